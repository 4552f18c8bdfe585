package testetcd_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"go.uber.org/zap"

	"github.com/naplesnet/naples/internal/testetcd"
)

// TestMain checks that clusters and clients leave no goroutine behind.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// waitTimeout bounds every wait of these tests for a cluster to do something.
const waitTimeout = 30 * time.Second

// memberClient returns a client of member i alone, closed when the test ends.
func memberClient(t *testing.T, c *testetcd.Cluster, i int) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{c.Endpoint(i)}, Logger: zap.NewNop()})
	if err != nil {
		t.Fatalf("client of member %d: %v", i, err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// mustGet reads key through member i with a linearizable read and fails the test unless
// it holds want.
func mustGet(t *testing.T, c *testetcd.Cluster, i int, key, want string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	resp, err := memberClient(t, c, i).Get(ctx, key)
	if err != nil {
		t.Fatalf("get %q from member %d: %v", key, i, err)
	}
	if len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != want {
		t.Fatalf("get %q from member %d: got %v, want the value %q", key, i, resp.Kvs, want)
	}
}

// mustPut writes key through a client of the whole cluster and fails the test when the
// write does not commit.
func mustPut(t *testing.T, c *testetcd.Cluster, key, value string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if _, err := c.Client(t).Put(ctx, key, value); err != nil {
		t.Fatalf("put %q: %v", key, err)
	}
}

// waitLeader waits until a member other than not leads the cluster, and returns it.
func waitLeader(t *testing.T, c *testetcd.Cluster, not int) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		leader, err := c.Leader(ctx)
		if err == nil && leader != not {
			return leader
		}
		select {
		case <-ctx.Done():
			t.Fatalf("no leader other than member %d after %v: last answer %d, %v", not, waitTimeout, leader, err)
		case <-tick.C:
		}
	}
}

// TestBinary checks that Binary gives an etcd of the version tools/etcd pins, and the
// same file every time.
func TestBinary(t *testing.T) {
	t.Parallel()
	bin := testetcd.Binary(t)
	if again := testetcd.Binary(t); again != bin {
		t.Errorf("second Binary: got %s, want %s", again, bin)
	}
	gomod, err := os.ReadFile(filepath.Join("..", "..", "tools", "etcd", "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	var want string
	for line := range strings.Lines(string(gomod)) {
		// The requirement stands alone ("require M V") or in a block ("M V").
		if f := strings.Fields(strings.TrimPrefix(strings.TrimSpace(line), "require ")); len(f) >= 2 && f[0] == "go.etcd.io/etcd/server/v3" {
			want = "etcd Version: " + strings.TrimPrefix(f[1], "v") + "\n"
		}
	}
	out, err := exec.Command(bin, "--version").CombinedOutput()
	if err != nil {
		t.Fatalf("%s --version: %v\n%s", bin, err, out)
	}
	if want == "" || !strings.Contains(string(out), want) {
		t.Errorf("%s --version: got %q, want a line %q", bin, out, want)
	}
}

// TestStart checks that a started 3-member cluster has a leader and that a write through
// any member is readable through each one.
func TestStart(t *testing.T) {
	t.Parallel()
	c := testetcd.Start(t, 3)
	eps := c.Endpoints()
	if len(eps) != 3 || eps[0] == eps[1] || eps[1] == eps[2] || eps[0] == eps[2] {
		t.Fatalf("Endpoints: got %q, want 3 different ones", eps)
	}
	for i, ep := range eps {
		if c.Endpoint(i) != ep {
			t.Errorf("Endpoint(%d): got %q, want %q", i, c.Endpoint(i), ep)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if leader, err := c.Leader(ctx); err != nil || leader < 0 || leader > 2 {
		t.Fatalf("Leader: got %d, %v; want a member index", leader, err)
	}
	mustPut(t, c, "/k", "v")
	for i := range 3 {
		mustGet(t, c, i, "/k", "v")
	}
}

// TestKillLeader checks that killing the leader elects another one that takes writes,
// and that the old leader, restarted, rejoins and serves what was written without it.
func TestKillLeader(t *testing.T) {
	t.Parallel()
	c := testetcd.Start(t, 3)
	mustPut(t, c, "/before", "1")
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	old, err := c.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c.Kill(old)
	c.Kill(old) // killing a stopped member does nothing

	// The killed member no longer answers.
	short, cancelShort := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = memberClient(t, c, old).Status(short, c.Endpoint(old))
	cancelShort()
	if err == nil {
		t.Fatalf("member %d answers after Kill", old)
	}

	leader := waitLeader(t, c, old)
	t.Logf("member %d led, member %d leads after it was killed", old, leader)
	mustPut(t, c, "/after", "2")
	mustGet(t, c, leader, "/after", "2")

	c.Restart(old)
	mustGet(t, c, old, "/before", "1")
	mustGet(t, c, old, "/after", "2")
}

// TestRestartWithoutQuorum checks that a cluster killed entirely comes back member by
// member with its data: one member listens without a quorum and a second one restores it.
func TestRestartWithoutQuorum(t *testing.T) {
	t.Parallel()
	c := testetcd.Start(t, 3)
	mustPut(t, c, "/k", "v")
	for i := range 3 {
		c.Kill(i)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if leader, err := c.Leader(ctx); !errors.Is(err, testetcd.ErrNoLeader) {
		t.Fatalf("Leader with no member running: got %d, %v; want ErrNoLeader", leader, err)
	}

	// Alone, member 0 listens but answers nothing until it has a quorum again.
	c.Restart(0)
	conn, err := net.Dial("unix", strings.TrimPrefix(c.Endpoint(0), "unix://"))
	if err != nil {
		t.Fatalf("member 0 does not listen after Restart: %v", err)
	}
	conn.Close()

	c.Restart(1)
	mustGet(t, c, 0, "/k", "v")
	mustGet(t, c, 1, "/k", "v")
	mustPut(t, c, "/k2", "v2")
}

// TestPlanStartAll checks that a planned cluster listens on nothing, and that a client
// created before StartAll reaches it afterwards on the same endpoints.
func TestPlanStartAll(t *testing.T) {
	t.Parallel()
	c := testetcd.Plan(t, 3)
	before := c.Endpoints()
	for _, ep := range before {
		path := strings.TrimPrefix(ep, "unix://")
		if !filepath.IsAbs(path) {
			t.Fatalf("endpoint %q: want unix:// and an absolute path", ep)
		}
		if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("socket %s of a planned cluster: got %v, want it not to exist", path, err)
		}
	}
	cli := c.Client(t) // as a server started before etcd would
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if leader, err := c.Leader(ctx); !errors.Is(err, testetcd.ErrNoLeader) {
		t.Fatalf("Leader of a planned cluster: got %d, %v; want ErrNoLeader", leader, err)
	}

	c.StartAll()
	if after := c.Endpoints(); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("Endpoints changed by StartAll: %q, then %q", before, after)
	}
	if _, err := cli.Put(ctx, "/k", "v"); err != nil {
		t.Fatalf("put through the client made before StartAll: %v", err)
	}
	for i := range 3 {
		mustGet(t, c, i, "/k", "v")
	}
}

// TestLimits checks that the options reach etcd: transactions and requests up to the
// limits commit and larger ones are refused with etcd's errors.
func TestLimits(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		opts     []testetcd.Option
		maxOps   int
		maxBytes int
	}{
		{"defaults", nil, testetcd.DefaultMaxTxnOps, testetcd.DefaultMaxRequestBytes},
		{"options", []testetcd.Option{testetcd.MaxTxnOps(4), testetcd.MaxRequestBytes(64 << 10)}, 4, 64 << 10},
		{"flags override", []testetcd.Option{testetcd.MaxTxnOps(4), testetcd.Flags("--max-txn-ops=2")}, 2, testetcd.DefaultMaxRequestBytes},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := testetcd.Start(t, 1, tt.opts...)
			cli := c.Client(t)
			ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
			defer cancel()
			txn := func(n int) error {
				ops := make([]clientv3.Op, n)
				for i := range ops {
					ops[i] = clientv3.OpPut(fmt.Sprintf("/txn/%d", i), "v")
				}
				_, err := cli.Txn(ctx).Then(ops...).Commit()
				return err
			}
			if err := txn(tt.maxOps); err != nil {
				t.Errorf("txn of %d ops: %v", tt.maxOps, err)
			}
			if err := txn(tt.maxOps + 1); !errors.Is(err, rpctypes.ErrTooManyOps) {
				t.Errorf("txn of %d ops: got %v, want %v", tt.maxOps+1, err, rpctypes.ErrTooManyOps)
			}
			if _, err := cli.Put(ctx, "/big", strings.Repeat("x", tt.maxBytes/2)); err != nil {
				t.Errorf("put of %d bytes: %v", tt.maxBytes/2, err)
			}
			_, err := cli.Put(ctx, "/big", strings.Repeat("x", tt.maxBytes+1024))
			if !errors.Is(err, rpctypes.ErrRequestTooLarge) {
				t.Errorf("put of %d bytes: got %v, want %v", tt.maxBytes+1024, err, rpctypes.ErrRequestTooLarge)
			}
		})
	}
}
