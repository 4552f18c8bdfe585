package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/naplesnet/naples/internal/version/versiontest"
)

func TestMain(m *testing.M) { versiontest.Main(m, main) }

func TestVersionFlag(t *testing.T) {
	// --log-level makes sure --version wins over the flags that configure a run.
	versiontest.Flag(t, "naples-agent", "--log-level", "debug")
}

// TestExitStatus runs the command: a command line or configuration it cannot run with
// exits 2, which the systemd unit does not restart; a failure while it runs exits 1.
func TestExitStatus(t *testing.T) {
	dir := t.TempDir()
	notADir := filepath.Join(dir, "file")
	if err := os.WriteFile(notADir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		args []string
		want int
		// says is what stderr must hold.
		says string
	}{
		{[]string{"--node", "Host_A", "--insecure"}, 2, `invalid value "Host_A" for flag --node`},
		{[]string{"--no-such-flag"}, 2, "no-such-flag"},
		{[]string{"--node", "host-a", "--state-dir", ""}, 2, "-state-dir"},
		{[]string{"--node", "host-a", "--tls-cert", filepath.Join(dir, "missing.crt")}, 2, "missing.crt"},
		{[]string{"--node", "host-a", "--insecure", "--socket", "", "--bpf-dir", "", "--state-dir", filepath.Join(notADir, "state")}, 1, "state"},
	} {
		status, stderr := versiontest.ExitStatus(t, tt.args...)
		if status != tt.want || !strings.Contains(stderr, tt.says) {
			t.Errorf("naples-agent %q: exit status %d, stderr:\n%s\nwant status %d and a line naming %s", tt.args, status, stderr, tt.want, tt.says)
		}
	}
}
