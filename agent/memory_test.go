package agent

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestMemorySettlesOnceWhenReady checks that the agent releases its start-up memory once,
// when it first becomes ready, however many probes ask, and that a probe answering ready
// waits for the release.
func TestMemorySettlesOnceWhenReady(t *testing.T) {
	var frees atomic.Int32
	started, release := make(chan struct{}, 1), make(chan struct{})
	m := &memorySettler{log: quiet, free: func() {
		frees.Add(1)
		started <- struct{}{}
		<-release
	}}
	var checks atomic.Int32
	ready := func() []string {
		if checks.Add(1) < 3 {
			return []string{"not yet"}
		}
		return nil
	}
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		m.watch(context.Background(), time.Millisecond, ready)
	}()
	// A probe that finds the agent ready while the release runs waits for it.
	var probes sync.WaitGroup
	answered := make(chan struct{}, 3)
	for range 3 {
		probes.Go(func() {
			m.readyNow()
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
	<-watched
	probes.Wait()
	if n := frees.Load(); n != 1 {
		t.Errorf("released memory %d times, want once", n)
	}
}

// TestMemorySettlerStopsWithContext checks that watch returns when the agent stops
// before it was ever ready, without releasing anything.
func TestMemorySettlerStopsWithContext(t *testing.T) {
	var frees atomic.Int32
	m := &memorySettler{log: quiet, free: func() { frees.Add(1) }}
	ctx, cancel := context.WithCancel(context.Background())
	checked := make(chan struct{}, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		m.watch(ctx, time.Millisecond, func() []string {
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
		t.Errorf("released memory %d times for an agent never ready, want 0", n)
	}
}
