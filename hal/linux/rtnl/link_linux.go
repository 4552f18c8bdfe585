package rtnl

import (
	"encoding/binary"
	"net/netip"

	"golang.org/x/sys/unix"
)

// Link is a decoded RTM_NEWLINK or RTM_DELLINK message (`ip -d -s link show`): struct
// ifinfomsg and the attributes of it that the HAL reads. The fields of an attribute the
// message did not carry are zero.
type Link struct {
	// Family is AF_UNSPEC for a message about the link itself, AF_BRIDGE for a bridge's
	// view of one of its ports (`bridge link`), which carries no alias.
	Family uint8
	// Index is the interface index.
	Index int32
	// Flags are the interface's flags (IFF_UP, ...).
	Flags uint32
	// Name is IFLA_IFNAME.
	Name string
	// Alias is IFLA_IFALIAS (`ip link set DEV alias ALIAS`).
	Alias string
	// Group is IFLA_GROUP.
	Group uint32
	// MAC is IFLA_ADDRESS, the link-layer address, as raw bytes.
	MAC string
	// MTU is IFLA_MTU.
	MTU uint32
	// Master is IFLA_MASTER, the interface index of the bridge (or bond, ...) the link
	// is a port of; 0 for none.
	Master int32
	// OperState is IFLA_OPERSTATE, the RFC 2863 operational state (IF_OPER_*).
	OperState uint8
	// Carrier is IFLA_CARRIER.
	Carrier bool
	// Kind is IFLA_INFO_KIND: "bridge", "vxlan", "veth", ...; "" for a link without one.
	Kind string
	// VXLAN holds a VXLAN device's settings (IFLA_INFO_DATA of kind "vxlan").
	VXLAN VXLANInfo
	// BridgePort tells that the message describes the link as a port of a bridge:
	// IFLA_INFO_SLAVE_KIND "bridge", or in an AF_BRIDGE message IFLA_PROTINFO. Port
	// then holds the port's flags.
	BridgePort bool
	// Protinfo tells that an AF_BRIDGE message carried the port's flags
	// (IFLA_PROTINFO); `bridge link set dev PORT learning on` sends only that.
	Protinfo bool
	// Port holds a bridge port's flags.
	Port BridgePortInfo
	// Stats are the link's counters: IFLA_STATS64, or IFLA_STATS on kernels that send
	// no IFLA_STATS64.
	Stats LinkStats
	// IPv4Forwarding is, in a request that sets it (LinkIPv4Forwarding), the value of
	// net.ipv4.conf.DEV.forwarding; a decoded message leaves it zero.
	IPv4Forwarding uint32
}

// The operational states of a link (Link.OperState, IFLA_OPERSTATE), RFC 2863's, which
// golang.org/x/sys/unix does not name (IF_OPER_*).
const (
	OperUnknown uint8 = iota
	OperNotPresent
	OperDown
	OperLowerLayerDown
	OperTesting
	OperDormant
	OperUp
)

// operStateNames are the names `ip link` prints of the operational states, by number.
var operStateNames = [...]string{"unknown", "not-present", "down", "lower-layer-down", "testing", "dormant", "up"}

// OperStateName names an operational state as `ip link` prints it, in lower case: "up",
// "lower-layer-down", ...; "unknown" for a state it does not name.
func OperStateName(state uint8) string {
	if int(state) < len(operStateNames) {
		return operStateNames[state]
	}
	return "unknown"
}

// Up reports whether the link is administratively up (IFF_UP).
func (l *Link) Up() bool { return l.Flags&unix.IFF_UP != 0 }

// VXLANInfo is what Link holds of a VXLAN device (`ip -d link show` of type vxlan).
type VXLANInfo struct {
	// VNI is IFLA_VXLAN_ID.
	VNI uint32
	// Local is IFLA_VXLAN_LOCAL or IFLA_VXLAN_LOCAL6, the local tunnel address.
	Local netip.Addr
	// Port is IFLA_VXLAN_PORT, the UDP destination port.
	Port uint16
	// Learning is IFLA_VXLAN_LEARNING: the device learns remote addresses.
	Learning bool
}

// BridgePortInfo is what Link holds of a bridge port's flags (IFLA_BRPORT_*).
type BridgePortInfo struct {
	// Learning is IFLA_BRPORT_LEARNING: the bridge learns the source addresses of the
	// frames the port receives.
	Learning bool
	// NeighSuppress is IFLA_BRPORT_NEIGH_SUPPRESS: the bridge answers ARP and ND for the
	// port.
	NeighSuppress bool
}

// LinkStats are a link's counters (struct rtnl_link_stats64).
type LinkStats struct {
	RxPackets, TxPackets, RxBytes, TxBytes, RxErrors, TxErrors, RxDropped, TxDropped uint64
}

// ParseLink decodes the payload of an RTM_NEWLINK or RTM_DELLINK message (struct
// ifinfomsg and its attributes). ok is false when the payload is too short to hold
// struct ifinfomsg.
func ParseLink(b []byte) (l Link, ok bool) {
	if len(b) < unix.SizeofIfInfomsg {
		return Link{}, false
	}
	ne := binary.NativeEndian
	l.Family = b[0]
	l.Index = int32(ne.Uint32(b[4:8]))
	l.Flags = ne.Uint32(b[8:12])
	stats64 := false
	EachAttr(b[unix.SizeofIfInfomsg:], func(typ uint16, v []byte) {
		switch typ {
		case unix.IFLA_IFNAME:
			l.Name = CString(v)
		case unix.IFLA_MTU:
			l.MTU = AttrUint32(v)
		case unix.IFLA_ADDRESS:
			l.MAC = string(v)
		case unix.IFLA_MASTER:
			l.Master = int32(AttrUint32(v))
		case unix.IFLA_IFALIAS:
			l.Alias = CString(v)
		case unix.IFLA_GROUP:
			l.Group = AttrUint32(v)
		case unix.IFLA_OPERSTATE:
			if len(v) >= 1 {
				l.OperState = v[0]
			}
		case unix.IFLA_CARRIER:
			if len(v) >= 1 {
				l.Carrier = v[0] != 0
			}
		case unix.IFLA_LINKINFO:
			parseLinkInfo(v, &l)
		case unix.IFLA_PROTINFO:
			if l.Family == unix.AF_BRIDGE {
				l.Protinfo = true
				l.BridgePort = true
				parseBridgePort(v, &l.Port)
			}
		case unix.IFLA_STATS64:
			// struct rtnl_link_stats64: rx_packets, tx_packets, rx_bytes, tx_bytes,
			// rx_errors, tx_errors, rx_dropped, tx_dropped, ...
			if len(v) >= 64 {
				l.Stats = LinkStats{
					RxPackets: ne.Uint64(v[0:]), TxPackets: ne.Uint64(v[8:]),
					RxBytes: ne.Uint64(v[16:]), TxBytes: ne.Uint64(v[24:]),
					RxErrors: ne.Uint64(v[32:]), TxErrors: ne.Uint64(v[40:]),
					RxDropped: ne.Uint64(v[48:]), TxDropped: ne.Uint64(v[56:]),
				}
				stats64 = true
			}
		case unix.IFLA_STATS:
			// struct rtnl_link_stats, the same counters in 32 bits.
			if len(v) >= 32 && !stats64 {
				l.Stats = LinkStats{
					RxPackets: uint64(ne.Uint32(v[0:])), TxPackets: uint64(ne.Uint32(v[4:])),
					RxBytes: uint64(ne.Uint32(v[8:])), TxBytes: uint64(ne.Uint32(v[12:])),
					RxErrors: uint64(ne.Uint32(v[16:])), TxErrors: uint64(ne.Uint32(v[20:])),
					RxDropped: uint64(ne.Uint32(v[24:])), TxDropped: uint64(ne.Uint32(v[28:])),
				}
			}
		}
	})
	return l, true
}

// parseLinkInfo decodes IFLA_LINKINFO: the link's kind, a VXLAN device's settings and a
// bridge port's flags.
func parseLinkInfo(b []byte, l *Link) {
	var slaveKind string
	var slaveData []byte
	EachAttr(b, func(typ uint16, v []byte) {
		switch typ {
		case unix.IFLA_INFO_KIND:
			l.Kind = CString(v)
		case unix.IFLA_INFO_DATA:
			if l.Kind == "vxlan" {
				parseVXLANInfo(v, &l.VXLAN)
			}
		case unix.IFLA_INFO_SLAVE_KIND:
			slaveKind = CString(v)
		case unix.IFLA_INFO_SLAVE_DATA:
			slaveData = v
		}
	})
	// The kernel puts the kind first, but do not count on it.
	if slaveKind == "bridge" {
		l.BridgePort = true
		parseBridgePort(slaveData, &l.Port)
	}
}

// parseVXLANInfo decodes the IFLA_INFO_DATA of a VXLAN device.
func parseVXLANInfo(b []byte, x *VXLANInfo) {
	EachAttr(b, func(typ uint16, v []byte) {
		switch typ {
		case unix.IFLA_VXLAN_ID:
			x.VNI = AttrUint32(v)
		case unix.IFLA_VXLAN_LOCAL, unix.IFLA_VXLAN_LOCAL6:
			if a, ok := netip.AddrFromSlice(v); ok {
				x.Local = a
			}
		case unix.IFLA_VXLAN_PORT:
			if len(v) >= 2 {
				x.Port = binary.BigEndian.Uint16(v)
			}
		case unix.IFLA_VXLAN_LEARNING:
			x.Learning = len(v) > 0 && v[0] != 0
		}
	})
}

// parseBridgePort decodes a bridge port's flags, IFLA_BRPORT_* attributes.
func parseBridgePort(b []byte, p *BridgePortInfo) {
	EachAttr(b, func(typ uint16, v []byte) {
		switch typ {
		case unix.IFLA_BRPORT_LEARNING:
			p.Learning = len(v) > 0 && v[0] != 0
		case unix.IFLA_BRPORT_NEIGH_SUPPRESS:
			p.NeighSuppress = len(v) > 0 && v[0] != 0
		}
	})
}

// LinkAttrs names the attributes of a Link that AppendLinkRequest sends.
type LinkAttrs uint32

// The attributes AppendLinkRequest can send.
const (
	// LinkName is IFLA_IFNAME: Link.Name.
	LinkName LinkAttrs = 1 << iota
	// LinkAlias is IFLA_IFALIAS: Link.Alias.
	LinkAlias
	// LinkGroup is IFLA_GROUP: Link.Group.
	LinkGroup
	// LinkMAC is IFLA_ADDRESS: Link.MAC.
	LinkMAC
	// LinkMTU is IFLA_MTU: Link.MTU.
	LinkMTU
	// LinkMaster is IFLA_MASTER: Link.Master, 0 for none (`nomaster`).
	LinkMaster
	// LinkIPv4Forwarding is IFLA_AF_SPEC holding AF_INET holding IFLA_INET_CONF holding
	// IPV4_DEVCONF_FORWARDING: Link.IPv4Forwarding (AppendIPv4ForwardingRequest).
	LinkIPv4Forwarding
	// LinkKind is IFLA_INFO_KIND, Link.Kind, in IFLA_LINKINFO.
	LinkKind
	// LinkVXLAN is, with LinkKind, a VXLAN device's IFLA_INFO_DATA: Link.VXLAN's VNI,
	// local address (IFLA_VXLAN_LOCAL or IFLA_VXLAN_LOCAL6), port and learning.
	LinkVXLAN
	// LinkVXLANLearning is, with LinkKind, IFLA_INFO_DATA holding IFLA_VXLAN_LEARNING
	// alone: Link.VXLAN.Learning.
	LinkVXLANLearning
	// LinkPortLearning is a bridge port's IFLA_BRPORT_LEARNING, Link.Port.Learning, in
	// IFLA_INFO_SLAVE_DATA of slave kind "bridge".
	LinkPortLearning
	// LinkPortNeighSuppress is a bridge port's IFLA_BRPORT_NEIGH_SUPPRESS,
	// Link.Port.NeighSuppress, beside LinkPortLearning's.
	LinkPortNeighSuppress
)

// AppendLinkRequest appends to b a request of the type (RTM_NEWLINK: `ip link add` with
// NLM_F_CREATE|NLM_F_EXCL, `ip link set` without; RTM_DELLINK: `ip link del`;
// RTM_GETLINK: `ip link show`) for the link l: struct ifinfomsg with AF_UNSPEC, l.Index
// (0 to name the link by IFLA_IFNAME), l.Flags and the flags to change, then the
// attributes attrs names, in the order of LinkAttrs.
func AppendLinkRequest(b []byte, typ, flags uint16, l Link, change uint32, attrs LinkAttrs) []byte {
	b = AppendIfInfo(Message(b, typ, flags), unix.AF_UNSPEC, l.Index, l.Flags, change)
	if attrs&LinkName != 0 {
		b = AppendAttrString(b, unix.IFLA_IFNAME, l.Name)
	}
	if attrs&LinkAlias != 0 {
		b = AppendAttrString(b, unix.IFLA_IFALIAS, l.Alias)
	}
	if attrs&LinkGroup != 0 {
		b = AppendAttrUint32(b, unix.IFLA_GROUP, l.Group)
	}
	if attrs&LinkMAC != 0 {
		b = AppendAttr(b, unix.IFLA_ADDRESS, []byte(l.MAC))
	}
	if attrs&LinkMTU != 0 {
		b = AppendAttrUint32(b, unix.IFLA_MTU, l.MTU)
	}
	if attrs&LinkMaster != 0 {
		b = AppendAttrUint32(b, unix.IFLA_MASTER, uint32(l.Master))
	}
	if attrs&LinkIPv4Forwarding != 0 {
		b = appendIPv4Forwarding(b, l.IPv4Forwarding)
	}
	if attrs&(LinkKind|LinkPortLearning|LinkPortNeighSuppress) == 0 {
		return b
	}
	b, info := BeginNest(b, unix.IFLA_LINKINFO)
	if attrs&LinkKind != 0 {
		b = AppendAttrString(b, unix.IFLA_INFO_KIND, l.Kind)
		if attrs&(LinkVXLAN|LinkVXLANLearning) != 0 {
			var data int
			b, data = BeginNest(b, unix.IFLA_INFO_DATA)
			if attrs&LinkVXLAN != 0 {
				b = AppendAttrUint32(b, unix.IFLA_VXLAN_ID, l.VXLAN.VNI)
				if l.VXLAN.Local.Is4() {
					b = AppendAttrAddr(b, unix.IFLA_VXLAN_LOCAL, l.VXLAN.Local)
				} else {
					b = AppendAttrAddr(b, unix.IFLA_VXLAN_LOCAL6, l.VXLAN.Local)
				}
				b = AppendAttr(b, unix.IFLA_VXLAN_PORT, []byte{byte(l.VXLAN.Port >> 8), byte(l.VXLAN.Port)})
			}
			b = AppendAttrUint8(b, unix.IFLA_VXLAN_LEARNING, boolByte(l.VXLAN.Learning))
			b = EndNest(b, data)
		}
	}
	if attrs&(LinkPortLearning|LinkPortNeighSuppress) != 0 {
		b = AppendAttrString(b, unix.IFLA_INFO_SLAVE_KIND, "bridge")
		var data int
		b, data = BeginNest(b, unix.IFLA_INFO_SLAVE_DATA)
		if attrs&LinkPortLearning != 0 {
			b = AppendAttrUint8(b, unix.IFLA_BRPORT_LEARNING, boolByte(l.Port.Learning))
		}
		if attrs&LinkPortNeighSuppress != 0 {
			b = AppendAttrUint8(b, unix.IFLA_BRPORT_NEIGH_SUPPRESS, boolByte(l.Port.NeighSuppress))
		}
		b = EndNest(b, data)
	}
	return EndNest(b, info)
}

// boolByte is 1 for true, 0 for false.
func boolByte(v bool) uint8 {
	if v {
		return 1
	}
	return 0
}
