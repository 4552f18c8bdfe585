package linux

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"go.uber.org/goleak"

	"github.com/naplesnet/naples/delphi"
	"github.com/naplesnet/naples/hal"
	"github.com/naplesnet/naples/internal/testns"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// host is a test host: a fresh namespace with two connected subnets, 10.10.0.0/24 on
// eth0 and 10.20.0.0/24 on eth1, a delphi store and a route reconciler bound to it.
type host struct {
	ns      string
	nl      *netlink.Handle
	store   *delphi.Store
	desired *delphi.DesiredWriter
	rec     *RouteReconciler
}

func newHost(t *testing.T) *host {
	t.Helper()
	ns := testns.Named(t, "naples-hal")
	for _, args := range [][]string{
		{"link", "add", "eth0", "type", "veth", "peer", "name", "eth1"},
		{"addr", "add", "10.10.0.1/24", "dev", "eth0"},
		{"addr", "add", "10.20.0.1/24", "dev", "eth1"},
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
	store, err := delphi.Open(delphi.Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	desired, err := store.ClaimDesired()
	if err != nil {
		t.Fatal(err)
	}
	rec, err := NewRouteReconciler(RouteOptions{Store: store, Namespace: &nsh, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rec.Close() })
	return &host{ns: ns, nl: nl, store: store, desired: desired, rec: rec}
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

func (h *host) put(t *testing.T, objs ...*nimbusv1.Object) {
	t.Helper()
	txn := &delphi.DesiredTxn{}
	for _, o := range objs {
		txn.Put(o)
	}
	if err := h.desired.Commit(txn); err != nil {
		t.Fatal(err)
	}
}

func (h *host) del(t *testing.T, key *nimbusv1.ObjectKey) {
	t.Helper()
	txn := &delphi.DesiredTxn{}
	txn.Delete(key)
	if err := h.desired.Commit(txn); err != nil {
		t.Fatal(err)
	}
}

// reconcile runs the reconciler the way the HAL does: with the object delphi holds now.
func (h *host) reconcile(t *testing.T, key *nimbusv1.ObjectKey) error {
	t.Helper()
	obj, _ := h.store.Get(key)
	_, err := h.rec.Reconcile(context.Background(), key, obj)
	return err
}

// table lists the kernel's table as `ip route show table N` does.
func (h *host) table(t *testing.T, table int) string {
	t.Helper()
	return testns.Run(t, "ip", "-n", h.ns, "route", "show", "table", strconv.Itoa(table))
}

func TestRouteLifecycle(t *testing.T) {
	h := newHost(t)
	obj := route("to-dc2", 100, "198.51.100.0/24", "10.10.0.2")
	key := obj.Key()

	h.put(t, obj)
	if err := h.reconcile(t, key); err != nil {
		t.Fatalf("reconcile: %v", err)
	}
	if got := h.table(t, 100); !strings.Contains(got, "198.51.100.0/24 via 10.10.0.2 dev eth0 proto 241") {
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
	h.put(t, route("to-dc2", 100, "198.51.100.0/24", "10.20.0.2"))
	if err := h.reconcile(t, key); err != nil {
		t.Fatalf("reconcile after next-hop change: %v", err)
	}
	if got := h.table(t, 100); !strings.Contains(got, "via 10.20.0.2 dev eth1") || strings.Contains(got, "10.10.0.2") {
		t.Fatalf("table 100 after next-hop change:\n%s", got)
	}

	// Two next hops make an ECMP route.
	h.put(t, route("to-dc2", 100, "198.51.100.0/24", "10.10.0.2", "10.20.0.2"))
	if err := h.reconcile(t, key); err != nil {
		t.Fatalf("reconcile ECMP: %v", err)
	}
	got := h.table(t, 100)
	if !strings.Contains(got, "nexthop via 10.10.0.2 dev eth0") || !strings.Contains(got, "nexthop via 10.20.0.2 dev eth1") {
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
	h.put(t, route("to-dc2", 100, "203.0.113.0/24", "10.10.0.2"))
	if err := h.reconcile(t, key); err != nil {
		t.Fatal(err)
	}
	if got := h.table(t, 100); strings.Contains(got, "198.51.100.0/24") || !strings.Contains(got, "203.0.113.0/24") {
		t.Fatalf("table 100 after prefix change:\n%s", got)
	}

	// Delete, twice.
	h.del(t, key)
	for i := range 2 {
		if err := h.reconcile(t, key); err != nil {
			t.Fatalf("delete %d: %v", i+1, err)
		}
	}
	if got := h.table(t, 100); strings.TrimSpace(got) != "" {
		t.Fatalf("table 100 after delete:\n%s", got)
	}
}

func TestRouteLeavesForeignRoutesAlone(t *testing.T) {
	h := newHost(t)
	// Routes that naples did not create: one beside ours, one on the prefix we want.
	testns.Run(t, "ip", "-n", h.ns, "route", "add", "192.0.2.0/24", "via", "10.10.0.9", "table", "100")
	testns.Run(t, "ip", "-n", h.ns, "route", "add", "203.0.113.0/24", "via", "10.10.0.9", "table", "100")

	ours := route("ours", 100, "198.51.100.0/24", "10.10.0.2")
	clash := route("clash", 100, "203.0.113.0/24", "10.10.0.2")
	h.put(t, ours, clash)
	if err := h.reconcile(t, ours.Key()); err != nil {
		t.Fatal(err)
	}
	err := h.reconcile(t, clash.Key())
	var re interface{ Reason() string }
	if !errors.As(err, &re) || re.Reason() != ReasonConflict || !strings.Contains(err.Error(), "not created by naples") {
		t.Fatalf("reconcile onto a foreign route: err = %v, want a Conflict", err)
	}
	h.del(t, ours.Key())
	h.del(t, clash.Key())
	for _, k := range []*nimbusv1.ObjectKey{ours.Key(), clash.Key()} {
		if err := h.reconcile(t, k); err != nil {
			t.Fatal(err)
		}
	}
	if err := h.rec.Sweep(context.Background()); err != nil {
		t.Fatal(err)
	}
	got := h.table(t, 100)
	for _, want := range []string{"192.0.2.0/24 via 10.10.0.9", "203.0.113.0/24 via 10.10.0.9"} {
		if !strings.Contains(got, want) {
			t.Errorf("foreign route %q was touched; table 100:\n%s", want, got)
		}
	}
	if strings.Contains(got, "198.51.100.0/24") {
		t.Errorf("our route survived its delete:\n%s", got)
	}
}

func TestRouteConflictBetweenObjects(t *testing.T) {
	h := newHost(t)
	a := route("a", 100, "198.51.100.0/24", "10.10.0.2")
	b := route("b", 100, "198.51.100.0/24", "10.20.0.2")
	h.put(t, a, b)
	if err := h.reconcile(t, a.Key()); err != nil {
		t.Fatal(err)
	}
	if err := h.reconcile(t, b.Key()); err == nil || !strings.Contains(err.Error(), a.Key().ID()) {
		t.Fatalf("second object on the same route: err = %v, want a conflict naming %s", err, a.Key().ID())
	}
	if got := h.table(t, 100); !strings.Contains(got, "via 10.10.0.2") {
		t.Fatalf("the owner's route was disturbed:\n%s", got)
	}
}

func TestSweepRemovesStaleAndAdopts(t *testing.T) {
	h := newHost(t)
	// A previous agent left two routes behind; only one is still desired.
	testns.Run(t, "ip", "-n", h.ns, "route", "add", "198.51.100.0/24", "via", "10.10.0.2", "table", "100", "proto", "241")
	testns.Run(t, "ip", "-n", h.ns, "route", "add", "203.0.113.0/24", "via", "10.10.0.2", "table", "200", "proto", "241")
	kept := route("kept", 100, "198.51.100.0/24", "10.10.0.2")
	h.put(t, kept)

	if err := h.rec.Sweep(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := h.table(t, 200); strings.TrimSpace(got) != "" {
		t.Errorf("stale route in table 200 survived the sweep:\n%s", got)
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
	if got := h.table(t, 100); strings.TrimSpace(got) != "" {
		t.Errorf("adopted route survived its delete:\n%s", got)
	}
}

// TestHAL runs the whole HAL on the route reconciler: status, retries, drift repair.
func TestHAL(t *testing.T) {
	h := newHost(t)
	limiter := hal.DefaultRateLimiter()
	hl, err := hal.New(hal.Options{Store: h.store, Reconcilers: []hal.Reconciler{h.rec}, RateLimiter: limiter, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- hl.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})

	good := route("good", 100, "198.51.100.0/24", "10.10.0.2")
	// 10.30.0.0/24 is not connected yet: the kernel refuses the gateway.
	unreachable := route("later", 100, "203.0.113.0/24", "10.30.0.2")
	network := &nimbusv1.Object{Meta: &nimbusv1.ObjectMeta{Name: "net1", Generation: 3}, Spec: &nimbusv1.Object_Network{Network: &nimbusv1.NetworkSpec{Vni: 1, Subnet: "10.0.0.0/24"}}}
	h.put(t, good, unreachable, network)

	waitStatus(t, h.store, good.Key(), func(s *nimbusv1.NodeStatus) bool {
		return s.GetPhase() == nimbusv1.Phase_PHASE_PROGRAMMED && s.GetObservedGeneration() == 1
	})
	st := waitStatus(t, h.store, unreachable.Key(), func(s *nimbusv1.NodeStatus) bool {
		return s.GetPhase() == nimbusv1.Phase_PHASE_FAILED
	})
	if st.GetReason() != ReasonKernelError || !strings.Contains(st.GetMessage(), "unreachable") {
		t.Errorf("FAILED status = %v, want KernelError with the kernel's message", st)
	}
	waitStatus(t, h.store, network.Key(), func(s *nimbusv1.NodeStatus) bool {
		return s.GetPhase() == nimbusv1.Phase_PHASE_PENDING && s.GetReason() == hal.ReasonUnsupported && s.GetObservedGeneration() == 3
	})

	// Connect the gateway's subnet: the retry programs the route without any new event.
	testns.Run(t, "ip", "-n", h.ns, "addr", "add", "10.30.0.1/24", "dev", "eth0")
	waitStatus(t, h.store, unreachable.Key(), func(s *nimbusv1.NodeStatus) bool {
		return s.GetPhase() == nimbusv1.Phase_PHASE_PROGRAMMED
	})

	// Drift: a route deleted by hand comes back.
	testns.Run(t, "ip", "-n", h.ns, "route", "del", "198.51.100.0/24", "table", "100")
	waitFor(t, "route deleted by hand to come back", func() bool {
		return strings.Contains(h.table(t, 100), "198.51.100.0/24 via 10.10.0.2")
	})

	// Delete: the route and the status go.
	h.del(t, good.Key())
	waitFor(t, "route and status to go", func() bool {
		_, ok := h.store.Status(good.Key())
		return !ok && !strings.Contains(h.table(t, 100), "198.51.100.0/24")
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
