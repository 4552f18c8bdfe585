package nimbus

import (
	"context"
	"slices"
	"testing"
	"time"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// openWatch opens a watch for the node and receives its snapshot. The function it returns
// ends the stream and waits until the server has seen it end; otherwise the stream ends
// with the test.
func openWatch(t *testing.T, ts *testServer, node string) (end func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(testContext(t))
	recvUntilSynced(t, watchFrom(t, ctx, ts.client, node, "", 0))
	return func() {
		t.Helper()
		open := metricValues(t, ts.srv.Registry())["naples_nimbus_watchers"]
		cancel()
		waitWatchers(t, ts, open-1)
	}
}

func nodeKey(name string) *nimbusv1.ObjectKey {
	return nimbusv1.NewKey(nimbusv1.Kind_KIND_NODE, "", "", name)
}

// del deletes the object and fails the test unless it existed.
func (ts *testServer) del(t *testing.T, key *nimbusv1.ObjectKey) {
	t.Helper()
	resp, err := ts.client.Delete(testContext(t), &nimbusv1.DeleteRequest{Key: key})
	if err != nil || !resp.GetFound() {
		t.Fatalf("Delete %s: found %v, error %v; want it deleted", key.ID(), resp.GetFound(), err)
	}
}

// wantWatchRecords fails the test unless the server keeps the watch state of exactly the
// named nodes.
func wantWatchRecords(t *testing.T, ts *testServer, nodes ...string) {
	t.Helper()
	var got []string
	for rec := range ts.srv.store.read().allWatchNodes() {
		got = append(got, rec.Name)
	}
	if !slices.Equal(got, nodes) {
		t.Fatalf("watch state kept for nodes %q, want %q", got, nodes)
	}
}

// TestDeletedNodeIsNoTarget is the report "Ghost nodes at nimbus": a node that watched
// once and whose Node object was deleted must not hold up an object for every node.
func TestDeletedNodeIsNoTarget(t *testing.T) {
	const programmed = nimbusv1.Phase_PHASE_PROGRAMMED
	ts := start(t, Options{})
	key := routeKey("r1")
	ts.apply(t, route("r1", nil, "192.0.2.1"))

	// host-a watches once, reports and goes away; its Node object comes and goes.
	end := openWatch(t, ts, "host-a")
	ts.report(t, stamped(key, "host-a", 1, programmed, 1))
	end()
	ts.apply(t, nodeObject("host-a"))
	wantStatus(t, ts, key, 1, 1, 0, "host-a")
	ts.del(t, nodeKey("host-a"))
	st := wantStatus(t, ts, key, 0, 0, 0)
	wantPropagation(t, st, 1, 0, nil, nil)

	// host-b is alive: the object is caught up once host-b has it, without host-a.
	openWatch(t, ts, "host-b")
	st = wantStatus(t, ts, key, 1, 0, 0)
	wantPropagation(t, st, 1, 0, []string{"host-b"}, nil)
	ts.report(t, stamped(key, "host-b", 1, programmed, 2))
	st = wantStatus(t, ts, key, 1, 1, 0, "host-b")
	wantPropagation(t, st, 1, 1, nil, stamped(key, "host-b", 1, programmed, 2).GetStatus().GetUpdateTime())
}

// TestWatchingNodeIsTargetWhileWatching checks that a node without a Node object is a
// target of an object for every node exactly while it has a watch stream open, and that
// what it reported counts again when it is back.
func TestWatchingNodeIsTargetWhileWatching(t *testing.T) {
	const programmed = nimbusv1.Phase_PHASE_PROGRAMMED
	ts := start(t, Options{})
	key := routeKey("r1")
	ts.apply(t, route("r1", nil, "192.0.2.1"))

	end := openWatch(t, ts, "w1")
	st := wantStatus(t, ts, key, 1, 0, 0)
	wantPropagation(t, st, 1, 0, []string{"w1"}, nil)
	ts.report(t, stamped(key, "w1", 1, programmed, 1))
	wantStatus(t, ts, key, 1, 1, 0, "w1")

	// Its stream ends: no longer a target, and what it reported counts for nothing.
	end()
	st = wantStatus(t, ts, key, 0, 0, 0)
	wantPropagation(t, st, 1, 0, nil, nil)
	// Nor does a report from a node that neither watches nor has a Node object.
	ts.report(t, stamped(key, "x9", 1, programmed, 2))
	wantStatus(t, ts, key, 0, 0, 0)

	// w1 is back: what it reported before counts again.
	openWatch(t, ts, "w1")
	st = wantStatus(t, ts, key, 1, 1, 0, "w1")
	wantPropagation(t, st, 1, 1, nil, stamped(key, "w1", 1, programmed, 1).GetStatus().GetUpdateTime())
	// Two streams of one node make one target.
	openWatch(t, ts, "w1")
	wantStatus(t, ts, key, 1, 1, 0, "w1")
}

// TestStaleAfterLastStreamOfTarget checks that a node that stays a target after its last
// stream ended, by its Node object or by meta.nodes, turns stale StaleAfter after that
// end and not from the server's start.
func TestStaleAfterLastStreamOfTarget(t *testing.T) {
	const programmed = nimbusv1.Phase_PHASE_PROGRAMMED
	ts := start(t, Options{StaleAfter: 30 * time.Second})
	all, explicit := routeKey("all"), routeKey("explicit")
	ts.apply(t, route("all", nil, "192.0.2.1"))
	ts.apply(t, route("explicit", []string{"e1"}, "192.0.2.1"))
	ts.apply(t, nodeObject("n1"))
	endN1 := openWatch(t, ts, "n1")
	endE1 := openWatch(t, ts, "e1")
	ts.report(t, statusReport(all, "n1", 1, programmed, ""), statusReport(explicit, "e1", 1, programmed, ""))

	ts.clock.Advance(time.Hour)
	endN1()
	endE1()
	wantStatus(t, ts, all, 1, 1, 0, "n1")
	wantStale(t, ts, all)
	wantStale(t, ts, explicit)
	ts.clock.Advance(29 * time.Second)
	wantStale(t, ts, all)
	wantStale(t, ts, explicit)
	ts.clock.Advance(time.Second)
	wantStale(t, ts, all, "n1")
	wantStale(t, ts, explicit, "e1")
}

// TestWatchStateIsBounded checks that the server forgets a node's watch state once the
// node has no open stream, no Node object and no stored status, whichever of them goes
// last.
func TestWatchStateIsBounded(t *testing.T) {
	const programmed = nimbusv1.Phase_PHASE_PROGRAMMED
	ts := start(t, Options{})
	all := routeKey("all")
	ts.apply(t, route("all", nil, "192.0.2.1"))

	// Nothing else to keep it for: forgotten when its stream ends.
	end := openWatch(t, ts, "gone")
	wantWatchRecords(t, ts, "gone")
	end()
	wantWatchRecords(t, ts)

	// Kept while its status is, which goes with the object.
	end = openWatch(t, ts, "reporter")
	ts.report(t, statusReport(all, "reporter", 1, programmed, ""))
	end()
	wantWatchRecords(t, ts, "reporter")
	ts.del(t, all)
	wantWatchRecords(t, ts)

	// Kept while its status is, which goes when the object is retargeted away from it.
	ts.apply(t, route("explicit", []string{"t1"}, "192.0.2.1"))
	end = openWatch(t, ts, "t1")
	ts.report(t, statusReport(routeKey("explicit"), "t1", 1, programmed, ""))
	end()
	wantWatchRecords(t, ts, "t1")
	ts.apply(t, route("explicit", []string{"t2"}, "192.0.2.1"))
	wantWatchRecords(t, ts)

	// Kept while its Node object is.
	ts.apply(t, nodeObject("n1"))
	end = openWatch(t, ts, "n1")
	end()
	wantWatchRecords(t, ts, "n1")
	ts.del(t, nodeKey("n1"))
	wantWatchRecords(t, ts)

	// A Node object deleted while its node watches: kept until the stream ends.
	ts.apply(t, nodeObject("n2"))
	end = openWatch(t, ts, "n2")
	ts.del(t, nodeKey("n2"))
	wantWatchRecords(t, ts, "n2")
	end()
	wantWatchRecords(t, ts)
}

// TestPublisherWatchIsNoTarget is issue 19's "watching makes a target": a publisher that
// watches a node, the way to see what the node would receive, must not make that node a
// target of the objects for every node.
func TestPublisherWatchIsNoTarget(t *testing.T) {
	ts, p := startTLS(t)
	key := routeKey("r1")
	ts.apply(t, route("r1", nil, "192.0.2.1"))
	a := p.node(t, ts, "host-a")
	recvUntilSynced(t, watch(t, a, "host-a"))
	recvUntilSynced(t, watch(t, ts.client, "phantom-1"))
	reportWith(t, a, statusReport(key, "host-a", 1, nimbusv1.Phase_PHASE_PROGRAMMED, ""))

	st := wantStatus(t, ts, key, 1, 1, 0, "host-a")
	if len(st.GetPending()) != 0 || st.GetCaughtUpTime() == nil {
		t.Errorf("status pending %q, caught up at %v; want nothing pending and caught up", st.GetPending(), st.GetCaughtUpTime())
	}
	wantWatchRecords(t, ts, "host-a")
}
