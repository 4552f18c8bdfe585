package test

import (
	"fmt"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/naplesnet/naples/internal/testetcd"
	"github.com/naplesnet/naples/internal/testns"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// statusReconnects is the agent's count of status streams started again.
const statusReconnects = `naples_nimbusclient_reconnects_total{stream="status"}`

// startAgentOnReplicas runs n replicas on a 3-member etcd and host-a's agent given all
// of them, and returns the index of the replica the agent watches.
func startAgentOnReplicas(t *testing.T, n int) (*replicaCluster, *host, int) {
	t.Helper()
	testns.RequireRoot(t)
	etcd := testetcd.Start(t, 3)
	rc := newReplicaCluster(t, etcd, n)
	h := rc.newHostOn(t, "host-a", nil)
	victim := rc.replicaOf(h.waitWatching(t).server)
	if victim < 0 {
		t.Fatalf("host-a watches no replica's address")
	}
	return rc, h, victim
}

// TestStatusesFollowAgentPastKilledReplica runs two replicas on a 3-member etcd and one
// agent given both. Once a route is programmed, the replica the agent reports to is
// SIGKILLed while the agent's status stream is idle: the agent opens its status stream
// on the other replica at once and reports its watermark again there, so that the
// replica, once restarted, hears of it from its peer and says 1/1 PROGRAMMED too.
func TestStatusesFollowAgentPastKilledReplica(t *testing.T) {
	rc, h, victim := startAgentOnReplicas(t, 2)
	if out := rc.mustCtl(t, toDC2, "apply", "-f", "-", "--wait", "--timeout", "30s"); !strings.Contains(out, "1 of 1 programmed on every target node") {
		t.Fatalf("apply --wait printed %q, want the route programmed on its node", out)
	}
	tel := h.telemetry(t)
	before := tel.metrics(t)[statusReconnects]

	rc.kill(t, victim)
	waitFor(t, "host-a's status stream to start again", func() bool { return tel.metrics(t)[statusReconnects] > before })
	rc.restart(t, victim)
	var st *nimbusv1.ObjectStatus
	waitUntil(t, fmt.Sprintf("route to-dc2 programmed on 1/1 nodes through the restarted %s", rc.replicas[victim].name), func() bool {
		_, s, err := rc.via(victim).get(t, "route", "to-dc2")
		st = s
		return err == nil && s.GetProgrammedNodes() == 1 && nodeStatus(s, "host-a").GetPhase() == nimbusv1.Phase_PHASE_PROGRAMMED
	}, func() string { return fmt.Sprintf("its status is %v", st) })
	out, err := rc.via(victim).ctl(t, "", "wait", "route", "to-dc2", "--timeout", "10s")
	if err != nil || !strings.Contains(out, "programmed on 1/1 nodes") {
		t.Errorf("wait through the restarted %s = %q, %v; want programmed on 1/1 nodes", rc.replicas[victim].name, out, err)
	}
}

// TestClientsSkipReplicaNotReady lists first a replica that cannot reach etcd (up, but
// not ready: it refuses every call), then a ready one. naplesctl given both succeeds every
// time, and the agent given both watches the ready one and programs a route applied with
// --wait.
func TestClientsSkipReplicaNotReady(t *testing.T) {
	testns.RequireRoot(t)
	etcd := testetcd.Start(t, 3)
	rc := planReplicas(t, etcd, 2)
	notReady, ready := 0, 1
	// Replica 0's etcd is a member that never starts.
	args := rc.replicas[notReady].args
	unreachable := "unix://" + filepath.Join(t.TempDir(), "no-etcd.sock")
	args[slices.Index(args, "--etcd-endpoints")+1] = unreachable
	rc.start(t, notReady)
	rc.start(t, ready)
	rc.waitReady(t, ready)
	if code, body := rc.readyz(t, notReady); code != http.StatusServiceUnavailable {
		t.Fatalf("the replica without etcd answers /readyz %d %q, want 503", code, body)
	}
	if !strings.HasPrefix(rc.server, rc.replicas[notReady].addr+",") {
		t.Fatalf("the replicas' list %q does not start with the one not ready", rc.server)
	}

	h := rc.newHostOn(t, "host-a", nil)
	if ws := h.waitWatching(t); ws.server != rc.replicas[ready].addr {
		t.Errorf("host-a watches %s, want the ready replica %s", ws.server, rc.replicas[ready].addr)
	}
	const calls = 20
	failed := 0
	for i := range calls {
		if _, err := rc.ctl(t, "", "get", "routes"); err != nil {
			t.Logf("naplesctl --server %s get routes, call %d: %v", rc.server, i+1, err)
			failed++
		}
	}
	if failed > 0 {
		t.Errorf("%d of %d calls of naplesctl get routes failed", failed, calls)
	}
	out, err := rc.ctl(t, toDC2, "apply", "-f", "-", "--wait", "--timeout", "30s")
	if err != nil || !strings.Contains(out, "1 of 1 programmed on every target node") {
		t.Errorf("apply --wait through %s = %q, %v; want the route programmed on its node", rc.server, out, err)
	}
}

// TestFailedStatusFollowsAgentPastKilledReplica runs three replicas on a 3-member etcd
// and one agent given all of them, which reports a watermark and its one exception, a
// route that fails. The replica the agent reports to is SIGKILLed: the agent reports its
// exception and watermark to another one, and every replica, the killed one once
// restarted too, counts the programmed route and the failed one, with the failure's
// message, and holds the node's watermark.
func TestFailedStatusFollowsAgentPastKilledReplica(t *testing.T) {
	rc, h, victim := startAgentOnReplicas(t, 3)
	// Someone else's route holds 203.0.113.0/24 in table 100: naples's route for it fails.
	testns.Run(t, "ip", "-n", h.ns, "route", "add", "203.0.113.0/24", "via", "10.10.0.9", "table", "100")
	taken := strings.NewReplacer("to-dc2", "taken", "198.51.100.0/24", "203.0.113.0/24").Replace(toDC2)
	rc.mustCtl(t, toDC2+"---\n"+taken, "apply", "-f", "-")

	var message string
	// agree waits until replica i counts to-dc2 programmed and taken failed on host-a,
	// with the message the first replica showed.
	agree := func(i int) {
		t.Helper()
		var dc2, tk *nimbusv1.ObjectStatus
		waitUntil(t, fmt.Sprintf("%s to count to-dc2 programmed and taken failed on host-a", rc.replicas[i].name), func() bool {
			var err1, err2 error
			_, dc2, err1 = rc.via(i).get(t, "route", "to-dc2")
			_, tk, err2 = rc.via(i).get(t, "route", "taken")
			if err1 != nil || err2 != nil || dc2.GetProgrammedNodes() != 1 || tk.GetFailedNodes() != 1 || tk.GetProgrammedNodes() != 0 {
				return false
			}
			msg := nodeStatus(tk, "host-a").GetMessage()
			if message == "" {
				message = msg
			}
			return msg != "" && msg == message
		}, func() string { return fmt.Sprintf("to-dc2 %v; taken %v", dc2, tk) })
		if wm := rc.metrics(t, i)["naples_nimbus_status_watermarks"]; wm != 1 {
			t.Errorf("%s holds %v watermarks, want host-a's", rc.replicas[i].name, wm)
		}
	}
	for i := range rc.replicas {
		agree(i)
	}

	tel := h.telemetry(t)
	before := tel.metrics(t)[statusReconnects]
	rc.kill(t, victim)
	waitFor(t, "host-a's status stream to start again", func() bool { return tel.metrics(t)[statusReconnects] > before })
	for i := range rc.replicas {
		if i != victim {
			agree(i)
		}
	}
	rc.restart(t, victim)
	agree(victim)
}
