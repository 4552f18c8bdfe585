package hal

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"
	"google.golang.org/protobuf/types/known/timestamppb"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// Reconciler makes the kernel match the desired state of one kind.
type Reconciler interface {
	// Kind is the kind of object the reconciler programs.
	Kind() nimbusv1.Kind
	// Reconcile makes the kernel match obj, the desired state of key, or removes what it
	// programmed for key when obj is nil. It must be idempotent and return soon after ctx
	// ends. It returns kind-specific operational data for the object's status, nil for
	// none (the HAL fills the status's deprecated operational map from it); an error
	// leaves the object FAILED, with the reason of an *Error (ReasonFailed otherwise), and
	// is retried with backoff.
	Reconcile(ctx context.Context, key *nimbusv1.ObjectKey, obj *nimbusv1.Object) (*nimbusv1.OperationalData, error)
}

// Sweeper is implemented by reconcilers that can find kernel state they created for
// objects that no longer exist (after a restart, say) and remove it.
type Sweeper interface {
	// Sweep reads the kernel state of the reconciler's kind afresh, enqueues the key of
	// every object whose kernel state it finds changed without the reconciler hearing of
	// it (drift that no observer reported), and removes kernel state that no desired object
	// owns. The HAL calls it once the desired table is complete and then every resync
	// interval.
	Sweep(ctx context.Context, enqueue func(key nimbusv1.Key)) error
}

// Observer is implemented by reconcilers that watch the kernel for drift.
type Observer interface {
	// Observe watches the kernel until ctx ends. It subscribes to kernel changes, reads
	// the state of its kind afresh (a backend's Mirror), enqueues the key of every object
	// whose state drifted, and calls subscribed once it sees every change; then it
	// enqueues the key of every object whose kernel state changes behind the HAL's back.
	// It never writes the kernel. When it returns an error, changes may have been missed:
	// the HAL starts it again after a backoff and, once it is subscribed again, reconciles
	// every object of its kind.
	Observe(ctx context.Context, enqueue func(key nimbusv1.Key), subscribed func()) error
}

// Dependent is implemented by reconcilers whose objects depend on objects of other kinds
// (an endpoint on its network and nodes, say). Whenever a desired object of a kind they
// depend on changes in the store, and whenever one is PROGRAMMED after it was not, the
// HAL enqueues the keys they name, so that an object waiting for another one is
// reconciled the moment that one comes, changes, is programmed or goes.
type Dependent interface {
	// DependsOn returns the kinds the reconciler's objects depend on.
	DependsOn() []nimbusv1.Kind
	// DependentsOf returns the keys of the reconciler's objects that depend on the object
	// with the key, of one of the DependsOn kinds; that object may be gone. Typically it
	// looks them up in the store's indexes.
	DependentsOf(key nimbusv1.Key) []nimbusv1.Key
}

// KernelWriteCounter is implemented by reconcilers that count the kernel objects they
// write; Stats reports the count.
type KernelWriteCounter interface {
	// KernelWrites returns how many kernel objects the reconciler created, replaced or
	// removed since it was made.
	KernelWrites() uint64
}

// Store is what the HAL needs of the local object store: the desired objects, a feed of
// their changes, whether the desired table is complete, and the status table it alone
// writes. The agent adapts its delphi store to it.
type Store interface {
	// Get returns the desired object with the key.
	Get(key *nimbusv1.ObjectKey) (*nimbusv1.Object, bool)
	// Keys returns the keys of the desired objects of one kind; KIND_UNSPECIFIED returns
	// all.
	Keys(kind nimbusv1.Kind) []nimbusv1.Key
	// WatchDesired returns a feed of the keys of desired objects that change. Its first
	// Next returns every key present.
	WatchDesired() (Feed, error)
	// Synced returns a channel that is closed once the desired table is complete: from
	// then on an object missing from it is meant to be absent.
	Synced() <-chan struct{}
	// WriteStatus records the statuses in one transaction, in order: an update with a
	// Status sets the status of the object with its Key, one without removes it (an absent
	// one is no error). The store may keep the statuses themselves: the HAL never
	// modifies a status once it has handed it over.
	WriteStatus(updates []StatusUpdate) error
}

// StatusUpdate is the status of one object for Store.WriteStatus to record, or, with
// Status nil, to remove.
type StatusUpdate struct {
	// Key is the object's key.
	Key nimbusv1.Key
	// Status is the object's status; nil removes it.
	Status *nimbusv1.NodeStatus
}

// Feed hands out the keys of changed objects.
type Feed interface {
	// Next blocks until keys have changed and returns them, each once however often it
	// changed. It returns ctx's error when ctx ends, and ErrClosed (or an error wrapping
	// it) once the store is closed.
	Next(ctx context.Context) ([]nimbusv1.Key, error)
	// Close ends the feed.
	Close()
}

// Options configures a HAL.
type Options struct {
	// Store is the store to read desired objects from and write status to. Required.
	Store Store
	// Reconcilers program one kind each. Objects of other kinds are reported PENDING with
	// reason Unsupported.
	Reconcilers []Reconciler
	// Workers is the number of keys reconciled at once. A reconcile spends most of its
	// time waiting for the kernel, and backends send the writes of concurrent reconciles
	// to the kernel together, so more workers than cores pay. Default: 64.
	Workers int
	// RateLimiter decides how long a failed key waits before its retry. Default:
	// DefaultRateLimiter().
	RateLimiter workqueue.TypedRateLimiter[nimbusv1.Key]
	// ResyncInterval is how often sweepers run again and every key is reconciled again, as
	// a safety net for drift no observer saw. Default: 5m; negative disables.
	ResyncInterval time.Duration
	// ObserverBackoff bounds the delay before a failed observer is started again: it
	// starts at Min and doubles with every failure in a row up to Max. An observer that
	// ran for Healthy before it failed starts over at Min. Defaults: 100ms, 30s,
	// 1m.
	ObserverBackoff struct{ Min, Max, Healthy time.Duration }
	// Clock tells the time for status updates and reconcile durations, and drives the
	// retry delays, resyncs and observer restarts; tests inject a fake one. (The default
	// rate limiter's overall token bucket keeps real time.) Default: the real clock.
	Clock clock.WithTicker
	// StatusBatch bounds how many statuses one store transaction records. Workers hand
	// the statuses they produce to one writer, which records what is pending, the latest
	// status of each key, in transactions of StatusBatch statuses while more keys are
	// queued, and at once whatever is pending when the queue is empty. Default: 1000.
	StatusBatch int
	// Logger receives the HAL's logs. Default: slog.Default().
	Logger *slog.Logger
	// Registerer takes the HAL's Prometheus metrics (see the package documentation);
	// Close unregisters them. Default: a private prometheus.Registry.
	Registerer prometheus.Registerer
}

// HAL reconciles the store's desired objects into the kernel.
type HAL struct {
	store       Store
	reconcilers map[nimbusv1.Kind]Reconciler
	// dependents are the Dependent reconcilers by the kinds they depend on.
	dependents map[nimbusv1.Kind][]Dependent
	// programmed holds the keys of the kinds that have dependents whose last reconcile
	// left them PROGRAMMED, by name in a map per scope as it holds every such object;
	// guarded by programmedMu.
	programmedMu sync.Mutex
	programmed   nimbusv1.KeyMap[struct{}]
	counts       map[nimbusv1.Kind]*kindCounts
	queue        workqueue.TypedRateLimitingInterface[nimbusv1.Key]
	status       *statusWriter
	ready        *readiness
	metrics      *metrics
	// state is where Run is: runNotStarted, runRunning or runStopped.
	state     atomic.Int32
	opts      Options
	log       *slog.Logger
	closeOnce sync.Once
}

// kindCounts are the counts of one kind's reconciles.
type kindCounts struct {
	reconciles, errors atomic.Uint64
}

// Stats are counts of the HAL's work since New.
type Stats struct {
	// Kinds holds the counts of every kind that has a reconciler.
	Kinds map[nimbusv1.Kind]KindStats
	// StatusCommits is the number of store transactions that recorded statuses.
	StatusCommits uint64
	// StatusWrites is the number of statuses (and removals of statuses) they recorded.
	StatusWrites uint64
}

// KindStats are counts of one kind's work.
type KindStats struct {
	// Reconciles is the number of reconciles run, whatever their outcome.
	Reconciles uint64
	// Errors is the number of reconciles that failed and are retried.
	Errors uint64
	// KernelWrites is the number of kernel objects the kind's reconciler wrote, when it
	// counts them (KernelWriteCounter); 0 otherwise.
	KernelWrites uint64
}

// New builds a HAL.
func New(opts Options) (*HAL, error) {
	if opts.Store == nil {
		return nil, errors.New("hal: Options.Store is required")
	}
	if opts.Workers <= 0 {
		opts.Workers = 64
	}
	if opts.RateLimiter == nil {
		opts.RateLimiter = DefaultRateLimiter()
	}
	if opts.ResyncInterval == 0 {
		opts.ResyncInterval = 5 * time.Minute
	}
	if opts.ObserverBackoff.Min <= 0 {
		opts.ObserverBackoff.Min = 100 * time.Millisecond
	}
	if opts.ObserverBackoff.Max <= 0 {
		opts.ObserverBackoff.Max = 30 * time.Second
	}
	if opts.ObserverBackoff.Healthy <= 0 {
		opts.ObserverBackoff.Healthy = time.Minute
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.StatusBatch <= 0 {
		opts.StatusBatch = 1000
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Registerer == nil {
		opts.Registerer = prometheus.NewRegistry()
	}
	recs := map[nimbusv1.Kind]Reconciler{}
	counts := map[nimbusv1.Kind]*kindCounts{}
	dependents := map[nimbusv1.Kind][]Dependent{}
	for _, r := range opts.Reconcilers {
		if _, dup := recs[r.Kind()]; dup {
			return nil, fmt.Errorf("hal: two reconcilers for kind %s", r.Kind().Name())
		}
		recs[r.Kind()] = r
		counts[r.Kind()] = &kindCounts{}
		if d, ok := r.(Dependent); ok {
			for _, k := range d.DependsOn() {
				dependents[k] = append(dependents[k], d)
			}
		}
	}
	h := &HAL{
		store:       opts.Store,
		reconcilers: recs,
		dependents:  dependents,
		counts:      counts,
		queue:       newQueue(opts.RateLimiter, opts.Clock),
		ready:       newReadiness(),
		opts:        opts,
		log:         opts.Logger,
	}
	h.status = newStatusWriter(opts.Store, opts.StatusBatch, func() bool { return h.queue.Len() > 0 }, h.statusFailed)
	var err error
	if h.metrics, err = newMetrics(h, opts.Registerer); err != nil {
		h.queue.ShutDown()
		return nil, fmt.Errorf("hal: %w", err)
	}
	return h, nil
}

// Stats returns counts of the HAL's work so far. It is safe to call at any time, also
// while Run runs.
func (h *HAL) Stats() Stats {
	st := Stats{Kinds: make(map[nimbusv1.Kind]KindStats, len(h.reconcilers))}
	for kind, r := range h.reconcilers {
		c := h.counts[kind]
		ks := KindStats{Reconciles: c.reconciles.Load(), Errors: c.errors.Load()}
		if kw, ok := r.(KernelWriteCounter); ok {
			ks.KernelWrites = kw.KernelWrites()
		}
		st.Kinds[kind] = ks
	}
	st.StatusCommits, st.StatusWrites = h.status.counts()
	return st
}

// DefaultRateLimiter returns the retry policy New uses by default: the larger of a per-key
// exponential backoff from 50ms to 30s and an overall token bucket of 50 retries a second
// with a burst of 300.
func DefaultRateLimiter() workqueue.TypedRateLimiter[nimbusv1.Key] {
	return workqueue.NewTypedMaxOfRateLimiter(
		workqueue.NewTypedItemExponentialFailureRateLimiter[nimbusv1.Key](50*time.Millisecond, 30*time.Second),
		&workqueue.TypedBucketRateLimiter[nimbusv1.Key]{Limiter: rate.NewLimiter(rate.Limit(50), 300)},
	)
}

// Run reconciles until ctx ends or the store is closed, then stops every goroutine it
// started. It returns nil when ctx ended or the store was closed, and an error when
// watching the store's desired objects failed otherwise. A HAL runs once: after Run it is
// done, and closed.
func (h *HAL) Run(ctx context.Context) error {
	h.state.Store(runRunning)
	defer h.state.Store(runStopped)
	defer h.Close()
	feed, err := h.store.WatchDesired()
	if errors.Is(err, ErrClosed) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("watching desired objects: %w", err)
	}
	defer feed.Close()

	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	statusDone := make(chan struct{})
	go func() {
		defer close(statusDone)
		h.status.run()
	}()
	defer func() {
		// Whatever ends Run, the goroutines see ctx end and the queue shut down before Run
		// waits for them; then the status writer records what the workers reported last.
		cancel()
		h.queue.ShutDown()
		wg.Wait()
		h.status.stop()
		<-statusDone
	}()

	for range h.opts.Workers {
		wg.Go(func() {
			for h.processNext(ctx) {
			}
		})
	}
	for _, r := range h.reconcilers {
		if o, ok := r.(Observer); ok {
			wg.Go(func() { h.superviseObserver(ctx, r.Kind(), o) })
		}
	}
	wg.Go(func() { h.sweepAndResync(ctx) })

	for {
		ids, err := feed.Next(ctx)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, ErrClosed) {
				return nil
			}
			return fmt.Errorf("watching desired objects: %w", err)
		}
		// Readiness hears of a key before a worker can take it.
		h.ready.heard(ids)
		for _, id := range ids {
			h.queue.Add(id)
		}
		h.enqueueDependents(ids)
	}
}

// enqueueDependents queues the keys that depend on the keys ids.
func (h *HAL) enqueueDependents(ids []nimbusv1.Key) {
	if len(h.dependents) == 0 {
		return
	}
	for _, id := range ids {
		for _, d := range h.dependents[id.Kind] {
			for _, dep := range d.DependentsOf(id) {
				h.queue.Add(dep)
			}
		}
	}
}

// programmedNow records whether the last reconcile of id, of a kind that has dependents,
// left it PROGRAMMED, and when it newly did, queues its dependents.
func (h *HAL) programmedNow(id nimbusv1.Key, programmed bool) {
	if len(h.dependents[id.Kind]) == 0 {
		return
	}
	h.programmedMu.Lock()
	was := h.programmed.Has(id)
	if programmed {
		h.programmed.Set(id, struct{}{})
	} else {
		h.programmed.Delete(id)
	}
	h.programmedMu.Unlock()
	if programmed && !was {
		h.enqueueDependents([]nimbusv1.Key{id})
	}
}

// Close stops the work queue and unregisters the HAL's metrics. It is safe to call twice.
func (h *HAL) Close() error {
	h.closeOnce.Do(func() {
		h.queue.ShutDown()
		h.metrics.unregister()
	})
	return nil
}

// sweepAndResync runs the sweepers once the desired table is complete, and then every
// resync interval sweeps again and requeues every key.
func (h *HAL) sweepAndResync(ctx context.Context) {
	select {
	case <-ctx.Done():
		return
	case <-h.store.Synced():
	}
	// The table is complete: every key in it is one readiness waits for. One pass, once.
	for _, id := range h.ready.complete(h.store.Keys(nimbusv1.Kind_KIND_UNSPECIFIED)) {
		h.queue.Add(id)
	}
	h.sweep(ctx)
	if h.opts.ResyncInterval < 0 {
		return
	}
	t := h.opts.Clock.NewTicker(h.opts.ResyncInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
		}
		h.log.Debug("resync")
		h.sweep(ctx)
		h.enqueueKind(nimbusv1.Kind_KIND_UNSPECIFIED)
	}
}

func (h *HAL) sweep(ctx context.Context) {
	for _, r := range h.reconcilers {
		if s, ok := r.(Sweeper); ok {
			if err := s.Sweep(ctx, h.queue.Add); err != nil && ctx.Err() == nil {
				h.log.Warn("sweeping stale kernel state", "kind", r.Kind().Name(), "err", err)
			}
		}
	}
}

// enqueueKind queues every desired key of the kind; KIND_UNSPECIFIED queues all.
func (h *HAL) enqueueKind(kind nimbusv1.Kind) {
	for _, id := range h.store.Keys(kind) {
		h.queue.Add(id)
	}
}

// superviseObserver runs the observer until ctx ends, starting it again with backoff
// whenever it fails. After a restart, once the observer is subscribed, every object of
// its kind is reconciled, since changes may have been missed while it was down.
func (h *HAL) superviseObserver(ctx context.Context, kind nimbusv1.Kind, o Observer) {
	b := h.opts.ObserverBackoff
	delay := b.Min
	for restarts := 0; ; restarts++ {
		start := h.opts.Clock.Now()
		subscribed := func() {}
		if restarts > 0 {
			subscribed = func() { h.enqueueKind(kind) }
		}
		err := o.Observe(ctx, h.queue.Add, subscribed)
		if ctx.Err() != nil {
			return
		}
		if h.opts.Clock.Since(start) >= b.Healthy {
			delay = b.Min
		}
		h.log.Error("observer stopped; restarting it", "kind", kind.Name(), "err", err, "in", delay)
		t := h.opts.Clock.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C():
		}
		delay = min(2*delay, b.Max)
	}
}

// processNext reconciles one key from the queue; it returns false once the queue is shut down.
func (h *HAL) processNext(ctx context.Context) bool {
	id, shutdown := h.queue.Get()
	if shutdown {
		return false
	}
	// The status writer waits for full batches only while work is queued: tell it when
	// the queue shrinks, and when a reconcile ends.
	h.status.poke()
	defer h.status.poke()
	defer h.queue.Done(id)
	if ctx.Err() != nil {
		// The queue still hands out what it holds after ShutDown: leave it to the next run.
		return true
	}
	if err := h.reconcile(ctx, id); err != nil {
		if ctx.Err() != nil {
			return true
		}
		if IsPending(err) {
			// What the object waits for enqueues it when it comes; no retries meanwhile.
			h.log.Debug("reconcile pending", "key", id, "reason", err)
			h.queue.Forget(id)
			return true
		}
		h.log.Warn("reconcile failed; will retry", "key", id, "err", err, "retries", h.queue.NumRequeues(id))
		h.metrics.retries.Inc()
		h.queue.AddRateLimited(id)
		return true
	}
	h.queue.Forget(id)
	return true
}

// reconcile programs one key and hands its status to the status writer. A returned error
// means retry.
func (h *HAL) reconcile(ctx context.Context, id nimbusv1.Key) error {
	key := id.Proto()
	obj, present := h.store.Get(key)
	r, ok := h.reconcilers[id.Kind]
	if !ok {
		h.ready.reconciled(id, present)
		if !present {
			h.status.put(StatusUpdate{Key: id})
			return nil
		}
		h.status.put(StatusUpdate{Key: id, Status: &nimbusv1.NodeStatus{
			ObservedGeneration: obj.GetMeta().GetGeneration(),
			Phase:              nimbusv1.Phase_PHASE_PENDING,
			Reason:             ReasonUnsupported,
			Message:            "this agent does not program " + key.GetKind().Name() + " objects yet",
			UpdateTime:         timestamppb.New(h.opts.Clock.Now()),
		}})
		return nil
	}
	counts := h.counts[key.GetKind()]
	counts.reconciles.Add(1)
	start := h.opts.Clock.Now()
	op, rerr := r.Reconcile(ctx, key, obj)
	if rerr != nil && ctx.Err() != nil {
		return rerr // stopped, not failed: the status stays as it was
	}
	h.metrics.kinds[key.GetKind()].Observe(h.opts.Clock.Since(start).Seconds())
	h.ready.reconciled(id, present)
	if rerr != nil {
		counts.errors.Add(1)
	}
	if !present {
		if rerr != nil {
			return fmt.Errorf("removing %s: %w", id, rerr)
		}
		h.log.Debug("removed", "key", id)
		h.programmedNow(id, false)
		h.status.put(StatusUpdate{Key: id})
		return nil
	}
	st := &nimbusv1.NodeStatus{
		ObservedGeneration: obj.GetMeta().GetGeneration(),
		Phase:              nimbusv1.Phase_PHASE_PROGRAMMED,
		OperationalData:    op,
		Operational:        op.Map(),
		UpdateTime:         timestamppb.New(h.opts.Clock.Now()),
	}
	if rerr != nil {
		st.Phase = nimbusv1.Phase_PHASE_FAILED
		if IsPending(rerr) {
			st.Phase = nimbusv1.Phase_PHASE_PENDING
		}
		st.Reason = ReasonOf(rerr)
		st.Message = rerr.Error()
		st.Terminal = st.Phase == nimbusv1.Phase_PHASE_FAILED && IsTerminal(rerr)
	}
	h.status.put(StatusUpdate{Key: id, Status: st})
	h.programmedNow(id, rerr == nil)
	if rerr != nil {
		return rerr
	}
	h.log.Debug("programmed", "key", id, "generation", st.ObservedGeneration)
	return nil
}

// statusFailed is called with the keys whose statuses the store could not record: they
// are reconciled again, after a backoff, which reports their status anew.
func (h *HAL) statusFailed(ids []nimbusv1.Key, err error) {
	if errors.Is(err, ErrClosed) {
		return // the store is closing, and Run with it
	}
	h.log.Warn("recording statuses failed; reconciling their objects again", "objects", len(ids), "err", err)
	h.metrics.retries.Add(float64(len(ids)))
	for _, id := range ids {
		h.queue.AddRateLimited(id)
	}
}
