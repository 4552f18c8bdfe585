package delphiv1

import (
	"errors"
	"net/netip"
	"strings"
)

// FlowName is an object named by a FlowsRequest's from, to or policy: its name and, when
// given, its namespace and tenant.
type FlowName struct {
	Tenant, Namespace, Name string
}

// ParseFlowPeer reads a FlowsRequest's from or to: an address, or an endpoint's name,
// namespace/name or tenant/namespace/name. The error says why s is neither, without
// naming the field.
func ParseFlowPeer(s string) (netip.Addr, FlowName, error) {
	if a, err := netip.ParseAddr(s); err == nil {
		return a.Unmap(), FlowName{}, nil
	}
	var n FlowName
	parts := strings.Split(s, "/")
	switch len(parts) {
	case 1:
		n.Name = parts[0]
	case 2:
		n.Namespace, n.Name = parts[0], parts[1]
	case 3:
		n.Tenant, n.Namespace, n.Name = parts[0], parts[1], parts[2]
	default:
		return netip.Addr{}, FlowName{}, errors.New("want an address or an endpoint's name, namespace/name or tenant/namespace/name")
	}
	if n.Name == "" {
		return netip.Addr{}, FlowName{}, errors.New("the endpoint's name is empty")
	}
	return netip.Addr{}, n, nil
}

// ParseFlowPolicy reads a FlowsRequest's policy: a NetworkSecurityPolicy's name,
// namespace/name or tenant/namespace/name.
func ParseFlowPolicy(s string) (FlowName, error) {
	a, n, err := ParseFlowPeer(s)
	if err != nil || a.IsValid() {
		return FlowName{}, errors.New("want a NetworkSecurityPolicy's name, namespace/name or tenant/namespace/name")
	}
	return n, nil
}
