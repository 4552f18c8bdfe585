package memsettle

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// quiet discards the settler's logs.
var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// TestMemorySettlesOnceWhenReady checks that the process releases its start-up memory once,
// when it first becomes ready, however many probes ask, and that a probe answering ready
// waits for the release.
func TestMemorySettlesOnceWhenReady(t *testing.T) {
	var frees atomic.Int32
	started, release := make(chan struct{}, 1), make(chan struct{})
	m := &Settler{log: quiet, free: func() {
		frees.Add(1)
		started <- struct{}{}
		<-release
	}, allocated: func() uint64 { return 0 }}
	var checks atomic.Int32
	ready := func() []string {
		if checks.Add(1) < 3 {
			return []string{"not yet"}
		}
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		m.Watch(ctx, time.NewTicker(time.Millisecond).C, ready)
	}()
	// A probe that finds the process ready while the release runs waits for it.
	var probes sync.WaitGroup
	answered := make(chan struct{}, 3)
	for range 3 {
		probes.Go(func() {
			m.ReadyNow()
			answered <- struct{}{}
		})
	}
	<-started
	select {
	case <-answered:
		t.Fatal("a probe answered before the release ended")
	case <-watched:
		t.Fatal("watch returned before the release ended")
	default:
	}
	close(release)
	probes.Wait()
	// Nothing is allocated after ready, so nothing more is released.
	cancel()
	<-watched
	if n := frees.Load(); n != 1 {
		t.Errorf("released memory %d times, want once", n)
	}
}

// TestMemorySettlerStopsWithContext checks that Watch returns when the process stops
// before it was ever ready, without releasing anything.
func TestMemorySettlerStopsWithContext(t *testing.T) {
	var frees atomic.Int32
	m := &Settler{log: quiet, free: func() { frees.Add(1) }, allocated: func() uint64 { return 0 }}
	ctx, cancel := context.WithCancel(context.Background())
	checked := make(chan struct{}, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		m.Watch(ctx, time.NewTicker(time.Millisecond).C, func() []string {
			select {
			case checked <- struct{}{}:
			default:
			}
			return []string{"never ready"}
		})
	}()
	<-checked
	cancel()
	<-done
	if n := frees.Load(); n != 0 {
		t.Errorf("released memory %d times for a process never ready, want 0", n)
	}
}

// TestMemorySettlesAfterBursts checks that, once ready, the process releases memory when it
// is idle after allocating burstBytes or more, not during the burst nor in a pause of it
// shorter than idleTicks, and not after less.
func TestMemorySettlesAfterBursts(t *testing.T) {
	var allocated atomic.Uint64
	// frees receives what was allocated at each release; reads signals every reading of
	// what was allocated, which watch does once per tick and once after each release.
	frees := make(chan uint64, 10)
	reads := make(chan struct{}, 10)
	m := &Settler{log: quiet, free: func() { frees <- allocated.Load() }, allocated: func() uint64 {
		v := allocated.Load()
		reads <- struct{}{}
		return v
	}}
	ctx, cancel := context.WithCancel(context.Background())
	ticks := make(chan time.Time)
	done := make(chan struct{})
	go func() {
		defer close(done)
		m.Watch(ctx, ticks, func() []string { return nil })
	}()
	<-reads // what was allocated when Watch started
	// tick allocates, ticks, and waits until watch has read what was allocated.
	tick := func(alloc uint64) {
		allocated.Add(alloc)
		ticks <- time.Time{}
		<-reads
	}
	// freed waits for a release and for watch's reading after it.
	freed := func() uint64 {
		t.Helper()
		select {
		case got := <-frees:
			<-reads
			return got
		case <-time.After(10 * time.Second):
			t.Fatal("no release")
			return 0
		}
	}
	none := func(when string) {
		t.Helper()
		select {
		case got := <-frees:
			t.Fatalf("released at %d bytes allocated %s", got, when)
		default:
		}
	}

	tick(0) // ready: the first release, then watch reads what was allocated
	if got := <-frees; got != 0 {
		t.Fatalf("the release on ready saw %d bytes allocated, want 0", got)
	}
	<-reads
	const steps = 21
	for range steps {
		tick(8 << 20) // a burst: more than idleBytes at every tick
	}
	none("during the burst")
	for range idleTicks - 1 {
		tick(0) // a pause, shorter than idle
	}
	none("in a pause of the burst")
	tick(8 << 20) // the burst goes on
	for range idleTicks {
		tick(0) // idle
	}
	if got := freed(); got != (steps+1)*8<<20 {
		t.Errorf("released at %d bytes allocated, want %d: once idle after the burst", got, (steps+1)*8<<20)
	}
	tick(burstBytes / 2) // less than a burst, then idle
	for range 2 * idleTicks {
		tick(0)
	}
	none("after less than a burst")
	cancel()
	<-done
}

// watched is a Settler whose Watch runs on ticks the test sends, with the allocations,
// the releases and the garbage collector's targets faked and recorded.
type watched struct {
	m         *Settler
	ticks     chan time.Time
	allocated atomic.Uint64
	// reads receives a value at each reading of what was allocated; frees at each release.
	reads, frees chan struct{}
	mu           sync.Mutex
	targets      []int
	cancel       func()
	done         chan struct{}
}

// watch starts a Settler of the targets base and burst, in its start-up's burst, and its
// Watch with ready, which the test stops with stop.
func watch(base, burst int, ready func() []string) *watched {
	w := &watched{ticks: make(chan time.Time), reads: make(chan struct{}, 10), frees: make(chan struct{}, 10), done: make(chan struct{})}
	w.m = &Settler{log: quiet, base: base, burst: burst,
		free: func() { w.frees <- struct{}{} },
		setGCPercent: func(p int) int {
			w.mu.Lock()
			defer w.mu.Unlock()
			w.targets = append(w.targets, p)
			return 0
		},
		allocated: func() uint64 {
			v := w.allocated.Load()
			w.reads <- struct{}{}
			return v
		}}
	w.m.StartBurst()
	ctx, cancel := context.WithCancel(context.Background())
	w.cancel = cancel
	go func() {
		defer close(w.done)
		w.m.Watch(ctx, w.ticks, ready)
	}()
	<-w.reads // what was allocated when Watch started
	return w
}

// tick allocates, ticks, and waits until Watch has read what was allocated.
func (w *watched) tick(alloc uint64) {
	w.allocated.Add(alloc)
	w.ticks <- time.Time{}
	<-w.reads
}

// released waits for a release and for Watch's reading after it.
func (w *watched) released() {
	<-w.frees
	<-w.reads
}

// set returns the targets set so far.
func (w *watched) set() []int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.targets)
}

// stop ends Watch.
func (w *watched) stop() {
	w.cancel()
	<-w.done
}

// TestMemoryBurstRaisesGCTarget checks that the garbage collector's target is the
// burst's during start-up, until the process is first ready, and from a tick that
// allocated burstRateBytes or more until an idle one; and that a process whose
// collector is off, or a burst target not above the base, is left alone.
func TestMemoryBurstRaisesGCTarget(t *testing.T) {
	for _, tc := range []struct {
		name        string
		base, burst int
		want        []int
	}{
		{name: "raised", base: 50, burst: 200, want: []int{200, 50, 200, 50}},
		{name: "collector off", base: -1, burst: 200},
		{name: "burst not above", base: 100, burst: 100},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := watch(tc.base, tc.burst, func() []string { return nil })
			w.tick(0) // ready: the start-up's burst ends
			w.released()
			for _, alloc := range []uint64{burstRateBytes, burstRateBytes, idleBytes} {
				w.tick(alloc) // a burst, then less but not idle: the target stays
			}
			if got, want := w.set(), tc.want[:min(3, len(tc.want))]; !slices.Equal(got, want) {
				t.Errorf("during the burst the targets set were %v, want %v", got, want)
			}
			for range idleTicks - 1 {
				w.tick(0) // a pause: the target stays
			}
			if got, want := w.set(), tc.want[:min(3, len(tc.want))]; !slices.Equal(got, want) {
				t.Errorf("in a pause of the burst the targets set were %v, want %v", got, want)
			}
			w.tick(0) // idle
			w.tick(0)
			w.stop()
			if got := w.set(); !slices.Equal(got, tc.want) {
				t.Errorf("the targets set were %v, want %v", got, tc.want)
			}
		})
	}
}

// TestMemoryStartUpIdlesBeforeReady checks that a start-up that idles before the process
// is ready (waiting for its server, say) ends its burst once idle, takes a burst
// up again when one comes, and releases memory only once ready.
func TestMemoryStartUpIdlesBeforeReady(t *testing.T) {
	var isReady atomic.Bool
	w := watch(50, 200, func() []string {
		if isReady.Load() {
			return nil
		}
		return []string{"nimbus unreachable"}
	})
	for range idleTicks {
		w.tick(0) // idle, not ready: the start-up's burst ends
	}
	if got, want := w.set(), []int{200, 50}; !slices.Equal(got, want) {
		t.Errorf("once idle before ready the targets set were %v, want %v", got, want)
	}
	w.tick(burstRateBytes) // a burst before ready
	if got, want := w.set(), []int{200, 50, 200}; !slices.Equal(got, want) {
		t.Errorf("after a busy tick before ready the targets set were %v, want %v", got, want)
	}
	select {
	case <-w.frees:
		t.Fatal("released memory before ready")
	default:
	}
	isReady.Store(true)
	w.tick(0) // idle and ready: the burst ends, and the release on ready
	w.released()
	w.stop()
	if got, want := w.set(), []int{200, 50, 200, 50}; !slices.Equal(got, want) {
		t.Errorf("the targets set were %v, want %v", got, want)
	}
}
