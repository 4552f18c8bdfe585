package delphi

import (
	"slices"
	"sort"
)

// ordered is a sorted set of items that is never changed once published, so readers
// need no lock: a writer derives a new version from the current one (clone) and changes
// that, copying what it touches, and readers of the old version see none of it.
//
// The items are kept in chunks of at most maxChunk, in order, and the version holds the
// list of its chunks. A write copies the list once per transaction and each chunk it
// changes once per transaction, and shares every other chunk with the version it came
// from; the mark of the transaction tells which chunks and which list it made and may
// change in place. The list is a slice, not a tree, so a transaction copies a pointer per
// maxChunk items once: 1,600 of them at 100,000 items. In exchange an item costs its own
// size and a share of its chunk's header, a few bytes, where go-memdb's radix trees spend
// several hundred bytes on nodes, leaves and watch channels per item and index.
//
// Methods that search take cmp, which compares an item with the target: negative when
// the item sorts before it, zero when it is the target, positive after.
type ordered[T any] struct {
	chunks []*chunk[T]
	n      int
	// mark is the transaction that may change this version, nil once it is published;
	// ownList tells that the transaction has copied chunks, which it may then change in
	// place.
	mark    *txnMark
	ownList bool
}

// chunk is a run of consecutive items of an ordered set.
type chunk[T any] struct {
	items []T
	// mark is the transaction that made the chunk, and may change it in place.
	mark *txnMark
}

// txnMark identifies a write transaction; it has a size so that two marks never share
// an address.
type txnMark struct{ _ byte }

// The bounds of a chunk's length: a chunk that grows past maxChunk is split in two, and
// one that shrinks below minChunk is merged with a neighbour when both fit in one.
const (
	maxChunk = 128
	minChunk = maxChunk / 4
)

// buildOrdered returns a published set of items, which must be sorted and distinct.
func buildOrdered[T any](items []T) *ordered[T] {
	o := &ordered[T]{n: len(items)}
	for len(items) > 0 {
		n := min(maxChunk, len(items))
		o.chunks = append(o.chunks, &chunk[T]{items: items[:n:n]})
		items = items[n:]
	}
	return o
}

// len returns the number of items.
func (o *ordered[T]) len() int { return o.n }

// clone returns a version of the set that the transaction of mark may change.
func (o *ordered[T]) clone(mark *txnMark) *ordered[T] {
	return &ordered[T]{chunks: o.chunks, n: o.n, mark: mark}
}

// publish ends the changes of the transaction: the version may no longer change.
func (o *ordered[T]) publish() { o.mark, o.ownList = nil, false }

// seek returns the position of the first item that does not sort before the target:
// chunk ci, item i, and whether it is the target. Past the last item, ci is
// len(o.chunks).
func (o *ordered[T]) seek(cmp func(T) int) (ci, i int, found bool) {
	ci = sort.Search(len(o.chunks), func(j int) bool {
		items := o.chunks[j].items
		return cmp(items[len(items)-1]) >= 0
	})
	if ci == len(o.chunks) {
		return ci, 0, false
	}
	items := o.chunks[ci].items
	i = sort.Search(len(items), func(j int) bool { return cmp(items[j]) >= 0 })
	return ci, i, cmp(items[i]) == 0
}

// get returns the target item.
func (o *ordered[T]) get(cmp func(T) int) (item T, ok bool) {
	ci, i, found := o.seek(cmp)
	if !found {
		return item, false
	}
	return o.chunks[ci].items[i], true
}

// ascend calls fn with every item from the first that does not sort before the target
// (from the first item when cmp is nil), in order, until fn returns false.
func (o *ordered[T]) ascend(cmp func(T) int, fn func(T) bool) {
	ci, i := 0, 0
	if cmp != nil {
		ci, i, _ = o.seek(cmp)
	}
	for ; ci < len(o.chunks); ci, i = ci+1, 0 {
		for _, item := range o.chunks[ci].items[i:] {
			if !fn(item) {
				return
			}
		}
	}
}

// ownChunk makes the list of chunks and chunk ci the transaction's own, copying them when
// they are not yet, and returns the chunk.
func (o *ordered[T]) ownChunk(ci int) *chunk[T] {
	o.ownChunks()
	c := o.chunks[ci]
	if c.mark != o.mark {
		c = &chunk[T]{items: slices.Clone(c.items), mark: o.mark}
		o.chunks[ci] = c
	}
	return c
}

// ownChunks makes the list of chunks the transaction's own, copying it when it is not
// yet.
func (o *ordered[T]) ownChunks() {
	if o.mark == nil {
		panic("delphi: write to a published version of an ordered set")
	}
	if !o.ownList {
		o.chunks = slices.Clone(o.chunks)
		o.ownList = true
	}
}

// set stores item at the place cmp finds, replacing the item there; it returns the item
// replaced.
func (o *ordered[T]) set(cmp func(T) int, item T) (old T, replaced bool) {
	if len(o.chunks) == 0 {
		o.ownChunks()
		o.chunks = append(o.chunks, &chunk[T]{items: []T{item}, mark: o.mark})
		o.n++
		return old, false
	}
	ci, i, found := o.seek(cmp)
	if ci == len(o.chunks) {
		// After the last item: append to the last chunk.
		ci = len(o.chunks) - 1
		i = len(o.chunks[ci].items)
	}
	c := o.ownChunk(ci)
	if found {
		old, c.items[i] = c.items[i], item
		return old, true
	}
	c.items = slices.Insert(c.items, i, item)
	o.n++
	if len(c.items) > maxChunk {
		half := len(c.items) / 2
		right := &chunk[T]{items: slices.Clone(c.items[half:]), mark: o.mark}
		c.items = slices.Clip(c.items[:half])
		o.chunks = slices.Insert(o.chunks, ci+1, right)
	}
	return old, false
}

// delete removes the item cmp finds and returns it.
func (o *ordered[T]) delete(cmp func(T) int) (old T, deleted bool) {
	ci, i, found := o.seek(cmp)
	if !found {
		return old, false
	}
	c := o.ownChunk(ci)
	old = c.items[i]
	c.items = slices.Delete(c.items, i, i+1)
	o.n--
	switch {
	case len(c.items) == 0:
		o.chunks = slices.Delete(o.chunks, ci, ci+1)
	case len(c.items) < minChunk:
		// Merge with the next chunk, or the previous one, when both fit in one.
		next := ci + 1
		if next == len(o.chunks) {
			next = ci
		}
		if prev := next - 1; prev >= 0 && len(o.chunks[prev].items)+len(o.chunks[next].items) <= maxChunk {
			merged := &chunk[T]{items: slices.Concat(o.chunks[prev].items, o.chunks[next].items), mark: o.mark}
			o.chunks[prev] = merged
			o.chunks = slices.Delete(o.chunks, next, next+1)
		}
	}
	return old, true
}
