package agent

import (
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	delphiv1 "github.com/naplesnet/naples/proto/delphi/v1"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// DefaultFlowLogSize is the default of the flow records the agent keeps (--flows-ring).
const DefaultFlowLogSize = 8192

// DefaultFlowStreams is the default of the local API's Flows streams served at once
// (--local-api-flow-streams).
const DefaultFlowStreams = 16

// DefaultFlowSweep is the default of how often the conntrack table is swept for idle
// connections (--flow-sweep-interval).
const DefaultFlowSweep = 10 * time.Second

// flowBatch bounds the records one response of Flows carries.
const flowBatch = 256

// FlowLog keeps the latest flow records of the host's firewall, named, for Flows: a ring
// of a fixed number of records, oldest first, each with a sequence number, which
// followers read from where they are. It counts the records the datapath lost and those
// it let go of before a follower read them. It is safe for concurrent use.
type FlowLog struct {
	mu sync.Mutex
	// ring holds the records, next is the sequence number of the next one: the record of
	// sequence number s is ring[s%len(ring)] while s >= next-len(ring).
	ring []*delphiv1.Flow
	next uint64
	// lostDatapath is the datapath's count of records it could not write, suppressed its
	// count of those endpoints' budgets suppressed.
	lostDatapath, suppressed uint64
	// ringPending and ringSize are the firewall's ring's bytes not read yet and its size,
	// as the collector last saw them.
	ringPending, ringSize int
	// added is closed, and replaced, whenever records are added.
	added chan struct{}

	flows          *prometheus.CounterVec
	drops          *prometheus.CounterVec
	lost           prometheus.CounterFunc
	suppressedFunc prometheus.CounterFunc
	occupied       prometheus.GaugeFunc
	ringGauges     []prometheus.Collector
}

// NewFlowLog returns a FlowLog of size records whose metrics reg takes, if not nil.
func NewFlowLog(size int, reg prometheus.Registerer) (*FlowLog, error) {
	if size <= 0 {
		return nil, fmt.Errorf("flow log of %d records: must be positive", size)
	}
	l := &FlowLog{ring: make([]*delphiv1.Flow, size), added: make(chan struct{})}
	l.flows = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "naples", Subsystem: "agent", Name: "flows_total",
		Help: "Flow records of the firewall the agent took, by verdict (allowed, denied) and event (started, denied, active, ended).",
	}, []string{"verdict", "event"})
	l.drops = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "naples", Subsystem: "agent", Name: "flow_drops_total",
		Help: "Packets the firewall dropped that the agent took a record of, by reason (policy, spoofed, malformed, fragment, vlan); naplesctl monitor --type drop shows them.",
	}, []string{"reason"})
	l.lost = prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "naples", Subsystem: "agent", Name: "flow_records_lost_total",
		Help: "Flow records the firewall could not write because the agent had not taken the ones before (its ring buffer, --fw-flow-ring-bytes, was full), since the ring was made."}, lockedValue(l, &l.lostDatapath))
	l.suppressedFunc = prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "naples", Subsystem: "agent", Name: "flow_records_suppressed_total",
		Help: "Flow records the firewall did not write because their endpoint had spent its budget of records (--fw-flow-endpoint-rate), since the budgets were made."}, lockedValue(l, &l.suppressed))
	l.occupied = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "naples", Subsystem: "agent", Name: "flow_log_records",
		Help: "Flow records the agent keeps for the local API's Flows, at most --flows-ring.",
	}, func() float64 {
		l.mu.Lock()
		defer l.mu.Unlock()
		return float64(min(l.next, uint64(len(l.ring))))
	})
	l.ringGauges = []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "naples", Subsystem: "agent", Name: "flow_ring_pending_bytes",
			Help: "Bytes of flow records in the firewall's ring (--fw-flow-ring-bytes) that the agent has not read yet, as last seen."}, lockedValue(l, &l.ringPending)),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "naples", Subsystem: "agent", Name: "flow_ring_size_bytes",
			Help: "The size of the firewall's ring of flow records in bytes (--fw-flow-ring-bytes)."}, lockedValue(l, &l.ringSize)),
	}
	if reg != nil {
		for _, c := range append([]prometheus.Collector{l.flows, l.drops, l.lost, l.suppressedFunc, l.occupied}, l.ringGauges...) {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("registering the flow log's metrics: %w", err)
			}
		}
	}
	return l, nil
}

// Add appends the records, which the log keeps and does not modify, and records the
// datapath's count of lost records.
func (l *FlowLog) Add(flows []*delphiv1.Flow, lostDatapath uint64) {
	for _, f := range flows {
		l.flows.WithLabelValues(f.GetVerdict(), flowEventName(f.GetEvent())).Inc()
		if f.GetEvent() == delphiv1.FlowEvent_FLOW_EVENT_DENIED {
			l.drops.WithLabelValues(f.GetReason()).Inc()
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, f := range flows {
		l.ring[l.next%uint64(len(l.ring))] = f
		l.next++
	}
	l.lostDatapath = lostDatapath
	if len(flows) > 0 {
		close(l.added)
		l.added = make(chan struct{})
	}
}

// SetRing records how many bytes of records the firewall's ring holds that the collector
// has not read yet, and the ring's size.
func (l *FlowLog) SetRing(pending, size int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ringPending, l.ringSize = pending, size
}

// lockedValue returns a function that reads n, which l.mu guards, for a metric.
func lockedValue[T uint64 | int](l *FlowLog, n *T) func() float64 {
	return func() float64 {
		l.mu.Lock()
		defer l.mu.Unlock()
		return float64(*n)
	}
}

// SetSuppressed records the datapath's count of records endpoints' budgets suppressed,
// and wakes the followers when it changed.
func (l *FlowLog) SetSuppressed(n uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if n != l.suppressed {
		l.suppressed = n
		close(l.added)
		l.added = make(chan struct{})
	}
}

// suppressedCount returns what SetSuppressed recorded last.
func (l *FlowLog) suppressedCount() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.suppressed
}

// from returns the records from sequence number seq on, at most max of them, the
// sequence number after the last returned, how many records from seq on the log let go
// of already, the datapath's lost count, and a channel closed when records are added.
func (l *FlowLog) from(seq uint64, max int) (flows []*delphiv1.Flow, next, skipped, lost uint64, added <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if oldest := l.next - min(l.next, uint64(len(l.ring))); seq < oldest {
		skipped, seq = oldest-seq, oldest
	}
	for ; seq < l.next && len(flows) < max; seq++ {
		flows = append(flows, l.ring[seq%uint64(len(l.ring))])
	}
	return flows, seq, skipped, l.lostDatapath, l.added
}

// flowEventName names the event as the metrics do: "started", "denied", "ended".
func flowEventName(e delphiv1.FlowEvent) string {
	return strings.ToLower(strings.TrimPrefix(e.String(), "FLOW_EVENT_"))
}

// flowFilter is a FlowsRequest's filters, checked.
type flowFilter struct {
	since    time.Time
	from, to flowPeer
	verdict  string
	// policy is the policy's tenant, namespace and name, those not given empty; nil
	// selects every record.
	policy *nimbusv1.ObjectKey
}

// flowPeer is a from or to filter: an endpoint's name, or an address.
type flowPeer struct {
	set  bool
	addr netip.Addr
	// name is the endpoint's name: tenant, namespace and name, the ones not given empty.
	tenant, namespace, name string
}

// parseFlowPeer reads a from or to filter.
func parseFlowPeer(field, s string) (flowPeer, error) {
	if s == "" {
		return flowPeer{}, nil
	}
	a, n, err := delphiv1.ParseFlowPeer(s)
	if err != nil {
		return flowPeer{}, status.Errorf(codes.InvalidArgument, "%s %q: %v", field, s, err)
	}
	return flowPeer{set: true, addr: a, tenant: n.Tenant, namespace: n.Namespace, name: n.Name}, nil
}

// matches tells whether the side of a record, its address and, when it is the local
// endpoint's, the endpoint's key, is the peer's.
func (p flowPeer) matches(addr string, ep *nimbusv1.ObjectKey) bool {
	if !p.set {
		return true
	}
	if p.addr.IsValid() {
		a, err := netip.ParseAddr(addr)
		return err == nil && a.Unmap() == p.addr
	}
	return ep != nil && ep.GetName() == p.name &&
		(p.namespace == "" || ep.GetNamespace() == p.namespace) && (p.tenant == "" || ep.GetTenant() == p.tenant)
}

// newFlowFilter checks the request's filters.
func newFlowFilter(req *delphiv1.FlowsRequest, now time.Time) (*flowFilter, error) {
	f := &flowFilter{}
	var err error
	if f.from, err = parseFlowPeer("from", req.GetFrom()); err != nil {
		return nil, err
	}
	if f.to, err = parseFlowPeer("to", req.GetTo()); err != nil {
		return nil, err
	}
	switch v := req.GetVerdict(); v {
	case "", "allowed", "denied":
		f.verdict = v
	default:
		return nil, status.Errorf(codes.InvalidArgument, "verdict %q: want allowed or denied", v)
	}
	if req.Since != nil {
		d := req.GetSince().AsDuration()
		if d < 0 || !req.GetSince().IsValid() {
			return nil, status.Errorf(codes.InvalidArgument, "since %v: want a duration of zero or more", req.GetSince())
		}
		f.since = now.Add(-d)
	}
	if s := req.GetPolicy(); s != "" {
		p, err := delphiv1.ParseFlowPolicy(s)
		if err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "policy %q: %v", s, err)
		}
		f.policy = &nimbusv1.ObjectKey{Tenant: p.Tenant, Namespace: p.Namespace, Name: p.Name}
	}
	return f, nil
}

// matches tells whether the record passes the filters.
func (f *flowFilter) matches(r *delphiv1.Flow) bool {
	if f.verdict != "" && r.GetVerdict() != f.verdict {
		return false
	}
	if !f.since.IsZero() && r.GetTime().AsTime().Before(f.since) {
		return false
	}
	if f.policy != nil {
		p := r.GetPolicy()
		if p == nil || p.GetName() != f.policy.GetName() ||
			(f.policy.GetNamespace() != "" && p.GetNamespace() != f.policy.GetNamespace()) ||
			(f.policy.GetTenant() != "" && p.GetTenant() != f.policy.GetTenant()) {
			return false
		}
	}
	// The local endpoint is the source of what it sends (egress) and the destination of
	// what it receives; the peer endpoint the other end.
	srcEP, dstEP := r.GetPeerEndpoint(), r.GetEndpoint()
	if r.GetDirection() == "egress" {
		srcEP, dstEP = dstEP, srcEP
	}
	return f.from.matches(r.GetSource(), srcEP) && f.to.matches(r.GetDestination(), dstEP)
}

// errNoFlows is returned by Flows when the agent keeps no flow records.
var errNoFlows = status.Error(codes.FailedPrecondition,
	"the agent keeps no flow records: it runs without a firewall (--bpf-dir is empty) or with flow records off (--fw-flow-ring-bytes 0)")

// Flows sends the recent flow records the request selects, oldest first, then, when it
// follows, each new one as it comes, until the stream's context ends or the Inspector is
// closed. Each response carries the counts of records lost, by the datapath and by the
// agent for this stream.
func (i *Inspector) Flows(req *delphiv1.FlowsRequest, stream delphiv1.Delphi_FlowsServer) error {
	if i.flows == nil {
		return errNoFlows
	}
	filter, err := newFlowFilter(req, time.Now())
	if err != nil {
		return err
	}
	select {
	case i.flowStreams <- struct{}{}:
		defer func() { <-i.flowStreams }()
	default:
		i.flowStreamsRefused.Inc()
		return status.Errorf(codes.ResourceExhausted, "the agent serves %d flows streams already (its --local-api-flow-streams): end one, or raise the limit", cap(i.flowStreams))
	}
	ctx := stream.Context()
	c := &flowCursor{log: i.flows, filter: filter, batch: flowBatch}
	var sentLost, sentLostAgent, sentSuppressed uint64
	// The records go in responses of at most flowBatch; the first response goes out
	// even without records, and so does a change of the lost counts.
	return c.follow(ctx, i.done, req, func(flows []*delphiv1.Flow, first bool) error {
		changed := c.lost != sentLost || c.lostAgent != sentLostAgent || c.suppressed != sentSuppressed
		for one := first || changed; one || len(flows) > 0; one = false {
			n := min(len(flows), flowBatch)
			if err := stream.Send(&delphiv1.FlowsResponse{Flows: flows[:n], LostDatapath: c.lost, LostAgent: c.lostAgent, Suppressed: c.suppressed}); err != nil {
				return err
			}
			flows = flows[n:]
		}
		sentLost, sentLostAgent, sentSuppressed = c.lost, c.lostAgent, c.suppressed
		return nil
	})
}
