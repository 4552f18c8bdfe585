package nimbusclient

import (
	"net"
	"path/filepath"
	"slices"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/naplesnet/naples/internal/telemetry/telemetrytest"
	"github.com/naplesnet/naples/internal/testetcd"
	"github.com/naplesnet/naples/nimbus"
)

// TestFailoverFromAReplicaCutOffFromEtcd runs a client of two nimbus replicas on one etcd,
// each reaching etcd through a proxy of its own. When the watched replica is cut off from
// etcd, the client moves to the other and resumes there, without a snapshot, and a change
// applied to the other arrives.
func TestFailoverFromAReplicaCutOffFromEtcd(t *testing.T) {
	c := testetcd.Start(t, 1)
	var replicas [2]*replica
	proxies := map[*replica]*testetcd.Proxy{}
	for i := range replicas {
		p := c.NewProxy(t, 0)
		lis, err := net.Listen("unix", filepath.Join(t.TempDir(), "nimbus.sock"))
		if err != nil {
			t.Fatal(err)
		}
		replicas[i] = serveReplica(t, lis, nimbus.Options{Logger: quiet, Etcd: &nimbus.EtcdOptions{
			Config: clientv3.Config{Endpoints: []string{p.Endpoint()}}, ProgressTimeout: time.Second}})
		proxies[replicas[i]] = p
	}
	waitFor(t, "both replicas ready", func() bool {
		return len(replicas[0].srv.Ready()) == 0 && len(replicas[1].srv.Ready()) == 0
	})
	replicas[0].apply(t, "r1", "a")
	a, reg := failoverClient(t, replicas[0].addr+","+replicas[1].addr)
	waitFor(t, "the first snapshot", func() bool { return slices.Equal(a.names(), []string{"r1"}) })
	watched, other := watchedReplica(t, replicas)

	start := time.Now()
	proxies[watched].Cut()
	waitFor(t, "the client to watch "+other.addr, func() bool { return other.watchers(t) == 1 })
	t.Logf("the client moved %v after the cut", time.Since(start))
	waitMetric(t, reg, seriesWatchServer(other.addr), "to be 1", func(v float64) bool { return v == 1 })
	waitMetric(t, reg, seriesResumes, "to count the resume on "+other.addr, func(v float64) bool { return v == 1 })
	if v := telemetrytest.Values(t, reg)[seriesSnapshots]; v != 1 {
		t.Fatalf("%s = %v after the move, want 1: the client should resume, not take a snapshot", seriesSnapshots, v)
	}
	other.apply(t, "r2", "a")
	waitFor(t, "r2 from "+other.addr, func() bool { return slices.Equal(a.names(), []string{"r1", "r2"}) })
}
