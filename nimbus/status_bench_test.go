package nimbus

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"testing"
	"time"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// BenchmarkViewStatus measures the statuses of 10,000 objects for every node on 10,000
// nodes whose watermarks all passed them, each node with a few moves kept: one op is
// every object's status in one view, as one List of them all or one status watch's
// flush of them all makes them.
func BenchmarkViewStatus(b *testing.B) { benchmarkViewStatus(b, false) }

// BenchmarkViewStatusBehind is BenchmarkViewStatus with every other node's watermark
// halfway: the later half of the objects are pending on half the nodes.
func BenchmarkViewStatusBehind(b *testing.B) { benchmarkViewStatus(b, true) }

// viewStatusNodes and viewStatusObjects are the size of viewStatusServer's store.
const viewStatusNodes, viewStatusObjects = 10000, 10000

// viewStatusServer serves a nimbus until the benchmark ends with viewStatusObjects
// routes for every one of viewStatusNodes nodes, whose watermarks moved four times over
// the objects' revisions and passed them all, or, when behind, every other one only
// halfway. It returns the server, the routes' records and the revision of the last.
func viewStatusServer(b *testing.B, behind bool) (*Server, []*objectRecord, uint64) {
	const nodes, objects = viewStatusNodes, viewStatusObjects
	srv, err := New(Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	lis, err := net.Listen("unix", filepath.Join(b.TempDir(), "n.sock"))
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, lis) }()
	b.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			b.Error(err)
		}
	})
	var batch []*nimbusv1.Object
	flush := func() {
		if _, err := srv.ApplyBatch(ctx, &nimbusv1.ApplyBatchRequest{Objects: batch, OmitObjects: true}); err != nil {
			b.Fatal(err)
		}
		batch = batch[:0]
	}
	for i := range nodes {
		batch = append(batch, nodeObject(fmt.Sprintf("n%05d", i)))
		if len(batch) == 1000 {
			flush()
		}
	}
	for i := range objects {
		batch = append(batch, route(fmt.Sprintf("r%05d", i), nil, "192.0.2.1"))
		if len(batch) == 1000 {
			flush()
		}
	}
	rev := srv.store.read().revision()
	// Every node's watermark moved four times over the objects' revisions, the nodes at
	// different times, and passed them all.
	txn := srv.store.write()
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for i := range nodes {
		var rec *watermarkRecord
		for step := uint64(1); step <= 4; step++ {
			if behind && i%2 == 0 && step > 2 {
				break
			}
			rec = rec.moved(fmt.Sprintf("n%05d", i), srv.Epoch(), rev-(4-step)*objects/4, "", t0.Add(time.Duration(int(step)*nodes+i)*time.Millisecond))
		}
		txn.putWatermark(rec)
	}
	txn.commit()
	var recs []*objectRecord
	for rec := range srv.store.read().objectsOfKind(nimbusv1.Kind_KIND_ROUTE) {
		recs = append(recs, rec)
	}
	return srv, recs, rev
}

// benchmarkViewStatus is BenchmarkViewStatus, with half the nodes behind or not.
func benchmarkViewStatus(b *testing.B, behind bool) {
	const nodes, objects = viewStatusNodes, viewStatusObjects
	srv, recs, rev := viewStatusServer(b, behind)
	b.ResetTimer()
	for range b.N {
		v := srv.view()
		for _, rec := range recs {
			want := int32(nodes)
			if behind && rec.Object.GenerationRevision() > rev-objects/2 {
				want = nodes / 2
			}
			if st := v.status(rec); st.GetProgrammedNodes() != want {
				b.Fatalf("%s: %d nodes programmed, want %d", rec.Key, st.GetProgrammedNodes(), want)
			}
		}
	}
	b.ReportMetric(b.Elapsed().Seconds()/float64(b.N)/objects*1e6, "µs/object")
}

// BenchmarkViewStatusAfterMove measures one node's watermark moving and then one
// object's status for every node on viewStatusNodes nodes in a view of the new version,
// as a status watch's flush makes it: with the index of the watermarks the views share,
// made from the one before (index=shared), against reading every node's watermark again
// (index=read), in the same run.
func BenchmarkViewStatusAfterMove(b *testing.B) {
	srv, recs, rev := viewStatusServer(b, false)
	rec := recs[len(recs)/2]
	for _, shared := range []bool{true, false} {
		b.Run(map[bool]string{true: "index=shared", false: "index=read"}[shared], func(b *testing.B) {
			now := time.Date(2026, 2, 1, 0, 0, 0, 0, time.UTC)
			for i := 0; b.Loop(); i++ {
				node := fmt.Sprintf("n%05d", i%viewStatusNodes)
				txn := srv.store.write()
				now = now.Add(time.Millisecond)
				txn.putWatermark(txn.watermark(node).moved(node, srv.Epoch(), rev+uint64(i), "", now))
				txn.commit()
				v := srv.view()
				if !shared {
					v.marks = &everyMarks{markIndex: v.readMarkIndex()}
				}
				if st := v.status(rec); st.GetProgrammedNodes() != viewStatusNodes {
					b.Fatalf("%s: %d nodes programmed, want %d", rec.Key, st.GetProgrammedNodes(), viewStatusNodes)
				}
			}
		})
	}
}
