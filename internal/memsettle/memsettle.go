// Package memsettle returns to the operating system the heap that bursts of work used and
// no longer need, and runs the Go garbage collector with a higher target while a burst
// lasts. The agent and nimbus each run one Settler.
package memsettle

import (
	"context"
	"log/slog"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"time"
)

// Interval is how often Watch should tick: how often the process checks whether it has
// become ready, to release the memory its start-up used, and later whether a burst of
// work has started or ended.
const Interval = 100 * time.Millisecond

const (
	// burstBytes is how much the process must have allocated since it last released
	// memory for it to release again once idle: a burst, such as a large apply or delete.
	burstBytes = 64 << 20
	// idleBytes is the most the process may allocate in one Interval and count as idle.
	idleBytes = 1 << 20
	// burstRateBytes is the least the process allocates in one Interval for the settler
	// to take it for a burst and raise the garbage collector's target: what the agent
	// allocates for some 700 routes, a rate a bulk apply or delete reaches and steady
	// churn does not.
	burstRateBytes = 8 << 20
	// idleTicks is how many ticks in a row must each allocate less than idleBytes for
	// the process to count as idle: half a second. Work that passes from one process to
	// the next (a bulk apply, whose last part is the agent's while nimbus waits for its
	// statuses) leaves a process quiet for a tick or two before it is done, and a
	// collection then takes a core from the process still working.
	idleTicks = 5
)

// Settler releases the heap that bursts of work used and no longer need: start-up (for
// the agent, the stored state decoded to restore it, the kernel dumps and the first
// reconcile of every object), and later every burst such as a bulk apply, leave far more
// free heap behind than the process uses afterwards. The Go runtime returns free heap to
// the operating system only gradually, so until it does, that heap counts in the
// process's resident set, and it can take minutes. The settler returns it at once: when
// told to (Release), when the process is first ready, and whenever the process goes idle
// after allocating burstBytes or more since the last release. A release costs a garbage
// collection, so it waits for the burst to end rather than running during it.
//
// During a burst the settler also raises the garbage collector's target (GOGC) to the
// burst's: a bulk apply allocates some 10 KB per route in the agent and 7 KB in nimbus,
// nearly all of it garbage within milliseconds, and at the agent's target of 50 the
// collections of a 20,000-route apply took a fifth of its CPU. The heap may grow further
// until the burst ends; then the target goes back and the release returns what the burst
// left. Start-up, from StartBurst until the process first idles or is ready, is one.
type Settler struct {
	log *slog.Logger
	// free collects garbage and returns the free heap to the operating system; tests
	// count its calls. Default: debug.FreeOSMemory.
	free func()
	// allocated returns the bytes the process has allocated since it started; tests fake
	// it. Default: the runtime's /gc/heap/allocs:bytes.
	allocated func() uint64
	// setGCPercent sets the garbage collector's target; tests record it. Default:
	// debug.SetGCPercent.
	setGCPercent func(int) int
	// base is the garbage collector's target outside bursts, burst the one during them;
	// a burst leaves the target alone unless burst is above base and base is not off
	// (negative).
	base, burst int
	ready       sync.Once

	mu sync.Mutex
	// bursting tells that the target is burst's.
	bursting bool
}

// New returns a settler that raises the garbage collector's target to
// burstPercent during bursts and otherwise keeps the one the process runs with now.
func New(log *slog.Logger, burstPercent int) *Settler {
	sample := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(sample)
	return &Settler{log: log, free: debug.FreeOSMemory, allocated: heapAllocated, setGCPercent: debug.SetGCPercent,
		base: int(sample[0].Value.Uint64()), burst: burstPercent}
}

// StartBurst raises the garbage collector's target to the burst's: at start-up, before
// the process restores what it holds. Watch sets it back at its first idle tick, or
// once the process is ready.
func (m *Settler) StartBurst() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.bursting || m.burst <= m.base || m.base < 0 {
		return
	}
	m.bursting = true
	m.setGCPercent(m.burst)
}

// EndBurst sets the garbage collector's target back after a burst.
func (m *Settler) EndBurst() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.bursting {
		return
	}
	m.bursting = false
	m.setGCPercent(m.base)
}

// heapAllocated returns the bytes allocated on the heap since the process started.
func heapAllocated() uint64 {
	sample := []metrics.Sample{{Name: "/gc/heap/allocs:bytes"}}
	metrics.Read(sample)
	return sample[0].Value.Uint64()
}

// Release collects garbage and returns every free page of the heap to the operating
// system, and logs what that took and what is left, at DEBUG; when says what for.
func (m *Settler) Release(when string) {
	start := time.Now()
	m.free()
	sample := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(sample)
	m.log.Debug("released free memory", "when", when, "took", time.Since(start), "heap_bytes", sample[0].Value.Uint64())
}

// ReadyNow ends the start-up's burst and releases its memory the first time it is
// called; later calls, and calls while the first one runs, wait for it and return. A
// readiness probe may call it, so that the process says it is ready once it has settled.
func (m *Settler) ReadyNow() {
	m.ready.Do(func() {
		m.EndBurst()
		m.Release("ready")
	})
}

// Watch, at every tick (every Interval), raises the garbage collector's target when the
// tick allocated burstRateBytes or more and sets it back once the process is idle
// (idleTicks); calls ReadyNow once ready reports no reason; and from then on releases
// memory once idle after a burst, until ctx ends: the process settles also when nobody
// probes its readiness. A start-up that idles before it is ready (waiting for a server,
// say) ends its burst then.
func (m *Settler) Watch(ctx context.Context, ticks <-chan time.Time, ready func() []string) {
	last := m.allocated()
	var released uint64
	isReady := false
	quiet := 0 // ticks in a row that allocated less than idleBytes
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticks:
		}
		now := m.allocated()
		rate := now - last
		last = now
		quiet++
		if rate >= idleBytes {
			quiet = 0
		}
		idle := quiet >= idleTicks
		switch {
		case rate >= burstRateBytes:
			m.StartBurst()
		case idle:
			m.EndBurst()
		}
		switch {
		case !isReady:
			if len(ready()) == 0 {
				isReady = true
				m.ReadyNow()
				released = m.allocated()
				last = released
			}
		case idle && now-released >= burstBytes:
			m.Release("idle after a burst")
			released = m.allocated()
			last = released
		}
	}
}
