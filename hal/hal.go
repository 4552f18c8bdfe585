package hal

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

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
	// ends. It returns kind-specific operational data for the object's status; an error
	// leaves the object FAILED, with the reason of an *Error (ReasonFailed otherwise), and
	// is retried with backoff.
	Reconcile(ctx context.Context, key *nimbusv1.ObjectKey, obj *nimbusv1.Object) (map[string]string, error)
}

// Sweeper is implemented by reconcilers that can find kernel state they created for
// objects that no longer exist (after a restart, say) and remove it.
type Sweeper interface {
	// Sweep removes kernel state of the reconciler's kind that no desired object owns. The
	// HAL calls it once the desired table is complete and then every resync interval.
	Sweep(ctx context.Context) error
}

// Observer is implemented by reconcilers that watch the kernel for drift.
type Observer interface {
	// Observe watches the kernel until ctx ends. It calls subscribed once it sees every
	// change, then enqueue with the key ID of every object whose kernel state changed
	// behind the HAL's back. It never writes the kernel. When it returns an error, changes
	// may have been missed: the HAL starts it again after a backoff and, once it is
	// subscribed again, reconciles every object of its kind.
	Observe(ctx context.Context, enqueue func(keyID string), subscribed func()) error
}

// Store is what the HAL needs of the local object store: the desired objects, a feed of
// their changes, whether the desired table is complete, and the status table it alone
// writes. Delphi adapts a delphi store to it.
type Store interface {
	// Get returns the desired object with the key.
	Get(key *nimbusv1.ObjectKey) (*nimbusv1.Object, bool)
	// Keys returns the key IDs of the desired objects of one kind; KIND_UNSPECIFIED
	// returns all.
	Keys(kind nimbusv1.Kind) []string
	// WatchDesired returns a feed of the key IDs of desired objects that change. Its first
	// Next returns every key present.
	WatchDesired() (Feed, error)
	// Synced returns a channel that is closed once the desired table is complete: from
	// then on an object missing from it is meant to be absent.
	Synced() <-chan struct{}
	// SetStatus records the status of the object with the key.
	SetStatus(key *nimbusv1.ObjectKey, st *nimbusv1.NodeStatus) error
	// DeleteStatus removes the status of the object with the key; an absent one is no
	// error.
	DeleteStatus(key *nimbusv1.ObjectKey) error
}

// Feed hands out the key IDs of changed objects.
type Feed interface {
	// Next blocks until keys have changed and returns them, each once however often it
	// changed. It returns ctx's error when ctx ends, and ErrClosed (or an error wrapping
	// it) once the store is closed.
	Next(ctx context.Context) ([]string, error)
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
	// Workers is the number of keys reconciled at once. Default: 2.
	Workers int
	// RateLimiter decides how long a failed key waits before its retry. Default:
	// DefaultRateLimiter().
	RateLimiter workqueue.TypedRateLimiter[string]
	// ResyncInterval is how often sweepers run again and every key is reconciled again, as
	// a safety net for drift no observer saw. Default: 5m; negative disables.
	ResyncInterval time.Duration
	// ObserverBackoff bounds the delay before a failed observer is started again: it
	// starts at Min and doubles with every failure in a row up to Max. An observer that
	// ran for Healthy before it failed starts over at Min. Defaults: 100ms, 30s,
	// 1m.
	ObserverBackoff struct{ Min, Max, Healthy time.Duration }
	// Clock tells the time for status updates and drives the retry delays, resyncs and
	// observer restarts; tests inject a fake one. (The default rate limiter's overall token
	// bucket keeps real time.) Default: the real clock.
	Clock clock.WithTicker
	// Logger receives the HAL's logs. Default: slog.Default().
	Logger *slog.Logger
}

// HAL reconciles the store's desired objects into the kernel.
type HAL struct {
	store       Store
	reconcilers map[nimbusv1.Kind]Reconciler
	queue       workqueue.TypedRateLimitingInterface[string]
	opts        Options
	log         *slog.Logger
	closeOnce   sync.Once
}

// New builds a HAL.
func New(opts Options) (*HAL, error) {
	if opts.Store == nil {
		return nil, errors.New("hal: Options.Store is required")
	}
	if opts.Workers <= 0 {
		opts.Workers = 2
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
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	recs := map[nimbusv1.Kind]Reconciler{}
	for _, r := range opts.Reconcilers {
		if _, dup := recs[r.Kind()]; dup {
			return nil, fmt.Errorf("hal: two reconcilers for kind %s", r.Kind().Name())
		}
		recs[r.Kind()] = r
	}
	return &HAL{
		store:       opts.Store,
		reconcilers: recs,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(opts.RateLimiter,
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "hal", Clock: opts.Clock}),
		opts: opts,
		log:  opts.Logger,
	}, nil
}

// DefaultRateLimiter returns the retry policy New uses by default: the larger of a per-key
// exponential backoff from 50ms to 30s and an overall token bucket of 50 retries a second
// with a burst of 300.
func DefaultRateLimiter() workqueue.TypedRateLimiter[string] {
	return workqueue.NewTypedMaxOfRateLimiter(
		workqueue.NewTypedItemExponentialFailureRateLimiter[string](50*time.Millisecond, 30*time.Second),
		&workqueue.TypedBucketRateLimiter[string]{Limiter: rate.NewLimiter(rate.Limit(50), 300)},
	)
}

// Run reconciles until ctx ends or the store is closed, then stops every goroutine it
// started and returns nil. A HAL runs once: after Run it is done.
func (h *HAL) Run(ctx context.Context) error {
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
	// Whatever ends Run, the goroutines see ctx end and the queue shut down before Run
	// waits for them.
	defer wg.Wait()
	defer h.queue.ShutDown()
	defer cancel()

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
		for _, id := range ids {
			h.queue.Add(id)
		}
	}
}

// Close stops the work queue. It is safe to call twice.
func (h *HAL) Close() error {
	h.closeOnce.Do(h.queue.ShutDown)
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
			if err := s.Sweep(ctx); err != nil && ctx.Err() == nil {
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
	defer h.queue.Done(id)
	if ctx.Err() != nil {
		// The queue still hands out what it holds after ShutDown: leave it to the next run.
		return true
	}
	if err := h.reconcile(ctx, id); err != nil {
		if ctx.Err() != nil {
			return true
		}
		h.log.Warn("reconcile failed; will retry", "key", id, "err", err, "retries", h.queue.NumRequeues(id))
		h.queue.AddRateLimited(id)
		return true
	}
	h.queue.Forget(id)
	return true
}

// reconcile programs one key and records its status. A returned error means retry.
func (h *HAL) reconcile(ctx context.Context, id string) error {
	key, err := nimbusv1.ParseKeyID(id)
	if err != nil {
		h.log.Error("dropping malformed key", "key", id, "err", err)
		return nil
	}
	obj, present := h.store.Get(key)
	r, ok := h.reconcilers[key.GetKind()]
	if !ok {
		if !present {
			return h.store.DeleteStatus(key)
		}
		return h.store.SetStatus(key, &nimbusv1.NodeStatus{
			ObservedGeneration: obj.GetMeta().GetGeneration(),
			Phase:              nimbusv1.Phase_PHASE_PENDING,
			Reason:             ReasonUnsupported,
			Message:            "this agent does not program " + key.GetKind().Name() + " objects yet",
			UpdateTime:         timestamppb.New(h.opts.Clock.Now()),
		})
	}
	op, rerr := r.Reconcile(ctx, key, obj)
	if rerr != nil && ctx.Err() != nil {
		return rerr // stopped, not failed: the status stays as it was
	}
	if !present {
		if rerr != nil {
			return fmt.Errorf("removing %s: %w", id, rerr)
		}
		h.log.Info("removed", "key", id)
		return h.store.DeleteStatus(key)
	}
	st := &nimbusv1.NodeStatus{
		ObservedGeneration: obj.GetMeta().GetGeneration(),
		Phase:              nimbusv1.Phase_PHASE_PROGRAMMED,
		Operational:        op,
		UpdateTime:         timestamppb.New(h.opts.Clock.Now()),
	}
	if rerr != nil {
		st.Phase = nimbusv1.Phase_PHASE_FAILED
		st.Reason = ReasonOf(rerr)
		st.Message = rerr.Error()
	}
	if err := h.store.SetStatus(key, st); err != nil {
		return fmt.Errorf("recording status of %s: %w", id, err)
	}
	if rerr != nil {
		return rerr
	}
	h.log.Debug("programmed", "key", id, "generation", st.ObservedGeneration)
	return nil
}
