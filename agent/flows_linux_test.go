package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/naplesnet/naples/delphi"
	"github.com/naplesnet/naples/internal/telemetry/telemetrytest"
	delphiv1 "github.com/naplesnet/naples/proto/delphi/v1"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// testFlow returns a flow record of an endpoint: i numbers its source port; denied ones
// are a policy's.
func testFlow(at time.Time, ep, dir, src, dst string, i int, denied bool) *delphiv1.Flow {
	f := &delphiv1.Flow{
		Time: timestamppb.New(at), Event: delphiv1.FlowEvent_FLOW_EVENT_STARTED, Verdict: "allowed", Node: "n1",
		Endpoint:  &nimbusv1.ObjectKey{Kind: nimbusv1.Kind_KIND_ENDPOINT, Tenant: "t1", Namespace: "ns1", Name: ep},
		Direction: dir, Protocol: "tcp", Source: src, SourcePort: uint32(40000 + i), Destination: dst, DestinationPort: 80,
	}
	if denied {
		f.Event, f.Verdict, f.Reason, f.Rule = delphiv1.FlowEvent_FLOW_EVENT_DENIED, "denied", "policy", 7
		f.Policy = &nimbusv1.ObjectKey{Kind: nimbusv1.Kind_KIND_NETWORK_SECURITY_POLICY, Tenant: "t1", Namespace: "ns1", Name: "web"}
	}
	return f
}

// peerFlow returns f with the endpoint of f's tenant and namespace of the name as its
// peer.
func peerFlow(f *delphiv1.Flow, name string) *delphiv1.Flow {
	f.PeerEndpoint = &nimbusv1.ObjectKey{Kind: nimbusv1.Kind_KIND_ENDPOINT, Tenant: "t1", Namespace: "ns1", Name: name}
	return f
}

// flowsOf returns the source ports of the records of the responses, and the responses'
// last lost counts.
func flowsOf(resps []*delphiv1.FlowsResponse) (ports []uint32, lostDatapath, lostAgent uint64) {
	for _, r := range resps {
		for _, f := range r.GetFlows() {
			ports = append(ports, f.GetSourcePort()-40000)
		}
		lostDatapath, lostAgent = r.GetLostDatapath(), r.GetLostAgent()
	}
	return ports, lostDatapath, lostAgent
}

// recent runs Flows without following and returns what it sent.
func recent(t *testing.T, api delphiv1.DelphiClient, req *delphiv1.FlowsRequest) ([]*delphiv1.FlowsResponse, error) {
	t.Helper()
	stream, err := api.Flows(t.Context(), req)
	if err != nil {
		return nil, err
	}
	var out []*delphiv1.FlowsResponse
	for {
		r, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		out = append(out, r)
	}
}

// serveFlows serves the local API with a flow log of size records, whose metrics reg
// takes (nil: none), and returns the log and a client of the API.
func serveFlows(t *testing.T, size int, reg prometheus.Registerer) (*FlowLog, delphiv1.DelphiClient) {
	t.Helper()
	return serveFlowsLimited(t, size, reg, 0)
}

// serveFlowsLimited is serveFlows with a limit of streams (0: the default), the API's
// metrics registered with reg too.
func serveFlowsLimited(t *testing.T, size int, reg prometheus.Registerer, streams int) (*FlowLog, delphiv1.DelphiClient) {
	t.Helper()
	log, err := NewFlowLog(size, reg)
	if err != nil {
		t.Fatal(err)
	}
	store, err := delphi.Open(delphi.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	opts := InspectorOptions{Store: store, Flows: log}
	if streams > 0 {
		opts.FlowStreams, opts.Registerer = streams, reg
	}
	return log, serveInspector(t, opts)
}

// TestFlowsFilters fills a flow log by hand and reads it through the local API with
// each filter: endpoint names, local or peer, as the source or destination (as the
// direction says), addresses, verdict, policy, since and limit; and checks the metrics.
func TestFlowsFilters(t *testing.T) {
	reg := prometheus.NewRegistry()
	log, api := serveFlows(t, 100, reg)
	old, now := time.Now().Add(-time.Hour), time.Now()
	log.Add([]*delphiv1.Flow{
		testFlow(old, "web", "egress", "10.0.0.1", "10.0.0.2", 0, false),
		testFlow(now, "web", "egress", "10.0.0.1", "10.0.0.3", 1, false),
		testFlow(now, "db", "ingress", "10.0.0.1", "10.0.0.2", 2, true),
		testFlow(now, "db", "ingress", "10.0.0.9", "10.0.0.2", 3, false),
		peerFlow(testFlow(now, "db", "ingress", "10.0.0.5", "10.0.0.2", 4, false), "web"),
	}, 5)
	for _, c := range []struct {
		req  *delphiv1.FlowsRequest
		want string
	}{
		{&delphiv1.FlowsRequest{}, "[0 1 2 3 4]"},
		{&delphiv1.FlowsRequest{From: "web"}, "[0 1 4]"},
		{&delphiv1.FlowsRequest{From: "ns1/web"}, "[0 1 4]"},
		{&delphiv1.FlowsRequest{From: "t1/ns2/web"}, "[]"},
		{&delphiv1.FlowsRequest{To: "db"}, "[2 3 4]"},
		{&delphiv1.FlowsRequest{From: "10.0.0.1", To: "10.0.0.2"}, "[0 2]"},
		{&delphiv1.FlowsRequest{Verdict: "denied"}, "[2]"},
		{&delphiv1.FlowsRequest{Policy: "t1/ns1/web"}, "[2]"},
		{&delphiv1.FlowsRequest{Since: durationpb.New(time.Minute)}, "[1 2 3 4]"},
		{&delphiv1.FlowsRequest{Limit: 2}, "[3 4]"},
	} {
		resps, err := recent(t, api, c.req)
		if err != nil {
			t.Fatalf("Flows %v: %v", c.req, err)
		}
		ports, lost, lostAgent := flowsOf(resps)
		if got := fmt.Sprint(ports); got != c.want || lost != 5 || lostAgent != 0 {
			t.Errorf("Flows %v: records %s, lost %d and %d; want %s, 5 and 0", c.req, got, lost, lostAgent, c.want)
		}
	}
	// Bad input names the field and the value.
	for _, req := range []*delphiv1.FlowsRequest{
		{Verdict: "maybe"}, {From: "a/b/c/d"}, {To: "ns/"}, {Policy: "10.0.0.1"}, {Since: durationpb.New(-time.Second)},
	} {
		_, err := recent(t, api, req)
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("Flows %v: %v, want InvalidArgument", req, err)
		}
	}
	values := telemetrytest.Values(t, reg)
	for series, want := range map[string]float64{
		`naples_agent_flows_total{event="started",verdict="allowed"}`: 4,
		`naples_agent_flows_total{event="denied",verdict="denied"}`:   1,
		"naples_agent_flow_records_lost_total":                        5,
		"naples_agent_flow_log_records":                               5,
	} {
		if values[series] != want {
			t.Errorf("%s = %v, want %v", series, values[series], want)
		}
	}
}

// TestFlowsFollow follows the flows of a log of 8 records: the follower gets the recent
// ones, then each new one as it comes; when more come at once than the log keeps, those
// it let go of before the follower read them are counted, not skipped silently.
func TestFlowsFollow(t *testing.T) {
	log, api := serveFlows(t, 8, nil)
	now := time.Now()
	batch := func(from, n int) []*delphiv1.Flow {
		var out []*delphiv1.Flow
		for i := range n {
			out = append(out, testFlow(now, "web", "egress", "10.0.0.1", "10.0.0.2", from+i, false))
		}
		return out
	}
	log.Add(batch(0, 2), 0)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	stream, err := api.Flows(ctx, &delphiv1.FlowsRequest{Follow: true})
	if err != nil {
		t.Fatal(err)
	}
	var got []*delphiv1.FlowsResponse
	next := func(want string) {
		t.Helper()
		var ports []uint32
		for len(ports) < strings.Count(want, " ")+1 {
			r, err := stream.Recv()
			if err != nil {
				t.Fatalf("following: %v", err)
			}
			got = append(got, r)
			p, _, _ := flowsOf([]*delphiv1.FlowsResponse{r})
			ports = append(ports, p...)
		}
		if s := fmt.Sprint(ports); s != want {
			t.Fatalf("followed %s, want %s", s, want)
		}
	}
	next("[0 1]")
	log.Add(batch(2, 1), 0)
	next("[2]")
	// Twenty at once: the log keeps the last 8, and the follower, which read up to 2, is
	// told the 12 before those were let go of.
	log.Add(batch(3, 20), 3)
	next("[15 16 17 18 19 20 21 22]")
	if _, lost, lostAgent := flowsOf(got); lost != 3 || lostAgent != 12 {
		t.Errorf("lost %d by the datapath and %d by the agent, want 3 and 12", lost, lostAgent)
	}
}

// TestFlowsStreamsLimit serves Flows with a limit of two streams: a third is refused with
// ResourceExhausted naming the flag, and counted; once one ends, another is served.
func TestFlowsStreamsLimit(t *testing.T) {
	reg := prometheus.NewRegistry()
	log, api := serveFlowsLimited(t, 8, reg, 2)
	log.Add([]*delphiv1.Flow{testFlow(time.Now(), "web", "egress", "10.0.0.1", "10.0.0.2", 1, false)}, 0)
	follow := func(ctx context.Context) (delphiv1.Delphi_FlowsClient, error) {
		stream, err := api.Flows(ctx, &delphiv1.FlowsRequest{Follow: true})
		if err != nil {
			return nil, err
		}
		_, err = stream.Recv() // the recent records, or the refusal
		return stream, err
	}
	ctx1, end1 := context.WithCancel(t.Context())
	defer end1()
	for _, ctx := range []context.Context{ctx1, t.Context()} {
		if _, err := follow(ctx); err != nil {
			t.Fatalf("a stream within the limit: %v", err)
		}
	}
	_, err := follow(t.Context())
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "--local-api-flow-streams") {
		t.Fatalf("a third stream: %v, want ResourceExhausted naming --local-api-flow-streams", err)
	}
	values := telemetrytest.Values(t, reg)
	if got := values["naples_agent_local_api_flow_streams_refused_total"]; got != 1 {
		t.Errorf("streams refused: %v, want 1", got)
	}
	if got := values["naples_agent_local_api_flow_streams"]; got != 2 {
		t.Errorf("streams served: %v, want 2", got)
	}
	end1()
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := follow(t.Context())
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a stream after one ended: %v", err)
		}
		time.Sleep(10 * time.Millisecond) // the server sees the end a moment after the client
	}
}
