package fwbpf

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/naplesnet/naples/hal/firewall"
)

// The frames of these tests come from endpoint A, whose MAC is macB (the source of every
// frame packet.frame makes) and whose addresses are the families' ep.

// withSource returns the frame with its Ethernet source replaced by mac.
func withSource(frame, mac []byte) []byte {
	b := append([]byte{}, frame...)
	copy(b[6:12], mac)
	return b
}

// arpFrom returns an ARP request from the Ethernet source ethSrc, with sender hardware
// address sha and sender protocol address spa, for 10.0.0.9.
func arpFrom(ethSrc, sha []byte, spa netip.Addr) []byte {
	b := append(append([]byte{}, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff), ethSrc...)
	b = binary.BigEndian.AppendUint16(b, 0x0806)
	b = binary.BigEndian.AppendUint16(b, 1)
	b = binary.BigEndian.AppendUint16(b, 0x0800)
	b = append(b, 6, 4)
	b = binary.BigEndian.AppendUint16(b, 1)
	b = append(b, sha...)
	a := spa.As4()
	b = append(b, a[:]...)
	b = append(b, 0, 0, 0, 0, 0, 0)
	return append(b, 10, 0, 0, 9)
}

// ndFrom returns an ICMPv6 neighbour solicitation (135) or advertisement (136) from src
// (Ethernet source macB) for the target, with a link-layer address option (source for a
// solicitation, target for an advertisement) holding optMAC, or none when it is nil.
func ndFrom(typ uint8, src, target netip.Addr, optMAC []byte) []byte {
	body := []byte{typ, 0, 0, 0, 0, 0, 0, 0}
	if typ == 136 {
		body[4] = 0x60 // solicited, override
	}
	t := target.As16()
	body = append(body, t[:]...)
	if optMAC != nil {
		opt := byte(1)
		if typ == 136 {
			opt = 2
		}
		body = append(append(body, opt, 1), optMAC...)
	}
	ip := make([]byte, 40)
	ip[0] = 0x60
	binary.BigEndian.PutUint16(ip[4:], uint16(len(body)))
	ip[6], ip[7] = 58, 255
	s, d := src.As16(), netip.MustParseAddr("ff02::1").As16()
	copy(ip[8:], s[:])
	copy(ip[24:], d[:])
	b := append([]byte{0x33, 0x33, 0, 0, 0, 1}, macB...)
	b = binary.BigEndian.AppendUint16(b, 0x86dd)
	return append(append(b, ip...), body...)
}

// otherFrame returns a frame of another EtherType (LLDP's) from the Ethernet source.
func otherFrame(ethSrc []byte) []byte {
	b := append([]byte{0x01, 0x80, 0xc2, 0, 0, 0x0e}, ethSrc...)
	b = binary.BigEndian.AppendUint16(b, 0x88cc)
	return append(b, make([]byte, 46)...)
}

// guardedA returns the entries of endpoint A on ifA, with the subject and the flags, and
// guarded: its MAC macB and the families' ep addresses are its sources.
func (f *fixture) guardedA(subject, flags uint32) []entry {
	es := []entry{
		endpoint(f.ifA, epA, subject, flags|firewall.FlagGuard, gen1),
		{firewall.SourceMACKey(f.ifA, [6]byte(macB)), firewall.Value{ID: epA}},
	}
	for _, fam := range families {
		es = append(es, entry{firewall.SourceKey(f.ifA, fam.ep), firewall.Value{ID: epA}})
	}
	return es
}

func TestSpoofedFramesDrop(t *testing.T) {
	f := newFixture(t)
	f.install(f.guardedA(0, 0)...)
	f.makeCounters(nil, []uint32{epA})
	v4, v6 := families[0], families[1]
	stranger := []byte{0x02, 0, 0, 0, 0, 0x99}
	linkLocal := netip.MustParseAddr("fe80::1")
	zero4, zero6 := netip.IPv4Unspecified(), netip.IPv6Unspecified()

	type frameCase struct {
		what  string
		frame []byte
		want  uint32
	}
	var cases []frameCase
	for _, fam := range families {
		own := udp(fam.ep, 40000, fam.peer, 53)
		cases = append(cases,
			frameCase{fam.name + " from its own address", own.frame(), tcxNext},
			frameCase{fam.name + " from another address", udp(fam.other, 40000, fam.peer, 53).frame(), tcxDrop},
			frameCase{fam.name + " from a peer's address", udp(fam.peer, 40000, fam.ep, 53).frame(), tcxDrop},
			frameCase{fam.name + " from another MAC", withSource(own.frame(), stranger), tcxDrop},
		)
	}
	cases = append(cases,
		frameCase{"DHCP discover from 0.0.0.0", udp(zero4, 68, netip.MustParseAddr("255.255.255.255"), 67).frame(), tcxNext},
		frameCase{"other UDP from 0.0.0.0", udp(zero4, 68, v4.peer, 53).frame(), tcxDrop},
		frameCase{"ICMP from 0.0.0.0", v4.icmpPacket(zero4, v4.peer, v4.echoRequest, 0, 1).frame(), tcxDrop},
		frameCase{"IPv6 from a link-local address", udp(linkLocal, 546, netip.MustParseAddr("ff02::1:2"), 547).frame(), tcxNext},
		frameCase{"IPv6 echo from ::", v6.icmpPacket(zero6, v6.peer, v6.echoRequest, 0, 1).frame(), tcxDrop},
		frameCase{"DAD solicitation from ::", ndFrom(135, zero6, v6.ep, nil), tcxNext},
		frameCase{"router solicitation from ::", v6.icmpPacket(zero6, netip.MustParseAddr("ff02::2"), 133, 0, 0).frame(), tcxNext},
		frameCase{"solicitation with its own MAC", ndFrom(135, v6.ep, v6.peer, macB), tcxNext},
		frameCase{"solicitation with another MAC", ndFrom(135, v6.ep, v6.peer, stranger), tcxDrop},
		frameCase{"advertisement of its own address", ndFrom(136, v6.ep, v6.ep, macB), tcxNext},
		frameCase{"advertisement of a link-local address", ndFrom(136, linkLocal, linkLocal, macB), tcxNext},
		frameCase{"advertisement of another's address", ndFrom(136, v6.ep, v6.peer, macB), tcxDrop},
		frameCase{"advertisement of another's address, no option", ndFrom(136, v6.ep, v6.peer, nil), tcxDrop},
		frameCase{"advertisement with another MAC", ndFrom(136, v6.ep, v6.ep, stranger), tcxDrop},
		frameCase{"ARP from its own addresses", arpFrom(macB, macB, v4.ep), tcxNext},
		frameCase{"ARP probe", arpFrom(macB, macB, zero4), tcxNext},
		frameCase{"ARP for another's address", arpFrom(macB, macB, v4.peer), tcxDrop},
		frameCase{"ARP with another sender MAC", arpFrom(macB, stranger, v4.ep), tcxDrop},
		frameCase{"ARP from another MAC", arpFrom(stranger, stranger, v4.ep), tcxDrop},
		frameCase{"LLDP from its own MAC", otherFrame(macB), tcxNext},
		frameCase{"LLDP from another MAC", otherFrame(stranger), tcxDrop},
	)
	var drops, dropBytes uint64
	for _, c := range cases {
		if got := f.run(f.ingress, f.ifA, c.frame); got != c.want {
			t.Errorf("%s: verdict %s, want %s", c.what, verdict(got), verdict(c.want))
		}
		if c.want == tcxDrop {
			drops++
			dropBytes += uint64(len(c.frame))
		}
	}
	if got := f.epCount(epA); got.SpoofedPackets != drops || got.SpoofedBytes != dropBytes || got.DeniedPackets != 0 {
		t.Errorf("endpoint counter %+v, want %d spoofed packets of %d bytes and none denied", got, drops, dropBytes)
	}
	if got := f.stat(StatSpoofedDrops); got != drops {
		t.Errorf("fw_stats spoofed drops = %d, want %d", got, drops)
	}
	f.wantStats(f.stat(StatCTCreated), 0, 0)

	// What comes to the endpoint is policy's only: any source passes an open endpoint.
	for _, fam := range families {
		f.to(f.ifA, udp(fam.other, 53, fam.ep, 40000), tcxNext)
	}
	if got := f.stat(StatSpoofedDrops); got != drops {
		t.Errorf("fw_stats spoofed drops = %d after packets to the endpoint, want %d", got, drops)
	}
}

// TestUnspecifiedSourceOnlyMLD: from ::, behind a hop-by-hop header to ff02::/16, only
// MLD reports (v2, 143; v1, 131) and dones (132) right behind it pass, of any length of
// the header; a query, other ICMPv6, UDP, MLD behind a further header, to another
// multicast scope, or without the hop-by-hop header is spoofed. (DAD's and routers'
// solicitations from :: are TestSpoofedFramesDrop's.)
func TestUnspecifiedSourceOnlyMLD(t *testing.T) {
	f := newFixture(t)
	f.install(f.guardedA(0, 0)...)
	f.makeCounters(nil, []uint32{epA})
	v6 := families[1]
	zero := netip.IPv6Unspecified()
	reports := netip.MustParseAddr("ff02::16")
	behind := func(p packet, exts ...ext) packet {
		p.exts = exts
		return p
	}
	hbh := ext{ipProtoHopByHop, 8}
	var drops uint64
	for _, c := range []struct {
		what string
		p    packet
		want uint32
	}{
		{"MLDv2 report", behind(v6.icmpPacket(zero, reports, 143, 0, 0), hbh), tcxNext},
		{"MLDv2 report behind a 16-byte hop-by-hop header", behind(v6.icmpPacket(zero, reports, 143, 0, 0), ext{ipProtoHopByHop, 16}), tcxNext},
		{"MLDv1 report", behind(v6.icmpPacket(zero, netip.MustParseAddr("ff02::1:ff00:1"), 131, 0, 0), hbh), tcxNext},
		{"MLD done", behind(v6.icmpPacket(zero, netip.MustParseAddr("ff02::2"), 132, 0, 0), hbh), tcxNext},
		{"MLD query", behind(v6.icmpPacket(zero, netip.MustParseAddr("ff02::1"), 130, 0, 0), hbh), tcxDrop},
		{"echo request", behind(v6.icmpPacket(zero, netip.MustParseAddr("ff02::1"), v6.echoRequest, 0, 1), hbh), tcxDrop},
		{"neighbour advertisement", behind(v6.icmpPacket(zero, netip.MustParseAddr("ff02::1"), 136, 0, 0), hbh), tcxDrop},
		{"UDP", behind(udp(zero, 546, netip.MustParseAddr("ff02::1:2"), 547), hbh), tcxDrop},
		{"MLDv2 report behind destination options too", behind(v6.icmpPacket(zero, reports, 143, 0, 0), hbh, ext{ipProtoDstOpts, 8}), tcxDrop},
		{"MLDv2 report to ff05::16", behind(v6.icmpPacket(zero, netip.MustParseAddr("ff05::16"), 143, 0, 0), hbh), tcxDrop},
		{"MLDv2 report without hop-by-hop", v6.icmpPacket(zero, reports, 143, 0, 0), tcxDrop},
		{"MLDv2 report, truncated in the hop-by-hop header", packet{src: zero, dst: reports, proto: v6.icmp, icmpType: 143, exts: []ext{hbh}, truncate: 44}, tcxDrop},
	} {
		frame := c.p.frame()
		if got := f.run(f.ingress, f.ifA, frame); got != c.want {
			t.Errorf("from ::, %s: verdict %s, want %s", c.what, verdict(got), verdict(c.want))
		}
		if c.want == tcxDrop {
			drops++
		}
	}
	if got := f.epCount(epA); got.SpoofedPackets != drops {
		t.Errorf("endpoint counter %+v, want %d spoofed packets", got, drops)
	}
}

func TestSpoofCheckedBeforePolicy(t *testing.T) {
	forEachFamily(t, func(t *testing.T, f *fixture, fam family) {
		// A protected endpoint whose policy lets everything out: a spoofed packet is
		// dropped as spoofed, never tracked, never counted on the rule.
		entries := append(f.guardedA(subject, firewall.FlagEgress), policy(DirEgress, firewall.ClassUDP, firewall.AnyIdentity, 0, 0, firewall.VerdictAllow, 0x77))
		f.install(entries...)
		f.makeCounters([]uint64{0x77}, []uint32{epA})
		spoofed := udp(fam.other, 40000, fam.peer, 53)
		f.from(f.ifA, spoofed, tcxDrop)
		f.noConn(f.ifA, spoofed)
		f.wantRule(0x77, 0, 0)
		own := udp(fam.ep, 40000, fam.peer, 53)
		f.from(f.ifA, own, tcxNext)
		f.wantRule(0x77, 1, uint64(len(own.frame())))
		if got := f.epCount(epA); got.SpoofedPackets != 1 || got.AllowedPackets != 1 {
			t.Errorf("endpoint counter %+v, want 1 spoofed and 1 allowed", got)
		}
	})
}

func TestAllowedSourcePrefixes(t *testing.T) {
	f := newFixture(t)
	// A's allowed prefixes: the addresses inside pass, the others do not.
	f.install(append(f.guardedA(0, 0),
		entry{firewall.SourcePrefixKey(f.ifA, netip.MustParsePrefix("172.16.0.0/24")), firewall.Value{ID: epA}},
		entry{firewall.SourcePrefixKey(f.ifA, netip.MustParsePrefix("fd00:99::/64")), firewall.Value{ID: epA}})...)
	for _, c := range []struct {
		src  string
		want uint32
	}{
		{"172.16.0.5", tcxNext}, {"172.16.0.255", tcxNext}, {"172.16.1.5", tcxDrop},
		{"fd00:99::5", tcxNext}, {"fd00:98::5", tcxDrop},
	} {
		src := netip.MustParseAddr(c.src)
		dst := families[0].peer
		if src.Is6() {
			dst = families[1].peer
		}
		f.from(f.ifA, udp(src, 40000, dst, 53), c.want)
	}
	if got := f.run(f.ingress, f.ifA, arpFrom(macB, macB, netip.MustParseAddr("172.16.0.9"))); got != tcxNext {
		t.Errorf("ARP from an allowed prefix: %s, want TCX_NEXT", verdict(got))
	}
}

func TestUnguardedEndpointIsNotChecked(t *testing.T) {
	f := newFixture(t)
	// No FlagGuard (an endpoint without a MAC): its sources are not checked.
	f.install(endpoint(f.ifA, epA, 0, 0, gen1))
	for _, fam := range families {
		f.from(f.ifA, udp(fam.other, 40000, fam.peer, 53), tcxNext)
	}
	if got := f.run(f.ingress, f.ifA, arpFrom(macA, macA, families[0].other)); got != tcxNext {
		t.Errorf("ARP from an unguarded endpoint: %s, want TCX_NEXT", verdict(got))
	}
	if got := f.stat(StatSpoofedDrops); got != 0 {
		t.Errorf("fw_stats spoofed drops = %d, want 0", got)
	}
}
