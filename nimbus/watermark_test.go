package nimbus

import (
	"testing"

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

	// Deleting the Node object forgets the watermark, as it does the node's statuses.
	if _, err := ts.client.Delete(testContext(t), &nimbusv1.DeleteRequest{Key: nodeObject("a").Key()}); err != nil {
		t.Fatal(err)
	}
	wantMetrics(t, ts.srv, `naples_nimbus_status_watermarks 0`)
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
