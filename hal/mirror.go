package hal

import (
	"hash/maphash"
	"iter"
	"slices"
	"sync"
)

// Mirror is an in-memory copy of the kernel objects of one kind that a backend reads
// instead of asking the kernel, keyed by their kernel identity K (a route's table, prefix
// and metric, say) and holding what the backend needs to know of each, V. It is safe for
// concurrent use.
//
// Three things keep it current:
//
//   - Replace loads a full dump: once at start, again whenever the backend's subscription
//     to kernel changes starts over (a netlink socket that overflowed), and at every
//     resync. It returns the keys whose dumped state differs from the mirrored one: drift
//     that no event reported.
//   - Update and Remove apply the changes the subscription reports, in the order it
//     reports them: an event is the kernel's truth.
//   - Expect, before the backend writes an object, and then Done, Fail or Gone on the
//     returned Write, record the backend's own writes, so a reconcile that follows sees
//     what was written without waiting for its event.
//
// Events lag the kernel: one that the subscription reports after a write may describe the
// object as it was before. So while a write of a key waits for its echo (the event that
// reports it), events of that key that differ from what was written are passed over, and
// the mirror keeps showing the write; the echo, or any event equal to the written state,
// ends the wait. An event passed over is not lost: should the write fail, the mirror takes
// the latest such event. A write whose echo never comes (the kernel reports no replace
// that changes nothing) stops waiting at the next Replace, which also ends the waits of
// every write under way, as a subscription started anew may not carry their echoes; until
// their echo, an event older than such a write may then show the object's older state for
// a moment.
//
// Indexes (NewIndex) find the objects of one value derived from each, such as the
// addresses of one interface, without a walk of the whole mirror.
//
// Several writers may share a mirror: each names itself with a bit of Writers when it
// expects a write (ExpectBy), and a follower (Follow) hears of every change the mirror
// shows with its cause: the writer whose write ended, or the writers whose writes the
// event echoes, so that an echo is passed over only by the writer whose write it was.
//
// A backend must not run two writes of one key at once; writes of different keys, events
// and Replace may run concurrently with each other. The mirror is split in shards by key,
// each with its own lock, so that many workers writing different keys do not queue on
// one lock.
type Mirror[K comparable, V any] struct {
	equal func(have, want V) bool
	hash  func(K) uint64
	seed  maphash.Seed

	shards [mirrorShards]mirrorShard[K, V]
}

// mirrorShards is the number of shards of a Mirror.
const mirrorShards = 16

// mirrorShard holds the keys of a Mirror that hash to it.
type mirrorShard[K comparable, V any] struct {
	// index is the shard's place in Mirror.shards.
	index int
	// mu guards objs, pending and replacing.
	mu sync.RWMutex
	// objs holds the mirrored objects; a key that is absent in the kernel is absent here.
	objs map[K]V
	// pending holds, per key, the writes that wait for their echo.
	pending map[K]*pendingWrites[K, V]
	// replacing holds the Replace calls in progress, which must not overwrite what
	// changes while they dump.
	replacing map[*replaceRun[K]]struct{}
	// indexes are the mirror's indexes (NewIndex), which follow every change of objs.
	indexes []mirrorIndex[K, V]
	// followers are the functions Follow registered, which hear of every change of objs.
	followers []func(MirrorChange[K, V])
}

// Writers is a set of the writers that share a Mirror, a bit each (at most 64): ExpectBy
// names the writer of a write, and a MirrorChange the writers of its cause.
type Writers uint64

// MirrorChange is a change of what a Mirror shows, as Follow reports it: the object with
// key Key was Old (when Had) and is New (when Has). Old and New may be equal: a write's
// echo, or a dump, that leaves the object as it was.
type MirrorChange[K comparable, V any] struct {
	Key      K
	Old, New V
	Had, Has bool
	// Wrote is the writer whose write made the change, as it ended (Done, Fail, Gone);
	// 0 for a change an event or a dump made, or a write that named no writer.
	Wrote Writers
	// Echoes are the writers of the writes whose echo the event that made the change
	// is (Update, Remove).
	Echoes Writers
	// Dump tells that Replace made the change.
	Dump bool
}

// mirrorCause is why a shard's object changes, as a MirrorChange tells it.
type mirrorCause struct {
	wrote, echoes Writers
	dump          bool
}

// NewMirror returns an empty mirror. equal reports whether an object the kernel reports,
// have, is in the state want describes, which may be a state the backend wrote (and so
// leave out what the kernel fills in, such as the interface of a gateway). Replace uses it
// to find drift, Update to recognise the echo of a write (but of one that ExpectFunc made,
// which brings its own). hash, when not nil, spreads the keys over the mirror's shards,
// and must return the same for equal keys; without it the mirror hashes keys with
// hash/maphash, which allocates for most key types.
func NewMirror[K comparable, V any](equal func(have, want V) bool, hash func(K) uint64) *Mirror[K, V] {
	m := &Mirror[K, V]{equal: equal, hash: hash, seed: maphash.MakeSeed()}
	for i := range m.shards {
		m.shards[i] = mirrorShard[K, V]{
			index:     i,
			objs:      map[K]V{},
			pending:   map[K]*pendingWrites[K, V]{},
			replacing: map[*replaceRun[K]]struct{}{},
		}
	}
	return m
}

// shard returns the shard of key k.
func (m *Mirror[K, V]) shard(k K) *mirrorShard[K, V] {
	var h uint64
	if m.hash != nil {
		h = m.hash(k)
	} else {
		h = maphash.Comparable(m.seed, k)
	}
	return &m.shards[h%mirrorShards]
}

// mirrorState is an object's state: present with a value, or absent.
type mirrorState[V any] struct {
	v       V
	present bool
}

// pendingWrites are a key's writes that wait for their echo, oldest first, and the latest
// event of the key passed over meanwhile.
type pendingWrites[K comparable, V any] struct {
	writes []*Write[K, V]
	seen   *mirrorState[V]
}

// maxPending bounds the writes of one key that wait for their echo; beyond it the oldest
// stop waiting. An echo goes missing only where a Replace follows, such as a subscription
// that overflowed and starts over.
const maxPending = 8

// replaceRun is one Replace in progress: the keys that changed while it dumped, by
// shard, each guarded by its shard's lock.
type replaceRun[K comparable] struct {
	touched [mirrorShards]map[K]struct{}
}

// Write is a write of one object that a backend is making to the kernel: Expect or
// ExpectGone returned it, and exactly one of Done, Fail or Gone ends it.
type Write[K comparable, V any] struct {
	s    *mirrorShard[K, V]
	key  K
	want mirrorState[V]
	// match, when not nil, recognises the write's echo instead of the mirror's equal.
	match func(have, want V) bool
	// by names the writer (ExpectBy); 0 for none.
	by Writers
	// Guarded by s.mu:
	ended  bool // Done, Fail or Gone was called
	echoed bool // an event equal to want, or any event once loose, was applied
	loose  bool // a Replace began while it was under way: it waits for no echo
}

// Get returns the mirrored state of the object with key k, and whether the kernel holds
// it.
func (m *Mirror[K, V]) Get(k K) (V, bool) {
	sh := m.shard(k)
	sh.mu.RLock()
	defer sh.mu.RUnlock()
	v, ok := sh.objs[k]
	return v, ok
}

// Len returns the number of mirrored objects.
func (m *Mirror[K, V]) Len() int {
	n := 0
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.RLock()
		n += len(sh.objs)
		sh.mu.RUnlock()
	}
	return n
}

// All returns the mirrored objects as they are when it is called (each shard's at one
// moment), in no particular order.
func (m *Mirror[K, V]) All() iter.Seq2[K, V] {
	type kv struct {
		k K
		v V
	}
	var all []kv
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.RLock()
		all = slices.Grow(all, len(sh.objs))
		for k, v := range sh.objs {
			all = append(all, kv{k, v})
		}
		sh.mu.RUnlock()
	}
	return func(yield func(K, V) bool) {
		for _, e := range all {
			if !yield(e.k, e.v) {
				return
			}
		}
	}
}

// Update applies an event that reports the kernel holding v under k. It returns whether
// the event is the echo of a write the backend made (or, what cannot be told apart, an
// earlier event equal to it); an event that is not describes a change someone else made,
// or one the kernel made, and may be drift.
func (m *Mirror[K, V]) Update(k K, v V) (echo bool) {
	return m.apply(k, mirrorState[V]{v: v, present: true})
}

// Remove applies an event that reports the object with key k gone from the kernel. Its
// result is Update's.
func (m *Mirror[K, V]) Remove(k K) (echo bool) {
	return m.apply(k, mirrorState[V]{})
}

func (m *Mirror[K, V]) apply(k K, st mirrorState[V]) bool {
	sh := m.shard(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sh.touchLocked(k)
	p := sh.pending[k]
	echo := false
	var cause mirrorCause
	if p != nil {
		// Writes that were under way when a Replace began wait for no echo: any event
		// supersedes them.
		p.writes = slices.DeleteFunc(p.writes, func(w *Write[K, V]) bool {
			if !w.loose {
				return false
			}
			w.echoed = true
			if m.echoesLocked(st, w) {
				echo = true
				cause.echoes |= w.by
			}
			return true
		})
		if len(p.writes) == 0 {
			delete(sh.pending, k)
			p = nil
		}
	}
	if p == nil {
		sh.setLocked(k, st, cause)
		return echo
	}
	for i, w := range p.writes {
		if !m.echoesLocked(st, w) {
			continue
		}
		// The echo of w, or a state equal to it: w and the writes before it wait no more.
		// It is the echo of the writes among them that it matches.
		for _, e := range p.writes[:i+1] {
			e.echoed = true
			if e == w || m.echoesLocked(st, e) {
				cause.echoes |= e.by
			}
		}
		p.writes = p.writes[i+1:]
		if len(p.writes) == 0 {
			delete(sh.pending, k)
			sh.setLocked(k, st, cause)
		} else {
			p.seen = &st
		}
		return true
	}
	// An event from before the pending writes: the mirror keeps what they wrote.
	p.seen = &st
	return echo
}

// Expect records that the backend is about to write v under k, and returns the write,
// which the backend ends with Done once the kernel took it, or with Fail. The mirror
// shows v from Done on.
func (m *Mirror[K, V]) Expect(k K, v V) *Write[K, V] {
	return m.expect(k, mirrorState[V]{v: v, present: true}, nil)
}

// ExpectFunc is Expect for a write whose echo match recognises instead of the mirror's
// equal: match reports whether an object the kernel reports, have, is in the state the
// write wants (v), so that writers that leave different fields to the kernel (one an
// interface index, another an MTU) can share one mirror.
func (m *Mirror[K, V]) ExpectFunc(k K, v V, match func(have, want V) bool) *Write[K, V] {
	return m.expect(k, mirrorState[V]{v: v, present: true}, match)
}

// ExpectBy is ExpectFunc for a mirror that several writers share: by (one bit) names the
// writer, which the changes the write makes (MirrorChange.Wrote) and those of its echo
// (MirrorChange.Echoes) carry. match may be nil: the mirror's equal recognises the echo.
func (m *Mirror[K, V]) ExpectBy(by Writers, k K, v V, match func(have, want V) bool) *Write[K, V] {
	return m.expectBy(by, k, mirrorState[V]{v: v, present: true}, match)
}

// ExpectGoneBy is ExpectGone for a mirror that several writers share, by naming the
// writer (ExpectBy).
func (m *Mirror[K, V]) ExpectGoneBy(by Writers, k K) *Write[K, V] {
	return m.expectBy(by, k, mirrorState[V]{}, nil)
}

// ExpectGone records that the backend is about to delete the object with key k, and
// returns the write, which the backend ends with Done once the kernel deleted it, with Gone
// when the kernel had no such object, or with Fail.
func (m *Mirror[K, V]) ExpectGone(k K) *Write[K, V] {
	return m.expect(k, mirrorState[V]{}, nil)
}

// writeAndPending is a write allocated together with the pending writes of its key, for
// the usual case of a key with no other write under way: one allocation, not three.
type writeAndPending[K comparable, V any] struct {
	w    Write[K, V]
	p    pendingWrites[K, V]
	slot [1]*Write[K, V]
}

func (m *Mirror[K, V]) expect(k K, st mirrorState[V], match func(have, want V) bool) *Write[K, V] {
	return m.expectBy(0, k, st, match)
}

func (m *Mirror[K, V]) expectBy(by Writers, k K, st mirrorState[V], match func(have, want V) bool) *Write[K, V] {
	sh := m.shard(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sh.touchLocked(k)
	p := sh.pending[k]
	var w *Write[K, V]
	if p == nil {
		a := &writeAndPending[K, V]{}
		w, p = &a.w, &a.p
		p.writes = a.slot[:0]
		sh.pending[k] = p
	} else {
		w = &Write[K, V]{}
	}
	*w = Write[K, V]{s: sh, key: k, want: st, match: match, by: by}
	if len(p.writes) >= maxPending {
		p.writes = p.writes[1:]
	}
	p.writes = append(p.writes, w)
	return w
}

// Done records that the kernel took the write. The mirror shows what was written, unless
// an event that ends the write's wait was applied already: then it shows what the events
// since report.
func (w *Write[K, V]) Done() {
	sh := w.s
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if w.ended {
		return
	}
	w.ended = true
	sh.touchLocked(w.key)
	if w.echoed {
		return
	}
	sh.setLocked(w.key, w.want, mirrorCause{wrote: w.by})
	if w.loose {
		sh.dropLocked(w)
	}
}

// Fail records that the kernel refused the write and so changed nothing: the mirror keeps
// what it showed, or the latest event of the key applied while the write was under way.
func (w *Write[K, V]) Fail() { w.end(nil) }

// Gone records that the kernel answered a delete saying it held no such object: the
// mirror shows the object absent, or the latest event of the key applied while the delete
// was under way.
func (w *Write[K, V]) Gone() { w.end(&mirrorState[V]{}) }

// end ends a write that the kernel will not echo; known, when set, is the state the
// kernel's answer proved.
func (w *Write[K, V]) end(known *mirrorState[V]) {
	sh := w.s
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if w.ended {
		return
	}
	w.ended = true
	sh.touchLocked(w.key)
	if w.echoed {
		return // the kernel already reported the state the write would have left
	}
	p := sh.pending[w.key]
	if p == nil {
		return
	}
	switch {
	case p.seen != nil:
		sh.setLocked(w.key, *p.seen, mirrorCause{wrote: w.by})
	case known != nil:
		sh.setLocked(w.key, *known, mirrorCause{wrote: w.by})
	}
	sh.dropLocked(w)
}

// dropLocked stops w waiting for its echo.
func (sh *mirrorShard[K, V]) dropLocked(w *Write[K, V]) {
	p := sh.pending[w.key]
	if p == nil {
		return
	}
	p.writes = slices.DeleteFunc(p.writes, func(e *Write[K, V]) bool { return e == w })
	if len(p.writes) == 0 {
		delete(sh.pending, w.key)
	}
}

// Replace loads a full dump of the kernel objects into the mirror: dump calls add with
// every object the kernel holds. It returns the keys whose dumped state differs from the
// mirrored one, in no particular order: drift that no event reported. Keys that change
// while dump runs, by an event or a write, keep their newer state. When dump fails, the
// mirror is left as it was.
//
// The dump is the mirror's new baseline: the writes made or under way when Replace is
// called wait no more for their echo, which a subscription started since might never
// carry; the first event of such a key applies, and a write still under way shows its
// state from Done only if no event came first. So a backend that subscribes to kernel
// changes anew calls Replace after subscribing.
func (m *Mirror[K, V]) Replace(dump func(add func(K, V)) error) ([]K, error) {
	run := &replaceRun[K]{}
	// The dump holds about what the mirror holds: its maps are made to that size, so
	// that a reload of many objects does not grow them step by step.
	var fresh [mirrorShards]map[K]V
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		fresh[i] = make(map[K]V, len(sh.objs))
		run.touched[i] = map[K]struct{}{}
		sh.replacing[run] = struct{}{}
		for k, p := range sh.pending {
			p.writes = slices.DeleteFunc(p.writes, func(w *Write[K, V]) bool {
				w.loose = true
				return w.ended
			})
			if len(p.writes) == 0 {
				delete(sh.pending, k)
			}
		}
		sh.mu.Unlock()
	}
	defer func() {
		for i := range m.shards {
			sh := &m.shards[i]
			sh.mu.Lock()
			delete(sh.replacing, run)
			sh.mu.Unlock()
		}
	}()

	if err := dump(func(k K, v V) { fresh[m.shard(k).index][k] = v }); err != nil {
		return nil, err
	}

	var drift []K
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		if len(sh.objs) == 0 {
			// The first load: the shard's map takes the dump's size at once.
			sh.objs = make(map[K]V, len(fresh[i]))
		}
		touched := run.touched[i]
		settled := func(k K) bool {
			_, changed := touched[k]
			_, writing := sh.pending[k]
			return !changed && !writing
		}
		for k, v := range fresh[i] {
			if !settled(k) {
				continue
			}
			if old, ok := sh.objs[k]; !ok || !m.equal(v, old) {
				drift = append(drift, k)
			}
			sh.putLocked(k, v, mirrorCause{dump: true})
		}
		for k := range sh.objs {
			if _, ok := fresh[i][k]; !ok && settled(k) {
				drift = append(drift, k)
				sh.deleteLocked(k, mirrorCause{dump: true})
			}
		}
		sh.mu.Unlock()
	}
	return drift, nil
}

// setLocked makes the mirror show st under k, for the cause.
func (sh *mirrorShard[K, V]) setLocked(k K, st mirrorState[V], cause mirrorCause) {
	if st.present {
		sh.putLocked(k, st.v, cause)
	} else {
		sh.deleteLocked(k, cause)
	}
}

// putLocked makes the mirror show v under k, for the cause, and the indexes and
// followers follow.
func (sh *mirrorShard[K, V]) putLocked(k K, v V, cause mirrorCause) {
	if len(sh.indexes) > 0 || len(sh.followers) > 0 {
		old, had := sh.objs[k]
		for _, ix := range sh.indexes {
			ix.changed(k, old, had, v, true)
		}
		sh.followLocked(MirrorChange[K, V]{Key: k, Old: old, Had: had, New: v, Has: true}, cause)
	}
	sh.objs[k] = v
}

// deleteLocked makes the mirror show k absent, for the cause, and the indexes and
// followers follow.
func (sh *mirrorShard[K, V]) deleteLocked(k K, cause mirrorCause) {
	if len(sh.indexes) > 0 || len(sh.followers) > 0 {
		if old, had := sh.objs[k]; had {
			var zero V
			for _, ix := range sh.indexes {
				ix.changed(k, old, true, zero, false)
			}
			sh.followLocked(MirrorChange[K, V]{Key: k, Old: old, Had: true}, cause)
		}
	}
	delete(sh.objs, k)
}

// followLocked tells the followers of the change, with its cause.
func (sh *mirrorShard[K, V]) followLocked(c MirrorChange[K, V], cause mirrorCause) {
	if len(sh.followers) == 0 {
		return
	}
	c.Wrote, c.Echoes, c.Dump = cause.wrote, cause.echoes, cause.dump
	for _, f := range sh.followers {
		f(c)
	}
}

// Follow calls f with every change of what m shows from now on, from events, writes and
// Replace alike, with its cause, in the order the changes of each key happen. f runs
// while the key's shard is locked: it must be quick and must not call m. A follower
// cannot be removed.
func (m *Mirror[K, V]) Follow(f func(MirrorChange[K, V])) {
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		sh.followers = append(sh.followers, f)
		sh.mu.Unlock()
	}
}

// echoesLocked reports whether the kernel's state have is the state the write w wants:
// by w's match when it has one, else by the mirror's equal.
func (m *Mirror[K, V]) echoesLocked(have mirrorState[V], w *Write[K, V]) bool {
	if have.present != w.want.present {
		return false
	}
	if !have.present {
		return true
	}
	if w.match != nil {
		return w.match(have.v, w.want.v)
	}
	return m.equal(have.v, w.want.v)
}

// touchLocked tells every Replace in progress that k, a key of the shard, changed.
func (sh *mirrorShard[K, V]) touchLocked(k K) {
	for run := range sh.replacing {
		run.touched[sh.index][k] = struct{}{}
	}
}
