package nimbus

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/naplesnet/naples/internal/pki"
	"github.com/naplesnet/naples/internal/telemetry"
)

// Values of the mode label of naples_nimbus_watch_starts_total.
const (
	watchModeResume   = "resume"
	watchModeSnapshot = "snapshot"
)

// metrics are the Prometheus metrics of one Server.
type metrics struct {
	// unregister removes the metrics from the Registerer they were registered with.
	unregister func()

	resets      prometheus.Counter
	watchStarts *prometheus.CounterVec
	watchers    prometheus.Gauge
	revision    prometheus.Gauge
	objects     prometheus.Gauge
	commits     prometheus.Counter
	commitSize  prometheus.Histogram
	// statusTruncated counts the status reports cut to fit Limits, by what was cut.
	statusTruncated *prometheus.CounterVec
	// detailsOmitted counts the object statuses sent without the details of some nodes.
	detailsOmitted prometheus.Counter
	// nodesOmitted counts the object statuses sent with some nodes left out of their
	// lists of nodes or pending nodes.
	nodesOmitted prometheus.Counter
	// objectsTooLarge counts the objects refused for their size.
	objectsTooLarge prometheus.Counter
	// dryRuns counts the Apply and ApplyBatch calls with dry_run that reached the store.
	dryRuns prometheus.Counter
	// listPagesCut counts the List pages that ended before the last item.
	listPagesCut prometheus.Counter
	// nodeStatusPagesCut counts the ListNodeStatuses pages that ended before the last
	// node.
	nodeStatusPagesCut prometheus.Counter
	// handshakesRefused counts the TLS handshakes refused, by reason.
	handshakesRefused *prometheus.CounterVec
	// watermarkMovesDelayed counts the watermark reports held back by
	// Limits.StatusWatermarkMoves.
	watermarkMovesDelayed prometheus.Counter
	// revokedClosed counts the connections closed because Options.CRL came to revoke
	// their client certificate.
	revokedClosed prometheus.Counter
	// certificateExpiry is when each certificate of Options.Certificates expires.
	certificateExpiry *prometheus.GaugeVec
}

// newMetrics creates the metrics and registers them with reg; statuses tells how many node
// statuses the store holds, watermarks how many nodes have a status watermark. On error
// nothing stays registered.
func newMetrics(reg prometheus.Registerer, statuses, watermarks func() float64) (*metrics, error) {
	const ns, sub = "naples", "nimbus"
	m := &metrics{
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
			Help: "The revision of the store's last change.",
		}),
		objects: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "objects",
			Help: "Objects in the store.",
		}),
		commits: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "commits_total",
			Help: "Commits of object changes: each is one store transaction and, with a data directory, one state-file commit, and may carry the writes of several calls.",
		}),
		commitSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: ns, Subsystem: sub, Name: "commit_batch_size",
			Help:    "Object changes (revisions) per commit.",
			Buckets: prometheus.ExponentialBuckets(1, 4, 10),
		}),
		statusTruncated: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "status_truncated_total",
			Help: "Status reports cut to fit nimbus's limits, by field: message, reason, operational_entries, operational_key, operational_value or operational_bytes.",
		}, []string{"field"}),
		detailsOmitted: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "status_details_omitted_total",
			Help: "Object statuses sent without the messages and operational data of some nodes, because they held more than --status-details-bytes.",
		}),
	}
	m.nodesOmitted = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "status_nodes_omitted_total",
		Help: "Object statuses sent with some nodes left out of their lists of node statuses or pending nodes, because they had more than --status-nodes.",
	})
	m.objectsTooLarge = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "objects_too_large_total",
		Help: "Objects refused at Apply or ApplyBatch because they were larger than --max-object-bytes.",
	})
	m.dryRuns = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "dry_runs_total",
		Help: "Apply and ApplyBatch calls with dry_run checked against the store, which stored nothing.",
	})
	m.listPagesCut = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "list_pages_cut_total",
		Help: "List answers that ended before the last item, at the request's limit or --list-page-bytes, with a next_page_token.",
	})
	m.nodeStatusPagesCut = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "node_status_pages_cut_total",
		Help: "ListNodeStatuses answers that ended before the last node, at the request's limit, --list-page-bytes or the nodes a page looks at, with a next_page_token.",
	})
	m.handshakesRefused = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "tls_handshakes_refused_total",
		Help: "TLS handshakes refused, by reason: plaintext, no_certificate, unknown_ca, client_refused, revoked or other.",
	}, []string{"reason"})
	m.watermarkMovesDelayed = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "status_watermark_moves_delayed_total",
		Help: "Status watermarks a node reported that were held back, to be applied later with the reports after them, because the node moved its watermark faster than --status-watermark-moves.",
	})
	m.revokedClosed = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "tls_revoked_connections_closed_total",
		Help: "Open connections closed because a revocation list read again (--tls-crl) revokes their client certificate.",
	})
	m.certificateExpiry = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: ns, Subsystem: sub, Name: "tls_certificate_expiry_seconds",
		Help: "When each certificate nimbus loaded expires (its NotAfter), in seconds since the Unix epoch, by certificate (server or ca) and file; for a file of several CAs, the first to expire.",
	}, []string{"certificate", "file"})
	for _, r := range handshakeReasons {
		m.handshakesRefused.WithLabelValues(r)
	}
	for _, f := range truncatedFields {
		m.statusTruncated.WithLabelValues(f)
	}
	statusGauge := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: ns, Subsystem: sub, Name: "statuses",
		Help: "Node statuses held: one per object and node that reported it.",
	}, statuses)
	watermarkGauge := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: ns, Subsystem: sub, Name: "status_watermarks",
		Help: "Nodes whose status watermark is held: statuses of theirs are derived from it.",
	}, watermarks)
	// Both modes are present from the start, so that rates work from the first watch.
	m.watchStarts.WithLabelValues(watchModeResume)
	m.watchStarts.WithLabelValues(watchModeSnapshot)
	var err error
	if m.unregister, err = telemetry.Register(reg, "Server", m.resets, m.watchStarts, m.watchers, m.revision, m.objects, m.commits, m.commitSize,
		m.statusTruncated, m.detailsOmitted, m.nodesOmitted, statusGauge, watermarkGauge, m.objectsTooLarge, m.dryRuns, m.listPagesCut,
		m.nodeStatusPagesCut, m.handshakesRefused, m.watermarkMovesDelayed, m.certificateExpiry, m.revokedClosed); err != nil {
		return nil, err
	}
	return m, nil
}

// setCertificates sets the expiry gauge of each certificate file.
func (m *metrics) setCertificates(e *pki.Expiry) {
	for _, c := range e.Certificates() {
		m.certificateExpiry.WithLabelValues(c.Use, c.Path).Set(float64(c.NotAfter.Unix()))
	}
}
