package linux

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/naplesnet/naples/hal"
)

// This file holds the mechanism of a KernelView's kernel tables, whatever they hold:
//
//   - viewTable[K, V]: one kernel table of a namespace (its links, say), a hal.Mirror keyed
//     by K, filled by a dump when the view's subscription joins the table's groups, kept
//     current by the view's reader before it hands the notifications on, and shared by the
//     reconcilers of the namespace, which write through it (hal.Mirror.ExpectBy);
//   - tableReader[K, V]: one reconciler's reading of a table, from its construction to its
//     Close: the changes of the table it has yet to handle, queued for its observer while
//     it watches (in the kernel's order, between the notifications it watches), and
//     coalesced by key while it does not, so that it hears of them when it watches again;
//   - tableChange[K, V]: a change as a reader hears of it, computed once by the table.
//
// A table of another kind of object is a viewTable of its key and value, with its decoder
// (viewTableOptions), held by the view (KernelView.tables).

// viewTableOptions is what makes a viewTable a table of one kind of kernel object.
type viewTableOptions[K comparable, V any] struct {
	// groups are the RTNLGRP_* numbers of the notifications that change the table.
	groups []uint
	// equal is the mirror's (hal.NewMirror): whether an object the kernel reports, have,
	// is in the state want describes. hash spreads the keys over its shards.
	equal func(have, want V) bool
	hash  func(K) uint64
	// fields returns the set of the fields, a bit each, in which two values of an object
	// differ; 0 when they are equal.
	fields func(old, new V) uint64
	// notify applies a notification of one of the groups to the mirror (Update, Remove).
	notify func(m *hal.Mirror[K, V], typ uint16, payload []byte)
	// dump loads the mirror with a dump through a reconciler's reader (dumpMirror).
	dump func(ctx context.Context, c *rtnlConn, m *hal.Mirror[K, V]) error
	// echoes, when set, returns the writers of writes under way that the mirror cannot
	// expect, whose echo the change is: a link's create, whose index the write cannot
	// name (linkTable.expectCreate). It runs while the key's shard is locked.
	echoes func(c hal.MirrorChange[K, V]) hal.Writers
}

// viewTable is one kernel table of a KernelView. It is safe for concurrent use.
type viewTable[K comparable, V any] struct {
	opts viewTableOptions[K, V]
	// m holds the table's objects.
	m *hal.Mirror[K, V]

	// stale is set when the view's subscription joins the table's groups, and when it
	// stops reporting them: the table misses what changed while no subscription reported
	// it, and the next reader that watches dumps it (ensure).
	stale atomic.Bool
	// loadMu serializes the dumps. loaded is set once a dump has loaded the table;
	// loading is set during the first, whose changes no reader hears of (the HAL
	// reconciles every object once at start anyway).
	loadMu  sync.Mutex
	loaded  atomic.Bool
	loading atomic.Bool
	// dumps counts the dumps that loaded the table, for tests.
	dumps atomic.Uint64

	// mu guards readers and used.
	mu sync.Mutex
	// used is the set of the bits that readers hold (hal.Writers).
	used    hal.Writers
	readers map[*tableReader[K, V]]struct{}
	// list is a copy of readers that the mirror's follower reads without the lock.
	list atomic.Pointer[[]*tableReader[K, V]]
}

// newViewTable returns an empty table.
func newViewTable[K comparable, V any](opts viewTableOptions[K, V]) *viewTable[K, V] {
	t := &viewTable[K, V]{opts: opts, m: hal.NewMirror(opts.equal, opts.hash), readers: map[*tableReader[K, V]]struct{}{}}
	t.stale.Store(true)
	t.m.Follow(t.follow)
	return t
}

// viewTableState is what a KernelView does with its tables whatever they hold.
type viewTableState interface {
	// groupSet returns the table's groups, a bit per RTNLGRP_* number.
	groupSet() uint64
	// markStale records that the view's subscription joined the table's groups.
	markStale()
	// notify applies a notification to the table, if it is of the table's.
	notify(typ uint16, payload []byte)
}

func (t *viewTable[K, V]) groupSet() uint64 {
	var set uint64
	for _, g := range t.opts.groups {
		set |= 1 << g
	}
	return set
}

func (t *viewTable[K, V]) markStale() { t.stale.Store(true) }

func (t *viewTable[K, V]) notify(typ uint16, payload []byte) { t.opts.notify(t.m, typ, payload) }

// loadLocked dumps the table through c, the reader of a reconciler. loadMu must be held.
func (t *viewTable[K, V]) loadLocked(ctx context.Context, c *rtnlConn) error {
	first := !t.loaded.Load()
	t.loading.Store(first)
	defer t.loading.Store(false)
	if err := t.opts.dump(ctx, c, t.m); err != nil {
		return err
	}
	t.dumps.Add(1)
	t.loaded.Store(true)
	return nil
}

// fill dumps the table through c unless a dump has loaded it already.
func (t *viewTable[K, V]) fill(ctx context.Context, c *rtnlConn) error {
	if t.loaded.Load() {
		return nil
	}
	t.loadMu.Lock()
	defer t.loadMu.Unlock()
	if t.loaded.Load() {
		return nil
	}
	return t.loadLocked(ctx, c)
}

// ensure dumps the table through c when the view's subscription joined its groups since
// its last dump.
func (t *viewTable[K, V]) ensure(ctx context.Context, c *rtnlConn) error {
	if !t.stale.Load() {
		return nil
	}
	t.loadMu.Lock()
	defer t.loadMu.Unlock()
	if !t.stale.Swap(false) {
		return nil
	}
	if err := t.loadLocked(ctx, c); err != nil {
		t.stale.Store(true)
		return err
	}
	return nil
}

// current reports whether the table shows the kernel as the view's subscription reports
// it: it was loaded since the subscription joined its groups, and the subscription
// still reports them.
func (t *viewTable[K, V]) current() bool { return t.loaded.Load() && !t.stale.Load() }

// reload dumps the table afresh through c (a resync); its readers hear of what the dump
// found changed.
func (t *viewTable[K, V]) reload(ctx context.Context, c *rtnlConn) error {
	t.loadMu.Lock()
	defer t.loadMu.Unlock()
	return t.loadLocked(ctx, c)
}

// follow hands a change of the mirror to the readers it concerns: every reader but the
// one whose write made it, each told whether it is the echo of its own write. Changes
// of the first dump, and those that change nothing, concern none.
func (t *viewTable[K, V]) follow(c hal.MirrorChange[K, V]) {
	if c.Dump && t.loading.Load() {
		return
	}
	var fields uint64
	if c.Had && c.Has {
		if fields = t.opts.fields(c.Old, c.New); fields == 0 {
			return
		}
	}
	list := t.list.Load()
	if list == nil {
		return
	}
	echoes := c.Echoes
	if t.opts.echoes != nil {
		echoes |= t.opts.echoes(c)
	}
	for _, r := range *list {
		if c.Wrote&r.bit != 0 {
			continue
		}
		tc := tableChange[K, V]{key: c.Key, old: c.Old, new: c.New, had: c.Had, has: c.Has,
			echo: echoes&r.bit != 0, fields: fields}
		if r.concerns != nil && !r.concerns(&tc) {
			continue
		}
		r.push(tc)
	}
}

// reader returns a new reader of the table for a reconciler that dumps through c, or nil
// when 64 readers hold the table already. The reconciler closes it when it closes.
func (t *viewTable[K, V]) reader(c *rtnlConn) *tableReader[K, V] { return t.readerOf(c, nil) }

// readerOf is reader for a reconciler that hears only of the changes concerns reports
// true for, unless concerns is nil: the others never reach its queue, its backlog or
// its observer. concerns runs as the table follows its mirror, with a shard of the
// mirror locked: it must be quick.
func (t *viewTable[K, V]) readerOf(c *rtnlConn, concerns func(*tableChange[K, V]) bool) *tableReader[K, V] {
	t.mu.Lock()
	defer t.mu.Unlock()
	r := &tableReader[K, V]{t: t, conn: c, concerns: concerns, backlog: map[K]*tableChange[K, V]{}}
	for bit := hal.Writers(1); bit != 0; bit <<= 1 {
		if t.used&bit == 0 {
			r.bit = bit
			break
		}
	}
	if r.bit == 0 {
		return nil
	}
	t.used |= r.bit
	t.readers[r] = struct{}{}
	t.publishLocked()
	return r
}

// publishLocked hands the follower the readers as they are now.
func (t *viewTable[K, V]) publishLocked() {
	list := make([]*tableReader[K, V], 0, len(t.readers))
	for r := range t.readers {
		list = append(list, r)
	}
	t.list.Store(&list)
}

// tableChange is a change of a table's object as one reader hears of it: the object with
// key was old (when had) and is new (when has).
type tableChange[K comparable, V any] struct {
	key      K
	old, new V
	had, has bool
	// echo tells that an event made the change that is the echo of the reader's own
	// write (its reconciler's); the change is someone else's or the kernel's otherwise.
	echo bool
	// fields is the set of the fields that differ (viewTableOptions.fields) when the
	// object was there before and after; 0 otherwise.
	fields uint64
}

// tableReader is one reconciler's reading of a viewTable, and the writer it names in the
// table's mirror (bit).
type tableReader[K comparable, V any] struct {
	t *viewTable[K, V]
	// conn is the reconciler's: the table's dumps go through its reader.
	conn *rtnlConn
	// bit names the reconciler among the table's writers.
	bit hal.Writers
	// concerns, when set, tells the changes the reconciler hears of (readerOf).
	concerns func(*tableChange[K, V]) bool

	// mu guards w, slot, handle, queue, head and backlog.
	mu sync.Mutex
	// w is the observer's watcher while it watches (attach), nil otherwise; slot is the
	// reader's place among the watcher's tables, and handle what the observer does with
	// a change.
	w      *viewWatcher
	slot   int
	handle func(tableChange[K, V])
	// queue holds, from head on, the changes queued for the watcher, which holds a mark
	// for each. Its array is used again as it drains, and once drained up to keptQueue
	// changes: a burst of route changes used to allocate it anew as it grew, three
	// quarters of a kilobyte per route.
	queue []tableChange[K, V]
	head  int
	// backlog holds the changes made while no watcher takes them, coalesced by key.
	backlog map[K]*tableChange[K, V]
}

// writer returns the writer the reader names in the table's mirror (hal.Mirror.ExpectBy).
func (r *tableReader[K, V]) writer() hal.Writers { return r.bit }

// close stops the reader hearing of the table's changes and frees its bit.
func (r *tableReader[K, V]) close() {
	t := r.t
	t.mu.Lock()
	if _, ok := t.readers[r]; ok {
		delete(t.readers, r)
		t.used &^= r.bit
		t.publishLocked()
	}
	t.mu.Unlock()
}

// keptQueue is how many changes a drained queue keeps room for: some 100 KB for a
// link table's, whose changes are the largest, so that a reader does not hold the room
// of a burst once idle. Within a burst the array is used again however large it grew.
const keptQueue = 256

// push queues a change for the watcher, or in the backlog when none takes it.
func (r *tableReader[K, V]) push(c tableChange[K, V]) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.w != nil && r.w.mark(r.slot) {
		if r.head > 0 && len(r.queue) == cap(r.queue) {
			// A full array: its drained front makes room when it is half of it at
			// least, or else the queued changes move to an array twice their number,
			// so that a change moves a bounded number of times on average.
			live := r.queue[r.head:]
			if r.head >= len(live) {
				n := copy(r.queue, live)
				clear(r.queue[n:])
				r.queue = r.queue[:n]
			} else {
				r.queue = append(make([]tableChange[K, V], 0, 2*len(live)), live...)
			}
			r.head = 0
		}
		r.queue = append(r.queue, c)
		return
	}
	r.coalesceLocked(c)
}

// coalesceLocked adds c to the backlog: a change of a key there already keeps the state
// before the first, takes the state after c, and is an echo only if both are.
func (r *tableReader[K, V]) coalesceLocked(c tableChange[K, V]) {
	prev, ok := r.backlog[c.key]
	if !ok {
		r.backlog[c.key] = &c
		return
	}
	prev.new, prev.has = c.new, c.has
	prev.echo = prev.echo && c.echo
	prev.fields = 0
	if prev.had && prev.has {
		prev.fields = r.t.opts.fields(prev.old, prev.new)
	}
}

// watching returns the source through which an observer that watches through the view
// hears of the table's changes, each handed to handle.
func (r *tableReader[K, V]) watching(handle func(tableChange[K, V])) viewSource {
	return &tableSource[K, V]{r: r, handle: handle}
}

// viewSource is a table an observer watches through a KernelView (KernelView.watch).
type viewSource interface {
	// groupSet returns the table's groups, a bit per RTNLGRP_* number.
	groupSet() uint64
	// attach makes the watcher, in whose queue the source is at slot, take the table's
	// changes, and returns a function that hands those it missed to the observer.
	attach(w *viewWatcher, slot int) (missed func())
	// detach stops the watcher taking the changes: those it has not handled go back to
	// the backlog.
	detach()
	// ensure dumps the table when the view's subscription joined its groups since its
	// last dump.
	ensure(ctx context.Context) error
	// next hands the next change queued for the watcher to the observer.
	next()
}

// tableSource is the viewSource of a tableReader.
type tableSource[K comparable, V any] struct {
	r      *tableReader[K, V]
	handle func(tableChange[K, V])
}

func (s *tableSource[K, V]) groupSet() uint64 { return s.r.t.groupSet() }

func (s *tableSource[K, V]) ensure(ctx context.Context) error { return s.r.t.ensure(ctx, s.r.conn) }

func (s *tableSource[K, V]) attach(w *viewWatcher, slot int) func() {
	r := s.r
	r.mu.Lock()
	defer r.mu.Unlock()
	r.w, r.slot, r.handle = w, slot, s.handle
	missed := make([]tableChange[K, V], 0, len(r.backlog))
	for _, c := range r.backlog {
		missed = append(missed, *c)
	}
	clear(r.backlog)
	return func() {
		for _, c := range missed {
			s.handle(c)
		}
	}
}

func (s *tableSource[K, V]) detach() {
	r := s.r
	r.mu.Lock()
	defer r.mu.Unlock()
	later := r.backlog
	queued := r.queue[r.head:]
	r.backlog = make(map[K]*tableChange[K, V], len(queued)+len(later))
	for _, c := range queued {
		r.coalesceLocked(c)
	}
	for _, c := range later {
		r.coalesceLocked(*c)
	}
	r.w, r.handle, r.queue, r.head = nil, nil, nil, 0
}

func (s *tableSource[K, V]) next() {
	r := s.r
	r.mu.Lock()
	if r.head == len(r.queue) {
		r.mu.Unlock()
		return
	}
	c := r.queue[r.head]
	var zero tableChange[K, V]
	r.queue[r.head] = zero
	r.head++
	if r.head == len(r.queue) {
		r.head = 0
		r.queue = r.queue[:0]
		if cap(r.queue) > keptQueue {
			r.queue = nil
		}
	}
	r.mu.Unlock()
	s.handle(c)
}

// drainMissed hands the changes of the backlog to handle, when no observer watches: a
// resync that the observer does not run (a sweep) hears of what it found changed.
func (r *tableReader[K, V]) drainMissed(handle func(tableChange[K, V])) {
	r.mu.Lock()
	if r.w != nil {
		r.mu.Unlock()
		return
	}
	missed := make([]tableChange[K, V], 0, len(r.backlog))
	for _, c := range r.backlog {
		missed = append(missed, *c)
	}
	clear(r.backlog)
	r.mu.Unlock()
	for _, c := range missed {
		handle(c)
	}
}
