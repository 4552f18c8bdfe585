//go:build linux

package test

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/naplesnet/naples/internal/testns"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// This file sends frames a hostile workload would send, from inside its namespace, and
// checks that the overlay does not believe them: no bridge entry moves to the
// workload's port, and nothing it sends from an address that is not its own reaches
// anyone.

// sendFrames sends the Ethernet frames, whole, out of the workload's eth0 through an
// AF_PACKET socket, as a workload crafting its own frames would.
func (w *workload) sendFrames(t testing.TB, frames ...[]byte) {
	t.Helper()
	if err := inNetns(t, w.ns, func() error {
		ifi, err := net.InterfaceByName("eth0")
		if err != nil {
			return err
		}
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("opening an AF_PACKET socket: %w", err)
		}
		defer unix.Close(fd)
		to := &unix.SockaddrLinklayer{Ifindex: ifi.Index, Halen: 6}
		for _, f := range frames {
			copy(to.Addr[:], f[:6])
			if err := unix.Sendto(fd, f, 0, to); err != nil {
				return fmt.Errorf("sending a frame: %w", err)
			}
		}
		return nil
	}); err != nil {
		t.Fatalf("sending frames from %s: %v", w.name, err)
	}
}

// mustMAC parses a MAC address.
func mustMAC(s string) []byte {
	hw, err := net.ParseMAC(s)
	if err != nil {
		panic(err)
	}
	return hw
}

// ethFrame returns an Ethernet frame from src to dst of the EtherType.
func ethFrame(dst, src []byte, etherType uint16, payload []byte) []byte {
	b := append(append([]byte{}, dst...), src...)
	b = binary.BigEndian.AppendUint16(b, etherType)
	return append(b, payload...)
}

// udpFrame returns an Ethernet frame from the MAC src to dst holding a UDP datagram from
// the address from to the address to, port 9, with the payload; IPv4 or IPv6 by the
// family of from.
func udpFrame(dst, src []byte, from, to netip.Addr, payload []byte) []byte {
	udp := make([]byte, 8, 8+len(payload))
	binary.BigEndian.PutUint16(udp[0:], 40000)
	binary.BigEndian.PutUint16(udp[2:], 9)
	binary.BigEndian.PutUint16(udp[4:], uint16(8+len(payload)))
	udp = append(udp, payload...)
	if from.Is4() {
		ip := make([]byte, 20)
		ip[0], ip[8], ip[9] = 0x45, 64, unix.IPPROTO_UDP
		binary.BigEndian.PutUint16(ip[2:], uint16(20+len(udp)))
		s, d := from.As4(), to.As4()
		copy(ip[12:], s[:])
		copy(ip[16:], d[:])
		binary.BigEndian.PutUint16(ip[10:], internetChecksum(ip))
		return ethFrame(dst, src, etherIPv4, append(ip, udp...))
	}
	return ethFrame(dst, src, etherIPv6, append(ipv6Header(from, to, unix.IPPROTO_UDP, len(udp)), udp...))
}

// ipv6Header returns an IPv6 header from one address to another, of the next header and
// payload length, hop limit 255.
func ipv6Header(from, to netip.Addr, next uint8, length int) []byte {
	ip := make([]byte, 40)
	ip[0], ip[6], ip[7] = 0x60, next, 255
	binary.BigEndian.PutUint16(ip[4:], uint16(length))
	s, d := from.As16(), to.As16()
	copy(ip[8:], s[:])
	copy(ip[24:], d[:])
	return ip
}

// arpRequestFrame returns a broadcast ARP request from the MAC src, whose sender is
// (sha, spa), for tpa; the payload is padded with the marker.
func arpRequestFrame(src, sha []byte, spa, tpa netip.Addr, marker []byte) []byte {
	arp := binary.BigEndian.AppendUint16(nil, 1)
	arp = binary.BigEndian.AppendUint16(arp, etherIPv4)
	arp = append(arp, 6, 4, 0, 1)
	arp = append(arp, sha...)
	s, d := spa.As4(), tpa.As4()
	arp = append(arp, s[:]...)
	arp = append(arp, 0, 0, 0, 0, 0, 0)
	arp = append(arp, d[:]...)
	return ethFrame(mustMAC("ff:ff:ff:ff:ff:ff"), src, etherARP, append(arp, marker...))
}

// advertisementFrame returns an unsolicited neighbour advertisement to ff02::1 from the
// MAC src and the address from, for the target, with a target link-layer address option
// of src; the marker follows the option.
func advertisementFrame(src []byte, from, target netip.Addr, marker []byte) []byte {
	body := []byte{136, 0, 0, 0, 0x20, 0, 0, 0} // override
	t := target.As16()
	body = append(body, t[:]...)
	body = append(append(body, 2, 1), src...)
	body = append(body, marker...)
	all := netip.MustParseAddr("ff02::1")
	ip := ipv6Header(from, all, unix.IPPROTO_ICMPV6, len(body))
	// The ICMPv6 checksum covers a pseudo-header; the capture does not check it, the
	// receiver's stack would.
	pseudo := append(append([]byte{}, ip[8:40]...), 0, 0, byte(len(body)>>8), byte(len(body)), 0, 0, 0, unix.IPPROTO_ICMPV6)
	binary.BigEndian.PutUint16(body[2:], internetChecksum(append(pseudo, body...)))
	return ethFrame(mustMAC("33:33:00:00:00:01"), src, etherIPv6, append(ip, body...))
}

// seenWith reports whether a frame the capture holds from the index from on contains
// the marker.
func (c *capture) seenWith(t testing.TB, from int, marker []byte) bool {
	t.Helper()
	for _, p := range c.packets(t, from) {
		if bytes.Contains(p.frame, marker) {
			return true
		}
	}
	return false
}

// TestOverlayAntiSpoofing runs blue with workloads wa1 and wa2 on host-a and wb1 on
// host-b, and has wa1 behave as a hostile workload would: (a) it sends broadcast frames
// with wb1's MAC as their source, which on a learning bridge would move wb1's entry onto
// wa1's port; the entry stays on the VXLAN device, and wa1 and wa2 still reach wb1; a
// `bridge fdb replace` by hand that moves it is repaired at once. (b) It sends UDP from
// an IPv4 and an IPv6 address it does not own, an ARP request with another's sender
// address and a neighbour advertisement for another's address: none reaches wa2, while
// the same frames from wa1's own addresses do; the agent's metrics and `naplesctl bpf`
// count the drops.
func TestOverlayAntiSpoofing(t *testing.T) {
	c := newCluster(t)
	u := newUnderlay(t)
	a := c.addHost(t, "host-a", "host-a")
	b := c.addHost(t, "host-b", "host-b")
	vtepA, vtepB := u.attach(t, a), u.attach(t, b)
	a.startAgentWith(t, append(slices.Clone(metricsFlags), fwStatsFlags...)...)
	b.startAgent(t)
	wa1 := newWorkload(t, a, "wa1", "02:00:00:00:05:a1", []string{"10.1.0.31/24", "fd00:1::31/64"}, "10.1.0.1", "fd00:1::1")
	wa2 := newWorkload(t, a, "wa2", "02:00:00:00:05:a2", []string{"10.1.0.32/24", "fd00:1::32/64"}, "10.1.0.1", "fd00:1::1")
	wb1 := newWorkload(t, b, "wb1", "02:00:00:00:05:b1", []string{"10.1.0.41/24", "fd00:1::41/64"}, "10.1.0.1", "fd00:1::1")
	wb1.serve(t)
	c.apply(t, nodeYAML(a, vtepA)+nodeYAML(b, vtepB)+overlayNetworksYAML+
		wa1.endpointYAML("default", "blue", a)+wa2.endpointYAML("default", "blue", a)+
		wb1.endpointYAML("default", "blue", b))
	wa1.wantReach(t, wb1.ip(4))
	wa2.wantReach(t, wb1.ip(6))
	tel := a.telemetry(t)
	br, vx := a.networkDevices(t, "default", "blue")
	bridge := func(args ...string) string { return testns.Run(t, "bridge", append([]string{"-n", a.ns}, args...)...) }
	// fdbOn reports whether `bridge fdb show dev DEV` lists the MAC as the bridge's static
	// entry for that port.
	fdbOn := func(dev, mac string) bool {
		for line := range strings.Lines(bridge("fdb", "show", "dev", dev)) {
			if containsAll(strings.Fields(line), mac, "master", br, "static") {
				return true
			}
		}
		return false
	}
	if !fdbOn(vx, wb1.mac) {
		t.Fatalf("before the attack: wb1's entry is not on %s:\n%s", vx, bridge("fdb", "show", "br", br))
	}
	if !fdbOn(wa1.name, wa1.mac) || strings.Contains(testns.Run(t, "ip", "-n", a.ns, "-d", "link", "show", wa1.name), " learning on ") {
		t.Errorf("wa1's MAC is no static entry on its port, or the port learns:\n%s", bridge("fdb", "show", "br", br))
	}
	waCapture := newCapture(t, wa2.ns)
	own1, mac1, mac2 := netip.MustParseAddr(wa1.ip(4)), mustMAC(wa1.mac), mustMAC(wa2.mac)
	own6, wa2v4, wa2v6 := netip.MustParseAddr(wa1.ip(6)), netip.MustParseAddr(wa2.ip(4)), netip.MustParseAddr(wa2.ip(6))

	// (a) Frames with wb1's MAC as their source: wb1's entry stays where it is.
	from := waCapture.count()
	claim := []byte("claiming wb1's MAC")
	for range 5 {
		wa1.sendFrames(t, ethFrame(mustMAC("ff:ff:ff:ff:ff:ff"), mustMAC(wb1.mac), 0x88b5, append([]byte{}, claim...)))
	}
	barrier := []byte("after the claims")
	wa1.sendFrames(t, ethFrame(mustMAC("ff:ff:ff:ff:ff:ff"), mac1, 0x88b5, barrier))
	waCapture.waitSeen(t, "wa2 to receive wa1's broadcast from its own MAC", from, func(p packet) bool { return bytes.Contains(p.frame, barrier) })
	if waCapture.seenWith(t, from, claim) {
		t.Errorf("wa2 received a frame wa1 sent with wb1's MAC")
	}
	if !fdbOn(vx, wb1.mac) || fdbOn(wa1.name, wb1.mac) {
		t.Errorf("after wa1 claimed wb1's MAC, wb1's entry moved:\n%s", bridge("fdb", "show", "br", br))
	}
	wa1.wantReach(t, wb1.ip(4))
	wa2.wantReach(t, wb1.ip(4))

	// The same move by hand is repaired, event-driven: not at the next resync.
	bridge("fdb", "replace", wb1.mac, "dev", wa1.name, "master", "static")
	start := time.Now()
	took := waitRepaired(t, "wb1's entry moved to wa1's port", start, func() bool { return fdbOn(vx, wb1.mac) && !fdbOn(wa1.name, wb1.mac) })
	t.Logf("wb1's entry moved to %s by hand: back on %s in %v", wa1.name, vx, took.Round(time.Millisecond))
	wa2.wantReach(t, wb1.ip(4))

	// (b) Addresses wa1 does not own; each has a twin from its own addresses that must
	// arrive, and arrives after it.
	other4, other6 := netip.MustParseAddr("10.1.0.99"), netip.MustParseAddr("fd00:1::99")
	for _, tc := range []struct {
		what          string
		spoofed, real func(marker []byte) []byte
	}{
		{"UDP from another IPv4 address",
			func(m []byte) []byte { return udpFrame(mac2, mac1, other4, wa2v4, m) },
			func(m []byte) []byte { return udpFrame(mac2, mac1, own1, wa2v4, m) }},
		{"UDP from another's IPv4 address",
			func(m []byte) []byte { return udpFrame(mac2, mac1, netip.MustParseAddr(wb1.ip(4)), wa2v4, m) },
			func(m []byte) []byte { return udpFrame(mac2, mac1, own1, wa2v4, m) }},
		{"UDP from another IPv6 address",
			func(m []byte) []byte { return udpFrame(mac2, mac1, other6, wa2v6, m) },
			func(m []byte) []byte { return udpFrame(mac2, mac1, own6, wa2v6, m) }},
		{"ARP with another's sender address",
			func(m []byte) []byte { return arpRequestFrame(mac1, mac1, netip.MustParseAddr(wb1.ip(4)), wa2v4, m) },
			func(m []byte) []byte { return arpRequestFrame(mac1, mac1, own1, wa2v4, m) }},
		{"ARP with another's sender MAC",
			func(m []byte) []byte { return arpRequestFrame(mac1, mustMAC(wb1.mac), own1, wa2v4, m) },
			func(m []byte) []byte { return arpRequestFrame(mac1, mac1, own1, wa2v4, m) }},
		{"neighbour advertisement for another's address",
			func(m []byte) []byte { return advertisementFrame(mac1, own6, netip.MustParseAddr(wb1.ip(6)), m) },
			func(m []byte) []byte { return advertisementFrame(mac1, own6, own6, m) }},
	} {
		from := waCapture.count()
		spoofed := fmt.Appendf(nil, "spoofed: %s", tc.what)
		real := fmt.Appendf(nil, "real: %s", tc.what)
		wa1.sendFrames(t, tc.spoofed(spoofed), tc.real(real))
		waCapture.waitSeen(t, "wa2 to receive wa1's "+tc.what+" from its own addresses", from,
			func(p packet) bool { return bytes.Contains(p.frame, real) })
		if waCapture.seenWith(t, from, spoofed) {
			t.Errorf("%s: wa2 received the frame from an address wa1 does not own", tc.what)
		}
	}
	wa1.wantReach(t, wb1.ip(4))
	wa1.wantReach(t, wb1.ip(6))

	// Counted: 5 claims of wb1's MAC and 6 spoofed frames, in the agent's metrics and in
	// naplesctl bpf.
	const drops = 11
	key := (&nimbusv1.ObjectKey{Kind: nimbusv1.Kind_KIND_ENDPOINT, Name: wa1.name}).ID()
	m := tel.metrics(t)
	if got := m["naples_firewall_spoofed_drops_total"]; got < drops {
		t.Errorf("naples_firewall_spoofed_drops_total = %v, want at least %d", got, drops)
	}
	if got := m[fmt.Sprintf("naples_firewall_endpoint_packets_total{endpoint=%q,verdict=\"spoofed\"}", key)]; got < drops {
		t.Errorf("wa1's spoofed packets = %v, want at least %d", got, drops)
	}
	out := c.mustCtl(t, "", "--agent", filepath.Join(c.dir, "agent-"+a.name+".sock"), "bpf", "policy", "-o", "json")
	var view struct {
		Stats struct {
			SpoofedDrops json.Number `json:"spoofedDrops"`
		} `json:"stats"`
		Endpoints []struct {
			Interface string   `json:"interface"`
			Guarded   bool     `json:"guarded"`
			Sources   []string `json:"sources"`
			Counters  struct {
				SpoofedPackets json.Number `json:"spoofedPackets"`
			} `json:"counters"`
		} `json:"endpoints"`
	}
	if err := json.Unmarshal([]byte(out), &view); err != nil {
		t.Fatalf("parsing naplesctl bpf policy -o json: %v\n%s", err, out)
	}
	var found bool
	for _, e := range view.Endpoints {
		if e.Interface != wa1.name {
			continue
		}
		found = true
		var n int
		fmt.Sscan(e.Counters.SpoofedPackets.String(), &n)
		want := []string{wa1.mac, wa1.ip(4), wa1.ip(6)}
		if !e.Guarded || n < drops || !sameSet(e.Sources, want) {
			t.Errorf("naplesctl bpf policy, wa1: guarded %v, %d spoofed packets, sources %v; want guarded, at least %d, %v",
				e.Guarded, n, e.Sources, drops, want)
		}
	}
	var total int
	fmt.Sscan(view.Stats.SpoofedDrops.String(), &total)
	if !found || total < drops {
		t.Errorf("naplesctl bpf policy: wa1 found %v, %d spoofed drops in all; want at least %d:\n%s", found, total, drops, out)
	}
	text := c.mustCtl(t, "", "--agent", filepath.Join(c.dir, "agent-"+a.name+".sock"), "bpf", "policy")
	if !strings.Contains(text, "SPOOFED") {
		t.Errorf("naplesctl bpf policy has no SPOOFED column:\n%s", text)
	}
	// And in wa1's status, which host-a refreshes with the counters.
	waitFor(t, "wa1's status to count its spoofed frames", func() bool {
		_, st, err := c.get(t, "endpoint", wa1.name)
		op := nodeStatus(st, a.name).GetOperational()
		return err == nil && op["firewall.sources"] == "guarded" && opCount(op, "firewall.spoofedPackets") >= drops
	})
}

// sameSet reports whether a and b hold the same strings, in any order.
func sameSet(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for _, s := range b {
		if !strings.Contains(" "+strings.Join(a, " ")+" ", " "+s+" ") {
			return false
		}
	}
	return true
}
