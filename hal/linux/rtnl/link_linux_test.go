package rtnl

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"

	"golang.org/x/sys/unix"
)

// linkPayload builds the payload of an RTM_NEWLINK message of the family about the link
// with the index, with the attributes attrs appends.
func linkPayload(family uint8, index int32, flags uint32, attrs func(b []byte) []byte) []byte {
	b := AppendIfInfo(nil, family, index, flags, 0)
	return attrs(b)
}

// TestParseLink decodes a VXLAN device that is a bridge port, a bridge's AF_BRIDGE view
// of a port, and a link's counters, each from the attributes the kernel sends.
func TestParseLink(t *testing.T) {
	vxlan := linkPayload(unix.AF_UNSPEC, 7, unix.IFF_UP, func(b []byte) []byte {
		b = AppendAttrString(b, unix.IFLA_IFNAME, "nvx01")
		b = AppendAttrString(b, unix.IFLA_IFALIAS, "naples:owner")
		b = AppendAttrUint32(b, unix.IFLA_MTU, 1450)
		b = AppendAttrUint32(b, unix.IFLA_MASTER, 5)
		b = AppendAttrUint32(b, unix.IFLA_GROUP, 42)
		b = AppendAttr(b, unix.IFLA_ADDRESS, []byte{2, 0, 0, 0, 0, 1})
		b, info := BeginNest(b, unix.IFLA_LINKINFO)
		b = AppendAttrString(b, unix.IFLA_INFO_KIND, "vxlan")
		b, data := BeginNest(b, unix.IFLA_INFO_DATA)
		b = AppendAttrUint32(b, unix.IFLA_VXLAN_ID, 100)
		b = AppendAttrAddr(b, unix.IFLA_VXLAN_LOCAL, netip.MustParseAddr("192.0.2.1"))
		b = AppendAttr(b, unix.IFLA_VXLAN_PORT, []byte{0x12, 0xb5})
		b = AppendAttrUint8(b, unix.IFLA_VXLAN_LEARNING, 0)
		b = EndNest(b, data)
		b = AppendAttrString(b, unix.IFLA_INFO_SLAVE_KIND, "bridge")
		b, slave := BeginNest(b, unix.IFLA_INFO_SLAVE_DATA)
		b = AppendAttrUint8(b, unix.IFLA_BRPORT_LEARNING, 0)
		b = AppendAttrUint8(b, unix.IFLA_BRPORT_NEIGH_SUPPRESS, 1)
		b = EndNest(b, slave)
		return EndNest(b, info)
	})
	port := linkPayload(unix.AF_BRIDGE, 8, 0, func(b []byte) []byte {
		b = AppendAttrString(b, unix.IFLA_IFNAME, "veth0")
		b, p := BeginNest(b, unix.IFLA_PROTINFO)
		b = AppendAttrUint8(b, unix.IFLA_BRPORT_LEARNING, 1)
		return EndNest(b, p)
	})
	stats := linkPayload(unix.AF_UNSPEC, 9, 0, func(b []byte) []byte {
		b = AppendAttrString(b, unix.IFLA_IFNAME, "eth0")
		b = AppendAttrUint8(b, unix.IFLA_OPERSTATE, 6)
		b = AppendAttrUint8(b, unix.IFLA_CARRIER, 1)
		s64 := make([]byte, 0, 64)
		for i := range 8 {
			s64 = binary.NativeEndian.AppendUint64(s64, uint64(i+1)<<33)
		}
		s32 := make([]byte, 32)
		// The 64-bit counters win, whichever comes first.
		b = AppendAttr(b, unix.IFLA_STATS64, s64)
		return AppendAttr(b, unix.IFLA_STATS, s32)
	})
	for _, tc := range []struct {
		name    string
		payload []byte
		want    Link
	}{
		{"vxlan port", vxlan, Link{
			Family: unix.AF_UNSPEC, Index: 7, Flags: unix.IFF_UP, Name: "nvx01", Alias: "naples:owner",
			Group: 42, MAC: "\x02\x00\x00\x00\x00\x01", MTU: 1450, Master: 5, Kind: "vxlan",
			VXLAN:      VXLANInfo{VNI: 100, Local: netip.MustParseAddr("192.0.2.1"), Port: 4789},
			BridgePort: true, Port: BridgePortInfo{NeighSuppress: true},
		}},
		{"bridge view of a port", port, Link{
			Family: unix.AF_BRIDGE, Index: 8, Name: "veth0", BridgePort: true, Protinfo: true,
			Port: BridgePortInfo{Learning: true},
		}},
		{"counters", stats, Link{
			Family: unix.AF_UNSPEC, Index: 9, Name: "eth0", OperState: 6, Carrier: true,
			Stats: LinkStats{1 << 33, 2 << 33, 3 << 33, 4 << 33, 5 << 33, 6 << 33, 7 << 33, 8 << 33},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := ParseLink(tc.payload)
			if !ok || got != tc.want {
				t.Errorf("ParseLink = %+v, %v\nwant %+v, true", got, ok, tc.want)
			}
		})
	}
	if _, ok := ParseLink(make([]byte, unix.SizeofIfInfomsg-1)); ok {
		t.Error("ParseLink of a payload shorter than struct ifinfomsg: ok")
	}
}

// TestLinkRequestRoundTrip: a VXLAN device's create, built by AppendLinkRequest, parses
// back as the link it was built from.
func TestLinkRequestRoundTrip(t *testing.T) {
	l := Link{Family: unix.AF_UNSPEC, Flags: unix.IFF_UP, Name: "nvx01", Alias: "naples:owner", Group: 42,
		MAC: "\x02\x00\x00\x00\x00\x01", MTU: 1450, Master: 5, Kind: "vxlan",
		VXLAN:      VXLANInfo{VNI: 100, Local: netip.MustParseAddr("2001:db8::1"), Port: 4789, Learning: true},
		BridgePort: true, Port: BridgePortInfo{Learning: true, NeighSuppress: true}}
	all := LinkName | LinkAlias | LinkGroup | LinkMAC | LinkMTU | LinkMaster | LinkKind | LinkVXLAN |
		LinkPortLearning | LinkPortNeighSuppress
	msg := AppendLinkRequest(nil, unix.RTM_NEWLINK, unix.NLM_F_CREATE|unix.NLM_F_EXCL, l, unix.IFF_UP, all)
	if got, ok := ParseLink(msg[unix.NLMSG_HDRLEN:]); !ok || got != l {
		t.Errorf("ParseLink(AppendLinkRequest(l)) = %+v, %v\nwant %+v, true", got, ok, l)
	}
}

// TestLinkRequestIPv4Forwarding: a link request that sets the IPv4 forwarding carries
// it as AppendIPv4ForwardingRequest does, beside the other attributes.
func TestLinkRequestIPv4Forwarding(t *testing.T) {
	l := Link{Index: 7, Alias: "naples:owner", MTU: 1450, IPv4Forwarding: 1}
	msg := AppendLinkRequest(nil, unix.RTM_NEWLINK, 0, l, 0, LinkAlias|LinkMTU|LinkIPv4Forwarding)
	want := AppendIPv4ForwardingRequest(nil, 7, 1)[unix.NLMSG_HDRLEN+unix.SizeofIfInfomsg:]
	var spec []byte
	EachAttr(msg[unix.NLMSG_HDRLEN+unix.SizeofIfInfomsg:], func(typ uint16, v []byte) {
		if typ == unix.IFLA_AF_SPEC {
			spec = AppendAttr(nil, typ, v)
		}
	})
	if !bytes.Equal(spec, want) {
		t.Errorf("IFLA_AF_SPEC of the link request = %x, want %x", spec, want)
	}
	if got, ok := ParseLink(msg[unix.NLMSG_HDRLEN:]); !ok || got.Alias != l.Alias || got.MTU != l.MTU {
		t.Errorf("ParseLink of the request = %+v, %v; want its alias and MTU", got, ok)
	}
}

// TestOperStateName names the operational states as `ip link` prints them, and a state
// beyond RFC 2863's as unknown.
func TestOperStateName(t *testing.T) {
	for state, want := range map[uint8]string{
		OperUnknown: "unknown", OperNotPresent: "not-present", OperDown: "down", OperLowerLayerDown: "lower-layer-down",
		OperTesting: "testing", OperDormant: "dormant", OperUp: "up", OperUp + 1: "unknown",
	} {
		if got := OperStateName(state); got != want {
			t.Errorf("OperStateName(%d) = %q, want %q", state, got, want)
		}
	}
}
