package nimbus

import (
	"context"
	"slices"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// report streams the reports in one ReportStatus call; when it returns, the server has
// taken all of them.
func (ts *testServer) report(t *testing.T, reports ...*nimbusv1.StatusReport) {
	t.Helper()
	reportWith(t, ts.client, reports...)
}

// reportWith streams the reports in one ReportStatus call of the client; when it
// returns, the server has taken all of them.
func reportWith(t *testing.T, client nimbusv1.NimbusClient, reports ...*nimbusv1.StatusReport) {
	t.Helper()
	stream, err := client.ReportStatus(testContext(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range reports {
		if err := stream.Send(r); err != nil {
			t.Fatalf("sending report: %v", err)
		}
	}
	if _, err := stream.CloseAndRecv(); err != nil {
		t.Fatalf("ReportStatus: %v", err)
	}
}

func statusReport(key *nimbusv1.ObjectKey, node string, gen int64, phase nimbusv1.Phase, msg string) *nimbusv1.StatusReport {
	return &nimbusv1.StatusReport{Key: key, Status: &nimbusv1.NodeStatus{
		Node: node, ObservedGeneration: gen, Phase: phase, Message: msg,
	}}
}

// wantStatus fails the test unless the object's status has these counts and the nodes'
// reports, in order.
func wantStatus(t *testing.T, ts *testServer, key *nimbusv1.ObjectKey, target, programmed, failed int32, nodes ...string) *nimbusv1.ObjectStatus {
	t.Helper()
	st := ts.get(t, key).GetStatus()
	var got []string
	for _, n := range st.GetNodes() {
		got = append(got, n.GetNode())
	}
	if st.GetTargetNodes() != target || st.GetProgrammedNodes() != programmed || st.GetFailedNodes() != failed || !slices.Equal(got, nodes) {
		t.Fatalf("status = target %d programmed %d failed %d nodes %q; want %d %d %d %q",
			st.GetTargetNodes(), st.GetProgrammedNodes(), st.GetFailedNodes(), got, target, programmed, failed, nodes)
	}
	return st
}

func TestReportStatus(t *testing.T) {
	const (
		programmed = nimbusv1.Phase_PHASE_PROGRAMMED
		failed     = nimbusv1.Phase_PHASE_FAILED
	)
	ts := start(t, Options{})
	key := routeKey("r1")
	ts.apply(t, route("r1", []string{"a", "b", "c"}, "192.0.2.1"))
	wantStatus(t, ts, key, 3, 0, 0)

	stamped := statusReport(key, "c", 1, nimbusv1.Phase_PHASE_PENDING, "")
	stamped.Status.UpdateTime = timestamppb.New(time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC))
	ts.report(t,
		statusReport(key, "b", 1, failed, "file exists"),
		statusReport(key, "a", 1, programmed, "ok"),
		stamped,
		// Dropped: a node the object does not target, an unknown object, a bad key, no node.
		statusReport(key, "d", 1, programmed, ""),
		statusReport(routeKey("r9"), "a", 1, programmed, ""),
		statusReport(&nimbusv1.ObjectKey{Name: "r1"}, "a", 1, programmed, ""),
		statusReport(key, "", 1, programmed, ""),
	)
	st := wantStatus(t, ts, key, 3, 1, 1, "a", "b", "c")
	a := st.GetNodes()[0]
	if a.GetPhase() != programmed || a.GetObservedGeneration() != 1 || a.GetMessage() != "ok" {
		t.Errorf("node a status = %v, want PROGRAMMED at generation 1 with message ok", a)
	}
	if !proto.Equal(a.GetUpdateTime(), ts.clock.Timestamp()) {
		t.Errorf("node a update time = %v, want the server's now %v", a.GetUpdateTime().AsTime(), ts.clock.Now())
	}
	if got := st.GetNodes()[2].GetUpdateTime(); !proto.Equal(got, stamped.GetStatus().GetUpdateTime()) {
		t.Errorf("node c update time = %v, want the reported %v", got.AsTime(), stamped.GetStatus().GetUpdateTime().AsTime())
	}

	// A new generation: what the nodes reported is for the old one and counts for nothing.
	ts.apply(t, route("r1", []string{"a", "b", "c"}, "192.0.2.2"))
	wantStatus(t, ts, key, 3, 0, 0, "a", "b", "c")
	ts.report(t, statusReport(key, "a", 2, programmed, ""))
	wantStatus(t, ts, key, 3, 1, 0, "a", "b", "c")

	// Retargeting drops the statuses of the nodes left out.
	ts.apply(t, route("r1", []string{"a", "b"}, "192.0.2.2"))
	wantStatus(t, ts, key, 2, 0, 0, "a", "b")
	ts.report(t, statusReport(key, "a", 3, programmed, ""), statusReport(key, "c", 3, programmed, ""))
	wantStatus(t, ts, key, 2, 1, 0, "a", "b")

	// Deleting drops every status: the object created again has none.
	if _, err := ts.client.Delete(testContext(t), &nimbusv1.DeleteRequest{Key: key}); err != nil {
		t.Fatal(err)
	}
	ts.apply(t, route("r1", []string{"a", "b"}, "192.0.2.2"))
	wantStatus(t, ts, key, 2, 0, 0)
}

func TestStatusOfObjectForAllNodes(t *testing.T) {
	ts := start(t, Options{})
	key := routeKey("r1")
	ts.apply(t, route("r1", nil, "192.0.2.1"))
	wantStatus(t, ts, key, 0, 0, 0)

	// The targets are the nodes with a Node object and the nodes watching now.
	ts.apply(t, nodeObject("n1"))
	ts.apply(t, nodeObject("n2"))
	recvUntilSynced(t, watch(t, ts.client, "n2"))
	recvUntilSynced(t, watch(t, ts.client, "w1"))
	wantStatus(t, ts, key, 3, 0, 0)

	ts.report(t,
		statusReport(key, "w1", 1, nimbusv1.Phase_PHASE_PROGRAMMED, ""),
		statusReport(key, "n1", 1, nimbusv1.Phase_PHASE_FAILED, "no route to host"),
	)
	wantStatus(t, ts, key, 3, 1, 1, "n1", "w1")

	// A node that reports without being a target counts for nothing.
	ts.report(t, statusReport(key, "x9", 1, nimbusv1.Phase_PHASE_PROGRAMMED, ""))
	wantStatus(t, ts, key, 3, 1, 1, "n1", "w1")
}

// stamped returns a report whose update time is the given minute of 2026-01-01.
func stamped(key *nimbusv1.ObjectKey, node string, gen int64, phase nimbusv1.Phase, minute int) *nimbusv1.StatusReport {
	r := statusReport(key, node, gen, phase, "")
	r.Status.UpdateTime = timestamppb.New(time.Date(2026, 1, 1, 0, minute, 0, 0, time.UTC))
	return r
}

// wantPropagation fails the test unless the status has these propagation fields.
func wantPropagation(t *testing.T, st *nimbusv1.ObjectStatus, gen int64, current int32, pending []string, caughtUp *timestamppb.Timestamp) {
	t.Helper()
	if st.GetGeneration() != gen || st.GetCurrentNodes() != current || !slices.Equal(st.GetPending(), pending) || !proto.Equal(st.GetCaughtUpTime(), caughtUp) {
		t.Fatalf("status = generation %d current %d pending %q caught up %v; want %d %d %q %v",
			st.GetGeneration(), st.GetCurrentNodes(), st.GetPending(), st.GetCaughtUpTime(), gen, current, pending, caughtUp)
	}
}

func TestPropagationStatus(t *testing.T) {
	const (
		pending    = nimbusv1.Phase_PHASE_PENDING
		programmed = nimbusv1.Phase_PHASE_PROGRAMMED
		failed     = nimbusv1.Phase_PHASE_FAILED
	)
	ts := start(t, Options{})
	key := routeKey("r1")
	ts.apply(t, route("r1", []string{"a", "b", "c"}, "192.0.2.1"))
	wantPropagation(t, ts.get(t, key).GetStatus(), 1, 0, []string{"a", "b", "c"}, nil)

	ts.report(t,
		stamped(key, "a", 1, programmed, 1),
		stamped(key, "b", 1, failed, 2),
		stamped(key, "c", 1, pending, 3),
	)
	st := wantStatus(t, ts, key, 3, 1, 1, "a", "b", "c")
	wantPropagation(t, st, 1, 3, []string{"c"}, nil)

	// Every node PROGRAMMED: caught up when the last of them got there.
	ts.report(t, stamped(key, "c", 1, programmed, 5), stamped(key, "b", 1, programmed, 4))
	st = wantStatus(t, ts, key, 3, 3, 0, "a", "b", "c")
	wantPropagation(t, st, 1, 3, nil, stamped(key, "c", 1, programmed, 5).GetStatus().GetUpdateTime())

	// A new generation: nobody is current, everybody is pending again.
	ts.apply(t, route("r1", []string{"a", "b", "c"}, "192.0.2.2"))
	wantPropagation(t, ts.get(t, key).GetStatus(), 2, 0, []string{"a", "b", "c"}, nil)
	ts.report(t, stamped(key, "b", 2, pending, 6), stamped(key, "a", 2, programmed, 7))
	wantPropagation(t, ts.get(t, key).GetStatus(), 2, 2, []string{"b", "c"}, nil)
	// FAILED is settled, so not pending, but it is not caught up.
	ts.report(t, stamped(key, "b", 2, failed, 8), stamped(key, "c", 2, programmed, 9))
	wantPropagation(t, ts.get(t, key).GetStatus(), 2, 3, nil, nil)
}

func TestPropagationStatusOfObjectForAllNodes(t *testing.T) {
	ts := start(t, Options{})
	key := routeKey("r1")
	ts.apply(t, route("r1", nil, "192.0.2.1"))
	// No target node: nothing is pending, and nothing is caught up either.
	wantPropagation(t, ts.get(t, key).GetStatus(), 1, 0, nil, nil)

	ts.apply(t, nodeObject("n1"))
	ts.apply(t, nodeObject("n2"))
	wantPropagation(t, ts.get(t, key).GetStatus(), 1, 0, []string{"n1", "n2"}, nil)
	// x9 is no target: it is not pending, and what it reports does not count.
	ts.report(t, stamped(key, "n2", 1, nimbusv1.Phase_PHASE_PROGRAMMED, 1), stamped(key, "x9", 1, nimbusv1.Phase_PHASE_PENDING, 2))
	wantStatus(t, ts, key, 2, 1, 0, "n2")
	wantPropagation(t, ts.get(t, key).GetStatus(), 1, 1, []string{"n1"}, nil)
}

// waitWatchers waits until the server has n watch streams open; a stream that a client
// ends leaves the server a moment later.
func waitWatchers(t *testing.T, ts *testServer, n float64) {
	t.Helper()
	ctx := testContext(t)
	for metricValues(t, ts.srv.Registry())["naples_nimbus_watchers"] != n {
		select {
		case <-ctx.Done():
			t.Fatalf("the server never had %v watchers", n)
		case <-time.After(time.Millisecond):
		}
	}
}

// wantStale fails the test unless exactly the named nodes' statuses are stale.
func wantStale(t *testing.T, ts *testServer, key *nimbusv1.ObjectKey, nodes ...string) {
	t.Helper()
	st := ts.get(t, key).GetStatus()
	var stale []string
	for _, n := range st.GetNodes() {
		if n.GetStale() {
			stale = append(stale, n.GetNode())
		}
	}
	if !slices.Equal(stale, nodes) || st.GetStaleNodes() != int32(len(nodes)) {
		t.Fatalf("stale nodes = %q, stale_nodes %d; want %q", stale, st.GetStaleNodes(), nodes)
	}
}

func TestStaleStatus(t *testing.T) {
	ts := start(t, Options{StaleAfter: 30 * time.Second})
	key := routeKey("r1")
	ts.apply(t, route("r1", []string{"a", "b"}, "192.0.2.1"))
	ctx, cancel := context.WithCancel(testContext(t))
	recvUntilSynced(t, watchFrom(t, ctx, ts.client, "a", "", 0))
	ts.report(t,
		statusReport(key, "a", 1, nimbusv1.Phase_PHASE_PROGRAMMED, ""),
		statusReport(key, "b", 1, nimbusv1.Phase_PHASE_PROGRAMMED, ""),
	)
	wantStale(t, ts, key)

	// b has never watched: it is stale once StaleAfter has passed since the start. a
	// watches and is not.
	ts.clock.Advance(29 * time.Second)
	wantStale(t, ts, key)
	ts.clock.Advance(time.Second)
	wantStale(t, ts, key, "b")
	// The stale status is still counted, with what it said.
	st := wantStatus(t, ts, key, 2, 2, 0, "a", "b")
	if b := st.GetNodes()[1]; b.GetPhase() != nimbusv1.Phase_PHASE_PROGRAMMED || b.GetObservedGeneration() != 1 {
		t.Errorf("stale status of b = %v, want what b reported", b)
	}

	// a disconnects: stale StaleAfter later, not before.
	cancel()
	waitWatchers(t, ts, 0)
	ts.clock.Advance(29 * time.Second)
	wantStale(t, ts, key, "b")
	ts.clock.Advance(time.Second)
	wantStale(t, ts, key, "a", "b")

	// Two streams of b: b stays live while either is open. Reconnecting clears staleness.
	ctxB, cancelB := context.WithCancel(testContext(t))
	recvUntilSynced(t, watchFrom(t, ctxB, ts.client, "b", "", 0))
	recvUntilSynced(t, watch(t, ts.client, "b"))
	wantStale(t, ts, key, "a")
	cancelB()
	waitWatchers(t, ts, 1)
	ts.clock.Advance(time.Hour)
	wantStale(t, ts, key, "a")
	recvUntilSynced(t, watch(t, ts.client, "a"))
	wantStale(t, ts, key)
}

func TestNodeDeletionDropsItsStatuses(t *testing.T) {
	ts := start(t, Options{})
	r1, r2 := routeKey("r1"), routeKey("r2")
	ts.apply(t, nodeObject("n1"))
	ts.apply(t, nodeObject("n2"))
	ts.apply(t, route("r1", nil, "192.0.2.1"))
	ts.apply(t, route("r2", []string{"n1", "n2"}, "192.0.2.1"))
	ts.report(t,
		statusReport(r1, "n1", 1, nimbusv1.Phase_PHASE_PROGRAMMED, ""),
		statusReport(r1, "n2", 1, nimbusv1.Phase_PHASE_PROGRAMMED, ""),
		statusReport(r2, "n1", 1, nimbusv1.Phase_PHASE_FAILED, ""),
		statusReport(r2, "n2", 1, nimbusv1.Phase_PHASE_PROGRAMMED, ""),
	)
	wantStatus(t, ts, r1, 2, 2, 0, "n1", "n2")

	nodeKey := nimbusv1.NewKey(nimbusv1.Kind_KIND_NODE, "", "", "n1")
	if _, err := ts.client.Delete(testContext(t), &nimbusv1.DeleteRequest{Key: nodeKey}); err != nil {
		t.Fatal(err)
	}
	// n1 is no longer a known node, and nothing it reported is left.
	wantStatus(t, ts, r1, 1, 1, 0, "n2")
	st := wantStatus(t, ts, r2, 2, 1, 0, "n2")
	wantPropagation(t, st, 1, 1, []string{"n1"}, nil)
}
