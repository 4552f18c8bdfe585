package linux

import (
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/naplesnet/naples/delphi"
	"github.com/naplesnet/naples/hal"
	"github.com/naplesnet/naples/internal/testns"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// BenchmarkHALEndpoints measures the HAL alone programming N remote endpoints (each a MAC
// and an IPv4 address in one network, on one of 16 remote nodes), against the floor of
// `bridge -batch` (the MAC's `self ... dst VTEP` and `master` entries) and `ip -batch`
// (the address's permanent neighbour) writing the same entries into a fresh namespace.
// The HAL is timed from Run until every endpoint is PROGRAMMED, and then from the
// deletion of every endpoint in one delphi transaction until every status is gone; the
// floor runs the two batches one after the other, adding and then deleting. The CPU
// metrics are the benchmark process's user and system time while the HAL worked, per
// endpoint: on a machine whose cores are shared they tell more than the rates. N is
// 10,000; run with -benchtime 1x.
func BenchmarkHALEndpoints(b *testing.B) {
	const n = 10_000
	testns.RequireRoot(b)
	var halAdd, halDel, addCPU, delCPU, toolAdd, toolDel time.Duration
	for range b.N {
		add, del, acpu, dcpu := benchEndpointsHAL(b, n)
		halAdd, halDel, addCPU, delCPU = halAdd+add, halDel+del, addCPU+acpu, delCPU+dcpu
		add, del = benchEndpointsBatch(b, n)
		toolAdd, toolDel = toolAdd+add, toolDel+del
	}
	total := float64(b.N * n)
	rate := func(d time.Duration) float64 { return total / d.Seconds() }
	b.ReportMetric(rate(halAdd), "hal-add-endpoints/s")
	b.ReportMetric(rate(toolAdd), "batch-add-endpoints/s")
	b.ReportMetric(rate(halAdd)/rate(toolAdd), "add-ratio")
	b.ReportMetric(rate(halDel), "hal-del-endpoints/s")
	b.ReportMetric(rate(toolDel), "batch-del-endpoints/s")
	b.ReportMetric(rate(halDel)/rate(toolDel), "del-ratio")
	b.ReportMetric(float64(addCPU.Microseconds())/total, "hal-add-cpu-µs/endpoint")
	b.ReportMetric(float64(delCPU.Microseconds())/total, "hal-del-cpu-µs/endpoint")
	b.ReportMetric(0, "ns/op")
}

// benchEndpoint returns the i-th endpoint's MAC, IPv4 address and node.
func benchEndpoint(i int) (mac, ip, node string) {
	return fmt.Sprintf("02:00:00:%02x:%02x:%02x", i>>16, (i>>8)&0xff, i&0xff),
		fmt.Sprintf("10.%d.%d.%d", 64+i>>16, (i>>8)&0xff, i&0xff),
		fmt.Sprintf("node-%d", i%16)
}

// benchVTEP returns the VTEP address of node-i.
func benchVTEP(i int) string { return fmt.Sprintf("192.0.2.%d", 10+i%16) }

// benchEndpointsHAL times the HAL adding and then deleting n remote endpoints, and
// measures the CPU time (user and system) the process spent meanwhile.
func benchEndpointsHAL(b *testing.B, n int) (add, del, addCPU, delCPU time.Duration) {
	b.StopTimer()
	defer b.StartTimer()
	h := newEPHost(b, "naples-bench", "node-local")
	network := epNetwork("net1", "100", 0, "10.64.0.0/10")
	netID := network.Key().ID()
	h.networkDevices(b, netID, "100", "192.0.2.1")
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	h.rec.log = logger

	txn := &delphi.DesiredTxn{}
	txn.Put(network)
	for i := range 16 {
		txn.Put(epNode(fmt.Sprintf("node-%d", i), benchVTEP(i)))
	}
	keys := make(map[string]*nimbusv1.ObjectKey, n)
	for i := range n {
		mac, ip, node := benchEndpoint(i)
		o := epEndpoint(fmt.Sprintf("ep%06d", i), "net1", node, "", mac, ip)
		keys[o.Key().ID()] = o.Key()
		txn.Put(o)
	}
	if err := h.desired.Commit(txn); err != nil {
		b.Fatal(err)
	}
	h.desired.MarkSynced()
	// Statuses of the network and the nodes are written too (Unsupported: no reconciler).
	watched := map[string]*nimbusv1.ObjectKey{netID: network.Key()}
	for i := range 16 {
		watched[NodeKey(fmt.Sprintf("node-%d", i)).ID()] = NodeKey(fmt.Sprintf("node-%d", i))
	}
	for id, k := range keys {
		watched[id] = k
	}
	t, stats := timeHAL(b, h.store, h.desired, h.rec, logger, watched, keys,
		func(hal.Stats) {
			if got := strings.Count(h.run(b, "bridge", "fdb", "show", "dev", VXLANName(netID)), " static"); got != 2*n {
				b.Fatalf("the HAL programmed %d static FDB entries; want %d", got, 2*n)
			}
		},
		func(hal.Stats) {
			if got := strings.Count(h.run(b, "ip", "neigh", "show", "dev", BridgeName(netID)), "PERMANENT"); got != 0 {
				b.Fatalf("%d neighbours left after every endpoint was deleted", got)
			}
		})
	if st := stats.Kinds[nimbusv1.Kind_KIND_ENDPOINT]; st.KernelWrites != uint64(6*n) || st.Errors != 0 {
		b.Errorf("endpoint stats %+v; want %d kernel writes and no errors", st, 6*n)
	}
	return t.add, t.del, t.addCPU, t.delCPU
}

// benchEndpointsBatch times `bridge -batch` and `ip -batch` adding and then deleting the
// entries of n remote endpoints in a fresh namespace.
func benchEndpointsBatch(b *testing.B, n int) (add, del time.Duration) {
	b.StopTimer()
	defer b.StartTimer()
	h := newEPHost(b, "naples-bench", "node-local")
	netID := epNetwork("net1", "100", 0).Key().ID()
	h.networkDevices(b, netID, "100", "192.0.2.1")
	br, vx := BridgeName(netID), VXLANName(netID)
	var fdbAdd, fdbDel, neighAdd, neighDel strings.Builder
	for i := range n {
		mac, ip, _ := benchEndpoint(i)
		fmt.Fprintf(&fdbAdd, "fdb replace %s dev %s self static dst %s\nfdb replace %s dev %s master static\n", mac, vx, benchVTEP(i), mac, vx)
		fmt.Fprintf(&fdbDel, "fdb del %s dev %s self\nfdb del %s dev %s master\n", mac, vx, mac, vx)
		fmt.Fprintf(&neighAdd, "neigh replace %s lladdr %s dev %s nud permanent\n", ip, mac, br)
		fmt.Fprintf(&neighDel, "neigh del %s dev %s\n", ip, br)
	}
	dir := b.TempDir()
	run := func(tool, name, batch string) time.Duration {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(batch), 0o600); err != nil {
			b.Fatal(err)
		}
		cmd := exec.Command(tool, "-n", h.ns, "-batch", path)
		b.StartTimer()
		start := time.Now()
		out, err := cmd.CombinedOutput()
		d := time.Since(start)
		b.StopTimer()
		if err != nil {
			b.Fatalf("%s -n %s -batch %s: %v\n%s", tool, h.ns, name, err, out)
		}
		return d
	}
	add = run("bridge", "fdb-add", fdbAdd.String()) + run("ip", "neigh-add", neighAdd.String())
	if got := strings.Count(h.run(b, "bridge", "fdb", "show", "dev", vx), " static"); got != 2*n {
		b.Fatalf("bridge -batch added %d static FDB entries; want %d", got, 2*n)
	}
	del = run("bridge", "fdb-del", fdbDel.String()) + run("ip", "neigh-del", neighDel.String())
	return add, del
}
