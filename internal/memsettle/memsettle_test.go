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
// is idle after allocating burstBytes or more, not during the burst, and not after less.
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
	tick(0) // idle
	if got := freed(); got != steps*8<<20 {
		t.Errorf("released at %d bytes allocated, want %d: once idle after the burst", got, steps*8<<20)
	}
	tick(burstBytes / 2) // less than a burst, then idle
	tick(0)
	tick(0)
	none("after less than a burst")
	cancel()
	<-done
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
			var mu sync.Mutex
			var set []int
			var allocated atomic.Uint64
			reads := make(chan struct{}, 10)
			m := &Settler{log: quiet, free: func() {}, base: tc.base, burst: tc.burst,
				setGCPercent: func(p int) int {
					mu.Lock()
					defer mu.Unlock()
					set = append(set, p)
					return 0
				},
				allocated: func() uint64 {
					v := allocated.Load()
					reads <- struct{}{}
					return v
				}}
			targets := func() []int {
				mu.Lock()
				defer mu.Unlock()
				return slices.Clone(set)
			}
			m.StartBurst() // start-up
			ctx, cancel := context.WithCancel(context.Background())
			ticks := make(chan time.Time)
			done := make(chan struct{})
			go func() {
				defer close(done)
				m.Watch(ctx, ticks, func() []string { return nil })
			}()
			<-reads // what was allocated when Watch started
			tick := func(alloc uint64) {
				allocated.Add(alloc)
				ticks <- time.Time{}
				<-reads
			}
			tick(0) // ready: the start-up's burst ends
			<-reads // after the release
			for _, alloc := range []uint64{burstRateBytes, burstRateBytes, idleBytes} {
				tick(alloc) // a burst, then less but not idle: the target stays
			}
			if got, want := targets(), tc.want[:min(3, len(tc.want))]; !slices.Equal(got, want) {
				t.Errorf("during the burst the targets set were %v, want %v", got, want)
			}
			tick(0) // idle
			tick(0)
			cancel()
			<-done
			if got := targets(); !slices.Equal(got, tc.want) {
				t.Errorf("the targets set were %v, want %v", got, tc.want)
			}
		})
	}
}

// TestMemoryStartUpIdlesBeforeReady checks that a start-up that idles before the process
// is ready (waiting for its server, say) ends its burst at the idle tick, takes a burst
// up again when one comes, and releases memory only once ready.
func TestMemoryStartUpIdlesBeforeReady(t *testing.T) {
	var mu sync.Mutex
	var set []int
	var allocated atomic.Uint64
	var isReady atomic.Bool
	reads := make(chan struct{}, 10)
	frees := make(chan struct{}, 10)
	m := &Settler{log: quiet, free: func() { frees <- struct{}{} }, base: 50, burst: 200,
		setGCPercent: func(p int) int {
			mu.Lock()
			defer mu.Unlock()
			set = append(set, p)
			return 0
		},
		allocated: func() uint64 {
			v := allocated.Load()
			reads <- struct{}{}
			return v
		}}
	targets := func() []int {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(set)
	}
	m.StartBurst()
	ctx, cancel := context.WithCancel(context.Background())
	ticks := make(chan time.Time)
	done := make(chan struct{})
	go func() {
		defer close(done)
		m.Watch(ctx, ticks, func() []string {
			if isReady.Load() {
				return nil
			}
			return []string{"nimbus unreachable"}
		})
	}()
	<-reads
	tick := func(alloc uint64) {
		allocated.Add(alloc)
		ticks <- time.Time{}
		<-reads
	}
	tick(0) // idle, not ready: the start-up's burst ends
	if got, want := targets(), []int{200, 50}; !slices.Equal(got, want) {
		t.Errorf("after an idle tick before ready the targets set were %v, want %v", got, want)
	}
	tick(burstRateBytes) // a burst before ready
	if got, want := targets(), []int{200, 50, 200}; !slices.Equal(got, want) {
		t.Errorf("after a busy tick before ready the targets set were %v, want %v", got, want)
	}
	select {
	case <-frees:
		t.Fatal("released memory before ready")
	default:
	}
	isReady.Store(true)
	tick(0) // idle and ready: the burst ends, and the release on ready
	<-frees
	<-reads
	cancel()
	<-done
	if got, want := targets(), []int{200, 50, 200, 50}; !slices.Equal(got, want) {
		t.Errorf("the targets set were %v, want %v", got, want)
	}
}
