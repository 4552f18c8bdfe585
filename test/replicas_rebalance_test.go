package test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/naplesnet/naples/internal/testetcd"
	"github.com/naplesnet/naples/internal/testns"
)

// TestAgentsRebalanceOntoARestartedReplica runs four agents on two replicas that
// rebalance at 5 agents a second with no slack. The second replica is SIGKILLed, so every
// agent watches the first; once it is restarted, the first asks agents to move until each
// replica serves two. Every agent resumed wherever it went (one snapshot, its first), and
// a route applied with --wait is programmed on every node.
func TestAgentsRebalanceOntoARestartedReplica(t *testing.T) {
	testns.RequireRoot(t)
	etcd := testetcd.Start(t, 1)
	rc := newReplicaCluster(t, etcd, 2, "--rebalance-rate", "5", "--rebalance-slack", "0")
	names := []string{"host-a", "host-b", "host-c", "host-d"}
	var hosts []*host
	for _, n := range names {
		hosts = append(hosts, rc.newHostOn(t, n, nil))
	}
	for _, h := range hosts {
		h.waitWatching(t)
	}
	spread := func() []int {
		n := make([]int, len(rc.replicas))
		for _, h := range hosts {
			if i := rc.replicaOf(h.watchStarts(t).server); i >= 0 {
				n[i]++
			}
		}
		return n
	}

	rc.kill(t, 1)
	waitUntil(t, "every agent on r0", func() bool { return spread()[0] == len(hosts) },
		func() string { return fmt.Sprintf("agents per replica %v", spread()) })
	rc.restart(t, 1)
	start := time.Now()
	waitUntil(t, "two agents on each replica", func() bool { n := spread(); return n[0] == 2 && n[1] == 2 },
		func() string { return fmt.Sprintf("agents per replica %v", spread()) })
	t.Logf("the agents spread 2/2 %v after r1 was ready again", time.Since(start))
	for _, h := range hosts {
		if ws := h.watchStarts(t); ws.snapshots != 1 {
			t.Errorf("%s's agent took %d snapshots, want 1: it resumes after every move (%d resumes)", h.name, ws.snapshots, ws.resumes)
		}
	}
	route := strings.Replace(toDC2, "nodes: [host-a]", "nodes: ["+strings.Join(names, ", ")+"]", 1)
	if out, err := rc.ctl(t, route, "apply", "-f", "-", "--wait", "--timeout", "30s"); err != nil || !strings.Contains(out, "1 of 1 programmed on every target node") {
		t.Fatalf("apply --wait = %q, %v; want the route programmed on its 4 nodes", out, err)
	}
}
