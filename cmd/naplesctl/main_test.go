package main

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/naplesnet/naples/internal/version/versiontest"
)

func TestMain(m *testing.M) { versiontest.Main(m, main) }

// TestExitStatus runs the command: a command line it cannot run exits 2, a failure while
// it runs exits 1.
func TestExitStatus(t *testing.T) {
	dir := t.TempDir()
	// Nothing listens on the socket: the call fails.
	server := "unix://" + filepath.Join(dir, "nimbus.sock")
	for _, tt := range []struct {
		args []string
		want int
		// says is what stderr must hold.
		says string
	}{
		{[]string{"--no-such-flag"}, 2, "no-such-flag"},
		{[]string{"no-such-command"}, 2, "no-such-command"},
		{[]string{"get"}, 2, "arg"},
		{[]string{"get", "nosuchkind"}, 2, "nosuchkind"},
		{[]string{"apply", "-f", "route.yaml", "--timeout", "3s"}, 2, "--timeout needs --wait"},
		{[]string{"--server", server, "--insecure", "apply", "-f", filepath.Join(dir, "missing.yaml")}, 2, "missing.yaml"},
		{[]string{"wait", "route", "r", "--timeout", "soon"}, 2, `--timeout "soon"`},
		{[]string{"--server", "ftp://x:1", "get", "routes"}, 2, "ftp://x:1"},
		{[]string{"--server", server, "--tls-cert", filepath.Join(dir, "missing.crt"), "get", "routes"}, 2, "missing.crt"},
		{[]string{"--server", server, "--insecure", "get", "routes"}, 1, "unavailable"},
	} {
		status, stderr := versiontest.ExitStatus(t, tt.args...)
		if status != tt.want || !strings.Contains(stderr, tt.says) {
			t.Errorf("naplesctl %q: exit status %d, stderr:\n%s\nwant status %d and a line naming %s", tt.args, status, stderr, tt.want, tt.says)
		}
	}
}
