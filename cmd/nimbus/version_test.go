package main

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/naplesnet/naples/internal/version/versiontest"
)

func TestMain(m *testing.M) { versiontest.Main(m, main) }

func TestVersionFlag(t *testing.T) {
	// --log-level makes sure --version wins over the flags that configure a run.
	versiontest.Flag(t, "nimbus", "--log-level", "debug")
}

// TestExitStatus runs the command: a command line or configuration it cannot run with
// exits 2, which the systemd unit does not restart; a failure while it runs exits 1.
func TestExitStatus(t *testing.T) {
	dir := t.TempDir()
	for _, tt := range []struct {
		args []string
		want int
		// says is what stderr must hold.
		says string
	}{
		{[]string{"--no-such-flag"}, 2, "no-such-flag"},
		{[]string{"--listen", "ftp://x:1"}, 2, "ftp://x:1"},
		{[]string{"--ephemeral", "--data-dir", dir}, 2, "mutually exclusive"},
		{[]string{"--ephemeral", "--tls-cert", filepath.Join(dir, "missing.crt")}, 2, "missing.crt"},
		// 192.0.2.1 (TEST-NET-1) is no address of this host: listening on it fails.
		{[]string{"--ephemeral", "--insecure", "--listen", "tcp://192.0.2.1:7000"}, 1, "192.0.2.1"},
	} {
		status, stderr := versiontest.ExitStatus(t, tt.args...)
		if status != tt.want || !strings.Contains(stderr, tt.says) {
			t.Errorf("nimbus %q: exit status %d, stderr:\n%s\nwant status %d and a line naming %s", tt.args, status, stderr, tt.want, tt.says)
		}
	}
}
