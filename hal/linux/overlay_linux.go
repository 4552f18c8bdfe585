package linux

import (
	"crypto/sha256"
	"encoding/hex"
	"hash/fnv"
	"net"
	"net/netip"
	"strconv"
	"strings"

	"github.com/naplesnet/naples/delphi"
	"github.com/naplesnet/naples/hal"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// The overlay's kernel objects are named and marked so that a restarted agent finds its
// own again and never touches anything else. See the package documentation.
const (
	// OverlayRouteProtocol marks the routes the network reconciler creates in tenant
	// tables (a network's subnets, through its bridge). It differs from RouteProtocol, so
	// the route reconciler, which owns every route of RouteProtocol, never sweeps them.
	OverlayRouteProtocol uint8 = 242
	// VXLANPort is the UDP port of the overlay's VXLAN tunnels, IANA's.
	VXLANPort = 4789
	// TenantTableBase is the first policy-routing table of tenants: a tenant routes in
	// table TenantTableBase plus a 24-bit hash of its name (TenantTable).
	TenantTableBase = 0x6E000000
	// TenantRulePriority is the priority of the policy-routing rule that sends what comes
	// in through a network's bridge to its tenant's table; the rule at
	// TenantRulePriority+1 refuses (prohibit) what that table does not route, so that
	// nothing entering from a network falls through to the main table and another
	// tenant's networks.
	TenantRulePriority = 1000

	// LinkGroup is the link group (`ip link show group 28257`) of every link the overlay
	// creates. The kernel takes a link's group, not its alias, in the request that
	// creates it, so the alias follows in a second request; an agent stopped between the
	// two leaves a link of a network's device name in this group without an alias, which
	// the next agent recognises as its own and marks.
	LinkGroup = 0x6E61

	// aliasPrefix starts the alias (IFLA_IFALIAS, `ip link set ... alias`) of every link
	// the overlay creates; the key ID of the object that owns the link follows.
	aliasPrefix = "naples:"
	// bridgePrefix and vxlanPrefix start the names of a network's bridge and VXLAN device.
	bridgePrefix = "nbr"
	vxlanPrefix  = "nvx"
)

// deviceSuffix is what follows the prefix in the names of a network's devices: 8 hex
// digits of the SHA-256 of the network's key ID, so names fit the kernel's 15 characters,
// are the same on every node and survive changes of the network's spec.
func deviceSuffix(networkKeyID string) string {
	sum := sha256.Sum256([]byte(networkKeyID))
	return hex.EncodeToString(sum[:4])
}

// BridgeName returns the name of the bridge of the network with the key ID.
func BridgeName(networkKeyID string) string { return bridgePrefix + deviceSuffix(networkKeyID) }

// VXLANName returns the name of the VXLAN device of the network with the key ID.
func VXLANName(networkKeyID string) string { return vxlanPrefix + deviceSuffix(networkKeyID) }

// OwnerAlias returns the alias that marks a link as created by naples for the object with
// the key ID.
func OwnerAlias(keyID string) string { return aliasPrefix + keyID }

// OwnerOfAlias returns the key ID of the object a link alias names as its owner, and
// whether the alias is one of naples's.
func OwnerOfAlias(alias string) (keyID string, ok bool) {
	return strings.CutPrefix(alias, aliasPrefix)
}

// GatewayMAC returns the MAC address of the gateway of the network with the key ID: the
// address of its bridge on every node, locally administered and unicast, derived from the
// key ID.
func GatewayMAC(networkKeyID string) net.HardwareAddr {
	sum := sha256.Sum256([]byte("gateway-mac/" + networkKeyID))
	mac := net.HardwareAddr(sum[:6])
	mac[0] = mac[0]&^0x01 | 0x02
	return mac
}

// TenantTable returns the policy-routing table the networks of the tenant route in
// (empty: the default tenant).
func TenantTable(tenant string) uint32 {
	if tenant == "" {
		tenant = nimbusv1.DefaultTenant
	}
	h := fnv.New32a()
	h.Write([]byte(tenant))
	return TenantTableBase + h.Sum32()&0xFFFFFF
}

// The indexes the overlay's reconcilers find dependent objects by.
var (
	// EndpointNetworkIndex lists an Endpoint under the key ID of its network.
	EndpointNetworkIndex = delphi.Index{Name: "endpoint_network", Values: func(obj *nimbusv1.Object) []string {
		if k := NetworkKeyOf(obj); k != nil {
			return []string{k.ID()}
		}
		return nil
	}}
	// EndpointNodeIndex lists an Endpoint under the name of the node it is on.
	EndpointNodeIndex = delphi.Index{Name: "endpoint_node", Values: func(obj *nimbusv1.Object) []string {
		if n := obj.GetEndpoint().GetNode(); n != "" {
			return []string{n}
		}
		return nil
	}}
	// EndpointInterfaceIndex lists an Endpoint under the name of its host-side interface.
	EndpointInterfaceIndex = delphi.Index{Name: "endpoint_interface", Values: func(obj *nimbusv1.Object) []string {
		if i := obj.GetEndpoint().GetInterface(); i != "" {
			return []string{i}
		}
		return nil
	}}
	// NetworkVNIIndex lists a Network under its VNI, in decimal.
	NetworkVNIIndex = delphi.Index{Name: "network_vni", Values: func(obj *nimbusv1.Object) []string {
		if n := obj.GetNetwork(); n != nil {
			return []string{strconv.FormatUint(uint64(n.GetVni()), 10)}
		}
		return nil
	}}
)

// NetworkKeyOf returns the key of the network an Endpoint is attached to, in the
// endpoint's tenant and namespace; nil for other objects.
func NetworkKeyOf(endpoint *nimbusv1.Object) *nimbusv1.ObjectKey {
	n := endpoint.GetEndpoint().GetNetwork()
	if n == "" {
		return nil
	}
	m := endpoint.GetMeta()
	return nimbusv1.NewKey(nimbusv1.Kind_KIND_NETWORK, m.GetTenant(), m.GetNamespace(), n)
}

// NodeKey returns the key of the Node object of the named node. Nodes live in the default
// tenant and namespace.
func NodeKey(name string) *nimbusv1.ObjectKey {
	return nimbusv1.NewKey(nimbusv1.Kind_KIND_NODE, "", "", name)
}

// OverlayStore is what the overlay's reconcilers read of delphi.
type OverlayStore interface {
	// Get returns the desired object with the key.
	Get(key *nimbusv1.ObjectKey) (*nimbusv1.Object, bool)
	// Keys returns the keys of the desired objects of one kind, ordered.
	Keys(kind nimbusv1.Kind) []nimbusv1.Key
	// LookupKeys returns the keys of the desired objects a declared index lists under
	// value, ordered.
	LookupKeys(index, value string) ([]nimbusv1.Key, error)
}

// ObjectGetter is what NodeVTEP reads of delphi; OverlayStore is one.
type ObjectGetter interface {
	// Get returns the desired object with the key.
	Get(key *nimbusv1.ObjectKey) (*nimbusv1.Object, bool)
}

// Reasons the overlay's objects are PENDING for.
const (
	// ReasonWaitingForNode: a Node the object needs (this host's, for its VTEP address,
	// or an endpoint's) is missing or has no VTEP address.
	ReasonWaitingForNode = "WaitingForNode"
	// ReasonWaitingForNetwork: an endpoint's network is missing or not programmed on
	// this host yet.
	ReasonWaitingForNetwork = "WaitingForNetwork"
	// ReasonWaitingForInterface: a host interface the object names does not exist.
	ReasonWaitingForInterface = "WaitingForInterface"
	// ReasonWaitingForAddress: this host's Node names a VTEP address that no interface of
	// the host holds yet (or holds only tentatively, while IPv6 duplicate address
	// detection runs).
	ReasonWaitingForAddress = "WaitingForAddress"
)

// NodeVTEP returns the VTEP address of the named node from its Node object. When there is
// no such object, or it has no VTEP address, the error is a pending *hal.Error with
// reason ReasonWaitingForNode that says so.
func NodeVTEP(store ObjectGetter, node string) (netip.Addr, error) {
	obj, ok := store.Get(NodeKey(node))
	if !ok {
		return netip.Addr{}, hal.Pendingf(ReasonWaitingForNode, "waiting for Node %q: no such Node object", node)
	}
	s := obj.GetNode().GetVtepAddress()
	if s == "" {
		return netip.Addr{}, hal.Pendingf(ReasonWaitingForNode, "waiting for Node %q to have spec.vtepAddress", node)
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		// Validated by nimbus; a stored object that does not parse is not ours to fix.
		return netip.Addr{}, hal.Errorf(hal.ReasonInvalid, "Node %q: spec.vtepAddress %q: %v", node, s, err)
	}
	return a, nil
}
