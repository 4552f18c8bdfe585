package xds

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/envoyproxy/go-control-plane/pkg/server/stream/v3"
	server "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/naplesnet/naples/nimbus"
	"github.com/naplesnet/naples/nimbusclient"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

const (
	// fanoutObjects is how many objects each system holds, all meant for every node.
	fanoutObjects = 10000
	// fanoutRounds is how many updates of one object each run times.
	fanoutRounds = 20
	// fanoutSnapshotTimeout and fanoutUpdateTimeout bound the wait for every client's
	// snapshot and for one update to reach every client, so that a client that fails
	// fails the run instead of hanging it.
	fanoutSnapshotTimeout = 5 * time.Minute
	fanoutUpdateTimeout   = time.Minute
	// benchNode is the node every client watches as.
	benchNode = "bench-node"
	// xdsMaxRecvMsgSize lets an xDS client take the whole snapshot in one response, as
	// go-control-plane's LinearCache sends it (about 2 MiB here, under gRPC's default
	// 4 MiB, but the bound should not be what a run measures).
	xdsMaxRecvMsgSize = 64 << 20
	// xdsReceiveWindow is the flow-control window of an xDS client's connection and
	// stream, the one nimbusclient.WindowOptions gives nimbus's clients.
	xdsReceiveWindow = 1 << 20
)

// BenchmarkFanoutVsXDS runs nimbus and go-control-plane's delta ADS, one after the other
// in the same process, with 1, 100 and 1000 clients, and reports for each the snapshot
// time, the update latency (p50, p99) and the heap in use, then the ratios nimbus/xDS.
// See the package comment for what each side holds and what its clients do.
//
// Each system runs under the pprof label system=nimbus or system=xds, which every
// goroutine it starts (servers, streams, clients) inherits, so a CPU profile of a run
// splits by system: go tool pprof -tagfocus system=nimbus. The GC's own workers carry no
// label; to profile one system alone, -args -fanout.systems=nimbus (or xds) runs only it.
func BenchmarkFanoutVsXDS(b *testing.B) {
	var runNimbus, runXDS bool
	for sys := range strings.SplitSeq(*fanoutSystems, ",") {
		switch sys {
		case "nimbus":
			runNimbus = true
		case "xds":
			runXDS = true
		default:
			b.Fatalf("-fanout.systems %q: unknown system %q", *fanoutSystems, sys)
		}
	}
	for _, clients := range []int{1, 100, 1000} {
		b.Run(fmt.Sprintf("clients=%d", clients), func(b *testing.B) {
			for range b.N {
				var n, x fanoutResult
				if runNimbus {
					pprof.Do(context.Background(), pprof.Labels("system", "nimbus"), func(context.Context) {
						n = runFanout(b, clients, nimbusTarget(b))
					})
					n.report(b, "nimbus")
				}
				if runXDS {
					pprof.Do(context.Background(), pprof.Labels("system", "xds"), func(context.Context) {
						x = runFanout(b, clients, xdsTarget(b))
					})
					x.report(b, "xds")
				}
				if runNimbus && runXDS {
					b.ReportMetric(n.snapshot.Seconds()/x.snapshot.Seconds(), "snapshot-ratio")
					b.ReportMetric(n.snapshotCPU.Seconds()/x.snapshotCPU.Seconds(), "snapshot-cpu-ratio")
					b.ReportMetric(ms(n.p99)/ms(x.p99), "update-p99-ratio")
					b.ReportMetric(n.heapMiB/x.heapMiB, "heap-ratio")
				}
			}
		})
	}
}

// fanoutSystems selects the systems BenchmarkFanoutVsXDS runs, to profile one alone.
var fanoutSystems = flag.String("fanout.systems", "nimbus,xds",
	"systems BenchmarkFanoutVsXDS runs, comma-separated: nimbus, xds; the ratios need both")

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// fanoutTarget is a server under test, serving fanoutObjects objects.
type fanoutTarget struct {
	// addr is the server's loopback address.
	addr string
	// dialOpts are added to every client's connection.
	dialOpts []grpc.DialOption
	// watch opens one client's stream on conn and sends what opens the watch. The function
	// it returns receives and decodes until the stream ends, calling synced once the
	// client holds the whole snapshot and updated for every object received after that.
	watch func(ctx context.Context, conn *grpc.ClientConn) (func(synced, updated func()), error)
	// update publishes the i-th update of one object to every client.
	update func(i int)
	// stop stops the server and everything the target started.
	stop func()
	// objectBytes is the encoded size of one object as its clients receive it: a WatchEvent
	// for nimbus, a delta Resource (name, version, Any) for xDS.
	objectBytes int
}

// fanoutResult is what runFanout measured.
type fanoutResult struct {
	snapshot time.Duration
	// snapshotCPU is the CPU time the whole process (server, clients, GC) used during the
	// snapshot, which other load on the machine changes far less than the elapsed time.
	snapshotCPU time.Duration
	p50, p99    time.Duration
	heapMiB     float64
	objectBytes int
}

// report reports the result as the metrics of system.
func (r fanoutResult) report(b *testing.B, system string) {
	b.ReportMetric(r.snapshot.Seconds(), system+"-snapshot-s")
	b.ReportMetric(r.snapshotCPU.Seconds(), system+"-snapshot-cpu-s")
	b.ReportMetric(ms(r.p50), system+"-update-p50-ms")
	b.ReportMetric(ms(r.p99), system+"-update-p99-ms")
	b.ReportMetric(r.heapMiB, system+"-heap-MiB")
	b.ReportMetric(float64(r.objectBytes), system+"-object-B")
}

// heapMiB returns the Go heap in use, after a collection, in MiB.
func heapMiB() float64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return float64(m.HeapInuse) / (1 << 20)
}

func listen(b *testing.B) net.Listener {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatalf("listening on loopback: %v", err)
	}
	return lis
}

// routeName is the name of the i-th route, on both sides.
func routeName(i int) string { return fmt.Sprintf("%s%05d", routeNamePrefix, i) }

// routeNamePrefix starts every route's name.
const routeNamePrefix = "to-rack-"

// routeLabels are the labels of every route, on both sides: nimbus's in the object's
// meta, xDS's in the RouteConfiguration's metadata.
var routeLabels = map[string]string{"app": "web", "env": "prod"}

// routeDevice is the device of every next hop, on both sides.
const routeDevice = "bond0"

// routeGateways are the next hops of a route whose first gateway is gw, on both sides: an
// ECMP route over three gateways.
func routeGateways(gw string) []string { return []string{gw, "192.0.2.250", "192.0.2.251"} }

// routePrefix is the i-th route's destination, on both sides.
func routePrefix(i int) string { return fmt.Sprintf("10.%d.%d.0/24", i/256, i%256) }

// updateGateway is the gateway the i-th update sets, a different one each time.
func updateGateway(i int) string { return fmt.Sprintf("192.0.2.%d", 2+i%200) }

// benchObject is the i-th nimbus Route object, as nimbus's own fan-out benchmark builds it:
// as users write routes, with a name, two labels and three next hops.
func benchObject(i int, gw string) *nimbusv1.Object {
	var hops []*nimbusv1.NextHop
	for _, g := range routeGateways(gw) {
		hops = append(hops, &nimbusv1.NextHop{Gateway: g, Device: routeDevice, Weight: 1})
	}
	return &nimbusv1.Object{
		Meta: &nimbusv1.ObjectMeta{Name: routeName(i), Labels: maps.Clone(routeLabels)},
		Spec: &nimbusv1.Object_Route{Route: &nimbusv1.RouteSpec{
			Table: 100, Prefix: routePrefix(i), Nexthops: hops,
		}},
	}
}

// nimbusTarget starts a nimbus server holding fanoutObjects Route objects for every node,
// published with ApplyBatch as nimbus's own fan-out benchmark does; updates are Applies
// over a publisher connection of their own.
func nimbusTarget(b *testing.B) fanoutTarget {
	srv, err := nimbus.New(nimbus.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), WatchBuffer: 1 << 16})
	if err != nil {
		b.Fatalf("creating nimbus server: %v", err)
	}
	lis := listen(b)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, lis) }()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatalf("connecting the publisher: %v", err)
	}
	api := nimbusv1.NewNimbusClient(conn)
	for i := 0; i < fanoutObjects; i += 1000 {
		var objs []*nimbusv1.Object
		for j := i; j < min(i+1000, fanoutObjects); j++ {
			objs = append(objs, benchObject(j, "192.0.2.1"))
		}
		if _, err := api.ApplyBatch(ctx, &nimbusv1.ApplyBatchRequest{Objects: objs, OmitObjects: true}); err != nil {
			b.Fatalf("applying routes %d-%d: %v", i, i+len(objs)-1, err)
		}
	}
	got, err := api.Get(ctx, &nimbusv1.GetRequest{Key: &nimbusv1.ObjectKey{Kind: nimbusv1.Kind_KIND_ROUTE, Name: routeName(0)}})
	if err != nil {
		b.Fatalf("getting %s: %v", routeName(0), err)
	}
	stored := got.GetItem().GetObject()
	return fanoutTarget{
		addr: lis.Addr().String(),
		// The clients decode as an agent's nimbusclient does, with its codec, and receive
		// with its flow-control windows.
		dialOpts: append([]grpc.DialOption{nimbusclient.CodecOption()}, nimbusclient.WindowOptions()...),
		watch: func(ctx context.Context, conn *grpc.ClientConn) (func(synced, updated func()), error) {
			stream, err := nimbusv1.NewNimbusClient(conn).Watch(ctx, &nimbusv1.WatchRequest{Node: benchNode})
			if err != nil {
				return nil, fmt.Errorf("opening watch: %w", err)
			}
			return func(synced, updated func()) {
				inSnapshot, n := true, 0
				// As the agent's watch does, each frame is received into storage lent by a
				// pool and given back once its events are handled.
				var f nimbusv1.PooledFrame
				defer f.Release()
				for {
					if err := stream.RecvMsg(&f); err != nil {
						return
					}
					for _, ev := range f.Events() {
						switch typ := ev.GetType(); {
						case typ == nimbusv1.WatchEvent_TYPE_SYNCED:
							if n != fanoutObjects {
								b.Errorf("nimbus snapshot: got %d objects before SYNCED, want %d", n, fanoutObjects)
							}
							inSnapshot = false
							synced()
						case typ == nimbusv1.WatchEvent_TYPE_PUT && inSnapshot:
							n++
						case typ == nimbusv1.WatchEvent_TYPE_PUT:
							updated()
						}
					}
					f.Release()
				}
			}, nil
		},
		update: func(i int) {
			if _, err := api.Apply(ctx, &nimbusv1.ApplyRequest{Object: benchObject(0, updateGateway(i))}); err != nil {
				b.Errorf("applying update %d: %v", i, err)
			}
		},
		stop: func() {
			conn.Close()
			cancel()
			if err := <-done; err != nil {
				b.Errorf("serving nimbus: %v", err)
			}
		},
		objectBytes: proto.Size(&nimbusv1.WatchEvent{
			Type: nimbusv1.WatchEvent_TYPE_PUT, Object: stored, Revision: stored.GetMeta().GetRevision(),
		}),
	}
}

// routeConfig is the xDS counterpart of benchObject: a RouteConfiguration of the same name
// whose metadata holds the route's labels, as Envoy's API carries them (filter metadata
// under one key), and whose one virtual host, named after the table, sends the route's
// prefix to a cluster per next hop, weighted, named after its device and gateway.
func routeConfig(i int, gw string) *routev3.RouteConfiguration {
	labels := make(map[string]any, len(routeLabels))
	for k, v := range routeLabels {
		labels[k] = v
	}
	md, err := structpb.NewStruct(labels)
	if err != nil {
		panic(fmt.Sprintf("labels as a struct: %v", err))
	}
	var clusters []*routev3.WeightedCluster_ClusterWeight
	for _, g := range routeGateways(gw) {
		clusters = append(clusters, &routev3.WeightedCluster_ClusterWeight{
			Name: routeDevice + "/" + g, Weight: wrapperspb.UInt32(1),
		})
	}
	return &routev3.RouteConfiguration{
		Name:     routeName(i),
		Metadata: &core.Metadata{FilterMetadata: map[string]*structpb.Struct{"naples.labels": md}},
		VirtualHosts: []*routev3.VirtualHost{{
			Name:    "table-100",
			Domains: []string{"*"},
			Routes: []*routev3.Route{{
				Match: &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: routePrefix(i)}},
				Action: &routev3.Route_Route{Route: &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_WeightedClusters{
					WeightedClusters: &routev3.WeightedCluster{Clusters: clusters},
				}}},
			}},
		}},
	}
}

// xdsTarget starts go-control-plane's xDS server (server/v3, ADS registered on a plain
// grpc.Server) over a LinearCache holding fanoutObjects RouteConfigurations; updates are
// LinearCache.UpdateResource calls, in process, as a control plane built on
// go-control-plane publishes.
//
// The cache marshals and hashes a resource lazily, the first time a response needs it,
// and keeps the bytes. xdsTarget makes it do so for every resource before the clock
// starts, through a watch of its own on the cache, as nimbus encodes each event when the
// object is applied: neither side's snapshot time includes encoding the objects once.
func xdsTarget(b *testing.B) fanoutTarget {
	initial := make(map[string]types.Resource, fanoutObjects)
	for i := range fanoutObjects {
		initial[routeName(i)] = routeConfig(i, "192.0.2.1")
	}
	lc := cache.NewLinearCache(resource.RouteType, cache.WithInitialResources(initial))

	warm := make(chan cache.DeltaResponse, 1)
	if _, err := lc.CreateDeltaWatch(&cache.DeltaRequest{TypeUrl: resource.RouteType},
		stream.NewDeltaSubscription([]string{"*"}, nil, nil, true), warm); err != nil {
		b.Fatalf("warming the linear cache: %v", err)
	}
	resp, err := (<-warm).GetDeltaDiscoveryResponse()
	if err != nil {
		b.Fatalf("warming the linear cache: %v", err)
	}
	if len(resp.GetResources()) != fanoutObjects {
		b.Fatalf("warming the linear cache: got %d resources, want %d", len(resp.GetResources()), fanoutObjects)
	}
	objectBytes := proto.Size(resp.GetResources()[0])

	ctx, cancel := context.WithCancel(context.Background())
	xs := server.NewServer(ctx, lc, nil)
	gs := grpc.NewServer()
	discovery.RegisterAggregatedDiscoveryServiceServer(gs, xs)
	lis := listen(b)
	done := make(chan error, 1)
	go func() { done <- gs.Serve(lis) }()
	return fanoutTarget{
		addr: lis.Addr().String(),
		// The clients receive with the flow-control windows nimbus's clients have
		// (nimbusclient.WindowOptions); Envoy's defaults are larger, 16 MiB a stream and
		// 24 MiB a connection.
		dialOpts: []grpc.DialOption{
			grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(xdsMaxRecvMsgSize)),
			grpc.WithInitialWindowSize(xdsReceiveWindow), grpc.WithInitialConnWindowSize(xdsReceiveWindow),
		},
		watch: func(ctx context.Context, conn *grpc.ClientConn) (func(synced, updated func()), error) {
			ads, err := discovery.NewAggregatedDiscoveryServiceClient(conn).DeltaAggregatedResources(ctx)
			if err != nil {
				return nil, fmt.Errorf("opening delta ADS: %w", err)
			}
			if err := ads.Send(&discovery.DeltaDiscoveryRequest{
				Node:                   &core.Node{Id: benchNode},
				TypeUrl:                resource.RouteType,
				ResourceNamesSubscribe: []string{"*"},
			}); err != nil {
				return nil, fmt.Errorf("subscribing to %s: %w", resource.RouteType, err)
			}
			return func(synced, updated func()) { xdsClient(b, ads, synced, updated) }, nil
		},
		update: func(i int) {
			if err := lc.UpdateResource(routeName(0), routeConfig(0, updateGateway(i))); err != nil {
				b.Errorf("updating %s: %v", routeName(0), err)
			}
		},
		stop: func() {
			gs.Stop()
			cancel()
			if err := <-done; err != nil {
				b.Errorf("serving xds: %v", err)
			}
		},
		objectBytes: objectBytes,
	}
}

// xdsClient is one Envoy-like delta ADS client: it unmarshals every resource of every
// response into a RouteConfiguration, ACKs the response with its nonce, and counts the
// distinct routes it holds until it has all of them (there is no SYNCED in xDS).
func xdsClient(b *testing.B, ads discovery.AggregatedDiscoveryService_DeltaAggregatedResourcesClient, synced, updated func()) {
	var have [(fanoutObjects + 63) / 64]uint64
	n, inSnapshot := 0, true
	for {
		resp, err := ads.Recv()
		if err != nil {
			return
		}
		for _, r := range resp.GetResources() {
			var rc routev3.RouteConfiguration
			if err := anypb.UnmarshalTo(r.GetResource(), &rc, proto.UnmarshalOptions{}); err != nil {
				b.Errorf("decoding %s: %v", r.GetName(), err)
				return
			}
			if !inSnapshot {
				updated()
				continue
			}
			i, err := strconv.Atoi(strings.TrimPrefix(rc.GetName(), routeNamePrefix))
			if err != nil || i < 0 || i >= fanoutObjects {
				b.Errorf("decoding %s: unexpected route name %q", r.GetName(), rc.GetName())
				return
			}
			if have[i/64]&(1<<(i%64)) == 0 {
				have[i/64] |= 1 << (i % 64)
				n++
			}
		}
		if inSnapshot && n == fanoutObjects {
			inSnapshot = false
			synced()
		}
		if err := ads.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.RouteType, ResponseNonce: resp.GetNonce()}); err != nil {
			return
		}
	}
}

// runFanout connects the clients, each over a connection of its own, waits for every
// snapshot, then publishes updates one at a time and times how long each takes to reach
// every client. It is nimbus's own fan-out harness with the watch left to the target.
func runFanout(b *testing.B, clients int, target fanoutTarget) fanoutResult {
	defer target.stop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	conns := make([]*grpc.ClientConn, clients)
	opts := append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, target.dialOpts...)
	for i := range conns {
		c, err := grpc.NewClient(target.addr, opts...)
		if err != nil {
			b.Fatalf("connecting client %d: %v", i, err)
		}
		defer c.Close()
		conns[i] = c
	}
	syncedc := make(chan struct{}, clients)
	updates := make(chan time.Time, clients)
	synced := func() { syncedc <- struct{}{} }
	updated := func() { updates <- time.Now() }
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	runtime.GC()
	start, startCPU := time.Now(), cpuTime()
	for i, conn := range conns {
		run, err := target.watch(ctx, conn)
		if err != nil {
			b.Fatalf("client %d: %v", i, err)
		}
		wg.Go(func() { run(synced, updated) })
	}
	deadline := time.NewTimer(fanoutSnapshotTimeout)
	defer deadline.Stop()
	for i := range clients {
		select {
		case <-syncedc:
		case <-deadline.C:
			b.Fatalf("snapshot: %d of %d clients synced after %v", i, clients, fanoutSnapshotTimeout)
		}
	}
	res := fanoutResult{snapshot: time.Since(start), snapshotCPU: cpuTime() - startCPU}
	res.heapMiB, res.objectBytes = heapMiB(), target.objectBytes

	var lat []time.Duration
	for i := range fanoutRounds {
		sent := time.Now()
		target.update(i)
		deadline.Reset(fanoutUpdateTimeout)
		for j := range clients {
			select {
			case t := <-updates:
				lat = append(lat, t.Sub(sent))
			case <-deadline.C:
				b.Fatalf("update %d: %d of %d clients had it after %v", i, j, clients, fanoutUpdateTimeout)
			}
		}
	}
	slices.Sort(lat)
	res.p50 = lat[len(lat)/2]
	res.p99 = lat[len(lat)*99/100]
	return res
}
