package nimbusv1

import (
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

func TestValidateTrace(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(s *TraceSpec)
		want   string // "" means valid; otherwise the exact error text
	}{
		{name: "valid", mutate: func(*TraceSpec) {}},
		{name: "to an address", mutate: func(s *TraceSpec) { s.Destination, s.DestinationAddress, s.Family = "", "10.2.0.5", "ipv4" }},
		{name: "icmp", mutate: func(s *TraceSpec) { s.Protocol, s.DestinationPort = "icmp", 0 }},
		{name: "live", mutate: func(s *TraceSpec) { s.Live, s.SourcePort, s.Timeout = true, 40000, durationpb.New(10*time.Minute) }},
		{name: "no source", mutate: func(s *TraceSpec) { s.Source = "" }, want: `spec.source "": is required`},
		{name: "no destination", mutate: func(s *TraceSpec) { s.Destination = "" },
			want: `spec.destination "": is required (an endpoint's name), or spec.destinationAddress`},
		{name: "both destinations", mutate: func(s *TraceSpec) { s.DestinationAddress = "10.2.0.5" },
			want: `spec.destinationAddress "10.2.0.5": must be empty when spec.destination names an endpoint`},
		{name: "to itself", mutate: func(s *TraceSpec) { s.Destination = "web" }, want: `spec.destination "web": is the source`},
		{name: "bad address", mutate: func(s *TraceSpec) { s.Destination, s.DestinationAddress = "", "10.2.0.500" },
			want: `spec.destinationAddress "10.2.0.500": not an IP address`},
		{name: "family of the address", mutate: func(s *TraceSpec) { s.Destination, s.DestinationAddress, s.Family = "", "fd00::5", "ipv4" },
			want: `spec.family "ipv4": does not match spec.destinationAddress "fd00::5" (ipv6)`},
		{name: "family", mutate: func(s *TraceSpec) { s.Family = "ip4" }, want: `spec.family "ip4": must be "ipv4" or "ipv6"`},
		{name: "protocol", mutate: func(s *TraceSpec) { s.Protocol = "sctp" }, want: `spec.protocol "sctp": must be "tcp", "udp" or "icmp"`},
		{name: "no port", mutate: func(s *TraceSpec) { s.DestinationPort = 0 }, want: `spec.destinationPort "0": must be 1 to 65535 with protocol "tcp"`},
		{name: "port", mutate: func(s *TraceSpec) { s.Protocol, s.DestinationPort = "udp", 70000 }, want: `spec.destinationPort "70000": must be 1 to 65535 with protocol "udp"`},
		{name: "icmp port", mutate: func(s *TraceSpec) { s.Protocol = "icmp" }, want: `spec.destinationPort "8080": must be 0 with protocol "icmp"`},
		{name: "icmp source port", mutate: func(s *TraceSpec) { s.Protocol, s.DestinationPort, s.SourcePort = "icmp", 0, 40001 },
			want: `spec.sourcePort "40001": must be 0 with protocol "icmp"`},
		{name: "payload", mutate: func(s *TraceSpec) { s.PayloadSize = 10 }, want: `spec.payloadSize "10": must be 24 to 3400 (the trace's tag takes 24 bytes)`},
		{name: "live payload", mutate: func(s *TraceSpec) { s.Live, s.SourcePort, s.PayloadSize = true, 40000, 100 },
			want: `spec.payloadSize "100": must be 0 with spec.live: a live trace injects no packet`},
		{name: "live icmp", mutate: func(s *TraceSpec) { s.Live, s.Protocol, s.DestinationPort = true, "icmp", 0 },
			want: `spec.protocol "icmp": must be "tcp" or "udp" with spec.live: a live trace names the packet by its ports`},
		{name: "live without port", mutate: func(s *TraceSpec) { s.Live = true }, want: `spec.sourcePort "0": is required with spec.live: the 5-tuple names the real packet to follow`},
		{name: "timeout", mutate: func(s *TraceSpec) { s.Timeout = durationpb.New(2 * time.Minute) }, want: `spec.timeout "2m0s": must be 1s to 1m0s`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &TraceSpec{Source: "web", Destination: "db", DestinationPort: 8080}
			tc.mutate(s)
			err := (&Object{Meta: &ObjectMeta{Name: "t"}, Spec: &Object_Trace{Trace: s}}).Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Validate = %v, want nil", err)
			case tc.want != "" && (err == nil || err.Error() != tc.want):
				t.Fatalf("Validate = %v, want %s", err, tc.want)
			}
		})
	}
}

// observed returns a node's status at generation 1 with the trace observations.
func observed(node string, done bool, obs ...*TraceObservation) *NodeStatus {
	return &NodeStatus{Node: node, ObservedGeneration: 1, Phase: Phase_PHASE_PROGRAMMED,
		OperationalData: &OperationalData{Kind: &OperationalData_Trace{Trace: &TraceOperational{Done: done, Observations: obs}}}}
}

// obs returns an observation at second sec.
func obs(sec int64, stage TraceStage, action TraceAction, reason string) *TraceObservation {
	return &TraceObservation{Stage: stage, Action: action, Reason: reason, Time: timestamppb.New(time.Unix(sec, 0))}
}

func TestTraceOutcome(t *testing.T) {
	inj := obs(1, TraceStage_TRACE_STAGE_INJECTED, TraceAction_TRACE_ACTION_FORWARDED, "")
	src := obs(2, TraceStage_TRACE_STAGE_SOURCE, TraceAction_TRACE_ACTION_ALLOWED, "")
	out := obs(3, TraceStage_TRACE_STAGE_TUNNEL_OUT, TraceAction_TRACE_ACTION_FORWARDED, "")
	for _, tc := range []struct {
		name   string
		nodes  []*NodeStatus
		result TraceResult
		reason string
		hops   int
	}{
		{"nothing yet", nil, TraceRunning, "", 0},
		{"on its way", []*NodeStatus{observed("a", false, inj, src, out)}, TraceRunning, "", 3},
		{"delivered remotely, reported first", []*NodeStatus{
			observed("b", false, obs(0, TraceStage_TRACE_STAGE_TUNNEL_IN, TraceAction_TRACE_ACTION_FORWARDED, ""),
				obs(0, TraceStage_TRACE_STAGE_DESTINATION, TraceAction_TRACE_ACTION_DELIVERED, "")),
			observed("a", false, inj, src, out)}, TraceDelivered, "", 5},
		{"delivered remotely, its arrival not reported yet", []*NodeStatus{
			observed("b", false, obs(4, TraceStage_TRACE_STAGE_DESTINATION, TraceAction_TRACE_ACTION_DELIVERED, "")),
			observed("a", false, inj, src, out)}, TraceRunning, "", 4},
		{"delivered remotely, its arrival never reported, the source done", []*NodeStatus{
			observed("b", false, obs(4, TraceStage_TRACE_STAGE_DESTINATION, TraceAction_TRACE_ACTION_DELIVERED, "")),
			observed("a", true, inj, src, out)}, TraceDelivered, "", 4},
		{"delivered remotely, the source's report not whole yet", []*NodeStatus{
			observed("b", false, obs(0, TraceStage_TRACE_STAGE_DESTINATION, TraceAction_TRACE_ACTION_DELIVERED, "")),
			observed("a", false, inj, src)}, TraceRunning, "", 3},
		{"denied remotely, the source done", []*NodeStatus{
			observed("b", false, obs(4, TraceStage_TRACE_STAGE_DESTINATION, TraceAction_TRACE_ACTION_DENIED, "Policy")),
			observed("a", true, inj, src)}, TraceDropped, "Policy", 3},
		{"denied", []*NodeStatus{observed("a", true, inj, obs(2, TraceStage_TRACE_STAGE_SOURCE, TraceAction_TRACE_ACTION_DENIED, "Policy"))},
			TraceDropped, "Policy", 2},
		{"flooded, not done", []*NodeStatus{observed("a", false, inj, src,
			obs(3, TraceStage_TRACE_STAGE_FORWARD, TraceAction_TRACE_ACTION_FLOODED, "NoFDBEntry"))}, TraceRunning, "", 3},
		{"flooded, done", []*NodeStatus{observed("a", true, inj, src,
			obs(3, TraceStage_TRACE_STAGE_FORWARD, TraceAction_TRACE_ACTION_FLOODED, "NoFDBEntry"))}, TraceDropped, "NoFDBEntry", 3},
		{"timed out", []*NodeStatus{observed("a", true, inj, src, out)}, TraceTimedOut, "last seen at tunnel-out on a", 3},
		{"older generation", []*NodeStatus{{Node: "a", ObservedGeneration: 0}}, TraceRunning, "", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := Outcome(&ObjectStatus{Nodes: tc.nodes}, 1, "a")
			if o.Result != tc.result || o.Reason != tc.reason || len(o.Hops) != tc.hops {
				t.Fatalf("Outcome = %v %q, %d hops; want %v %q, %d hops", o.Result, o.Reason, len(o.Hops), tc.result, tc.reason, tc.hops)
			}
			if len(o.Hops) > 0 && tc.hops > 1 && o.Hops[0].Node != "a" {
				t.Fatalf("first hop on %s, want the source's node a first", o.Hops[0].Node)
			}
		})
	}
}
