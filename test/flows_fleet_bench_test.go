package test

import (
	"context"
	"net"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	delphiv1 "github.com/naplesnet/naples/proto/delphi/v1"
	flowsv1 "github.com/naplesnet/naples/proto/nimbus/flows/v1"
)

// BenchmarkFlowsThroughNimbus measures how long a packet takes to be a record that an
// ObserveFlows client of nimbus receives: web1 on host-a opens TCP connections to db2's
// echo on host-b, one every 20 ms, and an observer of every node (following, filtered at
// the agents to records to db2) notes when host-b's record of each connection's start
// arrives. The latency is from just before the connection's first packet is sent; the
// benchmark reports its p50 and p99 (goal: p99 ≤ 1 s).
func BenchmarkFlowsThroughNimbus(b *testing.B) {
	const connections, spacing = 200, 20 * time.Millisecond
	sc := newFleetFlowsCluster(b, nil)
	web1, db2 := sc.workload("web1"), sc.workload("db2")
	hb := sc.host("host-b")
	api := sc.c.flowsAPI(b, sc.c.server)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := api.ObserveFlows(ctx, &flowsv1.ObserveFlowsRequest{Filter: &delphiv1.FlowsRequest{Follow: true, To: "db2"}})
	if err != nil {
		b.Fatal(err)
	}
	// arrived holds when host-b's start record of each source port came.
	var mu sync.Mutex
	arrived := map[uint32]time.Time{}
	go func() {
		for {
			resp, err := stream.Recv()
			if err != nil {
				return
			}
			now := time.Now()
			mu.Lock()
			for _, f := range resp.GetFlows() {
				if f.GetNode() == "host-b" && f.GetEvent() == delphiv1.FlowEvent_FLOW_EVENT_STARTED {
					arrived[f.GetSourcePort()] = now
				}
			}
			mu.Unlock()
		}
	}()
	waitTapSubscriptions(b, hb, hb.telemetry(b), 1)
	echo := netip.AddrPortFrom(db2.addr(4), 7)
	for b.Loop() {
		sent := map[uint32]time.Time{}
		for i := range connections {
			t0 := time.Now()
			c := web1.dial(b, "tcp", echo)
			if err := c.exchange(fwFlowWait); err != nil {
				b.Fatalf("connection %d: %v", i, err)
			}
			sent[uint32(netip.MustParseAddrPort(c.c.LocalAddr().String()).Port())] = t0
			c.c.(*net.TCPConn).SetLinger(0) // no TIME_WAIT piling up
			c.c.Close()
			time.Sleep(time.Until(t0.Add(spacing)))
		}
		var lat []time.Duration
		waitFor(b, "the observer to receive every connection's record", func() bool {
			mu.Lock()
			defer mu.Unlock()
			lat = lat[:0]
			for port, t0 := range sent {
				if at, ok := arrived[port]; ok {
					lat = append(lat, at.Sub(t0))
				}
			}
			return len(lat) == len(sent)
		})
		slices.Sort(lat)
		ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
		b.ReportMetric(ms(lat[len(lat)/2]), "p50-ms")
		b.ReportMetric(ms(lat[len(lat)*99/100]), "p99-ms")
		b.ReportMetric(ms(lat[len(lat)-1]), "max-ms")
	}
}
