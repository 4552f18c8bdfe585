package nimbusv1

import (
	"strconv"
	"strings"
)

// Map returns the operational data in the string form of NodeStatus.operational, which
// is deprecated: the keys and values that readers of that map have had so far, such as
// "egress[0].packets": "12" or "firewall.ingress": "protected". It returns nil for nil
// operational data, and an empty map for a kind that has none.
func (o *OperationalData) Map() map[string]string {
	if o == nil {
		return nil
	}
	m := map[string]string{}
	switch k := o.GetKind().(type) {
	case *OperationalData_Node:
		k.Node.fill(m)
	case *OperationalData_Network:
		k.Network.fill(m)
	case *OperationalData_Endpoint:
		k.Endpoint.fill(m)
	case *OperationalData_SecurityPolicy:
		k.SecurityPolicy.fill(m)
	case *OperationalData_Interface:
		k.Interface.fill(m)
	case *OperationalData_FlowExport:
		k.FlowExport.fill(m)
	case *OperationalData_Trace:
		k.Trace.fill(m)
	}
	return m
}

// mapString returns the role as the operational map has it: "local" or "remote".
func (r NodeRole) mapString() string {
	switch r {
	case NodeRole_NODE_ROLE_LOCAL:
		return "local"
	case NodeRole_NODE_ROLE_REMOTE:
		return "remote"
	}
	return ""
}

// fill adds the node's entries of the operational map to m.
func (n *NodeOperational) fill(m map[string]string) {
	m["role"] = n.GetRole().mapString()
	if v := n.GetVtep(); v != "" {
		m["vtep"] = v
	}
}

// fill adds the network's entries of the operational map to m.
func (n *NetworkOperational) fill(m map[string]string) {
	u := func(v uint32) string { return strconv.FormatUint(uint64(v), 10) }
	m["bridge"] = n.GetBridge()
	m["vxlan"] = n.GetVxlan()
	m["vni"] = u(n.GetVni())
	m["vtep"] = n.GetVtep()
	m["tenantTable"] = u(n.GetTenantTable())
	m["remoteVteps"] = strings.Join(n.GetRemoteVteps(), ",")
	if why := n.GetGatewayUnavailable(); why != "" {
		m["gatewayMark"] = "unavailable: " + why
	} else {
		m["gatewayMark"] = "0x" + strconv.FormatUint(uint64(n.GetGatewayMark()), 16)
	}
	m["mtu"] = u(n.GetMtu())
	m["underlay"] = n.GetUnderlay()
	if without := n.GetNodesWithoutVtep(); len(without) > 0 {
		m["nodesWithoutVtep"] = strings.Join(without, ",")
	}
	if why := n.GetIpv6ForwardingUnavailable(); why != "" {
		m["ipv6Forwarding"] = "unavailable: " + why
	}
	if w := n.GetMtuWarning(); w != "" {
		m["mtuWarning"] = w
	}
}

// fill adds the endpoint's entries of the operational map to m.
func (e *EndpointOperational) fill(m map[string]string) {
	m["role"] = e.GetRole().mapString()
	m["bridge"] = e.GetBridge()
	if e.GetRole() == NodeRole_NODE_ROLE_REMOTE {
		m["vtep"] = e.GetVtep()
		m["mac"] = e.GetMac()
	} else {
		m["interface"] = e.GetInterface()
	}
	fw := e.GetFirewall()
	if fw == nil {
		return
	}
	state := func(protected bool) string {
		if protected {
			return "protected"
		}
		return "open"
	}
	m["firewall.ingress"] = state(fw.GetIngressProtected())
	m["firewall.egress"] = state(fw.GetEgressProtected())
	if fw.GetSourcesGuarded() {
		m["firewall.sources"] = "guarded"
	} else {
		m["firewall.sources"] = "unchecked"
	}
	if c := fw.GetCounters(); c != nil {
		u := func(v uint64) string { return strconv.FormatUint(v, 10) }
		m["firewall.allowedPackets"] = u(c.GetAllowedPackets())
		m["firewall.allowedBytes"] = u(c.GetAllowedBytes())
		m["firewall.deniedPackets"] = u(c.GetDeniedPackets())
		m["firewall.deniedBytes"] = u(c.GetDeniedBytes())
		if fw.GetSourcesGuarded() {
			m["firewall.spoofedPackets"] = u(c.GetSpoofedPackets())
			m["firewall.spoofedBytes"] = u(c.GetSpoofedBytes())
		}
	}
	if missing := fw.GetMissingGroups(); len(missing) > 0 {
		m["firewall.missingGroups"] = strings.Join(missing, ", ")
	}
}

// fill adds the policy's entries of the operational map to m.
func (p *SecurityPolicyOperational) fill(m map[string]string) {
	m["protectedEndpoints"] = strconv.FormatUint(uint64(p.GetProtectedEndpoints()), 10)
	for _, r := range p.GetRules() {
		name := r.Name()
		m[name+".packets"] = strconv.FormatUint(r.GetPackets(), 10)
		m[name+".bytes"] = strconv.FormatUint(r.GetBytes(), 10)
	}
}

// Name returns the rule's name as its policy's spec has it: "ingress[0]", "egress[2]".
func (r *PolicyRuleCounters) Name() string {
	dir := "ingress"
	if r.GetDirection() == PolicyRuleCounters_DIRECTION_EGRESS {
		dir = "egress"
	}
	return dir + "[" + strconv.FormatUint(uint64(r.GetIndex()), 10) + "]"
}

// fill adds the interface's entries of the operational map to m.
func (i *InterfaceOperational) fill(m map[string]string) {
	u := func(v uint64) string { return strconv.FormatUint(v, 10) }
	m["operState"] = i.GetOperState().mapString()
	m["carrier"] = strconv.FormatBool(i.GetCarrier())
	m["adminUp"] = strconv.FormatBool(i.GetAdminUp())
	m["mtu"] = u(uint64(i.GetMtu()))
	m["rxBytes"] = u(i.GetRxBytes())
	m["txBytes"] = u(i.GetTxBytes())
	m["rxPackets"] = u(i.GetRxPackets())
	m["txPackets"] = u(i.GetTxPackets())
	m["rxErrors"] = u(i.GetRxErrors())
	m["txErrors"] = u(i.GetTxErrors())
	m["rxDropped"] = u(i.GetRxDropped())
	m["txDropped"] = u(i.GetTxDropped())
}

// mapString returns the state as the operational map has it, as `ip link` prints it.
func (s LinkOperState) mapString() string {
	switch s {
	case LinkOperState_LINK_OPER_STATE_NOT_PRESENT:
		return "not-present"
	case LinkOperState_LINK_OPER_STATE_DOWN:
		return "down"
	case LinkOperState_LINK_OPER_STATE_LOWER_LAYER_DOWN:
		return "lower-layer-down"
	case LinkOperState_LINK_OPER_STATE_TESTING:
		return "testing"
	case LinkOperState_LINK_OPER_STATE_DORMANT:
		return "dormant"
	case LinkOperState_LINK_OPER_STATE_UP:
		return "up"
	}
	return "unknown"
}

// fill adds the flow exporter's entries of the operational map to m.
func (e *FlowExportOperational) fill(m map[string]string) {
	u := func(v uint64) string { return strconv.FormatUint(v, 10) }
	m["recordsSelected"] = u(e.GetRecordsSelected())
	m["recordsDropped"] = u(e.GetRecordsDropped())
	m["connections"] = u(uint64(e.GetConnections()))
	for _, t := range e.GetTargets() {
		name := t.GetTarget()
		m[name+".recordsSent"] = u(t.GetRecordsSent())
		m[name+".messagesSent"] = u(t.GetMessagesSent())
		m[name+".errors"] = u(t.GetErrors())
		if t.GetLastError() != "" {
			m[name+".lastError"] = t.GetLastError()
		}
	}
}
