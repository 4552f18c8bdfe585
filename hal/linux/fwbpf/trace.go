package fwbpf

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
)

// TraceDSCP is the DSCP of a trace packet (IPv4 TOS >> 2, IPv6 traffic class >> 2): 43,
// 0x2b, which no standard or common scheme uses. A packet is a trace packet when it has
// this DSCP, its L4 payload starts with the trace tag (TracePacket.Frame) and the tag's
// id and nonce are an installed trace's (Objects.StartTrace); any other packet, this
// DSCP or not, is ordinary traffic.
const TraceDSCP = 0x2b

// MaxTraces is how many traces may be installed at once (MapTraces' capacity).
const MaxTraces = 64

// TraceTagSize is the size of the tag that starts a trace packet's L4 payload: the magic
// "NAPLESTR", the trace id (big-endian), 4 zero bytes and the nonce (little-endian, as the
// program compares it with the trace's).
const TraceTagSize = 24

// traceMagic starts a trace tag.
const traceMagic = "NAPLESTR"

// MaxTracePayload is the most bytes of L4 payload TracePacket.PayloadSize may ask for.
const MaxTracePayload = 9000

// Stages of a trace event (TraceEvent.Stage): where the packet was seen.
const (
	// TraceStageFromEndpoint: the tcx ingress hook of an endpoint's interface, checked
	// against its egress policy.
	TraceStageFromEndpoint = 1
	// TraceStageToEndpoint: the tcx egress hook of an endpoint's interface, checked
	// against its ingress policy.
	TraceStageToEndpoint = 2
	// TraceStageTunnelOut: the tcx egress hook of a tunnel device, before encapsulation.
	TraceStageTunnelOut = 3
	// TraceStageTunnelIn: the tcx ingress hook of a tunnel device, after decapsulation.
	TraceStageTunnelIn = 4
	// TraceStageGatewayIn: the tcx ingress hook of a bridge: up to the host's routing.
	TraceStageGatewayIn = 5
	// TraceStageGatewayOut: the tcx egress hook of a bridge: routed into its network.
	TraceStageGatewayOut = 6
)

// Verdicts of a trace event (TraceEvent.Verdict).
const (
	// TraceVerdictAllowed: the endpoint's egress policy let the packet out (Rule); it
	// goes on.
	TraceVerdictAllowed = 1
	// TraceVerdictDenied: the packet was dropped, for Reason (ReasonPolicy, with the
	// deciding Rule, 0 when no rule allowed it; ReasonSpoofed; ReasonMalformed).
	TraceVerdictDenied = 2
	// TraceVerdictSeen: an observer saw the packet.
	TraceVerdictSeen = 3
	// TraceVerdictDelivered: the endpoint's ingress policy let the packet in (Rule); it
	// was dropped before the endpoint, which never receives a trace packet.
	TraceVerdictDelivered = 4
)

// TracePacket describes a trace packet, as the source endpoint would send it.
type TracePacket struct {
	// ID is the trace's id, and Nonce its nonce, as StartTrace installed them.
	ID    uint32
	Nonce uint64
	// SrcMAC and DstMAC are the Ethernet addresses: the source endpoint's and its next
	// hop's (the destination endpoint's, or the gateway's).
	SrcMAC, DstMAC net.HardwareAddr
	// Src and Dst are the IP addresses, both IPv4 or both IPv6.
	Src, Dst netip.Addr
	// Proto is the IP protocol: 6 (TCP, a SYN), 17 (UDP), 1 (ICMP echo request, IPv4) or
	// 58 (ICMPv6 echo request). An echo's identifier is the low 16 bits of ID.
	Proto uint8
	// SrcPort and DstPort are the TCP or UDP ports; ignored for ICMP.
	SrcPort, DstPort uint16
	// PayloadSize is how many bytes of L4 payload the packet carries: the tag, then
	// zeros. 0 means TraceTagSize; otherwise from TraceTagSize to MaxTracePayload.
	PayloadSize int
}

// Frame returns the packet as an Ethernet frame: IPv4 (TTL 64, header checksum, no
// options, don't fragment) or IPv6 (hop limit 64, no extension header), DSCP TraceDSCP,
// and a TCP SYN, UDP datagram or ICMP/ICMPv6 echo request with its checksum, whose
// payload is the trace tag followed by zeros.
func (p TracePacket) Frame() ([]byte, error) {
	if len(p.SrcMAC) != 6 {
		return nil, fmt.Errorf("trace packet source MAC %q: want 6 bytes", p.SrcMAC)
	}
	if len(p.DstMAC) != 6 {
		return nil, fmt.Errorf("trace packet destination MAC %q: want 6 bytes", p.DstMAC)
	}
	if !p.Src.IsValid() || !p.Dst.IsValid() || p.Src.Is4() != p.Dst.Is4() || p.Src.Is4In6() || p.Dst.Is4In6() {
		return nil, fmt.Errorf("trace packet addresses %v and %v: want two IPv4 or two IPv6 addresses", p.Src, p.Dst)
	}
	v4 := p.Src.Is4()
	var l4h int
	switch {
	case p.Proto == 6:
		l4h = 20
	case p.Proto == 17:
		l4h = 8
	case p.Proto == 1 && v4, p.Proto == 58 && !v4:
		l4h = 8
	default:
		return nil, fmt.Errorf("trace packet protocol %d: want 6 (TCP), 17 (UDP), 1 (ICMP, IPv4) or 58 (ICMPv6, IPv6) for %v", p.Proto, p.Src)
	}
	size := p.PayloadSize
	if size == 0 {
		size = TraceTagSize
	}
	if size < TraceTagSize || size > MaxTracePayload {
		return nil, fmt.Errorf("trace packet payload size %d: want 0 (%d) or %d to %d", p.PayloadSize, TraceTagSize, TraceTagSize, MaxTracePayload)
	}

	iph := 20
	etype := uint16(0x0800)
	if !v4 {
		iph, etype = 40, 0x86dd
	}
	l4len := l4h + size
	b := make([]byte, 14+iph+l4len)
	copy(b[0:6], p.DstMAC)
	copy(b[6:12], p.SrcMAC)
	binary.BigEndian.PutUint16(b[12:], etype)
	ip := b[14 : 14+iph]
	src, dst := p.Src.AsSlice(), p.Dst.AsSlice()
	if v4 {
		ip[0] = 0x45
		ip[1] = TraceDSCP << 2
		binary.BigEndian.PutUint16(ip[2:], uint16(iph+l4len))
		binary.BigEndian.PutUint16(ip[6:], 0x4000) // don't fragment
		ip[8] = 64
		ip[9] = p.Proto
		copy(ip[12:16], src)
		copy(ip[16:20], dst)
		binary.BigEndian.PutUint16(ip[10:], checksum(ip))
	} else {
		binary.BigEndian.PutUint32(ip[0:], 6<<28|uint32(TraceDSCP<<2)<<20)
		binary.BigEndian.PutUint16(ip[4:], uint16(l4len))
		ip[6] = p.Proto
		ip[7] = 64
		copy(ip[8:24], src)
		copy(ip[24:40], dst)
	}

	l4 := b[14+iph:]
	tag := l4[l4h:]
	copy(tag[0:8], traceMagic)
	binary.BigEndian.PutUint32(tag[8:], p.ID)
	binary.LittleEndian.PutUint64(tag[16:], p.Nonce)
	var csumAt int
	switch p.Proto {
	case 6:
		binary.BigEndian.PutUint16(l4[0:], p.SrcPort)
		binary.BigEndian.PutUint16(l4[2:], p.DstPort)
		binary.BigEndian.PutUint32(l4[4:], 1) // sequence number
		l4[12] = 5 << 4
		l4[13] = 0x02 // SYN
		binary.BigEndian.PutUint16(l4[14:], 65535)
		csumAt = 16
	case 17:
		binary.BigEndian.PutUint16(l4[0:], p.SrcPort)
		binary.BigEndian.PutUint16(l4[2:], p.DstPort)
		binary.BigEndian.PutUint16(l4[4:], uint16(l4len))
		csumAt = 6
	default:
		l4[0] = 8 // echo request
		if !v4 {
			l4[0] = 128
		}
		binary.BigEndian.PutUint16(l4[4:], uint16(p.ID))
		binary.BigEndian.PutUint16(l4[6:], 1) // sequence number
		csumAt = 2
	}
	var sum uint16
	if p.Proto == 1 {
		sum = checksum(l4)
	} else {
		sum = checksum(append(pseudoHeader(src, dst, p.Proto, l4len), l4...))
		if sum == 0 && p.Proto == 17 {
			sum = 0xffff // UDP's 0 means no checksum
		}
	}
	binary.BigEndian.PutUint16(l4[csumAt:], sum)
	return b, nil
}

// pseudoHeader returns the pseudo-header of the L4 checksum of a packet of the addresses
// (4 or 16 bytes each), protocol and L4 length.
func pseudoHeader(src, dst []byte, proto uint8, l4len int) []byte {
	ph := append(append([]byte{}, src...), dst...)
	if len(src) == 4 {
		return append(ph, 0, proto, byte(l4len>>8), byte(l4len))
	}
	return append(ph, byte(l4len>>24), byte(l4len>>16), byte(l4len>>8), byte(l4len), 0, 0, 0, proto)
}

// checksum returns the Internet checksum of b.
func checksum(b []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	return ^uint16(sum)
}
