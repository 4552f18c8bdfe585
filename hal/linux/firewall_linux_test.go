package linux

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/naplesnet/naples/hal"
	"github.com/naplesnet/naples/internal/testns"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// TestPolicyWaitsForItsGroups runs the HAL with the firewall's policy and group
// reconcilers (the eBPF program loaded, its maps pinned in a directory of /sys/fs/bpf, in
// a fresh network namespace) and counter refreshes off. Policy p names group web
// (spec.attachGroups[0]) and group ops (spec.ingress[0].fromGroups[0]); only web exists.
// p is PENDING with reason WaitingForSecurityGroup and a message naming the field and the
// name of ops, and not web; q, whose groups all exist, is PROGRAMMED. When ops comes, p
// turns PROGRAMMED with no reason, though p itself did not change: the group's coming
// re-queues it. When web goes, p is PENDING again, naming spec.attachGroups[0] "web".
func TestPolicyWaitsForItsGroups(t *testing.T) {
	testns.RequireRoot(t)
	ns := testns.Named(t, "fwpol")
	nsh := testns.Handle(t, ns)
	s := newTestStore(t, Indexes())
	dir := filepath.Join("/sys/fs/bpf", fmt.Sprintf("naples-fwpol-%d", os.Getpid()))
	t.Cleanup(func() { os.RemoveAll(dir) })
	fw, err := NewFirewall(FirewallOptions{
		Store: s.store, Node: "host-a", Namespace: &nsh, Dir: dir, Logger: quiet,
		StatsInterval: time.Hour, GCInterval: time.Hour,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fw.Close() })

	group := func(name string) *nimbusv1.Object {
		return &nimbusv1.Object{Meta: &nimbusv1.ObjectMeta{Name: name, Generation: 1},
			Spec: &nimbusv1.Object_SecurityGroup{SecurityGroup: &nimbusv1.SecurityGroupSpec{}}}
	}
	policy := func(name string, attach []string, from ...string) *nimbusv1.Object {
		return &nimbusv1.Object{Meta: &nimbusv1.ObjectMeta{Name: name, Generation: 1},
			Spec: &nimbusv1.Object_NetworkSecurityPolicy{NetworkSecurityPolicy: &nimbusv1.NetworkSecurityPolicySpec{
				AttachGroups: attach,
				Ingress:      []*nimbusv1.PolicyRule{{Action: nimbusv1.PolicyRule_ACTION_ALLOW, Protocol: "tcp", FromGroups: from}},
			}}}
	}
	p, q := policy("p", []string{"web"}, "ops"), policy("q", []string{"web"})
	s.put(t, group("web"), p, q)
	s.desired.MarkSynced()
	runHAL(t, s.store, hal.Options{
		Reconcilers:    []hal.Reconciler{fw.PolicyReconciler(), fw.GroupReconciler()},
		ResyncInterval: -1,
	})

	// status waits until the object's status is in the phase, with a message holding
	// every string of want and none of unwanted.
	status := func(obj *nimbusv1.Object, phase nimbusv1.Phase, reason string, want []string, unwanted ...string) {
		t.Helper()
		var last *nimbusv1.NodeStatus
		waitFor(t, fmt.Sprintf("%s %v %s naming %q", obj.Key().ID(), phase, reason, want), func() bool {
			last, _ = s.store.Status(obj.Key())
			if last.GetPhase() != phase || last.GetReason() != reason {
				return false
			}
			for _, w := range want {
				if !strings.Contains(last.GetMessage(), w) {
					return false
				}
			}
			for _, u := range unwanted {
				if strings.Contains(last.GetMessage(), u) {
					return false
				}
			}
			return true
		})
		t.Logf("%s: %v %s: %s", obj.Key().ID(), last.GetPhase(), last.GetReason(), last.GetMessage())
	}
	pending, programmed := nimbusv1.Phase_PHASE_PENDING, nimbusv1.Phase_PHASE_PROGRAMMED
	ops, web := `spec.ingress[0].fromGroups[0] "ops"`, `spec.attachGroups[0] "web"`

	status(q, programmed, "", nil)
	status(p, pending, ReasonWaitingForSecurityGroup, []string{ops, "no such SecurityGroup in tenant default, namespace default"}, web)
	if st, _ := s.store.Status(p.Key()); st.GetOperationalData().GetSecurityPolicy() == nil || st.GetOperational()["protectedEndpoints"] != "0" {
		t.Errorf("p's status while PENDING: %v; want operational data, protected_endpoints 0", st)
	}

	s.put(t, group("ops"))
	status(p, programmed, "", nil)

	s.del(t, group("web").Key())
	status(p, pending, ReasonWaitingForSecurityGroup, []string{web}, ops)
	status(q, pending, ReasonWaitingForSecurityGroup, []string{web})
}
