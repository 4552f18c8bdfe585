package nimbusclient

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/naplesnet/naples/internal/telemetry/telemetrytest"
	"github.com/naplesnet/naples/internal/testetcd"
	"github.com/naplesnet/naples/nimbus"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

const (
	// seriesMoves counts the times nimbus asked a client to watch another replica.
	seriesMoves = "naples_nimbusclient_moves_total"
	// seriesRebalanced counts the agents a replica asked to move.
	seriesRebalanced = "naples_nimbus_rebalanced_total"
)

// programmed returns how many nodes the replica holds PROGRAMMED, and not stale, for the
// route.
func (r *replica) programmed(t *testing.T, name string) int {
	t.Helper()
	resp, err := r.api.Get(context.Background(), &nimbusv1.GetRequest{Key: routeKey(name)})
	if err != nil {
		t.Fatalf("Get %s from %s: %v", name, r.addr, err)
	}
	n := 0
	for _, st := range resp.GetItem().GetStatus().GetNodes() {
		if st.GetPhase() == nimbusv1.Phase_PHASE_PROGRAMMED && !st.GetStale() {
			n++
		}
	}
	return n
}

// TestRebalanceSpreadsAgentsWithoutResync runs nine agents that list three nimbus replicas
// on one etcd, of which only the first serves when they start, so they all watch it. Once
// the other two serve, the first asks agents to move until each replica serves three;
// every agent that moved resumed (no second snapshot) and started its status stream again,
// none moved more than twice, the spread holds (no agent bounces back), every replica
// holds every node's status, and a change reaches every agent.
func TestRebalanceSpreadsAgentsWithoutResync(t *testing.T) {
	c := testetcd.Start(t, 1)
	dir := t.TempDir()
	var paths, addrs [3]string
	for i := range paths {
		paths[i] = filepath.Join(dir, fmt.Sprintf("nimbus-%d.sock", i+1))
		addrs[i] = "unix://" + paths[i]
	}
	start := func(i int) *replica {
		lis, err := net.Listen("unix", paths[i])
		if err != nil {
			t.Fatal(err)
		}
		r := serveReplica(t, lis, nimbus.Options{
			Logger:      quiet,
			ReplicaName: fmt.Sprintf("nimbus-%d", i+1),
			Rebalance:   nimbus.RebalanceOptions{Rate: 20},
			Etcd: &nimbus.EtcdOptions{
				Config:    clientv3.Config{Endpoints: c.Endpoints()},
				Advertise: addrs[i],
			},
		})
		waitFor(t, fmt.Sprintf("replica %d ready", i+1), func() bool { return len(r.srv.Ready()) == 0 })
		return r
	}
	var replicas [3]*replica
	replicas[0] = start(0)
	replicas[0].apply(t, "r1")

	const agents = 9
	type running struct {
		a   *agent
		reg *prometheus.Registry
	}
	var all []running
	for i := range agents {
		reg := prometheus.NewRegistry()
		a := newAgent(t)
		cl, err := New(Options{Node: fmt.Sprintf("n%d", i+1), Address: strings.Join(addrs[:], ","), Store: a.store,
			Logger: quiet, MaxBackoff: 200 * time.Millisecond, Registerer: reg})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cl.Close() })
		runClient(t, cl)
		all = append(all, running{a, reg})
	}
	for _, r := range all {
		waitFor(t, "the first snapshot", func() bool { return slices.Equal(r.a.names(), []string{"r1"}) })
	}
	waitFor(t, "every agent on the first replica", func() bool { return replicas[0].watchers(t) == agents })
	for _, r := range all {
		if err := r.a.status.Set(routeKey("r1"), &nimbusv1.NodeStatus{ObservedGeneration: 1, Phase: nimbusv1.Phase_PHASE_PROGRAMMED}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "r1 programmed on every node", func() bool { return replicas[0].programmed(t, "r1") == agents })

	begin := time.Now()
	replicas[1], replicas[2] = start(1), start(2)
	spread := func() bool {
		for _, r := range replicas {
			if r.watchers(t) != agents/3 {
				return false
			}
		}
		return true
	}
	waitFor(t, "the agents spread 3/3/3", spread)
	t.Logf("the agents spread 3/3/3 %v after the other replicas started", time.Since(begin))

	// The spread holds: no replica asks an agent to move back.
	time.Sleep(time.Second)
	if !spread() {
		t.Fatalf("the spread did not hold: watchers %v, %v, %v",
			replicas[0].watchers(t), replicas[1].watchers(t), replicas[2].watchers(t))
	}
	moves := 0.0
	for i, r := range all {
		v := telemetrytest.Values(t, r.reg)
		if v[seriesSnapshots] != 1 {
			t.Errorf("agent n%d: %s = %v, want 1: an agent that moves resumes", i+1, seriesSnapshots, v[seriesSnapshots])
		}
		if v[seriesMoves] > 2 {
			t.Errorf("agent n%d moved %v times, want at most 2", i+1, v[seriesMoves])
		}
		if v[seriesResumes] != v[seriesMoves] || v[seriesStatusReconnects] != v[seriesMoves] {
			t.Errorf("agent n%d: %s = %v and %s = %v after %v moves, want as many: each move resumes the watch and starts the status stream again",
				i+1, seriesResumes, v[seriesResumes], seriesStatusReconnects, v[seriesStatusReconnects], v[seriesMoves])
		}
		moves += v[seriesMoves]
	}
	rebalanced := 0.0
	for _, r := range replicas {
		rebalanced += telemetrytest.Values(t, r.srv.Registry())[seriesRebalanced]
	}
	if moves != rebalanced || moves < agents-agents/3 || moves > agents {
		t.Errorf("agents moved %v times, replicas asked %v, want as many, from %d to %d", moves, rebalanced, agents-agents/3, agents)
	}
	t.Logf("%v moves", moves)
	for i, r := range replicas {
		waitFor(t, fmt.Sprintf("r1 programmed on every node at replica %d", i+1), func() bool { return r.programmed(t, "r1") == agents })
	}

	replicas[2].apply(t, "r2")
	for i, r := range all {
		waitFor(t, fmt.Sprintf("r2 at agent n%d", i+1), func() bool { return slices.Equal(r.a.names(), []string{"r1", "r2"}) })
	}
}
