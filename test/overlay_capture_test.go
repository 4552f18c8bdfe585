//go:build linux

package test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/naplesnet/naples/internal/testns"
)

// This file watches the overlay from the wire: a capture (an AF_PACKET socket, what
// tcpdump uses) in the underlay's namespace sees every VXLAN packet the hosts exchange,
// and the frames inside them.

// packet is one frame a capture saw.
type packet struct {
	// port is the name of the interface the frame crossed.
	port string
	// out is set when the namespace sent the frame out of port (PACKET_OUTGOING); a frame
	// it received has out unset.
	out bool
	// frame is the Ethernet frame, from the destination MAC on.
	frame []byte
}

// capture records every frame that crosses any interface of a namespace.
type capture struct {
	fd    int
	names map[int]string
	stop  atomic.Bool
	done  chan struct{}
	// mu guards pkts and err.
	mu   sync.Mutex
	pkts []packet
	err  error
}

// newCapture starts capturing every frame that crosses an interface of the namespace that
// exists now, until the test ends.
func newCapture(t testing.TB, ns string) *capture {
	t.Helper()
	c := &capture{names: map[int]string{}, done: make(chan struct{})}
	if err := inNetns(t, ns, func() error {
		ifs, err := net.Interfaces()
		if err != nil {
			return err
		}
		for _, i := range ifs {
			c.names[i.Index] = i.Name
		}
		// The protocol is in network byte order: ETH_P_ALL, every frame.
		c.fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_ALL)))
		if err != nil {
			return fmt.Errorf("opening an AF_PACKET socket: %w", err)
		}
		return nil
	}); err != nil {
		t.Fatalf("capturing in %s: %v", ns, err)
	}
	// A large buffer keeps a burst from being dropped while the reader is slow.
	if err := unix.SetsockoptInt(c.fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 16<<20); err != nil {
		unix.Close(c.fd)
		t.Fatalf("setting SO_RCVBUFFORCE on the capture socket: %v", err)
	}
	// The reader wakes up at least this often to see whether it must stop.
	tv := unix.NsecToTimeval((100 * time.Millisecond).Nanoseconds())
	if err := unix.SetsockoptTimeval(c.fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		unix.Close(c.fd)
		t.Fatalf("setting SO_RCVTIMEO on the capture socket: %v", err)
	}
	go c.read()
	t.Cleanup(func() {
		c.stop.Store(true)
		<-c.done
		unix.Close(c.fd)
	})
	return c
}

// read receives frames until stop is set.
func (c *capture) read() {
	defer close(c.done)
	buf := make([]byte, 1<<16)
	for !c.stop.Load() {
		n, from, err := unix.Recvfrom(c.fd, buf, 0)
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			c.mu.Lock()
			c.err = err
			c.mu.Unlock()
			return
		}
		ll, ok := from.(*unix.SockaddrLinklayer)
		if !ok {
			continue
		}
		name, ok := c.names[ll.Ifindex]
		if !ok {
			name = fmt.Sprintf("if%d", ll.Ifindex)
		}
		c.mu.Lock()
		c.pkts = append(c.pkts, packet{port: name, out: ll.Pkttype == unix.PACKET_OUTGOING, frame: bytes.Clone(buf[:n])})
		c.mu.Unlock()
	}
}

// packets returns the frames captured so far, from the index from on, and fails the test
// if the capture broke.
func (c *capture) packets(t testing.TB, from int) []packet {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		t.Fatalf("capture: %v", c.err)
	}
	return append([]packet(nil), c.pkts[min(from, len(c.pkts)):]...)
}

// count returns how many frames the capture holds: the index packets starts from for
// the frames to come.
func (c *capture) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.pkts)
}

// waitSeen waits until a frame captured from the index from on satisfies match.
func (c *capture) waitSeen(t testing.TB, what string, from int, match func(packet) bool) {
	t.Helper()
	waitFor(t, what, func() bool {
		for _, p := range c.packets(t, from) {
			if match(p) {
				return true
			}
		}
		return false
	})
}

// htons converts a 16-bit value to network byte order.
func htons(v uint16) uint16 { return v<<8 | v>>8 }

// vxlanPacket is a VXLAN packet over IPv4, decoded.
type vxlanPacket struct {
	// src and dst are the outer IPv4 addresses: the sending and receiving VTEPs.
	src, dst netip.Addr
	vni      uint32
	// inner is the Ethernet frame the packet carries.
	inner []byte
}

// Ethernet types of the frames the tests decode.
const (
	etherIPv4 = 0x0800
	etherARP  = 0x0806
	etherIPv6 = 0x86dd
)

// decodeVXLAN decodes an Ethernet frame carrying IPv4, UDP to port 4789 and a VXLAN
// header with a valid VNI.
func decodeVXLAN(frame []byte) (vxlanPacket, bool) {
	if len(frame) < 14+20 || binary.BigEndian.Uint16(frame[12:14]) != etherIPv4 {
		return vxlanPacket{}, false
	}
	ip := frame[14:]
	ihl := int(ip[0]&0x0f) * 4
	// Fragments other than the first, and first fragments that hide the header, are
	// not decoded: the overlay's packets are never fragmented.
	if ip[0]>>4 != 4 || ihl < 20 || len(ip) < ihl+8+8 || ip[9] != unix.IPPROTO_UDP ||
		binary.BigEndian.Uint16(ip[6:8])&0x3fff != 0 {
		return vxlanPacket{}, false
	}
	udp := ip[ihl:]
	if binary.BigEndian.Uint16(udp[2:4]) != 4789 {
		return vxlanPacket{}, false
	}
	vx := udp[8:]
	if vx[0]&0x08 == 0 {
		return vxlanPacket{}, false
	}
	return vxlanPacket{
		src:   netip.AddrFrom4([4]byte(ip[12:16])),
		dst:   netip.AddrFrom4([4]byte(ip[16:20])),
		vni:   binary.BigEndian.Uint32(vx[4:8]) >> 8,
		inner: vx[8:],
	}, true
}

// arpRequestTarget returns the address an Ethernet frame holding an ARP request asks
// for.
func arpRequestTarget(frame []byte) (netip.Addr, bool) {
	if len(frame) < 14+28 || binary.BigEndian.Uint16(frame[12:14]) != etherARP {
		return netip.Addr{}, false
	}
	arp := frame[14:]
	// Ethernet and IPv4 addresses, operation 1: a request.
	if binary.BigEndian.Uint16(arp[0:2]) != 1 || binary.BigEndian.Uint16(arp[2:4]) != etherIPv4 ||
		arp[4] != 6 || arp[5] != 4 || binary.BigEndian.Uint16(arp[6:8]) != 1 {
		return netip.Addr{}, false
	}
	return netip.AddrFrom4([4]byte(arp[24:28])), true
}

// solicitationTarget returns the address an Ethernet frame holding an ICMPv6 neighbour
// solicitation asks for.
func solicitationTarget(frame []byte) (netip.Addr, bool) {
	// Neighbour solicitations carry no extension headers: ICMPv6 follows IPv6.
	if len(frame) < 14+40+24 || binary.BigEndian.Uint16(frame[12:14]) != etherIPv6 {
		return netip.Addr{}, false
	}
	ip := frame[14:]
	if ip[6] != unix.IPPROTO_ICMPV6 || ip[40] != 135 {
		return netip.Addr{}, false
	}
	return netip.AddrFrom16([16]byte(ip[48:64])), true
}

// udpPayload returns the payload of an Ethernet frame holding UDP over IPv4 or IPv6
// (without extension headers).
func udpPayload(frame []byte) ([]byte, bool) {
	if len(frame) < 14 {
		return nil, false
	}
	var l4 []byte
	switch binary.BigEndian.Uint16(frame[12:14]) {
	case etherIPv4:
		ip := frame[14:]
		if len(ip) < 20 || ip[9] != unix.IPPROTO_UDP {
			return nil, false
		}
		l4 = ip[int(ip[0]&0x0f)*4:]
	case etherIPv6:
		ip := frame[14:]
		if len(ip) < 40 || ip[6] != unix.IPPROTO_UDP {
			return nil, false
		}
		l4 = ip[40:]
	default:
		return nil, false
	}
	if len(l4) < 8 {
		return nil, false
	}
	return l4[8:], true
}

// sendUDP sends one UDP datagram from the workload's eth0 to addr:port. A broadcast
// address is allowed.
func (w *workload) sendUDP(t testing.TB, addr string, port int, payload []byte) {
	t.Helper()
	if err := inNetns(t, w.ns, func() error {
		dst, err := netip.ParseAddr(addr)
		if err != nil {
			return err
		}
		network := "udp4"
		if dst.Is6() {
			network = "udp6"
		}
		// Go sets SO_BROADCAST on UDP sockets; binding to eth0 lets a broadcast to
		// 255.255.255.255 leave through it.
		conn, err := net.ListenUDP(network, nil)
		if err != nil {
			return err
		}
		defer conn.Close()
		raw, err := conn.SyscallConn()
		if err != nil {
			return err
		}
		var serr error
		if err := raw.Control(func(fd uintptr) { serr = unix.BindToDevice(int(fd), "eth0") }); err != nil {
			return err
		}
		if serr != nil {
			return fmt.Errorf("binding to eth0: %w", serr)
		}
		_, err = conn.WriteToUDPAddrPort(payload, netip.AddrPortFrom(dst, uint16(port)))
		return err
	}); err != nil {
		t.Fatalf("sending UDP from %s to %s:%d: %v", w.name, addr, port, err)
	}
}

// flushNeighbours empties the workload's neighbour caches, IPv4 and IPv6.
func (w *workload) flushNeighbours(t testing.TB) {
	t.Helper()
	for _, family := range []string{"-4", "-6"} {
		testns.Run(t, "ip", family, "-n", w.ns, "neigh", "flush", "all")
	}
}

// overlayBarrier sends a unicast UDP datagram from one workload to another and waits
// until the underlay's capture has seen it leave the sender's host (on port, the
// sender's uplink on the underlay). Frames that host sent before then are captured by
// then too: one capture socket receives the frames of every port in the order the
// underlay handled them.
func overlayBarrier(t testing.TB, uc *capture, from int, sender *workload, port string, to string) {
	t.Helper()
	marker := fmt.Appendf(nil, "barrier from %s at %d", sender.name, time.Now().UnixNano())
	sender.sendUDP(t, to, 9, marker)
	uc.waitSeen(t, "the underlay to carry the barrier from "+sender.name, from, func(p packet) bool {
		vx, ok := decodeVXLAN(p.frame)
		if !ok || p.port != port || p.out {
			return false
		}
		payload, ok := udpPayload(vx.inner)
		return ok && bytes.Equal(payload, marker)
	})
}

// TestOverlayCapture watches the underlay between three hosts. Blue has workloads on
// host-a and host-b, green one on host-c. (a) With their neighbour caches flushed, blue's
// workloads exchange IPv4 and IPv6 traffic: each resolves the other's address (the
// workload's own capture sees it ask), yet no ARP request or neighbour solicitation for
// an endpoint's address crosses the underlay inside VXLAN, since the bridges answer them
// locally. (b) A broadcast in blue, and an ARP request for an address no endpoint has,
// go from host-a to host-b's VTEP only: host-c, which has no endpoint in blue, gets
// nothing of blue.
func TestOverlayCapture(t *testing.T) {
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
	greenC := newWorkload(t, hc, "wgreen-c", "02:00:00:00:02:0c", []string{"10.2.0.12/24"}, "10.2.0.1")
	for _, w := range []*workload{blueA, blueB, greenC} {
		w.serve(t)
	}
	c.apply(t, nodeYAML(a, vtepA)+nodeYAML(b, vtepB)+nodeYAML(hc, vtepC)+overlayNetworksYAML+
		blueA.endpointYAML("default", "blue", a)+blueB.endpointYAML("default", "blue", b)+
		greenC.endpointYAML("default", "green", hc))
	blueA.wantReach(t, blueB.ip(4))
	blueA.wantReach(t, blueB.ip(6))
	greenC.wantReach(t, blueA.ip(4))
	const blueVNI = 100
	endpointIPs := map[netip.Addr]bool{}
	for _, w := range []*workload{blueA, blueB, greenC} {
		for _, p := range w.ips {
			endpointIPs[p.Addr()] = true
		}
	}

	uc := newCapture(t, u.ns)
	wc := newCapture(t, blueA.ns)

	t.Run("neighbour suppression", func(t *testing.T) {
		start, wcStart := uc.count(), wc.count()
		blueA.flushNeighbours(t)
		blueB.flushNeighbours(t)
		for _, x := range []struct{ proto, addr string }{
			{"udp", blueB.ip(4)}, {"tcp", blueB.ip(4)}, {"udp", blueB.ip(6)}, {"tcp", blueB.ip(6)},
		} {
			if !blueA.exchange(t, x.proto, x.addr, 5*time.Second) {
				t.Fatalf("%s exchange from %s to %s after flushing the neighbour caches failed", x.proto, blueA.name, x.addr)
			}
		}
		overlayBarrier(t, uc, start, blueA, "up1", blueB.ip(4))
		// blueB's side: it answered, so it resolved blueA's addresses; the barrier from it
		// shows that everything host-b sent before is captured.
		overlayBarrier(t, uc, start, blueB, "up2", blueA.ip(4))

		// The workload had to resolve its peer's addresses, and was answered. Its capture
		// reads on its own, so it is waited for.
		wc.waitSeen(t, blueA.name+" to send an ARP request for "+blueB.ip(4), wcStart, func(p packet) bool {
			ip, ok := arpRequestTarget(p.frame)
			return ok && p.out && p.port == "eth0" && ip.String() == blueB.ip(4)
		})
		wc.waitSeen(t, blueA.name+" to send a neighbour solicitation for "+blueB.ip(6), wcStart, func(p packet) bool {
			ip, ok := solicitationTarget(p.frame)
			return ok && p.out && p.port == "eth0" && ip.String() == blueB.ip(6)
		})
		for _, ip := range []string{blueB.ip(4), blueB.ip(6)} {
			if got := testns.Run(t, "ip", "-n", blueA.ns, "neigh", "show", ip); !strings.Contains(got, "lladdr "+blueB.mac) {
				t.Errorf("%s's neighbour entry for %s is %q; want lladdr %s", blueA.name, ip, got, blueB.mac)
			}
		}

		var tunnelled, resolutions int
		for _, p := range uc.packets(t, start) {
			vx, ok := decodeVXLAN(p.frame)
			if !ok {
				continue
			}
			tunnelled++
			if ip, ok := arpRequestTarget(vx.inner); ok && endpointIPs[ip] {
				resolutions++
				t.Errorf("ARP request for endpoint address %s crossed the underlay on %s (out %v) from %s to %s", ip, p.port, p.out, vx.src, vx.dst)
			}
			if ip, ok := solicitationTarget(vx.inner); ok && endpointIPs[ip] {
				resolutions++
				t.Errorf("neighbour solicitation for endpoint address %s crossed the underlay on %s (out %v) from %s to %s", ip, p.port, p.out, vx.src, vx.dst)
			}
		}
		t.Logf("the underlay carried %d VXLAN frames (counted on each port they crossed), %d of them resolving an endpoint's address", tunnelled, resolutions)
	})

	t.Run("broadcast", func(t *testing.T) {
		start := uc.count()
		marker := fmt.Appendf(nil, "broadcast from %s at %d", blueA.name, time.Now().UnixNano())
		blueA.sendUDP(t, "255.255.255.255", 9, marker)
		const unknown = "10.1.0.99"
		// No endpoint has this address: the bridge cannot answer, and the request floods.
		blueA.sendUDP(t, unknown, 9, []byte("to nobody"))
		isBroadcast := func(vx vxlanPacket) bool {
			payload, ok := udpPayload(vx.inner)
			return ok && bytes.Equal(payload, marker)
		}
		isUnknownARP := func(vx vxlanPacket) bool {
			ip, ok := arpRequestTarget(vx.inner)
			return ok && ip.String() == unknown
		}
		for _, x := range []struct {
			what  string
			match func(vxlanPacket) bool
		}{{"the broadcast", isBroadcast}, {"the ARP request for " + unknown, isUnknownARP}} {
			uc.waitSeen(t, x.what+" to reach host-b's VTEP", start, func(p packet) bool {
				vx, ok := decodeVXLAN(p.frame)
				return ok && p.port == "up2" && p.out && vx.dst.String() == vtepB && vx.vni == blueVNI && x.match(vx)
			})
		}
		overlayBarrier(t, uc, start, blueA, "up1", blueB.ip(4))

		perVTEP := map[string]int{}
		for _, p := range uc.packets(t, start) {
			vx, ok := decodeVXLAN(p.frame)
			// Each frame host-a sends is counted once, as it enters the underlay.
			if !ok || p.port != "up1" || p.out || vx.vni != blueVNI || (!isBroadcast(vx) && !isUnknownARP(vx)) {
				continue
			}
			perVTEP[vx.dst.String()]++
		}
		t.Logf("host-a flooded blue's broadcasts to VTEPs %v", perVTEP)
		if perVTEP[vtepB] == 0 {
			t.Errorf("host-a sent no copy of blue's broadcasts to host-b's VTEP %s: %v", vtepB, perVTEP)
		}
		for vtep, n := range perVTEP {
			if vtep != vtepB {
				t.Errorf("host-a sent %d copies of blue's broadcasts to VTEP %s; want only host-b's %s, the one node with an endpoint in blue", n, vtep, vtepB)
			}
		}
		// Nothing of blue reaches host-c: no packet is addressed to its VTEP, and none
		// leaves the underlay through its port (the underlay's bridge has learnt where
		// host-b is, so it floods nothing to host-c either).
		for _, p := range uc.packets(t, start) {
			vx, ok := decodeVXLAN(p.frame)
			if !ok || vx.vni != blueVNI {
				continue
			}
			if vx.dst.String() == vtepC || (p.port == "up3" && p.out) {
				t.Errorf("a packet of blue (VNI %d) from %s to %s went towards host-c (%s, port %s, out %v)", blueVNI, vx.src, vx.dst, vtepC, p.port, p.out)
			}
		}
	})
}
