package test

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"

	"github.com/naplesnet/naples/internal/pki"
	"github.com/naplesnet/naples/internal/testns"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// The bulk benchmarks run the whole chain with many routes — naplesctl, durable nimbus,
// one agent with durable delphi in a host namespace — and, in the same run, the floor:
// `ip -batch` adding and deleting the same routes in a fresh namespace. They report both
// rates and their ratio. The clock starts once the agent has loaded its eBPF programs
// and is idle. 10,000 routes run by default; 100,000 when named:
//
//	go test -run '^$' -bench 'BulkRoutes/routes=100k' -benchtime 1x ./test/
func BenchmarkBulkRoutes(b *testing.B) {
	for _, n := range []int{10_000, 100_000} {
		name := fmt.Sprintf("routes=%dk", n/1000)
		b.Run(name, func(b *testing.B) {
			if n > 10_000 && !strings.Contains(benchFlag(), name) {
				b.Skipf("run with -bench 'BulkRoutes/%s'", name)
			}
			for range b.N {
				bulkRoutes(b, n)
			}
		})
	}
}

// quietFlags make nimbus and the agent log at INFO, as in production, rather than at the
// DEBUG the tests use.
var quietFlags = []string{"--log-level", "info"}

// benchFlag returns the -test.bench pattern.
func benchFlag() string {
	if f := flag.Lookup("test.bench"); f != nil {
		return f.Value.String()
	}
	return ""
}

func bulkRoutes(b *testing.B, n int) {
	b.StopTimer()
	dsts := bulkPrefixes(n)

	floorNS := floorNamespace(b)
	floorAdd := ipBatch(b, floorNS, dsts, "add")
	if got := countRoutes(b, floorNS); got != n {
		b.Fatalf("ip -batch added %d routes, want %d", got, n)
	}
	floorDel := ipBatch(b, floorNS, dsts, "del")

	// The chain, logging at INFO as in production.
	c := newCluster(b, quietFlags...)
	h := c.newHostWith(b, "host-a", quietFlags...)
	manifest := filepath.Join(b.TempDir(), "routes.yaml")
	writeRouteManifest(b, manifest, dsts)
	status := c.watchRouteStatus(b)
	// The chain is timed, not the agent's start: the kernel's verifier takes a second or
	// more over the firewall's programs.
	waitIdle(b, h)

	cpu := startCPU(b, c, h)
	start := time.Now()
	c.mustCtl(b, "", "apply", "-f", manifest)
	applied := time.Since(start)
	status.waitProgrammed(b, n)
	chainAdd := time.Since(start)
	cpu.report(b, "add", n)
	if got := countRoutes(b, h.ns); got != n {
		b.Fatalf("the agent programmed %d routes, want %d", got, n)
	}
	rss := agentRSS(b, h)
	settled := settledRSS(b, h, start.Add(chainAdd))

	cpu = startCPU(b, c, h)
	start = time.Now()
	c.mustCtl(b, "", "delete", "-f", manifest)
	status.waitDeleted(b, n)
	waitFor(b, "the routes to leave the kernel", func() bool { return countRoutes(b, h.ns) == 0 })
	chainDel := time.Since(start)
	cpu.report(b, "del", n)

	rate := func(d time.Duration) float64 { return float64(n) / d.Seconds() }
	b.ReportMetric(rate(floorAdd), "ipbatch-add-routes/s")
	b.ReportMetric(rate(chainAdd), "chain-add-routes/s")
	b.ReportMetric(chainAdd.Seconds()/floorAdd.Seconds(), "add-x-ipbatch")
	b.ReportMetric(applied.Seconds(), "apply-returned-s")
	b.ReportMetric(rate(floorDel), "ipbatch-del-routes/s")
	b.ReportMetric(rate(chainDel), "chain-del-routes/s")
	b.ReportMetric(chainDel.Seconds()/floorDel.Seconds(), "del-x-ipbatch")
	b.ReportMetric(float64(rss)/float64(n), "agent-rss-B/route")
	b.ReportMetric(float64(settled)/float64(n), "agent-settled-rss-B/route")
}

// floorNamespace returns a fresh namespace set up like the agent's host, for the floor:
// ip -batch.
func floorNamespace(b *testing.B) string {
	b.Helper()
	ns := testns.Named(b, "naples-floor")
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

// bulkPrefixes returns n /32 destinations from 100.64.0.0/10.
func bulkPrefixes(n int) []string {
	base := netip.MustParseAddr("100.64.0.0")
	out := make([]string, n)
	a := base
	for i := range out {
		a = a.Next()
		out[i] = a.String() + "/32"
	}
	return out
}

// ipBatch runs `ip -n NS -batch FILE` with one `route OP` line per destination and
// returns how long it took.
func ipBatch(b *testing.B, ns string, dsts []string, op string) time.Duration {
	b.Helper()
	lines := make([]string, len(dsts))
	for i, d := range dsts {
		lines[i] = fmt.Sprintf("route %s %s via 10.10.0.2 table 100 proto 241", op, d)
	}
	return ipBatchLines(b, ns, op, lines)
}

// ipBatchLines runs `ip -n NS -batch FILE` with lines, named by what, and returns how
// long it took.
func ipBatchLines(b *testing.B, ns, what string, lines []string) time.Duration {
	b.Helper()
	path := filepath.Join(b.TempDir(), "ip-"+what+".batch")
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	w := bufio.NewWriter(f)
	for _, l := range lines {
		fmt.Fprintln(w, l)
	}
	if err := w.Flush(); err != nil {
		b.Fatal(err)
	}
	f.Close()
	start := time.Now()
	if out, err := exec.Command("ip", "-n", ns, "-batch", path).CombinedOutput(); err != nil {
		b.Fatalf("ip -batch %s: %v\n%s", what, err, out)
	}
	return time.Since(start)
}

// countRoutes counts the routes of protocol 241 in table 100 of the namespace.
func countRoutes(b testing.TB, ns string) int {
	out := testns.Run(b, "ip", "-n", ns, "route", "show", "table", "100", "proto", "241")
	return strings.Count(out, "\n")
}

func writeRouteManifest(b testing.TB, path string, dsts []string) {
	b.Helper()
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	w := bufio.NewWriter(f)
	for i, d := range dsts {
		fmt.Fprintf(w, "kind: Route\nmeta:\n  name: r%d\n  nodes: [host-a]\nspec:\n  table: 100\n  prefix: %s\n  nexthops:\n    - gateway: 10.10.0.2\n---\n", i, d)
	}
	if err := w.Flush(); err != nil {
		b.Fatal(err)
	}
	f.Close()
}

// chainCPU is the CPU time (user and system) the processes of the chain had used at a
// start point: nimbus, the agent, naplesctl (the benchmark's finished children) and the
// benchmark process itself (the status watcher).
type chainCPU struct {
	nimbus, agent, children, self time.Duration
	c                             *cluster
	h                             *host
}

func startCPU(b testing.TB, c *cluster, h *host) chainCPU {
	b.Helper()
	return chainCPU{
		nimbus: procCPU(b, c.nimbus.cmd.Process.Pid), agent: procCPU(b, h.agent.cmd.Process.Pid),
		children: rusageCPU(b, unix.RUSAGE_CHILDREN), self: rusageCPU(b, unix.RUSAGE_SELF),
		c: c, h: h,
	}
}

// report reports the CPU each process used since start, in µs per route, as
// cpu-µs/route metrics prefixed by what.
func (s chainCPU) report(b *testing.B, what string, n int) {
	b.Helper()
	now := startCPU(b, s.c, s.h)
	per := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(n) }
	b.ReportMetric(per(now.nimbus-s.nimbus), what+"-nimbus-cpu-µs/route")
	b.ReportMetric(per(now.agent-s.agent), what+"-agent-cpu-µs/route")
	b.ReportMetric(per(now.children-s.children), what+"-naplesctl-cpu-µs/route")
	b.ReportMetric(per(now.self-s.self), what+"-watcher-cpu-µs/route")
}

// procCPU returns the user and system time process pid has used, from /proc/PID/stat.
func procCPU(b testing.TB, pid int) time.Duration {
	b.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	// The command name, in parentheses, may hold spaces; the fields after it are fixed.
	_, rest, ok := strings.Cut(string(data), ") ")
	f := strings.Fields(rest)
	if !ok || len(f) < 13 {
		b.Fatalf("parsing /proc/%d/stat: %q", pid, data)
	}
	var ticks int64
	for _, s := range f[11:13] { // utime, stime: fields 14 and 15 of stat(5)
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			b.Fatalf("parsing /proc/%d/stat: %v", pid, err)
		}
		ticks += v
	}
	const clockTicks = 100 // USER_HZ, 100 on Linux
	return time.Duration(ticks) * time.Second / clockTicks
}

// rusageCPU returns the user and system time of who (RUSAGE_SELF or RUSAGE_CHILDREN).
func rusageCPU(b testing.TB, who int) time.Duration {
	b.Helper()
	var ru unix.Rusage
	if err := unix.Getrusage(who, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// settleTime is how long after the last route is programmed the agent's memory counts as
// settled: the agent returns a burst's garbage to the OS once it has been idle for half a
// second (memsettle), so right after the last status its resident set still holds that
// garbage.
const settleTime = 3 * time.Second

// settledRSS returns the agent's resident set size settleTime after since.
func settledRSS(b testing.TB, h *host, since time.Time) int64 {
	b.Helper()
	time.Sleep(time.Until(since.Add(settleTime)))
	return agentRSS(b, h)
}

// agentRSS returns the resident set size of the host's agent, in bytes.
func agentRSS(b testing.TB, h *host) int64 {
	b.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", h.agent.cmd.Process.Pid))
	if err != nil {
		b.Fatal(err)
	}
	for line := range strings.Lines(string(data)) {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				b.Fatalf("parsing VmRSS %q: %v", v, err)
			}
			return kb << 10
		}
	}
	b.Fatal("no VmRSS in the agent's /proc status")
	return 0
}

// routeStatus follows the propagation status of every Route through WatchStatus.
type routeStatus struct {
	// updates are the frames received; errs the error that ended the stream.
	updates chan *nimbusv1.StatusFrame
	errs    chan error
}

// watchRouteStatus opens a WatchStatus stream of Routes as the publisher, without the
// objects: it needs their names and statuses only.
func (c *cluster) watchRouteStatus(t testing.TB) *routeStatus {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	stream, err := c.publisherAPI(t).WatchStatus(ctx, &nimbusv1.WatchStatusRequest{Kind: nimbusv1.Kind_KIND_ROUTE, OmitObjects: true},
		grpc.WaitForReady(true), grpc.MaxCallRecvMsgSize(64<<20))
	if err != nil {
		t.Fatal(err)
	}
	s := &routeStatus{updates: make(chan *nimbusv1.StatusFrame, 1024), errs: make(chan error, 1)}
	go func() {
		for {
			f, err := stream.Recv()
			if err != nil {
				s.errs <- err
				return
			}
			s.updates <- f
		}
	}()
	return s
}

// waitProgrammed waits until n routes are PROGRAMMED on every target node.
func (s *routeStatus) waitProgrammed(t testing.TB, n int) {
	t.Helper()
	s.wait(t, fmt.Sprintf("%d routes PROGRAMMED", n), n, func(ev *nimbusv1.StatusEvent) (string, bool, bool) {
		if ev.GetType() != nimbusv1.StatusEvent_TYPE_PUT {
			return "", false, false
		}
		st := ev.GetItem().GetStatus()
		return ev.GetItem().GetObject().GetMeta().GetName(), st.GetTargetNodes() > 0 && st.GetProgrammedNodes() == st.GetTargetNodes(), true
	})
}

// waitDeleted waits until n routes have been deleted.
func (s *routeStatus) waitDeleted(t testing.TB, n int) {
	t.Helper()
	s.wait(t, fmt.Sprintf("%d routes deleted", n), n, func(ev *nimbusv1.StatusEvent) (string, bool, bool) {
		return ev.GetKey().GetName(), true, ev.GetType() == nimbusv1.StatusEvent_TYPE_DELETE
	})
}

// wait reads the stream until n names are done; judge tells, per event, the name it is
// about, whether that name is now done, and whether the event says anything about it.
func (s *routeStatus) wait(t testing.TB, what string, n int, judge func(ev *nimbusv1.StatusEvent) (name string, done, relevant bool)) {
	t.Helper()
	done := map[string]bool{}
	count := 0
	timeout := time.After(10 * time.Minute)
	for count < n {
		select {
		case f := <-s.updates:
			for _, ev := range f.GetEvents() {
				name, ok, relevant := judge(ev)
				if !relevant || done[name] == ok {
					continue
				}
				done[name] = ok
				if ok {
					count++
				} else {
					count--
				}
			}
		case err := <-s.errs:
			t.Fatalf("status stream ended waiting for %s: %v", what, err)
		case <-timeout:
			t.Fatalf("timed out waiting for %s: %d so far", what, count)
		}
	}
}

// routeArrivals records when routes of one table appear in a namespace, by its netlink
// notifications.
type routeArrivals struct {
	mu   sync.Mutex
	cond *sync.Cond
	at   map[string]time.Time
}

// watchRouteArrivals starts recording the routes of table that appear in the namespace
// ns, until the test ends.
func watchRouteArrivals(t testing.TB, ns string, table int) *routeArrivals {
	t.Helper()
	m := &routeArrivals{at: map[string]time.Time{}}
	m.cond = sync.NewCond(&m.mu)
	updates, done := make(chan netlink.RouteUpdate, 1024), make(chan struct{})
	h := testns.Handle(t, ns)
	if err := netlink.RouteSubscribeWithOptions(updates, done, netlink.RouteSubscribeOptions{Namespace: &h}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { close(done) })
	go func() {
		for u := range updates {
			if u.Type == unix.RTM_NEWROUTE && u.Table == table && u.Dst != nil {
				m.mu.Lock()
				m.at[u.Dst.String()] = time.Now()
				m.cond.Broadcast()
				m.mu.Unlock()
			}
		}
	}()
	return m
}

// seen returns when the route to dst appeared, waiting for its notification if it has
// not come yet.
func (m *routeArrivals) seen(t testing.TB, dst string) time.Time {
	t.Helper()
	timeout := time.AfterFunc(deadline, func() {
		m.mu.Lock()
		m.cond.Broadcast()
		m.mu.Unlock()
	})
	defer timeout.Stop()
	start := time.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	for {
		if at, ok := m.at[dst]; ok {
			return at
		}
		if time.Since(start) >= deadline {
			t.Fatalf("no netlink notification of the route to %s after %v", dst, deadline)
		}
		m.cond.Wait()
	}
}

// BenchmarkRouteLatency measures one route from Apply until a status stream shows it
// PROGRAMMED, 100 times once a first route has gone through, and in the same run the
// floor: one gRPC round trip to nimbus plus one netlink route write. It reports p50 and
// p99 of both and their ratio, and where the chain's p50 goes: until Apply returns
// (apply-p50-ms) and until the route's netlink notification reaches the benchmark
// (kernel-p50-ms, a bound on when the agent wrote it).
//
//	go test -run '^$' -bench RouteLatency -benchtime 1x ./test/
func BenchmarkRouteLatency(b *testing.B) {
	const samples = 100
	for range b.N {
		c := newCluster(b, quietFlags...)
		h := c.newHostWith(b, "host-a", quietFlags...)
		api := c.publisherAPI(b)
		status := c.watchRouteStatus(b)
		nl, err := netlink.NewHandleAt(testns.Handle(b, h.ns))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(nl.Close)
		gw := net.ParseIP("10.20.0.2")
		dsts := bulkPrefixes(2 * samples)

		kernel := watchRouteArrivals(b, h.ns, 100)
		// One route first, not timed: the agent starts, connects and reads its state
		// while it goes through, and the samples time a running chain.
		ctx := context.Background()
		warm := &nimbusv1.Object{
			Meta: &nimbusv1.ObjectMeta{Name: "warm", Nodes: []string{"host-a"}},
			Spec: &nimbusv1.Object_Route{Route: &nimbusv1.RouteSpec{Table: 100, Prefix: "10.255.255.0/24",
				Nexthops: []*nimbusv1.NextHop{{Gateway: "10.10.0.2"}}}},
		}
		if _, err := api.Apply(ctx, &nimbusv1.ApplyRequest{Object: warm}); err != nil {
			b.Fatal(err)
		}
		status.waitProgrammedNamed(b, "warm")

		var chain, floor, applied, programmed []time.Duration
		for i := range samples {
			obj := &nimbusv1.Object{
				Meta: &nimbusv1.ObjectMeta{Name: fmt.Sprintf("lat%d", i), Nodes: []string{"host-a"}},
				Spec: &nimbusv1.Object_Route{Route: &nimbusv1.RouteSpec{Table: 100, Prefix: dsts[i],
					Nexthops: []*nimbusv1.NextHop{{Gateway: "10.10.0.2"}}}},
			}
			start := time.Now()
			if _, err := api.Apply(ctx, &nimbusv1.ApplyRequest{Object: obj}); err != nil {
				b.Fatal(err)
			}
			applied = append(applied, time.Since(start))
			status.waitProgrammedNamed(b, obj.GetMeta().GetName())
			chain = append(chain, time.Since(start))
			programmed = append(programmed, kernel.seen(b, dsts[i]).Sub(start))

			_, dst, _ := net.ParseCIDR(dsts[samples+i])
			start = time.Now()
			if _, err := api.Get(ctx, &nimbusv1.GetRequest{Key: obj.Key()}); err != nil {
				b.Fatal(err)
			}
			if err := nl.RouteReplace(&netlink.Route{Dst: dst, Gw: gw, Table: 200}); err != nil {
				b.Fatal(err)
			}
			floor = append(floor, time.Since(start))
		}
		p := func(d []time.Duration, q float64) time.Duration {
			s := slices.Clone(d)
			slices.Sort(s)
			return s[int(q*float64(len(s)-1))]
		}
		ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
		b.ReportMetric(ms(p(applied, 0.5)), "apply-p50-ms")
		b.ReportMetric(ms(p(programmed, 0.5)), "kernel-p50-ms")
		b.ReportMetric(ms(p(chain, 0.5)), "chain-p50-ms")
		b.ReportMetric(ms(p(chain, 0.99)), "chain-p99-ms")
		b.ReportMetric(ms(p(floor, 0.5)), "floor-p50-ms")
		b.ReportMetric(ms(p(floor, 0.99)), "floor-p99-ms")
		b.ReportMetric(float64(p(chain, 0.99))/float64(p(floor, 0.99)), "p99-x-floor")
	}
}

// publisherAPI dials nimbus as the publisher.
func (c *cluster) publisherAPI(t testing.TB) nimbusv1.NimbusClient {
	t.Helper()
	tlsConfig, err := pki.ClientConfig(c.file("publisher.crt"), c.file("publisher.key"), c.file("ca.crt"), pki.DefaultServerName)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(c.server, grpc.WithTransportCredentials(pki.TransportCredentials(tlsConfig)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return nimbusv1.NewNimbusClient(conn)
}

// waitProgrammedNamed waits until the named route is PROGRAMMED on every target node.
func (s *routeStatus) waitProgrammedNamed(t testing.TB, name string) {
	t.Helper()
	s.wait(t, name+" PROGRAMMED", 1, func(ev *nimbusv1.StatusEvent) (string, bool, bool) {
		st := ev.GetItem().GetStatus()
		n := ev.GetItem().GetObject().GetMeta().GetName()
		return n, st.GetTargetNodes() > 0 && st.GetProgrammedNodes() == st.GetTargetNodes(), ev.GetType() == nimbusv1.StatusEvent_TYPE_PUT && n == name
	})
}

// BenchmarkAgentRestart programs routes, SIGKILLs the agent and starts it again on its
// state directory: it reports how long until /readyz answers 200 and the agent's heap and
// RSS per route, and fails if the restarted agent writes a single route (an `ip monitor
// route` in the host sees nothing). 10,000 routes by default; 100,000 when named:
//
//	go test -run '^$' -bench 'AgentRestart/routes=100k' -benchtime 1x ./test/
func BenchmarkAgentRestart(b *testing.B) {
	for _, n := range []int{10_000, 100_000} {
		name := fmt.Sprintf("routes=%dk", n/1000)
		b.Run(name, func(b *testing.B) {
			if n > 10_000 && !strings.Contains(benchFlag(), name) {
				b.Skipf("run with -bench 'AgentRestart/%s'", name)
			}
			for range b.N {
				agentRestart(b, n)
			}
		})
	}
}

func agentRestart(b *testing.B, n int) {
	flags := append(slices.Clone(quietFlags), metricsFlags...)
	c := newCluster(b, quietFlags...)
	h := c.newHostWith(b, "host-a", flags...)
	manifest := filepath.Join(b.TempDir(), "routes.yaml")
	writeRouteManifest(b, manifest, bulkPrefixes(n))
	status := c.watchRouteStatus(b)
	c.mustCtl(b, "", "apply", "-f", manifest)
	status.waitProgrammed(b, n)

	h.agent.kill(b)
	monitor := h.monitorRoutes(b)
	start := time.Now()
	h.startAgentWith(b, flags...)
	tel := h.telemetry(b)
	for {
		if code, _ := tel.get(b, "/readyz"); code == http.StatusOK {
			break
		}
		if time.Since(start) > 5*time.Minute {
			b.Fatal("the restarted agent was not ready within 5 minutes")
		}
		time.Sleep(10 * time.Millisecond)
	}
	ready := time.Since(start)
	if out := monitor.output(b); strings.TrimSpace(out) != "" {
		b.Fatalf("the restarted agent wrote routes that were already correct:\n%.2000s", out)
	}
	m := tel.metrics(b)
	b.ReportMetric(ready.Seconds(), "ready-s")
	b.ReportMetric(m["go_memstats_heap_inuse_bytes"]/float64(n), "heap-B/route")
	b.ReportMetric(float64(agentRSS(b, h))/float64(n), "rss-B/route")
	b.ReportMetric(m[`naples_hal_kernel_writes_total{kind="Route"}`], "kernel-writes")
}
