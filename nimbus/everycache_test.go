package nimbus

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// TestEveryNodeCacheMatchesUncached shows that the statuses of objects for every node are
// the same with the target nodes the views share as with those each view reads again,
// after each of random steps: watermark moves (also of another epoch), watches opened
// and closed, Node objects applied and deleted, and the clock moved past StaleAfter.
func TestEveryNodeCacheMatchesUncached(t *testing.T) {
	for seed := range uint64(3) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { testEveryNodeCacheMatchesUncached(t, seed) })
	}
}

// testEveryNodeCacheMatchesUncached is TestEveryNodeCacheMatchesUncached with one seed.
func testEveryNodeCacheMatchesUncached(t *testing.T, seed uint64) {
	rnd := rand.New(rand.NewPCG(seed, 23))
	ts := start(t, Options{StaleAfter: time.Minute, Limits: Limits{StatusDetailsBytes: 300}})
	var names []string
	for i := range 200 + rnd.IntN(100) {
		names = append(names, fmt.Sprintf("n%03d", i))
	}
	var keys []*nimbusv1.ObjectKey
	for i := range 4 {
		name := fmt.Sprintf("r%d", i)
		ts.apply(t, route(name, nil, "192.0.2.1"))
		keys = append(keys, routeKey(name))
	}
	check := func(step int) {
		t.Helper()
		for _, limit := range []int{1 << 30, 3} {
			ref := ts.srv.view()
			ref.st = nil // it reads every node's records itself, and shares nothing
			ref.statusNodes = limit
			for range 2 { // the second view reads the cache the first filled
				v := ts.srv.view()
				v.statusNodes = limit
				if got, want := v.everyNode(), ref.everyNode(); !slices.Equal(got, want) {
					t.Fatalf("step %d: target nodes %q, want %q", step, got, want)
				}
				if c := ts.srv.store.everyNodes.Load(); c == nil || c.gen != v.nodesGen {
					t.Fatalf("step %d: the target nodes of nodesGen %d are not cached", step, v.nodesGen)
				}
				for _, key := range keys {
					rec := v.object(key.Key())
					if got, want := v.status(rec), ref.status(ref.object(key.Key())); !proto.Equal(got, want) {
						t.Fatalf("step %d, cap %d: %s: status\n%v\nwant (uncached)\n%v", step, limit, key.ID(), got, want)
					}
				}
				if got, want := v.everyMarks().markIndex, ref.everyMarks().markIndex; !sameMarkIndex(got, want) {
					t.Fatalf("step %d: watermark index\n%+v\nwant (read afresh)\n%+v", step, got, want)
				}
			}
		}
	}
	// The nodes whose watches open and close have Node objects too, so that their
	// statuses turn stale as the clock moves.
	for _, n := range names[:20] {
		ts.apply(t, nodeObject(n))
	}
	check(0)
	updated := 0 // the steps whose shared watermark index was made from the one before
	for step := 1; step <= 60; step++ {
		before := ts.srv.store.marks.Load()
		switch rnd.IntN(5) {
		case 0, 1: // watermark moves
			top := ts.srv.store.read().revision()
			txn := ts.srv.store.write()
			for range 1 + rnd.IntN(20) {
				n := names[rnd.IntN(len(names))]
				epoch := ts.srv.Epoch()
				if rnd.IntN(8) == 0 {
					epoch = "another"
				}
				txn.putWatermark(txn.watermark(n).moved(n, epoch, uint64(rnd.IntN(int(top)+2)), "", ts.clock.Now()))
			}
			txn.commit()
		case 2: // watches opened and closed, one by one: each change alone must count
			for range 1 + rnd.IntN(10) {
				txn := ts.srv.store.write()
				n := names[rnd.IntN(20)] // few nodes, so that their records change often
				switch rnd.IntN(3) {
				case 0:
					txn.putWatchNode(&watchNodeRecord{Name: n, Streams: 1 + rnd.IntN(2)})
				case 1:
					txn.putWatchNode(&watchNodeRecord{Name: n, Since: ts.clock.Now()})
				case 2:
					txn.deleteWatchNode(n)
				}
				txn.commit()
				check(step)
			}
		case 3: // Node objects applied and deleted
			n := names[rnd.IntN(len(names))]
			if rnd.IntN(2) == 0 {
				ts.apply(t, nodeObject(n))
			} else if ts.srv.store.read().object(nodeObject(n).Key().Key()) != nil {
				if _, err := ts.client.Delete(testContext(t), &nimbusv1.DeleteRequest{Key: nodeObject(n).Key()}); err != nil {
					t.Fatal(err)
				}
			}
		case 4: // the clock, at times past StaleAfter
			ts.clock.Advance(time.Duration(rnd.IntN(90)) * time.Second)
		}
		check(step)
		// An index made from the one before shares its stale nodes.
		if after := ts.srv.store.marks.Load(); before != nil && after != before && len(before.stale) > 0 && len(after.stale) > 0 && &after.stale[0] == &before.stale[0] {
			updated++
		}
	}
	if updated == 0 {
		t.Errorf("no step made the shared watermark index from the one before")
	}
}

// sameMarkIndex tells whether two indexes of watermarks say the same of the nodes.
func sameMarkIndex(a, b *markIndex) bool {
	return a.epoch == b.epoch && slices.Equal(a.marks, b.marks) && slices.Equal(a.wms, b.wms) &&
		slices.Equal(a.byMark, b.byMark) && slices.Equal(a.sorted, b.sorted) && slices.Equal(a.stale, b.stale) &&
		slices.Equal(a.staleIdx, b.staleIdx) && slices.Equal(a.staleSorted, b.staleSorted)
}

// TestEveryNodeCacheConcurrentReads reads the statuses of an object for every node from
// several goroutines while the nodes' watches and watermarks change, for -race.
func TestEveryNodeCacheConcurrentReads(t *testing.T) {
	ts := start(t, Options{StaleAfter: time.Minute})
	ts.apply(t, route("every", nil, "192.0.2.1"))
	key := routeKey("every")
	var wg sync.WaitGroup
	done := make(chan struct{})
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-done:
					return
				default:
				}
				v := ts.srv.view()
				st := v.status(v.object(key.Key()))
				if int(st.GetTargetNodes()) != len(v.everyNode()) {
					t.Errorf("%d target nodes, want %d", st.GetTargetNodes(), len(v.everyNode()))
					return
				}
			}
		}()
	}
	for i := range 300 {
		n := fmt.Sprintf("n%02d", i%50)
		txn := ts.srv.store.write()
		txn.putWatchNode(&watchNodeRecord{Name: n, Streams: i % 2})
		txn.putWatermark(txn.watermark(n).moved(n, ts.srv.Epoch(), txn.revision(), "", ts.clock.Now()))
		txn.commit()
	}
	close(done)
	wg.Wait()
}

// TestNodesGenFollowsTheTargetNodes shows each write that changes which nodes the objects
// for every node target, or when a node's statuses turn stale, moves nodesGen, and the
// writes that change neither do not: the views' shared target nodes are read again after
// exactly those.
func TestNodesGenFollowsTheTargetNodes(t *testing.T) {
	st := newStore()
	gen := func() uint64 { return st.read().nodesGen }
	t0 := time.Unix(1_000, 0)
	nodeKey2 := nimbusv1.NewKey(nimbusv1.Kind_KIND_NODE, "", "", "n2").Key()
	for _, step := range []struct {
		what  string
		write func(w *writeTxn)
		moves bool
	}{
		{"a node's first watch record", func(w *writeTxn) { w.putWatchNode(&watchNodeRecord{Name: "n1", Since: t0}) }, true},
		{"its watch opening", func(w *writeTxn) { w.putWatchNode(&watchNodeRecord{Name: "n1", Streams: 1, Since: t0}) }, true},
		{"a second watch of it", func(w *writeTxn) { w.putWatchNode(&watchNodeRecord{Name: "n1", Streams: 2, Since: t0}) }, false},
		{"one of them ending", func(w *writeTxn) { w.putWatchNode(&watchNodeRecord{Name: "n1", Streams: 1, Since: t0}) }, false},
		{"the last one ending", func(w *writeTxn) { w.putWatchNode(&watchNodeRecord{Name: "n1", Since: t0.Add(time.Second)}) }, true},
		{"the same record again", func(w *writeTxn) { w.putWatchNode(&watchNodeRecord{Name: "n1", Since: t0.Add(time.Second)}) }, false},
		{"a later end", func(w *writeTxn) { w.putWatchNode(&watchNodeRecord{Name: "n1", Since: t0.Add(2 * time.Second)}) }, true},
		{"the record deleted", func(w *writeTxn) { w.deleteWatchNode("n1") }, true},
		{"a record that is not there deleted", func(w *writeTxn) { w.deleteWatchNode("n1") }, false},
		{"a Node object", func(w *writeTxn) { w.putObject(&objectRecord{Key: nodeKey2, Object: nodeObject("n2")}) }, true},
		{"a Route", func(w *writeTxn) {
			w.putObject(&objectRecord{Key: routeKey("r1").Key(), Object: route("r1", nil, "192.0.2.1")})
		}, false},
		{"the Route deleted", func(w *writeTxn) {
			w.deleteObject(routeKey("r1").Key())
		}, false},
		{"the Node object deleted", func(w *writeTxn) { w.deleteObject(nodeKey2) }, true},
	} {
		before := gen()
		w := st.write()
		step.write(w)
		w.commit()
		if moved := gen() != before; moved != step.moves {
			t.Errorf("%s: nodesGen went from %d to %d; want it moved: %v", step.what, before, gen(), step.moves)
		}
	}
}
