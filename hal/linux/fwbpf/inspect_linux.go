package fwbpf

import (
	"cmp"
	"errors"
	"fmt"
	"math/bits"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/cilium/ebpf"

	"github.com/naplesnet/naples/hal/firewall"
)

// Pinned is a read-only view of the maps a firewall pinned in a directory: what
// naplesctl's bpf commands show. Opening it loads no program and changes nothing; the
// firewall that pinned the maps may run meanwhile.
type Pinned struct {
	// objs holds the maps, opened read-only, and no programs, so that the read methods of
	// Objects serve Pinned too.
	objs *Objects
}

// OpenPinned opens the maps pinned in dir, read-only, as Open pinned them. A map that is
// not pinned there is an error wrapping os.ErrNotExist; one that is not the firewall's
// (its type or the size of its keys or values differ from the program's) is an error
// too, since its content could not be read right.
func OpenPinned(dir string) (*Pinned, error) {
	spec, err := LoadSpec()
	if err != nil {
		return nil, fmt.Errorf("loading the firewall's program spec: %w", err)
	}
	o := &Objects{dir: dir}
	for name, dst := range map[string]**ebpf.Map{
		MapSnapshots: &o.Snapshots, MapCT: &o.CT, MapFrag: &o.Frag, MapRuleStats: &o.RuleStats, MapEndpointStats: &o.EndpointStats, MapStats: &o.Stats,
	} {
		m, err := loadPinnedReadOnly(filepath.Join(dir, name), spec.Maps[name])
		if err != nil {
			o.Close()
			return nil, err
		}
		*dst = m
	}
	o.caps = Capacities{
		Conntrack: int(o.CT.MaxEntries()),
		Rules:     int(o.RuleStats.MaxEntries()),
		Endpoints: int(o.EndpointStats.MaxEntries()),
		Fragments: int(o.Frag.MaxEntries()),
	}
	return &Pinned{objs: o}, nil
}

// loadPinnedReadOnly opens the map pinned at path read-only and checks that it is of
// want's type and sizes.
func loadPinnedReadOnly(path string, want *ebpf.MapSpec) (*ebpf.Map, error) {
	m, err := ebpf.LoadPinnedMap(path, &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		return nil, fmt.Errorf("opening pinned map %s: %w", path, err)
	}
	if m.Type() != want.Type || m.KeySize() != want.KeySize || m.ValueSize() != want.ValueSize {
		m.Close()
		return nil, fmt.Errorf("pinned map %s: %s with %d-byte keys and %d-byte values, want the firewall's %s with %d and %d",
			path, m.Type(), m.KeySize(), m.ValueSize(), want.Type, want.KeySize, want.ValueSize)
	}
	return m, nil
}

// Close releases the maps; the pins stay.
func (p *Pinned) Close() error { return p.objs.Close() }

// PinnedSnapshot is the snapshot in place, as Pinned.Snapshot reads it.
type PinnedSnapshot struct {
	// Present is true when slot 0 of MapSnapshots holds a snapshot.
	Present bool
	// Entries are its entries, sorted by key data, then prefix length, as
	// firewall.Compile sorts them.
	Entries []firewall.Entry
	// Capacity is the number of entries it may hold.
	Capacity int
}

// Snapshot reads the snapshot in place. The snapshot map is opened by its id, which
// gives a read-write handle (the kernel has no read-only open by id); it is only read.
func (p *Pinned) Snapshot() (PinnedSnapshot, error) {
	m, err := currentSnapshot(p.objs.Snapshots)
	if err != nil || m == nil {
		return PinnedSnapshot{}, err
	}
	defer m.Close()
	entries, err := snapshotEntries(m)
	if err != nil {
		return PinnedSnapshot{}, err
	}
	slices.SortFunc(entries, func(a, b firewall.Entry) int {
		if d := slices.Compare(a.Key.Data[:], b.Key.Data[:]); d != 0 {
			return d
		}
		return cmp.Compare(a.Key.PrefixLen, b.Key.PrefixLen)
	})
	return PinnedSnapshot{Present: true, Entries: entries, Capacity: int(m.MaxEntries())}, nil
}

// currentSnapshot opens the snapshot map slot 0 of slots points to; nil when the slot is
// empty or the map it named is gone (replaced meanwhile).
func currentSnapshot(slots *ebpf.Map) (*ebpf.Map, error) {
	var id ebpf.MapID
	if err := slots.Lookup(uint32(0), &id); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return nil, nil
		}
		return nil, fmt.Errorf("reading the snapshot slot: %w", err)
	}
	if id == 0 {
		return nil, nil
	}
	m, err := ebpf.NewMapFromID(id)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("opening the snapshot: %w", err)
	}
	return m, nil
}

// snapshotEntries reads every entry of a snapshot map.
func snapshotEntries(m *ebpf.Map) ([]firewall.Entry, error) {
	var out []firewall.Entry
	var e firewall.Entry
	it := m.Iterate()
	for it.Next(&e.Key, &e.Value) {
		out = append(out, e)
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("reading the snapshot: %w", err)
	}
	return out, nil
}

// Capacities returns the sizes of the conntrack table and the counter maps; Snapshot is
// 0 (PinnedSnapshot.Capacity has it).
func (p *Pinned) Capacities() Capacities { return p.objs.caps }

// ProgramStats returns the program's counters.
func (p *Pinned) ProgramStats() (Stats, error) { return p.objs.ProgramStats() }

// RuleCounters returns every rule counter, by rule id, summed over CPUs.
func (p *Pinned) RuleCounters() (map[uint64]RuleStats, error) {
	return readCounters[uint64](p.objs.RuleStats, sumRuleCounts)
}

// EndpointCounters returns every endpoint counter, by endpoint id, summed over CPUs.
func (p *Pinned) EndpointCounters() (map[uint32]EndpointStats, error) {
	return readCounters[uint32](p.objs.EndpointStats, sumEndpointCounts)
}

// readCounters reads every entry of the per-CPU hash m, summing each value with sum.
func readCounters[K comparable, V any](m *ebpf.Map, sum func([]V) V) (map[K]V, error) {
	out := map[K]V{}
	var k K
	var per []V
	it := m.Iterate()
	for it.Next(&k, &per) {
		out[k] = sum(per)
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("reading the counters of %s: %w", mapName(m), err)
	}
	return out, nil
}

// mapName returns a map's name as the kernel knows it, "map" when it cannot tell.
func mapName(m *ebpf.Map) string {
	if info, err := m.Info(); err == nil && info.Name != "" {
		return info.Name
	}
	return "map"
}

// Connection is a live entry of the conntrack table, decoded.
type Connection struct {
	// Ifindex is the interface the connection was seen on.
	Ifindex uint32
	// Family is 4 or 6; Proto the IP protocol number.
	Family, Proto uint8
	// Src, Sport, Dst and Dport are the tuple of the connection's first packet on the
	// interface, ports in host order (for ICMP echo, the id: Sport of a request, Dport
	// of a reply). Src and Dst are invalid when Family is neither 4 nor 6.
	Src, Dst     netip.Addr
	Sport, Dport uint16
	// Dir is the direction of the first packet, DirIngress or DirEgress.
	Dir uint8
	// Flags are CTClosing and CTReplied.
	Flags uint8
	// Gen is the snapshot generation the connection was last checked against.
	Gen uint32
	// Rule is the id of the rule that allowed it; 0 for none.
	Rule uint64
	// Idle is how long before the read the connection saw its last packet; Timeout how
	// long it lives without one (CTTimeout).
	Idle, Timeout time.Duration
}

// Conntrack returns the live connections of the conntrack table, ordered by interface,
// family, protocol, source and destination, their idle times taken at one instant.
// Expired entries, which the program treats as absent, are left out.
func (p *Pinned) Conntrack() ([]Connection, error) {
	now, err := KtimeNow()
	if err != nil {
		return nil, err
	}
	var out []Connection
	var k CTKey
	var v CTValue
	it := p.objs.CT.Iterate()
	for it.Next(&k, &v) {
		if !CTExpired(&k, &v, now) {
			out = append(out, decodeConnection(&k, &v, now))
		}
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("reading the conntrack table: %w", err)
	}
	slices.SortFunc(out, func(a, b Connection) int {
		return cmp.Or(cmp.Compare(a.Ifindex, b.Ifindex), cmp.Compare(a.Family, b.Family), cmp.Compare(a.Proto, b.Proto),
			a.Src.Compare(b.Src), cmp.Compare(a.Sport, b.Sport), a.Dst.Compare(b.Dst), cmp.Compare(a.Dport, b.Dport))
	})
	return out, nil
}

// decodeConnection decodes a conntrack entry read at now.
func decodeConnection(k *CTKey, v *CTValue, now uint64) Connection {
	c := Connection{
		Ifindex: k.Ifindex, Family: k.Family, Proto: k.Proto,
		// The ports hold their bytes in network order, and the package's bindings are
		// for little-endian machines only (spec.go): the bytes swap.
		Sport: bits.ReverseBytes16(k.Sport), Dport: bits.ReverseBytes16(k.Dport),
		Dir: v.Dir, Flags: v.Flags, Gen: v.Gen, Rule: v.Rule,
		Timeout: CTTimeout(k.Family, k.Proto, v.Flags),
	}
	switch k.Family {
	case 4:
		c.Src, c.Dst = netip.AddrFrom4([4]byte(k.Saddr[:4])), netip.AddrFrom4([4]byte(k.Daddr[:4]))
	case 6:
		c.Src, c.Dst = netip.AddrFrom16(k.Saddr), netip.AddrFrom16(k.Daddr)
	}
	if now > v.LastSeen {
		c.Idle = time.Duration(now - v.LastSeen)
	}
	return c
}
