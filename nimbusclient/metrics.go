package nimbusclient

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Values of the labels of the client's metrics.
const (
	// modes of naples_nimbusclient_watch_starts_total.
	watchModeResume   = "resume"
	watchModeSnapshot = "snapshot"
	// streams of naples_nimbusclient_reconnects_total.
	streamWatch  = "watch"
	streamStatus = "status"
)

// metrics are the Prometheus metrics of one Client.
type metrics struct {
	reg prometheus.Registerer
	// registered holds what reg took, for unregister.
	registered []prometheus.Collector

	connected     prometheus.Gauge
	reconnects    *prometheus.CounterVec
	watchStarts   *prometheus.CounterVec
	statusReports prometheus.Counter
}

// newMetrics creates the client's metrics and registers them with reg. On error nothing
// stays registered.
func newMetrics(c *Client, reg prometheus.Registerer) (*metrics, error) {
	const ns, sub = "naples", "nimbusclient"
	m := &metrics{
		reg: reg,
		connected: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "watch_connected",
			Help: "1 while a watch stream is up, from its first event until it ends; 0 otherwise.",
		}),
		reconnects: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "reconnects_total",
			Help: "Streams to nimbus started again after one ended, by stream: watch or status.",
		}, []string{"stream"}),
		watchStarts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "watch_starts_total",
			Help: "Watch streams that started, by mode: resume (nimbus sends the changes after delphi's revision) or snapshot (every object, then a sweep of the others).",
		}, []string{"mode"}),
		statusReports: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "status_reports_total",
			Help: "Statuses sent to nimbus.",
		}),
	}
	// Every label value is present from the start, so that rates work from the first event.
	m.reconnects.WithLabelValues(streamWatch)
	m.reconnects.WithLabelValues(streamStatus)
	m.watchStarts.WithLabelValues(watchModeResume)
	m.watchStarts.WithLabelValues(watchModeSnapshot)
	received := prometheus.NewCounterFunc(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "events_received_total",
		Help: "Watch events received from nimbus, snapshot events and markers included.",
	}, func() float64 { return float64(c.EventsReceived()) })
	for _, col := range []prometheus.Collector{m.connected, m.reconnects, m.watchStarts, m.statusReports, received} {
		if err := reg.Register(col); err != nil {
			m.unregister()
			var are prometheus.AlreadyRegisteredError
			if errors.As(err, &are) {
				err = fmt.Errorf("%w (is another Client using the same Registerer?)", err)
			}
			return nil, fmt.Errorf("registering metrics: %w", err)
		}
		m.registered = append(m.registered, col)
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
