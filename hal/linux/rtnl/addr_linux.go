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
