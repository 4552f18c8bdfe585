package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"

	"github.com/naplesnet/naples/internal/address"
	"github.com/naplesnet/naples/nimbus"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// syncBuffer is a bytes.Buffer that a running command writes while the test reads.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// running is a naplesctl command running in the background.
type running struct {
	stdout, stderr *syncBuffer
	done           chan error
	cancel         context.CancelFunc
}

// start runs naplesctl with args in the background until it returns or the test ends.
func (e *env) start(args ...string) *running {
	e.t.Helper()
	return e.startWith(nil, args...)
}

// startWith runs naplesctl with args in the background, as start does, on a cli that
// setup, when not nil, adjusted.
func (e *env) startWith(setup func(*cli), args ...string) *running {
	e.t.Helper()
	ctx, cancel := context.WithCancel(e.t.Context())
	r := &running{stdout: &syncBuffer{}, stderr: &syncBuffer{}, done: make(chan error, 1), cancel: cancel}
	c := &cli{
		stdin:  strings.NewReader(""),
		stdout: r.stdout,
		stderr: r.stderr,
		now:    func() time.Time { return created.Add(90 * time.Second) },
	}
	if setup != nil {
		setup(c)
	}
	go func() { r.done <- c.run(ctx, args, func(k string) string { return e.vars[k] }) }()
	e.t.Cleanup(func() {
		cancel()
		<-r.done
	})
	return r
}

// result waits up to 10s for the command to return and returns its error.
func (r *running) result(t *testing.T) error {
	t.Helper()
	select {
	case err := <-r.done:
		r.done <- err // for the cleanup
		return err
	case <-time.After(10 * time.Second):
		t.Fatalf("the command did not return within 10s; stderr:\n%s", r.stderr)
		return nil
	}
}

// eventually fails the test unless cond holds within 10s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitStderr waits until the command has written want to stderr.
func (r *running) waitStderr(t *testing.T, want string) {
	t.Helper()
	eventually(t, "stderr to contain "+want+"; it holds:\n"+r.stderr.String(), func() bool {
		return strings.Contains(r.stderr.String(), want)
	})
}

// report sends one status report for the route called name as node, through the real
// ReportStatus stream.
func (e *env) report(name, node string, gen int64, phase nimbusv1.Phase, reason, msg string) {
	e.t.Helper()
	e.reportStatus(name, &nimbusv1.NodeStatus{Node: node, ObservedGeneration: gen, Phase: phase, Reason: reason, Message: msg})
}

// reportStatus sends st as st.Node's status report for the route called name, as report
// does.
func (e *env) reportStatus(name string, st *nimbusv1.NodeStatus) {
	e.t.Helper()
	e.reportFor(nimbusv1.NewKey(nimbusv1.Kind_KIND_ROUTE, "", "", name), st)
}

// reportFor sends st as st.Node's status report for the object with key, through the
// real ReportStatus stream, as the node's agent does.
func (e *env) reportFor(key *nimbusv1.ObjectKey, st *nimbusv1.NodeStatus) {
	e.t.Helper()
	stream, err := e.nimbus.ReportStatus(e.t.Context())
	if err != nil {
		e.t.Fatalf("ReportStatus: %v", err)
	}
	err = stream.Send(&nimbusv1.StatusReport{Key: key, Status: st})
	if err != nil {
		e.t.Fatalf("sending a status report: %v", err)
	}
	if _, err := stream.CloseAndRecv(); err != nil {
		e.t.Fatalf("ending the status reports: %v", err)
	}
}

// routeTo returns a route manifest targeting nodes.
func routeTo(name, prefix, gateway string, nodes ...string) string {
	return strings.Replace(routeYAML(name, prefix, gateway), "nodes: [host-a]", "nodes: ["+strings.Join(nodes, ", ")+"]", 1)
}

const (
	programmed = nimbusv1.Phase_PHASE_PROGRAMMED
	failed     = nimbusv1.Phase_PHASE_FAILED
	pending    = nimbusv1.Phase_PHASE_PENDING
)

// TestWaitSucceedsWhenStatusArrives runs wait alone, before any node reported.
func TestWaitSucceedsWhenStatusArrives(t *testing.T) {
	e := newEnv(t)
	e.ok("apply", "-f", e.file("route.yaml", routeYAML("to-dc2", "198.51.100.0/24", "10.10.0.2")))
	r := e.start("wait", "route", "to-dc2")
	r.waitStderr(t, "route/to-dc2: 0/1 nodes programmed (generation 1)\n")
	e.report("to-dc2", "host-a", 1, programmed, "", "")
	if err := r.result(t); err != nil {
		t.Fatalf("wait: %v", err)
	}
	equal(t, "wait stdout", r.stdout.String(), "route/to-dc2 programmed on 1/1 nodes (generation 1)\n")
}

// TestWaitFailed has a node report a terminal FAILED: wait fails at once, naming the
// node, its reason and its message.
func TestWaitFailed(t *testing.T) {
	e := newEnv(t)
	e.ok("apply", "-f", e.file("route.yaml", routeTo("to-dc2", "198.51.100.0/24", "10.10.0.2", "host-a", "host-b", "host-c")))
	e.report("to-dc2", "host-a", 1, programmed, "", "")
	r := e.start("wait", "route", "to-dc2", "--timeout", "20s")
	r.waitStderr(t, "route/to-dc2: 1/3 nodes programmed (generation 1)\n")
	e.reportStatus("to-dc2", &nimbusv1.NodeStatus{Node: "host-b", ObservedGeneration: 1, Phase: failed, Terminal: true,
		Reason: "InvalidSpec", Message: "spec.table 255: reserved"})
	err := r.result(t)
	if err == nil {
		t.Fatal("wait succeeded though host-b FAILED")
	}
	equal(t, "wait error", err.Error(), "route/to-dc2: programming failed on 1 of 3 nodes (generation 1):\n"+
		"  node host-b: InvalidSpec: spec.table 255: reserved")
	if !errors.Is(err, ErrProgrammingFailed) {
		t.Errorf("error %v is not ErrProgrammingFailed", err)
	}
	if out := r.stdout.String(); out != "" {
		t.Errorf("a failed wait wrote to stdout: %q", out)
	}

	// apply --wait of the same, unchanged route fails the same way, after applying it.
	out, _, err := e.run("", "apply", "-f", e.file("again.yaml", routeTo("to-dc2", "198.51.100.0/24", "10.10.0.2", "host-a", "host-b", "host-c")), "--wait")
	if err == nil || !errors.Is(err, ErrProgrammingFailed) || !strings.Contains(err.Error(), "node host-b: InvalidSpec") {
		t.Errorf("apply --wait of a failed route: %v", err)
	}
	equal(t, "apply --wait stdout", out, "route/to-dc2 unchanged\n")
}

// TestWaitThroughRetriedFailure has a node report a FAILED that its agent retries: wait
// shows it as progress and waits on, succeeding once the node reports PROGRAMMED; and a
// wait that times out on such a failure names it.
func TestWaitThroughRetriedFailure(t *testing.T) {
	e := newEnv(t)
	e.ok("apply", "-f", e.file("route.yaml", routeTo("to-dc2", "198.51.100.0/24", "10.10.0.2", "host-a", "host-b")))
	e.report("to-dc2", "host-a", 1, programmed, "", "")
	r := e.start("wait", "route", "to-dc2", "--timeout", "20s")
	r.waitStderr(t, "route/to-dc2: 1/2 nodes programmed (generation 1)\n")
	e.report("to-dc2", "host-b", 1, failed, "KernelError", "adding route 198.51.100.0/24: network is unreachable")
	r.waitStderr(t, "route/to-dc2: 1/2 nodes programmed (generation 1)\n"+
		"  host-b: FAILED KernelError (retrying): adding route 198.51.100.0/24: network is unreachable\n")
	select {
	case err := <-r.done:
		r.done <- err // for the cleanup
		t.Fatalf("wait returned %v on a failure that is being retried", err)
	default:
	}
	e.report("to-dc2", "host-b", 1, programmed, "", "")
	if err := r.result(t); err != nil {
		t.Fatalf("wait: %v", err)
	}
	equal(t, "wait stdout", r.stdout.String(), "route/to-dc2 programmed on 2/2 nodes (generation 1)\n")

	e.ok("apply", "-f", e.file("route3.yaml", routeTo("to-dc3", "203.0.113.0/24", "10.10.0.3", "host-a")))
	e.report("to-dc3", "host-a", 1, failed, "KernelError", "adding route: file exists")
	_, _, err := e.run("", "wait", "route", "to-dc3", "--timeout", "300ms")
	if !errors.Is(err, ErrWaitTimeout) {
		t.Fatalf("wait on a failure being retried: %v; want a timeout", err)
	}
	equal(t, "wait error", err.Error(), "route/to-dc3: timed out after 300ms: 0/1 nodes programmed (generation 1); "+
		"failing, being retried: host-a (KernelError: adding route: file exists)")
}

// TestWaitShowsWhatPendingWaitsFor waits on a route that one node reports PENDING with a
// message saying what it waits for: the progress shows the node's reason and message, the
// wait goes on, and succeeds once the node reports PROGRAMMED; a wait that times out on
// such a node names its reason and message.
func TestWaitShowsWhatPendingWaitsFor(t *testing.T) {
	e := newEnv(t)
	e.ok("apply", "-f", e.file("route.yaml", routeTo("to-dc2", "198.51.100.0/24", "10.10.0.2", "host-a", "host-b")))
	e.report("to-dc2", "host-a", 1, programmed, "", "")
	msg := `spec.attachGroups[1] "webb": no such SecurityGroup in tenant default, namespace default`
	e.report("to-dc2", "host-b", 1, pending, "WaitingForSecurityGroup", msg)
	r := e.start("wait", "route", "to-dc2", "--timeout", "20s")
	r.waitStderr(t, "route/to-dc2: 1/2 nodes programmed (generation 1)\n"+
		"  host-b: PENDING WaitingForSecurityGroup: "+msg+"\n")
	select {
	case err := <-r.done:
		r.done <- err // for the cleanup
		t.Fatalf("wait returned %v on a node that waits", err)
	default:
	}
	e.report("to-dc2", "host-b", 1, programmed, "", "")
	if err := r.result(t); err != nil {
		t.Fatalf("wait: %v", err)
	}

	e.ok("apply", "-f", e.file("route3.yaml", routeTo("to-dc3", "203.0.113.0/24", "10.10.0.3", "host-a")))
	e.report("to-dc3", "host-a", 1, pending, "WaitingForSecurityGroup", msg)
	_, _, err := e.run("", "wait", "route", "to-dc3", "--timeout", "300ms")
	if !errors.Is(err, ErrWaitTimeout) {
		t.Fatalf("wait on a node that waits: %v; want a timeout", err)
	}
	equal(t, "wait error", err.Error(), "route/to-dc3: timed out after 300ms: 0/1 nodes programmed (generation 1); "+
		"pending: host-a; waiting: host-a (WaitingForSecurityGroup: "+msg+")")
}

// TestWaitTimeout waits on routes that are not programmed everywhere: the error says how
// far each came and names the nodes still pending.
func TestWaitTimeout(t *testing.T) {
	e := newEnv(t)
	e.ok("apply", "-f", e.file("routes.yaml", routeTo("to-dc2", "198.51.100.0/24", "10.10.0.2", "host-a", "host-b", "host-c")+
		"---\n"+routeYAML("to-dc3", "203.0.113.0/24", "10.10.0.3")+
		"---\n"+strings.Replace(routeYAML("to-all", "192.0.2.0/24", "10.10.0.4"), "  nodes: [host-a]\n", "", 1)))
	e.report("to-dc2", "host-a", 1, programmed, "", "")
	e.report("to-dc2", "host-b", 1, pending, "Queued", "")
	e.report("to-dc3", "host-a", 1, programmed, "", "")

	out, _, err := e.run("", "wait", "route", "to-dc2", "to-dc3", "to-all", "--timeout", "500ms")
	if err == nil {
		t.Fatal("wait succeeded though host-b and host-c never programmed to-dc2")
	}
	equal(t, "wait stdout", out, "route/to-dc3 programmed on 1/1 nodes (generation 1)\n")
	equal(t, "wait error", err.Error(), ""+
		"route/to-dc2: timed out after 500ms: 1/3 nodes programmed (generation 1); pending: host-b, host-c\n"+
		"route/to-all: timed out after 500ms: the object targets no nodes (generation 1)")
	if !errors.Is(err, ErrWaitTimeout) {
		t.Errorf("error %v is not ErrWaitTimeout", err)
	}
}

func TestWaitUsageErrors(t *testing.T) {
	e := newEnv(t)
	f := e.file("route.yaml", routeYAML("to-dc2", "198.51.100.0/24", "10.10.0.2"))
	for _, tt := range []struct {
		args  []string
		parts []string
		is    error
	}{
		{[]string{"wait", "route", "to-dc2", "--timeout", "soon"}, []string{`--timeout "soon"`, "duration"}, nil},
		{[]string{"wait", "route", "to-dc2", "--timeout", "0s"}, []string{`--timeout "0s"`, "positive"}, nil},
		{[]string{"wait", "route"}, []string{"requires at least 2 arg(s)"}, nil},
		{[]string{"wait", "route", "missing"}, []string{`route "missing" not found`}, ErrNotFound},
		{[]string{"wait", "route", "a b"}, []string{`argument 2: key.name "a b": must be lower-case`}, nil},
		{[]string{"wait", "route", "to-dc2", "--tenant", "x y"}, []string{`--tenant "x y": must be lower-case`}, nil},
		{[]string{"wait", "route", "to-dc2", "to-dc3", "to-dc2"}, []string{`argument 4: route/to-dc2: key.name "to-dc2": the same object as argument 2`}, nil},
		{[]string{"apply", "-f", f, "--wait", "--timeout", "-1s"}, []string{`--timeout "-1s"`}, nil},
		{[]string{"apply", "-f", f, "--timeout", "5s"}, []string{"--timeout needs --wait"}, nil},
	} {
		err := e.fails(tt.args...)
		contains(t, strings.Join(tt.args, " "), err, tt.parts...)
		if tt.is != nil && !errors.Is(err, tt.is) {
			t.Errorf("%s: error %v is not %v", strings.Join(tt.args, " "), err, tt.is)
		}
	}
	if names := e.routes(); len(names) != 0 {
		t.Errorf("apply with a bad --timeout stored %v; want nothing applied", names)
	}
}

// TestWaitFollowsStatusStream runs wait through a proxy that sees every call naplesctl
// makes: wait follows the status changes over one WatchStatus stream, and never asks
// nimbus with Get or List. Beside it runs the health check of the connection.
func TestWaitFollowsStatusStream(t *testing.T) {
	e := newEnv(t)
	e.ok("apply", "-f", e.file("route.yaml", routeTo("to-dc2", "198.51.100.0/24", "10.10.0.2", "host-a", "host-b")))
	calls := e.proxy()
	r := e.start("wait", "route", "to-dc2", "--timeout", "20s")
	r.waitStderr(t, "route/to-dc2: 0/2 nodes programmed (generation 1)\n")
	e.report("to-dc2", "host-a", 1, programmed, "", "")
	r.waitStderr(t, "route/to-dc2: 1/2 nodes programmed (generation 1)\n")
	e.report("to-dc2", "host-b", 1, programmed, "", "")
	if err := r.result(t); err != nil {
		t.Fatalf("wait: %v\nstderr:\n%s", err, r.stderr)
	}
	equal(t, "wait stdout", r.stdout.String(), "route/to-dc2 programmed on 2/2 nodes (generation 1)\n")
	equal(t, "calls naplesctl made", calls.String(), "/grpc.health.v1.Health/Watch: 1, /nimbus.v1.Nimbus/WatchStatus: 1")
}

// TestWaitRefusedForGood waits with a node's certificate, which may not watch status: wait
// fails at once with nimbus's refusal, not when its timeout passes.
func TestWaitRefusedForGood(t *testing.T) {
	home := t.TempDir()
	pkiDir := filepath.Join(home, DefaultPKIDir)
	vars := map[string]string{"HOME": home}
	if _, err := tlsCtl(t, vars, "", "certs", "--nodes", "host-a"); err != nil {
		t.Fatalf("certs: %v", err)
	}
	vars[ServerEnv] = startTLSNimbus(t, pkiDir)
	if _, err := tlsCtl(t, vars, tlsRoute, "apply", "-f", "-"); err != nil {
		t.Fatalf("apply: %v", err)
	}
	vars[TLSCertEnv], vars[TLSKeyEnv] = filepath.Join(pkiDir, "host-a.crt"), filepath.Join(pkiDir, "host-a.key")
	_, err := tlsCtl(t, vars, "", "wait", "route", "to-dc2", "--timeout", "1h")
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), `node "host-a" may not watch status`) {
		t.Fatalf("wait with a node certificate = %v, want PermissionDenied naming the node", err)
	}
}

// callCounter counts the calls a proxy forwarded, by method.
type callCounter struct {
	mu    sync.Mutex
	calls map[string]int
	// open ends each call under way; breakCalls calls them.
	open map[int]context.CancelFunc
	next int
}

// breakCalls ends every call under way through the proxy, as a connection that breaks
// ends them.
func (c *callCounter) breakCalls() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, cancel := range c.open {
		cancel()
	}
}

// count returns how many calls of the method were made.
func (c *callCounter) count(method string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.calls[method]
}

// String lists the calls: "/nimbus.v1.Nimbus/Get: 3, /nimbus.v1.Nimbus/List: 1".
func (c *callCounter) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, m := range slices.Sorted(maps.Keys(c.calls)) {
		out = append(out, fmt.Sprintf("%s: %d", m, c.calls[m]))
	}
	return strings.Join(out, ", ")
}

// proxy serves a gRPC proxy in front of the test's nimbus, points naplesctl at it, and
// returns what counts the calls it forwards. The proxy passes messages on as they are,
// whatever the method, so it sees calls as nimbus does.
func (e *env) proxy() *callCounter {
	e.t.Helper()
	upstream, err := grpc.NewClient("unix://"+strings.TrimPrefix(e.server, "unix://"),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.ForceCodecV2(rawCodec{})))
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { upstream.Close() })
	counter := &callCounter{calls: map[string]int{}, open: map[int]context.CancelFunc{}}
	srv := grpc.NewServer(grpc.ForceServerCodecV2(rawCodec{}), grpc.UnknownServiceHandler(func(_ any, down grpc.ServerStream) error {
		method, _ := grpc.MethodFromServerStream(down)
		ctx, cancel := context.WithCancel(down.Context())
		defer cancel()
		counter.mu.Lock()
		counter.calls[method]++
		id := counter.next
		counter.next++
		counter.open[id] = cancel
		counter.mu.Unlock()
		defer func() {
			counter.mu.Lock()
			delete(counter.open, id)
			counter.mu.Unlock()
		}()
		up, err := upstream.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}, method)
		if err != nil {
			return err
		}
		go func() {
			for {
				var m rawMessage
				if err := down.RecvMsg(&m); err != nil {
					up.CloseSend()
					return
				}
				if err := up.SendMsg(&m); err != nil {
					return
				}
			}
		}()
		for {
			var m rawMessage
			if err := up.RecvMsg(&m); errors.Is(err, io.EOF) {
				return nil
			} else if err != nil {
				return err
			}
			if err := down.SendMsg(&m); err != nil {
				return err
			}
		}
	}))
	addr := address.Address{Network: "unix", Addr: filepath.Join(e.t.TempDir(), "proxy.sock")}
	lis, err := addr.Listen(e.t.Context())
	if err != nil {
		e.t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	e.t.Cleanup(func() {
		srv.Stop()
		if err := <-served; err != nil {
			e.t.Errorf("serving the proxy: %v", err)
		}
	})
	e.vars[ServerEnv] = addr.String()
	return counter
}

// TestWaitSaysWhenStreamBreaks breaks the status stream of a wait: naplesctl says on
// stderr that it watches again, and the wait goes on and succeeds on the new stream.
func TestWaitSaysWhenStreamBreaks(t *testing.T) {
	e := newEnv(t)
	e.ok("apply", "-f", e.file("route.yaml", routeTo("to-dc2", "198.51.100.0/24", "10.10.0.2", "host-a")))
	calls := e.proxy()
	r := e.start("wait", "route", "to-dc2", "--timeout", "20s")
	r.waitStderr(t, "route/to-dc2: 0/1 nodes programmed (generation 1)\n")
	calls.breakCalls()
	r.waitStderr(t, "naplesctl: status stream ended; watching again (error: ")
	e.report("to-dc2", "host-a", 1, programmed, "", "")
	if err := r.result(t); err != nil {
		t.Fatalf("wait after its stream broke: %v", err)
	}
	if got := calls.count("/nimbus.v1.Nimbus/WatchStatus"); got < 2 {
		t.Errorf("%d WatchStatus calls; want the wait to watch again", got)
	}
}

// rawMessage is a message in wire form, which rawCodec passes on as it is.
type rawMessage []byte

// rawCodec is a gRPC codec for rawMessage.
type rawCodec struct{}

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(*v.(*rawMessage))}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	*v.(*rawMessage) = data.Materialize()
	return nil
}

func (rawCodec) Name() string { return "proto" }

// TestWaitBeyondStatusNodes waits on routes of more nodes than nimbus lists in a status
// (its --status-nodes): the counts count every node, and a wait says so. A route that
// moves on to a newer generation, programmed on every node, ends wait and apply --wait
// as programmed; the FAILED nodes left out of the list are counted in the error, the
// line of a failure being retried and the error of a timeout.
func TestWaitBeyondStatusNodes(t *testing.T) {
	e := newEnvWith(t, nimbus.Options{Now: func() time.Time { return created }, Limits: nimbus.Limits{StatusNodes: 2}})
	nodes := []string{"n1", "n2", "n3", "n4", "n5"}
	reportAll := func(name string, gen int64) {
		for _, n := range nodes {
			e.report(name, n, gen, programmed, "", "")
		}
	}

	// wait on generation 1 while the route moves on to generation 2.
	e.ok("apply", "-f", e.file("r1.yaml", routeTo("r1", "198.51.100.0/24", "10.10.0.2", nodes...)))
	r := e.start("wait", "route", "r1", "--timeout", "20s")
	r.waitStderr(t, "route/r1: 0/5 nodes programmed (generation 1)\n")
	e.ok("apply", "-f", e.file("r1v2.yaml", routeTo("r1", "198.51.100.0/24", "10.10.0.3", nodes...)))
	reportAll("r1", 2)
	if err := r.result(t); err != nil {
		t.Fatalf("wait: %v\nstderr:\n%s", err, r.stderr)
	}
	equal(t, "wait stdout", r.stdout.String(), "route/r1 programmed on 5/5 nodes (generation 1)\n")

	// apply --wait of a route that moves on to generation 2 while it waits on 1.
	a := e.start("apply", "-f", e.file("r2.yaml", routeTo("r2", "198.51.101.0/24", "10.10.0.2", nodes...)), "--wait", "--timeout", "20s")
	a.waitStdout(t, "route/r2 created\n")
	e.ok("apply", "-f", e.file("r2v2.yaml", routeTo("r2", "198.51.101.0/24", "10.10.0.3", nodes...)))
	reportAll("r2", 2)
	if err := a.result(t); err != nil {
		t.Fatalf("apply --wait: %v\nstderr:\n%s", err, a.stderr)
	}
	equal(t, "apply --wait stdout", a.stdout.String(), "route/r2 created\n1 of 1 programmed on every target node\n")

	// Three nodes FAILED for good, two of them listed.
	e.ok("apply", "-f", e.file("r3.yaml", routeTo("r3", "198.51.102.0/24", "10.10.0.2", nodes...)))
	for _, n := range nodes[:3] {
		e.reportStatus("r3", &nimbusv1.NodeStatus{Node: n, ObservedGeneration: 1, Phase: failed, Terminal: true,
			Reason: "InvalidSpec", Message: "no"})
	}
	err := e.fails("wait", "route", "r3", "--timeout", "20s")
	equal(t, "wait error", err.Error(), "route/r3: programming failed on 2 of 5 nodes (generation 1):\n"+
		"  node n1: InvalidSpec: no\n  node n2: InvalidSpec: no\n  and 1 more FAILED node")

	// Three nodes FAILED and being retried, two of them listed.
	e.ok("apply", "-f", e.file("r4.yaml", routeTo("r4", "198.51.103.0/24", "10.10.0.2", nodes...)))
	for _, n := range nodes[:3] {
		e.report("r4", n, 1, failed, "KernelError", "file exists")
	}
	err = e.fails("wait", "route", "r4", "--timeout", "300ms")
	equal(t, "wait error", err.Error(), "route/r4: timed out after 300ms: 0/5 nodes programmed (generation 1); "+
		"pending: n4, n5; failing, being retried: n1 (KernelError: file exists), n2 (KernelError: file exists) and 1 more")
	_, stderr, err := e.run("", "apply", "-f", e.file("r4.yaml", routeTo("r4", "198.51.103.0/24", "10.10.0.2", nodes...)),
		"--wait", "--timeout", "300ms")
	if !errors.Is(err, ErrWaitTimeout) {
		t.Fatalf("apply --wait of r4: %v; want a timeout", err)
	}
	if want := "route/r4: FAILED on 3 of 5 nodes (generation 1): n1: KernelError (retrying): file exists; " +
		"n2: KernelError (retrying): file exists; and 1 more\n"; !strings.Contains(stderr, want) {
		t.Errorf("apply --wait stderr does not hold %q:\n%s", want, stderr)
	}
}
