package linux

import (
	"slices"
	"strings"
	"testing"

	"github.com/naplesnet/naples/hal"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// TestNetworkSubnetRevertLeavesNoRoute: a subnet with a gateway added to a network and
// then taken out again leaves no route in the tenant's table, with the HAL and the
// observer running. The kernel keeps a route of a table other than main whose preferred
// source address goes away; the reconciler must delete it.
func TestNetworkSubnetRevertLeavesNoRoute(t *testing.T) {
	h := newOverlayHost(t)
	runHAL(t, h.store, hal.Options{Reconcilers: []hal.Reconciler{h.rec}})
	base := []*nimbusv1.Subnet{subnet("10.1.0.0/24", "10.1.0.1"), subnet("2001:db8:1::/64", "2001:db8:1::1")}
	gen := int64(1)
	put := func(subnets ...*nimbusv1.Subnet) *nimbusv1.Object {
		obj := networkObj("acme", "blue", 100, 0, subnets...)
		obj.Meta.Generation = gen
		h.put(t, obj)
		waitStatus(t, h.store, obj.Key(), func(s *nimbusv1.NodeStatus) bool {
			return s.GetObservedGeneration() == gen && s.GetPhase() == nimbusv1.Phase_PHASE_PROGRAMMED
		})
		gen++
		return obj
	}
	h.put(t, nodeObj(localNode, "192.0.2.1"))
	obj := put(base...)
	table := TenantTable("acme")
	for _, added := range []*nimbusv1.Subnet{subnet("10.1.1.0/24", "10.1.1.1"), subnet("2001:db8:2::/64", "2001:db8:2::1")} {
		put(append(slices.Clone(base), added)...)
		prefix := strings.Split(added.GetCidr(), "/")[0]
		mustContain(t, "the tenant table with the subnet added", h.state(t, obj.Key(), table).table, prefix)
		put(base...)
		mustNotContain(t, "the tenant table with the subnet taken out again", h.state(t, obj.Key(), table).table, prefix)
	}
}
