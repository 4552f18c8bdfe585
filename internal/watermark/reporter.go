package watermark

import (
	"fmt"
	"slices"

	"google.golang.org/protobuf/proto"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// Source is what a Reporter reads of what a node holds. A Reporter reads what Object and
// Status return only until its next call of the same method, and keeps none of it: a
// Source may return the same value each time, filled in again.
type Source interface {
	// Object returns the object with the key as the node holds it, or nil when the node
	// does not hold it. A Reporter reads only its meta's generation, revision and
	// generation_revision: a Source may return an object that holds only those.
	Object(key nimbusv1.Key) *nimbusv1.Object
	// Status returns the node's status of the object with the key, or nil when it has
	// none. The Reporter does not modify it.
	Status(key nimbusv1.Key) *nimbusv1.NodeStatus
}

// Reporter works out what a node sends on one ReportStatus stream to a nimbus that takes
// watermarks: its watermark and, on their own, the statuses nimbus cannot derive from it,
// the exceptions (Tracker) and the statuses that carry operational data. Each change of
// one of those goes up, and so does each change of a status nimbus holds from the stream,
// until one that is done (PROGRAMMED at the object's generation) tells nimbus it may
// derive it again; an exception without a status goes up as a status without a phase.
// Then the watermark, when it moved.
//
// A Reporter serves one stream at a time: its first is told every key the node holds;
// Restart starts the next, which costs the exceptions and held statuses, not the objects.
// It is not safe for concurrent use.
type Reporter struct {
	node    string
	tracker *Tracker
	// held are the keys whose status nimbus holds from the stream, as one it cannot
	// derive.
	held map[nimbusv1.Key]struct{}
	// unsent are the keys the next Report sends again: those a failed Report did not get
	// to, and after Restart those whose status nimbus held from the stream before.
	unsent    map[nimbusv1.Key]struct{}
	sentEpoch string
	sentRev   uint64
	sentOnce  bool
}

// NewReporter returns a Reporter of the node's statuses whose Tracker has the options.
func NewReporter(node string, opts Options) *Reporter {
	return &Reporter{node: node, tracker: New(opts), held: map[nimbusv1.Key]struct{}{}, unsent: map[nimbusv1.Key]struct{}{}}
}

// Restart tells the Reporter that a new stream starts, to the same nimbus or another: the
// next Report sends again every status nimbus held from the stream before (the exceptions
// and the statuses with operational data among them), those a failed Report did not get to
// send, and the watermark. Every other key the node holds is done and below the
// watermark, which speaks for it on the new stream too: a node that moves to another
// replica sends its watermark and exceptions, not a status per object.
func (r *Reporter) Restart() {
	for id := range r.held {
		r.unsent[id] = struct{}{}
	}
	r.sentOnce = false
}

// Tracker returns the Reporter's Tracker, for its counts and NextAging; Report alone
// changes it.
func (r *Reporter) Tracker() *Tracker { return r.tracker }

// Report takes the keys of the objects whose object or status changed since the last
// call (every key the node holds on the first), and the node's resume point: it holds
// every change up to revision rev of the stream of epoch. It passes to send, in order,
// the status reports to send, and returns the watermark. With all, the statuses of every
// key in again go up too (every status the node holds, when nimbus must hear them all
// once more), and so does the watermark. An error of send ends Report and is returned,
// wrapped.
func (r *Reporter) Report(src Source, epoch string, rev uint64, changed []nimbusv1.Key, all bool, again []nimbusv1.Key, send func(*nimbusv1.StatusReport) error) (uint64, error) {
	tr := r.tracker
	// The statuses of the keys changed, read once: whether one is sent depends on it.
	statuses := make([]*nimbusv1.NodeStatus, len(changed))
	for i, id := range changed {
		statuses[i] = src.Status(id)
		tr.Set(id, src.Object(id), statuses[i])
	}
	tr.SetPosition(epoch, rev)
	epoch, w := tr.Watermark()
	// Only the keys with something to send are kept, then sorted: on a new stream every
	// key the node holds is changed, and most are not sent.
	var ids []nimbusv1.Key
	for i, id := range changed {
		if r.owes(id) || hasOperational(statuses[i]) {
			ids = append(ids, id)
		}
	}
	keep := func(keys []nimbusv1.Key) {
		for _, id := range keys {
			if r.sends(src, id) {
				ids = append(ids, id)
			}
		}
	}
	if all {
		keep(again)
	}
	keep(tr.Changed())
	// Whatever a stream before did not get to send goes, even a status that is done:
	// nimbus may hold one that is not.
	for id := range r.unsent {
		ids = append(ids, id)
	}
	clear(r.unsent)
	slices.SortFunc(ids, nimbusv1.Key.Compare)
	ids = slices.Compact(ids)
	for k, id := range ids {
		st := src.Status(id)
		own := tr.IsException(id) || (st != nil && hasOperational(st))
		obj := src.Object(id)
		var sent *nimbusv1.NodeStatus
		switch {
		case obj == nil:
			// nimbus drops the statuses of an object gone from the node.
			delete(r.held, id)
			continue
		case st == nil:
			// No status, and the watermark must not speak for the object: a status
			// without a phase, which counts as nothing reported.
			r.held[id] = struct{}{}
			sent = &nimbusv1.NodeStatus{Node: r.node}
		case own || !isDone(st, obj):
			// nimbus holds what is sent until a status that is done clears it.
			r.held[id] = struct{}{}
		default:
			delete(r.held, id) // its status says it is done: nimbus holds it no longer
		}
		if sent == nil {
			sent = proto.CloneOf(st) // the source's statuses are not to be modified
			sent.Node = r.node
		}
		if err := send(&nimbusv1.StatusReport{Key: id.Proto(), Status: sent}); err != nil {
			// The stream is broken: the next stream's first Report sends these.
			for _, id := range ids[k:] {
				r.unsent[id] = struct{}{}
			}
			return w, fmt.Errorf("sending status of %s: %w", id, err)
		}
	}
	if all || !r.sentOnce || epoch != r.sentEpoch || w != r.sentRev {
		wm := &nimbusv1.StatusWatermark{Node: r.node, Epoch: epoch, Revision: w}
		if err := send(&nimbusv1.StatusReport{Watermark: wm}); err != nil {
			r.sentOnce = false
			return w, fmt.Errorf("sending status watermark %s/%d: %w", epoch, w, err)
		}
		r.sentEpoch, r.sentRev, r.sentOnce = epoch, w, true
	}
	return w, nil
}

// sends tells whether the key has a status to send: its own (an exception, or one with
// operational data) or one nimbus holds from the stream, which must be cleared.
func (r *Reporter) sends(src Source, id nimbusv1.Key) bool {
	return r.owes(id) || hasOperational(src.Status(id))
}

// owes tells whether the key's status is sent whatever it is: it is an exception, or
// nimbus holds one from the stream, which must be cleared.
func (r *Reporter) owes(id nimbusv1.Key) bool {
	_, held := r.held[id]
	return held || r.tracker.IsException(id)
}

// isDone tells whether the status is PROGRAMMED at the object's generation.
func isDone(st *nimbusv1.NodeStatus, obj *nimbusv1.Object) bool {
	return st.GetPhase() == nimbusv1.Phase_PHASE_PROGRAMMED && st.GetObservedGeneration() == obj.GetMeta().GetGeneration()
}

// hasOperational tells whether the status carries operational data, which nimbus cannot
// derive from a watermark.
func hasOperational(st *nimbusv1.NodeStatus) bool {
	return st.GetOperationalData() != nil || len(st.GetOperational()) > 0
}
