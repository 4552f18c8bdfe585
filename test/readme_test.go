package test

import (
	"bufio"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/naplesnet/naples/internal/testns"
)

// readmeUsing returns the shell lines of the code block of README.md's "Using it".
func readmeUsing(t *testing.T) []string {
	t.Helper()
	f, err := os.Open("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var lines []string
	section, block := false, false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "## "):
			section = line == "## Using it"
		case section && strings.HasPrefix(line, "```"):
			if block {
				return lines
			}
			block = true
		case section && block:
			lines = append(lines, line)
		}
	}
	t.Fatalf("README.md has no code block under \"## Using it\" (%v)", sc.Err())
	return nil
}

// TestReadmeRouteExample follows README.md's "Using it" on a fresh host, a namespace with
// only lo up: the ip commands it runs before applying examples/route.yaml, then the apply
// with --wait, which must see the route PROGRAMMED and in the kernel.
func TestReadmeRouteExample(t *testing.T) {
	var setup []string
	applied := false
	for _, line := range readmeUsing(t) {
		cmd, _, _ := strings.Cut(line, "#")
		cmd = strings.TrimSpace(cmd)
		if strings.HasPrefix(cmd, "bin/naplesctl apply -f examples/route.yaml") {
			applied = true
			break
		}
		if strings.HasPrefix(cmd, "ip ") {
			setup = append(setup, cmd)
		}
	}
	if !applied {
		t.Fatal(`README.md's "Using it" does not apply examples/route.yaml`)
	}

	c := newCluster(t)
	c.certs(t, "host-a")
	ns := testns.Named(t, "naples-readme")
	for _, cmd := range setup {
		testns.Run(t, "ip", append([]string{"-n", ns}, strings.Fields(cmd)[1:]...)...)
	}
	bpf := filepath.Join(bpffs, filepath.Base(c.dir)+"-host-a")
	t.Cleanup(func() { os.RemoveAll(bpf) })
	h := &host{name: "host-a", ns: ns, state: filepath.Join(c.dir, "state-host-a"), c: c, cert: "host-a", bpf: bpf}
	h.startAgent(t)

	if out, err := c.ctl(t, "", "apply", "-f", "../examples/route.yaml", "--wait", "--timeout", "20s"); err != nil {
		t.Fatalf("the README's route on a fresh host: %v\n%s", err, out)
	}
	if got := h.routes(t, 100); !strings.Contains(got, "198.51.100.0/24 via 10.10.0.2") {
		t.Fatalf("the README's route is not in host-a's table 100:\n%s", got)
	}
}
