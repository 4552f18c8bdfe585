package delphi

import (
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/naplesnet/naples/internal/telemetry"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// phases are the values of the phase label of naples_delphi_objects, in the order of
// objectCounts.
var phases = [...]nimbusv1.Phase{nimbusv1.Phase_PHASE_PENDING, nimbusv1.Phase_PHASE_PROGRAMMED, nimbusv1.Phase_PHASE_FAILED}

// Indexes into objectCounts.
const (
	phasePending = iota
	phaseProgrammed
	phaseFailed
)

// objectCounts counts the desired objects of one kind per phase, indexed as phases.
type objectCounts [len(phases)]int

// metrics are the Prometheus metrics of one Store.
type metrics struct {
	// unregister removes the metrics from the Registerer they were registered with.
	unregister func()

	commitDuration *prometheus.HistogramVec
	commitSize     *prometheus.HistogramVec
}

// newMetrics creates the store's metrics and registers them with reg. On error nothing
// stays registered.
func newMetrics(s *Store, reg prometheus.Registerer) (*metrics, error) {
	const ns, sub = "naples", "delphi"
	m := &metrics{
		commitDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ns, Subsystem: sub, Name: "commit_duration_seconds",
			Help:    "Time a write transaction takes, by table: the in-memory transaction, its commit to the state file when durable changes are in it, and the notification of subscribers.",
			Buckets: prometheus.ExponentialBuckets(25e-6, 4, 10),
		}, []string{"table"}),
		commitSize: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ns, Subsystem: sub, Name: "commit_batch_size",
			Help:    "Objects a write transaction changed, by table: desired objects stored or deleted, or statuses set or removed; writes equal to what is stored change nothing.",
			Buckets: prometheus.ExponentialBuckets(1, 4, 10),
		}, []string{"table"}),
	}
	// Both tables are present from the start, so that rates work from the first commit.
	for _, t := range []Table{TableDesired, TableStatus} {
		m.commitDuration.WithLabelValues(string(t))
		m.commitSize.WithLabelValues(string(t))
	}
	synced := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: ns, Subsystem: sub, Name: "synced",
		Help: "1 once the desired table is complete (restored from the state file, or synced with nimbus), 0 before.",
	}, func() float64 {
		select {
		case <-s.synced:
			return 1
		default:
			return 0
		}
	})
	objects := objectsCollector{s: s, desc: prometheus.NewDesc(
		prometheus.BuildFQName(ns, sub, "objects"),
		"Desired objects by kind and by the phase of their status for their current generation: PROGRAMMED, FAILED, or PENDING (a status that says so, none yet, or one of an older generation). Counted at scrape time in one pass over both tables.",
		[]string{"kind", "phase"}, nil,
	)}
	var err error
	if m.unregister, err = telemetry.Register(reg, "Store", m.commitDuration, m.commitSize, synced, objects); err != nil {
		return nil, err
	}
	return m, nil
}

// objectsCollector collects naples_delphi_objects from the store's tables at scrape time.
type objectsCollector struct {
	s    *Store
	desc *prometheus.Desc
}

func (c objectsCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c objectsCollector) Collect(ch chan<- prometheus.Metric) {
	counts := c.s.countObjects()
	// Every known kind and phase is present, zero or not, so that a series does not vanish
	// when its last object goes.
	for _, k := range nimbusv1.Kinds() {
		if _, ok := counts[k]; !ok {
			counts[k] = &objectCounts{}
		}
	}
	for k, n := range counts {
		for i, p := range phases {
			ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(n[i]),
				k.Name(), strings.TrimPrefix(p.String(), "PHASE_"))
		}
	}
}

// countObjects counts the desired objects per kind and phase: one read transaction of the
// desired table, and a lookup of each object's status in the status map under one read
// lock, so the cost is linear in the number of objects.
func (s *Store) countObjects() map[nimbusv1.Kind]*objectCounts {
	counts := map[nimbusv1.Kind]*objectCounts{}
	desired := s.desired.Load().byID
	s.statusMu.RLock()
	defer s.statusMu.RUnlock()
	desired.Scan(func(d *record) bool {
		phase := phasePending
		if r, ok := s.statuses.Get(d.key); ok {
			gen, reported := r.progress()
			if gen != d.generation() {
				reported = nimbusv1.Phase_PHASE_UNSPECIFIED
			}
			switch reported {
			case nimbusv1.Phase_PHASE_PROGRAMMED:
				phase = phaseProgrammed
			case nimbusv1.Phase_PHASE_FAILED:
				phase = phaseFailed
			}
		}
		kind := d.key.Kind
		n := counts[kind]
		if n == nil {
			n = &objectCounts{}
			counts[kind] = n
		}
		n[phase]++
		return true
	})
	return counts
}
