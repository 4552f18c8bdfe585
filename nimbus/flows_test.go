package nimbus

import (
	"context"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/proto"

	"github.com/naplesnet/naples/internal/pki"
	delphiv1 "github.com/naplesnet/naples/proto/delphi/v1"
	flowsv1 "github.com/naplesnet/naples/proto/nimbus/flows/v1"
)

// dialFlows connects a Flows client to the socket; the test's cleanup closes it.
func dialFlows(t *testing.T, path string, opts ...grpc.DialOption) flowsv1.FlowsClient {
	t.Helper()
	return flowsv1.NewFlowsClient(dialConn(t, path, opts...))
}

// testTap is a flow tap opened the way an agent opens it, driven by the test.
type testTap struct {
	stream grpc.BidiStreamingClient[flowsv1.FlowTapUp, flowsv1.FlowTapDown]
	node   string
}

// openTap opens a tap of the node on the client and waits until nimbus took it.
func openTap(t *testing.T, client flowsv1.FlowsClient, node string) *testTap {
	t.Helper()
	stream, err := client.FlowTap(testContext(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&flowsv1.FlowTapUp{Node: node}); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Header(); err != nil {
		t.Fatalf("flow tap of %s: %v", node, err)
	}
	return &testTap{stream: stream, node: node}
}

// subscription receives the next message nimbus sends the tap, failing unless it is a
// subscription; it returns the subscription.
func (tt *testTap) subscription(t *testing.T) *flowsv1.FlowTapDown {
	t.Helper()
	down, err := tt.stream.Recv()
	if err != nil {
		t.Fatalf("tap of %s: %v", tt.node, err)
	}
	if down.GetCancel() {
		t.Fatalf("tap of %s: got %v, want a subscription", tt.node, down)
	}
	return down
}

// send sends records of the subscription, each numbered from first, with the counts.
func (tt *testTap) send(t *testing.T, sub uint64, first, n int, lostAgent uint64) {
	t.Helper()
	var flows []*delphiv1.Flow
	for i := range n {
		flows = append(flows, &delphiv1.Flow{Node: tt.node, Verdict: "allowed", SourcePort: uint32(first + i)})
	}
	if err := tt.stream.Send(&flowsv1.FlowTapUp{Subscription: sub, Flows: flows, LostDatapath: 7, Suppressed: 5, LostAgent: lostAgent}); err != nil {
		t.Fatal(err)
	}
}

// observed is what an observer received.
type observed struct {
	flows        []*delphiv1.Flow
	nodes        map[string]*flowsv1.NodeFlows
	notConnected []string
}

// receiveUntil receives from the observer until cond holds of what it received.
func receiveUntil(t *testing.T, stream grpc.ServerStreamingClient[flowsv1.ObserveFlowsResponse], got *observed, what string, cond func(*observed) bool) {
	t.Helper()
	if got.nodes == nil {
		got.nodes = map[string]*flowsv1.NodeFlows{}
	}
	for !cond(got) {
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("waiting for %s: %v (received %d flows, nodes %v, not connected %v)", what, err, len(got.flows), got.nodes, got.notConnected)
		}
		got.flows = append(got.flows, resp.GetFlows()...)
		for _, n := range resp.GetNodes() {
			got.nodes[n.GetNode()] = n
		}
		got.notConnected = resp.GetNotConnected()
	}
}

// TestFlowsRelay shows an observer receiving the records of the nodes it asks for from
// their taps, with the filter sent to the agents, the nodes not connected, the losses,
// and its subscriptions cancelled when it goes.
func TestFlowsRelay(t *testing.T) {
	ts := start(t, Options{})
	client := dialFlows(t, ts.path)
	ctx := testContext(t)
	other := openTap(t, client, "n3")

	filter := &delphiv1.FlowsRequest{Follow: true, Verdict: "denied", From: "web"}
	obs, err := client.ObserveFlows(ctx, &flowsv1.ObserveFlowsRequest{Filter: filter, Nodes: []string{"n1", "n2"}})
	if err != nil {
		t.Fatal(err)
	}
	var got observed
	receiveUntil(t, obs, &got, "both nodes not connected", func(o *observed) bool { return slices.Equal(o.notConnected, []string{"n1", "n2"}) })

	n1 := openTap(t, client, "n1")
	sub := n1.subscription(t)
	if !proto.Equal(sub.GetFilter(), filter) {
		t.Errorf("subscription's filter = %v, want %v", sub.GetFilter(), filter)
	}
	receiveUntil(t, obs, &got, "n2 alone not connected", func(o *observed) bool { return slices.Equal(o.notConnected, []string{"n2"}) })
	n1.send(t, sub.GetSubscription(), 0, 10, 3)
	receiveUntil(t, obs, &got, "10 flows", func(o *observed) bool { return len(o.flows) >= 10 && o.nodes["n1"] != nil })
	for i, f := range got.flows {
		if f.GetNode() != "n1" || f.GetSourcePort() != uint32(i) {
			t.Errorf("flow %d = node %q port %d, want n1 %d", i, f.GetNode(), f.GetSourcePort(), i)
		}
	}
	if n := got.nodes["n1"]; n.GetLostDatapath() != 7 || n.GetSuppressed() != 5 || n.GetLostAgent() != 3 || n.GetLostNimbus() != 0 {
		t.Errorf("n1's losses = %v, want datapath 7, suppressed 5, agent 3, nimbus 0", n)
	}
	// lost_agent is cumulative per subscription: 5 after 3 is 2 more.
	n1.send(t, sub.GetSubscription(), 10, 1, 5)
	receiveUntil(t, obs, &got, "lost_agent 5", func(o *observed) bool { return o.nodes["n1"].GetLostAgent() == 5 })

	// A second observer, of every node; when it goes (its context ends), its
	// subscriptions are cancelled.
	ctx2, cancel := context.WithCancel(ctx)
	defer cancel()
	obs2, err := client.ObserveFlows(ctx2, &flowsv1.ObserveFlowsRequest{Filter: &delphiv1.FlowsRequest{Follow: true}})
	if err != nil {
		t.Fatal(err)
	}
	var got2 observed
	receiveUntil(t, obs2, &got2, "the first response", func(o *observed) bool { return o.nodes != nil })
	// The observer of every node subscribes every tap, the one of n3 too.
	sub2 := n1.subscription(t)
	if s := other.subscription(t); s.GetSubscription() != sub2.GetSubscription() {
		t.Errorf("n3's subscription %d, want %d as n1's", s.GetSubscription(), sub2.GetSubscription())
	}
	cancel()
	down, err := n1.stream.Recv()
	if err != nil || !down.GetCancel() || down.GetSubscription() != sub2.GetSubscription() {
		t.Errorf("after the observer went, n1 received %v, %v; want the cancel of %d", down, err, sub2.GetSubscription())
	}
	if v := metricValues(t, ts.srv.Registry())["naples_nimbus_flow_taps"]; v != 2 {
		t.Errorf("naples_nimbus_flow_taps = %v, want 2", v)
	}
}

// TestFlowsNotFollowing shows an observer that does not follow ending once every tap
// said its recent records were sent.
func TestFlowsNotFollowing(t *testing.T) {
	ts := start(t, Options{})
	client := dialFlows(t, ts.path)
	n1 := openTap(t, client, "n1")
	obs, err := client.ObserveFlows(testContext(t), &flowsv1.ObserveFlowsRequest{Filter: &delphiv1.FlowsRequest{}})
	if err != nil {
		t.Fatal(err)
	}
	sub := n1.subscription(t)
	if err := n1.stream.Send(&flowsv1.FlowTapUp{Subscription: sub.GetSubscription(), Flows: []*delphiv1.Flow{{Node: "n1"}}, Done: true}); err != nil {
		t.Fatal(err)
	}
	var got observed
	receiveUntil(t, obs, &got, "a flow", func(o *observed) bool { return len(o.flows) == 1 })
	if _, err := obs.Recv(); err == nil {
		t.Fatal("the observer's stream goes on after every tap was done")
	} else if err.Error() != "EOF" {
		t.Fatalf("the observer's stream ended with %v, want EOF", err)
	}
}

// TestFlowsObserverBuffer shows a slow observer losing the records beyond its buffer,
// counted per node as lost_nimbus.
func TestFlowsObserverBuffer(t *testing.T) {
	ts := start(t, Options{Limits: Limits{FlowObserverBuffer: 4}})
	o := &flowObserver{buffer: ts.srv.opts.Limits.FlowObserverBuffer, dropped: ts.srv.flows.metrics.dropped, wake: make(chan struct{}, 1),
		states: map[string]*flowsv1.NodeFlows{}, changed: map[string]bool{}, local: map[string]bool{}}
	var flows []*delphiv1.Flow
	for range 10 {
		flows = append(flows, &delphiv1.Flow{Node: "n1"})
	}
	o.add(flows, nodeDelta{node: "n1"}, "")
	got, nodes, more := o.take()
	if len(got) != 4 || more {
		t.Errorf("took %d flows (more %v), want the buffer's 4", len(got), more)
	}
	if len(nodes) != 1 || nodes[0].GetLostNimbus() != 6 {
		t.Errorf("nodes = %v, want n1 with lost_nimbus 6", nodes)
	}
	if v := metricValues(t, ts.srv.Registry())["naples_nimbus_flow_records_dropped_total"]; v != 6 {
		t.Errorf("naples_nimbus_flow_records_dropped_total = %v, want 6", v)
	}
}

// TestFlowsObserverLimit shows observers beyond Limits.FlowObservers refused, and bad
// requests refused naming the field.
func TestFlowsObserverLimit(t *testing.T) {
	ts := start(t, Options{Limits: Limits{FlowObservers: 1}})
	client := dialFlows(t, ts.path)
	ctx := testContext(t)
	first, err := client.ObserveFlows(ctx, &flowsv1.ObserveFlowsRequest{Filter: &delphiv1.FlowsRequest{Follow: true}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := first.Recv(); err != nil {
		t.Fatal(err)
	}
	second, err := client.ObserveFlows(ctx, &flowsv1.ObserveFlowsRequest{Filter: &delphiv1.FlowsRequest{Follow: true}})
	if err == nil {
		_, err = second.Recv()
	}
	wantCode(t, err, codes.ResourceExhausted)
	for _, tc := range []struct {
		req  *flowsv1.ObserveFlowsRequest
		want string
	}{
		{&flowsv1.ObserveFlowsRequest{Filter: &delphiv1.FlowsRequest{Verdict: "maybe"}}, `filter.verdict "maybe"`},
		{&flowsv1.ObserveFlowsRequest{Nodes: []string{"Bad Node"}}, `nodes: "Bad Node"`},
		{&flowsv1.ObserveFlowsRequest{Filter: &delphiv1.FlowsRequest{Follow: true, From: "a/b/c/d"}}, `filter.from "a/b/c/d"`},
		{&flowsv1.ObserveFlowsRequest{Filter: &delphiv1.FlowsRequest{To: "default/"}}, `filter.to "default/": the endpoint's name is empty`},
		{&flowsv1.ObserveFlowsRequest{Filter: &delphiv1.FlowsRequest{Policy: "10.0.0.1"}}, `filter.policy "10.0.0.1"`},
	} {
		s, err := client.ObserveFlows(ctx, tc.req)
		if err == nil {
			_, err = s.Recv()
		}
		st := wantCode(t, err, codes.InvalidArgument)
		if !strings.Contains(st.Message(), tc.want) {
			t.Errorf("refusal %q does not name %s", st.Message(), tc.want)
		}
	}
}

// TestFlowsAuth shows that a node may tap only as itself and may not observe, that a
// publisher may observe but not ask for local_only, and that a replica may only.
func TestFlowsAuth(t *testing.T) {
	ts, p := startTLS(t)
	as := func(kp pki.KeyPair, err error) flowsv1.FlowsClient {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return dialFlows(t, ts.path, grpc.WithTransportCredentials(credentials.NewTLS(p.clientTLS(kp))))
	}
	node := as(p.ca.IssueNode("n1", pki.CertOptions{}))
	publisher := as(p.ca.IssuePublisher("admin", pki.CertOptions{}))
	replica := as(p.ca.IssueReplica("a", nil, pki.CertOptions{}))
	ctx := testContext(t)
	observe := func(c flowsv1.FlowsClient, localOnly bool) error {
		s, err := c.ObserveFlows(ctx, &flowsv1.ObserveFlowsRequest{LocalOnly: localOnly})
		if err != nil {
			return err
		}
		_, err = s.Recv()
		return err
	}
	wantDenied(t, observe(node, false), `node "n1" may not observe flows`)
	wantDenied(t, observe(publisher, true), "may not set local_only")
	wantDenied(t, observe(replica, false), "local_only only")
	for _, c := range []flowsv1.FlowsClient{publisher, replica} {
		if err := observe(c, c == replica); err != nil {
			t.Errorf("observe: %v", err)
		}
	}

	tap := func(c flowsv1.FlowsClient, as string) error {
		s, err := c.FlowTap(ctx)
		if err != nil {
			return err
		}
		if err := s.Send(&flowsv1.FlowTapUp{Node: as}); err != nil {
			_, err = s.Recv()
			return err
		}
		_, err = s.Recv()
		return err
	}
	wantDenied(t, tap(node, "n2"), `node "n1" may not tap the flows of node "n2"`)
	wantDenied(t, tap(publisher, "n1"), "a node certificate is required")
	openTap(t, node, "n1")
}

// TestFlowsThroughReplicas shows an observer at one replica receiving the records of an
// agent tapping another, and which nodes are connected nowhere.
func TestFlowsThroughReplicas(t *testing.T) {
	rs := startPeers(t, Options{}, "a", "b")
	a, b := dialFlows(t, rs[0].path), dialFlows(t, rs[1].path)
	ctx := testContext(t)
	obs, err := a.ObserveFlows(ctx, &flowsv1.ObserveFlowsRequest{Filter: &delphiv1.FlowsRequest{Follow: true}, Nodes: []string{"n1", "n2"}})
	if err != nil {
		t.Fatal(err)
	}
	var got observed
	receiveUntil(t, obs, &got, "the first response", func(o *observed) bool { return o.nodes != nil })
	n1 := openTap(t, b, "n1")
	sub := n1.subscription(t)
	receiveUntil(t, obs, &got, "n2 alone not connected", func(o *observed) bool { return slices.Equal(o.notConnected, []string{"n2"}) })
	n1.send(t, sub.GetSubscription(), 0, 3, 2)
	receiveUntil(t, obs, &got, "3 flows of n1 through b", func(o *observed) bool { return len(o.flows) >= 3 && o.nodes["n1"].GetLostAgent() == 2 })
	for _, f := range got.flows {
		if f.GetNode() != "n1" {
			t.Errorf("flow of node %q, want n1", f.GetNode())
		}
	}
	// n1 moves to a: its tap on b ends, one opens on a; records keep coming.
	n1.stream.CloseSend()
	n1a := openTap(t, a, "n1")
	sub = n1a.subscription(t)
	n1a.send(t, sub.GetSubscription(), 3, 2, 0)
	receiveUntil(t, obs, &got, "2 more flows of n1 through a", func(o *observed) bool { return len(o.flows) >= 5 })
	if got.flows[4].GetSourcePort() != 4 {
		t.Errorf("last flow = %v, want port 4", got.flows[4])
	}
	if v := metricValues(t, rs[1].srv.Registry())["naples_nimbus_flow_observers"]; v != 1 {
		t.Errorf("b's naples_nimbus_flow_observers = %v, want 1: a's local_only observer", v)
	}

	// An observer at b that does not follow, of n1 on a: it ends once a's stream ended,
	// with n1's records, and n1 connected to the end.
	once, err := b.ObserveFlows(ctx, &flowsv1.ObserveFlowsRequest{Filter: &delphiv1.FlowsRequest{}, Nodes: []string{"n1"}})
	if err != nil {
		t.Fatal(err)
	}
	sub = n1a.subscription(t)
	if err := n1a.stream.Send(&flowsv1.FlowTapUp{Subscription: sub.GetSubscription(), Flows: []*delphiv1.Flow{{Node: "n1"}}, Done: true}); err != nil {
		t.Fatal(err)
	}
	var recent observed
	for {
		resp, err := once.Recv()
		if err != nil {
			if err.Error() != "EOF" {
				t.Fatalf("the observer that does not follow ended with %v, want EOF", err)
			}
			break
		}
		recent.flows = append(recent.flows, resp.GetFlows()...)
		recent.notConnected = resp.GetNotConnected()
	}
	if len(recent.flows) != 1 || len(recent.notConnected) != 0 {
		t.Errorf("the observer that does not follow received %d flows, not connected %v; want n1's 1, none", len(recent.flows), recent.notConnected)
	}
}

// TestFlowTapQueueBounded shows that an observer that comes and goes before its
// subscription was sent leaves nothing queued for the agent.
func TestFlowTapQueueBounded(t *testing.T) {
	tap := &flowTap{node: "n1", wake: make(chan struct{}, 1), subs: map[uint64]uint64{}}
	for id := range uint64(100) {
		tap.enqueue(&flowsv1.FlowTapDown{Subscription: id, Filter: &delphiv1.FlowsRequest{}})
		tap.enqueue(&flowsv1.FlowTapDown{Subscription: id, Cancel: true})
	}
	tap.enqueue(&flowsv1.FlowTapDown{Subscription: 100, Filter: &delphiv1.FlowsRequest{}})
	if len(tap.pending) != 1 || len(tap.subs) != 1 {
		t.Errorf("%d messages queued and %d subscriptions after 100 observers came and went and one stayed, want 1 and 1", len(tap.pending), len(tap.subs))
	}
}
