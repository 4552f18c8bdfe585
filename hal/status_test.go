package hal_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

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

// TestStatusBatching runs a HAL with many objects and statuses produced
// concurrently by four workers: they reach the store in far fewer transactions than there are
// statuses, and each key ends with its latest status, also when it changed, or its object
// was deleted, while an earlier status of it was still on its way.
func TestStatusBatching(t *testing.T) {
	const n = 3000
	objs := make([]*nimbusv1.Object, n)
	for i := range objs {
		objs[i] = route(fmt.Sprintf("r%04d", i), 1)
	}
	fs := newFakeStore(objs...)
	store := &countingStore{Store: fs}
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
	var changed []*nimbusv1.Object
	var deleted []nimbusv1.Key
	for i, o := range objs {
		if i%10 == 0 {
			deleted = append(deleted, id(o))
		} else {
			changed = append(changed, route(o.GetMeta().GetName(), 2))
		}
	}
	fs.put(changed...)
	fs.remove(deleted...)
	waitFor(t, "every object reconciled again", reconciled(2))
	release()
	released = true

	statusOK := func(i int) (bool, string) {
		st, ok := fs.status(id(objs[i]))
		if i%10 == 0 {
			return !ok, fmt.Sprintf("status of deleted %s = %v; want none", id(objs[i]), st)
		}
		return ok && st.GetPhase() == nimbusv1.Phase_PHASE_PROGRAMMED && st.GetObservedGeneration() == 2,
			fmt.Sprintf("status of %s = %v; want PROGRAMMED at generation 2", id(objs[i]), st)
	}
	waitFor(t, "every status in the store", func() bool {
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
		t.Errorf("%d reconciles reached the store in %d transactions; want at most 5", 2*n, commits)
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

// keyCountingStore is a fakeStore that counts, per key, the status updates (statuses and
// removals) written to it, and the transactions that held none.
type keyCountingStore struct {
	*fakeStore

	// mu guards writes and empty.
	mu     sync.Mutex
	writes map[nimbusv1.Key]int
	empty  int
}

func newKeyCountingStore(objs ...*nimbusv1.Object) *keyCountingStore {
	return &keyCountingStore{fakeStore: newFakeStore(objs...), writes: map[nimbusv1.Key]int{}}
}

func (s *keyCountingStore) WriteStatus(updates []hal.StatusUpdate) error {
	if err := s.fakeStore.WriteStatus(updates); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(updates) == 0 {
		s.empty++
	}
	for _, u := range updates {
		s.writes[u.Key]++
	}
	return nil
}

// writesOf returns the number of status updates written for each of the keys.
func (s *keyCountingStore) writesOf(ids ...nimbusv1.Key) []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]int, len(ids))
	for i, id := range ids {
		out[i] = s.writes[id]
	}
	return out
}

// TestStatusWrittenOnlyWhenChanged: the HAL writes an object's status to the store only
// when its content (phase, reason, message, observed generation, operational data)
// differs from the last one it wrote, whatever the update time says: reconciles that
// change nothing, such as an observer's periodic refreshes, write nothing, while a change
// of counters, phase or generation is written once. A removed object's status is removed
// and the key forgotten, so the same status written again after it comes back is written.
func TestStatusWrittenOnlyWhenChanged(t *testing.T) {
	rec := newFakeReconciler(nimbusv1.Kind_KIND_INTERFACE)
	obs := observer{rec}
	a := object(nimbusv1.Kind_KIND_INTERFACE, "a", 1)
	b := object(nimbusv1.Kind_KIND_INTERFACE, "b", 1)
	up := func(rxBytes uint64) *nimbusv1.OperationalData {
		return &nimbusv1.OperationalData{Kind: &nimbusv1.OperationalData_Interface{Interface: &nimbusv1.InterfaceOperational{
			OperState: nimbusv1.LinkOperState_LINK_OPER_STATE_UP, RxBytes: rxBytes,
		}}}
	}
	rec.setOp(id(a), up(0))
	store := newKeyCountingStore(a, b)
	h := startOn(t, store, store.fakeStore, hal.Options{Reconcilers: []hal.Reconciler{obs}, ResyncInterval: -1})

	wantWrites := func(what string, wa, wb int) {
		t.Helper()
		// Statuses are recorded in the order they are handed over: once the barrier's
		// are in the store, those handed over before them are recorded, or passed over.
		h.barrier()
		if got := store.writesOf(id(a), id(b)); !slices.Equal(got, []int{wa, wb}) {
			t.Fatalf("%s: status writes of a and b = %v; want [%d %d]", what, got, wa, wb)
		}
	}
	statusOf := func(o *nimbusv1.Object) *nimbusv1.NodeStatus {
		st, _ := store.status(id(o))
		return st
	}
	refresh := func(o *nimbusv1.Object, times int) {
		t.Helper()
		for range times {
			// A later update time: the status differs in it alone.
			h.clock.Step(time.Second)
			// One at a time: the queue coalesces a key added while it waits.
			want := rec.callsOf(id(o)) + 1
			obs.sendEnqueue(t, id(o))
			waitFor(t, "the refresh of "+id(o).String(), func() bool { return rec.callsOf(id(o)) == want }, rec.describe)
		}
	}

	waitFor(t, "a and b PROGRAMMED", func() bool {
		return statusOf(a).GetPhase() == nimbusv1.Phase_PHASE_PROGRAMMED && statusOf(b).GetPhase() == nimbusv1.Phase_PHASE_PROGRAMMED
	}, rec.describe)
	wantWrites("first reconciles", 1, 1)
	first := statusOf(a).GetUpdateTime().AsTime()

	refresh(a, 3)
	refresh(b, 3)
	wantWrites("refreshes that change nothing", 1, 1)
	if got := statusOf(a).GetUpdateTime().AsTime(); !got.Equal(first) {
		t.Errorf("a's update time = %v; want %v, the time of the status written first", got, first)
	}

	rec.setOp(id(a), up(1500))
	refresh(a, 2)
	wantWrites("a's counters changed", 2, 1)
	if got := statusOf(a).GetOperationalData().GetInterface().GetRxBytes(); got != 1500 {
		t.Errorf("a's rx_bytes = %d; want the new count, 1500", got)
	}
	if got := statusOf(a).GetOperational()["rxBytes"]; got != "1500" {
		t.Errorf("a's deprecated rxBytes = %q; want the new count, 1500", got)
	}

	// b fails twice in a row with the same error, then succeeds: FAILED is written once.
	rec.fail(id(b), 2, hal.Errorf(hal.ReasonConflict, "interface %q is already claimed by %s", "eth0", id(a)))
	obs.sendEnqueue(t, id(b))
	for i := 1; i <= 2; i++ {
		waitFor(t, fmt.Sprintf("failure %d of b", i), func() bool { return rec.callsOf(id(b)) == 4+i }, rec.describe)
		h.waitTimers(1) // the retry
		h.clock.Step(time.Second)
	}
	waitFor(t, "b PROGRAMMED again", func() bool {
		return rec.callsOf(id(b)) == 7 && statusOf(b).GetPhase() == nimbusv1.Phase_PHASE_PROGRAMMED
	}, rec.describe)
	wantWrites("b FAILED twice alike, then PROGRAMMED", 2, 3)

	a2 := object(nimbusv1.Kind_KIND_INTERFACE, "a", 2)
	store.put(a2)
	waitFor(t, "a at generation 2", func() bool { return statusOf(a).GetObservedGeneration() == 2 }, rec.describe)
	wantWrites("a's generation changed", 3, 3)

	store.remove(id(a))
	waitFor(t, "a's status removed", func() bool { return statusOf(a) == nil }, rec.describe)
	store.put(a2)
	waitFor(t, "a's status back", func() bool { return statusOf(a).GetObservedGeneration() == 2 }, rec.describe)
	wantWrites("a removed and put back", 5, 3)

	store.mu.Lock()
	empty := store.empty
	store.mu.Unlock()
	if empty != 0 {
		t.Errorf("%d status transactions held no status; want none", empty)
	}
}
