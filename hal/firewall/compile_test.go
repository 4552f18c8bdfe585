package firewall

import (
	"errors"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/naplesnet/naples/internal/testrand"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// The endpoints every scenario starts from. Tenant acme: web1, db1 and open1 are local
// (ifindex 10, 11, 12), app1, ops1 and lab1 are on other nodes. Tenant globex has a local
// endpoint gweb (ifindex 20) with acme's web1 address, and a remote endpoint with app1's.
func baseEndpoints() []*nimbusv1.Object {
	return []*nimbusv1.Object{
		endpointObj("acme", "web1", []string{"10.0.0.1", "fd00::1"}, "web", "web2"),
		endpointObj("acme", "db1", []string{"10.0.0.2", "fd00::2"}, "db"),
		endpointObj("acme", "open1", []string{"10.0.0.3"}),
		endpointObj("acme", "app1", []string{"10.0.1.1", "fd00:1::1"}, "app"),
		endpointObj("acme", "ops1", []string{"10.0.1.2", "fd00:1::2"}, "ops"),
		endpointObj("acme", "lab1", []string{"10.0.2.2"}, "lab"),
		endpointObj("globex", "gweb", []string{"10.0.0.1"}, "web"),
		endpointObj("globex", "gapp", []string{"10.0.1.1"}),
		endpointObj("globex", "gapp2", []string{"10.0.5.5"}, "app"),
	}
}

// baseLocal are the local endpoints of the scenarios.
var baseLocal = []Local{
	{Endpoint: epKey("acme", "web1"), Ifindex: 10},
	{Endpoint: epKey("acme", "db1"), Ifindex: 11},
	{Endpoint: epKey("acme", "open1"), Ifindex: 12},
	{Endpoint: epKey("globex", "gweb"), Ifindex: 20},
}

// ifindexOf maps the local endpoints' names to their interfaces.
var ifindexOf = map[string]uint32{"web1": 10, "db1": 11, "open1": 12, "gweb": 20}

// want is one packet of a scenario and the expected decision. rule names the rule that
// must be counted as "policy/direction/index" in the local endpoint's tenant, "" for none.
type want struct {
	ep    string
	dir   uint8
	peer  string
	proto uint8
	port  uint16
	allow bool
	rule  string
}

// Shorthands for scenario tables.
const (
	in  = DirIngress
	out = DirEgress
)

func TestCompileSemantics(t *testing.T) {
	tests := []struct {
		name     string
		groups   []*nimbusv1.Object
		policies []*nimbusv1.Object
		want     []want
	}{{
		name: "no policy: every endpoint is open",
		want: []want{
			{ep: "web1", dir: in, peer: "10.0.1.1", proto: protoTCP, port: 80, allow: true},
			{ep: "web1", dir: out, peer: "8.8.8.8", proto: protoUDP, port: 53, allow: true},
			{ep: "db1", dir: in, peer: "203.0.113.7", proto: protoGRE, allow: true},
			{ep: "gweb", dir: in, peer: "fd00:1::1", proto: protoICMPv6, allow: true},
		},
	}, {
		name: "an ingress policy denies what no rule allows, only inbound, only where attached",
		policies: []*nimbusv1.Object{
			policyObj("acme", "web-in", []string{"web"}, []r{{action: "allow", proto: "tcp", ports: ports("80"), peers: peers("app")}}, nil),
		},
		want: []want{
			{ep: "web1", dir: in, peer: "10.0.1.1", proto: protoTCP, port: 80, allow: true, rule: "web-in/ingress/0"},
			{ep: "web1", dir: in, peer: "10.0.1.1", proto: protoTCP, port: 81},
			{ep: "web1", dir: in, peer: "10.0.1.1", proto: protoTCP, port: 79},
			{ep: "web1", dir: in, peer: "10.0.1.1", proto: protoUDP, port: 80},
			{ep: "web1", dir: in, peer: "10.0.1.2", proto: protoTCP, port: 80},
			{ep: "web1", dir: in, peer: "203.0.113.7", proto: protoTCP, port: 80},
			{ep: "web1", dir: in, peer: "fd00:1::1", proto: protoTCP, port: 80, allow: true, rule: "web-in/ingress/0"},
			{ep: "web1", dir: in, peer: "fd00:1::2", proto: protoTCP, port: 80},
			{ep: "web1", dir: out, peer: "203.0.113.7", proto: protoTCP, port: 25, allow: true},
			{ep: "db1", dir: in, peer: "203.0.113.7", proto: protoTCP, port: 5432, allow: true},
		},
	}, {
		name: "group CIDRs: the longest prefix gives the labels of every prefix holding it",
		groups: []*nimbusv1.Object{
			groupObj("acme", "corp", "192.168.0.0/16", "fd10::/32"),
			groupObj("acme", "lab", "192.168.7.0/24", "fd10:0:7::/48"),
		},
		policies: []*nimbusv1.Object{
			policyObj("acme", "ssh", []string{"web"}, []r{
				{action: "allow", proto: "tcp", ports: ports("22"), peers: peers("corp")},
				{action: "deny", proto: "tcp", ports: ports("22"), peers: peers("lab")},
				{action: "allow", proto: "udp", ports: ports("53"), peers: peers("192.168.7.128/25", "fd10:0:7:8000::/49")},
			}, nil),
		},
		want: []want{
			{ep: "web1", dir: in, peer: "192.168.1.1", proto: protoTCP, port: 22, allow: true, rule: "ssh/ingress/0"},
			{ep: "web1", dir: in, peer: "192.168.7.9", proto: protoTCP, port: 22, rule: "ssh/ingress/1"},
			{ep: "web1", dir: in, peer: "192.168.7.200", proto: protoTCP, port: 22, rule: "ssh/ingress/1"},
			{ep: "web1", dir: in, peer: "10.0.2.2", proto: protoTCP, port: 22, rule: "ssh/ingress/1"}, // lab1 lists lab
			{ep: "web1", dir: in, peer: "192.169.0.1", proto: protoTCP, port: 22},
			{ep: "web1", dir: in, peer: "192.168.7.200", proto: protoUDP, port: 53, allow: true, rule: "ssh/ingress/2"},
			{ep: "web1", dir: in, peer: "192.168.7.127", proto: protoUDP, port: 53},
			{ep: "web1", dir: in, peer: "fd10::1", proto: protoTCP, port: 22, allow: true, rule: "ssh/ingress/0"},
			{ep: "web1", dir: in, peer: "fd10:0:7::1", proto: protoTCP, port: 22, rule: "ssh/ingress/1"},
			{ep: "web1", dir: in, peer: "fd10:0:7:8000::1", proto: protoUDP, port: 53, allow: true, rule: "ssh/ingress/2"},
			{ep: "web1", dir: in, peer: "fd10:0:7::1", proto: protoUDP, port: 53},
			{ep: "web1", dir: in, peer: "fd11::1", proto: protoTCP, port: 22},
		},
	}, {
		name: "a rule with no peers matches any peer, the world included",
		policies: []*nimbusv1.Object{
			policyObj("acme", "https", []string{"web"}, []r{{action: "allow", proto: "tcp", ports: ports("443")}}, nil),
		},
		want: []want{
			{ep: "web1", dir: in, peer: "203.0.113.9", proto: protoTCP, port: 443, allow: true, rule: "https/ingress/0"},
			{ep: "web1", dir: in, peer: "10.0.1.1", proto: protoTCP, port: 443, allow: true, rule: "https/ingress/0"},
			{ep: "web1", dir: in, peer: "2001:db8::9", proto: protoTCP, port: 443, allow: true, rule: "https/ingress/0"},
			{ep: "web1", dir: in, peer: "203.0.113.9", proto: protoTCP, port: 8443},
		},
	}, {
		name: "deny beats allow across policies and overlapping port ranges",
		policies: []*nimbusv1.Object{
			policyObj("acme", "a-allow", []string{"web"}, []r{
				{action: "allow", proto: "tcp", ports: ports("1000-2000")},
				{action: "allow", proto: "tcp", ports: ports("1500-1600"), peers: peers("app")},
				{action: "allow", proto: "tcp", ports: ports("1-65535"), peers: peers("ops")},
			}, nil),
			policyObj("acme", "b-deny", []string{"web2"}, []r{
				{action: "deny", proto: "tcp", ports: ports("1550-1600", "8000-8080"), peers: peers("app", "ops")},
			}, nil),
		},
		want: []want{
			{ep: "web1", dir: in, peer: "10.0.1.1", proto: protoTCP, port: 999},
			{ep: "web1", dir: in, peer: "10.0.1.1", proto: protoTCP, port: 1000, allow: true, rule: "a-allow/ingress/0"},
			{ep: "web1", dir: in, peer: "10.0.1.1", proto: protoTCP, port: 1500, allow: true, rule: "a-allow/ingress/1"},
			{ep: "web1", dir: in, peer: "10.0.1.1", proto: protoTCP, port: 1549, allow: true, rule: "a-allow/ingress/1"},
			{ep: "web1", dir: in, peer: "10.0.1.1", proto: protoTCP, port: 1550, rule: "b-deny/ingress/0"},
			{ep: "web1", dir: in, peer: "10.0.1.1", proto: protoTCP, port: 1600, rule: "b-deny/ingress/0"},
			{ep: "web1", dir: in, peer: "10.0.1.1", proto: protoTCP, port: 1601, allow: true, rule: "a-allow/ingress/0"},
			{ep: "web1", dir: in, peer: "10.0.1.1", proto: protoTCP, port: 2000, allow: true, rule: "a-allow/ingress/0"},
			{ep: "web1", dir: in, peer: "10.0.1.1", proto: protoTCP, port: 2001},
			{ep: "web1", dir: in, peer: "10.0.1.2", proto: protoTCP, port: 1, allow: true, rule: "a-allow/ingress/2"},
			{ep: "web1", dir: in, peer: "10.0.1.2", proto: protoTCP, port: 7999, allow: true, rule: "a-allow/ingress/2"},
			{ep: "web1", dir: in, peer: "10.0.1.2", proto: protoTCP, port: 8000, rule: "b-deny/ingress/0"},
			{ep: "web1", dir: in, peer: "10.0.1.2", proto: protoTCP, port: 8080, rule: "b-deny/ingress/0"},
			{ep: "web1", dir: in, peer: "10.0.1.2", proto: protoTCP, port: 8081, allow: true, rule: "a-allow/ingress/2"},
			{ep: "web1", dir: in, peer: "10.0.1.2", proto: protoTCP, port: 65535, allow: true, rule: "a-allow/ingress/2"},
			{ep: "web1", dir: in, peer: "203.0.113.1", proto: protoTCP, port: 1555, allow: true, rule: "a-allow/ingress/0"},
		},
	}, {
		name: "deny listed after allow in one policy still wins",
		policies: []*nimbusv1.Object{
			policyObj("acme", "p", []string{"web"}, []r{
				{action: "allow", proto: "tcp"},
				{action: "deny", proto: "tcp", ports: ports("23")},
			}, nil),
		},
		want: []want{
			{ep: "web1", dir: in, peer: "10.0.1.1", proto: protoTCP, port: 22, allow: true, rule: "p/ingress/0"},
			{ep: "web1", dir: in, peer: "10.0.1.1", proto: protoTCP, port: 23, rule: "p/ingress/1"},
			{ep: "web1", dir: in, peer: "10.0.1.1", proto: protoUDP, port: 23},
		},
	}, {
		name: "protocol any, icmp and other",
		policies: []*nimbusv1.Object{
			policyObj("acme", "p", []string{"web"}, []r{
				{action: "allow", peers: peers("app")},
				{action: "allow", proto: "icmp", peers: peers("ops")},
				{action: "allow", proto: "udp", peers: peers("lab")},
			}, nil),
		},
		want: []want{
			{ep: "web1", dir: in, peer: "10.0.1.1", proto: protoTCP, port: 5, allow: true, rule: "p/ingress/0"},
			{ep: "web1", dir: in, peer: "10.0.1.1", proto: protoUDP, port: 7, allow: true, rule: "p/ingress/0"},
			{ep: "web1", dir: in, peer: "10.0.1.1", proto: protoICMP, allow: true, rule: "p/ingress/0"},
			{ep: "web1", dir: in, peer: "fd00:1::1", proto: protoICMPv6, allow: true, rule: "p/ingress/0"},
			{ep: "web1", dir: in, peer: "10.0.1.1", proto: protoGRE, allow: true, rule: "p/ingress/0"},
			{ep: "web1", dir: in, peer: "10.0.1.2", proto: protoICMP, allow: true, rule: "p/ingress/1"},
			{ep: "web1", dir: in, peer: "fd00:1::2", proto: protoICMPv6, allow: true, rule: "p/ingress/1"},
			{ep: "web1", dir: in, peer: "10.0.1.2", proto: protoTCP, port: 5},
			{ep: "web1", dir: in, peer: "10.0.1.2", proto: protoGRE},
			{ep: "web1", dir: in, peer: "10.0.2.2", proto: protoUDP, port: 9, allow: true, rule: "p/ingress/2"},
			{ep: "web1", dir: in, peer: "10.0.2.2", proto: protoICMP},
			{ep: "web1", dir: in, peer: "203.0.113.1", proto: protoICMP},
		},
	}, {
		name:   "egress rules protect only egress and match the destination",
		groups: []*nimbusv1.Object{groupObj("acme", "dns", "10.96.0.10/32")},
		policies: []*nimbusv1.Object{
			policyObj("acme", "out", []string{"web"}, nil, []r{
				{action: "allow", proto: "udp", ports: ports("53"), peers: peers("dns")},
				{action: "allow", proto: "tcp", ports: ports("5432"), peers: peers("db")},
				{action: "allow", proto: "tcp", ports: ports("443"), peers: peers("2001:db8::/32")},
			}),
		},
		want: []want{
			{ep: "web1", dir: out, peer: "10.96.0.10", proto: protoUDP, port: 53, allow: true, rule: "out/egress/0"},
			{ep: "web1", dir: out, peer: "10.96.0.11", proto: protoUDP, port: 53},
			{ep: "web1", dir: out, peer: "10.0.0.2", proto: protoTCP, port: 5432, allow: true, rule: "out/egress/1"},
			{ep: "web1", dir: out, peer: "fd00::2", proto: protoTCP, port: 5432, allow: true, rule: "out/egress/1"},
			{ep: "web1", dir: out, peer: "10.0.0.3", proto: protoTCP, port: 5432},
			{ep: "web1", dir: out, peer: "2001:db8:5::1", proto: protoTCP, port: 443, allow: true, rule: "out/egress/2"},
			{ep: "web1", dir: out, peer: "2001:db9::1", proto: protoTCP, port: 443},
			{ep: "web1", dir: in, peer: "203.0.113.1", proto: protoTCP, port: 22, allow: true},
		},
	}, {
		name: "tenants are isolated: same group names, same addresses",
		policies: []*nimbusv1.Object{
			policyObj("acme", "web-in", []string{"web"}, []r{
				{action: "allow", proto: "tcp", ports: ports("80"), peers: peers("app")},
				{action: "deny", proto: "tcp", ports: ports("80"), peers: peers("10.0.5.5/32")},
			}, nil),
			policyObj("globex", "web-in", []string{"web"}, []r{
				{action: "allow", proto: "tcp", ports: ports("80"), peers: peers("app")},
			}, nil),
		},
		want: []want{
			// 10.0.1.1 is in app in acme, not in globex.
			{ep: "web1", dir: in, peer: "10.0.1.1", proto: protoTCP, port: 80, allow: true, rule: "web-in/ingress/0"},
			{ep: "gweb", dir: in, peer: "10.0.1.1", proto: protoTCP, port: 80},
			// 10.0.5.5 is in app in globex; acme's deny of it does not reach globex.
			{ep: "gweb", dir: in, peer: "10.0.5.5", proto: protoTCP, port: 80, allow: true, rule: "web-in/ingress/0"},
			{ep: "web1", dir: in, peer: "10.0.5.5", proto: protoTCP, port: 80, rule: "web-in/ingress/1"},
		},
	}, {
		name: "a policy in another namespace attaches to that namespace's group",
		policies: []*nimbusv1.Object{
			policyIn("acme", "prod", "web-in", []string{"web"}, []r{{action: "allow", proto: "tcp", ports: ports("80")}}, nil),
		},
		want: []want{
			{ep: "web1", dir: in, peer: "10.0.1.1", proto: protoTCP, port: 22, allow: true},
		},
	}, {
		name: "a rule naming a group with no SecurityGroup object matches its endpoints",
		policies: []*nimbusv1.Object{
			policyObj("acme", "p", []string{"db"}, []r{{action: "allow", proto: "tcp", ports: ports("5432"), peers: peers("web")}}, nil),
		},
		want: []want{
			{ep: "db1", dir: in, peer: "10.0.0.1", proto: protoTCP, port: 5432, allow: true, rule: "p/ingress/0"},
			{ep: "db1", dir: in, peer: "fd00::1", proto: protoTCP, port: 5432, allow: true, rule: "p/ingress/0"},
			{ep: "db1", dir: in, peer: "10.0.0.3", proto: protoTCP, port: 5432},
		},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			input := Input{Endpoints: baseEndpoints(), Groups: tt.groups, Policies: tt.policies, Local: baseLocal}
			s := Compile(input)
			if len(s.Problems) > 0 {
				t.Fatalf("problems: %v", s.Problems)
			}
			if !sortedEntriesOK(s.Entries) {
				t.Errorf("entries not sorted")
			}
			tr := newTrie(t, s.Entries)
			world := newWorld(input)
			for _, w := range tt.want {
				p := packet{ifindex: ifindexOf[w.ep], dir: w.dir, peer: netip.MustParseAddr(w.peer), proto: w.proto, port: w.port}
				got := tr.check(p)
				var wantRule uint64
				if w.rule != "" {
					wantRule = ruleIDByName(t, s, tenantOf(w.ep), w.rule)
				}
				if got.allow != w.allow || got.rule != wantRule {
					t.Errorf("%s %s: allow=%v rule=%s, want allow=%v rule=%q",
						w.ep, p, got.allow, ruleNames(s, []uint64{got.rule}), w.allow, w.rule)
				}
				compareWithReference(t, world, s, tr, epKey(tenantOf(w.ep), w.ep), p)
			}
			// Beyond the listed packets, the snapshot agrees with the reference on
			// every pair of local endpoint and known address, in both directions.
			for _, l := range baseLocal {
				for _, peer := range addressesOf(input) {
					for _, proto := range []uint8{protoTCP, protoUDP, protoICMP, protoGRE} {
						for _, port := range []uint16{22, 53, 80, 1555, 8080} {
							for _, dir := range []uint8{in, out} {
								compareWithReference(t, world, s, tr, l.Endpoint,
									packet{ifindex: l.Ifindex, dir: dir, peer: peer, proto: proto, port: port})
							}
						}
					}
				}
			}
		})
	}
}

// tenantOf returns the tenant of a local endpoint of the scenarios.
func tenantOf(ep string) string {
	if ep == "gweb" {
		return "globex"
	}
	return "acme"
}

// ruleIDByName returns the id of the rule "policy/direction/index" of the tenant's policy
// in the default namespace, from the snapshot's rules.
func ruleIDByName(t *testing.T, s *Snapshot, tenant, name string) uint64 {
	t.Helper()
	for _, ri := range s.Rules {
		if k := ri.Policy; k.Tenant == tenant && k.Name+"/"+DirName(ri.Dir)+"/"+strconv.Itoa(ri.Index) == name {
			return ri.ID
		}
	}
	t.Fatalf("no rule %s of tenant %s in the snapshot", name, tenant)
	return 0
}

// addressesOf returns every address the input names: endpoint addresses, the first, last
// and neighbouring addresses of every group and rule CIDR, and a few of the world.
func addressesOf(in Input) []netip.Addr {
	set := map[netip.Addr]bool{
		netip.MustParseAddr("203.0.113.1"): true, netip.MustParseAddr("2001:db8:ff::1"): true,
	}
	prefix := func(s string) {
		p := netip.MustParsePrefix(s)
		first := p.Addr()
		last := lastAddr(p)
		set[first], set[last] = true, true
		if prev := first.Prev(); prev.IsValid() {
			set[prev] = true
		}
		if next := last.Next(); next.IsValid() {
			set[next] = true
		}
	}
	for _, o := range in.Endpoints {
		for _, ip := range o.GetEndpoint().GetIps() {
			set[netip.MustParseAddr(ip)] = true
		}
	}
	for _, o := range in.Groups {
		for _, c := range o.GetSecurityGroup().GetCidrs() {
			prefix(c)
		}
	}
	for _, o := range in.Policies {
		spec := o.GetNetworkSecurityPolicy()
		for _, rule := range append(slices.Clone(spec.GetIngress()), spec.GetEgress()...) {
			for _, c := range append(slices.Clone(rule.GetFromCidrs()), rule.GetToCidrs()...) {
				prefix(c)
			}
		}
	}
	var out []netip.Addr
	for a := range set {
		out = append(out, a)
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}

// lastAddr returns the last address of a prefix.
func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// TestCompileRandom compiles random objects and checks the snapshot against the reference
// on every local endpoint, direction, known address, protocol and port boundary.
func TestCompileRandom(t *testing.T) {
	seed := testrand.Seed(t)
	rng := rand.New(rand.NewPCG(seed, seed>>1))
	for round := range 25 {
		input := randomInput(rng)
		s := Compile(input)
		if len(s.Problems) > 0 {
			t.Fatalf("round %d: problems: %v", round, s.Problems)
		}
		tr := newTrie(t, s.Entries)
		world := newWorld(input)
		addrs := addressesOf(input)
		// TCP and UDP are checked at the edges of the rules' port ranges (a sample of
		// them: TestPolicyClosureExhaustive checks every port), other protocols at two
		// ports, which they must ignore.
		var edges []uint16
		for _, o := range input.Policies {
			spec := o.GetNetworkSecurityPolicy()
			for _, rule := range append(slices.Clone(spec.GetIngress()), spec.GetEgress()...) {
				for _, ps := range rule.GetPorts() {
					pr, _ := ParsePortRange(ps)
					edges = append(edges, pr.Lo-1, pr.Lo, pr.Hi, pr.Hi+1)
				}
			}
		}
		slices.Sort(edges)
		edges = slices.Compact(edges)
		rng.Shuffle(len(edges), reflect.Swapper(edges))
		l4Ports := append([]uint16{0, 1, 65535}, edges[:min(len(edges), 16)]...)
		for _, l := range input.Local {
			for _, peer := range addrs {
				for _, proto := range []uint8{protoTCP, protoUDP, protoICMP, protoGRE} {
					portList := []uint16{0, 80}
					if proto == protoTCP || proto == protoUDP {
						portList = l4Ports
					}
					for _, port := range portList {
						for _, dir := range []uint8{in, out} {
							compareWithReference(t, world, s, tr, l.Endpoint,
								packet{ifindex: l.Ifindex, dir: dir, peer: peer, proto: proto, port: port})
						}
					}
				}
			}
		}
		if t.Failed() {
			t.Fatalf("round %d failed", round)
		}
	}
}

// randomInput returns random endpoints, groups and policies of two tenants whose
// addresses, CIDRs and port ranges overlap a lot.
func randomInput(rng *rand.Rand) Input {
	tenants := []string{"a", "b"}
	groupNames := []string{"g1", "g2", "g3", "g4"}
	addrs := []string{"10.0.0.1", "10.0.0.2", "10.0.0.5", "10.0.1.1", "10.1.0.1", "fd00::1", "fd00::2", "fd00:1::1"}
	cidrs := []string{"10.0.0.0/8", "10.0.0.0/24", "10.0.0.0/30", "10.0.0.4/31", "10.0.1.0/24", "0.0.0.0/0",
		"fd00::/16", "fd00::/126", "fd00:1::/32", "::/0"}
	pick := func(list []string, maxN int) []string {
		var out []string
		for range rng.IntN(maxN + 1) {
			out = append(out, list[rng.IntN(len(list))])
		}
		return out
	}
	var in Input
	ifindex := uint32(1)
	for _, tenant := range tenants {
		for i := range 5 {
			name := "ep" + strconv.Itoa(i)
			in.Endpoints = append(in.Endpoints, endpointObj(tenant, name, dedupe(pick(addrs, 2)), pick(groupNames, 2)...))
			if i < 2 {
				in.Local = append(in.Local, Local{Endpoint: epKey(tenant, name), Ifindex: ifindex})
				ifindex++
			}
		}
		for _, g := range groupNames {
			if rng.IntN(2) == 0 {
				in.Groups = append(in.Groups, groupObj(tenant, g, pick(cidrs, 2)...))
			}
		}
		for i := range 3 {
			randomRules := func() []r {
				var rules []r
				for range rng.IntN(4) {
					x := r{action: []string{"allow", "deny"}[rng.IntN(2)], proto: []string{"", "tcp", "udp", "icmp"}[rng.IntN(4)]}
					if x.proto == "tcp" || x.proto == "udp" {
						for range rng.IntN(3) {
							lo := 1 + rng.IntN(100)
							x.ports = append(x.ports, strconv.Itoa(lo)+"-"+strconv.Itoa(lo+rng.IntN(100)))
						}
					}
					x.peers = append(pick(groupNames, 2), pick(cidrs, 1)...)
					rules = append(rules, x)
				}
				return rules
			}
			in.Policies = append(in.Policies, policyObj(tenant, "p"+strconv.Itoa(i), pick(groupNames, 2), randomRules(), randomRules()))
		}
	}
	return in
}

// dedupe returns the list without repeats.
func dedupe(list []string) []string {
	slices.Sort(list)
	return slices.Compact(list)
}

// TestPolicyClosureExhaustive checks every destination port: many overlapping allow and
// deny ranges of one subject, direction, class and peer compile into entries whose longest
// match for each port gives the verdict of all rules covering it and the first deciding
// rule.
func TestPolicyClosureExhaustive(t *testing.T) {
	seed := testrand.Seed(t)
	rng := rand.New(rand.NewPCG(seed, seed>>2))
	var rules []r
	type rng16 struct{ lo, hi int }
	var ranges [][]rng16
	for range 12 {
		x := r{action: []string{"allow", "deny"}[rng.IntN(2)], proto: "tcp"}
		if rng.IntN(4) == 0 {
			x.action = "allow"
		}
		var rs []rng16
		for range 1 + rng.IntN(3) {
			lo := 1 + rng.IntN(65535)
			hi := lo + rng.IntN(min(65536-lo, []int{1, 64, 5000, 40000}[rng.IntN(4)]))
			x.ports = append(x.ports, strconv.Itoa(lo)+"-"+strconv.Itoa(hi))
			rs = append(rs, rng16{lo, hi})
		}
		rules, ranges = append(rules, x), append(ranges, rs)
	}
	input := Input{
		Endpoints: []*nimbusv1.Object{endpointObj("t", "local", []string{"10.0.0.1"}, "g")},
		Policies:  []*nimbusv1.Object{policyObj("t", "p", []string{"g"}, rules, nil)},
		Local:     []Local{{Endpoint: epKey("t", "local"), Ifindex: 1}},
	}
	s := Compile(input)
	tr := newTrie(t, s.Entries)
	for port := range 65536 {
		// The verdict by brute force over the rules, in order.
		deny, allow := -1, -1
		for i, rs := range ranges {
			for _, x := range rs {
				if port >= x.lo && port <= x.hi {
					if rules[i].action == "deny" && deny < 0 {
						deny = i
					}
					if rules[i].action == "allow" && allow < 0 {
						allow = i
					}
				}
			}
		}
		want := verdict{}
		switch {
		case deny >= 0:
			want.rule = s.Rules[deny].ID
		case allow >= 0:
			want = verdict{allow: true, rule: s.Rules[allow].ID}
		}
		got := tr.check(packet{ifindex: 1, dir: in, peer: netip.MustParseAddr("192.0.2.1"), proto: protoTCP, port: uint16(port)})
		if got != want {
			t.Fatalf("port %d: got %+v, want %+v (rules %+v)", port, got, want, rules)
		}
	}
}

// TestCompileDeterministic compiles the same objects in shuffled orders: the snapshots are
// identical, generation included.
func TestCompileDeterministic(t *testing.T) {
	seed := testrand.Seed(t)
	rng := rand.New(rand.NewPCG(seed, seed>>3))
	for range 10 {
		input := randomInput(rng)
		first := Compile(input)
		for range 5 {
			shuffled := Input{
				Endpoints: slices.Clone(input.Endpoints),
				Groups:    slices.Clone(input.Groups),
				Policies:  slices.Clone(input.Policies),
				Local:     slices.Clone(input.Local),
			}
			rng.Shuffle(len(shuffled.Endpoints), reflect.Swapper(shuffled.Endpoints))
			rng.Shuffle(len(shuffled.Groups), reflect.Swapper(shuffled.Groups))
			rng.Shuffle(len(shuffled.Policies), reflect.Swapper(shuffled.Policies))
			rng.Shuffle(len(shuffled.Local), reflect.Swapper(shuffled.Local))
			again := Compile(shuffled)
			if !reflect.DeepEqual(first, again) {
				t.Fatalf("snapshots differ for the same objects in another order:\n%+v\n%+v", first, again)
			}
		}
		if first.Gen == 0 {
			t.Errorf("generation 0")
		}
	}
}

// TestCompileGeneration checks what the generation follows: the entries, not objects that
// change no entry.
func TestCompileGeneration(t *testing.T) {
	base := Input{
		Endpoints: baseEndpoints(),
		Policies: []*nimbusv1.Object{
			policyObj("acme", "web-in", []string{"web"}, []r{{action: "allow", proto: "tcp", ports: ports("80"), peers: peers("app")}}, nil),
		},
		Local: baseLocal,
	}
	gen := Compile(base).Gen
	with := func(f func(in *Input)) uint32 {
		in := base
		in.Endpoints, in.Policies = slices.Clone(base.Endpoints), slices.Clone(base.Policies)
		f(&in)
		return Compile(in).Gen
	}
	tests := []struct {
		name    string
		change  func(in *Input)
		changed bool
	}{
		{"nothing", func(in *Input) {}, false},
		{"a policy of a tenant with no local endpoint", func(in *Input) {
			in.Policies = append(in.Policies, policyObj("initech", "p", []string{"web"}, []r{{action: "allow"}}, nil))
		}, false},
		{"an endpoint in a group no rule names", func(in *Input) {
			in.Endpoints = append(in.Endpoints, endpointObj("acme", "new", []string{"10.9.9.9"}, "ops"))
		}, false},
		{"an endpoint joining a group a rule names", func(in *Input) {
			in.Endpoints = append(in.Endpoints, endpointObj("acme", "new", []string{"10.9.9.9"}, "app"))
		}, true},
		{"a rule's port", func(in *Input) {
			in.Policies[0] = policyObj("acme", "web-in", []string{"web"}, []r{{action: "allow", proto: "tcp", ports: ports("81"), peers: peers("app")}}, nil)
		}, true},
		{"a local endpoint's interface", func(in *Input) {
			in.Local = slices.Clone(base.Local)
			in.Local[0].Ifindex = 99
		}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := with(tt.change); (got != gen) != tt.changed {
				t.Errorf("generation %#x, before %#x: want changed=%v", got, gen, tt.changed)
			}
		})
	}
}

// TestCompileInfos checks what a snapshot reports beside its entries for a small input.
func TestCompileInfos(t *testing.T) {
	input := Input{
		Endpoints: []*nimbusv1.Object{
			endpointObj("acme", "web1", []string{"10.0.0.1"}, "web"),
			endpointObj("acme", "app1", []string{"10.0.1.1", "fd00::1"}, "app"),
			endpointObj("acme", "app2", []string{"10.0.1.2"}, "app", "ops"),
		},
		Groups: []*nimbusv1.Object{groupObj("acme", "app", "10.0.1.0/24")},
		Policies: []*nimbusv1.Object{
			policyObj("acme", "web-in", []string{"web"},
				[]r{{action: "allow", proto: "tcp", ports: ports("80", "8000-8080"), peers: peers("app", "10.0.0.0/8")}},
				[]r{{action: "deny", proto: "udp"}}),
		},
		Local: []Local{{Endpoint: epKey("acme", "web1"), Ifindex: 7}},
	}
	s := Compile(input)
	policy := "NetworkSecurityPolicy/acme/default/web-in"
	policyKey := nimbusv1.MakeKey(nimbusv1.Kind_KIND_NETWORK_SECURITY_POLICY, "acme", "", "web-in")
	app := "group:SecurityGroup/acme/default/app"
	scope := fnv32aStd("acme")

	wantEndpoints := []EndpointInfo{{
		Endpoint: nimbusv1.MakeKey(nimbusv1.Kind_KIND_ENDPOINT, "acme", "", "web1"), Ifindex: 7, ID: fnv32aStd(epKey("acme", "web1")), Scope: scope,
		Subject: fnv32aStd(policy), Flags: FlagIngress | FlagEgress, Policies: []nimbusv1.Key{policyKey},
	}}
	if !reflect.DeepEqual(s.Endpoints, wantEndpoints) {
		t.Errorf("endpoints:\n got %+v\nwant %+v", s.Endpoints, wantEndpoints)
	}
	wantSubjects := []SubjectInfo{{ID: fnv32aStd(policy), Policies: []nimbusv1.Key{policyKey}}}
	if !reflect.DeepEqual(s.Subjects, wantSubjects) {
		t.Errorf("subjects:\n got %+v\nwant %+v", s.Subjects, wantSubjects)
	}
	wantRules := []RuleInfo{
		{ID: fnv64aStd(policy + "|ingress|0"), Policy: policyKey, Dir: DirIngress, Index: 0, Action: "allow",
			Protocol: "tcp", Ports: []string{"80", "8000-8080"}, Peers: []string{app, "cidr:10.0.0.0/8"}},
		{ID: fnv64aStd(policy + "|egress|0"), Policy: policyKey, Dir: DirEgress, Index: 0, Action: "deny", Protocol: "udp"},
	}
	if !reflect.DeepEqual(s.Rules, wantRules) {
		t.Errorf("rules:\n got %+v\nwant %+v", s.Rules, wantRules)
	}
	// 10.0.0.0/8 holds 10.0.1.0/24 (app's CIDR) which holds app1's and app2's addresses;
	// app1's IPv6 address is in app only. web1's own address is in no group a rule names
	// and gets no entry; ops is named by no rule and gives no label.
	wantIdentities := map[string][]netip.Prefix{
		"cidr:10.0.0.0/8": {netip.MustParsePrefix("10.0.0.0/8")},
		"cidr:10.0.0.0/8\n" + app: {
			netip.MustParsePrefix("10.0.1.0/24"), netip.MustParsePrefix("10.0.1.1/32"), netip.MustParsePrefix("10.0.1.2/32"),
		},
		app: {netip.MustParsePrefix("fd00::1/128")},
	}
	if len(s.Identities) != len(wantIdentities) {
		t.Errorf("identities: got %+v, want %d", s.Identities, len(wantIdentities))
	}
	for _, id := range s.Identities {
		name := strings.Join(id.Labels, "\n")
		prefixes, ok := wantIdentities[name]
		switch {
		case !ok:
			t.Errorf("unexpected identity %+v", id)
		case !slices.Equal(id.Prefixes, prefixes):
			t.Errorf("identity %q prefixes %v, want %v", name, id.Prefixes, prefixes)
		case id.ID != fnv32aStd(name) || id.Scope != scope || id.Tenant != "acme":
			t.Errorf("identity %q: id %#x scope %#x tenant %q, want %#x %#x acme", name, id.ID, id.Scope, id.Tenant, fnv32aStd(name), scope)
		}
	}

	// Entries: 1 endpoint, 5 identity prefixes, and for each of the three identities,
	// which all carry a label of the ingress rule, its port blocks for tcp (80;
	// 8000-8063, 8064-8079, 8080); the egress deny of udp to any peer.
	var tables [4]int
	for _, e := range s.Entries {
		tables[e.Key.Data[0]]++
	}
	if tables[TableEndpoint] != 1 || tables[TableIdentity] != 5 || tables[TablePolicy] != 3*4+1 {
		t.Errorf("entries by table %v, want 1 endpoint, 5 identity, 13 policy:\n%v", tables, describeAll(s))
	}
	for _, e := range s.Entries {
		if e.Key.Data[0] == TableEndpoint && e.Value.Gen != s.Gen {
			t.Errorf("endpoint entry gen %#x, want the snapshot's %#x", e.Value.Gen, s.Gen)
		}
	}
}

// describeAll returns every entry of the snapshot described, one a line.
func describeAll(s *Snapshot) string {
	var out string
	for _, e := range s.Entries {
		out += DescribeEntry(e) + "\n"
	}
	return out
}

// TestCompileProblems feeds objects that validation would refuse: each bad part is
// reported with its object, field and value; a bad rule matches nothing but still
// protects its direction; a bad address is left out.
func TestCompileProblems(t *testing.T) {
	bad := func(mutate func(*nimbusv1.PolicyRule)) *nimbusv1.Object {
		o := policyObj("acme", "p", []string{"web"}, []r{
			{action: "allow", proto: "tcp", ports: ports("80")},
			{action: "allow", proto: "tcp", ports: ports("22")},
		}, nil)
		mutate(o.GetNetworkSecurityPolicy().GetIngress()[1])
		return o
	}
	tests := []struct {
		name    string
		policy  *nimbusv1.Object
		problem string
	}{
		{"bad port", bad(func(pr *nimbusv1.PolicyRule) { pr.Ports = append(pr.Ports, "99999") }),
			`NetworkSecurityPolicy/acme/default/p: spec.ingress[1].ports[1] "99999": ` + ErrBadPorts.Error()},
		{"bad protocol", bad(func(pr *nimbusv1.PolicyRule) { pr.Protocol = "sctp"; pr.Ports = nil }),
			`NetworkSecurityPolicy/acme/default/p: spec.ingress[1].protocol "sctp": must be "tcp", "udp", "icmp" or empty`},
		{"ports on icmp", bad(func(pr *nimbusv1.PolicyRule) { pr.Protocol = "icmp" }),
			`NetworkSecurityPolicy/acme/default/p: spec.ingress[1].protocol "icmp": ports need protocol tcp or udp`},
		{"ports on any protocol", bad(func(pr *nimbusv1.PolicyRule) { pr.Protocol = "" }),
			`NetworkSecurityPolicy/acme/default/p: spec.ingress[1].protocol "": ports need protocol tcp or udp`},
		{"no action", bad(func(pr *nimbusv1.PolicyRule) { pr.Action = nimbusv1.PolicyRule_ACTION_UNSPECIFIED }),
			`NetworkSecurityPolicy/acme/default/p: spec.ingress[1].action "ACTION_UNSPECIFIED": must be ACTION_ALLOW or ACTION_DENY`},
		{"bad cidr", bad(func(pr *nimbusv1.PolicyRule) { pr.FromCidrs = []string{"10.0.0.0/33"} }),
			`NetworkSecurityPolicy/acme/default/p: spec.ingress[1].fromCidrs[0] "10.0.0.0/33": not a CIDR prefix`},
		{"destination group in an ingress rule", bad(func(pr *nimbusv1.PolicyRule) { pr.ToGroups = []string{"db"} }),
			`NetworkSecurityPolicy/acme/default/p: spec.ingress[1].toGroups[0] "db": an ingress rule names its peers in fromGroups and fromCidrs`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			input := Input{
				Endpoints: []*nimbusv1.Object{
					endpointObj("acme", "web1", []string{"10.0.0.1", "not-an-ip"}, "web"),
				},
				Policies: []*nimbusv1.Object{tt.policy},
				Local:    []Local{{Endpoint: epKey("acme", "web1"), Ifindex: 3}},
			}
			s := Compile(input)
			var msgs []string
			for _, p := range s.Problems {
				msgs = append(msgs, p.Error())
				if !errors.Is(p, nimbusv1.ErrInvalid) {
					t.Errorf("problem %v does not wrap nimbusv1.ErrInvalid", p)
				}
			}
			wantMsgs := []string{
				`Endpoint/acme/default/web1: spec.ips[1] "not-an-ip": not an IP address`,
				tt.problem,
			}
			if !slices.Equal(msgs, wantMsgs) {
				t.Errorf("problems:\n got %q\nwant %q", msgs, wantMsgs)
			}
			tr := newTrie(t, s.Entries)
			peer := netip.MustParseAddr("10.0.1.1")
			if got := tr.check(packet{ifindex: 3, dir: in, peer: peer, proto: protoTCP, port: 80}); !got.allow {
				t.Errorf("port 80: the good rule no longer allows")
			}
			if got := tr.check(packet{ifindex: 3, dir: in, peer: peer, proto: protoTCP, port: 22}); got.allow {
				t.Errorf("port 22: the bad rule allows")
			}
			if len(s.Rules) != 2 {
				t.Errorf("rules %+v: want both, the bad one too, for its counter", s.Rules)
			}
		})
	}
}

// TestCompileLocal checks which local endpoints get an entry.
func TestCompileLocal(t *testing.T) {
	input := Input{
		Endpoints: []*nimbusv1.Object{
			endpointObj("acme", "a", []string{"10.0.0.1"}),
			endpointObj("acme", "b", []string{"10.0.0.2"}),
			endpointObj("acme", "c", []string{"10.0.0.3"}),
		},
		Local: []Local{
			{Endpoint: epKey("acme", "a"), Ifindex: 5},
			{Endpoint: epKey("acme", "b"), Ifindex: 5},       // a's interface
			{Endpoint: epKey("acme", "c"), Ifindex: 0},       // no interface
			{Endpoint: epKey("acme", "missing"), Ifindex: 6}, // no Endpoint
		},
	}
	s := Compile(input)
	if len(s.Endpoints) != 1 || s.Endpoints[0].Endpoint.String() != epKey("acme", "a") {
		t.Errorf("endpoints %+v, want only a", s.Endpoints)
	}
	if len(s.Problems) != 3 {
		t.Errorf("problems %v, want 3", s.Problems)
	}
	if len(s.Entries) != 1 || s.Entries[0].Key != EndpointKey(5) {
		t.Errorf("entries %v, want a's endpoint entry", describeAll(s))
	}
}

func TestCompileSources(t *testing.T) {
	guarded := endpointObj("acme", "a", []string{"fd00::1", "10.0.0.1", "10.0.0.1"})
	guarded.GetEndpoint().Mac = "02:00:00:00:00:0A"
	guarded.GetEndpoint().AllowedSourcePrefixes = []string{"172.16.0.0/24"}
	badMAC := endpointObj("acme", "c", []string{"10.0.0.3"})
	badMAC.GetEndpoint().Mac = "02:00:00:00:00"
	remote := endpointObj("acme", "r", []string{"10.0.0.9"})
	remote.GetEndpoint().Mac = "02:00:00:00:00:09"
	s := Compile(Input{
		Endpoints: []*nimbusv1.Object{guarded, endpointObj("acme", "b", []string{"10.0.0.2"}), badMAC, remote},
		Local: []Local{
			{Endpoint: epKey("acme", "a"), Ifindex: 5},
			{Endpoint: epKey("acme", "b"), Ifindex: 6},
			{Endpoint: epKey("acme", "c"), Ifindex: 7},
		},
	})
	// a is guarded: its MAC, its two addresses (one listed twice) and its allowed prefix
	// are its sources, and they sort last. b and c have no (readable) MAC: not guarded. The remote r has
	// no entries.
	want := []string{
		"endpoint ifindex=5",
		"endpoint ifindex=6",
		"endpoint ifindex=7",
		"source ifindex=5 02:00:00:00:00:0a",
		"source ifindex=5 10.0.0.1",
		"source ifindex=5 172.16.0.0/24",
		"source ifindex=5 fd00::1",
	}
	var got []string
	for _, e := range s.Entries {
		got = append(got, e.Key.String())
	}
	if !slices.Equal(got, want) {
		t.Errorf("entries:\n%s\nwant keys %q", describeAll(s), want)
	}
	flags := map[string]uint32{}
	for _, e := range s.Endpoints {
		flags[e.Endpoint.String()] = e.Flags
	}
	if flags[epKey("acme", "a")] != FlagGuard || flags[epKey("acme", "b")] != 0 || flags[epKey("acme", "c")] != 0 {
		t.Errorf("flags %v, want a guarded and b, c not", flags)
	}
	if len(s.Problems) != 1 || !strings.Contains(s.Problems[0].Error(), `spec.mac "02:00:00:00:00"`) {
		t.Errorf("problems %v, want c's spec.mac", s.Problems)
	}
	for _, e := range s.Entries {
		if e.Key.Data[0] == TableSource && e.Value.ID != s.Endpoints[0].ID {
			t.Errorf("source entry %s has id %#x, want a's %#x", e.Key, e.Value.ID, s.Endpoints[0].ID)
		}
	}
}
