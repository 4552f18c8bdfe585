package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/naplesnet/naples/hal/linux"
	delphiv1 "github.com/naplesnet/naples/proto/delphi/v1"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// Bounds of the kernel reads of one Dataplane call.
const (
	// dataplaneTimeout bounds each netlink exchange of a call whose deadline is not sooner.
	dataplaneTimeout = 10 * time.Second
	// dataplaneDumpAttempts bounds how often one dump starts over when the kernel reports
	// that what it dumps changed meanwhile (NLM_F_DUMP_INTR).
	dataplaneDumpAttempts = 5
)

// dataplane reads the kernel once and answers Dataplane from it and delphi.
func (i *Inspector) dataplane(ctx context.Context) (*delphiv1.DataplaneResponse, error) {
	k, err := readKernel(ctx, i.netns)
	if err != nil {
		return nil, err
	}
	v := &dataplaneView{store: i.store, node: i.node, kernel: k, vteps: map[string]netip.Addr{}}
	return v.response(), nil
}

// kernelState is what one Dataplane call read of the kernel: one dump each of links,
// addresses, FDB entries and neighbour entries.
type kernelState struct {
	// byName and byIndex hold every link, by name and by index (`ip link show`).
	byName  map[string]netlink.Link
	byIndex map[int]netlink.Link
	// addrs holds the addresses of each link, by link index (`ip addr show`).
	addrs map[int][]netip.Prefix
	// fdb holds the FDB entries of each link and MAC (`bridge fdb show`): the link's own,
	// flagged NTF_SELF, and its bridge's for the port, which carry the bridge's index
	// (NDA_MASTER).
	fdb map[fdbKey][]netlink.Neigh
	// neighs holds the IPv4 and IPv6 neighbour entry of each link and IP (`ip neigh show`).
	neighs map[neighKey]netlink.Neigh
	// learning holds the bridge ports that learn, by link index (`bridge -d link show`).
	learning map[int]bool
	// dumps counts the dumps requested, restarts included.
	dumps int
}

// fdbKey is what FDB entries are looked up by: a link's index and a MAC.
type fdbKey struct {
	link int
	mac  [6]byte
}

// neighKey is what neighbour entries are looked up by: a link's index and an IP.
type neighKey struct {
	link int
	ip   netip.Addr
}

// macKey returns the lookup form of a 6-byte MAC; false for other lengths.
func macKey(mac net.HardwareAddr) ([6]byte, bool) {
	if len(mac) != 6 {
		return [6]byte{}, false
	}
	return [6]byte(mac), true
}

// readKernel dumps the links, addresses, FDB entries and neighbour entries of namespace ns
// (nil: the agent's own), each netlink exchange bounded by what is left of ctx's deadline,
// and by dataplaneTimeout.
func readKernel(ctx context.Context, ns *netns.NsHandle) (*kernelState, error) {
	h, err := openNetlink(ctx, ns)
	if err != nil {
		return nil, err
	}
	defer h.Close()

	k := &kernelState{
		byName:  map[string]netlink.Link{},
		byIndex: map[int]netlink.Link{},
		addrs:   map[int][]netip.Prefix{},
		fdb:     map[fdbKey][]netlink.Neigh{},
		neighs:  map[neighKey]netlink.Neigh{},
	}
	if k.learning, err = portLearning(ctx, k, ns); err != nil {
		return nil, err
	}
	links, err := dumpKernel(ctx, k, "links", h.LinkList)
	if err != nil {
		return nil, err
	}
	for _, l := range links {
		k.byName[l.Attrs().Name] = l
		k.byIndex[l.Attrs().Index] = l
	}
	addrs, err := dumpKernel(ctx, k, "addresses", func() ([]netlink.Addr, error) {
		return h.AddrList(nil, netlink.FAMILY_ALL)
	})
	if err != nil {
		return nil, err
	}
	for _, a := range addrs {
		if p, ok := prefixOf(a.IPNet); ok {
			k.addrs[a.LinkIndex] = append(k.addrs[a.LinkIndex], p)
		}
	}
	fdb, err := dumpKernel(ctx, k, "fdb entries", func() ([]netlink.Neigh, error) {
		return h.NeighList(0, unix.AF_BRIDGE)
	})
	if err != nil {
		return nil, err
	}
	for _, e := range fdb {
		if mac, ok := macKey(e.HardwareAddr); ok {
			key := fdbKey{e.LinkIndex, mac}
			k.fdb[key] = append(k.fdb[key], e)
		}
	}
	neighs, err := dumpKernel(ctx, k, "neighbour entries", func() ([]netlink.Neigh, error) {
		return h.NeighList(0, netlink.FAMILY_ALL)
	})
	if err != nil {
		return nil, err
	}
	for _, e := range neighs {
		ip, ok := netip.AddrFromSlice(e.IP)
		if ok && (e.Family == unix.AF_INET || e.Family == unix.AF_INET6) {
			k.neighs[neighKey{e.LinkIndex, ip.Unmap()}] = e
		}
	}
	return k, nil
}

// portLearning dumps the bridge ports of namespace ns (nil: the agent's own) once
// (`bridge -d link show`, RTM_GETLINK of family AF_BRIDGE) and returns those that learn
// (IFLA_BRPORT_LEARNING), by link index.
func portLearning(ctx context.Context, k *kernelState, ns *netns.NsHandle) (map[int]bool, error) {
	target := netns.None()
	if ns != nil {
		target = *ns
	}
	s, err := nl.GetNetlinkSocketAt(target, netns.None(), unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("opening a netlink socket: %w", err)
	}
	defer s.Close()
	timeout := dataplaneTimeout
	if d, ok := ctx.Deadline(); ok {
		timeout = min(timeout, time.Until(d))
	}
	tv := unix.NsecToTimeval(timeout.Nanoseconds())
	if err := s.SetReceiveTimeout(&tv); err != nil {
		return nil, fmt.Errorf("setting netlink timeout %v: %w", timeout, err)
	}
	msgs, err := dumpKernel(ctx, k, "bridge ports", func() ([][]byte, error) {
		req := nl.NewNetlinkRequest(unix.RTM_GETLINK, unix.NLM_F_DUMP)
		req.Sockets = map[int]*nl.SocketHandle{unix.NETLINK_ROUTE: {Socket: s}}
		req.AddData(nl.NewIfInfomsg(unix.AF_BRIDGE))
		return req.Execute(unix.NETLINK_ROUTE, unix.RTM_NEWLINK)
	})
	if err != nil {
		return nil, err
	}
	out := map[int]bool{}
	for _, m := range msgs {
		info := nl.DeserializeIfInfomsg(m)
		attrs, err := nl.ParseRouteAttr(m[info.Len():])
		if err != nil {
			continue
		}
		for _, a := range attrs {
			if a.Attr.Type&nl.NLA_TYPE_MASK != unix.IFLA_PROTINFO {
				continue
			}
			port, err := nl.ParseRouteAttr(a.Value)
			if err != nil {
				continue
			}
			for _, pa := range port {
				if pa.Attr.Type == unix.IFLA_BRPORT_LEARNING && len(pa.Value) > 0 && pa.Value[0] != 0 {
					out[int(info.Index)] = true
				}
			}
		}
	}
	return out, nil
}

// openNetlink opens a netlink handle in namespace ns (nil: the agent's own) whose every
// exchange is bounded by what is left of ctx's deadline, and by dataplaneTimeout.
func openNetlink(ctx context.Context, ns *netns.NsHandle) (*netlink.Handle, error) {
	timeout := dataplaneTimeout
	if d, ok := ctx.Deadline(); ok {
		timeout = min(timeout, time.Until(d))
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if timeout < time.Millisecond {
		return nil, context.DeadlineExceeded
	}
	var h *netlink.Handle
	var err error
	if ns != nil {
		h, err = netlink.NewHandleAt(*ns, unix.NETLINK_ROUTE)
	} else {
		h, err = netlink.NewHandle(unix.NETLINK_ROUTE)
	}
	if err != nil {
		return nil, fmt.Errorf("opening a netlink handle: %w", err)
	}
	if err := h.SetSocketTimeout(timeout); err != nil {
		h.Close()
		return nil, fmt.Errorf("setting netlink timeout %v: %w", timeout, err)
	}
	return h, nil
}

// dumpKernel runs one dump of what, starting over when the kernel reports that it changed
// meanwhile, and counts it in k.
func dumpKernel[T any](ctx context.Context, k *kernelState, what string, dump func() ([]T, error)) ([]T, error) {
	for attempt := 1; ; attempt++ {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("listing %s: %w", what, err)
		}
		k.dumps++
		out, err := dump()
		if errors.Is(err, netlink.ErrDumpInterrupted) && attempt < dataplaneDumpAttempts {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("listing %s: %w", what, err)
		}
		return out, nil
	}
}

// prefixOf returns an address of a link as a prefix: the address and its prefix length.
func prefixOf(n *net.IPNet) (netip.Prefix, bool) {
	if n == nil {
		return netip.Prefix{}, false
	}
	a, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	ones, _ := n.Mask.Size()
	return netip.PrefixFrom(a.Unmap(), ones), true
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

// vtep returns the VTEP address of the named node from its Node object, as
// linux.NodeVTEP reads it; invalid when there is none.
func (v *dataplaneView) vtep(node string) netip.Addr {
	if a, ok := v.vteps[node]; ok {
		return a
	}
	var a netip.Addr
	if node != "" {
		if obj, ok := v.store.Get(linux.NodeKey(node)); ok {
			a, _ = netip.ParseAddr(obj.GetNode().GetVtepAddress())
		}
	}
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
	var br, vx netlink.Link
	n.Bridge, br = v.bridge(id, spec, mtu)
	n.Vxlan, vx = v.vxlan(id, spec, mtu)
	n.RemoteVteps = v.remoteVteps(vx, endpoints)
	for _, ep := range endpoints {
		n.Endpoints = append(n.Endpoints, v.endpoint(ep, id, mtu, br, vx))
	}
	return n
}

// link returns what the kernel has of the link called name, and the link; nil when there
// is none, which the link's problems say.
func (v *dataplaneView) link(name string) (*delphiv1.DataplaneLink, netlink.Link) {
	out := &delphiv1.DataplaneLink{Name: name}
	l, ok := v.kernel.byName[name]
	if !ok {
		out.Problems = []string{"missing"}
		return out, nil
	}
	a := l.Attrs()
	out.Present = true
	out.Kind = l.Type()
	out.Alias = a.Alias
	out.Up = a.Flags&net.FlagUp != 0
	out.OperState = a.OperState.String()
	out.Mtu = uint32(a.MTU)
	out.Mac = a.HardwareAddr.String()
	if m, ok := v.kernel.byIndex[a.MasterIndex]; ok && a.MasterIndex != 0 {
		out.Master = m.Attrs().Name
	}
	for _, p := range v.kernel.addrs[a.Index] {
		out.Addresses = append(out.Addresses, p.String())
	}
	if vx, ok := l.(*netlink.Vxlan); ok {
		out.Vni = uint32(vx.VxlanId)
		if vx.SrcAddr != nil {
			out.Local = vx.SrcAddr.String()
		}
		out.DstPort = uint32(vx.Port)
		out.Learning = vx.Learning
	}
	return out, l
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

// bridge returns the network's bridge, which should have the MTU mtu (0: any), and the
// link when it is naples's.
func (v *dataplaneView) bridge(networkKeyID string, spec *nimbusv1.NetworkSpec, mtu uint32) (*delphiv1.DataplaneLink, netlink.Link) {
	out, l := v.link(linux.BridgeName(networkKeyID))
	if !device(out, networkKeyID, "bridge", mtu) {
		return out, nil
	}
	if want := linux.GatewayMAC(networkKeyID).String(); out.GetMac() != want {
		out.Problems = append(out.Problems, fmt.Sprintf("mac %s (want %s)", out.GetMac(), want))
	}
	var want []netip.Prefix
	for _, s := range spec.AllSubnets() {
		subnet, err := netip.ParsePrefix(s.GetCidr())
		gw, gerr := netip.ParseAddr(s.GetGateway())
		if err == nil && gerr == nil {
			want = append(want, netip.PrefixFrom(gw, subnet.Bits()))
		}
	}
	have := v.kernel.addrs[l.Attrs().Index]
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
func (v *dataplaneView) vxlan(networkKeyID string, spec *nimbusv1.NetworkSpec, mtu uint32) (*delphiv1.DataplaneLink, netlink.Link) {
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
func (v *dataplaneView) remoteVteps(vx netlink.Link, endpoints []*nimbusv1.Object) []*delphiv1.DataplaneVtep {
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
		for _, e := range v.kernel.fdb[fdbKey{link: vx.Attrs().Index}] {
			if e.Flags&netlink.NTF_SELF == 0 {
				continue
			}
			if a, ok := netip.AddrFromSlice(e.IP); ok {
				vtep(a.Unmap()).Present = true
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
func (v *dataplaneView) endpoint(obj *nimbusv1.Object, networkKeyID string, mtu uint32, br, vx netlink.Link) *delphiv1.DataplaneEndpoint {
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
	out.Learning = v.kernel.learning[l.Attrs().Index]
	if out.Learning {
		out.Problems = append(out.Problems, "learning on (want off)")
	}
	if key, ok := macKey(mac); ok && out.GetMaster() == bridge {
		static := slices.ContainsFunc(v.kernel.fdb[fdbKey{l.Attrs().Index, key}], func(e netlink.Neigh) bool {
			return e.MasterIndex != 0 && e.State&netlink.NUD_NOARP != 0 && e.State&netlink.NUD_PERMANENT == 0
		})
		if !static {
			out.Problems = append(out.Problems, fmt.Sprintf("no static entry for %s on the bridge", mac))
		}
	}
	return out
}

// fdb returns the forwarding entries of a remote MAC on VXLAN device vx (nil: missing or
// not naples's), which should send it to vtep.
func (v *dataplaneView) fdb(vx netlink.Link, mac [6]byte, vtep netip.Addr) *delphiv1.DataplaneFdb {
	f := &delphiv1.DataplaneFdb{Mac: net.HardwareAddr(mac[:]).String()}
	if vx == nil {
		return f
	}
	for _, e := range v.kernel.fdb[fdbKey{vx.Attrs().Index, mac}] {
		if e.Flags&netlink.NTF_SELF == 0 {
			// The bridge's entry for its VXLAN port, which names the bridge as master
			// (NDA_MASTER); naples's are static.
			if e.MasterIndex != 0 && e.State&(netlink.NUD_NOARP|netlink.NUD_PERMANENT) != 0 {
				f.BridgePresent = true
			}
			continue
		}
		if a, ok := netip.AddrFromSlice(e.IP); ok {
			a = a.Unmap()
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
func (v *dataplaneView) neighbor(br netlink.Link, ip string, mac net.HardwareAddr) *delphiv1.DataplaneNeighbor {
	n := &delphiv1.DataplaneNeighbor{Ip: ip}
	want, err := netip.ParseAddr(ip)
	if err != nil || br == nil {
		return n
	}
	if e, ok := v.kernel.neighs[neighKey{br.Attrs().Index, want.Unmap()}]; ok {
		n.Mac = e.HardwareAddr.String()
		n.State = nudState(e.State)
		n.Present = e.State&netlink.NUD_PERMANENT != 0 && mac != nil && bytes.Equal(e.HardwareAddr, mac)
	}
	return n
}

// nudState names a neighbour entry's state as `ip neigh` does, in lower case:
// "permanent", "reachable", "none".
func nudState(state int) string {
	nudStates := []struct {
		bit  int
		name string
	}{
		{netlink.NUD_INCOMPLETE, "incomplete"},
		{netlink.NUD_REACHABLE, "reachable"},
		{netlink.NUD_STALE, "stale"},
		{netlink.NUD_DELAY, "delay"},
		{netlink.NUD_PROBE, "probe"},
		{netlink.NUD_FAILED, "failed"},
		{netlink.NUD_NOARP, "noarp"},
		{netlink.NUD_PERMANENT, "permanent"},
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
