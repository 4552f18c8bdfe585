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
type memorySettler struct {
	log *slog.Logger
	// free collects garbage and returns the free heap to the operating system; tests
	// count its calls. Default: debug.FreeOSMemory.
	free func()
	// allocated returns the bytes the process has allocated since it started; tests fake
	// it. Default: the runtime's /gc/heap/allocs:bytes.
	allocated func() uint64
	ready     sync.Once
}

func newMemorySettler(log *slog.Logger) *memorySettler {
	return &memorySettler{log: log, free: debug.FreeOSMemory, allocated: heapAllocated}
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
	m.ready.Do(func() { m.release("ready") })
}

// watch calls readyNow once ready reports no reason, checking at every tick, and then
// releases memory whenever the agent is idle at a tick after a burst, until ctx ends: the
// agent settles also when nobody probes its readiness.
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
		idle := now-last < idleBytes
		last = now
		if idle && now-released >= burstBytes {
			m.release("idle after a burst")
			released = m.allocated()
			last = released
		}
	}
}
