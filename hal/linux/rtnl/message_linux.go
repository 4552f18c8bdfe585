package rtnl

import (
	"encoding/binary"
	"net/netip"

	"golang.org/x/sys/unix"
)

// nlmAlign rounds n up to the alignment of netlink messages.
func nlmAlign(n int) int { return (n + unix.NLMSG_ALIGNTO - 1) &^ (unix.NLMSG_ALIGNTO - 1) }

// AttrAlign rounds n up to the alignment of netlink attributes (RTA_ALIGN).
func AttrAlign(n int) int { return (n + unix.RTA_ALIGNTO - 1) &^ (unix.RTA_ALIGNTO - 1) }

// Message starts a netlink message of the type and flags in b (its length and sequence
// number are left for Batcher.Do or Reader to fill in); the payload is appended to what it
// returns.
func Message(b []byte, typ, flags uint16) []byte {
	var h [unix.NLMSG_HDRLEN]byte
	binary.NativeEndian.PutUint16(h[4:6], typ)
	binary.NativeEndian.PutUint16(h[6:8], flags)
	return append(b, h[:]...)
}

// AppendAttr appends a netlink attribute (struct rtattr) holding data, padded.
func AppendAttr(b []byte, typ uint16, data []byte) []byte {
	b = AppendAttrHeader(b, typ, unix.SizeofRtAttr+len(data))
	b = append(b, data...)
	return PadAttr(b)
}

// AppendAttrUint32 appends a netlink attribute holding a uint32 in host byte order.
func AppendAttrUint32(b []byte, typ uint16, v uint32) []byte {
	b = AppendAttrHeader(b, typ, unix.SizeofRtAttr+4)
	return binary.NativeEndian.AppendUint32(b, v)
}

// AppendAttrHeader appends the header of an attribute of length l (header included).
func AppendAttrHeader(b []byte, typ uint16, l int) []byte {
	b = binary.NativeEndian.AppendUint16(b, uint16(l))
	return binary.NativeEndian.AppendUint16(b, typ)
}

// PadAttr pads b to the alignment of netlink attributes.
func PadAttr(b []byte) []byte {
	for len(b)%unix.RTA_ALIGNTO != 0 {
		b = append(b, 0)
	}
	return b
}

// EachAttr calls f with the type (flags masked out) and value of every netlink attribute
// in b.
func EachAttr(b []byte, f func(typ uint16, v []byte)) {
	ne := binary.NativeEndian
	for len(b) >= unix.SizeofRtAttr {
		l := int(ne.Uint16(b[0:2]))
		if l < unix.SizeofRtAttr || l > len(b) {
			return
		}
		f(ne.Uint16(b[2:4])&nlaTypeMask, b[unix.SizeofRtAttr:l])
		b = b[min(len(b), AttrAlign(l)):]
	}
}

// AttrUint32 returns an attribute's value as a uint32 in host byte order, 0 when it is
// too short.
func AttrUint32(v []byte) uint32 {
	if len(v) < 4 {
		return 0
	}
	return binary.NativeEndian.Uint32(v)
}

// CString returns the string of a NUL-terminated attribute.
func CString(v []byte) string { return unix.ByteSliceToString(v) }

// AppendIfInfo appends struct ifinfomsg: family, type, index, flags and the flags to
// change.
func AppendIfInfo(b []byte, family uint8, index int32, flags, change uint32) []byte {
	b = append(b, family, 0, 0, 0)
	b = binary.NativeEndian.AppendUint32(b, uint32(index))
	b = binary.NativeEndian.AppendUint32(b, flags)
	return binary.NativeEndian.AppendUint32(b, change)
}

// AppendAttrAddr appends an attribute holding an address, 4 or 16 bytes.
func AppendAttrAddr(b []byte, typ uint16, a netip.Addr) []byte {
	if a.Is4() {
		v := a.As4()
		return AppendAttr(b, typ, v[:])
	}
	v := a.As16()
	return AppendAttr(b, typ, v[:])
}

// AppendAttrString appends an attribute holding a NUL-terminated string.
func AppendAttrString(b []byte, typ uint16, s string) []byte {
	b = AppendAttrHeader(b, typ, unix.SizeofRtAttr+len(s)+1)
	b = append(b, s...)
	return PadAttr(append(b, 0))
}

// AppendAttrUint8 appends an attribute holding one byte.
func AppendAttrUint8(b []byte, typ uint16, v uint8) []byte {
	return AppendAttr(b, typ, []byte{v})
}

// BeginNest starts a nested attribute in b; EndNest, with the offset it returns, ends it.
func BeginNest(b []byte, typ uint16) ([]byte, int) {
	start := len(b)
	return AppendAttrHeader(b, typ, 0), start
}

// EndNest ends the nested attribute started at offset start.
func EndNest(b []byte, start int) []byte {
	binary.NativeEndian.PutUint16(b[start:], uint16(len(b)-start))
	return b
}

// LinkDumpRequest returns a request for every link (`ip link show`).
func LinkDumpRequest() []byte {
	return AppendIfInfo(Message(nil, unix.RTM_GETLINK, 0), unix.AF_UNSPEC, 0, 0, 0)
}

// BridgeLinkDumpRequest returns a request for the bridges' view of every bridge port
// (`bridge -d link show`, RTM_GETLINK of family AF_BRIDGE), whose answers carry each
// port's flags in IFLA_PROTINFO (Link.Port).
func BridgeLinkDumpRequest() []byte {
	return AppendIfInfo(Message(nil, unix.RTM_GETLINK, 0), unix.AF_BRIDGE, 0, 0, 0)
}

// AddrDumpRequest returns a request for every address of both families (`ip addr
// show`).
func AddrDumpRequest() []byte {
	return append(Message(nil, unix.RTM_GETADDR, 0), make([]byte, unix.SizeofIfAddrmsg)...)
}

// RouteDumpRequest returns a request for the routes of every table of the family
// (AF_UNSPEC: every family) and, unless protocol is 0, of the protocol (`ip route show
// table all proto P`): with strict checking the kernel sends only those.
func RouteDumpRequest(family, protocol uint8) []byte {
	// struct rtmsg: family, dst_len, src_len, tos, table, protocol, scope, type, flags.
	return append(Message(nil, unix.RTM_GETROUTE, 0), family, 0, 0, 0, 0, byte(protocol), 0, 0, 0, 0, 0, 0)
}

// NeighDumpRequest returns a request for every neighbour of the family (`ip neigh show`),
// or with AF_BRIDGE for every FDB entry (`bridge fdb show`).
func NeighDumpRequest(family uint8) []byte {
	// struct ndmsg: family, then zeros.
	return append(Message(nil, unix.RTM_GETNEIGH, 0), family, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
}

// RuleDumpRequest returns a request for every policy-routing rule of both families (`ip
// rule show`).
func RuleDumpRequest() []byte {
	// struct fib_rule_hdr, all zeros.
	return append(Message(nil, unix.RTM_GETRULE, 0), make([]byte, 12)...)
}
