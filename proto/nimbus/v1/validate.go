package nimbusv1

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// isName tells whether s is what names, tenants, namespaces and node names may look
// like: DNS-style labels separated by dots, each of 1 to 63 lower-case letters, digits
// and '-', neither first nor last. nimbus checks the key of every status report a node or
// a peer sends, millions at a fleet's size: a loop over the bytes, not a regular
// expression, which took a twentieth of a replica's CPU.
func isName(s string) bool {
	label := 0 // the length of the label so far
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c >= 'a' && c <= 'z' || c >= '0' && c <= '9':
		case c == '-':
			if label == 0 || i+1 == len(s) || s[i+1] == '.' {
				return false
			}
		case c == '.':
			if label == 0 {
				return false
			}
			label = 0
			continue
		default:
			return false
		}
		if label++; label > 63 {
			return false
		}
	}
	return label > 0
}

// ifNamePattern is what a Linux interface name may look like.
var ifNamePattern = regexp.MustCompile(`^[A-Za-z0-9_.:@-]{1,15}$`)

// validator collects field errors.
type validator struct{ errs []error }

func (v *validator) add(field, value, reason string, args ...any) {
	v.errs = append(v.errs, &FieldError{Field: field, Value: value, Reason: fmt.Sprintf(reason, args...)})
}

func (v *validator) err() error { return errors.Join(v.errs...) }

// fieldNames names one field of every element of a list, "base[i]suffix". The names of
// the first elements are made once: a validator names a field only when it is bad, and
// formatting the names of the good ones was a twentieth of the CPU nimbus and naplesctl
// spend on a bulk apply.
type fieldNames struct {
	base, suffix string
	first        [8]string
}

// newFieldNames returns the names of the field suffix of every element of the list base.
func newFieldNames(base, suffix string) *fieldNames {
	n := &fieldNames{base: base, suffix: suffix}
	for i := range n.first {
		n.first[i] = n.format(i)
	}
	return n
}

// at returns the name of the field of element i.
func (n *fieldNames) at(i int) string {
	if i >= 0 && i < len(n.first) {
		return n.first[i]
	}
	return n.format(i)
}

func (n *fieldNames) format(i int) string {
	return n.base + "[" + strconv.Itoa(i) + "]" + n.suffix
}

// The names of the fields of lists that objects commonly hold.
var (
	metaNodes       = newFieldNames("meta.nodes", "")
	endpointIPs     = newFieldNames("spec.ips", "")
	nexthopGateways = newFieldNames("spec.nexthops", ".gateway")
	nexthopDevices  = newFieldNames("spec.nexthops", ".device")
	nexthopWeights  = newFieldNames("spec.nexthops", ".weight")
)

// Validate checks the object's meta and spec and returns every bad field, each as a
// *FieldError joined together; nil means the object is valid.
func (o *Object) Validate() error {
	v := &validator{}
	m := o.GetMeta()
	if m == nil {
		v.add("meta", "", "is required")
		return v.err()
	}
	v.name("meta.name", m.GetName(), true)
	v.name("meta.tenant", m.GetTenant(), false)
	v.name("meta.namespace", m.GetNamespace(), false)
	for i, n := range m.GetNodes() {
		v.name(metaNodes.at(i), n, true)
	}
	switch s := o.GetSpec().(type) {
	case nil:
		v.add("spec", "", "is required")
	case *Object_Node:
		v.node(s.Node)
	case *Object_Network:
		v.network(s.Network)
	case *Object_Endpoint:
		v.endpoint(s.Endpoint)
	case *Object_SecurityGroup:
		for i, c := range s.SecurityGroup.GetCidrs() {
			v.prefix(fmt.Sprintf("spec.cidrs[%d]", i), c)
		}
	case *Object_NetworkSecurityPolicy:
		v.policy(s.NetworkSecurityPolicy)
	case *Object_Route:
		v.route(s.Route)
	case *Object_Interface:
		v.iface(s.Interface)
	case *Object_FlowExportPolicy:
		v.flowExport(s.FlowExportPolicy)
	case *Object_Trace:
		v.trace(s.Trace)
	}
	return v.err()
}

// Validate checks that the key names a known kind and a well-formed name.
func (k *ObjectKey) Validate() error {
	v := &validator{}
	if _, ok := kindNames[k.GetKind()]; !ok {
		v.add("key.kind", k.GetKind().String(), "unknown kind")
	}
	v.name("key.name", k.GetName(), true)
	v.name("key.tenant", k.GetTenant(), false)
	v.name("key.namespace", k.GetNamespace(), false)
	return v.err()
}

func (v *validator) name(field, s string, required bool) {
	switch {
	case s == "" && required:
		v.add(field, s, "is required")
	case s != "" && (len(s) > 253 || !isName(s)):
		v.add(field, s, "must be lower-case letters, digits, '-' and '.', at most 253 characters")
	}
}

func (v *validator) ifName(field, s string, required bool) {
	switch {
	case s == "" && required:
		v.add(field, s, "is required")
	case s != "" && !ifNamePattern.MatchString(s):
		v.add(field, s, "not a Linux interface name (1 to 15 characters, no '/' or spaces)")
	}
}

// prefix checks a CIDR with no host bits set, in canonical form, and returns it.
func (v *validator) prefix(field, s string) (netip.Prefix, bool) {
	p, err := netip.ParsePrefix(s)
	if err != nil {
		v.add(field, s, "%s", prefixReason(s, err))
		return netip.Prefix{}, false
	}
	if p != p.Masked() {
		v.add(field, s, "host bits set; did you mean %s?", p.Masked())
		return netip.Prefix{}, false
	}
	// Compared in a buffer of the stack: no string made for a prefix that is canonical.
	var buf [64]byte
	if string(p.AppendTo(buf[:0])) != s {
		v.add(field, s, "not in canonical form (RFC 5952: lower case, shortest); write %s", p)
		return netip.Prefix{}, false
	}
	return p, true
}

// prefixReason turns netip's parse error into a short reason.
func prefixReason(s string, err error) string {
	if s == "" {
		return "is required"
	}
	if addr, bits, ok := strings.Cut(s, "/"); ok {
		if a, aerr := netip.ParseAddr(addr); aerr == nil {
			if n, nerr := strconv.Atoi(bits); nerr == nil && (n < 0 || n > a.BitLen()) {
				return "prefix length out of range"
			}
		}
	}
	return "not a CIDR prefix: " + strings.TrimPrefix(err.Error(), "netip.ParsePrefix("+strconv.Quote(s)+"): ")
}

func (v *validator) addr(field, s string, required bool) (netip.Addr, bool) {
	if s == "" {
		if required {
			v.add(field, s, "is required")
		}
		return netip.Addr{}, false
	}
	a, err := netip.ParseAddr(s)
	if err != nil || a.Zone() != "" {
		v.add(field, s, "not an IP address")
		return netip.Addr{}, false
	}
	var buf [64]byte
	if string(a.AppendTo(buf[:0])) != s {
		v.add(field, s, "not in canonical form (RFC 5952: lower case, shortest); write %s", a)
		return netip.Addr{}, false
	}
	return a, true
}

func (v *validator) mtu(field string, mtu uint32) {
	if mtu != 0 && (mtu < 68 || mtu > 65535) {
		v.add(field, strconv.FormatUint(uint64(mtu), 10), "must be between 68 and 65535")
	}
}

func (v *validator) node(s *NodeSpec) {
	a, ok := v.addr("spec.vtepAddress", s.GetVtepAddress(), false)
	if ok && (a.IsUnspecified() || a.IsMulticast() || a.IsLoopback() || a == netip.AddrFrom4([4]byte{255, 255, 255, 255})) {
		// VXLAN tunnels to the node are sent to its VTEP address, so it names one
		// host: a tunnel to any of these would not reach the node.
		v.add("spec.vtepAddress", s.GetVtepAddress(), "not a unicast address of a host; tunnels to the node need one")
	}
}

func (v *validator) network(s *NetworkSpec) {
	if s.GetVni() == 0 || s.GetVni() > 1<<24-1 {
		v.add("spec.vni", strconv.FormatUint(uint64(s.GetVni()), 10), "must be between 1 and 16777215")
	}
	if s.GetSubnet() == "" && len(s.GetSubnets()) == 0 {
		v.add("spec.subnets", "", "at least one subnet is required (spec.subnet or spec.subnets)")
	}
	if s.GetSubnet() == "" && s.GetGateway() != "" {
		v.add("spec.gateway", s.GetGateway(), "needs spec.subnet")
	}
	type seen struct {
		field  string
		prefix netip.Prefix
	}
	var subnets []seen
	check := func(field, cidr, gwField, gateway string) {
		subnet, ok := v.prefix(field, cidr)
		if gw, gok := v.addr(gwField, gateway, false); gok && ok {
			switch {
			case !subnet.Contains(gw):
				v.add(gwField, gateway, "not inside %s %s", field, subnet)
			case subnet.Addr().Is4() && subnet.Bits() <= 30 && gw == subnet.Addr():
				v.add(gwField, gateway, "the network address of %s %s; a gateway needs a host address", field, subnet)
			case subnet.Addr().Is4() && subnet.Bits() <= 30 && gw == broadcast4(subnet):
				v.add(gwField, gateway, "the broadcast address of %s %s; a gateway needs a host address", field, subnet)
			}
		}
		if !ok {
			return
		}
		for _, o := range subnets {
			if o.prefix.Overlaps(subnet) {
				v.add(field, cidr, "overlaps %s %s", o.field, o.prefix)
				return
			}
		}
		subnets = append(subnets, seen{field, subnet})
	}
	if s.GetSubnet() != "" {
		check("spec.subnet", s.GetSubnet(), "spec.gateway", s.GetGateway())
	}
	for i, sn := range s.GetSubnets() {
		f := fmt.Sprintf("spec.subnets[%d]", i)
		check(f+".cidr", sn.GetCidr(), f+".gateway", sn.GetGateway())
	}
	v.mtu("spec.mtu", s.GetMtu())
}

// broadcast4 returns the broadcast address of the IPv4 prefix p: its last address.
func broadcast4(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().As4()
	for i := p.Bits(); i < 32; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	return netip.AddrFrom4(b)
}

// shortList is the length up to which a list is searched for repeats rather than indexed.
const shortList = 8

func (v *validator) endpoint(s *EndpointSpec) {
	v.name("spec.network", s.GetNetwork(), true)
	v.name("spec.node", s.GetNode(), false)
	v.ifName("spec.interface", s.GetInterface(), false)
	if s.GetMac() != "" {
		switch hw, err := net.ParseMAC(s.GetMac()); {
		case err != nil || len(hw) != 6:
			v.add("spec.mac", s.GetMac(), "not an Ethernet MAC address")
		case hw[0]&1 != 0:
			// The group bit: multicast, and broadcast (ff:ff:ff:ff:ff:ff), name many
			// receivers, never one endpoint.
			v.add("spec.mac", s.GetMac(), "a multicast or broadcast address (group bit set); an endpoint needs a unicast MAC")
		case [6]byte(hw) == [6]byte{}:
			v.add("spec.mac", s.GetMac(), "the all-zero address; an endpoint needs a unicast MAC")
		}
	}
	// An address listed twice is a typo. Addresses are in canonical form, so equal
	// addresses are equal strings. A short list, as endpoints have, is searched; a long
	// one (an object may be as large as nimbus's --max-object-bytes) is indexed, so that
	// checking it stays linear.
	ips := s.GetIps()
	var first map[string]int
	if len(ips) > shortList {
		first = make(map[string]int, len(ips))
	}
	for i, ip := range ips {
		if _, ok := v.addr(endpointIPs.at(i), ip, true); !ok {
			continue
		}
		j := -1
		if first == nil {
			j = slices.Index(ips[:i], ip)
		} else if k, seen := first[ip]; seen {
			j = k
		} else {
			first[ip] = i
		}
		if j >= 0 {
			v.add(endpointIPs.at(i), ip, "repeats %s", endpointIPs.at(j))
		}
	}
	// Anti-spoofing binds an endpoint's addresses to its MAC, and the other nodes answer
	// for its addresses with its MAC: addresses without one would go unguarded.
	if s.GetMac() == "" {
		if len(ips) > 0 {
			v.add("spec.ips", strings.Join(ips, ","), "an endpoint with addresses needs spec.mac, which its addresses are bound to")
		}
		if len(s.GetAllowedSourcePrefixes()) > 0 {
			v.add("spec.allowedSourcePrefixes", strings.Join(s.GetAllowedSourcePrefixes(), ","), "an endpoint with addresses needs spec.mac, which its addresses are bound to")
		}
	}
	for i, p := range s.GetAllowedSourcePrefixes() {
		v.prefix(fmt.Sprintf("spec.allowedSourcePrefixes[%d]", i), p)
	}
	for i, g := range s.GetSecurityGroups() {
		v.name(fmt.Sprintf("spec.securityGroups[%d]", i), g, true)
	}
}

func (v *validator) policy(s *NetworkSecurityPolicySpec) {
	for i, g := range s.GetAttachGroups() {
		v.name(fmt.Sprintf("spec.attachGroups[%d]", i), g, true)
	}
	for i, r := range s.GetIngress() {
		f := fmt.Sprintf("spec.ingress[%d]", i)
		v.rule(f, r)
		// An ingress rule's peers send: they are named by fromGroups and fromCidrs.
		if len(r.GetToGroups()) > 0 {
			v.add(f+".toGroups", strings.Join(r.GetToGroups(), ","), "an ingress rule names its peers with fromGroups")
		}
		if len(r.GetToCidrs()) > 0 {
			v.add(f+".toCidrs", strings.Join(r.GetToCidrs(), ","), "an ingress rule names its peers with fromCidrs")
		}
	}
	for i, r := range s.GetEgress() {
		f := fmt.Sprintf("spec.egress[%d]", i)
		v.rule(f, r)
		if len(r.GetFromGroups()) > 0 {
			v.add(f+".fromGroups", strings.Join(r.GetFromGroups(), ","), "an egress rule names its peers with toGroups")
		}
		if len(r.GetFromCidrs()) > 0 {
			v.add(f+".fromCidrs", strings.Join(r.GetFromCidrs(), ","), "an egress rule names its peers with toCidrs")
		}
	}
}

func (v *validator) rule(field string, r *PolicyRule) {
	if r.GetAction() == PolicyRule_ACTION_UNSPECIFIED {
		v.add(field+".action", r.GetAction().String(), "must be ACTION_ALLOW or ACTION_DENY")
	}
	for i, c := range r.GetFromCidrs() {
		v.prefix(fmt.Sprintf("%s.fromCidrs[%d]", field, i), c)
	}
	for i, c := range r.GetToCidrs() {
		v.prefix(fmt.Sprintf("%s.toCidrs[%d]", field, i), c)
	}
	for i, g := range r.GetFromGroups() {
		v.name(fmt.Sprintf("%s.fromGroups[%d]", field, i), g, true)
	}
	for i, g := range r.GetToGroups() {
		v.name(fmt.Sprintf("%s.toGroups[%d]", field, i), g, true)
	}
	switch r.GetProtocol() {
	case "", "tcp", "udp", "icmp":
	default:
		v.add(field+".protocol", r.GetProtocol(), `must be "tcp", "udp", "icmp" or empty`)
	}
	for i, p := range r.GetPorts() {
		f := fmt.Sprintf("%s.ports[%d]", field, i)
		if r.GetProtocol() != "tcp" && r.GetProtocol() != "udp" {
			v.add(f, p, "ports need protocol tcp or udp")
			continue
		}
		lo, hi, isRange := strings.Cut(p, "-")
		if !isRange {
			hi = lo
		}
		l, lerr := strconv.ParseUint(lo, 10, 16)
		h, herr := strconv.ParseUint(hi, 10, 16)
		if lerr != nil || herr != nil || l == 0 || l > h {
			v.add(f, p, `must be a port 1-65535 or a range "low-high"`)
		}
	}
}

func (v *validator) route(s *RouteSpec) {
	switch t := s.GetTable(); {
	case s.GetTenantTable():
		if t != 0 {
			v.add("spec.table", strconv.FormatUint(uint64(t), 10), "must be 0 with spec.tenantTable, which picks the tenant's table")
		}
	case t == 0:
		v.add("spec.table", "0", "is required (1 to 4294967295), or spec.tenantTable")
	case t == 255:
		v.add("spec.table", "255", `table 255 is the kernel's "local" table and cannot be used`)
	}
	p, pok := v.prefix("spec.prefix", s.GetPrefix())
	if len(s.GetNexthops()) == 0 {
		v.add("spec.nexthops", "", "at least one next hop is required")
	}
	for i, nh := range s.GetNexthops() {
		gw, gok := v.addr(nexthopGateways.at(i), nh.GetGateway(), nh.GetDevice() == "")
		if gok && pok && gw.Is4() != p.Addr().Is4() {
			v.add(nexthopGateways.at(i), nh.GetGateway(), "address family differs from spec.prefix %s", p)
		}
		v.ifName(nexthopDevices.at(i), nh.GetDevice(), false)
		if nh.GetWeight() > 256 {
			v.add(nexthopWeights.at(i), strconv.FormatUint(uint64(nh.GetWeight()), 10), "must be between 1 and 256")
		}
	}
}

func (v *validator) iface(s *InterfaceSpec) {
	v.ifName("spec.device", s.GetDevice(), false)
	v.mtu("spec.mtu", s.GetMtu())
	for i, a := range s.GetAddresses() {
		f := fmt.Sprintf("spec.addresses[%d]", i)
		if _, err := netip.ParsePrefix(a); err != nil {
			v.add(f, a, "not an address with prefix length, such as 10.0.0.1/24")
		}
	}
}

// ValidateNodeName checks that name can name a node: lower-case DNS-style labels.
func ValidateNodeName(name string) error {
	v := &validator{}
	v.name("node", name, true)
	return v.err()
}
