package agent

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/naplesnet/naples/delphi"
	"github.com/naplesnet/naples/internal/testns"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// runAgent runs an agent until the returned stop is called; stop fails the test unless
// Run then returns nil.
func runAgent(t *testing.T, cfg Config) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- Run(ctx, cfg) }()
	return func() {
		t.Helper()
		cancel()
		select {
		case err := <-ran:
			if err != nil {
				t.Errorf("Run after cancel = %v, want nil", err)
			}
		case <-time.After(20 * time.Second):
			t.Fatal("Run did not return after cancel")
		}
	}
}

// waitRoute waits until the namespace's table 100 holds the route.
func waitRoute(t *testing.T, nsName, want string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		// The table does not exist until its first route: ip fails until then.
		out, _ := exec.Command("ip", "-n", nsName, "route", "show", "table", "100").CombinedOutput()
		if strings.Contains(string(out), want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%q never reached the namespace's table 100", want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestRestartEnforcesStoredStateWithoutNimbus runs an agent against nimbus until a route
// is programmed, stops both, deletes the route by hand, and starts the agent again with
// nimbus gone: the route comes back from the state delphi kept in the state directory.
func TestRestartEnforcesStoredStateWithoutNimbus(t *testing.T) {
	nsName, ns := hostNamespace(t, "naples-state")
	dir := t.TempDir()
	addr, api, stopNimbus := startNimbus(t, dir)
	route := &nimbusv1.Object{
		Meta: &nimbusv1.ObjectMeta{Name: "to-dc2", Nodes: []string{"host-a"}},
		Spec: &nimbusv1.Object_Route{Route: &nimbusv1.RouteSpec{Table: 100, Prefix: "198.51.100.0/24", Nexthops: []*nimbusv1.NextHop{{Gateway: "10.10.0.2"}}}},
	}
	if _, err := api.Apply(context.Background(), &nimbusv1.ApplyRequest{Object: route}); err != nil {
		t.Fatal(err)
	}
	cfg := Config{Node: "host-a", Nimbus: addr, StateDir: filepath.Join(dir, "state"), Logger: quiet, netns: &ns}
	stop := runAgent(t, cfg)
	waitRoute(t, nsName, "198.51.100.0/24 via 10.10.0.2")
	stop()
	stopNimbus()
	os.Remove(strings.TrimPrefix(addr, "unix://"))

	testns.Run(t, "ip", "-n", nsName, "route", "del", "198.51.100.0/24", "table", "100")
	stop = runAgent(t, cfg)
	waitRoute(t, nsName, "198.51.100.0/24 via 10.10.0.2")
	stop()
}

// TestCorruptStateFile starts an agent on a state directory whose delphi file is garbage:
// it refuses, naming the file and the way out, and with DiscardState it starts afresh.
func TestCorruptStateFile(t *testing.T) {
	nsName := testns.Named(t, "naples-state")
	ns := testns.Handle(t, nsName)
	stateDir := filepath.Join(t.TempDir(), "state")
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(stateDir, delphi.StateFile)
	if err := os.WriteFile(path, []byte(strings.Repeat("garbage ", 4096)), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := Config{Node: "host-a", Nimbus: "unix://" + filepath.Join(stateDir, "none.sock"), StateDir: stateDir, Logger: quiet, netns: &ns}
	err := Run(context.Background(), cfg)
	if !errors.Is(err, delphi.ErrCorrupt) || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "--discard-state") {
		t.Fatalf("Run on a corrupt state file = %v, want ErrCorrupt naming %s and --discard-state", err, path)
	}

	cfg.DiscardState = true
	stop := runAgent(t, cfg)
	stop()
	s, err := delphi.Open(delphi.Options{Dir: stateDir, Logger: quiet})
	if err != nil {
		t.Fatalf("the state file after a discarding start: %v", err)
	}
	defer s.Close()
	if n := len(s.List(nimbusv1.Kind_KIND_UNSPECIFIED)); n != 0 {
		t.Errorf("after a discarding start the state holds %d objects, want 0", n)
	}
}
