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
// happened (Type, one of FlowNew, FlowDeny, FlowActive and FlowEnd, and Reason), when
// (Time, as CTValue.LastSeen), to which packet (its interface, endpoint id, direction,
// family, protocol, ports and addresses as CTKey holds them, and its length) and the rule
// that decided, 0 for none. A FlowActive or FlowEnd record carries the connection's
// original tuple and direction; a FlowDeny record of ReasonSpoofed no tuple (Family 0).
// The records of a connection (FlowNew, FlowActive, FlowEnd) carry its start (as Time)
// and its counts as CTValue holds them, up to and including the record's packet.
type FlowRecord = firewallFwFlow

// Types of a FlowRecord.
const (
	// FlowNew: a connection was allowed and is tracked from this packet on.
	FlowNew = 1
	// FlowDeny: a packet was dropped, for Reason.
	FlowDeny = 2
	// FlowEnd: a tracked connection ended, for Reason (EndFIN, EndRST, EndIdle).
	FlowEnd = 3
	// FlowActive: a tracked connection saw a packet FlowActive after its last record
	// (Capacities.FlowActive).
	FlowActive = 4
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
	// ReasonVLAN: a VLAN-tagged frame, on an endpoint's untagged port; no tuple.
	ReasonVLAN = 5
)

// Reasons of a FlowEnd record.
const (
	// EndFIN: both sides sent a FIN; the record is of the first packet after both, the
	// ACK of the last.
	EndFIN = 1
	// EndRST: a side reset the connection.
	EndRST = 2
	// EndIdle: the connection saw no packet for its timeout (CTTimeout). The program
	// writes it when a new connection of the same tuple takes the expired entry;
	// SweepConntrack finds the others.
	EndIdle = 3
)

// flowRecordSize is the size of struct fw_flow.
const flowRecordSize = 112

// FlowReader reads the flow records the programs write, and how many they could not, and
// finds the connections that ended idle (SweepConntrack).
type FlowReader struct {
	rd   *ringbuf.Reader
	maps FlowMaps
	rec  ringbuf.Record
	// deadline is SetDeadline's.
	deadline time.Time
	// owned are the maps the reader opened itself, which Close closes.
	owned []*ebpf.Map
	// mu guards closed, the maps and the ring against Close: the calls that read them,
	// but Read, hold it shared, Close alone, so that Close, from any goroutine, waits for
	// them rather than closes what they read.
	mu        sync.RWMutex
	closed    bool
	closeOnce sync.Once
	closeErr  error
}

// FlowMaps are the maps a FlowReader reads.
type FlowMaps struct {
	// Flows is the ring of records (MapFlows), Lost and Suppressed the counts of those
	// lost (MapFlowLost) and suppressed (MapFlowSuppressed), Budget the endpoints' budgets
	// (MapFlowBudget) and CT the conntrack table (MapCT), which SweepConntrack sweeps.
	Flows, Lost, Suppressed, Budget, CT *ebpf.Map
}

// flowMapNames are the names of the maps of FlowMaps, in its order.
var flowMapNames = []string{MapFlows, MapFlowLost, MapFlowSuppressed, MapFlowBudget, MapCT}

// NewFlowReader reads the records of the maps' ring and their counts.
func NewFlowReader(maps FlowMaps) (*FlowReader, error) {
	rd, err := ringbuf.NewReader(maps.Flows)
	if err != nil {
		return nil, fmt.Errorf("reading the flow records: %w", err)
	}
	return &FlowReader{rd: rd, maps: maps}, nil
}

// FlowReader returns a reader of the flow records of the objects' programs.
func (o *Objects) FlowReader() (*FlowReader, error) {
	return NewFlowReader(FlowMaps{Flows: o.Flows, Lost: o.FlowLost, Suppressed: o.FlowSuppressed, Budget: o.FlowBudget, CT: o.CT})
}

// ErrReaderClosed is the error of a FlowReader's calls after Close, but Read's, which is
// ringbuf.ErrClosed.
var ErrReaderClosed = errors.New("the flow reader is closed")

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
	if err := readRing(r.rd, &r.rec, r.deadline, ErrNoRecord); err != nil {
		return f, err
	}
	if len(r.rec.RawSample) < flowRecordSize {
		return f, fmt.Errorf("a flow record of %d bytes, want %d", len(r.rec.RawSample), flowRecordSize)
	}
	return decodeFlowRecord(r.rec.RawSample[:flowRecordSize]), nil
}

// readRing reads the next record of rd into rec, polling every flowPoll, until the
// deadline (the zero time: none) passed, when it returns none, or rd is closed.
func readRing(rd *ringbuf.Reader, rec *ringbuf.Record, deadline time.Time, none error) error {
	for {
		wait := time.Now().Add(flowPoll)
		if !deadline.IsZero() && deadline.Before(wait) {
			wait = deadline
		}
		rd.SetDeadline(wait)
		err := rd.ReadInto(rec)
		if err == nil {
			return nil
		}
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			return err
		}
		if !deadline.IsZero() && !time.Now().Before(deadline) {
			return none
		}
	}
}

// decodeFlowRecord decodes struct fw_flow field by field: binary.Decode's reflection took
// a share of the agent's CPU at thousands of records a second.
func decodeFlowRecord(b []byte) FlowRecord {
	e := binary.NativeEndian
	f := FlowRecord{
		Time: e.Uint64(b[0:]), Rule: e.Uint64(b[8:]), Ifindex: e.Uint32(b[16:]), Ep: e.Uint32(b[20:]), Len: e.Uint32(b[24:]),
		Type: b[28], Reason: b[29], Dir: b[30], Family: b[31], Proto: b[32], Pad: b[33],
		Sport: e.Uint16(b[34:]), Dport: e.Uint16(b[36:]), Pad2: e.Uint16(b[38:]),
		Start: e.Uint64(b[72:]),
	}
	copy(f.Saddr[:], b[40:56])
	copy(f.Daddr[:], b[56:72])
	for i := range 2 {
		f.Packets[i] = e.Uint64(b[80+8*i:])
		f.Bytes[i] = e.Uint64(b[96+8*i:])
	}
	return f
}

// SetDeadline makes Read return ErrNoRecord once t passed and no record is left; the zero
// time waits for ever.
func (r *FlowReader) SetDeadline(t time.Time) { r.deadline = t }

// Pending returns how many bytes of records the ring holds that the reader has not read
// yet, and the ring's size in bytes.
func (r *FlowReader) Pending() (pending, size int) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if r.closed {
		return 0, r.rd.BufferSize()
	}
	return r.rd.AvailableBytes(), r.rd.BufferSize()
}

// Lost returns how many flow records the programs could not write because the ring was
// full, summed over CPUs, since the map was made.
func (r *FlowReader) Lost() (uint64, error) {
	return r.sumPerCPU(r.maps.Lost, "lost")
}

// Suppressed returns how many flow records the programs did not write because their
// endpoint had spent its budget (Capacities.FlowEndpointRate), summed over CPUs, since the
// map was made.
func (r *FlowReader) Suppressed() (uint64, error) {
	return r.sumPerCPU(r.maps.Suppressed, "suppressed")
}

// SuppressedByEndpoint returns, of the endpoints with a budget now (the table holds the
// latest Capacities.Endpoints), the records each had suppressed, by endpoint id, those
// with none left out.
func (r *FlowReader) SuppressedByEndpoint() (map[uint32]uint64, error) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if r.closed {
		return nil, ErrReaderClosed
	}
	out := map[uint32]uint64{}
	var id uint32
	var per []FlowBucket
	it := r.maps.Budget.Iterate()
	for it.Next(&id, &per) {
		var n uint64
		for _, b := range per {
			n += b.Suppressed
		}
		if n > 0 {
			out[id] = n
		}
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("reading the endpoints' flow budgets: %w", err)
	}
	return out, nil
}

// sumPerCPU returns the sum over CPUs of the one uint64 of the per-CPU array m, of what
// records.
func (r *FlowReader) sumPerCPU(m *ebpf.Map, what string) (uint64, error) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if r.closed {
		return 0, ErrReaderClosed
	}
	var per []uint64
	if err := m.Lookup(uint32(0), &per); err != nil {
		return 0, fmt.Errorf("reading the %s flow records: %w", what, err)
	}
	var n uint64
	for _, c := range per {
		n += c
	}
	return n, nil
}

// sweepBatch is how many conntrack entries SweepConntrack reads with one syscall.
const sweepBatch = 4096

// SweepConntrack deletes the expired entries of the conntrack table and returns the
// FlowEnd records of EndIdle of those that had none yet, as the program writes them but
// for the endpoint id (0: the interface names it) and the packet's length (0). Each
// entry is taken out and checked at once (lookup and delete), so a packet that comes
// while it is swept either is counted in its record or starts a new connection; one that
// was not expired when taken out goes back, unless a packet made a new one meanwhile.
// It may run beside Read, from another goroutine; it takes time in proportion to the
// table's size (Capacities.Conntrack).
func (r *FlowReader) SweepConntrack() ([]FlowRecord, error) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if r.closed {
		return nil, ErrReaderClosed
	}
	now, err := KtimeNow()
	if err != nil {
		return nil, err
	}
	// The table is read in batches, a syscall for sweepBatch entries, not two for each.
	keys, vals := make([]CTKey, sweepBatch), make([]CTValue, sweepBatch)
	var cursor ebpf.MapBatchCursor
	var expired []CTKey
	for {
		n, err := r.maps.CT.BatchLookup(&cursor, keys, vals, nil)
		for i := range n {
			if CTExpired(&keys[i], &vals[i], now) {
				expired = append(expired, keys[i])
			}
		}
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("reading the conntrack table: %w", err)
		}
	}
	var v CTValue
	var ended []FlowRecord
	for _, k := range expired {
		if err := r.maps.CT.LookupAndDelete(&k, &v); err != nil {
			if errors.Is(err, ebpf.ErrKeyNotExist) {
				continue
			}
			return ended, fmt.Errorf("taking an expired conntrack entry out: %w", err)
		}
		if !CTExpired(&k, &v, now) {
			if err := r.maps.CT.Update(&k, &v, ebpf.UpdateNoExist); err != nil && !errors.Is(err, ebpf.ErrKeyExist) {
				return ended, fmt.Errorf("putting a live conntrack entry back: %w", err)
			}
			continue
		}
		if v.Ended == 0 {
			ended = append(ended, FlowRecord{
				Time: now, Rule: v.Rule, Ifindex: k.Ifindex, Type: FlowEnd, Reason: EndIdle,
				Dir: v.Dir, Family: k.Family, Proto: k.Proto, Sport: k.Sport, Dport: k.Dport,
				Saddr: k.Saddr, Daddr: k.Daddr, Start: v.Start, Packets: v.Packets, Bytes: v.Bytes,
			})
		}
	}
	return ended, nil
}

// Close ends the reader; a Read under way returns ringbuf.ErrClosed, the other calls
// ErrReaderClosed once those under way have returned, which Close waits for. It may be
// called more than once, from any goroutine.
func (r *FlowReader) Close() error {
	r.closeOnce.Do(func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.closed = true
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
	maps := make([]*ebpf.Map, len(flowMapNames))
	for i, name := range flowMapNames {
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
	r, err := NewFlowReader(FlowMaps{Flows: maps[0], Lost: maps[1], Suppressed: maps[2], Budget: maps[3], CT: maps[4]})
	if err != nil {
		for _, m := range maps {
			m.Close()
		}
		return nil, err
	}
	r.owned = maps
	return r, nil
}
