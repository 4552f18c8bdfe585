package hal

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/naplesnet/naples/internal/telemetry"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// metrics are the Prometheus metrics of one HAL.
type metrics struct {
	// unregister removes the metrics from the Registerer they were registered with.
	unregister func()

	// duration observes reconciles by kind; kinds holds its observer per kind.
	duration *prometheus.HistogramVec
	kinds    map[nimbusv1.Kind]prometheus.Observer
	retries  prometheus.Counter
}

// newMetrics creates the HAL's metrics and registers them with reg. On error nothing
// stays registered.
func newMetrics(h *HAL, reg prometheus.Registerer) (*metrics, error) {
	const ns, sub = "naples", "hal"
	m := &metrics{
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ns, Subsystem: sub, Name: "reconcile_duration_seconds",
			Help:    "Time a reconcile takes, by kind, whatever its outcome (Options.Clock's time).",
			Buckets: prometheus.ExponentialBuckets(10e-6, 4, 10),
		}, []string{"kind"}),
		kinds: map[nimbusv1.Kind]prometheus.Observer{},
		retries: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "retries_total",
			Help: "Keys put back on the work queue after a backoff: reconciles that failed, and statuses the store could not record.",
		}),
	}
	// Every kind with a reconciler is present from the start, so that rates work from the
	// first reconcile.
	for kind := range h.reconcilers {
		m.kinds[kind] = m.duration.WithLabelValues(kind.Name())
	}
	depth := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: ns, Subsystem: sub, Name: "queue_depth",
		Help: "Keys waiting on the work queue for a worker; keys being reconciled and keys waiting out a retry backoff are not counted.",
	}, func() float64 { return float64(h.queue.Len()) })
	unreconciled := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: ns, Subsystem: sub, Name: "unreconciled_objects",
		Help: "Desired objects not reconciled even once since the HAL started; the HAL is not ready while any are.",
	}, func() float64 { return float64(h.ready.unreconciled()) })
	stats := &statsCollector{
		h:          h,
		reconciles: prometheus.NewDesc(prometheus.BuildFQName(ns, sub, "reconciles_total"), "Reconciles run, by kind, whatever their outcome.", []string{"kind"}, nil),
		errors:     prometheus.NewDesc(prometheus.BuildFQName(ns, sub, "reconcile_errors_total"), "Reconciles that failed, by kind; each is retried after a backoff.", []string{"kind"}, nil),
		writes:     prometheus.NewDesc(prometheus.BuildFQName(ns, sub, "kernel_writes_total"), "Kernel objects created, replaced or removed, by kind; only kinds whose reconciler counts them.", []string{"kind"}, nil),
		commits:    prometheus.NewDesc(prometheus.BuildFQName(ns, sub, "status_commits_total"), "Store transactions that recorded statuses.", nil, nil),
		statuses:   prometheus.NewDesc(prometheus.BuildFQName(ns, sub, "status_writes_total"), "Statuses, and removals of statuses, recorded.", nil, nil),
	}
	var err error
	if m.unregister, err = telemetry.Register(reg, "HAL", m.duration, m.retries, depth, unreconciled, stats); err != nil {
		return nil, err
	}
	return m, nil
}

// statsCollector collects the counts of HAL.Stats at scrape time.
type statsCollector struct {
	h                                             *HAL
	reconciles, errors, writes, commits, statuses *prometheus.Desc
}

func (c *statsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.reconciles, c.errors, c.writes, c.commits, c.statuses} {
		ch <- d
	}
}

func (c *statsCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.h.Stats()
	for kind, ks := range st.Kinds {
		name := kind.Name()
		ch <- prometheus.MustNewConstMetric(c.reconciles, prometheus.CounterValue, float64(ks.Reconciles), name)
		ch <- prometheus.MustNewConstMetric(c.errors, prometheus.CounterValue, float64(ks.Errors), name)
		if _, ok := c.h.reconcilers[kind].(KernelWriteCounter); ok {
			ch <- prometheus.MustNewConstMetric(c.writes, prometheus.CounterValue, float64(ks.KernelWrites), name)
		}
	}
	ch <- prometheus.MustNewConstMetric(c.commits, prometheus.CounterValue, float64(st.StatusCommits))
	ch <- prometheus.MustNewConstMetric(c.statuses, prometheus.CounterValue, float64(st.StatusWrites))
}
