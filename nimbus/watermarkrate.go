package nimbus

import (
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// Rate of watermark moves
//
// Each move of a node's status watermark marks, in every WatchStatus watcher, the objects
// whose generation revision it moved across, and goes to every peer replica: a node that
// swings its watermark between 0 and the head as fast as it can would make every watcher
// recompute and resend every object meant for it, over and over. A watermark may move back
// (an object stops being done), so no move is refused; their rate is bounded instead.
//
// Each node has a token bucket of Limits.StatusWatermarkMoves moves a second,
// StatusWatermarkMoveBurstSeconds' worth at once, shared by its ReportStatus streams on
// this server. A watermark that moves the node's (one of another revision or epoch than
// the one recorded, or than the one before it in the same batch) takes a move from the
// bucket. When the bucket has none, that watermark and every report after it on the
// stream are held, in order, and applied together when the bucket has a move again, at
// most 1/Limits.StatusWatermarkMoves later; meanwhile the stream goes on reading. Of the
// node's watermarks held, only the last is kept, at its place among the reports: so the
// node's final watermark is always the last one it reported, and a node that moves its
// watermark as fast as it can has it applied at the limit's rate. The held reports of a
// stream are bounded: with maxHeldReports held it stops reading until they are applied,
// and gRPC's flow control holds the node back. A stream that ends with reports held
// applies them first when its client closed it (and answers after that), and drops them
// when it broke: the agent reports all again on its next stream.
//
// What nimbus answers stays one the node's reports justify. The held reports are applied
// in the order they came, never a record after a watermark that was sent after it; the
// answers before are those of the reports read up to the hold, as from a slower reader.
// Keeping only the last of the node's watermarks held skips the ones before: the records
// held between them are then taken against the watermark recorded before the hold rather
// than against the skipped one. That changes only whether a record PROGRAMMED at the
// object's generation without operational data is kept or dropped as one the watermark
// says already (derivable): kept, it says what the node last reported of the object (the
// agent reports an object again when it stops being done below a watermark it sent);
// dropped, the answer is the node's last watermark's. Either is what the node said.
//
// A stream holds its reports back for the latest of the node's watermarks only: when a
// watermark of the node comes on another stream after the last one held, the held reports
// of the node are dropped, not applied after the newer ones (an agent that reconnected
// reports all again on its new stream).
//
// The limit is kept by the replica the node reports to. Peer replicas apply what that one
// recorded (PeerFrame watermarks), at most the rate of it, and hold back nothing.
// naples_nimbus_status_watermark_moves_delayed_total counts the watermarks held back, and
// a node over the limit is named in a log line at most once per Limits.RefusalLogInterval.

// maxHeldReports bounds the reports one ReportStatus stream holds back for its node's
// watermark moves; with that many held it reads no more until they are applied.
const maxHeldReports = maxStatusBatch

// watermarkRates holds a token bucket of watermark moves per node whose moves it limits.
// Its methods are safe for concurrent use.
type watermarkRates struct {
	perSecond rate.Limit
	burst     int
	now       func() time.Time
	// streams numbers the ReportStatus streams, so that their ids tell them apart.
	streams atomic.Uint64

	// mu guards nodes and swept.
	mu sync.Mutex
	// nodes holds the buckets of the nodes that moved their watermark lately: those
	// whose bucket is not full, or with reports held back; swept is when the others were
	// last forgotten.
	nodes map[string]*nodeMoves
	swept time.Time
}

// nodeMoves is what watermarkRates holds of one node.
type nodeMoves struct {
	bucket *rate.Limiter
	// last is the id of the stream that reported the node's latest watermark.
	last uint64
	// holders counts the streams holding a watermark of the node back.
	holders int
}

// newWatermarkRates returns the buckets of the limits on the clock now.
func newWatermarkRates(l *Limits, now func() time.Time) *watermarkRates {
	return &watermarkRates{
		perSecond: rate.Limit(l.StatusWatermarkMoves),
		burst:     l.StatusWatermarkMoves * StatusWatermarkMoveBurstSeconds,
		now:       now,
		nodes:     map[string]*nodeMoves{},
		swept:     now(),
	}
}

// newStream returns the id of a new ReportStatus stream.
func (r *watermarkRates) newStream() uint64 { return r.streams.Add(1) }

// nodeLocked returns the node's entry, making it with a full bucket.
func (r *watermarkRates) nodeLocked(node string, now time.Time) *nodeMoves {
	r.sweepLocked(now)
	n := r.nodes[node]
	if n == nil {
		n = &nodeMoves{bucket: rate.NewLimiter(r.perSecond, r.burst)}
		r.nodes[node] = n
	}
	return n
}

// sweepLocked forgets, at most once per time a bucket takes to fill, the nodes whose
// bucket is full and that no stream holds reports back for: forgetting them changes
// nothing.
func (r *watermarkRates) sweepLocked(now time.Time) {
	if now.Sub(r.swept) < time.Duration(float64(r.burst)/float64(r.perSecond)*float64(time.Second)) {
		return
	}
	r.swept = now
	for node, n := range r.nodes {
		if n.holders == 0 && n.bucket.TokensAt(now) >= float64(r.burst) {
			delete(r.nodes, node)
		}
	}
}

// arrived records that a watermark of the node came on the stream with the id: its
// latest.
func (r *watermarkRates) arrived(node string, stream uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.nodeLocked(node, r.now()).last = stream
}

// latest tells whether the node's latest watermark came on the stream with the id.
func (r *watermarkRates) latest(node string, stream uint64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := r.nodes[node]
	return n != nil && n.last == stream
}

// allow takes a move from the node's bucket, and tells whether it had one.
func (r *watermarkRates) allow(node string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.now()
	return r.nodeLocked(node, now).bucket.AllowN(now, 1)
}

// wait returns how long the node's bucket takes, from now, to hold a move.
func (r *watermarkRates) wait(node string) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.now()
	tokens := r.nodeLocked(node, now).bucket.TokensAt(now)
	if tokens >= 1 {
		return 0
	}
	return time.Duration((1 - tokens) / float64(r.perSecond) * float64(time.Second))
}

// hold records that the stream with the id holds a watermark of the node back, the
// node's latest unless another came since; release that it no longer does.
func (r *watermarkRates) hold(node string, stream uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := r.nodeLocked(node, r.now())
	n.holders++
	if n.last == 0 {
		// Forgotten since the watermark came, with no other since.
		n.last = stream
	}
}

func (r *watermarkRates) release(node string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if n := r.nodes[node]; n != nil && n.holders > 0 {
		n.holders--
	}
}

// takeReports records the reports the stream rs received, in order, holding back the
// ones from a watermark move the node's bucket has no room for (see "Rate of watermark
// moves"): behind reports held already, all of them.
func (s *Server) takeReports(rs *reportStream, reports []*nimbusv1.StatusReport) {
	for _, r := range reports {
		if wm := r.GetWatermark(); wm != nil && wm.GetNode() != "" {
			s.wmRates.arrived(wm.GetNode(), rs.id)
		}
	}
	if len(rs.held) > 0 {
		s.holdReports(rs, reports, true)
		return
	}
	s.applyReports(rs, reports, true)
}

// watermarkAt is where a node's watermark is: its epoch and revision.
type watermarkAt struct {
	epoch string
	rev   uint64
}

// applyReports records the reports in order up to the first watermark that moves its
// node's watermark beyond the node's rate, and holds back that one and the rest; fresh
// tells that they were just received (rather than held before).
func (s *Server) applyReports(rs *reportStream, reports []*nimbusv1.StatusReport, fresh bool) {
	var at map[string]watermarkAt
	var t *tables
	for i, r := range reports {
		wm := r.GetWatermark()
		if wm == nil || wm.GetNode() == "" {
			continue
		}
		node := wm.GetNode()
		before, known := at[node]
		if !known {
			if t == nil {
				t = s.store.read()
			}
			if old := t.watermark(node); old != nil {
				before, known = watermarkAt{old.Epoch, old.Revision}, true
			}
		}
		next := watermarkAt{wm.GetEpoch(), wm.GetRevision()}
		if at == nil {
			at = map[string]watermarkAt{}
		}
		at[node] = next
		if (known && before == next) || s.wmRates.allow(node) {
			continue
		}
		if i > 0 {
			s.recordStatuses(rs, reports[:i])
		}
		if fresh {
			// INFO, not WARN: nothing is refused, and an agent applying a large snapshot
			// may move its watermark this fast for a while too.
			if logged, unlogged := s.refusals.allow("watermark-moves/" + node); logged {
				s.log.Info("holding back status watermark moves of a node over the limit (nimbus --status-watermark-moves)",
					"node", node, "moves_per_second", s.opts.Limits.StatusWatermarkMoves, "unlogged", unlogged)
			}
		}
		s.holdReports(rs, reports[i:], fresh)
		return
	}
	if len(reports) > 0 {
		s.recordStatuses(rs, reports)
	}
}

// holdReports holds the reports back on rs, after those it holds already, keeping of
// each node's watermarks only the last, at its place; fresh tells that they were just
// received, and counts their watermarks as delayed.
func (s *Server) holdReports(rs *reportStream, reports []*nimbusv1.StatusReport, fresh bool) {
	for _, r := range reports {
		wm := r.GetWatermark()
		if wm == nil || wm.GetNode() == "" {
			rs.held = append(rs.held, r)
			continue
		}
		if fresh {
			s.metrics.watermarkMovesDelayed.Inc()
		}
		node := wm.GetNode()
		if len(rs.held) == 0 {
			rs.heldFor = node
		}
		if i, ok := rs.heldWatermarks[node]; ok {
			if i == len(rs.held)-1 {
				rs.held[i] = r
				continue
			}
			rs.held[i] = nil
		} else {
			if rs.heldWatermarks == nil {
				rs.heldWatermarks = map[string]int{}
			}
			s.wmRates.hold(node, rs.id)
		}
		rs.heldWatermarks[node] = len(rs.held)
		rs.held = append(rs.held, r)
	}
}

// holdWait returns how long the reports rs holds back wait for their node's bucket.
func (s *Server) holdWait(rs *reportStream) time.Duration {
	return s.wmRates.wait(rs.heldFor)
}

// releaseReports applies the reports rs holds back, in order, but those of a node whose
// latest watermark came on another stream; those it holds back again when the node's
// bucket has no room yet.
func (s *Server) releaseReports(rs *reportStream) {
	held := rs.held
	rs.held, rs.heldFor = nil, ""
	var superseded map[string]bool
	for node := range rs.heldWatermarks {
		// Asked before the hold ends: a node held for is never forgotten.
		if !s.wmRates.latest(node, rs.id) {
			if superseded == nil {
				superseded = map[string]bool{}
			}
			superseded[node] = true
			s.log.Debug("dropping the status reports held back for a node whose later watermark came on another stream", "node", node)
		}
		s.wmRates.release(node)
	}
	clear(rs.heldWatermarks)
	reports := held[:0]
	for _, r := range held {
		if r == nil {
			continue
		}
		node := r.GetStatus().GetNode()
		if wm := r.GetWatermark(); wm != nil {
			node = wm.GetNode()
		}
		if superseded[node] {
			continue
		}
		reports = append(reports, r)
	}
	clear(held[len(reports):])
	s.applyReports(rs, reports, false)
}

// dropHeld forgets the reports rs holds back: its stream ended.
func (s *Server) dropHeld(rs *reportStream) {
	for node := range rs.heldWatermarks {
		s.wmRates.release(node)
	}
	clear(rs.heldWatermarks)
	rs.held, rs.heldFor = nil, ""
}
