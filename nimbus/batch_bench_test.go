package nimbus_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	"github.com/naplesnet/naples/nimbus"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// The durable write benchmark: 100,000 routes applied to a nimbus with a data directory
// over real gRPC on loopback TCP, each way timed from the first call to the last answer,
// every object durable by then. The ways:
//
//   - batch-4MiB: ApplyBatch calls of up to 4 MiB each, one after the other, as
//     naplesctl apply sends a manifest;
//   - apply-each: one Apply per object, one after the other: a commit and an fsync each;
//   - apply-each-64: one Apply per object from 64 concurrent clients, whose Applies share
//     commits (group commit).
//
// Each reports objects/s and commits (bbolt transactions, from the commits metric).

const (
	benchRoutes = 100000
	// benchBatchBytes is how much one ApplyBatch carries, as naplesctl sends.
	benchBatchBytes = 4 << 20
)

func BenchmarkApplyBatch(b *testing.B) {
	objs := benchRoutesObjects()
	b.Run("batch-4MiB", func(b *testing.B) {
		benchDurableApply(b, objs, func(ctx context.Context, api nimbusv1.NimbusClient) error {
			for _, part := range chunkBySize(objs, benchBatchBytes) {
				_, err := api.ApplyBatch(ctx, &nimbusv1.ApplyBatchRequest{Objects: part}, grpc.MaxCallRecvMsgSize(64<<20))
				if err != nil {
					return err
				}
			}
			return nil
		})
	})
	b.Run("apply-each", func(b *testing.B) {
		benchDurableApply(b, objs, func(ctx context.Context, api nimbusv1.NimbusClient) error {
			for _, o := range objs {
				if _, err := api.Apply(ctx, &nimbusv1.ApplyRequest{Object: o}); err != nil {
					return err
				}
			}
			return nil
		})
	})
	b.Run("apply-each-64", func(b *testing.B) {
		const clients = 64
		benchDurableApply(b, objs, func(ctx context.Context, api nimbusv1.NimbusClient) error {
			errs := make(chan error, clients)
			var wg sync.WaitGroup
			for c := range clients {
				wg.Go(func() {
					for i := c; i < len(objs); i += clients {
						if _, err := api.Apply(ctx, &nimbusv1.ApplyRequest{Object: objs[i]}); err != nil {
							errs <- err
							return
						}
					}
				})
			}
			wg.Wait()
			close(errs)
			return <-errs
		})
	})
}

// benchRoute returns the i-th route of the durable write benchmarks.
func benchRoute(i int) *nimbusv1.Object {
	return &nimbusv1.Object{
		Meta: &nimbusv1.ObjectMeta{Name: fmt.Sprintf("route-%06d", i)},
		Spec: &nimbusv1.Object_Route{Route: &nimbusv1.RouteSpec{
			Table: 100, Prefix: fmt.Sprintf("10.%d.%d.%d/32", i>>16, i>>8&0xff, i&0xff),
			Nexthops: []*nimbusv1.NextHop{{Gateway: "192.0.2.1"}},
		}},
	}
}

// benchDurableApply runs apply against a fresh durable nimbus per iteration and reports
// the objects per second and the commits it took.
func benchDurableApply(b *testing.B, objs []*nimbusv1.Object, apply func(context.Context, nimbusv1.NimbusClient) error) {
	var elapsed time.Duration
	var commits float64
	for range b.N {
		b.StopTimer()
		srv, err := nimbus.New(nimbus.Options{Logger: slog.New(slog.DiscardHandler), DataDir: b.TempDir()})
		if err != nil {
			b.Fatal(err)
		}
		lis := listen(b)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- srv.Serve(ctx, lis) }()
		conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			b.Fatal(err)
		}
		api := nimbusv1.NewNimbusClient(conn)
		if _, err := api.List(ctx, &nimbusv1.ListRequest{}, grpc.WaitForReady(true)); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()

		start := time.Now()
		if err := apply(ctx, api); err != nil {
			b.Fatal(err)
		}
		elapsed += time.Since(start)

		b.StopTimer()
		commits += commitsOf(b, srv)
		conn.Close()
		cancel()
		if err := <-done; err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(len(objs))*float64(b.N)/elapsed.Seconds(), "objects/s")
	b.ReportMetric(commits/float64(b.N), "commits")
}

// commitsOf returns the server's naples_nimbus_commits_total.
func commitsOf(b *testing.B, srv *nimbus.Server) float64 {
	families, err := srv.Registry().Gather()
	if err != nil {
		b.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == "naples_nimbus_commits_total" {
			return f.GetMetric()[0].GetCounter().GetValue()
		}
	}
	b.Fatal("naples_nimbus_commits_total is not registered")
	return 0
}

// chunkBySize splits objs into consecutive batches of at most max encoded bytes, counting
// 256 bytes more per object for the framing and what the answer adds, as naplesctl does.
func chunkBySize(objs []*nimbusv1.Object, max int) [][]*nimbusv1.Object {
	var out [][]*nimbusv1.Object
	start, size := 0, 0
	for i, o := range objs {
		n := proto.Size(o) + 256
		if i > start && size+n > max {
			out = append(out, objs[start:i])
			start, size = i, 0
		}
		size += n
	}
	if len(objs) > start {
		out = append(out, objs[start:])
	}
	return out
}
