package agent

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"

	"github.com/naplesnet/naples/hal"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// The defaults of FlowExportOptions, and of the agent's flags that set them.
const (
	// DefaultFlowExportMaxPolicies is the default of FlowExportOptions.MaxPolicies
	// (--flow-export-max-policies).
	DefaultFlowExportMaxPolicies = 16
	// DefaultFlowExportMaxConnections is the default of FlowExportOptions.MaxConnections
	// (--flow-export-max-connections).
	DefaultFlowExportMaxConnections = 65536
	// defaultFlowExportStats is the default of FlowExportOptions.StatsInterval.
	defaultFlowExportStats = 10 * time.Second
	// defaultFlowExportStopWait is the default of FlowExportOptions.StopWait.
	defaultFlowExportStopWait = 5 * time.Second
)

// The reasons of the statuses of FlowExportPolicy objects.
const (
	// ReasonExportFailed: a target, or the JSON file, did not take what was sent lately.
	ReasonExportFailed = "ExportFailed"
	// ReasonNoFlowRecords: the agent has no flow records to export (no firewall, or flow
	// records off).
	ReasonNoFlowRecords = "NoFlowRecords"
	// ReasonNoExportDir: a policy writes JSON lines to a file, and the agent has no
	// --flow-export-dir to put it in.
	ReasonNoExportDir = "NoExportDir"
	// ReasonLimitExceeded: the node runs as many policies as --flow-export-max-policies
	// allows already.
	ReasonLimitExceeded = "LimitExceeded"
)

// FlowExportConfig is the agent's configuration of its flow exporters; see
// FlowExportOptions for what each field does.
type FlowExportConfig struct {
	// Dir is FlowExportOptions.Dir (--flow-export-dir). Default: empty.
	Dir string
	// MaxPolicies is FlowExportOptions.MaxPolicies (--flow-export-max-policies).
	// Default: DefaultFlowExportMaxPolicies.
	MaxPolicies int
	// MaxConnections is FlowExportOptions.MaxConnections
	// (--flow-export-max-connections). Default: DefaultFlowExportMaxConnections.
	MaxConnections int
	// MessageBytes is FlowExportOptions.MessageBytes (--flow-export-message-bytes).
	// Default: ipfix.DefaultMessageBytes.
	MessageBytes int
	// StatsInterval is FlowExportOptions.StatsInterval. Default: 10s.
	StatsInterval time.Duration
}

// FlowExportStore is what the flow exporters read of delphi: the Endpoints, whose
// security groups a policy may select them by.
type FlowExportStore interface {
	// Get returns the desired object with the key.
	Get(key *nimbusv1.ObjectKey) (*nimbusv1.Object, bool)
}

// FlowExportOptions configures a FlowExportReconciler.
type FlowExportOptions struct {
	// Store holds the Endpoints a policy selects by security group. Required.
	Store FlowExportStore
	// Flows is the agent's flow log, which every exporter follows. Default: nil, the
	// agent has no flow records and every policy is FAILED with ReasonNoFlowRecords.
	Flows *FlowLog
	// Node is this host's node name; the IPFIX observation domain is derived from it.
	Node string
	// Dir is the directory under which format "json" writes its files (spec.file).
	// Default: empty, a policy with a file is FAILED with ReasonNoExportDir.
	Dir string
	// Stdout is where format "json" without a file writes. Default: os.Stdout.
	Stdout io.Writer
	// MaxPolicies bounds the policies the node exports for at once; one more is FAILED
	// with ReasonLimitExceeded until one of those running goes. Default:
	// DefaultFlowExportMaxPolicies.
	MaxPolicies int
	// MaxConnections bounds the connections one exporter tracks for their delta counts;
	// a connection beyond is exported only when it ends, with its totals. Default:
	// DefaultFlowExportMaxConnections.
	MaxConnections int
	// MessageBytes bounds an IPFIX message (ipfix.MinMessageBytes to
	// ipfix.MaxMessageBytes). Default: ipfix.DefaultMessageBytes.
	MessageBytes int
	// StatsInterval is how often the statuses of the policies are refreshed with their
	// exporters' counts; a target's failing or recovering refreshes its policy's status
	// at once. Default: 10s.
	StatsInterval time.Duration
	// StopWait bounds how long stopping an exporter (its policy changed or went, or
	// Close) waits for its goroutine, which a write to a standard output that nobody
	// reads blocks; one that does not end then ends when its write returns. Default: 5s.
	StopWait time.Duration
	// Logger receives the exporters' logs. Default: slog.Default().
	Logger *slog.Logger
	// Registerer takes the exporters' metrics. Default: none.
	Registerer prometheus.Registerer
}

// FlowExportReconciler runs the exporters of the FlowExportPolicy objects of the node:
// one goroutine each, which follows the flow log and sends what its policy selects to
// the policy's targets, so that neither the firewall nor the agent ever waits for a
// collector. A reconcile starts the exporter of an object, replaces it when its spec
// changed, stops it when the object is gone, and reports its counts and the errors of
// its targets in the object's status (nimbusv1.FlowExportOperational).
type FlowExportReconciler struct {
	opts    FlowExportOptions
	log     *slog.Logger
	metrics *flowExportMetrics
	// ctx is the exporters' context, which Close cancels.
	ctx    context.Context
	cancel context.CancelFunc

	// mu guards exporters, enqueue and closed.
	mu        sync.Mutex
	exporters map[nimbusv1.Key]*flowExporter
	// enqueue is the running observer's enqueue, nil while none runs.
	enqueue func(nimbusv1.Key)
	closed  bool
}

var (
	_ hal.Reconciler = (*FlowExportReconciler)(nil)
	_ hal.Observer   = (*FlowExportReconciler)(nil)
)

// flowExportMetrics are the exporters' metrics, by policy ("tenant/namespace/name") and
// target.
type flowExportMetrics struct {
	records, errors *prometheus.CounterVec
	dropped         *prometheus.CounterVec
	connections     *prometheus.GaugeVec
	policies        prometheus.GaugeFunc
}

// NewFlowExportReconciler returns a FlowExportReconciler.
func NewFlowExportReconciler(opts FlowExportOptions) (*FlowExportReconciler, error) {
	if opts.Store == nil {
		return nil, errors.New("flow export: a store is required")
	}
	if opts.Stdout == nil {
		opts.Stdout = os.Stdout
	}
	if opts.MaxPolicies == 0 {
		opts.MaxPolicies = DefaultFlowExportMaxPolicies
	}
	if opts.MaxConnections == 0 {
		opts.MaxConnections = DefaultFlowExportMaxConnections
	}
	if opts.StatsInterval <= 0 {
		opts.StatsInterval = defaultFlowExportStats
	}
	if opts.StopWait <= 0 {
		opts.StopWait = defaultFlowExportStopWait
	}
	if opts.MaxPolicies < 0 || opts.MaxConnections < 0 {
		return nil, fmt.Errorf("flow export: max policies %d, max connections %d: must be positive", opts.MaxPolicies, opts.MaxConnections)
	}
	if _, err := newIPFIXEncoder(opts.Node, opts.MessageBytes); err != nil {
		return nil, fmt.Errorf("flow export: %w", err)
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	r := &FlowExportReconciler{opts: opts, log: log, exporters: map[nimbusv1.Key]*flowExporter{}}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	m := &flowExportMetrics{
		records: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "naples", Subsystem: "agent", Name: "flow_export_records_total",
			Help: "Flow records a FlowExportPolicy sent to a target: IPFIX data records (one a direction of a connection), or JSON lines written.",
		}, []string{"policy", "target"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "naples", Subsystem: "agent", Name: "flow_export_errors_total",
			Help: "Sends of a FlowExportPolicy that a target did not take (refused, unresolvable, a write that failed); the records of a failed send are lost.",
		}, []string{"policy", "target"}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "naples", Subsystem: "agent", Name: "flow_export_records_dropped_total",
			Help: "Flow records a FlowExportPolicy's exporter did not read before the agent's flow log (--flows-ring) let go of them: it fell behind.",
		}, []string{"policy"}),
		connections: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "naples", Subsystem: "agent", Name: "flow_export_connections",
			Help: "Connections a FlowExportPolicy's exporter tracks for their delta counts, at most --flow-export-max-connections.",
		}, []string{"policy"}),
	}
	m.policies = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "naples", Subsystem: "agent", Name: "flow_export_policies",
		Help: "FlowExportPolicy objects the node runs an exporter for, at most --flow-export-max-policies.",
	}, func() float64 {
		r.mu.Lock()
		defer r.mu.Unlock()
		return float64(len(r.exporters))
	})
	if opts.Registerer != nil {
		for _, c := range []prometheus.Collector{m.records, m.errors, m.dropped, m.connections, m.policies} {
			if err := opts.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("flow export: registering metrics: %w", err)
			}
		}
	}
	r.metrics = m
	return r, nil
}

// Kind returns KIND_FLOW_EXPORT_POLICY.
func (r *FlowExportReconciler) Kind() nimbusv1.Kind { return nimbusv1.Kind_KIND_FLOW_EXPORT_POLICY }

// Reconcile starts, replaces or stops the exporter of the object, and reports its
// counts; a target that failed lately makes the object FAILED with ReasonExportFailed
// and the target's error, and the exporter runs on.
func (r *FlowExportReconciler) Reconcile(ctx context.Context, key *nimbusv1.ObjectKey, obj *nimbusv1.Object) (*nimbusv1.OperationalData, error) {
	id := key.Key()
	spec := obj.GetFlowExportPolicy()
	r.mu.Lock()
	x := r.exporters[id]
	if x != nil && (obj == nil || !proto.Equal(x.spec, spec)) {
		// The exporter stops without r.mu, which its goroutine takes to report a change;
		// its entry stays meanwhile, so that a changed policy keeps its place under
		// MaxPolicies, and goes with the object.
		r.mu.Unlock()
		if !x.stop() {
			r.log.Warn("flow exporter still blocked in a write; it ends when the write returns", "key", id)
		}
		r.metrics.forget(x.policy)
		r.log.Info("flow exporter stopped", "key", id)
		r.mu.Lock()
		if obj == nil {
			delete(r.exporters, id)
		}
		x = nil
	}
	defer r.mu.Unlock()
	if obj == nil {
		return nil, nil
	}
	// What fails below leaves no exporter behind.
	if x == nil {
		delete(r.exporters, id)
	}
	if r.opts.Flows == nil {
		return nil, hal.Errorf(ReasonNoFlowRecords, "the agent has no flow records to export: it runs without a firewall (--bpf-dir is empty) or with flow records off (--fw-flow-ring-bytes 0)")
	}
	if spec.ExportFormat() == nimbusv1.FlowExportJSON && spec.GetFile() != "" && r.opts.Dir == "" {
		return nil, hal.Errorf(ReasonNoExportDir, "spec.file %q: the agent has no --flow-export-dir to write it in", spec.GetFile())
	}
	if x == nil {
		if r.closed {
			return nil, errors.New("flow export: closed")
		}
		if len(r.exporters) >= r.opts.MaxPolicies {
			return nil, hal.Errorf(ReasonLimitExceeded, "the node runs %d flow export policies already, the most --flow-export-max-policies allows", len(r.exporters))
		}
		var err error
		if x, err = r.start(id, spec); err != nil {
			return nil, err
		}
		r.exporters[id] = x
		r.log.Info("flow exporter started", "key", id, "format", spec.ExportFormat(), "targets", spec.GetTargets(), "file", spec.GetFile())
	}
	op, failing := x.operational()
	if failing != nil {
		return op, hal.Errorf(ReasonExportFailed, "%w", failing)
	}
	return op, nil
}

// Observe refreshes the statuses of the policies every StatsInterval, and at once when
// one of their targets fails or recovers, until ctx ends.
func (r *FlowExportReconciler) Observe(ctx context.Context, enqueue func(key nimbusv1.Key), subscribed func()) error {
	r.mu.Lock()
	r.enqueue = enqueue
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		r.enqueue = nil
		r.mu.Unlock()
	}()
	subscribed()
	t := time.NewTicker(r.opts.StatsInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		r.mu.Lock()
		keys := make([]nimbusv1.Key, 0, len(r.exporters))
		for k := range r.exporters {
			keys = append(keys, k)
		}
		r.mu.Unlock()
		for _, k := range keys {
			enqueue(k)
		}
	}
}

// changed enqueues the key, when an observer runs, so that its status is reported anew.
func (r *FlowExportReconciler) changed(key nimbusv1.Key) {
	r.mu.Lock()
	enqueue := r.enqueue
	r.mu.Unlock()
	if enqueue != nil {
		enqueue(key)
	}
}

// Close stops every exporter. It is safe to call twice.
func (r *FlowExportReconciler) Close() error {
	r.mu.Lock()
	r.closed = true
	xs := r.exporters
	r.exporters = map[nimbusv1.Key]*flowExporter{}
	r.mu.Unlock()
	r.cancel()
	for id, x := range xs {
		if !x.stop() {
			r.log.Warn("flow exporter still blocked in a write; it ends when the write returns", "key", id)
		}
	}
	return nil
}

// forget removes the metrics of the policy, whose exporter stopped.
func (m *flowExportMetrics) forget(policy string) {
	l := prometheus.Labels{"policy": policy}
	m.records.DeletePartialMatch(l)
	m.errors.DeletePartialMatch(l)
	m.dropped.DeletePartialMatch(l)
	m.connections.DeletePartialMatch(l)
}

// policyName is the name of a policy in metrics, logs and IPFIX: "tenant/namespace/name".
func policyName(k nimbusv1.Key) string { return k.Tenant + "/" + k.Namespace + "/" + k.Name }

// observationDomain derives the IPFIX observation domain ID from the node's name, so
// that a collector tells the nodes apart.
func observationDomain(node string) uint32 {
	h := fnv.New32a()
	h.Write([]byte(node))
	return h.Sum32()
}

// joinTargetErrors returns one error naming every failing target, nil for none.
func joinTargetErrors(ts []*exportTarget) error {
	var msgs []string
	for _, t := range ts {
		if e, n := t.failing(); e != "" {
			msgs = append(msgs, fmt.Sprintf("target %q: %s (%d sends failed)", t.name, e, n))
		}
	}
	if len(msgs) == 0 {
		return nil
	}
	return errors.New(strings.Join(msgs, "; "))
}
