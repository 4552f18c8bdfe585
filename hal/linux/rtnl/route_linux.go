package rtnl

import (
	"encoding/binary"
	"iter"
	"net/netip"
	"strconv"

	"golang.org/x/sys/unix"
)

// Route is a decoded RTM_NEWROUTE or RTM_DELROUTE message (`ip route show table all`):
// struct rtmsg and the attributes of it that the HAL reads. The addresses are as the
// kernel sent them, 4 or 16 bytes; those of attributes the message did not carry are
// the zero Addr.
type Route struct {
	// Family is rtm_family, AF_INET or AF_INET6 for a route.
	Family uint8
	// DstLen is the destination's prefix length, rtm_dst_len.
	DstLen uint8
	// Table is RTA_TABLE, or rtm_table without it.
	Table uint32
	// Protocol, Scope and Type are rtm_protocol, rtm_scope and rtm_type (RTN_UNICAST,
	// ...).
	Protocol, Scope, Type uint8
	// Flags are rtm_flags (RTM_F_CLONED, ...).
	Flags uint32
	// Dst is RTA_DST; a default route comes without it.
	Dst netip.Addr
	// Gateway is RTA_GATEWAY.
	Gateway netip.Addr
	// OIF is RTA_OIF, the index of the interface the route leads out of.
	OIF int32
	// Priority is RTA_PRIORITY, the route's metric.
	Priority uint32
	// PrefSrc is RTA_PREFSRC, the preferred source address.
	PrefSrc netip.Addr
	// Multipath is the value of RTA_MULTIPATH, nil for a route without one; Nexthops
	// decodes it. It points into the message it was decoded from.
	Multipath []byte
}

// Nexthop is one next hop of a route's RTA_MULTIPATH (struct rtnexthop and its
// attributes).
type Nexthop struct {
	// Index is rtnh_ifindex, the interface.
	Index int32
	// Weight is rtnh_hops + 1, as `ip route` shows it.
	Weight int32
	// Gateway is the next hop's RTA_GATEWAY.
	Gateway netip.Addr
}

// ParseRoute decodes the payload of an RTM_NEWROUTE or RTM_DELROUTE message (struct
// rtmsg and its attributes). ok is false when the payload is too short to hold struct
// rtmsg.
func ParseRoute(b []byte) (r Route, ok bool) {
	if len(b) < unix.SizeofRtMsg {
		return Route{}, false
	}
	ne := binary.NativeEndian
	r.Family, r.DstLen = b[0], b[1]
	r.Table = uint32(b[4])
	r.Protocol, r.Scope, r.Type = b[5], b[6], b[7]
	r.Flags = ne.Uint32(b[8:12])
	EachAttr(b[unix.SizeofRtMsg:], func(typ uint16, v []byte) {
		switch typ {
		case unix.RTA_DST:
			r.Dst, _ = netip.AddrFromSlice(v)
		case unix.RTA_GATEWAY:
			r.Gateway, _ = netip.AddrFromSlice(v)
		case unix.RTA_OIF:
			r.OIF = int32(AttrUint32(v))
		case unix.RTA_PRIORITY:
			r.Priority = AttrUint32(v)
		case unix.RTA_PREFSRC:
			r.PrefSrc, _ = netip.AddrFromSlice(v)
		case unix.RTA_TABLE:
			if len(v) >= 4 {
				r.Table = ne.Uint32(v)
			}
		case unix.RTA_MULTIPATH:
			r.Multipath = v
		}
	})
	return r, true
}

// Nexthops returns the next hops of the route's RTA_MULTIPATH, in the kernel's order;
// none for a route without one.
func (r *Route) Nexthops() iter.Seq[Nexthop] {
	return func(yield func(Nexthop) bool) {
		ne := binary.NativeEndian
		mp := r.Multipath
		for len(mp) >= unix.SizeofRtNexthop {
			l := int(ne.Uint16(mp[0:2]))
			if l < unix.SizeofRtNexthop || l > len(mp) {
				return
			}
			h := Nexthop{Index: int32(ne.Uint32(mp[4:8])), Weight: int32(mp[3]) + 1}
			EachAttr(mp[unix.SizeofRtNexthop:l], func(typ uint16, v []byte) {
				if typ == unix.RTA_GATEWAY {
					h.Gateway, _ = netip.AddrFromSlice(v)
				}
			})
			if !yield(h) {
				return
			}
			mp = mp[min(len(mp), AttrAlign(l)):]
		}
	}
}

// AppendRouteRequest appends to b a request of the type, RTM_NEWROUTE (`ip route add`
// with NLM_F_CREATE|NLM_F_EXCL, `ip route replace` with NLM_F_CREATE|NLM_F_REPLACE) or
// RTM_DELROUTE (`ip route del`), for the route r to r.Dst/r.DstLen: struct rtmsg with
// r's family, protocol, scope and type and its table (RT_TABLE_UNSPEC in the header for
// a table above 255), then RTA_DST, and each of RTA_TABLE, RTA_PRIORITY, RTA_GATEWAY,
// RTA_OIF and RTA_PREFSRC when r sets it, and RTA_MULTIPATH of hops when there are any.
// The other fields of r are not sent.
func AppendRouteRequest(b []byte, typ, flags uint16, r Route, hops []Nexthop) []byte {
	b = Message(b, typ, flags)
	table := byte(unix.RT_TABLE_UNSPEC)
	if r.Table < 256 {
		table = byte(r.Table)
	}
	// struct rtmsg: family, dst_len, src_len, tos, table, protocol, scope, type, flags.
	b = append(b, r.Family, r.DstLen, 0, 0, table, r.Protocol, r.Scope, r.Type, 0, 0, 0, 0)
	b = AppendAttrAddr(b, unix.RTA_DST, r.Dst)
	if r.Table > 0 {
		b = AppendAttrUint32(b, unix.RTA_TABLE, r.Table)
	}
	if r.Priority > 0 {
		b = AppendAttrUint32(b, unix.RTA_PRIORITY, r.Priority)
	}
	if r.Gateway.IsValid() {
		b = AppendAttrAddr(b, unix.RTA_GATEWAY, r.Gateway)
	}
	if r.OIF != 0 {
		b = AppendAttrUint32(b, unix.RTA_OIF, uint32(r.OIF))
	}
	if r.PrefSrc.IsValid() {
		b = AppendAttrAddr(b, unix.RTA_PREFSRC, r.PrefSrc)
	}
	if len(hops) > 0 {
		start := len(b)
		b = AppendAttrHeader(b, unix.RTA_MULTIPATH, 0)
		for _, h := range hops {
			// struct rtnexthop: len, flags, hops (weight-1), ifindex; then attributes.
			nh := len(b)
			b = append(b, 0, 0, 0, byte(max(h.Weight, 1)-1))
			b = binary.NativeEndian.AppendUint32(b, uint32(h.Index))
			if h.Gateway.IsValid() {
				b = AppendAttrAddr(b, unix.RTA_GATEWAY, h.Gateway)
			}
			binary.NativeEndian.PutUint16(b[nh:], uint16(len(b)-nh))
		}
		binary.NativeEndian.PutUint16(b[start:], uint16(len(b)-start))
	}
	return b
}

// routeProtocolNames are the names of the route protocols (RTPROT_*) that
// RouteProtocolName knows.
var routeProtocolNames = map[uint8]string{
	unix.RTPROT_BABEL: "babel", unix.RTPROT_BGP: "bgp", unix.RTPROT_BIRD: "bird", unix.RTPROT_BOOT: "boot",
	unix.RTPROT_DHCP: "dhcp", unix.RTPROT_DNROUTED: "dnrouted", unix.RTPROT_EIGRP: "eigrp", unix.RTPROT_GATED: "gated",
	unix.RTPROT_ISIS: "isis", unix.RTPROT_KERNEL: "kernel", unix.RTPROT_MROUTED: "mrouted", unix.RTPROT_MRT: "mrt",
	unix.RTPROT_NTK: "ntk", unix.RTPROT_OSPF: "ospf", unix.RTPROT_RA: "ra", unix.RTPROT_REDIRECT: "redirect",
	unix.RTPROT_RIP: "rip", unix.RTPROT_STATIC: "static", unix.RTPROT_UNSPEC: "unspec", unix.RTPROT_XORP: "xorp",
	unix.RTPROT_ZEBRA: "zebra",
}

// RouteProtocolName names a route protocol (rtm_protocol) in lower case, as the netlink
// library does: "static", "kernel", "bgp"; a number without a name is its decimal form
// ("241").
func RouteProtocolName(p uint8) string {
	if name, ok := routeProtocolNames[p]; ok {
		return name
	}
	return strconv.Itoa(int(p))
}

// RouteGetRequest returns an RTM_GETROUTE request for the route the kernel would give a
// packet from src to dst received on the interface with index iif: an input route
// lookup, through the policy rules, as `ip route get DST from SRC iif DEV` asks it. The
// kernel answers with the route and an acknowledgement, or with ENETUNREACH (or
// EHOSTUNREACH) when it has none.
func RouteGetRequest(src, dst netip.Addr, iif int32) []byte {
	family, bits := byte(unix.AF_INET), byte(32)
	if dst.Is6() {
		family, bits = unix.AF_INET6, 128
	}
	b := Message(nil, unix.RTM_GETROUTE, 0)
	// struct rtmsg: family, dst_len, src_len, tos, table, protocol, scope, type, flags.
	b = append(b, family, bits, bits, 0, 0, 0, 0, 0, 0, 0, 0, 0)
	b = AppendAttrAddr(b, unix.RTA_DST, dst)
	b = AppendAttrAddr(b, unix.RTA_SRC, src)
	return AppendAttrUint32(b, unix.RTA_IIF, uint32(iif))
}
