package fwbpf

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/naplesnet/naples/hal/firewall"
	"github.com/naplesnet/naples/internal/testns"
)

// The addresses of the trace tests' two endpoints on one bridge.
var (
	traceMACA  = net.HardwareAddr{0x02, 0x74, 0, 0, 0, 0x0a}
	traceMACB  = net.HardwareAddr{0x02, 0x74, 0, 0, 0, 0x0b}
	traceAddrA = netip.MustParseAddr("10.77.0.1")
	traceAddrB = netip.MustParseAddr("10.77.0.2")
)

// Rules and ports of the trace tests' policy: A may send UDP to ports 5000 (rule
// traceRuleOut) and 7000 (traceRuleOut7000), is denied 6000 (traceRuleDenyOut); B takes
// UDP on 5000 (traceRuleIn) and denies 7000 (traceRuleDenyIn).
const (
	tracePortOK       = 5000
	tracePortDenyOut  = 6000
	tracePortDenyIn   = 7000
	traceRuleOut      = 11
	traceRuleOut7000  = 13
	traceRuleIn       = 12
	traceRuleDenyOut  = 21
	traceRuleDenyIn   = 22
	traceTestID       = 0x10203
	traceTestNonce    = 0x1122334455667788
	traceTestSrcPort  = 40001
	traceMarkerSource = 40002
)

// traceBed is a host namespace with a bridge whose ports are the host sides (hA, hB) of
// two endpoints' veths, each endpoint in a namespace of its own; the firewall is open with
// its maps pinned in a directory of its own and attached to hA and hB.
type traceBed struct {
	t        testing.TB
	o        *Objects
	host     netns.NsHandle
	nsA, nsB netns.NsHandle
	hA, hB   int
	br       int
	brMAC    net.HardwareAddr
	events   *TraceReader
	flows    *FlowReader
	udpB     int // a UDP socket of B on tracePortOK
	packetB  int // an AF_PACKET socket on B's interface
}

// inNS runs fn on a thread in the namespace; the thread is not reused afterwards.
func inNS(t testing.TB, ns netns.NsHandle, fn func() error) {
	t.Helper()
	done := make(chan error)
	go func() {
		runtime.LockOSThread() // never unlocked: the runtime ends the thread with the goroutine
		if err := netns.Set(ns); err != nil {
			done <- err
			return
		}
		done <- fn()
	}()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// newTraceBed builds the bed and installs the policy.
func newTraceBed(t *testing.T) *traceBed {
	t.Helper()
	testns.RequireRoot(t)
	host := testns.Named(t, "trh")
	a := testns.Named(t, "tra")
	b := testns.Named(t, "trb")
	testns.Run(t, "ip", "-n", host, "link", "add", "br0", "type", "bridge")
	for _, e := range []struct{ ns, h, w, mac, addr string }{
		{a, "hA", "wA", traceMACA.String(), traceAddrA.String()},
		{b, "hB", "wB", traceMACB.String(), traceAddrB.String()},
	} {
		testns.Run(t, "ip", "-n", host, "link", "add", e.h, "type", "veth", "peer", "name", e.w, "netns", e.ns)
		testns.Run(t, "ip", "-n", host, "link", "set", e.h, "master", "br0", "up")
		testns.Run(t, "ip", "-n", e.ns, "link", "set", e.w, "address", e.mac, "up")
		testns.Run(t, "ip", "-n", e.ns, "addr", "add", e.addr+"/24", "dev", e.w)
	}
	testns.Run(t, "ip", "-n", host, "link", "set", "br0", "up")
	// The endpoints know each other's MAC: no ARP, which the firewall passes anyway.
	testns.Run(t, "ip", "-n", b, "neigh", "replace", traceAddrA.String(), "lladdr", traceMACA.String(), "dev", "wB")

	testns.Run(t, "ip", "-n", a, "neigh", "replace", traceAddrB.String(), "lladdr", traceMACB.String(), "dev", "wA")
	bed := &traceBed{t: t, host: testns.Handle(t, host), nsA: testns.Handle(t, a), nsB: testns.Handle(t, b)}
	h, err := netlink.NewHandleAt(bed.host)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	for name, idx := range map[string]*int{"hA": &bed.hA, "hB": &bed.hB, "br0": &bed.br} {
		l, err := h.LinkByName(name)
		if err != nil {
			t.Fatal(err)
		}
		*idx = l.Attrs().Index
		if name == "br0" {
			bed.brMAC = l.Attrs().HardwareAddr
		}
	}

	dir := filepath.Join("/sys/fs/bpf", fmt.Sprintf("naples-fwbpf-trace-%d-%s", os.Getpid(), strings.ReplaceAll(t.Name(), "/", "-")))
	t.Cleanup(func() { os.RemoveAll(dir) })
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	bed.o, err = Open(dir, Capacities{Snapshot: 64, Conntrack: 64, Rules: 64, Endpoints: 16, Fragments: 16, FlowRing: 1 << 16}, quiet)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bed.o.Close() })
	flags := uint32(firewall.FlagIngress | firewall.FlagEgress)
	pol := func(dir uint8, port uint16, verdict uint32, rule uint64) firewall.Entry {
		return firewall.Entry{Key: firewall.PolicyKey(subject, dir, firewall.ClassUDP, firewall.AnyIdentity, port, 16),
			Value: firewall.Value{Verdict: verdict, Rule: rule}}
	}
	if err := bed.o.Install([]firewall.Entry{
		{Key: firewall.EndpointKey(uint32(bed.hA)), Value: firewall.Value{ID: epA, Subject: subject, Flags: flags, Gen: gen1, Scope: scope1}},
		{Key: firewall.EndpointKey(uint32(bed.hB)), Value: firewall.Value{ID: epB, Subject: subject, Flags: flags, Gen: gen1, Scope: scope1}},
		pol(firewall.DirEgress, tracePortOK, firewall.VerdictAllow, traceRuleOut),
		pol(firewall.DirEgress, tracePortDenyIn, firewall.VerdictAllow, traceRuleOut7000),
		pol(firewall.DirEgress, tracePortDenyOut, firewall.VerdictDeny, traceRuleDenyOut),
		pol(firewall.DirIngress, tracePortOK, firewall.VerdictAllow, traceRuleIn),
		pol(firewall.DirIngress, tracePortDenyIn, firewall.VerdictDeny, traceRuleDenyIn),
	}); err != nil {
		t.Fatal(err)
	}
	inNS(t, bed.host, func() error {
		for name, idx := range map[string]int{"a": bed.hA, "b": bed.hB} {
			if _, err := bed.o.Attach(name, idx); err != nil {
				return err
			}
		}
		return nil
	})
	t.Cleanup(func() { bed.o.Detach("a"); bed.o.Detach("b") })

	if bed.events, err = bed.o.TraceReader(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bed.events.Close() })
	if bed.flows, err = bed.o.FlowReader(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bed.flows.Close() })

	inNS(t, bed.nsB, func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		bed.udpB = fd
		if err := unix.Bind(fd, &unix.SockaddrInet4{Port: tracePortOK, Addr: traceAddrB.As4()}); err != nil {
			return fmt.Errorf("binding B's UDP socket: %w", err)
		}
		pfd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, int(htons(unix.ETH_P_ALL)))
		if err != nil {
			return err
		}
		bed.packetB = pfd
		l, err := net.InterfaceByName("wB")
		if err != nil {
			return err
		}
		return unix.Bind(pfd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: l.Index})
	})
	t.Cleanup(func() { unix.Close(bed.udpB); unix.Close(bed.packetB) })
	return bed
}

// htons returns v in network order, as AF_PACKET wants protocols.
func htons(v uint16) uint16 { return v<<8 | v>>8 }

// frame returns a UDP trace frame of A to B's port, of the trace id and nonce, from
// sport.
func (bed *traceBed) frame(id uint32, nonce uint64, sport, dport uint16) []byte {
	bed.t.Helper()
	b, err := TracePacket{ID: id, Nonce: nonce, SrcMAC: traceMACA, DstMAC: traceMACB, Src: traceAddrA, Dst: traceAddrB,
		Proto: 17, SrcPort: sport, DstPort: dport}.Frame()
	if err != nil {
		bed.t.Fatal(err)
	}
	return b
}

// inject injects the frame as if A sent it.
func (bed *traceBed) inject(frame []byte) {
	bed.t.Helper()
	inNS(bed.t, bed.host, func() error { return bed.o.InjectTrace(bed.hA, frame) })
}

// wantEvents reads the next len(want) events and checks their stage, verdict, reason,
// rule, interface and endpoint, and the trace id.
func (bed *traceBed) wantEvents(id uint32, want ...TraceEvent) {
	bed.t.Helper()
	bed.events.SetDeadline(time.Now().Add(5 * time.Second))
	for i, w := range want {
		ev, err := bed.events.Read()
		if err != nil {
			bed.t.Fatalf("trace event %d of %d: %v", i+1, len(want), err)
		}
		got := fmt.Sprintf("id %#x stage %d verdict %d reason %d rule %d ifindex %d endpoint %d live %t", ev.ID, ev.Stage, ev.Verdict, ev.Reason, ev.Rule, ev.Ifindex, ev.Endpoint, ev.Live)
		exp := fmt.Sprintf("id %#x stage %d verdict %d reason %d rule %d ifindex %d endpoint %d live %t", id, w.Stage, w.Verdict, w.Reason, w.Rule, w.Ifindex, w.Endpoint, w.Live)
		if got != exp {
			bed.t.Errorf("trace event %d: %s, want %s", i+1, got, exp)
		}
		if !bytes.Equal(ev.SrcMAC, traceMACA) || ev.Len == 0 || ev.Time == 0 {
			bed.t.Errorf("trace event %d: source MAC %s, length %d, time %d; want %s and non-zero", i+1, ev.SrcMAC, ev.Len, ev.Time, traceMACA)
		}
	}
}

// receiveB waits for B's UDP socket to receive a datagram from sport and returns its
// payload.
func (bed *traceBed) receiveB(sport int) []byte {
	bed.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	buf := make([]byte, 2048)
	for time.Now().Before(deadline) {
		tv := unix.NsecToTimeval(int64(100 * time.Millisecond))
		unix.SetsockoptTimeval(bed.udpB, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
		n, from, err := unix.Recvfrom(bed.udpB, buf, 0)
		if err != nil {
			continue
		}
		if sa, ok := from.(*unix.SockaddrInet4); ok && sa.Port == sport {
			return buf[:n]
		}
	}
	bed.t.Fatalf("B received no datagram from port %d", sport)
	return nil
}

// capturedTags returns the nonces of the trace tags in the frames B's interface saw so
// far.
func (bed *traceBed) capturedTags() []uint64 {
	var nonces []uint64
	buf := make([]byte, 4096)
	for {
		n, _, err := unix.Recvfrom(bed.packetB, buf, 0)
		if err != nil {
			return nonces
		}
		if i := bytes.Index(buf[:n], []byte(traceMagic)); i >= 0 && i+TraceTagSize <= n {
			nonces = append(nonces, binary.LittleEndian.Uint64(buf[i+16:]))
		}
	}
}

// ruleHits returns the packets counted for the rule, summed over CPUs.
func (bed *traceBed) ruleHits(rule uint64) uint64 {
	var per []RuleStats
	if err := bed.o.RuleStats.Lookup(rule, &per); err != nil {
		return 0
	}
	var n uint64
	for _, s := range per {
		n += s.Packets
	}
	return n
}

// ctEntries returns the number of conntrack entries.
func (bed *traceBed) ctEntries() int {
	var k CTKey
	var v CTValue
	n := 0
	it := bed.o.CT.Iterate()
	for it.Next(&k, &v) {
		n++
	}
	return n
}

// TestTraceDelivered injects a trace packet from A to B: it is allowed out of A and
// delivered to B, which never receives it, and leaves no conntrack entry, flow record or
// count behind. The same packet with a wrong nonce, with no trace installed, or after
// the trace stopped, is ordinary traffic from A but a stray trace packet to B: dropped
// and counted, never received. Untagged (DSCP 0), it is B's like any datagram.
func TestTraceDelivered(t *testing.T) {
	bed := newTraceBed(t)

	// No trace installed: tagged, the packet leaves A as ordinary traffic, and B's
	// interface drops it as a stray.
	bed.inject(bed.frame(traceTestID, traceTestNonce, traceMarkerSource, tracePortOK))
	bed.wantStrays(1)
	// Untagged, the same packet is ordinary traffic that B's socket receives: the
	// kernel takes its checksums.
	bed.inject(untagged(bed.frame(traceTestID, traceTestNonce, traceMarkerSource, tracePortOK)))
	if got := bed.receiveB(traceMarkerSource); !bytes.HasPrefix(got, []byte(traceMagic)) {
		t.Fatalf("B received %x, want the tag's bytes", got)
	}
	if err := bed.o.CT.Delete(ctKey(uint32(bed.hA), udp(traceAddrA, traceMarkerSource, traceAddrB, tracePortOK))); err != nil {
		t.Fatalf("the untraced packet made no conntrack entry on A's interface: %v", err)
	}
	for bed.ctEntries() > 0 {
		var k CTKey
		var v CTValue
		it := bed.o.CT.Iterate()
		it.Next(&k, &v)
		bed.o.CT.Delete(&k)
	}
	bed.flows.SetDeadline(time.Now().Add(5 * time.Second))
	for range 2 { // FlowNew at A's egress (the stray's) and at B's ingress (the untagged's)
		if _, err := bed.flows.Read(); err != nil {
			t.Fatal(err)
		}
	}
	bed.capturedTags()
	outBefore, inBefore := bed.ruleHits(traceRuleOut), bed.ruleHits(traceRuleIn)

	if err := bed.o.StartTrace(traceTestID, traceTestNonce); err != nil {
		t.Fatal(err)
	}
	bed.inject(bed.frame(traceTestID, traceTestNonce, traceTestSrcPort, tracePortOK))
	bed.wantEvents(traceTestID,
		TraceEvent{Stage: TraceStageFromEndpoint, Verdict: TraceVerdictAllowed, Rule: traceRuleOut, Ifindex: uint32(bed.hA), Endpoint: epA},
		TraceEvent{Stage: TraceStageToEndpoint, Verdict: TraceVerdictDelivered, Rule: traceRuleIn, Ifindex: uint32(bed.hB), Endpoint: epB})
	if n := bed.ctEntries(); n != 0 {
		t.Errorf("the trace packet left %d conntrack entries, want none", n)
	}
	if out, in := bed.ruleHits(traceRuleOut), bed.ruleHits(traceRuleIn); out != outBefore || in != inBefore {
		t.Errorf("rule counters went from %d, %d to %d, %d; want them unchanged", outBefore, inBefore, out, in)
	}

	// A wrong nonce: ordinary traffic from A, the first flow record since is its; a
	// stray to B.
	bed.inject(bed.frame(traceTestID, traceTestNonce+1, traceMarkerSource, tracePortOK))
	bed.wantStrays(2)
	rec, err := bed.flows.Read()
	if err != nil {
		t.Fatal(err)
	}
	if rec.Sport != netPort(traceMarkerSource) || rec.Type != FlowNew {
		t.Errorf("the first flow record after the trace is type %d from port %d, want the wrong-nonce packet's FlowNew (port %d)", rec.Type, netPort(rec.Sport), traceMarkerSource)
	}
	// Untagged, it reaches B; B's interface saw that, and never a tagged packet.
	bed.inject(untagged(bed.frame(traceTestID, traceTestNonce+2, traceMarkerSource, tracePortOK)))
	bed.receiveB(traceMarkerSource)
	sawMarker := false
	for _, n := range bed.capturedTags() {
		if n != traceTestNonce+2 {
			t.Errorf("B's interface saw a tagged packet of nonce %#x", n)
		}
		sawMarker = sawMarker || n == traceTestNonce+2
	}
	if !sawMarker {
		t.Errorf("B's interface did not see the untagged packet: the capture sees nothing")
	}
	if lost, err := bed.events.Lost(); err != nil || lost != 0 {
		t.Errorf("lost trace events: %d, %v; want 0", lost, err)
	}

	// Stopped, the trace's packets are strays to B again; stopping twice is fine.
	for range 2 {
		if err := bed.o.StopTrace(traceTestID); err != nil {
			t.Fatal(err)
		}
	}
	bed.inject(bed.frame(traceTestID, traceTestNonce, traceTestSrcPort, tracePortOK))
	bed.wantStrays(3)
}

// untagged returns the IPv4 frame with DSCP 0 and its header checksum made anew: not a
// trace packet, whatever its payload.
func untagged(frame []byte) []byte {
	f := bytes.Clone(frame)
	ip := f[14:34]
	ip[1] = 0
	ip[10], ip[11] = 0, 0
	binary.BigEndian.PutUint16(ip[10:], checksum(ip))
	return f
}

// wantStrays waits until the firewall counted n stray trace packets, and fails the test
// when it counts more, or fewer before the deadline.
func (bed *traceBed) wantStrays(n uint64) {
	bed.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		st, err := bed.o.ProgramStats()
		if err != nil {
			bed.t.Fatal(err)
		}
		if st.TraceStrayDrops == n {
			return
		}
		if st.TraceStrayDrops > n || time.Now().After(deadline) {
			bed.t.Fatalf("stray trace packets: %d, want %d", st.TraceStrayDrops, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestTraceDenied checks a trace packet that A's egress policy denies and one that B's
// ingress policy denies: DENIED with the deciding rule, nothing after it.
func TestTraceDenied(t *testing.T) {
	bed := newTraceBed(t)
	if err := bed.o.StartTrace(traceTestID, traceTestNonce); err != nil {
		t.Fatal(err)
	}
	if err := bed.o.StartTrace(traceTestID+1, traceTestNonce); err != nil {
		t.Fatal(err)
	}
	// Each denied packet is followed by a delivered one of the second trace: its events
	// come next, so the denied one went no further.
	marker := func() {
		bed.inject(bed.frame(traceTestID+1, traceTestNonce, traceTestSrcPort, tracePortOK))
		bed.wantEvents(traceTestID+1,
			TraceEvent{Stage: TraceStageFromEndpoint, Verdict: TraceVerdictAllowed, Rule: traceRuleOut, Ifindex: uint32(bed.hA), Endpoint: epA},
			TraceEvent{Stage: TraceStageToEndpoint, Verdict: TraceVerdictDelivered, Rule: traceRuleIn, Ifindex: uint32(bed.hB), Endpoint: epB})
	}
	bed.inject(bed.frame(traceTestID, traceTestNonce, traceTestSrcPort, tracePortDenyOut))
	bed.wantEvents(traceTestID,
		TraceEvent{Stage: TraceStageFromEndpoint, Verdict: TraceVerdictDenied, Reason: ReasonPolicy, Rule: traceRuleDenyOut, Ifindex: uint32(bed.hA), Endpoint: epA})
	marker()
	bed.inject(bed.frame(traceTestID, traceTestNonce, traceTestSrcPort, tracePortDenyIn))
	bed.wantEvents(traceTestID,
		TraceEvent{Stage: TraceStageFromEndpoint, Verdict: TraceVerdictAllowed, Rule: traceRuleOut7000, Ifindex: uint32(bed.hA), Endpoint: epA},
		TraceEvent{Stage: TraceStageToEndpoint, Verdict: TraceVerdictDenied, Reason: ReasonPolicy, Rule: traceRuleDenyIn, Ifindex: uint32(bed.hB), Endpoint: epB})
	marker()
	// TCP and ICMP trace packets are recognised too (the tag after TCP's header and
	// ICMP's); the policy allows neither: DENIED by default, rule 0.
	for _, proto := range []uint8{6, 1} {
		frame, err := TracePacket{ID: traceTestID, Nonce: traceTestNonce, SrcMAC: traceMACA, DstMAC: traceMACB, Src: traceAddrA,
			Dst: traceAddrB, Proto: proto, SrcPort: traceTestSrcPort, DstPort: tracePortOK, PayloadSize: 100}.Frame()
		if err != nil {
			t.Fatal(err)
		}
		bed.inject(frame)
		bed.wantEvents(traceTestID,
			TraceEvent{Stage: TraceStageFromEndpoint, Verdict: TraceVerdictDenied, Reason: ReasonPolicy, Ifindex: uint32(bed.hA), Endpoint: epA})
	}
	marker()
	if n := bed.ctEntries(); n != 0 {
		t.Errorf("the trace packets left %d conntrack entries, want none", n)
	}
	if hits := bed.ruleHits(traceRuleDenyOut) + bed.ruleHits(traceRuleDenyIn); hits != 0 {
		t.Errorf("the deny rules counted %d packets, want none", hits)
	}
}

// TestTraceObservers attaches the tunnel observers to A's interface (after the firewall:
// its ingress sees what A's policy let out) and the gateway observers to the bridge, and
// sends a trace packet to the bridge's own MAC, up to the host: SEEN events of both.
func TestTraceObservers(t *testing.T) {
	bed := newTraceBed(t)
	if err := bed.o.StartTrace(traceTestID, traceTestNonce); err != nil {
		t.Fatal(err)
	}
	var tunnel, gateway io.Closer
	inNS(t, bed.host, func() error {
		var err error
		if tunnel, err = bed.o.AttachTraceObserver(bed.hA, false); err != nil {
			return err
		}
		gateway, err = bed.o.AttachTraceObserver(bed.br, true)
		return err
	})
	frame, err := TracePacket{ID: traceTestID, Nonce: traceTestNonce, SrcMAC: traceMACA, DstMAC: bed.brMAC, Src: traceAddrA,
		Dst: traceAddrB, Proto: 17, SrcPort: traceTestSrcPort, DstPort: tracePortOK}.Frame()
	if err != nil {
		t.Fatal(err)
	}
	bed.inject(frame)
	bed.wantEvents(traceTestID,
		TraceEvent{Stage: TraceStageFromEndpoint, Verdict: TraceVerdictAllowed, Rule: traceRuleOut, Ifindex: uint32(bed.hA), Endpoint: epA},
		TraceEvent{Stage: TraceStageTunnelIn, Verdict: TraceVerdictSeen, Ifindex: uint32(bed.hA)},
		TraceEvent{Stage: TraceStageGatewayIn, Verdict: TraceVerdictSeen, Ifindex: uint32(bed.br)})

	// Closed, the observers see nothing: the next events are the endpoints' alone.
	for _, c := range []io.Closer{tunnel, gateway} {
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
	}
	bed.inject(frame)
	bed.inject(bed.frame(traceTestID, traceTestNonce, traceTestSrcPort, tracePortOK))
	bed.wantEvents(traceTestID,
		TraceEvent{Stage: TraceStageFromEndpoint, Verdict: TraceVerdictAllowed, Rule: traceRuleOut, Ifindex: uint32(bed.hA), Endpoint: epA},
		TraceEvent{Stage: TraceStageFromEndpoint, Verdict: TraceVerdictAllowed, Rule: traceRuleOut, Ifindex: uint32(bed.hA), Endpoint: epA},
		TraceEvent{Stage: TraceStageToEndpoint, Verdict: TraceVerdictDelivered, Rule: traceRuleIn, Ifindex: uint32(bed.hB), Endpoint: epB})
}

// TestTraceLimit checks that StartTrace refuses a trace past MaxTraces, naming the limit,
// and that StopTrace makes room.
func TestTraceLimit(t *testing.T) {
	bed := newTraceBed(t)
	for id := range uint32(MaxTraces) {
		if err := bed.o.StartTrace(id, 1); err != nil {
			t.Fatal(err)
		}
	}
	err := bed.o.StartTrace(MaxTraces, 1)
	if err == nil || !strings.Contains(err.Error(), fmt.Sprint(MaxTraces)) {
		t.Fatalf("trace %d past the limit: %v, want an error naming %d", MaxTraces, err, MaxTraces)
	}
	var ctl struct{ Active, Live uint32 }
	if err := bed.o.TraceCtl.Lookup(uint32(0), &ctl); err != nil || ctl.Active != MaxTraces || ctl.Live != 0 {
		t.Errorf("the count of active traces is %+v (%v), want %d, none live", ctl, err, MaxTraces)
	}
	if err := bed.o.StopTrace(3); err != nil {
		t.Fatal(err)
	}
	if err := bed.o.StartTrace(MaxTraces, 1); err != nil {
		t.Errorf("a trace after one stopped: %v", err)
	}
}

// TestTracePacketFrame checks the frames TracePacket makes: lengths, DSCP, TTL, the tag
// and every checksum, recomputed; and the errors of bad fields.
func TestTracePacketFrame(t *testing.T) {
	v6a, v6b := netip.MustParseAddr("fd00::1"), netip.MustParseAddr("fd00::2")
	for _, c := range []struct {
		src, dst netip.Addr
		proto    uint8
		size     int
	}{
		{traceAddrA, traceAddrB, 6, 0}, {traceAddrA, traceAddrB, 17, 101}, {traceAddrA, traceAddrB, 1, 9000},
		{v6a, v6b, 6, 0}, {v6a, v6b, 17, 33}, {v6a, v6b, 58, 0},
	} {
		p := TracePacket{ID: 0xabcdef, Nonce: 42, SrcMAC: traceMACA, DstMAC: traceMACB, Src: c.src, Dst: c.dst, Proto: c.proto,
			SrcPort: 1234, DstPort: 80, PayloadSize: c.size}
		b, err := p.Frame()
		if err != nil {
			t.Fatal(err)
		}
		size := max(c.size, TraceTagSize)
		ip := b[14:]
		var l4, pseudo []byte
		if c.src.Is4() {
			if ip[1]>>2 != TraceDSCP || ip[8] != 64 || ip[9] != c.proto || checksum(ip[:20]) != 0 ||
				int(binary.BigEndian.Uint16(ip[2:])) != len(ip) {
				t.Errorf("%d/%v: bad IPv4 header %x", c.proto, c.src, ip[:20])
			}
			l4 = ip[20:]
		} else {
			if binary.BigEndian.Uint32(ip)>>22&0x3f != TraceDSCP || ip[7] != 64 || ip[6] != c.proto ||
				int(binary.BigEndian.Uint16(ip[4:])) != len(ip)-40 {
				t.Errorf("%d/%v: bad IPv6 header %x", c.proto, c.src, ip[:40])
			}
			l4 = ip[40:]
		}
		if c.proto != 1 {
			pseudo = pseudoHeader(c.src.AsSlice(), c.dst.AsSlice(), c.proto, len(l4))
		}
		if checksum(append(pseudo, l4...)) != 0 {
			t.Errorf("%d/%v: bad L4 checksum", c.proto, c.src)
		}
		hl := 8
		if c.proto == 6 {
			hl = 20
			if l4[13] != 0x02 {
				t.Errorf("%d/%v: TCP flags %#x, want SYN", c.proto, c.src, l4[13])
			}
		}
		if c.proto == 1 || c.proto == 58 {
			if binary.BigEndian.Uint16(l4[4:]) != 0xcdef {
				t.Errorf("%d/%v: echo identifier %#x, want the id's low 16 bits", c.proto, c.src, binary.BigEndian.Uint16(l4[4:]))
			}
		}
		payload := l4[hl:]
		if len(payload) != size || string(payload[:8]) != traceMagic || binary.BigEndian.Uint32(payload[8:]) != 0xabcdef ||
			binary.LittleEndian.Uint64(payload[16:]) != 42 || bytes.ContainsFunc(payload[24:], func(r rune) bool { return r != 0 }) {
			t.Errorf("%d/%v: payload %x, want the tag and %d zeros", c.proto, c.src, payload, size-TraceTagSize)
		}
	}
	for _, c := range []struct {
		p    TracePacket
		want string
	}{
		{TracePacket{SrcMAC: traceMACA, DstMAC: traceMACB, Src: traceAddrA, Dst: v6b, Proto: 17}, "10.77.0.1 and fd00::2"},
		{TracePacket{SrcMAC: traceMACA, DstMAC: traceMACB, Src: traceAddrA, Dst: traceAddrB, Proto: 58}, "protocol 58"},
		{TracePacket{SrcMAC: traceMACA, DstMAC: traceMACB, Src: traceAddrA, Dst: traceAddrB, Proto: 47}, "protocol 47"},
		{TracePacket{SrcMAC: traceMACA, DstMAC: traceMACB, Src: traceAddrA, Dst: traceAddrB, Proto: 17, PayloadSize: 9001}, "payload size 9001"},
		{TracePacket{SrcMAC: traceMACA, DstMAC: traceMACB, Src: traceAddrA, Dst: traceAddrB, Proto: 17, PayloadSize: 3}, "payload size 3"},
		{TracePacket{SrcMAC: traceMACA[:3], DstMAC: traceMACB, Src: traceAddrA, Dst: traceAddrB, Proto: 17}, "source MAC"},
	} {
		if _, err := c.p.Frame(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Frame of %+v: %v, want an error naming %q", c.p, err, c.want)
		}
	}
}

// TestTraceEventLayout checks that decodeTraceEvent reads struct fw_trace_event as the
// generated binding lays it out.
func TestTraceEventLayout(t *testing.T) {
	in := firewallFwTraceEvent{Time: 1, Rule: 2, Id: 3, Ifindex: 4, Endpoint: 5, Len: 6, Stage: 7, Verdict: 8, Reason: 9, Live: 1,
		Smac: [6]uint8{1, 2, 3, 4, 5, 6}, Dmac: [6]uint8{7, 8, 9, 10, 11, 12}}
	b, err := binary.Append(nil, binary.NativeEndian, &in)
	if err != nil || len(b) != traceEventSize {
		t.Fatalf("struct fw_trace_event is %d bytes (%v), want %d", len(b), err, traceEventSize)
	}
	got := decodeTraceEvent(b)
	want := TraceEvent{Time: 1, Rule: 2, ID: 3, Ifindex: 4, Endpoint: 5, Len: 6, Stage: 7, Verdict: 8, Reason: 9, Live: true,
		SrcMAC: net.HardwareAddr{1, 2, 3, 4, 5, 6}, DstMAC: net.HardwareAddr{7, 8, 9, 10, 11, 12}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("decoded %+v, want %+v", got, want)
	}
}

// BenchmarkTraceInactiveCost measures fw_ingress on an established TCP connection's
// packet loaded with the trace checks left out (fw_trace_enabled 0) and in with no trace
// active, interleaved, and reports the ratio (x-trace-off; the goal is at most 1.02).
func BenchmarkTraceInactiveCost(b *testing.B) {
	off := loadWith(b, 16, 0, 0, disableTrace)
	on := loadRing(b, 16, 0)
	// The connection's packet from the endpoint (fw_ingress) and its reply to it
	// (fw_egress, which looks for stray trace packets first).
	var frames [2][2][]byte
	reply := tcp(netip.AddrFrom4([4]byte{10, 100, 0, 0}), 1000, families[0].ep, 40000, tcpACK).frame()
	for i, f := range []*fixture{off, on} {
		frames[i][0], _ = benchSetup(f, 1, false)
		frames[i][1] = reply
		if ret, _, err := f.ingress.Benchmark(frames[i][0], 1, nil); err != nil || ret != tcxNext {
			b.Fatalf("making the connection: %s, %v", verdict(ret), err)
		}
		if ret, _, err := f.egress.Benchmark(reply, 1, nil); err != nil || ret != tcxNext {
			b.Fatalf("the connection's reply: %s, %v", verdict(ret), err)
		}
	}
	const runs = 1 << 20
	var d [2][2]time.Duration
	for b.Loop() {
		for round := range 10 {
			for j := range 2 {
				i := (j + round) % 2 // alternate which goes first
				f := []*fixture{off, on}[i]
				for hook, prog := range []*ebpf.Program{f.ingress, f.egress} {
					ret, per, err := prog.Benchmark(frames[i][hook], runs, nil)
					if err != nil || ret != tcxNext {
						b.Fatalf("benchmark: %s, %v", verdict(ret), err)
					}
					d[i][hook] += per
				}
			}
		}
	}
	n := float64(b.N * 10)
	b.ReportMetric(float64(d[1][0].Nanoseconds())/n, "on-ns/op")
	b.ReportMetric(float64(d[0][0].Nanoseconds())/n, "off-ns/op")
	b.ReportMetric(float64(d[1][0])/float64(d[0][0]), "x-trace-off")
	b.ReportMetric(float64(d[1][1].Nanoseconds())/n, "egress-on-ns/op")
	b.ReportMetric(float64(d[0][1].Nanoseconds())/n, "egress-off-ns/op")
	b.ReportMetric(float64(d[1][1])/float64(d[0][1]), "egress-x-trace-off")
}

// TestTraceSpoofed checks a trace packet from a guarded endpoint that does not own its
// source: DENIED for ReasonSpoofed, dropped, nothing after it.
func TestTraceSpoofed(t *testing.T) {
	bed := newTraceBed(t)
	flags := uint32(firewall.FlagIngress | firewall.FlagEgress | firewall.FlagGuard)
	if err := bed.o.Install([]firewall.Entry{
		{Key: firewall.EndpointKey(uint32(bed.hA)), Value: firewall.Value{ID: epA, Subject: subject, Flags: flags, Gen: gen2, Scope: scope1}},
	}); err != nil {
		t.Fatal(err)
	}
	if err := bed.o.StartTrace(traceTestID, traceTestNonce); err != nil {
		t.Fatal(err)
	}
	bed.inject(bed.frame(traceTestID, traceTestNonce, traceTestSrcPort, tracePortOK))
	bed.wantEvents(traceTestID,
		TraceEvent{Stage: TraceStageFromEndpoint, Verdict: TraceVerdictDenied, Reason: ReasonSpoofed, Ifindex: uint32(bed.hA), Endpoint: epA})
	var per []EndpointStats
	if err := bed.o.EndpointStats.Lookup(uint32(epA), &per); err == nil {
		for _, s := range per {
			if s != (EndpointStats{}) {
				t.Errorf("the spoofed trace packet was counted for endpoint A: %+v", s)
			}
		}
	}
}

// TestOpenAddsTraceMaps opens a pin directory that lacks the trace maps, as one of an
// older firewall does: Open makes and pins them, and tracing works.
func TestOpenAddsTraceMaps(t *testing.T) {
	testns.RequireRoot(t)
	dir := filepath.Join("/sys/fs/bpf", fmt.Sprintf("naples-fwbpf-traceup-%d", os.Getpid()))
	t.Cleanup(func() { os.RemoveAll(dir) })
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	caps := Capacities{Conntrack: 64, Rules: 64, Endpoints: 16, Fragments: 32}
	o, err := Open(dir, caps, quiet)
	if err != nil {
		t.Fatal(err)
	}
	o.Close()
	names := []string{MapTraceCtl, MapTraces, MapTraceEvents, MapTraceLost, MapTraceLive}
	for _, name := range names {
		if err := os.Remove(filepath.Join(dir, name)); err != nil {
			t.Fatalf("the first Open did not pin %s: %v", name, err)
		}
	}
	o, err = Open(dir, caps, quiet)
	if err != nil {
		t.Fatalf("opening a pin directory without the trace maps: %v", err)
	}
	defer o.Close()
	for _, name := range names {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			t.Errorf("Open did not pin %s anew: %v", name, err)
		}
	}
	if err := o.StartTrace(1, 2); err != nil {
		t.Fatal(err)
	}
	var ctl struct{ Active, Live uint32 }
	if err := o.TraceCtl.Lookup(uint32(0), &ctl); err != nil || ctl.Active != 1 {
		t.Errorf("the count of active traces is %+v (%v), want 1", ctl, err)
	}
}

// TestTraceLive checks a live trace: the first real datagram of its tuple from A to B is
// recorded at A's egress (allowed), at the tunnel observer on A's interface (seen) and at
// B's ingress (delivered), marked live, and B receives it; the second is not recorded;
// stopped, the trace leaves its count at zero.
func TestTraceLive(t *testing.T) {
	bed := newTraceBed(t)
	const livePort = 40003
	tuple := TraceTuple{Proto: 17, Src: traceAddrA, Dst: traceAddrB, SrcPort: livePort, DstPort: tracePortOK}
	if err := bed.o.StartLiveTrace(traceTestID, tuple); err != nil {
		t.Fatal(err)
	}
	if err := bed.o.StartTrace(traceTestID+1, traceTestNonce); err != nil {
		t.Fatal(err)
	}
	if err := bed.o.StartLiveTrace(1, TraceTuple{Proto: 17, Src: traceAddrA, Dst: netip.MustParseAddr("fd00::1")}); err == nil ||
		!strings.Contains(err.Error(), "10.77.0.1 and fd00::1") {
		t.Errorf("a live trace of mixed families: %v, want an error naming the addresses", err)
	}
	var obs io.Closer
	inNS(t, bed.host, func() error {
		var err error
		obs, err = bed.o.AttachTraceObserver(bed.hA, false)
		return err
	})
	defer obs.Close()

	send := func() {
		inNS(t, bed.nsA, func() error {
			fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				return err
			}
			defer unix.Close(fd)
			if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); err != nil {
				return err
			}
			if err := unix.Bind(fd, &unix.SockaddrInet4{Port: livePort, Addr: traceAddrA.As4()}); err != nil {
				return err
			}
			return unix.Sendto(fd, []byte("live"), 0, &unix.SockaddrInet4{Port: tracePortOK, Addr: traceAddrB.As4()})
		})
		if got := bed.receiveB(livePort); string(got) != "live" {
			t.Fatalf("B received %q, want \"live\"", got)
		}
	}
	send()
	bed.wantEvents(traceTestID,
		TraceEvent{Stage: TraceStageFromEndpoint, Verdict: TraceVerdictAllowed, Ifindex: uint32(bed.hA), Endpoint: epA, Live: true},
		TraceEvent{Stage: TraceStageTunnelIn, Verdict: TraceVerdictSeen, Ifindex: uint32(bed.hA), Live: true},
		TraceEvent{Stage: TraceStageToEndpoint, Verdict: TraceVerdictDelivered, Ifindex: uint32(bed.hB), Endpoint: epB, Live: true})
	send()
	// The second datagram is not recorded: the next events are a synthetic trace's.
	bed.inject(bed.frame(traceTestID+1, traceTestNonce, traceTestSrcPort, tracePortOK))
	bed.wantEvents(traceTestID+1,
		TraceEvent{Stage: TraceStageFromEndpoint, Verdict: TraceVerdictAllowed, Rule: traceRuleOut, Ifindex: uint32(bed.hA), Endpoint: epA},
		TraceEvent{Stage: TraceStageTunnelIn, Verdict: TraceVerdictSeen, Ifindex: uint32(bed.hA)},
		TraceEvent{Stage: TraceStageToEndpoint, Verdict: TraceVerdictDelivered, Rule: traceRuleIn, Ifindex: uint32(bed.hB), Endpoint: epB})

	for _, id := range []uint32{traceTestID, traceTestID + 1} {
		if err := bed.o.StopTrace(id); err != nil {
			t.Fatal(err)
		}
	}
	var ctl struct{ Active, Live uint32 }
	if err := bed.o.TraceCtl.Lookup(uint32(0), &ctl); err != nil || ctl.Active != 0 || ctl.Live != 0 {
		t.Errorf("after StopTrace the counts are %+v (%v), want none", ctl, err)
	}
}

// TestOpenWithoutTraces opens the firewall without its trace checks: no trace can be
// installed, live or not, and the programs' trace checks are gone (fewer instructions).
func TestOpenWithoutTraces(t *testing.T) {
	testns.RequireRoot(t)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	caps := Capacities{Conntrack: 64, Rules: 64, Endpoints: 16, Fragments: 32}
	size := func(o *Objects) int {
		info, err := o.Egress.Info()
		if err != nil {
			t.Fatal(err)
		}
		insns, err := info.Instructions()
		if err != nil {
			t.Fatal(err)
		}
		return len(insns)
	}
	dir := filepath.Join("/sys/fs/bpf", fmt.Sprintf("naples-fwbpf-notraces-%d", os.Getpid()))
	t.Cleanup(func() { os.RemoveAll(dir) })
	with, err := Open(dir, caps, quiet)
	if err != nil {
		t.Fatal(err)
	}
	full := size(with)
	with.Close()
	caps.NoTraces = true
	o, err := Open(dir, caps, quiet)
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	if err := o.StartTrace(1, 2); !errors.Is(err, ErrTracesOff) {
		t.Errorf("StartTrace = %v, want ErrTracesOff", err)
	}
	tuple := TraceTuple{Proto: 17, Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("10.0.0.2"), SrcPort: 1, DstPort: 2}
	if err := o.StartLiveTrace(1, tuple); !errors.Is(err, ErrTracesOff) {
		t.Errorf("StartLiveTrace = %v, want ErrTracesOff", err)
	}
	if without := size(o); without >= full {
		t.Errorf("fw_egress has %d instructions without the trace checks, %d with: want fewer", without, full)
	}
}
