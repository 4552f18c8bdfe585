package fwbpf

import (
	"net/netip"
	"testing"

	"github.com/naplesnet/naples/hal/firewall"
)

// fragments returns the first and a later fragment of a UDP datagram from src:sport to
// dst:dport: the first holds the UDP header and 1000 bytes of data, the later one 500
// more bytes at offset 1008.
func fragments(src netip.Addr, sport uint16, dst netip.Addr, dport uint16, id uint32) (first, later packet) {
	first = udp(src, sport, dst, dport)
	first.moreFrags, first.fragID, first.payload = true, id, 1000
	later = first
	later.moreFrags, later.fragOffset, later.payload = false, 1008/8, 500
	return first, later
}

// wantDrops fails the test unless fw_stats counts the untracked fragments and the
// packets dropped for their headers.
func (f *fixture) wantDrops(untracked, badHeaders uint64) {
	f.tb.Helper()
	got := [2]uint64{f.stat(StatFragUntrackedDrops), f.stat(StatBadHeaderDrops)}
	if want := [2]uint64{untracked, badHeaders}; got != want {
		f.tb.Errorf("fw_stats untracked fragments, bad headers = %v, want %v", got, want)
	}
}

func TestIPv6ExtensionHeadersAreWalked(t *testing.T) {
	fam := families[1]
	f := newFixture(t)
	f.install(endpoint(f.ifA, epA, subject, firewall.FlagIngress|firewall.FlagEgress, gen1),
		policy(firewall.DirIngress, firewall.ClassUDP, firewall.AnyIdentity, 8080, 16, firewall.VerdictAllow, 80))
	f.makeCounters([]uint64{80}, []uint32{epA})
	for _, exts := range [][]ext{
		{{ipProtoHopByHop, 8}},
		{{ipProtoDstOpts, 16}},
		{{ipProtoHopByHop, 8}, {ipProtoRouting, 24}, {ipProtoDstOpts, 8}},
		{{ipProtoAH, 24}},
	} {
		p := udp(fam.peer, 40000, fam.ep, 8080)
		p.exts = exts
		f.to(f.ifA, p, tcxNext)
		// The L4 protocol and ports behind the chain are the connection's.
		f.mustConn(f.ifA, p)
		p.dport = 9090
		f.to(f.ifA, p, tcxDrop)
	}
	if r, _ := f.ruleCount(80); r.Packets != 4 {
		t.Errorf("rule 80 counted %d packets, want 4", r.Packets)
	}
	f.wantDrops(0, 0)
}

func TestIPv6ExtensionChainIsBounded(t *testing.T) {
	fam := families[1]
	f := newFixture(t)
	f.install(endpoint(f.ifA, epA, subject, firewall.FlagIngress, gen1),
		policy(firewall.DirIngress, firewall.ClassUDP, firewall.AnyIdentity, 0, 0, firewall.VerdictAllow, 80))
	ok := udp(fam.peer, 40000, fam.ep, 8080)
	ok.exts = chain(IPv6ExtMax, ipProtoDstOpts, 8)
	f.to(f.ifA, ok, tcxNext)
	f.wantDrops(0, 0)

	long := ok
	long.exts = chain(IPv6ExtMax+1, ipProtoDstOpts, 8)
	big := ok
	big.exts = chain(3, ipProtoDstOpts, IPv6ExtBytes/2) // more bytes than IPv6ExtBytes
	fragLate := ok                                      // a fragment header inside a chain too long
	fragLate.exts = chain(IPv6ExtMax, ipProtoDstOpts, 8)
	fragLate.moreFrags = true
	twoFrags := ok
	twoFrags.exts = []ext{{ipProtoFragment, 8}}
	twoFrags.moreFrags = true
	for i, p := range []packet{long, big, fragLate, twoFrags} {
		f.to(f.ifA, p, tcxDrop)
		f.wantDrops(0, uint64(i+1))
	}
	// The open direction drops them as well.
	long.src, long.dst = fam.ep, fam.peer
	f.from(f.ifA, long, tcxDrop)
	f.wantDrops(0, 5)
}

func TestFragmentsTakeTheFirstsVerdict(t *testing.T) {
	forEachFamily(t, func(t *testing.T, f *fixture, fam family) {
		f.install(endpoint(f.ifA, epA, subject, firewall.FlagIngress, gen1),
			policy(firewall.DirIngress, firewall.ClassUDP, firewall.AnyIdentity, 8080, 16, firewall.VerdictAllow, 80),
			policy(firewall.DirIngress, firewall.ClassUDP, firewall.AnyIdentity, 9090, 16, firewall.VerdictDeny, 90))
		f.makeCounters([]uint64{80, 90}, []uint32{epA})

		// Allowed: both fragments pass, as packets of one connection.
		first, later := fragments(fam.peer, 40000, fam.ep, 8080, 7)
		f.to(f.ifA, first, tcxNext)
		f.to(f.ifA, later, tcxNext)
		f.to(f.ifA, later, tcxNext) // a retransmission, within the timeout
		f.mustConn(f.ifA, first)
		n1, n2 := uint64(len(first.frame())), uint64(len(later.frame()))
		f.wantRule(80, 3, n1+2*n2)

		// Denied by port: the later fragment too, under the same rule; a denied
		// datagram's later fragment does not count as untracked.
		dfirst, dlater := fragments(fam.peer, 40001, fam.ep, 9090, 8)
		f.to(f.ifA, dfirst, tcxDrop)
		f.to(f.ifA, dlater, tcxDrop)
		f.wantRule(90, 2, n1+n2)
		f.noConn(f.ifA, dfirst)

		// Another datagram's fragments, of the same addresses and ports, are their own.
		_, orphan := fragments(fam.peer, 40000, fam.ep, 8080, 9)
		f.to(f.ifA, orphan, tcxDrop)
		f.wantDrops(1, 0)
		// So are those seen in the other direction.
		f.from(f.ifA, later.reply(), tcxDrop)
		f.wantDrops(2, 0)

		want := EndpointStats{AllowedPackets: 3, AllowedBytes: n1 + 2*n2, DeniedPackets: 4, DeniedBytes: n1 + 3*n2}
		if got := f.epCount(epA); got != want {
			t.Errorf("endpoint counter %+v, want %+v", got, want)
		}
	})
}

func TestFragmentEntryExpires(t *testing.T) {
	forEachFamily(t, func(t *testing.T, f *fixture, fam family) {
		f.install(endpoint(f.ifA, epA, 0, 0, gen1)) // open: fragments are tracked all the same
		first, later := fragments(fam.ep, 40000, fam.peer, 8080, 7)
		f.from(f.ifA, first, tcxNext)
		var k FragKey
		var v FragValue
		if err := f.frag.NextKey(nil, &k); err != nil {
			t.Fatalf("no entry in fw_frag after a first fragment: %v", err)
		}
		if err := f.frag.Lookup(&k, &v); err != nil {
			t.Fatal(err)
		}
		if v.Verdict != FragConn || v.Proto != ipProtoUDP || v.Sport != netPort(40000) || v.Dport != netPort(8080) {
			t.Errorf("fragment entry %+v, want verdict %d, UDP 40000 > 8080", v, FragConn)
		}
		f.from(f.ifA, later, tcxNext)
		v.FirstSeen = f.now() - uint64(FragTimeout) - 1e6
		if err := f.frag.Put(&k, &v); err != nil {
			t.Fatal(err)
		}
		f.from(f.ifA, later, tcxDrop)
		f.wantDrops(1, 0)
	})
}

func TestAtomicFragmentIsAPacket(t *testing.T) {
	fam := families[1]
	f := newFixture(t)
	f.install(endpoint(f.ifA, epA, subject, firewall.FlagIngress, gen1),
		policy(firewall.DirIngress, firewall.ClassUDP, firewall.AnyIdentity, 8080, 16, firewall.VerdictAllow, 80))
	p := udp(fam.peer, 40000, fam.ep, 8080)
	p.exts = []ext{{ipProtoFragment, 8}} // offset 0, no more fragments
	f.to(f.ifA, p, tcxNext)
	f.mustConn(f.ifA, p)
	var k FragKey
	if err := f.frag.NextKey(nil, &k); err == nil {
		t.Errorf("an atomic fragment made fragment entry %+v", k)
	}
	f.wantDrops(0, 0)
}

func TestHostileFragmentsDrop(t *testing.T) {
	forEachFamily(t, func(t *testing.T, f *fixture, fam family) {
		f.install(endpoint(f.ifA, epA, subject, firewall.FlagIngress, gen1),
			policy(firewall.DirIngress, firewall.ClassTCP, firewall.AnyIdentity, 80, 16, firewall.VerdictAllow, 80),
			policy(firewall.DirIngress, firewall.ClassUDP, firewall.AnyIdentity, 0, 0, firewall.VerdictAllow, 81))

		// A tiny first fragment, without the whole TCP (or UDP) header (RFC 1858).
		tiny := tcp(fam.peer, 40000, fam.ep, 80, tcpSYN)
		tiny.moreFrags, tiny.l4Len = true, 16
		f.to(f.ifA, tiny, tcxDrop)
		tinyUDP := udp(fam.peer, 40000, fam.ep, 53)
		tinyUDP.moreFrags, tinyUDP.l4Len = true, 4
		f.to(f.ifA, tinyUDP, tcxDrop)
		f.wantDrops(0, 2)

		// A later fragment at offset 8 overwrites the TCP flags of an allowed first
		// fragment (RFC 1858): dropped, the next one at offset 24 passes.
		first := tcp(fam.peer, 40001, fam.ep, 80, tcpACK)
		first.moreFrags, first.fragID, first.payload = true, 5, 100
		f.to(f.ifA, first, tcxNext)
		overlap := first
		overlap.fragOffset, overlap.payload = 1, 100
		f.to(f.ifA, overlap, tcxDrop)
		f.wantDrops(0, 3)
		next := first
		next.fragOffset, next.moreFrags, next.payload = 3, false, 100
		f.to(f.ifA, next, tcxNext)
		f.wantDrops(0, 3)
	})
}

func TestExtensionHeaderControlTraffic(t *testing.T) {
	fam := families[1]
	f := newFixture(t)
	f.install(endpoint(f.ifA, epA, subject, firewall.FlagIngress|firewall.FlagEgress, gen1))
	group := netip.MustParseAddr("ff02::16")
	// MLD travels behind a hop-by-hop header: it passes, whatever the policy.
	mld := fam.icmpPacket(fam.ep, group, 143, 0, 0)
	mld.exts = []ext{{ipProtoHopByHop, 8}}
	f.from(f.ifA, mld, tcxNext)
	// A hop-by-hop header is no pass for other protocols, to a link-local group or not.
	hbh := udp(fam.ep, 40000, group, 5353)
	hbh.exts = []ext{{ipProtoHopByHop, 8}}
	f.from(f.ifA, hbh, tcxDrop)
	f.wantDrops(0, 0)
	// Neighbour discovery behind an extension header, which the anti-spoofing checks
	// would not read, is dropped.
	na := fam.icmpPacket(fam.ep, fam.peer, 136, 0, 0)
	na.exts = []ext{{ipProtoDstOpts, 8}}
	f.from(f.ifA, na, tcxDrop)
	f.wantDrops(0, 1)
}

func TestFragmentsAreCheckedForSpoofing(t *testing.T) {
	forEachFamily(t, func(t *testing.T, f *fixture, fam family) {
		f.install(f.guardedA(0, 0)...) // open both ways: only anti-spoofing drops
		f.makeCounters(nil, []uint32{epA})
		first, later := fragments(fam.ep, 40000, fam.peer, 8080, 7)
		f.from(f.ifA, first, tcxNext)
		f.from(f.ifA, later, tcxNext)
		// The same datagram's later fragment from an address not its own.
		spoofed := later
		spoofed.src = fam.other
		f.from(f.ifA, spoofed, tcxDrop)
		if got := f.epCount(epA); got.SpoofedPackets != 1 || got.AllowedPackets != 2 {
			t.Errorf("endpoint counter %+v, want 2 allowed, 1 spoofed", got)
		}
		f.wantDrops(0, 0)
	})
}

func TestAdvertisementBehindExtensionHeaderDrops(t *testing.T) {
	fam := families[1]
	f := newFixture(t)
	f.install(f.guardedA(0, 0)...) // open both ways: only the header checks drop
	// A neighbour advertisement for another's address (its target: 16 bytes of 0x20),
	// which the anti-spoofing checks drop when it follows the IPv6 header, behind a
	// destination options header.
	na := fam.icmpPacket(fam.ep, netip.MustParseAddr("ff02::1"), 136, 0, 0)
	na.payload, na.fill = 16, 0x20
	f.from(f.ifA, na, tcxDrop)
	na.exts = []ext{{ipProtoDstOpts, 8}}
	f.from(f.ifA, na, tcxDrop)
	f.wantDrops(0, 1)
}
