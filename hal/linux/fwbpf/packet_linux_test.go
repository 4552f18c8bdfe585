package fwbpf

import (
	"encoding/binary"
	"net/netip"
)

// IP protocol numbers and TCP flags of test packets.
const (
	ipProtoTCP = 6
	ipProtoUDP = 17
	ipProtoGRE = 47

	ipProtoHopByHop = 0
	ipProtoRouting  = 43
	ipProtoFragment = 44
	ipProtoAH       = 51
	ipProtoDstOpts  = 60

	tcpFIN = 0x01
	tcpSYN = 0x02
	tcpRST = 0x04
	tcpACK = 0x10
)

// packet is a test packet: an IPv4 or IPv6 header (the family of src) and a TCP, UDP or
// ICMP header, or none for another protocol. frame returns it as an Ethernet frame.
type packet struct {
	src, dst netip.Addr
	// proto is the IP protocol: ipProtoTCP, ipProtoUDP, the family's ICMP (1 or 58) or
	// anything else (no L4 header is written then).
	proto uint8
	// sport and dport are the TCP or UDP ports.
	sport, dport uint16
	// tcpFlags are the TCP flags.
	tcpFlags uint8
	// icmpType, icmpCode and icmpID make the ICMP header; icmpID is the id of an echo.
	icmpType, icmpCode uint8
	icmpID             uint16
	// embed is the packet an ICMP error carries: its IP header and 8 bytes of its L4
	// header go into the error's body.
	embed *packet
	// fragOffset is the fragment offset in 8-byte units: a non-first fragment carries
	// no L4 header. moreFrags sets the more-fragments flag. An IPv6 packet with either
	// gets a fragment header after exts. fragID is the datagram's identification
	// (IPv4: the low 16 bits), 0x1234 when zero.
	fragOffset uint16
	moreFrags  bool
	fragID     uint32
	// exts are IPv6 extension headers before the L4 header, in order.
	exts []ext
	// l4Len, when positive, cuts the L4 header and payload to that many bytes, the IP
	// header's length saying so (a tiny fragment).
	l4Len int
	// payload is how many bytes of data follow the headers, each fill.
	payload int
	fill    byte
	// truncate, when positive, cuts the IP packet to that many bytes.
	truncate int
}

// ext is an IPv6 extension header of the protocol and size in bytes (a multiple of 8,
// of 4 for AH; a fragment header is 8 bytes, filled from the packet's fragment fields).
type ext struct {
	proto uint8
	size  int
}

// chain returns n extension headers of the protocol, each of size bytes.
func chain(n int, proto uint8, size int) []ext {
	var e []ext
	for range n {
		e = append(e, ext{proto, size})
	}
	return e
}

// reply returns the packet of the other direction: addresses and ports swapped.
func (p packet) reply() packet {
	p.src, p.dst = p.dst, p.src
	p.sport, p.dport = p.dport, p.sport
	return p
}

// The MAC addresses of test frames.
var (
	macA = []byte{0x02, 0, 0, 0, 0, 0x0a}
	macB = []byte{0x02, 0, 0, 0, 0, 0x0b}
)

// frame returns the packet in an Ethernet frame.
func (p packet) frame() []byte {
	ethType := uint16(0x0800)
	if p.src.Is6() {
		ethType = 0x86dd
	}
	b := append(append([]byte{}, macA...), macB...)
	b = binary.BigEndian.AppendUint16(b, ethType)
	return append(b, p.ip()...)
}

// arpFrame returns an ARP request for 10.0.0.9 from 10.0.0.2.
func arpFrame() []byte {
	b := append(append([]byte{}, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff), macB...)
	b = binary.BigEndian.AppendUint16(b, 0x0806)
	b = binary.BigEndian.AppendUint16(b, 1)      // Ethernet
	b = binary.BigEndian.AppendUint16(b, 0x0800) // IPv4
	b = append(b, 6, 4)
	b = binary.BigEndian.AppendUint16(b, 1) // request
	b = append(b, macB...)
	b = append(b, 10, 0, 0, 2)
	b = append(b, 0, 0, 0, 0, 0, 0)
	return append(b, 10, 0, 0, 9)
}

// ip returns the IP packet: header, L4 header and payload.
func (p packet) ip() []byte {
	var l4 []byte
	if p.fragOffset == 0 {
		l4 = p.l4()
	}
	for range p.payload {
		l4 = append(l4, p.fill)
	}
	if p.l4Len > 0 && p.l4Len < len(l4) {
		l4 = l4[:p.l4Len]
	}
	id := p.fragID
	if id == 0 {
		id = 0x1234
	}
	var b []byte
	if p.src.Is4() {
		b = make([]byte, 20)
		b[0] = 0x45
		binary.BigEndian.PutUint16(b[2:], uint16(20+len(l4)))
		binary.BigEndian.PutUint16(b[4:], uint16(id))
		off := p.fragOffset & 0x1fff
		if p.moreFrags {
			off |= 0x2000
		}
		binary.BigEndian.PutUint16(b[6:], off)
		b[8] = 64
		b[9] = p.proto
		s, d := p.src.As4(), p.dst.As4()
		copy(b[12:], s[:])
		copy(b[16:], d[:])
		binary.BigEndian.PutUint16(b[10:], checksum(b))
	} else {
		exts := p.exts
		if p.fragOffset != 0 || p.moreFrags {
			exts = append(append([]ext{}, exts...), ext{ipProtoFragment, 8})
		}
		var eb []byte
		for i, e := range exts {
			next := p.proto
			if i+1 < len(exts) {
				next = exts[i+1].proto
			}
			h := make([]byte, e.size)
			h[0] = next
			switch e.proto {
			case ipProtoFragment:
				h = make([]byte, 8)
				h[0] = next
				off := p.fragOffset << 3
				if p.moreFrags {
					off |= 1
				}
				binary.BigEndian.PutUint16(h[2:], off)
				binary.BigEndian.PutUint32(h[4:], id)
			case ipProtoAH:
				h[1] = uint8(e.size/4 - 2)
			default:
				h[1] = uint8(e.size/8 - 1)
			}
			eb = append(eb, h...)
		}
		l4 = append(eb, l4...)
		b = make([]byte, 40)
		b[0] = 0x60
		binary.BigEndian.PutUint16(b[4:], uint16(len(l4)))
		b[6] = p.proto
		if len(exts) > 0 {
			b[6] = exts[0].proto
		}
		b[7] = 64
		s, d := p.src.As16(), p.dst.As16()
		copy(b[8:], s[:])
		copy(b[24:], d[:])
	}
	b = append(b, l4...)
	if p.truncate > 0 && p.truncate < len(b) {
		b = b[:p.truncate]
	}
	return b
}

// l4 returns the L4 header of the packet (checksums are left zero: the program does not
// check them).
func (p packet) l4() []byte {
	switch {
	case p.proto == ipProtoTCP:
		b := make([]byte, 20)
		binary.BigEndian.PutUint16(b[0:], p.sport)
		binary.BigEndian.PutUint16(b[2:], p.dport)
		binary.BigEndian.PutUint32(b[4:], 1000)
		b[12] = 5 << 4
		b[13] = p.tcpFlags
		binary.BigEndian.PutUint16(b[14:], 65535)
		return b
	case p.proto == ipProtoUDP:
		b := make([]byte, 8)
		binary.BigEndian.PutUint16(b[0:], p.sport)
		binary.BigEndian.PutUint16(b[2:], p.dport)
		binary.BigEndian.PutUint16(b[4:], uint16(8+p.payload))
		return b
	case p.proto == icmpProto(p.src):
		b := make([]byte, 8)
		b[0], b[1] = p.icmpType, p.icmpCode
		binary.BigEndian.PutUint16(b[4:], p.icmpID)
		binary.BigEndian.PutUint16(b[6:], 1)
		if p.embed != nil {
			in := p.embed.ip()
			hdr := 20
			if p.embed.src.Is6() {
				hdr = 40
			}
			if len(in) > hdr+8 {
				in = in[:hdr+8]
			}
			b = append(b, in...)
		}
		return b
	}
	return nil
}

// icmpProto returns the IP protocol of ICMP in the family of a: 1, or 58 for IPv6.
func icmpProto(a netip.Addr) uint8 {
	if a.Is4() {
		return 1
	}
	return 58
}
