package linux

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/naplesnet/naples/delphi"
	"github.com/naplesnet/naples/hal"
	"github.com/naplesnet/naples/internal/testns"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// ipFamily is the addressing of one IP ipFamily in a test host: gateways on eth0 and eth1, a
// gateway that a foreign route uses, and prefixes for routes.
type ipFamily struct {
	name string
	// flag selects the ipFamily for ip(8): "-4" or "-6".
	flag string
	// gw1 is on eth0's subnet, gw2 on eth1's, foreignGW on eth0's.
	gw1, gw2, foreignGW string
	// prefix, prefix2 and prefix3 are destinations for routes.
	prefix, prefix2, prefix3 string
	// unreachableGW is on a subnet the host does not have until a test adds
	// unreachableAddr to eth0; the kernel refuses it saying unreachableMsg.
	unreachableGW, unreachableAddr, unreachableMsg string
}

var families = []ipFamily{
	{name: "IPv4", flag: "-4", gw1: "10.10.0.2", gw2: "10.20.0.2", foreignGW: "10.10.0.9",
		prefix: "198.51.100.0/24", prefix2: "203.0.113.0/24", prefix3: "192.0.2.0/24",
		unreachableGW: "10.30.0.2", unreachableAddr: "10.30.0.1/24", unreachableMsg: "network is unreachable"},
	{name: "IPv6", flag: "-6", gw1: "2001:db8:1::2", gw2: "2001:db8:2::2", foreignGW: "2001:db8:1::9",
		prefix: "2001:db8:ff::/48", prefix2: "2001:db8:fe::/48", prefix3: "2001:db8:fd::/48",
		unreachableGW: "2001:db8:3::2", unreachableAddr: "2001:db8:3::1/64", unreachableMsg: "no route to host"},
}

// forEachFamily runs the test once per IP ipFamily.
func forEachFamily(t *testing.T, test func(t *testing.T, f ipFamily)) {
	for _, f := range families {
		t.Run(f.name, func(t *testing.T) { test(t, f) })
	}
}

// host is a test host: a fresh namespace with two connected subnets per ipFamily,
// 10.10.0.0/24 and 2001:db8:1::/64 on eth0, 10.20.0.0/24 and 2001:db8:2::/64 on eth1, a
// delphi store and a route reconciler bound to it.
type host struct {
	testStore
	ns  string
	nsh netns.NsHandle
	nl  *netlink.Handle
	rec *RouteReconciler
}

func newHost(t *testing.T) *host {
	t.Helper()
	ns := testns.Named(t, "naples-hal")
	for _, args := range [][]string{
		{"link", "add", "eth0", "type", "veth", "peer", "name", "eth1"},
		{"addr", "add", "10.10.0.1/24", "dev", "eth0"},
		{"addr", "add", "10.20.0.1/24", "dev", "eth1"},
		{"addr", "add", "2001:db8:1::1/64", "dev", "eth0", "nodad"},
		{"addr", "add", "2001:db8:2::1/64", "dev", "eth1", "nodad"},
		{"link", "set", "eth0", "up"},
		{"link", "set", "eth1", "up"},
	} {
		testns.Run(t, "ip", append([]string{"-n", ns}, args...)...)
	}
	nsh := testns.Handle(t, ns)
	nl, err := netlink.NewHandleAt(nsh)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nl.Close)
	s := newTestStore(t, Indexes())
	rec, err := NewRouteReconciler(RouteOptions{Store: s.store, Namespace: &nsh, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rec.Close() })
	return &host{testStore: s, ns: ns, nsh: nsh, nl: nl, rec: rec}
}

func route(name string, table uint32, prefix string, gws ...string) *nimbusv1.Object {
	spec := &nimbusv1.RouteSpec{Table: table, Prefix: prefix}
	for _, gw := range gws {
		spec.Nexthops = append(spec.Nexthops, &nimbusv1.NextHop{Gateway: gw})
	}
	return &nimbusv1.Object{
		Meta: &nimbusv1.ObjectMeta{Name: name, Generation: 1},
		Spec: &nimbusv1.Object_Route{Route: spec},
	}
}

// reconcile runs the reconciler the way the HAL does: with the object delphi holds now.
func (h *host) reconcile(t *testing.T, key *nimbusv1.ObjectKey) error {
	t.Helper()
	_, err := h.reconcileStored(h.rec, key)
	return err
}

// sweep runs the reconciler's sweep, as the HAL's resync does, and returns the key IDs it
// enqueued, sorted.
func (h *host) sweep(t *testing.T) []string {
	t.Helper()
	var enqueued []string
	if err := h.rec.Sweep(context.Background(), func(key nimbusv1.Key) { enqueued = append(enqueued, key.String()) }); err != nil {
		t.Fatalf("Sweep: %v", err)
	}
	slices.Sort(enqueued)
	return slices.Compact(enqueued)
}

// observe runs the reconciler's observer until the test ends, and returns once it is
// subscribed. The keys it enqueues arrive on the returned channel.
func (h *host) observe(t *testing.T) <-chan string {
	t.Helper()
	return runObserver(t, h.rec)
}

// mirrored waits until the reconciler's mirror holds what ok accepts for the route with
// the prefix (metric 0, or 1024 for IPv6) in table, the state in which the observer has
// applied the kernel's latest change to it.
func (h *host) mirrored(t *testing.T, table uint32, prefix string, what string, ok func(rt kernelRoute, present bool) bool) {
	t.Helper()
	id, err := idOf(&nimbusv1.RouteSpec{Table: table, Prefix: prefix}, "")
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the mirror to show "+id.String()+" "+what, func() bool {
		rt, present := h.rec.routes.get(id)
		return ok(rt, present)
	})
}

// ip runs ip(8) in the host's namespace for the ipFamily.
func (h *host) ip(t *testing.T, f ipFamily, args ...string) string {
	t.Helper()
	return testns.Run(t, "ip", append([]string{"-n", h.ns, f.flag}, args...)...)
}

// table lists the kernel's table as `ip route show table N` does.
func (h *host) table(t *testing.T, f ipFamily, table int) string {
	t.Helper()
	return h.ip(t, f, "route", "show", "table", strconv.Itoa(table))
}

func isConflict(err error) bool {
	var he *hal.Error
	return errors.As(err, &he) && he.Reason == hal.ReasonConflict
}

func TestRouteLifecycle(t *testing.T) {
	forEachFamily(t, func(t *testing.T, f ipFamily) {
		h := newHost(t)
		obj := route("to-dc2", 100, f.prefix, f.gw1)
		key := obj.Key()

		h.put(t, obj)
		if err := h.reconcile(t, key); err != nil {
			t.Fatalf("reconcile: %v", err)
		}
		if got := h.table(t, f, 100); !strings.Contains(got, f.prefix+" via "+f.gw1+" dev eth0 proto 241") {
			t.Fatalf("table 100 after add:\n%s", got)
		}
		writes := h.rec.KernelWrites()
		if err := h.reconcile(t, key); err != nil {
			t.Fatalf("second reconcile: %v", err)
		}
		if h.rec.KernelWrites() != writes {
			t.Errorf("reconciling an unchanged route wrote the kernel %d more times", h.rec.KernelWrites()-writes)
		}

		// Change the next hop: the route is replaced in place.
		h.put(t, route("to-dc2", 100, f.prefix, f.gw2))
		if err := h.reconcile(t, key); err != nil {
			t.Fatalf("reconcile after next-hop change: %v", err)
		}
		if got := h.table(t, f, 100); !strings.Contains(got, "via "+f.gw2+" dev eth1") || strings.Contains(got, f.gw1) {
			t.Fatalf("table 100 after next-hop change:\n%s", got)
		}

		// Two next hops make an ECMP route.
		h.put(t, route("to-dc2", 100, f.prefix, f.gw1, f.gw2))
		if err := h.reconcile(t, key); err != nil {
			t.Fatalf("reconcile ECMP: %v", err)
		}
		got := h.table(t, f, 100)
		if !strings.Contains(got, "nexthop via "+f.gw1+" dev eth0") || !strings.Contains(got, "nexthop via "+f.gw2+" dev eth1") {
			t.Fatalf("table 100 after ECMP:\n%s", got)
		}
		writes = h.rec.KernelWrites()
		if err := h.reconcile(t, key); err != nil {
			t.Fatal(err)
		}
		if h.rec.KernelWrites() != writes {
			t.Errorf("reconciling an unchanged ECMP route rewrote it")
		}

		// Moving the prefix removes the old route.
		h.put(t, route("to-dc2", 100, f.prefix2, f.gw1))
		if err := h.reconcile(t, key); err != nil {
			t.Fatal(err)
		}
		if got := h.table(t, f, 100); strings.Contains(got, f.prefix) || !strings.Contains(got, f.prefix2) {
			t.Fatalf("table 100 after prefix change:\n%s", got)
		}

		// Delete, twice.
		h.del(t, key)
		for i := range 2 {
			if err := h.reconcile(t, key); err != nil {
				t.Fatalf("delete %d: %v", i+1, err)
			}
		}
		if got := h.table(t, f, 100); strings.TrimSpace(got) != "" {
			t.Fatalf("table 100 after delete:\n%s", got)
		}
	})
}

// TestRouteInTenantTable puts a route in its tenant's table: the table TenantTable gives
// for the object's tenant, which its networks route in, and moves it when the object
// names a table again.
func TestRouteInTenantTable(t *testing.T) {
	forEachFamily(t, func(t *testing.T, f ipFamily) {
		h := newHost(t)
		obj := route("to-dc2", 0, f.prefix, f.gw1)
		obj.Meta.Tenant = "acme"
		obj.GetRoute().TenantTable = true
		h.put(t, obj)
		if err := h.reconcile(t, obj.Key()); err != nil {
			t.Fatalf("reconcile: %v", err)
		}
		table := int(TenantTable("acme"))
		if got := h.table(t, f, table); !strings.Contains(got, f.prefix+" via "+f.gw1+" dev eth0 proto 241") {
			t.Fatalf("table %d (tenant acme) after add:\n%s", table, got)
		}
		moved := route("to-dc2", 100, f.prefix, f.gw1)
		moved.Meta.Tenant = "acme"
		h.put(t, moved)
		if err := h.reconcile(t, obj.Key()); err != nil {
			t.Fatalf("reconcile after the move: %v", err)
		}
		if got := h.table(t, f, table); strings.TrimSpace(got) != "" {
			t.Errorf("table %d (tenant acme) after the route moved to table 100:\n%s", table, got)
		}
		if got := h.table(t, f, 100); !strings.Contains(got, f.prefix+" via "+f.gw1) {
			t.Errorf("table 100 after the move:\n%s", got)
		}
	})
}

// TestRouteLeavesForeignRoutesAlone covers routes naples did not create, beside ours and on
// the destination an object wants: the object is FAILED with Conflict, and neither its
// reconcile, its delete nor a sweep touches the foreign route. For IPv6 this is the case
// where the kernel's metric 1024 once made naples take over the foreign route.
func TestRouteLeavesForeignRoutesAlone(t *testing.T) {
	forEachFamily(t, func(t *testing.T, f ipFamily) {
		h := newHost(t)
		h.ip(t, f, "route", "add", f.prefix3, "via", f.foreignGW, "table", "100")
		h.ip(t, f, "route", "add", f.prefix2, "via", f.foreignGW, "table", "100")

		ours := route("ours", 100, f.prefix, f.gw1)
		clash := route("clash", 100, f.prefix2, f.gw1)
		h.put(t, ours, clash)
		if err := h.reconcile(t, ours.Key()); err != nil {
			t.Fatal(err)
		}
		writes := h.rec.KernelWrites()
		for range 2 {
			err := h.reconcile(t, clash.Key())
			if !isConflict(err) || !strings.Contains(err.Error(), "not created by naples") {
				t.Fatalf("reconcile onto a foreign route: err = %v, want a Conflict", err)
			}
		}
		if h.rec.KernelWrites() != writes {
			t.Errorf("reconciling onto a foreign route wrote the kernel")
		}
		h.sweep(t)
		if got := h.table(t, f, 100); !strings.Contains(got, f.prefix+" via "+f.gw1) {
			t.Errorf("the sweep removed our own route:\n%s", got)
		}
		h.del(t, ours.Key())
		h.del(t, clash.Key())
		for _, k := range []*nimbusv1.ObjectKey{ours.Key(), clash.Key()} {
			if err := h.reconcile(t, k); err != nil {
				t.Fatal(err)
			}
		}
		h.sweep(t)
		got := h.table(t, f, 100)
		for _, want := range []string{f.prefix3 + " via " + f.foreignGW, f.prefix2 + " via " + f.foreignGW} {
			if !strings.Contains(got, want) {
				t.Errorf("foreign route %q was touched; table 100:\n%s", want, got)
			}
		}
		if strings.Contains(got, f.prefix+" ") {
			t.Errorf("our route survived its delete:\n%s", got)
		}
	})
}

// TestRouteReplacedByForeignRouteSurvivesDelete: someone replaces a naples route with one
// of their own; deleting the object then leaves their route alone.
func TestRouteReplacedByForeignRouteSurvivesDelete(t *testing.T) {
	forEachFamily(t, func(t *testing.T, f ipFamily) {
		h := newHost(t)
		h.observe(t)
		obj := route("ours", 100, f.prefix, f.gw1)
		h.put(t, obj)
		if err := h.reconcile(t, obj.Key()); err != nil {
			t.Fatal(err)
		}
		h.ip(t, f, "route", "replace", f.prefix, "via", f.foreignGW, "table", "100", "proto", "static")
		h.mirrored(t, 100, f.prefix, "replaced by a static route", func(rt kernelRoute, present bool) bool {
			return present && rt.protocol == unix.RTPROT_STATIC
		})
		if err := h.reconcile(t, obj.Key()); !isConflict(err) {
			t.Fatalf("reconcile after a foreign replace: err = %v, want a Conflict", err)
		}
		h.del(t, obj.Key())
		if err := h.reconcile(t, obj.Key()); err != nil {
			t.Fatal(err)
		}
		h.sweep(t)
		if got := h.table(t, f, 100); !strings.Contains(got, f.prefix+" via "+f.foreignGW+" dev eth0 proto static") {
			t.Fatalf("the foreign route that replaced ours did not survive the delete:\n%s", got)
		}
	})
}

// TestRouteIdentityIsParsed: the owner of a kernel route is found by the parsed prefix, so
// an object whose prefix is spelled in capitals (which delphi may hold from before such
// spellings were refused) keeps its route through sweeps and is removed by its delete.
func TestRouteIdentityIsParsed(t *testing.T) {
	h := newHost(t)
	f := families[1]
	obj := route("caps", 100, "2001:DB8:FF::/48", f.gw1)
	h.put(t, obj)
	if err := h.reconcile(t, obj.Key()); err != nil {
		t.Fatal(err)
	}
	h.sweep(t)
	writes := h.rec.KernelWrites()
	if err := h.reconcile(t, obj.Key()); err != nil {
		t.Fatal(err)
	}
	if got := h.table(t, f, 100); !strings.Contains(got, "2001:db8:ff::/48 via "+f.gw1) {
		t.Fatalf("the sweep removed the route of an object spelled in capitals:\n%s", got)
	}
	if h.rec.KernelWrites() != writes {
		t.Errorf("reconciling a correct route after the sweep rewrote it")
	}
	h.del(t, obj.Key())
	if err := h.reconcile(t, obj.Key()); err != nil {
		t.Fatal(err)
	}
	if got := h.table(t, f, 100); strings.TrimSpace(got) != "" {
		t.Fatalf("route survived its delete:\n%s", got)
	}
}

func TestRouteConflictBetweenObjects(t *testing.T) {
	forEachFamily(t, func(t *testing.T, f ipFamily) {
		h := newHost(t)
		a := route("a", 100, f.prefix, f.gw1)
		b := route("b", 100, f.prefix, f.gw2)
		h.put(t, a, b)
		if err := h.reconcile(t, a.Key()); err != nil {
			t.Fatal(err)
		}
		if err := h.reconcile(t, b.Key()); !isConflict(err) || !strings.Contains(err.Error(), a.Key().ID()) {
			t.Fatalf("second object on the same route: err = %v, want a conflict naming %s", err, a.Key().ID())
		}
		if got := h.table(t, f, 100); !strings.Contains(got, "via "+f.gw1) {
			t.Fatalf("the owner's route was disturbed:\n%s", got)
		}
	})
}

func TestSweepRemovesStaleAndAdopts(t *testing.T) {
	forEachFamily(t, func(t *testing.T, f ipFamily) {
		h := newHost(t)
		// A previous agent left two routes behind; only one is still desired.
		h.ip(t, f, "route", "add", f.prefix, "via", f.gw1, "table", "100", "proto", "241")
		h.ip(t, f, "route", "add", f.prefix2, "via", f.gw1, "table", "200", "proto", "241")
		kept := route("kept", 100, f.prefix, f.gw1)
		h.put(t, kept)

		h.sweep(t)
		if got := h.table(t, f, 200); strings.TrimSpace(got) != "" {
			t.Errorf("stale route in table 200 survived the sweep:\n%s", got)
		}
		if got := h.table(t, f, 100); !strings.Contains(got, f.prefix+" via "+f.gw1) {
			t.Errorf("the sweep removed the route a desired object owns:\n%s", got)
		}
		writes := h.rec.KernelWrites()
		if err := h.reconcile(t, kept.Key()); err != nil {
			t.Fatal(err)
		}
		if h.rec.KernelWrites() != writes {
			t.Errorf("an adopted, correct route was rewritten")
		}
		// The adopted route is removed when its object goes away.
		h.del(t, kept.Key())
		if err := h.reconcile(t, kept.Key()); err != nil {
			t.Fatal(err)
		}
		if got := h.table(t, f, 100); strings.TrimSpace(got) != "" {
			t.Errorf("adopted route survived its delete:\n%s", got)
		}
	})
}

// TestReconcileHonoursContext: a reconcile whose context has ended writes nothing and
// says why, so a worker never starts kernel work for a HAL that is stopping.
func TestReconcileHonoursContext(t *testing.T) {
	h := newHost(t)
	f := families[0]
	obj := route("late", 100, f.prefix, f.gw1)
	h.put(t, obj)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := h.rec.Reconcile(ctx, obj.Key(), obj); !errors.Is(err, context.Canceled) {
		t.Fatalf("Reconcile with an ended context: err = %v, want context.Canceled", err)
	}
	if got := h.ip(t, f, "route", "show", "table", "all"); strings.Contains(got, f.prefix) || h.rec.KernelWrites() != 0 {
		t.Fatalf("Reconcile with an ended context wrote the kernel:\n%s", got)
	}
}

// TestObserverSeesDrift runs the observer alone: drift of a naples route, by hand or by
// another writer using protocol 241, enqueues its owner; the reconciler's own writes do
// not. Changes arrive in order on one subscription, so a marker change made after our
// own write proves that write was seen and passed over.
func TestObserverSeesDrift(t *testing.T) {
	forEachFamily(t, func(t *testing.T, f ipFamily) {
		h := newHost(t)
		ours := route("ours", 100, f.prefix, f.gw1)
		marker := route("marker", 100, f.prefix2, f.gw1)
		h.put(t, ours, marker)
		if err := h.reconcile(t, marker.Key()); err != nil {
			t.Fatal(err)
		}

		enqueued := h.observe(t)
		next := func(what string) string {
			t.Helper()
			return nextEnqueued(t, enqueued, what)
		}

		// Our own write, then drift of the marker: only the marker is enqueued.
		if err := h.reconcile(t, ours.Key()); err != nil {
			t.Fatal(err)
		}
		h.ip(t, f, "route", "del", f.prefix2, "table", "100")
		if got := next("the deleted marker"); got != marker.Key().ID() {
			t.Fatalf("after our own write and a deleted marker, enqueued %s first, want %s", got, marker.Key().ID())
		}

		// Another writer using our protocol changes our route's next hop.
		h.ip(t, f, "route", "replace", f.prefix, "via", f.gw2, "table", "100", "proto", "241")
		if got := next("the route another writer changed with protocol 241"); got != ours.Key().ID() {
			t.Fatalf("enqueued %s, want %s", got, ours.Key().ID())
		}
	})
}

// TestHAL runs the whole HAL on the route reconciler: status, retries, drift repair.
func TestHAL(t *testing.T) {
	forEachFamily(t, func(t *testing.T, f ipFamily) {
		h := newHost(t)
		runHAL(t, h.store, hal.Options{Reconcilers: []hal.Reconciler{h.rec}})

		good := route("good", 100, f.prefix, f.gw1)
		// The gateway's subnet is not connected yet: the kernel refuses it.
		unreachable := route("later", 100, f.prefix2, f.unreachableGW)
		network := &nimbusv1.Object{Meta: &nimbusv1.ObjectMeta{Name: "net1", Generation: 3}, Spec: &nimbusv1.Object_Network{Network: &nimbusv1.NetworkSpec{Vni: 1, Subnet: "10.0.0.0/24"}}}
		h.put(t, good, unreachable, network)

		waitStatus(t, h.store, good.Key(), func(s *nimbusv1.NodeStatus) bool {
			return s.GetPhase() == nimbusv1.Phase_PHASE_PROGRAMMED && s.GetObservedGeneration() == 1
		})
		st := waitStatus(t, h.store, unreachable.Key(), func(s *nimbusv1.NodeStatus) bool {
			return s.GetPhase() == nimbusv1.Phase_PHASE_FAILED
		})
		if st.GetReason() != hal.ReasonKernelError || !strings.Contains(st.GetMessage(), f.unreachableMsg) {
			t.Errorf("FAILED status = %v, want KernelError with the kernel's message", st)
		}
		waitStatus(t, h.store, network.Key(), func(s *nimbusv1.NodeStatus) bool {
			return s.GetPhase() == nimbusv1.Phase_PHASE_PENDING && s.GetReason() == hal.ReasonUnsupported && s.GetObservedGeneration() == 3
		})

		// Connect the gateway's subnet: the retry programs the route without any new event.
		h.ip(t, f, "addr", "add", f.unreachableAddr, "dev", "eth0", "nodad")
		waitStatus(t, h.store, unreachable.Key(), func(s *nimbusv1.NodeStatus) bool {
			return s.GetPhase() == nimbusv1.Phase_PHASE_PROGRAMMED
		})

		// Drift: a route deleted by hand comes back.
		h.ip(t, f, "route", "del", f.prefix, "table", "100")
		waitFor(t, "route deleted by hand to come back", func() bool {
			return strings.Contains(h.table(t, f, 100), f.prefix+" via "+f.gw1)
		})
		// Drift by another writer using protocol 241 is repaired too.
		h.ip(t, f, "route", "replace", f.prefix, "via", f.gw2, "table", "100", "proto", "241")
		waitFor(t, "route changed with protocol 241 to be repaired", func() bool {
			return strings.Contains(h.table(t, f, 100), f.prefix+" via "+f.gw1)
		})

		// Delete: the route and the status go.
		h.del(t, good.Key())
		waitFor(t, "route and status to go", func() bool {
			_, ok := h.store.Status(good.Key())
			return !ok && !strings.Contains(h.table(t, f, 100), f.prefix+" ")
		})
	})
}

func waitStatus(t *testing.T, store *delphi.Store, key *nimbusv1.ObjectKey, ok func(*nimbusv1.NodeStatus) bool) *nimbusv1.NodeStatus {
	t.Helper()
	var last *nimbusv1.NodeStatus
	waitFor(t, "status of "+key.ID(), func() bool {
		last, _ = store.Status(key)
		return last != nil && ok(last)
	})
	return last
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestRouteDependsOnTenantNetworks: a change of a network reconciles the routes in its
// tenant's table again, and no other route.
func TestRouteDependsOnTenantNetworks(t *testing.T) {
	h := newHost(t)
	inTable := route("in-table", 100, "198.51.100.0/24", "10.10.0.2")
	inTable.Meta.Tenant = "acme"
	inTenant := route("in-tenant", 0, "203.0.113.0/24", "10.10.0.2")
	inTenant.Meta.Tenant = "acme"
	inTenant.GetRoute().TenantTable = true
	otherTenant := route("other-tenant", 0, "192.0.2.0/24", "10.10.0.2")
	otherTenant.GetRoute().TenantTable = true
	h.put(t, inTable, inTenant, otherTenant)

	network := nimbusv1.MakeKey(nimbusv1.Kind_KIND_NETWORK, "acme", "", "blue")
	if got, want := h.rec.DependentsOf(network), []nimbusv1.Key{inTenant.TypedKey()}; !slices.Equal(got, want) {
		t.Errorf("DependentsOf(%s) = %v, want %v", network, got, want)
	}
	if got := h.rec.DependentsOf(inTable.TypedKey()); got != nil {
		t.Errorf("DependentsOf(a route) = %v, want none", got)
	}
}

// TestRouteThroughDevice checks that a next hop's device is found by name in the view's
// link table, also a link added while the observer runs, that the route then reconciles
// without a write, and that a device the namespace lacks fails the reconcile as a kernel
// error.
func TestRouteThroughDevice(t *testing.T) {
	forEachFamily(t, func(t *testing.T, f ipFamily) {
		h := newHost(t)
		h.observe(t)
		testns.Run(t, "ip", "-n", h.ns, "link", "add", "dum0", "type", "veth", "peer", "name", "dum1")
		testns.Run(t, "ip", "-n", h.ns, "link", "set", "dum0", "up")
		testns.Run(t, "ip", "-n", h.ns, "link", "set", "dum1", "up")
		obj := route("via-dev", 100, f.prefix, f.gw1)
		obj.GetRoute().Nexthops[0].Device = "eth0"
		obj2 := route("on-dum0", 100, f.prefix2)
		obj2.GetRoute().Nexthops = []*nimbusv1.NextHop{{Device: "dum0"}}
		for _, o := range []*nimbusv1.Object{obj, obj2} {
			h.put(t, o)
			err := h.reconcile(t, o.Key())
			for i := 0; err != nil && i < 50; i++ { // the table hears of dum0 soon after ip(8) returns
				time.Sleep(20 * time.Millisecond)
				err = h.reconcile(t, o.Key())
			}
			if err != nil {
				t.Fatalf("reconcile %s: %v", o.GetMeta().GetName(), err)
			}
		}
		got := h.table(t, f, 100)
		if !strings.Contains(got, f.prefix+" via "+f.gw1+" dev eth0 proto 241") || !strings.Contains(got, f.prefix2+" dev dum0 proto 241") {
			t.Fatalf("table 100:\n%s", got)
		}
		writes := h.rec.KernelWrites()
		for _, o := range []*nimbusv1.Object{obj, obj2} {
			if err := h.reconcile(t, o.Key()); err != nil {
				t.Fatalf("second reconcile of %s: %v", o.GetMeta().GetName(), err)
			}
		}
		if n := h.rec.KernelWrites() - writes; n != 0 {
			t.Errorf("reconciling unchanged routes through devices wrote the kernel %d times", n)
		}

		missing := route("no-dev", 100, f.prefix3)
		missing.GetRoute().Nexthops = []*nimbusv1.NextHop{{Device: "nope0"}}
		h.put(t, missing)
		var he *hal.Error
		if err := h.reconcile(t, missing.Key()); !errors.As(err, &he) || he.Reason != hal.ReasonKernelError || !strings.Contains(err.Error(), `"nope0"`) {
			t.Errorf("reconcile through a missing device = %v, want a kernel error naming nope0", err)
		}
	})
}
