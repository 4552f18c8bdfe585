package fwbpf

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/ringbuf"
)

// FlowRecord is one flow record the programs write to MapFlows (struct fw_flow): what
// happened (Type, one of FlowNew, FlowDeny and FlowEnd, and Reason), when (Time, as
// CTValue.LastSeen), to which packet (its interface, endpoint id, direction, family,
// protocol, ports and addresses as CTKey holds them, and its length) and the rule that
// decided, 0 for none. A FlowEnd record carries the connection's original tuple and
// direction; a FlowDeny record of ReasonSpoofed no tuple (Family 0).
type FlowRecord = firewallFwFlow

// Types of a FlowRecord.
const (
	// FlowNew: a connection was allowed and is tracked from this packet on.
	FlowNew = 1
	// FlowDeny: a packet was dropped, for Reason.
	FlowDeny = 2
	// FlowEnd: a tracked TCP connection saw its first FIN or RST (Reason EndFIN or
	// EndRST).
	FlowEnd = 3
)

// Reasons of a FlowDeny record.
const (
	// ReasonPolicy: the policy denied it; Rule is the DENY rule, 0 when no rule allowed
	// it.
	ReasonPolicy = 1
	// ReasonSpoofed: it was not from the endpoint's own addresses.
	ReasonSpoofed = 2
	// ReasonMalformed: its headers could not be read, or were hostile.
	ReasonMalformed = 3
	// ReasonFragment: a later fragment whose first was not seen, or expired.
	ReasonFragment = 4
)

// Reasons of a FlowEnd record.
const (
	EndFIN = 1
	EndRST = 2
)

// flowRecordSize is the size of struct fw_flow.
const flowRecordSize = 72

// FlowReader reads the flow records the programs write, and how many they could not.
type FlowReader struct {
	rd   *ringbuf.Reader
	lost *ebpf.Map
	rec  ringbuf.Record
	// deadline is SetDeadline's.
	deadline time.Time
	// owned are the maps the reader opened itself, which Close closes.
	owned     []*ebpf.Map
	closeOnce sync.Once
	closeErr  error
}

// NewFlowReader reads the records of the ring flows (MapFlows) and counts the lost ones
// of lost (MapFlowLost).
func NewFlowReader(flows, lost *ebpf.Map) (*FlowReader, error) {
	rd, err := ringbuf.NewReader(flows)
	if err != nil {
		return nil, fmt.Errorf("reading the flow records: %w", err)
	}
	return &FlowReader{rd: rd, lost: lost}, nil
}

// FlowReader returns a reader of the flow records of the objects' programs.
func (o *Objects) FlowReader() (*FlowReader, error) {
	return NewFlowReader(o.Flows, o.FlowLost)
}

// ErrNoRecord is the error of Read when its deadline passed without a record.
var ErrNoRecord = errors.New("no flow record before the deadline")

// flowWakeupShare is the share of the ring (1/flowWakeupShare) that wakes the reader up
// when records fill it; flowPoll how often the reader looks for fewer.
const (
	flowWakeupShare = 8
	flowPoll        = 50 * time.Millisecond
)

// Read returns the next flow record, waiting until one comes, the deadline passes
// (ErrNoRecord) or the reader is closed (ringbuf.ErrClosed). A record comes at most
// flowPoll after it was written, or as soon as records fill an eighth of the ring.
func (r *FlowReader) Read() (FlowRecord, error) {
	var f FlowRecord
	for {
		wait := time.Now().Add(flowPoll)
		if !r.deadline.IsZero() && r.deadline.Before(wait) {
			wait = r.deadline
		}
		r.rd.SetDeadline(wait)
		err := r.rd.ReadInto(&r.rec)
		if err == nil {
			break
		}
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			return f, err
		}
		if !r.deadline.IsZero() && !time.Now().Before(r.deadline) {
			return f, ErrNoRecord
		}
	}
	if len(r.rec.RawSample) < flowRecordSize {
		return f, fmt.Errorf("a flow record of %d bytes, want %d", len(r.rec.RawSample), flowRecordSize)
	}
	if _, err := binary.Decode(r.rec.RawSample[:flowRecordSize], binary.NativeEndian, &f); err != nil {
		return f, fmt.Errorf("decoding a flow record: %w", err)
	}
	return f, nil
}

// SetDeadline makes Read return ErrNoRecord once t passed and no record is left; the zero
// time waits for ever.
func (r *FlowReader) SetDeadline(t time.Time) { r.deadline = t }

// Lost returns how many flow records the programs could not write because the ring was
// full, summed over CPUs, since the map was made.
func (r *FlowReader) Lost() (uint64, error) {
	var per []uint64
	if err := r.lost.Lookup(uint32(0), &per); err != nil {
		return 0, fmt.Errorf("reading the lost flow records: %w", err)
	}
	var n uint64
	for _, c := range per {
		n += c
	}
	return n, nil
}

// Close ends the reader; a Read under way returns ringbuf.ErrClosed. It may be called
// more than once, from any goroutine.
func (r *FlowReader) Close() error {
	r.closeOnce.Do(func() {
		r.closeErr = r.rd.Close()
		for _, m := range r.owned {
			m.Close()
		}
	})
	return r.closeErr
}

// OpenPinnedFlows reads the flow records of the firewall whose maps are pinned in dir, as
// Open pinned them (an error wrapping os.ErrNotExist until it did). One reader takes the
// records: two would each get some.
func OpenPinnedFlows(dir string) (*FlowReader, error) {
	spec, err := LoadSpec()
	if err != nil {
		return nil, fmt.Errorf("loading the firewall's program spec: %w", err)
	}
	var maps [2]*ebpf.Map
	for i, name := range []string{MapFlows, MapFlowLost} {
		path := filepath.Join(dir, name)
		m, err := ebpf.LoadPinnedMap(path, nil)
		if err != nil {
			for _, m := range maps[:i] {
				m.Close()
			}
			return nil, fmt.Errorf("opening pinned map %s: %w", path, err)
		}
		if want := spec.Maps[name]; m.Type() != want.Type || m.KeySize() != want.KeySize || m.ValueSize() != want.ValueSize {
			m.Close()
			for _, m := range maps[:i] {
				m.Close()
			}
			return nil, fmt.Errorf("pinned map %s: %s, want the firewall's %s", path, m.Type(), want.Type)
		}
		maps[i] = m
	}
	r, err := NewFlowReader(maps[0], maps[1])
	if err != nil {
		maps[0].Close()
		maps[1].Close()
		return nil, err
	}
	r.owned = maps[:]
	return r, nil
}
