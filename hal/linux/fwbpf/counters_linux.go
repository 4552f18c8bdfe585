package fwbpf

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
)

// RuleCounters returns the counter of the rule with the id.
func (o *Objects) RuleCounters(id uint64) (RuleStats, error) {
	var per []RuleStats
	if err := o.RuleStats.Lookup(id, &per); err != nil {
		return RuleStats{}, fmt.Errorf("reading the counter of rule %#x: %w", id, err)
	}
	return sumRuleCounts(per), nil
}

// EndpointCounters returns the counter of the local endpoint with the id.
func (o *Objects) EndpointCounters(id uint32) (EndpointStats, error) {
	var per []EndpointStats
	if err := o.EndpointStats.Lookup(id, &per); err != nil {
		return EndpointStats{}, fmt.Errorf("reading the counter of endpoint %#x: %w", id, err)
	}
	return sumEndpointCounts(per), nil
}

// sumRuleCounts sums the per-CPU values of a rule counter.
func sumRuleCounts(per []RuleStats) RuleStats {
	var c RuleStats
	for _, p := range per {
		c.Packets += p.Packets
		c.Bytes += p.Bytes
	}
	return c
}

// sumEndpointCounts sums the per-CPU values of an endpoint counter.
func sumEndpointCounts(per []EndpointStats) EndpointStats {
	var c EndpointStats
	for _, p := range per {
		c.AllowedPackets += p.AllowedPackets
		c.AllowedBytes += p.AllowedBytes
		c.DeniedPackets += p.DeniedPackets
		c.DeniedBytes += p.DeniedBytes
		c.SpoofedPackets += p.SpoofedPackets
		c.SpoofedBytes += p.SpoofedBytes
	}
	return c
}

// KeepRuleCounters makes a zero counter for every rule id that has none, and removes the
// counters of other ids; a counter that exists keeps its counts.
func (o *Objects) KeepRuleCounters(ids []uint64) error {
	return keepCounters(o.RuleStats, ids, make([]RuleStats, ebpf.MustPossibleCPU()))
}

// KeepEndpointCounters makes a zero counter for every endpoint id that has none, and
// removes the counters of other ids.
func (o *Objects) KeepEndpointCounters(ids []uint32) error {
	return keepCounters(o.EndpointStats, ids, make([]EndpointStats, ebpf.MustPossibleCPU()))
}

// keepCounters makes the per-CPU map m hold exactly the keys ids: new ones get zero, the
// values of the others stay; keys not in ids are removed.
func keepCounters[K comparable, V any](m *ebpf.Map, ids []K, zero []V) error {
	want := make(map[K]bool, len(ids))
	for _, id := range ids {
		want[id] = true
	}
	var stale []K
	var k K
	var v []V
	it := m.Iterate()
	for it.Next(&k, &v) {
		if want[k] {
			delete(want, k)
		} else {
			stale = append(stale, k)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("reading counters: %w", err)
	}
	var errs []error
	for _, k := range stale {
		if err := m.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, err)
		}
	}
	for k := range want {
		if err := m.Update(k, zero, ebpf.UpdateNoExist); err != nil && !errors.Is(err, ebpf.ErrKeyExist) {
			errs = append(errs, fmt.Errorf("making counter %v: %w", k, err))
		}
	}
	return errors.Join(errs...)
}

// Stats are the program's own counters, summed over CPUs, and what the last conntrack
// collection found.
type Stats struct {
	// CTCreated counts the conntrack entries the program made; CTDeleted those it
	// deleted because a new snapshot denies their connection.
	CTCreated, CTDeleted uint64
	// NoSnapshotDrops counts packets dropped because there was no snapshot or their
	// interface was not in it.
	NoSnapshotDrops uint64
	// SpoofedDrops counts the frames dropped because a guarded endpoint sent them from an
	// address that is not its own.
	SpoofedDrops uint64
	// FragUntrackedDrops counts the later fragments dropped because their datagram's
	// first fragment was not seen, or its entry expired or was evicted.
	FragUntrackedDrops uint64
	// BadHeaderDrops counts the packets dropped for hostile headers (StatBadHeaderDrops).
	BadHeaderDrops uint64
	// TraceStrayDrops counts the trace packets of no installed trace dropped before an
	// endpoint received them (StatTraceStrayDrops).
	TraceStrayDrops uint64
}

// ProgramStats returns the program's counters.
func (o *Objects) ProgramStats() (Stats, error) {
	var s Stats
	for i, dst := range map[uint32]*uint64{StatCTCreated: &s.CTCreated, StatCTDeleted: &s.CTDeleted, StatNoSnapshotDrops: &s.NoSnapshotDrops,
		StatSpoofedDrops: &s.SpoofedDrops, StatFragUntrackedDrops: &s.FragUntrackedDrops, StatBadHeaderDrops: &s.BadHeaderDrops,
		StatTraceStrayDrops: &s.TraceStrayDrops} {
		var per []uint64
		if err := o.Stats.Lookup(i, &per); err != nil {
			return Stats{}, fmt.Errorf("reading counter %d: %w", i, err)
		}
		for _, v := range per {
			*dst += v
		}
	}
	return s, nil
}

// Collection is what a conntrack collection found.
type Collection struct {
	// Live is the number of entries left; Expired the number it removed.
	Live, Expired int
}

// CollectConntrack removes the expired entries of the conntrack table.
func (o *Objects) CollectConntrack() (Collection, error) {
	now, err := KtimeNow()
	if err != nil {
		return Collection{}, err
	}
	var c Collection
	var expired []CTKey
	var k CTKey
	var v CTValue
	it := o.CT.Iterate()
	for it.Next(&k, &v) {
		if CTExpired(&k, &v, now) {
			expired = append(expired, k)
		} else {
			c.Live++
		}
	}
	if err := it.Err(); err != nil {
		return c, fmt.Errorf("reading the conntrack table: %w", err)
	}
	for i := range expired {
		if err := o.CT.Delete(&expired[i]); err == nil {
			c.Expired++
		} else if !errors.Is(err, ebpf.ErrKeyNotExist) {
			return c, fmt.Errorf("removing an expired connection: %w", err)
		}
	}
	return c, nil
}

// Conntrack returns the live entries of the conntrack table.
func (o *Objects) Conntrack() ([]CTKey, []CTValue, error) {
	now, err := KtimeNow()
	if err != nil {
		return nil, nil, err
	}
	var keys []CTKey
	var values []CTValue
	var k CTKey
	var v CTValue
	it := o.CT.Iterate()
	for it.Next(&k, &v) {
		if !CTExpired(&k, &v, now) {
			keys, values = append(keys, k), append(values, v)
		}
	}
	if err := it.Err(); err != nil {
		return nil, nil, fmt.Errorf("reading the conntrack table: %w", err)
	}
	return keys, values, nil
}
