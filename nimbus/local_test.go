package nimbus

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

func TestNodesSummarizesWhatTheServerKnows(t *testing.T) {
	ts := start(t, Options{StaleAfter: time.Minute})
	ts.apply(t, nodeObject("a"))
	ts.apply(t, route("r1", []string{"a", "b", "c"}, "192.0.2.1"))
	ts.apply(t, route("r2", []string{"b"}, "192.0.2.1"))
	endA := openWatch(t, ts, "a")
	// b's agent says its version in its user agent, as nimbusclient does.
	agent := dial(t, ts.path, grpc.WithUserAgent(nimbusv1.AgentUserAgent("v1.2.3")))
	recvUntilSynced(t, watchFrom(t, testContext(t), agent, "b", "", 0))
	ts.report(t,
		&nimbusv1.StatusReport{Watermark: &nimbusv1.StatusWatermark{Node: "b", Epoch: ts.srv.Epoch(), Revision: ts.srv.Revision()}},
		statusReport(routeKey("r1"), "b", 1, nimbusv1.Phase_PHASE_FAILED, "file exists"),
		statusReport(routeKey("r2"), "c", 1, nimbusv1.Phase_PHASE_PROGRAMMED, ""))
	endA()
	ts.clock.Advance(2 * time.Minute)

	got := map[string]NodeSummary{}
	for _, n := range ts.srv.Nodes() {
		got[n.Name] = n
	}
	if len(got) != 2 {
		// c reported on an object that does not target it: nothing is stored of it.
		t.Errorf("Nodes = %v, want a and b", got)
	}
	a, b := got["a"], got["b"]
	if !a.Declared || a.Connected() || !a.Stale || a.Since.IsZero() || a.Watermark != 0 || !a.LastReport.IsZero() || a.AgentVersion != "" {
		t.Errorf("a = %+v, want declared, disconnected, stale, without reports", a)
	}
	if b.Declared || !b.Connected() || b.Stale || b.Watermark != ts.srv.Revision() || b.Failed != 1 || b.Reported != 1 || b.LastReport.IsZero() ||
		b.AgentVersion != "v1.2.3" {
		t.Errorf("b = %+v, want connected, agent v1.2.3, at the latest revision, one FAILED report", b)
	}
}

func TestWatchStatusLocalHandsFramesToAFunction(t *testing.T) {
	ts := start(t, Options{})
	ts.apply(t, route("r1", []string{"a"}, "192.0.2.1"))
	ctx, cancel := context.WithCancel(testContext(t))
	events := make(chan *nimbusv1.StatusEvent, 16)
	done := make(chan error, 1)
	go func() {
		done <- ts.srv.WatchStatusLocal(ctx, &nimbusv1.WatchStatusRequest{Kind: nimbusv1.Kind_KIND_ROUTE}, func(f *nimbusv1.StatusFrame) error {
			for _, ev := range f.GetEvents() {
				events <- ev
			}
			return nil
		})
	}()
	next := func() *nimbusv1.StatusEvent {
		t.Helper()
		select {
		case ev := <-events:
			return ev
		case <-time.After(10 * time.Second):
			t.Fatal("no status event within 10s")
			return nil
		}
	}
	if ev := next(); ev.GetType() != nimbusv1.StatusEvent_TYPE_PUT || ev.GetItem().GetObject().Key().ID() != "Route/default/default/r1" {
		t.Fatalf("first event = %v, want the PUT of r1", ev)
	}
	if ev := next(); ev.GetType() != nimbusv1.StatusEvent_TYPE_SYNCED {
		t.Fatalf("second event = %v, want SYNCED", ev)
	}
	ts.report(t, statusReport(routeKey("r1"), "a", 1, nimbusv1.Phase_PHASE_FAILED, "file exists"))
	if ev := next(); ev.GetItem().GetStatus().GetFailedNodes() != 1 {
		t.Fatalf("event after the report = %v, want r1 with one FAILED node", ev)
	}
	cancel()
	if err := <-done; status.Code(err) != codes.Canceled {
		t.Errorf("WatchStatusLocal after cancel = %v, want Canceled", err)
	}
}
