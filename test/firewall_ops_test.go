//go:build linux

package test

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/naplesnet/naples/controller"
	"github.com/naplesnet/naples/internal/pki"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// This file checks what operators see of the firewall: the rule and endpoint counters in
// the statuses at nimbus and in the agent's metrics (TestFirewallCounters), and a policy
// too big for the maps (TestFirewallOverflow).

// fwStatsFlags make the agent refresh the firewall's counters in the statuses often.
var fwStatsFlags = []string{"--fw-stats-interval", "200ms"}

// nodeStatusOf returns the object's generation at nimbus and the status the node reports
// for it (nil when none).
func (fc *fwCluster) nodeStatusOf(t testing.TB, kind nimbusv1.Kind, name, node string) (int64, *nimbusv1.NodeStatus) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	resp, err := fc.api.Get(ctx, &nimbusv1.GetRequest{Key: &nimbusv1.ObjectKey{Kind: kind, Name: name}})
	if err != nil {
		t.Fatalf("getting %s %s from nimbus: %v", kind.Name(), name, err)
	}
	item := resp.GetItem()
	return item.GetObject().GetMeta().GetGeneration(), nodeStatus(item.GetStatus(), node)
}

// waitOperational waits until the node reports the object PROGRAMMED at its current
// generation with operational data for which ok holds, and returns that data.
func (fc *fwCluster) waitOperational(t testing.TB, kind nimbusv1.Kind, name, node, what string, ok func(op map[string]string) bool) map[string]string {
	t.Helper()
	var last *nimbusv1.NodeStatus
	end := time.Now().Add(deadline)
	for {
		gen, ns := fc.nodeStatusOf(t, kind, name, node)
		last = ns
		if ns.GetPhase() == nimbusv1.Phase_PHASE_PROGRAMMED && ns.GetObservedGeneration() == gen && ok(ns.GetOperational()) {
			return ns.GetOperational()
		}
		if time.Now().After(end) {
			t.Fatalf("timed out after %v waiting for %s %s on %s: %s; last status: %v %s at generation %d (current %d), operational %v",
				deadline, kind.Name(), name, node, what, last.GetPhase(), last.GetMessage(), last.GetObservedGeneration(), gen, last.GetOperational())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// controller returns a controller client of the cluster's nimbus, with the publisher's
// certificate.
func (c *cluster) controller(t testing.TB) *controller.Client {
	t.Helper()
	tlsConfig, err := pki.ClientConfig(c.file("publisher.crt"), c.file("publisher.key"), c.file("ca.crt"), pki.DefaultServerName)
	if err != nil {
		t.Fatal(err)
	}
	ctl, err := controller.New(controller.Options{Address: c.server, TLS: tlsConfig})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ctl.Close() })
	return ctl
}

// opCount returns an operational counter, -1 when it is missing or not a number.
func opCount(op map[string]string, name string) int64 {
	v, err := strconv.ParseInt(op[name], 10, 64)
	if err != nil {
		return -1
	}
	return v
}

// ruleCount returns a rule counter of a policy's operational data: a rule no packet hit
// may be left out, and counts 0; -1 when the counter is not a number.
func ruleCount(op map[string]string, name string) int64 {
	if _, ok := op[name]; !ok {
		return 0
	}
	return opCount(op, name)
}

// fwRuleSeries returns the series of a rule metric of the firewall
// (naples_firewall_rule_packets_total or naples_firewall_rule_bytes_total) of the rule
// of the policy (of the default tenant and namespace).
func fwRuleSeries(metric, policy, direction string, index int, action string) string {
	key := &nimbusv1.ObjectKey{Kind: nimbusv1.Kind_KIND_NETWORK_SECURITY_POLICY, Name: policy}
	return fmt.Sprintf("%s{action=%q,direction=%q,policy=%q,rule=%q}", metric, action, direction, key.ID(), strconv.Itoa(index))
}

// TestFirewallCounters sends exactly N UDP datagrams that rule ingress[0] of policy
// servers allows, from web1 (host-a) to db2 (host-b), each echoed (so each went through
// the firewall once), and M that rule ingress[1] denies; ingress[2] allows the multicast
// reports the bridge floods to every port, which would otherwise be denied too. At
// nimbus, host-b's status of the policy counts N packets on ingress[0] and M on
// ingress[1], and their bytes (Ethernet frames); host-a, where the policy protects
// nothing, counts no endpoint. db2's status counts at least N allowed packets and
// exactly M more denied ones than before, and host-b's agent serves the same figures as
// metrics.
func TestFirewallCounters(t *testing.T) {
	const n, m = 40, 25
	defs := fwDefs("web1", "db2")
	groups := map[string][]string{"web1": {"client"}, "db2": {"server"}}
	sc := newFWSmallCluster(t, fwSmallSpec{
		workloads:  defs,
		endpoints:  fwEndpointsOf(defs, groups),
		objs:       []*nimbusv1.Object{fwGroupObject("client"), fwGroupObject("server")},
		tcp:        []uint16{7},
		udp:        []uint16{9, 10},
		agentFlags: [][]string{fwStatsFlags, append(fwStatsFlags, metricsFlags...)},
	})
	// ingress[2] allows the multicast reports, so that the datagrams are all db2's
	// firewall denies.
	sc.apply(t, fwPolicyObject("servers", []string{"server"},
		fwRules(
			allowIn("udp", fwPorts("9"), "group:client"),
			denyIn("udp", fwPorts("10"), "group:client"),
			allowMulticastReports()), nil))
	sc.waitProgrammed(t)
	policy, endpoint := nimbusv1.Kind_KIND_NETWORK_SECURITY_POLICY, nimbusv1.Kind_KIND_ENDPOINT
	sc.waitOperational(t, policy, "servers", "host-a", "no protected endpoint", func(op map[string]string) bool {
		return op["protectedEndpoints"] == "0"
	})
	sc.waitOperational(t, policy, "servers", "host-b", "one protected endpoint, ingress[0] and [1] at 0", func(op map[string]string) bool {
		return op["protectedEndpoints"] == "1" && ruleCount(op, "ingress[0].packets") == 0 && ruleCount(op, "ingress[1].packets") == 0
	})
	base := sc.waitOperational(t, endpoint, "db2", "host-b", "firewall counters", func(op map[string]string) bool {
		return opCount(op, "firewall.deniedPackets") >= 0 && opCount(op, "firewall.allowedPackets") >= 0
	})
	baseDenied := opCount(base, "firewall.deniedPackets")
	t.Logf("db2's firewall counters before the datagrams: %d allowed, %d denied", opCount(base, "firewall.allowedPackets"), baseDenied)
	tel := sc.host("host-b").telemetry(t)
	baseMetric := fwEndpointPackets(t, tel, "db2", "denied")

	web1, db2 := sc.workload("web1"), sc.workload("db2")
	allowed := web1.dial(t, "udp", netip.AddrPortFrom(db2.addr(4), 9))
	var allowedBytes int64
	for i := range n {
		if err := allowed.exchange(fwFlowWait); err != nil {
			t.Fatalf("datagram %d of %d to udp/9: %v", i+1, n, err)
		}
		// The counters count Ethernet frames: 14 bytes of Ethernet, 20 of IPv4, 8 of UDP.
		allowedBytes += int64(14 + 20 + 8 + len(fmt.Sprintf("%s #%09d", allowed.name, i+1)))
	}
	denied := web1.dial(t, "udp", netip.AddrPortFrom(db2.addr(4), 10))
	payload := []byte("a datagram ingress[1] denies")
	for i := range m {
		if _, err := denied.c.Write(payload); err != nil {
			t.Fatalf("datagram %d of %d to udp/10: %v", i+1, m, err)
		}
	}
	deniedBytes := int64(m * (14 + 20 + 8 + len(payload)))

	op := sc.waitOperational(t, policy, "servers", "host-b", fmt.Sprintf("%d packets on ingress[0] and %d on ingress[1]", n, m), func(op map[string]string) bool {
		return opCount(op, "ingress[0].packets") >= n && opCount(op, "ingress[1].packets") >= m
	})
	for _, c := range []struct {
		name string
		want int64
	}{
		{"ingress[0].packets", n}, {"ingress[0].bytes", allowedBytes},
		{"ingress[1].packets", m}, {"ingress[1].bytes", deniedBytes},
	} {
		if got := opCount(op, c.name); got != c.want {
			t.Errorf("host-b's status of servers: %s = %q, want %d (all: %v)", c.name, op[c.name], c.want, op)
		}
	}
	// A controller reads the same hits from nimbus as numbers, typed, summed over the
	// nodes: host-a, where the policy protects nothing, counts none.
	ctl := sc.c.controller(t)
	items, err := ctl.List(t.Context(), controller.Filter{Kind: policy})
	if err != nil || len(items) != 1 {
		t.Fatalf("listing the policies with a controller: %d, %v; want servers", len(items), err)
	}
	hits := controller.PolicyRuleHits(items[0].GetStatus())
	ingress := nimbusv1.PolicyRuleCounters_DIRECTION_INGRESS
	for _, want := range []controller.RuleHits{
		{Direction: ingress, Index: 0, Packets: n, Bytes: uint64(allowedBytes)},
		{Direction: ingress, Index: 1, Packets: m, Bytes: uint64(deniedBytes)},
	} {
		if !slices.Contains(hits, want) {
			t.Errorf("the controller reads servers' rule hits as %+v; want %+v among them", hits, want)
		}
	}
	if a := controller.NodeOperational(items[0].GetStatus(), "host-a").GetSecurityPolicy(); a == nil || a.GetProtectedEndpoints() != 0 || len(a.GetRules()) != 0 {
		t.Errorf("host-a's typed operational data of servers: %v; want no protected endpoint, no hits", a)
	}
	epOp := sc.waitOperational(t, endpoint, "db2", "host-b", fmt.Sprintf("at least %d allowed and %d more denied packets", n, m), func(op map[string]string) bool {
		return opCount(op, "firewall.allowedPackets") >= n && opCount(op, "firewall.deniedPackets") >= baseDenied+m
	})
	if got := opCount(epOp, "firewall.deniedPackets"); got != baseDenied+m {
		t.Errorf("db2's status on host-b: firewall.deniedPackets = %d, want %d + %d denied datagrams (all: %v)", got, baseDenied, m, epOp)
	}
	_, db2Status := sc.nodeStatusOf(t, endpoint, "db2", "host-b")
	if fw := db2Status.GetOperationalData().GetEndpoint().GetFirewall(); !fw.GetIngressProtected() || fw.GetCounters().GetDeniedPackets() != uint64(baseDenied+m) {
		t.Errorf("db2's typed firewall data on host-b: %v; want ingress protected, %d denied packets", fw, baseDenied+m)
	}
	if got := sc.echo["db2"].received(10); got != 0 {
		t.Errorf("db2 received %d datagrams on udp/10; want none", got)
	}

	metrics := tel.metrics(t)
	for _, c := range []struct {
		series string
		want   float64
	}{
		{fwRuleSeries("naples_firewall_rule_packets_total", "servers", "ingress", 0, "allow"), n},
		{fwRuleSeries("naples_firewall_rule_bytes_total", "servers", "ingress", 0, "allow"), float64(allowedBytes)},
		{fwRuleSeries("naples_firewall_rule_packets_total", "servers", "ingress", 1, "deny"), m},
		{fwRuleSeries("naples_firewall_rule_bytes_total", "servers", "ingress", 1, "deny"), float64(deniedBytes)},
	} {
		if got, ok := metrics[c.series]; !ok || got != c.want {
			t.Errorf("host-b's metrics: %s = %v (present %v), want %v", c.series, got, ok, c.want)
		}
	}
	if got := fwEndpointPackets(t, tel, "db2", "denied") - baseMetric; got != m {
		t.Errorf("host-b's metrics: db2's denied packets rose by %v, want %d", got, m)
	}

	// A change that leaves host-b's snapshot as it is, an endpoint of a tenant that no
	// policy protects, is built and swaps nothing in.
	const builds, installs = "naples_firewall_build_seconds_count", "naples_firewall_snapshots_installed_total"
	before := tel.metrics(t)
	sc.apply(t, &nimbusv1.Object{
		Meta: &nimbusv1.ObjectMeta{Tenant: "other", Name: "stray"},
		Spec: &nimbusv1.Object_Endpoint{Endpoint: &nimbusv1.EndpointSpec{
			Network: "elsewhere", Node: "host-a", Mac: "02:00:00:00:99:01", Ips: []string{"10.9.0.1"},
		}},
	})
	waitFor(t, "host-b's firewall to build a snapshot with the new endpoint", func() bool {
		return tel.metrics(t)[builds] > before[builds]
	})
	if got := tel.metrics(t)[installs]; got != before[installs] {
		t.Errorf("host-b's firewall swapped in %v snapshots for an endpoint no policy cares for; want none", got-before[installs])
	}
	metrics = tel.metrics(t)
	if t.Failed() {
		var lines []string
		for series, v := range metrics {
			if strings.HasPrefix(series, "naples_firewall_") {
				lines = append(lines, fmt.Sprintf("%s %v", series, v))
			}
		}
		t.Logf("host-b's firewall metrics:\n%s", strings.Join(lines, "\n"))
	}
}

// waitFailed waits until the node reports the object FAILED at its current generation,
// and returns that status; it fails the test at once if the node reports it PROGRAMMED
// at that generation.
func (fc *fwCluster) waitFailed(t testing.TB, kind nimbusv1.Kind, name, node string) *nimbusv1.NodeStatus {
	t.Helper()
	end := time.Now().Add(deadline)
	for {
		gen, ns := fc.nodeStatusOf(t, kind, name, node)
		if ns.GetObservedGeneration() == gen {
			switch ns.GetPhase() {
			case nimbusv1.Phase_PHASE_FAILED:
				return ns
			case nimbusv1.Phase_PHASE_PROGRAMMED:
				t.Fatalf("%s %s generation %d is PROGRAMMED on %s; want FAILED (operational %v)", kind.Name(), name, gen, node, ns.GetOperational())
			}
		}
		if time.Now().After(end) {
			t.Fatalf("timed out after %v waiting for %s %s generation %d to be FAILED on %s; last: %v at generation %d %s",
				deadline, kind.Name(), name, gen, node, ns.GetPhase(), ns.GetObservedGeneration(), ns.GetMessage())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Series of the firewall's capacity metrics.
const (
	fwSnapshotEntries  = "naples_firewall_snapshot_entries"
	fwSnapshotCapacity = "naples_firewall_snapshot_capacity"
	fwCapacityExceeded = "naples_firewall_capacity_exceeded_total"
	fwFailedPolicies   = "naples_firewall_failed_policies"
)

// fwOverflowCapacity is the snapshot capacity of TestFirewallOverflow's agents.
const fwOverflowCapacity = 64

// TestFirewallOverflow runs both agents with a snapshot of fwOverflowCapacity entries.
// Policy small (db2's ingress takes tcp/8080 from web1's group) fits and is enforced.
// Policy big, on both workloads' groups, has 100 ingress rules with distinct CIDRs: it
// cannot fit, and both nodes report it FAILED with reason CapacityExceeded and a message
// naming the capacity; their metrics count the overflow and the failed policy. small is
// still PROGRAMMED and enforced, and big is not: web1's ingress stays open. Then big is
// updated to three rules: it fits, is PROGRAMMED on both nodes, and enforced with small.
func TestFirewallOverflow(t *testing.T) {
	flags := append([]string{"--fw-snapshot-entries", strconv.Itoa(fwOverflowCapacity)}, metricsFlags...)
	defs := fwDefs("web1", "db2")
	groups := map[string][]string{"web1": {"client"}, "db2": {"server"}}
	sc := newFWSmallCluster(t, fwSmallSpec{
		workloads:  defs,
		endpoints:  fwEndpointsOf(defs, groups),
		objs:       []*nimbusv1.Object{fwGroupObject("client"), fwGroupObject("server")},
		tcp:        []uint16{8080, 5432},
		agentFlags: [][]string{flags, flags},
	})
	tels := map[string]*telemetry{}
	for _, name := range fwHosts {
		tels[name] = sc.host(name).telemetry(t)
	}
	policy := nimbusv1.Kind_KIND_NETWORK_SECURITY_POLICY

	sc.apply(t, fwPolicyObject("small", []string{"server"}, fwRules(allowIn("tcp", fwPorts("8080"), "group:client")), nil))
	sc.waitProgrammed(t)
	smallOnly := []fwCase{
		fwCaseOf("web1", "db2", "tcp/8080", true), fwCaseOf("web1", "db2", "tcp/5432", false),
		fwCaseOf("db2", "web1", "tcp/8080", true), fwCaseOf("db2", "web1", "tcp/5432", true),
	}
	sc.wantCases(t, "small", smallOnly...)
	before := map[string]map[string]float64{}
	for name, tel := range tels {
		m := tel.metrics(t)
		before[name] = m
		t.Logf("%s with small: %v of %v snapshot entries", name, m[fwSnapshotEntries], m[fwSnapshotCapacity])
		if m[fwSnapshotCapacity] != fwOverflowCapacity || m[fwSnapshotEntries] == 0 || m[fwCapacityExceeded] != 0 || m[fwFailedPolicies] != 0 {
			t.Errorf("%s with small: %s %v, %s %v, %s %v, %s %v; want %d, more than 0, 0, 0", name,
				fwSnapshotCapacity, m[fwSnapshotCapacity], fwSnapshotEntries, m[fwSnapshotEntries],
				fwCapacityExceeded, m[fwCapacityExceeded], fwFailedPolicies, m[fwFailedPolicies], fwOverflowCapacity)
		}
	}

	var rules []*nimbusv1.PolicyRule
	for i := range 100 {
		rules = append(rules, allowIn("tcp", fwPorts("9000"), fmt.Sprintf("10.200.%d.0/24", i)))
	}
	sc.apply(t, fwPolicyObject("big", []string{"client", "server"}, rules, nil))
	for _, node := range fwHosts {
		ns := sc.waitFailed(t, policy, "big", node)
		t.Logf("big on %s: %s: %s", node, ns.GetReason(), ns.GetMessage())
		if want := fmt.Sprintf("capacity of %d", fwOverflowCapacity); ns.GetReason() != "CapacityExceeded" || !strings.Contains(ns.GetMessage(), want) {
			t.Errorf("big on %s: FAILED with %s: %q; want reason CapacityExceeded and a message saying %q", node, ns.GetReason(), ns.GetMessage(), want)
		}
		gen, small := sc.nodeStatusOf(t, policy, "small", node)
		if small.GetPhase() != nimbusv1.Phase_PHASE_PROGRAMMED || small.GetObservedGeneration() != gen {
			t.Errorf("small on %s: %v at generation %d (%s); want PROGRAMMED at generation %d", node, small.GetPhase(), small.GetObservedGeneration(), small.GetMessage(), gen)
		}
		m := tels[node].metrics(t)
		if m[fwCapacityExceeded] <= 0 || m[fwFailedPolicies] != 1 {
			t.Errorf("%s with big too big: %s %v, %s %v; want more than 0, 1", node, fwCapacityExceeded, m[fwCapacityExceeded], fwFailedPolicies, m[fwFailedPolicies])
		}
		if m[fwSnapshotEntries] != before[node][fwSnapshotEntries] {
			t.Errorf("%s with big too big: %v snapshot entries, want small's %v", node, m[fwSnapshotEntries], before[node][fwSnapshotEntries])
		}
	}
	sc.wantCases(t, "small, big too big", smallOnly...)

	// big, cut down to three rules, fits: web1's ingress takes tcp/5432 from db2's group
	// only.
	sc.apply(t, fwPolicyObject("big", []string{"client", "server"}, fwRules(
		allowIn("tcp", fwPorts("5432"), "group:server"),
		allowIn("tcp", fwPorts("9000"), "10.200.0.0/24"),
		allowIn("tcp", fwPorts("9000"), "10.200.1.0/24")), nil))
	sc.waitProgrammed(t)
	for node, tel := range tels {
		if m := tel.metrics(t); m[fwFailedPolicies] != 0 {
			t.Errorf("%s with big cut down: %s %v, want 0", node, fwFailedPolicies, m[fwFailedPolicies])
		}
	}
	sc.wantCases(t, "small and big cut down",
		fwCaseOf("web1", "db2", "tcp/8080", true), fwCaseOf("web1", "db2", "tcp/5432", false),
		fwCaseOf("db2", "web1", "tcp/8080", false), fwCaseOf("db2", "web1", "tcp/5432", true))
}
