package linux

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"iter"
	"log/slog"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/naplesnet/naples/hal"
	"github.com/naplesnet/naples/hal/linux/rtnl"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// This file holds the network reconciler's writes: each ensure step compares one part of
// a network's desired state with the mirrors and writes what differs (kernelWrite).

// ensureBridge makes the network's bridge exist as wanted: `ip link add BRIDGE type
// bridge`, with the network's alias and gateway MAC, its MTU when the network sets one,
// up. It returns the bridge as the link table shows it now, and whether it created it.
//
// A bridge it creates for a network whose one gateway family is IPv4 gets its
// forwarding (ensureForwarding) in the request that sets its alias: a link event, and a
// walk of every IPv6 route that the kernel makes for each, less.
func (r *NetworkReconciler) ensureBridge(ctx context.Context, want networkWant) (networkLink, bool, error) {
	target := networkLink{kind: "bridge", alias: want.alias, mac: want.mac, mtu: want.mtu, up: true}
	have, created, err := r.ensureLink(ctx, want.bridge, target, func(l networkLink) bool { return l.kind == "bridge" })
	if err != nil {
		return networkLink{}, false, err
	}
	v4, v6 := forwardingSysctls(want.bridge)
	forward := false
	if created && want.hasV4 && !want.hasV6 && !r.sysctls.Recorded(v6) {
		// Recorded as SetVia records it; the write is converge's.
		n, err := r.sysctls.SetVia(v4, "1", sysctlAccess{read: r.ipv4Forwarding(ctx, have.index).read, write: func(string) error { return nil }})
		if err != nil {
			return networkLink{}, false, kernelErr(err, "setting forwarding on %s", want.bridge)
		}
		forward = n > 0
	}
	br, forwarded, err := r.converge(ctx, want.bridge, have, target, forward)
	if err != nil || !forwarded {
		// A forwarding not set is ensureForwarding's to set.
		return br, created, err
	}
	r.writes.Add(1)
	r.mu.Lock()
	r.forwarding[want.bridge] = forwardingState{index: br.index, v4: true, v4Report: true, v6Report: true}
	r.mu.Unlock()
	r.log.Info("forwarding set", "key", want.id, "bridge", want.bridge, "ipv4", true, "ipv6", false)
	return br, created, nil
}

// ensureVXLAN makes the network's VXLAN device exist as wanted: `ip link add VXLAN type
// vxlan id VNI local VTEP dstport 4789 nolearning`, with the network's alias, its MTU when
// the network sets one, a port of the bridge with index master with learning off and
// neigh_suppress on, up. A device with another VNI, local address or port is replaced, as
// those cannot be changed. It returns the device as the link table shows it now.
func (r *NetworkReconciler) ensureVXLAN(ctx context.Context, want networkWant, vtep netip.Addr, master int32) (networkLink, error) {
	target := networkLink{
		kind: "vxlan", alias: want.alias, mtu: want.mtu, up: true, master: master,
		vni: want.vni, local: vtep, port: VXLANPort,
		bridgePort: true, neighSuppress: true,
	}
	have, _, err := r.ensureLink(ctx, want.vxlan, target, func(l networkLink) bool {
		return l.kind == "vxlan" && l.vni == want.vni && l.local == vtep && l.port == VXLANPort
	})
	if err != nil {
		return networkLink{}, err
	}
	vx, _, err := r.converge(ctx, want.vxlan, have, target, false)
	return vx, err
}

// ensureLink makes a link named name exist that fits: one the link table holds with the
// network's alias, or one it creates as target describes. A link of the name without the
// alias is a conflict, unless it is one naples created and could not mark yet (ownsLink);
// one with it that does not fit is deleted and created anew. It reports whether it
// created the link.
func (r *NetworkReconciler) ensureLink(ctx context.Context, name string, target networkLink, fits func(networkLink) bool) (networkLink, bool, error) {
	have, ok := r.link(name)
	if ok && !ownsLink(have, target.alias) {
		return networkLink{}, false, foreignLink(name, have)
	}
	if ok && fits(have) {
		return have, false, nil
	}
	if ok {
		r.log.Info("replacing a link whose settings cannot change", "key", ownerKey(have.alias), "link", name,
			"kind", have.kind, "vni", have.vni, "local", have.local)
		if err := r.deleteLink(ctx, name, have); err != nil {
			return networkLink{}, false, err
		}
	}
	return r.createLink(ctx, name, target)
}

// ownsLink reports whether the link have of a network's device name is that network's:
// it carries the network's alias, or no alias and LinkGroup, as a link naples created
// does until its alias is set.
func ownsLink(have networkLink, alias string) bool {
	return have.alias == alias || (have.alias == "" && have.group == LinkGroup)
}

// foreignLink is the conflict with a link of a network's device name that naples did not
// create.
func foreignLink(name string, l networkLink) error {
	return hal.Errorf(hal.ReasonConflict, "link %s exists and is not naples's (kind %q, alias %q); leaving it alone", name, l.kind, l.alias)
}

// createLink creates the link name as target describes (`ip link add NAME alias ALIAS
// address MAC master MASTER up type KIND ...`, and for a VXLAN device `mtu MTU`; a
// bridge's MTU and a port's flags are left to converge) and returns it as the kernel
// then reports it, and whether it created it: a link of the name the link table had not
// heard of yet, naples's, is adopted instead (createClash).
//
// A VXLAN device takes its MTU in the create, so the write that then sets its alias (the
// kernel takes none in a create) changes no MTU, which spares the walk of every IPv6
// route that the kernel makes for each change of a link's MTU. A bridge does not: the
// kernel keeps a bridge's MTU at its ports' smallest until it is set after the create
// (`ip link set`), and naples's stays as set when a smaller port joins.
func (r *NetworkReconciler) createLink(ctx context.Context, name string, target networkLink) (networkLink, bool, error) {
	attrs := rtnl.LinkName | rtnl.LinkAlias | rtnl.LinkGroup | rtnl.LinkKind
	if target.mac != "" {
		attrs |= rtnl.LinkMAC
	}
	if target.master != 0 {
		attrs |= rtnl.LinkMaster
	}
	mtu := uint32(0)
	if target.kind == "vxlan" {
		attrs |= rtnl.LinkVXLAN
		if target.mtu != 0 {
			attrs |= rtnl.LinkMTU
			mtu = target.mtu
		}
	}
	msg := rtnl.AppendLinkRequest(r.nl.Buffer(), unix.RTM_NEWLINK, unix.NLM_F_CREATE|unix.NLM_F_EXCL, rtnl.Link{
		Flags: unix.IFF_UP, Name: name, Alias: target.alias, Group: LinkGroup, MAC: target.mac, Master: target.master,
		MTU: mtu, Kind: target.kind,
		VXLAN: rtnl.VXLANInfo{VNI: target.vni, Local: target.local, Port: target.port, Learning: target.learning},
	}, unix.IFF_UP, attrs)

	// The link has no index until the kernel creates it, so the link table's mirror
	// cannot expect it: the table takes every change of a link of the name for the echo
	// of the create until the reconciler has found the link as created in the table or
	// read it back (expectCreate).
	done := r.links.expectCreate(r.linkReader.writer(), name)
	defer done()
	err := r.nl.Do(ctx, msg)
	if errors.Is(err, unix.EEXIST) {
		l, err := r.createClash(ctx, name, target, err)
		return l, false, err
	}
	if err != nil {
		return networkLink{}, false, kernelErr(err, "creating %s %s", target.kind, name)
	}
	r.writes.Add(1)
	r.log.Info("link created", "key", ownerKey(target.alias), "link", name, "kind", target.kind)
	if r.links.current() {
		// The kernel queues its reports of the create on the view's subscription before
		// it acks it on this socket, so the table holds the link as created as soon as the
		// view has read them: no read of the link back.
		if index, l, ok := r.links.awaitLink(ctx, name, r.createdLinkWait, func(l kernelLink) bool {
			return createdLink(networkLinkOf(0, l), target)
		}); ok {
			return networkLinkOf(index, l), true, nil
		}
	}
	l, err := r.refreshLink(ctx, name)
	return l, err == nil, err
}

// defaultCreatedLinkWait bounds how long createLink waits for the link table to show a
// link it created before it asks the kernel for it (NetworkReconciler.createdLinkWait).
const defaultCreatedLinkWait = 100 * time.Millisecond

// createdLink reports whether the link have is in the state the kernel reports last of
// a link that createLink created as target describes: naples's, of the kind, with its
// MAC, up, a port of its master, and for a VXLAN device with its settings and MTU. Its
// alias and a bridge's MTU are converge's to set.
func createdLink(have, target networkLink) bool {
	return have.group == LinkGroup && (have.alias == "" || have.alias == target.alias) &&
		have.kind == target.kind && (target.mac == "" || have.mac == target.mac) && have.up &&
		have.master == target.master && have.bridgePort == (target.master != 0) &&
		(target.kind != "vxlan" || (have.vni == target.vni && have.local == target.local &&
			have.port == target.port && have.learning == target.learning &&
			(target.mtu == 0 || have.mtu == target.mtu)))
}

// createClash explains a create the kernel refused with EEXIST: a link of the name the
// link table has not heard of yet (adopted when it is naples's, a conflict otherwise), or
// another VXLAN device with the same VNI, port and local address.
func (r *NetworkReconciler) createClash(ctx context.Context, name string, target networkLink, err error) (networkLink, error) {
	have, gerr := r.refreshLink(ctx, name)
	switch {
	case gerr == nil && ownsLink(have, target.alias):
		return have, nil
	case gerr == nil:
		return networkLink{}, foreignLink(name, have)
	case target.kind == "vxlan":
		return networkLink{}, hal.Errorf(hal.ReasonConflict, "creating vxlan %s with VNI %d: another VXLAN device has it: %v", name, target.vni, err)
	}
	return networkLink{}, kernelErr(err, "creating %s %s", target.kind, name)
}

// refreshLink asks the kernel for the link name (`ip link show NAME`), records the answer
// in the link table and returns it. The table shows the answer from then on and passes
// over the kernel's older events of the link until they catch up with it.
func (r *NetworkReconciler) refreshLink(ctx context.Context, name string) (networkLink, error) {
	r.linkGets.Add(1)
	msg := rtnl.AppendLinkRequest(make([]byte, 0, 64), unix.RTM_GETLINK, 0, rtnl.Link{Name: name}, 0, rtnl.LinkName)
	var got kernelLink
	var index int32
	found := false
	err := r.rtnl.Get(ctx, msg, func(typ uint16, payload []byte) {
		if typ == unix.RTM_NEWLINK {
			index, got, found = parseKernelLink(payload)
		}
	})
	if err == nil && !found {
		err = unix.ENODEV
	}
	if err != nil {
		return networkLink{}, kernelErr(err, "reading link %s", name)
	}
	r.links.m.ExpectBy(r.linkReader.writer(), index, got, sameNetworkLink).Done()
	return networkLinkOf(index, got), nil
}

// converge changes what differs between the link name as the link table shows it, have,
// and target: `ip link set NAME address MAC mtu MTU master MASTER up` and for a VXLAN device
// `type vxlan nolearning`, in one request, then the port flags, `ip link set NAME type
// bridge_slave learning off neigh_suppress on`, which need the link to be a port
// already: in the same request when it is one of the bridge it stays a port of (a VXLAN
// device just created with its master), in a second one when the first makes it a port.
// With forward, the first request, when there is one, also turns the link's IPv4
// forwarding on (`sysctl net.ipv4.conf.NAME.forwarding=1`, ipv4Forwarding). It returns
// the link as the link table then shows it, and whether it turned forwarding on.
func (r *NetworkReconciler) converge(ctx context.Context, name string, have, target networkLink, forward bool) (networkLink, bool, error) {
	target.index = have.index
	step := have
	if target.mac != "" {
		step.mac = target.mac
	}
	if target.mtu != 0 {
		step.mtu = target.mtu
	}
	step.up, step.alias, step.learning = target.up, target.alias, target.learning
	if step.master != target.master {
		// A new port starts with the kernel's default flags.
		step.master = target.master
		step.bridgePort = target.master != 0
		step.portLearning, step.neighSuppress = step.bridgePort, false
	}
	// A port already, whose flags differ, takes them with the rest.
	foldFlags := !sameLink(have, step) && have.bridgePort && have.master == step.master &&
		(step.portLearning != target.portLearning || step.neighSuppress != target.neighSuppress)
	if foldFlags {
		step.portLearning, step.neighSuppress = target.portLearning, target.neighSuppress
	}
	if !sameLink(have, step) {
		var flags, change uint32
		if have.up != step.up {
			change = unix.IFF_UP
			if step.up {
				flags = unix.IFF_UP
			}
		}
		var attrs rtnl.LinkAttrs
		var what []any
		if have.mac != step.mac {
			attrs |= rtnl.LinkMAC
			what = append(what, "address", macString(step.mac))
		}
		if have.mtu != step.mtu {
			attrs |= rtnl.LinkMTU
			what = append(what, "mtu", step.mtu)
		}
		if have.alias != step.alias {
			attrs |= rtnl.LinkAlias
		}
		if have.master != step.master {
			attrs |= rtnl.LinkMaster
			what = append(what, "master", step.master)
		}
		if have.kind == "vxlan" && have.learning != step.learning {
			attrs |= rtnl.LinkKind | rtnl.LinkVXLANLearning
			what = append(what, "learning", step.learning)
		}
		if change != 0 {
			what = append(what, "up", step.up)
		}
		if foldFlags {
			attrs |= rtnl.LinkPortLearning | rtnl.LinkPortNeighSuppress
		}
		if forward {
			attrs |= rtnl.LinkIPv4Forwarding
			what = append(what, "forwarding", 1)
		}
		msg := rtnl.AppendLinkRequest(r.nl.Buffer(), unix.RTM_NEWLINK, 0, rtnl.Link{
			Index: have.index, Flags: flags, MAC: step.mac, MTU: step.mtu, Alias: step.alias, Master: step.master,
			Kind: "vxlan", VXLAN: rtnl.VXLANInfo{Learning: step.learning},
			Port:           rtnl.BridgePortInfo{Learning: step.portLearning, NeighSuppress: step.neighSuppress},
			IPv4Forwarding: 1,
		}, change, attrs)
		if _, err := kernelWrite(ctx, r.rtnlConn, r.expectLink(name, have.index, step), msg); err != nil {
			return networkLink{}, false, kernelErr(err, "setting link %s %v", name, what)
		}
		r.log.Info("link changed", append([]any{"key", ownerKey(step.alias), "link", name}, what...)...)
	} else {
		forward = false
	}
	if step.bridgePort && (step.portLearning != target.portLearning || step.neighSuppress != target.neighSuppress) {
		next := step
		next.portLearning, next.neighSuppress = target.portLearning, target.neighSuppress
		msg := rtnl.AppendLinkRequest(r.nl.Buffer(), unix.RTM_NEWLINK, 0, rtnl.Link{
			Index: have.index, Port: rtnl.BridgePortInfo{Learning: next.portLearning, NeighSuppress: next.neighSuppress},
		}, 0, rtnl.LinkPortLearning|rtnl.LinkPortNeighSuppress)
		if _, err := kernelWrite(ctx, r.rtnlConn, r.expectLink(name, have.index, next), msg); err != nil {
			return networkLink{}, false, kernelErr(err, "setting the bridge port flags of %s", name)
		}
		step = next
	}
	return step, forward, nil
}

// expectLink records in the link table that the reconciler is about to write the link
// of the name, with the index, in the state n describes.
func (r *NetworkReconciler) expectLink(name string, index int32, n networkLink) *hal.Write[int32, kernelLink] {
	have, _ := r.links.get(index)
	return r.links.m.ExpectBy(r.linkReader.writer(), index, n.onto(name, have), sameNetworkLink)
}

// deleteLink deletes the link name (`ip link del NAME`), which the link table shows as l,
// and drops from the mirrors what the kernel removes with it: its addresses, routes and
// FDB entries (IPv4 routes go without a notification), and what the reconciler knew of
// its forwarding settings.
func (r *NetworkReconciler) deleteLink(ctx context.Context, name string, l networkLink) error {
	msg := rtnl.AppendLinkRequest(r.nl.Buffer(), unix.RTM_DELLINK, 0, rtnl.Link{Index: l.index}, 0, 0)
	took, err := kernelWrite(ctx, r.rtnlConn, r.links.m.ExpectGoneBy(r.linkReader.writer(), l.index), msg, unix.ENODEV)
	if err != nil {
		return kernelErr(err, "deleting link %s", name)
	}
	if took {
		r.log.Info("link deleted", "key", ownerKey(l.alias), "link", name)
	}
	r.linkGone(l.index)
	r.mu.Lock()
	delete(r.forwarding, name)
	delete(r.netconfWrites, l.index)
	r.mu.Unlock()
	return nil
}

// linkGone drops from the mirrors what the kernel holds no more once the link with the
// index is gone.
func (r *NetworkReconciler) linkGone(index int32) {
	for k := range r.addrs.byLink.Get(index) {
		r.addrs.m.Remove(k)
	}
	r.routesGone(index, true)
	for k := range r.neigh.headEnds.Get(index) {
		r.neigh.fdb.m.Remove(k)
	}
}

// routesGone drops from the route table the IPv4 routes through the link with the
// index, and with all also the IPv6 ones: the kernel flushes IPv4 routes through a link
// that goes down or away without a notification.
func (r *NetworkReconciler) routesGone(index int32, all bool) {
	if !all && !r.routes.carriesV4(index) {
		return
	}
	for _, id := range r.routeIDs(r.routes.byLink.Get(index), false) {
		if id.v4 || all {
			r.routes.m.Remove(id)
		}
	}
}

// overlayRouteIDs returns the identities of the routes of OverlayRouteProtocol.
func (r *NetworkReconciler) overlayRouteIDs() []routeID {
	return r.routeIDs(r.routes.protocols.Get(OverlayRouteProtocol), true)
}

// routeIDs collects the identities of routes, with overlay those of
// OverlayRouteProtocol alone, so that the caller can change the table as it walks them.
func (r *NetworkReconciler) routeIDs(routes iter.Seq2[routeID, kernelRoute], overlay bool) []routeID {
	var ids []routeID
	for id, rt := range routes {
		if !overlay || rt.protocol == OverlayRouteProtocol {
			ids = append(ids, id)
		}
	}
	return ids
}

// forwardingState is what the reconciler found or made right of a bridge's forwarding
// sysctls: for the link with the index, IPv4 and IPv6 forwarding are on as far as v4
// and v6 tell, and otherwise as naples found them; v6Missing tells that the kernel has
// no per-interface IPv6 forwarding.
//
// v4Report and v6Report tell that the kernel's reports that it created the bridge's
// IPv4 and IPv6 settings (netconfChanged) are still to reach the observer: the
// reconciler created the bridge, and so read or wrote its forwarding after the kernel
// sent them.
type forwardingState struct {
	index              int32
	v4, v6             bool
	v6Missing          bool
	v4Report, v6Report bool
}

// forwardingSysctls returns the paths of the forwarding sysctls of the bridge:
// net.ipv4.conf.BRIDGE.forwarding and net.ipv6.conf.BRIDGE.force_forwarding.
func forwardingSysctls(bridge string) (v4, v6 string) {
	return "/proc/sys/net/ipv4/conf/" + bridge + "/forwarding", "/proc/sys/net/ipv6/conf/" + bridge + "/force_forwarding"
}

// ensureForwarding turns forwarding on for what enters through the network's bridge,
// with index, for the families that need it: net.ipv4.conf.BRIDGE.forwarding=1 when the
// network has an IPv4 gateway, net.ipv6.conf.BRIDGE.force_forwarding=1 when it has an
// IPv6 one. For a family that needs it no more it puts back the value it found before
// it turned it on, and leaves alone one it found on (see sysctls). It reads the sysctls
// only when it has not found them right for this bridge and these families since it was
// created or a netconf notification said they changed. It reports whether the kernel
// lacks force_forwarding (before Linux 6.17) while the network has an IPv6 gateway.
// created tells that the reconcile created the bridge: the kernel's reports that it
// created the bridge's settings, which come before, are then no drift.
//
// IPv4 forwarding is read and written through netlink (ipv4Forwarding): a write of the
// sysctl file waits for the rtnl lock by restarting itself, spinning while the batcher
// holds the lock. The kernel takes IPv6 settings through netlink only as it reports
// them, so force_forwarding is written as a sysctl, in the namespace, and only when the
// network has an IPv6 gateway or naples changed it.
func (r *NetworkReconciler) ensureForwarding(ctx context.Context, want networkWant, index int32, created bool) (v6Missing bool, err error) {
	r.mu.Lock()
	st, ok := r.forwarding[want.bridge]
	r.mu.Unlock()
	if ok && st.index == index && st.v4 == want.hasV4 && st.v6 == want.hasV6 {
		return st.v6Missing, nil
	}
	v4, v6 := forwardingSysctls(want.bridge)
	if !want.hasV4 && !want.hasV6 && !r.sysctls.Recorded(v4) && !r.sysctls.Recorded(v6) {
		return false, nil
	}
	if err := ctx.Err(); err != nil {
		return false, err
	}
	st = forwardingState{index: index, v4: want.hasV4, v6: want.hasV6, v4Report: created, v6Report: created}
	var writes int
	err = func() error {
		n, err := r.forwardingSysctl(v4, want.hasV4, r.ipv4Forwarding(ctx, index))
		writes += n
		if err != nil || !want.hasV6 && !r.sysctls.Recorded(v6) {
			return err
		}
		return r.inNS.run(func() error {
			n, err := r.forwardingSysctl(v6, want.hasV6, r.reportedSysctl(index, sysctlFile(v6)))
			writes += n
			if want.hasV6 && errors.Is(err, fs.ErrNotExist) {
				st.v6Missing = true
				return nil
			}
			return err
		})
	}()
	r.writes.Add(uint64(writes))
	if err != nil {
		return false, kernelErr(err, "setting forwarding on %s", want.bridge)
	}
	r.mu.Lock()
	r.forwarding[want.bridge] = st
	r.mu.Unlock()
	if writes > 0 {
		r.log.Info("forwarding set", "key", want.id, "bridge", want.bridge, "ipv4", want.hasV4, "ipv6", want.hasV6 && !st.v6Missing)
	}
	if st.v6Missing && r.log.Enabled(ctx, slog.LevelInfo) {
		r.log.Info("this kernel has no per-interface IPv6 forwarding; IPv6 between networks needs net.ipv6.conf.all.forwarding=1",
			"key", want.id, "bridge", want.bridge)
	}
	return st.v6Missing, nil
}

// forwardingSysctl turns the forwarding sysctl at path, read and written through
// access, on when on, and otherwise puts back what naples found there before it turned
// it on. It returns how many writes that took.
func (r *NetworkReconciler) forwardingSysctl(path string, on bool, access sysctlAccess) (int, error) {
	if on {
		return r.sysctls.SetVia(path, "1", access)
	}
	return r.sysctls.RestoreVia(path, access)
}

// reportedSysctl returns access, the access to a sysctl file of the interface with the
// index whose change the kernel reports (RTM_NEWNETCONF), with its writes expected:
// the observer takes the report of each for its echo (netconfChanged). The kernel
// reports a write that changes the value, and sysctls writes only such.
func (r *NetworkReconciler) reportedSysctl(index int32, access sysctlAccess) sysctlAccess {
	write := access.write
	access.write = func(value string) error {
		r.mu.Lock()
		r.netconfWrites[index]++
		r.mu.Unlock()
		err := write(value)
		if err != nil {
			r.mu.Lock()
			if r.netconfWrites[index]--; r.netconfWrites[index] <= 0 {
				delete(r.netconfWrites, index)
			}
			r.mu.Unlock()
		}
		return err
	}
	return access
}

// ipv4Forwarding returns the access to net.ipv4.conf.BRIDGE.forwarding of the bridge
// with the index through netlink: RTM_GETNETCONF reads it (`ip netconf show dev
// BRIDGE`), RTM_SETLINK with IFLA_INET_CONF writes it. A bridge that is gone reads as
// fs.ErrNotExist, as its sysctl file would.
func (r *NetworkReconciler) ipv4Forwarding(ctx context.Context, index int32) sysctlAccess {
	return sysctlAccess{
		read: func() (string, error) {
			var v uint32
			var ok bool
			err := r.rtnl.Get(ctx, rtnl.NetconfRequest(unix.AF_INET, index), func(typ uint16, p []byte) {
				if typ == unix.RTM_NEWNETCONF {
					v, ok = rtnl.ParseNetconfForwarding(p)
				}
			})
			if errors.Is(err, unix.ENODEV) {
				return "", fmt.Errorf("reading the IPv4 forwarding of link %d: %w", index, fs.ErrNotExist)
			}
			if err != nil {
				return "", fmt.Errorf("reading the IPv4 forwarding of link %d: %w", index, err)
			}
			if !ok {
				return "", fmt.Errorf("reading the IPv4 forwarding of link %d: the kernel's answer does not hold it", index)
			}
			return strconv.FormatUint(uint64(v), 10), nil
		},
		write: func(value string) error {
			v, err := strconv.ParseUint(value, 10, 32)
			if err != nil {
				return fmt.Errorf("setting the IPv4 forwarding of link %d to %q: %w", index, value, err)
			}
			return r.nl.Do(ctx, rtnl.AppendIPv4ForwardingRequest(r.nl.Buffer(), index, uint32(v)))
		},
	}
}

// ensureAddresses makes the bridge with the index hold exactly the network's gateway
// addresses: `ip addr add GATEWAY/LEN dev BRIDGE noprefixroute` (and `nodad` for IPv6) for
// every subnet with a gateway, and `ip addr del` of every other address but IPv6
// link-local ones.
func (r *NetworkReconciler) ensureAddresses(ctx context.Context, want networkWant, index int32) error {
	wanted := map[addrKey]uint32{}
	for _, s := range want.subnets {
		if !s.gw.IsValid() {
			continue
		}
		flags := uint32(unix.IFA_F_NOPREFIXROUTE)
		if s.gw.Is6() {
			flags |= unix.IFA_F_NODAD
		}
		wanted[addrKey{index: index, prefix: netip.PrefixFrom(s.gw, s.prefix.Bits())}] = flags
	}
	// Unwanted ones go first: IPv6 refuses an address it holds with another length.
	for k, a := range r.addrs.byLink.Get(index) {
		if k.prefix.Addr().Is6() && k.prefix.Addr().IsLinkLocalUnicast() {
			continue
		}
		if flags, ok := wanted[k]; ok && a.flags&managedAddrFlags == flags {
			continue
		}
		if err := r.deleteAddr(ctx, want.bridge, k); err != nil {
			return err
		}
	}
	for _, k := range sortedKeys(wanted, compareAddrKeys) {
		if _, ok := r.addrs.get(k); ok {
			continue
		}
		flags := wanted[k]
		msg := appendAddrRequest(r.nl.Buffer(), unix.RTM_NEWADDR, unix.NLM_F_CREATE|unix.NLM_F_EXCL, k, flags)
		if _, err := kernelWrite(ctx, r.rtnlConn, r.addrs.m.ExpectBy(r.addrReader.writer(), k, kernelAddr{flags: flags}, sameGatewayAddr), msg); err != nil {
			return kernelErr(err, "adding address %s to %s", k.prefix, want.bridge)
		}
		r.log.Debug("gateway address added", "key", want.id, "address", k.prefix.String(), "bridge", want.bridge)
	}
	return nil
}

// sameGatewayAddr reports whether the gateway address have is in the state want
// describes: with the flags the reconciler sets (managedAddrFlags).
func sameGatewayAddr(have, want kernelAddr) bool {
	return have.flags&managedAddrFlags == want.flags&managedAddrFlags
}

// deleteAddr removes the address k from the link name (`ip addr del`).
func (r *NetworkReconciler) deleteAddr(ctx context.Context, name string, k addrKey) error {
	msg := appendAddrRequest(r.nl.Buffer(), unix.RTM_DELADDR, 0, k, 0)
	took, err := kernelWrite(ctx, r.rtnlConn, r.addrs.m.ExpectGoneBy(r.addrReader.writer(), k), msg, unix.EADDRNOTAVAIL, unix.ENODEV)
	if err != nil {
		return kernelErr(err, "deleting address %s from %s", k.prefix, name)
	}
	if took {
		r.log.Debug("address deleted", "address", k.prefix.String(), "link", name)
	}
	r.addrGone(k)
	return nil
}

// addrGone makes the route table follow what the kernel does, without a notification,
// to routes when the address k goes: IPv4 flushes the routes of the main table whose
// preferred source it was, unless another interface holds it still (routes of other
// tables, as the tenants' are, stay, and so stay in the table for ensureRoutes to
// delete), and every route through the interface when it was the interface's last IPv4
// address; IPv6 drops it as the preferred source of the interface's routes.
func (r *NetworkReconciler) addrGone(k addrKey) {
	a := k.prefix.Addr()
	if a.Is6() {
		for _, id := range r.routeIDs(r.routes.byLink.Get(k.index), false) {
			if rt, ok := r.routes.get(id); ok && !id.v4 && rt.src == a {
				rt.src = netip.Addr{}
				r.routes.m.Update(id, rt)
			}
		}
		return
	}
	heldElsewhere, lastOnLink := false, true
	for o := range r.addrs.byAddr.Get(a.Unmap()) {
		if o != k && o.prefix.Addr() == a {
			heldElsewhere = true
			break
		}
	}
	for o := range r.addrs.byLink.Get(k.index) {
		if o != k && o.prefix.Addr().Is4() {
			lastOnLink = false
			break
		}
	}
	if !heldElsewhere {
		for _, id := range r.routeIDs(r.routes.bySrc.Get(a), false) {
			if id.v4 && id.table == unix.RT_TABLE_MAIN {
				r.routes.m.Remove(id)
			}
		}
	}
	if lastOnLink {
		for _, id := range r.routeIDs(r.routes.byLink.Get(k.index), false) {
			if id.v4 {
				r.routes.m.Remove(id)
			}
		}
	}
}

// ensureRoutes makes the tenant's table route each of the network's subnets through its
// bridge, with index: `ip route add SUBNET dev BRIDGE table T proto 242 scope link src
// GATEWAY`, replacing a route of protocol 242 that differs; routes of protocol 242 through
// the bridge that the network does not want (for a subnet it no longer has, say) are
// deleted. A route of another protocol where one is wanted, or one that another
// network of the tenant holds, is a conflict.
func (r *NetworkReconciler) ensureRoutes(ctx context.Context, want networkWant, index int32) error {
	wanted := make(map[routeID]kernelRoute, len(want.subnets))
	for _, s := range want.subnets {
		metric := uint32(0)
		rt := kernelRoute{protocol: OverlayRouteProtocol, hops: []hop{{link: index, weight: 1}}, oif: index, src: s.gw, scope: unix.RT_SCOPE_LINK}
		if s.prefix.Addr().Is6() {
			metric, rt.scope = ip6DefaultMetric, unix.RT_SCOPE_UNIVERSE
		}
		wanted[newRouteID(want.table, s.prefix, metric)] = rt
	}
	for _, id := range r.routeIDs(r.routes.byLink.Get(index), true) {
		if _, ok := wanted[id]; !ok {
			if err := r.deleteRoute(ctx, id); err != nil {
				return err
			}
		}
	}
	for _, id := range sortedKeys(wanted, compareRouteIDs) {
		rt := wanted[id]
		have, exists := r.routes.get(id)
		exists = exists && have.protocol == OverlayRouteProtocol
		if exists && sameOverlayRoute(have, rt) {
			continue
		}
		if exists && have.oif != index {
			if owner := r.ownerOfIndex(have.oif); !owner.IsZero() && owner != want.key && r.desired(owner) {
				return hal.Errorf(hal.ReasonConflict, "subnet %s: tenant table %d routes it to %s already", id.prefix(), id.table, owner)
			}
		}
		flags := uint16(unix.NLM_F_CREATE | unix.NLM_F_EXCL)
		if exists {
			flags = unix.NLM_F_CREATE | unix.NLM_F_REPLACE
		}
		msg := appendOverlayRouteRequest(r.nl.Buffer(), unix.RTM_NEWROUTE, flags, id, rt)
		if _, err := kernelWrite(ctx, r.rtnlConn, r.routes.m.ExpectBy(r.routeReader.writer(), id, rt, sameOverlayRoute), msg); err != nil {
			if !exists && errors.Is(err, unix.EEXIST) {
				return hal.Errorf(hal.ReasonConflict, "subnet %s: tenant table %d holds a route to it that naples did not create; leaving it alone", id.prefix(), id.table)
			}
			return kernelErr(err, "adding route %s dev %s", id, want.bridge)
		}
		r.log.Debug("tenant route programmed", "key", want.id, "route", id.String(), "bridge", want.bridge)
	}
	return nil
}

// sameOverlayRoute reports whether the kernel route have is the overlay route want: of
// OverlayRouteProtocol, out of the same interface, with the same preferred source and
// scope.
func sameOverlayRoute(have, want kernelRoute) bool {
	return have.protocol == want.protocol && have.oif == want.oif && have.src == want.src && have.scope == want.scope
}

// compareRouteIDs orders route identities by table, destination and metric.
func compareRouteIDs(a, b routeID) int {
	if c := cmp.Compare(a.table, b.table); c != 0 {
		return c
	}
	if c := a.dst().Compare(b.dst()); c != 0 {
		return c
	}
	if c := cmp.Compare(a.bits, b.bits); c != 0 {
		return c
	}
	return cmp.Compare(a.metric, b.metric)
}

// deleteRoute deletes the route of protocol 242 with the identity (`ip route del PREFIX
// table T metric M proto 242`).
func (r *NetworkReconciler) deleteRoute(ctx context.Context, id routeID) error {
	msg := appendOverlayRouteRequest(r.nl.Buffer(), unix.RTM_DELROUTE, 0, id, kernelRoute{})
	took, err := kernelWrite(ctx, r.rtnlConn, r.routes.m.ExpectGoneBy(r.routeReader.writer(), id), msg, unix.ESRCH)
	if err != nil {
		return kernelErr(err, "deleting route %s", id)
	}
	if took {
		r.log.Debug("route deleted", "route", id.String())
	}
	return nil
}

// desired reports whether the store holds the object with the key.
func (r *NetworkReconciler) desired(key nimbusv1.Key) bool {
	if key.IsZero() {
		return false
	}
	_, ok := r.store.Get(key.Proto())
	return ok
}

// networkRules returns the policy-routing rules of a network's bridge that sends to
// table, in both families: `ip rule add iif BRIDGE lookup T pref 1000` and `ip rule add
// iif BRIDGE prohibit pref 1001`. A family without subnets gets them too, so that nothing
// of it entering from the network reaches the main table.
func networkRules(bridge string, table uint32) []ruleKey {
	var keys []ruleKey
	for _, fam := range []uint8{unix.AF_INET, unix.AF_INET6} {
		keys = append(keys,
			ruleKey{family: fam, priority: TenantRulePriority, iif: bridge, table: table, action: unix.FR_ACT_TO_TBL},
			ruleKey{family: fam, priority: TenantRulePriority + 1, iif: bridge, action: unix.FR_ACT_PROHIBIT})
	}
	return keys
}

// ensureRules makes the kernel hold exactly the network's rules (networkRules) for what
// enters through its bridge.
func (r *NetworkReconciler) ensureRules(ctx context.Context, want networkWant) error {
	wanted := networkRules(want.bridge, want.table)
	for k, proto := range r.rules.byIIF.Get(want.bridge) {
		if k.overlay() && !slices.Contains(wanted, k) {
			if err := r.deleteRule(ctx, k, proto); err != nil {
				return err
			}
		}
	}
	for _, k := range wanted {
		if _, ok := r.rules.get(k); ok {
			continue
		}
		msg := appendRuleRequest(r.nl.Buffer(), unix.RTM_NEWRULE, unix.NLM_F_CREATE|unix.NLM_F_EXCL, k, uint8(OverlayRouteProtocol))
		if _, err := kernelWrite(ctx, r.rtnlConn, r.rules.m.ExpectBy(r.ruleReader.writer(), k, uint8(OverlayRouteProtocol), nil), msg); err != nil {
			return kernelErr(err, "adding rule %s", ruleString(k))
		}
		r.log.Debug("rule added", "key", want.id, "rule", ruleString(k))
	}
	return nil
}

// deleteRule deletes the rule k of the protocol (`ip rule del ...`).
func (r *NetworkReconciler) deleteRule(ctx context.Context, k ruleKey, protocol uint8) error {
	msg := appendRuleRequest(r.nl.Buffer(), unix.RTM_DELRULE, 0, k, protocol)
	took, err := kernelWrite(ctx, r.rtnlConn, r.rules.m.ExpectGoneBy(r.ruleReader.writer(), k), msg, unix.ENOENT)
	if err != nil {
		return kernelErr(err, "deleting rule %s", ruleString(k))
	}
	if took {
		r.log.Debug("rule deleted", "rule", ruleString(k))
	}
	return nil
}

// ruleString describes a rule as `ip rule` does.
func ruleString(k ruleKey) string {
	fam := "-4"
	if k.family == unix.AF_INET6 {
		fam = "-6"
	}
	action := fmt.Sprintf("lookup %d", k.table)
	if k.action == unix.FR_ACT_PROHIBIT {
		action = "prohibit"
	}
	if k.fwmark != 0 {
		return fmt.Sprintf("%s %d: fwmark %#x %s", fam, k.priority, k.fwmark, action)
	}
	return fmt.Sprintf("%s %d: iif %s %s", fam, k.priority, k.iif, action)
}

// ensureReplication makes the network's VXLAN device, with index, replicate broadcasts
// and unknown destinations to exactly the VTEPs of the other nodes that have endpoints in
// the network: `bridge fdb append 00:00:00:00:00:00 dev VXLAN dst VTEP self permanent`
// per VTEP, and `bridge fdb del` of the others. It returns the VTEPs, and the nodes
// skipped for want of a usable VTEP address.
func (r *NetworkReconciler) ensureReplication(ctx context.Context, want networkWant, vtep netip.Addr, index int32) (remotes []netip.Addr, without []string, err error) {
	eps, err := r.store.LookupKeys(EndpointNetworkIndex.Name, want.id)
	if err != nil {
		return nil, nil, fmt.Errorf("finding the endpoints of %s: %w", want.id, err)
	}
	var remoteEPs []nimbusv1.Key
	nodes := map[string]bool{}
	for _, ep := range eps {
		obj, ok := r.store.Get(ep.Proto())
		node := obj.GetEndpoint().GetNode()
		if !ok || node == "" || node == r.node {
			continue
		}
		nodes[node] = true
		remoteEPs = append(remoteEPs, ep)
	}
	r.recordRemoteEndpoints(want.key, remoteEPs)

	wanted := map[netip.Addr]bool{}
	for _, node := range sortedKeys(nodes, strings.Compare) {
		a, err := NodeVTEP(r.store, node)
		if a = a.Unmap(); err != nil || a.Is4() != vtep.Is4() {
			without = append(without, node)
			continue
		}
		if a != vtep {
			wanted[a] = true
		}
	}
	for k := range r.neigh.headEnds.Get(index) {
		if !wanted[k.dst.addr()] {
			if err := r.deleteHER(ctx, want.vxlan, k); err != nil {
				return nil, nil, err
			}
		}
	}
	for _, a := range sortedKeys(wanted, netip.Addr.Compare) {
		remotes = append(remotes, a)
		k := fdbKey{ifindex: index, dst: epAddrOf(a)}
		if _, ok := r.neigh.fdb.m.Get(k); ok {
			continue
		}
		msg := appendHERRequest(r.nl.Buffer(), unix.RTM_NEWNEIGH, unix.NLM_F_CREATE|unix.NLM_F_APPEND, k)
		w := r.neigh.fdb.m.ExpectBy(r.fdbReader.writer(), k, fdbEntry{dst: k.dst, permanent: true}, nil)
		if _, err := kernelWrite(ctx, r.rtnlConn, w, msg); err != nil {
			return nil, nil, kernelErr(err, "adding head-end replication to %s on %s", a, want.vxlan)
		}
		r.log.Debug("head-end replication added", "key", want.id, "vtep", a.String(), "vxlan", want.vxlan)
	}
	return remotes, without, nil
}

// deleteHER deletes the head-end replication entry k of the VXLAN device name.
func (r *NetworkReconciler) deleteHER(ctx context.Context, name string, k fdbKey) error {
	msg := appendHERRequest(r.nl.Buffer(), unix.RTM_DELNEIGH, 0, k)
	took, err := kernelWrite(ctx, r.rtnlConn, r.neigh.fdb.m.ExpectGoneBy(r.fdbReader.writer(), k), msg, unix.ENOENT, unix.ENODEV)
	if err != nil {
		return kernelErr(err, "deleting head-end replication to %s on %s", k.dst, name)
	}
	if took {
		r.log.Debug("head-end replication deleted", "vtep", k.dst.String(), "vxlan", name)
	}
	return nil
}

// teardown removes the kernel state of the network with the key: its gateway state
// (teardownGateway), its VXLAN device and bridge, which take their addresses, routes and FDB entries with them, and then the
// rules of the bridge, which name it and stay otherwise. Links of the devices' names
// that are not the network's, and the rules of a bridge name that such a link holds, are
// left alone.
func (r *NetworkReconciler) teardown(ctx context.Context, key nimbusv1.Key) error {
	if err := r.teardownGateway(ctx, key); err != nil {
		return err
	}
	id := key.String()
	bridge, vxlan, alias := BridgeName(id), VXLANName(id), OwnerAlias(id)
	br, brExists := r.link(bridge)
	foreign := brExists && !ownsLink(br, alias)
	for _, name := range []string{vxlan, bridge} {
		if l, ok := r.link(name); ok && ownsLink(l, alias) {
			if err := r.deleteLink(ctx, name, l); err != nil {
				return err
			}
		}
	}
	if !foreign {
		for k, proto := range r.rules.byIIF.Get(bridge) {
			if !k.overlay() {
				continue
			}
			if err := r.deleteRule(ctx, k, proto); err != nil {
				return err
			}
		}
	}
	r.forget(key)
	return nil
}

// ownerKey returns the key ID a link alias names, for logs.
func ownerKey(alias string) string {
	id, _ := OwnerOfAlias(alias)
	return id
}
