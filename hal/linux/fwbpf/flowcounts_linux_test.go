package fwbpf

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/ringbuf"

	"github.com/naplesnet/naples/internal/testns"
)

// setConn changes the conntrack entry of the packet on the interface with change.
func (f *fixture) setConn(ifindex uint32, p packet, change func(*CTValue)) {
	f.tb.Helper()
	k := ctKey(ifindex, p)
	v := f.mustConn(ifindex, p)
	change(&v)
	if err := f.ct.Update(&k, &v, ebpf.UpdateExist); err != nil {
		f.tb.Fatalf("updating the conntrack entry of %s: %v", p, err)
	}
}

// TestFlowActiveRecord checks the ACTIVE record of a connection whose last record is an
// active timeout ago: written by its next packet, whichever side sends it, with the
// counts of both sides up to and including it, and only once per timeout.
func TestFlowActiveRecord(t *testing.T) {
	forEachFamily(t, func(t *testing.T, f *fixture, fam family) {
		f.install(endpoint(f.ifA, epA, 0, 0, gen1)) // unprotected: every connection allowed
		r := f.flowReader()
		out := udp(fam.ep, 40000, fam.peer, 53)
		out.payload = 100
		back := out.reply()
		back.payload = 300
		f.from(f.ifA, out, tcxNext)
		f.to(f.ifA, back, tcxNext)
		f.from(f.ifA, out, tcxNext)
		drain(t, r)
		before := f.now()
		f.setConn(f.ifA, out, func(v *CTValue) { f.setBack(&v.Reported, fixtureFlowActive) })
		f.to(f.ifA, back, tcxNext)
		f.to(f.ifA, back, tcxNext) // the record was just written: no other
		f.wantFlows(r, before, flowWant{typ: FlowActive, dir: DirEgress, p: withLen(out, back), ifindex: f.ifA, ep: epA,
			packets: [2]uint64{2, 2}, bytes: [2]uint64{ipBytes(out, out), ipBytes(back, back)}})
		if v := f.mustConn(f.ifA, out); v.Packets != [2]uint64{2, 3} || v.Bytes != [2]uint64{ipBytes(out, out), ipBytes(back, back, back)} {
			t.Errorf("the connection counts packets %v and bytes %v, want [2 3] and [%d %d]", v.Packets, v.Bytes, ipBytes(out, out), ipBytes(back, back, back))
		}
	})
}

// skbGSOContext is the start of struct __sk_buff up to gso_segs, for a run of a program
// on a GSO packet: one that stands for GSOSegs packets on the wire.
type skbGSOContext struct {
	skbContext
	TCIndex                                                             uint32
	CB                                                                  [5]uint32
	Hash, TCClassid, Data, DataEnd, NapiID, Family, RemoteIP4, LocalIP4 uint32
	RemoteIP6, LocalIP6                                                 [4]uint32
	RemotePort, LocalPort, DataMeta                                     uint32
	FlowKeys, Tstamp                                                    uint64
	WireLen, GSOSegs                                                    uint32
}

// TestFlowCountsGSO checks that a GSO packet counts as the packets it stands for, each
// with its own IP and TCP headers.
func TestFlowCountsGSO(t *testing.T) {
	forEachFamily(t, func(t *testing.T, f *fixture, fam family) {
		f.install(endpoint(f.ifA, epA, 0, 0, gen1))
		syn := tcp(fam.ep, 40000, fam.peer, 80, tcpSYN)
		f.from(f.ifA, syn, tcxNext)
		data := tcp(fam.ep, 40000, fam.peer, 80, tcpACK)
		data.payload = 1000 // a run takes at most a page
		var ret uint32
		var err error
		done := make(chan struct{})
		f.inNS <- func() {
			defer close(done)
			ret, err = f.ingress.Run(&ebpf.RunOptions{Data: data.frame(), Context: skbGSOContext{skbContext: skbContext{Ifindex: f.ifA}, GSOSegs: 4}})
		}
		<-done
		if err != nil || ret != tcxNext {
			t.Fatalf("running the GSO packet: verdict %s, %v", verdict(ret), err)
		}
		headers := uint64(20 + 20)
		if fam.ep.Is6() {
			headers = 40 + 20
		}
		want := ipBytes(syn) + ipBytes(data) + 3*headers
		if v := f.mustConn(f.ifA, syn); v.Packets != [2]uint64{5, 0} || v.Bytes != [2]uint64{want, 0} {
			t.Errorf("after a SYN and a GSO packet of 4 segments: packets %v and bytes %v, want [5 0] and [%d 0]", v.Packets, v.Bytes, want)
		}
	})
}

// TestSweepConntrackEndsIdle checks SweepConntrack: an expired connection without an end
// gets a FlowEnd record of EndIdle with its counts and its entry goes, an expired one that
// ended goes without a record, a live one stays; and that a new connection taking an
// expired entry's tuple writes the old one's end first.
func TestSweepConntrackEndsIdle(t *testing.T) {
	f := newFixture(t)
	fam := families[0]
	f.install(endpoint(f.ifA, epA, 0, 0, gen1))
	r := f.flowReader()
	idle := udp(fam.ep, 40000, fam.peer, 53)
	idle.payload = 10
	f.from(f.ifA, idle, tcxNext)
	f.to(f.ifA, idle.reply(), tcxNext)
	ended := tcp(fam.ep, 40001, fam.peer, 80, tcpSYN)
	f.from(f.ifA, ended, tcxNext)
	rst := ended.reply()
	rst.tcpFlags = tcpRST
	f.to(f.ifA, rst, tcxNext)
	live := udp(fam.ep, 40002, fam.peer, 53)
	f.from(f.ifA, live, tcxNext)
	retaken := udp(fam.ep, 40003, fam.peer, 53)
	f.from(f.ifA, retaken, tcxNext)
	f.from(f.ifA, retaken, tcxNext)
	drain(t, r)
	before := f.now()
	// Each is idle for its timeout (the TCP connection is closing, after its RST) and a
	// second more.
	for _, c := range []struct {
		p       packet
		timeout time.Duration
	}{{idle, CTTimeoutUDP}, {ended, CTTimeoutTCPClosing}, {retaken, CTTimeoutUDP}} {
		f.setConn(f.ifA, c.p, func(v *CTValue) { f.setBack(&v.LastSeen, c.timeout+time.Second) })
	}

	f.from(f.ifA, retaken, tcxNext)
	f.wantFlows(r, before,
		flowWant{typ: FlowEnd, reason: EndIdle, dir: DirEgress, p: retaken, ifindex: f.ifA, ep: epA,
			packets: [2]uint64{2, 0}, bytes: [2]uint64{ipBytes(retaken, retaken), 0}},
		flowWant{typ: FlowNew, dir: DirEgress, p: retaken, ifindex: f.ifA, ep: epA})

	recs, err := r.SweepConntrack()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, rec := range recs {
		got = append(got, describe(rec))
	}
	want := flowWant{typ: FlowEnd, reason: EndIdle, dir: DirEgress, p: idle, ifindex: f.ifA,
		packets: [2]uint64{1, 1}, bytes: [2]uint64{ipBytes(idle), ipBytes(idle.reply())}}
	if len(recs) != 1 || got[0] != describeLen0(want) {
		t.Errorf("swept: %q, want the idle connection's end only:\n%s", got, describeLen0(want))
	}
	for _, p := range []packet{idle, ended} {
		if _, ok := f.conn(f.ifA, p); ok {
			t.Errorf("the expired connection of %s is still in the table", p)
		}
	}
	for _, p := range []packet{live, retaken} {
		f.mustConn(f.ifA, p)
	}
}

// describeLen0 is w's record as SweepConntrack makes it: of no packet (length 0) and no
// endpoint id.
func describeLen0(w flowWant) string {
	rec := FlowRecord{Type: w.typ, Reason: w.reason, Dir: w.dir, Ifindex: w.ifindex, Packets: w.packets, Bytes: w.bytes}
	k := ctKey(w.ifindex, w.p)
	rec.Family, rec.Proto, rec.Sport, rec.Dport, rec.Saddr, rec.Daddr = k.Family, k.Proto, k.Sport, k.Dport, k.Saddr, k.Daddr
	return describe(rec)
}

// TestOpenCarriesConntrackOver checks that Open replaces a pinned conntrack table of the
// first layout (before the counts) or of another capacity with its live connections in.
func TestOpenCarriesConntrackOver(t *testing.T) {
	testns.RequireRoot(t)
	if err := mountBPFFS("/sys/fs/bpf/x"); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join("/sys/fs/bpf", fmt.Sprintf("naples-fwbpf-ct-%d", os.Getpid()))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))

	old, err := ebpf.NewMap(&ebpf.MapSpec{Name: MapCT, Type: ebpf.LRUHash, KeySize: 44, ValueSize: ctValueSizeV1, MaxEntries: 64})
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	now, err := KtimeNow()
	if err != nil {
		t.Fatal(err)
	}
	live := CTKey{Ifindex: 7, Family: 4, Proto: ipProtoTCP, Sport: 1, Dport: 2}
	expired := CTKey{Ifindex: 7, Family: 4, Proto: ipProtoUDP, Sport: 3, Dport: 4}
	v1 := func(lastSeen, rule uint64, gen uint32, dir, flags uint8) []byte {
		b := make([]byte, ctValueSizeV1)
		for i := range 8 {
			b[i], b[8+i] = byte(lastSeen>>(8*i)), byte(rule>>(8*i))
		}
		b[16], b[17], b[18], b[19], b[20], b[21] = byte(gen), byte(gen>>8), byte(gen>>16), byte(gen>>24), dir, flags
		return b
	}
	if err := old.Put(&live, v1(now, 21, 5, DirEgress, CTReplied)); err != nil {
		t.Fatal(err)
	}
	if err := old.Put(&expired, v1(now-uint64(CTTimeoutUDP+time.Second), 22, 5, DirEgress, 0)); err != nil {
		t.Fatal(err)
	}
	if err := old.Pin(filepath.Join(dir, MapCT)); err != nil {
		t.Fatal(err)
	}

	o, err := Open(dir, Capacities{Conntrack: 64, Rules: 64, Endpoints: 16, Fragments: 32}, quiet)
	if err != nil {
		t.Fatal(err)
	}
	var v CTValue
	if err := o.CT.Lookup(&live, &v); err != nil {
		t.Fatalf("the live connection was not carried over: %v", err)
	}
	if want := (CTValue{LastSeen: now, Rule: 21, Gen: 5, Dir: DirEgress, Flags: CTReplied, Reported: now}); v != want {
		t.Errorf("carried over as %+v, want %+v", v, want)
	}
	if err := o.CT.Lookup(&expired, &v); err == nil {
		t.Errorf("the expired connection was carried over: %+v", v)
	}
	o.Close()

	// Another capacity: the table is made anew, its connections carried over again.
	o, err = Open(dir, Capacities{Conntrack: 128, Rules: 64, Endpoints: 16, Fragments: 32}, quiet)
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	if got := o.CT.MaxEntries(); got != 128 {
		t.Errorf("the conntrack table holds %d entries, want 128", got)
	}
	if err := o.CT.Lookup(&live, &v); err != nil || v.Rule != 21 {
		t.Errorf("after a capacity change the connection is %+v (%v), want it carried over", v, err)
	}
}

// TestFlowEndpointBudget floods new connections from one endpoint, whose budget of flow
// records runs out, and checks that every connection is either a record read or counted
// suppressed, exactly, for that endpoint, and that another endpoint's records, which have
// a budget of their own, are all written.
func TestFlowEndpointBudget(t *testing.T) {
	const rate, flood, others = 50, 400, 10
	f := newFixtureOf(t, loadFlows(t, 1024, fixtureFlowRing, rate))
	fam := families[0]
	f.install(endpoint(f.ifA, epA, 0, 0, gen1), endpoint(f.ifB, epB, 0, 0, gen1))
	r := f.flowReader()
	for i := range flood {
		f.from(f.ifA, udp(fam.ep, uint16(10000+i), fam.peer, 53), tcxNext)
	}
	read := len(drain(t, r))
	suppressed, err := r.Suppressed()
	if err != nil {
		t.Fatal(err)
	}
	if uint64(read)+suppressed != flood || read < rate || suppressed == 0 {
		t.Errorf("%d records read and %d suppressed of %d connections: want every one either, at least a burst (%d) read, some suppressed",
			read, suppressed, flood, rate)
	}
	for i := range others {
		f.from(f.ifB, udp(fam.other, uint16(20000+i), fam.peer, 53), tcxNext)
	}
	if got := drain(t, r); len(got) != others {
		t.Errorf("%d records of the other endpoint's %d connections, want every one", len(got), others)
	}
	byEP, err := r.SuppressedByEndpoint()
	if err != nil {
		t.Fatal(err)
	}
	if len(byEP) != 1 || byEP[epA] != suppressed {
		t.Errorf("suppressed by endpoint: %v, want %d of endpoint %#x alone", byEP, suppressed, epA)
	}
	if lost, err := r.Lost(); err != nil || lost != 0 {
		t.Errorf("lost flow records: %d, %v; want 0", lost, err)
	}
}

// TestDecodeFlowRecord checks the hand-written decoder of a record against
// binary.Decode's, on records of random bytes.
func TestDecodeFlowRecord(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	b := make([]byte, flowRecordSize)
	for range 1000 {
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		var want FlowRecord
		if _, err := binary.Decode(b, binary.NativeEndian, &want); err != nil {
			t.Fatal(err)
		}
		if got := decodeFlowRecord(b); got != want {
			t.Fatalf("decoded %+v, want %+v", got, want)
		}
	}
}

// TestFlowReaderCloseDuringCalls closes a reader while another goroutine sweeps, counts
// and reads it: Close waits for the calls under way, which then return
// ErrReaderClosed, and a Read under way returns ringbuf.ErrClosed, none of them reading
// what Close let go of.
func TestFlowReaderCloseDuringCalls(t *testing.T) {
	f := newFixture(t)
	f.install(endpoint(f.ifA, epA, 0, 0, gen1))
	for i := range 100 {
		f.from(f.ifA, udp(families[0].ep, uint16(10000+i), families[0].peer, 53), tcxNext)
	}
	r, err := NewFlowReader(f.flowMaps)
	if err != nil {
		t.Fatal(err)
	}
	calls := make(chan error, 1)
	var rounds atomic.Int64
	go func() {
		for {
			rounds.Add(1)
			r.Pending()
			_, err := r.SweepConntrack()
			if err == nil {
				_, err = r.Lost()
			}
			if err == nil {
				_, err = r.Suppressed()
			}
			if err != nil {
				calls <- err
				return
			}
		}
	}()
	reads := make(chan error, 1)
	go func() {
		for {
			if _, err := r.Read(); err != nil {
				reads <- err
				return
			}
		}
	}()
	for rounds.Load() < 3 {
		runtime.Gosched()
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-calls; !errors.Is(err, ErrReaderClosed) {
		t.Errorf("the calls after Close: %v, want ErrReaderClosed", err)
	}
	if err := <-reads; !errors.Is(err, ringbuf.ErrClosed) {
		t.Errorf("a Read after Close: %v, want ringbuf.ErrClosed", err)
	}
}
