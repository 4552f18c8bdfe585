package test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/netip"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/naplesnet/naples/internal/testns"
)

// This file builds overlays end to end: hosts joined by an underlay, agents programming
// networks and endpoints from nimbus, and workloads in namespaces of their own sending
// real traffic to each other.

// underlay is a namespace with a bridge that joins the hosts' uplinks, the physical
// network between them.
type underlay struct {
	ns string
	// next is the host number the next uplink gets: its VTEP address is 192.168.100.next.
	next int
}

// newUnderlay makes the underlay's namespace and bridge.
func newUnderlay(t testing.TB) *underlay {
	t.Helper()
	ns := testns.Named(t, "naples-underlay")
	testns.Run(t, "ip", "-n", ns, "link", "add", "fabric", "type", "bridge")
	testns.Run(t, "ip", "-n", ns, "link", "set", "fabric", "up")
	return &underlay{ns: ns, next: 1}
}

// attach gives the host an uplink on the underlay, named uplink in the host with the
// host's VTEP address, and returns that address.
func (u *underlay) attach(t testing.TB, h *host) string {
	t.Helper()
	vtep := fmt.Sprintf("192.168.100.%d", u.next)
	port := fmt.Sprintf("up%d", u.next)
	u.next++
	testns.Run(t, "ip", "-n", u.ns, "link", "add", port, "type", "veth", "peer", "name", "uplink", "netns", h.ns)
	testns.Run(t, "ip", "-n", u.ns, "link", "set", port, "master", "fabric", "up")
	testns.Run(t, "ip", "-n", h.ns, "addr", "add", vtep+"/24", "dev", "uplink")
	testns.Run(t, "ip", "-n", h.ns, "link", "set", "uplink", "up")
	return vtep
}

// workload is a namespace standing for a VM or container: one interface, eth0, whose
// peer in the host (the endpoint's host-side interface) carries the workload's name.
type workload struct {
	name string
	ns   string
	mac  string
	ips  []netip.Prefix
}

// workloadMTU is the MTU of a workload's eth0: as a runtime gives it, the MTU of a network
// without spec.mtu over the hosts' 1500-byte links, less VXLAN's 50 bytes over IPv4, which
// the agent gives the host-side interface.
const workloadMTU = "1450"

// newWorkload makes a workload on the host with the MAC and addresses (CIDR form), and a
// default route per family through the gateways given (IPv4 and/or IPv6). Its eth0 has
// workloadMTU.
func newWorkload(t testing.TB, h *host, name, mac string, addrs []string, gateways ...string) *workload {
	t.Helper()
	ns := testns.Named(t, "naples-wl")
	testns.Run(t, "ip", "-n", h.ns, "link", "add", name, "type", "veth", "peer", "name", "eth0", "mtu", workloadMTU, "netns", ns)
	testns.Run(t, "ip", "-n", ns, "link", "set", "lo", "up")
	testns.Run(t, "ip", "-n", ns, "link", "set", "eth0", "address", mac)
	w := &workload{name: name, ns: ns, mac: mac}
	for _, a := range addrs {
		p := netip.MustParsePrefix(a)
		w.ips = append(w.ips, p)
		args := []string{"-n", ns, "addr", "add", a, "dev", "eth0"}
		if p.Addr().Is6() {
			args = append(args, "nodad")
		}
		testns.Run(t, "ip", args...)
	}
	testns.Run(t, "ip", "-n", ns, "link", "set", "eth0", "up")
	for _, gw := range gateways {
		family := "-4"
		if netip.MustParseAddr(gw).Is6() {
			family = "-6"
		}
		testns.Run(t, "ip", family, "-n", ns, "route", "add", "default", "via", gw)
	}
	return w
}

// ip returns the workload's address of the family (4 or 6).
func (w *workload) ip(family int) string {
	for _, p := range w.ips {
		if (family == 6) == p.Addr().Is6() {
			return p.Addr().String()
		}
	}
	panic(fmt.Sprintf("workload %s has no IPv%d address", w.name, family))
}

// endpointYAML is the Endpoint object of the workload on the host, in the network.
func (w *workload) endpointYAML(tenant, network string, h *host) string {
	var ips []string
	for _, p := range w.ips {
		ips = append(ips, p.Addr().String())
	}
	return fmt.Sprintf(`kind: Endpoint
meta: {name: %s, tenant: %s}
spec:
  network: %s
  node: %s
  interface: %s
  mac: "%s"
  ips: [%s]
---
`, w.name, tenant, network, h.name, w.name, w.mac, strings.Join(ips, ", "))
}

// inNetns runs f on an OS thread in the named namespace; sockets f opens stay there.
// It opens the namespace for the call only, so that calling it in a loop leaks nothing.
func inNetns(t testing.TB, ns string, f func() error) error {
	t.Helper()
	target, err := netns.GetFromName(ns)
	if err != nil {
		return fmt.Errorf("opening namespace %s: %w", ns, err)
	}
	defer target.Close()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// The thread is left locked and so dies with the goroutine: its namespace changed.
		if err := netns.Set(target); err != nil {
			errc <- fmt.Errorf("entering namespace %s: %w", ns, err)
			return
		}
		errc <- f()
	}()
	return <-errc
}

// server is an echo server in a workload: UDP and TCP on port 7, IPv4 and IPv6.
type server struct {
	udp net.PacketConn
	tcp net.Listener
	wg  sync.WaitGroup
}

// serve starts the workload's echo server, stopped when the test ends.
func (w *workload) serve(t testing.TB) {
	t.Helper()
	s := &server{}
	if err := inNetns(t, w.ns, func() error {
		var err error
		if s.udp, err = net.ListenPacket("udp", ":7"); err != nil {
			return err
		}
		s.tcp, err = net.Listen("tcp", ":7")
		return err
	}); err != nil {
		t.Fatalf("echo server in %s: %v", w.name, err)
	}
	s.wg.Go(func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := s.udp.ReadFrom(buf)
			if err != nil {
				return
			}
			s.udp.WriteTo(buf[:n], from)
		}
	})
	s.wg.Go(func() {
		for {
			c, err := s.tcp.Accept()
			if err != nil {
				return
			}
			s.wg.Go(func() {
				defer c.Close()
				c.SetDeadline(time.Now().Add(5 * time.Second))
				io.Copy(c, c)
			})
		}
	})
	t.Cleanup(func() {
		s.udp.Close()
		s.tcp.Close()
		s.wg.Wait()
	})
}

// exchange sends one message from the workload to addr port 7 over proto ("udp" or
// "tcp") and reports whether the echo came back within wait.
func (w *workload) exchange(t testing.TB, proto, addr string, wait time.Duration) bool {
	t.Helper()
	msg := []byte(fmt.Sprintf("%s from %s to %s at %d", proto, w.name, addr, time.Now().UnixNano()))
	var c net.Conn
	if err := inNetns(t, w.ns, func() error {
		var err error
		c, err = net.DialTimeout(proto, net.JoinHostPort(addr, "7"), wait)
		return err
	}); err != nil {
		return false
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(wait))
	if _, err := c.Write(msg); err != nil {
		return false
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil {
		return false
	}
	return bytes.Equal(got, msg)
}

// wantReach waits until the workload's UDP and TCP echoes to addr come back.
func (w *workload) wantReach(t testing.TB, addr string) {
	t.Helper()
	for _, proto := range []string{"udp", "tcp"} {
		waitFor(t, fmt.Sprintf("%s to reach %s over %s", w.name, addr, proto), func() bool {
			return w.exchange(t, proto, addr, 500*time.Millisecond)
		})
	}
}

// wantNoReach fails the test if any of a few UDP or TCP exchanges from the workload to
// addr succeeds. Call it once traffic that should pass has passed, so that the overlay has
// converged.
func (w *workload) wantNoReach(t testing.TB, addr string) {
	t.Helper()
	for range 3 {
		for _, proto := range []string{"udp", "tcp"} {
			if w.exchange(t, proto, addr, 300*time.Millisecond) {
				t.Errorf("%s reached %s over %s; want no path", w.name, addr, proto)
				return
			}
		}
	}
}

// nodeYAML is the Node object of a host with its VTEP address.
func nodeYAML(h *host, vtep string) string {
	return fmt.Sprintf("kind: Node\nmeta: {name: %s}\nspec: {hostname: %s, vtepAddress: %s}\n---\n", h.name, h.name, vtep)
}

// TestOverlayAcrossHosts runs three networks on three hosts: blue (dual-stack, a workload
// on every host) and green (a workload on host-b) in one tenant, red (a workload on
// host-a) in another. Workloads of blue reach each other across hosts over UDP and TCP,
// IPv4 and IPv6; blue and green route to each other through their gateways; red reaches
// neither. Then every object is deleted and nothing of naples's is left in any host.
func TestOverlayAcrossHosts(t *testing.T) {
	c := newCluster(t)
	u := newUnderlay(t)
	a := c.addHost(t, "host-a", "host-a")
	b := c.addHost(t, "host-b", "host-b")
	hc := c.addHost(t, "host-c", "host-c")
	vtepA, vtepB, vtepC := u.attach(t, a), u.attach(t, b), u.attach(t, hc)
	for _, h := range []*host{a, b, hc} {
		h.startAgent(t)
	}

	blueA := newWorkload(t, a, "wblue-a", "02:00:00:00:01:0a", []string{"10.1.0.10/24", "fd00:1::a/64"}, "10.1.0.1", "fd00:1::1")
	blueB := newWorkload(t, b, "wblue-b", "02:00:00:00:01:0b", []string{"10.1.0.11/24", "fd00:1::b/64"}, "10.1.0.1", "fd00:1::1")
	blueC := newWorkload(t, hc, "wblue-c", "02:00:00:00:01:0c", []string{"10.1.0.12/24", "fd00:1::c/64"}, "10.1.0.1", "fd00:1::1")
	greenB := newWorkload(t, b, "wgreen-b", "02:00:00:00:02:0b", []string{"10.2.0.11/24"}, "10.2.0.1")
	redA := newWorkload(t, a, "wred-a", "02:00:00:00:03:0a", []string{"10.3.0.10/24"}, "10.3.0.1")
	for _, w := range []*workload{blueA, blueB, blueC, greenB, redA} {
		w.serve(t)
	}

	manifest := nodeYAML(a, vtepA) + nodeYAML(b, vtepB) + nodeYAML(hc, vtepC) + overlayNetworksYAML +
		blueA.endpointYAML("default", "blue", a) + blueB.endpointYAML("default", "blue", b) +
		blueC.endpointYAML("default", "blue", hc) + greenB.endpointYAML("default", "green", b) +
		redA.endpointYAML("acme", "red", a)
	c.apply(t, manifest)

	blueA.wantReach(t, blueB.ip(4))
	blueA.wantReach(t, blueB.ip(6))
	blueB.wantReach(t, blueA.ip(6))
	blueC.wantReach(t, blueA.ip(4))
	blueC.wantReach(t, blueB.ip(6))
	blueB.wantReach(t, blueC.ip(4))
	blueA.wantReach(t, greenB.ip(4))
	greenB.wantReach(t, blueA.ip(4))
	greenB.wantReach(t, blueC.ip(4))
	redA.wantNoReach(t, blueA.ip(4))
	redA.wantNoReach(t, greenB.ip(4))
	blueA.wantNoReach(t, redA.ip(4))
	greenB.wantNoReach(t, redA.ip(4))
	blueC.wantNoReach(t, redA.ip(4))

	// Without spec.mtu a network's devices, and the workload's host-side interface, have
	// the underlay's MTU (the 1500-byte uplink) less VXLAN's 50 bytes over IPv4.
	st := c.waitProgrammed(t, "network", "blue", a.name, 1)
	if op := st.GetOperational(); op["mtu"] != "1450" || op["underlay"] != "uplink mtu 1500 carries at most 1450 with VXLAN over IPv4" {
		t.Errorf("network blue on %s: operational mtu %q, underlay %q; want 1450 from uplink", a.name, op["mtu"], op["underlay"])
	}
	br, vx := a.networkDevices(t, "default", "blue")
	for _, dev := range []string{br, vx, blueA.name} {
		waitFor(t, dev+" on "+a.name+" to have mtu 1450", func() bool {
			return strings.Contains(testns.Run(t, "ip", "-n", a.ns, "-o", "link", "show", dev), " mtu 1450 ")
		})
	}

	c.mustCtl(t, manifest, "delete", "-f", "-")
	for _, h := range []*host{a, b, hc} {
		waitFor(t, h.name+" to hold nothing of naples's", func() bool {
			links := testns.Run(t, "ip", "-n", h.ns, "-d", "link", "show")
			rules := testns.Run(t, "ip", "-n", h.ns, "rule", "show") + testns.Run(t, "ip", "-n", h.ns, "-6", "rule", "show")
			return !strings.Contains(links, "naples:") && !strings.Contains(links, "master nbr") &&
				!strings.Contains(rules, "iif nbr")
		})
	}
}

// overlayNetworksYAML holds the networks of the overlay tests: blue (VNI 100, dual-stack)
// and green (VNI 200) in the default tenant, red (VNI 300) in tenant acme.
const overlayNetworksYAML = `kind: Network
meta: {name: blue}
spec:
  vni: 100
  subnets:
  - {cidr: 10.1.0.0/24, gateway: 10.1.0.1}
  - {cidr: "fd00:1::/64", gateway: "fd00:1::1"}
---
kind: Network
meta: {name: green}
spec: {vni: 200, subnet: 10.2.0.0/24, gateway: 10.2.0.1}
---
kind: Network
meta: {name: red, tenant: acme}
spec: {vni: 300, subnet: 10.3.0.0/24, gateway: 10.3.0.1}
---
`

// TestOverlayEndpointMove moves a workload from host-b to host-c: its interface on
// host-b is deleted, a workload with the same MAC and addresses comes up on host-c, and
// its Endpoint is applied again with node host-c. The workload on host-a then reaches it
// again, through the tunnel to host-c.
func TestOverlayEndpointMove(t *testing.T) {
	c := newCluster(t)
	u := newUnderlay(t)
	a := c.addHost(t, "host-a", "host-a")
	b := c.addHost(t, "host-b", "host-b")
	hc := c.addHost(t, "host-c", "host-c")
	vtepA, vtepB, vtepC := u.attach(t, a), u.attach(t, b), u.attach(t, hc)
	for _, h := range []*host{a, b, hc} {
		h.startAgent(t)
	}
	const mac = "02:00:00:00:01:0b"
	addrs := []string{"10.1.0.11/24", "fd00:1::b/64"}
	blueA := newWorkload(t, a, "wblue-a", "02:00:00:00:01:0a", []string{"10.1.0.10/24", "fd00:1::a/64"}, "10.1.0.1", "fd00:1::1")
	mover := newWorkload(t, b, "wmover", mac, addrs, "10.1.0.1", "fd00:1::1")
	blueA.serve(t)
	mover.serve(t)
	c.apply(t, nodeYAML(a, vtepA)+nodeYAML(b, vtepB)+nodeYAML(hc, vtepC)+overlayNetworksYAML+
		blueA.endpointYAML("default", "blue", a)+mover.endpointYAML("default", "blue", b))
	blueA.wantReach(t, mover.ip(4))
	blueA.wantReach(t, mover.ip(6))

	// The workload goes from host-b: deleting its host-side interface deletes its eth0.
	// It comes back on host-c with the same MAC and addresses.
	testns.Run(t, "ip", "-n", b.ns, "link", "del", mover.name)
	moved := newWorkload(t, hc, mover.name, mac, addrs, "10.1.0.1", "fd00:1::1")
	moved.serve(t)
	// The echoes start before the apply does: naplesctl, built with the race detector,
	// sleeps 1 s as it exits (GORACE's atexit_sleep_ms), and the move may be done by then.
	start := time.Now()
	first := make(chan time.Duration, 1)
	go func() { first <- untilExchange(t, blueA, "udp", moved.ip(4), start) }()
	c.apply(t, moved.endpointYAML("default", "blue", hc))
	applied := time.Since(start)
	took := <-first
	if took < 0 {
		t.Fatalf("no UDP echo from %s to the moved workload within %v", blueA.name, deadline)
	}
	t.Logf("endpoint moved to host-c: first UDP echo from host-a %v after the apply started (naplesctl apply returned after %v)",
		took.Round(time.Millisecond), applied.Round(time.Millisecond))

	blueA.wantReach(t, moved.ip(4))
	blueA.wantReach(t, moved.ip(6))
	moved.wantReach(t, blueA.ip(4))
	c.waitProgrammed(t, "endpoint", mover.name, "host-c", 2)
	for _, h := range []*host{a, b} {
		_, vx := h.networkDevices(t, "default", "blue")
		waitFor(t, fmt.Sprintf("%s to forward %s to host-c's VTEP %s", h.name, mac, vtepC), func() bool {
			fdb := testns.Run(t, "bridge", "-n", h.ns, "fdb", "show", "dev", vx)
			return strings.Contains(fdb, mac+" dst "+vtepC+" ") && !strings.Contains(fdb, mac+" dst "+vtepB+" ")
		})
	}
}

// firstExchange sends UDP or TCP echoes from the workload to addr, one after the other,
// until one comes back, and returns the time from start to that echo's return. It fails
// the test when none comes back within the deadline.
func firstExchange(t testing.TB, w *workload, proto, addr string, start time.Time) time.Duration {
	t.Helper()
	took := untilExchange(t, w, proto, addr, start)
	if took < 0 {
		t.Fatalf("no %s echo from %s to %s within %v", proto, w.name, addr, deadline)
	}
	return took
}

// untilExchange is firstExchange for any goroutine: it returns -1 instead of failing
// the test when no echo comes back within the deadline.
func untilExchange(t testing.TB, w *workload, proto, addr string, start time.Time) time.Duration {
	for time.Since(start) < deadline {
		if w.exchange(t, proto, addr, 50*time.Millisecond) {
			return time.Since(start)
		}
	}
	return -1
}

// networkDevices waits until the host holds the bridge and the VXLAN device the agent
// made for the network of the tenant, the links whose alias names the network
// ("naples:Network/TENANT/default/NAME"), and returns their names.
func (h *host) networkDevices(t testing.TB, tenant, network string) (bridge, vxlan string) {
	t.Helper()
	alias := fmt.Sprintf("naples:Network/%s/default/%s", tenant, network)
	waitFor(t, fmt.Sprintf("%s to hold the devices of network %s/%s", h.name, tenant, network), func() bool {
		bridge, vxlan = "", ""
		var links []struct {
			Name     string `json:"ifname"`
			Alias    string `json:"ifalias"`
			LinkInfo struct {
				Kind string `json:"info_kind"`
			} `json:"linkinfo"`
		}
		out := testns.Run(t, "ip", "-n", h.ns, "-j", "-d", "link", "show")
		if err := json.Unmarshal([]byte(out), &links); err != nil {
			t.Fatalf("parsing ip -j -d link show: %v\n%s", err, out)
		}
		for _, l := range links {
			if l.Alias != alias {
				continue
			}
			switch l.LinkInfo.Kind {
			case "bridge":
				bridge = l.Name
			case "vxlan":
				vxlan = l.Name
			}
		}
		return bridge != "" && vxlan != ""
	})
	return bridge, vxlan
}
