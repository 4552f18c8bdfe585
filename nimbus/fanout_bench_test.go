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
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/naplesnet/naples/nimbus"
	"github.com/naplesnet/naples/nimbusclient"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// The fan-out benchmark: nimbus with 10,000 routes targeted at every node, labelled and
// with several next hops as users write them (benchObject), and 1, 100 or 1000 watching
// clients over real gRPC on loopback TCP, each client on a connection of its own, as
// agents are. It measures the time until every client has its initial snapshot (SYNCED),
// the p50/p99 time for one update to reach all clients, and the heap in use. The same run
// measures the floor: a bare gRPC stream that sends the same bytes (the snapshot's events
// packed into frames as nimbus packs them, SYNCED, then each update in a frame of its
// own) to the same number of clients; the ratios are nimbus over the floor.
//
// The clients decode every frame they receive, events and objects, as an agent does and
// with the agent's codec (internal/codec), so the client side costs what it costs in
// practice; client and server share the machine.

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

// benchObject is the i-th route as users write them: a name, two labels, and three
// next hops (an ECMP route over a bond), the first through gw.
func benchObject(i int, gw string) *nimbusv1.Object {
	return &nimbusv1.Object{
		Meta: &nimbusv1.ObjectMeta{
			Name:   fmt.Sprintf("to-rack-%05d", i),
			Labels: map[string]string{"app": "web", "env": "prod"},
		},
		Spec: &nimbusv1.Object_Route{Route: &nimbusv1.RouteSpec{
			Table: 100, Prefix: fmt.Sprintf("10.%d.%d.0/24", i/256, i%256),
			Nexthops: []*nimbusv1.NextHop{
				{Gateway: gw, Device: "bond0", Weight: 1},
				{Gateway: "192.0.2.250", Device: "bond0", Weight: 1},
				{Gateway: "192.0.2.251", Device: "bond0", Weight: 1},
			},
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

// serveNimbus starts a nimbus with opts on loopback TCP and returns it, its address and
// a function that stops it, which fails the benchmark when Serve failed.
func serveNimbus(b *testing.B, opts nimbus.Options) (srv *nimbus.Server, addr string, stop func()) {
	srv, err := nimbus.New(opts)
	if err != nil {
		b.Fatal(err)
	}
	lis := listen(b)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, lis) }()
	return srv, lis.Addr().String(), func() {
		cancel()
		if err := <-done; err != nil {
			b.Error(err)
		}
	}
}

func nimbusTarget(b *testing.B) fanoutTarget {
	_, addr, stopNimbus := serveNimbus(b, nimbus.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), WatchBuffer: 1 << 16})
	ctx, cancel := context.WithCancel(context.Background())
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	api := nimbusv1.NewNimbusClient(conn)
	for i := 0; i < fanoutObjects; i += 1000 {
		var objs []*nimbusv1.Object
		for j := i; j < min(i+1000, fanoutObjects); j++ {
			objs = append(objs, benchObject(j, "192.0.2.1"))
		}
		if _, err := api.ApplyBatch(ctx, &nimbusv1.ApplyBatchRequest{Objects: objs}); err != nil {
			b.Fatal(err)
		}
	}
	return fanoutTarget{
		addr:   addr,
		method: "/nimbus.v1.Nimbus/Watch",
		update: func(i int) {
			if _, err := api.Apply(ctx, &nimbusv1.ApplyRequest{Object: benchObject(0, fmt.Sprintf("192.0.2.%d", 2+i%200))}); err != nil {
				b.Error(err)
			}
		},
		stop: func() {
			conn.Close()
			cancel()
			stopNimbus()
		},
		heapMiB: heapMiB,
	}
}

// floorFrameBytes bounds the floor's frames as nimbus bounds its own (maxFrameBytes).
const floorFrameBytes = 32 << 10

// floorTarget serves the same event bytes with nothing but a gRPC stream: the snapshot's
// events in frames, SYNCED, then every update, in a frame of its own, broadcast to every
// stream.
func floorTarget(b *testing.B) fanoutTarget {
	var frames [][]byte
	var frame []byte
	add := func(ev []byte) {
		if len(frame) > 0 && len(frame)+protowire.SizeTag(1)+protowire.SizeBytes(len(ev)) > floorFrameBytes {
			frames = append(frames, frame)
			frame = nil
		}
		frame = protowire.AppendTag(frame, 1, protowire.BytesType)
		frame = protowire.AppendBytes(frame, ev)
	}
	for i := range fanoutObjects {
		add(mustMarshal(b, &nimbusv1.WatchEvent{Type: nimbusv1.WatchEvent_TYPE_PUT, Object: benchObject(i, "192.0.2.1"), Revision: uint64(i + 1)}))
	}
	add(mustMarshal(b, &nimbusv1.WatchEvent{Type: nimbusv1.WatchEvent_TYPE_SYNCED, Revision: fanoutObjects}))
	frames = append(frames, frame)

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
			ev := mustMarshal(b, &nimbusv1.WatchEvent{Type: nimbusv1.WatchEvent_TYPE_PUT, Object: benchObject(0, fmt.Sprintf("192.0.2.%d", 2+i%200)), Revision: uint64(fanoutObjects + i + 1)})
			f := protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), ev)
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

// runFanout connects the clients, each over a connection of its own, waits for every
// snapshot, then publishes updates one at a time and times how long each takes to reach
// every client. The clients decode every frame.
func runFanout(b *testing.B, clients int, target fanoutTarget) fanoutResult {
	defer target.stop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	conns := make([]*grpc.ClientConn, clients)
	for i := range conns {
		// The clients decode with the codec nimbusclient's watch uses and receive with its
		// windows, nimbus's and the floor's alike.
		opts := append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()),
			nimbusclient.CodecOption()}, nimbusclient.WindowOptions()...)
		c, err := grpc.NewClient(target.addr, opts...)
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		conns[i] = c
	}
	synced := make(chan struct{}, clients)
	updates := make(chan time.Time, clients)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	start := time.Now()
	for _, conn := range conns {
		stream, err := conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, target.method)
		if err != nil {
			b.Fatal(err)
		}
		if err := stream.SendMsg(&nimbusv1.WatchRequest{Node: "bench-node"}); err != nil {
			b.Fatal(err)
		}
		if err := stream.CloseSend(); err != nil {
			b.Fatal(err)
		}
		wg.Go(func() {
			inSnapshot := true
			// Received as the agent's watch receives: into storage lent by a pool.
			var f nimbusv1.PooledFrame
			defer f.Release()
			for {
				if err := stream.RecvMsg(&f); err != nil {
					return
				}
				for _, ev := range f.Events() {
					switch typ := ev.GetType(); {
					case typ == nimbusv1.WatchEvent_TYPE_SYNCED:
						inSnapshot = false
						synced <- struct{}{}
					case typ == nimbusv1.WatchEvent_TYPE_PUT && !inSnapshot:
						updates <- time.Now()
					}
				}
				f.Release()
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
