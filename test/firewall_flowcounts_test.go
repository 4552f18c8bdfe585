package test

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"testing"

	delphiv1 "github.com/naplesnet/naples/proto/delphi/v1"
)

// tupleCounts are the packets and IP bytes a capture saw of a TCP connection, from its
// initiator (0) and from its responder (1), and the largest frame.
type tupleCounts struct {
	packets, bytes [2]uint64
	largest        int
}

// countTuple counts the TCP packets between src and dst, either way, among the frames:
// IPv4, or IPv6 without extension headers.
func countTuple(pkts []packet, src, dst netip.AddrPort) tupleCounts {
	var c tupleCounts
	for _, p := range pkts {
		f := p.frame
		if len(f) < 14+40+4 {
			continue
		}
		ip := f[14:]
		var s, d netip.AddrPort
		var size uint64
		switch binary.BigEndian.Uint16(f[12:14]) {
		case 0x0800:
			ihl := int(ip[0]&0x0f) * 4
			if ip[9] != 6 || len(ip) < ihl+4 {
				continue
			}
			s = netip.AddrPortFrom(netip.AddrFrom4([4]byte(ip[12:16])), binary.BigEndian.Uint16(ip[ihl:]))
			d = netip.AddrPortFrom(netip.AddrFrom4([4]byte(ip[16:20])), binary.BigEndian.Uint16(ip[ihl+2:]))
			size = uint64(binary.BigEndian.Uint16(ip[2:4]))
		case 0x86dd:
			if ip[6] != 6 {
				continue
			}
			s = netip.AddrPortFrom(netip.AddrFrom16([16]byte(ip[8:24])), binary.BigEndian.Uint16(ip[40:]))
			d = netip.AddrPortFrom(netip.AddrFrom16([16]byte(ip[24:40])), binary.BigEndian.Uint16(ip[42:]))
			size = 40 + uint64(binary.BigEndian.Uint16(ip[4:6]))
		default:
			continue
		}
		side := -1
		switch {
		case s == src && d == dst:
			side = 0
		case s == dst && d == src:
			side = 1
		}
		if side < 0 {
			continue
		}
		c.packets[side]++
		c.bytes[side] += size
		c.largest = max(c.largest, len(f))
	}
	return c
}

// TestFirewallFlowCounts runs TCP connections from web1, across the tunnel to db2 and on
// host-a to db1, captures their packets in web1's namespace, and checks the counts the
// flow records carry against the capture's: every ACTIVE record's are at most the end's
// and grow, and the ENDED record of each firewall hook the connection crossed (web1's
// egress, the server's ingress) carries exactly the packets and IP bytes of both sides,
// its end reason fin, its start before its end.
func TestFirewallFlowCounts(t *testing.T) {
	active := []string{"--fw-flow-active-timeout", "200ms"}
	sc := webDBCluster(t, "server", nil, [][]string{active, active})
	sc.apply(t, fwPolicyObject("servers", []string{"server"},
		fwRules(allowIn("tcp", fwPorts("7"), "group:client"), allowMulticastReports()), nil))
	sc.waitProgrammed(t)
	web1 := sc.workload("web1")
	capture := newCapture(t, web1.ns)

	for _, c := range []struct {
		dst  string
		host string // the server's
	}{{"db2", "host-b"}, {"db1", "host-a"}} {
		dst := sc.workload(c.dst)
		to := netip.AddrPortFrom(dst.addr(4), 7)
		conn := web1.dial(t, "tcp", to)
		from := netip.MustParseAddrPort(conn.c.LocalAddr().String())
		ours := func(f *delphiv1.Flow) bool {
			return f.GetSource() == from.Addr().String() && f.GetSourcePort() == uint32(from.Port())
		}
		// Exchanges until the client's host wrote an ACTIVE record, then a few more.
		var activeSeen *delphiv1.Flow
		waitFor(t, fmt.Sprintf("an ACTIVE record of the connection to %s", c.dst), func() bool {
			if err := conn.exchange(fwFlowWait); err != nil {
				t.Fatalf("%s: %v", conn.name, err)
			}
			for _, f := range sc.hostFlows(t, "host-a", "--from", "web1") {
				if ours(f) && f.GetEvent() == delphiv1.FlowEvent_FLOW_EVENT_ACTIVE {
					activeSeen = f
				}
			}
			return activeSeen != nil
		})
		for range 3 {
			if err := conn.exchange(fwFlowWait); err != nil {
				t.Fatalf("%s: %v", conn.name, err)
			}
		}
		conn.c.Close()

		// The hooks the connection crossed: the client's egress and the server's ingress.
		hooks := []struct{ host, ep string }{{"host-a", "web1"}, {c.host, c.dst}}
		ends := make([]*delphiv1.Flow, len(hooks))
		for i, h := range hooks {
			waitFor(t, fmt.Sprintf("%s's ENDED record of %s's connection to %s", h.host, h.ep, c.dst), func() bool {
				for _, f := range sc.hostFlows(t, h.host) {
					if ours(f) && f.GetEvent() == delphiv1.FlowEvent_FLOW_EVENT_ENDED && f.GetEndpoint().GetName() == h.ep {
						ends[i] = f
					}
				}
				return ends[i] != nil
			})
		}
		got := countTuple(capture.packets(t, 0), from, to)
		if got.largest > 1514 {
			t.Fatalf("the capture saw a frame of %d bytes: a GSO packet, which the test cannot count", got.largest)
		}
		if got.packets[0] == 0 || got.packets[1] == 0 {
			t.Fatalf("the capture saw %v packets of the connection to %s", got.packets, c.dst)
		}
		t.Logf("the connection to %s: the capture saw %v packets and %v bytes; the ACTIVE record %d/%d packets", c.dst, got.packets, got.bytes,
			activeSeen.GetInitiatorPackets(), activeSeen.GetResponderPackets())
		for i, f := range ends {
			hook := hooks[i].host + "/" + hooks[i].ep
			gotCounts := [4]uint64{f.GetInitiatorPackets(), f.GetInitiatorBytes(), f.GetResponderPackets(), f.GetResponderBytes()}
			want := [4]uint64{got.packets[0], got.bytes[0], got.packets[1], got.bytes[1]}
			if gotCounts != want {
				t.Errorf("%s's ENDED record of the connection to %s: packets/bytes from the client %d/%d, from the server %d/%d; the capture saw %d/%d and %d/%d",
					hook, c.dst, gotCounts[0], gotCounts[1], gotCounts[2], gotCounts[3], want[0], want[1], want[2], want[3])
			}
			if f.GetReason() != "fin" || f.GetVerdict() != "allowed" {
				t.Errorf("%s's ENDED record of the connection to %s: %s, want allowed, reason fin", hook, c.dst, flowText(f))
			}
			if s := f.GetStartTime(); s == nil || s.AsTime().After(f.GetTime().AsTime()) {
				t.Errorf("%s's ENDED record of the connection to %s starts at %v, after its end %v", hook, c.dst, s.AsTime(), f.GetTime().AsTime())
			}
		}
		if a := activeSeen; a.GetInitiatorPackets() == 0 || a.GetResponderPackets() == 0 ||
			a.GetInitiatorPackets() >= got.packets[0] || a.GetResponderBytes() >= got.bytes[1] {
			t.Errorf("the ACTIVE record of the connection to %s counts %d/%d packets, want some of both sides and fewer than the end's %v",
				c.dst, a.GetInitiatorPackets(), a.GetResponderPackets(), got.packets)
		}
	}
}
