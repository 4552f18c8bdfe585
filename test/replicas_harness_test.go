package test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	grpcbackoff "google.golang.org/grpc/backoff"

	"github.com/naplesnet/naples/internal/pki"
	"github.com/naplesnet/naples/internal/telemetry/telemetrytest"
	"github.com/naplesnet/naples/internal/testetcd"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// This file runs nimbus as several replicas over a real etcd cluster: each replica is a
// cmd/nimbus process with --store etcd, serving mutual TLS with a replica certificate of
// `naplesctl certs --replicas` on a Unix socket of its own, which is also where the other
// replicas reach it (--advertise). The cluster the replicas make has for its server the
// list of every replica's address, so that the hosts made from it run agents that fail
// over between the replicas, and naplesctl does too.

// replicaCluster is nimbus as replicas over an etcd cluster.
type replicaCluster struct {
	// cluster holds the directory, the certificates and naplesctl's server: the list of
	// every replica's address. It runs no nimbus of its own.
	*cluster
	etcd     *testetcd.Cluster
	replicas []*replica
}

// replica is one nimbus replica, running or not.
type replica struct {
	name string
	// addr is where it serves and where its peers reach it: unix:///path.
	addr string
	args []string
	// proc is its running process, or the last one.
	proc *proc
	// metrics is host:port of the running process's telemetry endpoint.
	metrics string
	// conn is a publisher's connection to it, made on first use; it outlives restarts.
	conn *grpc.ClientConn
}

// replicaName returns the name of replica i.
func replicaName(i int) string { return fmt.Sprintf("r%d", i) }

// planReplicas lays out n replicas over the etcd cluster, with their certificates, and
// starts none; extra flags for every replica are appended to the usual ones.
func planReplicas(t testing.TB, etcd *testetcd.Cluster, n int, extra ...string) *replicaCluster {
	t.Helper()
	dir := t.TempDir()
	rc := &replicaCluster{cluster: &cluster{dir: dir, pki: filepath.Join(dir, "pki")}, etcd: etcd}
	var names, addrs []string
	for i := range n {
		names = append(names, replicaName(i))
		addrs = append(addrs, "unix://"+filepath.Join(dir, replicaName(i)+".sock"))
	}
	rc.server = strings.Join(addrs, ",")
	args := []string{"certs", "--dir", rc.pki, "--replicas", strings.Join(names, ",")}
	if out, err := exec.Command(filepath.Join(bin, "naplesctl"), args...).CombinedOutput(); err != nil {
		t.Fatalf("naplesctl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	for i, name := range names {
		r := &replica{name: name, addr: addrs[i]}
		r.args = append([]string{"--store", "etcd", "--etcd-endpoints", strings.Join(etcd.Endpoints(), ","),
			"--replica-name", name, "--listen", r.addr, "--advertise", r.addr,
			"--tls-cert", rc.file("replica-" + name + ".crt"), "--tls-key", rc.file("replica-" + name + ".key"),
			"--tls-ca", rc.file("ca.crt"), "--metrics", "127.0.0.1:0", "--log-level", "debug"}, extra...)
		rc.replicas = append(rc.replicas, r)
	}
	t.Cleanup(func() {
		for _, r := range rc.replicas {
			if r.conn != nil {
				r.conn.Close()
			}
		}
	})
	return rc
}

// newReplicaCluster starts n replicas over the etcd cluster, which must serve, and waits
// until every one is ready.
func newReplicaCluster(t testing.TB, etcd *testetcd.Cluster, n int, extra ...string) *replicaCluster {
	t.Helper()
	rc := planReplicas(t, etcd, n, extra...)
	for i := range rc.replicas {
		rc.start(t, i)
	}
	for i := range rc.replicas {
		rc.waitReady(t, i)
	}
	return rc
}

// servingNimbusMetrics matches nimbus's log line that names its metrics URL.
var servingNimbusMetrics = regexp.MustCompile(`msg="serving metrics" .*url=http://(\S+)/metrics`)

// start starts replica i and waits until it serves its telemetry and listens on its
// socket; it may not be ready yet.
func (rc *replicaCluster) start(t testing.TB, i int) {
	t.Helper()
	r := rc.replicas[i]
	r.proc = start(t, "nimbus-"+r.name, filepath.Join(bin, "nimbus"), r.args...)
	r.metrics = ""
	p := r.proc
	waitFor(t, fmt.Sprintf("replica %s to serve its metrics and listen", r.name), func() bool {
		if p.exited {
			return false
		}
		if r.metrics == "" {
			out, err := os.ReadFile(p.log)
			if err != nil {
				t.Fatal(err)
			}
			m := servingNimbusMetrics.FindSubmatch(out)
			if m == nil {
				return false
			}
			r.metrics = string(m[1])
		}
		conn, err := net.Dial("unix", strings.TrimPrefix(r.addr, "unix://"))
		if err != nil {
			return false
		}
		conn.Close()
		return true
	})
}

// kill sends SIGKILL to replica i and reaps it.
func (rc *replicaCluster) kill(t testing.TB, i int) {
	t.Helper()
	rc.replicas[i].proc.kill(t)
}

// restart starts replica i again after kill and waits until it is ready.
func (rc *replicaCluster) restart(t testing.TB, i int) {
	t.Helper()
	rc.start(t, i)
	rc.waitReady(t, i)
}

// readyz returns the status code and body of replica i's /readyz.
func (rc *replicaCluster) readyz(t testing.TB, i int) (int, string) {
	t.Helper()
	return rc.httpGet(t, i, "/readyz")
}

// httpGet returns the status code and body of GET path on replica i's telemetry endpoint.
func (rc *replicaCluster) httpGet(t testing.TB, i int, path string) (int, string) {
	t.Helper()
	client := &http.Client{Timeout: deadline}
	resp, err := client.Get("http://" + rc.replicas[i].metrics + path)
	if err != nil {
		t.Fatalf("replica %s: GET %s: %v", rc.replicas[i].name, path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("replica %s: reading GET %s: %v", rc.replicas[i].name, path, err)
	}
	return resp.StatusCode, string(body)
}

// waitReady waits until replica i's /readyz answers 200.
func (rc *replicaCluster) waitReady(t testing.TB, i int) {
	t.Helper()
	var code int
	var body string
	waitUntil(t, fmt.Sprintf("replica %s to be ready", rc.replicas[i].name), func() bool {
		code, body = rc.readyz(t, i)
		return code == http.StatusOK
	}, func() string { return fmt.Sprintf("/readyz answers %d %q", code, body) })
}

// metrics scrapes replica i's /metrics.
func (rc *replicaCluster) metrics(t testing.TB, i int) map[string]float64 {
	t.Helper()
	code, body := rc.httpGet(t, i, "/metrics")
	if code != http.StatusOK {
		t.Fatalf("replica %s: GET /metrics = %d: %s", rc.replicas[i].name, code, body)
	}
	return telemetrytest.Parse(t, body)
}

// api returns the nimbus API of replica i, as the publisher. The connection is made once
// and redials quickly after the replica restarts; calls fail at once with Unavailable
// while the replica does not run.
func (rc *replicaCluster) api(t testing.TB, i int) nimbusv1.NimbusClient {
	t.Helper()
	r := rc.replicas[i]
	if r.conn == nil {
		tlsConfig, err := pki.ClientConfig(rc.file("publisher.crt"), rc.file("publisher.key"), rc.file("ca.crt"), pki.DefaultServerName)
		if err != nil {
			t.Fatal(err)
		}
		r.conn, err = grpc.NewClient(r.addr, grpc.WithTransportCredentials(pki.TransportCredentials(tlsConfig)),
			grpc.WithConnectParams(grpc.ConnectParams{
				Backoff:           grpcbackoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 500 * time.Millisecond},
				MinConnectTimeout: 2 * time.Second,
			}))
		if err != nil {
			t.Fatal(err)
		}
	}
	return nimbusv1.NewNimbusClient(r.conn)
}

// apis returns the API of every replica, in order, made on the test's goroutine so that
// other goroutines may use them.
func (rc *replicaCluster) apis(t testing.TB) []nimbusv1.NimbusClient {
	t.Helper()
	apis := make([]nimbusv1.NimbusClient, len(rc.replicas))
	for i := range rc.replicas {
		apis[i] = rc.api(t, i)
	}
	return apis
}

// ctlVia runs naplesctl against replica i alone.
func (rc *replicaCluster) ctlVia(t testing.TB, i int, stdin string, args ...string) (string, error) {
	t.Helper()
	return rc.ctl(t, stdin, append([]string{"--server", rc.replicas[i].addr}, args...)...)
}

// addrsOf returns the comma-separated addresses of the given replicas.
func (rc *replicaCluster) addrsOf(idx ...int) string {
	addrs := make([]string, len(idx))
	for k, i := range idx {
		addrs[k] = rc.replicas[i].addr
	}
	return strings.Join(addrs, ",")
}

// newHostOn makes a host whose agent knows only the given replicas (every replica when
// none is given) and serves its telemetry in its namespace; extra flags are appended.
func (rc *replicaCluster) newHostOn(t testing.TB, name string, replicas []int, extra ...string) *host {
	t.Helper()
	server := rc.server
	if len(replicas) > 0 {
		server = rc.addrsOf(replicas...)
	}
	flags := append([]string{"--nimbus", server}, metricsFlags...)
	return rc.newHostWith(t, name, append(flags, extra...)...)
}

// replicaOf returns the index of the replica whose address is addr, or -1.
func (rc *replicaCluster) replicaOf(addr string) int {
	for i, r := range rc.replicas {
		if r.addr == addr {
			return i
		}
	}
	return -1
}

// Log lines of an agent's watch starts, with the address of the nimbus it watches.
var (
	watchSynced  = regexp.MustCompile(`msg="synced with nimbus" .*server=(\S+)`)
	watchResumed = regexp.MustCompile(`msg="resumed watch" .*server=(\S+)`)
)

// watchStarts is how an agent's watch streams started, from its log.
type watchStarts struct {
	// snapshots and resumes count the streams that started with a snapshot and those that
	// resumed.
	snapshots, resumes int
	// server is the address the last stream went to; empty before the first.
	server string
}

// watchStarts reads the watch starts of the host's current agent from its log.
func (h *host) watchStarts(t testing.TB) watchStarts {
	t.Helper()
	out, err := os.ReadFile(h.agent.log)
	if err != nil {
		t.Fatal(err)
	}
	var ws watchStarts
	for line := range strings.Lines(string(out)) {
		if m := watchSynced.FindStringSubmatch(line); m != nil {
			ws.snapshots++
			ws.server = m[1]
		} else if m := watchResumed.FindStringSubmatch(line); m != nil {
			ws.resumes++
			ws.server = m[1]
		}
	}
	return ws
}

// waitWatching waits until the host's agent has a watch stream up and returns its starts.
func (h *host) waitWatching(t testing.TB) watchStarts {
	t.Helper()
	var ws watchStarts
	waitFor(t, h.name+"'s agent to watch nimbus", func() bool {
		ws = h.watchStarts(t)
		return ws.server != ""
	})
	return ws
}

// routeTable returns the routes of table 100 in the host as "PREFIX via GATEWAY", sorted
// as ip prints them; none when the table does not exist.
func (h *host) routeTable(t testing.TB) []string {
	t.Helper()
	// Until a route is there, the table does not exist and ip fails.
	out, _ := exec.Command("ip", "-n", h.ns, "route", "show", "table", "100").Output()
	var routes []string
	for line := range strings.Lines(string(out)) {
		f := strings.Fields(line)
		if len(f) >= 3 && f[1] == "via" {
			routes = append(routes, f[0]+" via "+f[2])
		} else if len(f) > 0 {
			routes = append(routes, strings.TrimSpace(line))
		}
	}
	return routes
}

// listRoutes lists the routes through one replica's API.
func listRoutes(ctx context.Context, api nimbusv1.NimbusClient) ([]*nimbusv1.ObjectWithStatus, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := nimbusv1.ListAll(ctx, api, &nimbusv1.ListRequest{Kind: nimbusv1.Kind_KIND_ROUTE})
	if err != nil {
		return nil, err
	}
	return resp.GetItems(), nil
}

// waitUntil is waitFor with a diagnosis: when the deadline passes, the failure says what
// diag returns then, such as what the last check found.
func waitUntil(t testing.TB, what string, cond func() bool, diag func() string) {
	t.Helper()
	end := time.Now().Add(deadline)
	for !cond() {
		if time.Now().After(end) {
			t.Fatalf("timed out after %v waiting for %s: %s", deadline, what, diag())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// etcdWatchRestarts returns how many times each replica has started its etcd watch
// again after it failed (naples_nimbus_etcd_watch_restarts_total).
func (rc *replicaCluster) etcdWatchRestarts(t testing.TB) []float64 {
	t.Helper()
	n := make([]float64, len(rc.replicas))
	for i := range rc.replicas {
		n[i] = rc.metrics(t, i)["naples_nimbus_etcd_watch_restarts_total"]
	}
	return n
}
