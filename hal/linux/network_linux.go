package linux

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/naplesnet/naples/hal"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// NetworkOptions configures a NetworkReconciler.
type NetworkOptions struct {
	// Store holds the desired objects: the Network objects, and the Node and Endpoint
	// objects they depend on. It must declare the indexes Indexes returns. Required.
	Store OverlayStore
	// Node is the name of this host's Node object, whose spec.vtepAddress is the local
	// end of every network's VXLAN tunnels. Required.
	Node string
	// Namespace is the network namespace to program. Default: the calling process's.
	Namespace *netns.NsHandle
	// Timeout bounds every netlink request, so a kernel that does not answer fails the
	// reconcile, which is retried, instead of pinning a worker. Default: 10s.
	Timeout time.Duration
	// StateFile is where the reconciler records the value it found in each sysctl it
	// changed (a bridge's forwarding, the gateways' mark reflection), so that it puts the
	// value back when no network needs the change any more, also after a restart (the
	// agent's is sysctls.json in its state directory). Default: "", kept in memory only.
	StateFile string
	// View is Namespace's kernel view, shared with the other reconcilers of the namespace,
	// through which the observer watches (one subscription between them). Default: a view
	// of the reconciler's own.
	View *KernelView
	// EventBuffer is the size in bytes of the observer's queue of link, address, rule,
	// route, FDB and netconf changes, and the least receive buffer of its view's
	// subscription (SO_RCVBUFFORCE). A burst of changes bigger than it overflows it; the
	// observer then fails, and its restart reads the kernel afresh. Default: 8 MiB.
	EventBuffer int
	// BPFDir is the bpffs directory the gateway programs pin their map and links in,
	// under BPFDir/gateway, so that a restarted agent takes them over without a gap.
	// Default: "", which attaches them unpinned: they go with the reconciler (Close),
	// and the gateways do not answer until the next agent attaches them again.
	BPFDir string
	// GatewayBridges is the number of bridges the gateway programs' map holds marks for;
	// a network whose bridge finds it full is FAILED with ReasonCapacityExceeded.
	// Default: 4096 (gwbpf.DefaultBridges).
	GatewayBridges int
	// GatewayCheckInterval is how often the observer checks that the gateway programs are
	// still attached to the bridges they were attached to, and enqueues the network of
	// each bridge that lost one (a link detached by hand, or its pin removed): the kernel
	// sends no notification of that. Default: 10s.
	GatewayCheckInterval time.Duration
	// Registerer takes the reconciler's metrics (naples_gateway_*); Close unregisters
	// them. Default: nil, no metrics.
	Registerer prometheus.Registerer
	// Logger receives the reconciler's logs. Default: slog.Default().
	Logger *slog.Logger
}

// NetworkReconciler programs Network objects. For the network with key ID K it holds:
//
//   - the bridge BridgeName(K) (`ip link add NAME type bridge`) with alias OwnerAlias(K),
//     address GatewayMAC(K), the network's MTU (see below), up; on it the gateway
//     address of every subnet that has one, with noprefixroute (no route in the main
//     table) and for IPv6 nodad (every node holds the same anycast address), and no
//     other address but IPv6 link-local ones;
//   - the VXLAN device VXLANName(K): the network's VNI, this host's VTEP address as local
//     address, destination port VXLANPort, nolearning, the same alias and MTU, up, a port
//     of the bridge with learning off and neigh_suppress on (the bridge answers ARP and
//     ND for the endpoints it knows). A change of VNI or local address makes it anew;
//   - head-end replication: an FDB entry 00:00:00:00:00:00 dst VTEP (self, permanent) on
//     the VXLAN device per other node that has endpoints in the network;
//   - tenant routing without VRFs: in table TenantTable(tenant), a route of
//     OverlayRouteProtocol per subnet through the bridge (scope link, src its gateway);
//     per family the rules `iif BRIDGE lookup T pref TenantRulePriority` and `iif BRIDGE
//     prohibit pref TenantRulePriority+1`, made before the bridge; forwarding on for what
//     enters through the bridge (net.ipv4.conf.BRIDGE.forwarding, and
//     net.ipv6.conf.BRIDGE.force_forwarding where the kernel has it, Linux 6.17) in each
//     family that has a gateway, and for a family that has none any more put back as
//     naples found it before it turned it on (NetworkOptions.StateFile). So
//     networks of one tenant route to each other through their gateways, networks of
//     different tenants never do, and the main table holds no overlay route;
//   - the gateway's answers (network_gateway_linux.go): the gwbpf programs on the bridge
//     mark what comes up from it with the tenant's mark, per family the rule `fwmark
//     MARK lookup T pref GatewayRulePriority` routes the host's packets that carry it in
//     the tenant's table, and while some network has a gateway the kernel reflects marks
//     onto its replies and errors (fwmark_reflect, tcp_fwmark_accept), so the gateway
//     answers ping and TCP and sends ICMP errors with its tenant's routing.
//
// The network's MTU is spec.mtu, or without one the largest the underlay carries: the
// MTU of the link that holds this host's VTEP address (AssumedUnderlayMTU when none
// does) less VXLAN's overhead, VXLANOverheadIPv4 or VXLANOverheadIPv6 by the VTEP's
// family. So spec.mtu set back to 0 puts that default back, and a change of the
// underlay's MTU, or of the link that holds the VTEP address, reaches every network. A
// spec.mtu larger than the underlay link carries is FAILED (hal.ReasonInvalid), naming
// spec.mtu, the link and its MTU, and leaves the network's devices as they were; with
// no link holding the VTEP address it is set as asked and flagged: the status's
// mtu_warning names the assumed underlay and the largest MTU that fits.
//
// A link of the bridge's or VXLAN device's name without the network's alias, or a VNI
// that another Network has, is a conflict. Deleting the network removes all of the
// above; the devices take their addresses, routes and FDB entries with them.
//
// It reads the kernel's state from its KernelView's tables, shared with the other
// reconcilers of the namespace: the links (networks' bridges found by their tenant's
// GatewayMark through the table's index), every address, the policy-routing rules at
// TenantRulePriority, TenantRulePriority+1 and GatewayRulePriority, the routes of
// OverlayRouteProtocol and the head-end replication entries of VXLAN devices: one dump
// fills each, the view's subscription keeps them current, and every sweep dumps the
// links, addresses, rules and FDB entries afresh. A link it creates has no index until
// the kernel made it, so the table cannot expect it: the table takes what it hears of a
// link of the name for the create's echo until the reconciler, which reads the link back
// at once, has recorded what it read (linkTable.expectCreate). The kernel's reports of a
// bridge's forwarding settings (netconf) have no table: the observer recognises the
// echoes among them, the settings created with a bridge the reconciler created and the
// change its write of IPv6 forwarding made (netconfChanged). A reconcile compares the
// network's desired state with the tables and writes only what differs, so a reconcile
// of a network the kernel already holds writes nothing, and the kernel's echoes of a
// reconcile's writes enqueue nothing.
type NetworkReconciler struct {
	// rtnlConn carries the writes and reads dumps and single links.
	*rtnlConn
	// mirrorLoader runs the dumps that load the mirrors.
	mirrorLoader
	store OverlayStore
	node  string
	// sysctls sets the forwarding sysctls and puts back what they were.
	sysctls *sysctls
	// inNS runs what must run inside the namespace: sysctl files and attaching the
	// gateway programs.
	inNS *nsThreads

	// links is the view's table of links, which linkReader reads.
	links      *linkTable
	linkReader *tableReader[int32, kernelLink]
	// createdLinkWait bounds how long createLink waits for the link table to show a link
	// it created before it reads the link back (defaultCreatedLinkWait).
	createdLinkWait time.Duration
	// linkGets counts the reconciler's reads of single links from the kernel
	// (refreshLink).
	linkGets atomic.Uint64

	// addrs is the view's table of addresses, which addrReader reads; rules that of
	// rules, which ruleReader reads (the network's are those of the overlay's shape,
	// ruleKey.overlay).
	addrs      *addrTable
	addrReader *tableReader[addrKey, kernelAddr]
	rules      *ruleTable
	ruleReader *tableReader[ruleKey, uint8]
	// routes is the view's table of routes, which routeReader reads (the network's are
	// those of OverlayRouteProtocol).
	routes      *routeTable
	routeReader *tableReader[routeID, kernelRoute]
	// neigh holds the view's table of FDB entries, which fdbReader reads (the network's
	// are the head-end replication entries of its VXLAN device, which neigh.headEnds
	// finds by device).
	neigh     *neighTable
	fdbReader *tableReader[fdbKey, fdbEntry]
	// The tables' indexes, by which a reconcile reads what one network needs instead of
	// walking a whole table, find addresses by interface and by address, rules by input
	// interface, routes by protocol, output interface and preferred source, head-end
	// replication entries by VXLAN device, and networks' bridges by their tenant's
	// GatewayMark.

	// networkLocks serializes the work on one network's kernel state between its
	// reconciles and the sweeper.
	networkLocks keyedMutex[nimbusv1.Key]

	// mu guards devices, networksOfMark, gatewayNetworks, remoteEndpoints,
	// endpointsOf, forwarding, netconfWrites and ul.
	mu sync.Mutex
	// devices maps the names of the devices of the networks reconciled so far to their
	// network's key.
	devices map[string]nimbusv1.Key
	// networksOfMark holds the networks of devices by their tenant's GatewayMark.
	networksOfMark map[uint32]map[nimbusv1.Key]struct{}
	// gatewayNetworks holds the networks whose last reconcile found a gateway address
	// in their spec.
	gatewayNetworks map[nimbusv1.Key]struct{}
	// remoteEndpoints maps the keys of the endpoints on other nodes that the last
	// reconcile of their network counted for head-end replication to that network's set
	// of them, so that an endpoint's delete reaches its network; endpointsOf holds the
	// sets by network key. They are as long as the remote endpoints, so they hold names
	// (KeyMap) and a pointer to the set, which holds its network's key once, rather than
	// whole keys.
	remoteEndpoints nimbusv1.KeyMap[*remoteEndpointSet]
	endpointsOf     map[nimbusv1.Key]*remoteEndpointSet
	// forwarding holds, per bridge name, the forwarding sysctls found or made right.
	forwarding map[string]forwardingState
	// netconfWrites holds, per interface index, how many of the reconciler's writes of a
	// forwarding sysctl file have yet to reach the observer as the kernel's report of the
	// change (RTM_NEWNETCONF).
	netconfWrites map[int32]int
	// ul is what the reconciler last found of the underlay.
	ul underlayCache

	// gw is the gateways' state.
	gw *gateway
}

var (
	_ hal.Reconciler         = (*NetworkReconciler)(nil)
	_ hal.Sweeper            = (*NetworkReconciler)(nil)
	_ hal.Observer           = (*NetworkReconciler)(nil)
	_ hal.Dependent          = (*NetworkReconciler)(nil)
	_ hal.KernelWriteCounter = (*NetworkReconciler)(nil)
)

// NewNetworkReconciler returns a reconciler bound to the options' namespace.
func NewNetworkReconciler(opts NetworkOptions) (*NetworkReconciler, error) {
	if opts.Store == nil {
		return nil, errors.New("network reconciler: NetworkOptions.Store is required")
	}
	if opts.Node == "" {
		return nil, errors.New("network reconciler: NetworkOptions.Node is required")
	}
	sc, err := openSysctls(opts.StateFile)
	if err != nil {
		return nil, fmt.Errorf("network reconciler: %w", err)
	}
	gw := openGateway(opts.BPFDir, opts.GatewayBridges)
	if opts.Registerer != nil {
		if err := opts.Registerer.Register(gw); err != nil {
			gw.close()
			return nil, fmt.Errorf("network reconciler: registering the gateway metrics: %w", err)
		}
		gw.reg = opts.Registerer
	}
	c, err := openRTNLConn(rtnlConnOptions{Namespace: opts.Namespace, View: opts.View, Timeout: opts.Timeout,
		EventBuffer: opts.EventBuffer, DefaultEventBuffer: 8 << 20, Logger: opts.Logger, Writes: true})
	if err != nil {
		gw.close()
		return nil, err
	}
	reader := c.view.links.reader(c)
	if reader == nil {
		c.close()
		gw.close()
		return nil, errors.New("network reconciler: the kernel view's link table has as many readers as it can hold")
	}
	if gw.openErr != nil {
		c.log.Warn("loading the gateway programs; gateways will not answer", "err", gw.openErr)
	}
	gw.checkInterval = opts.GatewayCheckInterval
	if gw.checkInterval <= 0 {
		gw.checkInterval = 10 * time.Second
	}
	// Of the routes and the FDB entries the reconciler hears only of the overlay's (see
	// routeChanged and fdbChanged): not of every route and endpoint the others program.
	addrReader, ruleReader := c.view.addrs.reader(c), c.view.rules.reader(c)
	routeReader := c.view.routes.readerOf(c, overlayRouteChange)
	fdbReader := c.view.neigh.fdb.readerOf(c, headEndChange)
	if addrReader == nil || ruleReader == nil || routeReader == nil || fdbReader == nil {
		reader.close()
		if addrReader != nil {
			addrReader.close()
		}
		if ruleReader != nil {
			ruleReader.close()
		}
		if routeReader != nil {
			routeReader.close()
		}
		if fdbReader != nil {
			fdbReader.close()
		}
		c.close()
		gw.close()
		return nil, errors.New("network reconciler: a table of the kernel view has as many readers as it can hold")
	}
	r := &NetworkReconciler{
		gw:              gw,
		rtnlConn:        c,
		sysctls:         sc,
		inNS:            &nsThreads{ns: c.ns},
		store:           opts.Store,
		node:            opts.Node,
		links:           c.view.links,
		linkReader:      reader,
		createdLinkWait: defaultCreatedLinkWait,
		devices:         map[string]nimbusv1.Key{},
		networksOfMark:  map[uint32]map[nimbusv1.Key]struct{}{},
		gatewayNetworks: map[nimbusv1.Key]struct{}{},
		endpointsOf:     map[nimbusv1.Key]*remoteEndpointSet{},
		forwarding:      map[string]forwardingState{},
		netconfWrites:   map[int32]int{},
	}
	r.addrs, r.addrReader = c.view.addrs, addrReader
	r.rules, r.ruleReader = c.view.rules, ruleReader
	r.routes, r.routeReader = c.view.routes, routeReader
	r.neigh, r.fdbReader = c.view.neigh, fdbReader
	return r, nil
}

// bridgeMark returns the GatewayMark of the tenant of the network that owns the link
// l, when l is a network's bridge (linkTable.bridgesByMark).
func bridgeMark(_ int32, l kernelLink) (uint32, bool) {
	key, ok := networkOwner(l.alias)
	if !ok || l.kind != "bridge" {
		return 0, false
	}
	return GatewayMark(key.Tenant), true
}

// Close releases the netlink sockets and the threads in the namespace. It is safe to
// call twice.
func (r *NetworkReconciler) Close() error {
	r.linkReader.close()
	r.addrReader.close()
	r.ruleReader.close()
	r.routeReader.close()
	r.fdbReader.close()
	r.inNS.close()
	r.close()
	r.gw.close()
	return nil
}

// Kind returns KIND_NETWORK.
func (r *NetworkReconciler) Kind() nimbusv1.Kind { return nimbusv1.Kind_KIND_NETWORK }

// KernelWrites returns how many kernel objects (links and their settings, addresses,
// rules, routes, FDB entries, sysctls) the reconciler has created, changed or removed.
func (r *NetworkReconciler) KernelWrites() uint64 { return r.writes.Load() }

// managedAddrFlags are the flags of a gateway address that the reconciler sets and
// compares: no prefix route in the main table, and for IPv6 no duplicate address
// detection, since every node holds the same anycast address.
const managedAddrFlags = unix.IFA_F_NOPREFIXROUTE | unix.IFA_F_NODAD

// networkWant is what a Network object asks of this host's kernel.
type networkWant struct {
	// key is the network's key, and id its String form, which the names derive from.
	key           nimbusv1.Key
	id            string
	bridge, vxlan string
	alias         string
	mac           string
	vni, mtu      uint32
	table         uint32
	subnets       []wantSubnet
	// hasV4 and hasV6 tell that some subnet of the family has a gateway.
	hasV4, hasV6 bool
}

// wantSubnet is a parsed subnet of a network; gw is the zero Addr when it has no gateway.
type wantSubnet struct {
	prefix netip.Prefix
	gw     netip.Addr
}

// wantNetwork parses a Network object into what it asks of the kernel. Its errors name
// the field and value at fault.
func wantNetwork(key nimbusv1.Key, obj *nimbusv1.Object) (networkWant, error) {
	id := key.String()
	spec := obj.GetNetwork()
	if spec == nil {
		return networkWant{}, errors.New("spec: not a Network")
	}
	w := networkWant{
		key:    key,
		id:     id,
		bridge: BridgeName(id),
		vxlan:  VXLANName(id),
		alias:  OwnerAlias(id),
		mac:    string(GatewayMAC(id)),
		vni:    spec.GetVni(),
		mtu:    spec.GetMtu(),
		table:  TenantTable(obj.GetMeta().GetTenant()),
	}
	if w.vni == 0 || w.vni > 1<<24-1 {
		return networkWant{}, fmt.Errorf("spec.vni %d: out of range 1 to 16777215", w.vni)
	}
	if w.mtu != 0 && (w.mtu < 68 || w.mtu > 65535) {
		return networkWant{}, fmt.Errorf("spec.mtu %d: out of range 68 to 65535", w.mtu)
	}
	for i, s := range spec.AllSubnets() {
		cidrField, gwField := fmt.Sprintf("spec.subnets[%d].cidr", i), fmt.Sprintf("spec.subnets[%d].gateway", i)
		if spec.GetSubnet() != "" {
			// AllSubnets puts the shorthand first.
			cidrField, gwField = "spec.subnet", "spec.gateway"
			if i > 0 {
				cidrField, gwField = fmt.Sprintf("spec.subnets[%d].cidr", i-1), fmt.Sprintf("spec.subnets[%d].gateway", i-1)
			}
		}
		p, err := netip.ParsePrefix(s.GetCidr())
		if err != nil {
			return networkWant{}, fmt.Errorf("%s %q: %w", cidrField, s.GetCidr(), err)
		}
		p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()).Masked()
		sub := wantSubnet{prefix: p}
		if g := s.GetGateway(); g != "" {
			gw, err := netip.ParseAddr(g)
			if err != nil {
				return networkWant{}, fmt.Errorf("%s %q: %w", gwField, g, err)
			}
			if sub.gw = gw.Unmap(); !p.Contains(sub.gw) {
				return networkWant{}, fmt.Errorf("%s %q: not inside %s", gwField, g, p)
			}
			if sub.gw.Is4() {
				w.hasV4 = true
			} else {
				w.hasV6 = true
			}
		}
		for _, o := range w.subnets {
			if o.prefix.Overlaps(p) {
				return networkWant{}, fmt.Errorf("%s %q: overlaps %s", cidrField, s.GetCidr(), o.prefix)
			}
		}
		w.subnets = append(w.subnets, sub)
	}
	return w, nil
}

// Reconcile makes the kernel hold exactly what the Network obj asks for key: its bridge
// and VXLAN device, gateway addresses, tenant routes and rules, forwarding and head-end
// replication (see the package documentation). With obj nil it removes all of that.
//
// It is PENDING (ReasonWaitingForNode) while this host's Node object or its
// spec.vtepAddress is missing, and FAILED with hal.ReasonConflict when a link of its
// bridge's or VXLAN device's name is not naples's, or when another Network owns its
// VNI (see vniOwner).
func (r *NetworkReconciler) Reconcile(ctx context.Context, key *nimbusv1.ObjectKey, obj *nimbusv1.Object) (*nimbusv1.OperationalData, error) {
	if err := r.fill(ctx); err != nil {
		return nil, err
	}
	k := key.Key()
	lock := r.networkLocks.lock(k)
	defer r.networkLocks.unlock(k, lock)
	if obj == nil {
		return nil, r.teardown(ctx, k)
	}
	want, err := wantNetwork(k, obj)
	if err != nil {
		return nil, &hal.Error{Reason: hal.ReasonInvalid, Err: err}
	}
	vtep, err := NodeVTEP(r.store, r.node)
	if err != nil {
		return nil, err
	}
	vtep = vtep.Unmap()
	ul := r.underlay(vtep)
	mtu, misfit, err := networkMTU(want.mtu, ul, vtep)
	if err != nil {
		return nil, err
	}
	want.mtu = mtu
	r.recordUnderlayMTU(ul)
	owner, err := r.vniOwner(k, want.vni)
	if err != nil {
		return nil, err
	}
	if owner != k {
		// The owner programs a VXLAN device of this VNI; one of ours would clash.
		if err := r.teardown(ctx, k); err != nil {
			return nil, err
		}
		return nil, hal.Errorf(hal.ReasonConflict, "spec.vni %d: already used by %s", want.vni, owner)
	}
	r.mu.Lock()
	r.devices[want.bridge] = k
	r.devices[want.vxlan] = k
	mark := GatewayMark(k.Tenant)
	if r.networksOfMark[mark] == nil {
		r.networksOfMark[mark] = map[nimbusv1.Key]struct{}{}
	}
	r.networksOfMark[mark][k] = struct{}{}
	if want.hasV4 || want.hasV6 {
		r.gatewayNetworks[k] = struct{}{}
	} else {
		delete(r.gatewayNetworks, k)
	}
	r.mu.Unlock()

	// Links of the devices' names that are not naples's are never touched, nor are rules
	// made for them.
	for _, name := range []string{want.bridge, want.vxlan} {
		if l, ok := r.link(name); ok && !ownsLink(l, want.alias) {
			return nil, foreignLink(name, l)
		}
	}
	// The rules come first: the bridge never forwards without them, even when a later
	// step fails, so nothing entering from the network reaches the main table.
	if err := r.ensureRules(ctx, want); err != nil {
		return nil, err
	}
	br, created, err := r.ensureBridge(ctx, want)
	if err != nil {
		return nil, err
	}
	gwUnavailable, err := r.ensureGateway(ctx, want, br.index)
	if err != nil {
		return nil, err
	}
	vx, err := r.ensureVXLAN(ctx, want, vtep, br.index)
	if err != nil {
		return nil, err
	}
	v6Missing, err := r.ensureForwarding(ctx, want, br.index, created)
	if err != nil {
		return nil, err
	}
	if err := r.ensureAddresses(ctx, want, br.index); err != nil {
		return nil, err
	}
	if err := r.ensureRoutes(ctx, want, br.index); err != nil {
		return nil, err
	}
	remotes, without, err := r.ensureReplication(ctx, want, vtep, vx.index)
	if err != nil {
		return nil, err
	}

	op := &nimbusv1.NetworkOperational{
		Bridge:             want.bridge,
		Vxlan:              want.vxlan,
		Vni:                want.vni,
		Vtep:               vtep.String(),
		TenantTable:        want.table,
		RemoteVteps:        addrStrings(remotes),
		NodesWithoutVtep:   without,
		Mtu:                want.mtu,
		Underlay:           ul.describe(vtep),
		MtuWarning:         misfit,
		GatewayUnavailable: gwUnavailable,
	}
	if gwUnavailable == "" {
		op.GatewayMark = want.table // GatewayMark of the network's tenant
	}
	if v6Missing {
		op.Ipv6ForwardingUnavailable = "this kernel has no net.ipv6.conf." + want.bridge +
			".force_forwarding (Linux 6.17); IPv6 between networks needs net.ipv6.conf.all.forwarding=1"
	}
	return &nimbusv1.OperationalData{Kind: &nimbusv1.OperationalData_Network{Network: op}}, nil
}

// vniOwner returns the key of the Network that owns the VNI, of those that have it:
// the one whose VXLAN device has it now, so that a network that comes later never takes
// the VNI from a running one; otherwise the one created first (meta.createTime, then
// key).
func (r *NetworkReconciler) vniOwner(key nimbusv1.Key, vni uint32) (nimbusv1.Key, error) {
	keys, err := r.store.LookupKeys(NetworkVNIIndex.Name, strconv.FormatUint(uint64(vni), 10))
	if err != nil {
		return nimbusv1.Key{}, fmt.Errorf("finding the networks of VNI %d: %w", vni, err)
	}
	switch len(keys) {
	case 0:
		return key, nil
	case 1:
		return keys[0], nil
	}
	for _, owner := range keys {
		id := owner.String()
		if l, ok := r.link(VXLANName(id)); ok && l.kind == "vxlan" && l.vni == vni && ownsLink(l, OwnerAlias(id)) {
			return owner, nil
		}
	}
	return firstCreated(r.store.Get, keys), nil
}

// addrStrings returns the addresses, sorted, in their text form.
func addrStrings(as []netip.Addr) []string {
	slices.SortFunc(as, netip.Addr.Compare)
	s := make([]string, len(as))
	for i, a := range as {
		s[i] = a.String()
	}
	return s
}

// DependsOn returns the kinds networks depend on: Node (this host's VTEP address, and
// those of the nodes replicated to) and Endpoint (which nodes a network spans).
func (r *NetworkReconciler) DependsOn() []nimbusv1.Kind {
	return []nimbusv1.Kind{nimbusv1.Kind_KIND_NODE, nimbusv1.Kind_KIND_ENDPOINT}
}

// DependentsOf returns the keys of the networks that depend on the Node or Endpoint with
// the key: for this host's Node every network; for another node the networks that have
// endpoints on it; for an endpoint its network, as the store has it and, for one on
// another node, as the last reconciles of its network counted it, so that an endpoint
// that is gone or moved still reaches the network it leaves.
func (r *NetworkReconciler) DependentsOf(key nimbusv1.Key) []nimbusv1.Key {
	switch key.Kind {
	case nimbusv1.Kind_KIND_NODE:
		if key == NodeKey(r.node).Key() {
			return r.store.Keys(nimbusv1.Kind_KIND_NETWORK)
		}
		eps, err := r.store.LookupKeys(EndpointNodeIndex.Name, key.Name)
		if err != nil {
			r.log.Warn("finding the endpoints of a node", "node", key.Name, "err", err)
			return nil
		}
		set := map[nimbusv1.Key]bool{}
		for _, ep := range eps {
			if obj, ok := r.store.Get(ep.Proto()); ok {
				if nk := NetworkKeyOf(obj); nk != nil {
					set[nk.Key()] = true
				}
			}
		}
		return slices.SortedFunc(maps.Keys(set), nimbusv1.Key.Compare)
	case nimbusv1.Kind_KIND_ENDPOINT:
		set := map[nimbusv1.Key]bool{}
		if obj, ok := r.store.Get(key.Proto()); ok {
			if n := obj.GetEndpoint().GetNode(); n != "" && n != r.node {
				if nk := NetworkKeyOf(obj); nk != nil {
					set[nk.Key()] = true
				}
			}
		}
		r.mu.Lock()
		if eps, ok := r.remoteEndpoints.Get(key); ok {
			set[eps.network] = true
		}
		r.mu.Unlock()
		return slices.SortedFunc(maps.Keys(set), nimbusv1.Key.Compare)
	}
	return nil
}

// recordRemoteEndpoints records the endpoints on other nodes that the reconcile of the
// network with the key counted, replacing what its last reconcile recorded.
func (r *NetworkReconciler) recordRemoteEndpoints(network nimbusv1.Key, endpoints []nimbusv1.Key) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if was := r.endpointsOf[network]; was != nil {
		for ep := range was.all() {
			if eps, _ := r.remoteEndpoints.Get(ep); eps == was {
				r.remoteEndpoints.Delete(ep)
			}
		}
		delete(r.endpointsOf, network)
	}
	if len(endpoints) == 0 {
		return
	}
	eps := &remoteEndpointSet{network: network}
	for _, ep := range endpoints {
		if ep.Kind == nimbusv1.Kind_KIND_ENDPOINT && ep.Tenant == network.Tenant && ep.Namespace == network.Namespace {
			eps.names = append(eps.names, ep.Name)
		} else {
			eps.others = append(eps.others, ep)
		}
		r.remoteEndpoints.Set(ep, eps)
	}
	eps.names = slices.Clip(eps.names)
	r.endpointsOf[network] = eps
}

// remoteEndpointSet holds the endpoints on other nodes that the last reconcile of a
// network counted: by name those of the network's tenant and namespace, as the endpoints
// of a network are, and any others by key.
type remoteEndpointSet struct {
	network nimbusv1.Key
	names   []string
	others  []nimbusv1.Key
}

// all returns the keys of the endpoints in the set.
func (s *remoteEndpointSet) all() iter.Seq[nimbusv1.Key] {
	return func(yield func(nimbusv1.Key) bool) {
		for _, name := range s.names {
			if !yield(nimbusv1.Key{Kind: nimbusv1.Kind_KIND_ENDPOINT, Tenant: s.network.Tenant, Namespace: s.network.Namespace, Name: name}) {
				return
			}
		}
		for _, k := range s.others {
			if !yield(k) {
				return
			}
		}
	}
}

// forget drops what the reconciler recorded of the network with the key.
func (r *NetworkReconciler) forget(key nimbusv1.Key) {
	r.recordRemoteEndpoints(key, nil)
	id := key.String()
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.devices, BridgeName(id))
	delete(r.devices, VXLANName(id))
	mark := GatewayMark(key.Tenant)
	delete(r.networksOfMark[mark], key)
	if len(r.networksOfMark[mark]) == 0 {
		delete(r.networksOfMark, mark)
	}
	delete(r.gatewayNetworks, key)
	delete(r.forwarding, BridgeName(id))
	// The bridge took its sysctls with it.
	v4, v6 := forwardingSysctls(BridgeName(id))
	for _, p := range []string{v4, v6} {
		if err := r.sysctls.Forget(p); err != nil {
			r.log.Warn("forgetting the forwarding of a deleted bridge", "key", id, "err", err)
		}
	}
}

// networkOwner returns the key of the Network a link alias names as the link's owner,
// and whether it names one. The alias is the kernel's text: this is the one place the
// network reconciler turns a key ID back into a key. An alias whose key ID is not in
// the canonical form (Key.String) names no network, since the names of a network's
// devices derive from that form.
func networkOwner(alias string) (nimbusv1.Key, bool) {
	id, ok := OwnerOfAlias(alias)
	if !ok || !strings.HasPrefix(id, nimbusv1.Kind_KIND_NETWORK.Name()+"/") {
		return nimbusv1.Key{}, false
	}
	key, err := nimbusv1.ParseKey(id)
	if err != nil || key.Kind != nimbusv1.Kind_KIND_NETWORK || key.String() != id {
		return nimbusv1.Key{}, false
	}
	return key, true
}

// ownerOfName returns the key of the network that owns the link with the name, by the
// link's alias, or by the name for a device of a network reconciled before; the zero Key
// when no network does.
func (r *NetworkReconciler) ownerOfName(name string) nimbusv1.Key {
	if name == "" {
		return nimbusv1.Key{}
	}
	if _, l, ok := r.links.byName(name); ok {
		if key, ok := networkOwner(l.alias); ok {
			return key
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.devices[name]
}

// nameOf returns the name of the link with the index, "" when the link table has none.
func (r *NetworkReconciler) nameOf(index int32) string {
	l, _ := r.links.get(index)
	return l.name
}

// link returns what the reconciler reads of the link with the name, as the link table
// holds it.
func (r *NetworkReconciler) link(name string) (networkLink, bool) {
	index, l, ok := r.links.byName(name)
	if !ok {
		return networkLink{}, false
	}
	return networkLinkOf(index, l), true
}

// ownerOfIndex returns the key of the network that owns the link with the index.
func (r *NetworkReconciler) ownerOfIndex(index int32) nimbusv1.Key {
	return r.ownerOfName(r.nameOf(index))
}

// kernelErr wraps a kernel's refusal of what the reconciler was doing.
func kernelErr(err error, format string, args ...any) error {
	return &hal.Error{Reason: hal.ReasonKernelError, Err: fmt.Errorf(format+": %w", append(args, err)...)}
}

// macString formats a MAC address kept as raw bytes.
func macString(mac string) string { return net.HardwareAddr(mac).String() }

// sortedKeys returns the keys of m in the order cmp gives.
func sortedKeys[K comparable, V any](m map[K]V, compare func(a, b K) int) []K {
	ks := slices.Collect(maps.Keys(m))
	slices.SortFunc(ks, compare)
	return ks
}

// compareAddrKeys orders addresses by interface and then prefix.
func compareAddrKeys(a, b addrKey) int {
	if c := cmp.Compare(a.index, b.index); c != 0 {
		return c
	}
	if c := a.prefix.Addr().Compare(b.prefix.Addr()); c != 0 {
		return c
	}
	return cmp.Compare(a.prefix.Bits(), b.prefix.Bits())
}
