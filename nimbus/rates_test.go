package nimbus

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// hasStatusFrom tells whether the object's status holds a report of the node.
func hasStatusFrom(t *testing.T, ts *testServer, key *nimbusv1.ObjectKey, node string) bool {
	t.Helper()
	for _, n := range ts.get(t, key).GetStatus().GetNodes() {
		if n.GetNode() == node {
			return true
		}
	}
	return false
}

// waitStatusFrom waits until the object's status holds a report of the node, failing the
// test after 10s.
func waitStatusFrom(t *testing.T, ts *testServer, key *nimbusv1.ObjectKey, node string) {
	t.Helper()
	ctx := testContext(t)
	for !hasStatusFrom(t, ts, key, node) {
		select {
		case <-ctx.Done():
			t.Fatalf("%s has no status from %s", key.ID(), node)
		case <-time.After(time.Millisecond):
		}
	}
}

// TestStatusReportRatePerNode is issue 19's hostile flood of reports: a node certificate
// that reports more bytes than its bucket holds has its streams wait before their next
// report, all of its streams alike, while another node's reports go on.
func TestStatusReportRatePerNode(t *testing.T) {
	p := newTestPKI(t)
	key := func(i int) *nimbusv1.ObjectKey { return routeKey(fmt.Sprintf("r%d", i)) }
	report := func(i int, node string) *nimbusv1.StatusReport {
		return statusReport(key(i), node, 1, nimbusv1.Phase_PHASE_PROGRAMMED, strings.Repeat("x", 500))
	}
	// A bucket of one report that refills at a byte a second: the second report puts it
	// in debt for minutes.
	ts := start(t, Options{TLS: p.serverTLS(t), Limits: Limits{
		StatusReportBytesPerSecond: 1,
		StatusReportBurstBytes:     report(1, "host-a").SizeVT(),
	}})
	ts.client = p.publisher(t, ts)
	for i := 1; i <= 5; i++ {
		ts.apply(t, route(fmt.Sprintf("r%d", i), []string{"host-a", "host-b"}, "192.0.2.1"))
	}
	hostA := p.node(t, ts, "host-a")

	stream, err := hostA.ReportStatus(testContext(t))
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 3; i++ {
		if err := stream.Send(report(i, "host-a")); err != nil {
			t.Fatalf("sending report %d: %v", i, err)
		}
	}
	waitStatusFrom(t, ts, key(2), "host-a")
	waitMetricUntil(t, ts, "naples_nimbus_status_throttled_total", "1", func(v float64) bool { return v == 1 })
	if hasStatusFrom(t, ts, key(3), "host-a") {
		t.Fatal("the report read while host-a's bucket is in debt was recorded")
	}

	// Another stream of host-a waits too: the bucket is the node's, not the stream's.
	second, err := hostA.ReportStatus(testContext(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := second.Send(report(4, "host-a")); err != nil {
		t.Fatal(err)
	}
	waitMetricUntil(t, ts, "naples_nimbus_status_throttled_total", "2", func(v float64) bool { return v == 2 })
	if hasStatusFrom(t, ts, key(4), "host-a") {
		t.Fatal("host-a's second stream read a report while its bucket is in debt")
	}

	// host-b has a bucket of its own.
	reportWith(t, p.node(t, ts, "host-b"), report(5, "host-b"))
	if !hasStatusFrom(t, ts, key(5), "host-b") {
		t.Fatal("host-b's report was not recorded")
	}
}

// TestStreamStartsPerIdentity is issue 19's watch opened and closed in a loop: a node
// certificate may start Limits.NodeStreamStarts streams a second, StreamStartBurstSeconds'
// worth at once; one more is refused with ResourceExhausted naming the limit and its flag,
// and the bucket refills with time.
func TestStreamStartsPerIdentity(t *testing.T) {
	p := newTestPKI(t)
	ts := start(t, Options{TLS: p.serverTLS(t), Limits: Limits{NodeStreamStarts: 1, RefusalDelay: time.Nanosecond}})
	ts.client = p.publisher(t, ts)
	node := p.node(t, ts, "host-a")
	open := func() {
		t.Helper()
		ctx, cancel := context.WithCancel(testContext(t))
		defer cancel()
		recvUntilSynced(t, watchFrom(t, ctx, node, "host-a", "", 0))
	}
	for range StreamStartBurstSeconds {
		open()
	}
	refused := func() {
		t.Helper()
		wantWatchExhausted(t, node, "host-a", "1 a second", "--stream-starts-per-node")
	}
	refused()
	// A status stream draws on the same bucket.
	stream, err := node.ReportStatus(testContext(t))
	if err == nil {
		_, err = stream.CloseAndRecv()
	}
	wantCode(t, err, codes.ResourceExhausted)
	wantMetrics(t, ts.srv,
		`naples_nimbus_streams_refused_total{method="Watch",reason="rate",role="node"} 1`,
		`naples_nimbus_streams_refused_total{method="ReportStatus",reason="rate",role="node"} 1`)

	// Another node has a bucket of its own, and host-a's refills.
	recvUntilSynced(t, watch(t, p.node(t, ts, "host-b"), "host-b"))
	ts.clock.Advance(time.Second)
	open()
	refused()
}

// TestStreamRatesFreed shows that nimbus forgets the rates of certificates that closed
// their streams once their buckets have refilled: many certificates that come and go
// leave nothing behind.
func TestStreamRatesFreed(t *testing.T) {
	p := newTestPKI(t)
	ts := start(t, Options{TLS: p.serverTLS(t)})
	ts.client = p.publisher(t, ts)
	const gauge = "naples_nimbus_stream_identities"
	openClose := func(name string) {
		t.Helper()
		ctx, cancel := context.WithCancel(testContext(t))
		defer cancel()
		recvUntilSynced(t, watchFrom(t, ctx, p.node(t, ts, name), name, "", 0))
	}
	const nodes = 20
	for i := range nodes {
		openClose(fmt.Sprintf("host-%d", i))
	}
	waitMetricUntil(t, ts, `naples_nimbus_streams{method="Watch",role="node"}`, "0", func(v float64) bool { return v == 0 })
	// Each took a start from its bucket, so each is still held.
	wantMetrics(t, ts.srv, fmt.Sprintf("%s %d", gauge, nodes))

	ts.clock.Advance(ts.srv.opts.Limits.refillPeriod())
	ctx, cancel := context.WithCancel(testContext(t))
	recvUntilSynced(t, watchFrom(t, ctx, p.node(t, ts, "late"), "late", "", 0))
	wantMetrics(t, ts.srv, gauge+" 1")

	// A certificate whose bucket refilled while its stream was open is forgotten when it
	// closes it.
	ts.clock.Advance(ts.srv.opts.Limits.refillPeriod())
	cancel()
	waitMetricUntil(t, ts, gauge, "0", func(v float64) bool { return v == 0 })
}

// TestStatusReportRateSparesHonestNode shows that a stream takes from its node's bucket
// what its reports use: an agent that reports thousands of small statuses at once is not
// held back even by a rate of a byte a second.
func TestStatusReportRateSparesHonestNode(t *testing.T) {
	p := newTestPKI(t)
	// The first report is read as if it were 16 MiB, the whole burst; what it did not use
	// comes back.
	ts := start(t, Options{TLS: p.serverTLS(t), Limits: Limits{StatusReportBytesPerSecond: 1, StatusReportBurstBytes: 16 << 20}})
	ts.client = p.publisher(t, ts)
	ts.apply(t, route("r1", []string{"host-a"}, "192.0.2.1"))
	var reports []*nimbusv1.StatusReport
	for i := range 5000 {
		reports = append(reports, statusReport(routeKey("r1"), "host-a", int64(i+1), nimbusv1.Phase_PHASE_PROGRAMMED, "ok"))
	}
	reportWith(t, p.node(t, ts, "host-a"), reports...)
	wantMetrics(t, ts.srv, "naples_nimbus_status_throttled_total 0")
	if gen := nodeStatusOf(t, ts, routeKey("r1"), "host-a").GetObservedGeneration(); gen != 5000 {
		t.Errorf("host-a's status of r1 is at generation %d, want its last report's 5000", gen)
	}
}

// nodeStatusOf returns the node's status of the object, failing the test without one.
func nodeStatusOf(t *testing.T, ts *testServer, key *nimbusv1.ObjectKey, node string) *nimbusv1.NodeStatus {
	t.Helper()
	for _, n := range ts.get(t, key).GetStatus().GetNodes() {
		if n.GetNode() == node {
			return n
		}
	}
	t.Fatalf("%s has no status from %s", key.ID(), node)
	return nil
}

// TestRefusalsHeld shows that nimbus answers a stream it refuses for its identity's
// limits only after Limits.RefusalDelay, so that a client that opens streams again as
// soon as they are refused does not spin.
func TestRefusalsHeld(t *testing.T) {
	p := newTestPKI(t)
	ts := start(t, Options{TLS: p.serverTLS(t), Limits: Limits{NodeStreams: 1, RefusalDelay: time.Hour}})
	ts.client = p.publisher(t, ts)
	node := p.node(t, ts, "host-a")
	recvUntilSynced(t, watch(t, node, "host-a"))

	ctx, cancel := context.WithCancel(testContext(t))
	refused := make(chan error, 1)
	go func() {
		w, err := node.Watch(ctx, &nimbusv1.WatchRequest{Node: "host-a"})
		if err == nil {
			_, err = w.Recv()
		}
		refused <- err
	}()
	const held = "naples_nimbus_stream_refusals_held"
	waitMetricUntil(t, ts, held, "1", func(v float64) bool { return v == 1 })
	wantMetrics(t, ts.srv, `naples_nimbus_streams_refused_total{method="Watch",reason="open",role="node"} 1`)
	select {
	case err := <-refused:
		t.Fatalf("the refused watch was answered before the refusal delay: %v", err)
	default:
	}
	cancel()
	<-refused
	waitMetricUntil(t, ts, held, "0", func(v float64) bool { return v == 0 })
}
