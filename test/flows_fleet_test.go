package test

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/naplesnet/naples/internal/pki"
	"github.com/naplesnet/naples/internal/testetcd"
	"github.com/naplesnet/naples/internal/testns"
	delphiv1 "github.com/naplesnet/naples/proto/delphi/v1"
	flowsv1 "github.com/naplesnet/naples/proto/nimbus/flows/v1"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// Metrics of the agent's flow tap the tests read.
const (
	tapSubscriptions = "naples_agent_flow_tap_subscriptions"
	tapSent          = "naples_agent_flow_tap_records_sent_total"
)

// flowsAPI returns the Flows API of the nimbus at addr, as the publisher.
func (c *cluster) flowsAPI(t testing.TB, addr string) flowsv1.FlowsClient {
	t.Helper()
	tlsConfig, err := pki.ClientConfig(c.file("publisher.crt"), c.file("publisher.key"), c.file("ca.crt"), pki.DefaultServerName)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(pki.TransportCredentials(tlsConfig)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return flowsv1.NewFlowsClient(conn)
}

// fleetObserver is an ObserveFlows stream whose responses a goroutine collects.
type fleetObserver struct {
	cancel context.CancelFunc
	done   chan struct{}

	// mu guards flows, nodes, notConnected and err.
	mu           sync.Mutex
	flows        []*delphiv1.Flow
	nodes        map[string]*flowsv1.NodeFlows
	notConnected []string
	responses    int
	err          error
}

// observeFlows opens an ObserveFlows stream; it ends when the test does or with stop.
func observeFlows(t testing.TB, api flowsv1.FlowsClient, req *flowsv1.ObserveFlowsRequest) *fleetObserver {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := api.ObserveFlows(ctx, req)
	if err != nil {
		cancel()
		t.Fatalf("ObserveFlows: %v", err)
	}
	o := &fleetObserver{cancel: cancel, done: make(chan struct{}), nodes: map[string]*flowsv1.NodeFlows{}}
	go func() {
		defer close(o.done)
		for {
			resp, err := stream.Recv()
			o.mu.Lock()
			if err != nil {
				o.err = err
				o.mu.Unlock()
				return
			}
			o.responses++
			o.flows = append(o.flows, resp.GetFlows()...)
			for _, n := range resp.GetNodes() {
				o.nodes[n.GetNode()] = n
			}
			o.notConnected = resp.GetNotConnected()
			o.mu.Unlock()
		}
	}()
	t.Cleanup(o.stop)
	o.wait(t, "the observer's first response", func(*fleetObserver) bool { return o.responses > 0 })
	return o
}

// stop ends the stream and waits for the collector; safe to call twice.
func (o *fleetObserver) stop() {
	o.cancel()
	<-o.done
}

// wait waits until cond holds of what the observer received, with o.mu held.
func (o *fleetObserver) wait(t testing.TB, what string, cond func(*fleetObserver) bool) {
	t.Helper()
	waitFor(t, what, func() bool {
		o.mu.Lock()
		defer o.mu.Unlock()
		if o.err != nil {
			t.Fatalf("waiting for %s: the observer's stream ended: %v", what, o.err)
		}
		return cond(o)
	})
}

// of returns the records received of connections from the source port, as flowText
// describes them.
func (o *fleetObserver) of(port uint32) []string {
	var out []string
	for _, f := range o.flows {
		if f.GetSourcePort() == port && f.GetProtocol() == "tcp" {
			out = append(out, flowText(f))
		}
	}
	return out
}

// fleetConnect makes a TCP connection from one workload to the other's echo on port 7,
// one exchange and a close, and returns its source port.
func fleetConnect(t testing.TB, from, to *fwWorkload) uint32 {
	t.Helper()
	conn := from.dial(t, "tcp", netip.AddrPortFrom(to.addr(4), 7))
	if err := conn.exchange(fwFlowWait); err != nil {
		t.Fatalf("%s: %v", conn.name, err)
	}
	conn.c.Close()
	return uint32(netip.MustParseAddrPort(conn.c.LocalAddr().String()).Port())
}

// flowStart names a connection by its source port and start time, which its records
// share.
type flowStart struct {
	port  uint32
	start int64
}

func startOf(f *delphiv1.Flow) flowStart {
	return flowStart{f.GetSourcePort(), f.GetStartTime().AsTime().UnixNano()}
}

// fleetWant returns the records of a connection from web1 to the server on port 7 that
// the hosts write: the egress start and end on web1's host, the ingress start and end on
// the server's.
func fleetWant(web1, server *fwWorkload, serverHost string, port uint32) []string {
	w, d := web1.addr(4).String(), server.addr(4).String()
	rule := "NetworkSecurityPolicy/default/default/servers ingress[0]"
	return []string{
		fmt.Sprintf("allowed started /egress on host-a web1, peer %s (%s:%d > %s:7) rule %q of %q, tcp", server.name, w, port, d, "", ""),
		fmt.Sprintf("allowed ended fin/egress on host-a web1, peer %s (%s:%d > %s:7) rule %q of %q, tcp", server.name, w, port, d, "", ""),
		fmt.Sprintf("allowed started /ingress on %s %s, peer web1 (%s:%d > %s:7) rule %q of %q, tcp", serverHost, server.name, w, port, d, rule, "servers"),
		fmt.Sprintf("allowed ended fin/ingress on %s %s, peer web1 (%s:%d > %s:7) rule %q of %q, tcp", serverHost, server.name, w, port, d, rule, "servers"),
	}
}

// newFleetFlowsCluster starts web1 and db1 on host-a and db2 on host-b, whose agents
// serve their metrics and take the extra flags, with a policy that lets web1 reach the
// servers on TCP port 7, on the nimbus c (a new one when nil).
func newFleetFlowsCluster(t testing.TB, c *cluster, hostFlags ...[]string) *fwSmallCluster {
	t.Helper()
	defs := fwDefs("web1", "db1", "db2")
	groups := map[string][]string{"web1": {"client"}, "db1": {"server"}, "db2": {"server"}}
	flags := [][]string{metricsFlags, metricsFlags}
	for i, f := range hostFlags {
		flags[i] = slices.Concat(metricsFlags, f)
	}
	sc := newFWSmallCluster(t, fwSmallSpec{
		workloads:  defs,
		endpoints:  fwEndpointsOf(defs, groups),
		objs:       []*nimbusv1.Object{fwGroupObject("client"), fwGroupObject("server")},
		tcp:        []uint16{7},
		udp:        []uint16{10},
		agentFlags: flags,
		cluster:    c,
	})
	sc.apply(t, fwPolicyObject("servers", []string{"server"}, fwRules(allowIn("tcp", fwPorts("7"), "group:client"), allowMulticastReports()), nil))
	sc.waitProgrammed(t)
	return sc
}

// waitTapSubscriptions waits until the host's agent serves n subscriptions on its tap.
func waitTapSubscriptions(t testing.TB, h *host, tel *telemetry, n float64) {
	t.Helper()
	waitFor(t, fmt.Sprintf("%s's agent to serve %v flow subscriptions", h.name, n), func() bool {
		return tel.metrics(t)[tapSubscriptions] == n
	})
}

// TestFleetFlows sends real traffic between workloads on two hosts and observes it
// through nimbus (nimbus.flows.v1's ObserveFlows, and naplesctl flows without --agent):
// each node's records with its node, the filters applied at the agents (a filter that
// matches nothing on host-b makes host-b send nothing), --node selecting, and an
// observer that goes on through an agent's restart.
func TestFleetFlows(t *testing.T) {
	sc := newFleetFlowsCluster(t, nil)
	api := sc.c.flowsAPI(t, sc.c.server)
	web1, db1, db2 := sc.workload("web1"), sc.workload("db1"), sc.workload("db2")
	ha, hb := sc.host("host-a"), sc.host("host-b")
	tela, telb := ha.telemetry(t), hb.telemetry(t)

	// Every node's records, each with its node.
	all := observeFlows(t, api, &flowsv1.ObserveFlowsRequest{Filter: &delphiv1.FlowsRequest{Follow: true}})
	waitTapSubscriptions(t, ha, tela, 1)
	waitTapSubscriptions(t, hb, telb, 1)
	port := fleetConnect(t, web1, db2)
	want := fleetWant(web1, db2, "host-b", port)
	var got []string
	all.wait(t, "the records of web1→db2 from both hosts", func(o *fleetObserver) bool {
		got = o.of(port)
		return len(got) >= len(want)
	})
	if !sameMultiset(got, want) {
		t.Errorf("records of web1→db2 through nimbus:\n%s\nwant, in some order:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	all.stop()
	waitTapSubscriptions(t, ha, tela, 0)
	waitTapSubscriptions(t, hb, telb, 0)

	// A filter only host-a's records match: host-b sends nothing.
	sentA, sentB := tela.metrics(t)[tapSent], telb.metrics(t)[tapSent]
	toDB1 := observeFlows(t, api, &flowsv1.ObserveFlowsRequest{Filter: &delphiv1.FlowsRequest{Follow: true, To: "db1"}, Nodes: []string{"host-a", "host-b"}})
	toDB1.wait(t, "both nodes connected", func(o *fleetObserver) bool { return len(o.notConnected) == 0 })
	waitTapSubscriptions(t, ha, tela, 1)
	waitTapSubscriptions(t, hb, telb, 1)
	// The kernel may give web1 the port of an earlier connection to db2 again, that one
	// closed: host-b's records of the earlier ones, kept by now, are told apart by the
	// port and start time they have.
	earlier := map[flowStart]bool{}
	for _, f := range sc.hostFlows(t, "host-b", "--from", "web1") {
		earlier[startOf(f)] = true
	}
	port1, port2 := fleetConnect(t, web1, db1), fleetConnect(t, web1, db2)
	isPort2 := func(f *delphiv1.Flow) bool { return f.GetSourcePort() == port2 && !earlier[startOf(f)] }
	want = fleetWant(web1, db1, "host-a", port1)
	toDB1.wait(t, "the records of web1→db1", func(o *fleetObserver) bool {
		got = o.of(port1)
		return len(got) >= len(want)
	})
	if !sameMultiset(got, want) {
		t.Errorf("records of web1→db1 through nimbus:\n%s\nwant, in some order:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	// host-b took its records of web1→db2, and sent none of them.
	waitFor(t, "host-b's agent to keep the end of web1→db2", func() bool {
		for _, f := range sc.hostFlows(t, "host-b", "--from", "web1") {
			if isPort2(f) && f.GetEvent() == delphiv1.FlowEvent_FLOW_EVENT_ENDED {
				return true
			}
		}
		return false
	})
	toDB1.mu.Lock()
	for _, f := range toDB1.flows {
		if f.GetNode() != "host-a" || f.GetDestination() != db1.addr(4).String() {
			t.Errorf("--to db1 received %s", flowText(f))
		}
	}
	toDB1.mu.Unlock()
	if a, b := tela.metrics(t)[tapSent]-sentA, telb.metrics(t)[tapSent]-sentB; a < float64(len(want)) || b != 0 {
		t.Errorf("the taps sent %v records from host-a and %v from host-b; want host-a's %d at least and none from host-b", a, b, len(want))
	}
	toDB1.stop()

	// --node selects, through naplesctl: host-b's recent records alone.
	out := sc.c.mustCtl(t, "", "flows", "--node", "host-b", "--since", "10m", "-o", "json")
	var seen int
	for line := range strings.Lines(out) {
		f := &delphiv1.Flow{}
		if err := protojson.Unmarshal([]byte(line), f); err != nil {
			t.Fatalf("naplesctl flows printed %q: %v", line, err)
		}
		if f.GetNode() != "host-b" {
			t.Errorf("flows --node host-b printed %s", flowText(f))
		}
		if isPort2(f) {
			seen++
		}
	}
	if seen != 2 {
		t.Errorf("flows --node host-b printed %d records of web1→db2, want its start and end on host-b:\n%s", seen, out)
	}

	// An observer goes on through host-a's agent's restart: the agent opens its tap again
	// and serves the subscription.
	obs := observeFlows(t, api, &flowsv1.ObserveFlowsRequest{Filter: &delphiv1.FlowsRequest{Follow: true}, Nodes: []string{"host-a"}})
	waitTapSubscriptions(t, ha, tela, 1)
	ha.agent.stop(t)
	obs.wait(t, "host-a not connected", func(o *fleetObserver) bool { return slices.Equal(o.notConnected, []string{"host-a"}) })
	ha.startAgentWith(t, metricsFlags...)
	tela = ha.telemetry(t)
	waitTapSubscriptions(t, ha, tela, 1)
	obs.wait(t, "host-a connected again", func(o *fleetObserver) bool { return len(o.notConnected) == 0 })
	port3 := fleetConnect(t, web1, db1)
	want = fleetWant(web1, db1, "host-a", port3)
	obs.wait(t, "the records of web1→db1 after host-a's agent restarted", func(o *fleetObserver) bool {
		got = o.of(port3)
		return len(got) >= len(want)
	})
	if !sameMultiset(got, want) {
		t.Errorf("records after the restart:\n%s\nwant, in some order:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestFleetFlowsThroughReplicas runs nimbus as two replicas on etcd, host-a's agent on
// one and host-b's on the other: an observer at either replica receives the records of
// both hosts, and naplesctl flows at one replica prints the other's agent's records.
func TestFleetFlowsThroughReplicas(t *testing.T) {
	testns.RequireRoot(t)
	etcd := testetcd.Start(t, 1)
	rc := newReplicaCluster(t, etcd, 2)
	// The test and naplesctl talk to r0; each host's agent to its own replica.
	c := *rc.cluster
	c.server = rc.replicas[0].addr
	sc := newFleetFlowsCluster(t, &c, []string{"--nimbus", rc.addrsOf(0)}, []string{"--nimbus", rc.addrsOf(1)})
	web1, db2 := sc.workload("web1"), sc.workload("db2")
	ha, hb := sc.host("host-a"), sc.host("host-b")
	tela, telb := ha.telemetry(t), hb.telemetry(t)

	var observers []*fleetObserver
	for i := range rc.replicas {
		observers = append(observers, observeFlows(t, rc.flowsAPI(t, rc.replicas[i].addr),
			&flowsv1.ObserveFlowsRequest{Filter: &delphiv1.FlowsRequest{Follow: true}, Nodes: []string{"host-a", "host-b"}}))
	}
	for i, o := range observers {
		o.wait(t, fmt.Sprintf("both nodes connected, through r%d", i), func(o *fleetObserver) bool { return len(o.notConnected) == 0 })
	}
	// Each agent serves one subscription per observer: its replica's own, and the other
	// replica's, through its local_only stream.
	waitTapSubscriptions(t, ha, tela, 2)
	waitTapSubscriptions(t, hb, telb, 2)
	port := fleetConnect(t, web1, db2)
	want := fleetWant(web1, db2, "host-b", port)
	for i, o := range observers {
		var got []string
		o.wait(t, fmt.Sprintf("the records of web1→db2 from both hosts through r%d", i), func(o *fleetObserver) bool {
			got = o.of(port)
			return len(got) >= len(want)
		})
		if !sameMultiset(got, want) {
			t.Errorf("records of web1→db2 through r%d:\n%s\nwant, in some order:\n%s", i, strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
	}

	// naplesctl at r0, asking for host-b, whose agent is r1's.
	out, err := rc.ctlVia(t, 0, "", "flows", "--node", "host-b", "--since", "10m", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var seen int
	for line := range strings.Lines(out) {
		f := &delphiv1.Flow{}
		if err := protojson.Unmarshal([]byte(line), f); err != nil {
			t.Fatalf("naplesctl flows printed %q: %v", line, err)
		}
		if f.GetNode() != "host-b" {
			t.Errorf("flows --node host-b at r0 printed %s", flowText(f))
		}
		if f.GetSourcePort() == port {
			seen++
		}
	}
	if seen != 2 {
		t.Errorf("flows --node host-b at r0 printed %d records of web1→db2, want its start and end on host-b:\n%s", seen, out)
	}
}
