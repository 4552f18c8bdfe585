package nimbus_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/naplesnet/naples/nimbus"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// BenchmarkChain measures nimbus's share of the bulk chain in one process, so that it can
// be profiled (-cpuprofile) apart from the agent and the kernel: 100,000 routes applied to a
// durable nimbus in ApplyBatch calls of up to 4 MiB, as naplesctl sends a manifest; an
// agent stand-in on its own connection that watches them and reports each PUT it receives
// PROGRAMMED at its generation, as a HAL that writes nothing would; and a WatchStatus
// stream, as naplesctl wait or a controller follows, until every route is PROGRAMMED on
// the node. Then every route is deleted in DeleteBatch calls until the status stream has
// seen every deletion. It reports routes/s both ways, and how many times the stand-in's
// watch fell behind and was reset, after which it resumes as the agent does.
func BenchmarkChain(b *testing.B) {
	objs := benchRoutesObjects()
	var add, del time.Duration
	var resets int64
	for range b.N {
		a, d, r := runChain(b, objs)
		add, del, resets = add+a, del+d, resets+r
	}
	n := float64(len(objs) * b.N)
	b.ReportMetric(n/add.Seconds(), "add-routes/s")
	b.ReportMetric(n/del.Seconds(), "del-routes/s")
	b.ReportMetric(float64(resets)/float64(b.N), "watch-resets")
	b.ReportMetric(0, "ns/op")
}

func runChain(b *testing.B, objs []*nimbusv1.Object) (add, del time.Duration, resets int64) {
	b.StopTimer()
	defer b.StartTimer()
	_, addr, stopServer := serveNimbus(b, nimbus.Options{Logger: slog.New(slog.DiscardHandler), DataDir: b.TempDir()})
	defer stopServer()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dialAPI := func() nimbusv1.NimbusClient {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20)))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { conn.Close() })
		return nimbusv1.NewNimbusClient(conn)
	}
	publisher, agent, controller := dialAPI(), dialAPI(), dialAPI()

	// The agent stand-in: every PUT it receives is reported PROGRAMMED, in one report
	// stream, as the agent's reporter sends them. A watch reset because it fell behind is
	// resumed after the last event received, as the agent does.
	watch, err := agent.Watch(ctx, &nimbusv1.WatchRequest{Node: "bench-node"}, grpc.WaitForReady(true))
	if err != nil {
		b.Fatal(err)
	}
	reports, err := agent.ReportStatus(ctx)
	if err != nil {
		b.Fatal(err)
	}
	// The stand-in's error ends the run: it cancels ctx, which ends the status stream. It
	// reads the watch in one goroutine and reports in another, as the agent does, so that
	// reporting never holds the watch back.
	agentDone := make(chan error, 2)
	stop := func(err error) {
		agentDone <- err
		cancel()
	}
	toReport := make(chan []*nimbusv1.StatusReport, 1024)
	var watchResets atomic.Int64
	go func() {
		defer close(toReport)
		var epoch string
		var rev uint64
		for {
			frame, err := watch.Recv()
			if status.Code(err) == codes.ResourceExhausted {
				watchResets.Add(1)
				watch, err = agent.Watch(ctx, &nimbusv1.WatchRequest{Node: "bench-node", Epoch: epoch, Revision: rev})
				if err == nil {
					continue
				}
			}
			if err != nil {
				stop(err)
				return
			}
			var batch []*nimbusv1.StatusReport
			for _, ev := range frame.GetEvents() {
				if e := ev.GetEpoch(); e != "" {
					epoch = e
				}
				if ev.GetRevision() != 0 {
					rev = ev.GetRevision()
				}
				if ev.GetType() != nimbusv1.WatchEvent_TYPE_PUT {
					continue
				}
				batch = append(batch, &nimbusv1.StatusReport{Key: ev.ObjectKey(), Status: &nimbusv1.NodeStatus{
					Node: "bench-node", Phase: nimbusv1.Phase_PHASE_PROGRAMMED,
					ObservedGeneration: ev.GetObject().GetMeta().GetGeneration(),
				}})
			}
			select {
			case toReport <- batch:
			case <-ctx.Done():
				return
			}
		}
	}()
	go func() {
		for batch := range toReport {
			for _, r := range batch {
				if err := reports.Send(r); err != nil {
					stop(err)
					return
				}
			}
		}
	}()

	// fail ends the run with err, or with the stand-in's error that caused it.
	fail := func(err error) {
		b.Helper()
		select {
		case aerr := <-agentDone:
			b.Fatalf("agent stand-in: %v (then: %v)", aerr, err)
		default:
			b.Fatal(err)
		}
	}
	statuses, err := controller.WatchStatus(ctx, &nimbusv1.WatchStatusRequest{Kind: nimbusv1.Kind_KIND_ROUTE})
	if err != nil {
		b.Fatal(err)
	}
	// follow reads the status stream until judge has seen n objects done.
	follow := func(n int, judge func(ev *nimbusv1.StatusEvent) bool) {
		seen := map[string]bool{}
		for len(seen) < n {
			frame, err := statuses.Recv()
			if err != nil {
				fail(err)
			}
			for _, ev := range frame.GetEvents() {
				if judge(ev) {
					seen[ev.GetKey().GetName()] = true
				}
			}
		}
	}
	follow(0, nil)

	start := time.Now()
	for _, part := range chunkBySize(objs, benchBatchBytes) {
		_, err := publisher.ApplyBatch(ctx, &nimbusv1.ApplyBatchRequest{Objects: part, OmitObjects: true})
		if err != nil {
			fail(err)
		}
	}
	follow(len(objs), func(ev *nimbusv1.StatusEvent) bool {
		return ev.GetType() == nimbusv1.StatusEvent_TYPE_PUT && ev.GetItem().GetStatus().GetProgrammedNodes() == 1
	})
	add = time.Since(start)

	keys := make([]*nimbusv1.ObjectKey, len(objs))
	for i, o := range objs {
		keys[i] = o.Key()
	}
	start = time.Now()
	for lo := 0; lo < len(keys); lo += 20000 {
		hi := min(lo+20000, len(keys))
		if _, err := publisher.DeleteBatch(ctx, &nimbusv1.DeleteBatchRequest{Keys: keys[lo:hi]}); err != nil {
			fail(err)
		}
	}
	follow(len(objs), func(ev *nimbusv1.StatusEvent) bool { return ev.GetType() == nimbusv1.StatusEvent_TYPE_DELETE })
	del = time.Since(start)

	select {
	case err := <-agentDone:
		if !errors.Is(err, io.EOF) {
			b.Fatalf("agent stand-in: %v", err)
		}
	default:
	}
	return add, del, watchResets.Load()
}

// benchRoutesObjects returns benchRoutes Route objects as BenchmarkApplyBatch applies them.
func benchRoutesObjects() []*nimbusv1.Object {
	objs := make([]*nimbusv1.Object, benchRoutes)
	for i := range objs {
		objs[i] = benchRoute(i)
	}
	return objs
}
