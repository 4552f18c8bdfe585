//go:build linux

package test

import (
	"context"
	"strings"
	"testing"
	"time"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// waitNodeStatus waits until the node reports the object at its current generation with
// a status for which ok holds, and returns it. With notProgrammed, it fails the test at
// once when the node reports the current generation PROGRAMMED with no reason instead.
func (fc *fwCluster) waitNodeStatus(t testing.TB, kind nimbusv1.Kind, name, node, what string, notProgrammed bool, ok func(*nimbusv1.NodeStatus) bool) *nimbusv1.NodeStatus {
	t.Helper()
	end := time.Now().Add(deadline)
	for {
		gen, ns := fc.nodeStatusOf(t, kind, name, node)
		if ns.GetObservedGeneration() == gen {
			if ok(ns) {
				return ns
			}
			if notProgrammed && ns.GetPhase() == nimbusv1.Phase_PHASE_PROGRAMMED && ns.GetReason() == "" {
				t.Fatalf("%s %s generation %d is PROGRAMMED on %s with no reason; want %s", kind.Name(), name, gen, node, what)
			}
		}
		if time.Now().After(end) {
			t.Fatalf("timed out after %v waiting for %s %s generation %d on %s: %s; last: %v at generation %d, %s: %s, operational %v",
				deadline, kind.Name(), name, gen, node, what, ns.GetPhase(), ns.GetObservedGeneration(), ns.GetReason(), ns.GetMessage(), ns.GetOperational())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// pendingNaming returns a check that a status is PENDING with reason
// WaitingForSecurityGroup and a message naming each of the fields, and no other field.
func pendingNaming(fields []string, others ...string) func(*nimbusv1.NodeStatus) bool {
	return func(ns *nimbusv1.NodeStatus) bool {
		if ns.GetPhase() != nimbusv1.Phase_PHASE_PENDING || ns.GetReason() != "WaitingForSecurityGroup" {
			return false
		}
		for _, f := range fields {
			if !strings.Contains(ns.GetMessage(), f) {
				return false
			}
		}
		for _, f := range others {
			if strings.Contains(ns.GetMessage(), f) {
				return false
			}
		}
		return true
	}
}

// TestFirewallMissingGroup applies policy servers before two of the SecurityGroups it
// names: it attaches to server and webb (spec.attachGroups[1], no such group) and lets
// in tcp/8080 from client and admins (spec.ingress[0].fromGroups[1], no such group).
// db2 lists webb and stray, neither of which exists. Both nodes report the policy
// PENDING with reason WaitingForSecurityGroup and a message naming both fields and
// names; meanwhile it is enforced as written, fail-safe: db2, a member of webb by its
// name alone, is protected (web1 reaches it on tcp/8080, not on tcp/5432). db2's status
// names its missing groups as a warning (firewall.missingGroups) while it stays
// PROGRAMMED. When the groups are applied the policy turns PROGRAMMED at the same
// generation, without being applied again, and db2's warning goes; when admins is
// deleted the policy is PENDING again, naming admins only. host-a's agent does not
// refresh its statuses in the test's time (--fw-stats-interval 1h): its policy status
// follows the groups because their changes re-queue the policy.
func TestFirewallMissingGroup(t *testing.T) {
	defs := fwDefs("web1", "db2")
	groups := map[string][]string{"web1": {"client"}, "db2": {"webb", "stray"}}
	sc := newFWSmallCluster(t, fwSmallSpec{
		workloads: defs,
		endpoints: fwEndpointsOf(defs, groups),
		objs:      []*nimbusv1.Object{fwGroupObject("client"), fwGroupObject("server")},
		tcp:       []uint16{8080, 5432},
		// host-a never refreshes its statuses with counters in the test's time: what
		// makes its policy status change is the group's coming or going alone.
		agentFlags: [][]string{{"--fw-stats-interval", "1h"}, fwStatsFlags},
	})
	policy := nimbusv1.Kind_KIND_NETWORK_SECURITY_POLICY
	endpoint := nimbusv1.Kind_KIND_ENDPOINT
	attach := `spec.attachGroups[1] "webb"`
	from := `spec.ingress[0].fromGroups[1] "admins"`
	strays := `spec.securityGroups[0] "webb", spec.securityGroups[1] "stray"`

	sc.apply(t, fwPolicyObject("servers", []string{"server", "webb"},
		fwRules(allowIn("tcp", fwPorts("8080"), "group:client", "group:admins")), nil))
	for _, node := range fwHosts {
		ns := sc.waitNodeStatus(t, policy, "servers", node, "PENDING WaitingForSecurityGroup naming "+attach+" and "+from, true,
			pendingNaming([]string{attach, from}))
		t.Logf("servers on %s: %s %s: %s", node, ns.GetPhase(), ns.GetReason(), ns.GetMessage())
	}
	// Enforced as written while PENDING: db2, which lists webb, is protected, and lets
	// in what the rule allows from client, and nothing else.
	sc.wantCases(t, "servers PENDING",
		fwCaseOf("web1", "db2", "tcp/8080", true), fwCaseOf("web1", "db2", "tcp/5432", false),
		fwCaseOf("web1", "db2", "tcp6/8080", true), fwCaseOf("web1", "db2", "tcp6/5432", false))
	op := sc.waitOperational(t, endpoint, "db2", "host-b", "firewall.missingGroups naming "+strays, func(op map[string]string) bool {
		return op["firewall.missingGroups"] == strays
	})
	if op["firewall.ingress"] != "protected" {
		t.Errorf("db2 on host-b: firewall.ingress %q, want protected", op["firewall.ingress"])
	}
	if _, ns := sc.nodeStatusOf(t, endpoint, "web1", "host-a"); ns.GetOperational()["firewall.missingGroups"] != "" {
		t.Errorf("web1 on host-a: firewall.missingGroups %q, want none", ns.GetOperational()["firewall.missingGroups"])
	}

	// The groups come: the policy, unchanged, is PROGRAMMED, and db2's warning goes.
	gen, _ := sc.nodeStatusOf(t, policy, "servers", fwHosts[0])
	sc.apply(t, fwGroupObject("webb"), fwGroupObject("admins"), fwGroupObject("stray"))
	sc.waitProgrammed(t)
	for _, node := range fwHosts {
		g, ns := sc.nodeStatusOf(t, policy, "servers", node)
		if g != gen || ns.GetReason() != "" || ns.GetMessage() != "" {
			t.Errorf("servers on %s with its groups: generation %d (was %d), %s: %s; want generation %d, no reason", node, g, gen, ns.GetReason(), ns.GetMessage(), gen)
		}
	}
	sc.waitOperational(t, endpoint, "db2", "host-b", "no firewall.missingGroups", func(op map[string]string) bool {
		_, ok := op["firewall.missingGroups"]
		return !ok
	})

	// A group that goes is missing again.
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	if _, err := sc.api.Delete(ctx, &nimbusv1.DeleteRequest{Key: nimbusv1.NewKey(nimbusv1.Kind_KIND_SECURITY_GROUP, "", "", "admins")}); err != nil {
		t.Fatalf("deleting SecurityGroup admins: %v", err)
	}
	for _, node := range fwHosts {
		sc.waitNodeStatus(t, policy, "servers", node, "PENDING WaitingForSecurityGroup naming "+from+" only", false,
			pendingNaming([]string{from}, attach))
	}
}
