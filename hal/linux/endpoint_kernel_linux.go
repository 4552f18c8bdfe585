package linux

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/naplesnet/naples/hal"
	"github.com/naplesnet/naples/hal/linux/rtnl"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// The kernel state the endpoint reconciler reads, in the forms its mirrors keep (what it
// keeps of the messages package rtnl decodes, for dumps and notifications alike), and
// the requests, which rtnl builds, that change it. The mirrors hold:
//
//   - every link of the namespace (`ip link`), by interface index: its name, alias,
//     master, MTU, whether it is up and, for a bridge port, whether it learns;
//   - every static FDB entry (`bridge fdb show`, the entries shown "static" and not
//     "permanent") without a VLAN: the entries the reconciler writes, a remote MAC's
//     `self ... dst VTEP` entry on a VXLAN device and the `master` entries of a bridge for
//     its ports (the VXLAN port for a remote MAC, a local endpoint's interface for its
//     own), are of that kind; learned and permanent entries (a device's own addresses, the
//     network reconciler's head-end replication entries) are not. A bridge holds one entry
//     per MAC, whatever the port: the mirror keys a bridge's entry by the bridge and the
//     MAC, and keeps the port as its value, so that an entry that moves to another port
//     (`bridge fdb replace MAC dev OTHER master static`, or a frame learnt there) replaces
//     the copy of the port it left;
//   - every permanent neighbour (`ip neigh show nud permanent`), of either family.

// epLink is what the mirror keeps of a link.
type epLink struct {
	name  string
	alias string
	// master is the index of the link's master (a bridge, for a bridge port); 0 for none.
	master int32
	mtu    uint32
	// up tells the administrative state (IFF_UP), not whether the link has a carrier.
	up bool
	// group is IFLA_GROUP: a link naples created is in LinkGroup, even before it carries
	// its alias.
	group uint32
	// learning tells that the link is a port of a bridge that learns the source MACs of
	// the frames it receives (IFLA_BRPORT_LEARNING); false for a link that is no bridge
	// port.
	learning bool
}

// fdbKey identifies a static FDB entry: a device's own entry (`bridge fdb ... self`, a
// VXLAN device's remote MAC), by the device and the MAC, or a bridge's entry for one of
// its ports (`bridge fdb ... master`, reported with NDA_MASTER), by the bridge (ifindex)
// and the MAC, with master set.
type fdbKey struct {
	ifindex int32
	mac     [6]byte
	master  bool
}

// fdbEntry is what the mirror keeps of a static FDB entry: where a VXLAN device sends
// frames to the MAC (NDA_DST, the remote VTEP), or the port a bridge sends them to.
type fdbEntry struct {
	dst  netip.Addr
	port int32
}

// neighKey identifies a neighbour entry: its device and IP address.
type neighKey struct {
	ifindex int32
	ip      netip.Addr
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
	return epMix(h)
}

func (k neighKey) hash() uint64 {
	a := k.ip.As16()
	ne := binary.NativeEndian
	return epMix(ne.Uint64(a[0:8]) ^ ne.Uint64(a[8:16])*31 ^ uint64(uint32(k.ifindex))<<17)
}

// epMACString formats a MAC address as ip(8) does: "02:00:00:00:00:01".
func epMACString(mac [6]byte) string { return net.HardwareAddr(mac[:]).String() }

// String names the entry: "02:00:00:00:00:01 dev 7 self" as `bridge fdb` would, or
// "02:00:00:00:00:01 master 5" for a bridge's entry.
func (k fdbKey) String() string {
	if k.master {
		return fmt.Sprintf("%s master %d", epMACString(k.mac), k.ifindex)
	}
	return fmt.Sprintf("%s dev %d self", epMACString(k.mac), k.ifindex)
}

// String names the entry as `ip neigh` would: "10.0.0.5 dev 7".
func (k neighKey) String() string { return fmt.Sprintf("%s dev %d", k.ip, k.ifindex) }

// epLinkTable is the mirror of the namespace's links, by index, with a lookup by name.
type epLinkTable struct {
	mirror *hal.Mirror[int32, epLink]
	// byNameIndex finds the links of a name that the names hint misses.
	byNameIndex *hal.Index[int32, epLink, string]
	// mu guards names, which maps a name to the index that had it last. It is a hint
	// that byName checks against the mirror, since a name that went away stays in it.
	mu    sync.Mutex
	names map[string]int32
}

func newEPLinkTable() *epLinkTable {
	t := &epLinkTable{
		mirror: hal.NewMirror[int32, epLink](func(have, want epLink) bool { return have == want }, epHashLink),
		names:  map[string]int32{},
	}
	t.byNameIndex = hal.NewIndex(t.mirror, func(_ int32, l epLink) (string, bool) { return l.name, true })
	return t
}

// get returns the link with the index.
func (t *epLinkTable) get(index int32) (epLink, bool) { return t.mirror.Get(index) }

// byName returns the link with the name, and its index.
func (t *epLinkTable) byName(name string) (int32, epLink, bool) {
	t.mu.Lock()
	index, hinted := t.names[name]
	t.mu.Unlock()
	if hinted {
		if l, ok := t.mirror.Get(index); ok && l.name == name {
			return index, l, true
		}
	}
	// The name went away, or moved to another index that the hint missed: look.
	for i, l := range t.byNameIndex.Get(name) {
		t.named(i, name)
		return i, l, true
	}
	return 0, epLink{}, false
}

// named records that the link with the index has the name.
func (t *epLinkTable) named(index int32, name string) {
	t.mu.Lock()
	t.names[name] = index
	t.mu.Unlock()
}

// renamed rebuilds the names from the mirror, after a dump.
func (t *epLinkTable) renamed() {
	t.mu.Lock()
	defer t.mu.Unlock()
	clear(t.names)
	for i, l := range t.mirror.All() {
		t.names[l.name] = i
	}
}

// ours returns the link with the name when naples created it for the object with the
// key ID (its alias is OwnerAlias(ownerID)).
func (t *epLinkTable) ours(name, ownerID string) (int32, epLink, bool) {
	i, l, ok := t.byName(name)
	if !ok || l.alias != OwnerAlias(ownerID) {
		return 0, epLink{}, false
	}
	return i, l, true
}

// networkDevice tells whether the link with the index is the bridge or the VXLAN device
// of a network, and of which (its key ID).
func (t *epLinkTable) networkDevice(index int32) (networkID string, bridge, vxlan bool) {
	l, ok := t.get(index)
	if !ok {
		return "", false, false
	}
	return networkDeviceOf(l)
}

// networkDeviceOf tells whether the link is the bridge or the VXLAN device of a network,
// and of which (its key ID).
func networkDeviceOf(l epLink) (networkID string, bridge, vxlan bool) {
	id, ok := OwnerOfAlias(l.alias)
	if !ok || !strings.HasPrefix(id, nimbusv1.Kind_KIND_NETWORK.Name()+"/") {
		return "", false, false
	}
	return id, l.name == BridgeName(id), l.name == VXLANName(id)
}

// parseEPLink decodes the payload of an RTM_NEWLINK or RTM_DELLINK message
// (rtnl.ParseLink) into what the endpoint reconciler mirrors of the link. ok is false
// for a message of another family than AF_UNSPEC: the bridge's AF_BRIDGE messages
// describe a link as a port (an RTM_DELLINK of that family says that it left the
// bridge), without its alias.
func parseEPLink(b []byte) (index int32, l epLink, ok bool) {
	m, ok := rtnl.ParseLink(b)
	if !ok || m.Family != unix.AF_UNSPEC {
		return 0, epLink{}, false
	}
	l = epLink{name: m.Name, alias: m.Alias, master: m.Master, mtu: m.MTU, up: m.Up(), group: m.Group,
		learning: m.BridgePort && m.Port.Learning}
	return m.Index, l, m.Index > 0 && l.name != ""
}

// parseEPBridgePort decodes the payload of an RTM_NEWLINK message of family AF_BRIDGE, which
// a bridge sends about one of its ports (`bridge link set dev PORT learning on` sends only
// that): the port's index and whether it learns. ok is false for other messages, and for
// one without the port's attributes (IFLA_PROTINFO).
func parseEPBridgePort(b []byte) (index int32, learning, ok bool) {
	m, ok := rtnl.ParseLink(b)
	if !ok || m.Family != unix.AF_BRIDGE || !m.Protinfo || m.Index <= 0 {
		return 0, false, false
	}
	return m.Index, m.Port.Learning, true
}

// neighMsg is a decoded RTM_NEWNEIGH or RTM_DELNEIGH message: a neighbour (AF_INET,
// AF_INET6) or an FDB entry (AF_BRIDGE).
type neighMsg struct {
	family  uint8
	ifindex int32
	state   uint16
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
	m = neighMsg{family: n.Family, ifindex: n.Index, state: n.State, dst: n.Dst, mac: n.MAC, hasMAC: n.HasMAC,
		vlan: n.VLAN, master: n.Master}
	return m, m.ifindex > 0
}

// fdb returns the FDB entry an AF_BRIDGE message describes, and whether it is a static
// entry without a VLAN for a unicast MAC: the kind the mirror keeps. A bridge's entry is
// keyed by the bridge, with the port it names as its value.
func (m *neighMsg) fdb() (fdbKey, fdbEntry, bool) {
	k := fdbKey{ifindex: m.ifindex, mac: m.mac}
	e := fdbEntry{dst: m.dst}
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
	k := neighKey{ifindex: m.ifindex, ip: m.dst}
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
		Dst: e.dst, MAC: k.mac, HasMAC: true})
}

// appendNeighborRequest appends to b a request that adds or replaces (RTM_NEWNEIGH, `ip
// neigh replace IP lladdr MAC dev DEV nud permanent`) or deletes (RTM_DELNEIGH, `ip neigh
// del IP dev DEV`) a neighbour.
func appendNeighborRequest(b []byte, typ uint16, k neighKey, e neighEntry) []byte {
	family := uint8(unix.AF_INET6)
	if k.ip.Is4() {
		family = unix.AF_INET
	}
	if typ == unix.RTM_DELNEIGH {
		return rtnl.AppendNeighRequest(b, typ, 0, rtnl.Neigh{Family: family, Index: k.ifindex, Dst: k.ip})
	}
	return rtnl.AppendNeighRequest(b, typ, unix.NLM_F_CREATE|unix.NLM_F_REPLACE, rtnl.Neigh{Family: family, Index: k.ifindex,
		State: unix.NUD_PERMANENT, Dst: k.ip, MAC: e.mac, HasMAC: true})
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
