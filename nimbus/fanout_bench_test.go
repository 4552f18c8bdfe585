package nimbus_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	protoenc "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	"github.com/naplesnet/naples/nimbus"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// The fan-out benchmark: nimbus with 10,000 objects targeted at every node, and 1, 100 or
// 1000 watching clients over real gRPC on loopback TCP. It measures the time until every
// client has its initial snapshot (SYNCED), the p50/p99 time for one update to reach all
// clients, and the heap in use. The same run measures the floor: a bare gRPC stream that
// sends the same bytes (the encoded snapshot events and SYNCED, then each update) to the
// same number of clients; the ratios are nimbus over the floor.
//
// The clients do not decode what they receive (they read the event type from the first
// bytes of the frame), so the client side costs as little as it can and what is measured
// is the server's fan-out.

const fanoutObjects = 10000

func BenchmarkFanout(b *testing.B) {
	for _, clients := range []int{1, 100, 1000} {
		b.Run(fmt.Sprintf("clients=%d", clients), func(b *testing.B) {
			for range b.N {
				n := runFanout(b, clients, nimbusTarget(b))
				f := runFanout(b, clients, floorTarget(b))
				b.ReportMetric(n.snapshot.Seconds(), "snapshot-s")
				b.ReportMetric(ms(n.p50), "update-p50-ms")
				b.ReportMetric(ms(n.p99), "update-p99-ms")
				b.ReportMetric(n.heapMiB, "heap-MiB")
				b.ReportMetric(f.snapshot.Seconds(), "floor-snapshot-s")
				b.ReportMetric(ms(f.p50), "floor-update-p50-ms")
				b.ReportMetric(ms(f.p99), "floor-update-p99-ms")
				b.ReportMetric(n.snapshot.Seconds()/f.snapshot.Seconds(), "snapshot-ratio")
				b.ReportMetric(ms(n.p99)/ms(f.p99), "update-p99-ratio")
			}
		})
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// fanoutTarget is a server under test: its address, the method to watch, and a function
// that publishes one update to every client.
type fanoutTarget struct {
	addr    string
	method  string
	update  func(i int)
	stop    func()
	heapMiB func() float64
}

type fanoutResult struct {
	snapshot time.Duration
	p50, p99 time.Duration
	heapMiB  float64
}

func benchObject(i int, gw string) *nimbusv1.Object {
	return &nimbusv1.Object{
		Meta: &nimbusv1.ObjectMeta{Name: fmt.Sprintf("route-%05d", i)},
		Spec: &nimbusv1.Object_Route{Route: &nimbusv1.RouteSpec{
			Table: 100, Prefix: fmt.Sprintf("10.%d.%d.0/24", i/256, i%256),
			Nexthops: []*nimbusv1.NextHop{{Gateway: gw}},
		}},
	}
}

func heapMiB() float64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return float64(m.HeapInuse) / (1 << 20)
}

func listen(b *testing.B) net.Listener {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	return lis
}

func nimbusTarget(b *testing.B) fanoutTarget {
	srv, err := nimbus.New(nimbus.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), WatchBuffer: 1 << 16})
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
	for i := range fanoutObjects {
		if _, err := api.Apply(ctx, &nimbusv1.ApplyRequest{Object: benchObject(i, "192.0.2.1")}); err != nil {
			b.Fatal(err)
		}
	}
	return fanoutTarget{
		addr:   lis.Addr().String(),
		method: "/nimbus.v1.Nimbus/Watch",
		update: func(i int) {
			if _, err := api.Apply(ctx, &nimbusv1.ApplyRequest{Object: benchObject(0, fmt.Sprintf("192.0.2.%d", 2+i%200))}); err != nil {
				b.Error(err)
			}
		},
		stop: func() {
			conn.Close()
			cancel()
			<-done
		},
		heapMiB: heapMiB,
	}
}

// floorTarget serves the same event bytes with nothing but a gRPC stream: the snapshot
// frames, SYNCED, then every update broadcast to every stream.
func floorTarget(b *testing.B) fanoutTarget {
	var frames [][]byte
	for i := range fanoutObjects {
		ev := &nimbusv1.WatchEvent{Type: nimbusv1.WatchEvent_TYPE_PUT, Object: benchObject(i, "192.0.2.1"), Revision: uint64(i + 1), Snapshot: true}
		frames = append(frames, mustMarshal(b, ev))
	}
	synced := mustMarshal(b, &nimbusv1.WatchEvent{Type: nimbusv1.WatchEvent_TYPE_SYNCED, Revision: fanoutObjects})

	var mu sync.Mutex
	var subs []chan []byte
	handler := func(_ any, stream grpc.ServerStream) error {
		var req rawFrame
		if err := stream.RecvMsg(&req); err != nil {
			return err
		}
		ch := make(chan []byte, 64)
		mu.Lock()
		subs = append(subs, ch)
		mu.Unlock()
		for _, f := range frames {
			if err := stream.SendMsg(rawFrame(f)); err != nil {
				return err
			}
		}
		if err := stream.SendMsg(rawFrame(synced)); err != nil {
			return err
		}
		for {
			select {
			case <-stream.Context().Done():
				return nil
			case f := <-ch:
				if err := stream.SendMsg(rawFrame(f)); err != nil {
					return err
				}
			}
		}
	}
	srv := grpc.NewServer(grpc.ForceServerCodecV2(rawCodec{}))
	srv.RegisterService(&grpc.ServiceDesc{
		ServiceName: "floor.Floor",
		HandlerType: (*any)(nil),
		Streams:     []grpc.StreamDesc{{StreamName: "Watch", Handler: handler, ServerStreams: true}},
	}, struct{}{})
	lis := listen(b)
	go srv.Serve(lis)
	return fanoutTarget{
		addr:   lis.Addr().String(),
		method: "/floor.Floor/Watch",
		update: func(i int) {
			f := mustMarshal(b, &nimbusv1.WatchEvent{Type: nimbusv1.WatchEvent_TYPE_PUT, Object: benchObject(0, fmt.Sprintf("192.0.2.%d", 2+i%200)), Revision: uint64(fanoutObjects + i + 1)})
			mu.Lock()
			defer mu.Unlock()
			for _, ch := range subs {
				ch <- f
			}
		},
		stop:    srv.Stop,
		heapMiB: heapMiB,
	}
}

func mustMarshal(b *testing.B, m proto.Message) []byte {
	out, err := proto.Marshal(m)
	if err != nil {
		b.Fatal(err)
	}
	return out
}

// runFanout connects the clients, waits for every snapshot, then publishes updates one at
// a time and times how long each takes to reach every client.
func runFanout(b *testing.B, clients int, target fanoutTarget) fanoutResult {
	defer target.stop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// Clients share a few connections, as many agents behind one NAT or proxy would not;
	// separate connections per client make the floor and nimbus alike pay for TCP.
	conns := make([]*grpc.ClientConn, min(clients, 50))
	for i := range conns {
		c, err := grpc.NewClient(target.addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithDefaultCallOptions(grpc.ForceCodecV2(rawCodec{})))
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		conns[i] = c
	}
	req := mustMarshal(b, &nimbusv1.WatchRequest{Node: "bench-node"})
	synced := make(chan struct{}, clients)
	updates := make(chan time.Time, clients)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	start := time.Now()
	for i := range clients {
		stream, err := conns[i%len(conns)].NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, target.method)
		if err != nil {
			b.Fatal(err)
		}
		if err := stream.SendMsg(rawFrame(req)); err != nil {
			b.Fatal(err)
		}
		if err := stream.CloseSend(); err != nil {
			b.Fatal(err)
		}
		wg.Go(func() {
			inSnapshot := true
			for {
				var f rawFrame
				if err := stream.RecvMsg(&f); err != nil {
					return
				}
				typ := eventType(f)
				switch {
				case typ == nimbusv1.WatchEvent_TYPE_SYNCED:
					inSnapshot = false
					synced <- struct{}{}
				case typ == nimbusv1.WatchEvent_TYPE_PUT && !inSnapshot:
					updates <- time.Now()
				}
			}
		})
	}
	for range clients {
		<-synced
	}
	res := fanoutResult{snapshot: time.Since(start), heapMiB: target.heapMiB()}

	const rounds = 20
	var lat []time.Duration
	for i := range rounds {
		sent := time.Now()
		target.update(i)
		for range clients {
			lat = append(lat, (<-updates).Sub(sent))
		}
	}
	slices.Sort(lat)
	res.p50 = lat[len(lat)/2]
	res.p99 = lat[len(lat)*99/100]
	return res
}

// eventType reads a WatchEvent's type from its wire form without decoding the rest:
// field 1 (type) is encoded first, as tag 0x08 and a one-byte varint.
func eventType(f []byte) nimbusv1.WatchEvent_Type {
	if len(f) >= 2 && f[0] == 0x08 {
		return nimbusv1.WatchEvent_Type(f[1])
	}
	return nimbusv1.WatchEvent_TYPE_UNSPECIFIED
}

// rawFrame is a message in wire form, sent and received as is by rawCodec.
type rawFrame []byte

// rawCodec moves rawFrames without encoding or decoding them.
type rawCodec struct{}

func (rawCodec) Name() string { return protoenc.Name }

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	f, ok := v.(rawFrame)
	if !ok {
		return encoding.GetCodecV2(protoenc.Name).Marshal(v)
	}
	return mem.BufferSlice{mem.SliceBuffer(f)}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	f, ok := v.(*rawFrame)
	if !ok {
		return encoding.GetCodecV2(protoenc.Name).Unmarshal(data, v)
	}
	*f = data.Materialize()
	return nil
}
