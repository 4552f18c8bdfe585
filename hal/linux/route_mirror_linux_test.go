package linux

import (
	"context"
	"fmt"
	"github.com/naplesnet/naples/agent/halstore"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/naplesnet/naples/hal"
	"github.com/naplesnet/naples/internal/testns"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// bulkPrefix returns the i-th of many distinct prefixes of the family: host routes in
// 198.18.0.0/15 for IPv4, /64s in 2001:db8:100::/40 for IPv6.
func bulkPrefix(f ipFamily, i int) string {
	if f.flag == "-4" {
		a := netip.AddrFrom4([4]byte{198, 18 + byte(i>>16), byte(i >> 8), byte(i)})
		return netip.PrefixFrom(a, 32).String()
	}
	return fmt.Sprintf("2001:db8:1%02x:%x::/64", (i>>16)&0xff, i&0xffff)
}

// countRoutes counts the naples routes in table 100, as `ip route show table 100 proto 241`
// lists them.
func (h *host) countRoutes(t *testing.T, f ipFamily) int {
	t.Helper()
	out := strings.TrimSpace(h.ip(t, f, "route", "show", "table", "100", "proto", "241"))
	if out == "" {
		return 0
	}
	return len(strings.Split(out, "\n"))
}

// TestRouteBulkReadsTheMirror: reconciling 1,000 routes, with the observer running, writes
// each once and dumps the kernel a bounded number of times instead of once per route; a
// second pass over all of them writes nothing and dumps nothing; deleting them all writes
// each once more.
func TestRouteBulkReadsTheMirror(t *testing.T) {
	forEachFamily(t, func(t *testing.T, f ipFamily) {
		const n = 1000
		h := newHost(t)
		h.observe(t)
		objs := make([]*nimbusv1.Object, n)
		for i := range objs {
			objs[i] = route(fmt.Sprintf("r%04d", i), 100, bulkPrefix(f, i), f.gw1)
		}
		h.put(t, objs...)

		for _, o := range objs {
			if err := h.reconcile(t, o.Key()); err != nil {
				t.Fatalf("reconcile %s: %v", o.Key().ID(), err)
			}
		}
		if w := h.rec.KernelWrites(); w != n {
			t.Errorf("reconciling %d new routes made %d kernel writes; want exactly %d", n, w, n)
		}
		dumps := h.rec.dumps.Load()
		if dumps > 3 {
			t.Errorf("reconciling %d routes dumped the kernel's routes %d times; want at most 3 (a start-up fill and the observer's)", n, dumps)
		}
		if got := h.countRoutes(t, f); got != n {
			t.Fatalf("table 100 holds %d naples routes; want %d", got, n)
		}

		for _, o := range objs {
			if err := h.reconcile(t, o.Key()); err != nil {
				t.Fatalf("second reconcile of %s: %v", o.Key().ID(), err)
			}
		}
		if w := h.rec.KernelWrites(); w != n {
			t.Errorf("reconciling %d unchanged routes again made %d kernel writes; want none", n, w-n)
		}
		if d := h.rec.dumps.Load(); d != dumps {
			t.Errorf("reconciling %d unchanged routes again dumped the kernel %d times; want none", n, d-dumps)
		}

		for _, o := range objs {
			h.del(t, o.Key())
			if err := h.reconcile(t, o.Key()); err != nil {
				t.Fatalf("reconcile deleted %s: %v", o.Key().ID(), err)
			}
		}
		if w := h.rec.KernelWrites(); w != 2*n {
			t.Errorf("deleting %d routes made %d kernel writes; want %d", n, w-n, n)
		}
		if d := h.rec.dumps.Load(); d != dumps {
			t.Errorf("deleting %d routes dumped the kernel %d times; want none", n, d-dumps)
		}
		if got := h.countRoutes(t, f); got != 0 {
			t.Errorf("table 100 holds %d naples routes after every object was deleted; want 0", got)
		}
	})
}

// TestSweepRepairsUnreportedDrift: with no observer to report it, a route deleted by hand
// and one changed by hand stay as they are through reconciles, which trust the mirror; a
// sweep, as the HAL's resync runs it, reads the kernel afresh, enqueues exactly their
// owners, and their reconciles repair them with one write each.
func TestSweepRepairsUnreportedDrift(t *testing.T) {
	forEachFamily(t, func(t *testing.T, f ipFamily) {
		h := newHost(t)
		deleted := route("deleted", 100, f.prefix, f.gw1)
		changed := route("changed", 100, f.prefix2, f.gw1)
		intact := route("intact", 100, f.prefix3, f.gw1)
		objs := []*nimbusv1.Object{deleted, changed, intact}
		h.put(t, objs...)
		for _, o := range objs {
			if err := h.reconcile(t, o.Key()); err != nil {
				t.Fatal(err)
			}
		}
		h.ip(t, f, "route", "del", f.prefix, "table", "100")
		h.ip(t, f, "route", "replace", f.prefix2, "via", f.gw2, "table", "100", "proto", "241")

		writes := h.rec.KernelWrites()
		for _, o := range objs {
			if err := h.reconcile(t, o.Key()); err != nil {
				t.Fatal(err)
			}
		}
		if w := h.rec.KernelWrites(); w != writes {
			t.Fatalf("reconciles wrote the kernel %d times before any sweep; want none: they read the mirror, which no event updated", w-writes)
		}

		got := h.sweep(t)
		want := []string{changed.Key().ID(), deleted.Key().ID()}
		if !slices.Equal(got, want) {
			t.Fatalf("the sweep enqueued %q; want exactly the owners of the drifted routes, %q", got, want)
		}
		for _, id := range got {
			key, err := nimbusv1.ParseKeyID(id)
			if err != nil {
				t.Fatal(err)
			}
			if err := h.reconcile(t, key); err != nil {
				t.Fatal(err)
			}
		}
		if w := h.rec.KernelWrites(); w != writes+2 {
			t.Errorf("repairing two routes made %d kernel writes; want 2", w-writes)
		}
		table := h.table(t, f, 100)
		for _, p := range []string{f.prefix, f.prefix2, f.prefix3} {
			if !strings.Contains(table, p+" via "+f.gw1+" dev eth0 proto 241") {
				t.Errorf("route to %s not repaired by the sweep and reconcile:\n%s", p, table)
			}
		}
		if again := h.sweep(t); len(again) != 0 {
			t.Errorf("a second sweep enqueued %q; want nothing, the kernel matches the mirror", again)
		}
	})
}

// TestObserverRestartReadsKernelAfresh: changes made while the observer is down (as after
// a subscription overflowed) are found when it starts again: its first dump enqueues the
// owners of the routes that changed, before it reports being subscribed.
func TestObserverRestartReadsKernelAfresh(t *testing.T) {
	forEachFamily(t, func(t *testing.T, f ipFamily) {
		h := newHost(t)
		a := route("a", 100, f.prefix, f.gw1)
		b := route("b", 100, f.prefix2, f.gw1)
		h.put(t, a, b)
		for _, o := range []*nimbusv1.Object{a, b} {
			if err := h.reconcile(t, o.Key()); err != nil {
				t.Fatal(err)
			}
		}
		// The observer is not running: nobody hears of this.
		h.ip(t, f, "route", "del", f.prefix2, "table", "100")

		enqueued := h.observe(t)
		select {
		case id := <-enqueued:
			if id != b.Key().ID() {
				t.Fatalf("the restarted observer enqueued %s; want %s, whose route was deleted while it was down", id, b.Key().ID())
			}
		default:
			t.Fatalf("the restarted observer was subscribed without enqueuing %s, whose route was deleted while it was down", b.Key().ID())
		}
		if _, present := h.rec.routes.get(mustID(t, 100, f.prefix2)); present {
			t.Errorf("the mirror still holds the route deleted while the observer was down")
		}
		if err := h.reconcile(t, b.Key()); err != nil {
			t.Fatal(err)
		}
		if got := h.table(t, f, 100); !strings.Contains(got, f.prefix2+" via "+f.gw1) {
			t.Errorf("route deleted while the observer was down not repaired:\n%s", got)
		}
	})
}

// TestMirrorFollowsOwnAndForeignWrites: with the observer running, the mirror ends up as
// the kernel is after a mix of the reconciler's writes and changes by hand, in either
// order; and the reconciler's own writes enqueue nothing.
func TestMirrorFollowsOwnAndForeignWrites(t *testing.T) {
	forEachFamily(t, func(t *testing.T, f ipFamily) {
		h := newHost(t)
		enqueued := h.observe(t)
		obj := route("ours", 100, f.prefix, f.gw1)
		h.put(t, obj)
		gw := func(want string) func(kernelRoute, bool) bool {
			return func(rt kernelRoute, present bool) bool {
				return present && len(rt.hops) == 1 && rt.hops[0].gw.String() == want
			}
		}
		for range 3 {
			if err := h.reconcile(t, obj.Key()); err != nil {
				t.Fatal(err)
			}
			h.ip(t, f, "route", "replace", f.prefix, "via", f.gw2, "table", "100", "proto", "241")
			h.mirrored(t, 100, f.prefix, "via "+f.gw2, gw(f.gw2))
			if id := <-enqueued; id != obj.Key().ID() {
				t.Fatalf("the observer enqueued %s for a change by hand; want %s", id, obj.Key().ID())
			}
		}
		if err := h.reconcile(t, obj.Key()); err != nil {
			t.Fatal(err)
		}
		if got := h.table(t, f, 100); !strings.Contains(got, f.prefix+" via "+f.gw1) {
			t.Fatalf("route not repaired:\n%s", got)
		}
		// A marker change after our own last write: once the observer has applied it, it
		// has applied our echo too, and enqueued nothing for it.
		h.ip(t, f, "route", "add", f.prefix3, "via", f.gw1, "table", "100")
		h.mirrored(t, 100, f.prefix3, "added", func(_ kernelRoute, present bool) bool { return present })
		h.mirrored(t, 100, f.prefix, "via "+f.gw1, gw(f.gw1))
		select {
		case id := <-enqueued:
			t.Errorf("the observer enqueued %s after the reconciler's own write", id)
		default:
		}
	})
}

// noObserver hides a route reconciler's observer from the HAL, so the kernel can drift
// without any event reaching the HAL.
type noObserver struct{ rec *RouteReconciler }

var _ hal.Sweeper = noObserver{}

func (n noObserver) Kind() nimbusv1.Kind { return n.rec.Kind() }

func (n noObserver) Reconcile(ctx context.Context, key *nimbusv1.ObjectKey, obj *nimbusv1.Object) (*nimbusv1.OperationalData, error) {
	return n.rec.Reconcile(ctx, key, obj)
}

func (n noObserver) Sweep(ctx context.Context, enqueue func(nimbusv1.Key)) error {
	return n.rec.Sweep(ctx, enqueue)
}

func (n noObserver) KernelWrites() uint64 { return n.rec.KernelWrites() }

// TestHALResyncRepairsUnreportedDrift runs the HAL, on a fake clock, with no observer: a
// route deleted by hand stays deleted until the resync interval passes on the clock, and
// is back after it.
func TestHALResyncRepairsUnreportedDrift(t *testing.T) {
	forEachFamily(t, func(t *testing.T, f ipFamily) {
		h := newHost(t)
		store, err := halstore.New(h.store)
		if err != nil {
			t.Fatal(err)
		}
		clock := clocktesting.NewFakeClock(time.Date(2026, time.January, 1, 0, 0, 0, 0, time.UTC))
		const interval = 5 * time.Minute
		hl, err := hal.New(hal.Options{
			Store: store, Reconcilers: []hal.Reconciler{noObserver{h.rec}},
			ResyncInterval: interval, Clock: clock, Logger: quiet,
		})
		if err != nil {
			t.Fatal(err)
		}
		base := clock.Waiters()
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- hl.Run(ctx) }()
		t.Cleanup(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		})

		obj := route("ours", 100, f.prefix, f.gw1)
		h.put(t, obj)
		h.desired.MarkSynced()
		waitStatus(t, h.store, obj.Key(), func(s *nimbusv1.NodeStatus) bool {
			return s.GetPhase() == nimbusv1.Phase_PHASE_PROGRAMMED
		})
		waitFor(t, "the resync ticker", func() bool { return clock.Waiters() == base+1 })

		h.ip(t, f, "route", "del", f.prefix, "table", "100")
		writes := h.rec.KernelWrites()
		clock.Step(interval)
		waitFor(t, "the resync to put back the route deleted by hand", func() bool {
			return h.rec.KernelWrites() > writes && strings.Contains(h.table(t, f, 100), f.prefix+" via "+f.gw1)
		})
		waitStatus(t, h.store, obj.Key(), func(s *nimbusv1.NodeStatus) bool {
			return s.GetPhase() == nimbusv1.Phase_PHASE_PROGRAMMED
		})
		if w := h.rec.KernelWrites(); w != writes+1 {
			t.Errorf("the resync made %d kernel writes; want 1", w-writes)
		}
		if k := hl.Stats().Kinds[nimbusv1.Kind_KIND_ROUTE]; k.KernelWrites != h.rec.KernelWrites() || k.Reconciles < 2 || k.Errors != 0 {
			t.Errorf("Stats of routes = %+v; want %d kernel writes, at least 2 reconciles, no errors", k, h.rec.KernelWrites())
		}
	})
}

func mustID(t *testing.T, table uint32, prefix string) routeID {
	t.Helper()
	id, err := idOf(&nimbusv1.RouteSpec{Table: table, Prefix: prefix}, "")
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// TestRouteAddLeavesUnseenForeignRouteAlone: a foreign route added after the mirror was
// filled, with no observer to report it, is not overwritten: where the mirror holds no
// route, the reconciler adds rather than replaces, and the kernel refuses.
func TestRouteAddLeavesUnseenForeignRouteAlone(t *testing.T) {
	forEachFamily(t, func(t *testing.T, f ipFamily) {
		h := newHost(t)
		other := route("other", 100, f.prefix2, f.gw1)
		h.put(t, other)
		if err := h.reconcile(t, other.Key()); err != nil { // fills the mirror
			t.Fatal(err)
		}
		h.ip(t, f, "route", "add", f.prefix, "via", f.foreignGW, "table", "100")
		obj := route("ours", 100, f.prefix, f.gw1)
		h.put(t, obj)
		err := h.reconcile(t, obj.Key())
		if hal.ReasonOf(err) != hal.ReasonKernelError || !strings.Contains(err.Error(), "file exists") {
			t.Fatalf("reconcile onto a foreign route the mirror has not heard of: err = %v; want a KernelError saying it exists", err)
		}
		if got := h.table(t, f, 100); !strings.Contains(got, f.prefix+" via "+f.foreignGW+" dev eth0") || strings.Contains(got, f.prefix+" via "+f.gw1) {
			t.Fatalf("the foreign route was touched:\n%s", got)
		}
		// Once the mirror hears of it, the object is a Conflict, as for any foreign route.
		h.sweep(t)
		if err := h.reconcile(t, obj.Key()); !isConflict(err) {
			t.Fatalf("reconcile after a sweep: err = %v; want a Conflict", err)
		}
	})
}

// TestRouteIndexKey checks that the index keys of distinct route identities are distinct
// and that none is a prefix of another, which go-memdb's lookups of a non-unique index
// need: an IPv4 route and an IPv6 route whose address starts with the same bytes must not
// find each other's owner.
func TestRouteIndexKey(t *testing.T) {
	ids := []routeID{
		newRouteID(100, netip.MustParsePrefix("1.2.3.4/32"), 0),
		newRouteID(100, netip.MustParsePrefix("102:304::/32"), 0),
		newRouteID(100, netip.MustParsePrefix("102:304::/32"), 1024),
		newRouteID(100, netip.MustParsePrefix("1.2.3.0/24"), 0),
		newRouteID(101, netip.MustParsePrefix("1.2.3.4/32"), 0),
		newRouteID(100, netip.MustParsePrefix("1.2.3.4/32"), 1),
	}
	for i, a := range ids {
		for j, b := range ids {
			if i != j && strings.HasPrefix(b.indexKey(), a.indexKey()) {
				t.Errorf("the index key of %s is a prefix of that of %s", a, b)
			}
		}
	}
}

// TestDefaultRouteIsMirrored: a default route, which the kernel reports without a
// destination (no RTA_DST), is found again by the dump of a reconciler started afresh,
// whose reconcile then writes nothing, and its deletion by hand reaches the observer,
// which enqueues its owner, whose reconcile puts it back.
func TestDefaultRouteIsMirrored(t *testing.T) {
	forEachFamily(t, func(t *testing.T, f ipFamily) {
		h := newHost(t)
		prefix := "0.0.0.0/0"
		if f.flag == "-6" {
			prefix = "::/0"
		}
		obj := route("default", 100, prefix, f.gw1)
		h.put(t, obj)
		if err := h.reconcile(t, obj.Key()); err != nil {
			t.Fatal(err)
		}

		fresh, err := NewRouteReconciler(RouteOptions{Store: h.store, Namespace: &h.nsh, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		defer fresh.Close()
		if _, err := fresh.Reconcile(context.Background(), obj.Key(), obj); err != nil {
			t.Fatalf("reconcile by a fresh reconciler: %v", err)
		}
		if n := fresh.KernelWrites(); n != 0 {
			t.Errorf("a fresh reconciler wrote %d times for a default route the kernel holds; want 0", n)
		}

		enqueued := h.observe(t)
		h.ip(t, f, "route", "del", "default", "table", "100")
		if id := nextEnqueued(t, enqueued, "the owner of the deleted default route"); id != obj.Key().ID() {
			t.Fatalf("deleting the default route by hand enqueued %s, want %s", id, obj.Key().ID())
		}
		if err := h.reconcile(t, obj.Key()); err != nil {
			t.Fatal(err)
		}
		if got := h.table(t, f, 100); !strings.Contains(got, "default via "+f.gw1) {
			t.Errorf("table 100 after the repair:\n%s\nwant default via %s", got, f.gw1)
		}
	})
}

// TestObserverSeesSilentFlushes takes away, by hand, what an IPv4 route goes through:
// the kernel removes the route without a notification when its interface goes down,
// loses its address, or is deleted. The observer still enqueues the route's owner, and
// the mirror no longer holds the route, so the reconcile writes it again once it can.
func TestObserverSeesSilentFlushes(t *testing.T) {
	f := families[0]
	for _, tc := range []struct {
		name         string
		flush, heal  []string
		gateway      string
		wantUnhealed bool
	}{
		{name: "link down", flush: []string{"link", "set", "eth0", "down"}, heal: []string{"link", "set", "eth0", "up"}, gateway: f.gw1},
		{name: "address removed", flush: []string{"addr", "del", "10.10.0.1/24", "dev", "eth0"},
			heal: []string{"addr", "add", "10.10.0.1/24", "dev", "eth0"}, gateway: f.gw1},
		{name: "link deleted", flush: []string{"link", "del", "veth9"}, gateway: "10.90.0.2", wantUnhealed: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHost(t)
			for _, args := range [][]string{
				{"link", "add", "veth9", "type", "veth", "peer", "name", "veth9p"},
				{"addr", "add", "10.90.0.1/24", "dev", "veth9"},
				{"link", "set", "veth9", "up"},
				{"link", "set", "veth9p", "up"},
			} {
				testns.Run(t, "ip", append([]string{"-n", h.ns}, args...)...)
			}
			obj := route("flushed", 100, f.prefix, tc.gateway)
			h.put(t, obj)
			enqueued := h.observe(t)
			if err := h.reconcile(t, obj.Key()); err != nil {
				t.Fatal(err)
			}
			h.mirrored(t, 100, f.prefix, "programmed", func(_ kernelRoute, present bool) bool { return present })

			testns.Run(t, "ip", append([]string{"-n", h.ns}, tc.flush...)...)
			if got := h.table(t, f, 100); strings.Contains(got, f.prefix) {
				t.Fatalf("the kernel kept the route after %s:\n%s", tc.name, got)
			}
			if id := nextEnqueued(t, enqueued, "the owner of the flushed route"); id != obj.Key().ID() {
				t.Fatalf("the observer enqueued %s; want %s", id, obj.Key().ID())
			}
			h.mirrored(t, 100, f.prefix, "gone", func(_ kernelRoute, present bool) bool { return !present })
			if tc.wantUnhealed {
				return
			}
			testns.Run(t, "ip", append([]string{"-n", h.ns}, tc.heal...)...)
			if err := h.reconcile(t, obj.Key()); err != nil {
				t.Fatal(err)
			}
			if got := h.table(t, f, 100); !strings.Contains(got, f.prefix+" via "+tc.gateway) {
				t.Errorf("route not written again after %s was undone:\n%s", tc.name, got)
			}
		})
	}
}
