package testetcd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// Defaults of the options.
const (
	// DefaultMaxTxnOps is etcd's --max-txn-ops unless MaxTxnOps says otherwise.
	DefaultMaxTxnOps = 1024
	// DefaultMaxRequestBytes is etcd's --max-request-bytes unless MaxRequestBytes says
	// otherwise.
	DefaultMaxRequestBytes = 8 << 20
)

// Errors of Leader.
var (
	// ErrNoLeader reports that no running member claims to lead the cluster: an election
	// is under way, no member runs, or too few run for a quorum.
	ErrNoLeader = errors.New("no leader")
)

const (
	// readyTimeout bounds how long Start, StartAll and Restart wait for members to serve.
	readyTimeout = 60 * time.Second
	// probeTimeout bounds one readiness probe or status call to one member.
	probeTimeout = 2 * time.Second
	// pollInterval is the pause between two rounds of readiness probes.
	pollInterval = 50 * time.Millisecond
	// killTimeout bounds the wait for a killed member to exit.
	killTimeout = 30 * time.Second
	// tailLines is how many lines of a member's output a failure shows.
	tailLines = 40
	// grpcOverheadBytes is how much larger than --max-request-bytes etcd lets a gRPC
	// request be, so that its own size check, not gRPC's, rejects a large request.
	grpcOverheadBytes = 512 * 1024
	// maxSocketPath is the longest path a Unix socket can have on Linux.
	maxSocketPath = 107
	// probeKey is the key the readiness probe reads; it need not exist.
	probeKey = "\x00testetcd-probe"
)

// An Option changes how Plan and Start configure the members of a cluster.
type Option func(*config)

// config holds what the options set.
type config struct {
	maxTxnOps       int
	maxRequestBytes int
	durable         bool
	flags           []string
}

// MaxTxnOps sets the most operations one transaction may hold (etcd's --max-txn-ops;
// default DefaultMaxTxnOps).
func MaxTxnOps(n int) Option {
	return func(c *config) { c.maxTxnOps = n }
}

// MaxRequestBytes sets the largest request etcd accepts (etcd's --max-request-bytes;
// default DefaultMaxRequestBytes). Clients from Client send requests up to this size.
func MaxRequestBytes(n int) Option {
	return func(c *config) { c.maxRequestBytes = n }
}

// Durable keeps etcd's fsyncs. By default members run with --unsafe-no-fsync, which loses
// nothing when a member is killed but makes writes faster than on a real deployment.
func Durable() Option {
	return func(c *config) { c.durable = true }
}

// Flags passes more flags to every member, after the ones this package sets, so that they
// override them: Flags("--election-timeout=1000", "--auto-compaction-retention=10").
func Flags(args ...string) Option {
	return func(c *config) { c.flags = append(c.flags, args...) }
}

// A Cluster is a set of etcd processes planned or started by Plan or Start. Its methods
// must be called from the goroutine of the test that created it, except Endpoints,
// Endpoint and Leader, which any goroutine may call.
type Cluster struct {
	tb      testing.TB
	bin     string
	dir     string // the working directory of every member, holding the sockets
	cfg     config
	token   string
	members []*member

	mu sync.Mutex // guards proc of every member
}

// member is one etcd process of a cluster, running or not.
type member struct {
	name   string
	dir    string // holds data/ and etcd.log
	client string // client URL
	peer   string // peer URL
	proc   *process
}

// process is one run of a member's etcd.
type process struct {
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited
	err  error         // how it exited; set before done is closed
}

// running reports whether p is a process that has not exited.
func (p *process) running() bool {
	if p == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// clusters numbers the clusters of this test binary, for their tokens.
var clusters atomic.Uint64

// Start starts a cluster of the given number of members and waits until it has a leader,
// has committed a write and every member answers a linearizable read. It fails the test
// when the cluster does not come up within a minute. The cluster is killed when the test
// ends.
func Start(tb testing.TB, members int, opts ...Option) *Cluster {
	tb.Helper()
	c := Plan(tb, members, opts...)
	c.StartAll()
	return c
}

// Plan lays out a cluster of the given number of members, with their directories and
// endpoints, and starts none: until StartAll, nothing listens on the endpoints. Whatever
// is started later is killed when the test ends.
func Plan(tb testing.TB, members int, opts ...Option) *Cluster {
	tb.Helper()
	if members < 1 {
		tb.Fatalf("testetcd: members %d: want at least 1", members)
	}
	cfg := config{maxTxnOps: DefaultMaxTxnOps, maxRequestBytes: DefaultMaxRequestBytes}
	for _, o := range opts {
		o(&cfg)
	}
	c := &Cluster{
		tb:    tb,
		bin:   Binary(tb),
		dir:   socketDir(tb, members),
		cfg:   cfg,
		token: fmt.Sprintf("testetcd-%d-%d", os.Getpid(), clusters.Add(1)),
	}
	for i := range members {
		name := fmt.Sprintf("m%d", i)
		m := &member{
			name:   name,
			dir:    filepath.Join(c.dir, name),
			client: "unix://" + filepath.Join(c.dir, name+".sock"),
			// etcd's peer transport dials the host part of a unix URL, relative to the
			// working directory, and wants a port in it like any HTTP host.
			peer: "unix://" + name + ".peer:2380",
		}
		if err := os.Mkdir(m.dir, 0o700); err != nil {
			tb.Fatalf("testetcd: creating the directory of member %s: %v", name, err)
		}
		c.members = append(c.members, m)
	}
	tb.Cleanup(c.cleanup)
	return c
}

// socketDir returns the directory of a cluster: the test's temporary directory when the
// socket paths in it are short enough, and otherwise a new one, removed when the test
// ends, directly in the system's temporary directory.
func socketDir(tb testing.TB, members int) string {
	tb.Helper()
	longest := fmt.Sprintf("m%d.sock", members-1)
	dir := tb.TempDir()
	if len(filepath.Join(dir, longest)) <= maxSocketPath {
		return dir
	}
	dir, err := os.MkdirTemp("", "etcd")
	if err != nil {
		tb.Fatalf("testetcd: creating the cluster directory: %v", err)
	}
	tb.Cleanup(func() { os.RemoveAll(dir) })
	if p := filepath.Join(dir, longest); len(p) > maxSocketPath {
		tb.Fatalf("testetcd: socket path %q is longer than %d bytes; set TMPDIR to a shorter directory", p, maxSocketPath)
	}
	return dir
}

// Endpoints returns the client URLs of all members, in member order.
func (c *Cluster) Endpoints() []string {
	eps := make([]string, len(c.members))
	for i, m := range c.members {
		eps[i] = m.client
	}
	return eps
}

// Endpoint returns the client URL of member i, a unix:///path URL.
func (c *Cluster) Endpoint(i int) string {
	return c.members[i].client
}

// StartAll starts every member that does not run and waits, like Start, until the
// cluster serves.
func (c *Cluster) StartAll() {
	c.tb.Helper()
	all := make([]int, len(c.members))
	for i := range c.members {
		all[i] = i
		if !c.isRunning(i) {
			c.start(i)
		}
	}
	c.waitReady(all, true)
}

// Kill sends SIGKILL to member i and waits for it to exit. Killing a member that does not
// run does nothing.
func (c *Cluster) Kill(i int) {
	c.tb.Helper()
	m := c.members[i]
	c.mu.Lock()
	p := m.proc
	m.proc = nil
	c.mu.Unlock()
	if err := c.stop(p); err != nil {
		c.tb.Fatalf("testetcd: killing member %s: %v", m.name, err)
	}
}

// Restart starts member i again, on the same data directory and endpoints, after Kill
// or a crash. When the running members, this one included, make a majority, it waits
// until the member has caught up with the leader and serves linearizable reads and
// writes. Otherwise it waits only until the member listens: etcd answers no client
// request, not even a status request, before it has rejoined a quorum. It fails the test
// when member i is running.
func (c *Cluster) Restart(i int) {
	c.tb.Helper()
	if c.isRunning(i) {
		c.tb.Fatalf("testetcd: restarting member %s: it is running; Kill it first", c.members[i].name)
	}
	c.start(i)
	running := 0
	for j := range c.members {
		if c.isRunning(j) {
			running++
		}
	}
	c.waitReady([]int{i}, running > len(c.members)/2)
}

// Leader returns the index of the member that leads the cluster, asking each running
// member for its status (etcd's Maintenance.Status) and believing the one that reports
// itself as leader in the highest term. A member that does not answer within two
// seconds, as one without a quorum does not, counts as no leader. It returns an error
// wrapping ErrNoLeader when no running member reports itself as leader.
func (c *Cluster) Leader(ctx context.Context) (int, error) {
	var eps []string
	for i, m := range c.members {
		if c.isRunning(i) {
			eps = append(eps, m.client)
		}
	}
	if len(eps) == 0 {
		return -1, fmt.Errorf("%w: no member runs", ErrNoLeader)
	}
	cli, err := c.newClient(eps)
	if err != nil {
		return -1, err
	}
	defer cli.Close()
	leader, term := -1, uint64(0)
	var errs []error
	for i, m := range c.members {
		if !c.isRunning(i) {
			continue
		}
		sctx, cancel := context.WithTimeout(ctx, probeTimeout)
		st, err := cli.Status(sctx, m.client)
		cancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("member %s: %w", m.name, err))
			continue
		}
		if st.Leader != 0 && st.Leader == st.Header.MemberId && (leader < 0 || st.RaftTerm > term) {
			leader, term = i, st.RaftTerm
		}
	}
	if leader < 0 {
		return -1, fmt.Errorf("%w among running members: %w", ErrNoLeader, errors.Join(errs...))
	}
	return leader, nil
}

// Client returns a client of all members, closed when the test ends. It sends requests up
// to the cluster's MaxRequestBytes and logs nothing.
func (c *Cluster) Client(tb testing.TB) *clientv3.Client {
	tb.Helper()
	cli, err := c.newClient(c.Endpoints())
	if err != nil {
		tb.Fatalf("testetcd: creating a client: %v", err)
	}
	tb.Cleanup(func() { cli.Close() })
	return cli
}

// newClient returns a client of the given endpoints. Creating one does not wait for any
// connection.
func (c *Cluster) newClient(eps []string) (*clientv3.Client, error) {
	return clientv3.New(clientv3.Config{
		Endpoints:          eps,
		DialTimeout:        probeTimeout,
		MaxCallSendMsgSize: c.cfg.maxRequestBytes + grpcOverheadBytes,
		Logger:             zap.NewNop(),
	})
}

// isRunning reports whether member i runs.
func (c *Cluster) isRunning(i int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.members[i].proc.running()
}

// args returns the command line of member i.
func (c *Cluster) args(i int) []string {
	m := c.members[i]
	var initial []string
	for _, p := range c.members {
		initial = append(initial, p.name+"="+p.peer)
	}
	args := []string{
		"--name", m.name,
		"--data-dir", filepath.Join(m.dir, "data"),
		"--listen-client-urls", m.client,
		"--advertise-client-urls", m.client,
		"--listen-peer-urls", m.peer,
		"--initial-advertise-peer-urls", m.peer,
		"--initial-cluster", strings.Join(initial, ","),
		"--initial-cluster-state", "new",
		"--initial-cluster-token", c.token,
		"--heartbeat-interval", "50",
		"--election-timeout", "500",
		"--max-txn-ops", strconv.Itoa(c.cfg.maxTxnOps),
		"--max-request-bytes", strconv.Itoa(c.cfg.maxRequestBytes),
		"--log-level", "warn",
	}
	if !c.cfg.durable {
		args = append(args, "--unsafe-no-fsync")
	}
	return append(args, c.cfg.flags...)
}

// start starts the etcd process of member i, with its output appended to etcd.log in its
// directory, and fails the test when it cannot.
func (c *Cluster) start(i int) {
	c.tb.Helper()
	m := c.members[i]
	logPath := filepath.Join(m.dir, "etcd.log")
	logFile, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		c.tb.Fatalf("testetcd: starting member %s: %v", m.name, err)
	}
	fmt.Fprintf(logFile, "=== testetcd: starting member %s at %s\n", m.name, time.Now().Format(time.RFC3339Nano))

	cmd := exec.Command(c.bin, c.args(i)...)
	cmd.Dir = c.dir
	cmd.Env = memberEnv()
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.SysProcAttr = procAttr()
	p := &process{cmd: cmd, done: make(chan struct{})}
	started := make(chan error, 1)
	go func() {
		// The parent-death signal (procAttr) follows the thread that started the
		// process: keep that thread to this goroutine, which lives as long as etcd.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		defer logFile.Close()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		p.err = cmd.Wait()
		close(p.done)
	}()
	if err := <-started; err != nil {
		c.tb.Fatalf("testetcd: starting member %s: %v", m.name, err)
	}
	c.mu.Lock()
	m.proc = p
	c.mu.Unlock()
}

// memberEnv returns the environment of a member: the test's, without the ETCD_ variables
// that etcd would take for flags.
func memberEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "ETCD_") {
			env = append(env, kv)
		}
	}
	return env
}

// stop kills p, when it is a process that runs, and waits for it to exit.
func (c *Cluster) stop(p *process) error {
	if p == nil {
		return nil
	}
	if err := p.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	select {
	case <-p.done:
		return nil
	case <-time.After(killTimeout):
		return fmt.Errorf("pid %d still runs %v after SIGKILL", p.cmd.Process.Pid, killTimeout)
	}
}

// waitReady waits until each of the given members listens on its client socket and, with
// quorum, until it also knows a leader, serves a linearizable read and commits a write (a
// lease granted and revoked, which leaves the key space and its revision alone). It fails
// the test, with the members' output, when a member exits or readyTimeout passes first.
func (c *Cluster) waitReady(idxs []int, quorum bool) {
	c.tb.Helper()
	deadline := time.Now().Add(readyTimeout)
	pending := make(map[int]error, len(idxs))
	for _, i := range idxs {
		pending[i] = errors.New("not probed")
	}
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	for {
		for i := range pending {
			c.mu.Lock()
			p := c.members[i].proc
			c.mu.Unlock()
			if p == nil {
				c.tb.Fatalf("testetcd: member %s was killed before serving", c.members[i].name)
			}
			if !p.running() {
				c.tb.Fatalf("testetcd: member %s exited before serving: %v\n%s", c.members[i].name, p.err, c.tail(i))
			}
			if err := c.probe(i, quorum); err != nil {
				pending[i] = err
			} else {
				delete(pending, i)
			}
		}
		if len(pending) == 0 {
			return
		}
		if time.Now().After(deadline) {
			var b strings.Builder
			for i, err := range pending {
				fmt.Fprintf(&b, "member %s: %v\n%s\n", c.members[i].name, err, c.tail(i))
			}
			c.tb.Fatalf("testetcd: members not serving after %v:\n%s", readyTimeout, b.String())
		}
		<-tick.C
	}
}

// probe checks once that member i serves, as waitReady describes.
func (c *Cluster) probe(i int, quorum bool) error {
	ep := c.members[i].client
	// A gRPC client waits out a reconnection backoff after a refused dial; dialing the
	// socket first keeps probes of a member that does not listen yet fast.
	conn, err := net.DialTimeout("unix", strings.TrimPrefix(ep, "unix://"), probeTimeout)
	if err != nil {
		return err
	}
	conn.Close()
	if !quorum {
		return nil
	}
	cli, err := c.newClient([]string{ep})
	if err != nil {
		return err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
	defer cancel()
	st, err := cli.Status(ctx, ep)
	if err != nil {
		return fmt.Errorf("status: %w", err)
	}
	if st.Leader == 0 {
		return ErrNoLeader
	}
	if _, err := cli.Get(ctx, probeKey); err != nil {
		return fmt.Errorf("linearizable read: %w", err)
	}
	lease, err := cli.Grant(ctx, 60)
	if err != nil {
		return fmt.Errorf("granting a lease: %w", err)
	}
	if _, err := cli.Revoke(ctx, lease.ID); err != nil {
		return fmt.Errorf("revoking lease %x: %w", lease.ID, err)
	}
	return nil
}

// tail returns the last lines of member i's output.
func (c *Cluster) tail(i int) string {
	m := c.members[i]
	path := filepath.Join(m.dir, "etcd.log")
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(no output: %v)", err)
	}
	lines := bytes.Split(bytes.TrimRight(data, "\n"), []byte("\n"))
	if len(lines) > tailLines {
		lines = lines[len(lines)-tailLines:]
	}
	return fmt.Sprintf("--- last %d lines of %s:\n%s", len(lines), path, bytes.Join(lines, []byte("\n")))
}

// cleanup kills every member and, when the test failed, logs the tail of each member's
// output.
func (c *Cluster) cleanup() {
	for i, m := range c.members {
		c.mu.Lock()
		p := m.proc
		m.proc = nil
		c.mu.Unlock()
		if err := c.stop(p); err != nil {
			c.tb.Errorf("testetcd: killing member %s: %v", m.name, err)
		}
		if c.tb.Failed() {
			if _, err := os.Stat(filepath.Join(m.dir, "etcd.log")); err == nil {
				c.tb.Logf("testetcd: member %s\n%s", m.name, c.tail(i))
			}
		}
	}
}
