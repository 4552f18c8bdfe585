package linux

import (
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/naplesnet/naples/internal/testns"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// epInNamespace runs f on a thread in the namespace: sockets it opens stay there.
func epInNamespace(ns netns.NsHandle, f func() error) error { return runInNamespace(&ns, f) }

// TestEndpointTrafficCrossesTheTunnel programs two hosts, each with a workload, and sends
// a UDP datagram from one workload to the other: the sending host's bridge answers the
// workload's ARP request from the remote endpoint's neighbour entry (neigh_suppress), and
// its FDB entries send the frame through the VXLAN tunnel to the other host. No
// broadcast can cross: there are no head-end replication entries.
func TestEndpointTrafficCrossesTheTunnel(t *testing.T) {
	a := newEPHost(t, "naples-host-a", "host-a")
	b := newEPHost(t, "naples-host-b", "host-b")
	a.run(t, "ip", "link", "add", "ul", "type", "veth", "peer", "name", "ul", "netns", b.ns)
	for h, addr := range map[*epHost]string{a: "192.0.2.1/24", b: "192.0.2.2/24"} {
		h.run(t, "ip", "addr", "add", addr, "dev", "ul")
		h.run(t, "ip", "link", "set", "ul", "up")
	}
	network := epNetwork("net1", "100", 0, "10.1.0.0/24")
	netID := network.Key().ID()
	a.networkDevices(t, netID, "100", "192.0.2.1")
	b.networkDevices(t, netID, "100", "192.0.2.2")

	const macA, macB = "02:00:00:00:0a:01", "02:00:00:00:0b:01"
	workload := func(h *epHost, iface, mac, addr string) (string, netns.NsHandle) {
		ns := testns.Named(t, "naples-wl")
		h.run(t, "ip", "link", "add", iface, "type", "veth", "peer", "name", "eth0", "netns", ns)
		for _, args := range [][]string{
			{"link", "set", "eth0", "address", mac},
			{"addr", "add", addr, "dev", "eth0"},
			{"link", "set", "eth0", "up"},
		} {
			testns.Run(t, "ip", append([]string{"-n", ns}, args...)...)
		}
		return ns, testns.Handle(t, ns)
	}
	wa, waHandle := workload(a, "wl-a", macA, "10.1.0.1/24")
	wb, wbHandle := workload(b, "wl-b", macB, "10.1.0.2/24")

	epA := epEndpoint("wa", "net1", "host-a", "wl-a", macA, "10.1.0.1")
	epB := epEndpoint("wb", "net1", "host-b", "wl-b", macB, "10.1.0.2")
	for _, h := range []*epHost{a, b} {
		h.put(t, network, epNode("host-a", "192.0.2.1"), epNode("host-b", "192.0.2.2"), epA, epB)
		for _, ep := range []*nimbusv1.Object{epA, epB} {
			h.reconcile(t, ep.Key())
		}
	}

	var conn net.PacketConn
	if err := epInNamespace(wbHandle, func() (err error) {
		conn, err = net.ListenPacket("udp4", "10.1.0.2:5000")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var sender net.Conn
	if err := epInNamespace(waHandle, func() (err error) {
		sender, err = net.Dial("udp4", "10.1.0.2:5000")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer sender.Close()

	// Send until one datagram arrives: the first may wait for ARP.
	buf := make([]byte, 64)
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, err := sender.Write([]byte("hello")); err != nil {
			t.Fatalf("sending: %v", err)
		}
		if err := conn.SetReadDeadline(time.Now().Add(200 * time.Millisecond)); err != nil {
			t.Fatal(err)
		}
		n, from, err := conn.ReadFrom(buf)
		if err == nil {
			if string(buf[:n]) != "hello" || !strings.HasPrefix(from.String(), "10.1.0.1:") {
				t.Fatalf("received %q from %v, want \"hello\" from 10.1.0.1", buf[:n], from)
			}
			break
		}
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() {
			t.Fatalf("receiving: %v", err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("no datagram crossed the tunnel; host-a fdb:\n%s", a.fdb(t, VXLANName(netID)))
		}
	}

	// The sender learnt the remote MAC from its own host's bridge; the receiver never
	// saw an ARP request (it would have noted the requester as a neighbour).
	if got := testns.Run(t, "ip", "-n", wa, "neigh", "show", "10.1.0.2"); !strings.Contains(got, "lladdr "+macB) {
		t.Errorf("workload a's neighbour 10.1.0.2: %q, want lladdr %s", got, macB)
	}
	if got := testns.Run(t, "ip", "-n", wb, "neigh", "show", "10.1.0.1"); strings.TrimSpace(got) != "" {
		t.Errorf("workload b has a neighbour entry for 10.1.0.1, so an ARP request reached it: %q", got)
	}
}
