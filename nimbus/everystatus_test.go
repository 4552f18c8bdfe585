package nimbus

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// referenceStatus is view.status as it was before the cap on its lists and the counts
// from the sorted watermarks: a walk of every target node. The differential test holds
// the status to it.
func referenceStatus(v *view, rec *objectRecord) *nimbusv1.ObjectStatus {
	obj := rec.Object
	recs := v.statusesOfID(rec.id)
	m := obj.GetMeta()
	gen := m.GetGeneration()
	genRev := obj.GenerationRevision()
	reported := make(map[string]*nimbusv1.NodeStatus, len(recs))
	for _, r := range recs {
		reported[r.Node] = r.Status
	}
	targets := m.GetNodes()
	if len(targets) == 0 {
		targets = v.everyNode()
	}
	st := &nimbusv1.ObjectStatus{TargetNodes: int32(len(targets)), Generation: gen}
	caughtUp := len(targets) > 0
	var caughtUpTime *timestamppb.Timestamp
	details := 0
	for _, n := range targets {
		ns, ok := reported[n]
		if ok && ns.GetPhase() == nimbusv1.Phase_PHASE_UNSPECIFIED {
			st.Pending = append(st.Pending, n)
			caughtUp = false
			continue
		}
		if !ok {
			wm := v.watermark(n)
			if !wm.passes(v.epoch, genRev) {
				st.Pending = append(st.Pending, n)
				caughtUp = false
				continue
			}
			ns = &nimbusv1.NodeStatus{
				Node: n, ObservedGeneration: gen, Phase: nimbusv1.Phase_PHASE_PROGRAMMED,
				UpdateTime: timestamppb.New(wm.passedAt(genRev)),
			}
		}
		if d := statusDetailsSize(ns); d > 0 {
			if details+d > v.detailsBytes {
				ns = withoutDetails(ns)
				st.DetailsOmitted++
			} else {
				details += d
			}
		}
		if v.stale(n) {
			ns = proto.Clone(ns).(*nimbusv1.NodeStatus)
			ns.Stale = true
			st.StaleNodes++
		}
		st.Nodes = append(st.Nodes, ns)
		current := ns.GetObservedGeneration() == gen
		if current {
			st.CurrentNodes++
		}
		switch {
		case current && ns.GetPhase() == nimbusv1.Phase_PHASE_PROGRAMMED:
			st.ProgrammedNodes++
			if t := ns.GetUpdateTime(); caughtUpTime == nil || t.AsTime().After(caughtUpTime.AsTime()) {
				caughtUpTime = t
			}
		case current && ns.GetPhase() == nimbusv1.Phase_PHASE_FAILED:
			st.FailedNodes++
			caughtUp = false
		default:
			st.Pending = append(st.Pending, n)
			caughtUp = false
		}
	}
	if caughtUp {
		st.CaughtUpTime = caughtUpTime
	}
	return st
}

// TestStatusMatchesReference holds the status of objects for every node and of objects
// for listed nodes, over random nodes (Node objects, watching, stale, gone), watermarks
// (behind, past, of another epoch, none) and records (FAILED, PENDING, without phase, of
// an older generation, with operational data, of nodes that are no target), to the walk
// of every node it was: equal without a cap; with a small one, the same counts, and
// lists that are the documented part of the full ones.
//
// It holds the brief entries of objects for listed nodes, counted without the status, to
// the status too.
func TestStatusMatchesReference(t *testing.T) {
	briefs := 0
	for seed := range uint64(12) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { briefs += testStatusMatchesReference(t, seed) })
	}
	if briefs == 0 {
		t.Error("no object had a brief entry: the brief entries went untested")
	}
}

// anyTold tells whether one of the records is FAILED or has a reason or a message.
func anyTold(recs []*statusRecord) bool {
	for _, r := range recs {
		if r.Status.GetPhase() == nimbusv1.Phase_PHASE_FAILED || r.Status.GetReason() != "" || r.Status.GetMessage() != "" {
			return true
		}
	}
	return false
}

// testStatusMatchesReference is TestStatusMatchesReference with one seed; it returns how
// many objects had a brief entry.
func testStatusMatchesReference(t *testing.T, seed uint64) (briefs int) {
	rnd := rand.New(rand.NewPCG(seed, 22))
	ts := start(t, Options{Limits: Limits{StatusDetailsBytes: 300}})
	// The nodes that never watched are stale from the start.
	ts.clock.Advance(time.Minute)
	var names []string
	for i := range 10 + rnd.IntN(50) {
		names = append(names, fmt.Sprintf("n%03d", i))
	}
	txn := ts.srv.store.write()
	var nodeObjects []*nimbusv1.Object
	kinds := []int{0, 1, 2, 3, 4}
	switch seed % 3 {
	case 0:
		kinds = []int{1, 2, 4} // no stale nodes
	case 1:
		kinds = []int{0, 1, 1, 1, 2, 2, 2, 4} // few
	}
	for _, n := range names {
		switch kinds[rnd.IntN(len(kinds))] {
		case 0: // a Node object, never watched: stale
			nodeObjects = append(nodeObjects, nodeObject(n))
		case 1: // a Node object, watching
			nodeObjects = append(nodeObjects, nodeObject(n))
			txn.putWatchNode(&watchNodeRecord{Name: n, Streams: 1})
		case 2: // watching, without a Node object
			txn.putWatchNode(&watchNodeRecord{Name: n, Streams: 1})
		case 3: // a Node object, stopped watching a while ago: stale
			nodeObjects = append(nodeObjects, nodeObject(n))
			txn.putWatchNode(&watchNodeRecord{Name: n, Since: ts.clock.Now().Add(-time.Hour)})
		case 4: // stopped watching just now, without a Node object: no target
			txn.putWatchNode(&watchNodeRecord{Name: n, Since: ts.clock.Now()})
		}
	}
	txn.commit()
	if len(nodeObjects) > 0 {
		if _, err := ts.client.ApplyBatch(testContext(t), &nimbusv1.ApplyBatchRequest{Objects: nodeObjects}); err != nil {
			t.Fatal(err)
		}
	}
	var keys []*nimbusv1.ObjectKey
	for i := range 12 + rnd.IntN(12) {
		var nodes []string
		if i%2 == 1 {
			for _, n := range names {
				if rnd.IntN(3) == 0 {
					nodes = append(nodes, n)
				}
			}
			nodes = append(nodes, "not-a-node")
		}
		name := fmt.Sprintf("r%02d", i)
		ts.apply(t, route(name, nodes, "192.0.2.1"))
		if rnd.IntN(2) == 0 {
			ts.apply(t, route(name, nodes, "192.0.2.2")) // generation 2
		}
		keys = append(keys, routeKey(name))
	}
	top := ts.srv.store.read().revision()

	txn = ts.srv.store.write()
	// With some seeds every node has caught up with every object, by its watermark or
	// its records.
	caughtUp := seed%4 == 3
	for _, n := range names {
		if !caughtUp && rnd.IntN(6) == 0 {
			continue // no watermark
		}
		epoch := ts.srv.Epoch()
		if !caughtUp && rnd.IntN(6) == 0 {
			epoch = "another"
		}
		var wm *watermarkRecord
		for range 1 + rnd.IntN(4) {
			ts.clock.Advance(time.Duration(rnd.IntN(3)) * time.Second)
			wm = wm.moved(n, epoch, uint64(rnd.IntN(int(top)+3)), "", ts.clock.Now())
		}
		if caughtUp || rnd.IntN(3) == 0 {
			ts.clock.Advance(time.Duration(rnd.IntN(3)) * time.Second)
			wm = wm.moved(n, epoch, top, "", ts.clock.Now()) // past everything
		}
		txn.putWatermark(wm)
	}
	phases := []nimbusv1.Phase{nimbusv1.Phase_PHASE_UNSPECIFIED, nimbusv1.Phase_PHASE_PENDING, nimbusv1.Phase_PHASE_PROGRAMMED, nimbusv1.Phase_PHASE_FAILED}
	for _, key := range keys {
		obj := txn.object(key.Key())
		for _, n := range append(names, "not-a-node", "elsewhere") {
			if rnd.IntN(4) != 0 {
				continue
			}
			ns := &nimbusv1.NodeStatus{
				Node: n, Phase: phases[rnd.IntN(len(phases))],
				ObservedGeneration: obj.Object.GetMeta().GetGeneration() - int64(rnd.IntN(2)),
				UpdateTime:         timestamppb.New(ts.clock.Now().Add(time.Duration(rnd.IntN(5)-2) * time.Second)),
			}
			if caughtUp {
				ns.Phase, ns.ObservedGeneration = nimbusv1.Phase_PHASE_PROGRAMMED, obj.Object.GetMeta().GetGeneration()
			}
			if rnd.IntN(3) == 0 {
				ns.Message = strings.Repeat("m", rnd.IntN(120))
			}
			if rnd.IntN(4) == 0 {
				ns.Operational = map[string]string{"rx": fmt.Sprint(rnd.IntN(1000))}
			}
			txn.putStatus(&statusRecord{Object: key.Key(), Node: n, Status: ns})
		}
	}
	txn.commit()

	v := ts.srv.view()
	ref := ts.srv.view()
	v.statusNodes = 1 << 30
	for _, key := range keys {
		rec := v.object(key.Key())
		want := referenceStatus(ref, rec)
		got := v.status(rec)
		if !proto.Equal(got, want) {
			t.Fatalf("%s: status\n%v\nwant (the walk of every node)\n%v", key.ID(), got, want)
		}
		// A brief entry counted without the status has the status's counts, and is
		// given only for a quiet status.
		if e, ok := v.briefStatus(rec); ok {
			if !quiet(got) || e.generation != got.GetGeneration() || e.target != got.GetTargetNodes() || e.programmed != got.GetProgrammedNodes() {
				t.Fatalf("%s: brief entry %+v for the status\n%v", key.ID(), e, got)
			}
			briefs++
		} else if len(rec.Object.GetMeta().GetNodes()) > 0 && quiet(got) && !anyTold(v.statusesOfID(rec.id)) {
			t.Fatalf("%s: no brief entry for a quiet status without a record that tells more\n%v", key.ID(), got)
		}
	}
	// The same with the index of the times the watermarks passed each revision, which a
	// view makes once it walked the nodes for caught_up_time many times.
	v = ts.srv.view()
	v.statusNodes = 1 << 30
	if len(v.everyNode()) > 0 {
		v.everyMarks().walks = caughtWalks
	}
	for _, key := range keys {
		rec := v.object(key.Key())
		if want, got := referenceStatus(ref, rec), v.status(rec); !proto.Equal(got, want) {
			t.Fatalf("%s: status with the index of watermark times\n%v\nwant (the walk of every node)\n%v", key.ID(), got, want)
		}
	}
	for _, limit := range []int{1, 2, 3, 5, 8, 20} {
		v := ts.srv.view()
		v.statusNodes = limit
		for _, key := range keys {
			rec := v.object(key.Key())
			checkCapped(t, v, rec, referenceStatus(ref, rec), v.status(rec), limit)
		}
	}
	return briefs
}

// checkCapped fails the test unless got, the status of rec with Limits.StatusNodes at
// limit, has the counts of want, the status without a cap, and lists the part of its
// lists that the cap keeps: the nodes of the lowest tiers, by name within a tier (FAILED,
// then other records and stale nodes, then derived), and the pending nodes furthest
// behind, by name among equals.
func checkCapped(t *testing.T, v *view, rec *objectRecord, want, got *nimbusv1.ObjectStatus, limit int) {
	t.Helper()
	counts := func(st *nimbusv1.ObjectStatus) *nimbusv1.ObjectStatus {
		return &nimbusv1.ObjectStatus{
			TargetNodes: st.TargetNodes, ProgrammedNodes: st.ProgrammedNodes, FailedNodes: st.FailedNodes,
			Generation: st.Generation, CurrentNodes: st.CurrentNodes, StaleNodes: st.StaleNodes, CaughtUpTime: st.CaughtUpTime,
		}
	}
	if !proto.Equal(counts(got), counts(want)) {
		t.Fatalf("%s at cap %d: counts %v, want %v", rec.Key, limit, counts(got), counts(want))
	}
	tier := func(ns *nimbusv1.NodeStatus) int8 {
		switch {
		case ns.GetPhase() == nimbusv1.Phase_PHASE_FAILED:
			return tierFailed
		case ns.GetStale() || v.nodeStatusID(rec.id, ns.GetNode()) != nil:
			return tierTold
		}
		return tierProgrammed
	}
	kept := slices.Clone(want.GetNodes())
	slices.SortStableFunc(kept, func(a, b *nimbusv1.NodeStatus) int { return cmp.Compare(tier(a), tier(b)) })
	kept = kept[:min(limit, len(kept))]
	slices.SortFunc(kept, func(a, b *nimbusv1.NodeStatus) int { return strings.Compare(a.GetNode(), b.GetNode()) })
	if len(got.GetNodes()) != len(kept) || int(got.GetNodesOmitted()) != len(want.GetNodes())-len(kept) {
		t.Fatalf("%s at cap %d: %d nodes, %d omitted; want %d, %d omitted", rec.Key, limit,
			len(got.GetNodes()), got.GetNodesOmitted(), len(kept), len(want.GetNodes())-len(kept))
	}
	for i, ns := range got.GetNodes() {
		if !proto.Equal(withoutDetails(ns), withoutDetails(kept[i])) {
			t.Fatalf("%s at cap %d: node %d is %v, want %v", rec.Key, limit, i, ns, kept[i])
		}
	}
	mark := func(n string) uint64 { return v.watermark(n).mark(v.epoch) }
	pending := slices.Clone(want.GetPending())
	slices.SortStableFunc(pending, func(a, b string) int { return cmp.Compare(mark(a), mark(b)) })
	pending = pending[:min(limit, len(pending))]
	slices.Sort(pending)
	if !slices.Equal(got.GetPending(), pending) || int(got.GetPendingOmitted()) != len(want.GetPending())-len(pending) {
		t.Fatalf("%s at cap %d: pending %q, %d omitted; want %q, %d omitted", rec.Key, limit,
			got.GetPending(), got.GetPendingOmitted(), pending, len(want.GetPending())-len(pending))
	}
}

// TestStatusCapKeepsFailedNodes shows that of 1,000 target nodes, 10 of them FAILED and
// the others PROGRAMMED, the status lists the FAILED ones first, as many as the cap
// takes, with the counts of all, for an object for every node and one listing its nodes.
func TestStatusCapKeepsFailedNodes(t *testing.T) {
	for _, limit := range []int{5, DefaultStatusNodes} {
		t.Run(fmt.Sprint(limit), func(t *testing.T) {
			ts := start(t, Options{Limits: Limits{StatusNodes: limit}})
			const n = 1000
			var nodes []string
			var objs []*nimbusv1.Object
			for i := range n {
				nodes = append(nodes, fmt.Sprintf("n%04d", i))
				objs = append(objs, nodeObject(nodes[i]))
			}
			objs = append(objs, route("every", nil, "192.0.2.1"), route("listed", nodes, "192.0.2.1"))
			if _, err := ts.client.ApplyBatch(testContext(t), &nimbusv1.ApplyBatchRequest{Objects: objs}); err != nil {
				t.Fatal(err)
			}
			var failed []string
			for i := range 10 {
				failed = append(failed, nodes[i*97+3])
			}
			txn := ts.srv.store.write()
			for _, node := range nodes {
				txn.putWatchNode(&watchNodeRecord{Name: node, Streams: 1})
				txn.putWatermark((*watermarkRecord)(nil).moved(node, ts.srv.Epoch(), txn.revision(), "", ts.clock.Now()))
			}
			for _, key := range []*nimbusv1.ObjectKey{routeKey("every"), routeKey("listed")} {
				for _, node := range failed {
					txn.putStatus(&statusRecord{Object: key.Key(), Node: node, Status: &nimbusv1.NodeStatus{
						Node: node, ObservedGeneration: 1, Phase: nimbusv1.Phase_PHASE_FAILED, Reason: "KernelError", Message: "no",
					}})
				}
			}
			txn.commit()
			for _, key := range []*nimbusv1.ObjectKey{routeKey("every"), routeKey("listed")} {
				st := ts.get(t, key).GetStatus()
				if st.GetTargetNodes() != n || st.GetFailedNodes() != 10 || st.GetProgrammedNodes() != n-10 ||
					len(st.GetNodes()) != limit || int(st.GetNodesOmitted()) != n-limit || len(st.GetPending()) != 0 || st.GetPendingOmitted() != 0 {
					t.Fatalf("%s: status has target %d programmed %d failed %d, %d nodes (%d omitted), %d pending (%d omitted); want %d %d 10, %d nodes (%d omitted), none pending",
						key.GetName(), st.GetTargetNodes(), st.GetProgrammedNodes(), st.GetFailedNodes(), len(st.GetNodes()), st.GetNodesOmitted(),
						len(st.GetPending()), st.GetPendingOmitted(), n, n-10, limit, n-limit)
				}
				var gotFailed []string
				for _, ns := range st.GetNodes() {
					if ns.GetPhase() == nimbusv1.Phase_PHASE_FAILED {
						gotFailed = append(gotFailed, ns.GetNode())
					}
				}
				if want := failed[:min(limit, len(failed))]; !slices.Equal(gotFailed, want) {
					t.Errorf("%s: FAILED nodes listed %q, want %q", key.GetName(), gotFailed, want)
				}
			}
			wantMetrics(t, ts.srv, `naples_nimbus_status_nodes_omitted_total 2`)
		})
	}
}

// TestBriefStatusOfManyRecords holds the brief entry of an object of many target nodes,
// more of whose records than briefStatus searches one by one are clean (PENDING, or
// PROGRAMMED at the generation or an older one), to the object's status: the counts of
// the records and of the nodes whose watermarks passed it.
func TestBriefStatusOfManyRecords(t *testing.T) {
	ts := start(t, Options{})
	var nodes []string
	for i := range 4 * briefScan {
		nodes = append(nodes, fmt.Sprintf("n%02d", i))
	}
	ts.apply(t, route("r1", nodes, "192.0.2.1"))
	top := ts.srv.store.read().revision()
	txn := ts.srv.store.write()
	recorded := 3 * briefScan
	for i, n := range nodes[:recorded] {
		ns := &nimbusv1.NodeStatus{Node: n, Phase: nimbusv1.Phase_PHASE_PENDING, ObservedGeneration: 1,
			UpdateTime: timestamppb.New(ts.clock.Now())}
		switch i % 3 {
		case 1:
			ns.Phase = nimbusv1.Phase_PHASE_PROGRAMMED
		case 2:
			ns.Phase, ns.ObservedGeneration = nimbusv1.Phase_PHASE_PROGRAMMED, 0 // an older generation
		}
		txn.putStatus(&statusRecord{Object: routeKey("r1").Key(), Node: n, Status: ns})
	}
	// The nodes without a record: half have a watermark past the route, half none.
	for i, n := range nodes[recorded:] {
		if i%2 == 0 {
			var wm *watermarkRecord
			txn.putWatermark(wm.moved(n, ts.srv.Epoch(), top, "", ts.clock.Now()))
		}
	}
	txn.commit()

	v := ts.srv.view()
	rec := v.object(routeKey("r1").Key())
	st := v.status(rec)
	e, ok := v.briefStatus(rec)
	if !ok {
		t.Fatalf("no brief entry for the status\n%v", st)
	}
	wantProgrammed := int32(recorded/3 + (len(nodes)-recorded+1)/2)
	if !quiet(st) || st.GetProgrammedNodes() != wantProgrammed || st.GetTargetNodes() != int32(len(nodes)) {
		t.Fatalf("status = %v, want quiet, %d of %d programmed", st, wantProgrammed, len(nodes))
	}
	if e != (briefEntry{generation: 1, target: int32(len(nodes)), programmed: wantProgrammed}) {
		t.Errorf("brief entry = %+v, want generation 1, %d of %d programmed", e, wantProgrammed, len(nodes))
	}
}
