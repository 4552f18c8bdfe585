package linux

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/naplesnet/naples/delphi"
	"github.com/naplesnet/naples/hal"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// The indexes the endpoint reconciler finds the owner of a kernel entry by. Stores handed
// to NewEndpointReconciler must declare them (delphi.Options.Indexes), with
// EndpointNetworkIndex, EndpointNodeIndex and EndpointInterfaceIndex.
var (
	// EndpointMACIndex lists an Endpoint under "MAC|NETWORK": its MAC address as ip(8)
	// writes it ("02:00:00:00:00:01"), so that spellings of one address find the same
	// endpoint, and the key ID of its network. The network comes last so that delphi
	// holds it once for an endpoint's values here and in EndpointIPIndex and
	// EndpointNetworkIndex, which end and begin with it.
	EndpointMACIndex = delphi.Index{Name: "endpoint_mac", Values: func(obj *nimbusv1.Object) []string {
		k := NetworkKeyOf(obj)
		mac, err := parseEndpointMAC(obj.GetEndpoint().GetMac())
		if k == nil || err != nil {
			return nil
		}
		return []string{macIndexValue(k.ID(), mac)}
	}}
	// EndpointIPIndex lists an Endpoint under "NETWORK|IP" for each of its addresses: the
	// key ID of its network and the address in its canonical form ("2001:db8::5").
	EndpointIPIndex = delphi.Index{Name: "endpoint_ip", Values: func(obj *nimbusv1.Object) []string {
		k := NetworkKeyOf(obj)
		if k == nil {
			return nil
		}
		var out []string
		for _, s := range obj.GetEndpoint().GetIps() {
			if a, err := netip.ParseAddr(s); err == nil {
				out = append(out, ipIndexValue(k.ID(), a.Unmap()))
			}
		}
		slices.Sort(out)
		return slices.Compact(out)
	}}
)

// macIndexValue is the value EndpointMACIndex lists an endpoint with the MAC in the
// network under.
func macIndexValue(networkID string, mac [6]byte) string { return epMACString(mac) + "|" + networkID }

// ipIndexValue is the value EndpointIPIndex lists an endpoint with the address in the
// network under.
func ipIndexValue(networkID string, ip netip.Addr) string { return networkID + "|" + ip.String() }

// parseEndpointMAC parses an Ethernet MAC address.
func parseEndpointMAC(s string) ([6]byte, error) {
	hw, err := net.ParseMAC(s)
	if err != nil {
		return [6]byte{}, err
	}
	if len(hw) != 6 {
		return [6]byte{}, errors.New("not an Ethernet MAC address")
	}
	return [6]byte(hw), nil
}

// EndpointOptions configures an EndpointReconciler.
type EndpointOptions struct {
	// Store holds the desired Endpoint, Network and Node objects, and declares the
	// indexes of the package documentation. Required.
	Store OverlayStore
	// Node is the name of this host's Node: endpoints on it are local, the others remote.
	// Required.
	Node string
	// Namespace is the network namespace to program. Default: the calling process's.
	Namespace *netns.NsHandle
	// Timeout bounds every netlink request, so a kernel that does not answer fails the
	// reconcile, which is retried, instead of pinning a worker. Default: 10s.
	Timeout time.Duration
	// View is Namespace's kernel view, shared with the other reconcilers of the namespace,
	// through which the observer watches (one subscription between them). Default: a view
	// of the reconciler's own.
	View *KernelView
	// EventBuffer is the size in bytes of the observer's queue of link and neighbour
	// changes, and the least receive buffer of its view's subscription (SO_RCVBUFFORCE,
	// which needs CAP_NET_ADMIN). A burst of changes bigger than it overflows it; the
	// observer then fails, and its restart reads the kernel afresh. Default: 32 MiB.
	EventBuffer int
	// Logger receives the reconciler's logs. Default: slog.Default().
	Logger *slog.Logger
	// StateFile is where the reconciler records the MTU it found on a local endpoint's
	// interface before it first changed it, so that it puts the MTU back when it releases
	// the interface, also after a restart. Default: "", kept in memory only.
	StateFile string
	// Firewall, when set, enforces security policy on local endpoints: the reconciler
	// attaches it to a local endpoint's interface, and waits for it to hold the
	// endpoint, before it attaches the interface to its bridge, and removes it from an
	// interface that is not a local endpoint's any more. Default: nil, no firewall.
	Firewall *Firewall
}

// EndpointReconciler programs Endpoint objects into the bridges and VXLAN devices of
// their networks, which the network reconciler creates (BridgeName, VXLANName, marked
// with OwnerAlias of the network).
//
// A local endpoint, on this host's node, is a host interface that someone else created
// (a container runtime, say): the reconciler attaches it to the network's bridge, sets
// it up and gives it the network's MTU, the MTU of the bridge (`ip link set IF master BR
// mtu M up`; spec.mtu when the bridge has a larger one still), turns the
// port's learning off (`ip link set IF type bridge_slave learning off`), so that no frame
// from the workload moves another's entry to its port, and writes the endpoint's MAC, if
// it has one, to the bridge on that port (`bridge fdb replace MAC dev IF master static`).
// On teardown it releases the interface (`ip link set IF nomaster`) if its master is
// still a naples bridge, and puts back the MTU it had before naples first changed it
// (EndpointOptions.StateFile); it never deletes it. Its administrative state stays up.
//
// A remote endpoint, on another node, is reached through the VXLAN tunnel to that node's
// VTEP: the reconciler writes its MAC to the VXLAN device (`bridge fdb replace MAC dev VX
// self static dst VTEP`) and to the bridge, on the VXLAN port (`bridge fdb replace MAC dev
// VX master static`), so the bridge sends frames for it into the tunnel without learning
// it, and for every IP address a permanent neighbour on the bridge (`ip neigh replace IP
// lladdr MAC dev BR nud permanent`), from which the VXLAN port's neigh_suppress answers
// ARP and neighbour solicitations locally.
//
// The bridge holds one entry per MAC: the observer reports one that moves to another
// port of a naples bridge (`bridge fdb replace MAC dev OTHER master static`) as drift of
// the endpoint that owns the MAC, whose reconcile writes it back on its port.
//
// Each of these kernel entries (a MAC's two FDB entries in a network, an IP's neighbour
// in a network, an interface's attachment) belongs to one endpoint of those that the
// store's indexes list under it (EndpointMACIndex, EndpointIPIndex,
// EndpointInterfaceIndex): the one that holds it, the entry having been written or found
// right for it, as long as it still claims it; otherwise the one created first
// (meta.createTime, then key). The others are FAILED with reason Conflict, naming it. So
// an endpoint that comes later never takes what a running one holds, whatever their
// names; nimbus refuses such endpoints, but two replicas may each accept one at the same
// moment. After an agent restart, creation order decides.
// A reconcile makes each entry the endpoint had and has match what its owner wants, or
// removes it when no endpoint wants it, so a change of node, VTEP, MAC, addresses,
// network or interface moves or removes what was there. It reads the links from its
// KernelView's link table and the static FDB entries and permanent neighbours from its
// neighbour table, shared with the other reconcilers of the namespace, filled by one
// dump, kept current by the view and dumped afresh by every sweep, and writes only what
// differs.
type EndpointReconciler struct {
	// rtnlConn carries the writes, many to a sendmsg, and reads the kernel.
	*rtnlConn
	store OverlayStore
	node  string
	fw    *Firewall
	// found records the MTU of local endpoints' interfaces before naples changed it.
	found *foundLinks

	// links is the view's table of links, which linkReader reads; fdb and neigh are the
	// FDB entries and the neighbours of the view's neighbour table, which fdbReader and
	// neighReader read.
	links       *linkTable
	linkReader  *tableReader[int32, kernelLink]
	fdb         *viewTable[fdbKey, fdbEntry]
	fdbReader   *tableReader[fdbKey, fdbEntry]
	neigh       *viewTable[neighKey, neighEntry]
	neighReader *tableReader[neighKey, neighEntry]

	// locks serializes work on one kernel entry (endpointLock) between the workers of
	// different endpoints and the sweeper: whoever holds it reads the store and the
	// view's tables and then writes the kernel.
	locks keyedMutex[endpointLock]

	// mu guards endpoints, which holds the entries each endpoint programmed or may have
	// programmed, so that they can be removed or moved, and the endpoint each entry was
	// last written or found right for.
	mu        sync.Mutex
	endpoints endpointTable
}

var (
	_ hal.Reconciler         = (*EndpointReconciler)(nil)
	_ hal.Sweeper            = (*EndpointReconciler)(nil)
	_ hal.Observer           = (*EndpointReconciler)(nil)
	_ hal.Dependent          = (*EndpointReconciler)(nil)
	_ hal.KernelWriteCounter = (*EndpointReconciler)(nil)
)

// endpointLock names the kernel entry a lock of EndpointReconciler.locks guards, or
// EndpointReconciler.endpoints records the holder of: a MAC's FDB entries in a network, an
// IP's neighbour in a network, or a host interface.
type endpointLock struct {
	network string
	mac     [6]byte
	ip      netip.Addr
	iface   string
}

// endpointTable holds, per endpoint, the kernel entries it programmed or may have
// programmed, and per kernel entry the endpoint that holds it, by the entry's name, in a
// map per kind of entry. Every remote endpoint holds the FDB entries of its MAC and the
// neighbours of its addresses, so these maps are as long as the endpoints: an entry's
// holder is a pointer to the endpoint's record, which holds its key once, rather than a
// key in every map, and the MAC and address maps name a network by a small number
// (networkNumbers) rather than its key ID string: a macHolder takes 12 bytes where a
// macRef takes 24, an ipHolder 24 where an ipRef takes 40.
type endpointTable struct {
	// records holds the record of every endpoint that programmed entries or holds one,
	// by name (a KeyMap's place takes 24 bytes where a whole key and a pointer take 64),
	// the names shared with the records' keys.
	records *nimbusv1.KeyMap[*endpointRecord]
	nets    *networkNumbers
	macs    map[macHolder]*endpointRecord
	ips     map[ipHolder]*endpointRecord
	ifaces  map[string]*endpointRecord
}

// macHolder names the FDB entries of a MAC in a network, the network by its number, as
// the key of an endpointTable's map of holders.
type macHolder struct {
	network uint32
	mac     [6]byte
}

// ipHolder names the neighbour of an IP address on a network's bridge, the network by
// its number, as the key of an endpointTable's map of holders.
type ipHolder struct {
	network uint32
	ip      epAddr
}

// networkNumbers gives every network of which an endpointTable holds a MAC or an address
// a number, as long as it holds one, and takes it back for another network once it
// holds none.
type networkNumbers struct {
	byID map[string]*networkNumber
	free []uint32
	next uint32
}

// networkNumber is a network's number and how many MACs and addresses of it an
// endpointTable holds.
type networkNumber struct {
	n    uint32
	uses int
}

// number returns the network's number; when it has none, it gives it one if add is
// true, and reports false otherwise.
func (nn *networkNumbers) number(network string, add bool) (uint32, bool) {
	if e, ok := nn.byID[network]; ok {
		return e.n, true
	}
	if !add {
		return 0, false
	}
	e := &networkNumber{}
	if k := len(nn.free); k > 0 {
		e.n, nn.free = nn.free[k-1], nn.free[:k-1]
	} else {
		e.n = nn.next
		nn.next++
	}
	nn.byID[network] = e
	return e.n, true
}

// use counts one more (delta 1) or one fewer (delta -1) MAC or address of the network
// held, and takes its number back when none is left.
func (nn *networkNumbers) use(network string, delta int) {
	e, ok := nn.byID[network]
	if !ok {
		return
	}
	if e.uses += delta; e.uses <= 0 {
		delete(nn.byID, network)
		nn.free = append(nn.free, e.n)
	}
}

// endpointRecord is what an endpointTable keeps of one endpoint: its key, the entries it
// programmed or may have programmed, and the number of entries it holds.
type endpointRecord struct {
	key   nimbusv1.Key
	refs  packedRefs
	holds int
}

// packedRefs holds an endpoint's entries (endpointRefs) in the record: most endpoints,
// remote ones, program one MAC's FDB entries and one address's neighbour in one network,
// which it holds inline (112 bytes a record in all, where three slices and their arrays
// took 216); what does not fit that is kept in more.
type packedRefs struct {
	network string
	mac     [6]byte
	hasMAC  bool
	// ip is the address's neighbour, compact (17 bytes where a netip.Addr takes 24); the
	// zero epAddr when none. An address with a zone does not fit it and is kept in more.
	ip   epAddr
	more *endpointRefs
}

// packRefs returns r packed.
func packRefs(r endpointRefs) packedRefs {
	if len(r.ifaces) > 0 || len(r.macs) > 1 || len(r.ips) > 1 ||
		(len(r.ips) == 1 && (!r.ips[0].ip.IsValid() || r.ips[0].ip.Zone() != "")) ||
		(len(r.macs) == 1 && len(r.ips) == 1 && r.macs[0].network != r.ips[0].network) {
		return packedRefs{more: &r}
	}
	var p packedRefs
	if len(r.macs) == 1 {
		p.network, p.mac, p.hasMAC = r.macs[0].network, r.macs[0].mac, true
	}
	if len(r.ips) == 1 {
		p.network, p.ip = r.ips[0].network, epAddrOf(r.ips[0].ip)
	}
	return p
}

// unpack returns the entries p holds.
func (p packedRefs) unpack() endpointRefs {
	if p.more != nil {
		return *p.more
	}
	var r endpointRefs
	if p.hasMAC {
		r.macs = []macRef{{p.network, p.mac}}
	}
	if p.ip.valid() {
		r.ips = []ipRef{{p.network, p.ip.addr()}}
	}
	return r
}

func (p packedRefs) empty() bool { return p.more == nil && !p.hasMAC && !p.ip.valid() }

func newEndpointTable() endpointTable {
	return endpointTable{
		records: &nimbusv1.KeyMap[*endpointRecord]{},
		nets:    &networkNumbers{byID: map[string]*networkNumber{}},
		macs:    map[macHolder]*endpointRecord{},
		ips:     map[ipHolder]*endpointRecord{},
		ifaces:  map[string]*endpointRecord{},
	}
}

// programmed returns the entries the endpoint programmed or may have programmed.
func (t endpointTable) programmed(id nimbusv1.Key) endpointRefs {
	if r, ok := t.records.Get(id); ok {
		return r.refs.unpack()
	}
	return endpointRefs{}
}

// setProgrammed records the entries the endpoint programmed or may have programmed.
func (t endpointTable) setProgrammed(id nimbusv1.Key, refs endpointRefs) {
	r := t.record(id)
	r.refs = packRefs(refs)
	t.release(r)
}

// record returns the record of the endpoint, made when there is none; release lets go
// of it once it holds nothing.
func (t endpointTable) record(id nimbusv1.Key) *endpointRecord {
	r, ok := t.records.Get(id)
	if !ok {
		r = &endpointRecord{key: id}
		t.records.Set(id, r)
	}
	return r
}

// release forgets the endpoint's record when it neither programmed nor holds anything.
func (t endpointTable) release(r *endpointRecord) {
	if r.holds == 0 && r.refs.empty() {
		t.records.Delete(r.key)
	}
}

// get returns the holder of the entry.
func (t endpointTable) get(e endpointLock) (nimbusv1.Key, bool) {
	var r *endpointRecord
	if e.iface != "" {
		r = t.ifaces[e.iface]
	} else if n, ok := t.nets.number(e.network, false); ok {
		if e.ip.IsValid() {
			r = t.ips[ipHolder{n, epAddrOf(e.ip)}]
		} else {
			r = t.macs[macHolder{n, e.mac}]
		}
	}
	if r == nil {
		return nimbusv1.Key{}, false
	}
	return r.key, true
}

// set records owner as the holder of the entry; the zero Key records that none holds it.
func (t endpointTable) set(e endpointLock, owner nimbusv1.Key) {
	var r *endpointRecord
	if !owner.IsZero() {
		r = t.record(owner)
	}
	var was *endpointRecord
	if e.iface != "" {
		was = swapHolder(t.ifaces, e.iface, r)
	} else if n, ok := t.nets.number(e.network, r != nil); ok {
		if e.ip.IsValid() {
			was = swapHolder(t.ips, ipHolder{n, epAddrOf(e.ip)}, r)
		} else {
			was = swapHolder(t.macs, macHolder{n, e.mac}, r)
		}
		switch {
		case was == nil && r != nil:
			t.nets.use(e.network, 1)
		case was != nil && r == nil:
			t.nets.use(e.network, -1)
		}
	}
	if r != nil {
		r.holds++
	}
	if was != nil {
		was.holds--
		t.release(was)
	}
}

// swapHolder makes r the holder of the entry in m, none when r is nil, and returns the
// holder before.
func swapHolder[K comparable](m map[K]*endpointRecord, entry K, r *endpointRecord) *endpointRecord {
	was := m[entry]
	if r == nil {
		delete(m, entry)
	} else {
		m[entry] = r
	}
	return was
}

// claims returns the index that lists the endpoints that claim the entry and the value
// they are listed under.
func (e endpointLock) claims() (index, value string) {
	switch {
	case e.iface != "":
		return EndpointInterfaceIndex.Name, e.iface
	case e.ip.IsValid():
		return EndpointIPIndex.Name, ipIndexValue(e.network, e.ip)
	}
	return EndpointMACIndex.Name, macIndexValue(e.network, e.mac)
}

// macRef names the FDB entries of a MAC in a network: on its VXLAN device and on its
// bridge.
type macRef struct {
	network string
	mac     [6]byte
}

// ipRef names the neighbour of an IP address on a network's bridge.
type ipRef struct {
	network string
	ip      netip.Addr
}

// endpointRefs are the kernel entries an endpoint programs: for a remote endpoint its
// MAC's FDB entries and its addresses' neighbours, for a local one its interface.
type endpointRefs struct {
	macs   []macRef
	ips    []ipRef
	ifaces []string
}

func (r endpointRefs) empty() bool { return len(r.macs) == 0 && len(r.ips) == 0 && len(r.ifaces) == 0 }

func (r endpointRefs) equal(o endpointRefs) bool {
	return slices.Equal(r.macs, o.macs) && slices.Equal(r.ips, o.ips) && slices.Equal(r.ifaces, o.ifaces)
}

// minus returns the entries of r that are not in o.
func (r endpointRefs) minus(o endpointRefs) endpointRefs {
	var d endpointRefs
	for _, m := range r.macs {
		if !slices.Contains(o.macs, m) {
			d.macs = append(d.macs, m)
		}
	}
	for _, ip := range r.ips {
		if !slices.Contains(o.ips, ip) {
			d.ips = append(d.ips, ip)
		}
	}
	for _, i := range r.ifaces {
		if !slices.Contains(o.ifaces, i) {
			d.ifaces = append(d.ifaces, i)
		}
	}
	return d
}

// plus returns the entries of r and then those of o.
func (r endpointRefs) plus(o endpointRefs) endpointRefs {
	return endpointRefs{
		macs:   append(slices.Clip(r.macs), o.macs...),
		ips:    append(slices.Clip(r.ips), o.ips...),
		ifaces: append(slices.Clip(r.ifaces), o.ifaces...),
	}
}

// endpointPlan is what an endpoint that can be programmed wants of the kernel.
type endpointPlan struct {
	// network is the key ID of its network; bridge and bridgeIndex name the network's
	// bridge.
	network     string
	bridge      string
	bridgeIndex int32
	local       bool

	// iface is a local endpoint's interface; mtu the MTU it gets, 0 to leave it.
	iface string
	mtu   uint32

	// mac is the endpoint's MAC, when hasMAC; vtep and ips are a remote endpoint's.
	mac    [6]byte
	hasMAC bool
	vtep   netip.Addr
	ips    []netip.Addr
}

// refs returns the kernel entries the plan programs.
func (p *endpointPlan) refs() endpointRefs {
	if p.local {
		r := endpointRefs{ifaces: []string{p.iface}}
		if p.hasMAC {
			r.macs = []macRef{{p.network, p.mac}}
		}
		return r
	}
	r := endpointRefs{macs: []macRef{{p.network, p.mac}}}
	for _, ip := range p.ips {
		r.ips = append(r.ips, ipRef{p.network, ip})
	}
	return r
}

// operational returns the operational data of the endpoint's status, with the
// firewall's part fw (nil without a firewall).
func (p *endpointPlan) operational(fw *nimbusv1.EndpointFirewall) *nimbusv1.OperationalData {
	op := &nimbusv1.EndpointOperational{Bridge: p.bridge}
	if p.local {
		op.Role, op.Interface, op.Firewall = nimbusv1.NodeRole_NODE_ROLE_LOCAL, p.iface, fw
	} else {
		op.Role, op.Vtep, op.Mac = nimbusv1.NodeRole_NODE_ROLE_REMOTE, p.vtep.String(), epMACString(p.mac)
	}
	return &nimbusv1.OperationalData{Kind: &nimbusv1.OperationalData_Endpoint{Endpoint: op}}
}

// NewEndpointReconciler returns a reconciler bound to the options' namespace.
func NewEndpointReconciler(opts EndpointOptions) (*EndpointReconciler, error) {
	if opts.Store == nil {
		return nil, errors.New("endpoint reconciler: EndpointOptions.Store is required")
	}
	if opts.Node == "" {
		return nil, errors.New("endpoint reconciler: EndpointOptions.Node is required")
	}
	found, err := openFoundLinks(opts.StateFile)
	if err != nil {
		return nil, fmt.Errorf("endpoint reconciler: %w", err)
	}
	c, err := openRTNLConn(rtnlConnOptions{Namespace: opts.Namespace, View: opts.View, Timeout: opts.Timeout,
		EventBuffer: opts.EventBuffer, DefaultEventBuffer: 32 << 20, Logger: opts.Logger, Writes: true})
	if err != nil {
		return nil, err
	}
	reader := c.view.links.reader(c)
	fdbReader := c.view.neigh.fdb.reader(c)
	neighReader := c.view.neigh.ips.reader(c)
	if reader == nil || fdbReader == nil || neighReader == nil {
		if reader != nil {
			reader.close()
		}
		if fdbReader != nil {
			fdbReader.close()
		}
		if neighReader != nil {
			neighReader.close()
		}
		c.close()
		return nil, errors.New("endpoint reconciler: a table of the kernel view has as many readers as it can hold")
	}
	return &EndpointReconciler{
		rtnlConn:    c,
		found:       found,
		store:       opts.Store,
		node:        opts.Node,
		fw:          opts.Firewall,
		links:       c.view.links,
		linkReader:  reader,
		fdb:         c.view.neigh.fdb,
		fdbReader:   fdbReader,
		neigh:       c.view.neigh.ips,
		neighReader: neighReader,
		endpoints:   newEndpointTable(),
	}, nil
}

// Close releases the netlink sockets and stops reading the view's tables. It is safe to
// call twice.
func (r *EndpointReconciler) Close() error {
	r.linkReader.close()
	r.fdbReader.close()
	r.neighReader.close()
	r.close()
	return nil
}

// Kind returns KIND_ENDPOINT.
func (r *EndpointReconciler) Kind() nimbusv1.Kind { return nimbusv1.Kind_KIND_ENDPOINT }

// KernelWrites returns how many FDB entries, neighbours and interface attachments the
// reconciler has written or removed.
func (r *EndpointReconciler) KernelWrites() uint64 { return r.writes.Load() }

// DependsOn returns the kinds endpoints depend on: their Network and their Node.
func (r *EndpointReconciler) DependsOn() []nimbusv1.Kind {
	return []nimbusv1.Kind{nimbusv1.Kind_KIND_NETWORK, nimbusv1.Kind_KIND_NODE}
}

// DependentsOf returns the endpoints of a Network, or on a Node.
func (r *EndpointReconciler) DependentsOf(key nimbusv1.Key) []nimbusv1.Key {
	var keys []nimbusv1.Key
	var err error
	switch key.Kind {
	case nimbusv1.Kind_KIND_NETWORK:
		keys, err = r.store.LookupKeys(EndpointNetworkIndex.Name, key.String())
	case nimbusv1.Kind_KIND_NODE:
		keys, err = r.store.LookupKeys(EndpointNodeIndex.Name, key.Name)
	}
	if err != nil {
		r.log.Error("finding the endpoints that depend on an object", "key", key, "err", err)
		return nil
	}
	return keys
}

// Reconcile makes the kernel hold what the endpoint obj describes for key (see
// EndpointReconciler), and removes what the endpoint programmed before and no longer
// wants. With obj nil it removes everything the endpoint programmed. An endpoint that
// cannot be programmed (invalid, waiting for its network, node or interface, or in
// conflict with another one) programs nothing: what it had is removed.
func (r *EndpointReconciler) Reconcile(ctx context.Context, key *nimbusv1.ObjectKey, obj *nimbusv1.Object) (*nimbusv1.OperationalData, error) {
	if err := r.fill(ctx); err != nil {
		return nil, err
	}
	id := key.Key()
	r.mu.Lock()
	old := r.endpoints.programmed(id)
	r.mu.Unlock()

	var plan *endpointPlan
	var planErr error
	var want endpointRefs
	if obj != nil {
		if plan, planErr = r.plan(id, obj); planErr == nil {
			want = plan.refs()
		} else {
			plan = nil
		}
	}
	var fwOp *nimbusv1.EndpointFirewall
	if r.fw != nil && plan != nil && plan.local {
		// The firewall filters the interface before the interface joins its bridge.
		index, _, ok := r.links.byName(plan.iface)
		if !ok {
			return nil, hal.Pendingf(ReasonWaitingForInterface, "waiting for interface %q", plan.iface)
		}
		op, err := r.fw.AttachEndpoint(ctx, id, obj, int(index))
		if err != nil {
			return nil, err
		}
		fwOp = op
	}
	// Until the writes are done, the endpoint may have programmed either set.
	stale := old.minus(want)
	all := stale.plus(want)
	if !all.equal(old) {
		r.remember(id, all)
	}
	if err := r.sync(ctx, id, plan, all); err != nil {
		return nil, err
	}
	r.remember(id, want)
	if r.fw != nil && (plan == nil || !plan.local) {
		// Not a local endpoint (any more): no firewall on an interface for it, and its
		// addresses, if any, may be peers of policies.
		if err := r.fw.DetachEndpoint(id, obj); err != nil {
			return nil, hal.Errorf(hal.ReasonKernelError, "removing the firewall: %w", err)
		}
	}
	if planErr != nil {
		return nil, planErr
	}
	if obj == nil {
		return nil, nil
	}
	if r.log.Enabled(ctx, slog.LevelDebug) {
		r.log.Debug("endpoint programmed", "key", id, "local", plan.local)
	}
	return plan.operational(fwOp), nil
}

// remember records the entries the endpoint with key ID id has programmed.
func (r *EndpointReconciler) remember(id nimbusv1.Key, refs endpointRefs) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.endpoints.setProgrammed(id, refs)
}

// sync makes each entry of refs what its owner wants; plan is the plan of the endpoint
// with key ID id, nil when it cannot be programmed. The MACs the plan does not want come
// first, while the interfaces their entries may be on are still bridge ports; those it
// wants come after the interfaces, since a local endpoint's MAC goes on its interface
// once that is a port of the bridge.
func (r *EndpointReconciler) sync(ctx context.Context, id nimbusv1.Key, plan *endpointPlan, refs endpointRefs) error {
	var wanted []macRef
	if plan != nil {
		wanted = plan.refs().macs
	}
	for _, ref := range refs.macs {
		if slices.Contains(wanted, ref) {
			continue
		}
		if err := r.syncMAC(ctx, ref, id, plan, nil); err != nil {
			return err
		}
	}
	for _, name := range refs.ifaces {
		if err := r.syncInterface(ctx, name, id, plan, nil); err != nil {
			return err
		}
	}
	for _, ref := range refs.macs {
		if !slices.Contains(wanted, ref) {
			continue
		}
		if err := r.syncMAC(ctx, ref, id, plan, nil); err != nil {
			return err
		}
	}
	for _, ref := range refs.ips {
		if err := r.syncIP(ctx, ref, id, plan, nil); err != nil {
			return err
		}
	}
	return nil
}

// plan works out what the endpoint obj, with key ID id, wants of the kernel, or why it
// cannot be programmed: an *hal.Error that is invalid (ReasonInvalid), pending
// (ReasonWaitingForNetwork, ReasonWaitingForNode, ReasonWaitingForInterface) or in
// conflict (hal.ReasonConflict).
func (r *EndpointReconciler) plan(id nimbusv1.Key, obj *nimbusv1.Object) (*endpointPlan, error) {
	spec := obj.GetEndpoint()
	if spec == nil {
		return nil, hal.Errorf(hal.ReasonInvalid, "spec: not an Endpoint")
	}
	if spec.GetNode() == "" {
		return nil, hal.Errorf(hal.ReasonInvalid, `spec.node "": required`)
	}
	nk := NetworkKeyOf(obj)
	if nk == nil {
		return nil, hal.Errorf(hal.ReasonInvalid, `spec.network "": required`)
	}
	p := &endpointPlan{network: nk.ID(), local: spec.GetNode() == r.node}
	p.bridge = BridgeName(p.network)
	if s := spec.GetMac(); s != "" {
		mac, err := parseEndpointMAC(s)
		if err != nil {
			return nil, hal.Errorf(hal.ReasonInvalid, "spec.mac %q: %v", s, err)
		}
		if !p.local && !epUnicastMAC(mac) {
			return nil, hal.Errorf(hal.ReasonInvalid, "spec.mac %q: not a unicast address", s)
		}
		p.mac, p.hasMAC = mac, true
	}
	switch {
	case !p.local && !p.hasMAC:
		return nil, hal.Errorf(hal.ReasonInvalid, `spec.mac "": required for an endpoint on another node (%q)`, spec.GetNode())
	case p.local && !p.hasMAC && len(spec.GetIps()) > 0:
		return nil, hal.Errorf(hal.ReasonInvalid, `spec.mac "": required for an endpoint with spec.ips`)
	case p.local && spec.GetInterface() == "":
		return nil, hal.Errorf(hal.ReasonInvalid, `spec.interface "": required for an endpoint on this node (%q)`, r.node)
	}

	netObj, ok := r.store.Get(nk)
	if !ok || netObj.GetNetwork() == nil {
		return nil, hal.Pendingf(ReasonWaitingForNetwork, "waiting for %s: no such Network object", p.network)
	}
	if err := p.addIPs(spec.GetIps(), netObj.GetNetwork()); err != nil {
		return nil, err
	}
	if err := r.checkClaims(id, p); err != nil {
		return nil, err
	}

	bridge, br, ok := r.links.ours(p.bridge, p.network)
	if !ok {
		return nil, hal.Pendingf(ReasonWaitingForNetwork, "waiting for %s: its bridge %s is not there yet", p.network, p.bridge)
	}
	p.bridgeIndex = bridge
	// The network's key ID as the bridge's alias in the link table holds it: the entries
	// the plan programs, which the reconciler records, share one string per network
	// instead of one made for each endpoint.
	if id, ok := br.owner(); ok && id == p.network {
		p.network = id
	}
	if p.local {
		p.iface = spec.GetInterface()
		// The bridge's MTU is the network's, which its reconciler derives from the
		// underlay when spec.mtu is 0; spec.mtu is the most, should the bridge not have
		// it yet.
		p.mtu = br.mtu
		if m := netObj.GetNetwork().GetMtu(); m != 0 && (m < p.mtu || p.mtu == 0) {
			p.mtu = m
		}
		if err := r.checkInterface(id, p); err != nil {
			return nil, err
		}
		return p, nil
	}
	vxlan := VXLANName(p.network)
	if _, vx, ok := r.links.ours(vxlan, p.network); !ok || vx.master != bridge {
		return nil, hal.Pendingf(ReasonWaitingForNetwork, "waiting for %s: its VXLAN device %s is not attached to %s yet", p.network, vxlan, p.bridge)
	}
	vtep, err := NodeVTEP(r.store, spec.GetNode())
	if err != nil {
		return nil, err
	}
	p.vtep = vtep
	return p, nil
}

// addIPs parses the endpoint's addresses into p.ips, each of which must be inside a
// subnet of the network.
func (p *endpointPlan) addIPs(ips []string, network *nimbusv1.NetworkSpec) error {
	if len(ips) == 0 {
		return nil
	}
	var subnets []netip.Prefix
	var cidrs []string
	for _, s := range network.AllSubnets() {
		if pfx, err := netip.ParsePrefix(s.GetCidr()); err == nil {
			subnets = append(subnets, pfx.Masked())
			cidrs = append(cidrs, s.GetCidr())
		}
	}
	for i, s := range ips {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return hal.Errorf(hal.ReasonInvalid, "spec.ips[%d] %q: %v", i, s, err)
		}
		a = a.Unmap()
		if !slices.ContainsFunc(subnets, func(pfx netip.Prefix) bool { return pfx.Contains(a) }) {
			return hal.Errorf(hal.ReasonInvalid, "spec.ips[%d] %q: outside every subnet of %s (%s)", i, s, p.network, strings.Join(cidrs, ", "))
		}
		if !slices.Contains(p.ips, a) {
			p.ips = append(p.ips, a)
		}
	}
	return nil
}

// checkClaims checks that the endpoint with key ID id owns its MAC and addresses in its
// network: that no endpoint before it by key claims them.
func (r *EndpointReconciler) checkClaims(id nimbusv1.Key, p *endpointPlan) error {
	if p.hasMAC {
		owner, err := r.firstOwner(endpointLock{network: p.network, mac: p.mac})
		if err != nil {
			return err
		}
		if !owner.IsZero() && owner != id {
			return hal.Errorf(hal.ReasonConflict, "spec.mac %q: %s has it in %s", epMACString(p.mac), owner, p.network)
		}
	}
	for _, ip := range p.ips {
		owner, err := r.firstOwner(endpointLock{network: p.network, ip: ip})
		if err != nil {
			return err
		}
		if !owner.IsZero() && owner != id {
			return hal.Errorf(hal.ReasonConflict, "spec.ips %q: %s has it in %s", ip.String(), owner, p.network)
		}
	}
	return nil
}

// checkInterface checks that a local endpoint's interface is there and can be attached
// to its network's bridge: it is not a device of naples, no other endpoint of this node
// before it by key names it, and it has no master, or a naples bridge.
func (r *EndpointReconciler) checkInterface(id nimbusv1.Key, p *endpointPlan) error {
	_, l, ok := r.links.byName(p.iface)
	if !ok {
		return hal.Pendingf(ReasonWaitingForInterface, "waiting for interface %q", p.iface)
	}
	if owner, ours := OwnerOfAlias(l.alias); ours {
		return hal.Errorf(hal.ReasonConflict, "spec.interface %q: a device naples created for %s", p.iface, owner)
	}
	owner, err := r.interfaceOwner(p.iface)
	if err != nil {
		return err
	}
	if !owner.IsZero() && owner != id {
		return hal.Errorf(hal.ReasonConflict, "spec.interface %q: %s has it on this node", p.iface, owner)
	}
	return r.checkMaster(p.iface, l, p.bridgeIndex)
}

// checkMaster returns a Conflict error when the link has a master other than bridge that
// is not a naples bridge: an interface someone else attached is left alone.
func (r *EndpointReconciler) checkMaster(name string, l kernelLink, bridge int32) error {
	if l.master == 0 || l.master == bridge {
		return nil
	}
	if _, isBridge, _ := r.links.networkDevice(l.master); isBridge {
		return nil
	}
	m, _ := r.links.get(l.master)
	return hal.Errorf(hal.ReasonConflict, "interface %q is attached to %q, which naples did not create; leaving it alone", name, m.name)
}

// firstOwner returns the owner of the kernel entry (see pickOwner) among the endpoints
// that claim it, the zero Key when there is none.
func (r *EndpointReconciler) firstOwner(entry endpointLock) (nimbusv1.Key, error) {
	index, value := entry.claims()
	ids, err := r.store.LookupKeys(index, value)
	if err != nil {
		return nimbusv1.Key{}, fmt.Errorf("finding the owner of %q: %w", value, err)
	}
	return r.pickOwner(entry, ids), nil
}

// interfaceOwner returns the owner (see pickOwner) of the interface among the endpoints
// of this node that name it, the zero Key when there is none.
func (r *EndpointReconciler) interfaceOwner(name string) (nimbusv1.Key, error) {
	ids, err := r.store.LookupKeys(EndpointInterfaceIndex.Name, name)
	if err != nil {
		return nimbusv1.Key{}, fmt.Errorf("finding the endpoints of interface %q: %w", name, err)
	}
	mine := ids[:0:0]
	for _, id := range ids {
		if obj, ok := r.store.Get(id.Proto()); ok && obj.GetEndpoint().GetNode() == r.node {
			mine = append(mine, id)
		}
	}
	return r.pickOwner(endpointLock{iface: name}, mine), nil
}

// settle records who holds the kernel entry once a sync of it ended without error: the
// owner when the sync wrote or checked the entry for it (wanted, and no sweep), nobody
// when no endpoint wants it.
func (r *EndpointReconciler) settle(entry endpointLock, owner nimbusv1.Key, wanted, sweep bool, err error) {
	switch {
	case err != nil:
	case !wanted:
		r.hold(entry, nimbusv1.Key{})
	case !sweep:
		r.hold(entry, owner)
	}
}

// pickOwner returns which of the endpoints ids (keys in order), which all claim the
// kernel entry, owns it: the one that holds it, while it still claims it;
// otherwise the one created first, by meta.createTime and then key. The zero Key when
// ids is empty.
func (r *EndpointReconciler) pickOwner(entry endpointLock, ids []nimbusv1.Key) nimbusv1.Key {
	switch len(ids) {
	case 0:
		return nimbusv1.Key{}
	case 1:
		return ids[0]
	}
	r.mu.Lock()
	holder, held := r.endpoints.get(entry)
	r.mu.Unlock()
	if held && slices.Contains(ids, holder) {
		return holder
	}
	return firstCreated(r.store.Get, ids)
}

// firstCreated returns the key of the first created of the objects with the keys ids, by
// meta.createTime (an object without one counts as created first) and then by order in
// ids; the zero Key when ids is empty. get reads the objects.
func firstCreated(get func(*nimbusv1.ObjectKey) (*nimbusv1.Object, bool), ids []nimbusv1.Key) nimbusv1.Key {
	owner, first := nimbusv1.Key{}, time.Time{}
	for _, id := range ids {
		created := time.Time{}
		if obj, ok := get(id.Proto()); ok && obj.GetMeta().GetCreateTime() != nil {
			created = obj.GetMeta().GetCreateTime().AsTime()
		}
		if owner.IsZero() || created.Before(first) {
			owner, first = id, created
		}
	}
	return owner
}

// hold records that the kernel entry is written, or found right, for the endpoint owner;
// the zero Key records that no endpoint holds it.
func (r *EndpointReconciler) hold(entry endpointLock, owner nimbusv1.Key) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.endpoints.set(entry, owner)
}

// wanted returns the plan of the endpoint owner, which owns an entry that the endpoint
// with key id, whose plan is plan, may have programmed; nil when owner is the zero Key or
// cannot be programmed.
func (r *EndpointReconciler) wanted(owner, id nimbusv1.Key, plan *endpointPlan) *endpointPlan {
	if owner.IsZero() {
		return nil
	}
	if owner == id {
		return plan
	}
	obj, ok := r.store.Get(owner.Proto())
	if !ok {
		return nil
	}
	p, err := r.plan(owner, obj)
	if err != nil {
		return nil
	}
	return p
}

// syncMAC makes the FDB entries of a MAC in a network what the endpoint that owns them
// wants, or removes them when none does: for a remote endpoint, an entry on the VXLAN
// device to its VTEP and the bridge's entry for the VXLAN port; for a local one, the
// bridge's entry for its interface and none on the VXLAN device. The bridge holds one
// entry per MAC, so writing it on the wanted port moves it from any other, as from the
// port of a workload that claimed the MAC. id and plan are the reconciling endpoint's key
// ID and plan (nil when it cannot be programmed). With enqueue set (a sweep), entries
// that an endpoint wants are not written: that endpoint is enqueued when they differ.
func (r *EndpointReconciler) syncMAC(ctx context.Context, ref macRef, id nimbusv1.Key, plan *endpointPlan, enqueue func(nimbusv1.Key)) (err error) {
	lk := endpointLock{network: ref.network, mac: ref.mac}
	m := r.locks.lock(lk)
	defer r.locks.unlock(lk, m)
	owner, err := r.firstOwner(lk)
	if err != nil {
		return err
	}
	want := r.wanted(owner, id, plan)
	if want != nil && (want.network != ref.network || !want.hasMAC || want.mac != ref.mac) {
		want = nil
	}
	defer func() { r.settle(lk, owner, want != nil, enqueue != nil, err) }()
	br, _, hasBridge := r.links.ours(BridgeName(ref.network), ref.network)
	vx, _, hasVXLAN := r.links.ours(VXLANName(ref.network), ref.network)
	if !hasBridge && !hasVXLAN {
		return nil // gone, and their entries with them
	}
	self := fdbKey{ifindex: vx, mac: ref.mac}
	master := fdbKey{ifindex: br, mac: ref.mac, master: true}
	have, hasSelf := fdbEntry{}, false
	if hasVXLAN {
		have, hasSelf = r.fdb.m.Get(self)
	}
	port, hasMaster := fdbEntry{}, false
	if hasBridge {
		port, hasMaster = r.fdb.m.Get(master)
	}

	// What the owner wants: a VTEP on the VXLAN device (remote), and the port of the
	// bridge's entry (0: leave it, for a local interface that is no port yet).
	var wantDst netip.Addr
	var wantPort int32
	switch {
	case want == nil:
	case want.local:
		if i, l, ok := r.links.byName(want.iface); ok && hasBridge && l.master == br {
			wantPort = i
		}
	case !hasVXLAN || !hasBridge:
		return nil // the network's devices are being made: its endpoints are enqueued then
	default:
		wantDst, wantPort = want.vtep, vx
	}
	if want == nil || want.local {
		if enqueue != nil && (hasSelf || (want == nil && hasMaster)) {
			r.log.Info("removing stale FDB entries", "mac", epMACString(ref.mac), "network", ref.network)
		}
		if hasSelf {
			if err := r.deleteFDB(ctx, self, have); err != nil {
				return err
			}
		}
		if want == nil {
			if hasMaster {
				return r.deleteFDB(ctx, master, port)
			}
			return nil
		}
	}
	selfOK := want.local || (hasSelf && have.dst == epAddrOf(wantDst))
	masterOK := wantPort == 0 || (hasMaster && port.port == wantPort)
	if selfOK && masterOK {
		return nil
	}
	if enqueue != nil {
		enqueue(owner)
		return nil
	}
	if !selfOK {
		if err := r.writeFDB(ctx, self, fdbEntry{dst: epAddrOf(wantDst)}); err != nil {
			return err
		}
	}
	if !masterOK {
		if hasMaster && port.port != wantPort {
			r.log.Info("moving an FDB entry back to the port of its endpoint", "key", owner, "mac", epMACString(ref.mac),
				"from", r.deviceName(port.port), "to", r.deviceName(wantPort))
		}
		return r.writeFDB(ctx, master, fdbEntry{port: wantPort})
	}
	return nil
}

// syncIP makes the neighbour of an IP address on a network's bridge what the endpoint
// that owns it wants, or removes it when none does; see syncMAC.
func (r *EndpointReconciler) syncIP(ctx context.Context, ref ipRef, id nimbusv1.Key, plan *endpointPlan, enqueue func(nimbusv1.Key)) (err error) {
	lk := endpointLock{network: ref.network, ip: ref.ip}
	m := r.locks.lock(lk)
	defer r.locks.unlock(lk, m)
	owner, err := r.firstOwner(lk)
	if err != nil {
		return err
	}
	want := r.wanted(owner, id, plan)
	if want != nil && (want.local || want.network != ref.network || !slices.Contains(want.ips, ref.ip)) {
		want = nil
	}
	defer func() { r.settle(lk, owner, want != nil, enqueue != nil, err) }()
	br, _, ok := r.links.ours(BridgeName(ref.network), ref.network)
	if !ok {
		return nil
	}
	k := neighKey{ifindex: br, ip: epAddrOf(ref.ip)}
	have, has := r.neigh.m.Get(k)
	switch {
	case want == nil && has:
		if enqueue != nil {
			r.log.Info("removing stale neighbour", "ip", ref.ip, "network", ref.network)
		}
		return r.deleteNeigh(ctx, k)
	case want == nil, has && have.mac == want.mac:
		return nil
	case enqueue != nil:
		enqueue(owner)
		return nil
	}
	return r.writeNeigh(ctx, k, neighEntry{mac: want.mac})
}

// syncInterface attaches a host interface to the bridge of the local endpoint that owns
// it, up, with its network's MTU and learning off (the endpoint's MAC is a static entry,
// and no frame from the workload may move another's), or releases it from a naples
// bridge when no endpoint wants it; see syncMAC.
func (r *EndpointReconciler) syncInterface(ctx context.Context, name string, id nimbusv1.Key, plan *endpointPlan, enqueue func(nimbusv1.Key)) (err error) {
	lk := endpointLock{iface: name}
	m := r.locks.lock(lk)
	defer r.locks.unlock(lk, m)
	index, l, ok := r.links.byName(name)
	if !ok {
		return nil
	}
	if _, ours := OwnerOfAlias(l.alias); ours || l.group == LinkGroup {
		return nil // a device of naples (marked, or made and not marked yet): never an endpoint's
	}
	owner, err := r.interfaceOwner(name)
	if err != nil {
		return err
	}
	want := r.wanted(owner, id, plan)
	if want != nil && (!want.local || want.iface != name) {
		want = nil
	}
	defer func() {
		r.settle(lk, owner, want != nil, enqueue != nil, err)
	}()
	if want == nil {
		return r.releaseInterface(ctx, owner, index, l)
	}
	attached := l.master == want.bridgeIndex && l.up && (want.mtu == 0 || l.mtu == want.mtu)
	if attached && !l.learning {
		return nil
	}
	if enqueue != nil {
		enqueue(owner)
		return nil
	}
	if !attached {
		if err := r.checkMaster(name, l, want.bridgeIndex); err != nil {
			return err
		}
		if rec := r.found.get(name); rec.MTU == 0 && want.mtu != 0 && l.mtu != want.mtu {
			// Recorded before the write, so that a release puts the MTU back.
			rec.MTU = l.mtu
			if err := r.found.set(name, rec); err != nil {
				return hal.Errorf(hal.ReasonFailed, "recording the MTU of interface %s: %w", name, err)
			}
		}
		if err := r.setLink(ctx, owner, index, l, want.bridgeIndex, want.mtu, true); err != nil {
			return err
		}
		if l, ok = r.links.get(index); !ok || !l.learning {
			return nil
		}
	}
	return r.setLearning(ctx, index, l, false)
}

// releaseInterface releases the interface l, with the index, that no local endpoint
// wants from the naples bridge that is its master (`ip link set IF nomaster`), puts back
// the MTU it had before naples first changed it (`mtu M`), and forgets that MTU. One on no
// bridge gets its MTU back all the same; one on a bridge that is not naples's is left
// alone.
func (r *EndpointReconciler) releaseInterface(ctx context.Context, owner nimbusv1.Key, index int32, l kernelLink) error {
	rec := r.found.get(l.name)
	if _, isBridge, _ := r.links.networkDevice(l.master); l.master != 0 && !isBridge || l.master == 0 && (rec.MTU == 0 || rec.MTU == l.mtu) {
		// Someone else's bridge holds it now, or there is nothing to put back.
		return r.found.set(l.name, linkFound{})
	}
	mtu := rec.MTU
	if mtu == l.mtu {
		mtu = 0
	}
	if err := r.setLink(ctx, owner, index, l, 0, mtu, false); err != nil {
		return err
	}
	return r.found.set(l.name, linkFound{})
}

// deviceName returns the name of the link with the index, for messages.
func (r *EndpointReconciler) deviceName(index int32) string {
	if l, ok := r.links.get(index); ok {
		return l.name
	}
	return fmt.Sprintf("#%d", index)
}

// describeFDB names an FDB entry as `bridge fdb` does.
func (r *EndpointReconciler) describeFDB(k fdbKey, e fdbEntry) string {
	if k.master {
		return epMACString(k.mac) + " dev " + r.deviceName(e.port) + " master " + r.deviceName(k.ifindex) + " static"
	}
	s := epMACString(k.mac) + " dev " + r.deviceName(k.ifindex)
	if e.dst.valid() {
		s += " dst " + e.dst.String()
	}
	return s + " self static"
}

// writeFDB adds or replaces a static FDB entry (see appendFDBRequest).
func (r *EndpointReconciler) writeFDB(ctx context.Context, k fdbKey, e fdbEntry) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	msg := appendFDBRequest(r.nl.Buffer(), unix.RTM_NEWNEIGH, k, e)
	if _, err := kernelWrite(ctx, r.rtnlConn, r.fdb.m.ExpectBy(r.fdbReader.writer(), k, e, nil), msg); err != nil {
		return hal.Errorf(hal.ReasonKernelError, "adding FDB entry %s: %w", r.describeFDB(k, e), err)
	}
	if r.log.Enabled(ctx, slog.LevelDebug) {
		r.log.Debug("FDB entry written", "entry", r.describeFDB(k, e))
	}
	return nil
}

// deleteFDB deletes the static FDB entry k, which the table shows as e (a bridge's
// entry is deleted on its port); one that is gone already is no error.
func (r *EndpointReconciler) deleteFDB(ctx context.Context, k fdbKey, e fdbEntry) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	msg := appendFDBRequest(r.nl.Buffer(), unix.RTM_DELNEIGH, k, e)
	took, err := kernelWrite(ctx, r.rtnlConn, r.fdb.m.ExpectGoneBy(r.fdbReader.writer(), k), msg, unix.ENOENT, unix.ENODEV)
	if err != nil {
		return hal.Errorf(hal.ReasonKernelError, "deleting FDB entry %s: %w", r.describeFDB(k, e), err)
	}
	if took && r.log.Enabled(ctx, slog.LevelDebug) {
		r.log.Debug("FDB entry deleted", "entry", r.describeFDB(k, e))
	}
	return nil
}

// writeNeigh adds or replaces a permanent neighbour (see appendNeighborRequest).
func (r *EndpointReconciler) writeNeigh(ctx context.Context, k neighKey, e neighEntry) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	msg := appendNeighborRequest(r.nl.Buffer(), unix.RTM_NEWNEIGH, k, e)
	if _, err := kernelWrite(ctx, r.rtnlConn, r.neigh.m.ExpectBy(r.neighReader.writer(), k, e, nil), msg); err != nil {
		return hal.Errorf(hal.ReasonKernelError, "adding neighbour %s lladdr %s dev %s: %w", k.ip, epMACString(e.mac), r.deviceName(k.ifindex), err)
	}
	return nil
}

// deleteNeigh deletes a neighbour; one that is gone already is no error.
func (r *EndpointReconciler) deleteNeigh(ctx context.Context, k neighKey) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	msg := appendNeighborRequest(r.nl.Buffer(), unix.RTM_DELNEIGH, k, neighEntry{})
	if _, err := kernelWrite(ctx, r.rtnlConn, r.neigh.m.ExpectGoneBy(r.neighReader.writer(), k), msg, unix.ENOENT, unix.ENODEV); err != nil {
		return hal.Errorf(hal.ReasonKernelError, "deleting neighbour %s dev %s: %w", k.ip, r.deviceName(k.ifindex), err)
	}
	return nil
}

// setLink sets the master (0: none) of the link l with the index and, when not 0, its
// MTU, and sets it up when up is true (see appendSetLinkRequest); key is the endpoint it
// does it for, "" for none.
func (r *EndpointReconciler) setLink(ctx context.Context, key nimbusv1.Key, index int32, l kernelLink, master int32, mtu uint32, up bool) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	want := l
	want.master = master
	if mtu != 0 {
		want.mtu = mtu
	}
	want.up = want.up || up
	if master != l.master {
		// A new bridge port learns, as the kernel makes it; one released does not.
		want.bridgePort, want.learning, want.neighSuppress = master != 0, master != 0, false
	}
	msg := appendSetLinkRequest(r.nl.Buffer(), index, master, mtu, up)
	if _, err := kernelWrite(ctx, r.rtnlConn, r.links.m.ExpectBy(r.linkReader.writer(), index, want, sameEPLink), msg); err != nil {
		if master == 0 {
			return hal.Errorf(hal.ReasonKernelError, "releasing interface %s from %s: %w", l.name, r.deviceName(l.master), err)
		}
		return hal.Errorf(hal.ReasonKernelError, "attaching interface %s to %s: %w", l.name, r.deviceName(master), err)
	}
	if master == 0 {
		r.log.Info("interface released", "interface", l.name, "bridge", r.deviceName(l.master))
	} else {
		r.log.Info("interface attached", "key", key, "interface", l.name, "bridge", r.deviceName(master), "mtu", want.mtu)
	}
	return nil
}

// setLearning turns the learning of the bridge port l, with the index, on or off (see
// appendSetLearningRequest).
func (r *EndpointReconciler) setLearning(ctx context.Context, index int32, l kernelLink, learning bool) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	want := l
	want.learning = learning
	msg := appendSetLearningRequest(r.nl.Buffer(), index, learning)
	if _, err := kernelWrite(ctx, r.rtnlConn, r.links.m.ExpectBy(r.linkReader.writer(), index, want, sameEPLink), msg); err != nil {
		return hal.Errorf(hal.ReasonKernelError, "turning learning off on bridge port %s: %w", l.name, err)
	}
	r.log.Info("bridge port learning turned off", "interface", l.name, "bridge", r.deviceName(l.master))
	return nil
}

// Sweep reads the kernel afresh into the view's tables, enqueues the endpoints whose entries
// changed without the observer reporting it, removes the FDB entries and neighbours on
// the networks' devices that no endpoint wants, and releases from naples bridges the
// interfaces that no local endpoint wants there. Entries an endpoint wants that differ
// from what it wants enqueue it.
func (r *EndpointReconciler) Sweep(ctx context.Context, enqueue func(nimbusv1.Key)) error {
	if err := r.links.reload(ctx, r.rtnlConn); err != nil {
		return err
	}
	r.linkReader.drainMissed(func(c tableChange[int32, kernelLink]) { r.linkChanged(c, enqueue) })
	if err := r.fdb.reload(ctx, r.rtnlConn); err != nil {
		return err
	}
	r.fdbReader.drainMissed(func(c tableChange[fdbKey, fdbEntry]) { r.fdbChanged(c, enqueue) })
	if err := r.neigh.reload(ctx, r.rtnlConn); err != nil {
		return err
	}
	r.neighReader.drainMissed(func(c tableChange[neighKey, neighEntry]) { r.neighChanged(c, enqueue) })
	macs := map[macRef]struct{}{}
	for k := range r.fdb.m.All() {
		if network, ok := r.fdbNetwork(k); ok {
			macs[macRef{network, k.mac}] = struct{}{}
		}
	}
	for ref := range macs {
		if err := r.syncMAC(ctx, ref, nimbusv1.Key{}, nil, enqueue); err != nil {
			return err
		}
	}
	for k := range r.neigh.m.All() {
		if network, bridge, _ := r.links.networkDevice(k.ifindex); bridge {
			if err := r.syncIP(ctx, ipRef{network, k.ip.addr()}, nimbusv1.Key{}, nil, enqueue); err != nil {
				return err
			}
		}
	}
	for _, l := range r.links.m.All() {
		if _, ours := OwnerOfAlias(l.alias); ours || l.master == 0 {
			continue
		}
		if _, bridge, _ := r.links.networkDevice(l.master); bridge {
			if err := r.syncInterface(ctx, l.name, nimbusv1.Key{}, nil, enqueue); err != nil {
				return err
			}
		}
	}
	return nil
}

// Observe watches the view's link and neighbour tables (FDB entries and neighbours),
// which the view dumps when its subscription starts. It enqueues the endpoints whose
// kernel state someone else changed, or
// that the change concerns: the owner of an FDB entry or neighbour on a network's devices
// that changed or went, the endpoints that name an interface that came, went or changed,
// and every endpoint of a network whose bridge or VXLAN device came, went or changed.
func (r *EndpointReconciler) Observe(ctx context.Context, enqueue func(nimbusv1.Key), subscribed func()) error {
	links := r.linkReader.watching(func(c tableChange[int32, kernelLink]) { r.linkChanged(c, enqueue) })
	fdb := r.fdbReader.watching(func(c tableChange[fdbKey, fdbEntry]) { r.fdbChanged(c, enqueue) })
	neigh := r.neighReader.watching(func(c tableChange[neighKey, neighEntry]) { r.neighChanged(c, enqueue) })
	return r.observeTables(ctx, "link and neighbour changes", nil, []viewSource{links, fdb, neigh},
		func(context.Context) error { return nil }, subscribed, func(uint16, []byte) {})
}

// fdbChanged enqueues the owner of an FDB entry on a network's devices that changed or
// went, unless it is the echo of the reconciler's own write.
func (r *EndpointReconciler) fdbChanged(c tableChange[fdbKey, fdbEntry], enqueue func(nimbusv1.Key)) {
	if c.echo {
		return
	}
	if network, ok := r.fdbNetwork(c.key); ok {
		r.enqueueOwner(endpointLock{network: network, mac: c.key.mac}, enqueue)
	}
}

// neighChanged enqueues the owner of a neighbour on a network's bridge that changed or
// went, unless it is the echo of the reconciler's own write.
func (r *EndpointReconciler) neighChanged(c tableChange[neighKey, neighEntry], enqueue func(nimbusv1.Key)) {
	if c.echo {
		return
	}
	if network, bridge, _ := r.links.networkDevice(c.key.ifindex); bridge {
		r.enqueueOwner(endpointLock{network: network, ip: c.key.ip.addr()}, enqueue)
	}
}

// linkChanged enqueues the endpoints a change of the link table concerns, unless it is
// the echo of the reconciler's own write or changes nothing the endpoints read: those of
// the link as it was, and those of the link as it is when it appeared or its name or
// alias changed (see enqueueForLink). A change of a bridge port's learning alone (`bridge
// link set dev PORT learning on`) concerns the endpoints that name the port.
func (r *EndpointReconciler) linkChanged(c tableChange[int32, kernelLink], enqueue func(nimbusv1.Key)) {
	if !c.has {
		// An interface that is gone has no MTU to put back.
		if err := r.found.set(c.old.name, linkFound{}); err != nil {
			r.log.Warn("forgetting the MTU of a deleted interface", "interface", c.old.name, "err", err)
		}
	}
	if c.echo {
		return
	}
	if c.had && c.has {
		switch c.fields & epLinkFields {
		case 0:
			return
		case linkFieldLearning:
			r.enqueueAll(EndpointInterfaceIndex.Name, c.new.name, enqueue)
			return
		}
	}
	if c.had {
		r.enqueueForLink(c.old, enqueue)
	}
	if c.has && (!c.had || c.old.name != c.new.name || c.old.alias != c.new.alias) {
		r.enqueueForLink(c.new, enqueue)
	}
}

// fdbNetwork returns the network (its key ID) whose MAC entries an FDB entry is of: a
// VXLAN device's own entry, or any entry of a network's bridge, whatever its port. A
// head-end replication entry is the network reconciler's, of no MAC.
func (r *EndpointReconciler) fdbNetwork(k fdbKey) (string, bool) {
	if k.headEnd() {
		return "", false
	}
	network, bridge, vxlan := r.links.networkDevice(k.ifindex)
	if k.master {
		return network, bridge
	}
	return network, vxlan
}

// enqueueForLink enqueues the endpoints a change of the link concerns: those that name
// it as their interface and, when it is a network's bridge or VXLAN device, those of the
// network.
func (r *EndpointReconciler) enqueueForLink(l kernelLink, enqueue func(nimbusv1.Key)) {
	r.enqueueAll(EndpointInterfaceIndex.Name, l.name, enqueue)
	if network, bridge, vxlan := networkDeviceOf(l); bridge || vxlan {
		r.enqueueAll(EndpointNetworkIndex.Name, network, enqueue)
	}
}

// enqueueAll enqueues the objects the index lists under value.
func (r *EndpointReconciler) enqueueAll(index, value string, enqueue func(nimbusv1.Key)) {
	ids, err := r.store.LookupKeys(index, value)
	if err != nil {
		r.log.Error("finding the endpoints a kernel change concerns", "index", index, "value", value, "err", err)
		return
	}
	for _, id := range ids {
		enqueue(id)
	}
}

// enqueueOwner enqueues the owner (see pickOwner) of the kernel entry among the endpoints
// that claim it.
func (r *EndpointReconciler) enqueueOwner(entry endpointLock, enqueue func(nimbusv1.Key)) {
	owner, err := r.firstOwner(entry)
	if err != nil {
		r.log.Error("finding the endpoint a kernel change concerns", "err", err)
		return
	}
	if !owner.IsZero() {
		enqueue(owner)
	}
}

// fill loads the view's link and neighbour tables with a dump each, unless one has
// loaded them already.
func (r *EndpointReconciler) fill(ctx context.Context) error {
	if err := r.links.fill(ctx, r.rtnlConn); err != nil {
		return err
	}
	if err := r.fdb.fill(ctx, r.rtnlConn); err != nil {
		return err
	}
	return r.neigh.fill(ctx, r.rtnlConn)
}
