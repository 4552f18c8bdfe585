package fwbpf

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/naplesnet/naples/hal/firewall"
)

// flowReader returns a reader of the fixture's flow records, closed when the test ends.
func (f *fixture) flowReader() *FlowReader {
	f.tb.Helper()
	r, err := NewFlowReader(f.flowMaps)
	if err != nil {
		f.tb.Fatal(err)
	}
	f.tb.Cleanup(func() { r.Close() })
	return r
}

// drain returns every flow record the ring holds now.
func drain(tb testing.TB, r *FlowReader) []FlowRecord {
	tb.Helper()
	r.SetDeadline(time.Now())
	var out []FlowRecord
	for {
		rec, err := r.Read()
		if errors.Is(err, ErrNoRecord) {
			return out
		}
		if err != nil {
			tb.Fatal(err)
		}
		out = append(out, rec)
	}
}

// flowWant is what a test checks of a flow record: the packet's tuple, interface and
// length, its endpoint and direction, the record's type and reason, and the rule.
type flowWant struct {
	typ, reason, dir uint8
	p                packet
	ifindex, ep      uint32
	rule             uint64
	// noTuple: the record carries no tuple (a spoofed packet's).
	noTuple bool
	// packets and bytes are a connection's counts, initiator first; unset for a
	// FlowNew record, the one packet p.
	packets, bytes [2]uint64
}

// describe returns what the record says, as the test reads it.
func describe(rec FlowRecord) string {
	src, dst := "-", "-"
	switch rec.Family {
	case 4:
		src, dst = netip.AddrFrom4([4]byte(rec.Saddr[:4])).String(), netip.AddrFrom4([4]byte(rec.Daddr[:4])).String()
	case 6:
		src, dst = netip.AddrFrom16(rec.Saddr).String(), netip.AddrFrom16(rec.Daddr).String()
	}
	port := func(p uint16) uint16 { return binary.BigEndian.Uint16(binary.NativeEndian.AppendUint16(nil, p)) }
	return fmt.Sprintf("type %d reason %d dir %d if %d ep %#x rule %d len %d proto %d %s:%d > %s:%d packets %v bytes %v",
		rec.Type, rec.Reason, rec.Dir, rec.Ifindex, rec.Ep, rec.Rule, rec.Len, rec.Proto, src, port(rec.Sport), dst, port(rec.Dport),
		rec.Packets, rec.Bytes)
}

// ipBytes returns the IP bytes of the packets: their frames less the Ethernet header.
func ipBytes(ps ...packet) uint64 {
	var n uint64
	for _, p := range ps {
		n += uint64(len(p.frame()) - 14)
	}
	return n
}

// record returns the record the test wants, in describe's form.
func (w flowWant) record() string {
	rec := FlowRecord{Type: w.typ, Reason: w.reason, Dir: w.dir, Ifindex: w.ifindex, Ep: w.ep, Rule: w.rule, Len: uint32(len(w.p.frame())),
		Packets: w.packets, Bytes: w.bytes}
	if w.typ == FlowNew && w.packets == [2]uint64{} {
		rec.Packets, rec.Bytes = [2]uint64{1, 0}, [2]uint64{ipBytes(w.p), 0}
	}
	if !w.noTuple {
		rec.Proto = w.p.proto
		rec.Family = 4
		if w.p.src.Is6() {
			rec.Family = 6
		}
		rec.Saddr, rec.Daddr = w.p.src.As16(), w.p.dst.As16()
		if rec.Family == 4 {
			rec.Saddr, rec.Daddr = [16]byte{}, [16]byte{}
			copy(rec.Saddr[:], w.p.src.AsSlice())
			copy(rec.Daddr[:], w.p.dst.AsSlice())
		}
		rec.Sport = binary.NativeEndian.Uint16(binary.BigEndian.AppendUint16(nil, w.p.sport))
		rec.Dport = binary.NativeEndian.Uint16(binary.BigEndian.AppendUint16(nil, w.p.dport))
	}
	return describe(rec)
}

// wantFlows checks that the ring holds exactly the records, in order, each written
// between before and now.
func (f *fixture) wantFlows(r *FlowReader, before uint64, want ...flowWant) {
	f.tb.Helper()
	got := drain(f.tb, r)
	now := f.now()
	n := max(len(got), len(want))
	for i := range n {
		switch {
		case i >= len(got):
			f.tb.Errorf("flow record %d: none, want %s", i, want[i].record())
		case i >= len(want):
			f.tb.Errorf("flow record %d: %s, want none", i, describe(got[i]))
		case describe(got[i]) != want[i].record():
			f.tb.Errorf("flow record %d:\n got %s\nwant %s", i, describe(got[i]), want[i].record())
		case got[i].Time < before || got[i].Time > now:
			f.tb.Errorf("flow record %d written at %d, not between %d and %d", i, got[i].Time, before, now)
		case got[i].Type != FlowDeny && (got[i].Start == 0 || got[i].Start > got[i].Time):
			f.tb.Errorf("flow record %d of a connection that started at %d, after its record's %d", i, got[i].Start, got[i].Time)
		case got[i].Type == FlowNew && got[i].Start < before:
			f.tb.Errorf("flow record %d of a connection that started at %d, before %d", i, got[i].Start, before)
		case got[i].Type == FlowDeny && got[i].Start != 0:
			f.tb.Errorf("flow record %d of a denied packet with a start, %d", i, got[i].Start)
		}
	}
}

// TestFlowRecords runs the packets of two connections, denied packets and a malformed
// one through the firewall, and checks the flow records it writes: a connection's start
// with the rule that allowed it, its end at the ACK of the last FIN or at a RST from
// either side (with its original tuple and its counts both ways), each denied packet with
// the reason and rule, and nothing for the other packets of a connection.
func TestFlowRecords(t *testing.T) {
	forEachFamily(t, func(t *testing.T, f *fixture, fam family) {
		f.install(
			endpoint(f.ifA, epA, subject, firewall.FlagIngress|firewall.FlagEgress, gen1),
			identity(scope1, hostPrefix(fam.peer), idPeer),
			policy(firewall.DirEgress, firewall.ClassTCP, idPeer, 80, 16, firewall.VerdictAllow, 21),
			policy(firewall.DirEgress, firewall.ClassUDP, idPeer, 53, 16, firewall.VerdictDeny, 23),
		)
		r := f.flowReader()
		drain(t, r)
		before := f.now()

		syn := tcp(fam.ep, 40000, fam.peer, 80, tcpSYN)
		f.from(f.ifA, syn, tcxNext)
		synAck := syn.reply()
		synAck.tcpFlags = tcpSYN | tcpACK
		f.to(f.ifA, synAck, tcxNext)
		fin := syn
		fin.tcpFlags = tcpFIN | tcpACK
		f.from(f.ifA, fin, tcxNext)
		peerFin := synAck
		peerFin.tcpFlags = tcpFIN | tcpACK
		f.to(f.ifA, peerFin, tcxNext)
		f.from(f.ifA, fin, tcxNext) // a FIN again: not yet the end
		ack := syn
		ack.tcpFlags, ack.payload = tcpACK, 0
		f.from(f.ifA, ack, tcxNext)   // the ACK of the last FIN: the end, with the counts so far
		f.to(f.ifA, peerFin, tcxNext) // ended already: no second end

		// The peer resets the second connection.
		syn2 := tcp(fam.ep, 40001, fam.peer, 80, tcpSYN)
		f.from(f.ifA, syn2, tcxNext)
		rst := syn2.reply()
		rst.tcpFlags = tcpRST
		f.to(f.ifA, rst, tcxNext)

		// Denied: by default (no rule allows port 81), by the DENY rule, from the peer.
		to81 := tcp(fam.ep, 40002, fam.peer, 81, tcpSYN)
		f.from(f.ifA, to81, tcxDrop)
		dns := udp(fam.ep, 40003, fam.peer, 53)
		f.from(f.ifA, dns, tcxDrop)
		in := tcp(fam.peer, 50000, fam.ep, 22, tcpSYN)
		f.to(f.ifA, in, tcxDrop)
		// Malformed: a TCP header cut short.
		short := tcp(fam.ep, 40004, fam.peer, 80, tcpSYN)
		short.truncate = map[bool]int{true: 20 + 8, false: 40 + 8}[fam.ep.Is4()]
		f.from(f.ifA, short, tcxDrop)

		f.wantFlows(r, before,
			flowWant{typ: FlowNew, dir: DirEgress, p: syn, ifindex: f.ifA, ep: epA, rule: 21},
			flowWant{typ: FlowEnd, reason: EndFIN, dir: DirEgress, p: withLen(syn, ack), ifindex: f.ifA, ep: epA, rule: 21,
				packets: [2]uint64{4, 2}, bytes: [2]uint64{ipBytes(syn, fin, fin, ack), ipBytes(synAck, peerFin)}},
			flowWant{typ: FlowNew, dir: DirEgress, p: syn2, ifindex: f.ifA, ep: epA, rule: 21},
			// The end of a connection carries its original tuple, whichever side ended it.
			flowWant{typ: FlowEnd, reason: EndRST, dir: DirEgress, p: withLen(syn2, rst), ifindex: f.ifA, ep: epA, rule: 21,
				packets: [2]uint64{1, 1}, bytes: [2]uint64{ipBytes(syn2), ipBytes(rst)}},
			flowWant{typ: FlowDeny, reason: ReasonPolicy, dir: DirEgress, p: to81, ifindex: f.ifA, ep: epA},
			flowWant{typ: FlowDeny, reason: ReasonPolicy, dir: DirEgress, p: dns, ifindex: f.ifA, ep: epA, rule: 23},
			flowWant{typ: FlowDeny, reason: ReasonPolicy, dir: DirIngress, p: in, ifindex: f.ifA, ep: epA},
			flowWant{typ: FlowDeny, reason: ReasonMalformed, dir: DirEgress, p: withPorts(short, 0, 0), ifindex: f.ifA, ep: epA},
		)
		if lost, err := r.Lost(); err != nil || lost != 0 {
			t.Errorf("lost flow records: %d, %v; want 0", lost, err)
		}
	})
}

// withLen returns p with the frame length of q: a record carries the tuple of one packet
// and the length of another.
func withLen(p, q packet) packet {
	p.payload += len(q.frame()) - len(p.frame())
	return p
}

// withPorts returns p with the ports a record of it carries.
func withPorts(p packet, sport, dport uint16) packet {
	p.sport, p.dport = sport, dport
	return p
}

// TestSpoofedFlowRecord checks the record of a packet dropped because it is not from the
// endpoint's own address: the reason, no tuple.
func TestSpoofedFlowRecord(t *testing.T) {
	f := newFixture(t)
	f.install(f.guardedA(0, 0)...)
	r := f.flowReader()
	drain(t, r)
	before := f.now()
	fam := families[0]
	spoofed := udp(fam.other, 40000, fam.peer, 53)
	f.from(f.ifA, spoofed, tcxDrop)
	f.wantFlows(r, before, flowWant{typ: FlowDeny, reason: ReasonSpoofed, dir: DirEgress, p: spoofed, ifindex: f.ifA, ep: epA, noTuple: true})
}

// TestFlowRecordsLostAreCounted fills the fixture's ring with more new connections than
// it holds, reading none: every connection is either a record read afterwards or counted
// lost, exactly, and once the ring is read the next ones are records again.
func TestFlowRecordsLostAreCounted(t *testing.T) {
	f := newFixture(t)
	fam := families[0]
	f.install(endpoint(f.ifA, epA, 0, 0, gen1)) // unprotected: every connection allowed
	r := f.flowReader()
	drain(t, r)
	lost0, err := r.Lost()
	if err != nil {
		t.Fatal(err)
	}
	const conns = 2 * fixtureFlowRing / (flowRecordSize + 8) // a record takes 8 bytes more of the ring, its header
	for i := range conns {
		f.from(f.ifA, udp(fam.ep, uint16(10000+i), fam.peer, 53), tcxNext)
	}
	got := drain(t, r)
	lost, err := r.Lost()
	if err != nil {
		t.Fatal(err)
	}
	lost -= lost0
	if uint64(len(got))+lost != conns || lost == 0 {
		t.Errorf("%d records read and %d lost of %d connections: want every one either, some lost", len(got), lost, conns)
	}
	for i, rec := range got {
		if want := binary.NativeEndian.Uint16(binary.BigEndian.AppendUint16(nil, uint16(10000+i))); rec.Type != FlowNew || rec.Sport != want {
			t.Errorf("record %d: %s, want the start of the connection from port %d", i, describe(rec), 10000+i)
			break
		}
	}
	f.from(f.ifA, udp(fam.ep, 9999, fam.peer, 53), tcxNext)
	if got := drain(t, r); len(got) != 1 {
		t.Errorf("%d records after the ring was read, want 1", len(got))
	}
}

// BenchmarkFlowRecords measures the firewall on the packet of a new connection (each run
// finds no conntrack entry), as users write endpoints (protected by 100 rules, guarded
// against spoofing), with flow records on and a reader taking them as they come, against
// the same with flow records off, alternating in the same loop: x-off is the ratio of
// the two (records on ÷ off).
func BenchmarkFlowRecords(b *testing.B) {
	const rules, runs = 100, 200
	on := loadRing(b, 2*rules+16, 1<<20)
	off := loadRing(b, 2*rules+16, 0)
	frame, k := benchSetup(on, rules, true)
	benchSetup(off, rules, true)
	r := on.flowReader()
	var read atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			if _, err := r.Read(); err != nil {
				return
			}
			read.Add(1)
		}
	}()
	measure := func(f *fixture) time.Duration {
		var total time.Duration
		for range runs {
			if err := f.ct.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				b.Fatal(err)
			}
			ret, d, err := f.ingress.Benchmark(frame, 1, nil)
			if err != nil || ret != tcxNext {
				b.Fatalf("benchmark: %s, %v", verdict(ret), err)
			}
			total += d
		}
		return total
	}
	var tOn, tOff time.Duration
	for b.Loop() {
		tOn += measure(on)
		tOff += measure(off)
	}
	// Every run's record is read or counted lost, once the reader polled the last.
	want := int64(b.N * runs)
	deadline := time.Now().Add(5 * time.Second)
	var lost uint64
	for {
		n, err := r.Lost()
		if err != nil {
			b.Fatal(err)
		}
		if lost = n; read.Load()+int64(lost) == want || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	r.Close()
	<-done
	if got := read.Load() + int64(lost); got != want {
		b.Fatalf("%d records read and %d lost, want %d", read.Load(), lost, want)
	}
	b.ReportMetric(float64(tOn.Nanoseconds())/float64(b.N*runs), "on-ns/op")
	b.ReportMetric(float64(tOff.Nanoseconds())/float64(b.N*runs), "off-ns/op")
	b.ReportMetric(float64(tOn)/float64(tOff), "x-off")
}
