package hal_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/naplesnet/naples/hal"
	"github.com/naplesnet/naples/internal/telemetry/telemetrytest"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// metric returns the value of one series of reg, and whether it is there.
func metric(t *testing.T, reg prometheus.Gatherer, series string) (float64, bool) {
	t.Helper()
	v, ok := telemetrytest.Values(t, reg)[series]
	return v, ok
}

// wantMetric fails the test unless the series has the value.
func wantMetric(t *testing.T, reg prometheus.Gatherer, series string, want float64) {
	t.Helper()
	if v, ok := metric(t, reg, series); !ok || v != want {
		t.Errorf("%s = %v (present %v), want %v", series, v, ok, want)
	}
}

// TestMetricsMove checks that reconciles move the counters and the duration histogram of
// their kind, failures the error and retry counters, and that the queue depth counts the
// keys waiting for a worker.
func TestMetricsMove(t *testing.T) {
	reg := prometheus.NewRegistry()
	rec := newFakeReconciler(nimbusv1.Kind_KIND_ROUTE)
	a, b := route("a", 1), route("b", 1)
	rec.fail(id(b), 2, hal.Errorf(hal.ReasonKernelError, "netlink: %s", "invalid argument"))
	rec.block(id(a))
	store := newFakeStore(a, b)
	h := start(t, store, hal.Options{Reconcilers: []hal.Reconciler{counting{rec}}, Workers: 1, ResyncInterval: -1, Registerer: reg})
	wantMetric(t, reg, `naples_hal_reconcile_duration_seconds_count{kind="Route"}`, 0)

	// a blocks the only worker: whatever is added now waits on the queue.
	waitFor(t, "a reconciling", func() bool { return rec.runningOf(id(a)) == 1 }, rec.describe)
	h.clock.Step(1500 * time.Millisecond) // a's reconcile takes 1.5s on the HAL's clock
	more := []*nimbusv1.Object{route("c", 1), route("d", 1), route("e", 1)}
	store.put(more...)
	waitFor(t, "b and three more keys on the queue", func() bool {
		v, _ := metric(t, reg, "naples_hal_queue_depth")
		return v == 4
	}, func() string { v, _ := metric(t, reg, "naples_hal_queue_depth"); return fmt.Sprint("depth ", v) })
	rec.release(id(a))

	// The clock moves only while no reconcile runs, so that only a's took time.
	programmed := func(objs ...*nimbusv1.Object) bool {
		for _, o := range objs {
			if st, ok := store.status(id(o)); !ok || st.GetPhase() != nimbusv1.Phase_PHASE_PROGRAMMED {
				return false
			}
		}
		return true
	}
	for i := 1; i <= 2; i++ {
		waitFor(t, fmt.Sprintf("failure %d of b, and c, d and e programmed", i), func() bool {
			return rec.callsOf(id(b)) == i && rec.runningOf(id(b)) == 0 && programmed(more...)
		}, rec.describe)
		h.waitTimers(1) // the retry
		h.clock.Step(time.Second)
	}
	waitFor(t, "every route programmed", func() bool { return programmed(append([]*nimbusv1.Object{a, b}, more...)...) }, rec.describe)

	// a, c, d, e once; b three times.
	wantMetric(t, reg, `naples_hal_reconciles_total{kind="Route"}`, 7)
	wantMetric(t, reg, `naples_hal_reconcile_errors_total{kind="Route"}`, 2)
	wantMetric(t, reg, `naples_hal_kernel_writes_total{kind="Route"}`, 7*7)
	wantMetric(t, reg, `naples_hal_reconcile_duration_seconds_count{kind="Route"}`, 7)
	wantMetric(t, reg, `naples_hal_reconcile_duration_seconds_sum{kind="Route"}`, 1.5)
	wantMetric(t, reg, "naples_hal_retries_total", 2)
	wantMetric(t, reg, "naples_hal_queue_depth", 0)
	if _, ok := metric(t, reg, `naples_hal_kernel_writes_total{kind="Node"}`); ok {
		t.Errorf("kernel writes reported for Node, whose reconciler does not count them")
	}
	waitFor(t, "the status writer's counts", func() bool {
		st := h.hal.Stats()
		commits, _ := metric(t, reg, "naples_hal_status_commits_total")
		writes, _ := metric(t, reg, "naples_hal_status_writes_total")
		return st.StatusWrites >= 5 && commits == float64(st.StatusCommits) && writes == float64(st.StatusWrites)
	}, func() string { return fmt.Sprintf("Stats %+v", h.hal.Stats()) })

	// Run closes the HAL when it ends, and Close unregisters.
	h.cancel()
	if err := h.wait(); err != nil {
		t.Fatal(err)
	}
	if fams, err := reg.Gather(); err != nil || len(fams) != 0 {
		t.Errorf("after Run the registry holds %d metric families (err %v), want none", len(fams), err)
	}
}

func TestMetricsRegisterOnce(t *testing.T) {
	reg := prometheus.NewRegistry()
	opts := hal.Options{Store: newFakeStore(), Reconcilers: []hal.Reconciler{newFakeReconciler(nimbusv1.Kind_KIND_ROUTE)}, Logger: quiet, Registerer: reg}
	h, err := hal.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := hal.New(opts); err == nil || !strings.Contains(err.Error(), "registering metrics") {
		t.Errorf("second New on one Registerer = %v, want a registration error", err)
	}
	h.Close()
	h, err = hal.New(opts)
	if err != nil {
		t.Fatalf("New after Close: %v", err)
	}
	h.Close()
	// goleak in TestMain checks that the failed New stopped its work queue.
}

// wantReady waits until Ready returns exactly the reasons.
func wantReady(t *testing.T, h *harness, rec *fakeReconciler, reasons ...string) {
	t.Helper()
	waitFor(t, fmt.Sprintf("Ready() = %q", reasons), func() bool { return slices.Equal(h.hal.Ready(), reasons) },
		func() string { return fmt.Sprintf("Ready() = %q; %s", h.hal.Ready(), rec.describe()) })
}

// TestReadyAfterFirstReconciles checks that the HAL is ready only once the desired table is
// complete and every desired object has been reconciled at least once, a failed reconcile
// included; that a new object makes it wait again and a changed one does not; and that it
// is not ready before Run or after.
func TestReadyAfterFirstReconciles(t *testing.T) {
	rec := newFakeReconciler(nimbusv1.Kind_KIND_ROUTE)
	a, b, c := route("a", 1), route("b", 1), route("c", 1)
	rec.fail(id(b), 1<<30, hal.Errorf(hal.ReasonKernelError, "netlink: %s", "no such device"))
	rec.block(id(a))
	store := newFakeStore(a, b, c)

	idle, err := hal.New(hal.Options{Store: store, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if r := idle.Ready(); len(r) != 1 || !strings.Contains(r[0], "not running") {
		t.Errorf("Ready() before Run = %q, want not running", r)
	}
	idle.Close()

	// Two workers, so that an object waits on the queue while they are busy (see e below).
	h := start(t, store, hal.Options{Reconcilers: []hal.Reconciler{rec}, Workers: 2, ResyncInterval: -1})
	waitFor(t, "b failed and c programmed", func() bool {
		sb, _ := store.status(id(b))
		sc, _ := store.status(id(c))
		return sb.GetPhase() == nimbusv1.Phase_PHASE_FAILED && sc.GetPhase() == nimbusv1.Phase_PHASE_PROGRAMMED
	}, rec.describe)
	// Everything but a was tried, but the desired table is not known to be complete.
	wantReady(t, h, rec, "desired state not complete yet: neither restored from disk nor synced with nimbus")

	store.markSynced()
	wantReady(t, h, rec, "1 desired object not reconciled yet since start")
	d := route("d", 1)
	rec.block(id(d))
	store.put(d)
	wantReady(t, h, rec, "2 desired objects not reconciled yet since start")

	// An object deleted before its first reconcile is no longer waited for. Both workers
	// are busy with a and d: e waits on the queue until it is gone.
	e := route("e", 1)
	store.put(e)
	wantReady(t, h, rec, "3 desired objects not reconciled yet since start")
	store.remove(id(e))
	rec.release(id(a))
	rec.release(id(d))
	// b still fails and is retried: it was reconciled, and that counts.
	wantReady(t, h, rec)
	if n, last := rec.callsOf(id(e)), rec.lastOf(id(e)); n == 0 || last != nil {
		t.Errorf("e reconciled %d times, last with %v; want its removal", n, last)
	}

	// Once caught up the HAL stays ready: changed and new objects are ordinary work.
	rec.block(id(a))
	f := route("f", 1)
	rec.block(id(f))
	store.put(route("a", 2), f)
	waitFor(t, "a and f being reconciled", func() bool { return rec.runningOf(id(a)) == 1 && rec.runningOf(id(f)) == 1 }, rec.describe)
	if r := h.hal.Ready(); len(r) != 0 {
		t.Errorf("Ready() while a changed and a new object are reconciled = %q, want ready", r)
	}
	rec.release(id(a))
	rec.release(id(f))

	h.cancel()
	if err := h.wait(); err != nil {
		t.Fatal(err)
	}
	if r := h.hal.Ready(); !slices.Equal(r, []string{"hal stopped"}) {
		t.Errorf("Ready() after Run = %q, want hal stopped", r)
	}
}

// TestReadyCountsWhatTheFeedHasNotHandedOut checks that the keys of the complete desired
// table count even while the feed has not handed them out yet, as when a snapshot is
// committed and marked synced while the HAL is still busy with the feed's last batch.
func TestReadyCountsWhatTheFeedHasNotHandedOut(t *testing.T) {
	rec := newFakeReconciler(nimbusv1.Kind_KIND_ROUTE)
	store := newFakeStore()
	h := start(t, store, hal.Options{Reconcilers: []hal.Reconciler{rec}, ResyncInterval: -1})
	wantReady(t, h, rec, "desired state not complete yet: neither restored from disk nor synced with nimbus")

	// x is in the table, but no feed has heard of it.
	x := route("x", 1)
	rec.block(id(x))
	store.mu.Lock()
	store.objs[id(x)] = x
	store.mu.Unlock()
	store.markSynced()
	wantReady(t, h, rec, "1 desired object not reconciled yet since start")
	rec.release(id(x))
	wantReady(t, h, rec)
}
