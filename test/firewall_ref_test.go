package test

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"testing"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// This file holds the firewall's reference evaluator: what the desired Endpoints,
// SecurityGroups and NetworkSecurityPolicies say of one packet, written from the
// firewall's semantics alone, as plainly as possible, so that the traffic tests have an
// independent answer to compare the real firewall with.

// fwPacket is the first packet of a connection.
type fwPacket struct {
	// tenant is the tenant whose network carries the packet; empty means the default
	// tenant. Addresses of different tenants may overlap, so the sender and the receiver
	// are looked up among the endpoints of this tenant only.
	tenant string
	src    netip.Addr
	dst    netip.Addr
	// proto is "tcp", "udp" or "icmp" (ICMPv4 or ICMPv6, after the addresses' family).
	proto string
	// port is the destination port of a tcp or udp packet; it is 0 for icmp.
	port uint16
}

// String returns the packet as "10.1.0.11 → 10.1.0.21 tcp/80".
func (p fwPacket) String() string {
	what := p.proto
	if p.proto == "tcp" || p.proto == "udp" {
		what = fmt.Sprintf("%s/%d", p.proto, p.port)
	}
	return fmt.Sprintf("%v → %v %s", p.src, p.dst, what)
}

// fwDirection is the direction of a packet as seen by one endpoint.
type fwDirection int

const (
	// fwEgress: the packet leaves the endpoint; the peer is the destination.
	fwEgress fwDirection = iota
	// fwIngress: the packet comes to the endpoint; the peer is the source.
	fwIngress
)

// String returns "egress" or "ingress".
func (d fwDirection) String() string {
	if d == fwEgress {
		return "egress"
	}
	return "ingress"
}

// fwReference decides, from the desired objects alone, which packets the firewall
// delivers. It implements the semantics of the firewall's design, nothing more:
//
//   - Group names (an endpoint's securityGroups, a policy's attachGroups, a rule's
//     fromGroups and toGroups) name SecurityGroups of the referencing object's own
//     tenant and namespace.
//   - A peer address belongs to a group when an Endpoint of that tenant and namespace
//     lists the group and has the address among its ips, or when the address lies in one
//     of the group's cidrs.
//   - A policy protects the endpoints (of its tenant and namespace) that list one of its
//     attachGroups. In a direction, an endpoint protected by at least one policy with
//     rules of that direction lets a packet through only when some such rule ALLOWs it
//     and none DENYs it; otherwise the direction is open.
//   - A rule matches a peer when it names no groups and no CIDRs, or when the peer is in
//     one of its groups or CIDRs. The design says fromCidrs and toCidrs both match peer
//     addresses, whatever the direction; this evaluator reads groups the same way.
//   - A rule matches the protocol when its protocol is empty or equal to the packet's;
//     its ports, when given, must contain the destination port.
//   - A packet is delivered when the sender's egress (if the sender is an endpoint) and
//     the receiver's ingress (if the receiver is an endpoint) both let it through.
//
// An endpoint is taken to be enforced wherever it is: the evaluator does not look at
// spec.node or spec.interface.
type fwReference struct {
	endpoints []*nimbusv1.Object
	groups    []*nimbusv1.Object
	policies  []*nimbusv1.Object
}

// newFWReference returns the evaluator of the objects; objects of other kinds are
// ignored.
func newFWReference(objs []*nimbusv1.Object) *fwReference {
	r := &fwReference{}
	for _, o := range objs {
		switch o.GetSpec().(type) {
		case *nimbusv1.Object_Endpoint:
			r.endpoints = append(r.endpoints, o)
		case *nimbusv1.Object_SecurityGroup:
			r.groups = append(r.groups, o)
		case *nimbusv1.Object_NetworkSecurityPolicy:
			r.policies = append(r.policies, o)
		}
	}
	return r
}

// delivered reports whether the packet is delivered and, either way, why.
func (r *fwReference) delivered(p fwPacket) (bool, string) {
	tenant := p.tenant
	if tenant == "" {
		tenant = nimbusv1.DefaultTenant
	}
	var why []string
	if src := r.endpointAt(tenant, p.src); src != nil {
		ok, reason := r.allows(src, fwEgress, p.dst, p.proto, p.port)
		why = append(why, fmt.Sprintf("%s egress: %s", src.GetMeta().GetName(), reason))
		if !ok {
			return false, strings.Join(why, "; ")
		}
	}
	if dst := r.endpointAt(tenant, p.dst); dst != nil {
		ok, reason := r.allows(dst, fwIngress, p.src, p.proto, p.port)
		why = append(why, fmt.Sprintf("%s ingress: %s", dst.GetMeta().GetName(), reason))
		if !ok {
			return false, strings.Join(why, "; ")
		}
	}
	if len(why) == 0 {
		return true, "neither end is an endpoint"
	}
	return true, strings.Join(why, "; ")
}

// endpointAt returns the endpoint of the tenant that has the address, or nil.
func (r *fwReference) endpointAt(tenant string, addr netip.Addr) *nimbusv1.Object {
	for _, ep := range r.endpoints {
		if ep.Key().GetTenant() != tenant {
			continue
		}
		for _, ip := range ep.GetEndpoint().GetIps() {
			if a, err := netip.ParseAddr(ip); err == nil && a == addr {
				return ep
			}
		}
	}
	return nil
}

// allows reports whether the endpoint lets a packet with the peer, protocol and
// destination port through in the direction, and why.
func (r *fwReference) allows(ep *nimbusv1.Object, dir fwDirection, peer netip.Addr, proto string, port uint16) (bool, string) {
	protected := false
	var allowedBy, deniedBy []string
	for _, pol := range r.policies {
		if !sameScope(pol, ep) || !r.protects(pol, ep) {
			continue
		}
		spec := pol.GetNetworkSecurityPolicy()
		rules := spec.GetIngress()
		if dir == fwEgress {
			rules = spec.GetEgress()
		}
		if len(rules) > 0 {
			protected = true
		}
		for i, rule := range rules {
			if !r.ruleMatches(pol, rule, peer, proto, port) {
				continue
			}
			name := fmt.Sprintf("%s.%s[%d]", pol.GetMeta().GetName(), dir, i)
			switch rule.GetAction() {
			case nimbusv1.PolicyRule_ACTION_ALLOW:
				allowedBy = append(allowedBy, name)
			case nimbusv1.PolicyRule_ACTION_DENY:
				deniedBy = append(deniedBy, name)
			}
		}
	}
	switch {
	case !protected:
		return true, "open"
	case len(deniedBy) > 0:
		return false, "denied by " + strings.Join(deniedBy, ", ")
	case len(allowedBy) > 0:
		return true, "allowed by " + strings.Join(allowedBy, ", ")
	default:
		return false, "no rule allows"
	}
}

// protects reports whether the endpoint lists one of the policy's attachGroups.
func (r *fwReference) protects(pol, ep *nimbusv1.Object) bool {
	for _, g := range pol.GetNetworkSecurityPolicy().GetAttachGroups() {
		for _, mine := range ep.GetEndpoint().GetSecurityGroups() {
			if g == mine {
				return true
			}
		}
	}
	return false
}

// ruleMatches reports whether the rule of the policy matches the peer, the protocol and
// the destination port.
func (r *fwReference) ruleMatches(pol *nimbusv1.Object, rule *nimbusv1.PolicyRule, peer netip.Addr, proto string, port uint16) bool {
	if rule.GetProtocol() != "" && rule.GetProtocol() != proto {
		return false
	}
	if len(rule.GetPorts()) > 0 {
		if proto != "tcp" && proto != "udp" {
			return false
		}
		inPorts := false
		for _, ports := range rule.GetPorts() {
			lo, hi := parsePortRange(ports)
			if lo <= port && port <= hi {
				inPorts = true
			}
		}
		if !inPorts {
			return false
		}
	}
	groups := append(append([]string{}, rule.GetFromGroups()...), rule.GetToGroups()...)
	cidrs := append(append([]string{}, rule.GetFromCidrs()...), rule.GetToCidrs()...)
	if len(groups) == 0 && len(cidrs) == 0 {
		return true
	}
	for _, c := range cidrs {
		if inCIDR(c, peer) {
			return true
		}
	}
	for _, g := range groups {
		if r.inGroup(pol, g, peer) {
			return true
		}
	}
	return false
}

// inGroup reports whether the address belongs to the group named in the object's tenant
// and namespace: an endpoint there lists the group and has the address, or the address
// is in one of the group's cidrs.
func (r *fwReference) inGroup(in *nimbusv1.Object, group string, addr netip.Addr) bool {
	for _, ep := range r.endpoints {
		if !sameScope(ep, in) {
			continue
		}
		listed := false
		for _, g := range ep.GetEndpoint().GetSecurityGroups() {
			if g == group {
				listed = true
			}
		}
		if !listed {
			continue
		}
		for _, ip := range ep.GetEndpoint().GetIps() {
			if a, err := netip.ParseAddr(ip); err == nil && a == addr {
				return true
			}
		}
	}
	for _, sg := range r.groups {
		if !sameScope(sg, in) || sg.GetMeta().GetName() != group {
			continue
		}
		for _, c := range sg.GetSecurityGroup().GetCidrs() {
			if inCIDR(c, addr) {
				return true
			}
		}
	}
	return false
}

// sameScope reports whether two objects are in the same tenant and namespace.
func sameScope(a, b *nimbusv1.Object) bool {
	ka, kb := a.Key(), b.Key()
	return ka.GetTenant() == kb.GetTenant() && ka.GetNamespace() == kb.GetNamespace()
}

// inCIDR reports whether the address is in the prefix; a prefix that does not parse
// holds nothing.
func inCIDR(cidr string, addr netip.Addr) bool {
	p, err := netip.ParsePrefix(cidr)
	return err == nil && p.Contains(addr)
}

// parsePortRange parses "80" or "8000-8080"; a malformed one is the empty range 1-0.
func parsePortRange(s string) (lo, hi uint16) {
	l, h, isRange := strings.Cut(s, "-")
	if !isRange {
		h = l
	}
	a, errA := strconv.ParseUint(l, 10, 16)
	b, errB := strconv.ParseUint(h, 10, 16)
	if errA != nil || errB != nil {
		return 1, 0
	}
	return uint16(a), uint16(b)
}

// Builders of the objects the firewall tests use.

// fwEndpointObject is an Endpoint of the default tenant in network net, on the node,
// with the host-side interface named after it.
func fwEndpointObject(name, network, node, mac string, ips []string, groups ...string) *nimbusv1.Object {
	return &nimbusv1.Object{
		Meta: &nimbusv1.ObjectMeta{Name: name},
		Spec: &nimbusv1.Object_Endpoint{Endpoint: &nimbusv1.EndpointSpec{
			Network: network, Node: node, Interface: name, Mac: mac, Ips: ips, SecurityGroups: groups,
		}},
	}
}

// fwGroupObject is a SecurityGroup of the default tenant with the CIDRs as members.
func fwGroupObject(name string, cidrs ...string) *nimbusv1.Object {
	return &nimbusv1.Object{
		Meta: &nimbusv1.ObjectMeta{Name: name},
		Spec: &nimbusv1.Object_SecurityGroup{SecurityGroup: &nimbusv1.SecurityGroupSpec{Cidrs: cidrs}},
	}
}

// fwPolicyObject is a NetworkSecurityPolicy of the default tenant.
func fwPolicyObject(name string, attach []string, ingress, egress []*nimbusv1.PolicyRule) *nimbusv1.Object {
	return &nimbusv1.Object{
		Meta: &nimbusv1.ObjectMeta{Name: name},
		Spec: &nimbusv1.Object_NetworkSecurityPolicy{NetworkSecurityPolicy: &nimbusv1.NetworkSecurityPolicySpec{
			AttachGroups: attach, Ingress: ingress, Egress: egress,
		}},
	}
}

// withTenant sets the object's tenant and returns it.
func withTenant(tenant string, o *nimbusv1.Object) *nimbusv1.Object {
	o.Meta.Tenant = tenant
	return o
}

// withNamespace sets the object's namespace and returns it.
func withNamespace(namespace string, o *nimbusv1.Object) *nimbusv1.Object {
	o.Meta.Namespace = namespace
	return o
}

// fwRule is a policy rule; peers are given as "group:NAME" for a group and as a CIDR
// otherwise, and go to fromGroups/fromCidrs for ingress rules (from is set) and to
// toGroups/toCidrs for egress rules.
func fwRule(action nimbusv1.PolicyRule_Action, from bool, proto string, ports []string, peers ...string) *nimbusv1.PolicyRule {
	r := &nimbusv1.PolicyRule{Action: action, Protocol: proto, Ports: ports}
	for _, p := range peers {
		group, isGroup := strings.CutPrefix(p, "group:")
		switch {
		case isGroup && from:
			r.FromGroups = append(r.FromGroups, group)
		case isGroup:
			r.ToGroups = append(r.ToGroups, group)
		case from:
			r.FromCidrs = append(r.FromCidrs, p)
		default:
			r.ToCidrs = append(r.ToCidrs, p)
		}
	}
	return r
}

// allowIn is an ingress rule that allows; see fwRule.
func allowIn(proto string, ports []string, peers ...string) *nimbusv1.PolicyRule {
	return fwRule(nimbusv1.PolicyRule_ACTION_ALLOW, true, proto, ports, peers...)
}

// denyIn is an ingress rule that denies; see fwRule.
func denyIn(proto string, ports []string, peers ...string) *nimbusv1.PolicyRule {
	return fwRule(nimbusv1.PolicyRule_ACTION_DENY, true, proto, ports, peers...)
}

// allowOut is an egress rule that allows; see fwRule.
func allowOut(proto string, ports []string, peers ...string) *nimbusv1.PolicyRule {
	return fwRule(nimbusv1.PolicyRule_ACTION_ALLOW, false, proto, ports, peers...)
}

// denyOut is an egress rule that denies; see fwRule.
func denyOut(proto string, ports []string, peers ...string) *nimbusv1.PolicyRule {
	return fwRule(nimbusv1.PolicyRule_ACTION_DENY, false, proto, ports, peers...)
}

// fwRules is a shorthand for a list of rules.
func fwRules(r ...*nimbusv1.PolicyRule) []*nimbusv1.PolicyRule { return r }

// fwPorts is a shorthand for a list of ports.
func fwPorts(p ...string) []string { return p }

// TestFirewallReference checks the reference evaluator on cases worked out by hand, one
// property of the semantics each.
func TestFirewallReference(t *testing.T) {
	// a and b are in group web, c in group db, d in no group; x is no endpoint. Tenant acme
	// has an endpoint at a's address and one at 10.0.0.5, both in its own group web;
	// namespace other of the default tenant has one at 10.0.0.6 in its own group web.
	const (
		a, b, c, d, x = "10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4", "10.9.9.9"
		a6, c6        = "fd00::1", "fd00::3"
	)
	endpoints := []*nimbusv1.Object{
		fwEndpointObject("a", "n", "h1", "02:00:00:00:00:01", []string{a, a6}, "web"),
		fwEndpointObject("b", "n", "h2", "02:00:00:00:00:02", []string{b}, "web"),
		fwEndpointObject("c", "n", "h1", "02:00:00:00:00:03", []string{c, c6}, "db"),
		fwEndpointObject("d", "n", "h2", "02:00:00:00:00:04", []string{d}),
		withTenant("acme", fwEndpointObject("acme-a", "n", "h1", "02:00:00:00:00:05", []string{a}, "web")),
		withTenant("acme", fwEndpointObject("acme-e", "n", "h1", "02:00:00:00:00:07", []string{"10.0.0.5"}, "web")),
		withNamespace("other", fwEndpointObject("other-b", "n", "h1", "02:00:00:00:00:06", []string{"10.0.0.6"}, "web")),
	}
	groups := []*nimbusv1.Object{fwGroupObject("web"), fwGroupObject("db", "10.0.0.4/32"), fwGroupObject("ops", "10.9.0.0/16")}

	type probe struct {
		tenant, src, dst, proto string
		port                    uint16
		want                    bool
	}
	for _, tc := range []struct {
		name     string
		policies []*nimbusv1.Object
		probes   []probe
	}{{
		name: "no policy: everything open",
		probes: []probe{
			{"", a, c, "tcp", 22, true}, {"", c, a, "udp", 53, true}, {"", d, x, "icmp", 0, true}, {"", x, a, "tcp", 1, true},
		},
	}, {
		name: "ingress allow by group and port: only that passes, egress stays open",
		policies: []*nimbusv1.Object{fwPolicyObject("p", []string{"db"},
			fwRules(allowIn("tcp", fwPorts("5432"), "group:web")), nil)},
		probes: []probe{
			{"", a, c, "tcp", 5432, true},
			{"", b, c, "tcp", 5432, true},
			{"", a, c, "tcp", 5433, false}, // another port
			{"", a, c, "udp", 5432, false}, // another protocol
			{"", d, c, "tcp", 5432, false}, // d is not in web
			{"", x, c, "tcp", 5432, false}, // neither is x
			{"", a6, c6, "tcp", 5432, true},
			{"", c, a, "tcp", 22, true}, // c's egress: no egress rules
			{"", c, x, "icmp", 0, true},
			{"", a, b, "tcp", 22, true}, // b is not protected
		},
	}, {
		name: "egress rules only: ingress stays open",
		policies: []*nimbusv1.Object{fwPolicyObject("p", []string{"web"},
			nil, fwRules(allowOut("udp", fwPorts("53"), "10.0.0.0/30")))},
		probes: []probe{
			{"", a, c, "udp", 53, true},  // 10.0.0.3 in 10.0.0.0/30
			{"", a, d, "udp", 53, false}, // 10.0.0.4 is not
			{"", a, c, "udp", 54, false},
			{"", a, c, "tcp", 53, false},
			{"", d, a, "tcp", 80, true}, // a's ingress is open
			{"", a6, c6, "udp", 53, false},
		},
	}, {
		name: "deny beats allow, across policies and in either order",
		policies: []*nimbusv1.Object{
			fwPolicyObject("allow-all", []string{"db"}, fwRules(allowIn("", nil)), nil),
			fwPolicyObject("deny-web", []string{"db"}, fwRules(denyIn("tcp", fwPorts("8000-8080"), "group:web"), allowIn("tcp", fwPorts("8080"))), nil),
		},
		probes: []probe{
			{"", a, c, "tcp", 8080, false},
			{"", a, c, "tcp", 7999, true},
			{"", a, c, "tcp", 8081, true},
			{"", d, c, "tcp", 8080, true},
			{"", a, c, "icmp", 0, true},
		},
	}, {
		name: "group CIDR members and empty-protocol rules",
		policies: []*nimbusv1.Object{fwPolicyObject("p", []string{"web"},
			fwRules(allowIn("", nil, "group:db"), allowIn("icmp", nil, "group:ops")), nil)},
		probes: []probe{
			{"", d, a, "tcp", 1234, true}, // d is in db by its CIDR
			{"", c, a, "udp", 9, true},    // c lists db
			{"", c6, a6, "icmp", 0, true}, // and its IPv6 address is c's
			{"", "10.9.1.1", a, "icmp", 0, true},
			{"", "10.9.1.1", a, "tcp", 80, false},
			{"", b, a, "icmp", 0, false},
		},
	}, {
		name: "ports rules never match icmp; icmp means both families",
		policies: []*nimbusv1.Object{fwPolicyObject("p", []string{"db"},
			fwRules(allowIn("tcp", fwPorts("1-65535")), allowIn("icmp", nil, "fd00::/64")), nil)},
		probes: []probe{
			{"", a, c, "icmp", 0, false},
			{"", a6, c6, "icmp", 0, true},
			{"", a, c, "tcp", 65535, true},
			{"", a, c, "udp", 1, false},
		},
	}, {
		name: "both ends are checked",
		policies: []*nimbusv1.Object{
			fwPolicyObject("web-out", []string{"web"}, nil, fwRules(allowOut("tcp", fwPorts("80", "443")))),
			fwPolicyObject("db-in", []string{"db"}, fwRules(allowIn("tcp", fwPorts("443", "5432"))), nil),
		},
		probes: []probe{
			{"", a, c, "tcp", 443, true},
			{"", a, c, "tcp", 80, false},   // c's ingress
			{"", a, c, "tcp", 5432, false}, // a's egress
			{"", a, d, "tcp", 80, true},
			{"", x, c, "tcp", 5432, true}, // no sender to check
			{"", a, x, "tcp", 443, true},  // no receiver to check
		},
	}, {
		name: "deny-only ingress denies everything",
		policies: []*nimbusv1.Object{fwPolicyObject("p", []string{"db"},
			fwRules(denyIn("udp", nil, "group:web")), nil)},
		probes: []probe{
			{"", a, c, "udp", 53, false},
			{"", d, c, "tcp", 80, false},
		},
	}, {
		name: "policies and groups stay in their tenant and namespace",
		policies: []*nimbusv1.Object{
			// acme's policy on acme's web does not protect the default tenant's a.
			withTenant("acme", fwPolicyObject("p", []string{"web"}, fwRules(denyIn("", nil)), nil)),
			// The default tenant's policy on db allows from web: acme's endpoint at a's
			// address is in acme's web, not in this one; other-b in namespace other's.
			fwPolicyObject("q", []string{"db"}, fwRules(allowIn("", nil, "group:web")), nil),
			// A policy in namespace other attached to web protects other-b only.
			withNamespace("other", fwPolicyObject("r", []string{"web"}, fwRules(allowIn("tcp", fwPorts("1"))), nil)),
		},
		probes: []probe{
			{"", d, a, "tcp", 80, true},
			{"acme", d, a, "tcp", 80, false}, // to acme-a, in tenant acme
			{"", a, c, "tcp", 80, true},
			{"", "10.0.0.5", c, "tcp", 80, false}, // acme-e is in acme's web only
			{"", "10.0.0.6", c, "tcp", 80, false}, // other-b is in namespace other's web only
			{"", d, "10.0.0.6", "tcp", 80, false},
			{"", d, "10.0.0.6", "tcp", 1, true},
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			objs := append(append(append([]*nimbusv1.Object{}, endpoints...), groups...), tc.policies...)
			for _, o := range objs {
				if err := o.Validate(); err != nil {
					t.Fatalf("%s: %v", o.Key().ID(), err)
				}
			}
			ref := newFWReference(objs)
			for _, p := range tc.probes {
				pkt := fwPacket{tenant: p.tenant, src: netip.MustParseAddr(p.src), dst: netip.MustParseAddr(p.dst), proto: p.proto, port: p.port}
				if got, why := ref.delivered(pkt); got != p.want {
					t.Errorf("tenant %q %v: delivered = %v (%s), want %v", p.tenant, pkt, got, why, p.want)
				}
			}
		})
	}
}
