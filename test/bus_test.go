package test

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// routes makes n Route manifests for every node, each with its own prefix in table 100.
func manyRoutes(n int, gateway string) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "kind: Route\nmeta:\n  name: r%04d\nspec:\n  table: 100\n  prefix: 10.%d.%d.0/24\n  nexthops:\n    - gateway: %s\n---\n",
			i, 100+i/256, i%256, gateway)
	}
	return b.String()
}

// freePort returns a loopback address no one listens on now.
func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// httpBody returns the body of a GET of the URL.
func httpBody(t *testing.T, url string) []byte {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading %s: %v", url, err)
	}
	return body
}

// metric reads one unlabelled sample from nimbus's /metrics.
func metric(t *testing.T, addr, name string) float64 {
	t.Helper()
	body := httpBody(t, "http://"+addr+"/metrics")
	m := regexp.MustCompile(`(?m)^` + name + ` (\S+)$`).FindSubmatch(body)
	if m == nil {
		t.Fatalf("metric %s not found in:\n%s", name, body)
	}
	v, err := strconv.ParseFloat(string(m[1]), 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// revisions maps object name to revision from a JSON {"items": [...]} listing.
func revisions(t *testing.T, out string) map[string]string {
	t.Helper()
	var doc struct {
		Items []struct {
			Meta struct {
				Name     string      `json:"name"`
				Revision json.Number `json:"revision"`
			} `json:"meta"`
		} `json:"items"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("parsing %.200q: %v", out, err)
	}
	revs := map[string]string{}
	for _, it := range doc.Items {
		revs[it.Meta.Name] = it.Meta.Revision.String()
	}
	return revs
}

// TestStoppedAgentIsResetAndCatchesUp stops one agent with SIGSTOP while hundreds of
// changes are published, a hundred per apply, round after round until nimbus has reset
// that watcher (the stopped agent's socket and stream windows take in a round or more
// before its stream stops taking frames): the other agent is not held back, and after
// SIGCONT the stopped agent's delphi equals nimbus object for object. (A commit queues
// all its events for a watcher that had room when it began, so the watcher is reset by
// one of the commits after its stream stopped taking frames.)
func TestStoppedAgentIsResetAndCatchesUp(t *testing.T) {
	metrics := freePort(t)
	c := newCluster(t, "--watch-buffer", "8", "--metrics", metrics)
	a := c.newHost(t, "host-a")
	b := c.newHost(t, "host-b")
	const n = 600

	// host-a's watch must be under way before it stops: an agent stopped before it
	// watches has no stream to reset.
	c.apply(t, manyRoutes(1, "10.10.0.2"))
	waitFor(t, "host-a to program a first route", func() bool {
		// Until the route is there, table 100 does not exist and ip fails.
		out, _ := exec.Command("ip", "-n", a.ns, "route", "show", "table", "100").Output()
		return strings.Contains(string(out), "via 10.10.0.2")
	})
	if err := a.agent.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	gateways := []string{"10.10.0.2", "10.20.0.2"}
	last := ""
	for round := 0; round < 2 || metric(t, metrics, "naples_nimbus_watcher_resets_total") < 1; round++ {
		if round == 20 {
			t.Fatalf("nimbus did not reset the stopped watcher after %d rounds of %d changes", round, n)
		}
		last = gateways[round%2]
		docs := strings.SplitAfter(manyRoutes(n, last), "---\n")
		for len(docs) > 1 {
			k := min(100, len(docs))
			c.apply(t, strings.Join(docs[:k], ""))
			docs = docs[k:]
		}
	}
	waitFor(t, "host-b to program every route while host-a is stopped", func() bool {
		return strings.Count(b.routes(t, 100), "via "+last) == n
	})

	if err := a.agent.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	want := revisions(t, c.mustCtl(t, "", "get", "routes", "-o", "json"))
	if len(want) != n {
		t.Fatalf("nimbus lists %d routes, want %d", len(want), n)
	}
	sock := filepath.Join(c.dir, "agent-host-a.sock")
	waitFor(t, "host-a's delphi to equal nimbus", func() bool {
		out, err := c.ctl(t, "", "--agent", sock, "delphi", "list", "route", "-o", "json")
		if err != nil {
			return false
		}
		got := revisions(t, out)
		if len(got) != len(want) {
			return false
		}
		for name, rev := range want {
			if got[name] != rev {
				return false
			}
		}
		return true
	})
	waitFor(t, "host-a to program every route", func() bool {
		return strings.Count(a.routes(t, 100), "via "+last) == n
	})
}
