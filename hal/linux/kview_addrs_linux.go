package linux

import (
	"context"
	"net/netip"

	"golang.org/x/sys/unix"

	"github.com/naplesnet/naples/hal"
	"github.com/naplesnet/naples/hal/linux/rtnl"
)

// kernelAddr is what a KernelView's address table holds of an address (`ip address
// show`), keyed by its link and its address with prefix length (addrKey): what any of its
// readers needs.
type kernelAddr struct {
	// flags are the address's flags (IFA_F_*): whether it is tentative, say.
	flags uint32
	// proto is the address's protocol (IFA_PROTO): AddressProtocol for naples's, 0 from
	// kernels without address protocols.
	proto uint8
	// peer tells that the address has a peer (IFA_LOCAL and IFA_ADDRESS differ, or IPv6
	// sends IFA_LOCAL): the agent's dataplane view shows it as a whole address. No
	// reconciler's want holds it, and equal passes it over.
	peer bool
}

// The fields of a kernelAddr, a bit each, as a tableChange reports those that changed.
const (
	addrFieldFlags uint64 = 1 << iota
	addrFieldProto
	addrFieldPeer
)

// addrFields returns the fields in which two states of an address differ.
func addrFields(a, b kernelAddr) uint64 {
	var f uint64
	if a.flags != b.flags {
		f |= addrFieldFlags
	}
	if a.proto != b.proto {
		f |= addrFieldProto
	}
	if a.peer != b.peer {
		f |= addrFieldPeer
	}
	return f
}

// addrTable is a KernelView's table of the IPv4 and IPv6 addresses of every link, with
// its indexes.
type addrTable struct {
	*viewTable[addrKey, kernelAddr]
	// byLink finds the addresses of a link by its interface index; byAddr those of an
	// address, whatever their link and prefix length; protocols those of a protocol
	// (naples's are AddressProtocol's).
	byLink    *hal.Index[addrKey, kernelAddr, int32]
	byAddr    *hal.Index[addrKey, kernelAddr, netip.Addr]
	protocols *hal.Index[addrKey, kernelAddr, uint8]
}

// newAddrTable returns an empty address table.
func newAddrTable() *addrTable {
	t := &addrTable{viewTable: newViewTable(viewTableOptions[addrKey, kernelAddr]{
		groups: []uint{unix.RTNLGRP_IPV4_IFADDR, unix.RTNLGRP_IPV6_IFADDR},
		equal:  func(have, want kernelAddr) bool { return have.flags == want.flags && have.proto == want.proto },
		fields: addrFields,
		notify: notifyAddr,
		dump: func(ctx context.Context, c *rtnlConn, m *hal.Mirror[addrKey, kernelAddr]) error {
			_, err := dumpMirror(ctx, c, m, "addresses", unix.RTM_NEWADDR, parseKernelAddr, rtnl.AddrDumpRequest())
			return err
		},
	})}
	t.byLink = hal.NewIndex(t.m, func(k addrKey, _ kernelAddr) (int32, bool) { return k.index, true })
	t.byAddr = hal.NewIndex(t.m, func(k addrKey, _ kernelAddr) (netip.Addr, bool) { return k.prefix.Addr().Unmap(), true })
	t.protocols = hal.NewIndex(t.m, func(_ addrKey, a kernelAddr) (uint8, bool) { return a.proto, true })
	return t
}

// get returns the address with the key.
func (t *addrTable) get(k addrKey) (kernelAddr, bool) { return t.m.Get(k) }

// notifyAddr applies an address notification, an RTM_NEWADDR or RTM_DELADDR, to the
// table's mirror.
func notifyAddr(m *hal.Mirror[addrKey, kernelAddr], typ uint16, payload []byte) {
	if typ != unix.RTM_NEWADDR && typ != unix.RTM_DELADDR {
		return
	}
	k, a, ok := parseKernelAddr(payload)
	switch {
	case !ok:
	case typ == unix.RTM_NEWADDR:
		m.Update(k, a)
	default:
		m.Remove(k)
	}
}

// parseKernelAddr decodes the payload of an RTM_NEWADDR or RTM_DELADDR message
// (rtnl.ParseAddr) into the address's key and what the address table holds of it. ok
// is false for a message that is not about an address of its family, IPv4 or IPv6, on
// an interface.
func parseKernelAddr(b []byte) (addrKey, kernelAddr, bool) {
	a, ok := rtnl.ParseAddr(b)
	if !ok {
		return addrKey{}, kernelAddr{}, false
	}
	p, ok := a.Prefix()
	if !ok || a.Index <= 0 {
		return addrKey{}, kernelAddr{}, false
	}
	// IPv4 sends IFA_LOCAL with IFA_ADDRESS, which differs from it for a peer; IPv6
	// sends IFA_LOCAL only for a peer.
	peer := a.Local.IsValid() && (a.Family != unix.AF_INET || a.Address != a.Local)
	return addrKey{index: a.Index, prefix: p}, kernelAddr{flags: a.Flags, proto: a.Protocol, peer: peer}, true
}
