package test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/naplesnet/naples/internal/testns"
)

// BenchmarkBulkRoutesCLI applies 20,000 routes as people and generators write them
// (names such as dc2-web-0042, three labels, two or three next hops) with the real
// naplesctl binary, `naplesctl apply -f ROUTES.yaml --wait`, end to end until it exits
// with every route PROGRAMMED, against durable nimbus and one agent in a host namespace;
// and in the same run the floor, `ip -batch` adding the same multipath routes in a fresh
// namespace. The agent is left to load its eBPF programs before the clock starts. The
// manifest is written in block style and in flow style (`meta: {name: ..., nodes:
// [host-a]}`), one sub-benchmark each:
//
//	go test -run '^$' -bench BulkRoutesCLI -benchtime 1x ./test/
//
// NAPLES_BENCH_WATCH=1 adds a status watch of the benchmark's own, which reports when
// nimbus had every route PROGRAMMED (nimbus-programmed-s).
func BenchmarkBulkRoutesCLI(b *testing.B) {
	for _, style := range []string{"block", "flow"} {
		b.Run("routes=20k/style="+style, func(b *testing.B) {
			for range b.N {
				bulkRoutesCLI(b, 20_000, style)
			}
		})
	}
}

// userRoute is a route as an operator's manifest holds it.
type userRoute struct {
	name, app, tier, site, prefix string
	gateways                      []string
}

// userRoutes returns n routes to /32 destinations from 100.64.0.0/10, spread over three
// sites and four applications, every third with three next hops, the others with two.
func userRoutes(n int) []userRoute {
	apps := []string{"web", "db", "cache", "api"}
	tiers := []string{"frontend", "backend", "backend", "frontend"}
	routes := make([]userRoute, n)
	for i, dst := range bulkPrefixes(n) {
		app := i % len(apps)
		site := fmt.Sprintf("dc%d", 1+i/len(apps)%3)
		r := userRoute{name: fmt.Sprintf("%s-%s-%04d", site, apps[app], i), app: apps[app], tier: tiers[app],
			site: site, prefix: dst, gateways: []string{"10.10.0.2", "10.10.0.3"}}
		if i%3 == 0 {
			r.gateways = append(r.gateways, "10.10.0.4")
		}
		routes[i] = r
	}
	return routes
}

// writeUserRoutes writes routes as a YAML manifest for host-a in style, "block" or
// "flow".
func writeUserRoutes(b *testing.B, path, style string, routes []userRoute) {
	b.Helper()
	var buf bytes.Buffer
	for _, r := range routes {
		if style == "flow" {
			hops := make([]string, len(r.gateways))
			for i, g := range r.gateways {
				hops[i] = "{gateway: " + g + "}"
			}
			fmt.Fprintf(&buf, "---\nkind: Route\nmeta: {name: %s, labels: {app: %s, tier: %s, site: %s}, nodes: [host-a]}\n"+
				"spec: {table: 100, prefix: %s, nexthops: [%s]}\n", r.name, r.app, r.tier, r.site, r.prefix, strings.Join(hops, ", "))
			continue
		}
		fmt.Fprintf(&buf, "---\nkind: Route\nmeta:\n  name: %s\n  labels:\n    app: %s\n    tier: %s\n    site: %s\n  nodes:\n    - host-a\n"+
			"spec:\n  table: 100\n  prefix: %s\n  nexthops:\n", r.name, r.app, r.tier, r.site, r.prefix)
		for _, g := range r.gateways {
			fmt.Fprintf(&buf, "    - gateway: %s\n", g)
		}
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		b.Fatal(err)
	}
}

// countRouteEntries counts the routes of protocol 241 in table 100 of the namespace, a
// multipath route once (ip prints its next hops on lines of their own).
func countRouteEntries(b testing.TB, ns string) int {
	n := 0
	for line := range strings.Lines(testns.Run(b, "ip", "-n", ns, "route", "show", "table", "100", "proto", "241")) {
		if line != "" && line[0] != ' ' && line[0] != '\t' {
			n++
		}
	}
	return n
}

// waitIdle waits until the host's agent is idle: a started agent loads its eBPF
// programs for a second or two, on the cores the chain shares, and the kernel's verifier
// counts as the agent's CPU.
func waitIdle(b *testing.B, h *host) {
	b.Helper()
	const quiet = 20 * time.Millisecond // of CPU per 500 ms
	last := procCPU(b, h.agent.cmd.Process.Pid)
	for start := time.Now(); time.Since(start) < time.Minute; {
		time.Sleep(500 * time.Millisecond)
		now := procCPU(b, h.agent.cmd.Process.Pid)
		if now-last <= quiet {
			return
		}
		last = now
	}
	b.Fatal("the agent was not idle within a minute of starting")
}

func bulkRoutesCLI(b *testing.B, n int, style string) {
	b.StopTimer()
	routes := userRoutes(n)

	floorNS := floorNamespace(b)
	lines := make([]string, n)
	for i, r := range routes {
		var hops strings.Builder
		for _, g := range r.gateways {
			hops.WriteString(" nexthop via " + g)
		}
		lines[i] = fmt.Sprintf("route add %s table 100 proto 241%s", r.prefix, hops.String())
	}
	floor := ipBatchLines(b, floorNS, "add", lines)
	if got := countRouteEntries(b, floorNS); got != n {
		b.Fatalf("ip -batch added %d routes, want %d", got, n)
	}

	c := newCluster(b, quietFlags...)
	h := c.newHostWith(b, "host-a", quietFlags...)
	manifest := filepath.Join(b.TempDir(), "routes.yaml")
	writeUserRoutes(b, manifest, style, routes)
	waitIdle(b, h)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(bin, "naplesctl"), "--server", c.server,
		"--tls-cert", c.file("publisher.crt"), "--tls-key", c.file("publisher.key"), "--tls-ca", c.file("ca.crt"),
		"apply", "-f", manifest, "--wait", "--timeout", "10m")
	var stdout, stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	// When apply's last result line comes tells where the time goes: decoding and
	// applying, then the chain. With NAPLES_BENCH_WATCH=1 a status watch of the
	// benchmark's own tells when nimbus had every route PROGRAMMED too, which shows the
	// wait's own end; it is off by default, as the second status stream costs nimbus and
	// the benchmark's process CPU on the cores the chain shares, which an operator's
	// apply --wait does not pay.
	var status *routeStatus
	if os.Getenv("NAPLES_BENCH_WATCH") == "1" {
		status = c.watchRouteStatus(b)
	}
	lastResult := fmt.Sprintf("route/%s created", routes[n-1].name)
	var applied time.Time
	read := make(chan struct{})
	cpu := startCPU(b, c, h)
	start := time.Now()
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	go func() {
		defer close(read)
		scanner := bufio.NewScanner(out)
		for scanner.Scan() {
			if scanner.Text() == lastResult {
				applied = time.Now()
			}
			stdout.WriteString(scanner.Text() + "\n")
		}
	}()
	var programmed time.Time
	if status != nil {
		status.waitProgrammed(b, n)
		programmed = time.Now()
	}
	<-read
	if err := cmd.Wait(); err != nil {
		b.Fatalf("naplesctl apply --wait: %v\n%.2000s", err, stderr.String())
	}
	chain := time.Since(start)
	cpu.report(b, "add", n)
	b.ReportMetric(applied.Sub(start).Seconds(), "applied-s")
	if status != nil {
		b.ReportMetric(programmed.Sub(start).Seconds(), "nimbus-programmed-s")
	}
	if got := countRouteEntries(b, h.ns); got != n {
		b.Fatalf("the agent programmed %d routes, want %d", got, n)
	}
	if want := fmt.Sprintf("%d of %d programmed on every target node\n", n, n); !strings.HasSuffix(stdout.String(), want) {
		b.Fatalf("naplesctl apply --wait ended with %q, want %q", stdout.String()[max(0, stdout.Len()-200):], want)
	}

	b.ReportMetric(float64(n)/floor.Seconds(), "ipbatch-add-routes/s")
	b.ReportMetric(float64(n)/chain.Seconds(), "cli-add-routes/s")
	b.ReportMetric(chain.Seconds(), "cli-wait-s")
	b.ReportMetric(chain.Seconds()/floor.Seconds(), "cli-x-ipbatch")
	b.ReportMetric(float64(strings.Count(stdout.String(), "\n")+strings.Count(stderr.String(), "\n")), "output-lines")
}
