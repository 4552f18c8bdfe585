package linux

import (
	"context"
	"flag"
	"fmt"
	"github.com/naplesnet/naples/agent/halstore"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/naplesnet/naples/delphi"
	"github.com/naplesnet/naples/hal"
	"github.com/naplesnet/naples/internal/testns"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// BenchmarkHALRoutes measures the HAL alone programming many routes, against the floor of
// `ip -batch` adding the same routes into a fresh namespace. Delphi holds N Route objects
// (host routes in 198.18.0.0/15 via one gateway, table 100) and is synced; the HAL, with
// the route reconciler and its default options, is timed from Run until every object is
// PROGRAMMED in delphi (all routes are then in the kernel); then every object is deleted in
// one delphi transaction, and the HAL is timed until every status and route is gone. The
// floor is `ip -n NS -batch FILE` with one `route add` (then `route del`) line per route.
// The CPU metrics are the benchmark process's user and system time while the HAL worked,
// per route: on a machine whose cores are shared they tell more than the rates.
// N is 10,000, and 100,000 when asked for by name (-bench 'HALRoutes/routes=100k'). Run it
// with -benchtime 1x: one iteration takes seconds.
func BenchmarkHALRoutes(b *testing.B) {
	for _, n := range []struct {
		name  string
		count int
	}{{"10k", 10_000}, {"100k", 100_000}} {
		b.Run("routes="+n.name, func(b *testing.B) {
			if n.count >= 100_000 && !benchNamed("routes=100k") {
				b.Skip("run with -bench 'HALRoutes/routes=100k'")
			}
			testns.RequireRoot(b)
			var halAdd, halDel, addCPU, delCPU, ipAdd, ipDel time.Duration
			var commits uint64
			for range b.N {
				add, del, acpu, dcpu, c := benchHAL(b, n.count)
				halAdd, halDel, addCPU, delCPU = halAdd+add, halDel+del, addCPU+acpu, delCPU+dcpu
				commits += c
				add, del = benchIPBatch(b, n.count)
				ipAdd, ipDel = ipAdd+add, ipDel+del
			}
			total := float64(b.N * n.count)
			rate := func(d time.Duration) float64 { return total / d.Seconds() }
			b.ReportMetric(rate(halAdd), "hal-add-routes/s")
			b.ReportMetric(rate(ipAdd), "ip-add-routes/s")
			b.ReportMetric(rate(halAdd)/rate(ipAdd), "add-ratio")
			b.ReportMetric(rate(halDel), "hal-del-routes/s")
			b.ReportMetric(rate(ipDel), "ip-del-routes/s")
			b.ReportMetric(rate(halDel)/rate(ipDel), "del-ratio")
			b.ReportMetric(float64(addCPU.Microseconds())/total, "hal-add-cpu-µs/route")
			b.ReportMetric(float64(delCPU.Microseconds())/total, "hal-del-cpu-µs/route")
			b.ReportMetric(float64(commits)/float64(b.N), "status-commits/op")
			b.ReportMetric(0, "ns/op")
		})
	}
}

// benchPrefix is the i-th route's destination.
func benchPrefix(i int) string {
	return fmt.Sprintf("198.%d.%d.%d/32", 18+i>>16, (i>>8)&0xff, i&0xff)
}

// benchNamespace makes a fresh namespace with eth0 on 10.10.0.0/24, as newHost does.
func benchNamespace(b *testing.B) string {
	ns := testns.Named(b, "naples-bench")
	for _, args := range [][]string{
		{"link", "add", "eth0", "type", "veth", "peer", "name", "eth1"},
		{"addr", "add", "10.10.0.1/24", "dev", "eth0"},
		{"link", "set", "eth0", "up"},
		{"link", "set", "eth1", "up"},
	} {
		testns.Run(b, "ip", append([]string{"-n", ns}, args...)...)
	}
	return ns
}

// benchHAL times the HAL adding and then deleting n routes, and measures the CPU time
// (user and system) the process spent meanwhile.
func benchHAL(b *testing.B, n int) (add, del, addCPU, delCPU time.Duration, statusCommits uint64) {
	b.StopTimer()
	defer b.StartTimer()
	ns := benchNamespace(b)
	nsh := testns.Handle(b, ns)
	// Warnings only, such as an observer whose subscription overflowed.
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	store, err := delphi.Open(delphi.Options{Indexes: Indexes(), Logger: logger})
	if err != nil {
		b.Fatal(err)
	}
	defer store.Close()
	desired, err := store.ClaimDesired()
	if err != nil {
		b.Fatal(err)
	}
	txn := &delphi.DesiredTxn{}
	keys := make(map[string]*nimbusv1.ObjectKey, n)
	for i := range n {
		o := &nimbusv1.Object{
			Meta: &nimbusv1.ObjectMeta{Name: fmt.Sprintf("r%06d", i), Generation: 1},
			Spec: &nimbusv1.Object_Route{Route: &nimbusv1.RouteSpec{Table: 100, Prefix: benchPrefix(i),
				Nexthops: []*nimbusv1.NextHop{{Gateway: "10.10.0.2"}}}},
		}
		keys[o.Key().ID()] = o.Key()
		txn.Put(o)
	}
	if err := desired.Commit(txn); err != nil {
		b.Fatal(err)
	}
	desired.MarkSynced()
	rec, err := NewRouteReconciler(RouteOptions{Store: store, Namespace: &nsh, Logger: logger})
	if err != nil {
		b.Fatal(err)
	}
	defer rec.Close()
	t, stats := timeHAL(b, store, desired, rec, logger, keys, keys,
		func(hal.Stats) {
			if got := countTable100(b, ns); got != n {
				b.Fatalf("the HAL programmed %d routes into table 100; want %d", got, n)
			}
		},
		func(hal.Stats) {
			if got := countTable100(b, ns); got != 0 {
				b.Fatalf("%d routes left in table 100 after every object was deleted", got)
			}
		})
	if st := stats.Kinds[nimbusv1.Kind_KIND_ROUTE]; st.KernelWrites != uint64(2*n) || st.Errors != 0 {
		b.Errorf("route stats %+v; want %d kernel writes and no errors", st, 2*n)
	}
	return t.add, t.del, t.addCPU, t.delCPU, stats.StatusCommits
}

// halTimes are how long a HAL took to program and to remove the objects of a benchmark,
// and the CPU time the process spent meanwhile.
type halTimes struct {
	add, del, addCPU, delCPU time.Duration
}

// timeHAL runs a HAL with rec alone over store, whose desired table holds the objects and
// is complete, and times it until every key of watched has settled: PROGRAMMED, or
// Unsupported for a kind rec does not program. Then it deletes the keys of keys in one
// commit and times the HAL from then until their statuses are gone. afterAdd and afterDel
// check the kernel after each phase, with the timer stopped, and get the HAL's stats then;
// timeHAL returns the stats at the end. The timer is stopped when it is called and returns.
func timeHAL(b *testing.B, store *delphi.Store, desired *delphi.DesiredWriter, rec hal.Reconciler, logger *slog.Logger,
	watched, keys map[string]*nimbusv1.ObjectKey, afterAdd, afterDel func(hal.Stats)) (halTimes, hal.Stats) {
	halStore, err := halstore.New(store)
	if err != nil {
		b.Fatal(err)
	}
	h, err := hal.New(hal.Options{Store: halStore, Reconcilers: []hal.Reconciler{rec}, Logger: logger})
	if err != nil {
		b.Fatal(err)
	}
	sub, err := store.Subscribe(delphi.SubscribeOptions{Tables: []delphi.Table{delphi.TableStatus}})
	if err != nil {
		b.Fatal(err)
	}
	defer sub.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	var t halTimes
	var ru0, ru1 unix.Rusage
	unix.Getrusage(unix.RUSAGE_SELF, &ru0)
	b.StartTimer()
	start := time.Now()
	done := make(chan error, 1)
	go func() { done <- h.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			b.Errorf("Run: %v", err)
		}
	}()
	waitStatuses(b, ctx, store, sub, watched, func(st *nimbusv1.NodeStatus, ok bool) bool {
		return ok && (st.GetPhase() == nimbusv1.Phase_PHASE_PROGRAMMED || st.GetReason() == hal.ReasonUnsupported)
	})
	t.add = time.Since(start)
	b.StopTimer()
	unix.Getrusage(unix.RUSAGE_SELF, &ru1)
	t.addCPU = cpuTime(ru1) - cpuTime(ru0)
	afterAdd(h.Stats())

	txn := &delphi.DesiredTxn{}
	for _, k := range keys {
		txn.Delete(k)
	}
	// The HAL hears of the deletes once they are committed: time it from then.
	if err := desired.Commit(txn); err != nil {
		b.Fatal(err)
	}
	unix.Getrusage(unix.RUSAGE_SELF, &ru0)
	b.StartTimer()
	start = time.Now()
	waitStatuses(b, ctx, store, sub, keys, func(_ *nimbusv1.NodeStatus, ok bool) bool { return !ok })
	t.del = time.Since(start)
	b.StopTimer()
	unix.Getrusage(unix.RUSAGE_SELF, &ru1)
	t.delCPU = cpuTime(ru1) - cpuTime(ru0)
	stats := h.Stats()
	afterDel(stats)
	return t, stats
}

// cpuTime is the user and system time of a resource usage.
func cpuTime(ru unix.Rusage) time.Duration {
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// waitStatuses waits until done holds for the status of every key, reading the keys the
// status subscription reports.
func waitStatuses(b *testing.B, ctx context.Context, store *delphi.Store, sub *delphi.Subscription, keys map[string]*nimbusv1.ObjectKey, done func(*nimbusv1.NodeStatus, bool) bool) {
	met := map[string]bool{}
	for count := 0; count < len(keys); {
		ids, err := sub.Next(ctx)
		if err != nil {
			b.Fatalf("waiting for %d statuses (%d so far): %v", len(keys), count, err)
		}
		for _, k := range ids {
			id := k.String()
			key, ok := keys[id]
			if !ok {
				b.Fatalf("status of unknown key %s", id)
			}
			st, ok := store.Status(key)
			if now := done(st, ok); now != met[id] {
				met[id] = now
				if now {
					count++
				} else {
					count--
				}
			}
		}
	}
}

// benchIPBatch times `ip -batch` adding and then deleting n routes in a fresh namespace.
func benchIPBatch(b *testing.B, n int) (add, del time.Duration) {
	b.StopTimer()
	defer b.StartTimer()
	ns := benchNamespace(b)
	dir := b.TempDir()
	var adds, dels strings.Builder
	for i := range n {
		fmt.Fprintf(&adds, "route add %s via 10.10.0.2 table 100 proto 241\n", benchPrefix(i))
		fmt.Fprintf(&dels, "route del %s table 100 proto 241\n", benchPrefix(i))
	}
	run := func(name, batch string) time.Duration {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(batch), 0o600); err != nil {
			b.Fatal(err)
		}
		cmd := exec.Command("ip", "-n", ns, "-batch", path)
		b.StartTimer()
		start := time.Now()
		out, err := cmd.CombinedOutput()
		d := time.Since(start)
		b.StopTimer()
		if err != nil {
			b.Fatalf("ip -n %s -batch %s: %v\n%s", ns, name, err, out)
		}
		return d
	}
	add = run("add", adds.String())
	if got := countTable100(b, ns); got != n {
		b.Fatalf("ip -batch added %d routes into table 100; want %d", got, n)
	}
	del = run("del", dels.String())
	if got := countTable100(b, ns); got != 0 {
		b.Fatalf("%d routes left in table 100 after ip -batch deleted them", got)
	}
	return add, del
}

// countTable100 counts the routes in the namespace's table 100.
func countTable100(b *testing.B, ns string) int {
	nsh := testns.Handle(b, ns)
	nl, err := netlink.NewHandleAt(nsh)
	if err != nil {
		b.Fatal(err)
	}
	defer nl.Close()
	routes, err := nl.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: 100}, netlink.RT_FILTER_TABLE)
	if err != nil {
		b.Fatal(err)
	}
	n := 0
	for _, r := range routes {
		if r.Table == 100 && r.Type == unix.RTN_UNICAST {
			n++
		}
	}
	return n
}

// benchNamed reports whether the -test.bench pattern names s explicitly.
func benchNamed(s string) bool {
	f := flag.Lookup("test.bench")
	return f != nil && strings.Contains(f.Value.String(), s)
}
