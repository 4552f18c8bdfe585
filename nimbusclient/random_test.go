package nimbusclient

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/naplesnet/naples/delphi"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// cutProxy forwards a unix socket to nimbus and can cut every open connection at once, as
// a broken network would, while the client keeps running.
type cutProxy struct {
	path string
	lis  net.Listener
	wg   sync.WaitGroup
	// accepted counts the connections the client made through the proxy.
	accepted atomic.Int64

	// mu guards conns.
	mu    sync.Mutex
	conns map[net.Conn]struct{}
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
			p.track(c, up)
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

func (p *cutProxy) track(conns ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range conns {
		p.conns[c] = struct{}{}
	}
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

// TestRandomizedConvergence applies random creates, updates, deletes and retargets while
// the connections of three agents are cut at random points; at the end every agent's
// delphi holds exactly what nimbus targets at it, object for object.
func TestRandomizedConvergence(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, seed))
	b := newBus(t)
	nodes := []string{"a", "b", "c"}
	agents := map[string]*delphi.Store{}
	proxies := map[string]*cutProxy{}
	for _, n := range nodes {
		proxies[n] = newCutProxy(t, b.path)
		agents[n] = startNodeClient(t, n, "unix://"+proxies[n].path)
	}

	ctx := context.Background()
	const ops = 600
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
			if _, err := b.api.Apply(ctx, &nimbusv1.ApplyRequest{Object: obj}); err != nil {
				t.Fatal(err)
			}
		case op < 8:
			if _, err := b.api.Delete(ctx, &nimbusv1.DeleteRequest{Key: routeKey(name)}); err != nil {
				t.Fatal(err)
			}
		default:
			proxies[nodes[rng.IntN(len(nodes))]].cut()
		}
		if i%50 == 0 {
			time.Sleep(time.Duration(rng.IntN(20)) * time.Millisecond)
		}
	}

	resp, err := b.api.List(ctx, &nimbusv1.ListRequest{Kind: nimbusv1.Kind_KIND_ROUTE})
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
