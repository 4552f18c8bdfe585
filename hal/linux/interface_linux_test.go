package linux

import (
	"context"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	"github.com/naplesnet/naples/hal"
	"github.com/naplesnet/naples/hal/linux/rtnl"
	"github.com/naplesnet/naples/internal/testns"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// ifaceHost is a test host for the interface reconciler: a namespace holding nic0, one
// end of a veth pair whose other end, nic0p, is in a second namespace (the peer), both
// down; a delphi store; and a reconciler bound to the host's namespace.
type ifaceHost struct {
	testStore
	ns, peer string
	nsh      netns.NsHandle
	nl       *netlink.Handle
	rec      *InterfaceReconciler
	// stateFile is the reconcilers' InterfaceOptions.StateFile.
	stateFile string
}

func newIfaceHost(t *testing.T, statsInterval time.Duration) *ifaceHost {
	t.Helper()
	ns := testns.Named(t, "naples-if")
	peer := testns.Named(t, "naples-ifp")
	testns.Run(t, "ip", "-n", ns, "link", "add", "nic0", "type", "veth", "peer", "name", "nic0p", "netns", peer)
	nsh := testns.Handle(t, ns)
	h, err := netlink.NewHandleAt(nsh)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	host := &ifaceHost{testStore: newTestStore(t, Indexes()), ns: ns, peer: peer, nsh: nsh, nl: h,
		stateFile: filepath.Join(t.TempDir(), "interfaces.json")}
	host.rec = host.newReconciler(t, statsInterval)
	return host
}

// newReconciler returns a new interface reconciler over the host's namespace and store,
// as a restarted agent makes.
func (h *ifaceHost) newReconciler(t *testing.T, statsInterval time.Duration) *InterfaceReconciler {
	t.Helper()
	rec, err := NewInterfaceReconciler(InterfaceOptions{Store: h.store, Namespace: &h.nsh, StatsInterval: statsInterval,
		StateFile: h.stateFile, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rec.Close() })
	return rec
}

// ifaceObject returns an Interface object of generation 1 that sets the administrative
// state.
func ifaceObject(name, device string, up bool, mtu uint32, addrs ...string) *nimbusv1.Object {
	return ifaceSpecObject(name, &nimbusv1.InterfaceSpec{Device: device, AdminUp: &up, Mtu: mtu, Addresses: addrs})
}

// ifaceSpecObject returns an Interface object of generation 1 with the spec.
func ifaceSpecObject(name string, spec *nimbusv1.InterfaceSpec) *nimbusv1.Object {
	return &nimbusv1.Object{
		Meta: &nimbusv1.ObjectMeta{Name: name, Generation: 1},
		Spec: &nimbusv1.Object_Interface{Interface: spec},
	}
}

// reconcile runs rec the way the HAL does: with the object delphi holds now.
func (h *ifaceHost) reconcile(t *testing.T, rec *InterfaceReconciler, key *nimbusv1.ObjectKey) (*nimbusv1.OperationalData, error) {
	t.Helper()
	return h.reconcileStored(rec, key)
}

// mustReconcile is reconcile, failing the test on an error.
func (h *ifaceHost) mustReconcile(t *testing.T, rec *InterfaceReconciler, key *nimbusv1.ObjectKey) *nimbusv1.OperationalData {
	t.Helper()
	op, err := h.reconcile(t, rec, key)
	if err != nil {
		t.Fatalf("Reconcile %s: %v", key.ID(), err)
	}
	return op
}

// ip runs ip(8) in the host's namespace.
func (h *ifaceHost) ip(t *testing.T, args ...string) string {
	t.Helper()
	return testns.Run(t, "ip", append([]string{"-n", h.ns}, args...)...)
}

// link returns the administrative state and MTU of the link, read from the kernel.
func (h *ifaceHost) link(t *testing.T, device string) (up bool, mtu int) {
	t.Helper()
	l, err := h.nl.LinkByName(device)
	if err != nil {
		t.Fatalf("reading link %s: %v", device, err)
	}
	return l.Attrs().Flags&net.FlagUp != 0, l.Attrs().MTU
}

// protos returns the addresses of the link with their protocols (IFA_PROTO; 0 for none),
// dumped from the kernel with the netlink library's request and attribute parser, apart
// from the reconciler's own. IPv6 link-local addresses are left out.
func (h *ifaceHost) protos(t *testing.T, device string) map[string]uint8 {
	t.Helper()
	l, err := h.nl.LinkByName(device)
	if err != nil {
		t.Fatalf("reading link %s: %v", device, err)
	}
	var msgs [][]byte
	err = ifaceInNamespace(h.nsh, func() error {
		req := nl.NewNetlinkRequest(unix.RTM_GETADDR, unix.NLM_F_DUMP)
		req.AddData(nl.NewIfAddrmsg(unix.AF_UNSPEC))
		var err error
		msgs, err = req.Execute(unix.NETLINK_ROUTE, unix.RTM_NEWADDR)
		return err
	})
	if err != nil {
		t.Fatalf("dumping addresses: %v", err)
	}
	out := map[string]uint8{}
	for _, m := range msgs {
		msg := nl.DeserializeIfAddrmsg(m)
		if int(msg.Index) != l.Attrs().Index {
			continue
		}
		attrs, err := nl.ParseRouteAttr(m[msg.Len():])
		if err != nil {
			t.Fatal(err)
		}
		var addr net.IP
		proto := uint8(0)
		for _, a := range attrs {
			switch a.Attr.Type {
			case unix.IFA_ADDRESS:
				if addr == nil {
					addr = net.IP(a.Value)
				}
			case unix.IFA_LOCAL:
				addr = net.IP(a.Value)
			case 11: // IFA_PROTO
				proto = a.Value[0]
			}
		}
		if addr.IsLinkLocalUnicast() {
			continue
		}
		out[fmt.Sprintf("%s/%d", addr, msg.Prefixlen)] = proto
	}
	return out
}

// ifaceInNamespace runs f on a thread in the namespace.
func ifaceInNamespace(ns netns.NsHandle, f func() error) error { return runInNamespace(&ns, f) }

// wantProtos fails the test unless the link holds exactly the addresses of want, with
// their protocols.
func (h *ifaceHost) wantProtos(t *testing.T, what, device string, want map[string]uint8) {
	t.Helper()
	got := h.protos(t, device)
	if !maps.Equal(got, want) {
		t.Fatalf("%s: addresses of %s (with protocol) = %v; want %v", what, device, got, want)
	}
}

// runIfaceHAL runs a HAL with the host's reconciler over its store until the test ends,
// with resyncs off, so that only the observer enqueues objects after their first
// reconcile. It marks the desired table complete, so the HAL sweeps once.
func (h *ifaceHost) runIfaceHAL(t *testing.T) {
	t.Helper()
	h.desired.MarkSynced()
	runHAL(t, h.store, hal.Options{Reconcilers: []hal.Reconciler{h.rec}, ResyncInterval: -1})
}

// TestInterfaceLifecycle applies admin state, MTU and IPv4 and IPv6 addresses to a veth,
// changes them and deletes the object: the kernel follows, a repeated reconcile writes
// nothing, the addresses naples adds carry AddressProtocol, a foreign address on the same
// link is never touched, and the delete leaves admin state and MTU as they were.
func TestInterfaceLifecycle(t *testing.T) {
	h := newIfaceHost(t, -1)
	h.ip(t, "addr", "add", "192.0.2.9/24", "dev", "nic0")
	foreign := map[string]uint8{"192.0.2.9/24": 0}

	obj := ifaceObject("uplink", "nic0", true, 1400, "10.1.0.1/24", "2001:db8:1::1/64")
	h.put(t, obj)
	op := h.mustReconcile(t, h.rec, obj.Key())
	if up, mtu := h.link(t, "nic0"); !up || mtu != 1400 {
		t.Errorf("nic0 up %v, mtu %d; want up, 1400", up, mtu)
	}
	h.wantProtos(t, "after the first reconcile", "nic0", map[string]uint8{
		"10.1.0.1/24": AddressProtocol, "2001:db8:1::1/64": AddressProtocol, "192.0.2.9/24": 0,
	})
	if l := op.GetInterface(); !l.GetAdminUp() || l.GetMtu() != 1400 || l.GetOperState() == nimbusv1.LinkOperState_LINK_OPER_STATE_UNSPECIFIED {
		t.Errorf("operational = %v; want admin_up, mtu 1400, an oper_state", op)
	}
	m := op.Map()
	if m["adminUp"] != "true" || m["mtu"] != "1400" {
		t.Errorf("operational map = %v; want adminUp true, mtu 1400", m)
	}
	for _, k := range []string{"operState", "carrier", "rxBytes", "txBytes", "rxPackets", "txPackets", "rxErrors", "txErrors", "rxDropped", "txDropped"} {
		if _, ok := m[k]; !ok {
			t.Errorf("operational map = %v; want a %s", m, k)
		}
	}
	if n := h.rec.KernelWrites(); n != 3 {
		t.Errorf("first reconcile: %d kernel writes; want 3 (the link, two addresses)", n)
	}
	h.mustReconcile(t, h.rec, obj.Key())
	if n := h.rec.KernelWrites(); n != 3 {
		t.Errorf("a reconcile with nothing to change wrote %d times", n-3)
	}

	// Change everything. Taking the link down flushes its IPv6 addresses (the kernel's
	// default), which the reconcile finds gone when it removes the old one.
	obj = ifaceObject("uplink", "nic0", false, 1300, "10.1.0.2/24", "2001:db8:2::1/64")
	h.put(t, obj)
	h.mustReconcile(t, h.rec, obj.Key())
	if up, mtu := h.link(t, "nic0"); up || mtu != 1300 {
		t.Errorf("nic0 up %v, mtu %d; want down, 1300", up, mtu)
	}
	h.wantProtos(t, "after the change", "nic0", map[string]uint8{
		"10.1.0.2/24": AddressProtocol, "2001:db8:2::1/64": AddressProtocol, "192.0.2.9/24": 0,
	})
	writes := h.rec.KernelWrites()
	h.mustReconcile(t, h.rec, obj.Key())
	if n := h.rec.KernelWrites(); n != writes {
		t.Errorf("a reconcile with nothing to change wrote %d times", n-writes)
	}

	// Delete, twice: our addresses go, the foreign one stays, the state and the MTU are
	// put back as found: down, 1500.
	h.del(t, obj.Key())
	for i := range 2 {
		if _, err := h.rec.Reconcile(context.Background(), obj.Key(), nil); err != nil {
			t.Fatalf("delete %d: %v", i+1, err)
		}
	}
	if n := h.rec.dumps.Load(); n != 2 {
		t.Errorf("%d dumps; want 2, of links and of addresses, at the first reconcile: reconciles read the mirrors", n)
	}
	h.wantProtos(t, "after the delete", "nic0", foreign)
	if up, mtu := h.link(t, "nic0"); up || mtu != 1500 {
		t.Errorf("after the delete nic0 up %v, mtu %d; want it as found: down, 1500", up, mtu)
	}
}

// TestInterfaceWaitsForDevice runs the HAL with an object whose link does not exist: it is
// PENDING with reason WaitingForInterface naming the link, and once a link of that name
// appears, the observer enqueues it (nothing else would: resyncs and counter refreshes
// are off) and it is PROGRAMMED.
func TestInterfaceWaitsForDevice(t *testing.T) {
	h := newIfaceHost(t, -1)
	obj := ifaceObject("nic7", "", true, 0, "10.7.0.1/24")
	h.put(t, obj)
	h.runIfaceHAL(t)

	st := waitStatus(t, h.store, obj.Key(), func(s *nimbusv1.NodeStatus) bool {
		return s.GetPhase() == nimbusv1.Phase_PHASE_PENDING
	})
	if st.GetReason() != ReasonWaitingForInterface || !strings.Contains(st.GetMessage(), `"nic7"`) {
		t.Errorf("status = %v; want reason %s and a message naming nic7", st, ReasonWaitingForInterface)
	}

	h.ip(t, "link", "add", "nic7", "type", "veth", "peer", "name", "nic7p")
	st = waitStatus(t, h.store, obj.Key(), func(s *nimbusv1.NodeStatus) bool {
		return s.GetPhase() == nimbusv1.Phase_PHASE_PROGRAMMED
	})
	if !st.GetOperationalData().GetInterface().GetAdminUp() || st.GetOperational()["adminUp"] != "true" {
		t.Errorf("status = %v; want admin_up", st)
	}
	if up, _ := h.link(t, "nic7"); !up {
		t.Error("nic7 is down; want up")
	}
	h.wantProtos(t, "once nic7 appeared", "nic7", map[string]uint8{"10.7.0.1/24": AddressProtocol})
}

// TestInterfaceCountersGrow runs the HAL with counter refreshes every 100ms and sends UDP
// datagrams both ways over the veth pair, between the host's namespace and the peer's:
// the status reports the link up with carrier, and its counters grow by at least what
// was sent and received.
func TestInterfaceCountersGrow(t *testing.T) {
	h := newIfaceHost(t, 100*time.Millisecond)
	testns.Run(t, "ip", "-n", h.peer, "addr", "add", "10.1.0.2/24", "dev", "nic0p")
	testns.Run(t, "ip", "-n", h.peer, "link", "set", "nic0p", "up")
	obj := ifaceObject("uplink", "nic0", true, 0, "10.1.0.1/24")
	h.put(t, obj)
	h.runIfaceHAL(t)

	st := waitStatus(t, h.store, obj.Key(), func(s *nimbusv1.NodeStatus) bool {
		op := s.GetOperationalData().GetInterface()
		return s.GetPhase() == nimbusv1.Phase_PHASE_PROGRAMMED && op.GetOperState() == nimbusv1.LinkOperState_LINK_OPER_STATE_UP && op.GetCarrier()
	})
	counter := func(st *nimbusv1.NodeStatus, name string) uint64 {
		op := st.GetOperationalData().GetInterface()
		n := map[string]uint64{"txPackets": op.GetTxPackets(), "txBytes": op.GetTxBytes(), "rxPackets": op.GetRxPackets(), "rxBytes": op.GetRxBytes()}[name]
		// The string form says the same, for readers of the release before.
		if old := st.GetOperational()[name]; old != strconv.FormatUint(n, 10) {
			t.Fatalf("operational %s = %q; the typed data say %d", name, old, n)
		}
		return n
	}
	before := map[string]uint64{}
	for _, c := range []string{"txPackets", "txBytes", "rxPackets", "rxBytes"} {
		before[c] = counter(st, c)
	}

	// Neighbours set by hand: every datagram leaves at once, none waits for ARP.
	mac := func(ns, device string) string {
		nsh := testns.Handle(t, ns)
		nh, err := netlink.NewHandleAt(nsh)
		if err != nil {
			t.Fatal(err)
		}
		defer nh.Close()
		l, err := nh.LinkByName(device)
		if err != nil {
			t.Fatal(err)
		}
		return l.Attrs().HardwareAddr.String()
	}
	testns.Run(t, "ip", "-n", h.ns, "neigh", "replace", "10.1.0.2", "lladdr", mac(h.peer, "nic0p"), "dev", "nic0", "nud", "permanent")
	testns.Run(t, "ip", "-n", h.peer, "neigh", "replace", "10.1.0.1", "lladdr", mac(h.ns, "nic0"), "dev", "nic0p", "nud", "permanent")
	const datagrams, size = 20, 500
	send := func(ns, to string) {
		script := fmt.Sprintf("import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\nfor _ in range(%d): s.sendto(b'x' * %d, (%q, 9))\n", datagrams, size, to)
		testns.Run(t, "ip", "netns", "exec", ns, "python3", "-c", script)
	}
	send(h.ns, "10.1.0.2")
	send(h.peer, "10.1.0.1")

	var last *nimbusv1.NodeStatus
	waitFor(t, "counters in the status to grow by what was sent and received", func() bool {
		last, _ = h.store.Status(obj.Key())
		return counter(last, "txPackets") >= before["txPackets"]+datagrams &&
			counter(last, "txBytes") >= before["txBytes"]+datagrams*size &&
			counter(last, "rxPackets") >= before["rxPackets"]+datagrams &&
			counter(last, "rxBytes") >= before["rxBytes"]+datagrams*size
	})
	if last.GetOperationalData().GetInterface().GetOperState() != nimbusv1.LinkOperState_LINK_OPER_STATE_UP || last.GetOperational()["operState"] != "up" {
		t.Errorf("status = %v; want oper_state up", last)
	}
}

// TestInterfaceDriftRepaired runs the HAL, with resyncs and counter refreshes off, and
// changes the link by hand: an address deleted (IPv4, IPv6), the MTU changed, the link
// taken down. The observer enqueues the object each time and a reconcile repairs the
// link, while a foreign address added by hand stays.
func TestInterfaceDriftRepaired(t *testing.T) {
	h := newIfaceHost(t, -1)
	obj := ifaceObject("uplink", "nic0", true, 1400, "10.1.0.1/24", "2001:db8:1::1/64")
	h.put(t, obj)
	h.runIfaceHAL(t)
	waitStatus(t, h.store, obj.Key(), func(s *nimbusv1.NodeStatus) bool {
		return s.GetPhase() == nimbusv1.Phase_PHASE_PROGRAMMED
	})
	h.ip(t, "addr", "add", "192.0.2.9/24", "dev", "nic0")
	programmed := map[string]uint8{"10.1.0.1/24": AddressProtocol, "2001:db8:1::1/64": AddressProtocol, "192.0.2.9/24": 0}
	repaired := func(what string) {
		t.Helper()
		waitFor(t, what+" to be repaired", func() bool {
			up, mtu := h.link(t, "nic0")
			return up && mtu == 1400 && maps.Equal(h.protos(t, "nic0"), programmed)
		})
	}
	repaired("the first programming")
	h.ip(t, "addr", "del", "10.1.0.1/24", "dev", "nic0")
	repaired("an IPv4 address deleted by hand")
	h.ip(t, "-6", "addr", "del", "2001:db8:1::1/64", "dev", "nic0")
	repaired("an IPv6 address deleted by hand")
	h.ip(t, "link", "set", "nic0", "mtu", "1280")
	repaired("the MTU changed by hand")
	h.ip(t, "link", "set", "nic0", "down")
	repaired("the link taken down by hand")
}

// TestInterfaceRestartAdopts programs two objects with one reconciler, deletes one of
// them from the store while no reconciler runs, and starts a new reconciler over the same
// kernel, as a restarted agent does: reconciling the remaining object writes nothing, the
// sweep removes the deleted object's address and nothing else, and the new reconciler
// removes an address the old one added once its object no longer lists it.
func TestInterfaceRestartAdopts(t *testing.T) {
	h := newIfaceHost(t, -1)
	h.ip(t, "link", "add", "nic1", "type", "veth", "peer", "name", "nic1p")
	h.ip(t, "addr", "add", "192.0.2.9/24", "dev", "nic1")
	a := ifaceObject("a", "nic0", true, 1400, "10.1.0.1/24", "2001:db8:1::1/64")
	b := ifaceObject("b", "nic1", true, 0, "10.2.0.1/24")
	h.put(t, a, b)
	h.mustReconcile(t, h.rec, a.Key())
	h.mustReconcile(t, h.rec, b.Key())
	h.wantProtos(t, "b programmed", "nic1", map[string]uint8{"10.2.0.1/24": AddressProtocol, "192.0.2.9/24": 0})
	h.rec.Close()
	h.del(t, b.Key())

	rec := h.newReconciler(t, -1)
	h.mustReconcile(t, rec, a.Key())
	if n := rec.KernelWrites(); n != 0 {
		t.Errorf("the new reconciler wrote %d times for an object the kernel already matches; want 0", n)
	}
	var enqueued []string
	if err := rec.Sweep(context.Background(), func(key nimbusv1.Key) { enqueued = append(enqueued, key.String()) }); err != nil {
		t.Fatalf("Sweep: %v", err)
	}
	if len(enqueued) != 0 {
		t.Errorf("Sweep enqueued %v; want nothing: nothing drifted", enqueued)
	}
	h.wantProtos(t, "after the sweep", "nic1", map[string]uint8{"192.0.2.9/24": 0})
	h.wantProtos(t, "after the sweep", "nic0", map[string]uint8{"10.1.0.1/24": AddressProtocol, "2001:db8:1::1/64": AddressProtocol})
	if up, _ := h.link(t, "nic1"); up {
		t.Errorf("after the sweep nic1 is up; want it down, as found before b set it up")
	}
	if n := rec.KernelWrites(); n != 2 {
		t.Errorf("the sweep wrote %d times; want 2, the stale address and nic1's state", n)
	}
	if err := rec.Sweep(context.Background(), func(nimbusv1.Key) {}); err != nil {
		t.Fatalf("second Sweep: %v", err)
	}
	if n := rec.KernelWrites(); n != 2 {
		t.Errorf("a second sweep wrote %d times; want none", n-2)
	}

	a = ifaceObject("a", "nic0", true, 1400, "10.1.0.1/24")
	h.put(t, a)
	h.mustReconcile(t, rec, a.Key())
	h.wantProtos(t, "a's IPv6 address dropped", "nic0", map[string]uint8{"10.1.0.1/24": AddressProtocol})
}

// TestInterfaceLeavesUnsetAsFound: a spec sets only what it says, and what naples changed
// is put back when the object is deleted or the field leaves the spec, also by a
// restarted reconciler. A spec with an MTU alone leaves an UP link UP; deleting it puts
// the MTU back. A spec with adminUp alone brings a DOWN link UP; deleting it takes the
// link DOWN again.
func TestInterfaceLeavesUnsetAsFound(t *testing.T) {
	h := newIfaceHost(t, -1)
	wantLink := func(what string, wantUp bool, wantMTU int) {
		t.Helper()
		if up, mtu := h.link(t, "nic0"); up != wantUp || mtu != wantMTU {
			t.Errorf("%s: nic0 up %v, mtu %d; want up %v, mtu %d", what, up, mtu, wantUp, wantMTU)
		}
	}
	del := func(rec *InterfaceReconciler, key *nimbusv1.ObjectKey) {
		t.Helper()
		h.del(t, key)
		for i := range 2 {
			if _, err := rec.Reconcile(context.Background(), key, nil); err != nil {
				t.Fatalf("delete %d: %v", i+1, err)
			}
		}
	}

	h.ip(t, "link", "set", "nic0", "up")
	wantLink("before", true, 1500)
	mtuOnly := ifaceSpecObject("eth", &nimbusv1.InterfaceSpec{Device: "nic0", Mtu: 9000})
	h.put(t, mtuOnly)
	h.mustReconcile(t, h.rec, mtuOnly.Key())
	wantLink("spec {mtu: 9000}", true, 9000)
	del(h.rec, mtuOnly.Key())
	wantLink("after the delete", true, 1500)

	h.ip(t, "link", "set", "nic0", "down")
	// No observer runs: a sweep reads the change into the mirror.
	if err := h.rec.Sweep(context.Background(), func(nimbusv1.Key) {}); err != nil {
		t.Fatalf("Sweep: %v", err)
	}
	upOnly := ifaceSpecObject("eth", &nimbusv1.InterfaceSpec{Device: "nic0", AdminUp: proto.Bool(true)})
	h.put(t, upOnly)
	h.mustReconcile(t, h.rec, upOnly.Key())
	wantLink("spec {adminUp: true}", true, 1500)
	del(h.rec, upOnly.Key())
	wantLink("after the delete", false, 1500)

	// A field that leaves the spec is put back; one the spec sets anew is kept.
	both := ifaceSpecObject("eth", &nimbusv1.InterfaceSpec{Device: "nic0", AdminUp: proto.Bool(true), Mtu: 9000})
	h.put(t, both)
	h.mustReconcile(t, h.rec, both.Key())
	wantLink("spec {adminUp: true, mtu: 9000}", true, 9000)
	mtuOnly.Meta.Generation = 2
	h.put(t, mtuOnly)
	h.mustReconcile(t, h.rec, mtuOnly.Key())
	wantLink("adminUp left out", false, 9000)

	// A restarted reconciler puts back what the one before it changed, when the object
	// is deleted while no agent runs.
	h.put(t, both)
	h.mustReconcile(t, h.rec, both.Key())
	wantLink("spec {adminUp: true, mtu: 9000} again", true, 9000)
	h.rec.Close()
	h.del(t, both.Key())
	rec := h.newReconciler(t, -1)
	if err := rec.Sweep(context.Background(), func(nimbusv1.Key) {}); err != nil {
		t.Fatalf("Sweep: %v", err)
	}
	wantLink("after a restart and a sweep", false, 1500)
}

// TestInterfaceConflictsAndInvalid: a second object naming a link is FAILED with reason
// Conflict naming the first; an address the link holds already, not added by naples, is a
// Conflict naming it, leaves it alone and still programs the other addresses; an
// unparsable address is InvalidSpec naming the field and the value; a link naples created
// for another object (a network's bridge) is a Conflict naming that object.
func TestInterfaceConflictsAndInvalid(t *testing.T) {
	h := newIfaceHost(t, -1)
	h.ip(t, "addr", "add", "192.0.2.9/24", "dev", "nic0")
	first := ifaceObject("first", "nic0", true, 0, "10.1.0.1/24", "192.0.2.9/24")
	second := ifaceObject("second", "nic0", true, 0, "10.1.0.2/24")
	bad := ifaceObject("bad", "nic1", true, 0, "10.1.0.300/24")
	h.ip(t, "link", "add", "nbrx", "type", "bridge")
	h.ip(t, "link", "set", "nbrx", "alias", OwnerAlias("Network/default/default/blue"))
	overlay := ifaceObject("overlay", "nbrx", true, 0)
	h.put(t, first, second, bad, overlay)

	tests := []struct {
		name   string
		obj    *nimbusv1.Object
		reason string
		says   []string
	}{
		{"foreign address", first, hal.ReasonConflict, []string{"192.0.2.9/24", "nic0"}},
		{"second object on the link", second, hal.ReasonConflict, []string{first.Key().ID(), "nic0"}},
		{"unparsable address", bad, hal.ReasonInvalid, []string{"spec.addresses[0]", "10.1.0.300/24"}},
		{"link naples created for a network", overlay, hal.ReasonConflict, []string{"nbrx", "Network/default/default/blue"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := h.reconcile(t, h.rec, tc.obj.Key())
			if err == nil {
				t.Fatalf("Reconcile succeeded; want %s", tc.reason)
			}
			if r := hal.ReasonOf(err); r != tc.reason {
				t.Errorf("reason %s (%v); want %s", r, err, tc.reason)
			}
			for _, s := range tc.says {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not name %s", err, s)
				}
			}
		})
	}
	h.wantProtos(t, "after the conflicts", "nic0", map[string]uint8{"10.1.0.1/24": AddressProtocol, "192.0.2.9/24": 0})
}

// TestParseIfaceAgreesWithNetlink compares what the reconciler's dumps decode of links
// and addresses with what the netlink library decodes of them.
func TestParseIfaceAgreesWithNetlink(t *testing.T) {
	h := newIfaceHost(t, -1)
	h.ip(t, "link", "set", "nic0", "mtu", "1300", "up")
	h.ip(t, "addr", "add", "10.1.0.1/24", "dev", "nic0")
	h.ip(t, "addr", "add", "10.1.0.5", "peer", "10.9.0.1/32", "dev", "nic0")
	h.ip(t, "-6", "addr", "add", "2001:db8:1::1/64", "dev", "nic0", "nodad")
	h.ip(t, "link", "add", "nbrtest", "type", "bridge")
	h.ip(t, "link", "set", "nbrtest", "alias", OwnerAlias("Network/default/default/blue"))

	r := h.rec
	type link struct {
		index int32
		l     kernelLink
	}
	links, err := dumpObjects(context.Background(), r.rtnlConn, func(typ uint16, b []byte) (link, bool) {
		index, l, ok := parseKernelLink(b)
		return link{index, l}, ok
	}, rtnl.LinkDumpRequest())
	if err != nil {
		t.Fatal(err)
	}
	type addr struct {
		id ifaceAddrID
		a  kernelAddr
	}
	addrs, err := ifaceDump(context.Background(), r, func(typ uint16, b []byte) (addr, bool) {
		id, a, ok := parseKernelAddr(b)
		return addr{id, a}, ok
	})
	if err != nil {
		t.Fatal(err)
	}

	nlLinks, err := h.nl.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	if len(links) != len(nlLinks) {
		t.Fatalf("decoded %d links; the library %d", len(links), len(nlLinks))
	}
	for _, nlLink := range nlLinks {
		at := nlLink.Attrs()
		i := slices.IndexFunc(links, func(l link) bool { return l.l.name == at.Name })
		if i < 0 {
			t.Errorf("link %s not decoded", at.Name)
			continue
		}
		got := links[i].l
		if links[i].index != int32(at.Index) {
			t.Errorf("link %s decoded with index %d; the library says %d", at.Name, links[i].index, at.Index)
		}
		mac := string(at.HardwareAddr)
		if mac == "" && strings.Trim(got.mac, "\x00") == "" {
			mac = got.mac // the library leaves out an address of zeros (lo's)
		}
		want := kernelLink{name: at.Name, alias: at.Alias, kind: got.kind, master: int32(at.MasterIndex), up: at.Flags&net.FlagUp != 0,
			mtu: uint32(at.MTU), operState: uint8(at.OperState), carrier: got.carrier, group: at.Group, mac: mac,
			bridgePort: got.bridgePort, learning: got.learning, neighSuppress: got.neighSuppress, vxlan: got.vxlan, stats: got.stats}
		if got != want {
			t.Errorf("link %s decoded as %+v; the library says %+v", at.Name, got, want)
		}
		if got.kind != nlLink.Type() && !(got.kind == "" && nlLink.Type() == "device") {
			t.Errorf("link %s of kind %q; the library says %q", at.Name, got.kind, nlLink.Type())
		}
		// Counters of a link that is down do not move between the dumps.
		if s := at.Statistics; s != nil && !got.up && (got.stats.RxPackets != s.RxPackets || got.stats.TxBytes != s.TxBytes) {
			t.Errorf("link %s counters %+v; the library says %+v", at.Name, got.stats, s)
		}
	}
	if i := slices.IndexFunc(links, func(l link) bool { return l.l.name == "nbrtest" }); i < 0 {
		t.Errorf("the bridge not decoded: %+v", links)
	} else if owner, _ := links[i].l.owner(); owner != "Network/default/default/blue" {
		t.Errorf("the bridge's owner from its alias not decoded: %+v", links[i].l)
	}

	nlAddrs, err := h.nl.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		t.Fatal(err)
	}
	var want, got []string
	for _, a := range nlAddrs {
		ip := a.IP
		ones, _ := a.Mask.Size()
		want = append(want, fmt.Sprintf("%s/%d@%d", ip, ones, a.LinkIndex))
	}
	for _, a := range addrs {
		got = append(got, fmt.Sprintf("%s@%d", a.id.prefix, a.id.index))
	}
	slices.Sort(want)
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("decoded addresses %v; the library %v", got, want)
	}
	if !slices.Contains(got, netip.MustParsePrefix("10.1.0.5/32").String()+"@"+strconv.Itoa(ifaceLinkIndex(t, h, "nic0"))) {
		t.Errorf("the peer address decoded as %v; want its local address, 10.1.0.5/32", got)
	}
}

func ifaceLinkIndex(t *testing.T, h *ifaceHost, device string) int {
	t.Helper()
	l, err := h.nl.LinkByName(device)
	if err != nil {
		t.Fatal(err)
	}
	return l.Attrs().Index
}

// TestInterfaceFirstComeKeepsItsLink programs an Interface object on nic0, then adds one
// that names nic0 too and sorts before it by name: the newcomer is FAILED with reason
// Conflict naming the running one, which keeps the link and its addresses, reconciled
// again as well.
func TestInterfaceFirstComeKeepsItsLink(t *testing.T) {
	h := newIfaceHost(t, -1)
	running := ifaceObject("web", "nic0", true, 1400, "10.1.0.1/24")
	h.put(t, running)
	h.mustReconcile(t, h.rec, running.Key())

	newcomer := ifaceObject("aaa", "nic0", true, 9000, "10.9.0.1/24")
	h.put(t, newcomer)
	_, err := h.reconcile(t, h.rec, newcomer.Key())
	if hal.ReasonOf(err) != hal.ReasonConflict || !strings.Contains(err.Error(), running.Key().ID()) {
		t.Fatalf("reconcile of the newcomer: %v, want Conflict naming %s", err, running.Key().ID())
	}
	h.mustReconcile(t, h.rec, running.Key())
	if up, mtu := h.link(t, "nic0"); !up || mtu != 1400 {
		t.Errorf("nic0: up %v, mtu %d; want up at the running object's 1400", up, mtu)
	}
	h.wantProtos(t, "after the newcomer", "nic0", map[string]uint8{"10.1.0.1/24": AddressProtocol})
}

// TestLinkOperState checks that every kernel operational state reads in the status as
// netlink names it, in the string form too.
func TestLinkOperState(t *testing.T) {
	for s := range uint8(10) {
		op := linkStatus(kernelLink{operState: s})
		if got, want := op.Map()["operState"], netlink.LinkOperState(s).String(); got != want {
			t.Errorf("kernel state %d reads %q (%v), want %q", s, got, op.GetInterface().GetOperState(), want)
		}
	}
}
