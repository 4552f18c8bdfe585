package rtnl

import (
	"encoding/binary"
	"net/netip"

	"golang.org/x/sys/unix"
)

// Neigh is a decoded RTM_NEWNEIGH or RTM_DELNEIGH message: a neighbour (AF_INET,
// AF_INET6; `ip neigh show`) or an FDB entry (AF_BRIDGE; `bridge fdb show`), struct
// ndmsg and the attributes of it that the HAL reads.
type Neigh struct {
	// Family is ndm_family.
	Family uint8
	// Index is ndm_ifindex, the device of the entry.
	Index int32
	// State is ndm_state (NUD_*); Flags are ndm_flags (NTF_*).
	State uint16
	Flags uint8
	// Dst is NDA_DST, unmapped: a neighbour's address, a VXLAN FDB entry's remote.
	Dst netip.Addr
	// MAC is NDA_LLADDR when it is an Ethernet address (HasMAC).
	MAC    [6]byte
	HasMAC bool
	// VLAN is NDA_VLAN.
	VLAN uint16
	// Master is NDA_MASTER, the index of the bridge whose entry it is; 0 for a device's
	// own.
	Master int32
}

// ParseNeigh decodes the payload of an RTM_NEWNEIGH or RTM_DELNEIGH message (struct
// ndmsg and its attributes). ok is false when the payload is too short to hold struct
// ndmsg.
func ParseNeigh(b []byte) (n Neigh, ok bool) {
	if len(b) < unix.SizeofNdMsg {
		return Neigh{}, false
	}
	ne := binary.NativeEndian
	n.Family = b[0]
	n.Index = int32(ne.Uint32(b[4:8]))
	n.State = ne.Uint16(b[8:10])
	n.Flags = b[10]
	EachAttr(b[unix.SizeofNdMsg:], func(typ uint16, v []byte) {
		switch typ {
		case unix.NDA_DST:
			a, _ := netip.AddrFromSlice(v)
			n.Dst = a.Unmap()
		case unix.NDA_LLADDR:
			if len(v) == 6 {
				n.MAC = [6]byte(v)
				n.HasMAC = true
			}
		case unix.NDA_VLAN:
			if len(v) >= 2 {
				n.VLAN = ne.Uint16(v)
			}
		case unix.NDA_MASTER:
			n.Master = int32(AttrUint32(v))
		}
	})
	return n, true
}

// AppendNeighRequest appends to b a request of the type, RTM_NEWNEIGH (`ip neigh
// replace`, `bridge fdb append`, ... by the flags) or RTM_DELNEIGH, for the entry n:
// struct ndmsg with its family, interface, state and flags, then NDA_DST when n.Dst is
// valid and NDA_LLADDR when n.HasMAC.
func AppendNeighRequest(b []byte, typ, flags uint16, n Neigh) []byte {
	b = Message(b, typ, flags)
	// struct ndmsg: family, pad1, pad2, ifindex, state, flags, type.
	b = append(b, n.Family, 0, 0, 0)
	b = binary.NativeEndian.AppendUint32(b, uint32(n.Index))
	b = binary.NativeEndian.AppendUint16(b, n.State)
	b = append(b, n.Flags, 0)
	if n.Dst.IsValid() {
		b = AppendAttrAddr(b, unix.NDA_DST, n.Dst)
	}
	if n.HasMAC {
		b = AppendAttr(b, unix.NDA_LLADDR, n.MAC[:])
	}
	return b
}
