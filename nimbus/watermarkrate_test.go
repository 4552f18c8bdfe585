package nimbus

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// delayedMoves is the metric of the watermark moves held back.
const delayedMoves = "naples_nimbus_status_watermark_moves_delayed_total"

// statusFrames receives the frames of the status watch c, after its SYNCED, on the
// channel it returns, until ctx ends.
func statusFrames(ctx context.Context, c *statusClient) <-chan *nimbusv1.StatusFrame {
	frames := make(chan *nimbusv1.StatusFrame)
	go func() {
		for {
			f, err := c.stream.Recv()
			if err != nil {
				return
			}
			select {
			case frames <- f:
			case <-ctx.Done():
				return
			}
		}
	}()
	return frames
}

// sendMoves opens a ReportStatus stream and sends on it the node's watermarks 1 to n,
// as fast as it can.
func (ts *testServer) sendMoves(t *testing.T, node string, n int) grpc.ClientStreamingClient[nimbusv1.StatusReport, nimbusv1.ReportStatusResponse] {
	t.Helper()
	stream, err := ts.client.ReportStatus(testContext(t))
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if err := stream.Send(ts.watermarkReport(node, uint64(i+1))); err != nil {
			t.Fatalf("sending move %d: %v", i+1, err)
		}
	}
	return stream
}

// TestWatermarkMovesRateLimited is a node that swings its watermark between 0 and the
// head as fast as it can, on one stream: the moves applied are bounded by its bucket, the
// rest held back and counted, and a status watcher receives a frame per move applied at
// most. Another node's move meanwhile is applied at once. A record sent after a held
// watermark is held with it. Once the bucket has a move again, what was held is applied:
// the node's watermark is the last it sent.
func TestWatermarkMovesRateLimited(t *testing.T) {
	ts := start(t, Options{})
	ts.apply(t, nodeObject("a"))
	ts.apply(t, nodeObject("b"))
	const routes = 20
	var head uint64
	for i := range routes {
		head = ts.apply(t, route(fmt.Sprintf("r%d", i), nil, "192.0.2.1")).GetObject().GenerationRevision()
	}
	ctx, cancel := context.WithCancel(testContext(t))
	defer cancel()
	c := watchStatus(t, ctx, ts.client, &nimbusv1.WatchStatusRequest{Kind: nimbusv1.Kind_KIND_ROUTE})
	c.synced()
	frames := statusFrames(ctx, c)

	// The clock stands still: the bucket has its burst, and no more. The last move is to
	// 0, where the last one allowed is to the head.
	const moves = 1001
	burst := DefaultStatusWatermarkMoves * StatusWatermarkMoveBurstSeconds
	revAt := func(i int) uint64 {
		if i%2 == 0 {
			return 0
		}
		return head
	}
	stream, err := ts.client.ReportStatus(testContext(t))
	if err != nil {
		t.Fatal(err)
	}
	for i := range moves {
		if err := stream.Send(ts.watermarkReport("a", revAt(i))); err != nil {
			t.Fatalf("sending move %d: %v", i, err)
		}
	}
	failed := statusReport(routeKey("r0"), "a", 1, nimbusv1.Phase_PHASE_FAILED, "held with the watermark before it")
	if err := stream.Send(failed); err != nil {
		t.Fatal(err)
	}
	waitMetricUntil(t, ts, delayedMoves, fmt.Sprint(moves-burst), func(v float64) bool { return v == float64(moves-burst) })
	if got, want := ts.srv.store.read().watermark("a").Revision, revAt(burst-1); got != want {
		t.Fatalf("a's watermark with its bucket empty = %d, want %d, its last move allowed", got, want)
	}
	wantStatus(t, ts, routeKey("r0"), 2, 1, 0, "a")

	// b's bucket is its own: its move is applied at once, and the watcher sees it.
	ts.report(t, ts.watermarkReport("b", head))
	wantStatus(t, ts, routeKey("r0"), 2, 2, 0, "a", "b")
	seen := 0
	wait := time.After(10 * time.Second)
	for seenB := false; !seenB; {
		select {
		case f := <-frames:
			seen++
			for _, ev := range f.GetEvents() {
				if _, _, _, ok := nodePhase(ev.GetItem().GetStatus(), "b"); ok {
					seenB = true
				}
			}
		case <-wait:
			t.Fatalf("no status frame with b's move within 10s, after %d frames", seen)
		}
	}

	// Once the bucket has a move again, the held reports are applied in order: the last
	// watermark sent, and the record sent after it.
	time.Sleep(2 * time.Second / DefaultStatusWatermarkMoves)
	wantStatus(t, ts, routeKey("r0"), 2, 2, 0, "a", "b")
	ts.clock.Advance(time.Second / DefaultStatusWatermarkMoves)
	waitPeerCond(t, "a's held reports applied", func() bool {
		return ts.srv.store.read().watermark("a").Revision == revAt(moves-1) && ts.get(t, routeKey("r0")).GetStatus().GetFailedNodes() == 1
	})
	wantStatus(t, ts, routeKey("r1"), 2, 1, 0, "b")
	if _, err := stream.CloseAndRecv(); err != nil {
		t.Fatal(err)
	}
	wantMetrics(t, ts.srv, fmt.Sprintf("%s %d", delayedMoves, moves-burst))

	// The watcher got at most a frame per move applied: the burst, b's, and the release.
	for more := true; more; {
		select {
		case <-frames:
			seen++
		case <-time.After(200 * time.Millisecond):
			more = false
		}
	}
	if seen > burst+2 {
		t.Errorf("the status watcher received %d frames, want at most %d: one per move applied", seen, burst+2)
	}
}

// TestWatermarkMovesAtPaceNotDelayed moves a node's watermark at its burst at once, then
// below the limit's rate: no move is held back.
func TestWatermarkMovesAtPaceNotDelayed(t *testing.T) {
	ts := start(t, Options{})
	ts.apply(t, nodeObject("a"))
	head := ts.apply(t, route("r1", nil, "192.0.2.1")).GetObject().GenerationRevision()
	burst := DefaultStatusWatermarkMoves * StatusWatermarkMoveBurstSeconds
	stream, err := ts.client.ReportStatus(testContext(t))
	if err != nil {
		t.Fatal(err)
	}
	last := uint64(0)
	for i := range burst + 200 {
		if i >= burst {
			// Slower than the limit: a move every 150ms, 10 a second allowed.
			ts.clock.Advance(150 * time.Millisecond)
		}
		last = uint64(i%2) * head
		if err := stream.Send(ts.watermarkReport("a", last)); err != nil {
			t.Fatal(err)
		}
		if i >= burst-1 {
			// The clock moves with the reports read, as it would.
			waitPeerCond(t, "the move applied", func() bool {
				wm := ts.srv.store.read().watermark("a")
				return wm != nil && wm.Revision == last
			})
		}
	}
	if _, err := stream.CloseAndRecv(); err != nil {
		t.Fatal(err)
	}
	wantMetrics(t, ts.srv, delayedMoves+" 0")
	if got := ts.srv.store.read().watermark("a").Revision; got != last {
		t.Errorf("a's watermark = %d, want %d", got, last)
	}
}

// TestWatermarkMovesHeldDroppedForNewerStream holds a node's watermark back on one
// stream, then takes one of the node's on another: the held one, older, is dropped rather
// than applied after it.
func TestWatermarkMovesHeldDroppedForNewerStream(t *testing.T) {
	ts := start(t, Options{Limits: Limits{StatusWatermarkMoves: 1}})
	ts.apply(t, nodeObject("a"))
	burst := StatusWatermarkMoveBurstSeconds
	old := ts.sendMoves(t, "a", burst+1)
	waitMetricUntil(t, ts, delayedMoves, "1", func(v float64) bool { return v == 1 })
	// The newer stream's watermark is no move: the one recorded.
	ts.report(t, ts.watermarkReport("a", uint64(burst)))
	ts.clock.Advance(time.Second)
	if _, err := old.CloseAndRecv(); err != nil {
		t.Fatal(err)
	}
	if got := ts.srv.store.read().watermark("a").Revision; got != uint64(burst) {
		t.Errorf("a's watermark = %d, want %d from the newer stream", got, burst)
	}
}

// TestWatermarkMovesLimitedAtReplicaReportedTo floods one replica with a node's
// watermark moves: the peer keeps what that replica recorded, the last move allowed while
// the rest are held, and the last one sent once they are applied.
func TestWatermarkMovesLimitedAtReplicaReportedTo(t *testing.T) {
	rs := startWatermarkPeers(t, Options{Limits: Limits{StatusWatermarkMoves: 1}}, "a", "b")
	a, b := rs[0], rs[1]
	applyToPeers(t, []*nimbusv1.Object{nodeObject("n1"), route("r1", nil, "192.0.2.1")}, rs...)
	burst := StatusWatermarkMoveBurstSeconds
	const moves = 100
	stream := a.sendMoves(t, "n1", moves)
	waitMetricUntil(t, a.testServer, delayedMoves, fmt.Sprint(moves-burst), func(v float64) bool { return v == float64(moves-burst) })
	waitPeerWatermark(t, "n1", uint64(burst), "a", a, b)
	wantMetrics(t, b.srv, delayedMoves+" 0")

	a.clock.Advance(time.Second)
	if _, err := stream.CloseAndRecv(); err != nil {
		t.Fatal(err)
	}
	waitPeerWatermark(t, "n1", moves, "a", a, b)
}

// TestWatermarkMovesHeldAnsweredAfterApplied closes a stream whose last watermark is
// held: the answer waits until it is applied, so that a client that has its answer knows
// nimbus took all it sent.
func TestWatermarkMovesHeldAnsweredAfterApplied(t *testing.T) {
	ts := start(t, Options{Limits: Limits{StatusWatermarkMoves: 1}})
	ts.apply(t, nodeObject("a"))
	burst := StatusWatermarkMoveBurstSeconds
	stream := ts.sendMoves(t, "a", burst+1)
	answered := make(chan error, 1)
	go func() {
		_, err := stream.CloseAndRecv()
		answered <- err
	}()
	waitMetricUntil(t, ts, delayedMoves, "1", func(v float64) bool { return v == 1 })
	select {
	case err := <-answered:
		t.Fatalf("the stream was answered (%v) with a watermark held", err)
	case <-time.After(1500 * time.Millisecond):
	}
	ts.clock.Advance(time.Second)
	if err := <-answered; err != nil {
		t.Fatal(err)
	}
	if got := ts.srv.store.read().watermark("a").Revision; got != uint64(burst+1) {
		t.Errorf("a's watermark once answered = %d, want %d", got, burst+1)
	}
}
