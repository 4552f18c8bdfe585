package nimbusclient

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/naplesnet/naples/internal/testlog"
	"github.com/naplesnet/naples/nimbus"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// startStatusAgent runs a client of the node against the nimbus at addr, with its own
// delphi store, and more dial options.
func startStatusAgent(t *testing.T, node, addr string, exceptionAfter time.Duration, dial ...grpc.DialOption) *agent {
	t.Helper()
	a := newAgent(t)
	c, err := New(Options{Node: node, Address: addr, Store: a.store, Logger: quiet, MaxBackoff: 200 * time.Millisecond,
		StatusExceptionAfter: exceptionAfter, DialOptions: dial})
	if err != nil {
		t.Fatal(err)
	}
	runClient(t, c)
	return a
}

// unixNimbus serves a nimbus of the options on a unix socket of its own.
func unixNimbus(t *testing.T, opts nimbus.Options) *replica {
	t.Helper()
	lis, err := net.Listen("unix", filepath.Join(t.TempDir(), "nimbus.sock"))
	if err != nil {
		t.Fatal(err)
	}
	if opts.Logger == nil {
		opts.Logger = quiet
	}
	return serveReplica(t, lis, opts)
}

// withoutWatermarks is a dial option that hides from the client that nimbus takes
// watermarks (nimbusv1.StatusWatermarkHeader), as an older nimbus would: the client
// reports every status.
func withoutWatermarks() grpc.DialOption {
	return grpc.WithStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		s, err := streamer(ctx, desc, cc, method, opts...)
		if err != nil {
			return nil, err
		}
		return headerless{s}, nil
	})
}

// headerless is a client stream whose headers never say that nimbus takes watermarks.
type headerless struct{ grpc.ClientStream }

// Header returns the stream's headers without nimbusv1.StatusWatermarkHeader.
func (h headerless) Header() (metadata.MD, error) {
	md, err := h.ClientStream.Header()
	if md != nil {
		md = md.Copy()
		md.Delete(nimbusv1.StatusWatermarkHeader)
	}
	return md, err
}

// statusSummary is what a status answer says, update times, uids and revisions aside:
// per object its counts, pending nodes, and each node's phase, generation and messages.
func statusSummary(t *testing.T, api nimbusv1.NimbusClient) map[string]string {
	t.Helper()
	resp, err := api.List(context.Background(), &nimbusv1.ListRequest{Kind: nimbusv1.Kind_KIND_ROUTE})
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	out := map[string]string{}
	for _, item := range resp.GetItems() {
		st := item.GetStatus()
		var b strings.Builder
		fmt.Fprintf(&b, "gen %d target %d programmed %d failed %d current %d stale %d caught up %v pending %v",
			st.GetGeneration(), st.GetTargetNodes(), st.GetProgrammedNodes(), st.GetFailedNodes(), st.GetCurrentNodes(),
			st.GetStaleNodes(), st.GetCaughtUpTime() != nil, st.GetPending())
		for _, ns := range st.GetNodes() {
			fmt.Fprintf(&b, "; %s %v@%d %q %q %v", ns.GetNode(), ns.GetPhase(), ns.GetObservedGeneration(), ns.GetReason(), ns.GetMessage(), ns.GetOperational())
		}
		out[item.GetObject().GetMeta().GetName()] = b.String()
	}
	return out
}

// programmedKey names a status a node's HAL wrote: PROGRAMMED at a generation of one
// object (by uid).
type programmedKey struct {
	node, uid string
	gen       int64
}

// TestWatermarkStatusesMatchEveryStatus is the differential test of watermark statuses.
// Two nimbus servers get the same random objects: for every node and for listed nodes,
// with new generations, changes of labels only, retargets and deletions. Each node has an
// agent (the real client, with a delphi store) on each server: on one, the agent is not
// told that nimbus takes watermarks (withoutWatermarks) and reports every status, as
// agents did before; on the other it reports its watermark and exceptions. A simulated HAL
// per node programs the objects both of the node's stores hold at the same generation in
// random order, some failing, some pending, some never, and writes the same status into
// both. Once changes stop, both servers answer List alike, update times aside; and at no
// time does the watermark server show an object PROGRAMMED at a generation on a node
// before the node's HAL wrote so.
func TestWatermarkStatusesMatchEveryStatus(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 22))
	const exceptionAfter = 300 * time.Millisecond
	every := unixNimbus(t, nimbus.Options{})
	var logs testlog.Buffer
	marks := unixNimbus(t, nimbus.Options{Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	servers := []*replica{every, marks}
	nodes := []string{"n0", "n1", "n2", "n3"}
	for _, s := range servers {
		for i, n := range nodes {
			vtep := fmt.Sprintf("192.0.2.%d", i+1)
			node := &nimbusv1.Object{Meta: &nimbusv1.ObjectMeta{Name: n}, Spec: &nimbusv1.Object_Node{Node: &nimbusv1.NodeSpec{VtepAddress: vtep}}}
			if _, err := s.api.Apply(context.Background(), &nimbusv1.ApplyRequest{Object: node}); err != nil {
				t.Fatal(err)
			}
		}
	}
	agents := map[string][2]*agent{}
	for _, n := range nodes {
		agents[n] = [2]*agent{startStatusAgent(t, n, every.addr, exceptionAfter, withoutWatermarks()), startStatusAgent(t, n, marks.addr, exceptionAfter)}
	}

	type object struct {
		nodes  []string
		spec   int
		labels int
	}
	objects := map[string]*object{}
	names := func() []string {
		out := make([]string, 0, len(objects))
		for name := range objects {
			out = append(out, name)
		}
		slices.Sort(out)
		return out
	}
	apply := func(name string, o *object) {
		for _, s := range servers {
			obj := &nimbusv1.Object{
				Meta: &nimbusv1.ObjectMeta{Name: name, Nodes: o.nodes, Labels: map[string]string{"l": fmt.Sprint(o.labels)}},
				Spec: &nimbusv1.Object_Route{Route: &nimbusv1.RouteSpec{Table: 100, Prefix: "198.51.100.0/24",
					Nexthops: []*nimbusv1.NextHop{{Gateway: fmt.Sprintf("10.0.%d.%d", o.spec/250, o.spec%250+1)}}}},
			}
			if _, err := s.api.Apply(context.Background(), &nimbusv1.ApplyRequest{Object: obj}); err != nil {
				t.Fatalf("Apply %s: %v", name, err)
			}
		}
	}
	someNodes := func() []string {
		if rng.IntN(2) == 0 {
			return nil // for every node
		}
		var out []string
		for _, n := range nodes {
			if rng.IntN(2) == 0 {
				out = append(out, n)
			}
		}
		if len(out) == 0 {
			out = nodes[:1]
		}
		return out
	}
	created := 0
	programmed := map[programmedKey]bool{}

	// hal takes one step of the node's HAL: it forgets the statuses of the objects one of
	// its stores no longer holds, and programs, fails or leaves pending one object both
	// hold at the same generation.
	hal := func(n string) {
		ag := agents[n]
		for _, e := range ag[1].store.Statuses() {
			_, in0 := ag[0].store.Get(e.Key.Proto())
			_, in1 := ag[1].store.Get(e.Key.Proto())
			if !in0 || !in1 {
				for _, a := range ag {
					if err := a.status.Delete(e.Key.Proto()); err != nil {
						t.Fatal(err)
					}
				}
			}
		}
		held := ag[1].store.List(nimbusv1.Kind_KIND_ROUTE)
		if len(held) == 0 {
			return
		}
		obj := held[rng.IntN(len(held))]
		other, ok := ag[0].store.Get(obj.Key())
		gen := obj.GetMeta().GetGeneration()
		if !ok || other.GetMeta().GetGeneration() != gen {
			return
		}
		st := &nimbusv1.NodeStatus{ObservedGeneration: gen}
		switch r := rng.IntN(10); {
		case r < 6:
			st.Phase = nimbusv1.Phase_PHASE_PROGRAMMED
			if r == 0 {
				st.Operational = map[string]string{"hits": fmt.Sprint(rng.IntN(100))}
			}
			programmed[programmedKey{n, obj.GetMeta().GetUid(), gen}] = true
		case r < 8:
			st.Phase, st.Reason, st.Message = nimbusv1.Phase_PHASE_FAILED, "Refused", fmt.Sprintf("no route %d", rng.IntN(3))
		default:
			st.Phase, st.Message = nimbusv1.Phase_PHASE_PENDING, "waiting for a link"
		}
		for _, a := range ag {
			if err := a.status.Set(obj.Key(), st); err != nil {
				t.Fatal(err)
			}
		}
		logs.Write(fmt.Appendf(nil, "hal %s %s %v@%d\n", n, obj.GetMeta().GetName(), st.GetPhase(), gen))
	}

	// checkNeverAhead fails the test if the watermark server shows an object PROGRAMMED
	// on a node at a generation the node's HAL never wrote PROGRAMMED for.
	checkNeverAhead := func() {
		resp, err := marks.api.List(context.Background(), &nimbusv1.ListRequest{Kind: nimbusv1.Kind_KIND_ROUTE})
		if err != nil {
			t.Fatal(err)
		}
		for _, item := range resp.GetItems() {
			m := item.GetObject().GetMeta()
			for _, ns := range item.GetStatus().GetNodes() {
				if ns.GetPhase() != nimbusv1.Phase_PHASE_PROGRAMMED {
					continue
				}
				if !programmed[programmedKey{ns.GetNode(), m.GetUid(), ns.GetObservedGeneration()}] {
					t.Fatalf("%s shown PROGRAMMED at generation %d on %s, which never programmed it", m.GetName(), ns.GetObservedGeneration(), ns.GetNode())
				}
			}
		}
	}

	for step := range 400 {
		switch r := rng.IntN(20); {
		case r < 3 || len(objects) < 5:
			name := fmt.Sprintf("r%03d", created) // never a name deleted before
			created++
			objects[name] = &object{nodes: someNodes()}
			apply(name, objects[name])
		case r < 5:
			name := names()[rng.IntN(len(objects))]
			objects[name].spec++
			apply(name, objects[name])
		case r < 6:
			name := names()[rng.IntN(len(objects))]
			objects[name].labels++
			apply(name, objects[name])
		case r < 7:
			name := names()[rng.IntN(len(objects))]
			objects[name].nodes = someNodes()
			apply(name, objects[name])
		case r < 8:
			name := names()[rng.IntN(len(objects))]
			delete(objects, name)
			for _, s := range servers {
				if _, err := s.api.Delete(context.Background(), &nimbusv1.DeleteRequest{Key: routeKey(name)}); err != nil {
					t.Fatal(err)
				}
			}
		default:
			for range 1 + rng.IntN(4) {
				hal(nodes[rng.IntN(len(nodes))])
			}
		}
		if step%10 == 0 {
			time.Sleep(time.Duration(rng.IntN(50)) * time.Millisecond)
			checkNeverAhead()
		}
	}
	// The last changes reach the nodes; the HALs take a few more steps on them.
	time.Sleep(200 * time.Millisecond)
	for range 40 {
		hal(nodes[rng.IntN(len(nodes))])
	}

	deadline := time.Now().Add(20 * time.Second)
	for {
		checkNeverAhead()
		want, got := statusSummary(t, every.api), statusSummary(t, marks.api)
		var diffs []string
		for _, name := range names() {
			if want[name] != got[name] {
				diffs = append(diffs, fmt.Sprintf("%s:\n  every status: %s\n  watermarks:   %s", name, want[name], got[name]))
			}
		}
		if len(want) != len(objects) || len(got) != len(objects) {
			diffs = append(diffs, fmt.Sprintf("objects: %d and %d, want %d", len(want), len(got), len(objects)))
		}
		if len(diffs) == 0 {
			return
		}
		if time.Now().After(deadline) {
			for _, l := range strings.Split(logs.String(), "\n") {
				for _, d := range diffs {
					if name, _, _ := strings.Cut(d, ":"); strings.Contains(l, name) {
						t.Log(l)
						break
					}
				}
			}
			t.Fatalf("the servers disagree on %d objects:\n%s", len(diffs), strings.Join(diffs, "\n"))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// nodeProgrammed tells whether the nimbus shows the route PROGRAMMED on the node.
func nodeProgrammed(t *testing.T, api nimbusv1.NimbusClient, name, node string) bool {
	t.Helper()
	resp, err := api.Get(context.Background(), &nimbusv1.GetRequest{Key: routeKey(name)})
	if err != nil {
		t.Fatalf("Get %s: %v", name, err)
	}
	for _, ns := range resp.GetItem().GetStatus().GetNodes() {
		if ns.GetNode() == node && ns.GetPhase() == nimbusv1.Phase_PHASE_PROGRAMMED {
			return true
		}
	}
	return false
}

// TestWatermarkHeldBackByLateObject runs an agent that programs out of order: an object
// it programs late holds PROGRAMMED back on the node, for the objects after it too, until
// it is programmed; one short of programmed for longer than the exception delay lets the
// others go, and is still not shown PROGRAMMED.
func TestWatermarkHeldBackByLateObject(t *testing.T) {
	for _, tc := range []struct {
		name           string
		exceptionAfter time.Duration
	}{{"held", time.Hour}, {"exception", 200 * time.Millisecond}} {
		t.Run(tc.name, func(t *testing.T) {
			srv := unixNimbus(t, nimbus.Options{})
			late := srv.apply(t, "late", "a")
			srv.apply(t, "early", "a")
			a := startStatusAgent(t, "a", srv.addr, tc.exceptionAfter)
			waitFor(t, "both objects in delphi", func() bool { return len(a.store.List(nimbusv1.Kind_KIND_ROUTE)) == 2 })
			if err := a.status.Set(routeKey("early"), &nimbusv1.NodeStatus{ObservedGeneration: 1, Phase: nimbusv1.Phase_PHASE_PROGRAMMED}); err != nil {
				t.Fatal(err)
			}
			if tc.exceptionAfter == time.Hour {
				// early waits behind late however long it takes.
				for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
					if nodeProgrammed(t, srv.api, "early", "a") || nodeProgrammed(t, srv.api, "late", "a") {
						t.Fatal("PROGRAMMED shown on a while the object before it is not programmed")
					}
				}
			} else {
				// late turns into an exception: early goes, late stays unprogrammed.
				waitFor(t, "early PROGRAMMED past the late exception", func() bool { return nodeProgrammed(t, srv.api, "early", "a") })
				for end := time.Now().Add(500 * time.Millisecond); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
					if nodeProgrammed(t, srv.api, "late", "a") {
						t.Fatal("late shown PROGRAMMED on a, which never programmed it")
					}
				}
			}
			if err := a.status.Set(routeKey("late"), &nimbusv1.NodeStatus{ObservedGeneration: late.GetMeta().GetGeneration(), Phase: nimbusv1.Phase_PHASE_PROGRAMMED}); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "both PROGRAMMED", func() bool {
				return nodeProgrammed(t, srv.api, "late", "a") && nodeProgrammed(t, srv.api, "early", "a")
			})
		})
	}
}
