package hal_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/naplesnet/naples/delphi"
	"github.com/naplesnet/naples/hal"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// countingStore is a hal.Store that counts the status transactions it passes on, and that
// the test can make wait (hold) before passing them on.
type countingStore struct {
	hal.Store
	gate sync.RWMutex

	// mu guards commits and statuses.
	mu       sync.Mutex
	commits  int
	statuses int
}

func (c *countingStore) WriteStatus(updates []hal.StatusUpdate) error {
	c.gate.RLock()
	defer c.gate.RUnlock()
	c.mu.Lock()
	c.commits++
	c.statuses += len(updates)
	c.mu.Unlock()
	return c.Store.WriteStatus(updates)
}

func (c *countingStore) hold() (release func()) {
	c.gate.Lock()
	return c.gate.Unlock
}

func (c *countingStore) counts() (commits, statuses int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.commits, c.statuses
}

// TestStatusBatching runs a HAL on delphi with many objects and statuses produced
// concurrently by four workers: they reach delphi in far fewer transactions than there are
// statuses, and each key ends with its latest status, also when it changed, or its object
// was deleted, while an earlier status of it was still on its way.
func TestStatusBatching(t *testing.T) {
	const n = 3000
	ds, err := delphi.Open(delphi.Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ds.Close() })
	desired, err := ds.ClaimDesired()
	if err != nil {
		t.Fatal(err)
	}
	commit := func(fn func(txn *delphi.DesiredTxn)) {
		t.Helper()
		txn := &delphi.DesiredTxn{}
		fn(txn)
		if err := desired.Commit(txn); err != nil {
			t.Fatal(err)
		}
	}
	objs := make([]*nimbusv1.Object, n)
	for i := range objs {
		objs[i] = route(fmt.Sprintf("r%04d", i), 1)
	}
	commit(func(txn *delphi.DesiredTxn) {
		for _, o := range objs {
			txn.Put(o)
		}
	})
	inner, err := hal.Delphi(ds)
	if err != nil {
		t.Fatal(err)
	}
	store := &countingStore{Store: inner}
	rec := newFakeReconciler(nimbusv1.Kind_KIND_ROUTE)
	h, err := hal.New(hal.Options{Store: store, Reconcilers: []hal.Reconciler{rec}, Workers: 4, ResyncInterval: -1, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	// The first transaction waits until every object has been reconciled twice.
	release := store.hold()
	released := false
	defer func() {
		if !released {
			release()
		}
	}()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	reconciled := func(times int) func() bool {
		return func() bool {
			for _, o := range objs {
				if rec.callsOf(id(o)) < times {
					return false
				}
			}
			return true
		}
	}
	waitFor(t, "every object reconciled", reconciled(1))
	commit(func(txn *delphi.DesiredTxn) {
		for i, o := range objs {
			if i%10 == 0 {
				txn.Delete(o.Key())
			} else {
				txn.Put(route(o.GetMeta().GetName(), 2))
			}
		}
	})
	waitFor(t, "every object reconciled again", reconciled(2))
	release()
	released = true

	statusOK := func(i int) (bool, string) {
		st, ok := ds.Status(objs[i].Key())
		if i%10 == 0 {
			return !ok, fmt.Sprintf("status of deleted %s = %v; want none", id(objs[i]), st)
		}
		return ok && st.GetPhase() == nimbusv1.Phase_PHASE_PROGRAMMED && st.GetObservedGeneration() == 2,
			fmt.Sprintf("status of %s = %v; want PROGRAMMED at generation 2", id(objs[i]), st)
	}
	waitFor(t, "every status in delphi", func() bool {
		for i := range objs {
			if ok, _ := statusOK(i); !ok {
				return false
			}
		}
		return true
	}, func() string {
		for i := range objs {
			if ok, msg := statusOK(i); !ok {
				return msg
			}
		}
		return ""
	})

	commits, statuses := store.counts()
	// One transaction held with the first statuses, then everything pending, at most
	// 1000 (StatusBatch's default) at a time: 2 + 3000/1000.
	if commits > 5 {
		t.Errorf("%d reconciles reached delphi in %d transactions; want at most 5", 2*n, commits)
	}
	if statuses > n+1000 {
		t.Errorf("%d statuses written for %d keys; want at most those of the held transaction (up to 1000) and one per key: a pending status is replaced by its key's next", statuses, n)
	}
	// Stats counts a transaction once the store has returned from it.
	waitFor(t, "Stats to count every status transaction", func() bool {
		st := h.Stats()
		return st.StatusCommits == uint64(commits) && st.StatusWrites == uint64(statuses)
	}, func() string {
		return fmt.Sprintf("Stats: %+v; want %d commits of %d statuses", h.Stats(), commits, statuses)
	})
	st := h.Stats()
	if k := st.Kinds[nimbusv1.Kind_KIND_ROUTE]; k.Reconciles != 2*n || k.Errors != 0 || k.KernelWrites != 0 {
		t.Errorf("Stats of routes = %+v; want %d reconciles, no errors, no kernel writes", k, 2*n)
	}
}

// TestStatusWriteFailureRetries: a status transaction that fails is not lost: the objects
// in it are reconciled again, after their backoff, and their statuses written anew.
func TestStatusWriteFailureRetries(t *testing.T) {
	a := route("a", 1)
	rec := newFakeReconciler(nimbusv1.Kind_KIND_ROUTE)
	store := &failingStatusStore{fakeStore: newFakeStore(a), failures: 1}
	h := startOn(t, store, store.fakeStore, hal.Options{Reconcilers: []hal.Reconciler{rec}, ResyncInterval: -1})
	waitFor(t, "a reconciled once and its status write failed", func() bool {
		return rec.callsOf(id(a)) == 1 && store.failed() == 1
	}, rec.describe)
	h.waitTimers(1) // the retry
	if _, ok := store.status(id(a)); ok {
		t.Fatal("a has a status though its only status write failed")
	}
	h.clock.Step(time.Second)
	waitFor(t, "a reconciled again and PROGRAMMED", func() bool {
		st, ok := store.status(id(a))
		return rec.callsOf(id(a)) == 2 && ok && st.GetPhase() == nimbusv1.Phase_PHASE_PROGRAMMED
	}, rec.describe)
}

// failingStatusStore fails its first status transactions.
type failingStatusStore struct {
	*fakeStore
	mu       sync.Mutex
	failures int
	fails    int
}

func (f *failingStatusStore) WriteStatus(updates []hal.StatusUpdate) error {
	f.mu.Lock()
	if f.failures > 0 {
		f.failures--
		f.fails++
		f.mu.Unlock()
		return fmt.Errorf("writing statuses: %w", errDiskFull)
	}
	f.mu.Unlock()
	return f.fakeStore.WriteStatus(updates)
}

func (f *failingStatusStore) failed() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.fails
}

var errDiskFull = fmt.Errorf("no space left on device")

// TestSweepDriftIsReconciled: the keys a sweep enqueues, as drift it found, are reconciled.
func TestSweepDriftIsReconciled(t *testing.T) {
	rec := newFakeReconciler(nimbusv1.Kind_KIND_ROUTE)
	a, b := route("a", 1), route("b", 1)
	store := newFakeStore(a, b)
	rec.drift(id(b))
	h := start(t, store, hal.Options{Reconcilers: []hal.Reconciler{sweeper{rec}}, ResyncInterval: -1})
	waitFor(t, "a and b programmed", func() bool { return rec.callsOf(id(a)) == 1 && rec.callsOf(id(b)) == 1 }, rec.describe)
	h.barrier()
	store.markSynced()
	waitFor(t, "the sweep", func() bool { return rec.sweepCount() == 1 }, rec.describe)
	waitFor(t, "b, which the sweep found drifted, reconciled again", func() bool { return rec.callsOf(id(b)) == 2 }, rec.describe)
	h.barrier()
	h.barrier()
	if n := rec.callsOf(id(a)); n != 1 {
		t.Errorf("a reconciled %d times; want 1: the sweep found no drift in it and resync is off", n)
	}
}

// TestStatsCount checks the counts Stats reports per kind: reconciles, failed ones, and
// the kernel writes of a reconciler that counts them.
func TestStatsCount(t *testing.T) {
	rec := newFakeReconciler(nimbusv1.Kind_KIND_ROUTE)
	a, b := route("a", 1), route("b", 1)
	rec.fail(id(b), 2, hal.Errorf(hal.ReasonKernelError, "netlink: %s", "invalid argument"))
	store := newFakeStore(a, b)
	h := start(t, store, hal.Options{Reconcilers: []hal.Reconciler{counting{rec}}, ResyncInterval: -1})
	for i := 1; i <= 2; i++ {
		waitFor(t, fmt.Sprintf("failure %d of b", i), func() bool { return rec.callsOf(id(b)) == i }, rec.describe)
		h.waitTimers(1) // the retry
		h.clock.Step(time.Second)
	}
	waitFor(t, "a and b programmed", func() bool {
		sa, _ := store.status(id(a))
		sb, _ := store.status(id(b))
		return sa.GetPhase() == nimbusv1.Phase_PHASE_PROGRAMMED && sb.GetPhase() == nimbusv1.Phase_PHASE_PROGRAMMED
	}, rec.describe)
	st := h.hal.Stats()
	want := hal.KindStats{Reconciles: 4, Errors: 2, KernelWrites: 4 * 7}
	if got := st.Kinds[nimbusv1.Kind_KIND_ROUTE]; got != want {
		t.Errorf("Stats of routes = %+v; want %+v", got, want)
	}
	if got := st.Kinds[nimbusv1.Kind_KIND_NODE]; got.Reconciles != 0 || got.KernelWrites != 0 {
		t.Errorf("Stats of the barrier's Node reconciler = %+v; want nothing and no kernel writes: it does not count them", got)
	}
}

// counting is a fakeReconciler that reports 7 kernel writes per reconcile.
type counting struct{ *fakeReconciler }

var _ hal.KernelWriteCounter = counting{}

func (c counting) KernelWrites() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	var n uint64
	for _, calls := range c.calls {
		n += uint64(calls) * 7
	}
	return n
}

// TestStatusBatchesFillUnderLoad: while keys are queued, statuses are recorded in full
// batches of Options.StatusBatch, not one small transaction after each reconcile; the
// last, partial batch is recorded as soon as the queue is empty.
func TestStatusBatchesFillUnderLoad(t *testing.T) {
	const n, batch = 2000, 100
	objs := make([]*nimbusv1.Object, n)
	for i := range objs {
		objs[i] = route(fmt.Sprintf("r%04d", i), 1)
	}
	objs = append(objs, route("last", 1)) // n+1 keys: the last batch is partial
	store := newFakeStore(objs...)
	rec := newFakeReconciler(nimbusv1.Kind_KIND_ROUTE)
	// Two workers: the statuses of the reconciles under way when the queue runs empty at
	// the end are recorded as they end, a small transaction each at worst.
	h := start(t, store, hal.Options{Reconcilers: []hal.Reconciler{rec}, StatusBatch: batch, Workers: 2, ResyncInterval: -1})
	waitFor(t, "every status recorded", func() bool {
		for _, o := range objs {
			if st, ok := store.status(id(o)); !ok || st.GetPhase() != nimbusv1.Phase_PHASE_PROGRAMMED {
				return false
			}
		}
		return true
	})
	// A few more than n/batch: the queue may run empty for a moment while the feed
	// fills it.
	if c := store.statusCommits(); c > n/batch+10 {
		t.Errorf("%d statuses recorded in %d transactions; want about %d, batches of %d", n+1, c, n/batch+1, batch)
	}
	// Stats counts a transaction once the store has returned from it.
	waitFor(t, "Stats to count every status", func() bool { return h.hal.Stats().StatusWrites == uint64(n+1) },
		func() string { return fmt.Sprintf("Stats: %+v", h.hal.Stats()) })
}
