package nimbusclient

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/naplesnet/naples/delphi"
	"github.com/naplesnet/naples/internal/address"
	"github.com/naplesnet/naples/internal/telemetry/telemetrytest"
	"github.com/naplesnet/naples/nimbus"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// seriesNimbusWatchers is the number of watch streams a nimbus serves.
const seriesNimbusWatchers = "naples_nimbus_watchers"

// replica is a real nimbus server with its own ephemeral store, serving on one listener
// until the test stops it, and a publisher client to it.
type replica struct {
	*bus
	srv *nimbus.Server
	// addr is the address the replica serves on, in the form Options.Address takes.
	addr string
	stop func()
}

// newReplica serves a new nimbus on lis.
func newReplica(t *testing.T, lis net.Listener) *replica {
	t.Helper()
	return serveReplica(t, lis, nimbus.Options{Logger: quiet})
}

// serveReplica serves a new nimbus of the options on lis.
func serveReplica(t *testing.T, lis net.Listener, opts nimbus.Options) *replica {
	t.Helper()
	srv, err := nimbus.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	a := address.Address{Network: lis.Addr().Network(), Addr: lis.Addr().String()}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, lis) }()
	r := &replica{srv: srv, addr: a.String(), bus: &bus{}}
	r.stop = sync.OnceFunc(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve on %s: %v", a, err)
		}
	})
	t.Cleanup(r.stop)
	conn, err := grpc.NewClient(a.GRPCTarget(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	r.api = nimbusv1.NewNimbusClient(conn)
	return r
}

// newUnixReplica serves a new nimbus on a unix socket of its own.
func newUnixReplica(t *testing.T) *replica {
	t.Helper()
	lis, err := net.Listen("unix", filepath.Join(t.TempDir(), "nimbus.sock"))
	if err != nil {
		t.Fatal(err)
	}
	return newReplica(t, lis)
}

// watchers returns how many watch streams the replica serves.
func (r *replica) watchers(t *testing.T) float64 {
	t.Helper()
	v, ok := telemetrytest.Values(t, r.srv.Registry())[seriesNimbusWatchers]
	if !ok {
		t.Fatalf("nimbus at %s has no metric %s", r.addr, seriesNimbusWatchers)
	}
	return v
}

// hasStatus reports whether the replica holds a PROGRAMMED status of node a for the route.
func (r *replica) hasStatus(t *testing.T, name string) bool {
	t.Helper()
	resp, err := r.api.Get(context.Background(), &nimbusv1.GetRequest{Key: routeKey(name)})
	if err != nil {
		t.Fatalf("Get %s from %s: %v", name, r.addr, err)
	}
	for _, st := range resp.GetItem().GetStatus().GetNodes() {
		if st.GetNode() == "a" && st.GetPhase() == nimbusv1.Phase_PHASE_PROGRAMMED {
			return true
		}
	}
	return false
}

// seriesWatchServer is the client's series that names the nimbus its watch is up to.
func seriesWatchServer(addr string) string {
	return fmt.Sprintf("naples_nimbusclient_watch_server{address=%q}", addr)
}

// failoverClient runs a client for node a of the nimbus at addr, an address or a list,
// and returns its delphi store and status writer, and its metrics.
func failoverClient(t *testing.T, addr string) (*agent, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	a := newAgent(t)
	c, err := New(Options{Node: "a", Address: addr, Store: a.store, Logger: quiet, MaxBackoff: 200 * time.Millisecond, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	runClient(t, c)
	return a, reg
}

// watchedReplica waits until exactly one of the replicas serves a watch, the client's,
// and returns it and the other.
func watchedReplica(t *testing.T, replicas [2]*replica) (watched, other *replica) {
	t.Helper()
	waitFor(t, "one replica to serve the client's watch", func() bool {
		w0, w1 := replicas[0].watchers(t), replicas[1].watchers(t)
		switch {
		case w0 == 1 && w1 == 0:
			watched, other = replicas[0], replicas[1]
		case w0 == 0 && w1 == 1:
			watched, other = replicas[1], replicas[0]
		default:
			return false
		}
		return true
	})
	return watched, other
}

// testFailover runs a client of two replicas that hold the same objects. It watches and
// reports to one of them; when that one stops, the client moves to the other within the
// deadline, delphi keeps the objects throughout, its statuses go up to the survivor
// without being written again, and a change applied to the survivor arrives. The
// replicas have stores of their own, so the client cannot resume on the survivor: it
// takes a snapshot, which holds the same objects.
func testFailover(t *testing.T, replicas [2]*replica, addr string) {
	for _, r := range replicas {
		r.apply(t, "r1", "a")
		r.apply(t, "r2", "a")
	}
	a, reg := failoverClient(t, addr)
	waitFor(t, "the first snapshot", func() bool { return slices.Equal(a.names(), []string{"r1", "r2"}) })
	watched, survivor := watchedReplica(t, replicas)
	waitMetric(t, reg, seriesWatchServer(watched.addr), "to be 1", func(v float64) bool { return v == 1 })

	if err := a.status.Set(routeKey("r1"), &nimbusv1.NodeStatus{ObservedGeneration: 1, Phase: nimbusv1.Phase_PHASE_PROGRAMMED}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "r1's status at the watched replica", func() bool { return watched.hasStatus(t, "r1") })
	if survivor.hasStatus(t, "r1") {
		t.Fatalf("r1's status reached %s, which the client does not watch", survivor.addr)
	}

	watched.stop()
	if got := a.names(); !slices.Equal(got, []string{"r1", "r2"}) {
		t.Fatalf("with %s stopped delphi holds %v, want [r1 r2]", watched.addr, got)
	}
	waitFor(t, "the client to watch "+survivor.addr, func() bool { return survivor.watchers(t) == 1 })
	waitMetric(t, reg, seriesWatchServer(survivor.addr), "to be 1", func(v float64) bool { return v == 1 })
	waitMetric(t, reg, seriesSnapshots, "to count the survivor's snapshot", func(v float64) bool { return v == 2 })
	if v, ok := telemetrytest.Values(t, reg)[seriesWatchServer(watched.addr)]; ok {
		t.Errorf("after the failover %s = %v, want no such series", seriesWatchServer(watched.addr), v)
	}
	if got := a.names(); !slices.Equal(got, []string{"r1", "r2"}) {
		t.Fatalf("after the failover delphi holds %v, want [r1 r2]", got)
	}
	waitFor(t, "r1's status at "+survivor.addr, func() bool { return survivor.hasStatus(t, "r1") })

	survivor.apply(t, "r3", "a")
	waitFor(t, "r3 from "+survivor.addr, func() bool { return slices.Equal(a.names(), []string{"r1", "r2", "r3"}) })
}

// TestFailover lists two replicas on unix sockets.
func TestFailover(t *testing.T) {
	replicas := [2]*replica{newUnixReplica(t), newUnixReplica(t)}
	testFailover(t, replicas, replicas[0].addr+","+replicas[1].addr)
}

// TestFailoverMixedNetworks lists a replica on a unix socket and one on tcp.
func TestFailoverMixedNetworks(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	replicas := [2]*replica{newUnixReplica(t), newReplica(t, lis)}
	testFailover(t, replicas, replicas[1].addr+","+replicas[0].addr)
}

// TestFailoverByName gives one host name, localhost, with a replica on each of its
// addresses, 127.0.0.1 and ::1, on the same port.
func TestFailoverByName(t *testing.T) {
	name := "localhost"
	if os.Getenv(hostsNamespaceEnv) != "" {
		name = bothLoopbacksName
	}
	ips, err := net.DefaultResolver.LookupNetIP(context.Background(), "ip", name)
	if err != nil {
		t.Fatalf("resolving %s: %v", name, err)
	}
	var v4, v6 bool
	for _, ip := range ips {
		v4 = v4 || ip.Unmap() == netip.MustParseAddr("127.0.0.1")
		v6 = v6 || ip == netip.IPv6Loopback()
	}
	if !v4 || !v6 {
		if name != "localhost" {
			t.Fatalf("%s resolves to %v in the test's own hosts file, want 127.0.0.1 and ::1", name, ips)
		}
		// Run the test again in a mount namespace of its own, with a hosts file that
		// gives one name both loopback addresses.
		runWithBothLoopbacks(t)
		return
	}
	var lis4, lis6 net.Listener
	for range 10 {
		if lis4, err = net.Listen("tcp4", "127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
		_, port, _ := net.SplitHostPort(lis4.Addr().String())
		if lis6, err = net.Listen("tcp6", net.JoinHostPort("::1", port)); err == nil {
			break
		}
		lis4.Close()
		if !errors.Is(err, syscall.EADDRINUSE) {
			t.Skipf("listening on ::1: %v", err)
		}
	}
	if err != nil {
		t.Fatalf("no port free on both 127.0.0.1 and ::1: %v", err)
	}
	_, port, _ := net.SplitHostPort(lis4.Addr().String())
	replicas := [2]*replica{newReplica(t, lis4), newReplica(t, lis6)}
	testFailover(t, replicas, "tcp://"+name+":"+port)
}

// hostsNamespaceEnv marks the run of the test binary that runWithBothLoopbacks starts, in
// which bothLoopbacksName resolves to 127.0.0.1 and ::1.
const (
	hostsNamespaceEnv = "NAPLES_TEST_HOSTS_NAMESPACE"
	bothLoopbacksName = "replicas.nimbus.test"
)

// runWithBothLoopbacks runs TestFailoverByName in a new mount namespace (unshare -m),
// where a hosts file of the test's, bind-mounted on /etc/hosts, gives bothLoopbacksName
// both loopback addresses. It needs root, which CI has; elsewhere it skips.
func runWithBothLoopbacks(t *testing.T) {
	if os.Geteuid() != 0 && os.Getenv("CI") == "" {
		t.Skip("localhost does not resolve to both 127.0.0.1 and ::1, and a mount namespace with a hosts file of the test's needs root")
	}
	hosts := filepath.Join(t.TempDir(), "hosts")
	if err := os.WriteFile(hosts, []byte("127.0.0.1 "+bothLoopbacksName+"\n::1 "+bothLoopbacksName+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "unshare", "-m", "sh", "-c", `mount --bind "$1" /etc/hosts && exec "$2" -test.run '^TestFailoverByName$' -test.v`,
		"sh", hosts, os.Args[0])
	cmd.Env = append(os.Environ(), hostsNamespaceEnv+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: TestFailoverByName") {
		t.Fatalf("TestFailoverByName with %s in a hosts file of its own: %v\n%s", bothLoopbacksName, err, out)
	}
}

// TestNewRefusesBadAddress checks that New refuses a bad address or list, naming the
// value, before it claims delphi's desired writer.
func TestNewRefusesBadAddress(t *testing.T) {
	store, err := delphi.Open(delphi.Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	for _, tc := range []struct{ address, want string }{
		{"", `""`},
		{"ftp://x:1", `"ftp://x:1"`},
		{"unix:///run/a.sock,", "address 2 is empty"},
		{"unix:///run/a.sock,tcp://nimbus", `"nimbus"`},
		{"unix:///run/a.sock,unix://run/b.sock", `"unix://run/b.sock"`},
		{"tcp://10.0.0.1:7000,10.0.0.1:7000", "tcp://10.0.0.1:7000 is listed twice"},
	} {
		_, err := New(Options{Node: "a", Address: tc.address, Store: store, Logger: quiet})
		if !errors.Is(err, address.ErrBadAddress) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New with Address %q = %v, want ErrBadAddress saying %s", tc.address, err, tc.want)
		}
	}
	if _, err := store.ClaimDesired(); err != nil {
		t.Errorf("claiming the desired writer after New refused every address: %v", err)
	}
}
