//go:build linux

package test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/naplesnet/naples/internal/testns"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// This file tests what the firewall does to connections that live on: a policy change
// cuts the established connections the new policy denies and keeps the others
// (TestFirewallCutsEstablished), and ICMP errors about a tracked connection pass as
// related (TestFirewallRelatedICMP). It also holds what the other firewall tests of
// firewall_restart_test.go and firewall_ops_test.go share: a cluster of two hosts with
// only the workloads a test needs, echo servers that keep connections open, and
// connections that exchange numbered messages.

// fwSmallSpec describes a small firewall cluster: two hosts (fwHosts), the network
// fwNetwork and a few workloads.
type fwSmallSpec struct {
	// workloads are the workloads, each on fwHosts[host].
	workloads []fwEndpointDef
	// endpoints are their Endpoint objects; fwEndpointsOf makes the usual ones.
	endpoints []*nimbusv1.Object
	// objs are more objects applied with the endpoints: SecurityGroups, never a
	// NetworkSecurityPolicy (every workload must reach every other at first).
	objs []*nimbusv1.Object
	// tcp and udp are the ports of every workload's echo servers (see serveEcho).
	tcp, udp []uint16
	// agentFlags are extra flags of each host's agent, by host index.
	agentFlags [][]string
	// cluster, when set, is the nimbus the hosts' agents and the test talk to; unset, a
	// new one is started.
	cluster *cluster
}

// fwSmallCluster is a firewall cluster of two hosts with only the workloads a test
// needs, each serving echo on the spec's ports.
type fwSmallCluster struct {
	*fwCluster
	// echo holds the workloads' echo servers, by workload name.
	echo map[string]*fwEcho
}

// fwEndpointsOf returns the Endpoint objects of the workloads, each listing the groups
// groups gives it.
func fwEndpointsOf(defs []fwEndpointDef, groups map[string][]string) []*nimbusv1.Object {
	var out []*nimbusv1.Object
	for _, d := range defs {
		out = append(out, fwEndpointObject(d.name, fwNetwork, fwHosts[d.host], d.mac, []string{d.v4, d.v6}, groups[d.name]...))
	}
	return out
}

// fwDefs returns the definitions of the named workloads of fwEndpointDefs.
func fwDefs(names ...string) []fwEndpointDef {
	var out []fwEndpointDef
	for _, n := range names {
		i := slices.IndexFunc(fwEndpointDefs, func(d fwEndpointDef) bool { return d.name == n })
		if i < 0 {
			panic("no firewall test workload named " + n)
		}
		out = append(out, fwEndpointDefs[i])
	}
	return out
}

// newFWSmallCluster starts nimbus and the two hosts' agents (with the spec's flags),
// makes the workloads and their echo servers, applies the Nodes, the Network
// (10.1.0.0/24 and fd00:1::/64), the endpoints and the spec's objects, and waits until
// they are PROGRAMMED and every workload reaches every other over TCP on the first of
// the spec's TCP ports, IPv4 and IPv6.
func newFWSmallCluster(t testing.TB, spec fwSmallSpec) *fwSmallCluster {
	t.Helper()
	quickExit(t)
	c := spec.cluster
	if c == nil {
		c = newCluster(t)
	}
	u := newUnderlay(t)
	fc := &fwCluster{c: c, api: c.publisherAPI(t), desired: map[string]*nimbusv1.Object{}}
	var infra []*nimbusv1.Object
	for i, name := range fwHosts {
		h := c.addHost(t, name, name)
		vtep := u.attach(t, h)
		var flags []string
		if i < len(spec.agentFlags) {
			flags = spec.agentFlags[i]
		}
		h.startAgentWith(t, flags...)
		fc.hosts = append(fc.hosts, h)
		infra = append(infra, &nimbusv1.Object{
			Meta: &nimbusv1.ObjectMeta{Name: name},
			Spec: &nimbusv1.Object_Node{Node: &nimbusv1.NodeSpec{Hostname: name, VtepAddress: vtep}},
		})
	}
	infra = append(infra, &nimbusv1.Object{
		Meta: &nimbusv1.ObjectMeta{Name: fwNetwork},
		Spec: &nimbusv1.Object_Network{Network: &nimbusv1.NetworkSpec{Vni: 100, Subnets: []*nimbusv1.Subnet{
			{Cidr: "10.1.0.0/24", Gateway: "10.1.0.1"}, {Cidr: "fd00:1::/64", Gateway: "fd00:1::1"},
		}}},
	})
	sc := &fwSmallCluster{fwCluster: fc, echo: map[string]*fwEcho{}}
	var ws []*fwWorkload
	for _, d := range spec.workloads {
		w := newFWWorkload(t, newWorkload(t, fc.hosts[d.host], d.name, d.mac, []string{d.v4 + "/24", d.v6 + "/64"}, "10.1.0.1", "fd00:1::1"))
		sc.echo[d.name] = w.serveEcho(t, spec.tcp, spec.udp)
		ws = append(ws, w)
	}
	fc.table = newFWTable(ws...)
	fc.apply(t, slices.Concat(infra, spec.endpoints, spec.objs)...)
	fc.waitProgrammed(t)
	var open []fwCase
	for _, family := range []int{4, 6} {
		k := fwKind{proto: "tcp", family: family, port: spec.tcp[0]}
		for _, s := range fc.table.names() {
			for _, d := range fc.table.names() {
				if s != d {
					open = append(open, fwCase{src: s, dst: d, kind: k, want: true})
				}
			}
		}
	}
	// The overlay is programmed, but its first packets may wait for a bridge port to
	// come up or a neighbour to resolve: probes are tried again until all pass.
	fc.table.wantTable(t, "no policy", open, deadline)
	if t.Failed() {
		t.FailNow()
	}
	return sc
}

// workload returns the cluster's workload with the name.
func (sc *fwSmallCluster) workload(name string) *fwWorkload {
	w := sc.table.workloads[name]
	if w == nil {
		panic("no workload named " + name)
	}
	return w
}

// host returns the host of the name.
func (sc *fwSmallCluster) host(name string) *host {
	i := slices.Index(fwHosts, name)
	if i < 0 {
		panic("no host named " + name)
	}
	return sc.hosts[i]
}

// wantCases probes the cases, each once more when it differs, and fails the test with
// every case that still differs.
func (sc *fwSmallCluster) wantCases(t *testing.T, what string, cases ...fwCase) {
	t.Helper()
	sc.table.wantTable(t, what, cases, 0)
}

// fwCaseOf is a case of the kind ("tcp/80", "udp6/53", ...) from src to dst.
func fwCaseOf(src, dst, kind string, want bool) fwCase {
	return fwCase{src: src, dst: dst, kind: mustFWKinds(kind)[0], want: want}
}

// allowMulticastReports is an ingress rule that allows what the gateway and the link-local
// addresses of the network send: the IGMP and MLD reports that the bridge floods to every
// port (the gateway's own, and the workloads'). A protected ingress denies them
// otherwise, which shows in the firewall's counters: a test that counts denied packets or
// cut connections allows them, so that its counts are those of its own traffic.
func allowMulticastReports() *nimbusv1.PolicyRule {
	return allowIn("", nil, "10.1.0.1/32", "fe80::/10", "::/128")
}

// fwEcho is a workload's echo servers for the tests of this file: TCP and UDP on the
// ports given, IPv4 and IPv6. Unlike serveFW's, a TCP connection stays open until the
// client closes it or the test ends, and the datagrams each UDP port receives are
// counted.
type fwEcho struct {
	// udp counts the datagrams received, by port.
	udp map[uint16]*atomic.Int64
}

// received returns how many datagrams the UDP echo server on the port received.
func (e *fwEcho) received(port uint16) int64 { return e.udp[port].Load() }

// serveEcho starts the workload's echo servers on the ports, stopped when the test ends.
// The UDP sockets get a receive buffer of streamBuffer bytes, so that a stream of
// datagrams survives a pause of the test process.
func (w *fwWorkload) serveEcho(t testing.TB, tcpPorts, udpPorts []uint16) *fwEcho {
	t.Helper()
	e := &fwEcho{udp: map[uint16]*atomic.Int64{}}
	var listeners []net.Listener
	pcs := map[uint16]*net.UDPConn{}
	// mu guards conns and closed.
	var mu sync.Mutex
	conns := map[net.Conn]bool{}
	closed := false
	var wg sync.WaitGroup
	t.Cleanup(func() {
		for _, l := range listeners {
			l.Close()
		}
		for _, pc := range pcs {
			pc.Close()
		}
		mu.Lock()
		closed = true
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	if err := inNamespace(w.handle, func() error {
		for _, p := range tcpPorts {
			l, err := net.Listen("tcp", fmt.Sprintf(":%d", p))
			if err != nil {
				return err
			}
			listeners = append(listeners, l)
		}
		for _, p := range udpPorts {
			pc, err := net.ListenUDP("udp", &net.UDPAddr{Port: int(p)})
			if err != nil {
				return err
			}
			pcs[p] = pc
			e.udp[p] = &atomic.Int64{}
			if err := forceRcvBuf(pc); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatalf("echo servers in %s: %v", w.name, err)
	}
	for _, l := range listeners {
		wg.Go(func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				mu.Lock()
				if closed {
					mu.Unlock()
					c.Close()
					continue
				}
				conns[c] = true
				mu.Unlock()
				wg.Go(func() {
					io.Copy(c, c)
					c.Close()
					mu.Lock()
					delete(conns, c)
					mu.Unlock()
				})
			}
		})
	}
	for p, pc := range pcs {
		count := e.udp[p]
		wg.Go(func() {
			buf := make([]byte, 2048)
			for {
				n, from, err := pc.ReadFromUDP(buf)
				if errors.Is(err, net.ErrClosed) {
					return
				}
				if err != nil {
					continue
				}
				count.Add(1)
				pc.WriteToUDP(buf[:n], from)
			}
		})
	}
	return e
}

// fwConn is a connection a test keeps open from a workload to an echo server, over
// which it exchanges numbered messages.
type fwConn struct {
	// name says what the connection is, for messages.
	name  string
	proto string
	c     net.Conn
	// seq is the number of the last message sent.
	seq int
}

// dial opens a connection of proto ("tcp" or "udp") from the workload to dst, closed
// when the test ends.
func (w *fwWorkload) dial(t testing.TB, proto string, dst netip.AddrPort) *fwConn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	c, err := dialIn(ctx, w.handle, proto, dst.String())
	if err != nil {
		t.Fatalf("%s connection from %s to %v: %v", proto, w.name, dst, err)
	}
	t.Cleanup(func() { c.Close() })
	return &fwConn{name: fmt.Sprintf("%s %s→%v", proto, w.name, dst), proto: proto, c: c}
}

// exchange sends the next numbered message and waits at most wait for its echo. Over
// UDP, echoes of earlier messages are skipped; over TCP, the connection is of no use
// after an exchange that failed.
func (fc *fwConn) exchange(wait time.Duration) error {
	fc.seq++
	msg := fmt.Appendf(nil, "%s #%09d", fc.name, fc.seq)
	fc.c.SetDeadline(time.Now().Add(wait))
	if _, err := fc.c.Write(msg); err != nil {
		return fmt.Errorf("sending message %d: %w", fc.seq, err)
	}
	got := make([]byte, len(msg)+64)
	if fc.proto == "tcp" {
		if _, err := io.ReadFull(fc.c, got[:len(msg)]); err != nil {
			return fmt.Errorf("reading the echo of message %d: %w", fc.seq, err)
		}
		if !bytes.Equal(got[:len(msg)], msg) {
			return fmt.Errorf("echo %q, want %q", got[:len(msg)], msg)
		}
		return nil
	}
	for {
		n, err := fc.c.Read(got)
		if err != nil {
			return fmt.Errorf("reading the echo of message %d: %w", fc.seq, err)
		}
		if bytes.Equal(got[:n], msg) {
			return nil
		}
	}
}

// wantCut sends one more message and fails the test if anything comes back within
// wait: the connection must stay cut.
func (fc *fwConn) wantCut(t *testing.T, wait time.Duration) {
	t.Helper()
	err := fc.exchange(wait)
	if err == nil {
		t.Errorf("%s: a message was echoed after the connection was cut", fc.name)
		return
	}
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("%s: after the cut, %v; want no answer at all", fc.name, err)
	}
}

// fwFlow exchanges messages over a connection, one after the other, until it is stopped
// or an exchange fails, and records when each exchange began.
type fwFlow struct {
	conn *fwConn
	// wait is how long an exchange waits for its echo.
	wait time.Duration
	stop chan struct{}
	done chan struct{}

	// mu guards answered, failedAt and err.
	mu sync.Mutex
	// answered holds when each answered exchange began.
	answered []time.Time
	// failedAt is when the exchange that failed began; zero while none has.
	failedAt time.Time
	err      error
}

// fwFlowPause is the pause between two exchanges of a flow.
const fwFlowPause = 2 * time.Millisecond

// startFlow starts exchanging over the connection; the flow stops when the test ends at
// the latest.
func startFlow(t testing.TB, conn *fwConn, wait time.Duration) *fwFlow {
	f := &fwFlow{conn: conn, wait: wait, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(f.done)
		for {
			select {
			case <-f.stop:
				return
			default:
			}
			began := time.Now()
			err := conn.exchange(wait)
			f.mu.Lock()
			if err != nil {
				f.failedAt, f.err = began, err
				f.mu.Unlock()
				return
			}
			f.answered = append(f.answered, began)
			f.mu.Unlock()
			time.Sleep(fwFlowPause)
		}
	}()
	t.Cleanup(f.finish)
	return f
}

// finish stops the flow and waits for its last exchange; it is safe to call twice.
func (f *fwFlow) finish() {
	select {
	case <-f.stop:
	default:
		close(f.stop)
	}
	<-f.done
}

// answeredSince returns how many exchanges that began at or after since were answered.
func (f *fwFlow) answeredSince(since time.Time) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	i, _ := slices.BinarySearchFunc(f.answered, since, func(a, b time.Time) int { return a.Compare(b) })
	return len(f.answered) - i
}

// failure returns when the exchange that failed began and why it failed; a zero time
// while none has.
func (f *fwFlow) failure() (time.Time, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.failedAt, f.err
}

// lastAnswered returns when the last answered exchange began; zero if none was.
func (f *fwFlow) lastAnswered() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.answered) == 0 {
		return time.Time{}
	}
	return f.answered[len(f.answered)-1]
}

// fwCutBound is how soon after a policy change is PROGRAMMED on every node the
// connections it denies must stop passing.
const fwCutBound = time.Second

// fwKeptAfter is how many exchanges the flows a policy change keeps must carry past
// fwCutBound after the change.
const fwKeptAfter = 20

// fwFlowWait is how long an exchange of the tests' flows waits for its echo: long
// enough that a slow answer on a loaded machine is not taken for a drop.
const fwFlowWait = 3 * time.Second

// TestFirewallCutsEstablished runs two IPv4 TCP connections and two UDP flows from
// web1 (host-a, group client) to db2 (host-b, group server), messages echoed both ways
// without pause. Both ends are protected both ways, and no rule allows anything from db2
// to web1: the echoes pass as replies only, while db2 cannot open a connection to web1.
// Then the server policy is changed to deny tcp/5432 and udp/53: those two flows must
// stop passing within fwCutBound of the change being PROGRAMMED on both nodes (the time
// from PROGRAMMED seen at nimbus to the first exchange that got no answer is logged),
// and stay cut, while tcp/8080 and udp/123, still allowed, pass on without losing an
// exchange.
func TestFirewallCutsEstablished(t *testing.T) {
	defs := fwDefs("web1", "db2")
	groups := map[string][]string{"web1": {"client"}, "db2": {"server"}}
	sc := newFWSmallCluster(t, fwSmallSpec{
		workloads: defs,
		endpoints: fwEndpointsOf(defs, groups),
		objs:      []*nimbusv1.Object{fwGroupObject("client"), fwGroupObject("server")},
		tcp:       []uint16{8080, 5432},
		udp:       []uint16{53, 123},
	})
	// 192.0.2.1 is nobody: the rules naming it only make their direction protected.
	servers := func(tcp, udp []string) *nimbusv1.Object {
		return fwPolicyObject("servers", []string{"server"},
			fwRules(allowIn("tcp", tcp, "group:client"), allowIn("udp", udp, "group:client")),
			fwRules(allowOut("tcp", fwPorts("22"), "192.0.2.1/32")))
	}
	clients := fwPolicyObject("clients", []string{"client"},
		fwRules(allowIn("tcp", fwPorts("22"), "192.0.2.1/32")),
		fwRules(allowOut("tcp", fwPorts("5432", "8080"), "group:server"), allowOut("udp", fwPorts("53", "123"), "group:server")))
	sc.apply(t, clients, servers(fwPorts("5432", "8080"), fwPorts("53", "123")))
	sc.waitProgrammed(t)
	sc.wantCases(t, "the first policies",
		fwCaseOf("web1", "db2", "tcp/5432", true), fwCaseOf("web1", "db2", "tcp/8080", true),
		fwCaseOf("web1", "db2", "udp/53", true), fwCaseOf("web1", "db2", "udp/123", true),
		fwCaseOf("db2", "web1", "tcp/5432", false), fwCaseOf("db2", "web1", "tcp/8080", false),
		fwCaseOf("db2", "web1", "udp/53", false), fwCaseOf("db2", "web1", "udp/123", false))

	web1, db2 := sc.workload("web1"), sc.workload("db2")
	dst := func(port uint16) netip.AddrPort { return netip.AddrPortFrom(db2.addr(4), port) }
	cut := []*fwFlow{
		startFlow(t, web1.dial(t, "tcp", dst(5432)), fwFlowWait),
		startFlow(t, web1.dial(t, "udp", dst(53)), fwFlowWait),
	}
	kept := []*fwFlow{
		startFlow(t, web1.dial(t, "tcp", dst(8080)), fwFlowWait),
		startFlow(t, web1.dial(t, "udp", dst(123)), fwFlowWait),
	}
	all := slices.Concat(cut, kept)
	began := time.Now()
	waitFor(t, "every flow to carry 50 exchanges", func() bool {
		for _, f := range all {
			if at, err := f.failure(); !at.IsZero() {
				t.Fatalf("%s failed %v after it began, before the policy changed: %v", f.conn.name, at.Sub(began), err)
			}
			if f.answeredSince(began) < 50 {
				return false
			}
		}
		return true
	})

	applied := time.Now()
	sc.apply(t, servers(fwPorts("8080"), fwPorts("123")))
	sc.waitProgrammed(t)
	programmed := time.Now()
	t.Logf("the change was PROGRAMMED on both nodes %v after it was applied", programmed.Sub(applied).Round(time.Millisecond))

	// Wait until the cut flows have failed and the kept ones have carried fwKeptAfter
	// exchanges past the bound, or until a cut flow still passing past the bound can no
	// longer fail in time.
	end := programmed.Add(fwCutBound + fwFlowWait + time.Second)
	for time.Now().Before(end) {
		done := true
		for _, f := range cut {
			if at, _ := f.failure(); at.IsZero() {
				done = false
			}
		}
		for _, f := range kept {
			if at, _ := f.failure(); at.IsZero() && f.answeredSince(programmed.Add(fwCutBound)) < fwKeptAfter {
				done = false
			}
		}
		if done {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, f := range all {
		f.finish()
	}

	for _, f := range cut {
		at, err := f.failure()
		switch {
		case at.IsZero():
			t.Errorf("%s: still passing %v after the change was PROGRAMMED (last exchange answered began %v after); want cut within %v",
				f.conn.name, time.Since(programmed).Round(time.Millisecond), f.lastAnswered().Sub(programmed).Round(time.Millisecond), fwCutBound)
			continue
		case at.Before(applied):
			t.Errorf("%s: failed %v before the change was applied: %v", f.conn.name, applied.Sub(at), err)
			continue
		}
		d := at.Sub(programmed)
		t.Logf("%s: the first exchange without answer began %v after the change was PROGRAMMED on both nodes (%v after it was applied); it ended with: %v",
			f.conn.name, d.Round(time.Millisecond), at.Sub(applied).Round(time.Millisecond), err)
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("%s: the exchange after the change ended with %v; want no answer at all", f.conn.name, err)
		}
		if d >= fwCutBound {
			t.Errorf("%s: cut %v after the change was PROGRAMMED on both nodes; want less than %v", f.conn.name, d.Round(time.Millisecond), fwCutBound)
		}
		f.conn.wantCut(t, time.Second)
	}
	for _, f := range kept {
		if at, err := f.failure(); !at.IsZero() {
			t.Errorf("%s: still allowed, but an exchange that began %v after the change was PROGRAMMED got no answer: %v",
				f.conn.name, at.Sub(programmed).Round(time.Millisecond), err)
			continue
		}
		if n := f.answeredSince(programmed.Add(fwCutBound)); n < fwKeptAfter {
			t.Errorf("%s: only %d exchanges answered from %v after the change on; want it to go on", f.conn.name, n, fwCutBound)
		}
		if err := f.conn.exchange(fwFlowWait); err != nil {
			t.Errorf("%s: still allowed, but after the flow: %v", f.conn.name, err)
		}
		t.Logf("%s: %d exchanges answered, none lost", f.conn.name, f.answeredSince(began))
	}
	// New connections follow the new policy too.
	sc.wantCases(t, "the changed policy",
		fwCaseOf("web1", "db2", "tcp/5432", false), fwCaseOf("web1", "db2", "tcp/8080", true),
		fwCaseOf("web1", "db2", "udp/53", false), fwCaseOf("web1", "db2", "udp/123", true))
}

// fwSinkPort is the TCP port of the sink servers of TestFirewallRelatedICMP.
const fwSinkPort = 5001

// serveSink starts a TCP server on fwSinkPort in the namespace that reads what a client
// sends until the client closes its side, then answers with the number of bytes read, in
// decimal, and closes. It stops when the test ends.
func serveSink(t testing.TB, ns string) {
	t.Helper()
	var l net.Listener
	if err := inNetns(t, ns, func() error {
		var err error
		l, err = net.Listen("tcp", fmt.Sprintf(":%d", fwSinkPort))
		return err
	}); err != nil {
		t.Fatalf("sink server in %s: %v", ns, err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		l.Close()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				c.SetDeadline(time.Now().Add(deadline))
				n, err := io.Copy(io.Discard, c)
				if err == nil {
					fmt.Fprintf(c, "%d", n)
				}
			})
		}
	})
}

// sendAll connects from the workload to dst, sends size bytes, closes its side and
// waits for the sink's count, all within wait. It returns the connection's path MTU as
// the kernel knows it (IP_MTU or IPV6_MTU) once connected and at the end.
func (w *fwWorkload) sendAll(dst netip.AddrPort, size int, wait time.Duration) (before, after int, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	c, err := dialIn(ctx, w.handle, "tcp", dst.String())
	if err != nil {
		return 0, 0, fmt.Errorf("connecting: %w", err)
	}
	defer c.Close()
	tc := c.(*net.TCPConn)
	tc.SetDeadline(time.Now().Add(wait))
	if before, err = pathMTU(tc); err != nil {
		return 0, 0, err
	}
	if _, err := tc.Write(bytes.Repeat([]byte{0x5a}, size)); err != nil {
		return before, 0, fmt.Errorf("sending %d bytes: %w", size, err)
	}
	if err := tc.CloseWrite(); err != nil {
		return before, 0, fmt.Errorf("closing the sending side: %w", err)
	}
	answer, err := io.ReadAll(tc)
	if err != nil {
		mtu, _ := pathMTU(tc)
		return before, mtu, fmt.Errorf("reading the sink's count after sending %d bytes: %w", size, err)
	}
	if string(answer) != fmt.Sprint(size) {
		return before, 0, fmt.Errorf("the sink counted %q bytes, want %d", answer, size)
	}
	after, err = pathMTU(tc)
	return before, after, err
}

// pathMTU returns the path MTU of a connected socket as its kernel knows it.
func pathMTU(c *net.TCPConn) (int, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	level, opt := unix.IPPROTO_IP, unix.IP_MTU
	if netip.MustParseAddrPort(c.RemoteAddr().String()).Addr().Unmap().Is6() {
		level, opt = unix.IPPROTO_IPV6, unix.IPV6_MTU
	}
	var mtu int
	var serr error
	if err := raw.Control(func(fd uintptr) { mtu, serr = unix.GetsockoptInt(int(fd), level, opt) }); err != nil {
		return 0, err
	}
	if serr != nil {
		return 0, fmt.Errorf("reading the path MTU: %w", serr)
	}
	return mtu, nil
}

// icmpErrorAbout returns an ICMP error message (ICMPv4 or ICMPv6, after the addresses'
// family) of the type and code about a TCP packet from src to dst: the header of that
// packet and the first 8 bytes of its TCP header, with sequence number 0, which no
// connection takes for one of its own segments. An ICMPv6 message is returned without
// its checksum, which the kernel computes.
func icmpErrorAbout(typ, code byte, src, dst netip.AddrPort) []byte {
	msg := []byte{typ, code, 0, 0, 0, 0, 0, 0}
	if src.Addr().Is4() {
		ip := []byte{0x45, 0, 0, 40, 0, 0, 0x40, 0, 64, unix.IPPROTO_TCP, 0, 0}
		ip = append(ip, src.Addr().AsSlice()...)
		ip = append(ip, dst.Addr().AsSlice()...)
		binary.BigEndian.PutUint16(ip[10:], internetChecksum(ip))
		msg = append(msg, ip...)
	} else {
		msg = append(msg, 0x60, 0, 0, 0, 0, 20, unix.IPPROTO_TCP, 64)
		msg = append(msg, src.Addr().AsSlice()...)
		msg = append(msg, dst.Addr().AsSlice()...)
	}
	msg = binary.BigEndian.AppendUint16(msg, src.Port())
	msg = binary.BigEndian.AppendUint16(msg, dst.Port())
	msg = append(msg, 0, 0, 0, 0)
	if src.Addr().Is4() {
		binary.BigEndian.PutUint16(msg[2:], internetChecksum(msg))
	}
	return msg
}

// sendICMP sends an ICMP message (ICMPv4 or ICMPv6, after dst's family) from the
// workload's address of that family to dst, on a raw socket.
func (w *fwWorkload) sendICMP(dst netip.Addr, msg []byte) error {
	network, family := "ip4:icmp", 4
	if dst.Is6() {
		network, family = "ip6:ipv6-icmp", 6
	}
	var c net.PacketConn
	if err := inNamespace(w.handle, func() error {
		var err error
		c, err = net.ListenPacket(network, w.addr(family).String())
		return err
	}); err != nil {
		return fmt.Errorf("raw ICMP socket in %s: %w", w.name, err)
	}
	defer c.Close()
	_, err := c.WriteTo(msg, &net.IPAddr{IP: dst.AsSlice()})
	return err
}

// icmpWatch counts the ICMP errors of one type a workload receives, by the ports of the
// TCP packet each one embeds.
type icmpWatch struct {
	typ byte
	// ipLen is the length of the embedded packet's IP header.
	ipLen int
	pc    net.PacketConn
	done  chan struct{}
	// mu guards seen.
	mu sync.Mutex
	// seen counts the errors by source and destination port of the packet they embed.
	seen map[[2]uint16]int
}

// watchICMPErrors starts counting the ICMP errors of the type (ICMPv4 or ICMPv6, after
// the family) that reach the workload's address of the family, until the test ends. A
// raw socket receives a copy of every ICMP message its namespace receives, whatever the
// kernel makes of it.
func (w *fwWorkload) watchICMPErrors(t testing.TB, family int, typ byte) *icmpWatch {
	t.Helper()
	network, ipLen := "ip4:icmp", 20
	if family == 6 {
		network, ipLen = "ip6:ipv6-icmp", 40
	}
	iw := &icmpWatch{typ: typ, ipLen: ipLen, done: make(chan struct{}), seen: map[[2]uint16]int{}}
	if err := inNamespace(w.handle, func() error {
		var err error
		iw.pc, err = net.ListenPacket(network, w.addr(family).String())
		return err
	}); err != nil {
		t.Fatalf("raw ICMP socket in %s: %v", w.name, err)
	}
	go func() {
		defer close(iw.done)
		buf := make([]byte, 2048)
		for {
			// Go strips the IPv4 header; the message starts with the ICMP header.
			n, _, err := iw.pc.ReadFrom(buf)
			if errors.Is(err, net.ErrClosed) {
				return
			}
			m := buf[:n]
			if err != nil || len(m) < 8+ipLen+4 || m[0] != typ {
				continue
			}
			ports := [2]uint16{binary.BigEndian.Uint16(m[8+ipLen:]), binary.BigEndian.Uint16(m[8+ipLen+2:])}
			iw.mu.Lock()
			iw.seen[ports]++
			iw.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		iw.pc.Close()
		<-iw.done
	})
	return iw
}

// count returns how many errors about packets between the ports were seen.
func (iw *icmpWatch) count(src, dst netip.AddrPort) int {
	iw.mu.Lock()
	defer iw.mu.Unlock()
	return iw.seen[[2]uint16{src.Port(), dst.Port()}]
}

// fwRouterMTU is the MTU of the route the router of TestFirewallRelatedICMP forwards
// through: the smallest IPv6 allows.
const fwRouterMTU = 1280

// TestFirewallRelatedICMP checks that ICMP errors about a tracked connection pass the
// firewall as related, and that others are checked as plain ICMP.
//
// web1 (host-a) sends 64 KiB over TCP, with DF set, to r2, a namespace behind db2
// (host-b): db2 is a router whose route to r2 has a smaller MTU (`ip route ... mtu lock
// 1280`), and r2's addresses are addresses of db2's Endpoint, so the overlay delivers
// them to db2. r2 advertises an MSS for its own MTU of 1500, so web1's first segments
// are too big for that route: db2 answers them with ICMP "fragmentation needed" (IPv4)
// or "packet too big" (IPv6), and web1 must learn the smaller path MTU and send
// everything. No rule allows ICMP: db2's egress and web1's ingress are protected, so
// the errors pass both only as related to the connection, in IPv4 and IPv6.
//
// The router cannot be the host: the host has no route to the overlay (its tenant
// routing only applies to what enters through a bridge), so the kernel sends no ICMP
// error about what it forwards between networks; PMTU discovery between networks of
// different MTUs fails with or without the firewall.
//
// Then ops (host-b, unprotected) sends web1 two forged "host unreachable" errors, one
// about web1's open connection to r2 and one about a connection from the same port to
// another port of r2, which does not exist:
// the second, sent first, is dropped (web1's firewall counts a denied packet, and web1
// never sees it), the first reaches web1.
func TestFirewallRelatedICMP(t *testing.T) {
	defs := fwDefs("web1", "db2", "ops")
	groups := map[string][]string{"web1": {"client"}, "db2": {"server"}}
	r2v4, r2v6 := netip.MustParseAddr("10.1.0.50"), netip.MustParseAddr("fd00:1::50")
	endpoints := fwEndpointsOf(defs, groups)
	for _, ep := range endpoints {
		if ep.GetMeta().GetName() == "db2" {
			ep.GetEndpoint().Ips = append(ep.GetEndpoint().Ips, r2v4.String(), r2v6.String())
		}
	}
	sc := newFWSmallCluster(t, fwSmallSpec{
		workloads: defs,
		endpoints: endpoints,
		objs:      []*nimbusv1.Object{fwGroupObject("client"), fwGroupObject("server")},
		tcp:       []uint16{8080},
		// host-a's metrics count what web1's firewall denies.
		agentFlags: [][]string{metricsFlags},
	})
	web1, db2, ops := sc.workload("web1"), sc.workload("db2"), sc.workload("ops")
	telA := sc.host("host-a").telemetry(t)

	// r2, behind db2: 10.99.0.0/30 and fd00:99::/64 join them.
	r2 := testns.Named(t, "naples-wl")
	for _, args := range [][]string{
		{"-n", db2.ns, "link", "add", "sub0", "type", "veth", "peer", "name", "eth0", "netns", r2},
		{"-n", db2.ns, "addr", "add", "10.99.0.1/30", "dev", "sub0"},
		{"-n", db2.ns, "addr", "add", "fd00:99::1/64", "dev", "sub0", "nodad"},
		{"-n", db2.ns, "link", "set", "sub0", "up"},
		{"-n", r2, "addr", "add", "10.99.0.2/30", "dev", "eth0"},
		{"-n", r2, "addr", "add", r2v4.String() + "/32", "dev", "eth0"},
		{"-n", r2, "addr", "add", "fd00:99::2/64", "dev", "eth0", "nodad"},
		{"-n", r2, "addr", "add", r2v6.String() + "/128", "dev", "eth0", "nodad"},
		{"-n", r2, "link", "set", "eth0", "up"},
		{"-n", r2, "route", "add", "default", "via", "10.99.0.1"},
		{"-n", r2, "-6", "route", "add", "default", "via", "fd00:99::1"},
		{"netns", "exec", db2.ns, "sysctl", "-qw", "net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1"},
		{"-n", db2.ns, "route", "add", r2v4.String() + "/32", "via", "10.99.0.2", "dev", "sub0", "mtu", "lock", fmt.Sprint(fwRouterMTU)},
		{"-n", db2.ns, "-6", "route", "add", r2v6.String() + "/128", "via", "fd00:99::2", "dev", "sub0", "mtu", "lock", fmt.Sprint(fwRouterMTU)},
	} {
		testns.Run(t, "ip", args...)
	}
	serveSink(t, r2)

	// 192.0.2.1 is nobody: the rules naming it only make their direction protected.
	sc.apply(t,
		fwPolicyObject("clients", []string{"client"},
			fwRules(allowIn("tcp", fwPorts("22"), "192.0.2.1/32")),
			fwRules(allowOut("tcp", fwPorts(fmt.Sprint(fwSinkPort)), "group:server"))),
		fwPolicyObject("servers", []string{"server"},
			fwRules(allowIn("tcp", fwPorts(fmt.Sprint(fwSinkPort)), "group:client")),
			fwRules(allowOut("tcp", fwPorts("22"), "192.0.2.1/32"))))
	sc.waitProgrammed(t)
	sc.wantCases(t, "the policies",
		fwCaseOf("ops", "web1", "icmp", false), fwCaseOf("ops", "web1", "icmp6", false),
		fwCaseOf("web1", "db2", "icmp", false), fwCaseOf("web1", "db2", "icmp6", false))

	for _, dst := range []netip.Addr{r2v4, r2v6} {
		to := netip.AddrPortFrom(dst, fwSinkPort)
		before, after, err := web1.sendAll(to, 64<<10, 10*time.Second)
		if err != nil {
			t.Errorf("64 KiB from web1 to %v: %v (path MTU %d at first, %d at the end)", to, err, before, after)
			continue
		}
		t.Logf("64 KiB from web1 to %v: path MTU %d at first, %d at the end", to, before, after)
		if before <= fwRouterMTU || after != fwRouterMTU {
			t.Errorf("64 KiB from web1 to %v: path MTU %d at first, %d at the end; want more than %d, then %d from the router's ICMP error",
				to, before, after, fwRouterMTU, fwRouterMTU)
		}
	}

	for _, tc := range []struct {
		dst       netip.Addr
		typ, code byte
	}{
		{r2v4, 3, 1}, // destination unreachable, host unreachable
		{r2v6, 1, 3}, // destination unreachable, address unreachable
	} {
		family := 4
		if tc.dst.Is6() {
			family = 6
		}
		watch := web1.watchICMPErrors(t, family, tc.typ)
		conn := web1.dial(t, "tcp", netip.AddrPortFrom(tc.dst, fwSinkPort))
		local := netip.MustParseAddrPort(conn.c.LocalAddr().String())
		src := netip.AddrPortFrom(local.Addr().Unmap(), local.Port())
		to := netip.AddrPortFrom(tc.dst, fwSinkPort)
		// Nothing listens on the next port of r2, and web1 never connected to it.
		unrelated := netip.AddrPortFrom(tc.dst, fwSinkPort+1)
		denied := fwEndpointPackets(t, telA, "web1", "denied")
		if err := ops.sendICMP(web1.addr(family), icmpErrorAbout(tc.typ, tc.code, src, unrelated)); err != nil {
			t.Fatalf("sending an ICMP error from ops: %v", err)
		}
		waitFor(t, fmt.Sprintf("web1's firewall to deny the ICMPv%d error about %v → %v", family, src, unrelated), func() bool {
			return fwEndpointPackets(t, telA, "web1", "denied") > denied
		})
		if err := ops.sendICMP(web1.addr(family), icmpErrorAbout(tc.typ, tc.code, src, to)); err != nil {
			t.Fatalf("sending an ICMP error from ops: %v", err)
		}
		waitFor(t, fmt.Sprintf("web1 to receive the ICMPv%d error about its connection %v → %v", family, src, to), func() bool {
			return watch.count(src, to) > 0
		})
		if n := watch.count(src, unrelated); n > 0 {
			t.Errorf("web1 received %d ICMPv%d errors about %v → %v, which is no connection; want them dropped", n, family, src, unrelated)
		}
		conn.c.Close()
	}
}

// fwEndpointPackets returns the agent's naples_firewall_endpoint_packets_total of the
// workload's Endpoint (of the default tenant and namespace) with the verdict ("allowed"
// or "denied"), as it serves it now; 0 when it serves none.
func fwEndpointPackets(t testing.TB, tel *telemetry, workload, verdict string) float64 {
	t.Helper()
	key := &nimbusv1.ObjectKey{Kind: nimbusv1.Kind_KIND_ENDPOINT, Name: workload}
	return tel.metrics(t)[fmt.Sprintf("naples_firewall_endpoint_packets_total{endpoint=%q,verdict=%q}", key.ID(), verdict)]
}
