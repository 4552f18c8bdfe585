package fwbpf

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/naplesnet/naples/hal/firewall"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// This file runs the semantics of docs/firewall.md end to end: objects built with the
// nimbus types are compiled by firewall.Compile, installed as the agent installs them
// (the snapshot and a counter for each of its rules and endpoints), and packets run
// through the real program, whose verdicts and counters are checked against a table
// written by hand.

// Directions of a scenario's packets, seen from the local endpoint.
const (
	// toEP is a packet to the endpoint: its ingress, run through fw_egress.
	toEP = firewall.DirIngress
	// fromEP is a packet from the endpoint: its egress, run through fw_ingress.
	fromEP = firewall.DirEgress
)

// roles are the addresses of the scenarios by name, IPv4 and IPv6. The objects of a
// scenario name both (an endpoint has one address of each family); its packets use the
// address of the family under test.
var roles = map[string][2]string{
	"A":    {"10.0.0.2", "fd00::2"},     // acme/web, local on interface A
	"B":    {"10.0.0.3", "fd00::3"},     // acme/db, local on interface B
	"app1": {"10.0.1.1", "fd00:1::1"},   // acme/app1, in group app
	"ops1": {"10.0.1.2", "fd00:1::2"},   // acme/ops1, in group ops
	"lab1": {"10.0.2.2", "fd00:2::2"},   // acme/lab1, in group lab (when a scenario has it)
	"dev1": {"10.0.8.1", "fd00:8::1"},   // acme/dev/dev1: namespace dev, its group app
	"gapp": {"10.0.9.1", "fd00:9::1"},   // globex/gapp, in globex's group app
	"gnet": {"10.0.10.5", "fd00:10::5"}, // inside globex's group app's CIDR

	"corp":    {"192.168.1.1", "fd10:0:1::1"},        // inside corpCIDRs only
	"lab":     {"192.168.7.9", "fd10:0:7::9"},        // inside labCIDRs (inside corpCIDRs)
	"lab25":   {"192.168.7.200", "fd10:0:7:8000::9"}, // inside lab25CIDRs (inside labCIDRs)
	"outside": {"192.169.0.1", "fd11::1"},            // just outside corpCIDRs

	"world":  {"192.0.2.7", "2001:db8::7"},     // inside docCIDRs and doc28CIDRs
	"world2": {"192.0.2.100", "2001:db8::100"}, // inside docCIDRs only
	"mcast":  {"224.0.0.22", "ff02::16"},       // the group of IGMP and MLD reports
}

// CIDRs of the scenarios, an IPv4 and an IPv6 prefix each, nested as their names say.
var (
	corpCIDRs  = []string{"192.168.0.0/16", "fd10::/32"}
	labCIDRs   = []string{"192.168.7.0/24", "fd10:0:7::/48"}
	lab25CIDRs = []string{"192.168.7.128/25", "fd10:0:7:8000::/49"}
	docCIDRs   = []string{"192.0.2.0/24", "2001:db8::/32"}
	doc28CIDRs = []string{"192.0.2.0/28", "2001:db8::/124"}
	gnetCIDRs  = []string{"10.0.10.0/24", "fd00:10::/64"}
)

// splitKey returns the tenant, namespace and name of "tenant/name" or
// "tenant/namespace/name".
func splitKey(key string) (tenant, namespace, name string) {
	p := strings.Split(key, "/")
	if len(p) == 3 {
		return p[0], p[1], p[2]
	}
	return p[0], "", p[1]
}

// meta returns the metadata of the object "tenant[/namespace]/name".
func meta(key string) *nimbusv1.ObjectMeta {
	tenant, namespace, name := splitKey(key)
	return &nimbusv1.ObjectMeta{Tenant: tenant, Namespace: namespace, Name: name}
}

// epObj returns the Endpoint "tenant[/namespace]/name" with both addresses of the role,
// listing the security groups.
func epObj(key, role string, groups ...string) *nimbusv1.Object {
	a := roles[role]
	return &nimbusv1.Object{
		Meta: meta(key),
		Spec: &nimbusv1.Object_Endpoint{Endpoint: &nimbusv1.EndpointSpec{
			Network: "net", Interface: "veth-" + role, Ips: []string{a[0], a[1]}, SecurityGroups: groups,
		}},
	}
}

// groupObj returns the SecurityGroup "tenant[/namespace]/name" with the CIDRs.
func groupObj(key string, cidrs ...[]string) *nimbusv1.Object {
	var all []string
	for _, c := range cidrs {
		all = append(all, c...)
	}
	return &nimbusv1.Object{
		Meta: meta(key),
		Spec: &nimbusv1.Object_SecurityGroup{SecurityGroup: &nimbusv1.SecurityGroupSpec{Cidrs: all}},
	}
}

// ruleSpec is a rule as the table writes it, before it knows its direction.
type ruleSpec struct {
	action nimbusv1.PolicyRule_Action
	proto  string
	// ports are comma-separated ports and ranges, "" for all.
	ports string
	// peers are group names, and CIDRs (with a '/'); none means any peer.
	peers []string
}

// allow returns an ALLOW rule of the protocol, ports and peers (names of groups, or
// CIDR lists).
func allow(proto, ports string, peers ...any) ruleSpec {
	return ruleSpec{nimbusv1.PolicyRule_ACTION_ALLOW, proto, ports, peerList(peers)}
}

// deny returns a DENY rule, as allow does.
func deny(proto, ports string, peers ...any) ruleSpec {
	return ruleSpec{nimbusv1.PolicyRule_ACTION_DENY, proto, ports, peerList(peers)}
}

// peerList flattens group names (string) and CIDR lists ([]string).
func peerList(peers []any) []string {
	var out []string
	for _, p := range peers {
		switch p := p.(type) {
		case string:
			out = append(out, p)
		case []string:
			out = append(out, p...)
		default:
			panic(fmt.Sprintf("peer %v of type %T", p, p))
		}
	}
	return out
}

// policyObj returns the NetworkSecurityPolicy "tenant[/namespace]/name" attached to the
// groups. The peers of its ingress rules go to fromGroups and fromCidrs, those of its
// egress rules to toGroups and toCidrs.
func policyObj(key string, attach []string, ingress, egress []ruleSpec) *nimbusv1.Object {
	convert := func(r ruleSpec, in bool) *nimbusv1.PolicyRule {
		pr := &nimbusv1.PolicyRule{Action: r.action, Protocol: r.proto}
		if r.ports != "" {
			pr.Ports = strings.Split(r.ports, ",")
		}
		for _, p := range r.peers {
			switch cidr := strings.Contains(p, "/"); {
			case cidr && in:
				pr.FromCidrs = append(pr.FromCidrs, p)
			case cidr:
				pr.ToCidrs = append(pr.ToCidrs, p)
			case in:
				pr.FromGroups = append(pr.FromGroups, p)
			default:
				pr.ToGroups = append(pr.ToGroups, p)
			}
		}
		return pr
	}
	spec := &nimbusv1.NetworkSecurityPolicySpec{AttachGroups: attach}
	for _, r := range ingress {
		spec.Ingress = append(spec.Ingress, convert(r, true))
	}
	for _, r := range egress {
		spec.Egress = append(spec.Egress, convert(r, false))
	}
	return &nimbusv1.Object{Meta: meta(key), Spec: &nimbusv1.Object_NetworkSecurityPolicy{NetworkSecurityPolicy: spec}}
}

// rules is shorthand for a list of rules.
func rules(r ...ruleSpec) []ruleSpec { return r }

// groups is shorthand for a list of group names.
func groups(g ...string) []string { return g }

// withBase returns the endpoints every scenario has, then the objects: acme/web (local
// on interface A) in group web, acme/db (local on B unless the scenario says otherwise)
// in group db, acme/app1 in group app and acme/ops1 in group ops, the last two on
// other nodes.
func withBase(objs ...*nimbusv1.Object) []*nimbusv1.Object {
	return append([]*nimbusv1.Object{
		epObj("acme/web", "A", "web"),
		epObj("acme/db", "B", "db"),
		epObj("acme/app1", "app1", "app"),
		epObj("acme/ops1", "ops1", "ops"),
	}, objs...)
}

// step is one packet of a scenario and what the semantics make of it.
type step struct {
	// ep is the local endpoint, "A" or "B": the one on the fixture's interface A or B.
	ep string
	// dir is toEP or fromEP.
	dir uint8
	// peer is the role of the other end's address.
	peer string
	// kind is the packet: "tcp", "udp", "echo" (request), "echo-reply", "gre", an ICMP
	// error carrying embed ("unreachable", "too-big", "time-exceeded",
	// "parameter-problem"), or link control
	// traffic: "arp" (no IP), "igmp" (IPv4), "nd" (neighbour solicitation), "mld"
	// (an MLDv2 report) and "hop-by-hop" (an MLDv2 report behind a hop-by-hop header), the last three
	// IPv6.
	kind string
	// sport and dport are the TCP or UDP ports of the packet. A zero sport is a source
	// port of the step's own (30000 + its position), so that unrelated steps are never
	// one connection.
	sport, dport uint16
	// flags are the TCP flags; none means SYN.
	flags uint8
	// id is the id of an echo request or reply; zero for a request means one of the
	// step's own.
	id uint16
	// embed is the packet an ICMP error carries, seen from the same endpoint, its ports
	// as written.
	embed *step
	// only, 4 or 6, runs the step in that family only.
	only int
	// allow is the verdict: TCX_NEXT when true, TCX_DROP otherwise.
	allow bool
	// rule is the rule whose counter counts the packet, "[tenant/]policy/direction/index"
	// (tenant acme unless named), or "" for none.
	rule string
}

// phase is a set of objects and the packets run through the snapshot compiled from it.
type phase struct {
	objects []*nimbusv1.Object
	steps   []step
	// cut is the number of connections the program has deleted since the scenario began
	// because a new snapshot denied them (fw_stats ct_deleted).
	cut uint64
}

// scenario is a row of TestCompiledSemantics: it names the rule of the semantics it
// shows, and its phases, each compiled and installed in turn.
type scenario struct {
	name string
	// b is the key of the endpoint local on interface B; "" means acme/db.
	b      string
	phases []phase
}

// compiledScenarios are the rows of TestCompiledSemantics: every rule of the Semantics
// section of docs/firewall.md.
var compiledScenarios = []scenario{{
	name: "an endpoint no policy protects is open",
	phases: []phase{{
		// A policy attached to a group no local endpoint lists protects none.
		objects: withBase(policyObj("acme/elsewhere", groups("nobody"), rules(deny("", "")), rules(deny("", "")))),
		steps: []step{
			{ep: "A", dir: fromEP, peer: "world", kind: "tcp", dport: 22, allow: true},
			{ep: "A", dir: toEP, peer: "world", kind: "tcp", dport: 22, allow: true},
			{ep: "A", dir: toEP, peer: "world", kind: "echo", allow: true},
			{ep: "A", dir: fromEP, peer: "app1", kind: "udp", dport: 53, allow: true},
			{ep: "A", dir: fromEP, peer: "world", kind: "gre", allow: true},
			{ep: "B", dir: toEP, peer: "ops1", kind: "tcp", dport: 5432, allow: true},
			{ep: "B", dir: fromEP, peer: "A", kind: "udp", dport: 9, allow: true},
		},
	}},
}, {
	name: "a policy protects the local endpoints that list one of its attachGroups, only those",
	phases: []phase{{
		objects: withBase(policyObj("acme/web-in", groups("frontend", "web"), rules(allow("tcp", "80", "app")), nil)),
		steps: []step{
			{ep: "A", dir: toEP, peer: "app1", kind: "tcp", dport: 80, allow: true, rule: "web-in/ingress/0"},
			{ep: "A", dir: toEP, peer: "app1", kind: "tcp", dport: 81},
			{ep: "A", dir: toEP, peer: "world", kind: "tcp", dport: 80},
			{ep: "B", dir: toEP, peer: "app1", kind: "tcp", dport: 81, allow: true}, // db is not attached
			{ep: "B", dir: toEP, peer: "world", kind: "gre", allow: true},
		},
	}},
}, {
	name: "a protected direction denies what no rule allows, the other direction stays open",
	phases: []phase{{
		objects: withBase(
			policyObj("acme/web-in", groups("web"), rules(allow("tcp", "80", "app")), nil),
			policyObj("acme/db-out", groups("db"), nil, rules(allow("udp", "53"))),
		),
		steps: []step{
			{ep: "A", dir: toEP, peer: "app1", kind: "tcp", dport: 80, allow: true, rule: "web-in/ingress/0"},
			{ep: "A", dir: toEP, peer: "ops1", kind: "tcp", dport: 80},
			{ep: "A", dir: toEP, peer: "world", kind: "udp", dport: 53},
			{ep: "A", dir: fromEP, peer: "world", kind: "tcp", dport: 443, allow: true},
			{ep: "A", dir: fromEP, peer: "ops1", kind: "gre", allow: true},
			{ep: "B", dir: fromEP, peer: "world", kind: "udp", dport: 53, allow: true, rule: "db-out/egress/0"},
			{ep: "B", dir: fromEP, peer: "world", kind: "tcp", dport: 443},
			{ep: "B", dir: fromEP, peer: "app1", kind: "echo"},
			{ep: "B", dir: toEP, peer: "world", kind: "tcp", dport: 5432, allow: true},
		},
	}},
}, {
	name: "a peer is in a group when its address is an address of an endpoint listing the group",
	phases: []phase{{
		objects: withBase(policyObj("acme/web", groups("web"),
			rules(allow("tcp", "80", "app")),
			rules(allow("tcp", "5432", "db"), allow("udp", "53", "ops")))),
		steps: []step{
			{ep: "A", dir: toEP, peer: "app1", kind: "tcp", dport: 80, allow: true, rule: "web/ingress/0"},
			{ep: "A", dir: toEP, peer: "ops1", kind: "tcp", dport: 80},
			{ep: "A", dir: toEP, peer: "world", kind: "tcp", dport: 80},
			{ep: "A", dir: fromEP, peer: "B", kind: "tcp", dport: 5432, allow: true, rule: "web/egress/0"},
			{ep: "A", dir: fromEP, peer: "app1", kind: "tcp", dport: 5432},
			{ep: "A", dir: fromEP, peer: "ops1", kind: "udp", dport: 53, allow: true, rule: "web/egress/1"},
			{ep: "A", dir: fromEP, peer: "app1", kind: "udp", dport: 53},
		},
	}},
}, {
	name: "a peer is in a group when it lies inside one of its CIDRs, the longest prefix giving all nested groups",
	phases: []phase{{
		objects: withBase(
			epObj("acme/lab1", "lab1", "lab"),
			groupObj("acme/corp", corpCIDRs),
			groupObj("acme/lab", labCIDRs),
			policyObj("acme/ssh", groups("web"), rules(
				allow("tcp", "22", "corp"),
				deny("tcp", "22", "lab"),
				allow("tcp", "443", "corp"),
			), nil),
		),
		steps: []step{
			{ep: "A", dir: toEP, peer: "corp", kind: "tcp", dport: 22, allow: true, rule: "ssh/ingress/0"},
			{ep: "A", dir: toEP, peer: "lab", kind: "tcp", dport: 22, rule: "ssh/ingress/1"},
			{ep: "A", dir: toEP, peer: "lab", kind: "tcp", dport: 443, allow: true, rule: "ssh/ingress/2"}, // lab lies in corp
			{ep: "A", dir: toEP, peer: "lab1", kind: "tcp", dport: 22, rule: "ssh/ingress/1"},              // lab by its endpoint
			{ep: "A", dir: toEP, peer: "lab1", kind: "tcp", dport: 443},                                    // but not in corp
			{ep: "A", dir: toEP, peer: "outside", kind: "tcp", dport: 22},
			{ep: "A", dir: toEP, peer: "outside", kind: "tcp", dport: 443},
		},
	}},
}, {
	name: "a rule's fromCidrs and toCidrs match peers inside them, by longest prefix among nested ones",
	phases: []phase{{
		objects: withBase(
			groupObj("acme/corp", corpCIDRs),
			groupObj("acme/lab", labCIDRs),
			policyObj("acme/net", groups("web"),
				rules(allow("udp", "53", lab25CIDRs), allow("tcp", "443", "corp")),
				rules(allow("tcp", "443", docCIDRs), deny("tcp", "443", doc28CIDRs))),
		),
		steps: []step{
			{ep: "A", dir: toEP, peer: "lab25", kind: "udp", dport: 53, allow: true, rule: "net/ingress/0"},
			{ep: "A", dir: toEP, peer: "lab", kind: "udp", dport: 53},
			{ep: "A", dir: toEP, peer: "corp", kind: "udp", dport: 53},
			{ep: "A", dir: toEP, peer: "lab25", kind: "tcp", dport: 443, allow: true, rule: "net/ingress/1"}, // and in corp
			{ep: "A", dir: fromEP, peer: "world2", kind: "tcp", dport: 443, allow: true, rule: "net/egress/0"},
			{ep: "A", dir: fromEP, peer: "world", kind: "tcp", dport: 443, rule: "net/egress/1"},
			{ep: "A", dir: fromEP, peer: "outside", kind: "tcp", dport: 443},
		},
	}},
}, {
	name: "a rule with no groups and no CIDRs matches any peer",
	phases: []phase{{
		objects: withBase(policyObj("acme/any", groups("web"), rules(allow("tcp", "443"), allow("tcp", "80", "app")), nil)),
		steps: []step{
			{ep: "A", dir: toEP, peer: "world", kind: "tcp", dport: 443, allow: true, rule: "any/ingress/0"},
			{ep: "A", dir: toEP, peer: "app1", kind: "tcp", dport: 443, allow: true, rule: "any/ingress/0"},
			{ep: "A", dir: toEP, peer: "corp", kind: "tcp", dport: 443, allow: true, rule: "any/ingress/0"},
			{ep: "A", dir: toEP, peer: "world", kind: "tcp", dport: 80},
			{ep: "A", dir: toEP, peer: "app1", kind: "tcp", dport: 80, allow: true, rule: "any/ingress/1"},
		},
	}},
}, {
	name: "DENY beats ALLOW across two policies",
	phases: []phase{{
		objects: withBase(
			policyObj("acme/allow-all", groups("web"), rules(allow("tcp", "")), nil),
			policyObj("acme/block", groups("web"), rules(deny("tcp", "23"), deny("tcp", "", "ops")), nil),
		),
		steps: []step{
			{ep: "A", dir: toEP, peer: "world", kind: "tcp", dport: 22, allow: true, rule: "allow-all/ingress/0"},
			{ep: "A", dir: toEP, peer: "app1", kind: "tcp", dport: 80, allow: true, rule: "allow-all/ingress/0"},
			{ep: "A", dir: toEP, peer: "world", kind: "tcp", dport: 23, rule: "block/ingress/0"},
			{ep: "A", dir: toEP, peer: "app1", kind: "tcp", dport: 23, rule: "block/ingress/0"},
			{ep: "A", dir: toEP, peer: "ops1", kind: "tcp", dport: 80, rule: "block/ingress/1"},
			{ep: "A", dir: toEP, peer: "world", kind: "udp", dport: 22},
		},
	}},
}, {
	name: "DENY beats ALLOW within one policy, whatever the order: overlapping port ranges",
	phases: []phase{{
		objects: withBase(policyObj("acme/web", groups("web"), rules(
			allow("tcp", "8000-8100"),
			deny("tcp", "8080"),
			deny("udp", "9000"),
			allow("udp", "8990-9010"),
		), nil)),
		steps: []step{
			{ep: "A", dir: toEP, peer: "world", kind: "tcp", dport: 7999},
			{ep: "A", dir: toEP, peer: "world", kind: "tcp", dport: 8000, allow: true, rule: "web/ingress/0"},
			{ep: "A", dir: toEP, peer: "world", kind: "tcp", dport: 8079, allow: true, rule: "web/ingress/0"},
			{ep: "A", dir: toEP, peer: "world", kind: "tcp", dport: 8080, rule: "web/ingress/1"},
			{ep: "A", dir: toEP, peer: "world", kind: "tcp", dport: 8081, allow: true, rule: "web/ingress/0"},
			{ep: "A", dir: toEP, peer: "world", kind: "tcp", dport: 8100, allow: true, rule: "web/ingress/0"},
			{ep: "A", dir: toEP, peer: "world", kind: "tcp", dport: 8101},
			{ep: "A", dir: toEP, peer: "world", kind: "udp", dport: 8990, allow: true, rule: "web/ingress/3"},
			{ep: "A", dir: toEP, peer: "world", kind: "udp", dport: 9000, rule: "web/ingress/2"},
			{ep: "A", dir: toEP, peer: "world", kind: "udp", dport: 9010, allow: true, rule: "web/ingress/3"},
			{ep: "A", dir: toEP, peer: "world", kind: "udp", dport: 9011},
		},
	}},
}, {
	name: "protocols tcp, udp, icmp and any; ports are destination ports, single or ranges, none meaning all",
	phases: []phase{{
		objects: withBase(policyObj("acme/proto", groups("web"),
			rules(
				allow("tcp", "80", "app"),
				allow("udp", "53,5000-5010", "app"),
				allow("icmp", "", "app"),
				allow("", "", "ops"),
			),
			rules(allow("udp", "")))),
		steps: []step{
			{ep: "A", dir: toEP, peer: "app1", kind: "tcp", dport: 80, allow: true, rule: "proto/ingress/0"},
			{ep: "A", dir: toEP, peer: "app1", kind: "tcp", dport: 53},
			{ep: "A", dir: toEP, peer: "app1", kind: "tcp", sport: 80, dport: 40000}, // a source port is no destination port
			{ep: "A", dir: toEP, peer: "app1", kind: "udp", dport: 53, allow: true, rule: "proto/ingress/1"},
			{ep: "A", dir: toEP, peer: "app1", kind: "udp", dport: 4999},
			{ep: "A", dir: toEP, peer: "app1", kind: "udp", dport: 5000, allow: true, rule: "proto/ingress/1"},
			{ep: "A", dir: toEP, peer: "app1", kind: "udp", dport: 5010, allow: true, rule: "proto/ingress/1"},
			{ep: "A", dir: toEP, peer: "app1", kind: "udp", dport: 5011},
			{ep: "A", dir: toEP, peer: "app1", kind: "echo", allow: true, rule: "proto/ingress/2"},
			{ep: "A", dir: toEP, peer: "app1", kind: "gre"},
			{ep: "A", dir: toEP, peer: "ops1", kind: "gre", allow: true, rule: "proto/ingress/3"},
			{ep: "A", dir: toEP, peer: "ops1", kind: "tcp", dport: 9999, allow: true, rule: "proto/ingress/3"},
			{ep: "A", dir: toEP, peer: "ops1", kind: "udp", dport: 1, allow: true, rule: "proto/ingress/3"},
			{ep: "A", dir: toEP, peer: "ops1", kind: "echo", allow: true, rule: "proto/ingress/3"},
			{ep: "A", dir: fromEP, peer: "world", kind: "udp", dport: 1, allow: true, rule: "proto/egress/0"},
			{ep: "A", dir: fromEP, peer: "world", kind: "udp", dport: 65535, allow: true, rule: "proto/egress/0"},
			{ep: "A", dir: fromEP, peer: "world", kind: "tcp", dport: 80},
			{ep: "A", dir: fromEP, peer: "world", kind: "echo"},
		},
	}},
}, {
	name: "names are of the object's own tenant and namespace, peers are looked up in the endpoint's tenant",
	// Interface B holds globex's web: acme's web address, the same group names, a
	// policy of the same name.
	b: "globex/web",
	phases: []phase{{
		objects: withBase(
			epObj("globex/web", "A", "web"),
			epObj("globex/gapp", "gapp", "app"),
			epObj("globex/gops", "ops1", "app"), // acme/ops1's address
			groupObj("globex/app", gnetCIDRs),
			epObj("acme/dev/dev1", "dev1", "app"),
			policyObj("acme/web-in", groups("web"), rules(allow("tcp", "80", "app")), nil),
			policyObj("globex/web-in", groups("web"), rules(allow("tcp", "22", "app")), nil),
			// Attached to group web of namespace dev, which no endpoint lists.
			policyObj("acme/dev/web-in", groups("web"), rules(allow("tcp", "22")), nil),
		),
		steps: []step{
			{ep: "A", dir: toEP, peer: "app1", kind: "tcp", dport: 80, allow: true, rule: "web-in/ingress/0"},
			{ep: "A", dir: toEP, peer: "app1", kind: "tcp", dport: 22},
			{ep: "A", dir: toEP, peer: "gapp", kind: "tcp", dport: 80},
			{ep: "A", dir: toEP, peer: "ops1", kind: "tcp", dport: 80},
			{ep: "A", dir: toEP, peer: "gnet", kind: "tcp", dport: 80},
			{ep: "A", dir: toEP, peer: "dev1", kind: "tcp", dport: 80},
			{ep: "B", dir: toEP, peer: "gapp", kind: "tcp", dport: 22, allow: true, rule: "globex/web-in/ingress/0"},
			{ep: "B", dir: toEP, peer: "ops1", kind: "tcp", dport: 22, allow: true, rule: "globex/web-in/ingress/0"},
			{ep: "B", dir: toEP, peer: "gnet", kind: "tcp", dport: 22, allow: true, rule: "globex/web-in/ingress/0"},
			{ep: "B", dir: toEP, peer: "app1", kind: "tcp", dport: 22},
			{ep: "B", dir: toEP, peer: "app1", kind: "tcp", dport: 80},
			{ep: "B", dir: toEP, peer: "gapp", kind: "tcp", dport: 80},
		},
	}},
}, {
	name: "stateful: the later packets of an allowed connection pass in both directions, replies included",
	phases: []phase{{
		objects: withBase(policyObj("acme/web", groups("web"),
			rules(allow("tcp", "8080", "ops")),
			rules(allow("tcp", "80", "app"), allow("udp", "53", "app"), allow("icmp", "", "app")))),
		steps: []step{
			{ep: "A", dir: fromEP, peer: "app1", kind: "tcp", sport: 40000, dport: 80, allow: true, rule: "web/egress/0"},
			{ep: "A", dir: toEP, peer: "app1", kind: "tcp", sport: 80, dport: 40000, flags: tcpSYN | tcpACK, allow: true},
			{ep: "A", dir: fromEP, peer: "app1", kind: "tcp", sport: 40000, dport: 80, flags: tcpACK, allow: true, rule: "web/egress/0"},
			{ep: "A", dir: toEP, peer: "app1", kind: "tcp", sport: 80, dport: 40001}, // a new connection, not a reply
			{ep: "A", dir: toEP, peer: "app1", kind: "tcp", sport: 80, dport: 40000, flags: tcpFIN | tcpACK, allow: true},
			{ep: "A", dir: fromEP, peer: "app1", kind: "udp", sport: 40002, dport: 53, allow: true, rule: "web/egress/1"},
			{ep: "A", dir: toEP, peer: "app1", kind: "udp", sport: 53, dport: 40002, allow: true},
			{ep: "A", dir: toEP, peer: "app1", kind: "udp", sport: 53, dport: 40003},
			{ep: "A", dir: fromEP, peer: "app1", kind: "echo", id: 0x1234, allow: true, rule: "web/egress/2"},
			{ep: "A", dir: toEP, peer: "app1", kind: "echo-reply", id: 0x1234, allow: true},
			{ep: "A", dir: toEP, peer: "app1", kind: "echo-reply", id: 0x4321},
			{ep: "A", dir: toEP, peer: "ops1", kind: "tcp", sport: 40004, dport: 8080, allow: true, rule: "web/ingress/0"},
			{ep: "A", dir: fromEP, peer: "ops1", kind: "tcp", sport: 8080, dport: 40004, flags: tcpSYN | tcpACK, allow: true},
			{ep: "A", dir: fromEP, peer: "ops1", kind: "tcp", sport: 8080, dport: 40005},
			{ep: "A", dir: toEP, peer: "ops1", kind: "tcp", sport: 40004, dport: 8080, flags: tcpACK, allow: true, rule: "web/ingress/0"},
		},
	}},
}, {
	name: "an ICMP error about a tracked connection passes either way, other ICMP errors are checked as ICMP",
	phases: []phase{{
		objects: withBase(policyObj("acme/web", groups("web"),
			rules(allow("icmp", "", "ops")),
			rules(allow("udp", "53", "app"), allow("tcp", "80", "app")))),
		steps: []step{
			{ep: "A", dir: fromEP, peer: "app1", kind: "udp", sport: 40000, dport: 53, allow: true, rule: "web/egress/0"},
			{ep: "A", dir: fromEP, peer: "app1", kind: "tcp", sport: 40001, dport: 80, allow: true, rule: "web/egress/1"},
			{ep: "A", dir: toEP, peer: "app1", kind: "unreachable", allow: true,
				embed: &step{dir: fromEP, peer: "app1", kind: "udp", sport: 40000, dport: 53}},
			{ep: "A", dir: toEP, peer: "world", kind: "too-big", allow: true, // from a router on the path
				embed: &step{dir: fromEP, peer: "app1", kind: "tcp", sport: 40001, dport: 80}},
			{ep: "A", dir: fromEP, peer: "app1", kind: "unreachable", allow: true, // about the reply direction
				embed: &step{dir: toEP, peer: "app1", kind: "udp", sport: 53, dport: 40000}},
			{ep: "A", dir: toEP, peer: "app1", kind: "parameter-problem", allow: true,
				embed: &step{dir: fromEP, peer: "app1", kind: "tcp", sport: 40001, dport: 80, flags: tcpACK}},
			{ep: "A", dir: toEP, peer: "app1", kind: "unreachable",
				embed: &step{dir: fromEP, peer: "app1", kind: "udp", sport: 40009, dport: 53}},
			{ep: "A", dir: toEP, peer: "world", kind: "time-exceeded",
				embed: &step{dir: fromEP, peer: "app1", kind: "tcp", sport: 40009, dport: 80}},
			{ep: "A", dir: toEP, peer: "ops1", kind: "unreachable", allow: true, rule: "web/ingress/0",
				embed: &step{dir: fromEP, peer: "app1", kind: "udp", sport: 40009, dport: 53}},
		},
	}},
}, {
	name: "ARP, neighbour discovery and multicast membership always pass",
	phases: []phase{{
		objects: withBase(policyObj("acme/web", groups("web"), rules(allow("tcp", "80", "app")), rules(allow("tcp", "80", "app")))),
		steps: []step{
			{ep: "A", dir: fromEP, peer: "mcast", kind: "arp", allow: true},
			{ep: "A", dir: toEP, peer: "world", kind: "arp", allow: true},
			{ep: "A", dir: fromEP, peer: "mcast", kind: "igmp", only: 4, allow: true},
			{ep: "A", dir: toEP, peer: "world", kind: "igmp", only: 4, allow: true},
			{ep: "A", dir: fromEP, peer: "world", kind: "nd", only: 6, allow: true},
			{ep: "A", dir: toEP, peer: "world", kind: "nd", only: 6, allow: true},
			{ep: "A", dir: fromEP, peer: "mcast", kind: "mld", only: 6, allow: true},
			{ep: "A", dir: fromEP, peer: "mcast", kind: "hop-by-hop", only: 6, allow: true},
			{ep: "A", dir: fromEP, peer: "world", kind: "echo"},
			{ep: "A", dir: toEP, peer: "world", kind: "udp", dport: 53},
		},
	}},
}, {
	name: "both ends are checked, each on its own interface: the sender's egress and the receiver's ingress",
	phases: []phase{{
		objects: withBase(
			policyObj("acme/web-out", groups("web"), nil, rules(allow("tcp", "5432-5433", "db"))),
			policyObj("acme/db-in", groups("db"), rules(allow("tcp", "5432", "web"), allow("tcp", "6000", "web")), nil),
		),
		steps: []step{
			{ep: "A", dir: fromEP, peer: "B", kind: "tcp", sport: 40000, dport: 5432, allow: true, rule: "web-out/egress/0"},
			{ep: "B", dir: toEP, peer: "A", kind: "tcp", sport: 40000, dport: 5432, allow: true, rule: "db-in/ingress/0"},
			{ep: "B", dir: fromEP, peer: "A", kind: "tcp", sport: 5432, dport: 40000, flags: tcpSYN | tcpACK, allow: true},
			{ep: "A", dir: toEP, peer: "B", kind: "tcp", sport: 5432, dport: 40000, flags: tcpSYN | tcpACK, allow: true},
			{ep: "A", dir: fromEP, peer: "B", kind: "tcp", sport: 40001, dport: 5433, allow: true, rule: "web-out/egress/0"},
			{ep: "B", dir: toEP, peer: "A", kind: "tcp", sport: 40001, dport: 5433},
			{ep: "A", dir: fromEP, peer: "B", kind: "tcp", sport: 40002, dport: 6000},
			{ep: "B", dir: toEP, peer: "A", kind: "tcp", sport: 40002, dport: 6000, allow: true, rule: "db-in/ingress/1"},
		},
	}},
}, {
	name: "a new snapshot cuts a connection it denies at its next packet, one still allowed passes",
	phases: []phase{{
		objects: withBase(policyObj("acme/web", groups("web"),
			rules(allow("icmp", "", "ops")),
			rules(allow("tcp", "443", "app"), allow("tcp", "80", "app"), allow("udp", "53")))),
		steps: []step{
			{ep: "A", dir: fromEP, peer: "app1", kind: "tcp", sport: 40000, dport: 443, allow: true, rule: "web/egress/0"},
			{ep: "A", dir: fromEP, peer: "app1", kind: "tcp", sport: 40001, dport: 80, allow: true, rule: "web/egress/1"},
			{ep: "A", dir: fromEP, peer: "world", kind: "udp", sport: 40002, dport: 53, allow: true, rule: "web/egress/2"},
			{ep: "A", dir: toEP, peer: "app1", kind: "tcp", sport: 443, dport: 40000, flags: tcpSYN | tcpACK, allow: true},
			{ep: "A", dir: toEP, peer: "app1", kind: "tcp", sport: 80, dport: 40001, flags: tcpSYN | tcpACK, allow: true},
		},
	}, {
		// web allows 443 only now, and block denies DNS.
		objects: withBase(
			policyObj("acme/web", groups("web"), rules(allow("icmp", "", "ops")), rules(allow("tcp", "443", "app"))),
			policyObj("acme/block", groups("web"), nil, rules(deny("udp", "53"))),
		),
		steps: []step{
			{ep: "A", dir: fromEP, peer: "app1", kind: "tcp", sport: 40000, dport: 443, flags: tcpACK, allow: true, rule: "web/egress/0"},
			{ep: "A", dir: toEP, peer: "app1", kind: "tcp", sport: 80, dport: 40001, flags: tcpACK},             // cut, by the default deny
			{ep: "A", dir: fromEP, peer: "app1", kind: "tcp", sport: 40001, dport: 80, flags: tcpACK},           // gone: a new connection
			{ep: "A", dir: fromEP, peer: "world", kind: "udp", sport: 40002, dport: 53, rule: "block/egress/0"}, // cut, by a DENY
			{ep: "A", dir: toEP, peer: "world", kind: "udp", sport: 53, dport: 40002},                           // gone
			{ep: "A", dir: toEP, peer: "app1", kind: "tcp", sport: 443, dport: 40000, flags: tcpACK, allow: true},
		},
		cut: 2,
	}},
}}

// TestCompiledSemantics runs every scenario of compiledScenarios in each IP family, on
// one fixture per family that each scenario starts empty.
func TestCompiledSemantics(t *testing.T) {
	forEachFamily(t, func(t *testing.T, f *fixture, fam family) {
		for _, sc := range compiledScenarios {
			t.Run(sc.name, func(t *testing.T) {
				sf := *f
				sf.tb = t
				newScenarioRun(t, &sf, fam, sc.b).run(sc.phases)
			})
		}
	})
}

// scenarioRun runs one scenario in one family and keeps the counts the hand table adds
// up to.
type scenarioRun struct {
	t   *testing.T
	f   *fixture
	fam family
	// objs are the firewall's maps, for the agent's own install and counter code.
	objs *Objects
	// local are the key IDs of the endpoints on interfaces A and B, ifindex their
	// interfaces.
	local   map[string]string
	ifindex map[string]uint32
	// snap is the snapshot installed.
	snap *firewall.Snapshot
	// rules and eps are what the counters of the rules and endpoints must hold.
	rules map[uint64]RuleStats
	eps   map[uint32]EndpointStats
	// steps counts the steps run, for their own source ports.
	steps int
}

// newScenarioRun empties the fixture's conntrack table and counters, left by an earlier
// scenario, and returns a run with endpoint acme/web on interface A and b (acme/db when
// empty) on interface B.
func newScenarioRun(t *testing.T, f *fixture, fam family, b string) *scenarioRun {
	t.Helper()
	if b == "" {
		b = "acme/db"
	}
	r := &scenarioRun{
		t: t, f: f, fam: fam,
		objs: &Objects{
			Ingress: f.ingress, Egress: f.egress, Snapshots: f.snapshots,
			CT: f.ct, RuleStats: f.ruleStats, EndpointStats: f.epStats, Stats: f.stats,
			caps:  Capacities{Snapshot: int(f.spec.Maps[MapSnapshots].InnerMap.MaxEntries)}.WithDefaults(),
			inner: f.spec.Maps[MapSnapshots].InnerMap,
		},
		local:   map[string]string{"A": keyID(nimbusv1.Kind_KIND_ENDPOINT, "acme/web"), "B": keyID(nimbusv1.Kind_KIND_ENDPOINT, b)},
		ifindex: map[string]uint32{"A": f.ifA, "B": f.ifB},
		rules:   map[uint64]RuleStats{},
		eps:     map[uint32]EndpointStats{},
	}
	var keys []CTKey
	var k CTKey
	var v CTValue
	it := f.ct.Iterate()
	for it.Next(&k, &v) {
		keys = append(keys, k)
	}
	if err := it.Err(); err != nil {
		t.Fatalf("reading fw_ct: %v", err)
	}
	for i := range keys {
		if err := f.ct.Delete(&keys[i]); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			t.Fatalf("emptying fw_ct: %v", err)
		}
	}
	if err := errors.Join(r.objs.KeepRuleCounters(nil), r.objs.KeepEndpointCounters(nil)); err != nil {
		t.Fatalf("removing the counters: %v", err)
	}
	for i := range uint32(NumStats) {
		if err := f.stats.Put(i, make([]uint64, ebpf.MustPossibleCPU())); err != nil {
			t.Fatalf("zeroing fw_stats[%d]: %v", i, err)
		}
	}
	return r
}

// keyID returns the key ID of the object of the kind "tenant[/namespace]/name".
func keyID(kind nimbusv1.Kind, key string) string {
	tenant, namespace, name := splitKey(key)
	return nimbusv1.NewKey(kind, tenant, namespace, name).ID()
}

// run installs each phase's snapshot in turn, runs its steps and checks the counters.
func (r *scenarioRun) run(phases []phase) {
	for i, ph := range phases {
		r.install(ph.objects)
		for j, s := range ph.steps {
			r.step(ph.objects, fmt.Sprintf("phase %d step %d", i, j), s)
		}
		r.check(i, ph.cut)
	}
}

// install compiles the objects for the two local endpoints and installs the snapshot
// and its counters as the agent does: Objects.Install, then a counter for every rule
// and endpoint of the snapshot, existing ones keeping their counts, others removed.
func (r *scenarioRun) install(objs []*nimbusv1.Object) {
	r.t.Helper()
	in := firewall.Input{Local: []firewall.Local{
		{Endpoint: r.local["A"], Ifindex: r.ifindex["A"]},
		{Endpoint: r.local["B"], Ifindex: r.ifindex["B"]},
	}}
	for _, o := range objs {
		switch o.Kind() {
		case nimbusv1.Kind_KIND_ENDPOINT:
			in.Endpoints = append(in.Endpoints, o)
		case nimbusv1.Kind_KIND_SECURITY_GROUP:
			in.Groups = append(in.Groups, o)
		case nimbusv1.Kind_KIND_NETWORK_SECURITY_POLICY:
			in.Policies = append(in.Policies, o)
		}
	}
	snap := firewall.Compile(in)
	if len(snap.Problems) > 0 || len(snap.Endpoints) != 2 {
		r.t.Fatalf("compiling: problems %v, %d local endpoints, want none and 2", snap.Problems, len(snap.Endpoints))
	}
	if r.snap != nil && snap.Gen == r.snap.Gen {
		r.t.Fatalf("the new snapshot has the generation %#x of the old one", snap.Gen)
	}
	r.snap = snap
	if err := r.objs.Install(snap.Entries); err != nil {
		r.t.Fatalf("installing the snapshot: %v", err)
	}
	ruleIDs := make([]uint64, 0, len(snap.Rules))
	for _, ri := range snap.Rules {
		ruleIDs = append(ruleIDs, ri.ID)
	}
	epIDs := make([]uint32, 0, len(snap.Endpoints))
	for _, e := range snap.Endpoints {
		epIDs = append(epIDs, e.ID)
	}
	if err := errors.Join(r.objs.KeepRuleCounters(ruleIDs), r.objs.KeepEndpointCounters(epIDs)); err != nil {
		r.t.Fatalf("making the counters: %v", err)
	}
	// The counters of rules and endpoints that are gone are gone.
	kept := map[uint64]bool{}
	for _, id := range ruleIDs {
		kept[id] = true
	}
	for id := range r.rules {
		if !kept[id] {
			delete(r.rules, id)
		}
	}
}

// addr returns the address of the role in the family under test.
func (r *scenarioRun) addr(role string) netip.Addr {
	r.t.Helper()
	a, ok := roles[role]
	if !ok {
		r.t.Fatalf("no role %q", role)
	}
	if r.fam.ep.Is4() {
		return netip.MustParseAddr(a[0])
	}
	return netip.MustParseAddr(a[1])
}

// epAddr returns the address, in the family under test, of the endpoint local on the
// interface ("A" or "B"), from its object.
func (r *scenarioRun) epAddr(objs []*nimbusv1.Object, ep string) netip.Addr {
	r.t.Helper()
	for _, o := range objs {
		if o.Kind() != nimbusv1.Kind_KIND_ENDPOINT || o.Key().ID() != r.local[ep] {
			continue
		}
		for _, s := range o.GetEndpoint().GetIps() {
			if a := netip.MustParseAddr(s); a.Is4() == r.fam.ep.Is4() {
				return a
			}
		}
	}
	r.t.Fatalf("no %s address of endpoint %s", r.fam.name, r.local[ep])
	return netip.Addr{}
}

// packet returns the packet of the step s on the endpoint whose address is ep.
func (r *scenarioRun) packet(ep netip.Addr, s step) packet {
	r.t.Helper()
	src, dst := r.addr(s.peer), ep
	if s.dir == fromEP {
		src, dst = dst, src
	}
	fam := r.fam
	switch s.kind {
	case "tcp":
		flags := s.flags
		if flags == 0 {
			flags = tcpSYN
		}
		return tcp(src, s.sport, dst, s.dport, flags)
	case "udp":
		return udp(src, s.sport, dst, s.dport)
	case "echo":
		return fam.icmpPacket(src, dst, fam.echoRequest, 0, s.id)
	case "echo-reply":
		return fam.icmpPacket(src, dst, fam.echoReply, 0, s.id)
	case "gre":
		return packet{src: src, dst: dst, proto: ipProtoGRE, payload: 4}
	case "unreachable", "too-big", "time-exceeded", "parameter-problem":
		typ, code := fam.unreachType, fam.unreachCode
		switch s.kind {
		case "too-big":
			typ, code = fam.tooBigType, fam.tooBigCode
		case "time-exceeded":
			typ, code = fam.timeExceeded, 0
		case "parameter-problem":
			typ, code = 12, 0 // ICMPv4's; ICMPv6's is 4
			if src.Is6() {
				typ = 4
			}
		}
		p := fam.icmpPacket(src, dst, typ, code, 0)
		if s.embed == nil {
			r.t.Fatalf("ICMP error step %+v embeds no packet", s)
		}
		in := r.packet(ep, *s.embed)
		p.embed = &in
		return p
	case "igmp":
		return packet{src: src, dst: dst, proto: 2, payload: 8}
	case "nd":
		return fam.icmpPacket(src, dst, 135, 0, 0)
	case "mld":
		return fam.icmpPacket(src, dst, 143, 0, 0)
	case "hop-by-hop":
		p := fam.icmpPacket(src, dst, 143, 0, 0)
		p.exts = []ext{{ipProtoHopByHop, 8}}
		return p
	}
	r.t.Fatalf("step of unknown kind %q", s.kind)
	return packet{}
}

// step runs the step's packet through the program of its direction on its endpoint's
// interface, checks the verdict, and adds the packet to what the counters must hold. at
// says where the step is in the table.
func (r *scenarioRun) step(objs []*nimbusv1.Object, at string, s step) {
	r.t.Helper()
	r.steps++
	if (s.only == 4 && !r.fam.ep.Is4()) || (s.only == 6 && r.fam.ep.Is4()) {
		return
	}
	ifindex, ok := r.ifindex[s.ep]
	if !ok {
		r.t.Fatalf("%s: no endpoint %q", at, s.ep)
	}
	prog, way := r.f.egress, "to"
	if s.dir == fromEP {
		prog, way = r.f.ingress, "from"
	}
	var frame []byte
	var what string
	if s.kind == "arp" {
		frame, what = arpFrame(), "ARP"
	} else {
		if s.sport == 0 && (s.kind == "tcp" || s.kind == "udp") {
			s.sport = uint16(30000 + r.steps)
		}
		if s.id == 0 && s.kind == "echo" {
			s.id = uint16(30000 + r.steps)
		}
		p := r.packet(r.epAddr(objs, s.ep), s)
		frame, what = p.frame(), p.String()
	}
	want := uint32(tcxDrop)
	if s.allow {
		want = tcxNext
	}
	if got := r.f.run(prog, ifindex, frame); got != want {
		r.t.Errorf("%s: %s %s endpoint %s: verdict %s, want %s", at, what, way, s.ep, verdict(got), verdict(want))
	}

	n := uint64(len(frame))
	if s.rule != "" {
		id := r.ruleID(s.rule)
		c := r.rules[id]
		c.Packets++
		c.Bytes += n
		r.rules[id] = c
	}
	if s.kind == "arp" {
		return // not IP: the program lets it by before it knows the endpoint
	}
	id := r.endpointID(s.ep)
	c := r.eps[id]
	if s.allow {
		c.AllowedPackets++
		c.AllowedBytes += n
	} else {
		c.DeniedPackets++
		c.DeniedBytes += n
	}
	r.eps[id] = c
}

// ruleID returns the id of the rule "[tenant/]policy/direction/index" in the snapshot.
func (r *scenarioRun) ruleID(name string) uint64 {
	r.t.Helper()
	for _, ri := range r.snap.Rules {
		if r.ruleName(ri) == name {
			return ri.ID
		}
	}
	r.t.Fatalf("no rule %s in the snapshot", name)
	return 0
}

// ruleName returns the name the table gives the rule: "[tenant/]policy/direction/index",
// the tenant left out when it is acme.
func (r *scenarioRun) ruleName(ri firewall.RuleInfo) string {
	k := ri.Policy
	name := k.Name + "/" + firewall.DirName(ri.Dir) + "/" + strconv.Itoa(ri.Index)
	if k.Tenant != "acme" {
		name = k.Tenant + "/" + name
	}
	return name
}

// endpointID returns the id of the endpoint local on the interface ("A" or "B").
func (r *scenarioRun) endpointID(ep string) uint32 {
	r.t.Helper()
	for _, e := range r.snap.Endpoints {
		if e.Endpoint.String() == r.local[ep] {
			return e.ID
		}
	}
	r.t.Fatalf("endpoint %s has no entry in the snapshot", r.local[ep])
	return 0
}

// check fails the test unless the counter of every rule and endpoint of the snapshot
// holds what the steps add up to, and the program deleted cut connections.
func (r *scenarioRun) check(phase int, cut uint64) {
	r.t.Helper()
	for _, ri := range r.snap.Rules {
		got, err := r.objs.RuleCounters(ri.ID)
		if err != nil {
			r.t.Errorf("phase %d: rule %s: %v", phase, r.ruleName(ri), err)
		} else if want := r.rules[ri.ID]; got != want {
			r.t.Errorf("phase %d: rule %s counted %d packets, %d bytes, want %d, %d",
				phase, r.ruleName(ri), got.Packets, got.Bytes, want.Packets, want.Bytes)
		}
	}
	for _, e := range r.snap.Endpoints {
		got, err := r.objs.EndpointCounters(e.ID)
		if err != nil {
			r.t.Errorf("phase %d: endpoint %s: %v", phase, e.Endpoint, err)
		} else if want := r.eps[e.ID]; got != want {
			r.t.Errorf("phase %d: endpoint %s counted %s, want %s", phase, e.Endpoint, epCounts(got), epCounts(want))
		}
	}
	st, err := r.objs.ProgramStats()
	if err != nil {
		r.t.Fatal(err)
	}
	if st.CTDeleted != cut || st.NoSnapshotDrops != 0 {
		r.t.Errorf("phase %d: the program cut %d connections and dropped %d packets of unknown interfaces, want %d and none",
			phase, st.CTDeleted, st.NoSnapshotDrops, cut)
	}
}

// epCounts describes an endpoint's counter in failure messages.
func epCounts(c EndpointStats) string {
	return fmt.Sprintf("%d packets (%d bytes) allowed, %d (%d bytes) denied",
		c.AllowedPackets, c.AllowedBytes, c.DeniedPackets, c.DeniedBytes)
}
