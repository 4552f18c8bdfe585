package linux

import (
	"net/netip"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// This file gives readers outside the reconcilers (the agent's `dataplane` view) what the
// overlay's reconcilers derive from an object, by the reconcilers' own rules, so that
// what a reader expects of the kernel is what the reconcilers program.

// GatewayAddresses returns the addresses the network reconciler gives the bridge of the
// Network obj: each subnet's gateway with the subnet's prefix length, in the order of
// spec.AllSubnets. It fails, as a reconcile would, for a spec nimbus should have refused.
func GatewayAddresses(obj *nimbusv1.Object) ([]netip.Prefix, error) {
	want, err := wantNetwork(obj.Key().Key(), obj)
	if err != nil {
		return nil, err
	}
	var out []netip.Prefix
	for _, s := range want.subnets {
		if s.gw.IsValid() {
			out = append(out, netip.PrefixFrom(s.gw, s.prefix.Bits()))
		}
	}
	return out, nil
}
