package rtnl

import (
	"encoding/binary"
	"net/netip"

	"golang.org/x/sys/unix"
)

// AttrAddrProtocol is the attribute of an address's protocol (IFA_PROTO, Linux 6.3),
// which golang.org/x/sys/unix does not name.
const AttrAddrProtocol = 11

// Addr is a decoded RTM_NEWADDR or RTM_DELADDR message (`ip address show`): struct
// ifaddrmsg and the attributes of it that the HAL reads.
type Addr struct {
	// Family is ifa_family, AF_INET or AF_INET6 for an address.
	Family uint8
	// PrefixLen is ifa_prefixlen.
	PrefixLen uint8
	// Flags are IFA_FLAGS, or ifa_flags (their low 8 bits) without it: IFA_F_*.
	Flags uint32
	// Index is ifa_index, the interface that holds the address.
	Index int32
	// Local is IFA_LOCAL: an IPv4 address, whose IFA_ADDRESS is its peer.
	Local netip.Addr
	// Address is IFA_ADDRESS, which IPv6 sends alone unless the address has a peer.
	Address netip.Addr
	// Protocol is IFA_PROTO, who added the address; 0 from kernels without it.
	Protocol uint8
}

// ParseAddr decodes the payload of an RTM_NEWADDR or RTM_DELADDR message (struct
// ifaddrmsg and its attributes). ok is false when the payload is too short to hold
// struct ifaddrmsg.
func ParseAddr(b []byte) (a Addr, ok bool) {
	if len(b) < unix.SizeofIfAddrmsg {
		return Addr{}, false
	}
	a.Family, a.PrefixLen = b[0], b[1]
	a.Flags = uint32(b[2])
	a.Index = int32(binary.NativeEndian.Uint32(b[4:8]))
	EachAttr(b[unix.SizeofIfAddrmsg:], func(typ uint16, v []byte) {
		switch typ {
		case unix.IFA_LOCAL:
			a.Local, _ = netip.AddrFromSlice(v)
		case unix.IFA_ADDRESS:
			a.Address, _ = netip.AddrFromSlice(v)
		case unix.IFA_FLAGS:
			a.Flags = AttrUint32(v)
		case AttrAddrProtocol:
			if len(v) >= 1 {
				a.Protocol = v[0]
			}
		}
	})
	return a, true
}

// Prefix returns the interface's address with its prefix length: IFA_LOCAL when the
// message carried it, IFA_ADDRESS otherwise. ok is false when that is not an address of
// the message's family.
func (a *Addr) Prefix() (p netip.Prefix, ok bool) {
	addr := a.Address
	if a.Local.IsValid() {
		addr = a.Local
	}
	switch {
	case a.Family == unix.AF_INET && addr.Is4(), a.Family == unix.AF_INET6 && addr.Is6():
	default:
		return netip.Prefix{}, false
	}
	p = netip.PrefixFrom(addr, int(a.PrefixLen))
	return p, p.IsValid()
}

// AppendAddrRequest appends to b a request of the type, RTM_NEWADDR (`ip address add`)
// or RTM_DELADDR (`ip address del`), for the address p on the interface with the index:
// struct ifaddrmsg with the low 8 bits of ifaFlags, then IFA_LOCAL and IFA_ADDRESS, both
// p's address, as `ip address` sends them (an IPv4 delete matches the prefix length only
// when IFA_ADDRESS is there), and for RTM_NEWADDR the flags (IFA_FLAGS) and the protocol
// (AttrAddrProtocol), each when not 0.
func AppendAddrRequest(b []byte, typ, flags uint16, index int32, p netip.Prefix, ifaFlags uint32, protocol uint8) []byte {
	b = Message(b, typ, flags)
	family := byte(unix.AF_INET6)
	if p.Addr().Is4() {
		family = unix.AF_INET
	}
	// struct ifaddrmsg: family, prefixlen, flags, scope, index.
	b = append(b, family, byte(p.Bits()), byte(ifaFlags), unix.RT_SCOPE_UNIVERSE)
	b = binary.NativeEndian.AppendUint32(b, uint32(index))
	b = AppendAttrAddr(b, unix.IFA_LOCAL, p.Addr())
	b = AppendAttrAddr(b, unix.IFA_ADDRESS, p.Addr())
	if typ == unix.RTM_NEWADDR && ifaFlags != 0 {
		b = AppendAttrUint32(b, unix.IFA_FLAGS, ifaFlags)
	}
	if typ == unix.RTM_NEWADDR && protocol != 0 {
		b = AppendAttr(b, AttrAddrProtocol, []byte{protocol})
	}
	return b
}
