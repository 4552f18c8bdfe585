//go:build linux

package test

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/naplesnet/naples/internal/testns"
)

// This file checks that a network's anycast gateway answers: ping, a refused TCP
// connection, the ICMP errors of path-MTU discovery between networks of different MTU,
// and the ICMP error of a connection across tenants, also with overlapping subnets in two
// tenants.

// TestOverlayGatewayAnswers runs one cluster of two hosts on an underlay that carries
// jumbo frames, with networks jumbo (MTU 9000) and small (MTU 1400) of the default
// tenant, and in tenant acme twin (jumbo's subnets and gateway addresses) and far.
//
//   - Workloads of jumbo and twin on host-a, of small on host-b, ping their gateways
//     (IPv4 and IPv6) and get replies, each from its own bridge.
//   - A TCP connection to a closed port of the gateway is refused (a TCP reset).
//   - A 1 MB TCP transfer from jumbo's workload to small's, whose interface takes
//     jumbo frames, completes: the gateway's frag-needed (packet-too-big) reaches the
//     sender, which lowers its path MTU.
//   - A TCP connection from jumbo's workload to far's fails with the ICMP error of the
//     tenant boundary (host unreachable, administratively prohibited), not a timeout.
//   - The gateway answers while host-a's agent is killed, and after it restarts.
//   - Once its gateway's ingress links are detached by hand (their pins removed), the
//     agent attaches the programs again, and the gateway answers again.
func TestOverlayGatewayAnswers(t *testing.T) {
	c := newCluster(t)
	u := newUnderlay(t)
	a := c.addHost(t, "host-a", "host-a")
	b := c.addHost(t, "host-b", "host-b")
	vtepA, vtepB := u.attach(t, a), u.attach(t, b)
	// The underlay carries 9000-byte frames and VXLAN's overhead.
	for i, h := range []*host{a, b} {
		testns.Run(t, "ip", "-n", u.ns, "link", "set", fmt.Sprintf("up%d", i+1), "mtu", "9100")
		testns.Run(t, "ip", "-n", h.ns, "link", "set", "uplink", "mtu", "9100")
	}
	for _, h := range []*host{a, b} {
		h.startAgent(t)
	}

	jumbo := newWorkload(t, a, "wjumbo", "02:00:00:00:04:0a", []string{"10.40.0.10/24", "fd00:40::a/64"}, "10.40.0.1", "fd00:40::1")
	twin := newWorkload(t, a, "wtwin", "02:00:00:00:05:0a", []string{"10.40.0.10/24", "fd00:40::a/64"}, "10.40.0.1", "fd00:40::1")
	small := newWorkload(t, b, "wsmall", "02:00:00:00:06:0b", []string{"10.41.0.10/24", "fd00:41::a/64"}, "10.41.0.1", "fd00:41::1")
	far := newWorkload(t, b, "wfar", "02:00:00:00:07:0b", []string{"10.43.0.10/24", "fd00:43::a/64"}, "10.43.0.1", "fd00:43::1")
	far.serve(t)
	// Jumbo frames from jumbo's workload into its bridge; small's workload takes them too,
	// so that it advertises a TCP MSS the 1400-byte network cannot carry.
	for _, l := range []struct{ ns, dev string }{{a.ns, jumbo.name}, {jumbo.ns, "eth0"}, {b.ns, small.name}, {small.ns, "eth0"}} {
		testns.Run(t, "ip", "-n", l.ns, "link", "set", l.dev, "mtu", "9000")
	}
	sinks := map[int]*byteSink{4: small.sink(t, "tcp4", 5001), 6: small.sink(t, "tcp6", 5001)}

	c.apply(t, nodeYAML(a, vtepA)+nodeYAML(b, vtepB)+gatewayNetworksYAML+
		jumbo.endpointYAML("default", "jumbo", a)+small.endpointYAML("default", "small", b)+
		twin.endpointYAML("acme", "twin", a)+far.endpointYAML("acme", "far", b))
	// naplesctl reads the default tenant; the pings wait for the others.
	c.waitProgrammed(t, "endpoint", jumbo.name, "host-a", 1)
	c.waitProgrammed(t, "endpoint", small.name, "host-b", 1)

	for _, p := range []struct {
		w   *workload
		gws []string
	}{
		{jumbo, []string{"10.40.0.1", "fd00:40::1"}},
		{twin, []string{"10.40.0.1", "fd00:40::1"}},
		{small, []string{"10.41.0.1", "fd00:41::1"}},
	} {
		fw := newFWWorkload(t, p.w)
		for _, gw := range p.gws {
			waitFor(t, fmt.Sprintf("%s to get an echo reply from its gateway %s", p.w.name, gw), func() bool {
				return fw.probeICMP(netip.MustParseAddr(gw), []byte("naples"), 500*time.Millisecond).outcome == fwPassed
			})
		}
	}

	for _, gw := range []string{"10.40.0.1", "fd00:40::1"} {
		if err := jumbo.dial(t, gw, 9, 10*time.Second); !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("%s connecting to the closed port 9 of its gateway %s: got %v, want it refused", jumbo.name, gw, err)
		}
	}

	for _, family := range []int{4, 6} {
		const size = 1 << 20
		if err := jumbo.send(t, small.ip(family), 5001, size, 20*time.Second); err != nil {
			t.Errorf("sending 1 MB over TCP from %s (MTU 9000) to %s (network MTU 1400): %v", jumbo.name, small.ip(family), err)
		} else if got := sinks[family].wait(t); got != size {
			t.Errorf("%s received %d bytes over IPv%d, want %d", small.name, got, family, size)
		}
	}

	for family, want := range map[int][]error{4: {syscall.EHOSTUNREACH}, 6: {syscall.EACCES, syscall.EHOSTUNREACH}} {
		err := jumbo.dial(t, far.ip(family), 7, 10*time.Second)
		if !oneOf(err, want) {
			t.Errorf("%s (tenant default) connecting to %s (tenant acme): got %v, want the ICMP error of the tenant boundary (%v)",
				jumbo.name, far.ip(family), err, want)
		}
	}

	// The programs and their map are pinned: the gateway answers while host-a's agent is
	// down, killed, and after the next one has started.
	a.agent.kill(t)
	fw := newFWWorkload(t, jumbo)
	for _, gw := range []string{"10.40.0.1", "fd00:40::1"} {
		if r := fw.probeICMP(netip.MustParseAddr(gw), []byte("naples"), 2*time.Second); r.outcome != fwPassed {
			t.Errorf("with host-a's agent killed, %s got no echo reply from its gateway %s: %+v", jumbo.name, gw, r)
		}
	}
	a.startAgentWith(t, metricsFlags...)
	a.telemetry(t).waitReady(t)
	for _, gw := range []string{"10.40.0.1", "fd00:40::1"} {
		waitFor(t, fmt.Sprintf("%s to get an echo reply from its gateway %s after host-a's agent restarted", jumbo.name, gw), func() bool {
			return fw.probeICMP(netip.MustParseAddr(gw), []byte("naples"), 500*time.Millisecond).outcome == fwPassed
		})
	}

	// The ingress links detached by hand (their pins removed, so the kernel frees them):
	// the agent notices and attaches the programs again, and the gateway answers again.
	unpinLinks(t, filepath.Join(a.bpf, "gateway", "links", "*-ingress"))
	for _, gw := range []string{"10.40.0.1", "fd00:40::1"} {
		waitFor(t, fmt.Sprintf("%s to get an echo reply from its gateway %s after its ingress link was detached by hand", jumbo.name, gw), func() bool {
			return fw.probeICMP(netip.MustParseAddr(gw), []byte("naples"), 500*time.Millisecond).outcome == fwPassed
		})
	}
}

// gatewayNetworksYAML holds the networks of TestOverlayGatewayAnswers.
const gatewayNetworksYAML = `kind: Network
meta: {name: jumbo}
spec:
  vni: 400
  mtu: 9000
  subnets:
  - {cidr: 10.40.0.0/24, gateway: 10.40.0.1}
  - {cidr: "fd00:40::/64", gateway: "fd00:40::1"}
---
kind: Network
meta: {name: small}
spec:
  vni: 401
  mtu: 1400
  subnets:
  - {cidr: 10.41.0.0/24, gateway: 10.41.0.1}
  - {cidr: "fd00:41::/64", gateway: "fd00:41::1"}
---
kind: Network
meta: {name: twin, tenant: acme}
spec:
  vni: 402
  subnets:
  - {cidr: 10.40.0.0/24, gateway: 10.40.0.1}
  - {cidr: "fd00:40::/64", gateway: "fd00:40::1"}
---
kind: Network
meta: {name: far, tenant: acme}
spec:
  vni: 403
  subnets:
  - {cidr: 10.43.0.0/24, gateway: 10.43.0.1}
  - {cidr: "fd00:43::/64", gateway: "fd00:43::1"}
---
`

// oneOf tells whether err is one of want.
func oneOf(err error, want []error) bool {
	for _, w := range want {
		if errors.Is(err, w) {
			return true
		}
	}
	return false
}

// dial opens a TCP connection from the workload to addr:port and returns the error of
// the attempt, nil when it connected (the connection is closed again).
func (w *workload) dial(t testing.TB, addr string, port int, wait time.Duration) error {
	t.Helper()
	var c net.Conn
	err := inNetns(t, w.ns, func() error {
		var err error
		c, err = net.DialTimeout("tcp", net.JoinHostPort(addr, strconv.Itoa(port)), wait)
		return err
	})
	if err == nil {
		c.Close()
	}
	return err
}

// send sends size bytes over TCP from the workload to addr:port, closes its side and
// waits for the peer to close, all within wait.
func (w *workload) send(t testing.TB, addr string, port, size int, wait time.Duration) error {
	t.Helper()
	var c net.Conn
	if err := inNetns(t, w.ns, func() error {
		var err error
		c, err = net.DialTimeout("tcp", net.JoinHostPort(addr, strconv.Itoa(port)), wait)
		return err
	}); err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(wait))
	if _, err := c.Write(make([]byte, size)); err != nil {
		return fmt.Errorf("writing: %w", err)
	}
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		return fmt.Errorf("closing the sending side: %w", err)
	}
	if _, err := io.Copy(io.Discard, c); err != nil {
		return fmt.Errorf("waiting for the peer to close: %w", err)
	}
	return nil
}

// byteSink counts the bytes of the first TCP connection to a listener.
type byteSink struct {
	got chan int64
}

// sink listens on port in the workload (network "tcp4" or "tcp6") and counts the bytes
// of the first connection, which it closes once the peer has closed its side.
func (w *workload) sink(t testing.TB, network string, port int) *byteSink {
	t.Helper()
	var l net.Listener
	if err := inNetns(t, w.ns, func() error {
		var err error
		l, err = net.Listen(network, ":"+strconv.Itoa(port))
		return err
	}); err != nil {
		t.Fatalf("listening on %s port %d in %s: %v", network, port, w.name, err)
	}
	s := &byteSink{got: make(chan int64, 1)}
	go func() {
		c, err := l.Accept()
		if err != nil {
			s.got <- -1
			return
		}
		n, _ := io.Copy(io.Discard, c)
		c.Close()
		s.got <- n
	}()
	t.Cleanup(func() { l.Close() })
	return s
}

// wait returns the number of bytes the sink received, -1 when it accepted nothing
// within the deadline.
func (s *byteSink) wait(t testing.TB) int64 {
	t.Helper()
	select {
	case n := <-s.got:
		return n
	case <-time.After(deadline):
		return -1
	}
}
