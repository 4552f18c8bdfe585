package linux

import (
	"fmt"
	"net/netip"

	"github.com/naplesnet/naples/hal"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// This file holds how the network reconciler derives a network's MTU from the underlay:
// the link that holds this host's VTEP address, whose MTU less VXLAN's overhead is the
// largest MTU the network's devices can carry without fragmenting the tunnel's packets.

// VXLAN's overhead: what encapsulation adds to a frame the overlay carries, the inner
// Ethernet header (14 bytes), the VXLAN header (8), UDP (8) and the outer IP header (20
// for IPv4, 40 for IPv6).
const (
	VXLANOverheadIPv4 = 50
	VXLANOverheadIPv6 = 70
)

// AssumedUnderlayMTU is the underlay MTU a network's default is derived from when no
// link of this host holds its VTEP address: Ethernet's.
const AssumedUnderlayMTU = 1500

// minOverlayMTU is the smallest MTU the kernel gives a bridge or VXLAN device (IPv4's
// minimum).
const minOverlayMTU = 68

// underlayLink is the link that holds this host's VTEP address, as the mirror shows it.
type underlayLink struct {
	// name is the link's name; "" when no link holds the address.
	name  string
	index int32
	mtu   uint32
}

// vxlanOverhead returns VXLAN's overhead over the VTEP address's family.
func vxlanOverhead(vtep netip.Addr) uint32 {
	if vtep.Is4() {
		return VXLANOverheadIPv4
	}
	return VXLANOverheadIPv6
}

// vxlanFamily names VXLAN over the VTEP address's family, for messages.
func vxlanFamily(vtep netip.Addr) string {
	if vtep.Is4() {
		return "VXLAN over IPv4"
	}
	return "VXLAN over IPv6"
}

// carries returns the largest MTU a network's devices can have over the underlay u with
// the VTEP address: the underlay's MTU (AssumedUnderlayMTU without an underlay link), at
// most 65535, the largest IP packet, less VXLAN's overhead.
func (u underlayLink) carries(vtep netip.Addr) uint32 {
	mtu := u.mtu
	if u.name == "" {
		mtu = AssumedUnderlayMTU
	}
	mtu = min(mtu, 65535)
	if o := vxlanOverhead(vtep); mtu > o {
		return mtu - o
	}
	return 0
}

// describe tells what u carries with the VTEP address, for status messages: "eth0 mtu
// 1500 carries at most 1450 with VXLAN over IPv4".
func (u underlayLink) describe(vtep netip.Addr) string {
	if u.name == "" {
		return fmt.Sprintf("no link holds VTEP %s; a %d-byte underlay carries at most %d with %s",
			vtep, AssumedUnderlayMTU, u.carries(vtep), vxlanFamily(vtep))
	}
	return fmt.Sprintf("%s mtu %d carries at most %d with %s", u.name, u.mtu, u.carries(vtep), vxlanFamily(vtep))
}

// networkMTU returns the MTU the network's devices get over the underlay u: spec.mtu
// when the network has one, otherwise the largest the underlay carries. A spec.mtu larger
// than a link of this host carries (its MTU less VXLAN's overhead) is an error of
// hal.ReasonInvalid that names spec.mtu, its value, the link and its MTU: the network is
// FAILED on this host, its devices are left as they were, and the underlay's next change
// of MTU reconciles it again. Without an underlay link, whose MTU is then unknown, misfit
// says instead that spec.mtu is larger than a 1500-byte underlay carries, and the network
// has the MTU it asks for. An underlay that carries less than the smallest MTU is an
// error when the network has no spec.mtu.
func networkMTU(spec uint32, u underlayLink, vtep netip.Addr) (mtu uint32, misfit string, err error) {
	limit := u.carries(vtep)
	switch {
	case spec != 0 && spec > limit && u.name != "":
		return 0, "", hal.Errorf(hal.ReasonInvalid, "spec.mtu %d: does not fit the underlay: %s; set spec.mtu %d or less, or raise %s's MTU",
			spec, u.describe(vtep), limit, u.name)
	case spec != 0 && spec > limit:
		return spec, fmt.Sprintf("spec.mtu %d: does not fit the underlay (%s)", spec, u.describe(vtep)), nil
	case spec != 0:
		return spec, "", nil
	case limit < minOverlayMTU:
		return 0, "", hal.Errorf(hal.ReasonInvalid, "underlay: %s, less than the smallest MTU, %d; set spec.mtu", u.describe(vtep), minOverlayMTU)
	}
	return limit, "", nil
}

// underlay returns the link that holds the VTEP address. It walks the addresses only
// when the address or the link that held it changed since it last looked (see
// underlayChanged).
func (r *NetworkReconciler) underlay(vtep netip.Addr) underlayLink {
	r.mu.Lock()
	known, index := r.ul.known && r.ul.vtep == vtep, r.ul.index
	r.mu.Unlock()
	if !known {
		index = 0
		for k := range r.addrs.byAddr.Get(vtep) {
			if index == 0 || k.index < index {
				index = k.index
			}
		}
		r.mu.Lock()
		r.ul = underlayCache{known: true, vtep: vtep, index: index}
		r.mu.Unlock()
	}
	if index == 0 {
		return underlayLink{}
	}
	l, ok := r.links.get(index)
	if !ok {
		return underlayLink{}
	}
	return underlayLink{name: l.name, index: index, mtu: l.mtu}
}

// underlayCache is what the reconciler last found of the underlay: the link with the
// index (0: none) held the VTEP address vtep, when known, and had the MTU mtu when the
// networks were last reconciled.
type underlayCache struct {
	known bool
	vtep  netip.Addr
	index int32
	mtu   uint32
}

// underlayAddr reports whether an address that came or went is the VTEP address the
// reconciler last looked for; if so it forgets what it found, so that the next reconcile
// looks again.
func (r *NetworkReconciler) underlayAddr(a netip.Addr) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.ul.known || r.ul.vtep != a.Unmap() {
		return false
	}
	r.ul.known = false
	return true
}

// underlayLinkChanged reports whether a change of the link with the index, to mtu (0:
// deleted), concerns the underlay: it is the link that held the VTEP address and its MTU
// is not the one the networks were last reconciled with. A deleted one is forgotten.
func (r *NetworkReconciler) underlayLinkChanged(index int32, mtu uint32) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.ul.known || r.ul.index == 0 || r.ul.index != index || r.ul.mtu == mtu {
		return false
	}
	if mtu == 0 {
		r.ul.known = false
	}
	r.ul.mtu = mtu
	return true
}

// recordUnderlayMTU records the underlay MTU the networks are reconciled with.
func (r *NetworkReconciler) recordUnderlayMTU(u underlayLink) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ul.known && r.ul.index == u.index {
		r.ul.mtu = u.mtu
	}
}

// allNetworks enqueues every network, for a change of the underlay.
func (r *NetworkReconciler) allNetworks(enqueue func(nimbusv1.Key), what, which string) {
	keys := r.store.Keys(nimbusv1.Kind_KIND_NETWORK)
	if len(keys) > 0 {
		r.log.Info("underlay changed; reconciling every network", "what", what, "which", which, "networks", len(keys))
	}
	for _, key := range keys {
		enqueue(key)
	}
}
