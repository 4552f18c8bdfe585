package linux

import (
	"net"
	"net/netip"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/naplesnet/naples/hal/linux/rtnl"
)

// TestParseRouteAgreesWithNetlink: the reconciler's decoding of route messages
// (parseRoute), which serves its dumps and its observer's notifications, finds the
// identity and next hops that the netlink library's decoding of a dump finds (kernelID,
// kernelRouteOf), for routes of both families, with one next hop or several, weighted,
// with and without gateways, in tables below and above 255, with and without a metric,
// and for default routes.
func TestParseRouteAgreesWithNetlink(t *testing.T) {
	h := newHost(t)
	sub, err := rtnl.Subscribe(&h.nsh, 1<<20, unix.RTNLGRP_IPV4_ROUTE, unix.RTNLGRP_IPV6_ROUTE)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Close() })

	routes := [][]string{
		{"-4", "route", "add", "198.51.100.0/24", "via", "10.10.0.2", "table", "100", "proto", "241"},
		{"-4", "route", "add", "198.51.101.0/24", "dev", "eth1", "table", "100"},
		{"-4", "route", "add", "198.51.102.0/24", "table", "1000", "metric", "7", "proto", "241",
			"nexthop", "via", "10.10.0.2", "weight", "3", "nexthop", "via", "10.20.0.2"},
		{"-4", "route", "add", "198.51.103.7/32", "via", "10.20.0.2", "dev", "eth1", "table", "100"},
		{"-6", "route", "add", "2001:db8:ff::/48", "via", "2001:db8:1::2", "table", "100", "proto", "241"},
		{"-6", "route", "add", "2001:db8:fe::/48", "table", "100", "metric", "5",
			"nexthop", "via", "2001:db8:1::2", "nexthop", "via", "2001:db8:2::2", "weight", "2"},
		// Default routes, which the kernel sends without a destination.
		{"-4", "route", "add", "default", "via", "10.10.0.2", "table", "100", "proto", "241"},
		{"-6", "route", "add", "default", "via", "2001:db8:1::2", "table", "1000", "metric", "3"},
		{"-4", "route", "del", "198.51.101.0/24", "table", "100"},
	}
	for _, args := range routes {
		h.ip(t, ipFamily{flag: args[0]}, args[1:]...)
	}

	// The notifications of the routes added, by identity, the last one of each.
	seen := map[routeID]kernelRoute{}
	deleted := map[routeID]bool{}
	timer := time.AfterFunc(20*time.Second, func() { sub.Close() })
	defer timer.Stop()
	for len(seen) < 8 || len(deleted) < 1 {
		err := sub.Receive(func(typ uint16, payload []byte) {
			id, rt, ok := parseRoute(payload)
			if !ok || (id.table != 100 && id.table != 1000) {
				return
			}
			switch typ {
			case unix.RTM_NEWROUTE:
				seen[id] = rt
			case unix.RTM_DELROUTE:
				deleted[id] = true
			}
		})
		if err != nil {
			t.Fatalf("receiving route notifications (%d seen): %v", len(seen), err)
		}
	}

	dumped := 0
	err = h.nl.RouteListFilteredIter(netlink.FAMILY_ALL, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE,
		func(rt netlink.Route) bool {
			id, ok := kernelID(rt)
			if !ok || (id.table != 100 && id.table != 1000) {
				return true
			}
			dumped++
			want := kernelRouteOf(&rt)
			got, ok := seen[id]
			if !ok {
				t.Errorf("no notification decoded as %s", id)
			} else if !reflect.DeepEqual(got, want) {
				t.Errorf("route %s: notification decoded as %+v, the library decodes the dump as %+v", id, got, want)
			}
			return true
		})
	if err != nil {
		t.Fatal(err)
	}
	if dumped != 7 {
		t.Errorf("dumped %d routes in tables 100 and 1000, want 7", dumped)
	}
	if want := mustID(t, 100, "198.51.101.0/24"); !deleted[want] {
		t.Errorf("the deletion of %s was not decoded; deleted: %v", want, deleted)
	}
}

// TestRouteIDKeepsThePrefix: the compact identity gives back the masked prefix, table and
// metric it was made of, and identities of different families never compare equal.
func TestRouteIDKeepsThePrefix(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"198.51.100.7/24", "198.51.100.0/24"},
		{"10.0.0.1/32", "10.0.0.1/32"},
		{"0.0.0.0/0", "0.0.0.0/0"},
		{"2001:db8:ff::1/48", "2001:db8:ff::/48"},
		{"::/0", "::/0"},
	} {
		id := newRouteID(7, netip.MustParsePrefix(tc.in), 9)
		if got := id.prefix().String(); got != tc.want || id.table != 7 || id.metric != 9 {
			t.Errorf("newRouteID(7, %s, 9) = %s table %d metric %d, want %s table 7 metric 9", tc.in, got, id.table, id.metric, tc.want)
		}
	}
	if newRouteID(1, netip.MustParsePrefix("0.0.0.0/0"), 0) == newRouteID(1, netip.MustParsePrefix("::/0"), 0) {
		t.Error("the IPv4 and IPv6 default routes have one identity")
	}
}

// kernelID is the identity of a route the netlink library decoded, if it has a
// destination.
func kernelID(rt netlink.Route) (routeID, bool) {
	if rt.Dst == nil {
		return routeID{}, false
	}
	addr, ok := netip.AddrFromSlice(rt.Dst.IP)
	if !ok {
		return routeID{}, false
	}
	ones, _ := rt.Dst.Mask.Size()
	return newRouteID(uint32(rt.Table), netip.PrefixFrom(addr.Unmap(), ones), uint32(rt.Priority)), true
}

// kernelRouteOf is what the mirror keeps of a route the netlink library decoded.
func kernelRouteOf(rt *netlink.Route) kernelRoute {
	k := kernelRoute{protocol: uint8(rt.Protocol), src: addrOf(rt.Src), oif: int32(rt.LinkIndex), scope: uint8(rt.Scope)}
	if len(rt.MultiPath) == 0 {
		k.hops = []hop{{gw: addrOf(rt.Gw), link: int32(rt.LinkIndex), weight: 1}}
	} else {
		k.hops = make([]hop, 0, len(rt.MultiPath))
		for _, nh := range rt.MultiPath {
			k.hops = append(k.hops, hop{gw: addrOf(nh.Gw), link: int32(nh.LinkIndex), weight: int32(nh.Hops) + 1})
		}
		slices.SortFunc(k.hops, compareHops)
	}
	return k
}

// addrOf converts a netlink address; nil is the zero Addr.
func addrOf(ip net.IP) netip.Addr {
	a, _ := netip.AddrFromSlice(ip)
	return a.Unmap()
}
