package hal_test

import (
	"errors"
	"fmt"
	"io/fs"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/naplesnet/naples/hal"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestNewRejectsBadOptions(t *testing.T) {
	tests := []struct {
		name string
		opts hal.Options
	}{
		{"no store", hal.Options{}},
		{"two reconcilers of one kind", hal.Options{
			Store: newFakeStore(),
			Reconcilers: []hal.Reconciler{
				newFakeReconciler(nimbusv1.Kind_KIND_ROUTE),
				newFakeReconciler(nimbusv1.Kind_KIND_ROUTE),
			},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if h, err := hal.New(tc.opts); err == nil {
				h.Close()
				t.Fatal("New succeeded")
			}
		})
	}
}

func TestCloseTwiceWithoutRun(t *testing.T) {
	h, err := hal.New(hal.Options{Store: newFakeStore(), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	// goleak in TestMain checks that Close stopped the work queue's goroutines.
}

// TestPerKeySerialization checks that one key is never reconciled on two workers at once,
// that changes made during its reconcile are coalesced into one more reconcile of the
// latest object, and that two keys are reconciled at the same time.
func TestPerKeySerialization(t *testing.T) {
	a, b, c := route("a", 1), route("b", 1), route("c", 1)
	rec := newFakeReconciler(nimbusv1.Kind_KIND_ROUTE)
	rec.block(id(a))
	rec.block(id(b))
	store := newFakeStore(a, b)
	h := start(t, store, hal.Options{Reconcilers: []hal.Reconciler{rec}, Workers: 2, ResyncInterval: -1})

	waitFor(t, "a and b reconciling at once", func() bool {
		return rec.runningOf(id(a)) == 1 && rec.runningOf(id(b)) == 1
	}, rec.describe)
	rec.release(id(b))
	waitFor(t, "b programmed", func() bool {
		st, ok := store.status(id(b))
		return ok && st.GetPhase() == nimbusv1.Phase_PHASE_PROGRAMMED
	}, rec.describe)

	// a changes three times while its first reconcile is blocked; then c is added. The
	// queue is FIFO, so the free worker would take a before c if it could.
	for gen := int64(2); gen <= 4; gen++ {
		store.put(route("a", gen))
	}
	store.put(c)
	waitFor(t, "c programmed by the free worker", func() bool {
		st, ok := store.status(id(c))
		return ok && st.GetPhase() == nimbusv1.Phase_PHASE_PROGRAMMED
	}, rec.describe)
	if n, m := rec.callsOf(id(a)), rec.maxRunningOf(id(a)); n != 1 || m != 1 {
		t.Fatalf("while a's first reconcile is blocked: %d reconciles of a started, %d at most at once; want 1 and 1", n, m)
	}

	rec.release(id(a))
	waitFor(t, "a reconciled again", func() bool { return rec.callsOf(id(a)) == 2 }, rec.describe)
	// Two barriers: the first one ends after a's second reconcile is done, the second one
	// after anything that requeued a when it was done.
	h.barrier()
	h.barrier()
	if n := rec.callsOf(id(a)); n != 2 {
		t.Errorf("a reconciled %d times; want 2: three changes during the first reconcile coalesce into one more", n)
	}
	if m := rec.maxRunningOf(id(a)); m != 1 {
		t.Errorf("a reconciled %d times at once; want 1", m)
	}
	if g := rec.lastOf(id(a)).GetMeta().GetGeneration(); g != 4 {
		t.Errorf("a's second reconcile got generation %d; want the latest, 4", g)
	}
	if st, _ := store.status(id(a)); st.GetPhase() != nimbusv1.Phase_PHASE_PROGRAMMED || st.GetObservedGeneration() != 4 {
		t.Errorf("status of a = %v; want PROGRAMMED at generation 4", st)
	}
	if m := rec.maxConcurrent(); m != 2 {
		t.Errorf("at most %d reconciles ran at once; want 2 with 2 workers", m)
	}
}

// TestStatus checks the status the HAL records for programmed, failed and unsupported
// objects, and that it removes the status of deleted ones.
func TestStatus(t *testing.T) {
	rec := newFakeReconciler(nimbusv1.Kind_KIND_ROUTE)
	ok := route("ok", 5)
	// Any operational data: the HAL does not look at its kind.
	rec.setOp(id(ok), &nimbusv1.OperationalData{Kind: &nimbusv1.OperationalData_SecurityPolicy{
		SecurityPolicy: &nimbusv1.SecurityPolicyOperational{ProtectedEndpoints: 2, Rules: []*nimbusv1.PolicyRuleCounters{
			{Direction: nimbusv1.PolicyRuleCounters_DIRECTION_EGRESS, Index: 1, Packets: 3, Bytes: 180},
		}},
	}})
	conflict := route("conflict", 2)
	rec.fail(id(conflict), 1<<30, hal.Errorf(hal.ReasonConflict, "table %d is held by %s", 100, "another agent"))
	wrapped := route("wrapped", 3)
	rec.fail(id(wrapped), 1<<30, fmt.Errorf("replacing route 10.0.0.0/24: %w",
		&hal.Error{Reason: hal.ReasonKernelError, Err: fs.ErrExist}))
	plain := route("plain", 1)
	rec.fail(id(plain), 1<<30, errors.New("no such device"))
	invalid := route("invalid", 4)
	rec.fail(id(invalid), 1<<30, fmt.Errorf("parsing: %w", hal.Errorf(hal.ReasonInvalid, "spec.table %d: reserved", 255)))
	network := object(nimbusv1.Kind_KIND_NETWORK, "blue", 7)

	store := newFakeStore(ok, conflict, wrapped, plain, invalid, network)
	h := start(t, store, hal.Options{Reconcilers: []hal.Reconciler{rec}, ResyncInterval: -1})
	now := timestamppb.New(h.clock.Now())

	tests := []struct {
		name string
		id   nimbusv1.Key
		want *nimbusv1.NodeStatus
	}{
		{"programmed", id(ok), &nimbusv1.NodeStatus{
			ObservedGeneration: 5, Phase: nimbusv1.Phase_PHASE_PROGRAMMED,
			Operational: map[string]string{"protectedEndpoints": "2", "egress[1].packets": "3", "egress[1].bytes": "180"},
			OperationalData: &nimbusv1.OperationalData{Kind: &nimbusv1.OperationalData_SecurityPolicy{
				SecurityPolicy: &nimbusv1.SecurityPolicyOperational{ProtectedEndpoints: 2, Rules: []*nimbusv1.PolicyRuleCounters{
					{Direction: nimbusv1.PolicyRuleCounters_DIRECTION_EGRESS, Index: 1, Packets: 3, Bytes: 180},
				}},
			}},
			UpdateTime: now,
		}},
		{"failed with reason", id(conflict), &nimbusv1.NodeStatus{
			ObservedGeneration: 2, Phase: nimbusv1.Phase_PHASE_FAILED,
			Reason: hal.ReasonConflict, Message: "table 100 is held by another agent", UpdateTime: now,
		}},
		{"failed with wrapped reason", id(wrapped), &nimbusv1.NodeStatus{
			ObservedGeneration: 3, Phase: nimbusv1.Phase_PHASE_FAILED,
			Reason: hal.ReasonKernelError, Message: "replacing route 10.0.0.0/24: file already exists", UpdateTime: now,
		}},
		{"failed with plain error", id(plain), &nimbusv1.NodeStatus{
			ObservedGeneration: 1, Phase: nimbusv1.Phase_PHASE_FAILED,
			Reason: hal.ReasonFailed, Message: "no such device", UpdateTime: now,
		}},
		// No retry mends an invalid spec: the status says so. The failures above are
		// retried (terminal false).
		{"failed with invalid spec", id(invalid), &nimbusv1.NodeStatus{
			ObservedGeneration: 4, Phase: nimbusv1.Phase_PHASE_FAILED, Terminal: true,
			Reason: hal.ReasonInvalid, Message: "parsing: spec.table 255: reserved", UpdateTime: now,
		}},
		{"kind without reconciler", id(network), &nimbusv1.NodeStatus{
			ObservedGeneration: 7, Phase: nimbusv1.Phase_PHASE_PENDING,
			Reason: hal.ReasonUnsupported, Message: "this agent does not program Network objects yet", UpdateTime: now,
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			waitFor(t, "status of "+tc.id.String(), func() bool {
				st, _ := store.status(tc.id)
				return proto.Equal(st, tc.want)
			}, func() string {
				st, _ := store.status(tc.id)
				return fmt.Sprintf("got %v, want %v", st, tc.want)
			})
		})
	}

	store.remove(id(ok), id(network))
	waitFor(t, "statuses of deleted objects removed", func() bool {
		_, okThere := store.status(id(ok))
		_, netThere := store.status(id(network))
		return !okThere && !netThere
	}, rec.describe)
	if rec.lastOf(id(ok)) != nil {
		t.Errorf("the reconcile of deleted %s got an object; want nil, to remove it", id(ok))
	}
	if n := rec.callsOf(id(ok)); n != 2 {
		t.Errorf("%s reconciled %d times; want 2: the add and the delete", id(ok), n)
	}
}

// TestRetryBackoff checks that a failed reconcile is retried once the per-key backoff has
// passed on the clock, not before, and that the object is PROGRAMMED once it succeeds.
func TestRetryBackoff(t *testing.T) {
	a := route("a", 1)
	rec := newFakeReconciler(nimbusv1.Kind_KIND_ROUTE)
	rec.fail(id(a), 2, hal.Errorf(hal.ReasonKernelError, "netlink: %s", "device or resource busy"))
	store := newFakeStore(a)
	h := start(t, store, hal.Options{
		Reconcilers:    []hal.Reconciler{rec},
		RateLimiter:    hal.DefaultRateLimiter(),
		ResyncInterval: -1,
	})
	failed := func() bool {
		st, ok := store.status(id(a))
		return ok && st.GetPhase() == nimbusv1.Phase_PHASE_FAILED && st.GetReason() == hal.ReasonKernelError
	}

	// DefaultRateLimiter backs off 50ms after the first failure, 100ms after the second.
	for i, backoff := range []time.Duration{50 * time.Millisecond, 100 * time.Millisecond} {
		waitFor(t, fmt.Sprintf("failure %d", i+1), func() bool { return rec.callsOf(id(a)) == i+1 && failed() }, rec.describe)
		h.waitTimers(1) // the retry
		if n := rec.callsOf(id(a)); n != i+1 {
			t.Fatalf("after failure %d: %d reconciles before the clock moved; want %d", i+1, n, i+1)
		}
		h.clock.Step(backoff - time.Millisecond)
		if w, n := h.clock.Waiters()-h.base, rec.callsOf(id(a)); w != 1 || n != i+1 {
			t.Fatalf("%v after failure %d: %d retry timers pending and %d reconciles; want the retry still pending",
				backoff-time.Millisecond, i+1, w, n)
		}
		h.clock.Step(time.Millisecond)
	}
	waitFor(t, "a programmed on the third try", func() bool {
		st, ok := store.status(id(a))
		return rec.callsOf(id(a)) == 3 && ok && st.GetPhase() == nimbusv1.Phase_PHASE_PROGRAMMED && st.GetReason() == ""
	}, rec.describe)
}

// TestSweepWaitsForSynced checks that nothing is swept before the desired table is
// complete, and that it is swept once as soon as it is.
func TestSweepWaitsForSynced(t *testing.T) {
	rec := newFakeReconciler(nimbusv1.Kind_KIND_ROUTE)
	a, b := route("a", 1), route("b", 1)
	store := newFakeStore(a, b)
	h := start(t, store, hal.Options{Reconcilers: []hal.Reconciler{sweeper{rec}}, ResyncInterval: 5 * time.Minute})

	waitFor(t, "a and b programmed", func() bool {
		sa, _ := store.status(id(a))
		sb, _ := store.status(id(b))
		return sa.GetPhase() == nimbusv1.Phase_PHASE_PROGRAMMED && sb.GetPhase() == nimbusv1.Phase_PHASE_PROGRAMMED
	}, rec.describe)
	h.barrier()
	if n := rec.sweepCount(); n != 0 {
		t.Fatalf("%d sweeps before the store is synced; want 0", n)
	}

	store.markSynced()
	waitFor(t, "a sweep once synced", func() bool { return rec.sweepCount() >= 1 }, rec.describe)
	h.waitTimers(1) // the resync ticker, started after the first sweep
	rec.mu.Lock()
	sweeps, sweepCtx := rec.sweeps, rec.sweepCtx
	rec.mu.Unlock()
	if sweeps != 1 {
		t.Errorf("%d sweeps once synced; want 1", sweeps)
	}
	if sweepCtx != nil {
		t.Errorf("sweep ran with an ended ctx: %v", sweepCtx)
	}
}

// TestResync checks that every resync interval sweeps again and reconciles every key
// again, also with no objects at all (the old code blocked forever on an empty desired
// table after the first resync) and with a sweep that fails.
func TestResync(t *testing.T) {
	tests := []struct {
		name     string
		objs     []*nimbusv1.Object
		sweepErr error
	}{
		{"objects", []*nimbusv1.Object{route("a", 1), route("b", 1)}, nil},
		{"empty store", nil, nil},
		{"empty store, failing sweep", nil, errors.New("listing routes: operation not permitted")},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rec := newFakeReconciler(nimbusv1.Kind_KIND_ROUTE)
			rec.sweepErr = tc.sweepErr
			store := newFakeStore(tc.objs...)
			store.markSynced()
			const interval = 5 * time.Minute
			h := start(t, store, hal.Options{Reconcilers: []hal.Reconciler{sweeper{rec}}, ResyncInterval: interval})

			reconciled := func(n int) func() bool {
				return func() bool {
					for _, o := range tc.objs {
						if rec.callsOf(id(o)) != n {
							return false
						}
					}
					return true
				}
			}
			waitFor(t, "the first sweep", func() bool { return rec.sweepCount() == 1 }, rec.describe)
			waitFor(t, "every key reconciled", reconciled(1), rec.describe)
			h.waitTimers(1) // the resync ticker
			for round := 2; round <= 3; round++ {
				h.clock.Step(interval)
				waitFor(t, fmt.Sprintf("sweep %d", round), func() bool { return rec.sweepCount() == round }, rec.describe)
				waitFor(t, fmt.Sprintf("every key reconciled %d times", round), reconciled(round), rec.describe)
			}
		})
	}
}

// TestObserverRestart checks that an observer that fails is started again after
// ObserverBackoff.Min and not before, that every object of its kind (and of no other kind)
// is reconciled again once it is subscribed again, and that the keys it enqueues are
// reconciled.
func TestObserverRestart(t *testing.T) {
	routes := newFakeReconciler(nimbusv1.Kind_KIND_ROUTE)
	ifaces := newFakeReconciler(nimbusv1.Kind_KIND_INTERFACE)
	r1, r2 := route("r1", 1), route("r2", 1)
	i1 := object(nimbusv1.Kind_KIND_INTERFACE, "eth0", 1)
	store := newFakeStore(r1, r2, i1)
	opts := hal.Options{Reconcilers: []hal.Reconciler{observer{routes}, ifaces}, ResyncInterval: -1}
	opts.ObserverBackoff.Min = time.Second
	opts.ObserverBackoff.Max = 8 * time.Second
	opts.ObserverBackoff.Healthy = time.Hour
	h := start(t, store, opts)

	calls := func() [3]int {
		return [3]int{routes.callsOf(id(r1)), routes.callsOf(id(r2)), ifaces.callsOf(id(i1))}
	}
	describe := func() string { return fmt.Sprintf("calls r1, r2, i1 = %v; %s", calls(), routes.describe()) }

	waitFor(t, "observer subscribed", func() bool { return routes.subscribedCount() == 1 }, describe)
	waitFor(t, "every key reconciled", func() bool { return calls() == [3]int{1, 1, 1} }, describe)

	observer{routes}.sendEnqueue(t, id(r1))
	waitFor(t, "r1 enqueued by the observer reconciled", func() bool { return calls() == [3]int{2, 1, 1} }, describe)
	h.barrier()
	h.barrier()
	if got := calls(); got != [3]int{2, 1, 1} {
		t.Fatalf("calls r1, r2, i1 = %v before the observer fails; want [2 1 1]", got)
	}

	observer{routes}.sendFail(t, errors.New("netlink: no buffer space available"))
	h.waitTimers(1) // the restart
	h.clock.Step(opts.ObserverBackoff.Min - time.Nanosecond)
	if w, n := h.clock.Waiters()-h.base, routes.startCount(); w != 1 || n != 1 {
		t.Fatalf("just before the backoff: %d restart timers pending, observer started %d times; want 1 and 1", w, n)
	}
	h.clock.Step(time.Nanosecond)
	waitFor(t, "observer started and subscribed again", func() bool { return routes.subscribedCount() == 2 }, describe)
	waitFor(t, "every route reconciled again", func() bool { return calls() == [3]int{3, 2, 1} }, describe)
	h.barrier()
	h.barrier()
	if got := calls(); got != [3]int{3, 2, 1} {
		t.Errorf("calls r1, r2, i1 = %v after the observer restarted; want [3 2 1]: each route once more, the interface not", got)
	}
	if n := routes.startCount(); n != 2 {
		t.Errorf("observer started %d times; want 2", n)
	}
}

// TestObserverBackoff checks that the restart delay doubles with every failure in a row up
// to ObserverBackoff.Max, and starts over at Min after the observer ran for Healthy.
func TestObserverBackoff(t *testing.T) {
	routes := newFakeReconciler(nimbusv1.Kind_KIND_ROUTE)
	opts := hal.Options{Reconcilers: []hal.Reconciler{observer{routes}}, ResyncInterval: -1}
	opts.ObserverBackoff.Min = time.Second
	opts.ObserverBackoff.Max = 4 * time.Second
	opts.ObserverBackoff.Healthy = time.Hour
	h := start(t, newFakeStore(), opts)
	waitFor(t, "observer subscribed", func() bool { return routes.subscribedCount() == 1 }, routes.describe)

	restartsAfter := func(delay time.Duration) {
		t.Helper()
		starts := routes.startCount()
		observer{routes}.sendFail(t, errors.New("netlink: no buffer space available"))
		h.waitTimers(1)
		h.clock.Step(delay - time.Nanosecond)
		if w, n := h.clock.Waiters()-h.base, routes.startCount(); w != 1 || n != starts {
			t.Fatalf("%v after failure %d: %d restart timers pending, %d starts; want the restart still pending after %v",
				delay-time.Nanosecond, starts, w, n, delay)
		}
		h.clock.Step(time.Nanosecond)
		waitFor(t, fmt.Sprintf("restart %d after %v", starts, delay),
			func() bool { return routes.subscribedCount() == starts+1 }, routes.describe)
	}
	for _, delay := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 4 * time.Second} {
		restartsAfter(delay)
	}
	h.clock.Step(time.Hour) // the observer runs healthy for an hour
	restartsAfter(time.Second)
	restartsAfter(2 * time.Second)
}

// TestRunEndsWhenStoreCloses checks that Run returns nil soon after the store closes while
// its ctx is still live, even with an observer running and a reconcile blocked until its
// ctx ends (the old code waited for its goroutines before cancelling them).
func TestRunEndsWhenStoreCloses(t *testing.T) {
	routes := newFakeReconciler(nimbusv1.Kind_KIND_ROUTE)
	stuck := route("stuck", 1)
	routes.block(id(stuck))
	store := newFakeStore(stuck)
	h := start(t, store, hal.Options{Reconcilers: []hal.Reconciler{observer{routes}}})
	waitFor(t, "observer running and reconcile blocked", func() bool {
		return routes.isObserving() && routes.runningOf(id(stuck)) == 1
	}, routes.describe)

	store.close()
	if err := h.wait(); err != nil {
		t.Fatalf("Run after the store closed: %v; want nil", err)
	}
	if routes.ctxEndedOf(id(stuck)) == 0 {
		t.Error("blocked reconcile not ended by its ctx")
	}
	if routes.isObserving() {
		t.Error("observer still running after Run returned")
	}
}

// TestStopLeavesStatusAndQueue: a reconcile cut short by the HAL stopping is no failure,
// so the object keeps the status it had; and keys still queued are left to the next run,
// not reconciled with a context that has ended.
func TestStopLeavesStatusAndQueue(t *testing.T) {
	routes := newFakeReconciler(nimbusv1.Kind_KIND_ROUTE)
	stuck := route("stuck", 1)
	store := newFakeStore(stuck)
	h := start(t, store, hal.Options{Workers: 1, Reconcilers: []hal.Reconciler{routes}})
	waitFor(t, "stuck PROGRAMMED at generation 1", func() bool {
		st, ok := store.status(id(stuck))
		return ok && st.GetPhase() == nimbusv1.Phase_PHASE_PROGRAMMED && st.GetObservedGeneration() == 1
	})

	routes.block(id(stuck))
	store.put(route("stuck", 2))
	waitFor(t, "the second reconcile of stuck to block", func() bool { return routes.runningOf(id(stuck)) == 1 }, routes.describe)
	queued := []*nimbusv1.Object{route("b", 1), route("c", 1)}
	store.put(queued...)

	store.close()
	if err := h.wait(); err != nil {
		t.Fatalf("Run after the store closed: %v; want nil", err)
	}
	if routes.ctxEndedOf(id(stuck)) == 0 {
		t.Fatal("blocked reconcile not ended by its ctx")
	}
	if st, _ := store.status(id(stuck)); st.GetPhase() != nimbusv1.Phase_PHASE_PROGRAMMED || st.GetObservedGeneration() != 1 {
		t.Errorf("status of stuck after the HAL stopped = %v; want PROGRAMMED at generation 1 as before", st)
	}
	for _, o := range queued {
		if n := routes.callsOf(id(o)); n != 0 {
			t.Errorf("%s reconciled %d times after the HAL stopped; want 0", id(o), n)
		}
	}
}

func TestReasonOf(t *testing.T) {
	sentinel := errors.New("file exists")
	tests := []struct {
		name    string
		err     error
		reason  string
		message string
	}{
		{"plain error", errors.New("no such device"), hal.ReasonFailed, "no such device"},
		{"Errorf", hal.Errorf(hal.ReasonConflict, "link %q is held by %s", "vx100", "another agent"),
			hal.ReasonConflict, `link "vx100" is held by another agent`},
		{"wrapped", fmt.Errorf("adding route: %w", hal.Errorf(hal.ReasonKernelError, "netlink: %w", sentinel)),
			hal.ReasonKernelError, "adding route: netlink: file exists"},
		{"joined", errors.Join(errors.New("a"), hal.Errorf(hal.ReasonConflict, "b")),
			hal.ReasonConflict, "a\nb"},
		{"outermost reason wins", hal.Errorf(hal.ReasonConflict, "outer: %w", hal.Errorf(hal.ReasonKernelError, "inner")),
			hal.ReasonConflict, "outer: inner"},
		{"Error literal", &hal.Error{Reason: hal.ReasonKernelError, Err: sentinel},
			hal.ReasonKernelError, "file exists"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := hal.ReasonOf(tc.err); got != tc.reason {
				t.Errorf("ReasonOf = %q; want %q", got, tc.reason)
			}
			if got := tc.err.Error(); got != tc.message {
				t.Errorf("Error() = %q; want %q", got, tc.message)
			}
		})
	}

	err := fmt.Errorf("replacing route: %w", hal.Errorf(hal.ReasonKernelError, "netlink: %w", sentinel))
	if !errors.Is(err, sentinel) {
		t.Error("errors.Is does not find the error wrapped by Errorf")
	}
	if e, ok := errors.AsType[*hal.Error](err); !ok || e.Reason != hal.ReasonKernelError || !errors.Is(e.Unwrap(), sentinel) {
		t.Errorf("errors.AsType[*hal.Error] = %v, %v; want the KernelError wrapping %v", e, ok, sentinel)
	}
}
