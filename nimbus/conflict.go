package nimbus

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"google.golang.org/protobuf/protoadapt"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// Cross-object conflicts
//
// Some values belong to one object at a time: an endpoint's address in its tenant, its MAC
// in its network, a host interface on a node (an Endpoint's spec.interface on spec.node,
// an Interface object's device on each node it targets, or on every node), a network's
// VNI, a node's VTEP address (which the other nodes' tunnels reach it at), and the
// address space of a tenant's subnets. Apply refuses an object that takes such a value
// from another object, and an endpoint address outside the subnets of its network, equal
// to one of its gateway addresses (which every node of the network holds on its bridge)
// or to an IPv4 subnet's network or broadcast address, checked both ways: an endpoint applied when its network exists, a network
// applied when endpoints of it exist; an endpoint applied before its network is accepted,
// and the network that would leave its addresses outside is then refused. The later
// object is refused, never the one that holds the value, and the error names both.
//
// Addresses are unique per tenant, not only per network, because the networks of a
// tenant route to each other (each tenant has one routing table, see hal/linux): the
// same address in two networks of a tenant would be two hosts behind one route.
//
// The checks run against the store as the commit finds it, with the batch's earlier
// writes made: an object updated keeps what its old version held, and a batch that frees
// a value and then takes it in another object works. The claims are kept in an index of
// the tables (tables.claims), updated with every object stored or deleted, so a check
// costs a few lookups, not a scan of the objects; kinds that hold no claim, such as
// Route, cost a type switch.
//
// A batch with a conflict is refused whole with codes.FailedPrecondition, the value being
// taken (the request is well formed; the store's state refuses it), one line per
// conflict as for invalid entries; the other batches committed with it are unaffected.
// With the etcd store, each replica checks against its cache: two replicas that accept
// conflicting objects at the same moment both commit. The nodes then keep the object that
// was programmed first, and FAIL the other naming it (see hal/linux).

// The prefixes of the claims index's keys, one per kind of claim, and what follows them,
// separated by claimKeySep. A member key is no claim: it lists an endpoint under its
// network, for the check of a network's subnets.
const (
	claimDevice = "dev\x00"    // DEVICE NODE, or anyNode: Endpoint or Interface
	claimIP     = "ip\x00"     // TENANT IP: Endpoint
	claimMAC    = "mac\x00"    // NETWORK-ID MAC: Endpoint
	claimVNI    = "vni\x00"    // VNI: Network
	claimVTEP   = "vtep\x00"   // ADDRESS: Node
	claimSubnet = "subnet\x00" // TENANT FAMILY+ADDRESS/BITS: Network
	claimMember = "member\x00" // NETWORK-ID ENDPOINT-ID: Endpoint
	claimKeySep = "\x00"
	// anyNode is the node of the device claim of an Interface object for every node.
	anyNode = "*"
	// subnetBitsDigits is how many digits a subnet key's prefix length takes.
	subnetBitsDigits = 3
)

// claimKeys returns the index keys the object holds, nil for kinds that hold none.
func claimKeys(obj *nimbusv1.Object) []string {
	m := obj.GetMeta()
	switch s := obj.GetSpec().(type) {
	case *nimbusv1.Object_Endpoint:
		ep := s.Endpoint
		key := obj.Key()
		netID := endpointNetworkID(obj)
		keys := []string{claimMember + netID + claimKeySep + key.ID()}
		if ep.GetNode() != "" && ep.GetInterface() != "" {
			keys = append(keys, deviceKey(ep.GetInterface(), ep.GetNode()))
		}
		if mac, ok := parseMAC(ep.GetMac()); ok {
			keys = append(keys, claimMAC+netID+claimKeySep+mac)
		}
		for _, ip := range ep.GetIps() {
			if a, err := netip.ParseAddr(ip); err == nil {
				keys = append(keys, claimIP+key.GetTenant()+claimKeySep+a.Unmap().String())
			}
		}
		return keys
	case *nimbusv1.Object_Network:
		keys := []string{claimVNI + strconv.FormatUint(uint64(s.Network.GetVni()), 10)}
		for _, sn := range s.Network.AllSubnets() {
			if p, err := netip.ParsePrefix(sn.GetCidr()); err == nil {
				keys = append(keys, subnetKey(obj.Key().GetTenant(), p.Masked()))
			}
		}
		return keys
	case *nimbusv1.Object_Node:
		if a, ok := vtepAddr(s.Node); ok {
			return []string{claimVTEP + a.String()}
		}
		return nil
	case *nimbusv1.Object_Interface:
		dev := interfaceDevice(obj)
		if len(m.GetNodes()) == 0 {
			return []string{deviceKey(dev, anyNode)}
		}
		keys := make([]string, 0, len(m.GetNodes()))
		for _, n := range m.GetNodes() {
			keys = append(keys, deviceKey(dev, n))
		}
		return keys
	}
	return nil
}

// holdsClaims tells whether objects of the kind hold claims, or name other objects
// that must exist (Trace), and are checked for conflicts.
func holdsClaims(obj *nimbusv1.Object) bool {
	switch obj.GetSpec().(type) {
	case *nimbusv1.Object_Endpoint, *nimbusv1.Object_Network, *nimbusv1.Object_Interface, *nimbusv1.Object_Trace, *nimbusv1.Object_Node:
		return true
	}
	return false
}

// vtepAddr returns the node's VTEP address, when it has a valid one.
func vtepAddr(n *nimbusv1.NodeSpec) (netip.Addr, bool) {
	a, err := netip.ParseAddr(n.GetVtepAddress())
	return a.Unmap(), err == nil
}

func deviceKey(device, node string) string { return claimDevice + device + claimKeySep + node }

// subnetKey is the index key of the tenant's subnet p: its address in hexadecimal, after
// its family, so that the keys of a tenant's subnets sort by address.
func subnetKey(tenant string, p netip.Prefix) string {
	fam := "4"
	if p.Addr().Is6() {
		fam = "6"
	}
	b := p.Addr().AsSlice()
	return fmt.Sprintf("%s%s%s%s%s/%0*d", claimSubnet, tenant, claimKeySep, fam, hex.EncodeToString(b), subnetBitsDigits, p.Bits())
}

// parseSubnetKey returns the subnet of a key subnetKey made.
func parseSubnetKey(key string) (netip.Prefix, bool) {
	i := strings.LastIndex(key, claimKeySep)
	if i < 0 || len(key) < i+2 {
		return netip.Prefix{}, false
	}
	addrHex, bits, ok := strings.Cut(key[i+2:], "/")
	if !ok {
		return netip.Prefix{}, false
	}
	b, err := hex.DecodeString(addrHex)
	n, nerr := strconv.Atoi(bits)
	a, aok := netip.AddrFromSlice(b)
	if err != nil || nerr != nil || !aok {
		return netip.Prefix{}, false
	}
	return netip.PrefixFrom(a, n), true
}

// endpointNetworkID is the key ID of the Network an Endpoint names, in its tenant and
// namespace.
func endpointNetworkID(obj *nimbusv1.Object) string { return endpointNetwork(obj).String() }

// endpointNetwork is the key of the Network an Endpoint names, in its tenant and
// namespace.
func endpointNetwork(obj *nimbusv1.Object) nimbusv1.Key {
	m := obj.GetMeta()
	return nimbusv1.MakeKey(nimbusv1.Kind_KIND_NETWORK, m.GetTenant(), m.GetNamespace(), obj.GetEndpoint().GetNetwork())
}

// interfaceDevice is the device an Interface object describes: spec.device, or its name.
func interfaceDevice(obj *nimbusv1.Object) string {
	if d := obj.GetInterface().GetDevice(); d != "" {
		return d
	}
	return obj.GetMeta().GetName()
}

// parseMAC returns the MAC in the one spelling of ip(8), "02:00:00:00:00:01".
func parseMAC(s string) (string, bool) {
	if s == "" {
		return "", false
	}
	hw, err := net.ParseMAC(s)
	if err != nil || len(hw) != 6 {
		return "", false
	}
	return hw.String(), true
}

// addClaims records in the index that the record's object holds its claims; a claim
// another object holds already stays with it.
func (w *writeTxn) addClaims(rec *objectRecord) {
	for _, k := range claimKeys(rec.Object) {
		if _, held := w.claims.Get(k); !held {
			w.claims.Set(k, rec.Key)
		}
	}
}

// releaseClaims removes from the index the claims the record's object holds.
func (w *writeTxn) releaseClaims(rec *objectRecord) {
	for _, k := range claimKeys(rec.Object) {
		if owner, _ := w.claims.Get(k); owner == rec.Key {
			w.claims.Delete(k)
		}
	}
}

// conflictError is the refusal of a batch whose objects take values other objects hold.
type conflictError struct {
	msg string
	// details are the details of the refusal's status (refusal.details).
	details []protoadapt.MessageV1
}

func (e *conflictError) Error() string { return e.msg }

// Is makes a conflictError match ErrConflict.
func (e *conflictError) Is(target error) bool { return target == ErrConflict }

// checkConflicts returns an error for each value the object obj, with key id, would
// take from another object stored in t, and for each endpoint address the object leaves
// outside its network's subnets; nil when there is none.
func (t *tables) checkConflicts(id nimbusv1.Key, obj *nimbusv1.Object) error {
	c := conflictCheck{t: t, id: id, obj: obj}
	switch s := obj.GetSpec().(type) {
	case *nimbusv1.Object_Endpoint:
		c.endpoint(s.Endpoint)
	case *nimbusv1.Object_Network:
		c.network(s.Network)
	case *nimbusv1.Object_Interface:
		c.iface()
	case *nimbusv1.Object_Trace:
		c.trace(s.Trace)
	case *nimbusv1.Object_Node:
		c.node(s.Node)
	}
	return errors.Join(c.errs...)
}

// conflictCheck collects the conflicts of one object.
type conflictCheck struct {
	t    *tables
	id   nimbusv1.Key
	obj  *nimbusv1.Object
	errs []error
}

// add records a conflict of field, with value, of the object checked.
func (c *conflictCheck) add(field, value, reason string, args ...any) {
	c.errs = append(c.errs, &claimError{object: describe(c.obj.Key()), field: field, value: value, reason: fmt.Sprintf(reason, args...)})
}

// claimError is a conflict of one field of an object: `endpoint "t/web": spec.ips
// "10.1.0.5" is already used by endpoint "t/db" in network "net1"`.
type claimError struct {
	// object names the object, as describe does.
	object string
	// field is the field's path, value its value, and reason what holds it or why it
	// may not be.
	field, value, reason string
}

func (e *claimError) Error() string {
	return fmt.Sprintf("%s: %s %q %s", e.object, e.field, e.value, e.reason)
}

// holder returns the object other than the one checked that holds the index key, or nil.
func (c *conflictCheck) holder(key string) *nimbusv1.Object {
	owner, ok := c.t.claims.Get(key)
	if !ok || owner == c.id {
		return nil
	}
	if rec := c.t.object(owner); rec != nil {
		return rec.Object
	}
	return nil
}

// deviceHolder returns the object other than the one checked that holds the device on
// node, or on any node when node is anyNode, or nil.
func (c *conflictCheck) deviceHolder(device, node string) *nimbusv1.Object {
	if node != anyNode {
		if h := c.holder(deviceKey(device, node)); h != nil {
			return h
		}
		return c.holder(deviceKey(device, anyNode))
	}
	var found *nimbusv1.Object
	prefix := claimDevice + device + claimKeySep
	c.t.claims.Ascend(prefix, func(k string, _ nimbusv1.Key) bool {
		if !strings.HasPrefix(k, prefix) {
			return false
		}
		found = c.holder(k)
		return found == nil
	})
	return found
}

func (c *conflictCheck) endpoint(ep *nimbusv1.EndpointSpec) {
	key := c.obj.Key()
	netID := endpointNetworkID(c.obj)
	if ep.GetNode() != "" && ep.GetInterface() != "" {
		if h := c.deviceHolder(ep.GetInterface(), ep.GetNode()); h != nil {
			c.add("spec.interface", ep.GetInterface(), "is already used by %s on node %q", describe(h.Key()), ep.GetNode())
		}
	}
	if mac, ok := parseMAC(ep.GetMac()); ok {
		if h := c.holder(claimMAC + netID + claimKeySep + mac); h != nil {
			c.add("spec.mac", ep.GetMac(), "is already used by %s in network %q", describe(h.Key()), ep.GetNetwork())
		}
	}
	var subnets []netip.Prefix
	var cidrs []string
	var gateways []netip.Addr
	netRec := c.t.object(endpointNetwork(c.obj))
	if netRec != nil {
		for _, sn := range netRec.Object.GetNetwork().AllSubnets() {
			if p, err := netip.ParsePrefix(sn.GetCidr()); err == nil {
				subnets = append(subnets, p.Masked())
				cidrs = append(cidrs, sn.GetCidr())
			}
		}
		gateways = networkGateways(netRec.Object.GetNetwork())
	}
	for _, s := range ep.GetIps() {
		a, err := netip.ParseAddr(s)
		if err != nil {
			continue
		}
		a = a.Unmap()
		if h := c.holder(claimIP + key.GetTenant() + claimKeySep + a.String()); h != nil {
			c.add("spec.ips", s, "is already used by %s in network %q", describe(h.Key()), networkName(h, key))
		}
		in := slices.IndexFunc(subnets, func(p netip.Prefix) bool { return p.Contains(a) })
		if netRec != nil && in < 0 {
			c.add("spec.ips", s, "is outside every subnet of network %q (%s)", ep.GetNetwork(), strings.Join(cidrs, ", "))
		}
		if in >= 0 {
			if what := reservedAddr(subnets[in], a); what != "" {
				c.add("spec.ips", s, "is the %s address of subnet %s of network %q; an endpoint needs a host address", what, subnets[in], ep.GetNetwork())
			}
		}
		if slices.Contains(gateways, a) {
			c.add("spec.ips", s, "is the gateway address of network %q, which every node of it holds", ep.GetNetwork())
		}
	}
}

// reservedAddr names what the address a of the subnet p is when no host may hold it: the
// network or the broadcast address of an IPv4 subnet of more than two addresses. It
// returns "" for a host address.
func reservedAddr(p netip.Prefix, a netip.Addr) string {
	if !a.Is4() || p.Bits() > 30 {
		return ""
	}
	b := a.As4()
	n := binary.BigEndian.Uint32(b[:])
	host := n &^ (^uint32(0) << (32 - p.Bits()))
	switch {
	case host == 0:
		return "network"
	case host == ^uint32(0)>>p.Bits():
		return "broadcast"
	}
	return ""
}

// node refuses a VTEP address another node holds: the other nodes would tunnel both
// nodes' traffic to one host.
func (c *conflictCheck) node(n *nimbusv1.NodeSpec) {
	if a, ok := vtepAddr(n); ok {
		if h := c.holder(claimVTEP + a.String()); h != nil {
			c.add("spec.vtepAddress", n.GetVtepAddress(), "is already used by %s; tunnels to both nodes would reach one host", describe(h.Key()))
		}
	}
}

// networkGateways returns the gateway addresses of the network's subnets: a few, so a
// slice, which an endpoint's apply searches without allocating a map.
func networkGateways(n *nimbusv1.NetworkSpec) []netip.Addr {
	var gateways []netip.Addr
	for _, sn := range n.AllSubnets() {
		if a, err := netip.ParseAddr(sn.GetGateway()); err == nil {
			gateways = append(gateways, a.Unmap())
		}
	}
	return gateways
}

// networkName names the network of the endpoint h to the endpoint with the key: by name
// in the same namespace, namespace/name otherwise.
func networkName(h *nimbusv1.Object, key *nimbusv1.ObjectKey) string {
	hk := h.Key()
	if hk.GetNamespace() == key.GetNamespace() {
		return h.GetEndpoint().GetNetwork()
	}
	return hk.GetNamespace() + "/" + h.GetEndpoint().GetNetwork()
}

func (c *conflictCheck) network(n *nimbusv1.NetworkSpec) {
	key := c.obj.Key()
	if h := c.holder(claimVNI + strconv.FormatUint(uint64(n.GetVni()), 10)); h != nil {
		c.add("spec.vni", strconv.FormatUint(uint64(n.GetVni()), 10), "is already used by %s", describe(h.Key()))
	}
	var subnets []netip.Prefix
	var cidrs []string
	for i, sn := range n.AllSubnets() {
		p, err := netip.ParsePrefix(sn.GetCidr())
		if err != nil {
			continue
		}
		p = p.Masked()
		subnets = append(subnets, p)
		cidrs = append(cidrs, sn.GetCidr())
		field := fmt.Sprintf("spec.subnets[%d].cidr", i)
		if n.GetSubnet() != "" {
			field = "spec.subnet"
			if i > 0 {
				field = fmt.Sprintf("spec.subnets[%d].cidr", i-1)
			}
		}
		if other, h := c.overlap(key.GetTenant(), p); h != nil {
			c.add(field, sn.GetCidr(), "overlaps subnet %s of %s in tenant %q", other, describe(h.Key()), key.GetTenant())
		}
	}
	// The endpoints of this network applied before it must be inside its subnets, and
	// none may hold one of its gateway addresses.
	gateways := networkGateways(n)
	prefix := claimMember + key.ID() + claimKeySep
	c.t.claims.Ascend(prefix, func(k string, epID nimbusv1.Key) bool {
		if !strings.HasPrefix(k, prefix) {
			return false
		}
		rec := c.t.object(epID)
		if rec == nil {
			return true
		}
		for _, s := range rec.Object.GetEndpoint().GetIps() {
			a, err := netip.ParseAddr(s)
			if err != nil {
				continue
			}
			in := slices.IndexFunc(subnets, func(p netip.Prefix) bool { return p.Contains(a.Unmap()) })
			if in < 0 {
				c.add("spec.subnets", strings.Join(cidrs, ", "), "leaves out address %q of %s", s, describe(rec.Object.Key()))
				return len(c.errs) < maxReportedInvalid
			}
			if what := reservedAddr(subnets[in], a.Unmap()); what != "" {
				c.add("spec.subnets", strings.Join(cidrs, ", "), "makes address %q of %s the %s address of %s", s, describe(rec.Object.Key()), what, subnets[in])
				return len(c.errs) < maxReportedInvalid
			}
			if slices.Contains(gateways, a.Unmap()) {
				c.add(gatewayField(n, a.Unmap()), s, "is the address of %s", describe(rec.Object.Key()))
				return len(c.errs) < maxReportedInvalid
			}
		}
		return true
	})
}

// gatewayField returns the path of the field of the network that gives the gateway
// address a: spec.gateway, or spec.subnets[i].gateway.
func gatewayField(n *nimbusv1.NetworkSpec, a netip.Addr) string {
	if g, err := netip.ParseAddr(n.GetGateway()); err == nil && g.Unmap() == a && n.GetSubnet() != "" {
		return "spec.gateway"
	}
	for i, sn := range n.GetSubnets() {
		if g, err := netip.ParseAddr(sn.GetGateway()); err == nil && g.Unmap() == a {
			return fmt.Sprintf("spec.subnets[%d].gateway", i)
		}
	}
	return "spec.gateway"
}

// overlap returns a subnet of another network of the tenant that overlaps p, and that
// network, or nil.
func (c *conflictCheck) overlap(tenant string, p netip.Prefix) (netip.Prefix, *nimbusv1.Object) {
	// A subnet that holds p, or is p: p's address masked to each length up to p's.
	for bits := 0; bits <= p.Bits(); bits++ {
		q, _ := p.Addr().Prefix(bits)
		if h := c.holder(subnetKey(tenant, q)); h != nil {
			return q, h
		}
	}
	// A subnet inside p: its key sorts after p's, before the end of p's range.
	var other netip.Prefix
	var found *nimbusv1.Object
	c.t.claims.Ascend(subnetKey(tenant, p), func(k string, _ nimbusv1.Key) bool {
		q, ok := parseSubnetKey(k)
		if !strings.HasPrefix(k, claimSubnet+tenant+claimKeySep) || !ok || !p.Contains(q.Addr()) {
			return false
		}
		if h := c.holder(k); h != nil {
			other, found = q, h
			return false
		}
		return true
	})
	return other, found
}

func (c *conflictCheck) iface() {
	dev := interfaceDevice(c.obj)
	nodes := c.obj.GetMeta().GetNodes()
	if len(nodes) == 0 {
		nodes = []string{anyNode}
	}
	for _, n := range nodes {
		h := c.deviceHolder(dev, n)
		if h == nil {
			continue
		}
		where := fmt.Sprintf("on node %q", n)
		if n == anyNode {
			where = "on a node this object targets (it targets every node)"
		}
		c.add("spec.device", dev, "is already used by %s %s", describe(h.Key()), where)
		return
	}
}

// trace checks that a Trace's endpoints exist in its tenant and namespace, and that its
// source is on a node, which injects the packet. A Trace is short-lived and acts at
// once: one that names what is not there would only time out.
func (c *conflictCheck) trace(t *nimbusv1.TraceSpec) {
	m := c.obj.GetMeta()
	endpoint := func(field, name string) *nimbusv1.Object {
		rec := c.t.object(nimbusv1.MakeKey(nimbusv1.Kind_KIND_ENDPOINT, m.GetTenant(), m.GetNamespace(), name))
		if rec == nil {
			c.add(field, name, "names no Endpoint in tenant %q, namespace %q", m.GetTenant(), m.GetNamespace())
			return nil
		}
		return rec.Object
	}
	if src := endpoint("spec.source", t.GetSource()); src != nil && src.GetEndpoint().GetNode() == "" {
		c.add("spec.source", t.GetSource(), "is on no node (its spec.node is empty): no node can inject the packet")
	}
	if t.GetDestination() != "" {
		endpoint("spec.destination", t.GetDestination())
	}
}

// traceNodes returns the nodes a Trace of the tenant and namespace targets when its
// meta.nodes is empty: the node of its source endpoint, and the node of its destination,
// the endpoint it names or the one that holds its destination address in the tenant, in
// t. Only those can see its packet: the source's node makes it and routes it, and the
// tunnel takes it to the destination's. A Trace for every node would take a trace slot
// of every agent's firewall (--max-traces), and every node's report of it would be a
// status record of its own. An endpoint that does not exist or is on no node adds none;
// nil when neither does.
func (t *tables) traceNodes(tenant, namespace string, tr *nimbusv1.TraceSpec) []string {
	var nodes []string
	add := func(rec *objectRecord) {
		if rec == nil {
			return
		}
		if n := rec.Object.GetEndpoint().GetNode(); n != "" {
			nodes = append(nodes, n)
		}
	}
	endpoint := func(name string) *objectRecord {
		return t.object(nimbusv1.MakeKey(nimbusv1.Kind_KIND_ENDPOINT, tenant, namespace, name))
	}
	add(endpoint(tr.GetSource()))
	switch {
	case tr.GetDestination() != "":
		add(endpoint(tr.GetDestination()))
	case tr.GetDestinationAddress() != "":
		if a, err := netip.ParseAddr(tr.GetDestinationAddress()); err == nil {
			if owner, ok := t.claims.Get(claimIP + tenant + claimKeySep + a.Unmap().String()); ok {
				add(t.object(owner))
			}
		}
	}
	return normalizeNodes(nodes)
}

// describe names an object in a conflict: its kind in lower case and
// "namespace/name", with the tenant first when it is not the default one:
// `endpoint "default/web-a"`.
func describe(k *nimbusv1.ObjectKey) string {
	name := k.GetNamespace() + "/" + k.GetName()
	if t := k.GetTenant(); t != nimbusv1.DefaultTenant {
		name = t + "/" + name
	}
	return fmt.Sprintf("%s %q", strings.ToLower(k.GetKind().Name()), name)
}
