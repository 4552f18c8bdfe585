package agent

import (
	"context"
	"log/slog"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"time"
)

// settleInterval is how often the agent checks whether it has become ready, to release the
// memory its start-up used, and later whether a burst of work has ended, to release what
// the burst left.
const settleInterval = 100 * time.Millisecond

const (
	// burstBytes is how much the agent must have allocated since it last released memory
	// for it to release again once idle: a burst, such as a large apply or delete.
	burstBytes = 64 << 20
	// idleBytes is the most the agent may allocate in one settleInterval and count as idle.
	idleBytes = 1 << 20
	// burstRateBytes is the least the agent allocates in one settleInterval for the
	// settler to take it for a burst and raise the garbage collector's target: some 700
	// routes, a rate a bulk apply or delete reaches and steady churn does not.
	burstRateBytes = 8 << 20
)

// memorySettler releases the heap that bursts of work used and no longer need: start-up
// (the stored state decoded to restore it, the kernel dumps and the first reconcile of
// every object), and later every burst such as a bulk apply, leave far more free heap
// behind than the agent uses afterwards. The Go runtime returns free heap to the
// operating system only gradually, so until it does, that heap counts in the agent's
// resident set, and it can take minutes. The settler returns it at once: when delphi has
// restored its state, when the agent is first ready, and whenever the agent goes idle
// after allocating burstBytes or more since the last release. A release costs a garbage
// collection, so it waits for the burst to end rather than running during it.
//
// During a burst the settler also raises the garbage collector's target (GOGC) to the
// burst's: a bulk apply allocates some 10 KB per route, nearly all of it garbage within
// milliseconds, and at the agent's target of 50 the collections of a 20,000-route apply
// took a fifth of its CPU. The heap may grow further until the burst ends; then the
// target goes back and the release returns what the burst left. Start-up, until the
// agent is first ready, counts as a burst.
type memorySettler struct {
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

// newMemorySettler returns a settler that raises the garbage collector's target to
// burstPercent during bursts and otherwise keeps the one the process runs with now.
func newMemorySettler(log *slog.Logger, burstPercent int) *memorySettler {
	sample := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(sample)
	return &memorySettler{log: log, free: debug.FreeOSMemory, allocated: heapAllocated, setGCPercent: debug.SetGCPercent,
		base: int(sample[0].Value.Uint64()), burst: burstPercent}
}

// startBurst raises the garbage collector's target to the burst's.
func (m *memorySettler) startBurst() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.bursting || m.burst <= m.base || m.base < 0 {
		return
	}
	m.bursting = true
	m.setGCPercent(m.burst)
}

// endBurst sets the garbage collector's target back after a burst.
func (m *memorySettler) endBurst() {
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

// release collects garbage and returns every free page of the heap to the operating
// system, and logs what that took and what is left, at DEBUG.
func (m *memorySettler) release(when string) {
	start := time.Now()
	m.free()
	sample := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(sample)
	m.log.Debug("released free memory", "when", when, "took", time.Since(start), "heap_bytes", sample[0].Value.Uint64())
}

// readyNow releases the start-up's memory the first time it is called; later calls, and
// calls while the first one runs, wait for it and return. Readiness calls it, so the
// agent says it is ready once it has settled.
func (m *memorySettler) readyNow() {
	m.ready.Do(func() {
		m.endBurst()
		m.release("ready")
	})
}

// watch calls readyNow once ready reports no reason, checking at every tick, and then
// raises the garbage collector's target at a tick that allocated burstRateBytes or more,
// and at an idle tick sets it back and, after a burst, releases memory, until ctx ends:
// the agent settles also when nobody probes its readiness.
func (m *memorySettler) watch(ctx context.Context, ticks <-chan time.Time, ready func() []string) {
	tick := func() bool {
		select {
		case <-ctx.Done():
			return false
		case <-ticks:
			return true
		}
	}
	for {
		if !tick() {
			return
		}
		if len(ready()) == 0 {
			m.readyNow()
			break
		}
	}
	released := m.allocated()
	last := released
	for tick() {
		now := m.allocated()
		rate := now - last
		last = now
		switch {
		case rate >= burstRateBytes:
			m.startBurst()
		case rate < idleBytes:
			m.endBurst()
			if now-released >= burstBytes {
				m.release("idle after a burst")
				released = m.allocated()
				last = released
			}
		}
	}
}
