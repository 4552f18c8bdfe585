package nimbus

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/naplesnet/naples/internal/address"
	"github.com/naplesnet/naples/internal/backoff"
	"github.com/naplesnet/naples/internal/telemetry"
	delphiv1 "github.com/naplesnet/naples/proto/delphi/v1"
	flowsv1 "github.com/naplesnet/naples/proto/nimbus/flows/v1"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// Flows across the fleet
//
// nimbus relays the flow records of the nodes' firewalls to operators (the
// nimbus.flows.v1.Flows service). Each agent keeps a flow tap open to the replica it
// watches (FlowTap, dialed by the agent: nimbus never dials an agent). An operator's
// ObserveFlows registers an observer; nimbus sends each tap of a node the observer asks
// for a subscription, with the observer's filters, and the agent sends back, tagged with
// the subscription's id, only the records that match: filtering is done at the agent, so
// only matching records leave a host. When the observer goes, its subscriptions are
// cancelled; when a tap opens, it receives a subscription for every observer of its node.
//
// Through replicas: a replica serving an observer asks each of its peers for the same
// records with local_only set (over the peers' addresses and dial options, those of the
// push streams), which only replica certificates may set, and merges what they send with
// its own agents' records. The peers are those the replica had when the observation
// began; a peer stream that fails is opened again with backoff.
//
// Loss is counted, never silent, per node and per observer: lost_datapath is the node's
// firewall's count, lost_agent the records the agent let go of before it sent them (its
// ring went round before nimbus took them), lost_nimbus those nimbus dropped because the
// observer read slower than they came (its buffer, Limits.FlowObserverBuffer records, was
// full). A slow observer loses its own records only: the taps never wait for an observer,
// and an observer never waits for another.
//
// Bounds: Limits.FlowObservers observers at once (one more is refused with
// ResourceExhausted), Limits.FlowObserverBuffer records queued per observer, and the
// streams of node and publisher certificates count against Limits.NodeStreams and
// Limits.PublisherStreams as the other streams do.

// flowResponseBatch bounds the records of one ObserveFlowsResponse.
const flowResponseBatch = 256

// flowHub holds a Server's flow taps and observers and routes records between them.
type flowHub struct {
	flowsv1.UnimplementedFlowsServer

	s       *Server
	log     *slog.Logger
	metrics *flowMetrics

	// mu guards taps, observers and nextID.
	mu sync.Mutex
	// taps holds the current tap of each node; a node's newer tap replaces an older one.
	taps map[string]*flowTap
	// observers holds the observers by id, which is also their subscriptions' id.
	observers map[uint64]*flowObserver
	nextID    uint64
}

var _ flowsv1.FlowsServer = (*flowHub)(nil)

// flowMetrics are the metrics of the flow relay.
type flowMetrics struct {
	unregister func()
	observers  prometheus.Gauge
	refused    prometheus.Counter
	taps       prometheus.Gauge
	received   prometheus.Counter
	dropped    prometheus.Counter
}

// newFlowHub returns the flow relay of s, its metrics registered.
func newFlowHub(s *Server) (*flowHub, error) {
	const ns, sub = "naples", "nimbus"
	m := &flowMetrics{
		observers: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "flow_observers",
			Help: "ObserveFlows streams open, at most --max-flow-observers.",
		}),
		refused: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "flow_observers_refused_total",
			Help: "ObserveFlows streams refused because --max-flow-observers were open.",
		}),
		taps: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "flow_taps",
			Help: "Agents with a flow tap open to this nimbus.",
		}),
		received: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "flow_records_received_total",
			Help: "Flow records the agents' taps sent, each counted once however many observers it went to.",
		}),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "flow_records_dropped_total",
			Help: "Flow records dropped for observers that read slower than they came (their --flow-observer-buffer was full), reported to them as lost_nimbus.",
		}),
	}
	var err error
	if m.unregister, err = telemetry.Register(s.opts.Registerer, "Server", m.observers, m.refused, m.taps, m.received, m.dropped); err != nil {
		return nil, err
	}
	return &flowHub{s: s, log: s.log, metrics: m, taps: map[string]*flowTap{}, observers: map[uint64]*flowObserver{}}, nil
}

// flowTap is one agent's open FlowTap stream.
type flowTap struct {
	node string
	// end ends the tap's stream, as when a newer tap of the node replaces it.
	end context.CancelCauseFunc
	// wake has room for one signal: pending has messages.
	wake chan struct{}

	// mu guards pending and subs.
	mu sync.Mutex
	// pending are the messages to send the agent, in order.
	pending []*flowsv1.FlowTapDown
	// subs holds the tap's subscriptions and, for each, the lost_agent count last sent.
	subs map[uint64]uint64
}

// enqueue queues a message for the agent; it never waits. The cancel of a subscription
// not sent yet takes the subscription out instead, so that what waits for an agent that
// reads slowly is bounded by the observers open, not by how many came and went.
func (t *flowTap) enqueue(m *flowsv1.FlowTapDown) {
	t.mu.Lock()
	id := m.GetSubscription()
	queued := false
	if m.GetCancel() {
		delete(t.subs, id)
		if i := slices.IndexFunc(t.pending, func(p *flowsv1.FlowTapDown) bool { return p.GetSubscription() == id }); i >= 0 {
			t.pending = slices.Delete(t.pending, i, i+1)
			queued = true
		}
	} else {
		t.subs[id] = 0
	}
	if !queued {
		t.pending = append(t.pending, m)
	}
	t.mu.Unlock()
	select {
	case t.wake <- struct{}{}:
	default:
	}
}

// lostAgentDelta records a subscription's lost_agent count and returns how much it grew,
// and whether the subscription is the tap's.
func (t *flowTap) lostAgentDelta(sub, lost uint64) (uint64, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	last, ok := t.subs[sub]
	if !ok {
		return 0, false
	}
	t.subs[sub] = lost
	if lost < last {
		return lost, true
	}
	return lost - last, true
}

// errTapReplaced ends a tap that a newer tap of the same node replaced.
var errTapReplaced = errors.New("replaced by a newer flow tap of the same node")

// FlowTap serves an agent's flow tap: it sends the subscriptions of the observers of the
// agent's node and routes the records the agent sends to them.
func (h *flowHub) FlowTap(stream grpc.BidiStreamingServer[flowsv1.FlowTapUp, flowsv1.FlowTapDown]) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	node := first.GetNode()
	if err := nimbusv1.ValidateNodeName(node); err != nil {
		return status.Errorf(codes.InvalidArgument, "flow tap: node %q: %v", node, err)
	}
	ctx, cancel := context.WithCancelCause(stream.Context())
	defer cancel(nil)
	t := &flowTap{node: node, end: cancel, wake: make(chan struct{}, 1), subs: map[uint64]uint64{}}
	h.openTap(t)
	defer h.closeTap(t)
	// The headers tell the agent that the tap is taken.
	if err := stream.SendHeader(metadata.MD{}); err != nil {
		return err
	}

	errc := make(chan error, 1)
	go func() { errc <- h.receiveTap(t, stream) }()
	for {
		select {
		case err := <-errc:
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		case <-ctx.Done():
			if errors.Is(context.Cause(ctx), errTapReplaced) {
				return status.Error(codes.Aborted, errTapReplaced.Error())
			}
			return nil
		case <-h.s.done:
			return status.Error(codes.Unavailable, ErrClosed.Error())
		case <-t.wake:
		}
		t.mu.Lock()
		pending := t.pending
		t.pending = nil
		t.mu.Unlock()
		for _, m := range pending {
			if err := stream.Send(m); err != nil {
				return err
			}
		}
	}
}

// receiveTap routes what the agent sends on the tap to the observers, until the stream
// fails or ends.
func (h *flowHub) receiveTap(t *flowTap, stream grpc.BidiStreamingServer[flowsv1.FlowTapUp, flowsv1.FlowTapDown]) error {
	for {
		up, err := stream.Recv()
		if err != nil {
			return err
		}
		if n := up.GetNode(); n != "" && n != t.node {
			return status.Errorf(codes.InvalidArgument, "flow tap of node %q: message of node %q", t.node, n)
		}
		id := up.GetSubscription()
		delta, ok := t.lostAgentDelta(id, up.GetLostAgent())
		if !ok {
			continue // cancelled meanwhile
		}
		h.metrics.received.Add(float64(len(up.GetFlows())))
		h.mu.Lock()
		o := h.observers[id]
		h.mu.Unlock()
		if o == nil {
			continue
		}
		o.add(up.GetFlows(), nodeDelta{node: t.node, datapath: up.GetLostDatapath(), suppressed: up.GetSuppressed(), agent: delta,
			err: up.GetError(), done: up.GetDone() || up.GetError() != ""}, "")
	}
}

// openTap makes t its node's tap, replacing an older one, and subscribes it for every
// observer of the node.
func (h *flowHub) openTap(t *flowTap) {
	h.mu.Lock()
	old := h.taps[t.node]
	h.taps[t.node] = t
	observers := 0
	for _, o := range h.observers {
		if o.wants(t.node) {
			// Marked before the agent can answer, so that its answer counts.
			o.tapped(t.node, true)
			t.enqueue(&flowsv1.FlowTapDown{Subscription: o.id, Filter: o.filter})
			observers++
		}
	}
	h.mu.Unlock()
	if old != nil {
		old.end(errTapReplaced)
	} else {
		h.metrics.taps.Inc()
	}
	h.log.Debug("flow tap opened", "node", t.node, "observers", observers)
}

// closeTap removes t, unless a newer tap replaced it, and tells its node's observers.
func (h *flowHub) closeTap(t *flowTap) {
	h.mu.Lock()
	if h.taps[t.node] != t {
		h.mu.Unlock()
		return
	}
	delete(h.taps, t.node)
	for _, o := range h.observers {
		if o.wants(t.node) {
			o.tapped(t.node, false)
		}
	}
	h.mu.Unlock()
	h.metrics.taps.Dec()
	h.log.Debug("flow tap closed", "node", t.node)
}

// nodeDelta is what a batch tells of its node besides its records: the datapath's
// counts, the growth of the agent's and nimbus's counts, an error, and whether the node's
// subscription ended.
type nodeDelta struct {
	node                 string
	datapath, suppressed uint64
	agent, nimbus        uint64
	err                  string
	done                 bool
}

// flowObserver is one ObserveFlows stream: the records queued for it, bounded, and what
// it is to be told of the nodes.
type flowObserver struct {
	id     uint64
	filter *delphiv1.FlowsRequest
	// nodes holds the nodes asked for; nil asks for every node.
	nodes map[string]bool
	// buffer bounds queue.
	buffer  int
	dropped prometheus.Counter
	// wake has room for one signal: something changed.
	wake chan struct{}

	// mu guards the fields below. The hub's lock, when held too, is taken first.
	mu    sync.Mutex
	queue []*delphiv1.Flow
	// states holds what the observer is told of each node; changed the nodes whose state
	// changed since the last response.
	states  map[string]*flowsv1.NodeFlows
	changed map[string]bool
	// local holds the nodes tapped on this replica, and whether their subscription is
	// still under way (not done); for an observer that does not follow, its end.
	local map[string]bool
	// peers holds what each peer's stream said, by peer name.
	peers map[string]*peerObservation
}

// peerObservation is what an observer knows of a peer's stream.
type peerObservation struct {
	// up tells that the stream is open and has answered; ended that it ended for good.
	up, ended bool
	// notConnected is the peer's latest list of the nodes it has no tap of.
	notConnected []string
	// counts are the peer's latest cumulative counts per node, from which the growth is
	// taken.
	counts map[string]*flowsv1.NodeFlows
}

// wants tells whether the observer asks for the node's records.
func (o *flowObserver) wants(node string) bool { return o.nodes == nil || o.nodes[node] }

// signal wakes the observer's stream up.
func (o *flowObserver) signal() {
	select {
	case o.wake <- struct{}{}:
	default:
	}
}

// add queues records, as many as the buffer has room for, the others counted lost for
// their node, and records what d tells of its node. from names the peer they came
// through, "" for this replica's tap.
func (o *flowObserver) add(flows []*delphiv1.Flow, d nodeDelta, from string) {
	o.mu.Lock()
	room := max(o.buffer-len(o.queue), 0)
	kept := flows[:min(room, len(flows))]
	o.queue = append(o.queue, kept...)
	var droppedByNode map[string]uint64
	if lost := len(flows) - len(kept); lost > 0 {
		o.dropped.Add(float64(lost))
		droppedByNode = map[string]uint64{}
		for _, f := range flows[len(kept):] {
			droppedByNode[cmp.Or(f.GetNode(), d.node)]++
		}
	}
	if d.node != "" {
		st := o.stateLocked(d.node)
		changed := false
		if st.LostDatapath != d.datapath || st.Suppressed != d.suppressed {
			st.LostDatapath, st.Suppressed, changed = d.datapath, d.suppressed, true
		}
		if d.agent > 0 || d.nimbus > 0 || st.Error != d.err {
			st.LostAgent += d.agent
			st.LostNimbus += d.nimbus
			st.Error = d.err
			changed = true
		}
		if changed {
			o.changed[d.node] = true
		}
		if from == "" && d.done {
			if _, ok := o.local[d.node]; ok {
				o.local[d.node] = false
			}
		}
	}
	for node, n := range droppedByNode {
		o.stateLocked(node).LostNimbus += n
		o.changed[node] = true
	}
	o.mu.Unlock()
	o.signal()
}

// stateLocked returns the node's state, made when missing. o.mu is held.
func (o *flowObserver) stateLocked(node string) *flowsv1.NodeFlows {
	st := o.states[node]
	if st == nil {
		st = &flowsv1.NodeFlows{Node: node}
		o.states[node] = st
	}
	return st
}

// tapped records that the node's tap on this replica opened (with the observer's
// subscription) or closed. h.mu may be held: it comes before o.mu.
func (o *flowObserver) tapped(node string, open bool) {
	o.mu.Lock()
	if open {
		o.local[node] = true
	} else if _, ok := o.local[node]; ok {
		delete(o.local, node)
	}
	o.mu.Unlock()
	o.signal()
}

// take returns the queued records, at most flowResponseBatch, the nodes whose state
// changed, and whether records are left.
func (o *flowObserver) take() (flows []*delphiv1.Flow, nodes []*flowsv1.NodeFlows, more bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := min(len(o.queue), flowResponseBatch)
	flows = slices.Clone(o.queue[:n])
	o.queue = slices.Delete(o.queue, 0, n)
	for node := range o.changed {
		st := o.states[node]
		nodes = append(nodes, &flowsv1.NodeFlows{Node: node, LostDatapath: st.LostDatapath, Suppressed: st.Suppressed,
			LostAgent: st.LostAgent, LostNimbus: st.LostNimbus, Error: st.Error})
	}
	clear(o.changed)
	slices.SortFunc(nodes, func(a, b *flowsv1.NodeFlows) int { return cmp.Compare(a.Node, b.Node) })
	return flows, nodes, len(o.queue) > 0
}

// notConnected returns the nodes asked for that no tap serves: none on this replica,
// and no peer whose stream is up says it has one. isTapped tells whether this replica
// has a tap of a node.
func (o *flowObserver) notConnected(isTapped func(node string) bool) []string {
	if o.nodes == nil {
		return nil
	}
	// isTapped takes the hub's lock, which comes before o.mu.
	var untapped []string
	for node := range o.nodes {
		if !isTapped(node) {
			untapped = append(untapped, node)
		}
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []string
	for _, node := range untapped {
		connected := false
		for _, p := range o.peers {
			if p.up && !slices.Contains(p.notConnected, node) {
				connected = true
				break
			}
		}
		if !connected {
			out = append(out, node)
		}
	}
	slices.Sort(out)
	return out
}

// finished tells, for an observer that does not follow, that every subscription it had
// ended and every peer stream ended.
func (o *flowObserver) finished() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, under := range o.local {
		if under {
			return false
		}
	}
	for _, p := range o.peers {
		if !p.ended {
			return false
		}
	}
	return len(o.queue) == 0 && len(o.changed) == 0
}

// isTapped tells whether this replica has a tap of the node.
func (h *flowHub) isTapped(node string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.taps[node] != nil
}

// checkObserveRequest returns the InvalidArgument error of a request nimbus can tell is
// wrong without an agent: a node name or a filter value that is no such thing. The
// agents check the filters again, and refuse what they cannot take.
func checkObserveRequest(req *flowsv1.ObserveFlowsRequest) error {
	for _, n := range req.GetNodes() {
		if err := nimbusv1.ValidateNodeName(n); err != nil {
			return status.Errorf(codes.InvalidArgument, "nodes: %q: %v", n, err)
		}
	}
	f := req.GetFilter()
	switch v := f.GetVerdict(); v {
	case "", "allowed", "denied":
	default:
		return status.Errorf(codes.InvalidArgument, "filter.verdict %q: want allowed or denied", v)
	}
	if s := f.GetSince(); s != nil && (!s.IsValid() || s.AsDuration() < 0) {
		return status.Errorf(codes.InvalidArgument, "filter.since %v: want a duration of zero or more", s)
	}
	for _, p := range []struct{ field, value string }{{"from", f.GetFrom()}, {"to", f.GetTo()}} {
		if p.value == "" {
			continue
		}
		if _, _, err := delphiv1.ParseFlowPeer(p.value); err != nil {
			return status.Errorf(codes.InvalidArgument, "filter.%s %q: %v", p.field, p.value, err)
		}
	}
	if s := f.GetPolicy(); s != "" {
		if _, err := delphiv1.ParseFlowPolicy(s); err != nil {
			return status.Errorf(codes.InvalidArgument, "filter.policy %q: %v", s, err)
		}
	}
	return nil
}

// ObserveFlows streams the flow records of the nodes asked for, filtered at their
// agents, from this replica's agents and, unless local_only, its peers'.
func (h *flowHub) ObserveFlows(req *flowsv1.ObserveFlowsRequest, stream grpc.ServerStreamingServer[flowsv1.ObserveFlowsResponse]) error {
	if err := checkObserveRequest(req); err != nil {
		return err
	}
	if h.s.isClosed() {
		return status.Error(codes.Unavailable, ErrClosed.Error())
	}
	filter := req.GetFilter()
	if filter == nil {
		filter = &delphiv1.FlowsRequest{}
	}
	o := &flowObserver{
		filter:  filter,
		buffer:  h.s.opts.Limits.FlowObserverBuffer,
		dropped: h.metrics.dropped,
		wake:    make(chan struct{}, 1),
		states:  map[string]*flowsv1.NodeFlows{},
		changed: map[string]bool{},
		local:   map[string]bool{},
		peers:   map[string]*peerObservation{},
	}
	if len(req.GetNodes()) > 0 {
		o.nodes = map[string]bool{}
		for _, n := range req.GetNodes() {
			o.nodes[n] = true
		}
	}
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	var peers []Peer
	if !req.GetLocalOnly() {
		peers = h.s.peers.list()
		for _, p := range peers {
			o.peers[p.Name] = &peerObservation{}
		}
	}
	if err := h.openObserver(o); err != nil {
		return err
	}
	defer h.closeObserver(o)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	for _, p := range peers {
		wg.Go(func() { h.observePeer(ctx, o, p, req) })
	}

	// The first response goes out at once; the others when they carry records, a node's
	// change or a change of the nodes not connected.
	first := true
	var sentNC []string
	for {
		flows, nodes, more := o.take()
		nc := o.notConnected(h.isTapped)
		if first || len(flows) > 0 || len(nodes) > 0 || !slices.Equal(nc, sentNC) {
			if err := stream.Send(&flowsv1.ObserveFlowsResponse{Flows: flows, Nodes: nodes, NotConnected: nc}); err != nil {
				return err
			}
			sentNC = nc
		}
		first = false
		if more {
			continue
		}
		if !filter.GetFollow() && o.finished() {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-h.s.done:
			return status.Error(codes.Unavailable, ErrClosed.Error())
		case <-o.wake:
		}
	}
}

// openObserver registers o, unless Limits.FlowObservers are open, and subscribes the taps
// of its nodes.
func (h *flowHub) openObserver(o *flowObserver) error {
	h.mu.Lock()
	if limit := h.s.opts.Limits.FlowObservers; len(h.observers) >= limit {
		h.mu.Unlock()
		h.metrics.refused.Inc()
		return status.Errorf(codes.ResourceExhausted, "%d flow observers are open, the most this nimbus allows (nimbus --max-flow-observers); close one first", limit)
	}
	h.nextID++
	o.id = h.nextID
	h.observers[o.id] = o
	for node, t := range h.taps {
		if o.wants(node) {
			o.tapped(node, true)
			t.enqueue(&flowsv1.FlowTapDown{Subscription: o.id, Filter: o.filter})
		}
	}
	h.mu.Unlock()
	h.metrics.observers.Inc()
	return nil
}

// closeObserver removes o and cancels its subscriptions.
func (h *flowHub) closeObserver(o *flowObserver) {
	h.mu.Lock()
	delete(h.observers, o.id)
	for node, t := range h.taps {
		if o.wants(node) {
			t.enqueue(&flowsv1.FlowTapDown{Subscription: o.id, Cancel: true})
		}
	}
	h.mu.Unlock()
	h.metrics.observers.Dec()
}

// observePeer streams the records of the peer's agents for o, with local_only, opening
// the stream again with backoff when it fails, until ctx ends or, for an observer that
// does not follow, the peer's stream ends.
func (h *flowHub) observePeer(ctx context.Context, o *flowObserver, p Peer, req *flowsv1.ObserveFlowsRequest) {
	bo := backoff.Backoff{Min: peerBackoffMin, Max: peerBackoffMax}
	sub := &flowsv1.ObserveFlowsRequest{Filter: req.GetFilter(), Nodes: req.GetNodes(), LocalOnly: true}
	for {
		ended, err := h.observePeerOnce(ctx, o, p, sub, bo.Reset)
		// An observer that does not follow asks once: a peer that failed has nothing more
		// to add to the records of now, and its nodes count as not connected. One whose
		// stream ended of itself keeps what it last said of its nodes.
		done := ended || !req.GetFilter().GetFollow()
		o.mu.Lock()
		po := o.peers[p.Name]
		if !ended {
			po.up, po.notConnected, po.counts = false, nil, nil
		}
		if done || ctx.Err() != nil {
			po.ended = true
		}
		o.mu.Unlock()
		o.signal()
		if done || ctx.Err() != nil {
			if err != nil && ctx.Err() == nil {
				h.log.Warn("flow stream from peer replica failed", "peer", p.Name, "error", err)
			}
			return
		}
		delay := bo.Next()
		h.log.Debug("flow stream from peer replica failed; opening it again", "peer", p.Name, "error", err, "delay", delay)
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			o.mu.Lock()
			o.peers[p.Name].ended = true
			o.mu.Unlock()
			return
		case <-t.C:
		}
	}
}

// observePeerOnce runs one local_only ObserveFlows stream on the peer, feeding o; done
// tells that it ended of itself (an observer that does not follow). up is called once
// the peer answered.
func (h *flowHub) observePeerOnce(ctx context.Context, o *flowObserver, p Peer, req *flowsv1.ObserveFlowsRequest, up func()) (done bool, err error) {
	conn, err := h.s.peers.dialPeer(p)
	if err != nil {
		return false, err
	}
	defer conn.Close()
	stream, err := flowsv1.NewFlowsClient(conn).ObserveFlows(ctx, req)
	if err != nil {
		return false, err
	}
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return true, nil
		}
		if err != nil {
			return false, err
		}
		up()
		o.mu.Lock()
		po := o.peers[p.Name]
		po.up, po.notConnected = true, resp.GetNotConnected()
		if po.counts == nil {
			po.counts = map[string]*flowsv1.NodeFlows{}
		}
		var deltas []nodeDelta
		for _, n := range resp.GetNodes() {
			last := po.counts[n.GetNode()]
			if last == nil {
				last = &flowsv1.NodeFlows{}
			}
			deltas = append(deltas, nodeDelta{node: n.GetNode(), datapath: n.GetLostDatapath(), suppressed: n.GetSuppressed(),
				agent: grown(last.GetLostAgent(), n.GetLostAgent()), nimbus: grown(last.GetLostNimbus(), n.GetLostNimbus()), err: n.GetError()})
			po.counts[n.GetNode()] = n
		}
		o.mu.Unlock()
		o.add(resp.GetFlows(), nodeDelta{}, p.Name)
		for _, d := range deltas {
			o.add(nil, d, p.Name)
		}
	}
}

// grown returns how much a cumulative count grew from last to now; a count that went
// down started over.
func grown(last, now uint64) uint64 {
	if now < last {
		return now
	}
	return now - last
}

// list returns the peers the hub pushes to; none on a nil hub.
func (h *peerHub) list() []Peer {
	if h == nil {
		return nil
	}
	h.mu.RLock()
	defer h.mu.RUnlock()
	peers := make([]Peer, 0, len(h.pushers))
	for _, p := range h.pushers {
		peers = append(peers, p.peer)
	}
	return peers
}

// dialPeer returns a connection to the peer, with the dial options of the push streams.
func (h *peerHub) dialPeer(p Peer) (*grpc.ClientConn, error) {
	target, err := address.Parse(p.Address)
	if err != nil {
		return nil, fmt.Errorf("peer replica %q: address %q: %w", p.Name, p.Address, err)
	}
	conn, err := grpc.NewClient(target.GRPCTarget(), h.dial...)
	if err != nil {
		return nil, fmt.Errorf("dialing peer replica %q at %s: %w", p.Name, target, err)
	}
	return conn, nil
}
