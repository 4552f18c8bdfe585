package hal_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/naplesnet/naples/hal"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// This file holds the fakes the HAL's tests drive it with: a store, reconcilers that can
// fail, block, sweep and observe, and a harness that runs a HAL on a fake clock.

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// t0 is where every test's fake clock starts.
var t0 = time.Date(2026, time.January, 1, 0, 0, 0, 0, time.UTC)

// object returns a desired object of the kind, with a spec of that kind.
func object(kind nimbusv1.Kind, name string, generation int64) *nimbusv1.Object {
	o := &nimbusv1.Object{Meta: &nimbusv1.ObjectMeta{Name: name, Generation: generation}}
	switch kind {
	case nimbusv1.Kind_KIND_NODE:
		o.Spec = &nimbusv1.Object_Node{Node: &nimbusv1.NodeSpec{}}
	case nimbusv1.Kind_KIND_NETWORK:
		o.Spec = &nimbusv1.Object_Network{Network: &nimbusv1.NetworkSpec{}}
	case nimbusv1.Kind_KIND_ROUTE:
		o.Spec = &nimbusv1.Object_Route{Route: &nimbusv1.RouteSpec{}}
	case nimbusv1.Kind_KIND_INTERFACE:
		o.Spec = &nimbusv1.Object_Interface{Interface: &nimbusv1.InterfaceSpec{}}
	default:
		panic(fmt.Sprintf("object: kind %v not handled", kind))
	}
	return o
}

func route(name string, generation int64) *nimbusv1.Object {
	return object(nimbusv1.Kind_KIND_ROUTE, name, generation)
}

func id(o *nimbusv1.Object) nimbusv1.Key { return o.TypedKey() }

// waitFor polls cond every few milliseconds until it holds, and fails the test when it does
// not within 10s. what says what is awaited; got, when set, describes the state at the
// deadline.
func waitFor(t *testing.T, what string, cond func() bool, got ...func() string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	poll := time.NewTicker(2 * time.Millisecond)
	defer poll.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			msg := ""
			for _, g := range got {
				msg += "; " + g()
			}
			t.Fatalf("timed out after 10s waiting for %s%s", what, msg)
		}
		<-poll.C
	}
}

// fakeStore is an in-memory hal.Store. The test changes its desired objects with put and
// remove, marks it synced with markSynced and closes it with close; the HAL's statuses are
// kept in a map.
type fakeStore struct {
	synced   chan struct{}
	syncOnce sync.Once

	// mu guards objs, statuses, commits, feeds and closed.
	mu       sync.Mutex
	objs     map[nimbusv1.Key]*nimbusv1.Object
	statuses map[nimbusv1.Key]*nimbusv1.NodeStatus
	commits  int
	feeds    map[*fakeFeed]struct{}
	closed   bool
}

var _ hal.Store = (*fakeStore)(nil)

func newFakeStore(objs ...*nimbusv1.Object) *fakeStore {
	s := &fakeStore{
		synced:   make(chan struct{}),
		objs:     map[nimbusv1.Key]*nimbusv1.Object{},
		statuses: map[nimbusv1.Key]*nimbusv1.NodeStatus{},
		feeds:    map[*fakeFeed]struct{}{},
	}
	for _, o := range objs {
		s.objs[id(o)] = o
	}
	return s
}

func (s *fakeStore) Get(key *nimbusv1.ObjectKey) (*nimbusv1.Object, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	o, ok := s.objs[key.Key()]
	return o, ok
}

func (s *fakeStore) Keys(kind nimbusv1.Kind) []nimbusv1.Key {
	s.mu.Lock()
	defer s.mu.Unlock()
	var ids []nimbusv1.Key
	for id, o := range s.objs {
		if kind == nimbusv1.Kind_KIND_UNSPECIFIED || o.Kind() == kind {
			ids = append(ids, id)
		}
	}
	slices.SortFunc(ids, nimbusv1.Key.Compare)
	return ids
}

func (s *fakeStore) WatchDesired() (hal.Feed, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, fmt.Errorf("fake store: %w", hal.ErrClosed)
	}
	f := &fakeFeed{s: s, signal: make(chan struct{}, 1), pending: map[nimbusv1.Key]bool{}}
	f.add(slices.SortedFunc(maps.Keys(s.objs), nimbusv1.Key.Compare))
	s.feeds[f] = struct{}{}
	return f, nil
}

func (s *fakeStore) Synced() <-chan struct{} { return s.synced }

// WriteStatus records the statuses as one transaction: it counts the transaction and
// applies the updates in order. A closed store fails it with hal.ErrClosed, as delphi
// does.
func (s *fakeStore) WriteStatus(updates []hal.StatusUpdate) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("fake store: %w", hal.ErrClosed)
	}
	s.commits++
	for _, u := range updates {
		if u.Status == nil {
			delete(s.statuses, u.Key)
		} else {
			s.statuses[u.Key] = proto.CloneOf(u.Status)
		}
	}
	return nil
}

// statusCommits returns the number of WriteStatus transactions.
func (s *fakeStore) statusCommits() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.commits
}

// put stores the objects, replacing those with the same keys, and tells the feeds.
func (s *fakeStore) put(objs ...*nimbusv1.Object) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ids := make([]nimbusv1.Key, len(objs))
	for i, o := range objs {
		ids[i] = id(o)
		s.objs[ids[i]] = o
	}
	for f := range s.feeds {
		f.add(ids)
	}
}

// remove deletes the objects with the keys and tells the feeds.
func (s *fakeStore) remove(ids ...nimbusv1.Key) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range ids {
		delete(s.objs, id)
	}
	for f := range s.feeds {
		f.add(ids)
	}
}

func (s *fakeStore) markSynced() { s.syncOnce.Do(func() { close(s.synced) }) }

// close ends every feed: a blocked Next returns an error wrapping hal.ErrClosed.
func (s *fakeStore) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	for f := range s.feeds {
		f.close()
	}
	clear(s.feeds)
}

// status returns the status the HAL recorded for the key.
func (s *fakeStore) status(id nimbusv1.Key) (*nimbusv1.NodeStatus, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st, ok := s.statuses[id]
	return st, ok
}

// fakeFeed hands out changed key IDs as a delphi subscription does: the first Next every
// key present, later ones the keys changed since, each once, in the order they first
// changed.
type fakeFeed struct {
	s      *fakeStore
	signal chan struct{}

	// mu guards order, pending and closed.
	mu      sync.Mutex
	order   []nimbusv1.Key
	pending map[nimbusv1.Key]bool
	closed  bool
}

var _ hal.Feed = (*fakeFeed)(nil)

func (f *fakeFeed) add(ids []nimbusv1.Key) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, id := range ids {
		if !f.pending[id] {
			f.pending[id] = true
			f.order = append(f.order, id)
		}
	}
	select {
	case f.signal <- struct{}{}:
	default:
	}
}

func (f *fakeFeed) Next(ctx context.Context) ([]nimbusv1.Key, error) {
	for {
		f.mu.Lock()
		if f.closed {
			f.mu.Unlock()
			return nil, fmt.Errorf("fake feed: %w", hal.ErrClosed)
		}
		if len(f.order) > 0 {
			out := f.order
			f.order, f.pending = nil, map[nimbusv1.Key]bool{}
			f.mu.Unlock()
			return out, nil
		}
		f.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-f.signal:
		}
	}
}

func (f *fakeFeed) Close() {
	f.s.mu.Lock()
	delete(f.s.feeds, f)
	f.s.mu.Unlock()
	f.close()
}

func (f *fakeFeed) close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.closed {
		f.closed = true
		close(f.signal)
	}
}

// fakeReconciler records its calls per key. A key can be told to fail its next calls
// (fail), to block until released or until ctx ends (block, release), and what
// operational data to report (setOp). Wrapped in sweeper or observer it also sweeps or
// observes.
type fakeReconciler struct {
	kind    nimbusv1.Kind
	enqueue chan nimbusv1.Key // keys the observer enqueues
	failObs chan error        // errors the observer returns

	// mu guards every field below.
	mu         sync.Mutex
	calls      map[nimbusv1.Key]int
	last       map[nimbusv1.Key]*nimbusv1.Object // the object of the latest call; nil for a removal
	running    map[nimbusv1.Key]int
	maxRunning map[nimbusv1.Key]int
	nowRunning int
	maxNow     int // most reconciles of any keys at once
	ctxEnded   map[nimbusv1.Key]int
	failures   map[nimbusv1.Key]failure
	gates      map[nimbusv1.Key]chan struct{}
	ops        map[nimbusv1.Key]*nimbusv1.OperationalData
	sweeps     int
	sweepErr   error
	sweepCtx   error          // ctx.Err() seen by the latest sweep
	drifted    []nimbusv1.Key // keys the next sweep enqueues
	starts     int            // Observe calls
	subscribed int            // subscribed calls made by Observe
	observing  bool
}

type failure struct {
	n   int
	err error
}

var _ hal.Reconciler = (*fakeReconciler)(nil)

func newFakeReconciler(kind nimbusv1.Kind) *fakeReconciler {
	return &fakeReconciler{
		kind:       kind,
		enqueue:    make(chan nimbusv1.Key),
		failObs:    make(chan error),
		calls:      map[nimbusv1.Key]int{},
		last:       map[nimbusv1.Key]*nimbusv1.Object{},
		running:    map[nimbusv1.Key]int{},
		maxRunning: map[nimbusv1.Key]int{},
		ctxEnded:   map[nimbusv1.Key]int{},
		failures:   map[nimbusv1.Key]failure{},
		gates:      map[nimbusv1.Key]chan struct{}{},
		ops:        map[nimbusv1.Key]*nimbusv1.OperationalData{},
	}
}

func (f *fakeReconciler) Kind() nimbusv1.Kind { return f.kind }

func (f *fakeReconciler) Reconcile(ctx context.Context, key *nimbusv1.ObjectKey, obj *nimbusv1.Object) (*nimbusv1.OperationalData, error) {
	id := key.Key()
	f.mu.Lock()
	f.calls[id]++
	f.last[id] = obj
	f.running[id]++
	f.maxRunning[id] = max(f.maxRunning[id], f.running[id])
	f.nowRunning++
	f.maxNow = max(f.maxNow, f.nowRunning)
	gate := f.gates[id]
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		f.running[id]--
		f.nowRunning--
		f.mu.Unlock()
	}()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			f.mu.Lock()
			f.ctxEnded[id]++
			f.mu.Unlock()
			return nil, ctx.Err()
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	op := f.ops[id]
	if fl := f.failures[id]; fl.n > 0 {
		fl.n--
		f.failures[id] = fl
		return op, fl.err
	}
	return op, nil
}

// fail makes the next n reconciles of the key return err.
func (f *fakeReconciler) fail(id nimbusv1.Key, n int, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failures[id] = failure{n, err}
}

// block makes reconciles of the key wait until release or until their ctx ends.
func (f *fakeReconciler) block(id nimbusv1.Key) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.gates[id] = make(chan struct{})
}

// release lets the blocked reconciles of the key go on; later ones do not block.
func (f *fakeReconciler) release(id nimbusv1.Key) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if g, ok := f.gates[id]; ok {
		close(g)
		delete(f.gates, id)
	}
}

func (f *fakeReconciler) setOp(id nimbusv1.Key, op *nimbusv1.OperationalData) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ops[id] = op
}

func (f *fakeReconciler) callsOf(id nimbusv1.Key) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[id]
}

func (f *fakeReconciler) runningOf(id nimbusv1.Key) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.running[id]
}

func (f *fakeReconciler) maxRunningOf(id nimbusv1.Key) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.maxRunning[id]
}

func (f *fakeReconciler) lastOf(id nimbusv1.Key) *nimbusv1.Object {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.last[id]
}

func (f *fakeReconciler) ctxEndedOf(id nimbusv1.Key) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.ctxEnded[id]
}

func (f *fakeReconciler) maxConcurrent() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.maxNow
}

func (f *fakeReconciler) sweepCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.sweeps
}

func (f *fakeReconciler) startCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.starts
}

func (f *fakeReconciler) subscribedCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.subscribed
}

func (f *fakeReconciler) isObserving() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.observing
}

// describe lists the calls per key, for failure messages.
func (f *fakeReconciler) describe() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return fmt.Sprintf("%s calls %v, running %v, sweeps %d, observer starts %d, subscribed %d",
		f.kind.Name(), f.calls, f.running, f.sweeps, f.starts, f.subscribed)
}

// sweeper is a fakeReconciler that also sweeps, counting its sweeps; a sweep enqueues the
// keys set with drift.
type sweeper struct{ *fakeReconciler }

var _ hal.Sweeper = sweeper{}

func (s sweeper) Sweep(ctx context.Context, enqueue func(key nimbusv1.Key)) error {
	s.mu.Lock()
	s.sweeps++
	s.sweepCtx = ctx.Err()
	err, drifted := s.sweepErr, s.drifted
	s.drifted = nil
	s.mu.Unlock()
	for _, id := range drifted {
		enqueue(id)
	}
	return err
}

// drift makes the next sweep enqueue the keys, as if it found their kernel state changed.
func (f *fakeReconciler) drift(ids ...nimbusv1.Key) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.drifted = append(f.drifted, ids...)
}

// observer is a fakeReconciler that also observes: Observe counts its starts, calls
// subscribed, then enqueues the keys sent on enqueue until ctx ends or an error is sent on
// failObs, which it returns.
type observer struct{ *fakeReconciler }

var _ hal.Observer = observer{}

func (o observer) Observe(ctx context.Context, enqueue func(key nimbusv1.Key), subscribed func()) error {
	o.mu.Lock()
	o.starts++
	o.observing = true
	o.mu.Unlock()
	defer func() {
		o.mu.Lock()
		o.observing = false
		o.mu.Unlock()
	}()
	subscribed()
	o.mu.Lock()
	o.subscribed++
	o.mu.Unlock()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case id := <-o.enqueue:
			enqueue(id)
		case err := <-o.failObs:
			return err
		}
	}
}

// sendEnqueue has the running observer enqueue the key.
func (o observer) sendEnqueue(t *testing.T, id nimbusv1.Key) {
	t.Helper()
	select {
	case o.enqueue <- id:
	case <-time.After(10 * time.Second):
		t.Fatalf("observer of %s not running to enqueue %s", o.kind.Name(), id)
	}
}

// sendFail makes the running observer return err.
func (o observer) sendFail(t *testing.T, err error) {
	t.Helper()
	select {
	case o.failObs <- err:
	case <-time.After(10 * time.Second):
		t.Fatalf("observer of %s not running to fail", o.kind.Name())
	}
}

// harness runs a HAL over a store on a fake clock until the test ends.
type harness struct {
	t       *testing.T
	store   *fakeStore
	clock   *clocktesting.FakeClock
	hal     *hal.HAL
	gate    *fakeReconciler // reconciles the Node keys of barriers
	workers int
	base    int // the clock's waiters once New returned: the work queue's own ticker
	cancel  context.CancelFunc
	done    chan error

	runOnce sync.Once
	runErr  error
	ran     bool
}

var barrierSeq atomic.Int64

// start runs a HAL with opts over store on a fake clock, with a quiet logger and, besides
// opts.Reconcilers, a reconciler of Node objects for barriers. The HAL is stopped (ctx
// cancelled, Run awaited and required to return nil) when the test ends.
func start(t *testing.T, store *fakeStore, opts hal.Options) *harness {
	t.Helper()
	return startOn(t, store, store, opts)
}

// startOn is start with the HAL reading halStore, which wraps store.
func startOn(t *testing.T, halStore hal.Store, store *fakeStore, opts hal.Options) *harness {
	t.Helper()
	h := &harness{
		t:     t,
		store: store,
		clock: clocktesting.NewFakeClock(t0),
		gate:  newFakeReconciler(nimbusv1.Kind_KIND_NODE),
		done:  make(chan error, 1),
	}
	opts.Store = halStore
	opts.Clock = h.clock
	opts.Logger = quiet
	opts.Reconcilers = append(slices.Clone(opts.Reconcilers), h.gate)
	h.workers = opts.Workers
	if h.workers <= 0 {
		h.workers = 2
	}
	var err error
	h.hal, err = hal.New(opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	h.base = h.clock.Waiters()
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	go func() { h.done <- h.hal.Run(ctx) }()
	t.Cleanup(func() {
		h.cancel()
		if err := h.wait(); err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return h
}

// wait waits up to 10s for Run to return and returns its error.
func (h *harness) wait() error {
	h.runOnce.Do(func() {
		select {
		case h.runErr = <-h.done:
			h.ran = true
		case <-time.After(10 * time.Second):
			h.runErr = fmt.Errorf("Run did not return within 10s")
		}
	})
	return h.runErr
}

// waitTimers waits until n timers or tickers besides the work queue's own wait on the
// fake clock.
func (h *harness) waitTimers(n int) {
	h.t.Helper()
	waitFor(h.t, fmt.Sprintf("%d timers on the fake clock", n),
		func() bool { return h.clock.Waiters() == h.base+n },
		func() string { return fmt.Sprintf("%d waiting", h.clock.Waiters()-h.base) })
}

// barrier returns once every key queued before it has been reconciled. It puts one
// blocked Node object per worker into the store and waits until all of them are being
// reconciled at once: every worker has then finished what it took before. The queue is
// FIFO, so anything queued before the barrier's keys was taken before them. It must not be
// used while another reconcile is blocked.
func (h *harness) barrier() {
	h.t.Helper()
	objs := make([]*nimbusv1.Object, h.workers)
	for i := range objs {
		objs[i] = object(nimbusv1.Kind_KIND_NODE, fmt.Sprintf("barrier-%d", barrierSeq.Add(1)), 1)
		h.gate.block(id(objs[i]))
	}
	h.store.put(objs...)
	waitFor(h.t, "every worker on a barrier key", func() bool {
		for _, o := range objs {
			if h.gate.runningOf(id(o)) != 1 {
				return false
			}
		}
		return true
	}, h.gate.describe)
	for _, o := range objs {
		h.gate.release(id(o))
	}
	waitFor(h.t, "barrier keys reconciled", func() bool {
		for _, o := range objs {
			if st, ok := h.store.status(id(o)); !ok || st.GetPhase() != nimbusv1.Phase_PHASE_PROGRAMMED {
				return false
			}
		}
		return true
	}, h.gate.describe)
}
