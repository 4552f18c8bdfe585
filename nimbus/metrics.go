package nimbus

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Values of the mode label of naples_nimbus_watch_starts_total.
const (
	watchModeResume   = "resume"
	watchModeSnapshot = "snapshot"
)

// metrics are the Prometheus metrics of one Server.
type metrics struct {
	reg prometheus.Registerer
	// registered holds what reg took, for unregister.
	registered []prometheus.Collector

	resets      prometheus.Counter
	watchStarts *prometheus.CounterVec
	watchers    prometheus.Gauge
	revision    prometheus.Gauge
	objects     prometheus.Gauge
	commits     prometheus.Counter
	commitSize  prometheus.Histogram
}

// newMetrics creates the metrics and registers them with reg. On error nothing stays
// registered.
func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	const ns, sub = "naples", "nimbus"
	m := &metrics{
		reg: reg,
		resets: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "watcher_resets_total",
			Help: "Watch streams ended with ResourceExhausted because their buffer was full.",
		}),
		watchStarts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "watch_starts_total",
			Help: "Watch streams started, by mode: resume (changes after the client's revision) or snapshot.",
		}, []string{"mode"}),
		watchers: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "watchers",
			Help: "Watch streams currently receiving changes.",
		}),
		revision: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "revision",
			Help: "The store's current revision.",
		}),
		objects: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "objects",
			Help: "Objects in the store.",
		}),
		commits: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "commits_total",
			Help: "Commits of object changes: each is one memdb transaction and, with a data directory, one bbolt transaction (one fsync), and may carry the writes of several calls.",
		}),
		commitSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: ns, Subsystem: sub, Name: "commit_batch_size",
			Help:    "Object changes (revisions) per commit.",
			Buckets: prometheus.ExponentialBuckets(1, 4, 10),
		}),
	}
	// Both modes are present from the start, so that rates work from the first watch.
	m.watchStarts.WithLabelValues(watchModeResume)
	m.watchStarts.WithLabelValues(watchModeSnapshot)
	for _, c := range []prometheus.Collector{m.resets, m.watchStarts, m.watchers, m.revision, m.objects, m.commits, m.commitSize} {
		if err := reg.Register(c); err != nil {
			m.unregister()
			var are prometheus.AlreadyRegisteredError
			if errors.As(err, &are) {
				err = fmt.Errorf("%w (is another Server using the same Registerer?)", err)
			}
			return nil, fmt.Errorf("registering metrics: %w", err)
		}
		m.registered = append(m.registered, c)
	}
	return m, nil
}

// unregister removes the metrics from the Registerer they were registered with.
func (m *metrics) unregister() {
	for _, c := range m.registered {
		m.reg.Unregister(c)
	}
	m.registered = nil
}
