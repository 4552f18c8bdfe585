package agent

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	"github.com/naplesnet/naples/nimbusclient"
	delphiv1 "github.com/naplesnet/naples/proto/delphi/v1"
	flowsv1 "github.com/naplesnet/naples/proto/nimbus/flows/v1"
)

// Defaults of FlowTapOptions.
const (
	// DefaultFlowTapSubscriptions is the default of FlowTapOptions.Subscriptions.
	DefaultFlowTapSubscriptions = 16
	// DefaultFlowTapBatch is the default of FlowTapOptions.Batch.
	DefaultFlowTapBatch = flowBatch
)

// FlowTapOptions configures a FlowTap.
type FlowTapOptions struct {
	// Log is the flow log the subscriptions are served from. Default: nil, no flow log:
	// every subscription is refused, saying so.
	Log *FlowLog
	// Subscriptions bounds the subscriptions served at once; one more is refused, and its
	// observer told why. Default: DefaultFlowTapSubscriptions (16).
	Subscriptions int
	// Batch bounds the records of one message. Default: DefaultFlowTapBatch (256).
	Batch int
	// Logger receives the tap's logs. Default: slog.Default().
	Logger *slog.Logger
	// Registerer takes the tap's metrics. Default: nil, none are registered.
	Registerer prometheus.Registerer
}

// FlowTap serves the subscriptions nimbus sends on the agent's flow tap from the flow
// log: each subscription reads the log from where it is, filters at the agent with the
// subscription's filters (so only matching records leave the host) and sends them in
// batches. Readers of the log never hold up the collector that fills it: a subscription
// that nimbus takes slower than records come falls behind the log's ring, and the records
// it let go of are counted and sent as its lost_agent.
type FlowTap struct {
	// log is the flow log; nil when the agent keeps none, and every subscription is
	// refused with errNoFlows. Set before the tap is served, never changed after.
	log *FlowLog
	// maxSubs bounds the subscriptions served at once, batch the records of one message.
	maxSubs, batch int
	logger         *slog.Logger

	subscriptions prometheus.Gauge
	refused       prometheus.Counter
	sent          prometheus.Counter
	lost          prometheus.Counter
}

var _ nimbusclient.FlowTapper = (*FlowTap)(nil)

// NewFlowTap returns a tap, its metrics registered; nimbusclient.Options.FlowTap takes it.
func NewFlowTap(opts FlowTapOptions) (*FlowTap, error) {
	if opts.Subscriptions < 0 || opts.Batch < 0 {
		return nil, fmt.Errorf("flow tap of %d subscriptions and batches of %d records: must not be negative", opts.Subscriptions, opts.Batch)
	}
	const ns, sub = "naples", "agent"
	t := &FlowTap{
		log:     opts.Log,
		maxSubs: cmp.Or(opts.Subscriptions, DefaultFlowTapSubscriptions),
		batch:   cmp.Or(opts.Batch, DefaultFlowTapBatch),
		logger:  cmp.Or(opts.Logger, slog.Default()),
		subscriptions: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "flow_tap_subscriptions",
			Help: "Subscriptions of nimbus's flow observers the agent serves on its flow tap, at most --flow-tap-subscriptions.",
		}),
		refused: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "flow_tap_subscriptions_refused_total",
			Help: "Subscriptions the flow tap refused: --flow-tap-subscriptions were served, or the filter was wrong.",
		}),
		sent: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "flow_tap_records_sent_total",
			Help: "Flow records sent to nimbus on the flow tap, after each subscription's filter: one per subscription a record matched.",
		}),
		lost: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "flow_tap_records_lost_total",
			Help: "Flow records a subscription let go of before it sent them (the flow log's ring went round first, as when nimbus takes them slower than they come), reported as lost_agent.",
		}),
	}
	if opts.Registerer != nil {
		for _, c := range []prometheus.Collector{t.subscriptions, t.refused, t.sent, t.lost} {
			if err := opts.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("registering the flow tap's metrics: %w", err)
			}
		}
	}
	return t, nil
}

// tapStream is the client side of a flow tap.
type tapStream = grpc.BidiStreamingClient[flowsv1.FlowTapUp, flowsv1.FlowTapDown]

// ServeFlowTap serves the subscriptions nimbus sends on the stream until it fails or ctx
// ends; every subscription ends with it.
func (t *FlowTap) ServeFlowTap(ctx context.Context, stream tapStream) error {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	// mu guards subs and serializes the sends.
	var mu sync.Mutex
	subs := map[uint64]context.CancelFunc{}
	defer func() {
		cancel()
		wg.Wait()
	}()
	send := func(m *flowsv1.FlowTapUp) error {
		mu.Lock()
		defer mu.Unlock()
		return stream.Send(m)
	}
	for {
		down, err := stream.Recv()
		if err != nil {
			return err
		}
		id := down.GetSubscription()
		mu.Lock()
		end, known := subs[id]
		switch {
		case down.GetCancel():
			if known {
				end()
				delete(subs, id)
			}
			mu.Unlock()
			continue
		case known:
			mu.Unlock()
			continue
		case len(subs) >= t.maxSubs:
			mu.Unlock()
			t.refused.Inc()
			msg := fmt.Sprintf("the agent serves %d flow subscriptions, its most (naples-agent --flow-tap-subscriptions)", t.maxSubs)
			if err := send(&flowsv1.FlowTapUp{Subscription: id, Error: msg}); err != nil {
				return err
			}
			continue
		}
		subCtx, end := context.WithCancel(ctx)
		subs[id] = end
		mu.Unlock()
		t.subscriptions.Inc()
		wg.Go(func() {
			defer t.subscriptions.Dec()
			err := t.serve(subCtx, id, down.GetFilter(), send)
			mu.Lock()
			if subs[id] != nil {
				subs[id]()
				delete(subs, id)
			}
			mu.Unlock()
			if err != nil && subCtx.Err() == nil {
				t.logger.Debug("flow subscription ended", "subscription", id, "error", err)
			}
		})
	}
}

// serve serves one subscription: the recent records its filter selects when it asks for
// them, then, when it follows, each new one as it comes, until ctx ends.
func (t *FlowTap) serve(ctx context.Context, id uint64, req *delphiv1.FlowsRequest, send func(*flowsv1.FlowTapUp) error) error {
	refuse := func(err error) error {
		t.refused.Inc()
		return send(&flowsv1.FlowTapUp{Subscription: id, Error: status.Convert(err).Message()})
	}
	if t.log == nil {
		return refuse(errNoFlows)
	}
	filter, err := newFlowFilter(req, time.Now())
	if err != nil {
		return refuse(err)
	}
	c := &flowCursor{log: t.log, filter: filter, batch: t.batch}
	if req.GetFollow() && req.GetSince() == nil && req.GetLimit() == 0 {
		c.seq = t.log.head() // from now on
	}
	var sentLost, sentAgent, sentSuppressed uint64
	// flush sends the records, in batches, with the counts; at least one message when
	// always is set.
	flush := func(flows []*delphiv1.Flow, always, done bool) error {
		if c.lostAgent > sentAgent {
			t.lost.Add(float64(c.lostAgent - sentAgent))
		}
		changed := c.lost != sentLost || c.lostAgent != sentAgent || c.suppressed != sentSuppressed
		for first := true; len(flows) > 0 || (first && (always || changed)); first = false {
			n := min(len(flows), t.batch)
			m := &flowsv1.FlowTapUp{Subscription: id, Flows: flows[:n], LostDatapath: c.lost, LostAgent: c.lostAgent,
				Suppressed: c.suppressed, Done: done && n == len(flows)}
			if err := send(m); err != nil {
				return err
			}
			t.sent.Add(float64(n))
			flows = flows[n:]
			sentLost, sentAgent, sentSuppressed = c.lost, c.lostAgent, c.suppressed
		}
		return nil
	}
	return c.follow(ctx, nil, req, func(flows []*delphiv1.Flow, first bool) error {
		end := first && !req.GetFollow()
		return flush(flows, end, end)
	})
}

// follow emits the recent records the cursor selects, the latest req.Limit of them
// (first set), then, when req follows, the records that come after, as they come (first
// unset), until ctx ends or done is closed (nil: never).
func (c *flowCursor) follow(ctx context.Context, done <-chan struct{}, req *delphiv1.FlowsRequest, emit func(flows []*delphiv1.Flow, first bool) error) error {
	recent := c.read()
	if n := int(req.GetLimit()); n > 0 && len(recent) > n {
		recent = recent[len(recent)-n:]
	}
	if err := emit(recent, true); err != nil || !req.GetFollow() {
		return err
	}
	for {
		if !c.more {
			select {
			case <-ctx.Done():
				return nil
			case <-done:
				return nil
			case <-c.added:
			}
		} else if ctx.Err() != nil {
			return nil
		}
		if err := emit(c.read(), false); err != nil {
			return err
		}
	}
}

// flowCursor reads a flow log from a sequence number on, through a filter.
type flowCursor struct {
	log    *FlowLog
	filter *flowFilter
	batch  int
	// seq is the sequence number of the next record to read.
	seq uint64
	// lost is the datapath's count, lostAgent the records the log let go of before they
	// were read, and suppressed the datapath's count of records over the endpoints'
	// budgets, as of the last read; added is closed when records are added after it.
	lost, lostAgent, suppressed uint64
	added                       <-chan struct{}
	// more is set when the last read stopped before the last record.
	more bool
}

// read returns the records selected from seq on, reading at most the log's size of them,
// so that a follower of a flood still sends what it read.
func (c *flowCursor) read() []*delphiv1.Flow {
	var out []*delphiv1.Flow
	c.more = false
	for n := 0; ; {
		if n >= len(c.log.ring) {
			c.more = true
			return out
		}
		batch, next, skipped, lost, added := c.log.from(c.seq, c.batch)
		c.lostAgent += skipped
		c.lost, c.added, c.seq = lost, added, next
		c.suppressed = c.log.suppressedCount()
		n += len(batch)
		for _, f := range batch {
			if c.filter.matches(f) {
				out = append(out, f)
			}
		}
		if len(batch) < c.batch {
			return out
		}
	}
}

// head returns the sequence number of the next record the log will take.
func (l *FlowLog) head() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.next
}
