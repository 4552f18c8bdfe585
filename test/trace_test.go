package test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/naplesnet/naples/hal/linux"
	"github.com/naplesnet/naples/internal/testns"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// traceObject returns a Trace with the spec.
func traceObject(name string, spec *nimbusv1.TraceSpec) *nimbusv1.Object {
	return &nimbusv1.Object{Meta: &nimbusv1.ObjectMeta{Name: name}, Spec: &nimbusv1.Object_Trace{Trace: spec}}
}

// traceRun is a Trace applied and followed to its outcome.
type traceRun struct {
	outcome nimbusv1.TraceOutcome
	// took is from the apply to the outcome.
	took time.Duration
}

// path returns the hops as "node stage action" lines, with the reason of a denial or
// drop.
func (r traceRun) path() []string {
	var out []string
	for _, h := range r.outcome.Hops {
		line := fmt.Sprintf("%s %s %s", h.Node, h.GetStage().StageName(), h.GetAction().ActionName())
		if h.GetReason() != "" {
			line += " " + h.GetReason()
		}
		out = append(out, line)
	}
	return out
}

// String returns the result and every hop with its message, for failures.
func (r traceRun) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s after %v:", r.outcome.Result, r.outcome.Reason, r.took.Round(time.Millisecond))
	for _, h := range r.outcome.Hops {
		fmt.Fprintf(&b, "\n  %s: %s", h.Node, h.Line())
	}
	return b.String()
}

// trace applies a Trace with the name and spec and follows its status until its outcome
// is known, or the deadline; it deletes the Trace afterwards.
func (fc *fwCluster) trace(t testing.TB, name string, spec *nimbusv1.TraceSpec) traceRun {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	src := fc.desired[nimbusv1.NewKey(nimbusv1.Kind_KIND_ENDPOINT, "", "", spec.GetSource()).Defaulted().ID()]
	start := time.Now()
	resp, err := fc.api.Apply(ctx, &nimbusv1.ApplyRequest{Object: traceObject(name, spec)})
	if err != nil {
		t.Fatalf("applying trace %s: %v", name, err)
	}
	key := resp.GetObject().Key()
	defer func() {
		if _, err := fc.api.Delete(context.Background(), &nimbusv1.DeleteRequest{Key: key}); err != nil {
			t.Errorf("deleting trace %s: %v", name, err)
		}
	}()
	gen := resp.GetObject().GetMeta().GetGeneration()
	for {
		got, err := fc.api.Get(ctx, &nimbusv1.GetRequest{Key: key})
		if err != nil {
			t.Fatalf("trace %s: %v", name, err)
		}
		out := nimbusv1.Outcome(got.GetItem().GetStatus(), gen, src.GetEndpoint().GetNode())
		if out.Result != nimbusv1.TraceRunning {
			return traceRun{outcome: out, took: time.Since(start)}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("trace %s: no outcome after %v: %v", name, deadline, traceRun{outcome: out, took: time.Since(start)})
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// wantPath checks the trace's result and its hops, "node stage action [reason]".
func wantPath(t testing.TB, what string, r traceRun, result nimbusv1.TraceResult, path ...string) {
	t.Helper()
	if r.outcome.Result != result || !slices.Equal(r.path(), path) {
		t.Errorf("%s: got %s\nwant %s with hops\n  %s", what, r, result, strings.Join(path, "\n  "))
	}
}

// traceCluster starts web1 and db1 on host-a and db2 on host-b, serving TCP echo on
// port 7 and UDP on port 9, with web1 a client and the others servers: the servers
// take TCP 7 and UDP 9 from the clients, the clients may send those and TCP 8080 to the
// servers, and never TCP 22.
func traceCluster(t testing.TB) *fwSmallCluster {
	t.Helper()
	defs := fwDefs("web1", "db1", "db2")
	groups := map[string][]string{"web1": {"client"}, "db1": {"server"}, "db2": {"server"}}
	sc := newFWSmallCluster(t, fwSmallSpec{
		workloads: defs,
		endpoints: fwEndpointsOf(defs, groups),
		objs:      []*nimbusv1.Object{fwGroupObject("client"), fwGroupObject("server")},
		tcp:       []uint16{7},
		udp:       []uint16{9},
	})
	sc.apply(t, fwPolicyObject("servers", []string{"server"},
		fwRules(allowIn("tcp", fwPorts("7"), "group:client"), allowIn("udp", fwPorts("9"), "group:client"), allowMulticastReports()), nil),
		fwPolicyObject("clients", []string{"client"}, nil,
			fwRules(denyOut("tcp", fwPorts("22")), allowOut("tcp", fwPorts("7", "8080"), "group:server"), allowOut("udp", fwPorts("9"), "group:server"))))
	sc.waitProgrammed(t)
	return sc
}

// TestTrace traces packets between the workloads of traceCluster, checked hop by hop:
// delivered on one host and across the tunnel (and never received by the workload), also
// to an address of the source's network, denied by the destination's ingress and the
// source's egress policy, dropped for the MTU, flooded for want of an FDB entry of an endpoint whose node is gone, and one that
// never comes back, which times out and leaves nothing behind; two at once between the
// same endpoints; one naming an endpoint that does not exist.
func TestTrace(t *testing.T) {
	sc := traceCluster(t)
	udp9 := func(dst string) *nimbusv1.TraceSpec {
		return &nimbusv1.TraceSpec{Source: "web1", Destination: dst, Protocol: "udp", DestinationPort: 9}
	}
	tcp := func(dst string, port uint32) *nimbusv1.TraceSpec {
		return &nimbusv1.TraceSpec{Source: "web1", Destination: dst, DestinationPort: port}
	}

	r := sc.trace(t, "same-host", udp9("db1"))
	wantPath(t, "web1 → db1 udp 9", r, nimbusv1.TraceDelivered,
		"host-a injected forwarded", "host-a source allowed", "host-a forward forwarded", "host-a destination delivered")
	r = sc.trace(t, "across", udp9("db2"))
	wantPath(t, "web1 → db2 udp 9", r, nimbusv1.TraceDelivered,
		"host-a injected forwarded", "host-a source allowed", "host-a forward forwarded", "host-a tunnel-out forwarded",
		"host-b tunnel-in forwarded", "host-b destination delivered")
	if fwd := r.outcome.Hops[2]; fwd.GetVtep() == "" || fwd.GetPeerNode() != "host-b" || fwd.GetEndpoint() != "db2" {
		t.Errorf("web1 → db2: the forwarding hop names VTEP %q of node %q and endpoint %q, want host-b's and db2", fwd.GetVtep(), fwd.GetPeerNode(), fwd.GetEndpoint())
	}
	// An address in the source's own network: to the MAC of the endpoint that holds it,
	// as the workload would send it, not up to the gateway.
	r = sc.trace(t, "to-address", &nimbusv1.TraceSpec{Source: "web1", DestinationAddress: "10.1.0.32", Protocol: "udp", DestinationPort: 9})
	wantPath(t, "web1 → 10.1.0.32 (db2's) udp 9", r, nimbusv1.TraceDelivered,
		"host-a injected forwarded", "host-a source allowed", "host-a forward forwarded", "host-a tunnel-out forwarded",
		"host-b tunnel-in forwarded", "host-b destination delivered")
	if n := sc.echo["db2"].received(9) + sc.echo["db1"].received(9); n != 0 {
		t.Errorf("the workloads received %d trace packets as data, want none", n)
	}

	r = sc.trace(t, "ingress-denied", tcp("db2", 8080))
	wantPath(t, "web1 → db2 tcp 8080", r, nimbusv1.TraceDropped,
		"host-a injected forwarded", "host-a source allowed", "host-a forward forwarded", "host-a tunnel-out forwarded",
		"host-b tunnel-in forwarded", "host-b destination denied Policy")
	r = sc.trace(t, "egress-denied", tcp("db2", 22))
	wantPath(t, "web1 → db2 tcp 22", r, nimbusv1.TraceDropped, "host-a injected forwarded", "host-a source denied Policy")
	if d := r.outcome.Decided; d == nil || d.GetPolicy().GetName() != "clients" || d.GetRule() != "egress[0]" {
		t.Errorf("web1 → db2 tcp 22: decided by %v, want rule egress[0] of policy clients", d)
	}
	big := tcp("db2", 7)
	big.PayloadSize = 1600
	r = sc.trace(t, "mtu", big)
	wantPath(t, "web1 → db2 tcp 7, 1,600 bytes", r, nimbusv1.TraceDropped,
		"host-a injected forwarded", "host-a source allowed", "host-a forward dropped MTU")

	// Two at once between the same endpoints: each its own packet and path.
	var wg sync.WaitGroup
	var twice [2]traceRun
	for i := range twice {
		wg.Go(func() { twice[i] = sc.trace(t, fmt.Sprintf("twice-%d", i), tcp("db2", 7)) })
	}
	wg.Wait()
	for i, r := range twice {
		wantPath(t, fmt.Sprintf("web1 → db2 tcp 7, trace %d of two at once", i), r, nimbusv1.TraceDelivered,
			"host-a injected forwarded", "host-a source allowed", "host-a forward forwarded", "host-a tunnel-out forwarded",
			"host-b tunnel-in forwarded", "host-b destination delivered")
	}

	// Through the gateway: db3, in network backs on host-b, is routed to in the tenant's
	// table, out of host-a through backs' bridge and tunnel.
	newWorkload(t, sc.host("host-b"), "db3", "02:00:00:00:f0:33", []string{"10.2.0.33/24"}, "10.2.0.1")
	sc.apply(t, &nimbusv1.Object{Meta: &nimbusv1.ObjectMeta{Name: "backs"}, Spec: &nimbusv1.Object_Network{Network: &nimbusv1.NetworkSpec{
		Vni: 200, Subnets: []*nimbusv1.Subnet{{Cidr: "10.2.0.0/24", Gateway: "10.2.0.1"}}}}},
		fwEndpointObject("db3", "backs", "host-b", "02:00:00:00:f0:33", []string{"10.2.0.33"}, "server"))
	sc.waitProgrammed(t, nimbusv1.Kind_KIND_NETWORK, nimbusv1.Kind_KIND_ENDPOINT)
	r = sc.trace(t, "gateway", udp9("db3"))
	wantPath(t, "web1 → db3 udp 9, in another network", r, nimbusv1.TraceDelivered,
		"host-a injected forwarded", "host-a source allowed", "host-a forward forwarded", "host-a gateway forwarded",
		"host-a routed forwarded", "host-a forward forwarded", "host-a tunnel-out forwarded", "host-b tunnel-in forwarded",
		"host-b destination delivered")
	if len(r.outcome.Hops) == 9 {
		if gw := r.outcome.Hops[3]; gw.GetTable() != linux.TenantTable("default") || gw.GetNetwork() != fwNetwork {
			t.Errorf("web1 → db3: the gateway hop routes in table %d of network %q, want the default tenant's %d of %q", gw.GetTable(), gw.GetNetwork(), linux.TenantTable("default"), fwNetwork)
		}
		if routed := r.outcome.Hops[4]; routed.GetNetwork() != "backs" {
			t.Errorf("web1 → db3: routed into network %q, want backs", routed.GetNetwork())
		}
		if fwd := r.outcome.Hops[5]; fwd.GetEndpoint() != "db3" || fwd.GetPeerNode() != "host-b" {
			t.Errorf("web1 → db3: backs' bridge forwards by the FDB entry of %q to node %q, want db3's to host-b", fwd.GetEndpoint(), fwd.GetPeerNode())
		}
	}

	// An endpoint on a node that is gone (its Node object deleted) has no FDB entry on
	// host-a any more: the bridge floods the packet, to db1 and through the tunnel to
	// host-b, and nobody takes it.
	gone := &nimbusv1.Object{Meta: &nimbusv1.ObjectMeta{Name: "host-gone"},
		Spec: &nimbusv1.Object_Node{Node: &nimbusv1.NodeSpec{Hostname: "host-gone", VtepAddress: "192.168.77.9"}}}
	sc.apply(t, gone, fwEndpointObject("ghost", fwNetwork, "host-gone", "02:00:00:00:f0:99", []string{"10.1.0.99"}, "server"))
	sc.c.waitProgrammed(t, "endpoint", "ghost", "host-a", 1)
	if _, err := sc.api.Delete(context.Background(), &nimbusv1.DeleteRequest{Key: gone.Key()}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "host-a to forget ghost's FDB entry", func() bool {
		return !strings.Contains(testns.Run(t, "bridge", "-n", sc.host("host-a").ns, "fdb", "show"), "02:00:00:00:f0:99")
	})
	spec := udp9("ghost")
	spec.Timeout = durationpb.New(2 * time.Second)
	r = sc.trace(t, "no-fdb", spec)
	if r.outcome.Result != nimbusv1.TraceDropped || r.outcome.Reason != "NoFDBEntry" || !slices.Contains(r.path(), "host-a forward flooded NoFDBEntry") ||
		!slices.Contains(r.path(), "host-a destination flooded") {
		t.Errorf("web1 → ghost: got %s\nwant dropped for NoFDBEntry, flooded to db1", r)
	}

	// A packet to an address nobody has goes up to the gateway and never comes back.
	spec = &nimbusv1.TraceSpec{Source: "web1", DestinationAddress: "10.1.0.98", Protocol: "udp", DestinationPort: 9, Timeout: durationpb.New(2 * time.Second)}
	sc.apply(t, fwPolicyObject("clients", []string{"client"}, nil,
		fwRules(denyOut("tcp", fwPorts("22")), allowOut("tcp", fwPorts("7", "8080"), "group:server"),
			allowOut("udp", fwPorts("9"), "group:server", "10.1.0.98/32", "10.9.9.0/24"))))
	sc.waitProgrammed(t, nimbusv1.Kind_KIND_NETWORK_SECURITY_POLICY)
	r = sc.trace(t, "no-answer", spec)
	wantPath(t, "web1 → 10.1.0.98 udp 9", r, nimbusv1.TraceTimedOut,
		"host-a injected forwarded", "host-a source allowed", "host-a forward forwarded", "host-a gateway forwarded")
	// A packet to an address no route covers: the kernel's routing drops it at the
	// gateway, where no stage observes it; the source's node asks the kernel for the route.
	spec = &nimbusv1.TraceSpec{Source: "web1", DestinationAddress: "10.9.9.9", Protocol: "udp", DestinationPort: 9, Timeout: durationpb.New(2 * time.Second)}
	r = sc.trace(t, "no-route", spec)
	wantPath(t, "web1 → 10.9.9.9 udp 9", r, nimbusv1.TraceDropped,
		"host-a injected forwarded", "host-a source allowed", "host-a forward forwarded", "host-a gateway forwarded", "host-a gateway dropped NoRoute")
	if r.outcome.Reason != "NoRoute" {
		t.Errorf("web1 → 10.9.9.9: outcome %s, want dropped for NoRoute", r)
	}
	for _, h := range sc.hosts {
		waitFor(t, h.name+"'s trace state to go", func() bool { return traceLeftovers(t, h) == "" })
	}

	// Live: the next real datagram of the 5-tuple, followed and delivered as data.
	live := &nimbusv1.TraceSpec{Source: "web1", Destination: "db2", Protocol: "udp", SourcePort: 40009, DestinationPort: 9,
		Live: true, Timeout: durationpb.New(deadline)}
	liveRun := make(chan traceRun, 1)
	go func() {
		var r traceRun
		defer func() { liveRun <- r }() // also when trace fails the test
		r = sc.trace(t, "live", live)
	}()
	for _, h := range sc.hosts {
		waitFor(t, h.name+" to install the live trace", func() bool { return strings.Contains(traceLeftovers(t, h), "1 live traces installed") })
	}
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	c, err := dialWith(ctx, sc.workload("web1").handle, net.Dialer{LocalAddr: &net.UDPAddr{Port: 40009}}, "udp", "10.1.0.32:9")
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	conn := &fwConn{name: "udp web1:40009→db2:9", proto: "udp", c: c}
	if err := conn.exchange(deadline); err != nil {
		t.Fatal(err)
	}
	c.Close()
	r = <-liveRun
	wantPath(t, "web1:40009 → db2 udp 9, live", r, nimbusv1.TraceDelivered,
		"host-a source allowed", "host-a forward forwarded", "host-a tunnel-out forwarded",
		"host-b tunnel-in forwarded", "host-b destination delivered")
	if n := sc.echo["db2"].received(9); n != 1 {
		t.Errorf("db2 received %d datagrams on port 9, want the live trace's one", n)
	}

	// A Trace deleted while it runs leaves nothing behind either; its observers are
	// seen attached first, so that the check above sees what it looks for.
	long := udp9("db2")
	long.Timeout = durationpb.New(time.Minute)
	resp, err := sc.api.Apply(context.Background(), &nimbusv1.ApplyRequest{Object: traceObject("deleted", long)})
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range sc.hosts {
		waitFor(t, h.name+" to observe the trace", func() bool { return strings.Contains(traceLeftovers(t, h), "fw_trace_tunnel_out") })
	}
	if _, err := sc.api.Delete(context.Background(), &nimbusv1.DeleteRequest{Key: resp.GetObject().Key()}); err != nil {
		t.Fatal(err)
	}
	for _, h := range sc.hosts {
		waitFor(t, h.name+"'s trace state to go after the delete", func() bool { return traceLeftovers(t, h) == "" })
	}

	// An agent killed while a trace runs leaves the trace installed in its firewall's
	// pinned maps; the trace deleted meanwhile, the agent removes it when it starts.
	resp, err = sc.api.Apply(context.Background(), &nimbusv1.ApplyRequest{Object: traceObject("killed", long)})
	if err != nil {
		t.Fatal(err)
	}
	ha := sc.host("host-a")
	waitFor(t, "host-a to observe the trace", func() bool { return strings.Contains(traceLeftovers(t, ha), "traces installed") })
	ha.agent.kill(t)
	if _, err := sc.api.Delete(context.Background(), &nimbusv1.DeleteRequest{Key: resp.GetObject().Key()}); err != nil {
		t.Fatal(err)
	}
	if left := traceLeftovers(t, ha); !strings.Contains(left, "1 traces installed") {
		t.Fatalf("host-a's agent killed during a trace left %q, want the trace installed", left)
	}
	ha.startAgentWith(t, "--max-traces", "1")
	waitFor(t, "host-a's restarted agent to remove the trace", func() bool { return traceLeftovers(t, ha) == "" })

	// With --max-traces 1, a trace that ended and is kept holds no place: the next one
	// runs. One installed holds it until it ends: the next is FAILED with LimitExceeded.
	short := udp9("db1")
	short.Timeout = durationpb.New(time.Second)
	kept := applyTrace(t, sc, "kept", short)
	waitFor(t, "host-a to end the kept trace and uninstall it", func() bool {
		return traceNodeStatus(t, sc, kept, "host-a").GetOperationalData().GetTrace().GetDone() && traceLeftovers(t, ha) == ""
	})
	// A Trace between endpoints of one node targets that node alone: no other agent
	// takes a trace slot for it or reports on it.
	got, err := sc.api.Get(context.Background(), &nimbusv1.GetRequest{Key: kept})
	if err != nil {
		t.Fatal(err)
	}
	if nodes, st := got.GetItem().GetObject().GetMeta().GetNodes(), got.GetItem().GetStatus(); !slices.Equal(nodes, []string{"host-a"}) || st.GetTargetNodes() != 1 || traceNodeStatus(t, sc, kept, "host-b") != nil {
		t.Errorf("a trace web1 → db1 targets %q (%d target nodes; host-b's status %v), want host-a alone", nodes, st.GetTargetNodes(), traceNodeStatus(t, sc, kept, "host-b"))
	}
	r = sc.trace(t, "after-kept", udp9("db1"))
	wantPath(t, "web1 → db1 udp 9 with a kept trace and --max-traces 1", r, nimbusv1.TraceDelivered,
		"host-a injected forwarded", "host-a source allowed", "host-a forward forwarded", "host-a destination delivered")
	running := applyTrace(t, sc, "running", long)
	waitFor(t, "host-a to install the running trace", func() bool { return strings.Contains(traceLeftovers(t, ha), "1 traces installed") })
	over := applyTrace(t, sc, "over-limit", udp9("db1"))
	waitFor(t, "host-a to refuse the trace over --max-traces", func() bool {
		st := traceNodeStatus(t, sc, over, "host-a")
		return st.GetPhase() == nimbusv1.Phase_PHASE_FAILED && st.GetReason() == "LimitExceeded" && strings.Contains(st.GetMessage(), "--max-traces")
	})
	for _, key := range []*nimbusv1.ObjectKey{kept, running, over} {
		if _, err := sc.api.Delete(context.Background(), &nimbusv1.DeleteRequest{Key: key}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "host-a's trace state to go after the deletes", func() bool { return traceLeftovers(t, ha) == "" })

	// An endpoint that does not exist: refused, nothing stored.
	_, err = sc.api.Apply(context.Background(), &nimbusv1.ApplyRequest{Object: traceObject("nowhere", udp9("no-such"))})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), `spec.destination "no-such" names no Endpoint`) {
		t.Errorf("a trace to endpoint no-such: %v, want it refused naming spec.destination", err)
	}
}

// applyTrace applies a Trace with the name and spec, and returns its key; the caller
// deletes it.
func applyTrace(t testing.TB, sc *fwSmallCluster, name string, spec *nimbusv1.TraceSpec) *nimbusv1.ObjectKey {
	t.Helper()
	resp, err := sc.api.Apply(context.Background(), &nimbusv1.ApplyRequest{Object: traceObject(name, spec)})
	if err != nil {
		t.Fatalf("applying trace %s: %v", name, err)
	}
	return resp.GetObject().Key()
}

// traceNodeStatus returns the status the node reported for the Trace with key, nil
// while it reported none.
func traceNodeStatus(t testing.TB, sc *fwSmallCluster, key *nimbusv1.ObjectKey, node string) *nimbusv1.NodeStatus {
	t.Helper()
	got, err := sc.api.Get(context.Background(), &nimbusv1.GetRequest{Key: key})
	if err != nil {
		t.Fatalf("getting %s: %v", key, err)
	}
	for _, n := range got.GetItem().GetStatus().GetNodes() {
		if n.GetNode() == node {
			return n
		}
	}
	return nil
}

// traceLeftovers returns what of the host's traces is left in its kernel: trace
// observers attached to the devices of the network, and traces installed in its
// firewall; "" when nothing is.
func traceLeftovers(t testing.TB, h *host) string {
	t.Helper()
	var left []string
	netID := nimbusv1.NewKey(nimbusv1.Kind_KIND_NETWORK, "", "", fwNetwork).ID()
	for _, dev := range []string{linux.VXLANName(netID), linux.BridgeName(netID)} {
		for _, name := range tcxProgramNames(t, h, dev) {
			if strings.HasPrefix(name, "fw_trace_") {
				left = append(left, name+" on "+dev)
			}
		}
	}
	out, err := exec.Command("bpftool", "-j", "map", "dump", "pinned", h.bpf+"/fw_traces").Output()
	if err != nil {
		t.Fatalf("bpftool map dump of %s's fw_traces: %v", h.name, err)
	}
	var entries []json.RawMessage
	if err := json.Unmarshal(out, &entries); err != nil {
		t.Fatalf("bpftool map dump of %s's fw_traces: %v: %s", h.name, err, out)
	}
	if len(entries) > 0 {
		left = append(left, fmt.Sprintf("%d traces installed", len(entries)))
	}
	out, err = exec.Command("bpftool", "-j", "map", "dump", "pinned", h.bpf+"/fw_trace_live").Output()
	if err != nil {
		t.Fatalf("bpftool map dump of %s's fw_trace_live: %v", h.name, err)
	}
	if err := json.Unmarshal(out, &entries); err != nil {
		t.Fatalf("bpftool map dump of %s's fw_trace_live: %v: %s", h.name, err, out)
	}
	if len(entries) > 0 {
		left = append(left, fmt.Sprintf("%d live traces installed", len(entries)))
	}
	return strings.Join(left, "; ")
}

// fwTraceSample is how many cases of each scenario of TestFirewallRandom are traced too.
const fwTraceSample = 8

// wantTracesAgree traces a random sample of the cases at once, each the 5-tuple of its
// probe, and checks that each trace's verdict is the case's: the reference's, which the
// probes, real connections, were checked against in the same scenario.
func (fc *fwCluster) wantTracesAgree(t *testing.T, what string, cases []fwCase, rng interface{ IntN(int) int }) {
	t.Helper()
	sample := slices.Clone(cases)
	for i := len(sample) - 1; i > 0; i-- {
		j := rng.IntN(i + 1)
		sample[i], sample[j] = sample[j], sample[i]
	}
	sample = sample[:min(fwTraceSample, len(sample))]
	runs := make([]traceRun, len(sample))
	var wg sync.WaitGroup
	for i, c := range sample {
		spec := &nimbusv1.TraceSpec{Source: c.src, Destination: c.dst, Protocol: c.kind.proto, DestinationPort: uint32(c.kind.port), Family: "ipv4"}
		if c.kind.family == 6 {
			spec.Family = "ipv6"
		}
		wg.Go(func() { runs[i] = fc.trace(t, fmt.Sprintf("agree-%d", i), spec) })
	}
	wg.Wait()
	for i, c := range sample {
		want := nimbusv1.TraceDropped
		if c.want {
			want = nimbusv1.TraceDelivered
		}
		if runs[i].outcome.Result != want {
			t.Errorf("%s: trace of %v: %s, want %s (%s)", what, c, runs[i], want, c.why)
		}
	}
}

// tcxProgramNames returns the names of the programs at both tcx hooks of the device in
// the host's namespace.
func tcxProgramNames(t testing.TB, h *host, dev string) []string {
	t.Helper()
	var names []string
	ns := testns.Handle(t, h.ns)
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends in the host's namespace
		if err := netns.Set(ns); err != nil {
			errc <- err
			return
		}
		ifi, err := net.InterfaceByName(dev)
		if err != nil {
			errc <- err
			return
		}
		for _, at := range []ebpf.AttachType{ebpf.AttachTCXIngress, ebpf.AttachTCXEgress} {
			res, err := link.QueryPrograms(link.QueryOptions{Target: ifi.Index, Attach: at})
			// ENOSPC: a program was attached between the query's count and its read of
			// the ids (the agent attaches observers as traces start); ask again.
			for try := 0; errors.Is(err, unix.ENOSPC) && try < 100; try++ {
				res, err = link.QueryPrograms(link.QueryOptions{Target: ifi.Index, Attach: at})
			}
			if err != nil {
				errc <- err
				return
			}
			for _, p := range res.Programs {
				prog, err := ebpf.NewProgramFromID(p.ID)
				if err != nil {
					continue // detached since
				}
				if info, err := prog.Info(); err == nil {
					names = append(names, info.Name)
				}
				prog.Close()
			}
		}
		errc <- nil
	}()
	if err := <-errc; err != nil {
		t.Fatalf("the tcx programs of %s on %s: %v", dev, h.name, err)
	}
	return names
}
