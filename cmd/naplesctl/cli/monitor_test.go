package cli

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/naplesnet/naples/agent"
	delphiv1 "github.com/naplesnet/naples/proto/delphi/v1"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// TestMonitorDrops streams the drops of a real agent's local API: the denied records that
// come after it started, one a line with the reason, endpoint, tuple and rule, none of the
// allowed ones and none from before, the records lost on standard error; and refuses a
// --type it does not know, naming it.
func TestMonitorDrops(t *testing.T) {
	e := newEnv(t)
	log, err := agent.NewFlowLog(16, nil)
	if err != nil {
		t.Fatal(err)
	}
	serveFlowsAgent(t, e, log)
	db := &nimbusv1.ObjectKey{Kind: nimbusv1.Kind_KIND_ENDPOINT, Tenant: "default", Namespace: "default", Name: "db"}
	denied := func(at time.Time, port uint32, reason string) *delphiv1.Flow {
		return &delphiv1.Flow{Time: timestamppb.New(at), Event: delphiv1.FlowEvent_FLOW_EVENT_DENIED, Verdict: "denied", Reason: reason,
			Node: "host-b", Endpoint: db, Direction: "ingress", Protocol: "udp", Source: "10.1.0.11", SourcePort: port,
			Destination: "10.1.0.32", DestinationPort: 10, RuleName: "NetworkSecurityPolicy/default/default/servers ingress[1]", Bytes: 70}
	}
	log.Add([]*delphiv1.Flow{denied(time.Now().Add(-time.Minute), 1111, "policy")}, 0) // before: not shown

	r := e.start("monitor", "--type", "drop")
	// Stamped a minute ahead: after the monitor's start, whenever it reads them.
	now := time.Now().Add(time.Minute)
	log.Add([]*delphiv1.Flow{
		{Time: timestamppb.New(now), Event: delphiv1.FlowEvent_FLOW_EVENT_STARTED, Verdict: "allowed", Node: "host-b", Endpoint: db,
			Direction: "ingress", Protocol: "tcp", Source: "10.1.0.11", SourcePort: 2222, Destination: "10.1.0.32", DestinationPort: 7},
		denied(now, 3333, "policy"),
		{Time: timestamppb.New(now), Event: delphiv1.FlowEvent_FLOW_EVENT_DENIED, Verdict: "denied", Reason: "vlan", Node: "host-b",
			Endpoint: db, Direction: "egress", Bytes: 64},
	}, 3)
	eventually(t, "the two drops on standard output", func() bool { return strings.Count(r.stdout.String(), "\n") >= 2 })
	r.waitStderr(t, "lost 3 flow records")
	r.cancel()
	if err := r.result(t); err != nil {
		t.Fatalf("monitor: %v", err)
	}
	local := now.Local().Format("15:04:05.000000")
	equal(t, "monitor", r.stdout.String(), local+`  host-b  drop policy  ingress default/default/db  udp 10.1.0.11:3333 > 10.1.0.32:10  rule NetworkSecurityPolicy/default/default/servers ingress[1]  70 bytes
`+local+`  host-b  drop vlan    egress default/default/db   -                                  rule -                                                         64 bytes
`)

	if err := e.fails("monitor", "--type", "trace"); err == nil || !strings.Contains(err.Error(), `--type "trace": want drop`) {
		t.Errorf("monitor --type trace: %v, want an error naming the type", err)
	}
}

// TestMonitorThroughNimbus streams the drops of an agent tapped to a real nimbus, without
// --agent: the denied records alone, with their node, filtered at the agent.
func TestMonitorThroughNimbus(t *testing.T) {
	e := newBatchEnv(t)
	log, err := agent.NewFlowLog(16, nil)
	if err != nil {
		t.Fatal(err)
	}
	tapReg := prometheus.NewRegistry()
	tapAgent(t, e, "host-a", log, tapReg)
	// Stamped a minute ahead: after the monitor's start, whenever its agent reads them.
	at := time.Now().Add(time.Minute)
	log.Add([]*delphiv1.Flow{
		{Time: timestamppb.New(at), Event: delphiv1.FlowEvent_FLOW_EVENT_STARTED, Verdict: "allowed", Node: "host-a",
			Direction: "egress", Protocol: "tcp", Source: "10.1.0.11", SourcePort: 41234, Destination: "10.1.0.32", DestinationPort: 7, Bytes: 74},
		{Time: timestamppb.New(at), Event: delphiv1.FlowEvent_FLOW_EVENT_DENIED, Verdict: "denied", Reason: "policy", Node: "host-a",
			Direction: "egress", Protocol: "udp", Source: "10.1.0.11", SourcePort: 5353, Destination: "10.1.0.40", DestinationPort: 53, Bytes: 60},
	}, 0)
	r := e.start("monitor", "--node", "host-a")
	eventually(t, "the drop on standard output", func() bool { return strings.Contains(r.stdout.String(), "\n") })
	r.cancel()
	if err := r.result(t); err != nil {
		t.Fatalf("monitor: %v", err)
	}
	equal(t, "monitor through nimbus", r.stdout.String(), at.Local().Format("15:04:05.000000")+
		"  host-a  drop policy  egress -  udp 10.1.0.11:5353 > 10.1.0.40:53  rule -  60 bytes\n")
	if sent := gauge(t, tapReg, "naples_agent_flow_tap_records_sent_total"); sent != 1 {
		t.Errorf("the agent sent %v records on its tap, want the 1 drop", sent)
	}
}
