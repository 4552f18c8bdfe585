package agent

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/naplesnet/naples/delphi"
	"github.com/naplesnet/naples/nimbus"
	"github.com/naplesnet/naples/nimbusclient"
	delphiv1 "github.com/naplesnet/naples/proto/delphi/v1"
	flowsv1 "github.com/naplesnet/naples/proto/nimbus/flows/v1"
)

// tapThroughNimbus serves a nimbus on a unix socket and runs a nimbus client of node n1
// with tap, until the test ends; it returns a Flows client of the nimbus once nimbus has
// the tap.
func tapThroughNimbus(t *testing.T, tap *FlowTap) flowsv1.FlowsClient {
	t.Helper()
	reg := prometheus.NewRegistry()
	addr, conn, stop := startNimbusWith(t, t.TempDir(), nimbus.Options{Registerer: reg})
	store, err := delphi.Open(delphi.Options{})
	if err != nil {
		t.Fatal(err)
	}
	client, err := nimbusclient.New(nimbusclient.Options{Node: "n1", Address: addr, Store: store, FlowTap: tap, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- client.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-ran; err != nil {
			t.Errorf("nimbus client: %v", err)
		}
		stop()
		client.Close()
		store.Close()
	})
	waitTap(t, "nimbus to have the tap", func() bool { return gathered(t, reg, "naples_nimbus_flow_taps") == 1 })
	return flowsv1.NewFlowsClient(conn)
}

// gathered returns the value of the registry's metric without labels; 0 when missing.
func gathered(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == name {
			m := f.GetMetric()[0]
			return m.GetGauge().GetValue() + m.GetCounter().GetValue()
		}
	}
	return 0
}

// waitTap polls cond for up to 30s.
func waitTap(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(30 * time.Second); !cond(); {
		if time.Now().After(end) {
			t.Fatalf("waited 30s in vain for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// nodeError receives from the observer until it tells of n1's error, and returns it.
func nodeError(t *testing.T, obs grpc.ServerStreamingClient[flowsv1.ObserveFlowsResponse]) string {
	t.Helper()
	for {
		resp, err := obs.Recv()
		if err != nil {
			t.Fatalf("waiting for n1's error: %v", err)
		}
		for _, n := range resp.GetNodes() {
			if n.GetNode() == "n1" && n.GetError() != "" {
				return n.GetError()
			}
		}
	}
}

// TestFlowTapLimits shows the tap serving subscriptions through nimbus, filtered at the
// agent, refusing one beyond its limit and a bad filter, each observer told why.
func TestFlowTapLimits(t *testing.T) {
	log, err := NewFlowLog(64, nil)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	tap, err := NewFlowTap(FlowTapOptions{Log: log, Subscriptions: 1, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	api := tapThroughNimbus(t, tap)
	now := time.Now()
	log.Add([]*delphiv1.Flow{
		testFlow(now, "web", "egress", "10.0.0.1", "10.0.0.2", 0, false),
		testFlow(now, "db", "ingress", "10.0.0.1", "10.0.0.2", 1, true),
	}, 0)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	first, err := api.ObserveFlows(ctx, &flowsv1.ObserveFlowsRequest{Filter: &delphiv1.FlowsRequest{Follow: true, Verdict: "denied", Since: durationpb.New(time.Hour)}})
	if err != nil {
		t.Fatal(err)
	}
	var flows []*delphiv1.Flow
	for len(flows) == 0 {
		resp, err := first.Recv()
		if err != nil {
			t.Fatal(err)
		}
		flows = append(flows, resp.GetFlows()...)
	}
	if len(flows) != 1 || flows[0].GetVerdict() != "denied" {
		t.Errorf("the denied observer received %v, want the one denied record", flows)
	}
	if v := testutil.ToFloat64(tap.sent); v != 1 {
		t.Errorf("naples_agent_flow_tap_records_sent_total = %v, want 1: the allowed record stays at the agent", v)
	}

	second, err := api.ObserveFlows(ctx, &flowsv1.ObserveFlowsRequest{Filter: &delphiv1.FlowsRequest{Follow: true}})
	if err != nil {
		t.Fatal(err)
	}
	if e := nodeError(t, second); !strings.Contains(e, "--flow-tap-subscriptions") {
		t.Errorf("the second observer was told %q, want the limit named", e)
	}
	if v := gathered(t, reg, "naples_agent_flow_tap_subscriptions_refused_total"); v != 1 {
		t.Errorf("naples_agent_flow_tap_subscriptions_refused_total = %v, want 1", v)
	}
	cancel()
	waitTap(t, "the subscriptions to end", func() bool { return gathered(t, reg, "naples_agent_flow_tap_subscriptions") == 0 })

	// A filter that names nothing is refused by nimbus before any agent is asked.
	bad, err := api.ObserveFlows(t.Context(), &flowsv1.ObserveFlowsRequest{Filter: &delphiv1.FlowsRequest{Follow: true, From: "a/b/c/d"}})
	if err == nil {
		_, err = bad.Recv()
	}
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), `filter.from "a/b/c/d"`) {
		t.Errorf("the observer of a bad filter got %v, want InvalidArgument naming the field and value", err)
	}
}

// TestFlowTapSlowNimbus shows a subscription that nimbus takes slower than records come
// losing the oldest, counted as lost_agent, while the log, and its collector, go on.
func TestFlowTapSlowNimbus(t *testing.T) {
	log, err := NewFlowLog(8, nil)
	if err != nil {
		t.Fatal(err)
	}
	tap, err := NewFlowTap(FlowTapOptions{Log: log})
	if err != nil {
		t.Fatal(err)
	}
	add := func(n int) {
		for i := range n {
			log.Add([]*delphiv1.Flow{testFlow(time.Now(), "web", "egress", "10.0.0.1", "10.0.0.2", i, false)}, 0)
		}
	}
	add(4)
	// The first send blocks, as a send to a nimbus that does not read.
	gate, sent := make(chan struct{}), make(chan *flowsv1.FlowTapUp, 16)
	send := func(m *flowsv1.FlowTapUp) error {
		sent <- m
		<-gate
		return nil
	}
	ctx, cancel := context.WithCancel(t.Context())
	served := make(chan error, 1)
	go func() {
		served <- tap.serve(ctx, 7, &delphiv1.FlowsRequest{Follow: true, Since: durationpb.New(time.Hour)}, send)
	}()
	if m := <-sent; len(m.GetFlows()) != 4 || m.GetSubscription() != 7 {
		t.Fatalf("first message: %d flows of subscription %d, want the 4 recent of 7", len(m.GetFlows()), m.GetSubscription())
	}
	add(20) // the ring of 8 goes round while the send is blocked
	close(gate)
	var got int
	var lost uint64
	for lost < 12 || got < 8 {
		m := <-sent
		got += len(m.GetFlows())
		lost = m.GetLostAgent()
	}
	cancel()
	if err := <-served; err != nil {
		t.Fatal(err)
	}
	if got != 8 || lost != 12 {
		t.Errorf("after the ring went round: %d records sent and %d lost, want the ring's 8 and 12", got, lost)
	}
	if v := testutil.ToFloat64(tap.lost); v != 12 {
		t.Errorf("naples_agent_flow_tap_records_lost_total = %v, want 12", v)
	}
}
