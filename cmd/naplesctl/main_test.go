package main

import (
	"context"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/naplesnet/naples/internal/version/versiontest"
	"github.com/naplesnet/naples/nimbus"
)

func TestMain(m *testing.M) { versiontest.Main(m, main) }

// TestExitStatus runs the command: a command line it cannot run exits 2, a failure while
// it runs exits 1, but diff's, 2.
func TestExitStatus(t *testing.T) {
	dir := t.TempDir()
	// Nothing listens on the socket: the call fails.
	server := "unix://" + filepath.Join(dir, "nimbus.sock")
	route := filepath.Join(dir, "route.yaml")
	if err := os.WriteFile(route, []byte("kind: Route\nmeta: {name: r}\nspec: {table: 100, prefix: 10.9.0.0/16, nexthops: [{gateway: 10.0.0.1}]}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
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
		// diff exits 1 for a difference, so every failure of its own exits 2.
		{[]string{"--server", server, "--insecure", "diff", "-f", route}, 2, "unavailable"},
		{[]string{"--server", server, "--insecure", "version"}, 1, "unavailable"},
	} {
		status, stderr := versiontest.ExitStatus(t, tt.args...)
		if status != tt.want || !strings.Contains(stderr, tt.says) {
			t.Errorf("naplesctl %q: exit status %d, stderr:\n%s\nwant status %d and a line naming %s", tt.args, status, stderr, tt.want, tt.says)
		}
	}
}

// TestDiffExitStatus runs diff against a nimbus: it exits 1 when apply would change
// something, printing nothing on stderr, and 0 once nothing would change.
func TestDiffExitStatus(t *testing.T) {
	dir := t.TempDir()
	srv, err := nimbus.New(nimbus.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "nimbus.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, lis) }()
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	route := filepath.Join(dir, "route.yaml")
	if err := os.WriteFile(route, []byte("kind: Route\nmeta: {name: r}\nspec: {table: 100, prefix: 10.9.0.0/16, nexthops: [{gateway: 10.0.0.1}]}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"--server", "unix://" + sock, "--insecure", "diff", "-f", route}
	if status, stderr := versiontest.ExitStatus(t, args...); status != 1 || stderr != "" {
		t.Errorf("diff of a new route: exit status %d, stderr %q; want 1 and nothing", status, stderr)
	}
	if status, stderr := versiontest.ExitStatus(t, "--server", "unix://"+sock, "--insecure", "apply", "-f", route); status != 0 {
		t.Fatalf("apply: exit status %d, stderr:\n%s", status, stderr)
	}
	if status, stderr := versiontest.ExitStatus(t, args...); status != 0 || stderr != "" {
		t.Errorf("diff after apply: exit status %d, stderr %q; want 0 and nothing", status, stderr)
	}
}
