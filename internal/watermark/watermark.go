// Package watermark works out what a node reports of the status of the objects it holds:
// a watermark, the revision up to which every object the node holds is PROGRAMMED at its
// generation, and the exceptions, the objects a watermark passes that are not.
//
// An object counts from the revision that made its generation (nimbusv1.Object's
// GenerationRevision). It is done when the node's status of it is PROGRAMMED at its
// generation. The watermark is the node's resume point in the stream, held back to just
// below the first object that is neither done nor an exception: so nimbus may take every
// object at or below the watermark for which the node reported nothing else as PROGRAMMED
// at its generation (docs/status.md).
//
// An object becomes an exception, and stops holding the watermark back, when it is FAILED
// at its generation, when it has been short of done for Options.ExceptionAfter, or when it
// stops being done below a watermark already handed out. It stays one until it is done or
// deleted, and the node reports its status as long as it is one. At most
// Options.MaxExceptions objects are exceptions at once; others past the limit hold the
// watermark back, so that what a node asks nimbus to hold is bounded.
//
// A Tracker is not safe for concurrent use.
package watermark

import (
	"slices"
	"time"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// Defaults of Options.
const (
	DefaultExceptionAfter = 2 * time.Second
	DefaultMaxExceptions  = 1000
)

// Options tune a Tracker.
type Options struct {
	// ExceptionAfter is how long an object may be short of done, without failing, before it
	// is an exception rather than holding the watermark back; DefaultExceptionAfter when 0.
	ExceptionAfter time.Duration
	// MaxExceptions bounds the exceptions at once; DefaultMaxExceptions when 0.
	MaxExceptions int
	// Now returns the time; time.Now when nil.
	Now func() time.Time
}

// smallRoom is how many entries a map may have had room for and still be kept once empty.
const smallRoom = 64

// state is where an object stands.
type state uint8

const (
	done      state = iota // PROGRAMMED at its generation, or not held
	pending                // short of done, holding the watermark back
	exception              // short of done, reported on its own
)

// entry is what the tracker holds of one object that is short of done.
type entry struct {
	key    nimbusv1.Key
	genRev uint64
	state  state
	since  time.Time // when it last stopped being done
	// queued is the number of the entry's place in the queues, while it is pending.
	queued uint64
}

// Tracker follows the objects a node holds and their statuses, and works out the
// watermark and exceptions.
type Tracker struct {
	opts Options
	// entries holds the objects that are pending or exceptions; a done object has none.
	entries map[nimbusv1.Key]*entry
	// room is the most entries held at once since entries was made.
	room int
	// pending queues the entries that hold the watermark back by generation revision,
	// aging the same by when they stopped being done (see queue); pendingLen counts them,
	// and places numbers the places the queues give.
	pending, aging queue
	pendingLen     int
	places         uint64
	// start is when the Tracker was made: aging orders entries by their since less it.
	start time.Time
	// exceptions counts the entries that are exceptions.
	exceptions int
	// changed holds the keys that became or stopped being exceptions since Changed.
	changed map[nimbusv1.Key]struct{}
	epoch   string
	rev     uint64 // the resume point: every change up to it is held
	handed  uint64 // the last watermark Watermark returned in this epoch
}

// New returns an empty Tracker.
func New(opts Options) *Tracker {
	if opts.ExceptionAfter <= 0 {
		opts.ExceptionAfter = DefaultExceptionAfter
	}
	if opts.MaxExceptions <= 0 {
		opts.MaxExceptions = DefaultMaxExceptions
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Tracker{
		opts:    opts,
		entries: map[nimbusv1.Key]*entry{},
		changed: map[nimbusv1.Key]struct{}{},
		start:   opts.Now(),
	}
}

// SetPosition records the node's resume point: it holds every change up to revision rev
// of the stream of epoch. A new epoch starts the watermark over.
func (t *Tracker) SetPosition(epoch string, rev uint64) {
	if epoch != t.epoch {
		t.epoch, t.handed = epoch, 0
	}
	t.rev = rev
}

// Set records what the node holds of the object with the key: the object, nil when the
// node does not hold it, and the node's status of it, nil when there is none. The tracker
// holds nothing of an object that is done: every object it has not seen since the start is
// done or comes after the resume point.
func (t *Tracker) Set(key nimbusv1.Key, obj *nimbusv1.Object, st *nimbusv1.NodeStatus) {
	e := t.entries[key]
	was := done
	if e != nil {
		was = e.state
		t.leave(e)
	}
	now := done // nothing to report of an object the node does not hold
	var genRev uint64
	if obj != nil {
		gen := obj.GetMeta().GetGeneration()
		genRev = obj.GenerationRevision()
		phase, observed := st.GetPhase(), st.GetObservedGeneration()
		switch {
		case phase == nimbusv1.Phase_PHASE_PROGRAMMED && observed == gen:
			now = done
		case was == exception:
			// An exception stays one until it is done: its status is reported as it changes.
			now = exception
		case phase == nimbusv1.Phase_PHASE_FAILED && observed == gen,
			was == done && t.handed != 0 && genRev <= t.handed:
			// A failure does not hold the watermark back, nor does an object that stops
			// being done below a watermark handed out already, which must not go back.
			now = exception
		default:
			now = pending
		}
	}
	if now == exception && was != exception && t.exceptions >= t.opts.MaxExceptions {
		now = pending
	}
	switch {
	case was == now:
	case now == exception:
		t.exceptions++
		t.changed[key] = struct{}{}
	case was == exception:
		t.exceptions--
		t.changed[key] = struct{}{}
	}
	if now == done {
		if e != nil {
			e.state = done // its places count for nothing now
			delete(t.entries, key)
			// A Go map keeps the room it once grew to: emptied after holding many
			// objects (a first sync), it is made anew, so that a settled node holds
			// nothing per object.
			if len(t.entries) == 0 && t.room > smallRoom {
				t.entries, t.room = map[nimbusv1.Key]*entry{}, 0
			}
		}
		return
	}
	if e == nil {
		e = &entry{key: key}
		t.entries[key] = e
		t.room = max(t.room, len(t.entries))
	}
	// An entry that stays pending at the same generation revision keeps its places.
	kept := was == pending && now == pending && e.genRev == genRev
	e.genRev, e.state = genRev, now
	if now == pending {
		t.pendingLen++
		if kept {
			return
		}
		if was == done {
			e.since = t.opts.Now()
		}
		t.places++
		e.queued = t.places
		t.pending.push(queuedEntry{e: e, place: e.queued, order: int64(e.genRev)})
		t.aging.push(queuedEntry{e: e, place: e.queued, order: int64(e.since.Sub(t.start))})
		t.compact()
	}
}

// leave counts the entry out of the pending ones, when it is one. Its places in the
// queues stay, and count for nothing once it is not pending there (queuedEntry.live).
func (t *Tracker) leave(e *entry) {
	if e.state == pending {
		t.pendingLen--
	}
}

// compact drops the places that count for nothing from the queues once they are most of
// them, so that an object that comes and goes while another holds the front costs
// memory for a while only.
func (t *Tracker) compact() {
	if max(len(t.pending.items), len(t.aging.items)) > 2*t.pendingLen+smallRoom {
		t.pending.compact()
		t.aging.compact()
	}
}

// Watermark turns the objects that have been short of done for Options.ExceptionAfter
// into exceptions, as far as the limit allows, and returns the epoch and the watermark:
// the resume point, or just below the first object that holds it back.
func (t *Tracker) Watermark() (epoch string, watermark uint64) {
	cutoff := t.opts.Now().Add(-t.opts.ExceptionAfter)
	for t.exceptions < t.opts.MaxExceptions {
		e, ok := t.aging.min()
		if !ok || e.since.After(cutoff) {
			break
		}
		t.leave(e)
		e.state = exception
		t.exceptions++
		t.changed[e.key] = struct{}{}
	}
	w := t.rev
	if e, ok := t.pending.min(); ok && e.genRev <= w {
		w = e.genRev - min(e.genRev, 1)
	}
	t.handed = max(t.handed, w)
	return t.epoch, w
}

// NextAging returns when the object short of done for longest turns into an exception,
// if one does: the time to call Watermark again.
func (t *Tracker) NextAging() (time.Time, bool) {
	if t.exceptions >= t.opts.MaxExceptions {
		return time.Time{}, false
	}
	e, ok := t.aging.min()
	if !ok {
		return time.Time{}, false
	}
	return e.since.Add(t.opts.ExceptionAfter), true
}

// IsException tells whether the object with the key is an exception: one whose status
// the node reports on its own.
func (t *Tracker) IsException(key nimbusv1.Key) bool {
	e := t.entries[key]
	return e != nil && e.state == exception
}

// Exceptions returns how many objects are exceptions.
func (t *Tracker) Exceptions() int { return t.exceptions }

// Pending returns how many objects hold the watermark back.
func (t *Tracker) Pending() int { return t.pendingLen }

// Changed returns the keys of the objects that became exceptions or stopped being ones
// since it was last called, in key order.
func (t *Tracker) Changed() []nimbusv1.Key {
	keys := make([]nimbusv1.Key, 0, len(t.changed))
	for key := range t.changed {
		keys = append(keys, key)
	}
	if len(keys) > smallRoom {
		t.changed = map[nimbusv1.Key]struct{}{} // let go of the room, as entries does
	} else {
		clear(t.changed)
	}
	slices.SortFunc(keys, nimbusv1.Key.Compare)
	return keys
}

// queue orders the pending entries by one of their fields, a min-heap whose places are
// left behind rather than taken out: an entry that stops being pending, or moves to
// another generation revision, leaves a place that counts for nothing (queuedEntry.live),
// dropped when it comes to the front or when Tracker.compact finds most places such. The
// entries come mostly in the order they are queued by, as a node receives objects in
// revision order, and then a place is queued at once and leaves the front without a
// search: a sorted tree cost a node's agent a tenth of what it spends on each object of a
// bulk apply.
type queue struct {
	items []queuedEntry
}

// queuedEntry is a place in a queue: the entry, the number of the place and the value it
// is ordered by.
type queuedEntry struct {
	e     *entry
	place uint64
	order int64
}

// live tells whether the place counts: its entry is pending, and holds this place.
func (q queuedEntry) live() bool { return q.e.state == pending && q.e.queued == q.place }

// push queues a place.
func (q *queue) push(x queuedEntry) {
	q.items = append(q.items, x)
	q.up(len(q.items) - 1)
}

// min returns the entry of the first live place, dropping those before it. A queue
// emptied lets go of its room when that is large, as Tracker.entries does: a settled node
// holds nothing per object.
func (q *queue) min() (*entry, bool) {
	for len(q.items) > 0 {
		if q.items[0].live() {
			return q.items[0].e, true
		}
		last := len(q.items) - 1
		q.items[0] = q.items[last]
		q.items[last] = queuedEntry{}
		q.items = q.items[:last]
		q.down(0)
	}
	if cap(q.items) > smallRoom {
		q.items = nil
	}
	return nil, false
}

// compact drops every place that counts for nothing, and the room they took.
func (q *queue) compact() {
	live := make([]queuedEntry, 0, len(q.items)/2)
	for _, x := range q.items {
		if x.live() {
			live = append(live, x)
		}
	}
	q.items = live
	for i := len(live)/2 - 1; i >= 0; i-- {
		q.down(i)
	}
}

// less orders the places: by their order, and places equal in it by key, so that the
// entries that turn into exceptions first under a clock that stands still are the same on
// every run.
func (q *queue) less(i, j int) bool {
	a, b := q.items[i], q.items[j]
	if a.order != b.order {
		return a.order < b.order
	}
	return a.e.key.Compare(b.e.key) < 0
}

// up moves the place at i towards the front until the one before it comes first.
func (q *queue) up(i int) {
	for i > 0 {
		parent := (i - 1) / 2
		if !q.less(i, parent) {
			return
		}
		q.items[i], q.items[parent] = q.items[parent], q.items[i]
		i = parent
	}
}

// down moves the place at i away from the front until it comes before those after it.
func (q *queue) down(i int) {
	for {
		first := i
		for _, c := range [2]int{2*i + 1, 2*i + 2} {
			if c < len(q.items) && q.less(c, first) {
				first = c
			}
		}
		if first == i {
			return
		}
		q.items[i], q.items[first] = q.items[first], q.items[i]
		i = first
	}
}
