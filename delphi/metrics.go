package delphi

import (
	"errors"
	"fmt"
	"strings"

	"github.com/hashicorp/go-memdb"
	"github.com/prometheus/client_golang/prometheus"

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
	reg prometheus.Registerer
	// registered holds what reg took, for unregister.
	registered []prometheus.Collector

	commitDuration *prometheus.HistogramVec
	commitSize     *prometheus.HistogramVec
}

// newMetrics creates the store's metrics and registers them with reg. On error nothing
// stays registered.
func newMetrics(s *Store, reg prometheus.Registerer) (*metrics, error) {
	const ns, sub = "naples", "delphi"
	m := &metrics{
		reg: reg,
		commitDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ns, Subsystem: sub, Name: "commit_duration_seconds",
			Help:    "Time a write transaction takes, by table: the memdb transaction, its write to the state file (one fsync) when durable changes are in it, and the notification of subscribers.",
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
	for _, c := range []prometheus.Collector{m.commitDuration, m.commitSize, synced, objects} {
		if err := reg.Register(c); err != nil {
			m.unregister()
			var are prometheus.AlreadyRegisteredError
			if errors.As(err, &are) {
				err = fmt.Errorf("%w (is another Store using the same Registerer?)", err)
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

// countObjects counts the desired objects per kind and phase in one read transaction. Both
// tables are ordered by key ID, so one merged pass over them finds each object's status:
// the cost is linear in the number of objects, without a lookup per object.
func (s *Store) countObjects() map[nimbusv1.Kind]*objectCounts {
	counts := map[nimbusv1.Kind]*objectCounts{}
	txn := s.db.Txn(false)
	desired, err := txn.Get(string(TableDesired), "id")
	if err != nil {
		return counts
	}
	statuses, err := txn.Get(string(TableStatus), "id")
	if err != nil {
		return counts
	}
	st := nextStatus(statuses)
	for raw := desired.Next(); raw != nil; raw = desired.Next() {
		d := raw.(*desiredRecord)
		for st != nil && st.ID < d.ID {
			st = nextStatus(statuses)
		}
		phase := phasePending
		if st != nil && st.ID == d.ID && st.Status.GetObservedGeneration() == d.Object.GetMeta().GetGeneration() {
			switch st.Status.GetPhase() {
			case nimbusv1.Phase_PHASE_PROGRAMMED:
				phase = phaseProgrammed
			case nimbusv1.Phase_PHASE_FAILED:
				phase = phaseFailed
			}
		}
		kind := nimbusv1.Kind(d.Kind)
		n := counts[kind]
		if n == nil {
			n = &objectCounts{}
			counts[kind] = n
		}
		n[phase]++
	}
	return counts
}

func nextStatus(it memdb.ResultIterator) *statusRecord {
	if raw := it.Next(); raw != nil {
		return raw.(*statusRecord)
	}
	return nil
}
