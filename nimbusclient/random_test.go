package nimbusclient

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	"github.com/naplesnet/naples/delphi"
	"github.com/naplesnet/naples/internal/testrand"
	"github.com/naplesnet/naples/nimbus"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// cutProxy forwards a unix socket to nimbus and can cut every open connection at once, as
// a broken network would, while the client keeps running. It can also hold the client
// away: while held, it closes every connection as soon as it is made.
type cutProxy struct {
	path string
	lis  net.Listener
	wg   sync.WaitGroup
	// accepted counts the connections the client made through the proxy.
	accepted atomic.Int64

	// mu guards conns and held.
	mu    sync.Mutex
	conns map[net.Conn]struct{}
	held  bool
}

func newCutProxy(t *testing.T, target string) *cutProxy {
	t.Helper()
	p := &cutProxy{path: filepath.Join(t.TempDir(), "proxy.sock"), conns: map[net.Conn]struct{}{}}
	lis, err := net.Listen("unix", p.path)
	if err != nil {
		t.Fatal(err)
	}
	p.lis = lis
	p.wg.Go(func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			p.accepted.Add(1)
			up, err := net.Dial("unix", target)
			if err != nil {
				c.Close()
				continue
			}
			if !p.track(c, up) {
				continue
			}
			p.wg.Go(func() { io.Copy(up, c); up.Close(); c.Close() })
			p.wg.Go(func() { io.Copy(c, up); up.Close(); c.Close() })
		}
	})
	t.Cleanup(func() {
		lis.Close()
		p.cut()
		p.wg.Wait()
	})
	return p
}

// track records the connections so that cut closes them; while the proxy holds the
// client away it closes them instead and returns false.
func (p *cutProxy) track(conns ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range conns {
		if p.held {
			c.Close()
			continue
		}
		p.conns[c] = struct{}{}
	}
	return !p.held
}

// hold cuts every connection and turns the client away until release.
func (p *cutProxy) hold() {
	p.mu.Lock()
	p.held = true
	p.mu.Unlock()
	p.cut()
}

// release lets the client connect again.
func (p *cutProxy) release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.held = false
}

// cut closes every connection the proxy carries now.
func (p *cutProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.Close()
	}
	clear(p.conns)
}

// newWindowBus is newBus with a server that keeps only the latest window changes for
// resuming watches and sends idle watches a bookmark every 10ms; it also returns the
// server, whose metrics tell how watches started.
func newWindowBus(t *testing.T, window int) (*bus, *nimbus.Server) {
	t.Helper()
	return newServedBus(t, nimbus.Options{HistoryWindow: window, BookmarkInterval: 10 * time.Millisecond})
}

// newServedBus is newBus with a server of the given options, which it also returns.
func newServedBus(t *testing.T, opts nimbus.Options) (*bus, *nimbus.Server) {
	t.Helper()
	b := &bus{path: filepath.Join(t.TempDir(), "nimbus.sock")}
	opts.Logger = quiet
	srv, err := nimbus.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("unix", b.path)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, lis) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	conn, err := grpc.NewClient("unix://"+b.path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	b.api = nimbusv1.NewNimbusClient(conn)
	return b, srv
}

// Metrics of nimbus the randomized test reads.
const (
	metricResumes   = `naples_nimbus_watch_starts_total{mode="resume"}`
	metricSnapshots = `naples_nimbus_watch_starts_total{mode="snapshot"}`
)

// nimbusMetric returns the value of one of the server's metrics, named the way the text
// exposition format writes it: name{label="value",...}. It fails the test when the server
// has no such metric.
func nimbusMetric(t *testing.T, srv *nimbus.Server, want string) int {
	t.Helper()
	families, err := srv.Registry().Gather()
	if err != nil {
		t.Fatalf("gathering nimbus metrics: %v", err)
	}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			name := f.GetName()
			if len(labels) > 0 {
				name += "{" + strings.Join(labels, ",") + "}"
			}
			if name != want {
				continue
			}
			switch {
			case m.GetCounter() != nil:
				return int(m.GetCounter().GetValue())
			case m.GetGauge() != nil:
				return int(m.GetGauge().GetValue())
			}
		}
	}
	t.Fatalf("nimbus has no metric %s", want)
	return 0
}

// TestRandomizedConvergence applies random creates, updates, deletes and retargets while
// the connections of three agents are cut at random points; at the end every agent's
// delphi holds exactly what nimbus targets at it, object for object. Nimbus keeps only a
// short history of changes. After some cuts the agent is held away until more changes
// than that happened, so it cannot resume and takes a snapshot and a sweep; after others
// nothing changes until the agent, caught up, was cut and resumed. Both must have happened
// after the first snapshots, or the test did not cover what it is for.
func TestRandomizedConvergence(t *testing.T) {
	seed := testrand.Seed(t)
	rng := rand.New(rand.NewPCG(seed, seed))
	window := 8 + rng.IntN(57)
	t.Logf("nimbus keeps the latest %d changes", window)
	b, srv := newWindowBus(t, window)
	nodes := []string{"a", "b", "c"}
	agents := map[string]*delphi.Store{}
	proxies := map[string]*cutProxy{}
	for _, n := range nodes {
		proxies[n] = newCutProxy(t, b.path)
		agents[n] = startNodeClient(t, n, "unix://"+proxies[n].path)
	}
	for _, n := range nodes {
		select {
		case <-agents[n].Synced():
		case <-time.After(30 * time.Second):
			t.Fatalf("node %s never took its first snapshot", n)
		}
	}
	firstResumes, firstSnapshots := nimbusMetric(t, srv, metricResumes), nimbusMetric(t, srv, metricSnapshots)

	ctx := context.Background()
	const ops = 600
	var rev uint64              // nimbus's revision after the latest change
	held := map[string]uint64{} // node held away → nimbus's revision when it was cut
	var holds, waits int
	for i := range ops {
		name := fmt.Sprintf("r%02d", rng.IntN(40))
		switch op := rng.IntN(10); {
		case op < 5: // create or update, with random targets
			var targets []string
			for _, n := range nodes {
				if rng.IntN(2) == 0 {
					targets = append(targets, n)
				}
			}
			obj := &nimbusv1.Object{
				Meta: &nimbusv1.ObjectMeta{Name: name, Nodes: targets},
				Spec: &nimbusv1.Object_Route{Route: &nimbusv1.RouteSpec{
					Table: uint32(1 + rng.IntN(5)), Prefix: "198.51.100.0/24",
					Nexthops: []*nimbusv1.NextHop{{Gateway: fmt.Sprintf("10.0.0.%d", 1+rng.IntN(200))}},
				}},
			}
			resp, err := b.api.Apply(ctx, &nimbusv1.ApplyRequest{Object: obj})
			if err != nil {
				t.Fatal(err)
			}
			rev = max(rev, resp.GetObject().GetMeta().GetRevision())
		case op < 8:
			resp, err := b.api.Delete(ctx, &nimbusv1.DeleteRequest{Key: routeKey(name)})
			if err != nil {
				t.Fatal(err)
			}
			rev = max(rev, resp.GetRevision())
		default:
			n := nodes[rng.IntN(len(nodes))]
			if _, ok := held[n]; ok {
				break
			}
			switch rng.IntN(4) {
			case 0: // away until its changes are no longer kept
				holds++
				held[n] = rev
				proxies[n].hold()
			case 1: // nothing changes until the agent has caught up, is cut and watches again
				waits++
				deadline := time.Now().Add(30 * time.Second)
				for _, at := agents[n].Resume(); at != rev; _, at = agents[n].Resume() {
					if time.Now().After(deadline) {
						t.Fatalf("op %d: node %s stayed at revision %d, nimbus is at %d", i, n, at, rev)
					}
					time.Sleep(5 * time.Millisecond)
				}
				resumes, accepted := nimbusMetric(t, srv, metricResumes), proxies[n].accepted.Load()
				proxies[n].cut()
				for proxies[n].accepted.Load() == accepted || nimbusMetric(t, srv, metricResumes) == resumes {
					if time.Now().After(deadline) {
						t.Fatalf("op %d: node %s was cut at nimbus's revision %d and did not resume within 30s", i, n, rev)
					}
					time.Sleep(5 * time.Millisecond)
				}
			default:
				proxies[n].cut()
			}
		}
		for n, since := range held {
			if rev > since+uint64(window) || i == ops-1 {
				proxies[n].release()
				delete(held, n)
			}
		}
		if i%50 == 0 {
			time.Sleep(time.Duration(rng.IntN(20)) * time.Millisecond)
		}
	}

	resp, err := nimbusv1.ListAll(ctx, b.api, &nimbusv1.ListRequest{Kind: nimbusv1.Kind_KIND_ROUTE})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		var want []*nimbusv1.Object
		for _, item := range resp.GetItems() {
			if item.GetObject().TargetsNode(n) {
				want = append(want, item.GetObject())
			}
		}
		var diff string
		deadline := time.Now().Add(30 * time.Second)
		for {
			diff = compare(want, agents[n].List(nimbusv1.Kind_KIND_ROUTE))
			if diff == "" || time.Now().After(deadline) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if diff != "" {
			t.Errorf("node %s: delphi differs from what nimbus targets at it: %s", n, diff)
		}
		if got := proxies[n].accepted.Load(); got < 2 {
			t.Errorf("node %s connected %d times; the test meant to cut its connection", n, got)
		}
	}
	resumed := nimbusMetric(t, srv, metricResumes) - firstResumes
	snapshot := nimbusMetric(t, srv, metricSnapshots) - firstSnapshots
	t.Logf("after the first snapshots: %d watches resumed, %d took a snapshot; %d agents were held away, %d cuts waited for",
		resumed, snapshot, holds, waits)
	if snapshot == 0 {
		t.Errorf("no watch started with a snapshot after the first ones: the snapshot and sweep path went untested")
	}
	if resumed == 0 {
		t.Errorf("no watch resumed: the resume path went untested")
	}
}

// compare returns "" when the two sets of objects are equal, or what differs.
func compare(want, got []*nimbusv1.Object) string {
	byID := func(objs []*nimbusv1.Object) map[string]*nimbusv1.Object {
		m := map[string]*nimbusv1.Object{}
		for _, o := range objs {
			m[o.Key().ID()] = o
		}
		return m
	}
	w, g := byID(want), byID(got)
	var diffs []string
	for id, o := range w {
		switch other, ok := g[id]; {
		case !ok:
			diffs = append(diffs, "missing "+id)
		case !proto.Equal(o, other):
			diffs = append(diffs, fmt.Sprintf("%s at revision %d, want %d", id, other.GetMeta().GetRevision(), o.GetMeta().GetRevision()))
		}
	}
	for id := range g {
		if _, ok := w[id]; !ok {
			diffs = append(diffs, "extra "+id)
		}
	}
	sort.Strings(diffs)
	if len(diffs) == 0 {
		return ""
	}
	return fmt.Sprint(diffs)
}
