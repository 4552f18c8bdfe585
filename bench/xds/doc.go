// Package xds compares nimbus's watch fan-out with go-control-plane's delta ADS, the xDS
// server most Go control planes for Envoy are built on. It holds only the benchmark
// BenchmarkFanoutVsXDS and lives in a module of its own, so that go-control-plane and the
// Envoy API stay out of the naples module's go.mod.
//
// Both systems run in the same process, one after the other, in the harness shape of
// nimbus's BenchmarkFanout: 10,000 objects meant for every node, 1, 100 or 1000 clients,
// each on a gRPC connection of its own over loopback TCP (plaintext), each decoding every
// object it receives. The benchmark measures, for each system, the time until every client
// has the whole snapshot and the CPU time the process spent meanwhile, the latency of 20
// updates of one object until each client has decoded it (p50 and p99 over all (client,
// update) pairs), and the Go heap in use after the snapshot; it reports those and the
// ratios nimbus/xDS for the snapshot time and CPU time, the update p99 and the heap.
//
// nimbus holds Route objects as users write them (two labels, table 100, a /24 prefix,
// three next hops over a bond) and its clients call Watch until SYNCED, decoding with the
// agent's codec (nimbusclient.CodecOption: internal/codec with vtprotobuf's generated
// code, strings as views of each frame's bytes). go-control-plane holds, in a LinearCache
// (its cache for one type whose resources change one at a time), one
// envoy.config.route.v3.RouteConfiguration per route, carrying the same name, labels (in
// its metadata), table, prefix, gateways, device and weights; its clients open
// DeltaAggregatedResources, subscribe to every route configuration, unmarshal every
// resource's Any into a RouteConfiguration and ACK every response with its nonce, as
// Envoy does, and have the snapshot once they hold all 10,000; they decode as Go clients
// of go-control-plane do, with gRPC's proto codec and proto.Unmarshal.
package xds
