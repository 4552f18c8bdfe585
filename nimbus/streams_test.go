package nimbus

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/naplesnet/naples/internal/testlog"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// waitMetricUntil waits until the server's metric has a value ok takes, which want
// describes, failing the test after 10s.
func waitMetricUntil(t *testing.T, ts *testServer, name, want string, ok func(float64) bool) {
	t.Helper()
	ctx := testContext(t)
	for !ok(metricValues(t, ts.srv.Registry())[name]) {
		select {
		case <-ctx.Done():
			t.Fatalf("%s = %v, want %s", name, metricValues(t, ts.srv.Registry())[name], want)
		case <-time.After(time.Millisecond):
		}
	}
}

// wantWatchExhausted fails the test unless a watch of the node by the client is refused
// with ResourceExhausted, in a message that names the node and says every one of want.
func wantWatchExhausted(t *testing.T, client nimbusv1.NimbusClient, node string, want ...string) {
	t.Helper()
	_, err := watch(t, client, node).Recv()
	st := wantCode(t, err, codes.ResourceExhausted)
	for _, w := range append([]string{fmt.Sprintf("node %q", node)}, want...) {
		if !strings.Contains(st.Message(), w) {
			t.Errorf("refusal %q does not say %q", st.Message(), w)
		}
	}
}

// TestStreamsPerIdentity is issue 19's "streams per identity": a node certificate may
// have Limits.NodeStreams watches open; one more is refused with ResourceExhausted naming
// the limit and its flag, the refusals are logged once per interval with their count,
// and closing a watch frees its slot.
func TestStreamsPerIdentity(t *testing.T) {
	var logs testlog.Buffer
	p := newTestPKI(t)
	ts := start(t, Options{TLS: p.serverTLS(t), Logger: logs.Logger(), Limits: Limits{RefusalDelay: time.Nanosecond}})
	ts.client = p.publisher(t, ts)
	node := p.node(t, ts, "host-a")
	const gauge = `naples_nimbus_streams{method="Watch",role="node"}`

	var cancels []context.CancelFunc
	for range DefaultNodeStreams {
		ctx, cancel := context.WithCancel(testContext(t))
		cancels = append(cancels, cancel)
		recvUntilSynced(t, watchFrom(t, ctx, node, "host-a", "", 0))
	}
	refused := func() {
		t.Helper()
		wantWatchExhausted(t, node, "host-a", "16 Watch streams", "--max-streams-per-node")
	}
	for range 5 {
		refused()
	}
	wantMetrics(t, ts.srv, gauge+" 16", `naples_nimbus_streams_refused_total{method="Watch",reason="open",role="node"} 5`)
	if n := strings.Count(logs.String(), "stream refused"); n != 1 {
		t.Errorf("5 refusals within a minute logged %d lines, want 1:\n%s", n, logs.String())
	}
	ts.clock.Advance(DefaultRefusalLogInterval)
	refused()
	if !strings.Contains(logs.String(), "refused_unlogged=4") {
		t.Errorf("the refusal after a minute does not count the 4 not logged:\n%s", logs.String())
	}

	// Another node, and the node's status stream, have slots of their own.
	recvUntilSynced(t, watch(t, p.node(t, ts, "host-b"), "host-b"))
	reportWith(t, node)
	wantMetrics(t, ts.srv, gauge+" 17")

	cancels[0]()
	waitMetricUntil(t, ts, gauge, "16", func(v float64) bool { return v == 16 })
	recvUntilSynced(t, watch(t, node, "host-a"))
}

// TestInsecureStreamsUncounted shows that without TLS, where no client has an identity,
// streams are not counted: the existing deployments and tests that open many watches
// over plaintext keep working.
func TestInsecureStreamsUncounted(t *testing.T) {
	ts := start(t, Options{Limits: Limits{NodeStreams: 1}})
	for range 3 {
		recvUntilSynced(t, watch(t, ts.client, "host-a"))
	}
	ts.report(t, statusReport(routeKey("r"), "host-a", 1, nimbusv1.Phase_PHASE_PROGRAMMED, ""))
}

func TestCountedStreams(t *testing.T) {
	for method, want := range map[string]bool{
		nimbusv1.Nimbus_Watch_FullMethodName:        true,
		nimbusv1.Nimbus_ReportStatus_FullMethodName: true,
		nimbusv1.Nimbus_WatchStatus_FullMethodName:  true,
		nimbusv1.Nimbus_PeerStatus_FullMethodName:   false,
		"/grpc.health.v1.Health/Watch":              false,
	} {
		if got := countedStream(method); got != want {
			t.Errorf("countedStream(%s) = %v, want %v", method, got, want)
		}
	}
}
