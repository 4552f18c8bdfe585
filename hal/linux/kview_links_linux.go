package linux

import (
	"context"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/naplesnet/naples/hal"
	"github.com/naplesnet/naples/hal/linux/rtnl"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// kernelLink is what a KernelView's link table holds of a link (`ip -d -s link show`),
// keyed by its interface index: what any of its readers needs.
type kernelLink struct {
	name string
	// alias is IFLA_IFALIAS; a link naples created carries OwnerAlias of its object.
	alias string
	// kind is IFLA_INFO_KIND ("bridge", "vxlan", "veth", ...).
	kind string
	// master is the index of the link's master (a bridge, for a bridge port); 0 for none.
	master int32
	mtu    uint32
	// up is the administrative state (IFF_UP), not whether the link has a carrier.
	up bool
	// operState is the RFC 2863 operational state (IFLA_OPERSTATE).
	operState uint8
	carrier   bool
	// group is IFLA_GROUP: a link naples created is in LinkGroup, even before it carries
	// its alias.
	group uint32
	// mac is the link-layer address as raw bytes.
	mac string
	// bridgePort tells that the link is a port of a bridge; learning and neighSuppress
	// are then its port flags (`bridge link`): whether the bridge learns the source MACs
	// of the frames it receives (IFLA_BRPORT_LEARNING), and answers ARP and ND for it
	// (IFLA_BRPORT_NEIGH_SUPPRESS). Both are false for a link that is no bridge port.
	bridgePort    bool
	learning      bool
	neighSuppress bool
	// vxlan holds a VXLAN device's settings.
	vxlan rtnl.VXLANInfo
	// stats are the link's counters, as the last dump or notification reported them.
	stats rtnl.LinkStats
}

// The fields of a kernelLink, a bit each (linkFieldName: name, ...), as a tableChange
// reports those that changed.
const (
	linkFieldName uint64 = 1 << iota
	linkFieldAlias
	linkFieldKind
	linkFieldMaster
	linkFieldMTU
	linkFieldUp
	linkFieldOperState
	linkFieldCarrier
	linkFieldGroup
	linkFieldLearning
	linkFieldVXLAN
	linkFieldStats
	linkFieldMAC
	linkFieldBridgePort
	linkFieldNeighSuppress
)

// linkFields returns the fields in which two states of a link differ.
func linkFields(a, b kernelLink) uint64 {
	var f uint64
	set := func(differ bool, bit uint64) {
		if differ {
			f |= bit
		}
	}
	set(a.name != b.name, linkFieldName)
	set(a.alias != b.alias, linkFieldAlias)
	set(a.kind != b.kind, linkFieldKind)
	set(a.master != b.master, linkFieldMaster)
	set(a.mtu != b.mtu, linkFieldMTU)
	set(a.up != b.up, linkFieldUp)
	set(a.operState != b.operState, linkFieldOperState)
	set(a.carrier != b.carrier, linkFieldCarrier)
	set(a.group != b.group, linkFieldGroup)
	set(a.learning != b.learning, linkFieldLearning)
	set(a.vxlan != b.vxlan, linkFieldVXLAN)
	set(a.stats != b.stats, linkFieldStats)
	set(a.mac != b.mac, linkFieldMAC)
	set(a.bridgePort != b.bridgePort, linkFieldBridgePort)
	set(a.neighSuppress != b.neighSuppress, linkFieldNeighSuppress)
	return f
}

// owner returns the key ID of the object naples created the link for, from its alias
// (OwnerOfAlias), and whether it has one.
func (l kernelLink) owner() (string, bool) { return OwnerOfAlias(l.alias) }

// linkTable is a KernelView's table of links, keyed by interface index, with its indexes.
type linkTable struct {
	*viewTable[int32, kernelLink]
	// names finds a link by its name; owners finds the links naples created for an
	// object by its key ID; bridgesByMark finds networks' bridges by their tenant's
	// GatewayMark.
	names         *hal.Index[int32, kernelLink, string]
	owners        *hal.Index[int32, kernelLink, string]
	bridgesByMark *hal.Index[int32, kernelLink, uint32]
	// hintMu guards hint, which maps a name to the index that took it last: byName
	// checks it against the table, and asks names when it misses.
	hintMu sync.Mutex
	hint   map[string]int32
	// createMu guards creates, which holds per link name the writers that create a link
	// of the name and have not read it back yet (expectCreate).
	createMu sync.Mutex
	creates  map[string]hal.Writers
	// changed holds per link name a channel that the next change of a link of the name
	// closes, for those that wait for it (awaitLink); createMu guards it too.
	changed map[string]chan struct{}
}

// newLinkTable returns an empty link table.
func newLinkTable() *linkTable {
	t := &linkTable{hint: map[string]int32{}, creates: map[string]hal.Writers{}, changed: map[string]chan struct{}{}}
	t.viewTable = newViewTable(viewTableOptions[int32, kernelLink]{
		groups: []uint{unix.RTNLGRP_LINK},
		equal:  func(have, want kernelLink) bool { return have == want },
		hash:   epHashLink,
		fields: linkFields,
		notify: notifyLink,
		dump: func(ctx context.Context, c *rtnlConn, m *hal.Mirror[int32, kernelLink]) error {
			_, err := dumpMirror(ctx, c, m, "links", unix.RTM_NEWLINK, parseKernelLink, rtnl.LinkDumpRequest())
			return err
		},
		echoes: t.createEchoes,
	})
	t.names = hal.NewIndex(t.m, func(_ int32, l kernelLink) (string, bool) { return l.name, true })
	t.owners = hal.NewIndex(t.m, func(_ int32, l kernelLink) (string, bool) { return l.owner() })
	t.bridgesByMark = hal.NewIndex(t.m, bridgeMark)
	t.m.Follow(t.followNames)
	return t
}

// expectCreate records that the writer by is about to create a link of the name, and
// returns the function that ends the expectation, which the writer calls once the table
// holds the link as created (awaitLink), or it has read the link back and recorded what
// it read (hal.Mirror.ExpectBy). Until then every
// change of a link of the name is the echo of the create for by: the kernel reports a
// link it creates in steps (registered down and without an alias, then up, then a port
// of its master), each of which the writer's read answers, and the mirror cannot expect
// a write whose key, the index, the kernel has not chosen yet. From the read on, the
// mirror recognises the echoes.
func (t *linkTable) expectCreate(by hal.Writers, name string) (done func()) {
	t.createMu.Lock()
	t.creates[name] |= by
	t.createMu.Unlock()
	return func() {
		t.createMu.Lock()
		defer t.createMu.Unlock()
		if w := t.creates[name] &^ by; w != 0 {
			t.creates[name] = w
		} else {
			delete(t.creates, name)
		}
	}
}

// createEchoes returns the writers creating a link of the name the change shows
// (expectCreate), whose echo it is.
func (t *linkTable) createEchoes(c hal.MirrorChange[int32, kernelLink]) hal.Writers {
	name := c.New.name
	if !c.Has {
		name = c.Old.name
	}
	t.createMu.Lock()
	defer t.createMu.Unlock()
	return t.creates[name]
}

// awaitLink waits, for at most wait, until the table holds a link of the name for which
// ok is true, and returns it and its index. It reports false when the wait ends first,
// or ctx does.
func (t *linkTable) awaitLink(ctx context.Context, name string, wait time.Duration, ok func(kernelLink) bool) (int32, kernelLink, bool) {
	var timer *time.Timer
	for {
		// The channel is taken before the table is read, so a change in between closes it.
		t.createMu.Lock()
		ch := t.changed[name]
		if ch == nil {
			ch = make(chan struct{})
			t.changed[name] = ch
		}
		t.createMu.Unlock()
		if i, l, found := t.byName(name); found && ok(l) {
			return i, l, true
		}
		if timer == nil {
			timer = time.NewTimer(wait)
			defer timer.Stop()
		}
		select {
		case <-ch:
		case <-timer.C:
			return 0, kernelLink{}, false
		case <-ctx.Done():
			return 0, kernelLink{}, false
		}
	}
}

// signalChanged wakes those waiting for a change of a link of the name (awaitLink).
func (t *linkTable) signalChanged(name string) {
	t.createMu.Lock()
	defer t.createMu.Unlock()
	if ch, ok := t.changed[name]; ok {
		close(ch)
		delete(t.changed, name)
	}
}

// followNames keeps the hint of names current, and wakes those waiting for a change of
// a link of the name (awaitLink).
func (t *linkTable) followNames(c hal.MirrorChange[int32, kernelLink]) {
	if c.Has {
		t.signalChanged(c.New.name)
	}
	if c.Had && c.Has && c.Old.name == c.New.name {
		return
	}
	t.hintMu.Lock()
	defer t.hintMu.Unlock()
	if c.Had && t.hint[c.Old.name] == c.Key {
		delete(t.hint, c.Old.name)
	}
	if c.Has {
		t.hint[c.New.name] = c.Key
	}
}

// get returns the link with the index.
func (t *linkTable) get(index int32) (kernelLink, bool) { return t.m.Get(index) }

// byName returns the link with the name, and its index.
func (t *linkTable) byName(name string) (int32, kernelLink, bool) {
	t.hintMu.Lock()
	index, hinted := t.hint[name]
	t.hintMu.Unlock()
	if hinted {
		if l, ok := t.m.Get(index); ok && l.name == name {
			return index, l, true
		}
	}
	// The hint missed a link of the name that another shared with it for a moment.
	for i, l := range t.names.Get(name) {
		return i, l, true
	}
	return 0, kernelLink{}, false
}

// ours returns the link with the name when naples created it for the object with the
// key ID (its alias is OwnerAlias(ownerID)), and its index.
func (t *linkTable) ours(name, ownerID string) (int32, kernelLink, bool) {
	i, l, ok := t.byName(name)
	if !ok || l.alias != OwnerAlias(ownerID) {
		return 0, kernelLink{}, false
	}
	return i, l, true
}

// networkDevice tells whether the link with the index is the bridge or the VXLAN device
// of a network, and of which (its key ID).
func (t *linkTable) networkDevice(index int32) (networkID string, bridge, vxlan bool) {
	l, ok := t.get(index)
	if !ok {
		return "", false, false
	}
	return networkDeviceOf(l)
}

// networkDeviceOf tells whether the link is the bridge or the VXLAN device of a network,
// and of which (its key ID).
func networkDeviceOf(l kernelLink) (networkID string, bridge, vxlan bool) {
	id, ok := l.owner()
	if !ok || !strings.HasPrefix(id, nimbusv1.Kind_KIND_NETWORK.Name()+"/") {
		return "", false, false
	}
	return id, l.name == BridgeName(id), l.name == VXLANName(id)
}

// parseKernelLink decodes the payload of an RTM_NEWLINK or RTM_DELLINK message
// (rtnl.ParseLink) into what the link table holds of the link. ok is false for a
// message of another family than AF_UNSPEC (the bridge's AF_BRIDGE messages describe a
// link as a port, without its alias) and for one without a name or index.
func parseKernelLink(b []byte) (index int32, l kernelLink, ok bool) {
	m, ok := rtnl.ParseLink(b)
	if !ok {
		return 0, kernelLink{}, false
	}
	return kernelLinkOf(&m)
}

// kernelLinkOf is parseKernelLink of a decoded message.
func kernelLinkOf(m *rtnl.Link) (index int32, l kernelLink, ok bool) {
	if m.Family != unix.AF_UNSPEC || m.Name == "" || m.Index <= 0 {
		return 0, kernelLink{}, false
	}
	return m.Index, kernelLink{name: m.Name, alias: m.Alias, kind: m.Kind, master: m.Master, mtu: m.MTU, up: m.Up(),
		operState: m.OperState, carrier: m.Carrier, group: m.Group, mac: m.MAC, bridgePort: m.BridgePort,
		learning: m.BridgePort && m.Port.Learning, neighSuppress: m.BridgePort && m.Port.NeighSuppress,
		vxlan: m.VXLAN, stats: m.Stats}, true
}

// notifyLink applies a link notification to the table's mirror: an RTM_NEWLINK or
// RTM_DELLINK of a link, or a bridge's report about one of its ports (an RTM_NEWLINK of
// family AF_BRIDGE with IFLA_PROTINFO, which `bridge link set dev PORT learning on`
// sends alone), which changes its port flags.
func notifyLink(m *hal.Mirror[int32, kernelLink], typ uint16, payload []byte) {
	if typ != unix.RTM_NEWLINK && typ != unix.RTM_DELLINK {
		return
	}
	msg, ok := rtnl.ParseLink(payload)
	if !ok {
		return
	}
	if typ == unix.RTM_NEWLINK && msg.Family == unix.AF_BRIDGE {
		if !msg.Protinfo || msg.Index <= 0 {
			return
		}
		l, ok := m.Get(msg.Index)
		if !ok {
			return
		}
		next := l
		next.bridgePort, next.learning, next.neighSuppress = true, msg.Port.Learning, msg.Port.NeighSuppress
		if next != l {
			m.Update(msg.Index, next)
		}
		return
	}
	index, l, ok := kernelLinkOf(&msg)
	switch {
	case !ok:
	case typ == unix.RTM_NEWLINK:
		m.Update(index, l)
	default:
		m.Remove(index)
	}
}
