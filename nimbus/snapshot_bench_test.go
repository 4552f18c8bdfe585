package nimbus_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/naplesnet/naples/nimbus"
	"github.com/naplesnet/naples/nimbusclient"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// BenchmarkNodeSnapshot measures one node's initial snapshot in a fleet-shaped store:
// 1,000 routes for every node (benchObject) and 10 routes of the node's own, and, with
// others=99990, 10 routes of their own for each of 9,999 other nodes too, as endpoints
// and per-host routes are at fleet scale. Each op is a client that watches as one node
// over real gRPC and decodes, with the agent's codec, everything until SYNCED. The run
// without the other nodes' objects is the floor: a node's snapshot should cost what its
// own objects and those for every node cost, whatever the rest of the fleet holds.
//
//	go test -run '^$' -bench NodeSnapshot -benchmem ./nimbus/
func BenchmarkNodeSnapshot(b *testing.B) {
	const global, own, nodes = 1000, 10, 10000
	for _, others := range []int{0, (nodes - 1) * own} {
		b.Run(fmt.Sprintf("others=%d", others), func(b *testing.B) {
			_, addr, stop := serveNimbus(b, nimbus.Options{Logger: slog.New(slog.DiscardHandler)})
			defer stop()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			opts := append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()),
				nimbusclient.CodecOption()}, nimbusclient.WindowOptions()...)
			conn, err := grpc.NewClient(addr, opts...)
			if err != nil {
				b.Fatal(err)
			}
			defer conn.Close()
			api := nimbusv1.NewNimbusClient(conn)
			var objs []*nimbusv1.Object
			flush := func() {
				if _, err := api.ApplyBatch(ctx, &nimbusv1.ApplyBatchRequest{Objects: objs, OmitObjects: true}); err != nil {
					b.Fatal(err)
				}
				objs = objs[:0]
			}
			add := func(o *nimbusv1.Object) {
				if objs = append(objs, o); len(objs) == 1000 {
					flush()
				}
			}
			for i := range global {
				add(benchObject(i, "192.0.2.1"))
			}
			// The watched node is host-00000; with others, every node has its own.
			for n := range max(1, others/own+1) {
				for j := range own {
					add(nodeRoute(n, j))
				}
			}
			if len(objs) > 0 {
				flush()
			}
			b.ResetTimer()
			for range b.N {
				if got := watchSnapshot(b, ctx, api, "host-00000"); got != global+own {
					b.Fatalf("the snapshot of host-00000 held %d objects, want %d", got, global+own)
				}
			}
		})
	}
}

// nodeRoute is the j-th route of the node host-N, meant for that node alone, labelled and
// with next hops as users write them.
func nodeRoute(n, j int) *nimbusv1.Object {
	o := benchObject(0, "192.0.2.1")
	o.Meta.Name = fmt.Sprintf("host-%05d-uplink-%d", n, j)
	o.Meta.Nodes = []string{fmt.Sprintf("host-%05d", n)}
	o.GetRoute().Prefix = fmt.Sprintf("10.%d.%d.%d/28", 100+n/256/16, n/16%256, (n%16)*16)
	o.GetRoute().Table = uint32(200 + j)
	return o
}

// watchSnapshot watches as the node and returns how many objects its snapshot held.
func watchSnapshot(b *testing.B, ctx context.Context, api nimbusv1.NimbusClient, node string) int {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := api.Watch(ctx, &nimbusv1.WatchRequest{Node: node})
	if err != nil {
		b.Fatal(err)
	}
	puts := 0
	for {
		f, err := stream.Recv()
		if err != nil {
			b.Fatal(err)
		}
		for _, ev := range f.GetEvents() {
			switch ev.GetType() {
			case nimbusv1.WatchEvent_TYPE_PUT:
				puts++
			case nimbusv1.WatchEvent_TYPE_SYNCED:
				return puts
			}
		}
	}
}
