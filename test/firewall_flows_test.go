package test

import (
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"

	delphiv1 "github.com/naplesnet/naples/proto/delphi/v1"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// hostFlows returns the flow records the host's agent keeps that naplesctl flows, with
// the arguments, prints as JSON, one per line.
func (sc *fwSmallCluster) hostFlows(t testing.TB, host string, args ...string) []*delphiv1.Flow {
	t.Helper()
	h := sc.host(host)
	sock := filepath.Join(h.c.dir, "agent-"+h.name+".sock")
	out := sc.c.mustCtl(t, "", append([]string{"--agent", sock, "flows", "-o", "json"}, args...)...)
	var flows []*delphiv1.Flow
	for line := range strings.Lines(out) {
		f := &delphiv1.Flow{}
		if err := protojson.Unmarshal([]byte(line), f); err != nil {
			t.Fatalf("naplesctl flows printed %q: %v", line, err)
		}
		flows = append(flows, f)
	}
	return flows
}

// flowText describes a flow record as the test compares it.
func flowText(f *delphiv1.Flow) string {
	ep, peer := f.GetEndpoint().GetName(), f.GetPeerEndpoint().GetName()
	pol := f.GetPolicy().GetName()
	return fmt.Sprintf("%s %s %s/%s on %s %s, peer %s (%s:%d > %s:%d) rule %q of %q, %s",
		f.GetVerdict(), strings.ToLower(strings.TrimPrefix(f.GetEvent().String(), "FLOW_EVENT_")), f.GetReason(), f.GetDirection(),
		f.GetNode(), ep, peer, f.GetSource(), f.GetSourcePort(), f.GetDestination(), f.GetDestinationPort(), f.GetRuleName(), pol, f.GetProtocol())
}

// TestFirewallFlows sends real traffic between workloads, across the VXLAN tunnel and on
// one host, allowed and denied, and checks the flow records each host's agent shows
// through `naplesctl --agent SOCK flows`: each connection's start with the rule that
// allowed it, its end, each denied datagram with the rule that denied it, on the host
// whose firewall decided, with the endpoints at both ends named, and the filters.
func TestFirewallFlows(t *testing.T) {
	const denied = 3
	sc := webDBCluster(t, "server", []uint16{10}, nil)
	sc.apply(t, fwPolicyObject("servers", []string{"server"},
		fwRules(
			allowIn("tcp", fwPorts("7"), "group:client"),
			denyIn("udp", fwPorts("10"), "group:client"),
			allowMulticastReports()), nil))
	sc.waitProgrammed(t)
	web1, db1, db2 := sc.workload("web1"), sc.workload("db1"), sc.workload("db2")

	// A connection across the tunnel and one on host-a, each an exchange and a close.
	port := func(c net.Conn) uint32 { return uint32(netip.MustParseAddrPort(c.LocalAddr().String()).Port()) }
	var ports [2]uint32
	for i, dst := range []*fwWorkload{db2, db1} {
		conn := web1.dial(t, "tcp", netip.AddrPortFrom(dst.addr(4), 7))
		if err := conn.exchange(fwFlowWait); err != nil {
			t.Fatalf("%s: %v", conn.name, err)
		}
		ports[i] = port(conn.c)
		conn.c.Close()
	}
	// Datagrams the policy's ingress[1] denies on host-b.
	udp := web1.dial(t, "udp", netip.AddrPortFrom(db2.addr(4), 10))
	for i := range denied {
		if _, err := udp.c.Write([]byte("a datagram ingress[1] denies")); err != nil {
			t.Fatalf("datagram %d: %v", i, err)
		}
	}
	udpPort := port(udp.c)

	rule0 := "NetworkSecurityPolicy/default/default/servers ingress[0]"
	rule1 := "NetworkSecurityPolicy/default/default/servers ingress[1]"
	w, d1, d2 := web1.addr(4).String(), db1.addr(4).String(), db2.addr(4).String()
	want := map[string][]string{
		// host-b's firewall decides db2's ingress: the connection from web1 and its end,
		// then the denied datagrams.
		"host-b": {
			fmt.Sprintf("allowed started /ingress on host-b db2, peer web1 (%s:%d > %s:7) rule %q of %q, tcp", w, ports[0], d2, rule0, "servers"),
			fmt.Sprintf("allowed ended fin/ingress on host-b db2, peer web1 (%s:%d > %s:7) rule %q of %q, tcp", w, ports[0], d2, rule0, "servers"),
		},
		// host-a's: web1's egress, open, for both connections, and db1's ingress.
		"host-a": {
			fmt.Sprintf("allowed started /egress on host-a web1, peer db2 (%s:%d > %s:7) rule %q of %q, tcp", w, ports[0], d2, "", ""),
			fmt.Sprintf("allowed ended fin/egress on host-a web1, peer db2 (%s:%d > %s:7) rule %q of %q, tcp", w, ports[0], d2, "", ""),
			fmt.Sprintf("allowed started /egress on host-a web1, peer db1 (%s:%d > %s:7) rule %q of %q, tcp", w, ports[1], d1, "", ""),
			fmt.Sprintf("allowed started /ingress on host-a db1, peer web1 (%s:%d > %s:7) rule %q of %q, tcp", w, ports[1], d1, rule0, "servers"),
			fmt.Sprintf("allowed ended fin/egress on host-a web1, peer db1 (%s:%d > %s:7) rule %q of %q, tcp", w, ports[1], d1, "", ""),
			fmt.Sprintf("allowed ended fin/ingress on host-a db1, peer web1 (%s:%d > %s:7) rule %q of %q, tcp", w, ports[1], d1, rule0, "servers"),
			fmt.Sprintf("allowed started /egress on host-a web1, peer db2 (%s:%d > %s:10) rule %q of %q, udp", w, udpPort, d2, "", ""),
		},
	}
	for range denied {
		want["host-b"] = append(want["host-b"],
			fmt.Sprintf("denied denied policy/ingress on host-b db2, peer web1 (%s:%d > %s:10) rule %q of %q, udp", w, udpPort, d2, rule1, "servers"))
	}
	// The flows of these connections alone: those of the probes before are left out.
	ours := func(f *delphiv1.Flow) bool {
		p := f.GetSourcePort()
		return f.GetSource() == w && (p == ports[0] || p == ports[1] || p == udpPort)
	}
	for _, host := range []string{"host-a", "host-b"} {
		var got []string
		waitFor(t, fmt.Sprintf("%s's agent to show %d flow records of the test's connections", host, len(want[host])), func() bool {
			got = got[:0]
			for _, f := range sc.hostFlows(t, host, "--from", "web1") {
				if ours(f) {
					got = append(got, flowText(f))
				}
			}
			return len(got) >= len(want[host])
		})
		// Each record names the networks of its endpoint and its peer.
		for _, f := range sc.hostFlows(t, host, "--from", "web1") {
			if !ours(f) {
				continue
			}
			if n := f.GetNetwork(); n.GetName() != fwNetwork || n.GetKind() != nimbusv1.Kind_KIND_NETWORK {
				t.Errorf("%s: the record %s names network %v, want %s", host, flowText(f), n, fwNetwork)
			}
			if f.GetPeerEndpoint() != nil && f.GetPeerNetwork().GetName() != fwNetwork {
				t.Errorf("%s: the record %s names the peer's network %v, want %s", host, flowText(f), f.GetPeerNetwork(), fwNetwork)
			}
		}
		// A host's records of one connection may interleave with another's; each is in
		// order.
		if !sameMultiset(got, want[host]) {
			t.Errorf("%s's flow records:\n%s\nwant, in some order:\n%s", host, strings.Join(got, "\n"), strings.Join(want[host], "\n"))
		}
	}

	// The filters: by verdict, by endpoint name as the destination, by policy.
	deniedFlows := sc.hostFlows(t, "host-b", "--verdict", "denied", "--to", "db2")
	var n int
	for _, f := range deniedFlows {
		if f.GetVerdict() != "denied" || f.GetEndpoint().GetName() != "db2" || f.GetDirection() != "ingress" {
			t.Errorf("--verdict denied --to db2 printed %s", flowText(f))
		}
		if ours(f) {
			n++
		}
	}
	if n != denied {
		t.Errorf("--verdict denied --to db2: %d records of the test's datagrams, want %d", n, denied)
	}
	for _, f := range sc.hostFlows(t, "host-a", "--policy", "servers") {
		if f.GetPolicy().GetName() != "servers" || f.GetEndpoint().GetName() != "db1" {
			t.Errorf("--policy servers on host-a printed %s", flowText(f))
		}
	}
	// Bad input names the flag and the value.
	h := sc.host("host-a")
	_, err := sc.c.ctl(t, "", "--agent", filepath.Join(h.c.dir, "agent-"+h.name+".sock"), "flows", "--verdict", "maybe")
	if err == nil || !strings.Contains(err.Error(), `verdict "maybe"`) {
		t.Errorf("flows --verdict maybe: %v, want an error naming the verdict", err)
	}
}

// udpSockets returns n UDP sockets of the workload connected to dst, and their ports.
func udpSockets(t testing.TB, w *fwWorkload, dst netip.AddrPort, n int) ([]*fwConn, map[uint32]bool) {
	t.Helper()
	conns := make([]*fwConn, n)
	ports := map[uint32]bool{}
	for i := range conns {
		conns[i] = w.dial(t, "udp", dst)
		ports[uint32(netip.MustParseAddrPort(conns[i].c.LocalAddr().String()).Port())] = true
	}
	return conns, ports
}

// webDBCluster starts a small cluster of web1 and db1 on host-a and db2 on host-b, web1
// in group client, db2 in group server and db1 in db1Group, each serving TCP echo on
// port 7 and UDP on the ports, the hosts' agents taking the flags, by host index.
func webDBCluster(t testing.TB, db1Group string, udp []uint16, agentFlags [][]string) *fwSmallCluster {
	t.Helper()
	defs := fwDefs("web1", "db1", "db2")
	groups := map[string][]string{"web1": {"client"}, "db1": {db1Group}, "db2": {"server"}}
	return newFWSmallCluster(t, fwSmallSpec{
		workloads:  defs,
		endpoints:  fwEndpointsOf(defs, groups),
		objs:       []*nimbusv1.Object{fwGroupObject("client"), fwGroupObject("server")},
		tcp:        []uint16{7},
		udp:        udp,
		agentFlags: agentFlags,
	})
}

// sameMultiset tells whether a and b hold the same strings, as many times each.
func sameMultiset(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	count := map[string]int{}
	for _, s := range a {
		count[s]++
	}
	for _, s := range b {
		if count[s]--; count[s] < 0 {
			return false
		}
	}
	return true
}

// TestFirewallFlowsBurstAccounting floods host-b's firewall, whose flow ring holds one
// page of records, with new connections faster than its agent takes their records: a
// datagram from a port of its own for each. Every connection is then either a record the
// agent shows or a record counted lost, exactly, and the loss shows in the agent's metric
// and in naplesctl flows.
func TestFirewallFlowsBurstAccounting(t *testing.T) {
	const datagrams = 3000
	sc := clientServerCluster(t, "9", "--fw-flow-ring-bytes", "4096")
	web1, db2 := sc.workload("web1"), sc.workload("db2")
	tel := sc.host("host-b").telemetry(t)
	const lostSeries = "naples_agent_flow_records_lost_total"
	lost0 := tel.metrics(t)[lostSeries]

	// The sockets first, then the datagrams back to back.
	dst := netip.AddrPortFrom(db2.addr(4), 9)
	conns, ports := udpSockets(t, web1, dst, datagrams)
	for i, c := range conns {
		if _, err := c.c.Write([]byte("a new flow")); err != nil {
			t.Fatalf("datagram %d: %v", i, err)
		}
	}
	for _, c := range conns {
		c.c.Close()
	}

	// Records shown plus records lost must come to the datagrams sent, exactly; the
	// firewall's reply-less datagrams of other flows write none.
	w := web1.addr(4).String()
	var shown int
	var lost float64
	waitFor(t, fmt.Sprintf("host-b to account for every one of %d new flows", datagrams), func() bool {
		shown = 0
		for _, f := range sc.hostFlows(t, "host-b", "--from", w, "--to", dst.Addr().String()) {
			if f.GetEvent() == delphiv1.FlowEvent_FLOW_EVENT_STARTED && f.GetDestinationPort() == 9 && ports[f.GetSourcePort()] {
				shown++
			}
		}
		lost = tel.metrics(t)[lostSeries] - lost0
		return shown+int(lost) >= datagrams
	})
	t.Logf("%d new flows: %d records shown, %d counted lost", datagrams, shown, int(lost))
	if shown+int(lost) != datagrams || lost == 0 {
		t.Errorf("%d records shown and %v lost for %d new flows: want every one either, and some lost (a ring of one page)", shown, lost, datagrams)
	}
	// The ring's gauges: its size, and what the agent has not read of it, within it.
	m := tel.metrics(t)
	if size, pending := m["naples_agent_flow_ring_size_bytes"], m["naples_agent_flow_ring_pending_bytes"]; size != 4096 || pending < 0 || pending > size {
		t.Errorf("the flow ring's gauges: size %v, pending %v; want 4096 and within it", size, pending)
	}
	// naplesctl says so too.
	h := sc.host("host-b")
	cmd := exec.Command(filepath.Join(bin, "naplesctl"), "--agent", filepath.Join(h.c.dir, "agent-"+h.name+".sock"), "flows", "--last", "1")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("naplesctl flows: %v: %s", err, stderr.String())
	}
	if !strings.Contains(stderr.String(), "lost") {
		t.Errorf("naplesctl flows said nothing of the lost records on standard error: %q", stderr.String())
	}
}

// clientServerCluster starts a small cluster of web1 on host-a, in group client, and db2
// on host-b, in group server, which a policy lets the clients reach over UDP on the ports
// (a port or a range) and over TCP on port 7, db2's echo; host-b's agent keeps 65,536 flow records, serves its metrics and
// takes the extra flags.
func clientServerCluster(t testing.TB, udpPorts string, hostBFlags ...string) *fwSmallCluster {
	t.Helper()
	defs := fwDefs("web1", "db2")
	groups := map[string][]string{"web1": {"client"}, "db2": {"server"}}
	sc := newFWSmallCluster(t, fwSmallSpec{
		workloads:  defs,
		endpoints:  fwEndpointsOf(defs, groups),
		objs:       []*nimbusv1.Object{fwGroupObject("client"), fwGroupObject("server")},
		tcp:        []uint16{7},
		udp:        []uint16{9},
		agentFlags: [][]string{nil, slices.Concat([]string{"--flows-ring", "65536"}, metricsFlags, hostBFlags)},
	})
	sc.apply(t, fwPolicyObject("servers", []string{"server"},
		fwRules(allowIn("udp", fwPorts(udpPorts), "group:client"), allowIn("tcp", fwPorts("7"), "group:client"), allowMulticastReports()), nil))
	sc.waitProgrammed(t)
	return sc
}
