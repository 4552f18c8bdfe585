package cli

import (
	"context"
	"encoding/json"
	"errors"
	"regexp"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/naplesnet/naples/internal/exitstatus"
	"github.com/naplesnet/naples/nimbus"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// traceFixture is two nodes, a network across them, web-a on host-a and db-b on
// host-b, and nowhere, an endpoint on no node.
const traceFixture = `kind: Node
meta: {name: host-a}
spec: {hostname: host-a, vtepAddress: 192.0.2.1}
---
kind: Node
meta: {name: host-b}
spec: {hostname: host-b, vtepAddress: 192.0.2.2}
---
kind: Network
meta: {name: blue}
spec: {vni: 100, subnet: 10.1.0.0/24, gateway: 10.1.0.1}
---
kind: Endpoint
meta: {name: web-a}
spec: {network: blue, node: host-a, interface: veth-web-a, mac: "02:00:00:00:01:0a", ips: [10.1.0.2]}
---
kind: Endpoint
meta: {name: db-b}
spec: {network: blue, node: host-b, interface: veth-db-b, mac: "02:00:00:00:01:0b", ips: [10.1.0.3]}
---
kind: Endpoint
meta: {name: nowhere}
spec: {network: blue, interface: veth-nowhere, mac: "02:00:00:00:01:0c", ips: [10.1.0.4]}
`

// newTraceEnv is newEnv with traceFixture applied.
func newTraceEnv(t *testing.T) *env {
	t.Helper()
	return withTraceFixture(newEnv(t))
}

// withTraceFixture applies traceFixture in e and returns e.
func withTraceFixture(e *env) *env {
	e.t.Helper()
	e.ok("apply", "-f", e.file("fixture.yaml", traceFixture))
	return e
}

// traceKey is the key of the Trace called name in the default tenant and namespace.
func traceKey(name string) *nimbusv1.ObjectKey {
	return nimbusv1.NewKey(nimbusv1.Kind_KIND_TRACE, "", "", name)
}

// traces returns the names of the Traces nimbus holds.
func (e *env) traces() []string {
	e.t.Helper()
	return e.names(nimbusv1.Kind_KIND_TRACE)
}

// waitTrace waits until nimbus holds the Trace called name, which a running trace
// command applies.
func (e *env) waitTrace(name string) {
	e.t.Helper()
	eventually(e.t, "trace/"+name+" to be stored", func() bool {
		for _, n := range e.traces() {
			if n == name {
				return true
			}
		}
		return false
	})
}

// reportTrace reports, as node's agent does, what node saw of the Trace called name at
// generation 1: the observations, whether it is done, and on the source's node the packet.
func (e *env) reportTrace(name, node string, done bool, packet string, obs ...*nimbusv1.TraceObservation) {
	e.t.Helper()
	e.reportFor(traceKey(name), &nimbusv1.NodeStatus{
		Node: node, ObservedGeneration: 1, Phase: programmed,
		OperationalData: &nimbusv1.OperationalData{Kind: &nimbusv1.OperationalData_Trace{Trace: &nimbusv1.TraceOperational{
			Observations: obs, Done: done, Packet: packet,
		}}},
	})
}

// seen returns an observation at ms milliseconds after the test's creation time.
func seen(ms int, stage nimbusv1.TraceStage, action nimbusv1.TraceAction, o *nimbusv1.TraceObservation) *nimbusv1.TraceObservation {
	o.Stage, o.Action, o.Time = stage, action, timestamppb.New(created.Add(time.Duration(ms)*time.Millisecond))
	return o
}

// The stages and actions the tests report.
const (
	injected    = nimbusv1.TraceStage_TRACE_STAGE_INJECTED
	atSource    = nimbusv1.TraceStage_TRACE_STAGE_SOURCE
	forward     = nimbusv1.TraceStage_TRACE_STAGE_FORWARD
	tunnelOut   = nimbusv1.TraceStage_TRACE_STAGE_TUNNEL_OUT
	tunnelIn    = nimbusv1.TraceStage_TRACE_STAGE_TUNNEL_IN
	destination = nimbusv1.TraceStage_TRACE_STAGE_DESTINATION

	allowed   = nimbusv1.TraceAction_TRACE_ACTION_ALLOWED
	denied    = nimbusv1.TraceAction_TRACE_ACTION_DENIED
	forwarded = nimbusv1.TraceAction_TRACE_ACTION_FORWARDED
	delivered = nimbusv1.TraceAction_TRACE_ACTION_DELIVERED
)

// samplePacket is the packet host-a reports it injected.
const samplePacket = "tcp 10.1.0.2:40001 > 10.1.0.3:5432, 78 bytes"

// reportDelivered reports, for the Trace called name, the packet's way from web-a on
// host-a through the tunnel to db-b on host-b, where it is delivered. host-b reports
// first, as the nodes' reports may arrive in any order.
func (e *env) reportDelivered(name string) {
	e.t.Helper()
	e.reportTrace(name, "host-b", false, "",
		seen(5, tunnelIn, forwarded, &nimbusv1.TraceObservation{Interface: "vxlan100", Network: "blue", PeerNode: "host-a", Message: "received from 192.0.2.1"}),
		seen(6, destination, delivered, &nimbusv1.TraceObservation{Interface: "veth-db-b", Network: "blue", Endpoint: "db-b",
			Policy: nimbusv1.NewKey(nimbusv1.Kind_KIND_NETWORK_SECURITY_POLICY, "", "", "db"), Rule: "from-web",
			Message: "allowed in\tby db/from-web"}))
	e.reportTrace(name, "host-a", true, samplePacket,
		seen(1, injected, forwarded, &nimbusv1.TraceObservation{Interface: "veth-web-a", Endpoint: "web-a", Message: "injected " + samplePacket}),
		seen(2, atSource, allowed, &nimbusv1.TraceObservation{Interface: "veth-web-a", Network: "blue", Endpoint: "web-a",
			Policy: nimbusv1.NewKey(nimbusv1.Kind_KIND_NETWORK_SECURITY_POLICY, "", "", "web"), Rule: "to-db"}),
		seen(3, forward, forwarded, &nimbusv1.TraceObservation{Interface: "br100", Network: "blue", Endpoint: "db-b",
			Vtep: "192.0.2.2", PeerNode: "host-b", Message: "FDB entry of 02:00:00:00:01:0b"}),
		seen(4, tunnelOut, forwarded, &nimbusv1.TraceObservation{Interface: "vxlan100", Network: "blue", Vtep: "192.0.2.2", PeerNode: "host-b"}))
}

// TestTraceDelivered follows a packet across two nodes to its delivery: the path in the
// order the packet took it, exit status 0, and the Trace deleted afterwards.
func TestTraceDelivered(t *testing.T) {
	e := newTraceEnv(t)
	r := e.start("trace", "--from", "web-a", "--to", "db-b", "--port", "5432", "--name", "t1")
	e.waitTrace("t1")
	stored, err := e.nimbus.Get(t.Context(), &nimbusv1.GetRequest{Key: traceKey("t1")})
	if err != nil {
		t.Fatalf("Get trace/t1: %v", err)
	}
	if s := stored.GetItem().GetObject().GetTrace(); s.GetSource() != "web-a" || s.GetDestination() != "db-b" ||
		s.GetDestinationPort() != 5432 || s.TraceProtocol() != "tcp" || s.TraceTimeout() != 5*time.Second {
		t.Errorf("stored spec %v, want tcp from web-a to db-b:5432 in 5s", s)
	}
	e.reportDelivered("t1")
	if err := r.result(t); err != nil {
		t.Fatalf("trace: %v\nstderr:\n%s", err, r.stderr)
	}
	equal(t, "trace stdout", r.stdout.String(), ""+
		"packet: tcp 10.1.0.2:40001 > 10.1.0.3:5432, 78 bytes\n"+
		"NODE     STAGE         ACTION      WHERE                          DECIDED BY                               MESSAGE\n"+
		"host-a   injected      forwarded   veth-web-a ep=web-a            -                                        injected tcp 10.1.0.2:40001 > 10.1.0.3:5432, 78 bytes\n"+
		"host-a   source        allowed     veth-web-a net=blue ep=web-a   policy default/web rule to-db            -\n"+
		"host-a   forward       forwarded   br100 net=blue                 fdb ep=db-b vtep=192.0.2.2 node=host-b   FDB entry of 02:00:00:00:01:0b\n"+
		"host-a   tunnel-out    forwarded   vxlan100 net=blue              fdb vtep=192.0.2.2 node=host-b           -\n"+
		"host-b   tunnel-in     forwarded   vxlan100 net=blue              from node=host-a                         received from 192.0.2.1\n"+
		"host-b   destination   delivered   veth-db-b net=blue ep=db-b     policy default/db rule from-web          allowed in by db/from-web\n"+
		"delivered\n")
	if names := e.traces(); len(names) != 0 {
		t.Errorf("traces left after trace: %v", names)
	}
}

// TestTraceStatusCut follows a Trace through a nimbus that lists one node's status and
// leaves the operational data out of its object statuses: trace reads every node's
// status and finds the whole path.
func TestTraceStatusCut(t *testing.T) {
	for _, tt := range []struct {
		name   string
		limits nimbus.Limits
	}{
		{"nodes", nimbus.Limits{StatusNodes: 1}},
		{"details", nimbus.Limits{StatusDetailsBytes: 100}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e := withTraceFixture(newEnvWith(t, nimbus.Options{Now: func() time.Time { return created }, Limits: tt.limits}))
			r := e.start("trace", "--from", "web-a", "--to", "db-b", "--port", "5432", "--name", "t1", "-o", "json")
			e.waitTrace("t1")
			e.reportDelivered("t1")
			if err := r.result(t); err != nil {
				t.Fatalf("trace: %v\nstderr:\n%s", err, r.stderr)
			}
			var doc struct {
				Result string
				Hops   []struct{ Node string }
			}
			if err := json.Unmarshal([]byte(r.stdout.String()), &doc); err != nil || doc.Result != "delivered" || len(doc.Hops) != 6 {
				t.Errorf("trace: want delivered after 6 hops (%v):\n%s", err, r.stdout)
			}
		})
	}
}

// TestTraceDenied follows a packet the source's egress policy denies: exit status 1,
// the rule named, and -o json that parses.
func TestTraceDenied(t *testing.T) {
	e := newTraceEnv(t)
	r := e.start("trace", "--from", "web-a", "--to", "db-b", "--port", "5432", "--name", "t2", "-o", "json")
	e.waitTrace("t2")
	e.reportTrace("t2", "host-a", true, samplePacket,
		seen(1, injected, forwarded, &nimbusv1.TraceObservation{Interface: "veth-web-a", Endpoint: "web-a"}),
		seen(2, atSource, denied, &nimbusv1.TraceObservation{Interface: "veth-web-a", Network: "blue", Endpoint: "web-a", Reason: "Policy",
			Policy: nimbusv1.NewKey(nimbusv1.Kind_KIND_NETWORK_SECURITY_POLICY, "", "", "web"), Rule: "no-db", Message: "denied out"}))
	err := r.result(t)
	if !errors.Is(err, ErrTraceDropped) || exitstatus.Of(err) != exitstatus.Failure {
		t.Fatalf("trace of a denied packet: error %v (exit status %d), want ErrTraceDropped and %d", err, exitstatus.Of(err), exitstatus.Failure)
	}
	equal(t, "error", err.Error(), "trace/t2: dropped: Policy")
	var doc struct {
		Trace, Result, Reason, Packet string
		Hops                          []struct {
			Node        string
			Observation struct{ Stage, Action, Reason, Rule string }
		}
	}
	if err := json.Unmarshal([]byte(r.stdout.String()), &doc); err != nil {
		t.Fatalf("trace -o json does not parse: %v\n%s", err, r.stdout)
	}
	if doc.Trace != "t2" || doc.Result != "dropped" || doc.Reason != "Policy" || doc.Packet != samplePacket || len(doc.Hops) != 2 {
		t.Fatalf("trace -o json: %+v\n%s", doc, r.stdout)
	}
	if h := doc.Hops[1]; h.Node != "host-a" || h.Observation.Stage != "TRACE_STAGE_SOURCE" || h.Observation.Action != "TRACE_ACTION_DENIED" ||
		h.Observation.Rule != "no-db" {
		t.Errorf("trace -o json: the denying hop is %+v\n%s", h, r.stdout)
	}

	// In a table, the final line names the reason, the stage and the node, and the
	// denying hop the policy and rule.
	r = e.start("trace", "--from", "web-a", "--to", "db-b", "--port", "5432", "--name", "t3")
	e.waitTrace("t3")
	e.reportTrace("t3", "host-a", true, "",
		seen(2, atSource, denied, &nimbusv1.TraceObservation{Interface: "veth-web-a", Network: "blue", Endpoint: "web-a", Reason: "Policy",
			Policy: nimbusv1.NewKey(nimbusv1.Kind_KIND_NETWORK_SECURITY_POLICY, "", "", "web"), Rule: "no-db", Message: "denied out"}))
	if err := r.result(t); !errors.Is(err, ErrTraceDropped) {
		t.Fatalf("trace: error %v, want ErrTraceDropped", err)
	}
	equal(t, "trace stdout", r.stdout.String(), ""+
		"NODE     STAGE    ACTION            WHERE                          DECIDED BY                      MESSAGE\n"+
		"host-a   source   denied (Policy)   veth-web-a net=blue ep=web-a   policy default/web rule no-db   denied out\n"+
		"dropped: Policy (at source on host-a)\n")
}

// TestTraceTimedOut follows a packet the source's node lost sight of after the tunnel,
// and one whose source's node never reported: both time out with exit status 1.
func TestTraceTimedOut(t *testing.T) {
	e := newTraceEnv(t)
	r := e.start("trace", "--from", "web-a", "--to", "db-b", "--port", "5432", "--name", "t4")
	e.waitTrace("t4")
	e.reportTrace("t4", "host-a", true, samplePacket,
		seen(1, injected, forwarded, &nimbusv1.TraceObservation{Interface: "veth-web-a"}),
		seen(4, tunnelOut, forwarded, &nimbusv1.TraceObservation{Interface: "vxlan100", Network: "blue", Vtep: "192.0.2.2", PeerNode: "host-b"}))
	err := r.result(t)
	if !errors.Is(err, ErrTraceTimedOut) || exitstatus.Of(err) != exitstatus.Failure {
		t.Fatalf("trace: error %v (exit status %d), want ErrTraceTimedOut and %d", err, exitstatus.Of(err), exitstatus.Failure)
	}
	if out := r.stdout.String(); !strings.HasSuffix(out, "\ntimed out: last seen at tunnel-out on host-a\n") {
		t.Errorf("trace stdout does not end with the timeout:\n%s", out)
	}

	// Nobody reports: the command gives up after the timeout and the grace.
	start := time.Now()
	r = e.start("trace", "--from", "web-a", "--to", "db-b", "--port", "5432", "--name", "t5", "--timeout", "1s")
	err = r.result(t)
	if !errors.Is(err, ErrTraceTimedOut) {
		t.Fatalf("trace without reports: error %v, want ErrTraceTimedOut", err)
	}
	if d := time.Since(start); d < time.Second+traceGrace {
		t.Errorf("trace without reports gave up after %v, before the timeout and grace of %v", d, time.Second+traceGrace)
	}
	equal(t, "trace stdout", r.stdout.String(), "timed out: no report from the source's node host-a\n")
	if names := e.traces(); len(names) != 0 {
		t.Errorf("traces left after timing out: %v", names)
	}
}

// TestTraceOtherNodeFailed: a trace that times out after the packet left for a node
// that failed the Trace says that node's reason after where the packet was last seen.
func TestTraceOtherNodeFailed(t *testing.T) {
	e := newTraceEnv(t)
	r := e.start("trace", "--from", "web-a", "--to", "db-b", "--port", "5432", "--name", "t8")
	e.waitTrace("t8")
	e.reportFor(traceKey("t8"), &nimbusv1.NodeStatus{Node: "host-b", ObservedGeneration: 1, Phase: nimbusv1.Phase_PHASE_FAILED,
		Reason: "LimitExceeded", Message: "the node runs 16 traces already, the most --max-traces allows"})
	e.reportTrace("t8", "host-a", true, samplePacket,
		seen(1, injected, forwarded, &nimbusv1.TraceObservation{Interface: "veth-web-a"}),
		seen(4, tunnelOut, forwarded, &nimbusv1.TraceObservation{Interface: "vxlan100", Network: "blue", Vtep: "192.0.2.2", PeerNode: "host-b"}))
	if err := r.result(t); !errors.Is(err, ErrTraceTimedOut) {
		t.Fatalf("trace: error %v, want ErrTraceTimedOut", err)
	}
	want := "\ntimed out: last seen at tunnel-out on host-a; node host-b failed the trace: LimitExceeded: the node runs 16 traces already, the most --max-traces allows\n"
	if out := r.stdout.String(); !strings.HasSuffix(out, want) {
		t.Errorf("trace stdout does not end with %q:\n%s", want, out)
	}
}

// TestTraceSourceFailed checks that a trace the source's node fails ends at once, saying
// the node's reason, rather than timing out with nothing seen.
func TestTraceSourceFailed(t *testing.T) {
	e := newTraceEnv(t)
	start := time.Now()
	r := e.start("trace", "--from", "web-a", "--to", "db-b", "--port", "5432", "--name", "t7", "--timeout", "30s")
	e.waitTrace("t7")
	e.reportFor(traceKey("t7"), &nimbusv1.NodeStatus{Node: "host-a", ObservedGeneration: 1, Phase: nimbusv1.Phase_PHASE_FAILED,
		Reason: "LimitExceeded", Message: "the node runs 16 traces already, the most --max-traces allows"})
	err := r.result(t)
	if !errors.Is(err, ErrTraceTimedOut) || exitstatus.Of(err) != exitstatus.Failure {
		t.Fatalf("trace: error %v (exit status %d), want ErrTraceTimedOut and %d", err, exitstatus.Of(err), exitstatus.Failure)
	}
	if d := time.Since(start); d > 20*time.Second {
		t.Errorf("trace the source's node failed took %v, want it to end at once", d)
	}
	equal(t, "trace stdout", r.stdout.String(),
		"timed out: the source's node host-a failed the trace: LimitExceeded: the node runs 16 traces already, the most --max-traces allows\n")
}

// TestTraceRefused checks that a Trace nimbus refuses prints nimbus's message, exits
// with the usage status and stores nothing; and that bad flags are named as flags.
func TestTraceRefused(t *testing.T) {
	e := newTraceEnv(t)
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"missing source", []string{"--from", "ghost", "--to", "db-b", "--port", "80"},
			`spec.source "ghost" names no Endpoint in tenant "default", namespace "default"`},
		{"source on no node", []string{"--from", "nowhere", "--to", "db-b", "--port", "80"},
			`spec.source "nowhere" is on no node`},
		{"other namespace", []string{"--from", "web-a", "--to", "db-b", "--port", "80", "-n", "prod"},
			`spec.source "web-a" names no Endpoint in tenant "default", namespace "prod"`},
		{"no port", []string{"--from", "web-a", "--to", "db-b"}, `--port "0": must be 1 to 65535 with protocol "tcp"`},
		{"payload", []string{"--from", "web-a", "--to", "db-b", "--port", "80", "--payload-size", "3401"}, `--payload-size "3401": must be 24 to 3400`},
		{"timeout", []string{"--from", "web-a", "--to", "db-b", "--port", "80", "--timeout", "2m"}, `--timeout "2m0s": must be 1s to 1m0s`},
		{"no source", []string{"--to", "db-b", "--port", "80"}, "--from is required"},
		{"no destination", []string{"--from", "web-a", "--port", "80"}, "--to (an endpoint) or --to-address"},
		{"both destinations", []string{"--from", "web-a", "--to", "db-b", "--to-address", "10.1.0.3"}, "do not go together"},
		{"output", []string{"--from", "web-a", "--to", "db-b", "--port", "80", "-o", "yaml"}, `--output "yaml"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := e.fails(append([]string{"trace"}, tt.args...)...)
			contains(t, tt.name, err, tt.want)
			if exitstatus.Of(err) != exitstatus.Config {
				t.Errorf("exit status %d, want %d", exitstatus.Of(err), exitstatus.Config)
			}
			if names := e.traces(); len(names) != 0 {
				t.Errorf("traces stored after a refusal: %v", names)
			}
		})
	}
	// A bad --from is told as itself, not as the name made of it.
	err := e.fails("trace", "--from", "web/a", "--to", "db-b", "--port", "80")
	if err == nil || !strings.Contains(err.Error(), `--from "web/a": must be lower-case letters`) || strings.Contains(err.Error(), "--name") {
		t.Errorf("trace --from web/a: %v, want --from refused alone", err)
	}
}

// TestTraceKeep checks that --keep leaves the Trace in nimbus and says its name, that
// describe shows what each node saw, and that a second trace of the same name is
// refused rather than mixed with the first one's reports.
func TestTraceKeep(t *testing.T) {
	e := newTraceEnv(t)
	r := e.start("trace", "--from", "web-a", "--to", "db-b", "--port", "5432", "--name", "t6", "--keep")
	e.waitTrace("t6")
	e.reportDelivered("t6")
	if err := r.result(t); err != nil {
		t.Fatalf("trace --keep: %v", err)
	}
	equal(t, "trace --keep stderr", r.stderr.String(), "kept trace/t6: naplesctl describe trace t6\n")
	if names := e.traces(); len(names) != 1 || names[0] != "t6" {
		t.Errorf("traces after trace --keep: %v, want [t6]", names)
	}
	equal(t, "get traces", e.ok("get", "traces"), ""+
		"NAME   TENANT    NAMESPACE   GENERATION   PROGRAMMED   FAILED   PENDING   STALE   AGE\n"+
		"t6     default   default     1            2/2          0        0         0       90s\n")
	out := e.ok("describe", "trace", "t6")
	_, op, _ := strings.Cut(out, "\nOperational on host-a:\n")
	equal(t, "describe trace t6, operational part", op, ""+
		"  done:            true\n"+
		"  observations[0]: injected forwarded: injected tcp 10.1.0.2:40001 > 10.1.0.3:5432, 78 bytes\n"+
		"  observations[1]: source allowed\n"+
		"  observations[2]: forward forwarded: FDB entry of 02:00:00:00:01:0b\n"+
		"  observations[3]: tunnel-out forwarded\n"+
		"  packet:          tcp 10.1.0.2:40001 > 10.1.0.3:5432, 78 bytes\n"+
		"\n"+
		"Operational on host-b:\n"+
		"  done:            false\n"+
		"  observations[0]: tunnel-in forwarded: received from 192.0.2.1\n"+
		"  observations[1]: destination delivered: allowed in by db/from-web\n")

	err := e.fails("trace", "--from", "web-a", "--to", "db-b", "--port", "5432", "--name", "t6")
	contains(t, "trace of a kept name", err, `--name "t6": trace/t6 already exists`)
	if exitstatus.Of(err) != exitstatus.Config {
		t.Errorf("exit status %d, want %d", exitstatus.Of(err), exitstatus.Config)
	}
}

// TestTraceDefaultName checks the name a Trace gets without --name.
func TestTraceDefaultName(t *testing.T) {
	e := newTraceEnv(t)
	r := e.start("trace", "--from", "web-a", "--to-address", "10.2.0.7", "--proto", "icmp")
	var name string
	eventually(t, "a trace to be stored", func() bool {
		names := e.traces()
		if len(names) == 1 {
			name = names[0]
		}
		return name != ""
	})
	if !regexp.MustCompile(`^trace-web-a-[0-9a-f]{6}$`).MatchString(name) {
		t.Errorf("trace without --name is called %q, want trace-web-a-<6 hex digits>", name)
	}
	e.reportTrace(name, "host-a", true, "",
		seen(1, destination, delivered, &nimbusv1.TraceObservation{Interface: "veth-x"}))
	if err := r.result(t); err != nil {
		t.Fatalf("trace: %v", err)
	}
}

// TestTraceInterrupted checks that a trace interrupted while it follows deletes its
// Trace.
func TestTraceInterrupted(t *testing.T) {
	e := newTraceEnv(t)
	r := e.start("trace", "--from", "web-a", "--to", "db-b", "--port", "5432", "--name", "t7", "--timeout", "60s")
	e.waitTrace("t7")
	r.cancel()
	if err := r.result(t); !errors.Is(err, context.Canceled) {
		t.Fatalf("interrupted trace: error %v, want context.Canceled", err)
	}
	if names := e.traces(); len(names) != 0 {
		t.Errorf("traces left after an interrupted trace: %v", names)
	}
}
