package agent

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/naplesnet/naples/hal/linux"
	"github.com/naplesnet/naples/hal/linux/rtnl"
	delphiv1 "github.com/naplesnet/naples/proto/delphi/v1"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// dataplane reads the kernel once, through the Inspector's kernel view, and answers
// Dataplane from it and delphi.
func (i *Inspector) dataplane(ctx context.Context) (*delphiv1.DataplaneResponse, error) {
	k, err := readKernel(ctx, i.view)
	if err != nil {
		return nil, err
	}
	v := &dataplaneView{store: i.store, node: i.node, kernel: k, vteps: map[string]netip.Addr{}}
	return v.response(), nil
}

// kernelState is what one Dataplane call read of the kernel: one read each of links,
// bridge ports, addresses, FDB entries and neighbour entries.
type kernelState struct {
	// byName and byIndex hold every link, by name and by index (`ip link show`).
	byName  map[string]rtnl.Link
	byIndex map[int32]rtnl.Link
	// addrs holds the addresses of each link, by link index (`ip addr show`).
	addrs map[int32][]netip.Prefix
	// fdb holds the FDB entries of each link and MAC (`bridge fdb show`): the link's own,
	// flagged NTF_SELF, and its bridge's for the port, which carry the bridge's index
	// (NDA_MASTER).
	fdb map[fdbKey][]rtnl.Neigh
	// neighs holds the IPv4 and IPv6 neighbour entry of each link and IP (`ip neigh show`).
	neighs map[neighKey]rtnl.Neigh
	// learning holds the bridge ports that learn, by link index (`bridge -d link show`).
	learning map[int32]bool
	// dumps counts the reads of the kernel view, one per kind.
	dumps int
}

// fdbKey is what FDB entries are looked up by: a link's index and a MAC.
type fdbKey struct {
	link int32
	mac  [6]byte
}

// neighKey is what neighbour entries are looked up by: a link's index and an IP.
type neighKey struct {
	link int32
	ip   netip.Addr
}

// macKey returns the lookup form of a 6-byte MAC; false for other lengths.
func macKey(mac net.HardwareAddr) ([6]byte, bool) {
	if len(mac) != 6 {
		return [6]byte{}, false
	}
	return [6]byte(mac), true
}

// readKernel reads the bridge ports, links, addresses, FDB entries and neighbour entries
// of view's namespace in one reading (linux.KernelRead), each read bounded by ctx.
func readKernel(ctx context.Context, view *KernelView) (*kernelState, error) {
	read := view.Read()
	defer read.Close()
	k := &kernelState{
		byName:   map[string]rtnl.Link{},
		byIndex:  map[int32]rtnl.Link{},
		addrs:    map[int32][]netip.Prefix{},
		fdb:      map[fdbKey][]rtnl.Neigh{},
		neighs:   map[neighKey]rtnl.Neigh{},
		learning: map[int32]bool{},
	}
	ports, err := readView(ctx, k, read.BridgePorts)
	if err != nil {
		return nil, err
	}
	for _, p := range ports {
		if p.Port.Learning {
			k.learning[p.Index] = true
		}
	}
	links, err := readView(ctx, k, read.Links)
	if err != nil {
		return nil, err
	}
	for _, l := range links {
		k.byName[l.Name] = l
		k.byIndex[l.Index] = l
	}
	addrs, err := readView(ctx, k, read.Addrs)
	if err != nil {
		return nil, err
	}
	for _, a := range addrs {
		if p, ok := prefixOf(a); ok {
			k.addrs[a.Index] = append(k.addrs[a.Index], p)
		}
	}
	fdb, err := readView(ctx, k, read.FDB)
	if err != nil {
		return nil, err
	}
	for _, e := range fdb {
		if e.HasMAC {
			key := fdbKey{e.Index, e.MAC}
			k.fdb[key] = append(k.fdb[key], e)
		}
	}
	neighs, err := readView(ctx, k, read.Neighbours)
	if err != nil {
		return nil, err
	}
	for _, e := range neighs {
		if e.Dst.IsValid() {
			k.neighs[neighKey{e.Index, e.Dst}] = e
		}
	}
	return k, nil
}

// readView runs one read of the kernel view and counts it in k.
func readView[T any](ctx context.Context, k *kernelState, read func(context.Context) ([]T, error)) ([]T, error) {
	k.dumps++
	return read(ctx)
}

// prefixOf returns an address of a link as a prefix, as `ip addr show` prints it: the
// address and its prefix length, or a whole address's length for one with a peer.
func prefixOf(a rtnl.Addr) (netip.Prefix, bool) {
	p, ok := a.Prefix()
	if !ok {
		return netip.Prefix{}, false
	}
	addr := p.Addr().Unmap()
	// IPv4 sends IFA_LOCAL with IFA_ADDRESS, which differs from it for a peer; IPv6 sends
	// IFA_LOCAL only for a peer.
	if a.Local.IsValid() && (a.Family != unix.AF_INET || a.Address != a.Local) {
		return netip.PrefixFrom(addr, addr.BitLen()), true
	}
	return netip.PrefixFrom(addr, p.Bits()), true
}

// dataplaneView assembles the answer of one Dataplane call from delphi and one read of
// the kernel.
type dataplaneView struct {
	store  InspectStore
	node   string
	kernel *kernelState
	// vteps caches the VTEP address of each node by name; invalid for a node without one.
	vteps map[string]netip.Addr
}

// response returns the dataplane of every network that targets this node.
func (v *dataplaneView) response() *delphiv1.DataplaneResponse {
	resp := &delphiv1.DataplaneResponse{Node: v.node}
	if a := v.vtep(v.node); a.IsValid() {
		resp.Vtep = a.String()
	}
	endpoints := map[string][]*nimbusv1.Object{}
	for _, ep := range v.store.List(nimbusv1.Kind_KIND_ENDPOINT) {
		if k := linux.NetworkKeyOf(ep); k != nil && ep.TargetsNode(v.node) {
			endpoints[k.ID()] = append(endpoints[k.ID()], ep)
		}
	}
	for _, n := range v.store.List(nimbusv1.Kind_KIND_NETWORK) {
		if n.TargetsNode(v.node) {
			resp.Networks = append(resp.Networks, v.network(n, endpoints[n.Key().ID()]))
		}
	}
	return resp
}

// vtep returns the VTEP address of the named node from its Node object
// (linux.NodeVTEP); invalid when there is none.
func (v *dataplaneView) vtep(node string) netip.Addr {
	if a, ok := v.vteps[node]; ok {
		return a
	}
	a, _ := linux.NodeVTEP(v.store, node)
	v.vteps[node] = a
	return a
}

// network returns the dataplane of one network and its endpoints.
func (v *dataplaneView) network(obj *nimbusv1.Object, endpoints []*nimbusv1.Object) *delphiv1.DataplaneNetwork {
	key := obj.Key()
	id := key.ID()
	spec := obj.GetNetwork()
	n := &delphiv1.DataplaneNetwork{
		Key:        key,
		Generation: obj.GetMeta().GetGeneration(),
		Vni:        spec.GetVni(),
		Mtu:        spec.GetMtu(),
		Subnets:    spec.AllSubnets(),
	}
	n.Status, _ = v.store.Status(key)
	mtu := effectiveMTU(spec, n.Status)
	var br, vx *rtnl.Link
	n.Bridge, br = v.bridge(obj, mtu)
	n.Vxlan, vx = v.vxlan(id, spec, mtu)
	n.RemoteVteps = v.remoteVteps(vx, endpoints)
	for _, ep := range endpoints {
		n.Endpoints = append(n.Endpoints, v.endpoint(ep, id, mtu, br, vx))
	}
	return n
}

// link returns what the kernel has of the link called name, and the link; nil when there
// is none, which the link's problems say.
func (v *dataplaneView) link(name string) (*delphiv1.DataplaneLink, *rtnl.Link) {
	out := &delphiv1.DataplaneLink{Name: name}
	l, ok := v.kernel.byName[name]
	if !ok {
		out.Problems = []string{"missing"}
		return out, nil
	}
	out.Present = true
	out.Kind = l.Kind
	if out.Kind == "" {
		out.Kind = "device" // a link without IFLA_INFO_KIND: a NIC, lo
	}
	out.Alias = l.Alias
	out.Up = l.Up()
	out.OperState = rtnl.OperStateName(l.OperState)
	out.Mtu = l.MTU
	if strings.Trim(l.MAC, "\x00") != "" {
		out.Mac = net.HardwareAddr(l.MAC).String() // none for lo's zeros
	}
	if m, ok := v.kernel.byIndex[l.Master]; ok && l.Master != 0 {
		out.Master = m.Name
	}
	for _, p := range v.kernel.addrs[l.Index] {
		out.Addresses = append(out.Addresses, p.String())
	}
	if l.Kind == "vxlan" {
		out.Vni = l.VXLAN.VNI
		if l.VXLAN.Local.IsValid() {
			out.Local = l.VXLAN.Local.String()
		}
		out.DstPort = uint32(l.VXLAN.Port)
		out.Learning = l.VXLAN.Learning
	}
	return out, &l
}

// device checks what a network's bridge and VXLAN device have in common: naples's alias
// for the network, the type, up, the network's MTU. It returns false when the link is
// missing or not naples's, whose other settings are then no concern of naples.
func device(l *delphiv1.DataplaneLink, networkKeyID, kind string, mtu uint32) bool {
	if !l.GetPresent() {
		return false
	}
	if l.GetAlias() != linux.OwnerAlias(networkKeyID) {
		l.Problems = append(l.Problems, fmt.Sprintf("not naples's (alias %q)", l.GetAlias()))
		return false
	}
	if l.GetKind() != kind {
		l.Problems = append(l.Problems, fmt.Sprintf("type %s (want %s)", l.GetKind(), kind))
	}
	upAndMTU(l, mtu)
	return true
}

// upAndMTU adds the problems of a link that is down or whose MTU is not mtu (0: any).
func upAndMTU(l *delphiv1.DataplaneLink, mtu uint32) {
	if !l.GetUp() {
		l.Problems = append(l.Problems, "down")
	}
	if mtu != 0 && l.GetMtu() != mtu {
		l.Problems = append(l.Problems, fmt.Sprintf("mtu %d (want %d)", l.GetMtu(), mtu))
	}
}

// effectiveMTU returns the MTU the network's devices should have: spec.mtu, or without
// one what the network reconciler derived from the underlay, as the network's status
// says (0, any, before it says).
func effectiveMTU(spec *nimbusv1.NetworkSpec, st *nimbusv1.NodeStatus) uint32 {
	if spec.GetMtu() != 0 {
		return spec.GetMtu()
	}
	if n := st.GetOperationalData().GetNetwork(); n != nil {
		return n.GetMtu()
	}
	// A status an agent of the release before wrote has the string form alone.
	mtu, _ := strconv.ParseUint(st.GetOperational()["mtu"], 10, 32)
	return uint32(mtu)
}

// bridge returns the bridge of the Network obj, which should have the MTU mtu (0: any),
// and the link when it is naples's.
func (v *dataplaneView) bridge(obj *nimbusv1.Object, mtu uint32) (*delphiv1.DataplaneLink, *rtnl.Link) {
	networkKeyID := obj.Key().ID()
	out, l := v.link(linux.BridgeName(networkKeyID))
	if !device(out, networkKeyID, "bridge", mtu) {
		return out, nil
	}
	if want := linux.GatewayMAC(networkKeyID).String(); out.GetMac() != want {
		out.Problems = append(out.Problems, fmt.Sprintf("mac %s (want %s)", out.GetMac(), want))
	}
	// A spec the reconciler refuses, which nimbus does not store, wants none.
	want, _ := linux.GatewayAddresses(obj)
	have := v.kernel.addrs[l.Index]
	for _, p := range want {
		if !slices.Contains(have, p) {
			out.Problems = append(out.Problems, fmt.Sprintf("address %s missing", p))
		}
	}
	for _, p := range have {
		if !slices.Contains(want, p) && !(p.Addr().Is6() && p.Addr().IsLinkLocalUnicast()) {
			out.Problems = append(out.Problems, fmt.Sprintf("address %s not wanted", p))
		}
	}
	return out, l
}

// vxlan returns the network's VXLAN device, which should have the MTU mtu (0: any), and
// the link when it is naples's.
func (v *dataplaneView) vxlan(networkKeyID string, spec *nimbusv1.NetworkSpec, mtu uint32) (*delphiv1.DataplaneLink, *rtnl.Link) {
	out, l := v.link(linux.VXLANName(networkKeyID))
	if !device(out, networkKeyID, "vxlan", mtu) {
		return out, nil
	}
	if out.GetVni() != spec.GetVni() {
		out.Problems = append(out.Problems, fmt.Sprintf("vni %d (want %d)", out.GetVni(), spec.GetVni()))
	}
	if want := v.vtep(v.node); want.IsValid() {
		if have, _ := netip.ParseAddr(out.GetLocal()); have.Unmap() != want {
			out.Problems = append(out.Problems, fmt.Sprintf("local %s (want %s)", orNone(out.GetLocal()), want))
		}
	}
	if out.GetDstPort() != linux.VXLANPort {
		out.Problems = append(out.Problems, fmt.Sprintf("dstport %d (want %d)", out.GetDstPort(), linux.VXLANPort))
	}
	if out.GetLearning() {
		out.Problems = append(out.Problems, "learning on (want off)")
	}
	if want := linux.BridgeName(networkKeyID); out.GetMaster() != want {
		out.Problems = append(out.Problems, fmt.Sprintf("master %s (want %s)", orNone(out.GetMaster()), want))
	}
	return out, l
}

// orNone returns s, or "none" when s is empty.
func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// remoteVteps returns the VTEPs a network's VXLAN device vx (nil: missing or not naples's)
// should flood to, those of the other nodes with endpoints of the network, and those it
// does flood to, its head-end replication entries, ordered by address.
func (v *dataplaneView) remoteVteps(vx *rtnl.Link, endpoints []*nimbusv1.Object) []*delphiv1.DataplaneVtep {
	byAddr := map[netip.Addr]*delphiv1.DataplaneVtep{}
	vtep := func(a netip.Addr) *delphiv1.DataplaneVtep {
		t, ok := byAddr[a]
		if !ok {
			t = &delphiv1.DataplaneVtep{Address: a.String()}
			byAddr[a] = t
		}
		return t
	}
	for _, ep := range endpoints {
		node := ep.GetEndpoint().GetNode()
		if node == "" || node == v.node {
			continue
		}
		if a := v.vtep(node); a.IsValid() {
			t := vtep(a)
			t.Wanted = true
			if !slices.Contains(t.Nodes, node) {
				t.Nodes = append(t.Nodes, node)
			}
		}
	}
	if vx != nil {
		// Head-end replication entries have MAC 00:00:00:00:00:00.
		for _, e := range v.kernel.fdb[fdbKey{link: vx.Index}] {
			if e.Flags&unix.NTF_SELF == 0 {
				continue
			}
			if e.Dst.IsValid() {
				vtep(e.Dst).Present = true
			}
		}
	}
	addrs := make([]netip.Addr, 0, len(byAddr))
	for a := range byAddr {
		addrs = append(addrs, a)
	}
	slices.SortFunc(addrs, netip.Addr.Compare)
	out := make([]*delphiv1.DataplaneVtep, 0, len(addrs))
	for _, a := range addrs {
		t := byAddr[a]
		slices.Sort(t.Nodes)
		out = append(out, t)
	}
	return out
}

// endpoint returns the dataplane of one endpoint of a network, whose bridge is br and
// VXLAN device is vx (nil: missing or not naples's) and whose MTU is mtu (0: any).
func (v *dataplaneView) endpoint(obj *nimbusv1.Object, networkKeyID string, mtu uint32, br, vx *rtnl.Link) *delphiv1.DataplaneEndpoint {
	spec := obj.GetEndpoint()
	key := obj.Key()
	e := &delphiv1.DataplaneEndpoint{
		Key:        key,
		Generation: obj.GetMeta().GetGeneration(),
		Node:       spec.GetNode(),
		Interface:  spec.GetInterface(),
		Mac:        spec.GetMac(),
		Ips:        spec.GetIps(),
		Local:      spec.GetNode() == v.node,
	}
	e.Status, _ = v.store.Status(key)
	if e.Local {
		if spec.GetInterface() != "" {
			mac, _ := net.ParseMAC(spec.GetMac())
			e.Link = v.port(spec.GetInterface(), linux.BridgeName(networkKeyID), mtu, mac)
		}
		return e
	}
	vtep := v.vtep(spec.GetNode())
	if vtep.IsValid() {
		e.Vtep = vtep.String()
	}
	mac, err := net.ParseMAC(spec.GetMac())
	if err != nil || len(mac) != 6 {
		mac = nil
	} else {
		e.Fdb = v.fdb(vx, [6]byte(mac), vtep)
	}
	for _, ip := range spec.GetIps() {
		e.Neighbors = append(e.Neighbors, v.neighbor(br, ip, mac))
	}
	return e
}

// port returns a local endpoint's interface, which must be an up port of bridge with the
// network's MTU (0: any), that does not learn and, when the endpoint has a MAC (mac not
// nil), holds the bridge's static entry for it.
func (v *dataplaneView) port(name, bridge string, mtu uint32, mac net.HardwareAddr) *delphiv1.DataplaneLink {
	out, l := v.link(name)
	if l == nil {
		return out
	}
	switch out.GetMaster() {
	case bridge:
	case "":
		out.Problems = append(out.Problems, fmt.Sprintf("not a port of %s", bridge))
	default:
		out.Problems = append(out.Problems, fmt.Sprintf("port of %s (want %s)", out.GetMaster(), bridge))
	}
	upAndMTU(out, mtu)
	out.Learning = v.kernel.learning[l.Index]
	if out.Learning {
		out.Problems = append(out.Problems, "learning on (want off)")
	}
	if key, ok := macKey(mac); ok && out.GetMaster() == bridge {
		static := slices.ContainsFunc(v.kernel.fdb[fdbKey{l.Index, key}], func(e rtnl.Neigh) bool {
			return e.Master != 0 && e.State&unix.NUD_NOARP != 0 && e.State&unix.NUD_PERMANENT == 0
		})
		if !static {
			out.Problems = append(out.Problems, fmt.Sprintf("no static entry for %s on the bridge", mac))
		}
	}
	return out
}

// fdb returns the forwarding entries of a remote MAC on VXLAN device vx (nil: missing or
// not naples's), which should send it to vtep.
func (v *dataplaneView) fdb(vx *rtnl.Link, mac [6]byte, vtep netip.Addr) *delphiv1.DataplaneFdb {
	f := &delphiv1.DataplaneFdb{Mac: net.HardwareAddr(mac[:]).String()}
	if vx == nil {
		return f
	}
	for _, e := range v.kernel.fdb[fdbKey{vx.Index, mac}] {
		if e.Flags&unix.NTF_SELF == 0 {
			// The bridge's entry for its VXLAN port, which names the bridge as master
			// (NDA_MASTER); naples's are static.
			if e.Master != 0 && e.State&(unix.NUD_NOARP|unix.NUD_PERMANENT) != 0 {
				f.BridgePresent = true
			}
			continue
		}
		if a := e.Dst; a.IsValid() {
			f.Dsts = append(f.Dsts, a.String())
			f.Present = f.Present || a == vtep
		}
	}
	slices.Sort(f.Dsts)
	return f
}

// neighbor returns the neighbour entry for a remote endpoint's ip on bridge br (nil:
// missing or not naples's), which should be a permanent one for mac (nil: the endpoint has
// no valid MAC).
func (v *dataplaneView) neighbor(br *rtnl.Link, ip string, mac net.HardwareAddr) *delphiv1.DataplaneNeighbor {
	n := &delphiv1.DataplaneNeighbor{Ip: ip}
	want, err := netip.ParseAddr(ip)
	if err != nil || br == nil {
		return n
	}
	if e, ok := v.kernel.neighs[neighKey{br.Index, want.Unmap()}]; ok {
		if e.HasMAC {
			n.Mac = net.HardwareAddr(e.MAC[:]).String()
		}
		n.State = nudState(e.State)
		n.Present = e.State&unix.NUD_PERMANENT != 0 && e.HasMAC && bytes.Equal(e.MAC[:], mac)
	}
	return n
}

// nudState names a neighbour entry's state as `ip neigh` does, in lower case:
// "permanent", "reachable", "none".
func nudState(state uint16) string {
	nudStates := []struct {
		bit  uint16
		name string
	}{
		{unix.NUD_INCOMPLETE, "incomplete"},
		{unix.NUD_REACHABLE, "reachable"},
		{unix.NUD_STALE, "stale"},
		{unix.NUD_DELAY, "delay"},
		{unix.NUD_PROBE, "probe"},
		{unix.NUD_FAILED, "failed"},
		{unix.NUD_NOARP, "noarp"},
		{unix.NUD_PERMANENT, "permanent"},
	}
	var names []string
	for _, s := range nudStates {
		if state&s.bit != 0 {
			names = append(names, s.name)
		}
	}
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ",")
}
