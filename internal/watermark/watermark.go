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

	"github.com/tidwall/btree"

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
}

// Tracker follows the objects a node holds and their statuses, and works out the
// watermark and exceptions.
type Tracker struct {
	opts Options
	// entries holds the objects that are pending or exceptions; a done object has none.
	entries map[nimbusv1.Key]*entry
	// room is the most entries held at once since entries was made.
	room int
	// pending holds the entries that hold the watermark back, by generation revision;
	// aging holds the same by when they stopped being done.
	pending *btree.BTreeG[*entry]
	aging   *btree.BTreeG[*entry]
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
	byRev := func(a, b *entry) bool {
		if a.genRev != b.genRev {
			return a.genRev < b.genRev
		}
		return a.key.Compare(b.key) < 0
	}
	byAge := func(a, b *entry) bool {
		if c := a.since.Compare(b.since); c != 0 {
			return c < 0
		}
		return a.key.Compare(b.key) < 0
	}
	noLocks := btree.Options{NoLocks: true}
	return &Tracker{
		opts:    opts,
		entries: map[nimbusv1.Key]*entry{},
		pending: btree.NewBTreeGOptions(byRev, noLocks),
		aging:   btree.NewBTreeGOptions(byAge, noLocks),
		changed: map[nimbusv1.Key]struct{}{},
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
	e.genRev, e.state = genRev, now
	if now == pending {
		if was == done {
			e.since = t.opts.Now()
		}
		t.pending.Set(e)
		t.aging.Set(e)
	}
}

// leave takes the entry out of the sets its state puts it in, keeping its state.
func (t *Tracker) leave(e *entry) {
	if e.state == pending {
		t.pending.Delete(e)
		t.aging.Delete(e)
	}
}

// Watermark turns the objects that have been short of done for Options.ExceptionAfter
// into exceptions, as far as the limit allows, and returns the epoch and the watermark:
// the resume point, or just below the first object that holds it back.
func (t *Tracker) Watermark() (epoch string, watermark uint64) {
	cutoff := t.opts.Now().Add(-t.opts.ExceptionAfter)
	for t.exceptions < t.opts.MaxExceptions {
		e, ok := t.aging.Min()
		if !ok || e.since.After(cutoff) {
			break
		}
		t.leave(e)
		e.state = exception
		t.exceptions++
		t.changed[e.key] = struct{}{}
	}
	w := t.rev
	if e, ok := t.pending.Min(); ok && e.genRev <= w {
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
	e, ok := t.aging.Min()
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
func (t *Tracker) Pending() int { return t.pending.Len() }

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
