package test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/naplesnet/naples/internal/testns"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// bin is the directory holding the binaries TestMain builds.
var bin string

// bpffs is a bpffs instance TestMain mounts for the hosts' firewalls, each of which pins
// in a directory of its own under it. Agents run under `ip netns exec`, which mounts a
// fresh /sys in a mount namespace of their own: a bpffs an agent mounted on /sys/fs/bpf
// there would die with it, and a restarted agent would find nothing pinned.
var bpffs string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "naples-e2e-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bin = dir
	// Tests run the binaries with the race detector; benchmarks measure them without.
	flag.Parse()
	args := []string{"build", "-race", "-o", dir + "/", "../cmd/nimbus", "../cmd/naples-agent", "../cmd/naplesctl"}
	if flag.Lookup("test.bench").Value.String() != "" {
		args = slices.Delete(args, 1, 2)
	}
	build := exec.Command("go", args...)
	build.Stdout, build.Stderr = os.Stdout, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building binaries:", err)
		os.Exit(1)
	}
	// A binary built with -race sleeps a second when it exits (GORACE's atexit_sleep_ms),
	// which every naplesctl call and every stopped agent would pay; the races it waits to
	// report are reported all the same.
	if os.Getenv("GORACE") == "" {
		os.Setenv("GORACE", "atexit_sleep_ms=0")
	}
	bpffs = filepath.Join(dir, "bpffs")
	mounted := os.Mkdir(bpffs, 0o700) == nil && unix.Mount("bpf", bpffs, "bpf", 0, "mode=0700") == nil
	code := m.Run()
	if mounted {
		unix.Unmount(bpffs, unix.MNT_DETACH)
	}
	os.RemoveAll(dir)
	os.Exit(code)
}

// deadline is how long a test waits for the system to converge.
const deadline = 30 * time.Second

// proc is a running binary whose output goes to a log file shown when the test fails.
type proc struct {
	cmd  *exec.Cmd
	log  string
	done chan error
	// exited is set once the process has been reaped by stop or kill.
	exited bool
}

func start(t testing.TB, logName string, name string, args ...string) *proc {
	t.Helper()
	logPath := filepath.Join(t.TempDir(), logName+".log")
	f, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", name, err)
	}
	f.Close()
	p := &proc{cmd: cmd, log: logPath, done: make(chan error, 1)}
	go func() { p.done <- cmd.Wait() }()
	t.Cleanup(func() {
		p.stop(t)
		if t.Failed() {
			out, _ := os.ReadFile(logPath)
			t.Logf("%s log:\n%s", logName, out)
		}
	})
	return p
}

// stop sends SIGTERM and waits for a clean exit; it is safe to call twice.
func (p *proc) stop(t testing.TB) {
	t.Helper()
	if p.exited {
		return
	}
	p.exited = true
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.done:
		if err != nil {
			t.Errorf("%s exited with %v after SIGTERM", filepath.Base(p.cmd.Path), err)
		}
	case <-time.After(deadline):
		_ = p.cmd.Process.Kill()
		<-p.done
		t.Errorf("%s did not stop within %v of SIGTERM", filepath.Base(p.cmd.Path), deadline)
	}
}

// kill sends SIGKILL and reaps the process.
func (p *proc) kill(t testing.TB) {
	t.Helper()
	if err := p.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-p.done
	p.exited = true
}

// cluster is one nimbus and a way to reach it with naplesctl.
type cluster struct {
	dir    string
	server string
	nimbus *proc
	// nimbusArgs are nimbus's command-line flags.
	nimbusArgs []string
	// pki is the directory of the certificates naplesctl certs makes: ca, nimbus,
	// publisher and one per node.
	pki string
}

// newCluster starts nimbus with TLS and a data directory in the test's temporary
// directory; extra flags for nimbus are appended.
func newCluster(t testing.TB, nimbusArgs ...string) *cluster {
	t.Helper()
	testns.RequireRoot(t)
	dir := t.TempDir()
	sock := filepath.Join(dir, "nimbus.sock")
	c := &cluster{dir: dir, server: "unix://" + sock, pki: filepath.Join(dir, "pki")}
	c.certs(t)
	args := []string{"--listen", c.server, "--log-level", "debug",
		"--data-dir", filepath.Join(dir, "nimbus-data"),
		"--tls-cert", c.file("nimbus.crt"), "--tls-key", c.file("nimbus.key"), "--tls-ca", c.file("ca.crt")}
	c.nimbusArgs = append(args, nimbusArgs...)
	c.startNimbus(t)
	return c
}

// startNimbus starts nimbus with the cluster's flags and waits until it listens.
func (c *cluster) startNimbus(t testing.TB) {
	t.Helper()
	sock := strings.TrimPrefix(c.server, "unix://")
	c.nimbus = start(t, "nimbus", filepath.Join(bin, "nimbus"), c.nimbusArgs...)
	waitFor(t, "nimbus to listen", func() bool {
		conn, err := net.Dial("unix", sock)
		if err == nil {
			conn.Close()
		}
		return err == nil
	})
}

// certs makes the cluster's CA, nimbus's and the publisher's certificates if missing,
// and the certificates of the nodes, with naplesctl certs.
func (c *cluster) certs(t testing.TB, nodes ...string) {
	t.Helper()
	args := []string{"certs", "--dir", c.pki}
	if len(nodes) > 0 {
		args = append(args, "--nodes", strings.Join(nodes, ","))
	}
	if out, err := exec.Command(filepath.Join(bin, "naplesctl"), args...).CombinedOutput(); err != nil {
		t.Fatalf("naplesctl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// file returns the path of a file of the cluster's pki directory.
func (c *cluster) file(name string) string { return filepath.Join(c.pki, name) }

// host is a node: a network namespace with 10.10.0.1/24 on eth0 and 10.20.0.1/24 on
// eth1, and the agent running inside it.
type host struct {
	name  string
	ns    string
	state string
	c     *cluster
	agent *proc
	// cert is the node whose certificate the agent presents; normally name.
	cert string
	// bpf is the bpffs directory the agent's firewall pins its maps and links in.
	bpf string
}

func (c *cluster) newHost(t testing.TB, name string) *host {
	t.Helper()
	return c.newHostWithCert(t, name, name)
}

// newHostWithCert is newHost with an agent presenting the certificate of node cert.
func (c *cluster) newHostWithCert(t testing.TB, name, cert string) *host {
	t.Helper()
	h := c.addHost(t, name, cert)
	h.startAgent(t)
	return h
}

// newHostWith is newHost with extra flags for the agent's first start.
func (c *cluster) newHostWith(t testing.TB, name string, extra ...string) *host {
	t.Helper()
	h := c.addHost(t, name, name)
	h.startAgentWith(t, extra...)
	return h
}

// addHost makes the host, its namespace and the certificate of node cert for its agent,
// without starting the agent.
func (c *cluster) addHost(t testing.TB, name, cert string) *host {
	t.Helper()
	c.certs(t, cert)
	ns := testns.Named(t, "naples-e2e")
	for _, args := range [][]string{
		{"link", "add", "eth0", "type", "veth", "peer", "name", "eth1"},
		{"addr", "add", "10.10.0.1/24", "dev", "eth0"},
		{"addr", "add", "10.20.0.1/24", "dev", "eth1"},
		{"link", "set", "eth0", "up"},
		{"link", "set", "eth1", "up"},
	} {
		testns.Run(t, "ip", append([]string{"-n", ns}, args...)...)
	}
	// Each host's firewall pins in a bpffs directory of its own, removed after the
	// host's agent has stopped (cleanups run in reverse order).
	bpf := filepath.Join(bpffs, filepath.Base(c.dir)+"-"+name)
	t.Cleanup(func() { os.RemoveAll(bpf) })
	return &host{name: name, ns: ns, state: filepath.Join(c.dir, "state-"+name), c: c, cert: cert, bpf: bpf}
}

func (h *host) startAgent(t testing.TB) {
	t.Helper()
	h.startAgentWith(t)
}

// startAgentWith starts the host's agent with extra flags appended to the usual ones.
func (h *host) startAgentWith(t testing.TB, extra ...string) {
	t.Helper()
	args := []string{"netns", "exec", h.ns, filepath.Join(bin, "naples-agent"),
		"--node", h.name, "--nimbus", h.c.server, "--state-dir", h.state, "--log-level", "debug",
		"--socket", filepath.Join(h.c.dir, "agent-"+h.name+".sock"),
		"--tls-cert", h.c.file(h.cert + ".crt"), "--tls-key", h.c.file(h.cert + ".key"), "--tls-ca", h.c.file("ca.crt"),
		"--bpf-dir", h.bpf}
	h.agent = start(t, "agent-"+h.name, "ip", append(args, extra...)...)
}

// routes returns `ip route show table N` inside the host.
func (h *host) routes(t testing.TB, table int) string {
	t.Helper()
	return testns.Run(t, "ip", "-n", h.ns, "route", "show", "table", fmt.Sprint(table))
}

// ctl runs naplesctl against the cluster's nimbus with the publisher's certificate;
// TLS flags in args override it.
func (c *cluster) ctl(t testing.TB, stdin string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	global := []string{"--server", c.server,
		"--tls-cert", c.file("publisher.crt"), "--tls-key", c.file("publisher.key"), "--tls-ca", c.file("ca.crt")}
	cmd := exec.CommandContext(ctx, filepath.Join(bin, "naplesctl"), append(global, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err != nil {
		return stdout.String(), fmt.Errorf("naplesctl %s: %w: %s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String(), nil
}

func (c *cluster) mustCtl(t testing.TB, stdin string, args ...string) string {
	t.Helper()
	out, err := c.ctl(t, stdin, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// apply applies a manifest given as text.
func (c *cluster) apply(t testing.TB, manifest string) string {
	t.Helper()
	return c.mustCtl(t, manifest, "apply", "-f", "-")
}

// errNotFound is returned by get for an object nimbus does not have.
var errNotFound = errors.New("not found")

// get reads one object and its status with `naplesctl get KIND NAME -o json`.
func (c *cluster) get(t testing.TB, kind, name string) (generation int64, status *nimbusv1.ObjectStatus, err error) {
	t.Helper()
	out, err := c.ctl(t, "", "get", kind, name, "-o", "json")
	if err != nil {
		if strings.Contains(err.Error(), "not found") {
			return 0, nil, errNotFound
		}
		return 0, nil, err
	}
	var doc struct {
		Meta   json.RawMessage `json:"meta"`
		Status json.RawMessage `json:"status"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		return 0, nil, fmt.Errorf("parsing %q: %w", out, err)
	}
	meta := &nimbusv1.ObjectMeta{}
	if err := protojson.Unmarshal(doc.Meta, meta); err != nil {
		return 0, nil, fmt.Errorf("parsing meta %s: %w", doc.Meta, err)
	}
	status = &nimbusv1.ObjectStatus{}
	if len(doc.Status) > 0 {
		if err := protojson.Unmarshal(doc.Status, status); err != nil {
			return 0, nil, fmt.Errorf("parsing status %s: %w", doc.Status, err)
		}
	}
	return meta.GetGeneration(), status, nil
}

// nodeStatus returns the status one node reports for an object, or nil.
func nodeStatus(st *nimbusv1.ObjectStatus, node string) *nimbusv1.NodeStatus {
	for _, ns := range st.GetNodes() {
		if ns.GetNode() == node {
			return ns
		}
	}
	return nil
}

// waitProgrammed waits until node reports the object PROGRAMMED at the given generation.
func (c *cluster) waitProgrammed(t testing.TB, kind, name, node string, generation int64) *nimbusv1.NodeStatus {
	t.Helper()
	var last *nimbusv1.NodeStatus
	waitFor(t, fmt.Sprintf("%s %s PROGRAMMED at generation %d on %s", kind, name, generation, node), func() bool {
		gen, st, err := c.get(t, kind, name)
		if err != nil {
			return false
		}
		last = nodeStatus(st, node)
		return gen == generation && last.GetPhase() == nimbusv1.Phase_PHASE_PROGRAMMED && last.GetObservedGeneration() == generation
	})
	return last
}

func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	end := time.Now().Add(deadline)
	for !cond() {
		if time.Now().After(end) {
			t.Fatalf("timed out after %v waiting for %s", deadline, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// markerTable is the routing table monitorRoutes writes its marker routes to; no test
// uses it otherwise.
const markerTable = "250"

// routeMonitor is `ip monitor route` running in a host.
type routeMonitor struct {
	log string
	// offset is where the monitor's output starts after the markers.
	offset int
}

// monitorRoutes starts `ip monitor route` in the host and returns once the monitor
// provably receives route events: it adds and deletes marker routes (`blackhole
// 10.20N.N.0/24 table 250 proto static`, a new one each time) until the monitor prints
// one, then waits for the last one's deletion. What the monitor prints after that is what
// output returns. The monitor stops when the test ends.
func (h *host) monitorRoutes(t testing.TB) *routeMonitor {
	t.Helper()
	m := &routeMonitor{log: filepath.Join(t.TempDir(), "monitor.log")}
	f, err := os.Create(m.log)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("ip", "-n", h.ns, "monitor", "route")
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		f.Close()
		t.Fatalf("starting ip monitor route: %v", err)
	}
	f.Close()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			out, _ := os.ReadFile(m.log)
			t.Logf("ip monitor route in %s:\n%s", h.name, out)
		}
	})
	read := func() string {
		out, err := os.ReadFile(m.log)
		if err != nil {
			t.Fatal(err)
		}
		return string(out)
	}
	markers := 0
	waitFor(t, "ip monitor route to print a marker route", func() bool {
		marker := fmt.Sprintf("10.%d.%d.0/24", 200+markers/256, markers%256)
		markers++
		for _, op := range []string{"add", "del"} {
			testns.Run(t, "ip", "-n", h.ns, "route", op, "blackhole", marker, "table", markerTable, "proto", "static")
		}
		return strings.Contains(read(), " table "+markerTable+" ")
	})
	// The monitor prints every marker from the first one it printed on, in order, so the
	// last one's deletion is the last of them.
	last := markers - 1
	end := fmt.Sprintf("Deleted blackhole 10.%d.%d.0/24 table %s", 200+last/256, last%256, markerTable)
	waitFor(t, "ip monitor route to print the last marker's deletion", func() bool {
		out := read()
		i := strings.LastIndex(out, end)
		if i < 0 {
			return false
		}
		nl := strings.IndexByte(out[i:], '\n')
		if nl < 0 {
			return false
		}
		m.offset = i + nl + 1
		return true
	})
	return m
}

// output returns what the monitor printed since monitorRoutes returned.
// Routes the kernel makes itself (`proto kernel`, such as the IPv6 link-local routes of
// links that came up shortly before) are left out: the agent never writes those.
func (m *routeMonitor) output(t testing.TB) string {
	t.Helper()
	out, err := os.ReadFile(m.log)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for line := range strings.Lines(string(out[m.offset:])) {
		if !strings.Contains(line, " proto kernel ") {
			b.WriteString(line)
		}
	}
	return b.String()
}
