package agent

import (
	"context"
	"io"
	"log/slog"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netns"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/naplesnet/naples/internal/testns"
	"github.com/naplesnet/naples/nimbus"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// hostNamespace creates a fresh namespace with 10.10.0.1/24 on eth0, the subnet of the
// tests' gateways, and returns its name and a handle for the agent to program it through.
func hostNamespace(t *testing.T, prefix string) (string, netns.NsHandle) {
	t.Helper()
	name := testns.Named(t, prefix)
	testns.Run(t, "ip", "-n", name, "link", "add", "eth0", "type", "veth", "peer", "name", "eth1")
	testns.Run(t, "ip", "-n", name, "addr", "add", "10.10.0.1/24", "dev", "eth0")
	testns.Run(t, "ip", "-n", name, "link", "set", "eth0", "up")
	return name, testns.Handle(t, name)
}

// startNimbus serves a real, in-memory nimbus on a unix socket in dir and returns its
// address, a client of it, and a stop function that is safe to call twice (the test's
// cleanup calls it too).
func startNimbus(t *testing.T, dir string) (string, nimbusv1.NimbusClient, func()) {
	t.Helper()
	addr, conn, stop := startNimbusWith(t, dir, nimbus.Options{})
	return addr, nimbusv1.NewNimbusClient(conn), stop
}

// startNimbusWith is startNimbus with the options (an unset Logger discards) and the
// client's connection.
func startNimbusWith(t *testing.T, dir string, opts nimbus.Options) (string, *grpc.ClientConn, func()) {
	t.Helper()
	sock := filepath.Join(dir, "nimbus.sock")
	if opts.Logger == nil {
		opts.Logger = quiet
	}
	srv, err := nimbus.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, lis) }()
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	stop := sync.OnceFunc(func() {
		conn.Close()
		cancel()
		if err := <-served; err != nil {
			t.Errorf("nimbus Serve: %v", err)
		}
		srv.Close()
	})
	t.Cleanup(stop)
	return "unix://" + sock, conn, stop
}

// TestRunReportsAndStops runs a whole agent, programming a fresh network namespace,
// against a real nimbus: a route reaches the kernel, an object the agent does not program
// is reported PENDING at nimbus, its observers hold one rtnetlink subscription between
// them, and when the context ends Run returns nil with every goroutine stopped (goleak).
func TestRunReportsAndStops(t *testing.T) {
	nsName, ns := hostNamespace(t, "naples-agent")
	dir := t.TempDir()
	addr, api, stop := startNimbus(t, dir)
	defer stop()
	group := &nimbusv1.Object{
		Meta: &nimbusv1.ObjectMeta{Name: "web", Nodes: []string{"host-a"}},
		Spec: &nimbusv1.Object_SecurityGroup{SecurityGroup: &nimbusv1.SecurityGroupSpec{Cidrs: []string{"192.0.2.0/24"}}},
	}
	route := &nimbusv1.Object{
		Meta: &nimbusv1.ObjectMeta{Name: "to-dc2", Nodes: []string{"host-a"}},
		Spec: &nimbusv1.Object_Route{Route: &nimbusv1.RouteSpec{Table: 100, Prefix: "198.51.100.0/24", Nexthops: []*nimbusv1.NextHop{{Gateway: "10.10.0.2"}}}},
	}
	for _, obj := range []*nimbusv1.Object{group, route} {
		if _, err := api.Apply(context.Background(), &nimbusv1.ApplyRequest{Object: obj}); err != nil {
			t.Fatal(err)
		}
	}

	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() {
		ran <- Run(ctx, Config{Node: "host-a", Nimbus: addr, StateDir: filepath.Join(dir, "state"), Logger: quiet, netns: &ns})
	}()
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := api.Get(context.Background(), &nimbusv1.GetRequest{Key: group.Key()})
		if err == nil && len(resp.GetItem().GetStatus().GetNodes()) == 1 {
			st := resp.GetItem().GetStatus().GetNodes()[0]
			if st.GetNode() != "host-a" || st.GetPhase() != nimbusv1.Phase_PHASE_PENDING || st.GetReason() != "Unsupported" {
				t.Fatalf("status = %v, want host-a PENDING Unsupported", st)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the agent's status never reached nimbus")
		}
		time.Sleep(20 * time.Millisecond)
	}

	// Until the route is there, table 100 may not exist, and `ip route show` fails.
	for {
		out, _ := exec.Command("ip", "-n", nsName, "route", "show", "table", "100").CombinedOutput()
		if strings.Contains(string(out), "198.51.100.0/24 via 10.10.0.2") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the route never reached the namespace's table 100")
		}
		time.Sleep(20 * time.Millisecond)
	}

	// Every observer of the namespace hears the kernel through one subscription: the
	// count never goes past one while they start, and is one once they have.
	for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if n := testns.RouteSubscriptions(t, nsName); n > 1 {
			t.Fatalf("the agent holds %d rtnetlink subscriptions in its namespace, want 1", n)
		}
	}
	if n := testns.RouteSubscriptions(t, nsName); n != 1 {
		t.Errorf("the agent holds %d rtnetlink subscriptions in its namespace, want 1", n)
	}

	// A second agent on the same state directory is refused while the first runs.
	err := Run(context.Background(), Config{Node: "host-a", Nimbus: addr, StateDir: filepath.Join(dir, "state"), Logger: quiet})
	if err == nil || !strings.Contains(err.Error(), "another agent") {
		t.Errorf("second agent on the same state directory: err = %v, want a lock refusal", err)
	}

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

func TestRunRefusesBadConfig(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{Node: "Host_A", Nimbus: "unix:///x.sock", StateDir: t.TempDir()}, `node "Host_A"`},
		{Config{Node: "host-a", Nimbus: "http://x", StateDir: t.TempDir()}, `address "http://x"`},
		{Config{Node: "host-a", Nimbus: "unix:///x.sock"}, "state directory is required"},
	} {
		err := Run(context.Background(), tc.cfg)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Run(%+v) = %v, want an error containing %q", tc.cfg, err, tc.want)
		}
	}
}
