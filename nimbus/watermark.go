package nimbus

import (
	"iter"
	"slices"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// watermarkRecord is one row of the watermarks table: the status watermark a node
// reported. Every object meant for the node whose generation revision is at or below
// Revision is PROGRAMMED at its generation there, but for the objects the node reports a
// status of on its own (docs/status.md). A record is never modified once stored.
type watermarkRecord struct {
	Node string
	// Epoch is the epoch Revision belongs to: a watermark of another epoch than the
	// server's says nothing.
	Epoch    string
	Revision uint64
	// UpdateTime is when Revision last moved, as the server recorded it.
	UpdateTime time.Time
	// Origin is the name of the replica the node reported to; empty on a server that is
	// no replica.
	Origin string
	// steps holds when the watermark reached each of its last revisions, by revision,
	// at most watermarkSteps of them: passedAt reads it.
	steps []watermarkStep
}

// watermarkStep is one move of a watermark: to rev, at the time at.
type watermarkStep struct {
	rev uint64
	at  time.Time
}

// watermarkSteps bounds the moves a watermark record keeps the time of. An object whose
// generation revision the watermark passed before the oldest of them is taken as passed at
// the oldest, which is later than it was.
const watermarkSteps = 32

// passes tells whether the watermark is of the epoch and at or past rev.
func (r *watermarkRecord) passes(epoch string, rev uint64) bool {
	return r != nil && r.Epoch == epoch && r.Revision >= rev
}

// mark returns the watermark as one number for the epoch, ordered as watermarks are:
// 0 for none or one of another epoch, else Revision+1, so that it passes a revision rev
// of the epoch iff mark > rev.
func (r *watermarkRecord) mark(epoch string) uint64 {
	if r == nil || r.Epoch != epoch {
		return 0
	}
	return r.Revision + 1
}

// passedAt returns when the watermark reached rev, which it is at or past: the time of
// the first move it keeps to rev or beyond.
func (r *watermarkRecord) passedAt(rev uint64) time.Time {
	i, _ := slices.BinarySearchFunc(r.steps, rev, func(s watermarkStep, rev uint64) int {
		switch {
		case s.rev < rev:
			return -1
		case s.rev > rev:
			return 1
		}
		return 0
	})
	if i == len(r.steps) {
		return r.UpdateTime
	}
	return r.steps[i].at
}

// moved returns the record of the node's watermark once it is rev of epoch, reported
// to origin at now: r itself when that is no move. A move back keeps the times of the
// revisions still passed; a new epoch starts over.
func (r *watermarkRecord) moved(node, epoch string, rev uint64, origin string, now time.Time) *watermarkRecord {
	if r != nil && r.Epoch == epoch && r.Revision == rev && r.Origin == origin {
		return r
	}
	next := &watermarkRecord{Node: node, Epoch: epoch, Revision: rev, UpdateTime: now, Origin: origin}
	switch {
	case r == nil || r.Epoch != epoch:
		next.steps = []watermarkStep{{rev, now}}
	case rev == r.Revision:
		// Another replica took it: the times of the revisions passed stay, and the move
		// to that replica is the record's update, later than the one it replaces.
		next.steps = r.steps
	case rev > r.Revision:
		keep := r.steps[max(0, len(r.steps)-watermarkSteps+1):]
		next.steps = append(slices.Clip(keep), watermarkStep{rev, now})
	default:
		// The revisions up to rev were passed when they were; rev itself no later than
		// the first move past it.
		i := 0
		for i < len(r.steps) && r.steps[i].rev < rev {
			i++
		}
		next.steps = append(slices.Clip(r.steps[:i]), watermarkStep{rev, r.steps[i].at})
	}
	return next
}

// watermark returns the watermark the node reported, or nil.
func (t *tables) watermark(node string) *watermarkRecord {
	rec, _ := t.watermarks.Get(node)
	return rec
}

// allWatermarks iterates over the watermarks by node name.
func (t *tables) allWatermarks() iter.Seq[*watermarkRecord] {
	return func(yield func(*watermarkRecord) bool) {
		t.watermarks.Scan(func(_ string, rec *watermarkRecord) bool { return yield(rec) })
	}
}

// putWatermark stores the record, replacing the one of its node. The record must not be
// modified afterwards.
func (w *writeTxn) putWatermark(rec *watermarkRecord) {
	w.watermarks.Set(rec.Node, rec)
	w.journalMark(rec.Node)
}

// deleteWatermark deletes the watermark of the node.
func (w *writeTxn) deleteWatermark(node string) {
	if _, deleted := w.watermarks.Delete(node); deleted {
		w.journalMark(node)
	}
}

// reportStream is what the server keeps of one ReportStatus stream, per node it reports
// for (one, with TLS).
type reportStream struct {
	nodes map[string]*reportStreamNode
	// forgotten names a node whose Node object was deleted after the stream's first
	// watermark of it: the stream must end, so that the agent reports again.
	forgotten string
	// id tells the stream apart from the node's others (watermarkRates).
	id uint64
	// held holds, in order, the reports held back from a watermark move beyond its
	// node's rate on (watermarkrate.go); nil where a later watermark of the same node
	// replaced one. heldFor is the node whose bucket they wait for; heldWatermarks holds
	// the index in held of each node's watermark held.
	held           []*nimbusv1.StatusReport
	heldFor        string
	heldWatermarks map[string]int
}

// forgottenError is the error a stream ends with once its node is forgotten.
func (rs *reportStream) forgottenError() error {
	return status.Errorf(codes.Aborted, "node %q's Node object was deleted, and what it reported with it: report again", rs.forgotten)
}

// reportStreamNode is what the server keeps of one node's reports on a ReportStatus
// stream.
type reportStreamNode struct {
	// watermarked is true once the node's first watermark came on the stream.
	watermarked bool
	// nodeUID is the uid of the node's Node object when a watermark of the node on the
	// stream was last taken; empty when there was none.
	nodeUID string
	// seen holds, until then, the keys of the statuses the node reported on the stream:
	// an agent reports every status it holds that nimbus cannot derive before its first
	// watermark, and those are all the records nimbus keeps of it once that comes. nil
	// once more than maxSeenReports came, as from an agent that sends no watermark: the
	// first watermark then drops nothing for not being sent again.
	seen map[nimbusv1.Key]struct{}
}

// maxSeenReports bounds the keys a status stream remembers before its first watermark.
const maxSeenReports = 1 << 16

// saw records that the node reported a status of the key on the stream.
func (sn *reportStreamNode) saw(key nimbusv1.Key) {
	if sn.watermarked || sn.seen == nil {
		return
	}
	if len(sn.seen) >= maxSeenReports {
		sn.seen = nil
		return
	}
	sn.seen[key] = struct{}{}
}

// node returns the stream's state of the node, making it.
func (rs *reportStream) node(name string) *reportStreamNode {
	if rs.nodes == nil {
		rs.nodes = map[string]*reportStreamNode{}
	}
	n := rs.nodes[name]
	if n == nil {
		n = &reportStreamNode{seen: map[nimbusv1.Key]struct{}{}}
		rs.nodes[name] = n
	}
	return n
}

// derivable tells whether the status, of the stored object obj, says nothing the node's
// watermark does not: PROGRAMMED at the object's generation, without operational data,
// and the watermark, of the epoch, passes the object's generation revision.
func derivable(st *nimbusv1.NodeStatus, obj *nimbusv1.Object, wm *watermarkRecord, epoch string) bool {
	return st.GetPhase() == nimbusv1.Phase_PHASE_PROGRAMMED &&
		st.GetObservedGeneration() == obj.GetMeta().GetGeneration() &&
		st.GetOperationalData() == nil && len(st.GetOperational()) == 0 &&
		wm.passes(epoch, obj.GenerationRevision())
}

// recordWatermarkIn stores a watermark the node reported on the stream rs in txn, and
// deletes the node's records it makes redundant: on the stream's first watermark of the
// node, the records the node did not report again on it; and the records derivable from
// the watermark. It returns the span of revisions the watermark moved across (empty when
// it did not move), and the keys of the objects whose records it deleted.
func (s *Server) recordWatermarkIn(txn *writeTxn, rs *reportStream, wm *nimbusv1.StatusWatermark, origin string) (moved revSpan, deleted []nimbusv1.Key) {
	node := wm.GetNode()
	if node == "" {
		s.log.Debug("dropping status watermark without a node")
		return revSpan{}, nil
	}
	sn := rs.node(node)
	// The deletion of the node's Node object forgot what the node reported. On this
	// stream its watermark, without the exceptions sent before, would speak for them: it
	// is dropped, and the stream ends (rs.forgotten), so that the agent reports them all
	// again on a new one.
	uid := ""
	if n := txn.object(nimbusv1.MakeKey(nimbusv1.Kind_KIND_NODE, "", "", node)); n != nil {
		uid = n.Object.GetMeta().GetUid()
	}
	if sn.watermarked && sn.nodeUID != "" && uid == "" {
		s.log.Debug("dropping status watermark of a node whose Node object was deleted", "node", node)
		rs.forgotten = node
		return revSpan{}, nil
	}
	sn.nodeUID = uid
	old := txn.watermark(node)
	rec := old.moved(node, wm.GetEpoch(), wm.GetRevision(), origin, s.opts.Now())
	if rec != old {
		txn.putWatermark(rec)
	}
	first := !sn.watermarked && sn.seen != nil
	sn.watermarked = true
	seen := sn.seen
	sn.seen = nil
	moved = movedSpan(old, rec)
	if !first && rec == old {
		return moved, nil
	}
	if rec != old {
		s.log.Debug("status watermark recorded", "node", node, "epoch", rec.Epoch, "revision", rec.Revision, "origin", origin)
	}
	// The agent sent every record it holds on the stream before its first watermark,
	// whichever replica kept the earlier ones: the others are of an earlier stream.
	for _, r := range s.dropForWatermarkIn(txn, rec, func(r *statusRecord) bool {
		_, again := seen[r.Object]
		return first && !again
	}) {
		deleted = append(deleted, r.Object)
	}
	return moved, deleted
}

// dropForWatermarkIn deletes in txn the records of the watermark's node that stale tells
// are out of date, and those derivable from the watermark, whatever replica they came
// from: they say what the watermark says. It returns the records it deleted.
func (s *Server) dropForWatermarkIn(txn *writeTxn, rec *watermarkRecord, stale func(*statusRecord) bool) []*statusRecord {
	var deleted []*statusRecord
	epoch := s.Epoch()
	for _, r := range txn.statusesBy(rec.Node) {
		drop := stale(r)
		if !drop {
			if o := txn.object(r.Object); o != nil && derivable(r.Status, o.Object, rec, epoch) {
				drop = true
			}
		}
		if drop {
			s.log.Debug("status record dropped for the watermark", "key", r.Object, "node", rec.Node, "origin", r.Origin)
			txn.deleteStatus(r)
			deleted = append(deleted, r)
		}
	}
	return deleted
}

// recordPeerWatermarkIn stores in txn a watermark a peer replica's agent reported to it,
// with the peer as its origin, unless the watermark kept is from another replica and
// moved later (the node moved from the peer to it). It deletes the node's records the
// watermark makes redundant, as recordWatermarkIn does at the peer, and, when the node
// comes from another replica (or had no watermark here), those of other replicas than
// the peer: the agent sent the peer every record it holds before this watermark, and
// the peer pushed them before it. It returns the span of revisions the watermark moved
// across, and the records it deleted.
func (s *Server) recordPeerWatermarkIn(txn *writeTxn, wm *nimbusv1.StatusWatermark, origin string) (moved revSpan, deleted []*statusRecord) {
	node := wm.GetNode()
	if err := validateNode(node); err != nil {
		s.log.Debug("dropping a peer's status watermark of an invalid node", "peer", origin, "error", err)
		return revSpan{}, nil
	}
	at := s.opts.Now()
	if wm.GetUpdateTime() != nil {
		at = wm.GetUpdateTime().AsTime()
	}
	old := txn.watermark(node)
	if old != nil && old.Origin != origin && old.UpdateTime.After(at) {
		s.log.Debug("dropping a peer's status watermark older than the one kept from another replica",
			"node", node, "origin", origin, "kept_origin", old.Origin)
		return revSpan{}, nil
	}
	rec := old.moved(node, wm.GetEpoch(), wm.GetRevision(), origin, at)
	if rec == old {
		return revSpan{}, nil
	}
	txn.putWatermark(rec)
	s.log.Debug("status watermark recorded from a peer", "node", node, "epoch", rec.Epoch, "revision", rec.Revision, "origin", origin)
	arrived := old == nil || old.Origin != origin
	return movedSpan(old, rec), s.dropForWatermarkIn(txn, rec, func(r *statusRecord) bool {
		return arrived && r.Origin != origin
	})
}

// movedSpan returns the revisions a watermark moved across from old to rec, either nil:
// those whose derived status may differ between the two.
func movedSpan(old, rec *watermarkRecord) revSpan {
	switch {
	case old == rec:
		return revSpan{}
	case old == nil:
		return revSpan{0, rec.Revision}
	case rec == nil:
		return revSpan{0, old.Revision}
	case old.Epoch != rec.Epoch:
		return revSpan{0, max(old.Revision, rec.Revision)}
	}
	return revSpan{min(old.Revision, rec.Revision), max(old.Revision, rec.Revision)}
}

// watermarkCount returns how many nodes have a status watermark stored.
func (s *Server) watermarkCount() float64 { return float64(s.store.read().watermarks.Len()) }
