package nimbus

import (
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
	stream, err := ts.client.ReportStatus(testContext(t))
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

	// Known nodes are the Node objects and the nodes that have watched.
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

	// A node that reports without being known still counts among the targets.
	ts.report(t, statusReport(key, "x9", 1, nimbusv1.Phase_PHASE_PROGRAMMED, ""))
	wantStatus(t, ts, key, 4, 2, 1, "n1", "w1", "x9")
}
