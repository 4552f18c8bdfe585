package cli

import (
	"context"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/naplesnet/naples/agent"
	"github.com/naplesnet/naples/delphi"
	"github.com/naplesnet/naples/internal/exitstatus"
	"github.com/naplesnet/naples/nimbusclient"
	delphiv1 "github.com/naplesnet/naples/proto/delphi/v1"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// serveFlowsAgent serves the agent's local API with log as its flow records on a unix
// socket in e's directory until the test ends, and points NAPLES_AGENT at it.
func serveFlowsAgent(t *testing.T, e *env, log *agent.FlowLog) {
	t.Helper()
	store, err := delphi.Open(delphi.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	insp, err := agent.NewInspector(agent.InspectorOptions{Store: store, Flows: log})
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(e.dir, "agent.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- insp.Serve(ctx, lis) }()
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	e.vars[AgentEnv] = sock
}

// TestFlowsCommand prints an agent's flow records as a table (the local endpoint and the
// peer named) and as JSON lines, says on
// standard error how many were lost, and refuses a bad filter naming it.
func TestFlowsCommand(t *testing.T) {
	e := newEnv(t)
	log, err := agent.NewFlowLog(16, nil)
	if err != nil {
		t.Fatal(err)
	}
	serveFlowsAgent(t, e, log)
	at := time.Date(2026, 11, 28, 10, 18, 41, 203551000, time.UTC)
	db := &nimbusv1.ObjectKey{Kind: nimbusv1.Kind_KIND_ENDPOINT, Tenant: "default", Namespace: "default", Name: "db"}
	policy := &nimbusv1.ObjectKey{Kind: nimbusv1.Kind_KIND_NETWORK_SECURITY_POLICY, Tenant: "default", Namespace: "default", Name: "servers"}
	log.Add([]*delphiv1.Flow{
		{Time: timestamppb.New(at), Event: delphiv1.FlowEvent_FLOW_EVENT_STARTED, Verdict: "allowed", Node: "host-b", Endpoint: db,
			Direction: "ingress", Protocol: "tcp", Source: "10.1.0.11", SourcePort: 41234, Destination: "10.1.0.32", DestinationPort: 7,
			Rule: 21, Policy: policy, RuleName: "NetworkSecurityPolicy/default/default/servers ingress[0]", Bytes: 74,
			InitiatorPackets: 1, InitiatorBytes: 60,
			PeerEndpoint: &nimbusv1.ObjectKey{Kind: nimbusv1.Kind_KIND_ENDPOINT, Tenant: "default", Namespace: "default", Name: "web"}},
		{Time: timestamppb.New(at.Add(time.Millisecond)), Event: delphiv1.FlowEvent_FLOW_EVENT_DENIED, Verdict: "denied", Reason: "spoofed",
			Node: "host-b", Endpoint: db, Direction: "egress", Bytes: 60},
	}, 2)
	local := func(d time.Duration) string { return at.Add(d).Local().Format("15:04:05.000000") }
	out, stderr, err := e.run("", "flows")
	if err != nil {
		t.Fatal(err)
	}
	equal(t, "flows", out, `TIME             NODE    VERDICT  EVENT    REASON   DIR      ENDPOINT            PEER                 PROTO  SOURCE           DESTINATION  RULE                                                      PACKETS  BYTES
`+local(0)+`  host-b  allowed  started  -        ingress  default/default/db  default/default/web  tcp    10.1.0.11:41234  10.1.0.32:7  NetworkSecurityPolicy/default/default/servers ingress[0]  1/0      60/0
`+local(time.Millisecond)+`  host-b  denied   denied   spoofed  egress   default/default/db  -                    -      -                -            -                                                         1        60
`)
	if !strings.Contains(stderr, "lost 2 flow records") {
		t.Errorf("flows said on standard error %q, want the 2 records lost", stderr)
	}
	out, _, err = e.run("", "flows", "--verdict", "denied", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	if lines := strings.Split(strings.TrimSpace(out), "\n"); len(lines) != 1 || !strings.Contains(lines[0], `"reason":"spoofed"`) {
		t.Errorf("flows --verdict denied -o json printed %q, want the spoofed record's line", out)
	}
	// 64-bit integers are JSON numbers, as in get -o json.
	out, _, err = e.run("", "flows", "--verdict", "allowed", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, `"rule":21,`) || !strings.Contains(out, `"initiatorPackets":1,`) || !strings.Contains(out, `"initiatorBytes":60`) {
		t.Errorf("flows --verdict allowed -o json printed %q, want the rule and counts as numbers", out)
	}
	for _, args := range [][]string{{"--verdict", "maybe"}, {"--since", "-1s"}, {"-o", "yaml"}} {
		_, _, err := e.run("", append([]string{"flows"}, args...)...)
		if err == nil || !strings.Contains(err.Error(), strings.TrimPrefix(args[0], "--")) {
			t.Errorf("flows %v: %v, want an error naming %s", args, err, args[0])
		}
	}
}

// tapAgent runs a nimbus client for the node against e's nimbus, with a flow tap served
// from log (nil: none, and every subscription is refused), as the agent does, until the
// test ends; it waits until nimbus has the tap.
// The tap's metrics go to tapReg.
func tapAgent(t *testing.T, e *batchEnv, node string, log *agent.FlowLog, tapReg *prometheus.Registry) {
	t.Helper()
	store, err := delphi.Open(delphi.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	tap, err := agent.NewFlowTap(agent.FlowTapOptions{Log: log, Registerer: tapReg})
	if err != nil {
		t.Fatal(err)
	}
	client, err := nimbusclient.New(nimbusclient.Options{Node: node, Address: e.server, Store: store, FlowTap: tap, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	// The taps nimbus has before this one, read before it may connect.
	taps := gauge(t, e.reg, "naples_nimbus_flow_taps")
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- client.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-ran; err != nil {
			t.Errorf("nimbus client of %s: %v", node, err)
		}
		client.Close()
	})
	deadline := time.Now().Add(30 * time.Second)
	for gauge(t, e.reg, "naples_nimbus_flow_taps") <= taps {
		if time.Now().After(deadline) {
			t.Fatalf("nimbus has no flow tap of %s after 30s", node)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// gauge returns the value of the registry's metric of that name without labels, summed
// over its series; 0 when it has none.
func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatalf("gathering metrics: %v", err)
	}
	var v float64
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			v += m.GetGauge().GetValue() + m.GetCounter().GetValue()
		}
	}
	return v
}

// TestFlowsThroughNimbus runs naplesctl flows without --agent: nimbus relays the records
// of a node's agent, filtered at the agent, with a NODE column, and says which nodes
// asked for are not connected; --node with --agent is refused.
func TestFlowsThroughNimbus(t *testing.T) {
	e := newBatchEnv(t)
	log, err := agent.NewFlowLog(16, nil)
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 11, 28, 10, 18, 41, 0, time.UTC)
	log.Add([]*delphiv1.Flow{
		{Time: timestamppb.New(at), Event: delphiv1.FlowEvent_FLOW_EVENT_STARTED, Verdict: "allowed", Node: "host-a",
			Direction: "egress", Protocol: "tcp", Source: "10.1.0.11", SourcePort: 41234, Destination: "10.1.0.32", DestinationPort: 7, Bytes: 74},
		{Time: timestamppb.New(at.Add(time.Millisecond)), Event: delphiv1.FlowEvent_FLOW_EVENT_DENIED, Verdict: "denied", Reason: "policy", Node: "host-a",
			Direction: "egress", Protocol: "udp", Source: "10.1.0.11", SourcePort: 5353, Destination: "10.1.0.40", DestinationPort: 53, Bytes: 60},
	}, 0)
	tapReg := prometheus.NewRegistry()
	tapAgent(t, e, "host-a", log, tapReg)

	out, stderr, err := e.run("", "flows", "--verdict", "denied")
	if err != nil {
		t.Fatalf("flows: %v\n%s", err, stderr)
	}
	local := at.Add(time.Millisecond).Local().Format("15:04:05.000000")
	equal(t, "flows through nimbus", out, `TIME             NODE    VERDICT  EVENT   REASON  DIR     ENDPOINT  PEER  PROTO  SOURCE          DESTINATION   RULE  PACKETS  BYTES
`+local+`  host-a  denied   denied  policy  egress  -         -     udp    10.1.0.11:5353  10.1.0.40:53  -     1        60
`)
	// Filtered at the agent: the allowed record never left it.
	if sent := gauge(t, tapReg, "naples_agent_flow_tap_records_sent_total"); sent != 1 {
		t.Errorf("the agent sent %v records on its tap, want the 1 that matched", sent)
	}

	out, stderr, err = e.run("", "flows", "--node", "host-a", "--node", "host-b", "-o", "json")
	if err != nil {
		t.Fatalf("flows --node: %v\n%s", err, stderr)
	}
	if lines := strings.Split(strings.TrimSpace(out), "\n"); len(lines) != 2 || !strings.Contains(lines[0], `"node":"host-a"`) {
		t.Errorf("flows --node host-a --node host-b -o json printed %q, want host-a's 2 records", out)
	}
	if !strings.Contains(stderr, "no flows from host-b: not connected") {
		t.Errorf("flows said on standard error %q, want host-b not connected", stderr)
	}
	out, _, err = e.run("", "flows", "--node", "host-b")
	if err != nil || strings.Count(out, "\n") != 1 {
		t.Errorf("flows --node host-b: %v, printed %q; want the header alone", err, out)
	}
	// A filter that names nothing is refused at once, naming it: by naplesctl, before
	// nimbus (which refuses it too, naming filter.from: TestFlowsObserverLimit).
	if _, _, err := e.run("", "flows", "-f", "--from", "a/b/c/d"); exitstatus.Of(err) != exitstatus.Config || !strings.Contains(err.Error(), `--from "a/b/c/d": want an address or an endpoint's name`) {
		t.Errorf("flows -f --from a/b/c/d: %v, want a usage error naming --from", err)
	}
	// A node whose agent refuses the subscription fails the command, naming the node.
	tapAgent(t, e, "host-c", nil, prometheus.NewRegistry())
	_, stderr, err = e.run("", "flows", "--node", "host-c")
	if err == nil || exitstatus.Of(err) != exitstatus.Failure || !strings.Contains(err.Error(), "no flows from host-c: ") ||
		!strings.Contains(stderr, "node host-c: ") {
		t.Errorf("flows --node host-c, whose agent keeps no flows: %v (exit status %d), said %q; want it failed naming host-c", err, exitstatus.Of(err), stderr)
	}

	e.vars[AgentEnv] = filepath.Join(e.dir, "agent.sock")
	if _, _, err := e.run("", "flows", "--node", "host-a"); err == nil || !strings.Contains(err.Error(), "--node host-a") {
		t.Errorf("flows --node with an agent: %v, want an error naming --node", err)
	}
}

// TestFlowsFilterUsageErrors: a filter neither the agent nor nimbus would take is a usage
// error (exit status 2) naming the flag, through either, before asking.
func TestFlowsFilterUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--verdict", "maybe"}, `--verdict "maybe"`},
		{[]string{"--from", "a/b/c/d"}, `--from "a/b/c/d"`},
		{[]string{"--to", "ns/"}, `--to "ns/"`},
		{[]string{"--policy", "10.0.0.1"}, `--policy "10.0.0.1"`},
	} {
		for _, via := range [][]string{nil, {"--agent", "unix:///nonexistent/agent.sock"}} {
			args := append(append([]string{"flows"}, tc.args...), via...)
			_, _, err := runWithoutNimbus(args...)
			if exitstatus.Of(err) != exitstatus.Config || err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("naplesctl %s = %v (exit status %d), want a usage error naming %s", strings.Join(args, " "), err, exitstatus.Of(err), tc.want)
			}
		}
	}
}
