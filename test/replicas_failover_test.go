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

// TestStatusesFollowAgentPastKilledReplica runs two replicas on a 3-member etcd and one
// agent given both. Once a route is programmed, the replica the agent reports to is
// SIGKILLed while the agent's status stream is idle: the agent opens its status stream
// on the other replica at once and reports every status again there, so that the
// replica, once restarted, hears of them from its peer and says 1/1 PROGRAMMED too.
func TestStatusesFollowAgentPastKilledReplica(t *testing.T) {
	testns.RequireRoot(t)
	etcd := testetcd.Start(t, 3)
	rc := newReplicaCluster(t, etcd, 2)
	h := rc.newHostOn(t, "host-a", nil)
	victim := rc.replicaOf(h.waitWatching(t).server)
	if victim < 0 {
		t.Fatalf("host-a watches no replica's address")
	}
	if out := rc.mustCtl(t, toDC2, "apply", "-f", "-", "--wait", "--timeout", "30s"); !strings.Contains(out, "route/to-dc2 programmed on 1/1 nodes") {
		t.Fatalf("apply --wait printed %q, want the route programmed on 1/1 nodes", out)
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
	if err != nil || !strings.Contains(out, "route/to-dc2 programmed on 1/1 nodes") {
		t.Errorf("apply --wait through %s = %q, %v; want the route programmed on 1/1 nodes", rc.server, out, err)
	}
}
