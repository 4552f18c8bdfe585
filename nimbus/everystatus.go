package nimbus

import (
	"cmp"
	"slices"
	"sort"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// everyMarks is the index of the watermarks of the target nodes of the objects for every
// node as one view reads it: the index the views share (markIndex), with what this view
// derived from it.
type everyMarks struct {
	*markIndex
	// derived holds, by index, the status last derived for that node of an object for
	// every node: the objects of a generation whose generation revisions the node's
	// watermark passed in one move share it. Made on first use.
	derived []derivedStatus
	// walks counts the walks of the nodes for the caught_up_time of an object without
	// records; once there were caughtWalks of them, caught answers instead.
	walks int
	// caught, once made, tells the latest time the nodes' watermarks passed a revision
	// (see makeCaught).
	caught *caughtIndex
}

// caughtWalks is how many walks of the nodes for a caught_up_time a view makes before it
// indexes the times the nodes' watermarks passed each revision: the index costs some
// 30 walks to make (a node keeps up to 32 moves), and a List page or a status watch's
// flush of many objects for every node then takes a binary search for each.
const caughtWalks = 64

// caughtIndex is the latest time the nodes' watermarks passed each revision, for the
// revisions every one of them passed: revs holds the revisions the watermarks moved to,
// sorted, and at[j] the latest time a watermark passed any revision in (revs[j-1],
// revs[j]], the time passedAt gives for it.
type caughtIndex struct {
	revs []uint64
	at   []time.Time
}

// makeCaught indexes the times the watermarks, of the view's epoch, passed each
// revision: for each revision, the maximum over the nodes of passedAt. A watermark's
// moves cut the revisions into spans, (0, rev of its first move], ..., (rev of its last
// move, Revision], over each of which passedAt is one time; the spans are taken latest
// time first, each setting the revisions of revs it covers that none set before.
func (x *everyMarks) makeCaught() *caughtIndex {
	type span struct {
		lo, hi uint64 // the revisions in (lo, hi]
		at     time.Time
	}
	var spans []span
	var revs []uint64
	for _, wm := range x.wms {
		if wm.mark(x.epoch) == 0 {
			continue
		}
		lo := uint64(0)
		for _, s := range wm.steps {
			if s.rev > lo {
				spans = append(spans, span{lo, s.rev, s.at})
				revs = append(revs, s.rev)
				lo = s.rev
			}
		}
		if wm.Revision > lo {
			spans = append(spans, span{lo, wm.Revision, wm.UpdateTime})
			revs = append(revs, wm.Revision)
		}
	}
	slices.Sort(revs)
	revs = slices.Compact(revs)
	c := &caughtIndex{revs: revs, at: make([]time.Time, len(revs))}
	slices.SortFunc(spans, func(a, b span) int { return b.at.Compare(a.at) })
	// next[j] leads to the first revision from j on that no span set yet.
	next := make([]int32, len(revs)+1)
	for j := range next {
		next[j] = int32(j)
	}
	find := func(j int32) int32 {
		for next[j] != j {
			next[j] = next[next[j]]
			j = next[j]
		}
		return j
	}
	for _, s := range spans {
		lo, _ := slices.BinarySearch(revs, s.lo+1)
		hi, _ := slices.BinarySearch(revs, s.hi)
		for j := find(int32(lo)); int(j) <= hi; j = find(j + 1) {
			c.at[j] = s.at
			next[j] = j + 1
		}
	}
	return c
}

// latestPassed returns the latest time a node's watermark passed rev, which every
// node's watermark of the view's epoch passed, as the maximum of their passedAt(rev)
// is; false until the view walked the nodes caughtWalks times.
func (x *everyMarks) latestPassed(rev uint64) (time.Time, bool) {
	if x.walks++; x.walks <= caughtWalks || rev == 0 {
		return time.Time{}, false
	}
	if x.caught == nil {
		x.caught = x.makeCaught()
	}
	j, _ := slices.BinarySearch(x.caught.revs, rev)
	if j == len(x.caught.revs) {
		return time.Time{}, false
	}
	return x.caught.at[j], true
}

// everyMarks returns the index of the watermarks of the nodes everyNode returns, read on
// first use.
func (v *view) everyMarks() *everyMarks {
	if v.marks == nil {
		v.marks = &everyMarks{markIndex: v.markIndex()}
	}
	return v.marks
}

// passing returns how many of the sorted marks pass rev.
func passing(sorted []uint64, rev uint64) int {
	return len(sorted) - sort.Search(len(sorted), func(j int) bool { return sorted[j] > rev })
}

// derivedStatus returns the status derived for node i of an object at generation gen whose
// generation revision its watermark passed at at, shared with the other objects of the
// view it is the same for.
func (x *everyMarks) derivedStatus(node string, i int, gen int64, at time.Time) *nimbusv1.NodeStatus {
	if x.derived == nil {
		x.derived = make([]derivedStatus, len(x.marks))
	}
	if d := x.derived[i]; d.ns != nil && d.gen == gen && d.at.Equal(at) {
		return d.ns
	}
	ns := derivedNodeStatus(node, gen, at)
	x.derived[i] = derivedStatus{gen, at, ns}
	return ns
}

// derivedNodeStatus returns the status derived from the node's watermark for an object
// at generation gen whose generation revision it passed at at.
func derivedNodeStatus(node string, gen int64, at time.Time) *nimbusv1.NodeStatus {
	return &nimbusv1.NodeStatus{
		Node: node, ObservedGeneration: gen, Phase: nimbusv1.Phase_PHASE_PROGRAMMED,
		UpdateTime: timestamppb.New(at),
	}
}

// everyRecord is a record of a target node of an object for every node.
type everyRecord struct {
	i  int32
	ns *nimbusv1.NodeStatus
}

// everyStatus is status for an object for every node, whose records are recs. Its counts
// take a binary search of the nodes' watermarks (everyMarks) for the generation revision,
// corrected by the object's records: a record always wins over the watermark. Its lists
// take the records, the stale nodes, and of the other nodes only as many as
// Limits.StatusNodes keeps. Only caught_up_time, once every node is PROGRAMMED, takes a
// walk of the nodes (the latest time a watermark passed the generation revision), until
// the view indexed those times (latestPassed), and for objects with records.
func (v *view) everyStatus(rec *objectRecord, recs []*statusRecord) *nimbusv1.ObjectStatus {
	nodes := v.everyNode()
	x := v.everyMarks()
	m := rec.Object.GetMeta()
	gen := m.GetGeneration()
	genRev := rec.Object.GenerationRevision()
	n := len(nodes)
	st := &nimbusv1.ObjectStatus{TargetNodes: int32(n), Generation: gen}

	// The records of target nodes, by index: recs are by node, one a node.
	var own []everyRecord
	for _, r := range recs {
		if i, found := slices.BinarySearch(nodes, r.Node); found {
			own = append(own, everyRecord{int32(i), r.Status})
		}
	}
	isOwn := func(i int32) bool {
		_, found := slices.BinarySearchFunc(own, i, func(r everyRecord, i int32) int { return cmp.Compare(r.i, i) })
		return found
	}

	// The nodes whose watermarks pass, but for those with a record, are PROGRAMMED at
	// the generation.
	derived := passing(x.sorted, genRev)
	derivedStale := passing(x.staleSorted, genRev)
	var listed []listedNode
	var pending []pendingNode
	var caughtUpTime *timestamppb.Timestamp
	for _, r := range own {
		passes := x.marks[r.i] > genRev
		if passes {
			derived--
			if x.stale[r.i] {
				derivedStale--
			}
		}
		ns, name := r.ns, nodes[r.i]
		if ns.GetPhase() == nimbusv1.Phase_PHASE_UNSPECIFIED {
			pending = append(pending, pendingNode{name, x.marks[r.i]})
			continue
		}
		tier := tierTold
		if ns.GetPhase() == nimbusv1.Phase_PHASE_FAILED {
			tier = tierFailed
		}
		if x.stale[r.i] {
			st.StaleNodes++
		}
		listed = append(listed, listedNode{ns, tier, x.stale[r.i]})
		if tally(st, ns, gen, &caughtUpTime) {
			pending = append(pending, pendingNode{name, x.marks[r.i]})
		}
	}
	st.ProgrammedNodes += int32(derived)
	st.CurrentNodes += int32(derived)
	st.StaleNodes += int32(derivedStale)
	totalListed := len(listed) + derived

	// The stale nodes among the derived ones are listed before the others.
	for _, i := range x.staleIdx {
		if x.marks[i] > genRev && !isOwn(i) {
			node := nodes[i]
			listed = append(listed, listedNode{x.derivedStatus(node, int(i), gen, x.wms[i].passedAt(genRev)), tierTold, true})
		}
	}
	// Then the first of the others by name, as many as are kept at most: walking the
	// names when most pass, else the ones that pass.
	if fresh := derived - derivedStale; fresh > 0 {
		want := min(fresh, v.statusNodes)
		take := func(i int32) {
			node := nodes[i]
			listed = append(listed, listedNode{x.derivedStatus(node, int(i), gen, x.wms[i].passedAt(genRev)), tierProgrammed, false})
		}
		passers := x.byMark[n-passing(x.sorted, genRev):]
		if want*n/fresh <= len(passers) {
			for i, got := int32(0), 0; got < want; i++ {
				if x.marks[i] > genRev && !x.stale[i] && !isOwn(i) {
					take(i)
					got++
				}
			}
		} else {
			var first []int32
			for _, i := range passers {
				if !x.stale[i] && !isOwn(i) {
					first = append(first, i)
				}
			}
			slices.Sort(first)
			for _, i := range first[:want] {
				take(i)
			}
		}
	}

	// The nodes whose watermarks do not pass, but for those with a record, are pending;
	// those kept are the furthest behind, the first of byMark.
	behind := x.byMark[:n-passing(x.sorted, genRev)]
	totalPending := len(pending) + len(behind)
	for _, r := range own {
		if x.marks[r.i] <= genRev {
			totalPending--
		}
	}
	for j, kept := 0, 0; j < len(behind) && kept < v.statusNodes; j++ {
		if i := behind[j]; !isOwn(i) {
			pending = append(pending, pendingNode{nodes[i], x.marks[i]})
			kept++
		}
	}

	if n > 0 && int(st.ProgrammedNodes) == n {
		// Every node is PROGRAMMED: since the latest of the times they were.
		latest, indexed := time.Time{}, false
		if len(own) == 0 {
			latest, indexed = x.latestPassed(genRev)
		}
		if !indexed {
			j := 0 // own[j] is the first record of a node from i on
			for i := range int32(n) {
				if j < len(own) && own[j].i == i {
					j++
					continue
				}
				if at := x.wms[i].passedAt(genRev); at.After(latest) {
					latest = at
				}
			}
		}
		if derived > 0 && (caughtUpTime == nil || latest.After(caughtUpTime.AsTime())) {
			caughtUpTime = timestamppb.New(latest)
		}
		st.CaughtUpTime = caughtUpTime
	}
	v.capLists(st, listed, totalListed, pending, totalPending)
	return st
}
