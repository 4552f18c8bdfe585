package fwbpf

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/ringbuf"
	"golang.org/x/sys/unix"
)

// TraceEntry is an installed trace in MapTraces (struct fw_trace): the nonce its packets
// carry; Flags and Pad are 0.
type TraceEntry = firewallFwTrace

// TraceEvent is what a hook saw of a trace packet (struct fw_trace_event): when (Time, as
// CTValue.LastSeen), where (Stage, one of the TraceStage constants, and the interface),
// of which trace (ID), at which local endpoint (Endpoint, the snapshot's id; 0 at an
// observer), the packet's length and Ethernet addresses there, what became of it
// (Verdict, one of the TraceVerdict constants, and Reason, a FlowDeny reason, when
// denied) and the deciding rule (0 for none). Live marks a real packet of a live trace
// (StartLiveTrace), whose event carries a DENY rule but no ALLOW rule (0).
type TraceEvent struct {
	Time, Rule                 uint64
	ID, Ifindex, Endpoint, Len uint32
	Stage, Verdict, Reason     uint8
	Live                       bool
	SrcMAC, DstMAC             net.HardwareAddr
}

// traceEventSize is the size of struct fw_trace_event.
const traceEventSize = 48

// decodeTraceEvent decodes struct fw_trace_event field by field, as decodeFlowRecord.
func decodeTraceEvent(b []byte) TraceEvent {
	e := binary.NativeEndian
	return TraceEvent{
		Time: e.Uint64(b[0:]), Rule: e.Uint64(b[8:]),
		ID: e.Uint32(b[16:]), Ifindex: e.Uint32(b[20:]), Endpoint: e.Uint32(b[24:]), Len: e.Uint32(b[28:]),
		Stage: b[32], Verdict: b[33], Reason: b[34], Live: b[35] != 0,
		SrcMAC: net.HardwareAddr(append([]byte(nil), b[36:42]...)),
		DstMAC: net.HardwareAddr(append([]byte(nil), b[42:48]...)),
	}
}

// StartTrace installs the trace id with its nonce (replacing the nonce of an installed
// trace id): from then on the packets that carry both are trace packets. At most
// MaxTraces are installed at once.
func (o *Objects) StartTrace(id uint32, nonce uint64) error {
	if o.caps.NoTraces {
		return ErrTracesOff
	}
	o.traceMu.Lock()
	defer o.traceMu.Unlock()
	err := o.Traces.Update(id, TraceEntry{Nonce: nonce}, ebpf.UpdateAny)
	if errors.Is(err, unix.E2BIG) {
		return fmt.Errorf("starting trace %d: %d traces are installed, the limit", id, MaxTraces)
	}
	if err != nil {
		return fmt.Errorf("starting trace %d: %w", id, err)
	}
	return o.countTracesLocked()
}

// TraceTuple is the tuple of the real packets a live trace records, as the firewall
// sees them at an endpoint's interface: the protocol, the addresses (both IPv4 or both
// IPv6) and the TCP or UDP ports, or an ICMP echo request's identifier as SrcPort (a
// reply's as DstPort), 0 otherwise.
type TraceTuple struct {
	Proto            uint8
	Src, Dst         netip.Addr
	SrcPort, DstPort uint16
}

// key returns the tuple as a key of MapTraceLive: a CTKey of interface 0.
func (t TraceTuple) key() (CTKey, error) {
	if !t.Src.IsValid() || !t.Dst.IsValid() || t.Src.Is4() != t.Dst.Is4() || t.Src.Is4In6() || t.Dst.Is4In6() {
		return CTKey{}, fmt.Errorf("live trace tuple addresses %v and %v: want two IPv4 or two IPv6 addresses", t.Src, t.Dst)
	}
	k := CTKey{Family: 6, Proto: t.Proto, Saddr: t.Src.As16(), Daddr: t.Dst.As16()}
	if t.Src.Is4() {
		k.Family = 4
		k.Saddr, k.Daddr = [16]byte{}, [16]byte{}
		a, b := t.Src.As4(), t.Dst.As4()
		copy(k.Saddr[:], a[:])
		copy(k.Daddr[:], b[:])
	}
	var p [2]byte
	binary.BigEndian.PutUint16(p[:], t.SrcPort)
	k.Sport = binary.NativeEndian.Uint16(p[:])
	binary.BigEndian.PutUint16(p[:], t.DstPort)
	k.Dport = binary.NativeEndian.Uint16(p[:])
	return k, nil
}

// traceLiveValue is a value of MapTraceLive (struct fw_trace_live_value): the trace's id
// and the stages (bits 1 << TraceStage*) that recorded a packet already.
type traceLiveValue struct {
	ID, Seen uint32
}

// StartLiveTrace installs the live trace id: from then on the first real packet of the
// tuple that each stage sees is recorded (TraceEvent.Live), with the verdict the firewall
// gave it at an endpoint's hook, and treated as always. It replaces a live trace of the
// same tuple, and counts against MaxTraces. StopTrace removes it.
func (o *Objects) StartLiveTrace(id uint32, t TraceTuple) error {
	if o.caps.NoTraces {
		return ErrTracesOff
	}
	k, err := t.key()
	if err != nil {
		return fmt.Errorf("starting live trace %d: %w", id, err)
	}
	o.traceMu.Lock()
	defer o.traceMu.Unlock()
	err = o.TraceLive.Update(&k, traceLiveValue{ID: id}, ebpf.UpdateAny)
	if errors.Is(err, unix.E2BIG) {
		return fmt.Errorf("starting live trace %d: %d live traces are installed, the limit", id, MaxTraces)
	}
	if err != nil {
		return fmt.Errorf("starting live trace %d: %w", id, err)
	}
	return o.countTracesLocked()
}

// StopTrace removes the trace id, and the live traces of the id; a trace that is not
// installed is no error.
func (o *Objects) StopTrace(id uint32) error {
	o.traceMu.Lock()
	defer o.traceMu.Unlock()
	if err := o.Traces.Delete(id); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("stopping trace %d: %w", id, err)
	}
	var k CTKey
	var v traceLiveValue
	var live []CTKey
	it := o.TraceLive.Iterate()
	for it.Next(&k, &v) {
		if v.ID == id {
			live = append(live, k)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("stopping trace %d: reading the live traces: %w", id, err)
	}
	for i := range live {
		if err := o.TraceLive.Delete(&live[i]); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("stopping live trace %d: %w", id, err)
		}
	}
	return o.countTracesLocked()
}

// countTracesLocked sets MapTraceCtl's counts to the number of installed traces, and
// of live ones.
func (o *Objects) countTracesLocked() error {
	var ctl struct{ Active, Live uint32 }
	var id uint32
	var v TraceEntry
	it := o.Traces.Iterate()
	for it.Next(&id, &v) {
		ctl.Active++
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("counting the installed traces: %w", err)
	}
	var k CTKey
	var lv traceLiveValue
	lit := o.TraceLive.Iterate()
	for lit.Next(&k, &lv) {
		ctl.Live++
	}
	if err := lit.Err(); err != nil {
		return fmt.Errorf("counting the live traces: %w", err)
	}
	ctl.Active += ctl.Live
	if err := o.TraceCtl.Put(uint32(0), ctl); err != nil {
		return fmt.Errorf("setting the count of installed traces to %d (%d live): %w", ctl.Active, ctl.Live, err)
	}
	return nil
}

// AttachTraceObserver attaches the observers of a tunnel device (TraceTunnelIn and
// TraceTunnelOut) or, gateway, of a bridge (TraceGatewayIn and TraceGatewayOut) to both
// tcx hooks of the interface with the index, after the programs there, as links of this
// process (not pinned): closing the result detaches both. It must run in the
// interface's network namespace.
func (o *Objects) AttachTraceObserver(ifindex int, gateway bool) (io.Closer, error) {
	in, out := o.TraceTunnelIn, o.TraceTunnelOut
	if gateway {
		in, out = o.TraceGatewayIn, o.TraceGatewayOut
	}
	obs := &traceObserver{}
	for _, h := range []struct {
		prog *ebpf.Program
		at   ebpf.AttachType
	}{{in, ebpf.AttachTCXIngress}, {out, ebpf.AttachTCXEgress}} {
		l, err := link.AttachTCX(link.TCXOptions{Interface: ifindex, Program: h.prog, Attach: h.at, Anchor: link.Tail()})
		if err != nil {
			obs.Close()
			return nil, fmt.Errorf("attaching the trace observer to interface %d: %w", ifindex, err)
		}
		obs.links = append(obs.links, l)
	}
	return obs, nil
}

// traceObserver is an attached pair of observers.
type traceObserver struct {
	links []link.Link
}

// Close detaches the observers; a second Close does nothing.
func (t *traceObserver) Close() error {
	var errs []error
	for _, l := range t.links {
		errs = append(errs, l.Close())
	}
	t.links = nil
	return errors.Join(errs...)
}

// xdpMD is the context of an XDP program's test run (struct xdp_md).
type xdpMD struct {
	Data, DataEnd, DataMeta, IngressIfindex, RxQueueIndex, EgressIfindex uint32
}

// InjectTrace puts the frame into the stack as if the interface with the index had
// received it (an XDP_PASS of TraceInject run with BPF_F_TEST_XDP_LIVE_FRAMES): its tcx
// ingress hook, the firewall of an endpoint's interface, sees it first. It must run in
// the interface's network namespace.
func (o *Objects) InjectTrace(ifindex int, frame []byte) error {
	if len(frame) < 14 {
		return fmt.Errorf("injecting a trace frame of %d bytes: want an Ethernet frame", len(frame))
	}
	_, err := o.TraceInject.Run(&ebpf.RunOptions{
		Data:    frame,
		Context: xdpMD{DataEnd: uint32(len(frame)), IngressIfindex: uint32(ifindex)},
		Repeat:  1,
		Flags:   unix.BPF_F_TEST_XDP_LIVE_FRAMES,
	})
	if err != nil {
		return fmt.Errorf("injecting a trace frame on interface %d: %w", ifindex, err)
	}
	return nil
}

// ErrTracesOff is the error of StartTrace and StartLiveTrace when the programs were loaded
// without their trace checks (Capacities.NoTraces).
var ErrTracesOff = errors.New("the firewall runs without its trace checks")

// ErrNoTraceEvent is the error of TraceReader.Read when its deadline passed without an
// event.
var ErrNoTraceEvent = errors.New("no trace event before the deadline")

// TraceReader reads the trace events the programs write, and how many they could not.
type TraceReader struct {
	rd       *ringbuf.Reader
	lost     *ebpf.Map
	rec      ringbuf.Record
	deadline time.Time
	// mu guards closed against Close: Lost holds it shared, Close alone.
	mu        sync.RWMutex
	closed    bool
	closeOnce sync.Once
	closeErr  error
}

// TraceReader returns a reader of the trace events of the objects' programs. One reader
// takes the events: two would each get some.
func (o *Objects) TraceReader() (*TraceReader, error) {
	rd, err := ringbuf.NewReader(o.TraceEvents)
	if err != nil {
		return nil, fmt.Errorf("reading the trace events: %w", err)
	}
	return &TraceReader{rd: rd, lost: o.TraceLost}, nil
}

// Read returns the next trace event, waiting until one comes, the deadline passes
// (ErrNoTraceEvent) or the reader is closed (ringbuf.ErrClosed). An event wakes a reader
// that has caught up (the ring's default); it polls too, as FlowReader does.
func (r *TraceReader) Read() (TraceEvent, error) {
	if err := readRing(r.rd, &r.rec, r.deadline, ErrNoTraceEvent); err != nil {
		return TraceEvent{}, err
	}
	if len(r.rec.RawSample) < traceEventSize {
		return TraceEvent{}, fmt.Errorf("a trace event of %d bytes, want %d", len(r.rec.RawSample), traceEventSize)
	}
	return decodeTraceEvent(r.rec.RawSample[:traceEventSize]), nil
}

// SetDeadline makes Read return ErrNoTraceEvent once t passed and no event is left; the
// zero time waits for ever.
func (r *TraceReader) SetDeadline(t time.Time) { r.deadline = t }

// Lost returns how many trace events the programs could not write because the ring was
// full, summed over CPUs, since the map was made.
func (r *TraceReader) Lost() (uint64, error) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if r.closed {
		return 0, ErrReaderClosed
	}
	var per []uint64
	if err := r.lost.Lookup(uint32(0), &per); err != nil {
		return 0, fmt.Errorf("reading the lost trace events: %w", err)
	}
	var n uint64
	for _, c := range per {
		n += c
	}
	return n, nil
}

// Close stops the reader: a Read waiting in another goroutine returns ringbuf.ErrClosed.
// It is safe to call twice.
func (r *TraceReader) Close() error {
	r.closeOnce.Do(func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.closed = true
		r.closeErr = r.rd.Close()
	})
	return r.closeErr
}
