package nimbus

import (
	"context"
	"slices"
	"time"

	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// watermarkReport is a report of the node's watermark at rev, of the server's epoch.
func (ts *testServer) watermarkReport(node string, rev uint64) *nimbusv1.StatusReport {
	return &nimbusv1.StatusReport{Watermark: &nimbusv1.StatusWatermark{Node: node, Epoch: ts.srv.Epoch(), Revision: rev}}
}

func TestStatusWatermarkIntake(t *testing.T) {
	ts := start(t, Options{})
	ts.apply(t, nodeObject("a"))
	ts.report(t, ts.watermarkReport("a", 7))
	wantMetrics(t, ts.srv, `naples_nimbus_status_watermarks 1`)
	wm := ts.srv.store.read().watermark("a")
	if wm == nil || wm.Revision != 7 || wm.Epoch != ts.srv.Epoch() || !wm.UpdateTime.Equal(ts.clock.Now()) {
		t.Fatalf("watermark of a = %+v, want revision 7 of the server's epoch at %v", wm, ts.clock.Now())
	}
	// A watermark without a node is dropped.
	ts.report(t, &nimbusv1.StatusReport{Watermark: &nimbusv1.StatusWatermark{Revision: 9}})
	wantMetrics(t, ts.srv, `naples_nimbus_status_watermarks 1`)

	// A stream's first watermark drops the node's statuses the stream did not send before
	// it: they are of an earlier stream.
	ts.apply(t, route("r1", []string{"a"}, "192.0.2.1"))
	ts.apply(t, route("r2", []string{"a"}, "192.0.2.1"))
	ts.report(t, statusReport(routeKey("r1"), "a", 1, nimbusv1.Phase_PHASE_FAILED, "old"),
		statusReport(routeKey("r2"), "a", 1, nimbusv1.Phase_PHASE_FAILED, "old"))
	wantMetrics(t, ts.srv, `naples_nimbus_statuses 2`)
	ts.report(t, statusReport(routeKey("r2"), "a", 1, nimbusv1.Phase_PHASE_FAILED, "again"), ts.watermarkReport("a", 1))
	wantStatus(t, ts, routeKey("r1"), 1, 0, 0)
	wantStatus(t, ts, routeKey("r2"), 1, 0, 1, "a")
	// Later watermarks on the stream drop nothing for that.
	ts.report(t, statusReport(routeKey("r2"), "a", 1, nimbusv1.Phase_PHASE_FAILED, "again"), ts.watermarkReport("a", 1),
		statusReport(routeKey("r1"), "a", 1, nimbusv1.Phase_PHASE_FAILED, "new"), ts.watermarkReport("a", 1))
	wantMetrics(t, ts.srv, `naples_nimbus_statuses 2`)

	// Deleting the Node object forgets the watermark, as it does the node's statuses. The
	// stream's next watermark is not taken: it ends the stream, so that the agent reports
	// its exceptions again on a new one, whose watermark is taken.
	stream, err := ts.client.ReportStatus(testContext(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(ts.watermarkReport("a", 2)); err != nil {
		t.Fatal(err)
	}
	waitPeerCond(t, "the watermark at 2", func() bool { return ts.srv.store.read().watermark("a").Revision == 2 })
	if _, err := ts.client.Delete(testContext(t), &nimbusv1.DeleteRequest{Key: nodeObject("a").Key()}); err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(ts.watermarkReport("a", 3)); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.CloseAndRecv(); status.Code(err) != codes.Aborted {
		t.Fatalf("the stream that sent a forgotten node's watermark ended with %v, want Aborted", err)
	}
	wantMetrics(t, ts.srv, `naples_nimbus_status_watermarks 0`)
	ts.report(t, statusReport(routeKey("r1"), "a", 1, nimbusv1.Phase_PHASE_FAILED, "again"), ts.watermarkReport("a", 3))
	wantMetrics(t, ts.srv, `naples_nimbus_status_watermarks 1`)
	wantStatus(t, ts, routeKey("r1"), 1, 0, 1, "a")
}

func TestWatermarkSteps(t *testing.T) {
	ts := start(t, Options{})
	var r *watermarkRecord
	times := map[uint64]int64{}
	for i := uint64(1); i <= 40; i++ {
		ts.clock.Advance(1e9)
		r = r.moved("a", "e", i*10, "", ts.clock.Now())
		times[i*10] = ts.clock.Now().Unix()
	}
	if len(r.steps) != watermarkSteps {
		t.Fatalf("steps kept = %d, want %d", len(r.steps), watermarkSteps)
	}
	if got := r.passedAt(395).Unix(); got != times[400] {
		t.Errorf("passedAt(395) = %d, want %d", got, times[400])
	}
	if got := r.passedAt(300).Unix(); got != times[300] {
		t.Errorf("passedAt(300) = %d, want %d", got, times[300])
	}
	// Older than the steps kept: the oldest kept.
	if got, want := r.passedAt(5).Unix(), times[uint64(40-watermarkSteps+1)*10]; got != want {
		t.Errorf("passedAt(5) = %d, want the oldest kept %d", got, want)
	}
	// A move back keeps when the revisions still passed were.
	ts.clock.Advance(1e9)
	back := r.moved("a", "e", 355, "", ts.clock.Now())
	if back.Revision != 355 || back.passedAt(355).Unix() != times[360] || back.passedAt(340).Unix() != times[340] {
		t.Errorf("after a move back: revision %d, passedAt(355) %d, passedAt(340) %d; want 355, %d, %d",
			back.Revision, back.passedAt(355).Unix(), back.passedAt(340).Unix(), times[360], times[340])
	}
	if same := back.moved("a", "e", 355, "", ts.clock.Now()); same != back {
		t.Error("a report of the same watermark made a new record")
	}
	if fresh := back.moved("a", "f", 3, "", ts.clock.Now()); len(fresh.steps) != 1 || fresh.Epoch != "f" {
		t.Errorf("a new epoch kept steps %v", fresh.steps)
	}
}

// nodePhase returns the phase, generation and staleness of the node's status in st, and
// whether st has one.
func nodePhase(st *nimbusv1.ObjectStatus, node string) (nimbusv1.Phase, int64, bool, bool) {
	for _, ns := range st.GetNodes() {
		if ns.GetNode() == node {
			return ns.GetPhase(), ns.GetObservedGeneration(), ns.GetStale(), true
		}
	}
	return 0, 0, false, false
}

func TestStatusDerivedFromWatermark(t *testing.T) {
	const (
		programmed = nimbusv1.Phase_PHASE_PROGRAMMED
		failed     = nimbusv1.Phase_PHASE_FAILED
	)
	ts := start(t, Options{StaleAfter: 30 * time.Second})
	ts.apply(t, nodeObject("a"))
	ts.apply(t, nodeObject("b"))
	every, listed := routeKey("every"), routeKey("listed")
	r1 := ts.apply(t, route("every", nil, "192.0.2.1")).GetObject()
	wantStatus(t, ts, every, 2, 0, 0)

	// a's watermark passes every's generation revision: PROGRAMMED at its generation on a,
	// since a's watermark got there; b reported nothing.
	ts.clock.Advance(time.Second)
	passed := ts.clock.Now()
	ts.report(t, ts.watermarkReport("a", r1.GenerationRevision()))
	st := wantStatus(t, ts, every, 2, 1, 0, "a")
	if got := st.GetNodes()[0]; got.GetPhase() != programmed || got.GetObservedGeneration() != 1 || !got.GetUpdateTime().AsTime().Equal(passed) {
		t.Fatalf("a's derived status = %v, want PROGRAMMED at 1 since %v", got, passed)
	}
	if !slices.Equal(st.GetPending(), []string{"b"}) {
		t.Errorf("pending = %v, want [b]", st.GetPending())
	}

	// An object created after the watermark is pending on a until it passes it.
	r2 := ts.apply(t, route("listed", []string{"a"}, "192.0.2.1")).GetObject()
	wantStatus(t, ts, listed, 1, 0, 0)
	ts.clock.Advance(time.Second)
	ts.report(t, ts.watermarkReport("a", r2.GenerationRevision()))
	wantStatus(t, ts, listed, 1, 1, 0, "a")
	// Nor does a's watermark move every's time on a: it passed it before.
	if got := wantStatus(t, ts, every, 2, 1, 0, "a").GetNodes()[0].GetUpdateTime().AsTime(); !got.Equal(passed) {
		t.Errorf("a's derived status of every since %v after the watermark moved on, want %v", got, passed)
	}

	// A change of labels only keeps the generation and its revision: still PROGRAMMED.
	relabeled := route("every", nil, "192.0.2.1")
	relabeled.Meta.Labels = map[string]string{"tier": "web"}
	ts.apply(t, relabeled)
	wantStatus(t, ts, every, 2, 1, 0, "a")
	// A change of spec is pending on a until the watermark passes it.
	r1 = ts.apply(t, route("every", nil, "192.0.2.9")).GetObject()
	wantStatus(t, ts, every, 2, 0, 0)

	// A record wins over the watermark, whatever its generation: an exception.
	ts.report(t, statusReport(listed, "a", 1, failed, "no route to host"))
	wantStatus(t, ts, listed, 1, 0, 1, "a")
	// Its clearing record is kept while the watermark does not pass the object, and
	// dropped once it does, or at once when it does already.
	ts.report(t, statusReport(every, "a", 2, programmed, ""), statusReport(listed, "a", 1, programmed, ""))
	wantStatus(t, ts, every, 2, 1, 0, "a")
	wantStatus(t, ts, listed, 1, 1, 0, "a")
	wantMetrics(t, ts.srv, `naples_nimbus_statuses 1`)
	ts.report(t, ts.watermarkReport("a", r1.GenerationRevision()))
	wantStatus(t, ts, every, 2, 1, 0, "a")
	wantMetrics(t, ts.srv, `naples_nimbus_statuses 0`)
	// A record with operational data stays.
	withData := statusReport(every, "a", 2, programmed, "")
	withData.Status.Operational = map[string]string{"hits": "3"}
	ts.report(t, withData)
	wantMetrics(t, ts.srv, `naples_nimbus_statuses 1`)

	// Derived statuses of a node gone stale are stale.
	ts.clock.Advance(31 * time.Second)
	st = wantStatus(t, ts, listed, 1, 1, 0, "a")
	if _, _, stale, _ := nodePhase(st, "a"); !stale || st.GetStaleNodes() != 1 {
		t.Errorf("a's derived status stale %v, stale nodes %d; want stale, 1", stale, st.GetStaleNodes())
	}

	// A watermark of another epoch says nothing.
	ts.report(t, &nimbusv1.StatusReport{Watermark: &nimbusv1.StatusWatermark{Node: "a", Epoch: "another", Revision: 1 << 40}})
	wantStatus(t, ts, listed, 1, 0, 0)
}

// TestReportStatusHeaderSaysWatermarks shows that a nimbus takes watermarks, a replica
// as well as one that is none.
func TestReportStatusHeaderSaysWatermarks(t *testing.T) {
	for _, tc := range []struct {
		replica string
		want    []string
	}{{"", []string{"1"}}, {"r1", []string{"1"}}} {
		ts := start(t, Options{ReplicaName: tc.replica})
		stream, err := ts.client.ReportStatus(testContext(t))
		if err != nil {
			t.Fatal(err)
		}
		md, err := stream.Header()
		if err != nil {
			t.Fatal(err)
		}
		if got := md.Get(nimbusv1.StatusWatermarkHeader); !slices.Equal(got, tc.want) {
			t.Errorf("replica %q: header %s = %v, want %v", tc.replica, nimbusv1.StatusWatermarkHeader, got, tc.want)
		}
		if _, err := stream.CloseAndRecv(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestWatchStatusFollowsWatermarks moves a node's watermark: a status watch sends the
// objects it passed on the node, as Get shows them, and only those.
func TestWatchStatusFollowsWatermarks(t *testing.T) {
	ts := start(t, Options{})
	ts.apply(t, nodeObject("a"))
	ts.apply(t, nodeObject("b"))
	old := ts.apply(t, route("old", nil, "192.0.2.1")).GetObject()
	mid := ts.apply(t, route("mid", []string{"a"}, "192.0.2.1")).GetObject()
	ts.apply(t, route("other", []string{"b"}, "192.0.2.1"))
	last := ts.apply(t, route("last", nil, "192.0.2.1")).GetObject()
	ts.report(t, ts.watermarkReport("a", old.GenerationRevision()))

	ctx, cancel := context.WithCancel(testContext(t))
	defer cancel()
	c := watchStatus(t, ctx, ts.client, &nimbusv1.WatchStatusRequest{Kind: nimbusv1.Kind_KIND_ROUTE})
	items := c.synced()
	wantCounts(t, items[routeKey("old").ID()], 2, 1, 0, "b")

	// a passes mid and last: their PUTs, as Get has them; old and other are not sent.
	ts.report(t, ts.watermarkReport("a", last.GenerationRevision()))
	for _, key := range []*nimbusv1.ObjectKey{routeKey("last"), routeKey("mid")} {
		item := c.nextPut(key)
		wantAsGet(t, ts, item)
		if item.GetStatus().GetProgrammedNodes() != 1 {
			t.Fatalf("%s programmed on %d nodes, want 1", key.ID(), item.GetStatus().GetProgrammedNodes())
		}
	}
	// b's first watermark, at mid's revision, passes old on b: mid targets a only, and
	// other and last are beyond it.
	ts.report(t, ts.watermarkReport("b", mid.GenerationRevision()))
	wantCounts(t, c.nextPut(routeKey("old")), 2, 2, 0)
	// A change the watch sees proves nothing else came before it.
	ts.apply(t, route("other", []string{"b"}, "192.0.2.2"))
	c.nextPut(routeKey("other"))
}

// TestNewGenerationDropsClearingStatus keeps a PROGRAMMED status a node with a watermark
// reported to clear an exception, which its watermark had not passed yet: a new
// generation drops it, for the agent does not send it again, and it would otherwise
// stand for the node's status of the new generation.
func TestNewGenerationDropsClearingStatus(t *testing.T) {
	ts := start(t, Options{})
	ts.apply(t, nodeObject("a"))
	key := routeKey("r1")
	ts.apply(t, route("r1", []string{"a"}, "192.0.2.1"))
	ts.report(t, ts.watermarkReport("a", 1), statusReport(key, "a", 1, nimbusv1.Phase_PHASE_PROGRAMMED, ""))
	ts.apply(t, route("r2", []string{"a"}, "192.0.2.1"))
	ts.report(t, statusReport(routeKey("r2"), "a", 1, nimbusv1.Phase_PHASE_FAILED, "kept"))
	wantStatus(t, ts, key, 1, 1, 0, "a")
	wantMetrics(t, ts.srv, `naples_nimbus_statuses 2`)

	ts.apply(t, route("r1", []string{"a"}, "192.0.2.2"))
	ts.apply(t, route("r2", []string{"a"}, "192.0.2.2"))
	st := wantStatus(t, ts, key, 1, 0, 0)
	if !slices.Equal(st.GetPending(), []string{"a"}) {
		t.Errorf("pending = %v, want [a]", st.GetPending())
	}
	// A FAILED status stays: an agent sends its exceptions again with a new generation.
	wantStatus(t, ts, routeKey("r2"), 1, 0, 0, "a")
	wantMetrics(t, ts.srv, `naples_nimbus_statuses 1`)
}
