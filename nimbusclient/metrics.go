package nimbusclient

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/naplesnet/naples/internal/telemetry"
)

// Values of the labels of the client's metrics.
const (
	// modes of naples_nimbusclient_watch_starts_total.
	watchModeResume   = "resume"
	watchModeSnapshot = "snapshot"
	// streams of naples_nimbusclient_reconnects_total.
	streamWatch  = "watch"
	streamStatus = "status"
	// streamFlowTap is the flow tap (Options.FlowTap).
	streamFlowTap = "flowtap"
)

// metrics are the Prometheus metrics of one Client.
type metrics struct {
	// unregister removes the metrics from the Registerer they were registered with.
	unregister func()

	connected     prometheus.Gauge
	server        *prometheus.GaugeVec
	reconnects    *prometheus.CounterVec
	watchStarts   *prometheus.CounterVec
	statusReports prometheus.Counter
	// moves counts the times nimbus asked the client to watch another replica.
	moves prometheus.Counter
	// statusWatermark, statusExceptions and statusPending are the watermark last
	// reported, and how many objects are exceptions and hold it back (reportWatermarks).
	statusWatermark, statusExceptions, statusPending prometheus.Gauge
}

// newMetrics creates the client's metrics and registers them with reg. On error nothing
// stays registered.
func newMetrics(c *Client, reg prometheus.Registerer) (*metrics, error) {
	const ns, sub = "naples", "nimbusclient"
	m := &metrics{
		connected: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "watch_connected",
			Help: "1 while a watch stream is up, from its first event until it ends; 0 otherwise.",
		}),
		server: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "watch_server",
			Help: "1 for the address of the nimbus the watch stream is up to, from its first event until it ends; no series otherwise.",
		}, []string{"address"}),
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
		moves: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "moves_total",
			Help: "Times a nimbus replica asked the client to watch another replica, because it held more than its share of the agents.",
		}),
		statusWatermark: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "status_watermark",
			Help: "The status watermark last reported to nimbus: every object whose generation revision is at or below it is PROGRAMMED at its generation, or an exception.",
		}),
		statusExceptions: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "status_exceptions",
			Help: "Objects short of PROGRAMMED at their generation whose status is reported on its own, not held back by the watermark; at most --status-max-exceptions.",
		}),
		statusPending: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "status_pending",
			Help: "Objects short of PROGRAMMED at their generation that hold the status watermark back: for less than --status-exception-after, or past the exceptions' limit.",
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
	var err error
	if m.unregister, err = telemetry.Register(reg, "Client", m.connected, m.server, m.reconnects, m.watchStarts, m.statusReports, m.moves,
		m.statusWatermark, m.statusExceptions, m.statusPending, received); err != nil {
		return nil, err
	}
	return m, nil
}
