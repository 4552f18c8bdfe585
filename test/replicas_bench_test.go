package test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"text/tabwriter"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	grpcbackoff "google.golang.org/grpc/backoff"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/naplesnet/naples/controller"
	"github.com/naplesnet/naples/internal/testetcd"
	"github.com/naplesnet/naples/internal/watermark"
	"github.com/naplesnet/naples/nimbusclient"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// BenchmarkReplicas measures nimbus as 3 replicas on a 3-member etcd (store=etcd-3) and,
// in the same run, one nimbus with its embedded store and a durable --data-dir
// (store=embedded-1), under the same load: thousands of light watch clients in the
// benchmark process, each the watch and status uplink of one simulated agent.
//
//	go test -run '^$' -bench Replicas -benchtime 1x -timeout 30m ./test/
//
// Every nimbus is a real cmd/nimbus process serving plaintext (--insecure) on a Unix
// socket, logging at INFO; etcd is real too, fsyncing as in production
// (testetcd.Durable). Publishers write through replica 0.
//
// The layout, with the defaults: 10,000 agents (nodes n00000..n09999) and 10,000 Route
// objects r00000..r09999. The first 100 are for every node (meta.nodes empty); each of
// the others names one node, round robin, so every node receives 100 or 101 objects:
// about a million events per snapshot. The layout of the goals of status watermarks is
// every object for every node, 100 million events and implied statuses:
//
//	NAPLES_BENCH_GLOBAL=10000 go test -run '^$' -bench Replicas -benchtime 1x -timeout 120m ./test/
//
// The clients are simulated agents: raw nimbus.v1 Watch streams, spread evenly over the
// replicas and multiplexed over a few gRPC connections (96 in all by default, 32 per
// replica of three; see benchConnsDefault for why). Each decodes every frame with the
// agent's codec, keeps its epoch and last revision, and holds the generation of each
// object it received and the revision that made it (16 bytes an object). It reconciles
// each frame's objects in a shuffled order: most at once, some 10 or 30 ms later, and 1%
// after 1.5 times watermark.DefaultExceptionAfter, so that they are exceptions first; and
// the nodes of layout.failingNodes, 10 of them, fail benchFailObject, one for every node,
// with a terminal FAILED and a message. It reports as the agent does, with the agent's
// watermark.Reporter and Tracker, on one ReportStatus stream per connection, all the
// clients of that connection together, after checking nimbus's headers say it takes
// watermarks. When a stream fails, the client watches another replica with its epoch and
// revision, as an agent does, and reports on that replica's status stream with a new
// Reporter, everything again.
//
// It measures, per store:
//   - apply-s: ApplyBatch of every object, 128 per call (nimbus's default transaction
//     size on etcd);
//   - snapshot-s: from the first Watch until the last client is SYNCED;
//   - status-settled-s, from the first Watch, and status-settled-after-reports-s, from
//     when no client has an object in flight and every report is sent, until every
//     replica shows the right counts (generation, target, PROGRAMMED and FAILED nodes)
//     of a sample of objects (layout.sample) and of the failing one; status-reports/s
//     counts the reports sent, watermarks included; store-writes-from-status/s is
//     etcd's revision delta over that time (nimbus's own revision with the embedded
//     store), by design 0;
//   - failing-named-by-get and failing-named-by-wait: the FAILED nodes of the failing
//     object every replica's Get names, and the controller's Wait when it fails; the
//     benchmark fails unless both name exactly the failing nodes with their messages;
//   - update-p50-ms and update-p99-ms: one object for every node updated several times,
//     from the Apply until each client has the change, over every (client, update);
//     update-all-p50-ms is the median over updates of the time until the last client has
//     it; update-programmed-p50-ms and -p99-ms until each replica shows it PROGRAMMED on
//     every node on a status watch (WatchStatus, as the controller's Wait and reactors
//     see it; the next update waits for that), over every
//     (update, replica); update-last-report-p50-ms and -p99-ms until the last client
//     queued the report that tells it, and update-over-report-p50-ms and -p99-ms the
//     time from that report until each replica showed it;
//   - rss-MiB/replica and heap-MiB/replica: VmRSS and go_memstats_heap_inuse_bytes of
//     each nimbus once the statuses settled (mean over replicas; the maximum too);
//   - etcd-db-MiB: etcd's database size (maintenance Status DbSize, largest member);
//   - with replicas, one replica (not the publishers') is killed with SIGKILL:
//     failover-s until every one of its clients watches another replica again (the
//     log shows the distribution), failover-resumed and failover-snapshots counting how
//     they started, failover-counts-s until they reported again and every replica left
//     shows the right counts, and after-failover-update-p99-ms, an update that every
//     client must then receive;
//   - nimbus-cpu-s, etcd-cpu-s and clients-cpu-s: CPU time of every nimbus, of every
//     etcd member and of the benchmark process from the first Watch until the statuses
//     settled.
//
// It fails when a client misses the snapshot, an update or the failover, or when a
// replica does not show the right counts. After both stores, it prints the figures side
// by side with their ratio.
//
// The size can be set with the environment: NAPLES_BENCH_AGENTS, NAPLES_BENCH_OBJECTS,
// NAPLES_BENCH_GLOBAL (objects for every node), NAPLES_BENCH_CONNS (connections in all,
// shared by the replicas), NAPLES_BENCH_UPDATES and NAPLES_BENCH_SYNCING (first
// snapshots at once).
func BenchmarkReplicas(b *testing.B) {
	size := replicaBenchSizeFromEnv(b)
	var results []*replicaBenchResult
	for _, store := range []struct {
		name     string
		replicas int
	}{{"etcd-3", 3}, {"embedded-1", 1}} {
		b.Run("store="+store.name, func(b *testing.B) {
			for range b.N {
				res := runReplicaBench(b, size, store.name, store.replicas)
				res.report(b)
				results = append(results, res)
			}
		})
	}
	// The summary goes to standard output: the testing package keeps only the first
	// ten lines of what a benchmark logs.
	if len(results) > 0 {
		fmt.Printf("BenchmarkReplicas, %s:\n%s", size, replicaBenchTable(results))
	}
}

// Defaults of the benchmark's size; see BenchmarkReplicas.
const (
	benchAgentsDefault  = 10_000
	benchObjectsDefault = 10_000
	benchGlobalDefault  = 100
	benchUpdatesDefault = 10
	// benchConnsDefault is how many gRPC connections in all carry the clients' streams,
	// shared evenly by the replicas: so each connection carries as many clients, and its
	// status stream as many clients' reports, with one nimbus as with three replicas, as
	// it does in a fleet, where every agent has a connection and a stream of its own
	// whatever serves it. (With as many connections per replica, one nimbus's streams each
	// carried three times the reports, which it handled in fewer, larger messages: 13 %
	// less CPU than with the replicas' share per connection, at 10,000 agents.) Agents
	// have a connection each, but 10,000 connections would make the benchmark process hold
	// 10,000 HTTP/2 transports (a reader and a writer goroutine, read and write buffers,
	// flow control) next to the clients on the same 2 cores, and each replica as many:
	// that measures connection handling, which has nothing to do with the store. 32
	// connections a replica (96 for one nimbus) are still more than there are cores on
	// either side, so no single connection's reader or writer is the bottleneck, and each
	// carries about a hundred streams. Each stream keeps the 1 MiB window an agent's has,
	// and each connection's window is that times its streams, so sharing a connection does
	// not slow a stream down by flow control. A replica's memory thus leaves out what a
	// connection per agent adds, gRPC's read and write buffers (32 KiB each by default)
	// and transport state: 70 to 100 KiB per connection in a run with a connection per
	// agent, 3,334 on each replica.
	benchConnsDefault = 96
	// benchSyncingDefault is how many clients take their first snapshot at once, at most:
	// the others wait for one of them to be SYNCED. Agents each decode their snapshot on
	// a host of their own; here 10,000 of them share the benchmark's two cores with the
	// replicas, and with every client decoding at once (10⁸ events at 10,000 objects for
	// every node) the gRPC transports' reader goroutines wait so long behind the clients'
	// that their connections miss nimbus's keepalive (a ping answered within 10 s) and
	// close, and each client's stream window (1 MiB) fills: 10 GB held by the benchmark.
	// Every client still watches at once after a failover, which resumes.
	benchSyncingDefault = 1_000
)

// replicaBenchSize is the size of one run.
type replicaBenchSize struct {
	agents, objects, global, conns, updates int
	// syncing is how many clients take their first snapshot at once, at most.
	syncing int
}

func (s replicaBenchSize) String() string {
	return fmt.Sprintf("%d agents, %d objects (%d for every node, the others for one node each), %d connections in all, %d updates",
		s.agents, s.objects, s.global, s.conns, s.updates) + fmt.Sprintf(", %d first snapshots at once", s.syncing)
}

// replicaBenchSizeFromEnv reads the size from the environment, with the defaults.
func replicaBenchSizeFromEnv(b *testing.B) replicaBenchSize {
	b.Helper()
	get := func(name string, def int) int {
		v := os.Getenv(name)
		if v == "" {
			return def
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			b.Fatalf("$%s=%q: want a positive integer", name, v)
		}
		return n
	}
	s := replicaBenchSize{
		agents:  get("NAPLES_BENCH_AGENTS", benchAgentsDefault),
		objects: get("NAPLES_BENCH_OBJECTS", benchObjectsDefault),
		global:  get("NAPLES_BENCH_GLOBAL", benchGlobalDefault),
		conns:   get("NAPLES_BENCH_CONNS", benchConnsDefault),
		updates: get("NAPLES_BENCH_UPDATES", benchUpdatesDefault),
		syncing: get("NAPLES_BENCH_SYNCING", benchSyncingDefault),
	}
	if s.global > s.objects {
		b.Fatalf("$NAPLES_BENCH_GLOBAL=%d: more than the %d objects", s.global, s.objects)
	}
	if s.agents > 100_000 {
		b.Fatalf("$NAPLES_BENCH_AGENTS=%d: at most 100000 (node names have 5 digits)", s.agents)
	}
	return s
}

// benchLongWait bounds each wait of the benchmark for the whole fleet: a snapshot, the
// statuses settling, an update reaching every client, a failover.
const benchLongWait = 5 * time.Minute

// benchApplyBatch is how many objects one ApplyBatch carries: nimbus's default
// --etcd-max-txn-ops, so that every call is one etcd transaction.
const benchApplyBatch = 128

// benchFailObject is the index of the object, one for every node, that benchFailNodes
// nodes fail (FAILED, terminal, with a message), and benchFailNodes how many.
const (
	benchFailObject = 1
	benchFailNodes  = 10
)

// benchUpdateObject is the index of the object the update rounds change, one for every
// node.
const benchUpdateObject = 0

// replicaBenchResult is what one run measured.
type replicaBenchResult struct {
	store    string
	replicas int
	// etcd is whether the store is etcd.
	etcd bool
	// events and reports are the snapshot's events over all clients and the status
	// reports sent while the statuses settled.
	events, reports int64
	apply, snapshot time.Duration
	// settled is from the first Watch until every report is recorded everywhere.
	settled time.Duration
	// storeWrites is etcd's revision delta (with etcd) or nimbus's (embedded) over settled.
	storeWrites int64
	// p50 and p99 are over every (client, update); allP50 is the median over updates of
	// the time until the last client had it.
	p50, p99, allP50 time.Duration
	// settledAfterReports is from when every client had completed its objects and every
	// report was sent until every replica showed the right counts.
	settledAfterReports time.Duration
	// programmedP50 and programmedP99 are over every (update, replica) of the time until
	// the replica showed the change PROGRAMMED on every node; lastReport over updates of
	// the time until the last client queued the report that tells it, and overReport
	// over every (update, replica) of the time from that report until the replica
	// showed it.
	programmedP50, programmedP99 time.Duration
	lastReportP50, lastReportP99 time.Duration
	overReportP50, overReportP99 time.Duration
	// failNamedGet is how many FAILED nodes of the failing object every replica's Get
	// named (the fewest), failNamedWait how many the controller's Wait did, and
	// failWait how long the Wait took to fail.
	failNamedGet, failNamedWait int
	failWait                    time.Duration
	// rss and heap are per replica, in bytes.
	rss, heap []float64
	// cpu is the CPU time each nimbus used from the first Watch until the statuses
	// settled; etcdCPU that of every etcd member together, selfCPU the benchmark
	// process's (the clients).
	cpu              []time.Duration
	etcdCPU, selfCPU time.Duration
	// etcdDB and etcdDBInUse are etcd's database size, largest member.
	etcdDB, etcdDBInUse int64
	// rewatches counts watch streams that ended while no replica was being killed.
	rewatches int64
	// The failover, with replicas.
	failover, failoverP50   time.Duration
	moved, resumed, resyncs int
	afterFailoverP99        time.Duration
	// failoverCounts is from the kill until the moved clients reported again and every
	// replica left showed the right counts.
	failoverCounts time.Duration
}

// report reports the figures with b.ReportMetric.
func (r *replicaBenchResult) report(b *testing.B) {
	b.Helper()
	msOf := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	b.ReportMetric(r.apply.Seconds(), "apply-s")
	b.ReportMetric(r.snapshot.Seconds(), "snapshot-s")
	b.ReportMetric(float64(r.events)/r.snapshot.Seconds(), "snapshot-events/s")
	b.ReportMetric(r.settled.Seconds(), "status-settled-s")
	b.ReportMetric(float64(r.reports)/r.settled.Seconds(), "status-reports/s")
	b.ReportMetric(float64(r.storeWrites)/r.settled.Seconds(), "store-writes-from-status/s")
	b.ReportMetric(msOf(r.p50), "update-p50-ms")
	b.ReportMetric(msOf(r.p99), "update-p99-ms")
	b.ReportMetric(msOf(r.allP50), "update-all-p50-ms")
	b.ReportMetric(msOf(r.programmedP50), "update-programmed-p50-ms")
	b.ReportMetric(msOf(r.programmedP99), "update-programmed-p99-ms")
	b.ReportMetric(msOf(r.lastReportP50), "update-last-report-p50-ms")
	b.ReportMetric(msOf(r.lastReportP99), "update-last-report-p99-ms")
	b.ReportMetric(msOf(r.overReportP50), "update-over-report-p50-ms")
	b.ReportMetric(msOf(r.overReportP99), "update-over-report-p99-ms")
	b.ReportMetric(r.settledAfterReports.Seconds(), "status-settled-after-reports-s")
	b.ReportMetric(float64(r.failNamedGet), "failing-named-by-get")
	b.ReportMetric(float64(r.failNamedWait), "failing-named-by-wait")
	b.ReportMetric(mean(r.rss)/(1<<20), "rss-MiB/replica")
	b.ReportMetric(slices.Max(r.rss)/(1<<20), "rss-max-MiB")
	b.ReportMetric(mean(r.heap)/(1<<20), "heap-MiB/replica")
	b.ReportMetric(slices.Max(r.heap)/(1<<20), "heap-max-MiB")
	var cpu time.Duration
	for _, c := range r.cpu {
		cpu += c
	}
	b.ReportMetric(cpu.Seconds(), "nimbus-cpu-s")
	b.ReportMetric(r.selfCPU.Seconds(), "clients-cpu-s")
	b.ReportMetric(float64(r.rewatches), "rewatches")
	if r.etcd {
		b.ReportMetric(r.etcdCPU.Seconds(), "etcd-cpu-s")
		b.ReportMetric(float64(r.etcdDB)/(1<<20), "etcd-db-MiB")
		b.ReportMetric(float64(r.etcdDBInUse)/(1<<20), "etcd-db-inuse-MiB")
	}
	if r.replicas > 1 {
		b.ReportMetric(r.failover.Seconds(), "failover-s")
		b.ReportMetric(msOf(r.failoverP50), "failover-p50-ms")
		b.ReportMetric(float64(r.resumed), "failover-resumed")
		b.ReportMetric(float64(r.resyncs), "failover-snapshots")
		b.ReportMetric(msOf(r.afterFailoverP99), "after-failover-update-p99-ms")
		b.ReportMetric(r.failoverCounts.Seconds(), "failover-counts-s")
	}
}

// mean returns the mean of xs.
func mean(xs []float64) float64 {
	var sum float64
	for _, x := range xs {
		sum += x
	}
	return sum / float64(len(xs))
}

// replicaBenchTable formats the results side by side, with the ratio of the first to the
// second when there are two. A figure a store does not have (etcd's without etcd, the
// failover's with one nimbus) shows as a dash.
func replicaBenchTable(rs []*replicaBenchResult) string {
	var buf bytes.Buffer
	w := tabwriter.NewWriter(&buf, 0, 0, 2, ' ', tabwriter.AlignRight)
	all := func(*replicaBenchResult) bool { return true }
	withEtcd := func(r *replicaBenchResult) bool { return r.etcd }
	withReplicas := func(r *replicaBenchResult) bool { return r.replicas > 1 }
	row := func(name, unit string, has func(*replicaBenchResult) bool, f func(*replicaBenchResult) float64) {
		fmt.Fprintf(w, "%s\t", name)
		for _, r := range rs {
			if has(r) {
				fmt.Fprintf(w, "%.4g %s\t", f(r), unit)
			} else {
				fmt.Fprintf(w, "–\t")
			}
		}
		if len(rs) == 2 && has(rs[0]) && has(rs[1]) && f(rs[1]) != 0 {
			fmt.Fprintf(w, "%.3g×\t", f(rs[0])/f(rs[1]))
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "store\t")
	for _, r := range rs {
		fmt.Fprintf(w, "%s\t", r.store)
	}
	if len(rs) == 2 {
		fmt.Fprintf(w, "ratio\t")
	}
	fmt.Fprintln(w)
	sec := func(d time.Duration) float64 { return d.Seconds() }
	msOf := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	row("snapshot events", "", all, func(r *replicaBenchResult) float64 { return float64(r.events) })
	row("apply all objects", "s", all, func(r *replicaBenchResult) float64 { return sec(r.apply) })
	row("snapshot to all", "s", all, func(r *replicaBenchResult) float64 { return sec(r.snapshot) })
	row("statuses settled", "s", all, func(r *replicaBenchResult) float64 { return sec(r.settled) })
	row("statuses settled after the reports", "s", all, func(r *replicaBenchResult) float64 { return sec(r.settledAfterReports) })
	row("status reports", "", all, func(r *replicaBenchResult) float64 { return float64(r.reports) })
	row("store writes from status", "", all, func(r *replicaBenchResult) float64 { return float64(r.storeWrites) })
	row("update p50", "ms", all, func(r *replicaBenchResult) float64 { return msOf(r.p50) })
	row("update p99", "ms", all, func(r *replicaBenchResult) float64 { return msOf(r.p99) })
	row("update to all, p50", "ms", all, func(r *replicaBenchResult) float64 { return msOf(r.allP50) })
	row("update PROGRAMMED everywhere, p50", "ms", all, func(r *replicaBenchResult) float64 { return msOf(r.programmedP50) })
	row("update PROGRAMMED everywhere, p99", "ms", all, func(r *replicaBenchResult) float64 { return msOf(r.programmedP99) })
	row("update last agent's report, p50", "ms", all, func(r *replicaBenchResult) float64 { return msOf(r.lastReportP50) })
	row("update last agent's report, p99", "ms", all, func(r *replicaBenchResult) float64 { return msOf(r.lastReportP99) })
	row("update shown after last report, p50", "ms", all, func(r *replicaBenchResult) float64 { return msOf(r.overReportP50) })
	row("update shown after last report, p99", "ms", all, func(r *replicaBenchResult) float64 { return msOf(r.overReportP99) })
	row("failing nodes named by Get", "", all, func(r *replicaBenchResult) float64 { return float64(r.failNamedGet) })
	row("failing nodes named by Wait", "", all, func(r *replicaBenchResult) float64 { return float64(r.failNamedWait) })
	row("failing object's Wait", "ms", all, func(r *replicaBenchResult) float64 { return msOf(r.failWait) })
	row("RSS per replica", "MiB", all, func(r *replicaBenchResult) float64 { return mean(r.rss) / (1 << 20) })
	row("heap per replica", "MiB", all, func(r *replicaBenchResult) float64 { return mean(r.heap) / (1 << 20) })
	row("nimbus CPU, all replicas", "s", all, func(r *replicaBenchResult) float64 {
		var c time.Duration
		for _, x := range r.cpu {
			c += x
		}
		return sec(c)
	})
	row("etcd CPU", "s", withEtcd, func(r *replicaBenchResult) float64 { return sec(r.etcdCPU) })
	row("clients CPU", "s", all, func(r *replicaBenchResult) float64 { return sec(r.selfCPU) })
	row("etcd db size", "MiB", withEtcd, func(r *replicaBenchResult) float64 { return float64(r.etcdDB) / (1 << 20) })
	row("failover", "s", withReplicas, func(r *replicaBenchResult) float64 { return sec(r.failover) })
	row("failover, p50", "s", withReplicas, func(r *replicaBenchResult) float64 { return sec(r.failoverP50) })
	row("failover resumed", "", withReplicas, func(r *replicaBenchResult) float64 { return float64(r.resumed) })
	row("failover snapshots", "", withReplicas, func(r *replicaBenchResult) float64 { return float64(r.resyncs) })
	row("failover, counts right again", "s", withReplicas, func(r *replicaBenchResult) float64 { return sec(r.failoverCounts) })
	row("update after failover p99", "ms", withReplicas, func(r *replicaBenchResult) float64 { return msOf(r.afterFailoverP99) })
	w.Flush()
	return buf.String()
}

// runReplicaBench runs the benchmark once against the named store with the given number
// of replicas: etcd-3 (replicas on a 3-member etcd) or embedded-1.
func runReplicaBench(b *testing.B, size replicaBenchSize, store string, replicas int) *replicaBenchResult {
	b.Helper()
	res := &replicaBenchResult{store: store, replicas: replicas, etcd: strings.HasPrefix(store, "etcd")}
	var etcd *testetcd.Cluster
	var etcdCli *clientv3.Client
	var rc *replicaCluster
	quiet := []string{"--insecure", "--log-level", "info"}
	if benchProfileDir() != "" {
		quiet = append(quiet, "--pprof")
	}
	if res.etcd {
		etcd = testetcd.Start(b, 3, testetcd.Durable())
		etcdCli = etcd.Client(b)
		// The benchmark's watchers do not follow a replica that asks them to move, and
		// its figures are of a placement it controls: no rebalancing.
		rc = newReplicaCluster(b, etcd, replicas, append(quiet, "--rebalance-rate", "0")...)
	} else {
		rc = newEmbeddedNimbus(b, quiet...)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	apis := make([]nimbusv1.NimbusClient, replicas)
	for i := range apis {
		conn, err := grpc.NewClient(rc.replicas[i].addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20)))
		if err != nil {
			b.Fatal(err)
		}
		defer conn.Close()
		apis[i] = nimbusv1.NewNimbusClient(conn)
	}
	layout := newBenchLayout(size)
	// gens holds the generation every object has, by index.
	gens := make([]int64, size.objects)
	for i := range gens {
		gens[i] = 1
	}
	start := time.Now()
	for i := 0; i < size.objects; i += benchApplyBatch {
		var objs []*nimbusv1.Object
		for j := i; j < min(i+benchApplyBatch, size.objects); j++ {
			objs = append(objs, layout.object(j, 0))
		}
		if _, err := apis[0].ApplyBatch(ctx, &nimbusv1.ApplyBatchRequest{Objects: objs, OmitObjects: true}); err != nil {
			b.Fatalf("applying objects %d to %d: %v", i, i+len(objs)-1, err)
		}
	}
	res.apply = time.Since(start)

	f := newBenchFleet(b, ctx, rc, size, layout)
	// The fleet stops before the replicas do, which the harness does when the benchmark
	// ends: cleanups run last in, first out.
	defer f.stop()

	// The snapshot and the statuses.
	storeRev := func() int64 {
		if etcdCli != nil {
			return benchEtcdRevision(b, ctx, etcdCli)
		}
		return int64(rc.metrics(b, 0)["naples_nimbus_revision"])
	}
	rev0 := storeRev()
	cpu0 := benchCPU(b, rc)
	start = time.Now()
	snapProf := profilePhase(b, rc, store, "snapshot", benchSnapshotProfile(size), -1)
	defer snapProf.wait()
	f.startAll()
	benchWaitUpTo(b, "every client to be SYNCED", benchSnapshotWait(size), 10*time.Millisecond,
		func() bool { return f.synced.Load() == int64(size.agents) },
		func() string { return fmt.Sprintf("%d of %d", f.synced.Load(), size.agents) })
	res.snapshot = time.Duration(f.lastSynced.Load() - start.UnixNano())
	res.events = f.events.Load()

	// Every client reports its snapshot's objects as it completes them; once none has one
	// in flight and every report is sent, every replica must show the right counts.
	benchWait(b, "every client to complete its objects and every report to be sent", func() bool {
		return f.unsettled.Load() == 0 && f.drained(-1)
	}, func() string { return fmt.Sprintf("%d clients with objects in flight", f.unsettled.Load()) })
	reported := time.Now()
	every := make([]int, replicas)
	for i := range every {
		every[i] = i
	}
	benchWantCounts(b, ctx, apis, rc, every, layout, gens)
	res.settled = time.Since(start)
	res.settledAfterReports = time.Since(reported)
	res.reports = f.sent()
	res.storeWrites = storeRev() - rev0
	cpu1 := benchCPU(b, rc)
	for i := range replicas {
		res.cpu = append(res.cpu, cpu1.nimbus[i]-cpu0.nimbus[i])
	}
	res.etcdCPU, res.selfCPU = cpu1.etcd-cpu0.etcd, cpu1.self-cpu0.self
	if n := f.unexpected.Load(); n > 0 {
		b.Errorf("the clients received %d events they could not make sense of", n)
	}
	for i := range replicas {
		res.rss = append(res.rss, float64(benchRSS(b, rc.replicas[i].proc.cmd.Process.Pid)))
		res.heap = append(res.heap, rc.metrics(b, i)["go_memstats_heap_inuse_bytes"])
	}
	if etcdCli != nil {
		res.etcdDB, res.etcdDBInUse = benchEtcdDBSize(b, ctx, etcd, etcdCli)
	}
	benchCheckFailing(b, ctx, apis, rc, layout, res)

	// The updates: the object for every node changed, one change at a time. Each one
	// waits until every replica shows it PROGRAMMED on every node, so that the statuses
	// of one update do not delay the next.
	snapProf.wait()
	var lat, all, programmed, lastReport, overReport []time.Duration
	updProf := profilePhase(b, rc, store, "update", 10*time.Second, -1)
	for round := range size.updates {
		waitShown := benchShowProgrammed(b, ctx, apis, rc, layout.key(benchUpdateObject), int64(round)+2, size.agents)
		l, sent := f.update(b, ctx, apis[0], round)
		all = append(all, slices.Max(l))
		lat = append(lat, l...)
		gens[benchUpdateObject] = int64(round) + 2
		shown := waitShown()
		last := f.lastReported(b, round)
		lastReport = append(lastReport, last.Sub(sent))
		for _, at := range shown {
			programmed = append(programmed, at.Sub(sent))
			overReport = append(overReport, at.Sub(last))
		}
	}
	res.p50, res.p99 = benchPercentile(lat, 0.50), benchPercentile(lat, 0.99)
	res.allP50 = benchPercentile(all, 0.50)
	res.programmedP50, res.programmedP99 = benchPercentile(programmed, 0.50), benchPercentile(programmed, 0.99)
	res.lastReportP50, res.lastReportP99 = benchPercentile(lastReport, 0.50), benchPercentile(lastReport, 0.99)
	res.overReportP50, res.overReportP99 = benchPercentile(overReport, 0.50), benchPercentile(overReport, 0.99)
	res.rewatches = f.rewatches.Load()
	updProf.wait()

	if replicas > 1 {
		// A replica other than the publishers' dies; its clients move to the others.
		const victim = 1
		moved := f.clientsOn(victim)
		before := make([]int32, len(moved))
		reporters := make([]int32, len(moved))
		for k, c := range moved {
			before[k] = c.starts.Load()
			reporters[k] = c.reporters.Load()
		}
		failProf := profilePhase(b, rc, store, "failover", 6*time.Second, victim)
		killed := time.Now()
		rc.kill(b, victim)
		defer failProf.wait()
		benchWait(b, fmt.Sprintf("the %d clients of replica %s to watch another replica", len(moved), rc.replicas[victim].name), func() bool {
			for k, c := range moved {
				if c.starts.Load() == before[k] {
					return false
				}
			}
			return true
		}, func() string {
			n := 0
			for k, c := range moved {
				if c.starts.Load() != before[k] {
					n++
				}
			}
			return fmt.Sprintf("%d of %d moved", n, len(moved))
		})
		var took []time.Duration
		for _, c := range moved {
			took = append(took, time.Duration(c.startedAt.Load()-killed.UnixNano()))
			if r := int(c.replica.Load()); r == victim {
				b.Errorf("client %s watches the killed replica %s again", c.node, rc.replicas[victim].name)
			}
			if c.lastResumed.Load() {
				res.resumed++
			} else {
				res.resyncs++
			}
		}
		res.moved = len(moved)
		res.failover, res.failoverP50 = slices.Max(took), benchPercentile(took, 0.50)
		b.Logf("%s: %d clients of the killed replica watched another one after p10 %v, p50 %v, p90 %v, p99 %v, max %v",
			store, len(moved), benchPercentile(took, 0.10), res.failoverP50, benchPercentile(took, 0.90),
			benchPercentile(took, 0.99), res.failover)
		// The moved clients report everything again on their new replica's status
		// stream; then the counts must be right again on every replica left.
		benchWait(b, "the moved clients to report on their new replica", func() bool {
			for k, c := range moved {
				if c.reporters.Load() == reporters[k] {
					return false
				}
			}
			return f.unsettled.Load() == 0 && f.drained(victim)
		}, func() string { return fmt.Sprintf("%d clients with objects in flight", f.unsettled.Load()) })
		var left []int
		for i := range replicas {
			if i != victim {
				left = append(left, i)
			}
		}
		benchWantCounts(b, ctx, apis, rc, left, layout, gens)
		res.failoverCounts = time.Since(killed)
		// Every client, moved or not, receives the next change.
		l, _ := f.update(b, ctx, apis[0], size.updates)
		res.afterFailoverP99 = benchPercentile(l, 0.99)
	}
	b.Logf("%s: %d agents, %d snapshot events; %d re-watches before any kill",
		store, size.agents, res.events, res.rewatches)
	return res
}

// newEmbeddedNimbus starts one nimbus with the embedded store and a durable data
// directory, as a replicaCluster of one replica so that the harness's start, metrics and
// kill serve it too; extra flags are appended.
func newEmbeddedNimbus(b *testing.B, extra ...string) *replicaCluster {
	b.Helper()
	dir := b.TempDir()
	r := &replica{name: "embedded", addr: "unix://" + filepath.Join(dir, "nimbus.sock")}
	r.args = append([]string{"--listen", r.addr, "--data-dir", filepath.Join(dir, "data"),
		"--metrics", "127.0.0.1:0"}, extra...)
	rc := &replicaCluster{cluster: &cluster{dir: dir, server: r.addr}, replicas: []*replica{r}}
	rc.start(b, 0)
	rc.waitReady(b, 0)
	return rc
}

// benchSnapshotProfile is how long the CPU profiles of the snapshot run: about as long as
// a quiet machine takes to deliver it (47 s at 10,000 agents x 1,000 objects), at most 5
// minutes.
func benchSnapshotProfile(size replicaBenchSize) time.Duration {
	events := float64(size.agents) * float64(size.global+(size.objects-size.global)/max(size.agents, 1))
	return time.Duration(min(max(events/200_000, 5), 300)) * time.Second
}

// benchLayout is which objects exist and which nodes they target.
type benchLayout struct {
	size  replicaBenchSize
	names []string // object names by index
	keys  []*nimbusv1.ObjectKey
	ids   []nimbusv1.Key
	dsts  []string
	nodes []string // node names by client index
}

func newBenchLayout(size replicaBenchSize) *benchLayout {
	l := &benchLayout{size: size, dsts: bulkPrefixes(size.objects)}
	for i := range size.objects {
		name := fmt.Sprintf("r%05d", i)
		l.names = append(l.names, name)
		l.keys = append(l.keys, &nimbusv1.ObjectKey{Kind: nimbusv1.Kind_KIND_ROUTE, Tenant: "default", Namespace: "default", Name: name})
		l.ids = append(l.ids, l.keys[i].Key())
	}
	for i := range size.agents {
		l.nodes = append(l.nodes, fmt.Sprintf("n%05d", i))
	}
	return l
}

// object returns object i as the given update round left it: the first size.global
// objects are for every node, each of the others names one node, round robin.
func (l *benchLayout) object(i, round int) *nimbusv1.Object {
	meta := &nimbusv1.ObjectMeta{Name: l.names[i], Labels: map[string]string{
		"app": fmt.Sprintf("svc-%03d", i%500), "site": fmt.Sprintf("dc%d", 1+i%3), "tier": "backend",
	}}
	if i >= l.size.global {
		meta.Nodes = []string{l.nodes[(i-l.size.global)%l.size.agents]}
	}
	// Two weighted next hops, as an ECMP route is written.
	return &nimbusv1.Object{Meta: meta, Spec: &nimbusv1.Object_Route{Route: &nimbusv1.RouteSpec{
		Table: 100, Prefix: l.dsts[i],
		Nexthops: []*nimbusv1.NextHop{
			{Gateway: fmt.Sprintf("10.10.%d.%d", 1+round/250, 2+round%250), Weight: 2},
			{Gateway: fmt.Sprintf("10.11.%d.%d", 1+round/250, 2+round%250), Weight: 1},
		},
	}}}
}

// failingNodes returns the indexes of the nodes that fail benchFailObject: benchFailNodes
// of them, spread over the nodes; none when benchFailObject is not for every node.
func (l *benchLayout) failingNodes() []int {
	if l.size.global <= benchFailObject {
		return nil
	}
	n := min(benchFailNodes, l.size.agents)
	out := make([]int, n)
	for k := range out {
		out[k] = k * l.size.agents / n
	}
	return out
}

// key returns the key of object i.
func (l *benchLayout) key(i int) *nimbusv1.ObjectKey { return l.keys[i] }

// index returns the index of the object of that name, or -1.
func (l *benchLayout) index(name string) int {
	n, err := strconv.Atoi(strings.TrimPrefix(name, "r"))
	if err != nil || n < 0 || n >= len(l.names) || l.names[n] != name {
		return -1
	}
	return n
}

// benchFleet is the simulated agents, their connections and what they saw.
type benchFleet struct {
	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	layout  *benchLayout
	conns   [][]*benchConn // by replica, then connection
	clients []*benchClient

	// synced counts the clients whose first watch is SYNCED; lastSynced is when the last
	// of them was, in Unix nanoseconds.
	synced     atomic.Int64
	lastSynced atomic.Int64
	// events counts the PUT events of the clients' first complete snapshots.
	events atomic.Int64
	// rewatches counts watch streams that ended while the fleet ran.
	rewatches atomic.Int64
	// unexpected counts events the clients could not make sense of.
	unexpected atomic.Int64
	// unsettled counts the clients that have objects in flight.
	unsettled atomic.Int64
	// syncing holds a token for each client taking its first snapshot.
	syncing chan struct{}

	// received is when each client got each update round, in Unix nanoseconds, by round
	// then client; updateCount counts the clients that got each round. reported is when
	// each client queued the report that tells the round's change is done.
	received    [][]atomic.Int64
	updateCount []atomic.Int64
	reported    [][]atomic.Int64
}

// benchConn is one gRPC connection to a replica, the streams of the clients it carries
// and the status stream they share. The clients queue their reports without waiting, as
// an agent's watch does not wait for its status uplink: a queue without bound, which
// the connection's reporter sends.
type benchConn struct {
	replica int
	conn    *grpc.ClientConn
	api     nimbusv1.NimbusClient
	// mu guards queue.
	mu    sync.Mutex
	queue []*nimbusv1.StatusReport
	// queued counts the reports queued, done those sent or dropped by a failed stream.
	queued, done atomic.Int64
	// sent counts the reports sent.
	sent atomic.Int64
	// wake tells the reporter that the queue has reports.
	wake chan struct{}
	// repMu guards rep, the connection's reporter, made before any client runs.
	repMu sync.Mutex
	rep   *benchReporter
}

// benchReporter is one ReportStatus stream and the goroutine that sends what the
// clients of its connection queue.
type benchReporter struct {
	// stop asks the goroutine to send what is queued, close the stream and wait for
	// nimbus's answer; done is closed once it has.
	stop, done chan struct{}
	// failed is set once the stream failed: the goroutine has ended.
	failed atomic.Bool
	// err is written by the goroutine and read once done is closed.
	err error
}

// benchObj is what a simulated agent holds of one object: its generation, 0 when it
// does not hold it, and the revision that made that generation.
type benchObj struct {
	gen    int64
	genRev uint64
}

// benchDue is a set of objects in flight that a simulated agent completes at a time.
type benchDue struct {
	at   time.Time
	objs []int32
}

// benchClient is one simulated agent: the watch of one node, what it holds and its
// status reports.
type benchClient struct {
	idx  int
	node string
	home int // the replica it watches first
	// fails tells whether the node fails benchFailObject.
	fails bool
	// replica is the replica of its current or last stream.
	replica atomic.Int32
	// starts counts its watch streams that started (RESUMED or SYNCED); startedAt is when
	// the last one did, in Unix nanoseconds; lastResumed whether it resumed.
	starts      atomic.Int32
	startedAt   atomic.Int64
	lastResumed atomic.Bool
	// reporters counts the status streams it reported on.
	reporters atomic.Int32
	// syncing tells whether it holds a token of benchFleet.syncing, owned by its goroutine.
	syncing bool

	// The agent's state, owned by the client's goroutine.
	epoch string
	rev   uint64
	objs  []benchObj // by object index
	// inFlight holds the objects not reconciled yet, which are PENDING; due says when
	// each is.
	inFlight  map[int32]struct{}
	due       []benchDue
	unsettled bool
	// changed holds the keys changed since the last report.
	changed []nimbusv1.Key
	rng     *rand.Rand
	// rep works out the reports of the status stream repStream, on connection bc.
	rep       *watermark.Reporter
	repStream *benchReporter
	bc        *benchConn
	// scratch is what benchSource returns, filled in again on each call.
	scratch struct {
		obj    nimbusv1.Object
		status nimbusv1.NodeStatus
	}
}

// newBenchFleet dials the connections, with their status streams, and makes the
// clients, spread evenly over the replicas; none watches yet.
func newBenchFleet(b *testing.B, parent context.Context, rc *replicaCluster, size replicaBenchSize, layout *benchLayout) *benchFleet {
	b.Helper()
	ctx, cancel := context.WithCancel(parent)
	f := &benchFleet{ctx: ctx, cancel: cancel, layout: layout, syncing: make(chan struct{}, size.syncing)}
	rounds := size.updates + 1
	f.updateCount = make([]atomic.Int64, rounds)
	f.received = make([][]atomic.Int64, rounds)
	f.reported = make([][]atomic.Int64, rounds)
	for i := range f.received {
		f.received[i] = make([]atomic.Int64, size.agents)
		f.reported[i] = make([]atomic.Int64, size.agents)
	}
	replicas := len(rc.replicas)
	connsPer := max(1, size.conns/replicas)
	perConn := (size.agents + replicas*connsPer - 1) / (replicas * connsPer)
	window := int32(min(int64(perConn)<<20, 1<<30))
	for i, r := range rc.replicas {
		var conns []*benchConn
		for range connsPer {
			conn, err := grpc.NewClient(r.addr,
				grpc.WithTransportCredentials(insecure.NewCredentials()),
				nimbusclient.CodecOption(),
				grpc.WithInitialWindowSize(1<<20),
				grpc.WithInitialConnWindowSize(window),
				grpc.WithConnectParams(grpc.ConnectParams{
					Backoff:           grpcbackoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
					MinConnectTimeout: 2 * time.Second,
				}))
			if err != nil {
				b.Fatal(err)
			}
			conn.Connect()
			conns = append(conns, &benchConn{replica: i, conn: conn, api: nimbusv1.NewNimbusClient(conn), wake: make(chan struct{}, 1)})
		}
		f.conns = append(f.conns, conns)
	}
	for _, conns := range f.conns {
		for _, c := range conns {
			benchWait(b, "a connection to be ready", func() bool {
				s := c.conn.GetState()
				if s == connectivity.Idle {
					c.conn.Connect()
				}
				return s == connectivity.Ready
			}, func() string { return c.conn.GetState().String() })
			rep, err := c.openReporter(ctx)
			if err != nil {
				b.Fatal(err)
			}
			c.rep = rep
		}
	}
	failing := layout.failingNodes()
	for i := range size.agents {
		f.clients = append(f.clients, &benchClient{
			idx: i, node: layout.nodes[i], home: i % replicas, fails: slices.Contains(failing, i),
			objs: make([]benchObj, size.objects), inFlight: map[int32]struct{}{},
			rng: rand.New(rand.NewPCG(uint64(i), 22)),
		})
	}
	return f
}

// startAll starts every client's watch.
func (f *benchFleet) startAll() {
	for _, c := range f.clients {
		f.wg.Go(func() { f.run(c) })
	}
}

// stop ends every client and closes the connections.
func (f *benchFleet) stop() {
	f.cancel()
	f.wg.Wait()
	for _, conns := range f.conns {
		for _, c := range conns {
			c.repMu.Lock()
			if c.rep != nil {
				close(c.rep.stop)
				<-c.rep.done
				c.rep = nil
			}
			c.repMu.Unlock()
			c.conn.Close()
		}
	}
}

// clientsOn returns the clients whose current stream is on replica r.
func (f *benchFleet) clientsOn(r int) []*benchClient {
	var out []*benchClient
	for _, c := range f.clients {
		if int(c.replica.Load()) == r {
			out = append(out, c)
		}
	}
	return out
}

// drained tells whether every connection to a replica but skip has sent, or dropped,
// every report queued on it.
func (f *benchFleet) drained(skip int) bool {
	for r, conns := range f.conns {
		for _, c := range conns {
			if r != skip && c.done.Load() != c.queued.Load() {
				return false
			}
		}
	}
	return true
}

// sent returns how many reports the status streams sent.
func (f *benchFleet) sent() int64 {
	var n int64
	for _, conns := range f.conns {
		for _, c := range conns {
			n += c.sent.Load()
		}
	}
	return n
}

// run watches for client c until the fleet stops, moving to another replica whenever a
// stream ends.
func (f *benchFleet) run(c *benchClient) {
	// A client takes its first snapshot once fewer than benchSyncing others are taking
	// theirs; started lets the next one go.
	select {
	case f.syncing <- struct{}{}:
		c.syncing = true
	case <-f.ctx.Done():
		return
	}
	r := c.home
	failures := 0
	for f.ctx.Err() == nil {
		started, _ := f.watch(c, r)
		if f.ctx.Err() != nil {
			return
		}
		f.rewatches.Add(1)
		if started {
			failures = 0
		} else {
			// A replica that refuses at once: back off as agents do, up to a second.
			failures++
			t := time.NewTimer(min(time.Duration(25<<min(failures, 6))*time.Millisecond, time.Second))
			select {
			case <-f.ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
		}
		// Another replica, the clients of one spread over the others.
		if n := len(f.conns); n > 1 {
			r = (r + 1 + (c.idx/n+failures)%(n-1)) % n
		}
	}
}

// benchFrame is what a watch stream's receive returned.
type benchFrame struct {
	frame *nimbusv1.WatchFrame
	err   error
}

// watch runs one watch stream of client c on replica r until it fails, and tells whether
// it started (got RESUMED or SYNCED). It receives on a goroutine of its own, and
// completes the objects in flight as they are due meanwhile.
func (f *benchFleet) watch(c *benchClient, r int) (started bool, err error) {
	conns := f.conns[r]
	bc := conns[(c.idx/len(f.conns))%len(conns)]
	ctx, cancel := context.WithCancel(f.ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	stream, err := bc.api.Watch(ctx, &nimbusv1.WatchRequest{Node: c.node, Epoch: c.epoch, Revision: c.rev})
	if err != nil {
		return false, err
	}
	c.replica.Store(int32(r))
	c.bc = bc
	frames := make(chan benchFrame)
	wg.Go(func() {
		for {
			frame, err := stream.Recv()
			select {
			case frames <- benchFrame{frame, err}:
			case <-ctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	})
	// snap holds the snapshot under way when the client holds objects already: the
	// objects missing from it are gone.
	var snap []benchObj
	var fresh []int32 // objects received that are not reconciled yet
	first := c.starts.Load() == 0
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		timer.Reset(f.nextDue(c))
		var in benchFrame
		select {
		case <-ctx.Done():
			return started, ctx.Err()
		case in = <-frames:
		case <-timer.C:
			if f.complete(c) {
				f.reportStatus(c)
			}
			continue
		}
		if in.err != nil {
			return started, in.err
		}
		for _, ev := range in.frame.GetEvents() {
			switch ev.GetType() {
			case nimbusv1.WatchEvent_TYPE_PUT:
				obj := ev.GetObject()
				meta := obj.GetMeta()
				i := f.layout.index(meta.GetName())
				if i < 0 {
					f.unexpected.Add(1)
					continue
				}
				o := benchObj{gen: meta.GetGeneration(), genRev: obj.GenerationRevision()}
				if !started && len(fresh) == 0 && slices.ContainsFunc(c.objs, func(o benchObj) bool { return o.gen != 0 }) {
					snap = make([]benchObj, len(c.objs))
				}
				fresh = append(fresh, int32(i))
				if !started {
					if snap != nil {
						snap[i] = o
					} else {
						c.objs[i] = o
					}
					continue
				}
				c.objs[i] = o
				c.rev = ev.GetRevision()
				if i == benchUpdateObject {
					f.updated(c, o.gen)
				}
			case nimbusv1.WatchEvent_TYPE_DELETE:
				if i := f.layout.index(ev.GetKey().GetName()); i >= 0 && started {
					c.objs[i] = benchObj{}
					c.changed = append(c.changed, f.layout.ids[i])
					c.rev = ev.GetRevision()
				}
			case nimbusv1.WatchEvent_TYPE_SYNCED:
				if snap != nil {
					for i := range c.objs {
						if c.objs[i].gen != 0 && snap[i].gen == 0 {
							c.changed = append(c.changed, f.layout.ids[i])
						}
					}
					c.objs, snap = snap, nil
				} else if len(fresh) == 0 {
					// An empty snapshot: every object held is gone.
					for i := range c.objs {
						if c.objs[i].gen != 0 {
							c.objs[i] = benchObj{}
							c.changed = append(c.changed, f.layout.ids[i])
						}
					}
				}
				c.epoch, c.rev = strings.Clone(ev.GetEpoch()), ev.GetRevision()
				if first {
					f.events.Add(int64(len(fresh)))
				}
				// The snapshot's first reports go out before the client counts as SYNCED.
				f.reconcile(c, fresh)
				fresh = nil // let go of the snapshot's room
				f.reportStatus(c)
				started = true
				f.started(c, false, first)
			case nimbusv1.WatchEvent_TYPE_RESUMED:
				c.epoch, c.rev = strings.Clone(ev.GetEpoch()), ev.GetRevision()
				started = true
				f.started(c, true, first)
			case nimbusv1.WatchEvent_TYPE_BOOKMARK:
				if started {
					c.rev = ev.GetRevision()
				}
			default:
				f.unexpected.Add(1)
			}
		}
		if started {
			f.reconcile(c, fresh)
			fresh = fresh[:0]
			f.reportStatus(c)
		}
	}
}

// Delays of a simulated agent's reconciliation: of each frame's objects, in a shuffled
// order, benchSoonPerMille complete after benchSoon, benchLaterPerMille after benchLater
// and benchLagPerMille after benchLag, longer than watermark.DefaultExceptionAfter, so
// that they become exceptions first; the others at once.
const (
	benchSoon          = 10 * time.Millisecond
	benchSoonPerMille  = 200
	benchLater         = 30 * time.Millisecond
	benchLaterPerMille = 90
	benchLag           = watermark.DefaultExceptionAfter * 3 / 2
	benchLagPerMille   = 10
)

// reconcile starts the objects the client received: each is in flight until it is due,
// in a shuffled order; benchFailObject fails at once on the nodes that fail it.
func (f *benchFleet) reconcile(c *benchClient, fresh []int32) {
	if len(fresh) == 0 {
		return
	}
	c.rng.Shuffle(len(fresh), func(a, b int) { fresh[a], fresh[b] = fresh[b], fresh[a] })
	now := time.Now()
	var soon, later, lag []int32
	for _, i := range fresh {
		c.changed = append(c.changed, f.layout.ids[i])
		if c.fails && i == benchFailObject {
			continue
		}
		switch p := c.rng.IntN(1000); {
		case p < benchLagPerMille:
			lag = append(lag, i)
		case p < benchLagPerMille+benchLaterPerMille:
			later = append(later, i)
		case p < benchLagPerMille+benchLaterPerMille+benchSoonPerMille:
			soon = append(soon, i)
		default:
			delete(c.inFlight, i) // a change of an object still in flight completes it
			continue
		}
		c.inFlight[i] = struct{}{}
	}
	for _, d := range []benchDue{{now.Add(benchSoon), soon}, {now.Add(benchLater), later}, {now.Add(benchLag), lag}} {
		if len(d.objs) > 0 {
			c.due = append(c.due, d)
		}
	}
}

// nextDue returns how long until the client has something to do: objects due, or the
// next object in flight for its tracker to turn into an exception.
func (f *benchFleet) nextDue(c *benchClient) time.Duration {
	next := time.Hour
	now := time.Now()
	for _, d := range c.due {
		next = min(next, d.at.Sub(now))
	}
	if c.rep != nil {
		if at, ok := c.rep.Tracker().NextAging(); ok {
			next = min(next, at.Sub(now))
		}
	}
	return max(next, 0)
}

// complete completes the client's objects that are due, and tells whether it has
// something to report: completed objects, or objects in flight its tracker may turn
// into exceptions.
func (f *benchFleet) complete(c *benchClient) bool {
	now := time.Now()
	c.due = slices.DeleteFunc(c.due, func(d benchDue) bool {
		if d.at.After(now) {
			return false
		}
		for _, i := range d.objs {
			if _, ok := c.inFlight[i]; ok {
				delete(c.inFlight, i)
				c.changed = append(c.changed, f.layout.ids[i])
			}
		}
		return true
	})
	if len(c.inFlight) == 0 && len(c.due) == 0 {
		c.inFlight = map[int32]struct{}{} // let go of a snapshot's room
	}
	return c.epoch != "" && c.bc != nil
}

// reportStatus queues client c's reports since the last, as the agent's watermark
// reporter works them out, on the status stream of its connection. The client's first
// reporter is told every object it holds; on a new stream it goes on (Restart), as the
// agent's does, and sends its exceptions and watermark again.
func (f *benchFleet) reportStatus(c *benchClient) {
	bc := c.bc
	changed := c.changed
	if rs := bc.reporter(f.ctx); c.rep == nil || c.repStream != rs {
		if c.rep == nil {
			c.rep = watermark.NewReporter(c.node, watermark.Options{})
			changed = f.heldKeys(c)
		} else {
			c.rep.Restart()
		}
		c.repStream = rs
		c.reporters.Add(1)
	}
	var out []*nimbusv1.StatusReport
	_, _ = c.rep.Report(benchSource{f.layout, c}, c.epoch, c.rev, changed, false, nil, func(r *nimbusv1.StatusReport) error {
		out = append(out, r)
		return nil
	})
	c.changed = c.changed[:0]
	if cap(c.changed) > benchSmallRoom {
		c.changed = nil // let go of a snapshot's room
	}
	if len(out) > 0 {
		bc.report(out)
	}
	if o := c.objs[benchUpdateObject]; o.gen >= 2 {
		if _, busy := c.inFlight[benchUpdateObject]; !busy {
			f.reportedUpdate(c, o.gen)
		}
	}
	switch busy := len(c.due) > 0; {
	case busy && !c.unsettled:
		c.unsettled = true
		f.unsettled.Add(1)
	case !busy && c.unsettled:
		c.unsettled = false
		f.unsettled.Add(-1)
	}
}

// heldKeys returns the keys of every object client c holds, with those changed since
// its last report, for a new reporter. The layout's keys, read only, when it holds every
// object: copying ten thousand keys, which hold pointers, for each of thousands of
// clients that move at once took most of a failover's CPU.
func (f *benchFleet) heldKeys(c *benchClient) []nimbusv1.Key {
	held := 0
	for _, o := range c.objs {
		if o.gen != 0 {
			held++
		}
	}
	if held == len(c.objs) {
		// The changed ones are among them.
		return f.layout.ids
	}
	keys := slices.Grow(slices.Clone(c.changed), held)
	for i, o := range c.objs {
		if o.gen != 0 {
			keys = append(keys, f.layout.ids[i])
		}
	}
	return keys
}

// benchSource is what a simulated agent holds, as its watermark reporter reads it.
type benchSource struct {
	layout *benchLayout
	c      *benchClient
}

// Object returns the object with the key as the client holds it, or nil: the client's
// scratch object, filled in again by the next call, which watermark.Source allows.
func (s benchSource) Object(key nimbusv1.Key) *nimbusv1.Object {
	i := s.layout.index(key.Name)
	if i < 0 || s.c.objs[i].gen == 0 {
		return nil
	}
	o := s.c.objs[i]
	obj := &s.c.scratch.obj
	if obj.Meta == nil {
		obj.Meta = &nimbusv1.ObjectMeta{}
	}
	obj.Meta.Name, obj.Meta.Generation, obj.Meta.GenerationRevision = key.Name, o.gen, o.genRev
	return obj
}

// Status returns the client's status of the object with the key: FAILED for
// benchFailObject on a node that fails it, PENDING while it is in flight, PROGRAMMED
// once it is done; nil when the client does not hold it.
func (s benchSource) Status(key nimbusv1.Key) *nimbusv1.NodeStatus {
	i := s.layout.index(key.Name)
	if i < 0 || s.c.objs[i].gen == 0 {
		return nil
	}
	gen := s.c.objs[i].gen
	if s.c.fails && i == benchFailObject {
		return &nimbusv1.NodeStatus{Phase: nimbusv1.Phase_PHASE_FAILED, ObservedGeneration: gen, Terminal: true,
			Reason: benchFailReason, Message: benchFailMessage(s.c.node)}
	}
	// The client's scratch status, filled in again by the next call.
	st := &s.c.scratch.status
	st.Phase, st.ObservedGeneration = nimbusv1.Phase_PHASE_PROGRAMMED, gen
	if _, ok := s.c.inFlight[int32(i)]; ok {
		st.Phase = nimbusv1.Phase_PHASE_PENDING
	}
	return st
}

// benchSmallRoom is how many entries a client's buffers may have room for and still be
// kept: 10,000 clients must not each keep the room of a snapshot.
const benchSmallRoom = 1024

// benchFailReason is the reason of the failing object's FAILED statuses.
const benchFailReason = "BenchRefused"

// benchFailMessage returns the message of the failing object's FAILED status on node.
func benchFailMessage(node string) string {
	return "the benchmark refuses this route on " + node
}

// started records that client c's stream started, resumed or with a snapshot.
func (f *benchFleet) started(c *benchClient, resumed, first bool) {
	now := time.Now().UnixNano()
	c.lastResumed.Store(resumed)
	c.startedAt.Store(now)
	c.starts.Add(1)
	if c.syncing {
		c.syncing = false
		<-f.syncing
	}
	if first {
		for {
			last := f.lastSynced.Load()
			if now <= last || f.lastSynced.CompareAndSwap(last, now) {
				break
			}
		}
		f.synced.Add(1)
	}
}

// updated records that client c received generation gen of the update object.
func (f *benchFleet) updated(c *benchClient, gen int64) {
	round := int(gen) - 2 // generation 1 is the object as first applied
	if round < 0 || round >= len(f.received) {
		return
	}
	if f.received[round][c.idx].CompareAndSwap(0, time.Now().UnixNano()) {
		f.updateCount[round].Add(1)
	}
}

// reportedUpdate records that client c queued the report that tells generation gen of
// the update object is done.
func (f *benchFleet) reportedUpdate(c *benchClient, gen int64) {
	if round := int(gen) - 2; round >= 0 && round < len(f.reported) {
		f.reported[round][c.idx].CompareAndSwap(0, time.Now().UnixNano())
	}
}

// update changes the update object for the given round through api, waits until every
// client has the change and returns how long each took, and when the change was sent.
func (f *benchFleet) update(b *testing.B, ctx context.Context, api nimbusv1.NimbusClient, round int) ([]time.Duration, time.Time) {
	b.Helper()
	sent := time.Now()
	resp, err := api.Apply(ctx, &nimbusv1.ApplyRequest{Object: f.layout.object(benchUpdateObject, round+1)})
	if err != nil {
		b.Fatalf("update %d: %v", round, err)
	}
	if gen := resp.GetObject().GetMeta().GetGeneration(); gen != int64(round)+2 {
		b.Fatalf("update %d stored generation %d, want %d", round, gen, round+2)
	}
	n := int64(len(f.clients))
	benchWait(b, fmt.Sprintf("update %d to reach every client", round), func() bool { return f.updateCount[round].Load() == n },
		func() string { return fmt.Sprintf("%d of %d", f.updateCount[round].Load(), n) })
	lat := make([]time.Duration, len(f.clients))
	for i := range lat {
		lat[i] = time.Duration(f.received[round][i].Load() - sent.UnixNano())
	}
	return lat, sent
}

// lastReported returns when the last client queued the report that tells the round's
// change is done, once every client has.
func (f *benchFleet) lastReported(b *testing.B, round int) time.Time {
	b.Helper()
	var last int64
	benchWait(b, fmt.Sprintf("every client to report update %d", round), func() bool {
		last = 0
		for i := range f.reported[round] {
			at := f.reported[round][i].Load()
			if at == 0 {
				return false
			}
			last = max(last, at)
		}
		return true
	}, func() string { return "some have not" })
	return time.Unix(0, last)
}

// openReporter opens a status stream on the connection, checks that nimbus takes
// watermarks on it, as the agent does from its headers, and starts sending its queue on
// it. A stream that fails drops the reports it took and stops taking more, until
// reporter replaces it.
func (bc *benchConn) openReporter(ctx context.Context) (*benchReporter, error) {
	r := &benchReporter{stop: make(chan struct{}), done: make(chan struct{})}
	stream, err := bc.api.ReportStatus(ctx)
	if err != nil {
		return nil, fmt.Errorf("opening a status stream: %w", err)
	}
	md, err := stream.Header()
	if err != nil {
		return nil, fmt.Errorf("opening a status stream: %w", err)
	}
	if !slices.Contains(md.Get(nimbusv1.StatusWatermarkHeader), "1") {
		return nil, fmt.Errorf("opening a status stream: nimbus does not take status watermarks: headers %v", md)
	}
	go func() {
		defer close(r.done)
		for {
			batch := bc.take()
			if len(batch) == 0 {
				select {
				case <-bc.wake:
					continue
				case <-r.stop:
				}
				if batch = bc.take(); len(batch) == 0 {
					if r.err == nil {
						_, r.err = stream.CloseAndRecv()
					}
					return
				}
			}
			for _, rep := range batch {
				if r.err == nil {
					if r.err = stream.Send(rep); r.err == nil {
						bc.sent.Add(1)
					}
				}
				bc.done.Add(1)
			}
			if r.err != nil {
				r.failed.Store(true)
				bc.dropUntilReplaced(r)
				return
			}
		}
	}()
	return r, nil
}

// dropUntilReplaced drops, as done, the reports queued on the connection after its
// reporter r failed, until another replaces it or the fleet stops: they are of clients
// that watch elsewhere by now, and report everything again there, as agents do on a
// new status stream. A connection that stays down has nobody else to empty its queue.
func (bc *benchConn) dropUntilReplaced(r *benchReporter) {
	for {
		bc.repMu.Lock()
		if bc.rep != r {
			bc.repMu.Unlock()
			// The wake this took may have been the new reporter's.
			select {
			case bc.wake <- struct{}{}:
			default:
			}
			return
		}
		bc.done.Add(int64(len(bc.take())))
		bc.repMu.Unlock()
		select {
		case <-bc.wake:
		case <-r.stop:
			return
		}
	}
}

// reporter returns the connection's reporter, replacing it first with a new stream
// when it failed, as an agent opens a new status stream; the failed one's if no new one
// opens.
func (bc *benchConn) reporter(ctx context.Context) *benchReporter {
	bc.repMu.Lock()
	defer bc.repMu.Unlock()
	if bc.rep.failed.Load() && ctx.Err() == nil {
		if r, err := bc.openReporter(ctx); err == nil {
			bc.rep = r
		}
	}
	return bc.rep
}

// take empties the queue and returns what it held.
func (bc *benchConn) take() []*nimbusv1.StatusReport {
	bc.mu.Lock()
	defer bc.mu.Unlock()
	q := bc.queue
	bc.queue = nil
	return q
}

// report queues reports for the connection's status stream.
func (bc *benchConn) report(reports []*nimbusv1.StatusReport) {
	bc.mu.Lock()
	bc.queue = append(bc.queue, reports...)
	bc.queued.Add(int64(len(reports)))
	bc.mu.Unlock()
	select {
	case bc.wake <- struct{}{}:
	default:
	}
}

// benchWait waits until cond holds, checking it every 10 ms, for up to benchLongWait;
// diag says what the last check found when it does not.
func benchWait(b *testing.B, what string, cond func() bool, diag func() string) {
	b.Helper()
	benchWaitEvery(b, what, 10*time.Millisecond, cond, diag)
}

// benchWaitEvery is benchWait checking every poll.
func benchWaitEvery(b *testing.B, what string, poll time.Duration, cond func() bool, diag func() string) {
	b.Helper()
	benchWaitUpTo(b, what, benchLongWait, poll, cond, diag)
}

// benchWaitUpTo is benchWaitEvery waiting up to limit.
func benchWaitUpTo(b *testing.B, what string, limit, poll time.Duration, cond func() bool, diag func() string) {
	b.Helper()
	end := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(end) {
			b.Fatalf("timed out after %v waiting for %s: %s", limit, what, diag())
		}
		time.Sleep(poll)
	}
}

// benchSnapshotWait bounds the wait for every client's snapshot: benchLongWait, and 20
// seconds more per million events, as the clients share the benchmark's cores (10,000 ×
// 1,000 objects for every node took 77–111 s on a loaded 2-core machine).
func benchSnapshotWait(size replicaBenchSize) time.Duration {
	events := int64(size.agents)*int64(size.global) + int64(size.objects-size.global)
	return benchLongWait + time.Duration(events/1_000_000)*20*time.Second
}

// benchShowProgrammed watches the object's status on every replica from now on, as the
// controller's Wait and reactors do (WatchStatus), and returns a function that waits
// until each replica showed it PROGRAMMED at the generation on n nodes, of n target
// nodes, and returns when each first did.
func benchShowProgrammed(b *testing.B, ctx context.Context, apis []nimbusv1.NimbusClient, rc *replicaCluster, key *nimbusv1.ObjectKey, gen int64, n int) func() []time.Time {
	b.Helper()
	ctx, cancel := context.WithCancel(ctx)
	shown := make([]time.Time, len(apis))
	errs := make([]error, len(apis))
	last := make([]atomic.Pointer[nimbusv1.ObjectStatus], len(apis))
	var wg sync.WaitGroup
	for i, api := range apis {
		stream, err := api.WatchStatus(ctx, &nimbusv1.WatchStatusRequest{Kind: key.GetKind(), Tenant: key.GetTenant(), Namespace: key.GetNamespace(), Name: key.GetName()})
		if err != nil {
			cancel()
			b.Fatalf("replica %s: watching the status of %s: %v", rc.replicas[i].name, key.ID(), err)
		}
		wg.Go(func() {
			for {
				frame, err := stream.Recv()
				if err != nil {
					errs[i] = err
					return
				}
				for _, ev := range frame.GetEvents() {
					st := ev.GetItem().GetStatus()
					if ev.GetType() != nimbusv1.StatusEvent_TYPE_PUT || st == nil {
						continue
					}
					last[i].Store(st)
					if st.GetGeneration() == gen && st.GetTargetNodes() == int32(n) && st.GetProgrammedNodes() == int32(n) {
						shown[i] = time.Now()
						return
					}
				}
			}
		})
	}
	return func() []time.Time {
		b.Helper()
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(benchLongWait):
			cancel()
			<-done
		}
		cancel()
		for i := range apis {
			if shown[i].IsZero() {
				st := last[i].Load()
				b.Fatalf("replica %s never showed %s PROGRAMMED at generation %d on %d nodes: stream ended with %v; last status: generation %d, %d target nodes, %d programmed",
					rc.replicas[i].name, key.ID(), gen, n, errs[i], st.GetGeneration(), st.GetTargetNodes(), st.GetProgrammedNodes())
			}
		}
		return shown
	}
}

// sample returns the indexes of the objects whose counts the benchmark checks: the
// update object, the failing one, the first and last for every node, and some for one
// node, spread.
func (l *benchLayout) sample() []int {
	s := []int{benchUpdateObject, benchFailObject, l.size.global - 1, l.size.global, l.size.objects - 1}
	for k := 1; k <= 5; k++ {
		s = append(s, k*7919%l.size.objects)
	}
	s = slices.DeleteFunc(s, func(i int) bool { return i < 0 || i >= l.size.objects })
	slices.Sort(s)
	return slices.Compact(s)
}

// wantCounts returns the counts every replica must show of object i: target nodes,
// nodes PROGRAMMED and nodes FAILED.
func (l *benchLayout) wantCounts(i int) (target, programmed, failed int32) {
	target = 1
	if i < l.size.global {
		target = int32(l.size.agents)
	}
	if i == benchFailObject {
		failed = int32(len(l.failingNodes()))
	}
	return target, target - failed, failed
}

// benchWantCounts waits until each of the replicas shows the right counts of every
// object of the layout's sample at its generation in gens.
func benchWantCounts(b *testing.B, ctx context.Context, apis []nimbusv1.NimbusClient, rc *replicaCluster, replicas []int, layout *benchLayout, gens []int64) {
	b.Helper()
	for _, r := range replicas {
		for _, i := range layout.sample() {
			target, programmed, failed := layout.wantCounts(i)
			var st *nimbusv1.ObjectStatus
			var err error
			benchWait(b, fmt.Sprintf("replica %s to show %s with its counts", rc.replicas[r].name, layout.key(i).ID()), func() bool {
				var resp *nimbusv1.GetResponse
				resp, err = apis[r].Get(ctx, &nimbusv1.GetRequest{Key: layout.key(i)})
				st = resp.GetItem().GetStatus()
				return err == nil && st.GetGeneration() == gens[i] && st.GetTargetNodes() == target &&
					st.GetProgrammedNodes() == programmed && st.GetFailedNodes() == failed
			}, func() string {
				return fmt.Sprintf("error %v, generation %d (want %d), %d target nodes (want %d), %d programmed (want %d), %d failed (want %d)",
					err, st.GetGeneration(), gens[i], st.GetTargetNodes(), target, st.GetProgrammedNodes(), programmed, st.GetFailedNodes(), failed)
			})
		}
	}
}

// benchCheckFailing checks that every replica's Get of benchFailObject names exactly the
// nodes that fail it, with their messages, and that the controller's Wait for it fails
// naming them, and records how many each named and how long the Wait took.
func benchCheckFailing(b *testing.B, ctx context.Context, apis []nimbusv1.NimbusClient, rc *replicaCluster, layout *benchLayout, res *replicaBenchResult) {
	b.Helper()
	want := map[string]string{}
	for _, i := range layout.failingNodes() {
		want[layout.nodes[i]] = benchFailMessage(layout.nodes[i])
	}
	if len(want) == 0 {
		return
	}
	key := layout.key(benchFailObject)
	check := func(what string, failed []*nimbusv1.NodeStatus) int {
		got := map[string]string{}
		for _, n := range failed {
			got[n.GetNode()] = n.GetMessage()
		}
		if !maps.Equal(got, want) {
			b.Errorf("%s names the FAILED nodes %v of %s, want %v", what, got, key.ID(), want)
		}
		return len(got)
	}
	res.failNamedGet = len(want)
	for i, api := range apis {
		resp, err := api.Get(ctx, &nimbusv1.GetRequest{Key: key})
		if err != nil {
			b.Fatalf("getting %s from replica %s: %v", key.ID(), rc.replicas[i].name, err)
		}
		var failed []*nimbusv1.NodeStatus
		for _, n := range resp.GetItem().GetStatus().GetNodes() {
			if n.GetPhase() == nimbusv1.Phase_PHASE_FAILED {
				failed = append(failed, n)
			}
		}
		res.failNamedGet = min(res.failNamedGet, check("replica "+rc.replicas[i].name+"'s Get", failed))
	}
	ctl, err := controller.New(controller.Options{Address: rc.replicas[0].addr})
	if err != nil {
		b.Fatal(err)
	}
	defer ctl.Close()
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	start := time.Now()
	err = ctl.Wait(wctx, []controller.Target{{Key: key}}, controller.WaitOptions{})
	res.failWait = time.Since(start)
	var werr *controller.WaitError
	if !errors.As(err, &werr) || !errors.Is(err, controller.ErrFailed) {
		b.Errorf("waiting for %s: %v, want it to fail naming its FAILED nodes", key.ID(), err)
		return
	}
	res.failNamedWait = check("the controller's Wait", werr.Failed)
}

// benchPercentile returns the q quantile of ds, nearest rank.
func benchPercentile(ds []time.Duration, q float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[int(q*float64(len(s)-1))]
}

// benchEtcdRevision returns etcd's current revision.
func benchEtcdRevision(b *testing.B, ctx context.Context, cli *clientv3.Client) int64 {
	b.Helper()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, "\x00naples-bench", clientv3.WithCountOnly())
	if err != nil {
		b.Fatalf("reading etcd's revision: %v", err)
	}
	return resp.Header.Revision
}

// benchEtcdDBSize returns the largest database size of etcd's members, allocated and in
// use, from their maintenance status.
func benchEtcdDBSize(b *testing.B, ctx context.Context, etcd *testetcd.Cluster, cli *clientv3.Client) (size, inUse int64) {
	b.Helper()
	for _, ep := range etcd.Endpoints() {
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		st, err := cli.Status(sctx, ep)
		cancel()
		if err != nil {
			b.Fatalf("etcd status of %s: %v", ep, err)
		}
		size, inUse = max(size, st.DbSize), max(inUse, st.DbSizeInUse)
	}
	return size, inUse
}

// benchRSS returns the resident set size of process pid, in bytes.
func benchRSS(b *testing.B, pid int) int64 {
	b.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	for line := range strings.Lines(string(data)) {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				b.Fatalf("parsing VmRSS %q of process %d: %v", v, pid, err)
			}
			return kb << 10
		}
	}
	b.Fatalf("no VmRSS in /proc/%d/status", pid)
	return 0
}

// benchCPUTimes is the CPU time used so far by each nimbus, by the etcd members
// together and by the benchmark process.
type benchCPUTimes struct {
	nimbus     []time.Duration
	etcd, self time.Duration
}

// benchCPU reads the CPU times of the processes of a run. The etcd members are the
// benchmark's child processes whose command name starts with "etcd".
func benchCPU(b *testing.B, rc *replicaCluster) benchCPUTimes {
	b.Helper()
	var t benchCPUTimes
	for _, r := range rc.replicas {
		t.nimbus = append(t.nimbus, procCPU(b, r.proc.cmd.Process.Pid))
	}
	t.self = rusageCPU(b, unix.RUSAGE_SELF)
	entries, err := os.ReadDir("/proc")
	if err != nil {
		b.Fatal(err)
	}
	self := os.Getpid()
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue // gone meanwhile
		}
		// pid (comm) state ppid ...
		lo, hi := bytes.IndexByte(data, '('), bytes.LastIndexByte(data, ')')
		if lo < 0 || hi < lo {
			continue
		}
		comm := string(data[lo+1 : hi])
		f := strings.Fields(string(data[hi+1:]))
		if len(f) < 2 || f[1] != strconv.Itoa(self) || !strings.HasPrefix(comm, "etcd") {
			continue
		}
		t.etcd += procCPU(b, pid)
	}
	return t
}
