//go:build linux

package test

import (
	"bytes"
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// fragBytes is the size of the test's UDP datagrams: over the workloads' MTU of 1500, so
// the sender's kernel sends each in fragments.
const fragBytes = 3000

// fragNetworkYAML is the test's network, its groups and policies: fb1 is protected by an
// ingress rule for UDP port 8080, fb2 by one for UDP on every port.
const fragNetworkYAML = `kind: Network
meta: {name: frag}
spec:
  vni: 150
  subnets:
  - {cidr: 10.1.0.0/24, gateway: 10.1.0.1}
  - {cidr: "fd00:1::/64", gateway: "fd00:1::1"}
---
kind: SecurityGroup
meta: {name: by-port}
spec: {}
---
kind: SecurityGroup
meta: {name: any-port}
spec: {}
---
kind: NetworkSecurityPolicy
meta: {name: by-port}
spec:
  attachGroups: [by-port]
  ingress:
  - {action: ACTION_ALLOW, protocol: udp, ports: ["8080"]}
---
kind: NetworkSecurityPolicy
meta: {name: any-port}
spec:
  attachGroups: [any-port]
  ingress:
  - {action: ACTION_ALLOW, protocol: udp}
---
`

// fragEndpointYAML is the Endpoint of the workload on the host in network frag, listing
// the groups.
func fragEndpointYAML(w *workload, h *host, groups ...string) string {
	ips := make([]string, len(w.ips))
	for i, p := range w.ips {
		ips[i] = p.Addr().String()
	}
	return fmt.Sprintf("kind: Endpoint\nmeta: {name: %s}\nspec: {network: frag, node: %s, interface: %s, mac: %q, ips: [%s], securityGroups: [%s]}\n---\n",
		w.name, h.name, w.name, w.mac, strings.Join(ips, ", "), strings.Join(groups, ", "))
}

// udpSink is a UDP socket in a workload that the test reads without blocking.
type udpSink struct {
	what string
	c    *net.UDPConn
}

// listenUDP opens a UDP socket on the port, IPv4 and IPv6, in the workload, closed when
// the test ends.
func listenUDP(t testing.TB, w *workload, port int) *udpSink {
	t.Helper()
	var c *net.UDPConn
	if err := inNetns(t, w.ns, func() error {
		var err error
		c, err = net.ListenUDP("udp", &net.UDPAddr{Port: port})
		return err
	}); err != nil {
		t.Fatalf("listening on UDP port %d in %s: %v", port, w.name, err)
	}
	t.Cleanup(func() { c.Close() })
	return &udpSink{what: fmt.Sprintf("%s:%d", w.name, port), c: c}
}

// drain returns the datagrams queued on the socket, without waiting.
func (s *udpSink) drain(t testing.TB) [][]byte {
	t.Helper()
	raw, err := s.c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var out [][]byte
	for {
		buf := make([]byte, 65536)
		var n int
		var rerr error
		if err := raw.Control(func(fd uintptr) { n, _, rerr = unix.Recvfrom(int(fd), buf, unix.MSG_DONTWAIT) }); err != nil {
			t.Fatal(err)
		}
		if rerr != nil {
			return out
		}
		out = append(out, buf[:n])
	}
}

// sendBig sends one datagram of fragBytes from the workload to addr:port, marked.
func sendBig(t testing.TB, w *workload, addr string, port int, marker string) {
	t.Helper()
	msg := bytes.Repeat([]byte{'.'}, fragBytes)
	copy(msg, marker)
	if err := inNetns(t, w.ns, func() error {
		c, err := net.Dial("udp", net.JoinHostPort(addr, fmt.Sprint(port)))
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write(msg)
		return err
	}); err != nil {
		t.Fatalf("sending %d bytes from %s to %s port %d: %v", fragBytes, w.name, addr, port, err)
	}
}

// wantBig sends datagrams of fragBytes from the workload to the sink's workload at addr
// until one arrives whole, and fails the test after deadline.
func wantBig(t testing.TB, from *workload, s *udpSink, addr string, port int) {
	t.Helper()
	marker := fmt.Sprintf("from %s to [%s]:%d at %d", from.name, addr, port, time.Now().UnixNano())
	end := time.Now().Add(deadline)
	for next := time.Now(); ; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("no %d-byte datagram from %s reached %s at %s within %v", fragBytes, from.name, s.what, addr, deadline)
		}
		if time.Now().After(next) {
			sendBig(t, from, addr, port, marker)
			next = time.Now().Add(250 * time.Millisecond)
		}
		if slices.ContainsFunc(s.drain(t), func(d []byte) bool { return len(d) == fragBytes && bytes.HasPrefix(d, []byte(marker)) }) {
			return
		}
	}
}

// TestFirewallFragmentedDatagrams sends UDP datagrams of 3000 bytes, which the sender's
// kernel fragments, from fa1 to fb1 (ingress allows UDP port 8080) and fb2 (ingress
// allows UDP on any port), all on one host, IPv4 and IPv6: those to allowed ports arrive
// whole; one to fb1's port 9090, sent before one to port 8080 that arrives, does not.
func TestFirewallFragmentedDatagrams(t *testing.T) {
	c := newCluster(t)
	u := newUnderlay(t)
	a := c.addHost(t, "host-a", "host-a")
	vtep := u.attach(t, a)
	a.startAgentWith(t, metricsFlags...)
	src := newWorkload(t, a, "fa1", "02:00:00:00:0f:a1", []string{"10.1.0.51/24", "fd00:1::51/64"}, "10.1.0.1", "fd00:1::1")
	byPort := newWorkload(t, a, "fb1", "02:00:00:00:0f:b1", []string{"10.1.0.61/24", "fd00:1::61/64"}, "10.1.0.1", "fd00:1::1")
	anyPort := newWorkload(t, a, "fb2", "02:00:00:00:0f:b2", []string{"10.1.0.62/24", "fd00:1::62/64"}, "10.1.0.1", "fd00:1::1")
	allowed := listenUDP(t, byPort, 8080)
	denied := listenUDP(t, byPort, 9090)
	open := listenUDP(t, anyPort, 7070)
	c.apply(t, nodeYAML(a, vtep)+fragNetworkYAML+fragEndpointYAML(src, a)+
		fragEndpointYAML(byPort, a, "by-port")+fragEndpointYAML(anyPort, a, "any-port"))
	c.waitProgrammed(t, "networksecuritypolicy", "by-port", a.name, 1)
	c.waitProgrammed(t, "networksecuritypolicy", "any-port", a.name, 1)
	c.waitProgrammed(t, "endpoint", byPort.name, a.name, 1)
	c.waitProgrammed(t, "endpoint", anyPort.name, a.name, 1)

	for _, family := range []int{4, 6} {
		wantBig(t, src, allowed, byPort.ip(family), 8080)
		wantBig(t, src, open, anyPort.ip(family), 7070)
		// A datagram to a denied port, then one to the allowed port behind it on the
		// same path: once the second has arrived, the first would have.
		sendBig(t, src, byPort.ip(family), 9090, fmt.Sprintf("denied IPv%d", family))
		wantBig(t, src, allowed, byPort.ip(family), 8080)
		if got := denied.drain(t); len(got) > 0 {
			t.Errorf("IPv%d: %d datagrams reached %s, which no rule allows", family, len(got), denied.what)
		}
	}
	m := a.telemetry(t).metrics(t)
	if got := m["naples_firewall_fragment_capacity"]; got != 8192 {
		t.Errorf("naples_firewall_fragment_capacity = %v, want 8192", got)
	}
	if got := m["naples_firewall_fragment_untracked_drops_total"]; got != 0 {
		t.Errorf("naples_firewall_fragment_untracked_drops_total = %v, want 0", got)
	}
}
