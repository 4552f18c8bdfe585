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
// memory its start-up used.
const settleInterval = 100 * time.Millisecond

// memorySettler releases the heap the agent's start-up used and no longer needs: the
// stored state decoded to restore it, the kernel dumps and the first reconcile of every
// object leave far more free heap behind than the agent uses afterwards. The Go runtime
// returns free heap to the operating system only gradually, so until it does, that heap
// counts in the agent's resident set, and it can take minutes. The settler returns it at
// once, twice: when delphi has restored its state, and when the agent is first ready.
type memorySettler struct {
	log *slog.Logger
	// free collects garbage and returns the free heap to the operating system; tests
	// count its calls. Default: debug.FreeOSMemory.
	free  func()
	ready sync.Once
}

func newMemorySettler(log *slog.Logger) *memorySettler {
	return &memorySettler{log: log, free: debug.FreeOSMemory}
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

// watch calls readyNow once ready reports no reason, checking every interval, or returns
// when ctx ends: the agent settles also when nobody probes its readiness.
func (m *memorySettler) watch(ctx context.Context, interval time.Duration, ready func() []string) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if len(ready()) == 0 {
			m.readyNow()
			return
		}
	}
}
