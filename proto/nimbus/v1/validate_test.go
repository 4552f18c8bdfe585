package nimbusv1

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"
)

func validRoute() *Object {
	return &Object{
		Meta: &ObjectMeta{Name: "to-dc2", Nodes: []string{"host-a"}},
		Spec: &Object_Route{Route: &RouteSpec{Table: 100, Prefix: "198.51.100.0/24", Nexthops: []*NextHop{{Gateway: "10.10.0.2"}}}},
	}
}

// nodeWithVTEP makes the object a Node with the VTEP address.
func nodeWithVTEP(vtep string) func(o *Object) {
	return func(o *Object) { o.Spec = &Object_Node{Node: &NodeSpec{VtepAddress: vtep}} }
}

// endpointWithMAC makes the object an Endpoint with the MAC address.
func endpointWithMAC(mac string) func(o *Object) {
	return func(o *Object) {
		o.Spec = &Object_Endpoint{Endpoint: &EndpointSpec{Network: "net1", Node: "host-a", Mac: mac}}
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(o *Object)
		want   string // "" means valid; otherwise the exact error text
	}{
		{name: "valid", mutate: func(*Object) {}},
		{name: "ecmp v6", mutate: func(o *Object) {
			o.GetRoute().Prefix = "2001:db8::/32"
			o.GetRoute().Nexthops = []*NextHop{{Gateway: "fe80::1", Device: "eth0"}, {Gateway: "2001:db8:1::1", Weight: 3}}
		}},
		{name: "a bad weight and device past the names made once", mutate: func(o *Object) {
			for i := range 11 {
				o.GetRoute().Nexthops = append(o.GetRoute().Nexthops, &NextHop{Gateway: fmt.Sprintf("10.10.0.%d", 3+i)})
			}
			o.GetRoute().Nexthops[1].Weight = 300
			o.GetRoute().Nexthops[7].Device = "a/b"
			o.GetRoute().Nexthops[8].Weight = 257
			o.GetRoute().Nexthops[11].Gateway = "2001:db8::1"
		}, want: `spec.nexthops[1].weight "300": must be between 1 and 256` + "\n" +
			`spec.nexthops[7].device "a/b": not a Linux interface name (1 to 15 characters, no '/' or spaces)` + "\n" +
			`spec.nexthops[8].weight "257": must be between 1 and 256` + "\n" +
			`spec.nexthops[11].gateway "2001:db8::1": address family differs from spec.prefix 198.51.100.0/24`},
		{name: "prefix length", mutate: func(o *Object) { o.GetRoute().Prefix = "10.0.0.0/33" },
			want: `spec.prefix "10.0.0.0/33": prefix length out of range`},
		{name: "host bits", mutate: func(o *Object) { o.GetRoute().Prefix = "10.0.0.1/24" },
			want: `spec.prefix "10.0.0.1/24": host bits set; did you mean 10.0.0.0/24?`},
		{name: "non-canonical v6 prefix", mutate: func(o *Object) {
			o.GetRoute().Prefix = "2001:DB8:FF::/48"
			o.GetRoute().Nexthops[0].Gateway = "2001:db8:1::2"
		}, want: `spec.prefix "2001:DB8:FF::/48": not in canonical form (RFC 5952: lower case, shortest); write 2001:db8:ff::/48`},
		{name: "non-canonical v6 gateway", mutate: func(o *Object) {
			o.GetRoute().Prefix = "2001:db8:ff::/48"
			o.GetRoute().Nexthops[0].Gateway = "2001:db8:1:0:0:0:0:2"
		}, want: `spec.nexthops[0].gateway "2001:db8:1:0:0:0:0:2": not in canonical form (RFC 5952: lower case, shortest); write 2001:db8:1::2`},
		{name: "gateway", mutate: func(o *Object) { o.GetRoute().Nexthops[0].Gateway = "10.10.0.999" },
			want: `spec.nexthops[0].gateway "10.10.0.999": not an IP address`},
		{name: "family", mutate: func(o *Object) { o.GetRoute().Nexthops[0].Gateway = "2001:db8::1" },
			want: `spec.nexthops[0].gateway "2001:db8::1": address family differs from spec.prefix 198.51.100.0/24`},
		{name: "no next hops", mutate: func(o *Object) { o.GetRoute().Nexthops = nil },
			want: `spec.nexthops "": at least one next hop is required`},
		{name: "table 0", mutate: func(o *Object) { o.GetRoute().Table = 0 },
			want: `spec.table "0": is required (1 to 4294967295), or spec.tenantTable`},
		{name: "tenant table", mutate: func(o *Object) { o.GetRoute().Table, o.GetRoute().TenantTable = 0, true }},
		{name: "tenant table and table", mutate: func(o *Object) { o.GetRoute().TenantTable = true },
			want: `spec.table "100": must be 0 with spec.tenantTable, which picks the tenant's table`},
		{name: "local table", mutate: func(o *Object) { o.GetRoute().Table = 255 },
			want: `spec.table "255": table 255 is the kernel's "local" table and cannot be used`},
		{name: "name", mutate: func(o *Object) { o.Meta.Name = "To_DC2" },
			want: `meta.name "To_DC2": must be lower-case letters, digits, '-' and '.', at most 253 characters`},
		{name: "missing name", mutate: func(o *Object) { o.Meta.Name = "" }, want: `meta.name "": is required`},
		{name: "node", mutate: func(o *Object) { o.Meta.Nodes = []string{"host a"} },
			want: `meta.nodes[0] "host a": must be lower-case letters, digits, '-' and '.', at most 253 characters`},
		{name: "no spec", mutate: func(o *Object) { o.Spec = nil }, want: `spec "": is required`},
		{name: "network vni", mutate: func(o *Object) {
			o.Spec = &Object_Network{Network: &NetworkSpec{Vni: 1 << 24, Subnet: "10.1.0.0/24", Gateway: "10.2.0.1"}}
		}, want: "spec.vni \"16777216\": must be between 1 and 16777215\nspec.gateway \"10.2.0.1\": not inside spec.subnet 10.1.0.0/24"},
		{name: "dual-stack network", mutate: func(o *Object) {
			o.Spec = &Object_Network{Network: &NetworkSpec{Vni: 100, Subnets: []*Subnet{
				{Cidr: "10.1.0.0/24", Gateway: "10.1.0.1"}, {Cidr: "fd00:1::/64", Gateway: "fd00:1::1"}, {Cidr: "10.2.0.0/24"},
			}}}
		}},
		{name: "network gateway at the network address", mutate: func(o *Object) {
			o.Spec = &Object_Network{Network: &NetworkSpec{Vni: 100, Subnet: "10.1.0.0/24", Gateway: "10.1.0.0"}}
		}, want: `spec.gateway "10.1.0.0": the network address of spec.subnet 10.1.0.0/24; a gateway needs a host address`},
		{name: "network gateway at the broadcast address", mutate: func(o *Object) {
			o.Spec = &Object_Network{Network: &NetworkSpec{Vni: 100, Subnets: []*Subnet{{Cidr: "10.1.0.0/22", Gateway: "10.1.3.255"}}}}
		}, want: `spec.subnets[0].gateway "10.1.3.255": the broadcast address of spec.subnets[0].cidr 10.1.0.0/22; a gateway needs a host address`},
		{name: "network gateway of a point-to-point subnet", mutate: func(o *Object) {
			o.Spec = &Object_Network{Network: &NetworkSpec{Vni: 100, Subnets: []*Subnet{
				{Cidr: "10.1.0.0/31", Gateway: "10.1.0.1"}, {Cidr: "fd00:1::/64", Gateway: "fd00:1::"}, {Cidr: "10.2.0.0/30", Gateway: "10.2.0.2"},
			}}}
		}},
		{name: "node", mutate: nodeWithVTEP("192.0.2.1")},
		{name: "node ipv6", mutate: nodeWithVTEP("2001:db8::1")},
		{name: "node multicast vtep", mutate: nodeWithVTEP("239.1.1.1"),
			want: `spec.vtepAddress "239.1.1.1": not a unicast address of a host; tunnels to the node need one`},
		{name: "node unspecified vtep", mutate: nodeWithVTEP("::"),
			want: `spec.vtepAddress "::": not a unicast address of a host; tunnels to the node need one`},
		{name: "node loopback vtep", mutate: nodeWithVTEP("127.0.0.1"),
			want: `spec.vtepAddress "127.0.0.1": not a unicast address of a host; tunnels to the node need one`},
		{name: "node broadcast vtep", mutate: nodeWithVTEP("255.255.255.255"),
			want: `spec.vtepAddress "255.255.255.255": not a unicast address of a host; tunnels to the node need one`},
		{name: "network without subnet", mutate: func(o *Object) { o.Spec = &Object_Network{Network: &NetworkSpec{Vni: 100}} },
			want: `spec.subnets "": at least one subnet is required (spec.subnet or spec.subnets)`},
		{name: "network gateway without subnet", mutate: func(o *Object) {
			o.Spec = &Object_Network{Network: &NetworkSpec{Vni: 100, Gateway: "10.1.0.1", Subnets: []*Subnet{{Cidr: "10.1.0.0/24"}}}}
		}, want: `spec.gateway "10.1.0.1": needs spec.subnet`},
		{name: "network subnets", mutate: func(o *Object) {
			o.Spec = &Object_Network{Network: &NetworkSpec{Vni: 100, Subnet: "10.1.0.0/16", Subnets: []*Subnet{
				{Cidr: "fd00:1::/64", Gateway: "fd00:2::1"}, {Cidr: "10.1.2.0/24"}, {Cidr: ""},
			}}}
		}, want: "spec.subnets[0].gateway \"fd00:2::1\": not inside spec.subnets[0].cidr fd00:1::/64\n" +
			"spec.subnets[1].cidr \"10.1.2.0/24\": overlaps spec.subnet 10.1.0.0/16\n" +
			"spec.subnets[2].cidr \"\": is required"},
		{name: "endpoint unicast mac", mutate: endpointWithMAC("02:00:00:00:01:0a")},
		{name: "endpoint ipv4 multicast mac", mutate: endpointWithMAC("01:00:5e:00:00:01"),
			want: `spec.mac "01:00:5e:00:00:01": a multicast or broadcast address (group bit set); an endpoint needs a unicast MAC`},
		{name: "endpoint ipv6 multicast mac", mutate: endpointWithMAC("33:33:00:00:00:01"),
			want: `spec.mac "33:33:00:00:00:01": a multicast or broadcast address (group bit set); an endpoint needs a unicast MAC`},
		{name: "endpoint group bit mac", mutate: endpointWithMAC("03:00:00:00:00:0a"),
			want: `spec.mac "03:00:00:00:00:0a": a multicast or broadcast address (group bit set); an endpoint needs a unicast MAC`},
		{name: "endpoint broadcast mac", mutate: endpointWithMAC("ff:ff:ff:ff:ff:ff"),
			want: `spec.mac "ff:ff:ff:ff:ff:ff": a multicast or broadcast address (group bit set); an endpoint needs a unicast MAC`},
		{name: "endpoint zero mac", mutate: endpointWithMAC("00:00:00:00:00:00"),
			want: `spec.mac "00:00:00:00:00:00": the all-zero address; an endpoint needs a unicast MAC`},
		{name: "endpoint long mac", mutate: endpointWithMAC("02:00:00:00:00:00:00:01"),
			want: `spec.mac "02:00:00:00:00:00:00:01": not an Ethernet MAC address`},
		{name: "endpoint allowed source prefixes", mutate: func(o *Object) {
			o.Spec = &Object_Endpoint{Endpoint: &EndpointSpec{Network: "blue", Mac: "02:00:00:00:00:01", Ips: []string{"10.1.0.5"},
				AllowedSourcePrefixes: []string{"172.16.0.0/24", "fd00:99::/64"}}}
		}},
		{name: "endpoint address twice", mutate: func(o *Object) {
			o.Spec = &Object_Endpoint{Endpoint: &EndpointSpec{Network: "blue", Mac: "02:00:00:00:00:01", Ips: []string{"10.1.0.5", "fd00::5", "10.1.0.5"}}}
		}, want: `spec.ips[2] "10.1.0.5": repeats spec.ips[0]`},
		{name: "endpoint address twice in a long list", mutate: func(o *Object) {
			ips := make([]string, 20)
			for i := range ips {
				ips[i] = fmt.Sprintf("10.1.0.%d", 10+i)
			}
			ips[17] = "10.1.0.13"
			o.Spec = &Object_Endpoint{Endpoint: &EndpointSpec{Network: "blue", Mac: "02:00:00:00:00:01", Ips: ips}}
		}, want: `spec.ips[17] "10.1.0.13": repeats spec.ips[3]`},
		{name: "endpoint allowed source prefix", mutate: func(o *Object) {
			o.Spec = &Object_Endpoint{Endpoint: &EndpointSpec{Network: "blue", Mac: "02:00:00:00:00:01", AllowedSourcePrefixes: []string{"172.16.0.0/24", "172.16.0.5/24"}}}
		}, want: `spec.allowedSourcePrefixes[1] "172.16.0.5/24": host bits set; did you mean 172.16.0.0/24?`},
		// Anti-spoofing binds an endpoint's addresses to its MAC.
		{name: "endpoint addresses without a mac", mutate: func(o *Object) {
			o.Spec = &Object_Endpoint{Endpoint: &EndpointSpec{Network: "blue", Ips: []string{"10.1.0.5", "fd00::5"}, AllowedSourcePrefixes: []string{"172.16.0.0/24"}}}
		}, want: `spec.ips "10.1.0.5,fd00::5": an endpoint with addresses needs spec.mac, which its addresses are bound to` + "\n" +
			`spec.allowedSourcePrefixes "172.16.0.0/24": an endpoint with addresses needs spec.mac, which its addresses are bound to`},
		{name: "endpoint without a mac or addresses", mutate: func(o *Object) {
			o.Spec = &Object_Endpoint{Endpoint: &EndpointSpec{Network: "blue", Node: "host-a", Interface: "veth1"}}
		}},
		{name: "policy ports", mutate: func(o *Object) {
			o.Spec = &Object_NetworkSecurityPolicy{NetworkSecurityPolicy: &NetworkSecurityPolicySpec{
				Ingress: []*PolicyRule{{Action: PolicyRule_ACTION_ALLOW, Protocol: "tcp", Ports: []string{"80", "9000-8000"}}},
			}}
		}, want: `spec.ingress[0].ports[1] "9000-8000": must be a port 1-65535 or a range "low-high"`},
		{name: "policy peers on the wrong side", mutate: func(o *Object) {
			o.Spec = &Object_NetworkSecurityPolicy{NetworkSecurityPolicy: &NetworkSecurityPolicySpec{
				Ingress: []*PolicyRule{{Action: PolicyRule_ACTION_ALLOW, FromGroups: []string{"web"}, ToCidrs: []string{"10.0.0.0/8"}}},
				Egress:  []*PolicyRule{{Action: PolicyRule_ACTION_DENY, FromGroups: []string{"db"}, ToGroups: []string{"web"}}},
			}}
		}, want: "spec.ingress[0].toCidrs \"10.0.0.0/8\": an ingress rule names its peers with fromCidrs\n" +
			"spec.egress[0].fromGroups \"db\": an egress rule names its peers with toGroups"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := validRoute()
			tc.mutate(o)
			err := o.Validate()
			if tc.want == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if err == nil || err.Error() != tc.want {
				t.Fatalf("Validate() = %v\nwant %s", err, tc.want)
			}
			var fe *FieldError
			if !errors.As(err, &fe) || !errors.Is(err, ErrInvalid) {
				t.Errorf("error %v is not a *FieldError matching ErrInvalid", err)
			}
		})
	}
}

func TestParseKind(t *testing.T) {
	for in, want := range map[string]Kind{
		"route": Kind_KIND_ROUTE, "Route": Kind_KIND_ROUTE, "ROUTES": Kind_KIND_ROUTE,
		"networksecuritypolicies": Kind_KIND_NETWORK_SECURITY_POLICY, "network-security-policy": Kind_KIND_NETWORK_SECURITY_POLICY,
		"SecurityGroups": Kind_KIND_SECURITY_GROUP, "interface": Kind_KIND_INTERFACE, "nodes": Kind_KIND_NODE,
	} {
		if got, err := ParseKind(in); err != nil || got != want {
			t.Errorf("ParseKind(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	if _, err := ParseKind("rout"); !errors.Is(err, ErrUnknownKind) || !strings.Contains(err.Error(), `"rout"`) {
		t.Errorf("ParseKind(rout) error = %v, want ErrUnknownKind naming the input", err)
	}
}

func TestKeyIDRoundTrip(t *testing.T) {
	k := NewKey(Kind_KIND_NETWORK_SECURITY_POLICY, "", "prod", "web")
	if k.ID() != "NetworkSecurityPolicy/default/prod/web" {
		t.Fatalf("ID() = %q", k.ID())
	}
	back, err := ParseKeyID(k.ID())
	if err != nil || back.ID() != k.ID() {
		t.Fatalf("ParseKeyID(%q) = %v, %v", k.ID(), back, err)
	}
	for _, bad := range []string{"Route/x", "Rout/a/b/c"} {
		if _, err := ParseKeyID(bad); err == nil {
			t.Errorf("ParseKeyID(%q) succeeded", bad)
		}
	}
}

// TestIsNameMatchesThePattern checks isName against the regular expression of a DNS-style
// name it replaces, on edge cases and on random strings of the bytes that matter.
func TestIsNameMatchesThePattern(t *testing.T) {
	pattern := regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$`)
	cases := []string{"", "a", "-", ".", "a.", ".a", "a..b", "a-", "-a", "a-b", "a.-b", "a-.b", "a--b",
		"host-a.example", "A", "a_b", "a b", "é", strings.Repeat("a", 63), strings.Repeat("a", 64),
		strings.Repeat("a", 63) + "." + strings.Repeat("b", 63), strings.Repeat("a", 62) + "-"}
	rnd := rand.New(rand.NewPCG(1, 2))
	const bytes = "ab09-.-.Z_"
	for range 200000 {
		b := make([]byte, rnd.IntN(80))
		for i := range b {
			b[i] = bytes[rnd.IntN(len(bytes))]
		}
		cases = append(cases, string(b))
	}
	for _, s := range cases {
		if got, want := isName(s), pattern.MatchString(s); got != want {
			t.Errorf("isName(%q) = %v, want %v", s, got, want)
		}
	}
}

// BenchmarkValidateRoute validates a route as operators write them: labels, two nodes
// and three next hops.
func BenchmarkValidateRoute(b *testing.B) {
	o := &Object{
		Meta: &ObjectMeta{Name: "dc1-web-0042", Labels: map[string]string{"app": "web", "tier": "frontend", "site": "dc1"},
			Nodes: []string{"host-a", "host-b"}},
		Spec: &Object_Route{Route: &RouteSpec{Table: 100, Prefix: "100.64.0.42/32",
			Nexthops: []*NextHop{{Gateway: "10.10.0.2"}, {Gateway: "10.10.0.3"}, {Gateway: "10.10.0.4"}}}},
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := o.Validate(); err != nil {
			b.Fatal(err)
		}
	}
}
