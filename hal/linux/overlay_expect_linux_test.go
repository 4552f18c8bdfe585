package linux

import (
	"net/netip"
	"slices"
	"testing"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// TestGatewayAddresses: a network's gateway addresses are its subnets' gateways with the
// subnets' lengths, those without a gateway give none, and a spec the reconciler refuses
// gives an error.
func TestGatewayAddresses(t *testing.T) {
	network := func(spec *nimbusv1.NetworkSpec) *nimbusv1.Object {
		return &nimbusv1.Object{Meta: &nimbusv1.ObjectMeta{Name: "blue"}, Spec: &nimbusv1.Object_Network{Network: spec}}
	}
	got, err := GatewayAddresses(network(&nimbusv1.NetworkSpec{Vni: 100, Subnet: "10.1.0.0/24", Gateway: "10.1.0.1",
		Subnets: []*nimbusv1.Subnet{{Cidr: "10.2.0.0/16"}, {Cidr: "fd00:1::/64", Gateway: "fd00:1::1"}}}))
	want := []netip.Prefix{netip.MustParsePrefix("10.1.0.1/24"), netip.MustParsePrefix("fd00:1::1/64")}
	if err != nil || !slices.Equal(got, want) {
		t.Errorf("GatewayAddresses = %v, %v; want %v", got, err, want)
	}
	if got, err := GatewayAddresses(network(&nimbusv1.NetworkSpec{Vni: 100, Subnet: "10.1.0.0/24", Gateway: "10.9.0.1"})); err == nil {
		t.Errorf("GatewayAddresses of a gateway outside its subnet = %v, want an error", got)
	}
}
