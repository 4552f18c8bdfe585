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

	"github.com/naplesnet/naples/delphi"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// Reconciler makes the kernel match the desired state of one kind.
type Reconciler interface {
	// Kind is the kind of object the reconciler programs.
	Kind() nimbusv1.Kind
	// Reconcile makes the kernel match obj, the desired state of key, or removes what it
	// programmed for key when obj is nil. It must be idempotent. It returns kind-specific
	// operational data for the object's status; an error leaves the object FAILED and is
	// retried with backoff. An error that implements Reason() string names its reason.
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
	// Observe watches the kernel until ctx ends and calls enqueue with the key ID of every
	// object whose kernel state changed behind the HAL's back. It never writes the kernel.
	Observe(ctx context.Context, enqueue func(keyID string)) error
}

// ReasonUnsupported is the status reason of objects whose kind no reconciler programs.
const ReasonUnsupported = "Unsupported"

// reasonFailed is the status reason of a failed reconcile whose error names no reason.
const reasonFailed = "ProgrammingFailed"

// Store is what the HAL needs of delphi.
type Store interface {
	Get(key *nimbusv1.ObjectKey) (*nimbusv1.Object, bool)
	Subscribe(opts delphi.SubscribeOptions) (*delphi.Subscription, error)
	Synced() <-chan struct{}
	ClaimStatus() (*delphi.StatusWriter, error)
}

var _ Store = (*delphi.Store)(nil)

// Options configures a HAL.
type Options struct {
	// Store is the delphi store to read desired objects from and write status to. Required.
	Store Store
	// Reconcilers program one kind each. Objects of other kinds are reported PENDING with
	// reason Unsupported.
	Reconcilers []Reconciler
	// Workers is the number of keys reconciled at once. Default: 2.
	Workers int
	// RateLimiter decides how long a failed key waits before its retry. Default: the
	// larger of a per-key exponential backoff from 50ms to 30s and an overall token bucket
	// of 50 retries a second with a burst of 300.
	RateLimiter workqueue.TypedRateLimiter[string]
	// ResyncInterval is how often every key is reconciled again and sweepers run, as a
	// safety net for drift no observer saw. Default: 5m; negative disables.
	ResyncInterval time.Duration
	// Logger receives the HAL's logs. Default: slog.Default().
	Logger *slog.Logger
	// Now gives the time for status updates. Default: time.Now.
	Now func() time.Time
}

// HAL reconciles delphi's desired objects into the kernel.
type HAL struct {
	store       Store
	status      *delphi.StatusWriter
	reconcilers map[nimbusv1.Kind]Reconciler
	queue       workqueue.TypedRateLimitingInterface[string]
	opts        Options
	log         *slog.Logger
	closeOnce   sync.Once
}

// New builds a HAL and claims delphi's status writer.
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
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	status, err := opts.Store.ClaimStatus()
	if err != nil {
		return nil, err
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
		status:      status,
		reconcilers: recs,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(opts.RateLimiter,
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "hal"}),
		opts: opts,
		log:  opts.Logger,
	}, nil
}

// DefaultRateLimiter returns the retry policy New uses by default.
func DefaultRateLimiter() workqueue.TypedRateLimiter[string] {
	return workqueue.NewTypedMaxOfRateLimiter(
		workqueue.NewTypedItemExponentialFailureRateLimiter[string](50*time.Millisecond, 30*time.Second),
		&workqueue.TypedBucketRateLimiter[string]{Limiter: rate.NewLimiter(rate.Limit(50), 300)},
	)
}

// Run reconciles until ctx ends, then stops every goroutine it started and returns nil.
func (h *HAL) Run(ctx context.Context) error {
	defer h.Close()
	sub, err := h.store.Subscribe(delphi.SubscribeOptions{Tables: []delphi.Table{delphi.TableDesired}})
	if err != nil {
		return fmt.Errorf("subscribing to desired objects: %w", err)
	}
	defer sub.Close()

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer h.queue.ShutDown()

	for range h.opts.Workers {
		wg.Go(func() {
			for h.processNext(ctx) {
			}
		})
	}
	for _, r := range h.reconcilers {
		if o, ok := r.(Observer); ok {
			wg.Go(func() {
				if err := o.Observe(ctx, h.queue.Add); err != nil && ctx.Err() == nil {
					h.log.Error("observer stopped", "kind", r.Kind().Name(), "err", err)
				}
			})
		}
	}
	wg.Go(func() { h.sweepAndResync(ctx) })

	for {
		ids, err := sub.Next(ctx)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, delphi.ErrClosed) {
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
	t := time.NewTicker(h.opts.ResyncInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		h.sweep(ctx)
		sub, err := h.store.Subscribe(delphi.SubscribeOptions{Tables: []delphi.Table{delphi.TableDesired}})
		if err != nil {
			return
		}
		ids, _ := sub.Next(ctx)
		sub.Close()
		for _, id := range ids {
			h.queue.Add(id)
		}
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

// processNext reconciles one key from the queue; it returns false once the queue is shut down.
func (h *HAL) processNext(ctx context.Context) bool {
	id, shutdown := h.queue.Get()
	if shutdown {
		return false
	}
	defer h.queue.Done(id)
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
			return h.status.Delete(key)
		}
		return h.status.Set(key, &nimbusv1.NodeStatus{
			ObservedGeneration: obj.GetMeta().GetGeneration(),
			Phase:              nimbusv1.Phase_PHASE_PENDING,
			Reason:             ReasonUnsupported,
			Message:            "this agent does not program " + key.GetKind().Name() + " objects yet",
			UpdateTime:         timestamppb.New(h.opts.Now()),
		})
	}
	op, rerr := r.Reconcile(ctx, key, obj)
	if !present {
		if rerr != nil {
			return fmt.Errorf("removing %s: %w", id, rerr)
		}
		h.log.Info("removed", "key", id)
		return h.status.Delete(key)
	}
	st := &nimbusv1.NodeStatus{
		ObservedGeneration: obj.GetMeta().GetGeneration(),
		Phase:              nimbusv1.Phase_PHASE_PROGRAMMED,
		Operational:        op,
		UpdateTime:         timestamppb.New(h.opts.Now()),
	}
	if rerr != nil {
		st.Phase = nimbusv1.Phase_PHASE_FAILED
		st.Reason = reasonFailed
		var re interface{ Reason() string }
		if errors.As(rerr, &re) {
			st.Reason = re.Reason()
		}
		st.Message = rerr.Error()
	}
	if err := h.status.Set(key, st); err != nil {
		return fmt.Errorf("recording status of %s: %w", id, err)
	}
	if rerr != nil {
		return rerr
	}
	h.log.Debug("programmed", "key", id, "generation", st.ObservedGeneration)
	return nil
}
