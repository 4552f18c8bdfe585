package cli

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/naplesnet/naples/agent"
	"github.com/naplesnet/naples/delphi"
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
	for _, args := range [][]string{{"--verdict", "maybe"}, {"--since", "-1s"}, {"-o", "yaml"}} {
		_, _, err := e.run("", append([]string{"flows"}, args...)...)
		if err == nil || !strings.Contains(err.Error(), strings.TrimPrefix(args[0], "--")) {
			t.Errorf("flows %v: %v, want an error naming %s", args, err, args[0])
		}
	}
}
