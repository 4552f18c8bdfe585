package nimbus

import (
	"cmp"
	"slices"
	"time"
)

// markIndex indexes the watermarks of the target nodes of the objects for every node, as
// the views of the store's versions with the same nodesGen, marksGen and epoch, whose
// staleSince fits it (fits), read them: how many of the nodes passed a revision is a
// binary search, and so are the statuses of an object with few records (status's counts,
// without a walk of the nodes). It is never modified once made: the views share it, and a
// view of a later version makes the next from it, from the nodes whose watermarks were
// written since (withMoves), rather than read every node's again. At ten thousand nodes
// that read, with its sort, took a status watch's flush 10–16 ms.
type markIndex struct {
	// nodesGen, marksGen and epoch are those of the views it was made for.
	nodesGen, marksGen uint64
	epoch              string
	// marks holds each node's watermark as watermarkRecord.mark gives it, by index in
	// view.every; wms the records.
	marks []uint64
	wms   []*watermarkRecord
	// byMark holds the indices of the nodes, ordered by mark, then by index (which is by
	// name); sorted holds their marks in that order.
	byMark []int32
	sorted []uint64
	// stale tells, by index, the nodes whose statuses are stale; staleIdx holds their
	// indices in order, staleSorted their marks sorted.
	stale       []bool
	staleIdx    []int32
	staleSorted []uint64
	// staleOn tells whether statuses can be stale at all (view.staleSince is not zero);
	// then the nodes that are stale are those of every view whose staleSince is at or
	// after staleFrom and before staleUntil: the latest end of a last watch among the
	// stale nodes and the earliest among the others without a watch open.
	staleOn               bool
	staleFrom, staleUntil time.Time
}

// fits tells whether the nodes stale in a view whose staleSince is since are those of
// the index.
func (x *markIndex) fits(since time.Time) bool {
	if !x.staleOn {
		return since.IsZero()
	}
	return !since.IsZero() && !since.Before(x.staleFrom) && since.Before(x.staleUntil)
}

// markChange is one entry of the journal of writes of the watermarks table that a version
// of the store keeps (tables.markLog): the node whose watermark the write at marksGen gen
// made, deleted or moved, and the entry before, back to at most markJournal entries.
// Entries are never modified; the versions share them.
type markChange struct {
	gen   uint64
	node  string
	prev  *markChange
	depth int
}

// markJournal bounds the entries of the journal a version keeps: a view whose shared
// index is older than that reads every node's watermark again.
const markJournal = 4096

// journalMark records in the journal that the transaction wrote the node's watermark.
func (w *writeTxn) journalMark(node string) {
	w.marksGen++
	c := &markChange{gen: w.marksGen, node: node, prev: w.markLog, depth: 1}
	if c.prev != nil {
		if c.prev.depth >= markJournal {
			c.prev = nil // the journal starts over; the older entries go with their versions
		} else {
			c.depth = c.prev.depth + 1
		}
	}
	w.markLog = c
}

// marksWrittenSince returns the nodes whose watermarks the writes after marksGen gen, up to
// the version's, wrote, latest first and possibly more than once, and whether the journal
// still holds them all.
func (t *tables) marksWrittenSince(gen uint64) ([]string, bool) {
	if t.marksGen == gen {
		return nil, true
	}
	var nodes []string
	for c := t.markLog; c != nil && c.gen > gen; c = c.prev {
		nodes = append(nodes, c.node)
		if c.gen == gen+1 {
			return nodes, true
		}
	}
	return nil, false
}

// markIndex returns the index of the watermarks of the nodes everyNode returns: the one
// the store holds when it is the view's, else one made from it with the writes since
// (withMoves), else one read afresh; the store then holds the one returned.
func (v *view) markIndex() *markIndex {
	if v.st == nil {
		return v.readMarkIndex()
	}
	x := v.st.marks.Load()
	switch {
	case x == nil || x.nodesGen != v.nodesGen || x.epoch != v.epoch || x.marksGen > v.marksGen || !x.fits(v.staleSince):
		x = v.readMarkIndex()
	case x.marksGen < v.marksGen:
		if nodes, ok := v.marksWrittenSince(x.marksGen); ok {
			x = x.withMoves(v, nodes)
		} else {
			x = v.readMarkIndex()
		}
	default:
		return x
	}
	v.st.cacheMarks(x)
	return x
}

// readMarkIndex reads the index of the view's watermarks from every node's.
func (v *view) readMarkIndex() *markIndex {
	nodes := v.everyNode()
	n := len(nodes)
	x := &markIndex{
		nodesGen: v.nodesGen, marksGen: v.marksGen, epoch: v.epoch,
		marks: make([]uint64, n), wms: make([]*watermarkRecord, n),
		byMark: make([]int32, n), sorted: make([]uint64, n), stale: make([]bool, n),
		staleOn: !v.staleSince.IsZero(), staleUntil: farFuture,
	}
	for i, node := range nodes {
		x.wms[i] = v.watermark(node)
		x.marks[i] = x.wms[i].mark(v.epoch)
		x.byMark[i] = int32(i)
		stale, last, counts := v.staleness(node)
		switch {
		case stale:
			x.stale[i] = true
			x.staleIdx = append(x.staleIdx, int32(i))
			if last.After(x.staleFrom) {
				x.staleFrom = last
			}
		case counts && last.Before(x.staleUntil):
			x.staleUntil = last
		}
	}
	slices.SortFunc(x.byMark, x.byMarkOrder)
	x.sortMarks()
	return x
}

// farFuture is later than any time a watch ends.
var farFuture = time.Unix(1<<62, 0)

// byMarkOrder orders the nodes' indices by mark, then by index.
func (x *markIndex) byMarkOrder(a, b int32) int {
	return cmp.Or(cmp.Compare(x.marks[a], x.marks[b]), cmp.Compare(a, b))
}

// sortMarks sets sorted and staleSorted from byMark, staleIdx and marks.
func (x *markIndex) sortMarks() {
	x.sorted = make([]uint64, len(x.byMark))
	for j, i := range x.byMark {
		x.sorted[j] = x.marks[i]
	}
	x.staleSorted = make([]uint64, len(x.staleIdx))
	for j, i := range x.staleIdx {
		x.staleSorted[j] = x.marks[i]
	}
	slices.Sort(x.staleSorted)
}

// withMoves returns the index of view v made from x, which has v's target nodes, epoch
// and stale nodes, and the nodes whose watermarks were written since x was made: it reads
// only their watermarks, and moves only their places in byMark, in one merge.
func (x *markIndex) withMoves(v *view, written []string) *markIndex {
	nodes := v.everyNode()
	next := *x
	next.marksGen = v.marksGen
	next.marks, next.wms = slices.Clone(x.marks), slices.Clone(x.wms)
	var moved []int32
	var isMoved []bool // by index, once a node moved
	for _, node := range written {
		i, found := slices.BinarySearch(nodes, node)
		if !found {
			continue // not a target node: its watermark says nothing here
		}
		wm := v.watermark(node)
		if wm == next.wms[i] {
			continue // written again since, or not changed
		}
		next.wms[i] = wm
		if m := wm.mark(v.epoch); m != next.marks[i] {
			next.marks[i] = m
			if isMoved == nil {
				isMoved = make([]bool, len(nodes))
			}
			if !isMoved[i] {
				isMoved[i] = true
				moved = append(moved, int32(i))
			}
		}
	}
	if len(moved) == 0 {
		return &next
	}
	// byMark without the moved nodes keeps its order; the moved ones, sorted, merge in.
	slices.SortFunc(moved, next.byMarkOrder)
	next.byMark = make([]int32, 0, len(nodes))
	for _, i := range x.byMark {
		if isMoved[i] {
			continue
		}
		for len(moved) > 0 && next.byMarkOrder(moved[0], i) < 0 {
			next.byMark = append(next.byMark, moved[0])
			moved = moved[1:]
		}
		next.byMark = append(next.byMark, i)
	}
	next.byMark = append(next.byMark, moved...)
	next.sortMarks()
	return &next
}

// cacheMarks makes x the index of the watermarks the store holds, unless it holds one of
// a later version: one of a later nodesGen, or of the same and a later marksGen.
func (st *store) cacheMarks(x *markIndex) {
	for {
		cur := st.marks.Load()
		if cur != nil && (cur.nodesGen > x.nodesGen || cur.nodesGen == x.nodesGen && cur.marksGen > x.marksGen) {
			return
		}
		if st.marks.CompareAndSwap(cur, x) {
			return
		}
	}
}
