package nimbus

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/naplesnet/naples/internal/address"
	"github.com/naplesnet/naples/internal/backoff"
	"github.com/naplesnet/naples/internal/telemetry"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// Replicas
//
// Several nimbus replicas can serve the same objects (Options.ReplicaName names one; the
// objects are shared through the store they have in common). Each agent watches one
// replica and reports its statuses to that one, but Get, List, WatchStatus and
// `naplesctl wait` give the same answer on every replica, because every replica holds
// what every agent reported, as a single nimbus does: the replicas push to each other
// what their own agents report.
//
// Where statuses live. Statuses never go to the shared store: at 10,000 nodes and 10,000
// objects they are 100 million records, which change with every rollout; etcd would
// take every one of them as a write. Each replica keeps in memory what its agents and its
// peers' agents reported: per node its watermark and its records (exceptions, statuses
// with operational data, and every status of an agent that sends no watermark), each
// with the name of the replica its agent reported it to (its origin). A replica opens one
// push stream (the PeerStatus call) to each of its peers and sends on it first its full
// state, the records and the watermarks whose origin it is and which nodes watch it, then
// every change of those as it happens. A replica sends only what its own agents told it,
// never what it received from a peer, so nothing goes around in circles. A burst of
// changes coalesces: what changes while a frame is being sent goes in the next one, as
// one entry per status or watermark however often it changed, in frames of at most
// 1 MiB. Pushing never holds up a write, a report or a watch: a peer that is slow or gone
// only delays its own stream. A stream that fails is opened again with backoff (100ms
// doubling up to 10s), and starts over with the full state. When two replicas hold
// reports, or watermarks, of the same node from different origins, as when the node moved
// from one to the other, the one with the later update_time wins, and on a tie the one
// that arrived last; a watermark that moves to another replica is updated then.
//
// Watermarks across replicas. A replica takes its agents' watermarks as a single nimbus
// does (watermark.go) and pushes each in PeerFrame's watermarks, after the records of the
// frame, with its moves since the last frame (all those it keeps in the full state), each
// with its time, so that every replica derives the same update times. A peer keeps it with
// the replica as its origin and applies the rules the replica applied: it drops the node's
// records the watermark says (derivable), and when the node comes from another replica, or
// had no watermark there, the node's records of other origins, which the agent did not
// send again (the agent sends all of its records before its first watermark on a stream,
// and the replica pushed them before the watermark). A record a replica deletes for
// another cause than the shared store (a status its watermark says came, or a stream's
// first watermark dropped it) is pushed as a report with the key and a watermark naming
// the node and no status: the peer deletes its copy of that replica's record. A deletion
// of the node's Node object drops its watermark and records on every replica through the
// store, and a peer's frame built before the deletion and taken after brings none of them
// back (nodesDeletedAfter). What a replica that starts receives is thus the nodes'
// watermarks and their records, not a status per object; a node that moves sends its new
// replica its records and its watermark again, not every status.
//
// Which nodes watch. A node counts as watching, as a target of the objects for every node
// and for staleness, when it has a watch stream open on this replica or on a peer whose
// push stream to this replica is up. When that push stream ends (the peer died, was
// stopped or cannot be reached), the nodes it said were watching count as having stopped
// then: their statuses turn stale after Options.StaleAfter unless they watch another
// replica by then, which their agents do as soon as they notice. A push stream that
// carries nothing for 15s is taken for dead; an idle one carries a heartbeat every 5s.
//
// When a replica dies, nothing is lost: its peers hold a copy of every record and
// watermark its agents reported. The agents connect to another replica, resume their
// watch, and report their records and watermark again on their new status stream, which
// the new replica pushes to the others; each replaces the dead replica's copy. When the
// replica comes back, it starts empty and its peers push their full state to it.
//
// Volumes and memory: docs/replicas.md and docs/status.md. With agents that report
// watermarks, each replica holds, and a replica that starts receives, the nodes'
// watermarks and their records, not nodes × objects statuses; agents that send every
// status (older ones) cost as before: about 360 bytes per status on every replica.
//
// Security. With TLS, PeerStatus takes only replica certificates (Organization
// naples:replica, see internal/pki), whose name must be the name the stream's frames
// give, and a replica certificate may call nothing else; see auth.go.

// Peer is a replica this Server pushes to.
type Peer struct {
	// Name is the peer's Options.ReplicaName.
	Name string
	// Address is where the peer serves nimbus, as internal/address parses it:
	// "unix:///path" or "tcp://host:port".
	Address string
}

// Settings of the push streams between replicas.
const (
	// maxPeerFrameBytes bounds the reports and presence of one PeerFrame; an entry larger
	// than that goes in a frame of its own.
	maxPeerFrameBytes = 1 << 20
	// peerHeartbeat is how often a push stream that sent nothing else sends an empty
	// frame, so that its peer knows it is alive.
	peerHeartbeat = 5 * time.Second
	// peerTimeout is how long a peer waits for a frame before it takes the stream for dead.
	peerTimeout = 3 * peerHeartbeat
	// peerBackoffMin and peerBackoffMax bound the delay before a failed push stream is
	// opened again.
	peerBackoffMin = 100 * time.Millisecond
	peerBackoffMax = 10 * time.Second
)

// Values of the direction label of naples_nimbus_peer_reports_total.
const (
	peerSent     = "sent"
	peerReceived = "received"
)

// errPeerReplaced ends a peer's push stream when a newer one of the same peer replaces it.
var errPeerReplaced = errors.New("replaced by a newer push stream of the same replica")

// peerMetrics are the metrics of a replica's push streams.
type peerMetrics struct {
	unregister func()
	// peers is how many push streams to peers are up.
	peers   prometheus.Gauge
	reports *prometheus.CounterVec
}

// newPeerMetrics creates the metrics and registers them with reg. On error nothing stays
// registered.
func newPeerMetrics(reg prometheus.Registerer) (*peerMetrics, error) {
	const ns, sub = "naples", "nimbus"
	m := &peerMetrics{
		peers: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "peers",
			Help: "Push streams from this replica to its peer replicas that are up: connected, with the full state sent.",
		}),
		reports: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "peer_reports_total",
			Help: "Status reports pushed to peer replicas (direction sent) and taken from them (received).",
		}, []string{"direction"}),
	}
	m.reports.WithLabelValues(peerSent)
	m.reports.WithLabelValues(peerReceived)
	var err error
	if m.unregister, err = telemetry.Register(reg, "Server", m.peers, m.reports); err != nil {
		return nil, err
	}
	return m, nil
}

// peerHub is a replica's side of the exchange with its peers: a pusher per peer, and the
// push streams the peers have open to it. Its methods do nothing on a nil hub, which is
// what a Server that is no replica has.
type peerHub struct {
	s       *Server
	name    string
	dial    []grpc.DialOption
	metrics *peerMetrics

	// mu guards pushers and closed. Marks take it for reading, under s.mu when they come
	// from a watch stream; it is never held while taking s.mu or waiting for a pusher.
	mu      sync.RWMutex
	pushers map[string]*pusher
	closed  bool

	// sessionsMu guards sessions. It is taken inside store write transactions only, so
	// that what a transaction applies for a peer's stream and whether that stream is
	// still the peer's current one go together.
	sessionsMu sync.Mutex
	// sessions holds the current push stream of each peer that has one open to us.
	sessions map[string]*peerSession
}

// newPeerHub returns the hub of the replica s, with its metrics registered and no peer yet.
func newPeerHub(s *Server) (*peerHub, error) {
	m, err := newPeerMetrics(s.opts.Registerer)
	if err != nil {
		return nil, err
	}
	dial := []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 10 * time.Second, Timeout: 5 * time.Second, PermitWithoutStream: true}),
	}
	return &peerHub{
		s:        s,
		name:     s.opts.ReplicaName,
		dial:     append(dial, s.opts.PeerDialOptions...),
		metrics:  m,
		pushers:  map[string]*pusher{},
		sessions: map[string]*peerSession{},
	}, nil
}

// SetPeers sets the replicas the Server pushes to: it starts pushing to each peer it does
// not push to yet, and stops pushing to those that are not among peers any more, or whose
// address changed. A peer with the Server's own name is left out, so every replica can be
// handed the same list. A peer whose address does not parse is logged and left out. It
// does nothing on a Server that is no replica (Options.ReplicaName is empty) or that is
// closed, and never waits for a peer.
func (s *Server) SetPeers(peers []Peer) {
	h := s.peers
	if h == nil {
		if len(peers) > 0 {
			s.log.Warn("ignoring peers: this nimbus is no replica (no replica name)", "peers", len(peers))
		}
		return
	}
	want := map[string]Peer{}
	for _, p := range peers {
		if p.Name == "" || p.Name == h.name {
			continue
		}
		want[p.Name] = p
	}
	var stopped []*pusher
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return
	}
	for name, p := range h.pushers {
		if w, ok := want[name]; !ok || w.Address != p.peer.Address {
			delete(h.pushers, name)
			stopped = append(stopped, p)
		}
	}
	for name, peer := range want {
		if _, ok := h.pushers[name]; ok {
			continue
		}
		target, err := address.Parse(peer.Address)
		if err != nil {
			s.log.Error("leaving out a peer replica", "peer", name, "error", err)
			continue
		}
		p := newPusher(h, peer, target)
		h.pushers[name] = p
		s.log.Info("pushing statuses to peer replica", "peer", name, "address", peer.Address)
	}
	h.mu.Unlock()
	for _, p := range stopped {
		p.stop()
		s.log.Info("stopped pushing statuses to peer replica", "peer", p.peer.Name, "address", p.peer.Address)
	}
}

// close stops every pusher and unregisters the metrics. The peers' push streams to this
// Server end with it, on s.done.
func (h *peerHub) close() {
	if h == nil {
		return
	}
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return
	}
	h.closed = true
	pushers := slices.Collect(maps.Values(h.pushers))
	clear(h.pushers)
	h.mu.Unlock()
	for _, p := range pushers {
		p.stop()
	}
	h.metrics.unregister()
}

// statusChanged marks, in every pusher, the status the node reported to this replica
// about the object with the key.
func (h *peerHub) statusChanged(key nimbusv1.Key, node string) {
	if h == nil {
		return
	}
	h.mu.RLock()
	defer h.mu.RUnlock()
	for _, p := range h.pushers {
		p.markStatus(key, node)
	}
}

// watermarkChanged marks, in every pusher, the watermark the node reported to this
// replica.
func (h *peerHub) watermarkChanged(node string) {
	if h == nil {
		return
	}
	h.mu.RLock()
	defer h.mu.RUnlock()
	for _, p := range h.pushers {
		p.markWatermark(node)
	}
}

// presenceChanged marks, in every pusher, the node, whose watch streams on this replica
// opened or ended.
func (h *peerHub) presenceChanged(node string) {
	if h == nil {
		return
	}
	h.mu.RLock()
	defer h.mu.RUnlock()
	for _, p := range h.pushers {
		p.markNode(node)
	}
}

// statusKey names a status: the object's key and the node.
type statusKey struct {
	key  nimbusv1.Key
	node string
}

// pusher keeps the push stream to one peer: it sends the replica's full state, then what
// is marked, coalesced, and starts over on a new stream when one fails. What it holds is
// bounded by the statuses and the nodes there are, however slow the peer.
type pusher struct {
	hub    *peerHub
	peer   Peer
	target address.Address
	log    *slog.Logger
	// cancel ends the pusher's loop, which closes done when it returns.
	cancel context.CancelFunc
	done   chan struct{}
	// wake has room for one signal: something was marked since the last take.
	wake chan struct{}

	// mu guards statuses, watermarks and nodes.
	mu sync.Mutex
	// statuses holds the statuses marked: reported to this replica, or deleted, since the
	// last take.
	statuses map[statusKey]struct{}
	// watermarks holds the nodes whose watermarks were marked: reported to this replica
	// since the last take.
	watermarks map[string]struct{}
	// nodes holds the nodes marked: their watch streams on this replica changed.
	nodes map[string]struct{}
}

// newPusher starts pushing to the peer.
func newPusher(h *peerHub, peer Peer, target address.Address) *pusher {
	ctx, cancel := context.WithCancel(context.Background())
	p := &pusher{
		hub:        h,
		peer:       peer,
		target:     target,
		log:        h.s.log.With("peer", peer.Name, "address", peer.Address),
		cancel:     cancel,
		done:       make(chan struct{}),
		wake:       make(chan struct{}, 1),
		statuses:   map[statusKey]struct{}{},
		watermarks: map[string]struct{}{},
		nodes:      map[string]struct{}{},
	}
	go p.run(ctx)
	return p
}

// stop ends the push stream and waits for the pusher to return.
func (p *pusher) stop() {
	p.cancel()
	<-p.done
}

// markStatus marks the status the node reported about the object with the key.
func (p *pusher) markStatus(key nimbusv1.Key, node string) {
	p.mu.Lock()
	p.statuses[statusKey{key, node}] = struct{}{}
	p.mu.Unlock()
	p.signal()
}

// markWatermark marks the node's watermark.
func (p *pusher) markWatermark(node string) {
	p.mu.Lock()
	p.watermarks[node] = struct{}{}
	p.mu.Unlock()
	p.signal()
}

// markNode marks the node's presence.
func (p *pusher) markNode(node string) {
	p.mu.Lock()
	p.nodes[node] = struct{}{}
	p.mu.Unlock()
	p.signal()
}

// signal wakes the pusher up, unless a wake-up is pending already.
func (p *pusher) signal() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// take returns what was marked and starts over. A view of the store taken after take
// sees every change marked before it. The sets that start over are made as large as the
// ones taken: during a burst each frame's marks are about as many as the last's, and a
// set grown mark by mark from nothing rehashed its way up for every frame (at 10,000
// agents, marking took a sixth of a replica's CPU on its agents' reports, most of it
// rehashing).
func (p *pusher) take() (statuses map[statusKey]struct{}, watermarks, nodes map[string]struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	statuses, watermarks, nodes = p.statuses, p.watermarks, p.nodes
	p.statuses = make(map[statusKey]struct{}, len(statuses))
	p.watermarks = make(map[string]struct{}, len(watermarks))
	p.nodes = make(map[string]struct{}, len(nodes))
	return statuses, watermarks, nodes
}

// run pushes until ctx ends, opening a new stream with backoff whenever one fails.
func (p *pusher) run(ctx context.Context) {
	defer close(p.done)
	bo := backoff.Backoff{Min: peerBackoffMin, Max: peerBackoffMax}
	failing := false
	for {
		up, err := p.push(ctx)
		if ctx.Err() != nil {
			return
		}
		if up {
			bo.Reset()
			failing = false
		}
		delay := bo.Next()
		// The first failure is worth a warning; the retries of a peer that stays away are not.
		level := slog.LevelDebug
		if !failing {
			level = slog.LevelWarn
		}
		failing = true
		p.log.Log(ctx, level, "push stream to peer replica failed; opening it again", "error", err, "delay", delay)
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// push opens one push stream, sends the full state and then the changes until the stream
// fails or ctx ends. up tells that the full state was sent.
func (p *pusher) push(ctx context.Context) (up bool, err error) {
	h := p.hub
	conn, err := grpc.NewClient(p.target.GRPCTarget(), h.dial...)
	if err != nil {
		return false, fmt.Errorf("dialing %s: %w", p.target, err)
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := nimbusv1.NewNimbusClient(conn).PeerStatus(ctx)
	if err != nil {
		return false, fmt.Errorf("opening the push stream: %w", err)
	}
	// The peer answers only when it ends the stream. Waiting for that apart lets the loop
	// notice a peer that ended the stream while there is nothing to send.
	var endErr error
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		endErr = stream.RecvMsg(new(nimbusv1.PeerStatusResponse))
		if endErr == nil {
			endErr = errors.New("the peer answered before the stream ended")
		}
	}()
	defer func() {
		cancel()
		<-ended
	}()
	// send sends a frame; when the peer ended the stream, the error is the peer's.
	send := func(f *nimbusv1.PeerFrame) error {
		if err := stream.Send(f); err != nil {
			if errors.Is(err, io.EOF) {
				<-ended
				return fmt.Errorf("the peer ended the push stream: %w", endErr)
			}
			return fmt.Errorf("sending to the peer: %w", err)
		}
		h.metrics.reports.WithLabelValues(peerSent).Add(float64(len(f.GetReports())))
		return nil
	}

	// The full state covers every mark made so far.
	p.take()
	// sent holds the watermark record last sent of each node: the moves a record made
	// past it are the ones the peer has not had.
	sent := make(map[string]*watermarkRecord)
	v := h.s.view()
	fb := &peerFrameBuilder{send: send, frame: &nimbusv1.PeerFrame{Replica: h.name, Revision: v.revision()}}
	reports := 0
	for rec := range v.allStatuses() {
		if rec.Origin != h.name {
			continue
		}
		if err := fb.addStatus(rec); err != nil {
			return false, err
		}
		reports++
	}
	// The watermarks come after the records: a receiver takes a node's watermark once it
	// has the records the watermark does not say.
	watermarks := 0
	for rec := range v.allWatermarks() {
		if rec.Origin != h.name {
			continue
		}
		if err := fb.addWatermark(rec, nil); err != nil {
			return false, err
		}
		sent[rec.Node] = rec
		watermarks++
	}
	for rec := range v.allWatchNodes() {
		// A node that never watched this replica, and that this replica knows of no end
		// of a watch for, has nothing to tell.
		if rec.local() == 0 && rec.Since.IsZero() {
			continue
		}
		if err := fb.addPresence(rec); err != nil {
			return false, err
		}
	}
	// The first frame goes out even when empty: it names the replica.
	if err := fb.flush(true); err != nil {
		return false, err
	}
	h.metrics.peers.Inc()
	defer h.metrics.peers.Dec()
	p.log.Info("push stream to peer replica up", "reports", reports, "watermarks", watermarks, "revision", v.revision())

	heartbeat := time.NewTicker(peerHeartbeat)
	defer heartbeat.Stop()
	idle := true // nothing sent since the last tick
	for {
		select {
		case <-ctx.Done():
			return true, ctx.Err()
		case <-ended:
			return true, fmt.Errorf("the peer ended the push stream: %w", endErr)
		case <-heartbeat.C:
			if !idle {
				idle = true
				continue
			}
			if err := send(&nimbusv1.PeerFrame{Revision: h.s.view().revision()}); err != nil {
				return true, err
			}
		case <-p.wake:
			statuses, watermarks, nodes := p.take()
			v := h.s.view()
			fb := &peerFrameBuilder{send: send, frame: &nimbusv1.PeerFrame{Revision: v.revision()}}
			for k := range statuses {
				rec := v.nodeStatus(k.key, k.node)
				if rec != nil && rec.Origin == h.name {
					if err := fb.addStatus(rec); err != nil {
						return true, err
					}
					continue
				}
				// A status gone since, or replaced by a newer one from another replica,
				// is not this replica's any more: the peer drops the copy it holds.
				if err := fb.addDropped(k); err != nil {
					return true, err
				}
			}
			for node := range watermarks {
				// A watermark gone since (its Node object was deleted, which the peer
				// sees in the store too), or replaced by another replica's, is not this
				// replica's to send.
				rec := v.watermark(node)
				if rec == nil || rec.Origin != h.name {
					delete(sent, node)
					continue
				}
				if err := fb.addWatermark(rec, sent[node]); err != nil {
					return true, err
				}
				sent[node] = rec
			}
			for node := range nodes {
				rec := v.watchNode(node)
				if rec == nil {
					rec = &watchNodeRecord{Name: node}
				}
				if err := fb.addPresence(rec); err != nil {
					return true, err
				}
			}
			if err := fb.flush(false); err != nil {
				return true, err
			}
			idle = false
		}
	}
}

// peerFrameBuilder fills PeerFrames up to maxPeerFrameBytes and sends each full one.
type peerFrameBuilder struct {
	send  func(*nimbusv1.PeerFrame) error
	frame *nimbusv1.PeerFrame
	// size is the encoded length of the frame's reports, presence and watermarks.
	size int
}

// addStatus adds the record's status, sending the frame first when it does not fit.
func (b *peerFrameBuilder) addStatus(rec *statusRecord) error {
	r := &nimbusv1.StatusReport{Key: rec.Object.Proto(), Status: rec.Status}
	if err := b.room(r.SizeVT()); err != nil {
		return err
	}
	b.frame.Reports = append(b.frame.Reports, r)
	return nil
}

// addDropped adds a report that the replica holds no status of its own for the object
// and node of k any more: a report with the key and a watermark naming the node, and no
// status. The node's status of the object is then what its watermark says.
func (b *peerFrameBuilder) addDropped(k statusKey) error {
	r := &nimbusv1.StatusReport{Key: k.key.Proto(), Watermark: &nimbusv1.StatusWatermark{Node: k.node}}
	if err := b.room(r.SizeVT()); err != nil {
		return err
	}
	b.frame.Reports = append(b.frame.Reports, r)
	return nil
}

// isDropped tells whether the report of a peer says that the peer dropped its status of
// the object for the node (see addDropped).
func isDropped(r *nimbusv1.StatusReport) bool { return r.GetKey() != nil && r.GetWatermark() != nil }

// addWatermark adds the watermark, with its update time, and before it the moves it kept
// that it made since last, the record of the node last sent (nil for none), each with its
// time, so that the peer derives the times at which it passed each revision as this
// replica does. It sends the frame first when an entry does not fit.
//
// The moves are told apart by revision, not by time: a move's time is taken in the
// write that makes it, which a view taken after that time may not hold yet.
func (b *peerFrameBuilder) addWatermark(rec, last *watermarkRecord) error {
	from := uint64(0)
	if last != nil && last.Epoch == rec.Epoch {
		from = last.Revision
	}
	for _, st := range rec.steps {
		if st.rev > from && st.rev < rec.Revision {
			if err := b.addWatermarkEntry(&nimbusv1.StatusWatermark{Node: rec.Node, Epoch: rec.Epoch, Revision: st.rev, UpdateTime: timestamppb.New(st.at)}); err != nil {
				return err
			}
		}
	}
	return b.addWatermarkEntry(&nimbusv1.StatusWatermark{Node: rec.Node, Epoch: rec.Epoch, Revision: rec.Revision, UpdateTime: timestamppb.New(rec.UpdateTime)})
}

// addWatermarkEntry adds one entry of watermarks, sending the frame first when it does
// not fit.
func (b *peerFrameBuilder) addWatermarkEntry(wm *nimbusv1.StatusWatermark) error {
	if err := b.room(wm.SizeVT()); err != nil {
		return err
	}
	b.frame.Watermarks = append(b.frame.Watermarks, wm)
	return nil
}

// addPresence adds how many watch streams the record's node has open on this replica,
// sending the frame first when it does not fit.
func (b *peerFrameBuilder) addPresence(rec *watchNodeRecord) error {
	pr := &nimbusv1.PeerPresence{Node: rec.Name, Streams: int32(rec.local())}
	if !rec.Since.IsZero() {
		pr.Since = timestamppb.New(rec.Since)
	}
	if err := b.room(pr.SizeVT()); err != nil {
		return err
	}
	b.frame.Presence = append(b.frame.Presence, pr)
	return nil
}

// room makes room for an entry of n bytes: it sends the frame when the entry would take
// it past maxPeerFrameBytes, and counts the entry in.
func (b *peerFrameBuilder) room(n int) error {
	// Reports, presence and watermarks are fields 3 to 5: a one-byte tag, then the length.
	n = protowire.SizeTag(3) + protowire.SizeBytes(n)
	if b.size > 0 && b.size+n > maxPeerFrameBytes {
		if err := b.flush(false); err != nil {
			return err
		}
	}
	b.size += n
	return nil
}

// flush sends the frame when it holds something, or with always even when it does not,
// and starts the next one at the same revision.
func (b *peerFrameBuilder) flush(always bool) error {
	f := b.frame
	if len(f.GetReports()) == 0 && len(f.GetPresence()) == 0 && len(f.GetWatermarks()) == 0 && !always {
		return nil
	}
	b.frame, b.size = &nimbusv1.PeerFrame{Revision: f.GetRevision()}, 0
	return b.send(f)
}

// peerSession is one push stream a peer has open to this replica.
type peerSession struct {
	replica string
	// cancel ends the stream's handler with errPeerReplaced.
	cancel context.CancelCauseFunc
}

// PeerStatus takes the push stream of a peer replica: its first frame names the peer,
// and every frame carries status reports the peer's agents sent it and which nodes watch
// it. Reports are kept as ReportStatus keeps them, with the peer as their origin; the
// nodes the peer says watch it count as watching while the stream lasts. A newer stream
// of the same peer ends the older one. It ends with codes.FailedPrecondition on a Server
// that is no replica, codes.DeadlineExceeded when no frame came for 15s, and
// codes.Unavailable when the Server is closed.
func (s *Server) PeerStatus(stream grpc.ClientStreamingServer[nimbusv1.PeerFrame, nimbusv1.PeerStatusResponse]) error {
	h := s.peers
	if h == nil {
		return status.Error(codes.FailedPrecondition, "this nimbus is no replica (no replica name); it takes no peer statuses")
	}
	if s.isClosed() {
		return rpcError(fmt.Errorf("taking peer statuses: %w", ErrClosed))
	}
	ctx, cancel := context.WithCancelCause(stream.Context())
	defer cancel(nil)
	// Close ends the stream's context too, which a frame waiting in s.peerGate waits on.
	go func() {
		select {
		case <-s.done:
			cancel(ErrClosed)
		case <-ctx.Done():
		}
	}()
	type received struct {
		frame *nimbusv1.PeerFrame
		err   error
	}
	// Recv blocks, so it runs apart from the loop that must also notice Close; it ends at
	// the stream's first error, at the latest once ctx ends with this handler.
	frames := make(chan received, 1)
	go func() {
		for {
			f, err := stream.Recv()
			select {
			case frames <- received{f, err}:
			case <-ctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()
	errClosed := status.Error(codes.Unavailable, "nimbus is shutting down; push to another replica")
	timeout := time.NewTimer(peerTimeout)
	defer timeout.Stop()
	var sess *peerSession
	defer func() {
		if sess != nil {
			h.endSession(sess)
		}
	}()
	for {
		select {
		case <-s.done:
			return errClosed
		case <-ctx.Done():
			switch cause := context.Cause(ctx); {
			case errors.Is(cause, errPeerReplaced):
				return status.Error(codes.Aborted, errPeerReplaced.Error())
			case errors.Is(cause, ErrClosed):
				return errClosed
			}
			return status.FromContextError(ctx.Err()).Err()
		case <-timeout.C:
			return status.Errorf(codes.DeadlineExceeded, "no frame from the peer replica for %v", peerTimeout)
		case rcv := <-frames:
			if s.isClosed() {
				return errClosed
			}
			if errors.Is(rcv.err, io.EOF) {
				return stream.SendAndClose(&nimbusv1.PeerStatusResponse{})
			}
			if rcv.err != nil {
				return fmt.Errorf("receiving peer frames: %w", rcv.err)
			}
			f := rcv.frame
			switch replica := f.GetReplica(); {
			case sess == nil && replica == "":
				return status.Error(codes.InvalidArgument, `replica "": the first frame must name the sending replica`)
			case sess == nil && replica == h.name:
				return status.Errorf(codes.InvalidArgument, "replica %q: is this replica's own name", replica)
			case sess == nil:
				sess = h.openSession(replica, cancel)
			case replica != "" && replica != sess.replica:
				return status.Errorf(codes.InvalidArgument, "replica %q: the stream is replica %q's", replica, sess.replica)
			}
			if err := h.apply(ctx, sess, f); err != nil {
				if errors.Is(err, errPeerReplaced) {
					return status.Error(codes.Aborted, err.Error())
				}
				return err
			}
			timeout.Reset(peerTimeout)
		}
	}
}

// openSession makes the stream the peer's current one. An older stream of the same peer
// ends, and the nodes it said were watching stop counting until the new stream says so
// again.
func (h *peerHub) openSession(replica string, cancel context.CancelCauseFunc) *peerSession {
	sess := &peerSession{replica: replica, cancel: cancel}
	txn := h.s.store.write()
	h.sessionsMu.Lock()
	old := h.sessions[replica]
	h.sessions[replica] = sess
	h.sessionsMu.Unlock()
	var nodes []string
	if old != nil {
		old.cancel(errPeerReplaced)
		nodes = clearPeerPresence(txn, replica, h.s.opts.Now())
	}
	txn.commit()
	for _, n := range nodes {
		h.s.statusWatch.nodeChanged(n)
	}
	h.s.log.Info("push stream from peer replica opened", "peer", replica, "replaced", old != nil)
	return sess
}

// endSession ends the stream: when it is still the peer's current one, the nodes it said
// were watching count as having stopped now.
func (h *peerHub) endSession(sess *peerSession) {
	txn := h.s.store.write()
	h.sessionsMu.Lock()
	current := h.sessions[sess.replica] == sess
	if current {
		delete(h.sessions, sess.replica)
	}
	h.sessionsMu.Unlock()
	if !current {
		txn.abort()
		return
	}
	nodes := clearPeerPresence(txn, sess.replica, h.s.opts.Now())
	txn.commit()
	for _, n := range nodes {
		h.s.statusWatch.nodeChanged(n)
	}
	h.s.log.Info("push stream from peer replica ended", "peer", sess.replica, "nodes_stopped", len(nodes))
}

// current tells whether sess is its peer's current stream. The caller holds a store write
// transaction.
func (h *peerHub) current(sess *peerSession) bool {
	h.sessionsMu.Lock()
	defer h.sessionsMu.Unlock()
	return h.sessions[sess.replica] == sess
}

// apply takes one frame of the peer's stream: once the store has caught up with the
// frame's revision (s.peerGate), its reports, then its watermarks and presence.
func (h *peerHub) apply(ctx context.Context, sess *peerSession, f *nimbusv1.PeerFrame) error {
	s := h.s
	if len(f.GetReports()) == 0 && len(f.GetPresence()) == 0 && len(f.GetWatermarks()) == 0 {
		return nil // a heartbeat
	}
	if (len(f.GetReports()) > 0 || len(f.GetWatermarks()) > 0) && s.peerGate != nil {
		if err := s.peerGate(ctx, f.GetRevision()); err != nil {
			return status.Errorf(codes.Unavailable, "waiting for revision %d of replica %q: %v", f.GetRevision(), sess.replica, err)
		}
	}
	// What the frame says of a node whose Node object was deleted after the sender built
	// it was forgotten with it: the sender's agent reports it again.
	var forgotten map[string]struct{}
	if len(f.GetReports()) > 0 || len(f.GetWatermarks()) > 0 {
		forgotten = s.nodesDeletedAfter(f.GetRevision())
	}
	// The reports go in transactions of statusTxnReports each, as an agent's do, and the
	// watermarks and presence with the last of them.
	var changed []*nimbusv1.ObjectKey
	var dropped []*statusRecord
	reports := f.GetReports()
	for len(reports) > statusTxnReports {
		txn := s.store.write()
		if !h.current(sess) {
			txn.abort()
			return errPeerReplaced
		}
		changed, dropped = h.applyReportsIn(txn, sess, reports[:statusTxnReports], forgotten, changed, dropped)
		txn.commit()
		reports = reports[statusTxnReports:]
	}
	txn := s.store.write()
	defer txn.abort()
	if !h.current(sess) {
		return errPeerReplaced
	}
	changed, dropped = h.applyReportsIn(txn, sess, reports, forgotten, changed, dropped)
	var moved []watermarkMove
	for _, wm := range f.GetWatermarks() {
		if _, ok := forgotten[wm.GetNode()]; ok {
			s.log.Debug("dropping a peer's status watermark of a node whose Node object was deleted since", "node", wm.GetNode(), "peer", sess.replica)
			continue
		}
		m, del := s.recordPeerWatermarkIn(txn, wm, sess.replica)
		if m.hi > m.lo {
			moved = append(moved, watermarkMove{wm.GetNode(), m})
		}
		dropped = append(dropped, del...)
	}
	now := s.opts.Now()
	var nodes, idle []string
	for _, pr := range f.GetPresence() {
		if err := validateNode(pr.GetNode()); err != nil {
			s.log.Debug("dropping the presence of an invalid node", "peer", sess.replica, "error", err)
			continue
		}
		if applyPeerPresence(txn, sess.replica, pr, now) {
			nodes = append(nodes, pr.GetNode())
		}
		if pr.GetStreams() <= 0 {
			idle = append(idle, pr.GetNode())
		}
	}
	forgetIdleNodes(txn, idle...)
	txn.commit()
	h.metrics.reports.WithLabelValues(peerReceived).Add(float64(len(f.GetReports())))
	for _, key := range changed {
		s.statusWatch.objectChanged(key)
	}
	for _, r := range dropped {
		s.statusWatch.objectChanged(r.Object.Proto())
		// The peers may hold a copy of a record of this replica's own: they drop it too.
		if r.Origin == h.name {
			h.statusChanged(r.Object, r.Node)
		}
	}
	for _, m := range moved {
		s.statusWatch.watermarkMoved(m.node, m.span)
	}
	for _, n := range nodes {
		s.statusWatch.nodeChanged(n)
	}
	return nil
}

// applyReportsIn records in txn the reports of the peer's frame, as reported to the
// peer, but those of the forgotten nodes, and drops the records of the peer's own that a
// report says it dropped (isDropped). It returns changed and dropped with the keys of the
// objects whose records it stored, and the records it deleted, appended.
func (h *peerHub) applyReportsIn(txn *writeTxn, sess *peerSession, reports []*nimbusv1.StatusReport, forgotten map[string]struct{}, changed []*nimbusv1.ObjectKey, dropped []*statusRecord) ([]*nimbusv1.ObjectKey, []*statusRecord) {
	for _, r := range reports {
		if _, ok := forgotten[r.GetStatus().GetNode()]; ok && r.GetStatus() != nil {
			h.s.log.Debug("dropping a peer's status report of a node whose Node object was deleted since", "key", r.GetKey().ID(), "node", r.GetStatus().GetNode(), "peer", sess.replica)
			continue
		}
		if !isDropped(r) {
			if key := h.s.recordStatusIn(txn, r, sess.replica); key != nil {
				changed = append(changed, key)
			}
			continue
		}
		if r.GetKey().Validate() != nil {
			continue
		}
		if rec := txn.nodeStatus(r.GetKey().Key(), r.GetWatermark().GetNode()); rec != nil && rec.Origin == sess.replica {
			txn.deleteStatus(rec)
			dropped = append(dropped, rec)
		}
	}
	return changed, dropped
}

// nodesDeletedAfter returns the names of the nodes whose Node objects changes after
// revision rev deleted, as far as the history of changes reaches back; nil when it does
// not reach rev.
func (s *Server) nodesDeletedAfter(rev uint64) map[string]struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	h := &s.history
	if rev < h.floor || rev >= s.rev {
		return nil
	}
	var nodes map[string]struct{}
	first := sort.Search(len(h.ring), func(i int) bool { return h.at(i).rev > rev })
	for i := first; i < len(h.ring); i++ {
		if c := h.at(i); c.after == nil && c.key.GetKind() == nimbusv1.Kind_KIND_NODE {
			if nodes == nil {
				nodes = map[string]struct{}{}
			}
			nodes[c.key.GetName()] = struct{}{}
		}
	}
	return nodes
}

// applyPeerPresence records in txn that the node has pr.streams watch streams open on the
// peer replica, and tells whether that changed whether or since when the node watches.
// When the node's last stream anywhere was the peer's, it stopped now; a time the peer
// knows of a later end than this replica does is taken as it is.
func applyPeerPresence(txn *writeTxn, replica string, pr *nimbusv1.PeerPresence, now time.Time) bool {
	node, n := pr.GetNode(), max(int(pr.GetStreams()), 0)
	var since time.Time
	if pr.GetSince() != nil {
		since = pr.GetSince().AsTime()
	}
	old := txn.watchNode(node)
	if old == nil && n == 0 && since.IsZero() {
		return false
	}
	next := &watchNodeRecord{Name: node}
	if old != nil {
		*next = *old
	}
	had := next.Peers[replica]
	next.Peers = withPeerStreams(next.Peers, replica, n)
	next.Streams += n - had
	switch {
	case old != nil && old.Streams > 0 && next.Streams == 0:
		next.Since = now
	case since.After(next.Since):
		next.Since = since
	}
	txn.putWatchNode(next)
	return old == nil || (old.Streams > 0) != (next.Streams > 0) || !old.Since.Equal(next.Since)
}

// withPeerStreams returns a copy of peers with n streams for the replica; nil when no
// replica has any.
func withPeerStreams(peers map[string]int, replica string, n int) map[string]int {
	if peers[replica] == n {
		return peers
	}
	next := make(map[string]int, len(peers)+1)
	for r, c := range peers {
		if r != replica {
			next[r] = c
		}
	}
	if n > 0 {
		next[replica] = n
	}
	if len(next) == 0 {
		return nil
	}
	return next
}

// clearPeerPresence records in txn that the nodes watching the peer replica stopped
// watching it at now, and returns the nodes that stopped watching altogether.
func clearPeerPresence(txn *writeTxn, replica string, now time.Time) []string {
	var watching []*watchNodeRecord
	for rec := range txn.allWatchNodes() {
		if rec.Peers[replica] > 0 {
			watching = append(watching, rec)
		}
	}
	var stopped []string
	for _, rec := range watching {
		next := *rec
		next.Streams -= rec.Peers[replica]
		next.Peers = withPeerStreams(rec.Peers, replica, 0)
		if next.Streams == 0 {
			next.Since = now
			stopped = append(stopped, rec.Name)
		}
		txn.putWatchNode(&next)
	}
	forgetIdleNodes(txn, stopped...)
	return stopped
}
