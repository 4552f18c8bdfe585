package firewall

import (
	"net/netip"
	"strconv"
	"testing"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// rulesInput is one local endpoint protected by one policy of n ingress rules, each
// allowing a port range from a distinct /32.
func rulesInput(n int) Input {
	var rules []r
	for i := range n {
		a := netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})
		lo := 1000 + i%5000
		rules = append(rules, r{action: "allow", proto: "tcp",
			ports: ports(strconv.Itoa(lo) + "-" + strconv.Itoa(lo+80)), peers: peers(a.String() + "/32")})
	}
	return Input{
		Endpoints: []*nimbusv1.Object{endpointObj("acme", "web1", []string{"192.168.0.1"}, "web")},
		Policies:  []*nimbusv1.Object{policyObj("acme", "big", []string{"web"}, rules, nil)},
		Local:     []Local{{Endpoint: epKey("acme", "web1"), Ifindex: 1}},
	}
}

// endpointsInput is n endpoints, a quarter of them local, each in two of 20 groups, and
// 100 policies, each attached to one group, allowing TCP from two others, denying UDP from
// a CIDR and allowing egress to a third group. With overlap, the rule CIDRs hold the
// endpoints' addresses, multiplying the identities (label sets) by 40.
func endpointsInput(n int, overlap bool) Input {
	var in Input
	group := func(i int) string { return "g" + strconv.Itoa(i%20) }
	for i := range n {
		name := "ep" + strconv.Itoa(i)
		ip := netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}).String()
		in.Endpoints = append(in.Endpoints, endpointObj("acme", name, []string{ip}, group(i), group(i/20)))
		if i%4 == 0 {
			in.Local = append(in.Local, Local{Endpoint: epKey("acme", name), Ifindex: uint32(i + 1)})
		}
	}
	for i := range 20 {
		in.Groups = append(in.Groups, groupObj("acme", group(i), "172.16."+strconv.Itoa(i)+".0/24"))
	}
	for i := range 100 {
		cidr := "192.168." + strconv.Itoa(i) + ".0/24"
		if overlap {
			cidr = "10.0." + strconv.Itoa(i) + ".0/24"
		}
		in.Policies = append(in.Policies, policyObj("acme", "p"+strconv.Itoa(i), []string{group(i)}, []r{
			{action: "allow", proto: "tcp", ports: ports("80", "8000-8080"), peers: peers(group(i+1), group(i+2))},
			{action: "deny", proto: "udp", peers: peers(cidr)},
		}, []r{{action: "allow", peers: peers(group(i + 3))}}))
	}
	return in
}

func BenchmarkCompile(b *testing.B) {
	for _, bb := range []struct {
		name string
		in   Input
	}{
		{"rules=10000", rulesInput(10000)},
		{"endpoints=10000,policies=100", endpointsInput(10000, false)},
		{"endpoints=10000,policies=100,overlapping-cidrs", endpointsInput(10000, true)},
	} {
		b.Run(bb.name, func(b *testing.B) {
			var s *Snapshot
			for b.Loop() {
				s = Compile(bb.in)
			}
			b.ReportMetric(float64(len(s.Entries)), "entries")
		})
	}
}

// TestCompileLarge checks that the large inputs of BenchmarkCompile compile to what they
// should: every rule's /32 is its own identity with its port blocks.
func TestCompileLarge(t *testing.T) {
	if testing.Short() {
		t.Skip("large input")
	}
	s := Compile(rulesInput(10000))
	var identities int
	for _, e := range s.Entries {
		if e.Key.Data[0] == TableIdentity {
			identities++
		}
	}
	if identities != 10000 || len(s.Rules) != 10000 {
		t.Errorf("%d identity entries and %d rules, want 10000 each", identities, len(s.Rules))
	}
	tr := newTrie(t, s.Entries)
	for _, i := range []int{0, 1, 4999, 5000, 9999} {
		peer := netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})
		lo := uint16(1000 + i%5000)
		for port, allow := range map[uint16]bool{lo - 1: false, lo: true, lo + 80: true, lo + 81: false} {
			got := tr.check(packet{ifindex: 1, dir: in, peer: peer, proto: protoTCP, port: port})
			if got.allow != allow || (allow && got.rule != s.Rules[i].ID) {
				t.Errorf("rule %d, port %d: %+v, want allow=%v by rule %d", i, port, got, allow, i)
			}
		}
	}
	e := Compile(endpointsInput(10000, false))
	if len(e.Endpoints) != 2500 || len(e.Problems) != 0 {
		t.Errorf("%d local endpoints, problems %v; want 2500, none", len(e.Endpoints), e.Problems)
	}
}
