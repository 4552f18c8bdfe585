package linux

import (
	"context"
	"maps"
	"slices"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/naplesnet/naples/hal/linux/rtnl"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// This file holds how the network reconciler keeps its mirrors current: the dumps that
// fill them, the observer that applies the kernel's notifications, and the sweep that
// dumps afresh and removes what no desired network owns.

// fill loads the view's link, address, rule and route tables and the mirrors with a dump,
// unless one has loaded them already.
func (r *NetworkReconciler) fill(ctx context.Context) error {
	if err := r.links.fill(ctx, r.rtnlConn); err != nil {
		return err
	}
	if err := r.addrs.fill(ctx, r.rtnlConn); err != nil {
		return err
	}
	if err := r.rules.fill(ctx, r.rtnlConn); err != nil {
		return err
	}
	if err := r.routes.fill(ctx, r.rtnlConn); err != nil {
		return err
	}
	if err := r.neigh.fdb.fill(ctx, r.rtnlConn); err != nil {
		return err
	}
	return r.loadOnce(ctx, func(ctx context.Context) error {
		_, err := r.dumpAll(ctx)
		return err
	})
}

// resync loads the mirrors with fresh dumps and enqueues the networks whose kernel state
// the dumps found changed. The first load reports nothing: the HAL reconciles every
// object once at start anyway.
func (r *NetworkReconciler) resync(ctx context.Context, enqueue func(nimbusv1.Key)) error {
	var drift []nimbusv1.Key
	first, err := r.loadAgain(ctx, func(ctx context.Context) (err error) {
		drift, err = r.dumpAll(ctx)
		return err
	})
	if err != nil || first {
		return err
	}
	for _, key := range drift {
		r.log.Debug("network state drifted unreported", "key", key)
		enqueue(key)
	}
	return nil
}

// dumpAll returns the keys of the networks whose kernel state changed unreported: every
// network when the underlay's link or MTU changed. The links, addresses, rules, routes
// and FDB entries are the view's: what a dump of them finds changed reaches the
// observer (linkChanged, addrChanged, ruleChanged, routeChanged, fdbChanged). It also
// forgets what it knew of the forwarding sysctls, which have no dump: the reconciles
// that follow read them again.
func (r *NetworkReconciler) dumpAll(ctx context.Context) ([]nimbusv1.Key, error) {
	r.mu.Lock()
	clear(r.forwarding)
	ul := r.ul
	r.ul.known = false
	r.mu.Unlock()
	owners := map[nimbusv1.Key]bool{}
	note := func(key nimbusv1.Key) {
		if !key.IsZero() {
			owners[key] = true
		}
	}
	// The underlay has no owner: when the dumps find the link that holds the VTEP
	// address, or its MTU, changed, every network is.
	if ul.known {
		now := r.underlay(ul.vtep)
		if now.index != ul.index || now.mtu != ul.mtu {
			for _, key := range r.store.Keys(nimbusv1.Kind_KIND_NETWORK) {
				note(key)
			}
		} else {
			r.recordUnderlayMTU(now)
		}
	}
	return slices.SortedFunc(maps.Keys(owners), nimbusv1.Key.Compare), nil
}

// overlay reports whether a rule of the view's rule table, which holds plain rules
// alone, has the shape of the overlay's (overlayRule).
func (k ruleKey) overlay() bool { return overlayRule(ruleMsg{key: k, plain: true}) }

// overlayRule reports whether a rule has the shape of the overlay's: a priority of its
// own and an input interface as its only selector, or a gateway rule (gatewayRules).
func overlayRule(m ruleMsg) bool {
	if m.plain && m.key.priority == GatewayRulePriority {
		return m.key.iif == "" && m.key.fwmark != 0
	}
	return m.plain && m.key.iif != "" && m.key.fwmark == 0 && (m.key.priority == TenantRulePriority || m.key.priority == TenantRulePriority+1)
}

// Observe subscribes to changes of links, addresses, rules, routes, FDB entries and
// forwarding settings (netconf), reads all of them afresh into the mirrors (so a restart
// after an overflow starts from the kernel's state), and then keeps the mirrors current
// from the subscription. It enqueues the network that owns whatever someone else
// changes: a link by its alias (or by its name, for a device of a network reconciled
// before), an address, route, FDB entry or forwarding setting by its interface, a rule by
// its input interface's name; every network whose state the fresh read finds changed;
// and, every GatewayCheckInterval, every network whose bridge lost its gateway programs
// (a tcx link detached or its pin removed, of which the kernel sends no notification).
func (r *NetworkReconciler) Observe(ctx context.Context, enqueue func(nimbusv1.Key), subscribed func()) error {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { r.watchGatewayLinks(ctx, enqueue) })
	defer wg.Wait()
	defer cancel()
	links := r.linkReader.watching(func(c tableChange[int32, kernelLink]) { r.linkChanged(c, enqueue) })
	addrs := r.addrReader.watching(func(c tableChange[addrKey, kernelAddr]) { r.addrChanged(c, enqueue) })
	rules := r.ruleReader.watching(func(c tableChange[ruleKey, uint8]) { r.ruleChanged(c, enqueue) })
	routes := r.routeReader.watching(func(c tableChange[routeID, kernelRoute]) { r.routeChanged(c, enqueue) })
	fdb := r.fdbReader.watching(func(c tableChange[fdbKey, fdbEntry]) { r.fdbChanged(c, enqueue) })
	return r.observeTables(ctx, "network changes", []uint{
		unix.RTNLGRP_IPV4_NETCONF, unix.RTNLGRP_IPV6_NETCONF,
	}, []viewSource{links, addrs, rules, routes, fdb}, func(ctx context.Context) error { return r.resync(ctx, enqueue) }, subscribed,
		func(typ uint16, payload []byte) { r.apply(typ, payload, enqueue) })
}

// apply applies one notification to the mirrors and enqueues the network it shows
// drifted, if any.
func (r *NetworkReconciler) apply(typ uint16, b []byte, enqueue func(nimbusv1.Key)) {
	switch typ {
	case unix.RTM_NEWNETCONF, unix.RTM_DELNETCONF:
		r.netconfChanged(typ, b, enqueue)
	}
}

// netconfChanged applies the kernel's report of a change of an interface's settings
// (netconf). The report of force_forwarding carries no value: whoever changed a
// forwarding setting of a network's bridge, the reconciler reads it again, and the
// network is enqueued. The echoes of the reconciler's own writes are passed over: the
// report of its write of a forwarding sysctl file (reportedSysctl), and the reports that
// the kernel created the settings of a bridge, which carry them all
// (rtnl.NetconfReportsAll) and come before the link's own, when the reconciler created
// the bridge and read its forwarding after them (forwardingState), or has not read it
// yet. Settings the kernel creates anew for a bridge it had (after the bridge's MTU fell
// below the family's least and rose again) it reports dropped first, which is drift.
func (r *NetworkReconciler) netconfChanged(typ uint16, b []byte, enqueue func(nimbusv1.Key)) {
	family, index, ok := rtnl.ParseNetconfIndex(b)
	if !ok {
		return
	}
	name := r.nameOf(index)
	owner := r.ownerOfName(name)
	if owner.IsZero() || name != BridgeName(owner.String()) {
		return
	}
	created := typ == unix.RTM_NEWNETCONF && rtnl.NetconfReportsAll(b)
	r.mu.Lock()
	st, known := r.forwarding[name]
	known = known && st.index == index
	echo := true
	switch {
	case typ == unix.RTM_NEWNETCONF && !created && r.netconfWrites[index] > 0:
		if r.netconfWrites[index]--; r.netconfWrites[index] == 0 {
			delete(r.netconfWrites, index)
		}
	case created && !known:
		// Nothing read of the settings yet: the reconcile that reads them reads them
		// as the kernel created them.
	case created && family == unix.AF_INET && st.v4Report:
		st.v4Report = false
		r.forwarding[name] = st
	case created && family == unix.AF_INET6 && st.v6Report:
		st.v6Report = false
		r.forwarding[name] = st
	default:
		echo = false
		delete(r.forwarding, name)
	}
	r.mu.Unlock()
	if !echo {
		r.drifted(owner, enqueue, "forwarding settings", name)
	}
}

// drifted enqueues the network with the key, unless it is the zero Key, for what
// changed.
func (r *NetworkReconciler) drifted(key nimbusv1.Key, enqueue func(nimbusv1.Key), what, which string) {
	if key.IsZero() {
		return
	}
	r.log.Debug("network state changed", "key", key, "what", what, "which", which)
	enqueue(key)
}

// addrChanged makes the route table follow what the kernel does to routes when an
// address goes (addrGone), and enqueues every network when it is the VTEP address, and
// the network whose interface holds the address when it changed other than by the
// reconciler's own write.
func (r *NetworkReconciler) addrChanged(c tableChange[addrKey, kernelAddr], enqueue func(nimbusv1.Key)) {
	k := c.key
	if !c.has {
		r.addrGone(k)
	}
	if r.underlayAddr(k.prefix.Addr()) {
		r.allNetworks(enqueue, "VTEP address", k.prefix.String())
	}
	if c.echo || k.prefix.Addr().Is6() && k.prefix.Addr().IsLinkLocalUnicast() {
		return
	}
	r.drifted(r.ownerOfIndex(k.index), enqueue, "address", k.prefix.String())
}

// routeChanged enqueues the network whose interface a route of OverlayRouteProtocol
// leads out of when the route changed other than by the reconciler's own write, and,
// when the change moved it off another network's interface, that network too.
func (r *NetworkReconciler) routeChanged(c tableChange[routeID, kernelRoute], enqueue func(nimbusv1.Key)) {
	if c.echo {
		return
	}
	if c.has && c.new.protocol == OverlayRouteProtocol {
		r.drifted(r.ownerOfIndex(c.new.oif), enqueue, "route", c.key.String())
	}
	if c.had && c.old.protocol == OverlayRouteProtocol && (!c.has || c.new.protocol != OverlayRouteProtocol || c.new.oif != c.old.oif) {
		r.drifted(r.ownerOfIndex(c.old.oif), enqueue, "route", c.key.String())
	}
}

// overlayRouteChange reports whether c is a change of an overlay route, before or after:
// the only routes the network reconciler reads changes of.
func overlayRouteChange(c *tableChange[routeID, kernelRoute]) bool {
	return c.has && c.new.protocol == OverlayRouteProtocol || c.had && c.old.protocol == OverlayRouteProtocol
}

// headEndChange reports whether c is a change of a head-end replication entry: the only
// FDB entries the network reconciler reads changes of.
func headEndChange(c *tableChange[fdbKey, fdbEntry]) bool { return c.key.headEnd() }

// fdbChanged enqueues the network whose VXLAN device a head-end replication entry is on
// when the entry changed other than by the reconciler's own write.
func (r *NetworkReconciler) fdbChanged(c tableChange[fdbKey, fdbEntry], enqueue func(nimbusv1.Key)) {
	if c.echo || !headEndChange(&c) {
		return
	}
	r.drifted(r.ownerOfIndex(c.key.ifindex), enqueue, "head-end replication", c.key.dst.String())
}

// ruleChanged enqueues the network whose rule of the overlay's shape changed other than
// by the reconciler's own write.
func (r *NetworkReconciler) ruleChanged(c tableChange[ruleKey, uint8], enqueue func(nimbusv1.Key)) {
	if c.echo || !c.key.overlay() {
		return
	}
	r.drifted(r.ruleOwner(c.key), enqueue, "rule", ruleString(c.key))
}

// linkChanged applies a change of the link table: the reconciler drops what the kernel
// removes with a link that went (its addresses, routes and FDB entries; a link that went
// down loses its IPv4 routes without a notification), and every network is enqueued when
// the underlay's link changed its MTU or went. Unless the change is the echo of the
// reconciler's own write, or of its create of the link, the network that owns the link
// is enqueued when the link appeared, went, or changed what the reconciler sets of it
// (sameLink), and the one that owned it when it was renamed.
func (r *NetworkReconciler) linkChanged(c tableChange[int32, kernelLink], enqueue func(nimbusv1.Key)) {
	if !c.has {
		if r.underlayLinkChanged(c.key, 0) {
			r.allNetworks(enqueue, "underlay link", c.old.name)
		}
		r.linkGone(c.key)
		r.mu.Lock()
		delete(r.forwarding, c.old.name)
		delete(r.netconfWrites, c.key)
		r.mu.Unlock()
		if !c.echo {
			r.drifted(r.linkOwner(c.old.name, networkLinkOf(c.key, c.old), networkLinkOf(c.key, c.old)), enqueue, "link deleted", c.old.name)
		}
		return
	}
	l := networkLinkOf(c.key, c.new)
	if r.underlayLinkChanged(c.key, c.new.mtu) {
		r.allNetworks(enqueue, "underlay link", c.new.name)
	}
	var prev networkLink
	if c.had {
		prev = networkLinkOf(c.key, c.old)
		if c.old.name != c.new.name {
			// Renamed: the old name is gone.
			r.mu.Lock()
			delete(r.forwarding, c.old.name)
			r.mu.Unlock()
			if key, ok := networkOwner(c.old.alias); ok {
				r.drifted(key, enqueue, "link renamed", c.old.name)
			}
		}
	}
	if !c.new.up {
		r.routesGone(c.key, false)
	}
	if c.echo || c.had && c.fields&networkLinkFields == 0 {
		return
	}
	r.drifted(r.linkOwner(c.new.name, prev, l), enqueue, "link", c.new.name)
}

// linkOwner returns the key of the network that owns the link name, which the mirror
// showed as prev and a notification shows as l.
func (r *NetworkReconciler) linkOwner(name string, prev, l networkLink) nimbusv1.Key {
	if key, ok := networkOwner(l.alias); ok {
		return key
	}
	if key, ok := networkOwner(prev.alias); ok {
		return key
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.devices[name]
}

// Sweep reads the kernel afresh into the mirrors (and the forwarding sysctls, at the
// reconciles of the resync that follows), enqueues the networks whose state changed
// without the observer reporting it, and removes the kernel state that no desired
// Network owns: links with an alias of a Network that is not desired (with the
// rules of their bridges), rules at TenantRulePriority and TenantRulePriority+1 whose
// input interface is such a link or does not exist, and routes of OverlayRouteProtocol
// through anything but a desired network's bridge. So a restarted agent removes what a
// previous one programmed for networks deleted meanwhile, and adopts the rest.
func (r *NetworkReconciler) Sweep(ctx context.Context, enqueue func(nimbusv1.Key)) error {
	if err := r.links.reload(ctx, r.rtnlConn); err != nil {
		return err
	}
	r.linkReader.drainMissed(func(c tableChange[int32, kernelLink]) { r.linkChanged(c, enqueue) })
	if err := r.resync(ctx, enqueue); err != nil {
		return err
	}
	if err := r.addrs.reload(ctx, r.rtnlConn); err != nil {
		return err
	}
	r.addrReader.drainMissed(func(c tableChange[addrKey, kernelAddr]) { r.addrChanged(c, enqueue) })
	if err := r.rules.reload(ctx, r.rtnlConn); err != nil {
		return err
	}
	r.ruleReader.drainMissed(func(c tableChange[ruleKey, uint8]) { r.ruleChanged(c, enqueue) })
	if err := r.neigh.fdb.reload(ctx, r.rtnlConn); err != nil {
		return err
	}
	r.fdbReader.drainMissed(func(c tableChange[fdbKey, fdbEntry]) { r.fdbChanged(c, enqueue) })
	bridges := map[string]nimbusv1.Key{}
	devices := map[string]bool{}
	for _, key := range r.store.Keys(nimbusv1.Kind_KIND_NETWORK) {
		id := key.String()
		bridges[BridgeName(id)] = key
		devices[BridgeName(id)], devices[VXLANName(id)] = true, true
	}
	stale := map[nimbusv1.Key]bool{}
	for _, l := range r.links.m.All() {
		if key, ok := networkOwner(l.alias); ok && bridges[BridgeName(key.String())].IsZero() {
			stale[key] = true
		}
	}
	for _, key := range sortedKeys(stale, nimbusv1.Key.Compare) {
		if err := r.sweepNetwork(ctx, key, func() error {
			r.log.Info("removing the kernel state of a network that is gone", "key", key)
			return r.teardown(ctx, key)
		}); err != nil {
			return err
		}
	}
	// A link naples created and could not mark before it stopped (see LinkGroup), of a
	// network that is gone.
	for index, kl := range r.links.m.All() {
		name, l := kl.name, networkLinkOf(index, kl)
		unmarked := l.alias == "" && l.group == LinkGroup &&
			(strings.HasPrefix(name, bridgePrefix) || strings.HasPrefix(name, vxlanPrefix))
		if !unmarked || devices[name] {
			continue
		}
		if err := r.sweepNetwork(ctx, nimbusv1.Key{}, func() error {
			r.log.Info("removing an unmarked link of a network that is gone", "link", name)
			return r.deleteLink(ctx, name, l)
		}); err != nil {
			return err
		}
	}
	for k, proto := range r.rules.m.All() {
		if !k.overlay() || !bridges[k.iif].IsZero() || k.fwmark != 0 {
			continue // its network's reconcile keeps its rules exact; sweepGateway does the gateway rules
		}
		l, exists := r.link(k.iif)
		if _, ours := networkOwner(l.alias); exists && !ours {
			continue // a rule for someone else's link
		}
		if err := r.sweepNetwork(ctx, r.ownerOfName(k.iif), func() error {
			r.log.Info("removing a stale rule", "rule", ruleString(k))
			return r.deleteRule(ctx, k, proto)
		}); err != nil {
			return err
		}
	}
	for _, id := range r.overlayRouteIDs() {
		rt, ok := r.routes.get(id)
		if !ok || rt.protocol != OverlayRouteProtocol {
			continue
		}
		name := r.nameOf(rt.oif)
		if owner := bridges[name]; !owner.IsZero() && r.ownerOfName(name) == owner {
			continue
		}
		if err := r.sweepNetwork(ctx, r.ownerOfIndex(rt.oif), func() error {
			r.log.Info("removing a stale overlay route", "route", id.String(), "dev", name)
			return r.deleteRoute(ctx, id)
		}); err != nil {
			return err
		}
	}
	r.checkGatewayLinks(enqueue)
	return r.sweepGateway(ctx)
}

// sweepNetwork runs remove, which removes kernel state of the network with the key (the
// zero Key for state no network claims), unless the network has come into the store
// since the sweep began, under the lock its reconciles take.
func (r *NetworkReconciler) sweepNetwork(ctx context.Context, key nimbusv1.Key, remove func() error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if key.IsZero() {
		return remove()
	}
	lock := r.networkLocks.lock(key)
	defer r.networkLocks.unlock(key, lock)
	if r.desired(key) {
		return nil
	}
	return remove()
}
