package linux

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"

	"golang.org/x/sys/unix"

	"github.com/naplesnet/naples/hal/linux/rtnl"
)

// The kernel state the endpoint reconciler reads, in the forms its mirrors keep (what it
// keeps of the messages package rtnl decodes, for dumps and notifications alike), and
// the requests, which rtnl builds, that change it. It reads the links (`ip link`) from
// its KernelView's link table, by interface index: their name, alias, master, MTU,
// group, whether they are up and, for a bridge port, whether it learns. Its own mirrors
// hold:
//
//   - every static FDB entry (`bridge fdb show`, the entries shown "static" and not
//     "permanent") without a VLAN: the entries the reconciler writes, a remote MAC's
//     `self ... dst VTEP` entry on a VXLAN device and the `master` entries of a bridge for
//     its ports (the VXLAN port for a remote MAC, a local endpoint's interface for its
//     own), are of that kind; learned and permanent entries (a device's own addresses)
//     are not. The table holds the network reconciler's head-end replication entries
//     too, keyed apart (fdbKey.headEnd), which the reconciler passes over. A bridge holds one entry
//     per MAC, whatever the port: the mirror keys a bridge's entry by the bridge and the
//     MAC, and keeps the port as its value, so that an entry that moves to another port
//     (`bridge fdb replace MAC dev OTHER master static`, or a frame learnt there) replaces
//     the copy of the port it left;
//   - every permanent neighbour (`ip neigh show nud permanent`), of either family.

// epLinkFields are the fields of a link whose change concerns the endpoints that name
// it or, for a network's device, the endpoints of the network.
const epLinkFields = linkFieldName | linkFieldAlias | linkFieldMaster | linkFieldMTU | linkFieldUp | linkFieldGroup | linkFieldLearning

// sameEPLink reports whether the link have is in the state want, which the endpoint
// reconciler wrote, describes: the fields it reads (epLinkFields). The operational state
// and counters change on their own and are left out.
func sameEPLink(have, want kernelLink) bool {
	return have.name == want.name && have.alias == want.alias && have.master == want.master && have.mtu == want.mtu &&
		have.up == want.up && have.group == want.group && have.learning == want.learning
}

// fdbKey identifies a static FDB entry: a device's own entry (`bridge fdb ... self`, a
// VXLAN device's remote MAC), by the device and the MAC, or a bridge's entry for one of
// its ports (`bridge fdb ... master`, reported with NDA_MASTER), by the bridge (ifindex)
// and the MAC, with master set. A head-end replication entry (`bridge fdb append
// 00:00:00:00:00:00 dev VXLAN dst VTEP self`), of which the kernel keeps one per device
// and destination, is keyed by the device and its destination, dst, with the all-zeros
// MAC; dst is the zero epAddr in every other key.
type fdbKey struct {
	ifindex int32
	mac     [6]byte
	master  bool
	dst     epAddr
}

// fdbEntry is what the mirror keeps of a static FDB entry: where a VXLAN device sends
// frames to the MAC (NDA_DST, the remote VTEP), or the port a bridge sends them to. A
// head-end replication entry holds its destination too, and whether it is permanent
// (NUD_PERMANENT), the state the overlay's entries have.
type fdbEntry struct {
	port      int32
	dst       epAddr
	permanent bool
}

// headEnd tells whether the key is a head-end replication entry's.
func (k fdbKey) headEnd() bool { return k.dst.valid() }

// neighKey identifies a neighbour entry: its device and IP address.
type neighKey struct {
	ifindex int32
	ip      epAddr
}

// epAddr is an IP address as the FDB and neighbour mirrors hold it: its 16 bytes (an
// IPv4 address in the first four) and its kind, without netip.Addr's zone pointer, so
// that a key or entry that holds one is smaller and holds no pointer for the garbage
// collector to follow. The kernel's neighbours and FDB entries carry no zone. The zero
// epAddr stands for the zero netip.Addr.
type epAddr struct {
	b [16]byte
	// kind is 0 for no address, 4 for an IPv4 address, 6 for an IPv6 one (an IPv4-mapped
	// IPv6 address among them).
	kind uint8
}

// epAddrOf returns a's compact form, without its zone.
func epAddrOf(a netip.Addr) epAddr {
	switch {
	case a.Is4():
		e := epAddr{kind: 4}
		a4 := a.As4()
		copy(e.b[:], a4[:])
		return e
	case a.Is6():
		return epAddr{b: a.As16(), kind: 6}
	}
	return epAddr{}
}

// addr returns the address as a netip.Addr: the zero Addr for the zero epAddr.
func (a epAddr) addr() netip.Addr {
	switch a.kind {
	case 4:
		return netip.AddrFrom4([4]byte(a.b[:4]))
	case 6:
		return netip.AddrFrom16(a.b)
	}
	return netip.Addr{}
}

// valid tells whether a holds an address, as netip.Addr.IsValid does.
func (a epAddr) valid() bool { return a.kind != 0 }

// is4 tells whether a is an IPv4 address, as netip.Addr.Is4 does.
func (a epAddr) is4() bool { return a.kind == 4 }

// String returns the address as netip.Addr.String does: "invalid IP" for none.
func (a epAddr) String() string { return a.addr().String() }

// hash returns a hash of the address's bytes and kind.
func (a epAddr) hash() uint64 {
	ne := binary.NativeEndian
	return ne.Uint64(a.b[0:8])*31 ^ ne.Uint64(a.b[8:16]) ^ uint64(a.kind)<<56
}

// neighEntry is what the mirror keeps of a permanent neighbour: its link-layer address.
type neighEntry struct {
	mac [6]byte
}

// epMix spreads the bits of h, for the mirrors' shards.
func epMix(h uint64) uint64 {
	h *= 0x9e3779b97f4a7c15
	return h ^ h>>29
}

func epHashLink(index int32) uint64 { return epMix(uint64(uint32(index))) }

func (k fdbKey) hash() uint64 {
	var m [8]byte
	copy(m[:], k.mac[:])
	h := binary.NativeEndian.Uint64(m[:]) ^ uint64(uint32(k.ifindex))<<32
	if k.master {
		h ^= 1 << 63
	}
	if k.dst.valid() {
		h ^= k.dst.hash()
	}
	return epMix(h)
}

func (k neighKey) hash() uint64 {
	return epMix(k.ip.hash() ^ uint64(uint32(k.ifindex))<<17)
}

// epMACString formats a MAC address as ip(8) does: "02:00:00:00:00:01".
func epMACString(mac [6]byte) string { return net.HardwareAddr(mac[:]).String() }

// String names the entry: "02:00:00:00:00:01 dev 7 self" as `bridge fdb` would,
// "02:00:00:00:00:01 master 5" for a bridge's entry, or "00:00:00:00:00:00 dev 7 dst
// 192.0.2.1 self" for a head-end replication entry.
func (k fdbKey) String() string {
	if k.headEnd() {
		return fmt.Sprintf("%s dev %d dst %s self", epMACString(k.mac), k.ifindex, k.dst)
	}
	if k.master {
		return fmt.Sprintf("%s master %d", epMACString(k.mac), k.ifindex)
	}
	return fmt.Sprintf("%s dev %d self", epMACString(k.mac), k.ifindex)
}

// String names the entry as `ip neigh` would: "10.0.0.5 dev 7".
func (k neighKey) String() string { return fmt.Sprintf("%s dev %d", k.ip, k.ifindex) }

// neighMsg is a decoded RTM_NEWNEIGH or RTM_DELNEIGH message: a neighbour (AF_INET,
// AF_INET6) or an FDB entry (AF_BRIDGE).
type neighMsg struct {
	family  uint8
	ifindex int32
	state   uint16
	flags   uint8
	// dst is NDA_DST: a neighbour's address, a VXLAN FDB entry's remote.
	dst netip.Addr
	// mac is NDA_LLADDR when it is an Ethernet address (hasMAC).
	mac    [6]byte
	hasMAC bool
	// vlan is NDA_VLAN; master is NDA_MASTER, the index of the bridge whose entry it is (0
	// for a device's own).
	vlan   uint16
	master int32
}

// parseNeighMsg decodes the payload of an RTM_NEWNEIGH or RTM_DELNEIGH message
// (rtnl.ParseNeigh).
func parseNeighMsg(b []byte) (m neighMsg, ok bool) {
	n, ok := rtnl.ParseNeigh(b)
	if !ok {
		return neighMsg{}, false
	}
	m = neighMsg{family: n.Family, ifindex: n.Index, state: n.State, flags: n.Flags, dst: n.Dst, mac: n.MAC, hasMAC: n.HasMAC,
		vlan: n.VLAN, master: n.Master}
	return m, m.ifindex > 0
}

// fdb returns the FDB entry an AF_BRIDGE message describes, and whether it is of a kind
// the mirror keeps: a static entry without a VLAN for a unicast MAC, or a device's own
// head-end replication entry (NTF_SELF, the all-zeros MAC and a destination) in whatever
// state. A bridge's entry is keyed by the bridge, with the port it names as its value; a
// head-end replication entry by its device and destination.
func (m *neighMsg) fdb() (fdbKey, fdbEntry, bool) {
	dst := epAddrOf(m.dst)
	if m.flags&unix.NTF_SELF != 0 && m.hasMAC && m.mac == [6]byte{} && dst.valid() {
		return fdbKey{ifindex: m.ifindex, dst: dst}, fdbEntry{dst: dst, permanent: m.state&unix.NUD_PERMANENT != 0}, true
	}
	k := fdbKey{ifindex: m.ifindex, mac: m.mac}
	e := fdbEntry{dst: dst}
	if m.master != 0 {
		k.ifindex, k.master = m.master, true
		e = fdbEntry{port: m.ifindex}
	}
	static := m.state&unix.NUD_NOARP != 0 && m.state&unix.NUD_PERMANENT == 0
	return k, e, static && m.hasMAC && m.vlan == 0 && epUnicastMAC(m.mac)
}

// neigh returns the neighbour an AF_INET or AF_INET6 message describes, and whether it
// is a permanent one: the kind the mirror keeps.
func (m *neighMsg) neigh() (neighKey, neighEntry, bool) {
	k := neighKey{ifindex: m.ifindex, ip: epAddrOf(m.dst)}
	return k, neighEntry{mac: m.mac}, m.state&unix.NUD_PERMANENT != 0 && m.hasMAC && m.dst.IsValid()
}

// epUnicastMAC tells whether mac is a unicast address other than all zeros.
func epUnicastMAC(mac [6]byte) bool { return mac[0]&1 == 0 && mac != [6]byte{} }

// appendFDBRequest appends to b a request that adds or replaces (RTM_NEWNEIGH) or deletes
// (RTM_DELNEIGH) the static FDB entry with the key, on the port e names for a bridge's:
//
//	bridge fdb replace MAC dev VXLAN self static dst VTEP
//	bridge fdb replace MAC dev PORT master static
//	bridge fdb del MAC dev DEV self|master
//
// A VXLAN device wants the state of a static entry as iproute2 sends it (NUD_NOARP |
// NUD_REACHABLE); a bridge keeps NUD_NOARP, which it reports back.
func appendFDBRequest(b []byte, typ uint16, k fdbKey, e fdbEntry) []byte {
	ifindex, ntf, state := k.ifindex, uint8(unix.NTF_SELF), uint16(unix.NUD_NOARP|unix.NUD_REACHABLE)
	if k.master {
		ifindex, ntf, state = e.port, unix.NTF_MASTER, unix.NUD_NOARP
	}
	flags := uint16(unix.NLM_F_CREATE | unix.NLM_F_REPLACE)
	if typ == unix.RTM_DELNEIGH {
		flags, state, e = 0, 0, fdbEntry{}
	}
	return rtnl.AppendNeighRequest(b, typ, flags, rtnl.Neigh{Family: unix.AF_BRIDGE, Index: ifindex, State: state, Flags: ntf,
		Dst: e.dst.addr(), MAC: k.mac, HasMAC: true})
}

// appendNeighborRequest appends to b a request that adds or replaces (RTM_NEWNEIGH, `ip
// neigh replace IP lladdr MAC dev DEV nud permanent`) or deletes (RTM_DELNEIGH, `ip neigh
// del IP dev DEV`) a neighbour.
func appendNeighborRequest(b []byte, typ uint16, k neighKey, e neighEntry) []byte {
	family := uint8(unix.AF_INET6)
	if k.ip.is4() {
		family = unix.AF_INET
	}
	if typ == unix.RTM_DELNEIGH {
		return rtnl.AppendNeighRequest(b, typ, 0, rtnl.Neigh{Family: family, Index: k.ifindex, Dst: k.ip.addr()})
	}
	return rtnl.AppendNeighRequest(b, typ, unix.NLM_F_CREATE|unix.NLM_F_REPLACE, rtnl.Neigh{Family: family, Index: k.ifindex,
		State: unix.NUD_PERMANENT, Dst: k.ip.addr(), MAC: e.mac, HasMAC: true})
}

// appendSetLinkRequest appends to b a request that sets a link's master (0: none) and,
// when set, its MTU, and sets it up when up is true: `ip link set DEV master BR mtu M up`,
// or `ip link set DEV nomaster`.
func appendSetLinkRequest(b []byte, index, master int32, mtu uint32, up bool) []byte {
	var flags uint32
	if up {
		flags = unix.IFF_UP
	}
	attrs := rtnl.LinkMaster
	if mtu != 0 {
		attrs |= rtnl.LinkMTU
	}
	return rtnl.AppendLinkRequest(b, unix.RTM_NEWLINK, 0, rtnl.Link{Index: index, Flags: flags, MTU: mtu, Master: master}, flags, attrs)
}

// appendSetLearningRequest appends to b a request that turns the learning of a bridge port
// on or off: `ip link set DEV type bridge_slave learning on|off`.
func appendSetLearningRequest(b []byte, index int32, learning bool) []byte {
	return rtnl.AppendLinkRequest(b, unix.RTM_NEWLINK, 0, rtnl.Link{Index: index, Port: rtnl.BridgePortInfo{Learning: learning}},
		0, rtnl.LinkPortLearning)
}
