package fwbpf

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"reflect"
	"regexp"
	"runtime"
	"strconv"
	"testing"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"go.uber.org/goleak"

	"github.com/naplesnet/naples/hal/firewall"
	"github.com/naplesnet/naples/internal/testns"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// The return codes of a tcx program (enum tcx_action_base).
const (
	tcxNext = ^uint32(0) // TCX_NEXT, -1
	tcxPass = 0          // TCX_PASS
	tcxDrop = 2          // TCX_DROP
)

// skbContext is the start of struct __sk_buff, up to ifindex: the context of a test run.
// The kernel takes the device of a test run's packet from ifindex (an interface of the
// caller's network namespace; 0 and 1 mean loopback), and zero-fills the rest.
type skbContext struct {
	Len, PktType, Mark, QueueMapping, Protocol, VlanPresent, VlanTCI, VlanProto uint32
	Priority, IngressIfindex, Ifindex                                           uint32
}

// Ids of the snapshots the tests build.
const (
	scope1  = 0x5c01 // the tenant of endpoints A and B
	scope2  = 0x5c02 // another tenant
	epA     = 0xa1   // endpoint A's id
	epB     = 0xb1   // endpoint B's id
	subject = 0x5b   // the subject of the protected endpoints
	idPeer  = 0x1d   // the identity of family.peer
	gen1    = 0x61
	gen2    = 0x62
	gen3    = 0x63
	gen4    = 0x64
)

// family is the addressing of one IP family in the tests.
type family struct {
	name string
	// ep is endpoint A's address, peer a peer with identity idPeer, other a peer of
	// the world identity.
	ep, peer, other netip.Addr
	// net24 and net29 are nested prefixes; in24 lies in net24 only, in29 in net29.
	net24, net29 netip.Prefix
	in24, in29   netip.Addr
	// icmp is the IP protocol of ICMP; the rest are ICMP types and codes.
	icmp                     uint8
	echoRequest, echoReply   uint8
	unreachType, unreachCode uint8 // destination (port) unreachable
	tooBigType, tooBigCode   uint8 // fragmentation needed, packet too big
	timeExceeded             uint8
}

var families = []family{
	{
		name: "IPv4",
		ep:   netip.MustParseAddr("10.0.0.2"), peer: netip.MustParseAddr("10.0.1.9"),
		other: netip.MustParseAddr("192.0.2.7"),
		net24: netip.MustParsePrefix("10.0.2.0/24"), net29: netip.MustParsePrefix("10.0.2.8/29"),
		in24: netip.MustParseAddr("10.0.2.3"), in29: netip.MustParseAddr("10.0.2.9"),
		icmp: 1, echoRequest: 8, echoReply: 0,
		unreachType: 3, unreachCode: 3, tooBigType: 3, tooBigCode: 4, timeExceeded: 11,
	},
	{
		name: "IPv6",
		ep:   netip.MustParseAddr("fd00::2"), peer: netip.MustParseAddr("fd00:1::9"),
		other: netip.MustParseAddr("2001:db8::7"),
		net24: netip.MustParsePrefix("fd00:2::/120"), net29: netip.MustParsePrefix("fd00:2::8/125"),
		in24: netip.MustParseAddr("fd00:2::3"), in29: netip.MustParseAddr("fd00:2::9"),
		icmp: 58, echoRequest: 128, echoReply: 129,
		unreachType: 1, unreachCode: 4, tooBigType: 2, tooBigCode: 0, timeExceeded: 3,
	},
}

// forEachFamily runs the test once per IP family, each with a fixture of its own.
func forEachFamily(t *testing.T, test func(t *testing.T, f *fixture, fam family)) {
	for _, fam := range families {
		t.Run(fam.name, func(t *testing.T) { test(t, newFixture(t), fam) })
	}
}

// hostPrefix returns the prefix of the address alone.
func hostPrefix(a netip.Addr) netip.Prefix {
	return netip.PrefixFrom(a, a.BitLen())
}

// tcp returns a TCP packet from src:sport to dst:dport with the flags.
func tcp(src netip.Addr, sport uint16, dst netip.Addr, dport uint16, flags uint8) packet {
	return packet{src: src, dst: dst, proto: ipProtoTCP, sport: sport, dport: dport, tcpFlags: flags}
}

// udp returns a UDP packet from src:sport to dst:dport.
func udp(src netip.Addr, sport uint16, dst netip.Addr, dport uint16) packet {
	return packet{src: src, dst: dst, proto: ipProtoUDP, sport: sport, dport: dport}
}

// icmp returns an ICMP packet of the type and code; id is an echo's id.
func (fam family) icmpPacket(src, dst netip.Addr, typ, code uint8, id uint16) packet {
	return packet{src: src, dst: dst, proto: fam.icmp, icmpType: typ, icmpCode: code, icmpID: id}
}

// entry is an entry of a snapshot.
type entry struct {
	k firewall.Key
	v firewall.Value
}

// endpoint returns the entry of an endpoint of scope1 on the interface.
func endpoint(ifindex, id, subject, flags, gen uint32) entry {
	return entry{firewall.EndpointKey(ifindex),
		firewall.Value{ID: id, Subject: subject, Flags: flags, Gen: gen, Scope: scope1}}
}

// identity returns the entry giving the prefix the identity in the scope.
func identity(scope uint32, p netip.Prefix, id uint32) entry {
	return entry{firewall.IdentityKey(scope, p), firewall.Value{ID: id}}
}

// policy returns a policy entry of subject: the verdict and rule for the direction,
// class, identity and the ports whose first bits bits equal port's.
func policy(dir, class uint8, id uint32, port uint16, bits int, verdict uint32, rule uint64) entry {
	return entry{firewall.PolicyKey(subject, dir, class, id, port, bits),
		firewall.Value{Verdict: verdict, Rule: rule}}
}

// fixture is the firewall loaded without pinning, with a network namespace whose
// interfaces the test runs use.
type fixture struct {
	tb   testing.TB
	spec *ebpf.CollectionSpec
	// ingress is fw_ingress (packets from the endpoint), egress fw_egress (to it).
	ingress, egress                                *ebpf.Program
	snapshots, ct, frag, ruleStats, epStats, stats *ebpf.Map
	// flows and flowLost are the flow records' ring and lost count: every test runs with
	// flow records on, in a ring of fixtureFlowRing bytes that only some read.
	flows, flowLost *ebpf.Map
	flowMaps        FlowMaps
	// ifA and ifB are interfaces of the namespace, the endpoints' in most tests; ifC
	// one that no snapshot holds.
	ifA, ifB, ifC uint32
	// inNS runs functions on a thread in the namespace.
	inNS chan func()
}

// load loads the firewall, with flow records on, with its maps unpinned, a snapshot capacity of snapshotCap
// entries and small other maps, and closes it when the test ends.
func load(tb testing.TB, snapshotCap uint32) *fixture {
	tb.Helper()
	return loadRing(tb, snapshotCap, fixtureFlowRing)
}

// loadRing is load with a ring of flow records of flowRing bytes, or, for 0, flow
// records off.
func loadRing(tb testing.TB, snapshotCap uint32, flowRing int) *fixture {
	tb.Helper()
	return loadFlows(tb, snapshotCap, flowRing, 0)
}

// loadFlows is loadRing with a budget of epRate flow records a second per endpoint and
// CPU (0: none).
func loadFlows(tb testing.TB, snapshotCap uint32, flowRing, epRate int) *fixture {
	tb.Helper()
	return loadWith(tb, snapshotCap, flowRing, epRate, nil)
}

// loadWith is loadFlows with edit, when not nil, applied to the spec before loading.
func loadWith(tb testing.TB, snapshotCap uint32, flowRing, epRate int, edit func(*ebpf.CollectionSpec) error) *fixture {
	tb.Helper()
	testns.RequireRoot(tb)
	spec, err := LoadSpec()
	if err != nil {
		tb.Fatal(err)
	}
	for _, m := range spec.Maps {
		m.Pinning = ebpf.PinNone
	}
	spec.Maps[MapCT].MaxEntries = 4096
	spec.Maps[MapRuleStats].MaxEntries = 1024
	spec.Maps[MapEndpointStats].MaxEntries = 64
	spec.Maps[MapFrag].MaxEntries = 64
	spec.Maps[MapSnapshots].InnerMap.MaxEntries = snapshotCap
	if err := setFlowRing(spec, flowRing, fixtureFlowActive, epRate); err != nil {
		tb.Fatal(err)
	}
	if edit != nil {
		if err := edit(spec); err != nil {
			tb.Fatal(err)
		}
	}
	coll, err := ebpf.NewCollection(spec)
	if err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			tb.Fatalf("loading the firewall: %+v", ve)
		}
		tb.Fatalf("loading the firewall: %v", err)
	}
	tb.Cleanup(func() { coll.Close() })
	return &fixture{
		tb:        tb,
		spec:      spec,
		ingress:   coll.Programs[ProgIngress],
		egress:    coll.Programs[ProgEgress],
		snapshots: coll.Maps[MapSnapshots],
		ct:        coll.Maps[MapCT],
		frag:      coll.Maps[MapFrag],
		ruleStats: coll.Maps[MapRuleStats],
		epStats:   coll.Maps[MapEndpointStats],
		stats:     coll.Maps[MapStats],
		flows:     coll.Maps[MapFlows],
		flowLost:  coll.Maps[MapFlowLost],
		flowMaps: FlowMaps{Flows: coll.Maps[MapFlows], Lost: coll.Maps[MapFlowLost], Suppressed: coll.Maps[MapFlowSuppressed],
			Budget: coll.Maps[MapFlowBudget], CT: coll.Maps[MapCT]},
	}
}

// fixtureFlowRing is the size of the ring of flow records of a fixture's programs.
const fixtureFlowRing = 1 << 16

// fixtureFlowActive is the active timeout of a fixture's connections: longer than any
// test, which makes a connection due by setting its entry's Reported back (setBack), and
// shorter than a machine that just booted has been up.
const fixtureFlowActive = 30 * time.Second

// newFixture loads the firewall and makes a namespace with three veth interfaces.
func newFixture(tb testing.TB) *fixture {
	tb.Helper()
	return newFixtureOf(tb, load(tb, 1024))
}

// newFixtureOf makes the namespace of the loaded fixture f.
func newFixtureOf(tb testing.TB, f *fixture) *fixture {
	tb.Helper()
	ns := testns.Named(tb, "fwbpf")
	testns.Run(tb, "ip", "-n", ns, "link", "add", "fwa", "type", "veth", "peer", "name", "fwb")
	testns.Run(tb, "ip", "-n", ns, "link", "add", "fwc", "type", "veth", "peer", "name", "fwd")
	nsh := testns.Handle(tb, ns)
	h, err := netlink.NewHandleAt(nsh)
	if err != nil {
		tb.Fatal(err)
	}
	defer h.Close()
	for name, idx := range map[string]*uint32{"fwa": &f.ifA, "fwb": &f.ifB, "fwc": &f.ifC} {
		l, err := h.LinkByName(name)
		if err != nil {
			tb.Fatal(err)
		}
		*idx = uint32(l.Attrs().Index)
	}

	// BPF_PROG_TEST_RUN finds the context's ifindex in the caller's namespace: one
	// thread enters the namespace and runs the test runs. It stays locked to its
	// goroutine, so the runtime ends it with the goroutine instead of reusing it.
	f.inNS = make(chan func())
	entered := make(chan error)
	go func() {
		runtime.LockOSThread()
		if err := netns.Set(nsh); err != nil {
			entered <- err
			return
		}
		entered <- nil
		for fn := range f.inNS {
			fn()
		}
	}()
	if err := <-entered; err != nil {
		tb.Fatalf("entering namespace %s: %v", ns, err)
	}
	tb.Cleanup(func() { close(f.inNS) })
	return f
}

// run runs the program on the frame as if it came to the interface, and returns its
// verdict.
func (f *fixture) run(prog *ebpf.Program, ifindex uint32, frame []byte) uint32 {
	f.tb.Helper()
	var ret uint32
	var err error
	done := make(chan struct{})
	f.inNS <- func() {
		defer close(done)
		ret, err = prog.Run(&ebpf.RunOptions{Data: frame, Context: skbContext{Ifindex: ifindex}})
	}
	<-done
	if err != nil {
		f.tb.Fatalf("running %s on interface %d: %v", prog, ifindex, err)
	}
	return ret
}

// from runs fw_ingress on the packet, sent by the endpoint of the interface, and
// fails the test unless the verdict is want.
func (f *fixture) from(ifindex uint32, p packet, want uint32) {
	f.tb.Helper()
	if got := f.run(f.ingress, ifindex, p.frame()); got != want {
		f.tb.Errorf("packet %s from the endpoint on %d: verdict %s, want %s", p, ifindex, verdict(got), verdict(want))
	}
}

// to runs fw_egress on the packet, sent to the endpoint of the interface, and fails the
// test unless the verdict is want.
func (f *fixture) to(ifindex uint32, p packet, want uint32) {
	f.tb.Helper()
	if got := f.run(f.egress, ifindex, p.frame()); got != want {
		f.tb.Errorf("packet %s to the endpoint on %d: verdict %s, want %s", p, ifindex, verdict(got), verdict(want))
	}
}

// verdict names a tcx return code.
func verdict(v uint32) string {
	switch v {
	case tcxNext:
		return "TCX_NEXT"
	case tcxPass:
		return "TCX_PASS"
	case tcxDrop:
		return "TCX_DROP"
	}
	return fmt.Sprint(int32(v))
}

// String describes the packet in failure messages.
func (p packet) String() string {
	switch {
	case p.proto == ipProtoTCP:
		return fmt.Sprintf("tcp %s:%d > %s:%d flags %#x", p.src, p.sport, p.dst, p.dport, p.tcpFlags)
	case p.proto == ipProtoUDP:
		return fmt.Sprintf("udp %s:%d > %s:%d", p.src, p.sport, p.dst, p.dport)
	case p.proto == icmpProto(p.src):
		return fmt.Sprintf("icmp %s > %s type %d code %d id %d", p.src, p.dst, p.icmpType, p.icmpCode, p.icmpID)
	}
	return fmt.Sprintf("proto %d %s > %s", p.proto, p.src, p.dst)
}

// install makes a snapshot of the entries and puts it in slot 0 of fw_snapshots.
func (f *fixture) install(entries ...entry) {
	f.tb.Helper()
	m, err := ebpf.NewMap(f.spec.Maps[MapSnapshots].InnerMap)
	if err != nil {
		f.tb.Fatalf("making a snapshot: %v", err)
	}
	defer m.Close()
	for _, e := range entries {
		if err := m.Put(&e.k, &e.v); err != nil {
			f.tb.Fatalf("putting %+v: %v", e, err)
		}
	}
	if err := f.snapshots.Put(uint32(0), m); err != nil {
		f.tb.Fatalf("installing the snapshot: %v", err)
	}
}

// netPort returns the port as the program stores it: its bytes in network order.
func netPort(port uint16) uint16 {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], port)
	return binary.NativeEndian.Uint16(b[:])
}

// ctKey returns the conntrack key of the packet on the interface.
func ctKey(ifindex uint32, p packet) CTKey {
	k := CTKey{Ifindex: ifindex, Family: 4, Proto: p.proto}
	if p.src.Is6() {
		k.Family = 6
	}
	s, d := p.src.AsSlice(), p.dst.AsSlice()
	copy(k.Saddr[:], s)
	copy(k.Daddr[:], d)
	switch {
	case p.fragOffset != 0:
	case p.proto == ipProtoTCP || p.proto == ipProtoUDP:
		k.Sport, k.Dport = netPort(p.sport), netPort(p.dport)
	case p.proto == icmpProto(p.src) && (p.icmpType == 8 || p.icmpType == 128):
		k.Sport = netPort(p.icmpID)
	case p.proto == icmpProto(p.src) && (p.icmpType == 0 || p.icmpType == 129):
		k.Dport = netPort(p.icmpID)
	}
	return k
}

// conn returns the conntrack entry of the packet on the interface, and whether there is
// one.
func (f *fixture) conn(ifindex uint32, p packet) (CTValue, bool) {
	f.tb.Helper()
	k := ctKey(ifindex, p)
	var v CTValue
	if err := f.ct.Lookup(&k, &v); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return v, false
		}
		f.tb.Fatalf("looking %+v up in fw_ct: %v", k, err)
	}
	return v, true
}

// mustConn returns the conntrack entry of the packet on the interface and fails the test
// when there is none.
func (f *fixture) mustConn(ifindex uint32, p packet) CTValue {
	f.tb.Helper()
	v, ok := f.conn(ifindex, p)
	if !ok {
		f.tb.Fatalf("no conntrack entry for %s on %d", p, ifindex)
	}
	return v
}

// noConn fails the test when the packet has a conntrack entry on the interface.
func (f *fixture) noConn(ifindex uint32, p packet) {
	f.tb.Helper()
	if v, ok := f.conn(ifindex, p); ok {
		f.tb.Errorf("conntrack entry for %s on %d: %+v, want none", p, ifindex, v)
	}
}

// putConn writes a conntrack entry for the packet on the interface.
func (f *fixture) putConn(ifindex uint32, p packet, v CTValue) {
	f.tb.Helper()
	k := ctKey(ifindex, p)
	if err := f.ct.Put(&k, &v); err != nil {
		f.tb.Fatalf("writing %+v to fw_ct: %v", k, err)
	}
}

// stat returns a counter of fw_stats, summed over CPUs.
func (f *fixture) stat(index uint32) uint64 {
	f.tb.Helper()
	var per []uint64
	if err := f.stats.Lookup(index, &per); err != nil {
		f.tb.Fatalf("reading fw_stats[%d]: %v", index, err)
	}
	var sum uint64
	for _, c := range per {
		sum += c
	}
	return sum
}

// wantStats fails the test unless fw_stats holds the counts.
func (f *fixture) wantStats(created, deleted, noSnapshot uint64) {
	f.tb.Helper()
	got := [3]uint64{f.stat(StatCTCreated), f.stat(StatCTDeleted), f.stat(StatNoSnapshotDrops)}
	if want := [3]uint64{created, deleted, noSnapshot}; got != want {
		f.tb.Errorf("fw_stats ct created, ct deleted, no-snapshot drops = %v, want %v", got, want)
	}
}

// makeCounters creates zero counters for the rules and endpoints, as the agent does.
func (f *fixture) makeCounters(rules []uint64, endpoints []uint32) {
	f.tb.Helper()
	cpus := ebpf.MustPossibleCPU()
	for _, r := range rules {
		if err := f.ruleStats.Put(r, make([]RuleStats, cpus)); err != nil {
			f.tb.Fatal(err)
		}
	}
	for _, e := range endpoints {
		if err := f.epStats.Put(e, make([]EndpointStats, cpus)); err != nil {
			f.tb.Fatal(err)
		}
	}
}

// ruleCount returns the counter of the rule, summed over CPUs, and whether it exists.
func (f *fixture) ruleCount(rule uint64) (RuleStats, bool) {
	f.tb.Helper()
	var per []RuleStats
	if err := f.ruleStats.Lookup(rule, &per); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return RuleStats{}, false
		}
		f.tb.Fatal(err)
	}
	var sum RuleStats
	for _, c := range per {
		sum.Packets += c.Packets
		sum.Bytes += c.Bytes
	}
	return sum, true
}

// wantRule fails the test unless the rule's counter holds the packets and bytes.
func (f *fixture) wantRule(rule, packets, bytes uint64) {
	f.tb.Helper()
	got, ok := f.ruleCount(rule)
	if !ok || got.Packets != packets || got.Bytes != bytes {
		f.tb.Errorf("rule %#x counted %d packets, %d bytes (exists %v), want %d, %d", rule, got.Packets, got.Bytes, ok, packets, bytes)
	}
}

// epCount returns the counter of the endpoint, summed over CPUs.
func (f *fixture) epCount(id uint32) EndpointStats {
	f.tb.Helper()
	var per []EndpointStats
	if err := f.epStats.Lookup(id, &per); err != nil {
		f.tb.Fatal(err)
	}
	var sum EndpointStats
	for _, c := range per {
		sum.AllowedPackets += c.AllowedPackets
		sum.AllowedBytes += c.AllowedBytes
		sum.DeniedPackets += c.DeniedPackets
		sum.DeniedBytes += c.DeniedBytes
		sum.SpoofedPackets += c.SpoofedPackets
		sum.SpoofedBytes += c.SpoofedBytes
	}
	return sum
}

// now returns bpf_ktime_get_ns's clock.
// setBack sets the timestamp *t, nanoseconds since boot as bpf_ktime_get_ns counts
// them, to d before now. The program takes a timestamp after now for a fresh one, so a
// time before boot cannot be set: on a machine up for less than d it waits, for two
// minutes at most.
func (f *fixture) setBack(t *uint64, d time.Duration) {
	f.tb.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	now := f.now()
	for ; now <= uint64(d) && time.Now().Before(deadline); now = f.now() {
		time.Sleep(100 * time.Millisecond)
	}
	if now <= uint64(d) {
		f.tb.Fatalf("the monotonic clock reads %v, not past %v", time.Duration(now), d)
	}
	*t = now - uint64(d)
}

func (f *fixture) now() uint64 {
	f.tb.Helper()
	n, err := KtimeNow()
	if err != nil {
		f.tb.Fatal(err)
	}
	return n
}

func TestOpenEndpointPasses(t *testing.T) {
	forEachFamily(t, func(t *testing.T, f *fixture, fam family) {
		f.install(endpoint(f.ifA, epA, 0, 0, gen1))
		f.makeCounters(nil, []uint32{epA})
		out := tcp(fam.ep, 40000, fam.other, 22, tcpSYN)
		in := tcp(fam.other, 40001, fam.ep, 22, tcpSYN)
		ping := fam.icmpPacket(fam.other, fam.ep, fam.echoRequest, 0, 7)
		gre := packet{src: fam.ep, dst: fam.peer, proto: ipProtoGRE}
		f.from(f.ifA, out, tcxNext)
		f.to(f.ifA, in, tcxNext)
		f.to(f.ifA, ping, tcxNext)
		f.from(f.ifA, gre, tcxNext)

		// An open endpoint's connections are tracked all the same, each in the
		// direction of its first packet, with no rule.
		if v := f.mustConn(f.ifA, out); v.Dir != DirEgress || v.Rule != 0 || v.Gen != gen1 {
			t.Errorf("entry of the outgoing connection: %+v, want dir egress, no rule, gen %#x", v, gen1)
		}
		if v := f.mustConn(f.ifA, in); v.Dir != DirIngress {
			t.Errorf("entry of the incoming connection: %+v, want dir ingress", v)
		}
		f.mustConn(f.ifA, ping)
		f.mustConn(f.ifA, gre)
		f.wantStats(4, 0, 0)
		bytes := len(out.frame()) + len(in.frame()) + len(ping.frame()) + len(gre.frame())
		if got := f.epCount(epA); got != (EndpointStats{AllowedPackets: 4, AllowedBytes: uint64(bytes)}) {
			t.Errorf("endpoint counter %+v, want 4 allowed packets of %d bytes", got, bytes)
		}
	})
}

func TestUnknownInterfaceDrops(t *testing.T) {
	forEachFamily(t, func(t *testing.T, f *fixture, fam family) {
		p := tcp(fam.ep, 40000, fam.peer, 80, tcpSYN)
		// No snapshot at all: fail closed.
		f.from(f.ifA, p, tcxDrop)
		f.to(f.ifA, p.reply(), tcxDrop)
		f.wantStats(0, 0, 2)

		// A snapshot that knows ifA only: the context's ifindex decides.
		f.install(endpoint(f.ifA, epA, 0, 0, gen1))
		f.from(f.ifC, p, tcxDrop)
		f.to(f.ifC, p.reply(), tcxDrop)
		f.noConn(f.ifC, p)
		f.from(f.ifA, p, tcxNext)
		f.wantStats(1, 0, 4)
	})
}

func TestNonIPPasses(t *testing.T) {
	f := newFixture(t)
	// Neither a snapshot nor the interface in one is needed.
	if got := f.run(f.ingress, f.ifC, arpFrame()); got != tcxNext {
		t.Errorf("ARP from the endpoint without a snapshot: %s, want TCX_NEXT", verdict(got))
	}
	f.install(endpoint(f.ifA, epA, subject, firewall.FlagIngress|firewall.FlagEgress, gen1))
	for _, ifindex := range []uint32{f.ifA, f.ifC} {
		if got := f.run(f.ingress, ifindex, arpFrame()); got != tcxNext {
			t.Errorf("ARP from the endpoint on %d: %s, want TCX_NEXT", ifindex, verdict(got))
		}
		if got := f.run(f.egress, ifindex, arpFrame()); got != tcxNext {
			t.Errorf("ARP to the endpoint on %d: %s, want TCX_NEXT", ifindex, verdict(got))
		}
	}
	f.wantStats(0, 0, 0)
}

func TestVLANTaggedDrops(t *testing.T) {
	f := newFixture(t)
	f.install(endpoint(f.ifA, epA, 0, 0, gen1)) // open: everything untagged passes
	r := f.flowReader()
	var want []flowWant
	for _, fam := range families {
		p := udp(fam.ep, 40000, fam.peer, 53)
		f.from(f.ifA, p, tcxNext)
		want = append(want, flowWant{typ: FlowNew, dir: DirEgress, p: p, ifindex: f.ifA, ep: epA})
		for _, tpid := range []uint16{0x8100, 0x88a8} {
			if got := f.run(f.ingress, f.ifA, tagged(p.frame(), tpid)); got != tcxDrop {
				t.Errorf("%s tagged %#x from the endpoint: %s, want TCX_DROP", p, tpid, verdict(got))
			}
			if got := f.run(f.egress, f.ifA, tagged(p.reply().frame(), tpid)); got != tcxDrop {
				t.Errorf("%s tagged %#x to the endpoint: %s, want TCX_DROP", p.reply(), tpid, verdict(got))
			}
			// Each is a record of its endpoint, of the tagged frame's length, without a
			// tuple.
			out, in := p, p.reply()
			out.payload, in.payload = out.payload+4, in.payload+4
			want = append(want, flowWant{typ: FlowDeny, reason: ReasonVLAN, dir: DirEgress, p: out, ifindex: f.ifA, ep: epA, noTuple: true},
				flowWant{typ: FlowDeny, reason: ReasonVLAN, dir: DirIngress, p: in, ifindex: f.ifA, ep: epA, noTuple: true})
		}
	}
	f.wantFlows(r, 0, want...)
	// A tagged frame on an interface no endpoint has is dropped without a record.
	if got := f.run(f.ingress, f.ifC, tagged(udp(families[0].ep, 40000, families[0].peer, 53).frame(), 0x8100)); got != tcxDrop {
		t.Errorf("a tagged frame on an interface of no endpoint: %s, want TCX_DROP", verdict(got))
	}
	if got := drain(t, r); len(got) != 0 {
		t.Errorf("records of a tagged frame on an interface of no endpoint: %d, want none", len(got))
	}
}

// tagged returns the frame with a VLAN tag of the TPID (VLAN 100) after its MACs.
func tagged(frame []byte, tpid uint16) []byte {
	b := append([]byte{}, frame[:12]...)
	b = binary.BigEndian.AppendUint16(b, tpid)
	b = binary.BigEndian.AppendUint16(b, 100)
	return append(b, frame[12:]...)
}

func TestNeighbourDiscoveryPasses(t *testing.T) {
	// Neighbour discovery is IPv6's; IPv4's ARP is TestNonIPPasses.
	fam := families[1]
	f := newFixture(t)
	f.install(endpoint(f.ifA, epA, subject, firewall.FlagIngress|firewall.FlagEgress, gen1))
	for typ := uint8(133); typ <= 137; typ++ {
		f.from(f.ifA, fam.icmpPacket(fam.ep, fam.peer, typ, 0, 0), tcxNext)
		f.to(f.ifA, fam.icmpPacket(fam.peer, fam.ep, typ, 0, 0), tcxNext)
	}
	// Other ICMPv6 is policy's, which denies it here.
	f.from(f.ifA, fam.icmpPacket(fam.ep, fam.peer, fam.echoRequest, 0, 1), tcxDrop)
	f.to(f.ifA, fam.icmpPacket(fam.peer, fam.ep, 138, 0, 0), tcxDrop)
	f.wantStats(0, 0, 0)
}

func TestMulticastMembershipPasses(t *testing.T) {
	f := newFixture(t)
	f.install(endpoint(f.ifA, epA, subject, firewall.FlagIngress|firewall.FlagEgress, gen1))
	v4, v6 := families[0], families[1]
	igmp := packet{src: v4.ep, dst: netip.MustParseAddr("224.0.0.22"), proto: 2, payload: 8}
	f.from(f.ifA, igmp, tcxNext)
	f.to(f.ifA, packet{src: v4.peer, dst: netip.MustParseAddr("224.0.0.1"), proto: 2, payload: 8}, tcxNext)
	for _, typ := range []uint8{130, 131, 132, 143} {
		f.from(f.ifA, v6.icmpPacket(v6.ep, netip.MustParseAddr("ff02::16"), typ, 0, 0), tcxNext)
		f.to(f.ifA, v6.icmpPacket(v6.peer, v6.ep, typ, 0, 0), tcxNext)
	}
	// MLD travels behind a hop-by-hop header, which is walked: behind it MLD passes, other
	// protocols are policy's, which denies them here (TestExtensionHeaderControlTraffic).
	for _, dst := range []string{"ff02::16", "ff05::16"} {
		mld := v6.icmpPacket(v6.ep, netip.MustParseAddr(dst), 143, 0, 0)
		mld.exts = []ext{{ipProtoHopByHop, 8}}
		f.from(f.ifA, mld, tcxNext)
	}
	f.from(f.ifA, packet{src: v6.ep, dst: v6.peer, proto: 0, payload: 16}, tcxDrop)
	f.wantStats(0, 0, 0)
}

func TestProtectedDirectionDeniesByDefault(t *testing.T) {
	forEachFamily(t, func(t *testing.T, f *fixture, fam family) {
		f.makeCounters(nil, []uint32{epA})
		in := tcp(fam.peer, 40000, fam.ep, 80, tcpSYN)
		out := tcp(fam.ep, 40001, fam.peer, 80, tcpSYN)

		// Ingress protected, by no rule: incoming denied, outgoing open.
		f.install(endpoint(f.ifA, epA, subject, firewall.FlagIngress, gen1))
		f.to(f.ifA, in, tcxDrop)
		f.noConn(f.ifA, in)
		f.from(f.ifA, out, tcxNext)
		f.mustConn(f.ifA, out)

		// Egress protected: the other way round.
		in2 := tcp(fam.peer, 40002, fam.ep, 80, tcpSYN)
		out2 := tcp(fam.ep, 40003, fam.peer, 80, tcpSYN)
		f.install(endpoint(f.ifA, epA, subject, firewall.FlagEgress, gen1))
		f.from(f.ifA, out2, tcxDrop)
		f.noConn(f.ifA, out2)
		f.to(f.ifA, in2, tcxNext)

		got := f.epCount(epA)
		n := uint64(len(in.frame()))
		if want := (EndpointStats{AllowedPackets: 2, AllowedBytes: 2 * n, DeniedPackets: 2, DeniedBytes: 2 * n}); got != want {
			t.Errorf("endpoint counter %+v, want %+v", got, want)
		}
	})
}

func TestAllowByIdentity(t *testing.T) {
	forEachFamily(t, func(t *testing.T, f *fixture, fam family) {
		f.install(
			endpoint(f.ifA, epA, subject, firewall.FlagIngress, gen1),
			// Endpoint B has the same subject in another tenant, where peer has no
			// identity.
			entry{firewall.EndpointKey(f.ifB), firewall.Value{ID: epB, Subject: subject, Flags: firewall.FlagIngress, Gen: gen1, Scope: scope2}},
			identity(scope1, hostPrefix(fam.peer), idPeer),
			policy(firewall.DirIngress, firewall.ClassTCP, idPeer, 80, 16, firewall.VerdictAllow, 11),
		)
		f.to(f.ifA, tcp(fam.peer, 40000, fam.ep, 80, tcpSYN), tcxNext)
		f.to(f.ifA, tcp(fam.other, 40000, fam.ep, 80, tcpSYN), tcxDrop)
		f.to(f.ifA, tcp(fam.peer, 40001, fam.ep, 81, tcpSYN), tcxDrop)
		f.to(f.ifA, udp(fam.peer, 40002, fam.ep, 80), tcxDrop)
		// The rule is for ingress: the endpoint's own connections to peer:80 are
		// egress, unprotected.
		f.from(f.ifA, tcp(fam.ep, 40003, fam.peer, 80, tcpSYN), tcxNext)
		// Identities are per tenant.
		f.to(f.ifB, tcp(fam.peer, 40000, fam.ep, 80, tcpSYN), tcxDrop)
		if v := f.mustConn(f.ifA, tcp(fam.peer, 40000, fam.ep, 80, tcpSYN)); v.Rule != 11 || v.Dir != DirIngress {
			t.Errorf("conntrack entry %+v, want rule 11, dir ingress", v)
		}
	})
}

func TestAllowAnyPeer(t *testing.T) {
	forEachFamily(t, func(t *testing.T, f *fixture, fam family) {
		f.install(
			endpoint(f.ifA, epA, subject, firewall.FlagIngress|firewall.FlagEgress, gen1),
			identity(scope1, hostPrefix(fam.peer), idPeer),
			policy(firewall.DirIngress, firewall.ClassTCP, firewall.AnyIdentity, 443, 16, firewall.VerdictAllow, 12),
			policy(firewall.DirEgress, firewall.ClassUDP, firewall.AnyIdentity, 53, 16, firewall.VerdictAllow, 13),
		)
		f.to(f.ifA, tcp(fam.peer, 40000, fam.ep, 443, tcpSYN), tcxNext)
		f.to(f.ifA, tcp(fam.other, 40000, fam.ep, 443, tcpSYN), tcxNext)
		f.to(f.ifA, tcp(fam.other, 40001, fam.ep, 444, tcpSYN), tcxDrop)
		f.from(f.ifA, udp(fam.ep, 40002, fam.other, 53), tcxNext)
		f.from(f.ifA, udp(fam.ep, 40003, fam.peer, 53), tcxNext)
		f.from(f.ifA, udp(fam.ep, 40004, fam.peer, 54), tcxDrop)
		if v := f.mustConn(f.ifA, udp(fam.ep, 40002, fam.other, 53)); v.Rule != 13 || v.Dir != DirEgress {
			t.Errorf("conntrack entry %+v, want rule 13, dir egress", v)
		}
	})
}

func TestPortRangePrefixes(t *testing.T) {
	forEachFamily(t, func(t *testing.T, f *fixture, fam family) {
		f.install(
			endpoint(f.ifA, epA, subject, firewall.FlagIngress, gen1),
			// 8080-8087 and 9000-9001 as port prefixes; every UDP port.
			policy(firewall.DirIngress, firewall.ClassTCP, firewall.AnyIdentity, 8080, 13, firewall.VerdictAllow, 14),
			policy(firewall.DirIngress, firewall.ClassTCP, firewall.AnyIdentity, 9000, 15, firewall.VerdictAllow, 15),
			policy(firewall.DirIngress, firewall.ClassUDP, firewall.AnyIdentity, 0, 0, firewall.VerdictAllow, 16),
		)
		for port, want := range map[uint16]uint32{
			8079: tcxDrop, 8080: tcxNext, 8083: tcxNext, 8087: tcxNext, 8088: tcxDrop,
			8999: tcxDrop, 9000: tcxNext, 9001: tcxNext, 9002: tcxDrop,
		} {
			f.to(f.ifA, tcp(fam.peer, 40000, fam.ep, port, tcpSYN), want)
		}
		for _, port := range []uint16{1, 53, 65535} {
			f.to(f.ifA, udp(fam.peer, 40000, fam.ep, port), tcxNext)
		}
	})
}

func TestDenyBeatsAllow(t *testing.T) {
	forEachFamily(t, func(t *testing.T, f *fixture, fam family) {
		f.install(
			endpoint(f.ifA, epA, subject, firewall.FlagIngress, gen1),
			identity(scope1, hostPrefix(fam.peer), idPeer),
			// Any peer may use every TCP port but 23; peer every port but 22.
			policy(firewall.DirIngress, firewall.ClassTCP, firewall.AnyIdentity, 0, 0, firewall.VerdictAllow, 1),
			policy(firewall.DirIngress, firewall.ClassTCP, firewall.AnyIdentity, 23, 16, firewall.VerdictDeny, 4),
			policy(firewall.DirIngress, firewall.ClassTCP, idPeer, 0, 0, firewall.VerdictAllow, 3),
			policy(firewall.DirIngress, firewall.ClassTCP, idPeer, 22, 16, firewall.VerdictDeny, 2),
		)
		f.makeCounters([]uint64{1, 2, 3, 4}, nil)
		toPeer22 := tcp(fam.peer, 40000, fam.ep, 22, tcpSYN)
		f.to(f.ifA, toPeer22, tcxDrop)                                  // the identity's DENY beats any-peer's ALLOW
		f.to(f.ifA, tcp(fam.peer, 40000, fam.ep, 23, tcpSYN), tcxDrop)  // any-peer's DENY beats the identity's ALLOW
		f.to(f.ifA, tcp(fam.peer, 40000, fam.ep, 80, tcpSYN), tcxNext)  // the identity's ALLOW decides first
		f.to(f.ifA, tcp(fam.other, 40000, fam.ep, 22, tcpSYN), tcxNext) // any peer may use 22
		f.to(f.ifA, tcp(fam.other, 40000, fam.ep, 23, tcpSYN), tcxDrop)
		f.noConn(f.ifA, toPeer22)
		n := uint64(len(toPeer22.frame()))
		f.wantRule(2, 1, n)
		f.wantRule(4, 2, 2*n)
		f.wantRule(3, 1, n)
		f.wantRule(1, 1, n)
	})
}

func TestIdentityByLongestPrefix(t *testing.T) {
	forEachFamily(t, func(t *testing.T, f *fixture, fam family) {
		const idNet24, idNet29 = 0x24, 0x29
		entries := []entry{
			endpoint(f.ifA, epA, subject, firewall.FlagIngress, gen1),
			identity(scope1, fam.net24, idNet24),
			identity(scope1, fam.net29, idNet29),
			policy(firewall.DirIngress, firewall.ClassTCP, idNet24, 0, 0, firewall.VerdictAllow, 17),
		}
		f.install(entries...)
		f.to(f.ifA, tcp(fam.in24, 40000, fam.ep, 80, tcpSYN), tcxNext)
		// in29 lies in both prefixes: the longer decides, and its identity has no rule.
		f.to(f.ifA, tcp(fam.in29, 40000, fam.ep, 80, tcpSYN), tcxDrop)

		f.install(append(entries, policy(firewall.DirIngress, firewall.ClassTCP, idNet29, 0, 0, firewall.VerdictAllow, 18))...)
		f.to(f.ifA, tcp(fam.in29, 40001, fam.ep, 80, tcpSYN), tcxNext)
		if v := f.mustConn(f.ifA, tcp(fam.in29, 40001, fam.ep, 80, tcpSYN)); v.Rule != 18 {
			t.Errorf("conntrack entry %+v, want rule 18", v)
		}
	})
}

func TestProtocolClasses(t *testing.T) {
	forEachFamily(t, func(t *testing.T, f *fixture, fam family) {
		entries := []entry{
			endpoint(f.ifA, epA, subject, firewall.FlagIngress, gen1),
			policy(firewall.DirIngress, firewall.ClassUDP, firewall.AnyIdentity, 53, 16, firewall.VerdictAllow, 19),
			policy(firewall.DirIngress, firewall.ClassICMP, firewall.AnyIdentity, 0, 0, firewall.VerdictAllow, 20),
		}
		f.install(entries...)
		gre := packet{src: fam.peer, dst: fam.ep, proto: ipProtoGRE, payload: 4}
		f.to(f.ifA, tcp(fam.peer, 40000, fam.ep, 53, tcpSYN), tcxDrop)
		f.to(f.ifA, udp(fam.peer, 40000, fam.ep, 53), tcxNext)
		f.to(f.ifA, fam.icmpPacket(fam.peer, fam.ep, fam.echoRequest, 0, 9), tcxNext)
		f.to(f.ifA, fam.icmpPacket(fam.peer, fam.ep, fam.timeExceeded, 0, 0), tcxNext)
		f.to(f.ifA, gre, tcxDrop)

		f.install(append(entries, policy(firewall.DirIngress, firewall.ClassOther, firewall.AnyIdentity, 0, 0, firewall.VerdictAllow, 21))...)
		f.to(f.ifA, gre, tcxNext)
		if v := f.mustConn(f.ifA, gre); v.Rule != 21 {
			t.Errorf("conntrack entry of GRE %+v, want rule 21", v)
		}
	})
}

func TestConntrackReplyPasses(t *testing.T) {
	forEachFamily(t, func(t *testing.T, f *fixture, fam family) {
		// Both directions protected; only the endpoint's connections to peer:80 and
		// peer:53/udp are allowed.
		f.install(
			endpoint(f.ifA, epA, subject, firewall.FlagIngress|firewall.FlagEgress, gen1),
			endpoint(f.ifB, epB, subject, firewall.FlagIngress|firewall.FlagEgress, gen1),
			identity(scope1, hostPrefix(fam.peer), idPeer),
			policy(firewall.DirEgress, firewall.ClassTCP, idPeer, 80, 16, firewall.VerdictAllow, 21),
			policy(firewall.DirEgress, firewall.ClassUDP, idPeer, 53, 16, firewall.VerdictAllow, 22),
		)
		f.makeCounters([]uint64{21}, nil)
		syn := tcp(fam.ep, 40000, fam.peer, 80, tcpSYN)
		before := f.now()
		f.from(f.ifA, syn, tcxNext)
		v := f.mustConn(f.ifA, syn)
		if v.Dir != DirEgress || v.Gen != gen1 || v.Rule != 21 || v.Flags != 0 || v.LastSeen < before || v.LastSeen > f.now() {
			t.Errorf("conntrack entry after SYN %+v, want dir egress, gen %#x, rule 21, no flags, last seen now", v, gen1)
		}
		synAck := syn.reply()
		synAck.tcpFlags = tcpSYN | tcpACK
		f.to(f.ifA, synAck, tcxNext)
		if v := f.mustConn(f.ifA, syn); v.Flags != CTReplied {
			t.Errorf("flags after the reply %#x, want CTReplied", v.Flags)
		}
		f.noConn(f.ifA, synAck)
		ack := syn
		ack.tcpFlags = tcpACK
		f.from(f.ifA, ack, tcxNext)
		// The reply direction's tuple is no connection of its own on another
		// interface, nor is a new connection from the peer.
		f.to(f.ifB, synAck, tcxDrop)
		f.to(f.ifA, tcp(fam.peer, 80, fam.ep, 40001, tcpSYN), tcxDrop)
		fin := syn
		fin.tcpFlags = tcpFIN | tcpACK
		f.from(f.ifA, fin, tcxNext)
		if v := f.mustConn(f.ifA, syn); v.Flags != CTReplied|CTClosing {
			t.Errorf("flags after FIN %#x, want CTReplied|CTClosing", v.Flags)
		}
		rst := synAck
		rst.tcpFlags = tcpRST
		f.to(f.ifA, rst, tcxNext)

		// The rule counts the connection's original direction: SYN, ACK, FIN.
		n := uint64(len(syn.frame()))
		f.wantRule(21, 3, 3*n)

		query := udp(fam.ep, 40005, fam.peer, 53)
		f.from(f.ifA, query, tcxNext)
		f.to(f.ifA, query.reply(), tcxNext)
		f.to(f.ifA, udp(fam.peer, 53, fam.ep, 40006), tcxDrop)
		f.wantStats(2, 0, 0)
	})
}

func TestICMPEchoReplyPasses(t *testing.T) {
	forEachFamily(t, func(t *testing.T, f *fixture, fam family) {
		f.install(
			endpoint(f.ifA, epA, subject, firewall.FlagIngress|firewall.FlagEgress, gen1),
			policy(firewall.DirEgress, firewall.ClassICMP, firewall.AnyIdentity, 0, 0, firewall.VerdictAllow, 31),
		)
		req := fam.icmpPacket(fam.ep, fam.peer, fam.echoRequest, 0, 0x1234)
		f.from(f.ifA, req, tcxNext)
		if v := f.mustConn(f.ifA, req); v.Dir != DirEgress || v.Rule != 31 {
			t.Errorf("conntrack entry of the echo request %+v, want dir egress, rule 31", v)
		}
		f.to(f.ifA, fam.icmpPacket(fam.peer, fam.ep, fam.echoReply, 0, 0x1234), tcxNext)
		f.to(f.ifA, fam.icmpPacket(fam.peer, fam.ep, fam.echoReply, 0, 0x4321), tcxDrop)
		f.to(f.ifA, fam.icmpPacket(fam.peer, fam.ep, fam.echoRequest, 0, 0x1234), tcxDrop)
		if v := f.mustConn(f.ifA, req); v.Flags != CTReplied {
			t.Errorf("flags after the echo reply %#x, want CTReplied", v.Flags)
		}
	})
}

func TestRelatedICMPErrorPasses(t *testing.T) {
	forEachFamily(t, func(t *testing.T, f *fixture, fam family) {
		// Ingress protected by no rule; the endpoint may reach peer:53/udp and
		// peer:80/tcp.
		f.install(
			endpoint(f.ifA, epA, subject, firewall.FlagIngress|firewall.FlagEgress, gen1),
			identity(scope1, hostPrefix(fam.peer), idPeer),
			policy(firewall.DirEgress, firewall.ClassUDP, idPeer, 53, 16, firewall.VerdictAllow, 22),
			policy(firewall.DirEgress, firewall.ClassTCP, idPeer, 80, 16, firewall.VerdictAllow, 21),
		)
		f.makeCounters(nil, []uint32{epA})
		query := udp(fam.ep, 40000, fam.peer, 53)
		syn := tcp(fam.ep, 40001, fam.peer, 80, tcpSYN)
		f.from(f.ifA, query, tcxNext)
		f.from(f.ifA, syn, tcxNext)

		unreachable := fam.icmpPacket(fam.peer, fam.ep, fam.unreachType, fam.unreachCode, 0)
		unreachable.embed = &query
		f.to(f.ifA, unreachable, tcxNext)
		tooBig := fam.icmpPacket(fam.other, fam.ep, fam.tooBigType, fam.tooBigCode, 0)
		tooBig.embed = &syn
		f.to(f.ifA, tooBig, tcxNext)
		// The endpoint's error about a packet of the connection's reply direction.
		reply := query.reply()
		own := fam.icmpPacket(fam.ep, fam.peer, fam.unreachType, fam.unreachCode, 0)
		own.embed = &reply
		f.from(f.ifA, own, tcxNext)
		// No conntrack entry of their own, and the connections stay as they were.
		f.noConn(f.ifA, unreachable)
		f.noConn(f.ifA, own)
		if v := f.mustConn(f.ifA, query); v.Flags != 0 {
			t.Errorf("flags of the connection %#x, want none: an error is no reply", v.Flags)
		}

		// An error about another connection is an ICMP packet like any other.
		other := udp(fam.ep, 40002, fam.peer, 53)
		unrelated := fam.icmpPacket(fam.peer, fam.ep, fam.unreachType, fam.unreachCode, 0)
		unrelated.embed = &other
		f.to(f.ifA, unrelated, tcxDrop)
		f.wantStats(2, 0, 0)
		if got := f.epCount(epA); got.AllowedPackets != 5 || got.DeniedPackets != 1 {
			t.Errorf("endpoint counter %+v, want 5 allowed, 1 denied", got)
		}
	})
}

func TestUnrelatedICMPErrorIsChecked(t *testing.T) {
	forEachFamily(t, func(t *testing.T, f *fixture, fam family) {
		entries := []entry{
			endpoint(f.ifA, epA, subject, firewall.FlagIngress, gen1),
		}
		f.install(entries...)
		f.makeCounters([]uint64{32}, nil)
		untracked := udp(fam.ep, 40000, fam.peer, 53)
		unreachable := fam.icmpPacket(fam.peer, fam.ep, fam.unreachType, fam.unreachCode, 0)
		unreachable.embed = &untracked
		truncated := unreachable
		truncated.truncate = len(unreachable.ip()) - 10 // the embedded header is cut short
		f.to(f.ifA, unreachable, tcxDrop)
		f.to(f.ifA, truncated, tcxDrop)

		f.install(append(entries, policy(firewall.DirIngress, firewall.ClassICMP, firewall.AnyIdentity, 0, 0, firewall.VerdictAllow, 32))...)
		f.to(f.ifA, unreachable, tcxNext)
		f.to(f.ifA, truncated, tcxNext)
		f.wantRule(32, 2, uint64(len(unreachable.frame())+len(truncated.frame())))
	})
}

func TestGenerationChangeRechecks(t *testing.T) {
	forEachFamily(t, func(t *testing.T, f *fixture, fam family) {
		base := []entry{
			identity(scope1, hostPrefix(fam.peer), idPeer),
		}
		snap := func(gen uint32, rules ...entry) {
			f.install(append(append(base, endpoint(f.ifA, epA, subject, firewall.FlagIngress|firewall.FlagEgress, gen)), rules...)...)
		}
		allow41 := policy(firewall.DirEgress, firewall.ClassTCP, idPeer, 80, 16, firewall.VerdictAllow, 41)
		snap(gen1, allow41)
		f.makeCounters([]uint64{41, 42, 43}, nil)
		a := tcp(fam.ep, 40000, fam.peer, 80, tcpSYN)
		b := tcp(fam.ep, 40001, fam.peer, 80, tcpSYN)
		c := tcp(fam.ep, 40002, fam.peer, 80, tcpSYN)
		for _, p := range []packet{a, b, c} {
			f.from(f.ifA, p, tcxNext)
		}
		n := uint64(len(a.frame()))

		// Still allowed, by another rule: the entries take the new generation and rule,
		// from either direction.
		allow42 := policy(firewall.DirEgress, firewall.ClassTCP, firewall.AnyIdentity, 80, 16, firewall.VerdictAllow, 42)
		snap(gen2, allow42)
		f.from(f.ifA, a, tcxNext)
		f.to(f.ifA, b.reply(), tcxNext)
		for _, p := range []packet{a, b} {
			if v := f.mustConn(f.ifA, p); v.Gen != gen2 || v.Rule != 42 {
				t.Errorf("entry of %s after the re-check %+v, want gen %#x, rule 42", p, v, gen2)
			}
		}
		f.wantRule(42, 1, n) // a's packet; b's was a reply
		if v := f.mustConn(f.ifA, c); v.Gen != gen1 {
			t.Errorf("entry of %s without packets %+v, want gen %#x still", c, v, gen1)
		}

		// Denied now, by an explicit rule: a's next packet is dropped and its entry
		// deleted; so is b's, in the reply direction; c's, by the default deny.
		snap(gen3, policy(firewall.DirEgress, firewall.ClassTCP, idPeer, 80, 16, firewall.VerdictDeny, 43))
		f.from(f.ifA, a, tcxDrop)
		f.to(f.ifA, b.reply(), tcxDrop)
		f.noConn(f.ifA, a)
		f.noConn(f.ifA, b)
		f.wantRule(43, 2, 2*n)
		snap(gen4) // no rule at all
		f.from(f.ifA, c, tcxDrop)
		f.noConn(f.ifA, c)
		f.wantStats(3, 3, 0)
		f.wantRule(41, 3, 3*n) // the three first packets only
	})
}

func TestExpiredEntryIsAbsent(t *testing.T) {
	forEachFamily(t, func(t *testing.T, f *fixture, fam family) {
		// Ingress protected by no rule: a reply passes only while its connection's
		// entry lives. (TCP's hour is TestCTExpired's: the machine may be up for less.)
		f.install(endpoint(f.ifA, epA, subject, firewall.FlagIngress, gen1))
		for _, tc := range []struct {
			name  string
			p     packet
			flags uint8
			ttl   time.Duration
		}{
			{"tcp closing", tcp(fam.ep, 40001, fam.peer, 80, tcpACK), CTClosing, CTTimeoutTCPClosing},
			{"udp", udp(fam.ep, 40002, fam.peer, 53), 0, CTTimeoutUDP},
			{"icmp", fam.icmpPacket(fam.ep, fam.peer, fam.echoRequest, 0, 77), 0, CTTimeoutICMP},
			{"other", packet{src: fam.ep, dst: fam.peer, proto: ipProtoGRE}, 0, CTTimeoutOther},
		} {
			t.Run(tc.name, func(t *testing.T) {
				// An entry older than the timeout needs a clock that has run longer
				// than that since boot: wait for it on a machine just started.
				age := uint64(tc.ttl + time.Second)
				deadline := time.Now().Add(2 * time.Minute)
				now := f.now()
				for ; now <= age && time.Now().Before(deadline); now = f.now() {
					time.Sleep(100 * time.Millisecond)
				}
				if now <= age {
					t.Fatalf("the monotonic clock reads %v, not past %v", time.Duration(now), time.Duration(age))
				}
				reply := tc.p.reply()
				if tc.p.proto == fam.icmp {
					reply = fam.icmpPacket(fam.peer, fam.ep, fam.echoReply, 0, tc.p.icmpID)
				}
				f.putConn(f.ifA, tc.p, CTValue{LastSeen: now - uint64(tc.ttl) + uint64(time.Second), Gen: gen1, Dir: DirEgress, Flags: tc.flags})
				f.to(f.ifA, reply, tcxNext)
				f.putConn(f.ifA, tc.p, CTValue{LastSeen: now - age, Gen: gen1, Dir: DirEgress, Flags: tc.flags})
				f.to(f.ifA, reply, tcxDrop)
				// The endpoint's next packet starts the connection anew.
				f.from(f.ifA, tc.p, tcxNext)
				if v := f.mustConn(f.ifA, tc.p); v.LastSeen < now || v.Flags != 0 {
					t.Errorf("entry after a new first packet %+v, want a fresh one", v)
				}
			})
		}
	})
}

func TestCTExpired(t *testing.T) {
	const now = uint64(100 * time.Hour)
	v4 := func(proto uint8) CTKey { return CTKey{Family: 4, Proto: proto} }
	v6 := func(proto uint8) CTKey { return CTKey{Family: 6, Proto: proto} }
	for _, tc := range []struct {
		name  string
		k     CTKey
		flags uint8
		ttl   time.Duration
	}{
		{"tcp", v4(ipProtoTCP), 0, CTTimeoutTCP},
		{"tcp replied", v6(ipProtoTCP), CTReplied, CTTimeoutTCP},
		{"tcp closing", v4(ipProtoTCP), CTClosing | CTReplied, CTTimeoutTCPClosing},
		{"udp", v6(ipProtoUDP), 0, CTTimeoutUDP},
		{"icmp", v4(1), 0, CTTimeoutICMP},
		{"icmpv6", v6(58), 0, CTTimeoutICMP},
		{"icmpv6 number in IPv4", v4(58), 0, CTTimeoutOther},
		{"gre", v6(ipProtoGRE), 0, CTTimeoutOther},
	} {
		live := CTValue{LastSeen: now - uint64(tc.ttl), Flags: tc.flags}
		dead := CTValue{LastSeen: now - uint64(tc.ttl) - 1, Flags: tc.flags}
		future := CTValue{LastSeen: now + 1, Flags: tc.flags}
		if CTExpired(&tc.k, &live, now) || !CTExpired(&tc.k, &dead, now) || CTExpired(&tc.k, &future, now) {
			t.Errorf("%s: CTExpired %v at its timeout, %v a nanosecond past it, %v touched after now; want false, true, false",
				tc.name, CTExpired(&tc.k, &live, now), CTExpired(&tc.k, &dead, now), CTExpired(&tc.k, &future, now))
		}
	}
}

func TestCounters(t *testing.T) {
	forEachFamily(t, func(t *testing.T, f *fixture, fam family) {
		f.install(
			endpoint(f.ifA, epA, subject, firewall.FlagIngress, gen1),
			endpoint(f.ifB, epB, subject, firewall.FlagIngress, gen1),
			policy(firewall.DirIngress, firewall.ClassUDP, firewall.AnyIdentity, 53, 16, firewall.VerdictAllow, 51),
			policy(firewall.DirIngress, firewall.ClassUDP, firewall.AnyIdentity, 54, 16, firewall.VerdictAllow, 52),
		)
		// The agent makes the counters; rule 52 and endpoint B have none.
		f.makeCounters([]uint64{51}, []uint32{epA})
		var allowed, denied uint64
		for i, size := range []int{0, 100, 1000} {
			p := udp(fam.peer, uint16(40000+i), fam.ep, 53)
			p.payload = size
			f.to(f.ifA, p, tcxNext)
			allowed += uint64(len(p.frame()))
		}
		for _, size := range []int{10, 20} {
			p := udp(fam.peer, 40000, fam.ep, 55)
			p.payload = size
			f.to(f.ifA, p, tcxDrop)
			denied += uint64(len(p.frame()))
		}
		f.to(f.ifA, udp(fam.peer, 40000, fam.ep, 54), tcxNext)
		f.to(f.ifB, udp(fam.peer, 40000, fam.ep, 54), tcxNext)

		f.wantRule(51, 3, allowed)
		if got, ok := f.ruleCount(52); ok {
			t.Errorf("rule 52's counter %+v exists: the program made it", got)
		}
		n := uint64(len(udp(fam.peer, 40000, fam.ep, 54).frame()))
		if got, want := f.epCount(epA), (EndpointStats{AllowedPackets: 4, AllowedBytes: allowed + n, DeniedPackets: 2, DeniedBytes: denied}); got != want {
			t.Errorf("endpoint A's counter %+v, want %+v", got, want)
		}
		var per []EndpointStats
		if err := f.epStats.Lookup(uint32(epB), &per); !errors.Is(err, ebpf.ErrKeyNotExist) {
			t.Errorf("endpoint B's counter: %v, want none: the program made it", err)
		}
		f.wantStats(5, 0, 0)
	})
}

func TestMalformedPacketsDrop(t *testing.T) {
	forEachFamily(t, func(t *testing.T, f *fixture, fam family) {
		// Even an open endpoint's. (A test run refuses a packet shorter than its IP
		// header, so truncation is tested on the L4 header.)
		f.install(endpoint(f.ifA, epA, 0, 0, gen1))
		f.makeCounters(nil, []uint32{epA})
		ok := tcp(fam.ep, 40000, fam.peer, 80, tcpSYN)
		hdr := 20
		if fam.ep.Is6() {
			hdr = 40
		}
		shortTCP := ok
		shortTCP.truncate = hdr + 10
		bad := map[string][]byte{"truncated TCP header": shortTCP.frame()}
		wrongVersion := ok.frame()
		wrongVersion[14] ^= 0x20 // 4 <-> 6, against the Ethernet type
		bad["wrong IP version"] = wrongVersion
		if fam.ep.Is4() {
			shortIHL := ok.frame()
			shortIHL[14] = 0x44
			bad["header length 4"] = shortIHL
			longIHL := ok.frame()
			longIHL[14] = 0x4f // options past the end of the packet
			bad["header length 15"] = longIHL
		}
		for name, frame := range bad {
			if got := f.run(f.ingress, f.ifA, frame); got != tcxDrop {
				t.Errorf("%s: %s, want TCX_DROP", name, verdict(got))
			}
		}
		if got := f.epCount(epA); got.DeniedPackets != uint64(len(bad)) || got.AllowedPackets != 0 {
			t.Errorf("endpoint counter %+v, want %d denied", got, len(bad))
		}
		f.from(f.ifA, ok, tcxNext)
		f.wantStats(1, 0, 0)
	})
}

func TestLayoutMatchesFirewall(t *testing.T) {
	// The snapshot's Go types (hal/firewall) and the generated ones must agree on
	// every field's offset, and the conntrack types on the sizes firewall.c has.
	pairs := []struct{ goType, generated any }{
		{firewall.Key{}, firewallFwKey{}},
		{firewall.Value{}, firewallFwValue{}},
	}
	for _, p := range pairs {
		a, b := reflect.TypeOf(p.goType), reflect.TypeOf(p.generated)
		if a.Size() != b.Size() {
			t.Errorf("%v is %d bytes, %v %d", a, a.Size(), b, b.Size())
		}
		var offA, offB []uintptr
		for i := range a.NumField() {
			offA = append(offA, a.Field(i).Offset)
		}
		for i := range b.NumField() {
			if b.Field(i).Name != "_" {
				offB = append(offB, b.Field(i).Offset)
			}
		}
		if !reflect.DeepEqual(offA, offB) {
			t.Errorf("field offsets of %v %v, of %v %v", a, offA, b, offB)
		}
	}
	for _, s := range []struct {
		name string
		got  uintptr
		want uintptr
	}{
		{"CTKey", unsafe.Sizeof(CTKey{}), 44},
		{"CTValue", unsafe.Sizeof(CTValue{}), 80},
		{"FlowRecord", unsafe.Sizeof(FlowRecord{}), flowRecordSize},
		{"RuleStats", unsafe.Sizeof(RuleStats{}), 16},
		{"EndpointStats", unsafe.Sizeof(EndpointStats{}), 48},
		{"TraceEntry", unsafe.Sizeof(TraceEntry{}), 16},
		{"struct fw_trace_event", unsafe.Sizeof(firewallFwTraceEvent{}), traceEventSize},
	} {
		if s.got != s.want {
			t.Errorf("%s is %d bytes, want %d", s.name, s.got, s.want)
		}
	}
}

func TestConstantsMatchC(t *testing.T) {
	src, err := os.Open("firewall.c")
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	defines := map[string]int64{}
	re := regexp.MustCompile(`^#define (FW_[A-Z0-9_]+)\s+(-?(?:0x[0-9a-fA-F]+|[0-9]+))\b`)
	sc := bufio.NewScanner(src)
	for sc.Scan() {
		if m := re.FindStringSubmatch(sc.Text()); m != nil {
			v, err := strconv.ParseInt(m[2], 0, 64)
			if err != nil {
				t.Fatal(err)
			}
			defines[m[1]] = v
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]int64{
		"FW_TCX_NEXT": -1 /* tcxNext */, "FW_TCX_PASS": tcxPass, "FW_TCX_DROP": tcxDrop,
		"FW_T_ENDPOINT": firewall.TableEndpoint, "FW_T_IDENTITY": firewall.TableIdentity, "FW_T_POLICY": firewall.TablePolicy,
		"FW_T_SOURCE":   firewall.TableSource,
		"FW_EP_INGRESS": firewall.FlagIngress, "FW_EP_EGRESS": firewall.FlagEgress, "FW_EP_GUARD": firewall.FlagGuard,
		"FW_SRC_MAC": firewall.SourceFamilyMAC, "FW_SRC_IPV4": firewall.SourceFamilyIPv4, "FW_SRC_IPV6": firewall.SourceFamilyIPv6,
		"FW_DIR_INGRESS": DirIngress, "FW_DIR_EGRESS": DirEgress,
		"FW_CLASS_TCP": firewall.ClassTCP, "FW_CLASS_UDP": firewall.ClassUDP,
		"FW_CLASS_ICMP": firewall.ClassICMP, "FW_CLASS_OTHER": firewall.ClassOther,
		"FW_ALLOW": firewall.VerdictAllow, "FW_DENY": firewall.VerdictDeny,
		"FW_ANY_IDENTITY": firewall.AnyIdentity, "FW_WORLD_IDENTITY": 0,
		"FW_CT_CLOSING": CTClosing, "FW_CT_REPLIED": CTReplied,
		"FW_CT_TIMEOUT_TCP":         int64(CTTimeoutTCP / time.Second),
		"FW_CT_TIMEOUT_TCP_CLOSING": int64(CTTimeoutTCPClosing / time.Second),
		"FW_CT_TIMEOUT_UDP":         int64(CTTimeoutUDP / time.Second),
		"FW_CT_TIMEOUT_ICMP":        int64(CTTimeoutICMP / time.Second),
		"FW_CT_TIMEOUT_OTHER":       int64(CTTimeoutOther / time.Second),
		"FW_STAT_CT_CREATED":        StatCTCreated, "FW_STAT_CT_DELETED": StatCTDeleted,
		"FW_STAT_NO_SNAPSHOT": StatNoSnapshotDrops, "FW_STAT_SPOOFED": StatSpoofedDrops, "FW_STATS": NumStats,
		"FW_FLOW_NEW": FlowNew, "FW_FLOW_DENY": FlowDeny, "FW_FLOW_END": FlowEnd, "FW_FLOW_ACTIVE": FlowActive,
		"FW_REASON_POLICY": ReasonPolicy, "FW_REASON_SPOOFED": ReasonSpoofed,
		"FW_REASON_MALFORMED": ReasonMalformed, "FW_REASON_FRAGMENT": ReasonFragment, "FW_REASON_VLAN": ReasonVLAN,
		"FW_END_FIN": EndFIN, "FW_END_RST": EndRST, "FW_END_IDLE": EndIdle,
		"FW_TRACE_DSCP": TraceDSCP, "FW_TRACES": MaxTraces,
		"FW_TRACE_ALLOWED": TraceVerdictAllowed, "FW_TRACE_DENIED": TraceVerdictDenied,
		"FW_TRACE_SEEN": TraceVerdictSeen, "FW_TRACE_DELIVERED": TraceVerdictDelivered,
		"FW_TRACE_FROM_ENDPOINT": TraceStageFromEndpoint, "FW_TRACE_TO_ENDPOINT": TraceStageToEndpoint,
		"FW_TRACE_TUNNEL_OUT": TraceStageTunnelOut, "FW_TRACE_TUNNEL_IN": TraceStageTunnelIn,
		"FW_TRACE_GATEWAY_IN": TraceStageGatewayIn, "FW_TRACE_GATEWAY_OUT": TraceStageGatewayOut,
		// The prefix lengths of the keys hal/firewall builds.
		"FW_ENDPOINT_PREFIXLEN": int64(firewall.EndpointKey(1).PrefixLen),
		"FW_IDENTITY_PREFIXLEN": int64(firewall.IdentityKey(1, netip.MustParsePrefix("0.0.0.0/0")).PrefixLen),
		"FW_POLICY_PREFIXLEN":   int64(firewall.PolicyKey(1, 0, 1, 1, 0, 0).PrefixLen),
		"FW_SOURCE_PREFIXLEN":   int64(firewall.SourceMACKey(1, [6]byte{}).PrefixLen - 48),
	} {
		got, ok := defines[name]
		if !ok {
			t.Errorf("firewall.c has no #define %s", name)
		} else if got != want {
			t.Errorf("firewall.c: %s is %d, Go says %d", name, got, want)
		}
	}
}

func TestSpec(t *testing.T) {
	spec, err := LoadSpec()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{MapSnapshots, MapCT, MapRuleStats, MapEndpointStats, MapStats, MapFlows, MapFlowLost} {
		m, ok := spec.Maps[name]
		if !ok {
			t.Errorf("no map %s", name)
			continue
		}
		if m.Pinning != ebpf.PinByName {
			t.Errorf("map %s is not pinned by name", name)
		}
	}
	for name, want := range map[string]ebpf.AttachType{ProgIngress: ebpf.AttachTCXIngress, ProgEgress: ebpf.AttachTCXEgress} {
		p, ok := spec.Programs[name]
		if !ok {
			t.Errorf("no program %s", name)
			continue
		}
		if p.Type != ebpf.SchedCLS || p.AttachType != want {
			t.Errorf("program %s is %v attached as %v, want %v, %v", name, p.Type, p.AttachType, ebpf.SchedCLS, want)
		}
	}
	if m := spec.Maps[MapFlows]; m.Type != ebpf.RingBuf {
		t.Errorf("map %s is a %v, want a ring buffer", MapFlows, m.Type)
	}
	if n := binary.Size(FlowRecord{}); n != flowRecordSize {
		t.Errorf("a FlowRecord is %d bytes, want %d", n, flowRecordSize)
	}
	inner := spec.Maps[MapSnapshots].InnerMap
	if inner == nil || inner.Type != ebpf.LPMTrie || inner.KeySize != 28 || inner.ValueSize != 32 || inner.Flags&1 == 0 {
		t.Errorf("snapshot template %+v, want an LPM trie of 28-byte keys and 32-byte values, BPF_F_NO_PREALLOC", inner)
	}
}

// benchSetup installs, for a benchmark's runs on loopback, a local endpoint there,
// protected by the rules, each allowing one identity (of one address) one port, and
// guarded against spoofing or not; it returns the frame of a TCP packet the last rule
// allows and the conntrack key of its connection.
func benchSetup(f *fixture, rules int, guard bool) ([]byte, CTKey) {
	// Program.Benchmark runs without a context: the packet comes to loopback,
	// ifindex 1, of the caller's namespace.
	const lo = 1
	fam := families[0]
	var flags, subj uint32
	if rules > 0 {
		flags, subj = firewall.FlagEgress, subject
	}
	// A guarded endpoint (one with a MAC, as users write them) has its
	// sources checked: the frame's MAC and address are its own.
	entries := []entry{endpoint(lo, epA, subj, flags, gen1)}
	if guard {
		entries = []entry{endpoint(lo, epA, subj, flags|firewall.FlagGuard, gen1),
			{firewall.SourceMACKey(lo, [6]byte(macB)), firewall.Value{ID: epA}},
			{firewall.SourceKey(lo, fam.ep), firewall.Value{ID: epA}}}
	}
	dst := fam.peer
	var port uint16 = 80
	if rules > 0 {
		for i := range rules {
			addr := netip.AddrFrom4([4]byte{10, 100, byte(i >> 8), byte(i)})
			entries = append(entries,
				identity(scope1, hostPrefix(addr), uint32(0x1000+i)),
				policy(firewall.DirEgress, firewall.ClassTCP, uint32(0x1000+i), uint16(1000+i), 16, firewall.VerdictAllow, uint64(i+1)))
			dst, port = addr, uint16(1000+i)
		}
	}
	f.install(entries...)
	f.makeCounters([]uint64{uint64(rules)}, []uint32{epA})
	p := tcp(fam.ep, 40000, dst, port, tcpACK)
	frame := p.frame()
	k := ctKey(lo, p)
	return frame, k
}

// BenchmarkProgRun measures the firewall on a packet of a new connection and of an
// established one (a conntrack hit), with snapshots of 0 to 10000 rules, against a
// program that only returns TCX_NEXT. It reports the kernel's time per run (prog-ns/op)
// and the ratio to the trivial program's (x-trivial). With 0 rules the endpoint is
// unprotected; with N, it is protected by N rules, each allowing one identity (of one
// address) one port, and the packet matches the last. guard=on makes the endpoint
// guarded against spoofing, as every endpoint with a MAC is: the frame's source MAC and
// address are checked against its own first; guard=off beside it, in the same run, gives
// the checks' cost.
func BenchmarkProgRun(b *testing.B) {
	trivial, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type:         ebpf.SchedCLS,
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, -1), asm.Return()},
		License:      "GPL",
	})
	if err != nil {
		testns.RequireRoot(b)
		b.Fatal(err)
	}
	defer trivial.Close()

	for _, c := range []struct {
		rules int
		guard bool
	}{{0, false}, {0, true}, {100, true}, {1000, true}, {10000, false}, {10000, true}} {
		guard := "off"
		if c.guard {
			guard = "on"
		}
		rules := c.rules
		b.Run(fmt.Sprintf("rules=%d/guard=%s", rules, guard), func(b *testing.B) {
			f := loadRing(b, uint32(2*rules+16), 0) // flow records off, as by default
			frame, k := benchSetup(f, rules, c.guard)

			// runs is how many runs one iteration measures.
			const runs = 200
			measure := func(prog *ebpf.Program, fresh bool) time.Duration {
				var total time.Duration
				if !fresh {
					ret, d, err := prog.Benchmark(frame, runs, nil)
					if err != nil || ret != tcxNext {
						b.Fatalf("benchmark: %s, %v", verdict(ret), err)
					}
					return d * runs
				}
				for range runs {
					if err := f.ct.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
						b.Fatal(err)
					}
					ret, d, err := prog.Benchmark(frame, 1, nil)
					if err != nil || ret != tcxNext {
						b.Fatalf("benchmark: %s, %v", verdict(ret), err)
					}
					total += d
				}
				return total
			}
			for _, c := range []struct {
				name string
				new  bool
			}{{"new", true}, {"established", false}} {
				b.Run(c.name, func(b *testing.B) {
					if !c.new {
						if ret, _, err := f.ingress.Benchmark(frame, 1, nil); err != nil || ret != tcxNext {
							b.Fatalf("making the connection: %s, %v", verdict(ret), err)
						}
					}
					created := f.stat(StatCTCreated)
					var fw, triv time.Duration
					for b.Loop() {
						fw += measure(f.ingress, c.new)
						triv += measure(trivial, c.new)
					}
					// Every new connection's run made an entry; no established one did.
					made := f.stat(StatCTCreated) - created
					if want := uint64(0); c.new {
						want = uint64(b.N * runs)
						if made != want {
							b.Fatalf("%d conntrack entries made, want %d", made, want)
						}
					} else if made != want {
						b.Fatalf("%d conntrack entries made, want none", made)
					}
					perRun := float64(fw.Nanoseconds()) / float64(b.N*runs)
					b.ReportMetric(perRun, "prog-ns/op")
					b.ReportMetric(perRun/(float64(triv.Nanoseconds())/float64(b.N*runs)), "x-trivial")
				})
			}
		})
	}
}
