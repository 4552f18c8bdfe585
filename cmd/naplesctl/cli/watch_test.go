package cli

import (
	"errors"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// waitStdout waits until the command has written want to stdout.
func (r *running) waitStdout(t *testing.T, want string) {
	t.Helper()
	eventually(t, "stdout to contain "+want+"; it holds:\n"+r.stdout.String(), func() bool {
		return strings.Contains(r.stdout.String(), want)
	})
}

// stop cancels the command, as an interrupt does, and fails the test unless it returns
// nil.
func (r *running) stop(t *testing.T) {
	t.Helper()
	r.cancel()
	if err := r.result(t); err != nil {
		t.Fatalf("the command returned %v once cancelled, want nil; stderr:\n%s", err, r.stderr)
	}
}

// TestGetWatchTable watches routes in the table formats through nimbus's real status
// stream: the current state, then a row for each node's report, new object, new
// generation and deletion, until cancelled; the output is compared with golden files.
func TestGetWatchTable(t *testing.T) {
	for _, format := range []string{"table", "wide", "name", "custom-columns=NAME:.meta.name,GEN:.meta.generation,PROGRAMMED:.status.programmedNodes"} {
		t.Run(strings.SplitN(format, "=", 2)[0], func(t *testing.T) {
			e := newEnv(t)
			e.ok("apply", "-f", e.file("dc2.yaml", routeTo("to-dc2", "198.51.100.0/24", "10.10.0.2", "host-a", "host-b")))
			r := e.start("get", "routes", "-w", "-o", format)
			// Each step waits for its line, so that nimbus sends each change on its own.
			lines := 2 // the header and to-dc2
			if format == "name" {
				lines = 1
			}
			step := func(do func()) {
				t.Helper()
				do()
				eventually(t, "line "+strconv.Itoa(lines)+"; stdout holds:\n"+r.stdout.String(), func() bool {
					return strings.Count(r.stdout.String(), "\n") >= lines
				})
				lines++
			}
			step(func() {})
			step(func() { e.report("to-dc2", "host-a", 1, programmed, "", "") })
			step(func() {
				e.ok("apply", "-f", e.file("dc3.yaml", routeTo("to-dc3", "203.0.113.0/24", "10.10.0.3", "host-a")))
			})
			step(func() {
				e.ok("apply", "-f", e.file("dc2.yaml", routeTo("to-dc2", "198.51.100.0/24", "10.10.0.12", "host-a", "host-b")))
			})
			step(func() { e.ok("delete", "route", "to-dc3") })
			r.stop(t)
			golden(t, "get-routes-watch-"+strings.SplitN(format, "=", 2)[0]+".txt", r.stdout.String())
		})
	}
}

// TestGetWatchDocuments watches one route in -o yaml and -o json: a document for the
// current state, one per change (a node's report, a deletion with "deleted": true), YAML
// documents separated by ---.
func TestGetWatchDocuments(t *testing.T) {
	for _, format := range []string{"yaml", "json", "jsonpath"} {
		t.Run(format, func(t *testing.T) {
			e := newEnv(t)
			e.ok("apply", "-f", e.file("dc2.yaml", routeTo("to-dc2", "198.51.100.0/24", "10.10.0.2", "host-a")))
			e.ok("apply", "-f", e.file("dc3.yaml", routeTo("to-dc3", "203.0.113.0/24", "10.10.0.3", "host-a")))
			out := format
			if format == "jsonpath" {
				out = `jsonpath={.meta.name} {.status.programmedNodes}/{.status.targetNodes}{.deleted}{"\n"}`
			}
			r := e.start("get", "route", "to-dc2", "--watch", "-o", out)
			waitDocs := func(n int) {
				t.Helper()
				eventually(t, "document "+strconv.Itoa(n)+"; stdout holds:\n"+r.stdout.String(), func() bool {
					return strings.Count(r.stdout.String(), "to-dc2") >= n
				})
			}
			waitDocs(1)
			e.report("to-dc3", "host-a", 1, programmed, "", "") // not watched: prints nothing
			e.report("to-dc2", "host-a", 1, programmed, "", "route in table 100")
			waitDocs(2)
			e.ok("delete", "route", "to-dc2")
			eventually(t, "the deletion; stdout holds:\n"+r.stdout.String(), func() bool {
				return strings.Contains(r.stdout.String(), "deleted: true") || strings.Contains(r.stdout.String(), `"deleted": true`) ||
					strings.Contains(r.stdout.String(), "0/0true") || strings.Contains(r.stdout.String(), "1/1true")
			})
			r.stop(t)
			golden(t, "get-route-watch."+format, withoutUIDs(r.stdout.String()))
		})
	}
}

// TestGetWatchEmpty watches a kind of which there are no objects: stderr says so, and
// the table, header included, starts with the first object.
func TestGetWatchEmpty(t *testing.T) {
	e := newEnv(t)
	r := e.start("get", "routes", "-w")
	r.waitStderr(t, "No resources found.\n")
	if out := r.stdout.String(); out != "" {
		t.Errorf("get -w of no routes printed %q before any route", out)
	}
	e.ok("apply", "-f", e.file("dc2.yaml", routeYAML("to-dc2", "198.51.100.0/24", "10.10.0.2")))
	r.waitStdout(t, "to-dc2")
	r.stop(t)
	equal(t, "get -w from no routes", r.stdout.String(), ""+
		"NAME     TENANT    NAMESPACE   GENERATION   PROGRAMMED   FAILED   PENDING   STALE   AGE\n"+
		"to-dc2   default   default     1            0/1          0        1         0       90s\n")
}

// TestGetWatchErrors: a watch of an object that does not exist, or of a nimbus that
// cannot be reached, fails at once rather than waiting.
func TestGetWatchErrors(t *testing.T) {
	e := newEnv(t)
	if err := e.fails("get", "route", "missing", "-w"); !errors.Is(err, ErrNotFound) {
		t.Errorf("get -w of a missing route: %v, want ErrNotFound", err)
	}
	err := e.fails("--server", "unix://"+filepath.Join(e.dir, "nobody.sock"), "get", "routes", "-w")
	contains(t, "get -w of an unreachable nimbus", err, "listing Route objects", "is unavailable")
	contains(t, "get -w with a bad template", e.fails("get", "routes", "-w", "-o", "jsonpath={"), `--output "jsonpath={"`)
}
