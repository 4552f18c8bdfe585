package rtnl

import (
	"encoding/binary"
	"net/netip"
	"slices"
	"testing"

	"golang.org/x/sys/unix"
)

// TestParseRoute decodes a multipath route in a table above 255 and its next hops.
func TestParseRoute(t *testing.T) {
	b := []byte{unix.AF_INET, 24, 0, 0, unix.RT_TABLE_UNSPEC, 241, unix.RT_SCOPE_UNIVERSE, unix.RTN_UNICAST, 0, 0, 0, 0}
	b = AppendAttrAddr(b, unix.RTA_DST, netip.MustParseAddr("198.18.1.0"))
	b = AppendAttrUint32(b, unix.RTA_TABLE, 1000)
	b = AppendAttrUint32(b, unix.RTA_PRIORITY, 20)
	start := len(b)
	b = AppendAttrHeader(b, unix.RTA_MULTIPATH, 0)
	for i, gw := range []string{"10.0.0.2", "10.0.1.2"} {
		nh := len(b)
		b = append(b, 0, 0, 0, byte(i))
		b = binary.NativeEndian.AppendUint32(b, uint32(3+i))
		b = AppendAttrAddr(b, unix.RTA_GATEWAY, netip.MustParseAddr(gw))
		binary.NativeEndian.PutUint16(b[nh:], uint16(len(b)-nh))
	}
	binary.NativeEndian.PutUint16(b[start:], uint16(len(b)-start))

	r, ok := ParseRoute(b)
	if !ok {
		t.Fatal("ParseRoute: not ok")
	}
	if r.Family != unix.AF_INET || r.DstLen != 24 || r.Table != 1000 || r.Protocol != 241 || r.Type != unix.RTN_UNICAST ||
		r.Dst != netip.MustParseAddr("198.18.1.0") || r.Priority != 20 || r.Gateway.IsValid() || r.OIF != 0 {
		t.Errorf("ParseRoute = %+v", r)
	}
	want := []Nexthop{
		{Index: 3, Weight: 1, Gateway: netip.MustParseAddr("10.0.0.2")},
		{Index: 4, Weight: 2, Gateway: netip.MustParseAddr("10.0.1.2")},
	}
	if got := slices.Collect(r.Nexthops()); !slices.Equal(got, want) {
		t.Errorf("Nexthops = %+v, want %+v", got, want)
	}
	if _, ok := ParseRoute(b[:unix.SizeofRtMsg-1]); ok {
		t.Error("ParseRoute of a payload shorter than struct rtmsg: ok")
	}
}

// TestAddrPrefix: an IPv4 address is IFA_LOCAL, not its peer in IFA_ADDRESS; IPv6 sends
// IFA_ADDRESS alone; an address of the other family is none.
func TestAddrPrefix(t *testing.T) {
	msg := func(family, bits uint8, attrs map[uint16]string) []byte {
		b := []byte{family, bits, 0, 0}
		b = binary.NativeEndian.AppendUint32(b, 7)
		for _, typ := range []uint16{unix.IFA_ADDRESS, unix.IFA_LOCAL} {
			if a, ok := attrs[typ]; ok {
				b = AppendAttrAddr(b, typ, netip.MustParseAddr(a))
			}
		}
		return AppendAttrUint32(b, unix.IFA_FLAGS, unix.IFA_F_NOPREFIXROUTE)
	}
	for _, tc := range []struct {
		name string
		b    []byte
		want string
	}{
		{"ipv4 with a peer", msg(unix.AF_INET, 32, map[uint16]string{unix.IFA_LOCAL: "10.0.0.1", unix.IFA_ADDRESS: "10.0.0.2"}), "10.0.0.1/32"},
		{"ipv6", msg(unix.AF_INET6, 64, map[uint16]string{unix.IFA_ADDRESS: "2001:db8::1"}), "2001:db8::1/64"},
		{"family mismatch", msg(unix.AF_INET, 24, map[uint16]string{unix.IFA_ADDRESS: "2001:db8::1"}), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, ok := ParseAddr(tc.b)
			if !ok || a.Index != 7 || a.Flags != unix.IFA_F_NOPREFIXROUTE {
				t.Fatalf("ParseAddr = %+v, %v", a, ok)
			}
			got := ""
			if p, ok := a.Prefix(); ok {
				got = p.String()
			}
			if got != tc.want {
				t.Errorf("Prefix = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestRouteRequestRoundTrip: routes built by AppendRouteRequest parse back as built, one
// through a device with a preferred source in a table above 255, one multipath.
func TestRouteRequestRoundTrip(t *testing.T) {
	dev := Route{Family: unix.AF_INET, DstLen: 24, Table: 1000, Protocol: 242, Scope: unix.RT_SCOPE_LINK,
		Type: unix.RTN_UNICAST, Dst: netip.MustParseAddr("10.1.0.0"), OIF: 9, PrefSrc: netip.MustParseAddr("10.1.0.1")}
	msg := AppendRouteRequest(nil, unix.RTM_NEWROUTE, 0, dev, nil)
	if got, ok := ParseRoute(msg[unix.NLMSG_HDRLEN:]); !ok || !sameRoute(got, dev) {
		t.Errorf("ParseRoute(AppendRouteRequest(r)) = %+v, %v\nwant %+v", got, ok, dev)
	}
	ecmp := Route{Family: unix.AF_INET6, DstLen: 64, Table: 100, Protocol: 241, Type: unix.RTN_UNICAST,
		Dst: netip.MustParseAddr("2001:db8::"), Priority: 1024}
	hops := []Nexthop{{Index: 3, Weight: 1, Gateway: netip.MustParseAddr("fe80::1")}, {Index: 4, Weight: 3, Gateway: netip.MustParseAddr("fe80::2")}}
	msg = AppendRouteRequest(nil, unix.RTM_NEWROUTE, 0, ecmp, hops)
	got, ok := ParseRoute(msg[unix.NLMSG_HDRLEN:])
	if !ok || !sameRoute(got, ecmp) || !slices.Equal(slices.Collect(got.Nexthops()), hops) {
		t.Errorf("ParseRoute(AppendRouteRequest(r, hops)) = %+v, %v, hops %+v\nwant %+v, hops %+v", got, ok, slices.Collect(got.Nexthops()), ecmp, hops)
	}
}

// sameRoute compares routes but for their raw RTA_MULTIPATH.
func sameRoute(a, b Route) bool {
	return a.Family == b.Family && a.DstLen == b.DstLen && a.Table == b.Table && a.Protocol == b.Protocol &&
		a.Scope == b.Scope && a.Type == b.Type && a.Flags == b.Flags && a.Dst == b.Dst && a.Gateway == b.Gateway &&
		a.OIF == b.OIF && a.Priority == b.Priority && a.PrefSrc == b.PrefSrc
}

// TestRouteProtocolName checks that a route protocol with a name is named as the netlink
// library names it, and one without by its number.
func TestRouteProtocolName(t *testing.T) {
	for p, want := range map[uint8]string{unix.RTPROT_STATIC: "static", unix.RTPROT_KERNEL: "kernel", unix.RTPROT_UNSPEC: "unspec", 241: "241"} {
		if got := RouteProtocolName(p); got != want {
			t.Errorf("RouteProtocolName(%d) = %q, want %q", p, got, want)
		}
	}
}
