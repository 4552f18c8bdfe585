package fwbpf

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/naplesnet/naples/hal/firewall"
	"github.com/naplesnet/naples/hal/linux/internal/tcxpin"
)

// Capacities are the sizes of the firewall's maps, and how often its flow records come.
type Capacities struct {
	// Snapshot is the number of entries a snapshot holds (endpoints, identity prefixes
	// and policy entries together). Default: 65536.
	Snapshot int
	// Conntrack is the number of connections tracked at once; when it is full the least
	// recently used connection is evicted. Default: 262144.
	Conntrack int
	// Rules is the number of rules whose hits are counted. Default: 65536.
	Rules int
	// Endpoints is the number of local endpoints whose packets are counted. Default:
	// 16384.
	Endpoints int
	// Fragments is the number of fragmented datagrams whose first fragment's verdict is
	// kept at once, for FragTimeout, for their later fragments; when it is full the least
	// recently used is evicted, and the later fragments of an evicted datagram are
	// dropped (StatFragUntrackedDrops). Default: 8192.
	Fragments int
	// FlowRing is the size in bytes of the ring of flow records (MapFlows): a power of 2,
	// at least the page size. Records the reader did not take before the ring filled
	// are counted (MapFlowLost), not written. 0, the default, writes no flow records.
	FlowRing int
	// FlowActive is how long after its last record a connection that still sees packets
	// gets a FlowActive record, with its counts; 0 writes none. Whole milliseconds, at
	// most a day.
	FlowActive time.Duration
	// FlowEndpointRate is how many flow records a second each local endpoint may have
	// written on each CPU, with a burst of as many; past it its records are suppressed
	// and counted (MapFlowSuppressed, and per endpoint in MapFlowBudget), so that one
	// endpoint's flood does not fill the ring that all share. 0 leaves records
	// unbudgeted. At most 1e9.
	FlowEndpointRate int
	// NoTraces leaves the trace checks out of the programs (the verifier prunes them):
	// no trace can be installed (ErrTracesOff), and no packet pays for them.
	NoTraces bool
}

// WithDefaults returns c with every zero capacity set to its default.
func (c Capacities) WithDefaults() Capacities {
	if c.Snapshot <= 0 {
		c.Snapshot = 65536
	}
	if c.Conntrack <= 0 {
		c.Conntrack = 262144
	}
	if c.Rules <= 0 {
		c.Rules = 65536
	}
	if c.Endpoints <= 0 {
		c.Endpoints = 16384
	}
	if c.Fragments <= 0 {
		c.Fragments = 8192
	}
	return c
}

// Objects are the firewall's programs and maps, loaded from the embedded object with its
// maps pinned in a directory of bpffs, so that they outlive the process that loaded them.
type Objects struct {
	// Ingress runs at a local endpoint interface's tcx ingress hook (the endpoint's
	// egress); Egress at its tcx egress hook.
	Ingress, Egress *ebpf.Program
	// Snapshots is the array of one slot that holds the current snapshot.
	Snapshots *ebpf.Map
	// CT is the conntrack table; Frag the first fragments' verdicts; RuleStats,
	// EndpointStats and Stats the counters; Flows the flow records and FlowLost the
	// count of those lost (FlowReader).
	CT, Frag, RuleStats, EndpointStats, Stats, Flows, FlowLost *ebpf.Map
	// FlowBudget and FlowSuppressed are the endpoints' budgets of flow records and the
	// count of those suppressed.
	FlowBudget, FlowSuppressed *ebpf.Map
	// TraceTunnelOut, TraceTunnelIn, TraceGatewayOut and TraceGatewayIn are the trace
	// observers (AttachTraceObserver); TraceInject puts trace packets into the stack
	// (InjectTrace).
	TraceTunnelOut, TraceTunnelIn, TraceGatewayOut, TraceGatewayIn, TraceInject *ebpf.Program
	// TraceCtl counts the installed traces, Traces holds them (StartTrace), TraceEvents
	// is the ring of trace events and TraceLost the count of those lost (TraceReader).
	TraceCtl, Traces, TraceEvents, TraceLost *ebpf.Map
	// TraceLive holds the live traces (StartLiveTrace).
	TraceLive *ebpf.Map

	// traceMu serialises StartTrace and StopTrace, which keep TraceCtl's count equal to
	// Traces' entries.
	traceMu sync.Mutex

	dir   string
	caps  Capacities
	inner *ebpf.MapSpec
}

// bpffsMagic is the f_type statfs reports for bpffs.
const bpffsMagic = 0xcafe4a11

// Open loads the programs and maps with the capacities, reusing the maps pinned in dir (a
// directory of bpffs, made when missing; bpffs is mounted on /sys/fs/bpf when dir is
// under it and it is not mounted yet). A pinned map whose spec differs from the wanted one
// (a capacity changed, say) is replaced, and the log says so: its content is lost, but
// for the conntrack table's, which is carried over (migrateCT).
func Open(dir string, caps Capacities, log *slog.Logger) (*Objects, error) {
	caps = caps.WithDefaults()
	if err := mountBPFFS(dir); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Join(dir, "links"), 0o700); err != nil {
		return nil, fmt.Errorf("making the pin directory: %w", err)
	}
	spec, err := LoadSpec()
	if err != nil {
		return nil, fmt.Errorf("loading the firewall's program spec: %w", err)
	}
	spec.Maps[MapCT].MaxEntries = uint32(caps.Conntrack)
	spec.Maps[MapRuleStats].MaxEntries = uint32(caps.Rules)
	spec.Maps[MapEndpointStats].MaxEntries = uint32(caps.Endpoints)
	spec.Maps[MapFlowBudget].MaxEntries = uint32(caps.Endpoints)
	spec.Maps[MapFrag].MaxEntries = uint32(caps.Fragments)
	if err := setFlowRing(spec, caps.FlowRing, caps.FlowActive, caps.FlowEndpointRate); err != nil {
		return nil, err
	}
	if caps.NoTraces {
		if err := disableTrace(spec); err != nil {
			return nil, err
		}
	}
	inner := spec.Maps[MapSnapshots].InnerMap.Copy()
	inner.MaxEntries = uint32(caps.Snapshot)
	spec.Maps[MapSnapshots].InnerMap = inner.Copy()

	// The maps first, then the programs, each on a goroutine of its own: the kernel
	// verifies the programs of one collection one after the other, and the two largest
	// take the best part of a second each.
	maps := spec.Copy()
	maps.Programs = map[string]*ebpf.ProgramSpec{}
	var coll *ebpf.Collection
	var oldCT *ebpf.Map // the conntrack table being replaced
	defer func() {
		if oldCT != nil {
			oldCT.Close()
		}
	}()
	for attempt := 0; ; attempt++ {
		coll, err = ebpf.NewCollectionWithOptions(maps, ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: dir}})
		if err == nil {
			break
		}
		if !errors.Is(err, ebpf.ErrMapIncompatible) || attempt > len(spec.Maps) {
			return nil, fmt.Errorf("loading the firewall's maps: %w", err)
		}
		name := incompatibleMap(err, spec)
		if name == "" {
			return nil, fmt.Errorf("loading the firewall's maps: %w", err)
		}
		if name == MapCT && oldCT == nil {
			if m, err := ebpf.LoadPinnedMap(filepath.Join(dir, name), nil); err == nil {
				oldCT = m
			}
		}
		if oldCT != nil && name == MapCT {
			log.Info("the pinned conntrack table differs from the one wanted (capacity or layout changed); replacing it, its connections carried over",
				"map", name, "err", err)
		} else {
			log.Warn("a pinned firewall map differs from the one wanted (capacity changed?); replacing it, its content is lost",
				"map", name, "err", err)
		}
		if err := os.Remove(filepath.Join(dir, name)); err != nil {
			return nil, fmt.Errorf("replacing pinned map %s: %w", name, err)
		}
	}
	defer coll.Close()
	progs, err := loadPrograms(spec, coll.Maps)
	if err != nil {
		return nil, fmt.Errorf("loading the firewall's programs: %w", err)
	}
	o := &Objects{
		Ingress:         progs[ProgIngress],
		Egress:          progs[ProgEgress],
		Snapshots:       coll.DetachMap(MapSnapshots),
		CT:              coll.DetachMap(MapCT),
		Frag:            coll.DetachMap(MapFrag),
		RuleStats:       coll.DetachMap(MapRuleStats),
		EndpointStats:   coll.DetachMap(MapEndpointStats),
		Stats:           coll.DetachMap(MapStats),
		Flows:           coll.DetachMap(MapFlows),
		FlowLost:        coll.DetachMap(MapFlowLost),
		FlowBudget:      coll.DetachMap(MapFlowBudget),
		FlowSuppressed:  coll.DetachMap(MapFlowSuppressed),
		TraceTunnelOut:  progs[ProgTraceTunnelOut],
		TraceTunnelIn:   progs[ProgTraceTunnelIn],
		TraceGatewayOut: progs[ProgTraceGatewayOut],
		TraceGatewayIn:  progs[ProgTraceGatewayIn],
		TraceInject:     progs[ProgTraceInject],
		TraceCtl:        coll.DetachMap(MapTraceCtl),
		Traces:          coll.DetachMap(MapTraces),
		TraceEvents:     coll.DetachMap(MapTraceEvents),
		TraceLost:       coll.DetachMap(MapTraceLost),
		TraceLive:       coll.DetachMap(MapTraceLive),
		dir:             dir,
		caps:            caps,
		inner:           inner,
	}
	if oldCT != nil {
		n, skipped, err := migrateCT(oldCT, o.CT)
		if err != nil {
			log.Warn("carrying the conntrack table over: some connections are lost", "carried", n, "err", err)
		} else {
			log.Info("carried the conntrack table over", "connections", n, "skipped", skipped)
		}
	}
	return o, nil
}

// loadPrograms loads the programs of spec with maps, made already, each on a goroutine of
// its own, and returns them by name.
func loadPrograms(spec *ebpf.CollectionSpec, maps map[string]*ebpf.Map) (map[string]*ebpf.Program, error) {
	var mu sync.Mutex
	progs := make(map[string]*ebpf.Program, len(spec.Programs))
	var errs []error
	var wg sync.WaitGroup
	for name := range spec.Programs {
		one := spec.Copy()
		one.Programs = map[string]*ebpf.ProgramSpec{name: one.Programs[name]}
		wg.Go(func() {
			coll, err := ebpf.NewCollectionWithOptions(one, ebpf.CollectionOptions{MapReplacements: maps})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			progs[name] = coll.DetachProgram(name)
			coll.Close()
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for _, p := range progs {
			p.Close()
		}
		return nil, err
	}
	return progs, nil
}

// ctValueSizeV1 is the size of the first layout of struct fw_ct_value: the fields up to
// Pad, then 4 bytes of padding, without ends, start and counts.
const ctValueSizeV1 = 32

// migrateCT copies the entries of the conntrack table from, of this layout or the first,
// into to, until to is full, and returns how many it copied and how many it left out as
// expired or beyond to's capacity. An entry of the first layout starts with no counts,
// its start unknown (0) and its last record at its last packet. It stops at the first
// error but a full table.
func migrateCT(from, to *ebpf.Map) (copied, skipped int, err error) {
	if from.KeySize() != to.KeySize() || (from.ValueSize() != to.ValueSize() && from.ValueSize() != ctValueSizeV1) {
		return 0, 0, fmt.Errorf("the old conntrack table's key and value (%d, %d bytes) are of no known layout",
			from.KeySize(), from.ValueSize())
	}
	now, err := KtimeNow()
	if err != nil {
		return 0, 0, err
	}
	var k CTKey
	var raw []byte
	var v CTValue
	it := from.Iterate()
	for it.Next(&k, &raw) {
		if len(raw) == int(to.ValueSize()) {
			if _, err := binary.Decode(raw, binary.NativeEndian, &v); err != nil {
				return copied, skipped, fmt.Errorf("decoding a conntrack entry: %w", err)
			}
		} else {
			var old struct {
				LastSeen, Rule uint64
				Gen            uint32
				Dir, Flags     uint8
			}
			if _, err := binary.Decode(raw, binary.NativeEndian, &old); err != nil {
				return copied, skipped, fmt.Errorf("decoding a conntrack entry: %w", err)
			}
			v = CTValue{LastSeen: old.LastSeen, Rule: old.Rule, Gen: old.Gen, Dir: old.Dir, Flags: old.Flags, Reported: old.LastSeen}
		}
		if CTExpired(&k, &v, now) || copied >= int(to.MaxEntries()) {
			skipped++
			continue
		}
		if err := to.Update(&k, &v, ebpf.UpdateNoExist); err != nil {
			if errors.Is(err, ebpf.ErrKeyExist) {
				continue // the new programs tracked it already
			}
			return copied, skipped, fmt.Errorf("copying a conntrack entry: %w", err)
		}
		copied++
	}
	if err := it.Err(); err != nil {
		return copied, skipped, fmt.Errorf("reading the old conntrack table: %w", err)
	}
	return copied, skipped, nil
}

// setFlowRing sizes the ring of flow records of spec to bytes and turns the records on,
// with a FlowActive record every active and a budget of epRate records a second for each
// endpoint on each CPU (0: none), or, for 0 bytes, leaves them off with a ring of one page.
func setFlowRing(spec *ebpf.CollectionSpec, bytes int, active time.Duration, epRate int) error {
	page := os.Getpagesize()
	if bytes == 0 {
		spec.Maps[MapFlows].MaxEntries = uint32(page)
		return nil
	}
	if active < 0 || active > 24*time.Hour || active%time.Millisecond != 0 {
		return fmt.Errorf("flow active timeout %s: want whole milliseconds from 0 (none) to 24h", active)
	}
	if err := spec.Variables[varFlowsActive].Set(uint64(active)); err != nil {
		return fmt.Errorf("setting the flow records' active timeout: %w", err)
	}
	if epRate < 0 || epRate > 1e9 {
		return fmt.Errorf("flow records per endpoint per second %d: want 0 (no budget) to 1000000000", epRate)
	}
	if epRate > 0 {
		cost := uint64(time.Second) / uint64(epRate)
		if err := spec.Variables[varFlowsEPCost].Set(cost); err != nil {
			return fmt.Errorf("setting the endpoints' budget of flow records: %w", err)
		}
		if err := spec.Variables[varFlowsEPBurst].Set(cost * uint64(epRate)); err != nil {
			return fmt.Errorf("setting the endpoints' budget of flow records: %w", err)
		}
	}
	if bytes < page || bytes > 1<<30 || bytes&(bytes-1) != 0 {
		return fmt.Errorf("flow ring of %d bytes: want a power of 2 from %d (the page size) to 1 GiB", bytes, page)
	}
	spec.Maps[MapFlows].MaxEntries = uint32(bytes)
	if err := spec.Variables[varFlowsOn].Set(uint32(1)); err != nil {
		return fmt.Errorf("turning the flow records on: %w", err)
	}
	if err := spec.Variables[varFlowsWakeup].Set(uint64(bytes / flowWakeupShare)); err != nil {
		return fmt.Errorf("setting when flow records wake their reader: %w", err)
	}
	return nil
}

// disableTrace makes the programs of spec leave every trace check out (fw_trace_enabled
// 0): no packet is a trace packet. For benchmarks, the baseline of the checks' cost
// (BenchmarkTraceInactiveCost); Open always loads them on.
func disableTrace(spec *ebpf.CollectionSpec) error {
	if err := spec.Variables[varTraceEnabled].Set(uint8(0)); err != nil {
		return fmt.Errorf("turning the trace checks off: %w", err)
	}
	return nil
}

// incompatibleMap returns the name of the map the ErrMapIncompatible err is about, "" if
// it names none of spec's.
func incompatibleMap(err error, spec *ebpf.CollectionSpec) string {
	msg := err.Error()
	names := make([]string, 0, len(spec.Maps))
	for name := range spec.Maps {
		names = append(names, name)
	}
	// Longest first, so that fw_ct does not match inside a longer name.
	slices.SortFunc(names, func(a, b string) int { return len(b) - len(a) })
	for _, name := range names {
		if strings.Contains(msg, name) {
			return name
		}
	}
	return ""
}

// mountBPFFS mounts bpffs on /sys/fs/bpf when dir is under it and it is not bpffs yet.
func mountBPFFS(dir string) error {
	const root = "/sys/fs/bpf"
	if dir != root && !strings.HasPrefix(dir, root+"/") {
		return nil
	}
	var st unix.Statfs_t
	if err := unix.Statfs(root, &st); err == nil && st.Type == bpffsMagic {
		return nil
	}
	if err := unix.Mount("bpf", root, "bpf", 0, "mode=0700"); err != nil {
		return fmt.Errorf("mounting bpffs on %s: %w", root, err)
	}
	if err := unix.Statfs(root, &st); err != nil || st.Type != bpffsMagic {
		return fmt.Errorf("mounting bpffs on %s: it is not bpffs after the mount (type %#x, %v)", root, st.Type, err)
	}
	return nil
}

// Capacities returns the capacities the maps were made with.
func (o *Objects) Capacities() Capacities { return o.caps }

// Dir returns the pin directory.
func (o *Objects) Dir() string { return o.dir }

// Close releases the process's references to the programs and maps; pinned maps and
// links stay.
func (o *Objects) Close() error {
	for _, p := range []*ebpf.Program{o.Ingress, o.Egress, o.TraceTunnelOut, o.TraceTunnelIn, o.TraceGatewayOut, o.TraceGatewayIn, o.TraceInject} {
		if p != nil {
			p.Close()
		}
	}
	for _, m := range []*ebpf.Map{o.Snapshots, o.CT, o.Frag, o.RuleStats, o.EndpointStats, o.Stats, o.Flows, o.FlowLost, o.FlowBudget, o.FlowSuppressed,
		o.TraceCtl, o.Traces, o.TraceEvents, o.TraceLost, o.TraceLive} {
		if m != nil {
			m.Close()
		}
	}
	return nil
}

// Install makes a new snapshot of the entries and swaps it in: from the swap on, every
// packet sees the new snapshot whole, and the old one goes once no packet uses it. More
// entries than the snapshot capacity are an error, and nothing changes.
func (o *Objects) Install(entries []firewall.Entry) error {
	if len(entries) > o.caps.Snapshot {
		return fmt.Errorf("snapshot of %d entries exceeds its capacity of %d", len(entries), o.caps.Snapshot)
	}
	m, err := ebpf.NewMap(o.inner)
	if err != nil {
		return fmt.Errorf("making a snapshot map: %w", err)
	}
	defer m.Close()
	if len(entries) > 0 {
		keys := make([]firewall.Key, len(entries))
		values := make([]firewall.Value, len(entries))
		for i, e := range entries {
			keys[i], values[i] = e.Key, e.Value
		}
		if _, err := m.BatchUpdate(keys, values, nil); err != nil {
			if !errors.Is(err, ebpf.ErrNotSupported) {
				return fmt.Errorf("filling the snapshot: %w", err)
			}
			for i := range keys {
				if err := m.Put(&keys[i], &values[i]); err != nil {
					return fmt.Errorf("filling the snapshot: entry %d: %w", i, err)
				}
			}
		}
	}
	if err := o.Snapshots.Put(uint32(0), m); err != nil {
		return fmt.Errorf("swapping the snapshot in: %w", err)
	}
	return nil
}

// linkPath returns the pin of the link of the name at one hook.
func (o *Objects) linkPath(name string, ingress bool) string {
	hook := "egress"
	if ingress {
		hook = "ingress"
	}
	return filepath.Join(o.dir, "links", name+"-"+hook)
}

// Attach attaches the programs to both tcx hooks of the interface with the index, as
// links pinned under the name, or, when such links are attached to that interface
// already (left by a previous agent), makes them run this process's programs: an atomic
// replacement, which no packet notices. It must run in the interface's network
// namespace. It returns how many links it attached or updated.
func (o *Objects) Attach(name string, ifindex int) (int, error) {
	changed := 0
	for _, ingress := range []bool{true, false} {
		prog, at := o.Ingress, ebpf.AttachTCXIngress
		if !ingress {
			prog, at = o.Egress, ebpf.AttachTCXEgress
		}
		did, err := tcxpin.Attach(o.linkPath(name, ingress), ifindex, prog, at, sameProgram)
		if did {
			changed++
		}
		if err != nil {
			return changed, fmt.Errorf("attaching the firewall: %w", err)
		}
	}
	return changed, nil
}

// sameProgram tells whether prog is the program with the id.
func sameProgram(prog *ebpf.Program, id ebpf.ProgramID) bool {
	info, err := prog.Info()
	if err != nil {
		return false
	}
	have, ok := info.ID()
	return ok && have == id
}

// Detach removes the links pinned under the name, which detaches the programs. Links that
// are not there are no error.
func (o *Objects) Detach(name string) error {
	var errs []error
	for _, ingress := range []bool{true, false} {
		errs = append(errs, tcxpin.Detach(o.linkPath(name, ingress)))
	}
	return errors.Join(errs...)
}

// Attached tells whether the links pinned under the name attach the programs to both tcx
// hooks of the interface with the index: false when a link was detached by hand
// (`bpftool link detach`), its pin removed, or the interface made anew.
func (o *Objects) Attached(name string, ifindex int) bool {
	return tcxpin.Attached(o.linkPath(name, true), ifindex) && tcxpin.Attached(o.linkPath(name, false), ifindex)
}

// Links returns the names of the pinned links.
func (o *Objects) Links() ([]string, error) {
	names, err := tcxpin.Names(filepath.Join(o.dir, "links"))
	if err != nil {
		return nil, fmt.Errorf("listing the pinned links: %w", err)
	}
	return names, nil
}
