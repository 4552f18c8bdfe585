package nimbus

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// BenchmarkWatchStatusWatermarks measures a status watch's flush when 1,000 nodes report
// a watermark past 10,000 objects for every node: from the reports to the watch having
// every object PROGRAMMED on every node (flush-s), and the PUTs it took (puts).
func BenchmarkWatchStatusWatermarks(b *testing.B) {
	const nodes, objects = 1000, 10000
	for range b.N {
		srv, err := New(Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			b.Fatal(err)
		}
		path := filepath.Join(b.TempDir(), "n.sock")
		lis, err := net.Listen("unix", path)
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		served := make(chan error, 1)
		go func() { served <- srv.Serve(ctx, lis) }()
		conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			b.Fatal(err)
		}
		api := nimbusv1.NewNimbusClient(conn)
		var batch []*nimbusv1.Object
		flush := func() {
			if _, err := api.ApplyBatch(ctx, &nimbusv1.ApplyBatchRequest{Objects: batch, OmitObjects: true}); err != nil {
				b.Fatal(err)
			}
			batch = batch[:0]
		}
		for i := range nodes {
			batch = append(batch, nodeObject(fmt.Sprintf("n%04d", i)))
		}
		flush()
		for i := range objects {
			batch = append(batch, route(fmt.Sprintf("r%05d", i), nil, "192.0.2.1"))
			if len(batch) == 1000 {
				flush()
			}
		}
		stream, err := api.WatchStatus(ctx, &nimbusv1.WatchStatusRequest{Kind: nimbusv1.Kind_KIND_ROUTE}, grpc.MaxCallRecvMsgSize(64<<20))
		if err != nil {
			b.Fatal(err)
		}
		for synced := false; !synced; {
			f, err := stream.Recv()
			if err != nil {
				b.Fatal(err)
			}
			for _, ev := range f.GetEvents() {
				synced = synced || ev.GetType() == nimbusv1.StatusEvent_TYPE_SYNCED
			}
		}
		rev := srv.store.read().revision()
		start := time.Now()
		report, err := api.ReportStatus(ctx)
		if err != nil {
			b.Fatal(err)
		}
		for i := range nodes {
			wm := &nimbusv1.StatusWatermark{Node: fmt.Sprintf("n%04d", i), Epoch: srv.Epoch(), Revision: rev}
			if err := report.Send(&nimbusv1.StatusReport{Watermark: wm}); err != nil {
				b.Fatal(err)
			}
		}
		if _, err := report.CloseAndRecv(); err != nil {
			b.Fatal(err)
		}
		done, puts := map[string]bool{}, 0
		for len(done) < objects {
			f, err := stream.Recv()
			if err != nil {
				b.Fatal(err)
			}
			for _, ev := range f.GetEvents() {
				puts++
				if ev.GetItem().GetStatus().GetProgrammedNodes() == nodes {
					done[ev.GetKey().GetName()] = true
				}
			}
		}
		b.ReportMetric(time.Since(start).Seconds(), "flush-s")
		b.ReportMetric(float64(puts), "puts")
		cancel()
		conn.Close()
		if err := <-served; err != nil {
			b.Fatal(err)
		}
	}
}
