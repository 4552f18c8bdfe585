package linux

import (
	"cmp"
	"context"
	"net/netip"
	"slices"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/naplesnet/naples/hal"
	"github.com/naplesnet/naples/hal/linux/rtnl"
)

// kernelRoute is what a KernelView's route table holds of a route (`ip route show table
// all`), keyed by its identity (routeID: table, destination, metric): who made it and
// where it leads.
type kernelRoute struct {
	protocol uint8
	// hops are the next hops, sorted by gateway and then interface.
	hops []hop
	// src is the preferred source address (RTA_PREFSRC), the zero Addr for none.
	src netip.Addr
	// oif is the interface the route leads out of (RTA_OIF), 0 for a route with next
	// hops of their own.
	oif int32
	// scope is rtm_scope; the kernel reports every IPv6 route with scope universe.
	scope uint8
}

// hop is a next hop in a form that compares equal however the kernel reports it.
type hop struct {
	gw     netip.Addr
	link   int32
	weight int32
}

// The fields of a kernelRoute, a bit each, as a tableChange reports those that changed.
const (
	routeFieldProtocol uint64 = 1 << iota
	routeFieldHops
	routeFieldSrc
	routeFieldOIF
	routeFieldScope
)

// routeFields returns the fields in which two states of a route differ.
func routeFields(a, b kernelRoute) uint64 {
	var f uint64
	if a.protocol != b.protocol {
		f |= routeFieldProtocol
	}
	if !slices.Equal(a.hops, b.hops) {
		f |= routeFieldHops
	}
	if a.src != b.src {
		f |= routeFieldSrc
	}
	if a.oif != b.oif {
		f |= routeFieldOIF
	}
	if a.scope != b.scope {
		f |= routeFieldScope
	}
	return f
}

// routeTable is a KernelView's table of the IPv4 and IPv6 routes of every table but
// cached ones, keyed by identity, with its indexes.
type routeTable struct {
	*viewTable[routeID, kernelRoute]
	// protocols finds the routes of one protocol: those naples made are RouteProtocol's
	// and OverlayRouteProtocol's.
	protocols *hal.Index[routeID, kernelRoute, uint8]
	// byLink finds the routes that lead out of an interface (kernelRoute.oif), bySrc
	// those with a preferred source address. The network reconciler alone reads them,
	// so they are built at its first read (hal.NewLazyIndex): a host with many routes
	// and no network does not index each.
	byLink *hal.Index[routeID, kernelRoute, int32]
	bySrc  *hal.Index[routeID, kernelRoute, netip.Addr]
	// v4Mu guards v4Links, the number of next hops of IPv4 routes that go through each
	// link, by its interface index: the kernel flushes them without a notification when
	// the link goes down or away, or loses an address.
	v4Mu    sync.Mutex
	v4Links map[int32]int
}

// newRouteTable returns an empty route table.
func newRouteTable() *routeTable {
	t := &routeTable{viewTable: newViewTable(viewTableOptions[routeID, kernelRoute]{
		groups: []uint{unix.RTNLGRP_IPV4_ROUTE, unix.RTNLGRP_IPV6_ROUTE},
		equal:  sameRoute,
		hash:   routeID.hash,
		fields: routeFields,
		notify: notifyRoute,
		dump: func(ctx context.Context, c *rtnlConn, m *hal.Mirror[routeID, kernelRoute]) error {
			_, err := dumpMirror(ctx, c, m, "routes", unix.RTM_NEWROUTE, parseRoute, rtnl.RouteDumpRequest(unix.AF_UNSPEC, 0))
			return err
		},
	})}
	t.protocols = hal.NewIndex(t.m, func(_ routeID, rt kernelRoute) (uint8, bool) { return rt.protocol, true })
	t.byLink = hal.NewLazyIndex(t.m, func(_ routeID, rt kernelRoute) (int32, bool) { return rt.oif, rt.oif != 0 })
	t.bySrc = hal.NewLazyIndex(t.m, func(_ routeID, rt kernelRoute) (netip.Addr, bool) { return rt.src, rt.src.IsValid() })
	t.v4Links = map[int32]int{}
	t.m.Follow(t.followLinks)
	return t
}

// followLinks keeps v4Links current.
func (t *routeTable) followLinks(c hal.MirrorChange[routeID, kernelRoute]) {
	if !c.Key.v4 {
		return
	}
	t.v4Mu.Lock()
	defer t.v4Mu.Unlock()
	if c.Had {
		for _, h := range c.Old.hops {
			if t.v4Links[h.link]--; t.v4Links[h.link] <= 0 {
				delete(t.v4Links, h.link)
			}
		}
	}
	if c.Has {
		for _, h := range c.New.hops {
			t.v4Links[h.link]++
		}
	}
}

// get returns the route with the identity.
func (t *routeTable) get(id routeID) (kernelRoute, bool) { return t.m.Get(id) }

// carriesV4 tells whether the table holds an IPv4 route through the link with the index.
func (t *routeTable) carriesV4(index int32) bool {
	t.v4Mu.Lock()
	defer t.v4Mu.Unlock()
	return t.v4Links[index] > 0
}

// notifyRoute applies a route notification, an RTM_NEWROUTE or RTM_DELROUTE, to the
// table's mirror.
func notifyRoute(m *hal.Mirror[routeID, kernelRoute], typ uint16, payload []byte) {
	if typ != unix.RTM_NEWROUTE && typ != unix.RTM_DELROUTE {
		return
	}
	id, rt, ok := parseRoute(payload)
	switch {
	case !ok:
	case typ == unix.RTM_NEWROUTE:
		m.Update(id, rt)
	default:
		m.Remove(id)
	}
}

// parseRoute decodes the payload of an RTM_NEWROUTE or RTM_DELROUTE message (struct
// rtmsg and its attributes) into the route's identity and what the table holds of it,
// as the netlink library decodes a route: the destination of a route without one (a
// default route, which the kernel sends without RTA_DST) is the unspecified address of
// its family. ok is false for a message of a family other than IPv4 and IPv6 and for a
// cached route (RTM_F_CLONED), which naples could not have created.
func parseRoute(b []byte) (id routeID, rt kernelRoute, ok bool) {
	m, ok := rtnl.ParseRoute(b)
	if !ok || (m.Family != unix.AF_INET && m.Family != unix.AF_INET6) || m.Flags&unix.RTM_F_CLONED != 0 {
		return routeID{}, kernelRoute{}, false
	}
	rt.protocol = m.Protocol
	rt.src, rt.oif, rt.scope = m.PrefSrc.Unmap(), m.OIF, m.Scope
	dst := m.Dst
	switch {
	case dst.IsValid():
	case m.Family == unix.AF_INET:
		dst = netip.IPv4Unspecified()
	default:
		dst = netip.IPv6Unspecified()
	}
	id = newRouteID(m.Table, netip.PrefixFrom(dst.Unmap(), int(m.DstLen)), m.Priority)
	own := hop{gw: m.Gateway.Unmap(), link: m.OIF, weight: 1}
	if m.Multipath == nil {
		rt.hops = []hop{own}
		return id, rt, true
	}
	for h := range m.Nexthops() {
		rt.hops = append(rt.hops, hop{gw: h.Gateway.Unmap(), link: h.Index, weight: h.Weight})
	}
	if len(rt.hops) == 0 {
		// As the netlink library decodes it: no next hops is the route's own.
		rt.hops = []hop{own}
	}
	slices.SortFunc(rt.hops, compareHops)
	return id, rt, true
}

// compareHops orders next hops by gateway and then interface.
func compareHops(a, b hop) int {
	if c := a.gw.Compare(b.gw); c != 0 {
		return c
	}
	return cmp.Compare(a.link, b.link)
}

// sameRoute reports whether the kernel route have is the route want: the same protocol and
// exactly the wanted next hops, where a wanted hop without an interface matches whatever
// interface the kernel chose; a preferred source, output interface or scope that want
// leaves zero matches whatever the kernel holds, as for the routes of RouteProtocol,
// which name none.
func sameRoute(have, want kernelRoute) bool {
	return have.protocol == want.protocol && slices.EqualFunc(have.hops, want.hops, func(a, b hop) bool {
		return a.gw == b.gw && a.weight == b.weight && (b.link == 0 || a.link == b.link)
	}) &&
		(!want.src.IsValid() || have.src == want.src) &&
		(want.oif == 0 || have.oif == want.oif) &&
		(want.scope == 0 || have.scope == want.scope)
}
