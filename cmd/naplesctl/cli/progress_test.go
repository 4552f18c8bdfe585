package cli

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// fakeTicker stands in for the ticker of apply --wait's progress: the test sends each
// tick.
type fakeTicker chan time.Time

// ticker is a cli.tick that returns f.
func (f fakeTicker) ticker(time.Duration) (<-chan time.Time, func()) { return f, func() {} }

// startTicked runs naplesctl with args in the background, as start does, with stderr a
// terminal or not, and returns the ticker of its progress.
func (e *env) startTicked(terminal bool, args ...string) (*running, fakeTicker) {
	e.t.Helper()
	ticks := make(fakeTicker)
	r := e.startWith(func(c *cli) { c.terminal, c.tick = terminal, ticks.ticker }, args...)
	return r, ticks
}

// tick makes the command's progress tick once; it fails the test when the command does
// not take the tick within 10s.
func (r *running) tick(t *testing.T, ticks fakeTicker) {
	t.Helper()
	select {
	case ticks <- time.Time{}:
	case <-time.After(10 * time.Second):
		t.Fatalf("the command took no tick within 10s; stderr:\n%s", r.stderr)
	}
}

// reportMany sends st as st.Node's status report for each of the routes called names,
// over one ReportStatus stream, as the node's agent does.
func (e *env) reportMany(names []string, st *nimbusv1.NodeStatus) {
	e.t.Helper()
	stream, err := e.nimbus.ReportStatus(e.t.Context())
	if err != nil {
		e.t.Fatalf("ReportStatus: %v", err)
	}
	for _, name := range names {
		key := nimbusv1.NewKey(nimbusv1.Kind_KIND_ROUTE, "", "", name)
		if err := stream.Send(&nimbusv1.StatusReport{Key: key, Status: st}); err != nil {
			e.t.Fatalf("sending a status report: %v", err)
		}
	}
	if _, err := stream.CloseAndRecv(); err != nil {
		e.t.Fatalf("ending the status reports: %v", err)
	}
}

// routesYAML returns a manifest of n routes for host-a, r00000 on, and their names.
func routesYAML(n int) (string, []string) {
	var b strings.Builder
	names := make([]string, n)
	for i := range n {
		names[i] = fmt.Sprintf("r%05d", i)
		if i > 0 {
			b.WriteString("---\n")
		}
		b.WriteString(routeYAML(names[i], fmt.Sprintf("10.%d.%d.0/24", i/256, i%256), "10.10.0.2"))
	}
	return b.String(), names
}

// createdLines returns apply's lines for names, all created.
func createdLines(names []string) string {
	var b strings.Builder
	for _, n := range names {
		b.WriteString("route/" + n + " created\n")
	}
	return b.String()
}

// TestApplyWait applies a route for two nodes with --wait, stderr no terminal: a
// summary line on every tick, a line for the node FAILED and being retried, and a last
// line on stdout once both nodes are PROGRAMMED; apply exits 0.
func TestApplyWait(t *testing.T) {
	e := newEnv(t)
	f := e.file("route.yaml", routeTo("to-dc2", "198.51.100.0/24", "10.10.0.2", "host-a", "host-b"))
	r, ticks := e.startTicked(false, "apply", "-f", f, "--wait", "--timeout", "20s")
	r.waitStdout(t, "route/to-dc2 created\n")
	r.tick(t, ticks)
	r.waitStderr(t, "0 of 1 programmed, 0 failing\n")
	e.report("to-dc2", "host-a", 1, programmed, "", "route in table 100")
	e.report("to-dc2", "host-b", 1, failed, "KernelError", "adding route: network is unreachable")
	r.waitStderr(t, "host-b: KernelError (retrying)")
	r.tick(t, ticks)
	r.waitStderr(t, "0 of 1 programmed, 1 failing (host-b)\n")
	e.report("to-dc2", "host-b", 1, programmed, "", "route in table 100")
	if err := r.result(t); err != nil {
		t.Fatalf("apply --wait: %v\nstderr:\n%s", err, r.stderr)
	}
	equal(t, "apply --wait stdout", r.stdout.String(), "route/to-dc2 created\n1 of 1 programmed on every target node\n")
	equal(t, "apply --wait stderr", r.stderr.String(), ""+
		"0 of 1 programmed, 0 failing\n"+
		"route/to-dc2: FAILED on 1 of 2 nodes (generation 1): host-b: KernelError (retrying): adding route: network is unreachable\n"+
		"0 of 1 programmed, 1 failing (host-b)\n")
}

// TestApplyWaitNewGeneration changes a route both nodes programmed: their reports of the
// old generation do not count, so apply --wait waits for reports of the new one. An
// unchanged object in the same apply is waited on at its generation, which is done.
func TestApplyWaitNewGeneration(t *testing.T) {
	e := newEnv(t)
	other := routeTo("to-dc3", "203.0.113.0/24", "10.10.0.3", "host-a")
	e.ok("apply", "-f", e.file("v1.yaml", routeTo("to-dc2", "198.51.100.0/24", "10.10.0.2", "host-a", "host-b")+"---\n"+other))
	for _, n := range []string{"host-a", "host-b"} {
		e.report("to-dc2", n, 1, programmed, "", "")
	}
	e.report("to-dc3", "host-a", 1, programmed, "", "")

	f := e.file("v2.yaml", routeTo("to-dc2", "198.51.100.0/24", "10.10.0.12", "host-a", "host-b")+"---\n"+other)
	r, ticks := e.startTicked(false, "apply", "-f", f, "--wait")
	// to-dc3 is done at once, to-dc2 not: the reports of generation 1 do not count.
	eventually(t, "a summary of 1 of 2 programmed", func() bool {
		r.tick(t, ticks)
		return strings.Contains(r.stderr.String(), "1 of 2 programmed, 0 failing\n")
	})
	e.report("to-dc2", "host-a", 2, programmed, "", "")
	e.report("to-dc2", "host-b", 2, programmed, "", "")
	if err := r.result(t); err != nil {
		t.Fatalf("apply --wait: %v\nstderr:\n%s", err, r.stderr)
	}
	equal(t, "apply --wait stdout", r.stdout.String(), ""+
		"route/to-dc2 configured (generation 2)\nroute/to-dc3 unchanged\n"+
		"2 of 2 programmed on every target node\n")

	// wait alone on an object that is programmed returns at once.
	equal(t, "wait", e.ok("wait", "route", "to-dc2", "to-dc3"),
		"route/to-dc2 programmed on 2/2 nodes (generation 2)\nroute/to-dc3 programmed on 1/1 nodes (generation 1)\n")
}

// TestApplyWaitBulk applies 2,000 routes with --wait, stderr no terminal: apply prints a
// line per object, a summary per tick and one line for the route FAILED on a node,
// however often that node reports it, instead of a line per status change.
func TestApplyWaitBulk(t *testing.T) {
	const n = 2000
	e := newEnv(t)
	manifest, names := routesYAML(n)
	r, ticks := e.startTicked(false, "apply", "-f", e.file("routes.yaml", manifest), "--wait", "--timeout", "60s")
	r.waitStdout(t, "route/r01999 created\n")
	r.tick(t, ticks)
	r.waitStderr(t, "0 of 2000 programmed, 0 failing\n")
	e.report("r00007", "host-a", 1, failed, "KernelError", "adding route: file exists")
	r.waitStderr(t, "route/r00007: FAILED")
	r.tick(t, ticks)
	r.waitStderr(t, "0 of 2000 programmed, 1 failing (host-a)\n")
	e.reportMany(append(names[:7:7], names[8:]...), &nimbusv1.NodeStatus{Node: "host-a", ObservedGeneration: 1, Phase: programmed})
	e.report("r00007", "host-a", 1, failed, "KernelError", "adding route: no buffer space")
	e.report("r00007", "host-a", 1, programmed, "", "")
	if err := r.result(t); err != nil {
		t.Fatalf("apply --wait: %v\nstderr:\n%s", err, r.stderr)
	}
	equal(t, "apply --wait stdout", r.stdout.String(), createdLines(names)+"2000 of 2000 programmed on every target node\n")
	equal(t, "apply --wait stderr", r.stderr.String(), ""+
		"0 of 2000 programmed, 0 failing\n"+
		"route/r00007: FAILED on 1 of 1 nodes (generation 1): host-a: KernelError (retrying): adding route: file exists\n"+
		"0 of 2000 programmed, 1 failing (host-a)\n")
	if lines := strings.Count(r.stdout.String()+r.stderr.String(), "\n"); lines > n+4 {
		t.Errorf("apply --wait of %d routes printed %d lines, want at most %d", n, lines, n+4)
	}
}

// TestApplyWaitTerminal applies routes with --wait, stderr a terminal: one progress
// line, rewritten in place with a carriage return when it changed, erased for the line
// of a route FAILED on a node and when the wait ends.
func TestApplyWaitTerminal(t *testing.T) {
	e := newEnv(t)
	manifest, names := routesYAML(2)
	r, ticks := e.startTicked(true, "apply", "-f", e.file("routes.yaml", manifest), "--wait", "--timeout", "20s")
	r.waitStdout(t, "route/r00001 created\n")
	r.tick(t, ticks)
	r.waitStderr(t, "\r0 of 2 programmed, 0 failing\x1b[K")
	r.tick(t, ticks) // no change: nothing is written
	e.report("r00001", "host-a", 1, failed, "KernelError", "adding route: file exists\x1b[2J")
	r.waitStderr(t, "route/r00001: FAILED")
	r.tick(t, ticks)
	r.waitStderr(t, "\r0 of 2 programmed, 1 failing (host-a)\x1b[K")
	e.reportMany(names, &nimbusv1.NodeStatus{Node: "host-a", ObservedGeneration: 1, Phase: programmed})
	if err := r.result(t); err != nil {
		t.Fatalf("apply --wait: %v\nstderr:\n%q", err, r.stderr)
	}
	equal(t, "apply --wait stdout", r.stdout.String(), createdLines(names)+"2 of 2 programmed on every target node\n")
	// The node's message reaches the terminal escaped; only naplesctl's own carriage
	// returns and erasures drive it.
	equal(t, "apply --wait stderr", fmt.Sprintf("%q", r.stderr.String()), fmt.Sprintf("%q", ""+
		"\r0 of 2 programmed, 0 failing\x1b[K"+
		"\r\x1b[K"+
		`route/r00001: FAILED on 1 of 1 nodes (generation 1): host-a: KernelError (retrying): adding route: file exists\x1b[2J`+"\n"+
		"\r0 of 2 programmed, 1 failing (host-a)\x1b[K"+
		"\r\x1b[K"))
}

// TestApplyWaitBulkTimeout applies 2,000 routes that no node programs, with --wait: the
// error names the first routes not programmed and counts the others, and the last
// progress line goes to stderr.
func TestApplyWaitBulkTimeout(t *testing.T) {
	e := newEnv(t)
	manifest, _ := routesYAML(2000)
	out, errOut, err := e.run("", "apply", "-f", e.file("routes.yaml", manifest), "--wait", "--timeout", "2s")
	if !errors.Is(err, ErrWaitTimeout) {
		t.Fatalf("apply --wait of routes no node programs: %v; want a timeout", err)
	}
	if lines := strings.Count(out, "\n"); lines != 2000 {
		t.Errorf("apply --wait printed %d lines on stdout, want one per route", lines)
	}
	if !strings.HasSuffix(errOut, "0 of 2000 programmed, 0 failing\n") {
		t.Errorf("apply --wait stderr ends %q, want the progress line", errOut[max(0, len(errOut)-100):])
	}
	msg := err.Error()
	if lines := strings.Count(msg, "\n") + 1; lines != maxTimedOut+1 {
		t.Errorf("the error has %d lines, want %d", lines, maxTimedOut+1)
	}
	contains(t, "the error", err, "route/r00000: timed out after 2s: 0/1 nodes programmed (generation 1); pending: host-a",
		"and 1980 more objects timed out after 2s, not programmed on every target node")
}
