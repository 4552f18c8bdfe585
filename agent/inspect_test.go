package agent

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/naplesnet/naples/delphi"
	delphiv1 "github.com/naplesnet/naples/proto/delphi/v1"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// inspectEnv is a real delphi store, with its writers claimed by the test, served by an
// Inspector on a unix socket, and a client of it.
type inspectEnv struct {
	store   *delphi.Store
	desired *delphi.DesiredWriter
	status  *delphi.StatusWriter
	api     delphiv1.DelphiClient
	sock    string
	// stop stops the server and returns what Serve returned.
	stop func() error
}

func newInspectEnv(t *testing.T) *inspectEnv {
	t.Helper()
	store, err := delphi.Open(delphi.Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	desired, err := store.ClaimDesired()
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.ClaimStatus()
	if err != nil {
		t.Fatal(err)
	}
	// The socket's directory does not exist yet: listening creates it.
	sock := filepath.Join(t.TempDir(), "run", "agent.sock")
	ctx, cancel := context.WithCancel(context.Background())
	serve, err := serveLocalAPI(ctx, sock, InspectorOptions{Store: store, Logger: quiet})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- serve(ctx) }()
	stopped := false
	var serveErr error
	stop := func() error {
		if !stopped {
			cancel()
			serveErr, stopped = <-served, true
		}
		return serveErr
	}
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &inspectEnv{store: store, desired: desired, status: st, api: delphiv1.NewDelphiClient(conn), sock: sock, stop: stop}
}

func (e *inspectEnv) put(t *testing.T, objs ...*nimbusv1.Object) {
	t.Helper()
	txn := &delphi.DesiredTxn{}
	for _, o := range objs {
		txn.Put(o)
	}
	if err := e.desired.Commit(txn); err != nil {
		t.Fatal(err)
	}
}

func (e *inspectEnv) remove(t *testing.T, key *nimbusv1.ObjectKey) {
	t.Helper()
	txn := &delphi.DesiredTxn{}
	txn.Delete(key)
	if err := e.desired.Commit(txn); err != nil {
		t.Fatal(err)
	}
}

func (e *inspectEnv) setStatus(t *testing.T, key *nimbusv1.ObjectKey, phase nimbusv1.Phase, gen int64, msg string) {
	t.Helper()
	if err := e.status.Set(key, &nimbusv1.NodeStatus{Node: "host-a", Phase: phase, ObservedGeneration: gen, Message: msg}); err != nil {
		t.Fatal(err)
	}
}

func testRoute(name string, gen int64, prefix string) *nimbusv1.Object {
	return &nimbusv1.Object{
		Meta: &nimbusv1.ObjectMeta{Name: name, Tenant: "default", Namespace: "default", Generation: gen},
		Spec: &nimbusv1.Object_Route{Route: &nimbusv1.RouteSpec{Table: 100, Prefix: prefix, Nexthops: []*nimbusv1.NextHop{{Gateway: "10.10.0.2"}}}},
	}
}

func routeKey(name string) *nimbusv1.ObjectKey {
	return nimbusv1.NewKey(nimbusv1.Kind_KIND_ROUTE, "", "", name)
}

// describeEntry summarizes an entry for comparison: "Route/default/default/a gen=1 PROGRAMMED/1 msg".
func describeEntry(e *delphiv1.Entry) string {
	s := e.GetKey().ID()
	if o := e.GetObject(); o != nil {
		s += " gen=" + itoa(o.GetMeta().GetGeneration())
	}
	if st := e.GetStatus(); st != nil {
		s += " " + st.GetPhase().String() + "/" + itoa(st.GetObservedGeneration()) + " " + st.GetMessage()
	}
	return s
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

func TestInspectorListAndGet(t *testing.T) {
	e := newInspectEnv(t)
	ctx := t.Context()

	fi, err := os.Stat(e.sock)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o660 {
		t.Errorf("socket mode = %v, want a socket with mode 0660", fi.Mode())
	}

	resp, err := e.api.List(ctx, &delphiv1.ListRequest{})
	if err != nil {
		t.Fatalf("List of an empty delphi: %v", err)
	}
	if len(resp.GetEntries()) != 0 || resp.GetSynced() || resp.GetEpoch() != "" {
		t.Errorf("List of an empty delphi = %v, want no entries, not synced", resp)
	}

	network := &nimbusv1.Object{
		Meta: &nimbusv1.ObjectMeta{Name: "blue", Generation: 3},
		Spec: &nimbusv1.Object_Network{Network: &nimbusv1.NetworkSpec{Vni: 10, Subnet: "10.1.0.0/24"}},
	}
	txn := &delphi.DesiredTxn{}
	txn.Put(testRoute("b", 1, "203.0.113.0/24"))
	txn.Put(testRoute("a", 2, "198.51.100.0/24"))
	txn.Put(network)
	txn.SetResume("epoch-1", 42)
	if err := e.desired.Commit(txn); err != nil {
		t.Fatal(err)
	}
	e.desired.MarkSynced()
	e.setStatus(t, routeKey("a"), nimbusv1.Phase_PHASE_PROGRAMMED, 2, "route in table 100")
	// A status whose object is gone already: delphi holds only the status.
	e.setStatus(t, routeKey("c"), nimbusv1.Phase_PHASE_FAILED, 1, "no such device")

	resp, err = e.api.List(ctx, &delphiv1.ListRequest{})
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	var got []string
	for _, en := range resp.GetEntries() {
		got = append(got, describeEntry(en))
	}
	want := []string{
		"Network/default/default/blue gen=3",
		"Route/default/default/a gen=2 PHASE_PROGRAMMED/2 route in table 100",
		"Route/default/default/b gen=1",
		"Route/default/default/c PHASE_FAILED/1 no such device",
	}
	if !slices.Equal(got, want) {
		t.Errorf("List entries:\n got %q\nwant %q", got, want)
	}
	if resp.GetEpoch() != "epoch-1" || resp.GetRevision() != 42 || !resp.GetSynced() {
		t.Errorf("List position = %q, %d, synced %t; want epoch-1, 42, synced", resp.GetEpoch(), resp.GetRevision(), resp.GetSynced())
	}

	resp, err = e.api.List(ctx, &delphiv1.ListRequest{Kind: nimbusv1.Kind_KIND_NETWORK})
	if err != nil || len(resp.GetEntries()) != 1 || resp.GetEntries()[0].GetKey().GetName() != "blue" {
		t.Errorf("List(Network) = %v, %v; want only blue", resp, err)
	}

	g, err := e.api.Get(ctx, &delphiv1.GetRequest{Key: &nimbusv1.ObjectKey{Kind: nimbusv1.Kind_KIND_ROUTE, Name: "a"}})
	if err != nil {
		t.Fatalf("Get(a): %v", err)
	}
	if d := describeEntry(g.GetEntry()); d != want[1] {
		t.Errorf("Get(a) = %q, want %q", d, want[1])
	}
	g, err = e.api.Get(ctx, &delphiv1.GetRequest{Key: routeKey("c")})
	if err != nil || g.GetEntry().GetObject() != nil || g.GetEntry().GetStatus().GetMessage() != "no such device" {
		t.Errorf("Get(c) = %v, %v; want the status alone", g, err)
	}

	for _, tc := range []struct {
		name string
		call func() error
		code codes.Code
	}{
		{"Get of a missing key", func() error {
			_, err := e.api.Get(ctx, &delphiv1.GetRequest{Key: routeKey("missing")})
			return err
		}, codes.NotFound},
		{"Get of a bad key", func() error {
			_, err := e.api.Get(ctx, &delphiv1.GetRequest{Key: routeKey("Bad_Name")})
			return err
		}, codes.InvalidArgument},
		{"Get without a key", func() error {
			_, err := e.api.Get(ctx, &delphiv1.GetRequest{})
			return err
		}, codes.InvalidArgument},
		{"List of an unknown kind", func() error {
			_, err := e.api.List(ctx, &delphiv1.ListRequest{Kind: 99})
			return err
		}, codes.InvalidArgument},
	} {
		if err := tc.call(); status.Code(err) != tc.code {
			t.Errorf("%s: err = %v, want %v", tc.name, err, tc.code)
		}
	}
}

// watchNext receives the next event within 5s.
func watchNext(t *testing.T, w grpc.ServerStreamingClient[delphiv1.WatchEvent]) *delphiv1.WatchEvent {
	t.Helper()
	type recv struct {
		ev  *delphiv1.WatchEvent
		err error
	}
	c := make(chan recv, 1)
	go func() {
		ev, err := w.Recv()
		c <- recv{ev, err}
	}()
	select {
	case r := <-c:
		if r.err != nil {
			t.Fatalf("Recv: %v", r.err)
		}
		return r.ev
	case <-time.After(5 * time.Second):
		t.Fatal("no watch event within 5s")
		return nil
	}
}

func eventString(ev *delphiv1.WatchEvent) string {
	s := describeEntry(ev.GetEntry())
	if ev.GetDeleted() {
		s += " deleted"
	}
	return s
}

func TestInspectorWatch(t *testing.T) {
	e := newInspectEnv(t)
	e.put(t, testRoute("b", 1, "203.0.113.0/24"), testRoute("a", 1, "198.51.100.0/24"))
	e.setStatus(t, routeKey("z"), nimbusv1.Phase_PHASE_PENDING, 1, "status only")

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	w, err := e.api.Watch(ctx, &delphiv1.WatchRequest{Kind: nimbusv1.Kind_KIND_ROUTE})
	if err != nil {
		t.Fatal(err)
	}
	// Every current entry first, in key order.
	for _, want := range []string{
		"Route/default/default/a gen=1",
		"Route/default/default/b gen=1",
		"Route/default/default/z PHASE_PENDING/1 status only",
	} {
		if got := eventString(watchNext(t, w)); got != want {
			t.Errorf("initial event = %q, want %q", got, want)
		}
	}

	// Then each change, in the order it happened; a Network is not a Route and is not sent.
	e.put(t, &nimbusv1.Object{
		Meta: &nimbusv1.ObjectMeta{Name: "blue", Generation: 1},
		Spec: &nimbusv1.Object_Network{Network: &nimbusv1.NetworkSpec{Vni: 10, Subnet: "10.1.0.0/24"}},
	})
	e.put(t, testRoute("a", 2, "198.51.100.0/24"))
	if got, want := eventString(watchNext(t, w)), "Route/default/default/a gen=2"; got != want {
		t.Errorf("after a change of a: %q, want %q", got, want)
	}
	e.setStatus(t, routeKey("a"), nimbusv1.Phase_PHASE_PROGRAMMED, 2, "route in table 100")
	if got, want := eventString(watchNext(t, w)), "Route/default/default/a gen=2 PHASE_PROGRAMMED/2 route in table 100"; got != want {
		t.Errorf("after a status of a: %q, want %q", got, want)
	}

	// The object goes while its status stays: not a delete yet.
	e.remove(t, routeKey("a"))
	if got, want := eventString(watchNext(t, w)), "Route/default/default/a PHASE_PROGRAMMED/2 route in table 100"; got != want {
		t.Errorf("after the delete of a: %q, want %q", got, want)
	}
	if err := e.status.Delete(routeKey("a")); err != nil {
		t.Fatal(err)
	}
	if got, want := eventString(watchNext(t, w)), "Route/default/default/a deleted"; got != want {
		t.Errorf("after the status of a went too: %q, want %q", got, want)
	}

	// The watch ends when the client goes away; the server notices (goleak in TestMain
	// checks its goroutines are gone after the server stops).
	cancel()
	if _, err := w.Recv(); status.Code(err) != codes.Canceled {
		t.Errorf("Recv after cancel: %v, want Canceled", err)
	}
}

// TestInspectorStopEndsWatches stops the server while a watch is open: the watch ends with
// Unavailable, Serve returns nil and the socket file is gone.
func TestInspectorStopEndsWatches(t *testing.T) {
	e := newInspectEnv(t)
	e.put(t, testRoute("a", 1, "198.51.100.0/24"))
	w, err := e.api.Watch(t.Context(), &delphiv1.WatchRequest{})
	if err != nil {
		t.Fatal(err)
	}
	watchNext(t, w)
	if err := e.stop(); err != nil {
		t.Errorf("Serve after stop = %v, want nil", err)
	}
	if _, err := w.Recv(); status.Code(err) != codes.Unavailable {
		t.Errorf("Recv after the server stopped: %v, want Unavailable", err)
	}
	if _, err := os.Stat(e.sock); !os.IsNotExist(err) {
		t.Errorf("socket still there after the server stopped: %v", err)
	}
}

// TestListenReplacesStaleSocket leaves a socket file nobody serves, as a crashed agent
// does: listening replaces it. A socket somebody serves is refused.
func TestListenReplacesStaleSocket(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "agent.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()
	lis, err := listenLocalAPI(t.Context(), sock)
	if err != nil {
		t.Fatalf("listening over a stale socket: %v", err)
	}
	defer lis.Close()
	if _, err := listenLocalAPI(t.Context(), sock); err == nil {
		t.Error("listening on a served socket succeeded")
	}
}

// TestRunServesLocalAPI runs a whole agent with Config.Socket against a real nimbus and
// reads what it holds through the local API: the route nimbus sent, PROGRAMMED in the
// namespace's kernel. When the agent stops, the socket is gone.
func TestRunServesLocalAPI(t *testing.T) {
	_, ns := hostNamespace(t, "naples-inspect")
	dir := t.TempDir()
	addr, napi, _ := startNimbus(t, dir)
	route := testRoute("to-dc2", 0, "198.51.100.0/24")
	route.Meta.Nodes = []string{"host-a"}
	if _, err := napi.Apply(t.Context(), &nimbusv1.ApplyRequest{Object: route}); err != nil {
		t.Fatal(err)
	}

	sock := filepath.Join(dir, "run", "agent.sock")
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() {
		ran <- Run(ctx, Config{Node: "host-a", Nimbus: addr, StateDir: filepath.Join(dir, "state"),
			Logger: quiet, Socket: sock, netns: &ns})
	}()
	defer func() {
		cancel()
		select {
		case err := <-ran:
			if err != nil {
				t.Errorf("Run after cancel = %v, want nil", err)
			}
		case <-time.After(20 * time.Second):
			t.Fatal("Run did not return after cancel")
		}
		if _, err := os.Stat(sock); !os.IsNotExist(err) {
			t.Errorf("socket still there after the agent stopped: %v", err)
		}
	}()

	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	api := delphiv1.NewDelphiClient(conn)
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := api.List(t.Context(), &delphiv1.ListRequest{Kind: nimbusv1.Kind_KIND_ROUTE})
		if err == nil && len(resp.GetEntries()) == 1 && resp.GetSynced() &&
			resp.GetEntries()[0].GetStatus().GetPhase() == nimbusv1.Phase_PHASE_PROGRAMMED {
			if got := resp.GetEntries()[0].GetObject().GetRoute().GetPrefix(); got != "198.51.100.0/24" {
				t.Errorf("the local api holds prefix %q, want 198.51.100.0/24", got)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the local api never showed the route PROGRAMMED: %v, %v", resp, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
