package agent

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestFirewallThatCannotLoadStopsTheAgent checks that the firewall's programs and maps,
// which load in the background while delphi restores, still stop the agent at start
// with an error naming the firewall when they cannot load: here --bpf-dir is not on
// bpffs, where no map can be pinned.
func TestFirewallThatCannotLoadStopsTheAgent(t *testing.T) {
	dir := t.TempDir()
	ran := make(chan error, 1)
	go func() {
		ran <- Run(context.Background(), Config{Node: "host-a", Nimbus: "unix://" + filepath.Join(dir, "nimbus.sock"),
			StateDir: filepath.Join(dir, "state"), BPFDir: filepath.Join(dir, "bpf"), Logger: quiet})
	}()
	select {
	case err := <-ran:
		if err == nil || !strings.Contains(err.Error(), "starting the firewall") || !strings.Contains(err.Error(), "firewall: loading the firewall's maps") {
			t.Fatalf("Run = %v, want an error starting the firewall, naming its maps", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return on a firewall that cannot load")
	}
}
