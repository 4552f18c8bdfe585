package nimbusv1

import (
	"maps"
	"testing"
)

// TestOperationalDataMap checks the string form of every kind's operational data against
// the keys and values the agents of the release before wrote.
func TestOperationalDataMap(t *testing.T) {
	for _, tc := range []struct {
		name string
		op   *OperationalData
		want map[string]string
	}{
		{"nil", nil, nil},
		{"none", &OperationalData{}, map[string]string{}},
		{"local node", &OperationalData{Kind: &OperationalData_Node{Node: &NodeOperational{Role: NodeRole_NODE_ROLE_LOCAL, Vtep: "192.0.2.1"}}},
			map[string]string{"role": "local", "vtep": "192.0.2.1"}},
		{"remote node without VTEP", &OperationalData{Kind: &OperationalData_Node{Node: &NodeOperational{Role: NodeRole_NODE_ROLE_REMOTE}}},
			map[string]string{"role": "remote"}},
		{"network", &OperationalData{Kind: &OperationalData_Network{Network: &NetworkOperational{
			Bridge: "nbr1", Vxlan: "nvx1", Vni: 100, Vtep: "192.0.2.1", TenantTable: 1234,
			RemoteVteps: []string{"192.0.2.2", "192.0.2.3"}, NodesWithoutVtep: []string{"n3", "n4"},
			Mtu: 1450, Underlay: "eth0 mtu 1500", MtuWarning: "spec.mtu 9000: does not fit", GatewayMark: 0x4d2,
			Ipv6ForwardingUnavailable: "no force_forwarding",
		}}}, map[string]string{
			"bridge": "nbr1", "vxlan": "nvx1", "vni": "100", "vtep": "192.0.2.1", "tenantTable": "1234",
			"remoteVteps": "192.0.2.2,192.0.2.3", "nodesWithoutVtep": "n3,n4", "mtu": "1450", "underlay": "eth0 mtu 1500",
			"mtuWarning": "spec.mtu 9000: does not fit", "gatewayMark": "0x4d2", "ipv6Forwarding": "unavailable: no force_forwarding",
		}},
		{"network without gateway", &OperationalData{Kind: &OperationalData_Network{Network: &NetworkOperational{
			Bridge: "nbr1", Vxlan: "nvx1", Vni: 100, Vtep: "192.0.2.1", TenantTable: 1234, Mtu: 1450, Underlay: "u",
			GatewayUnavailable: "loading: operation not permitted",
		}}}, map[string]string{
			"bridge": "nbr1", "vxlan": "nvx1", "vni": "100", "vtep": "192.0.2.1", "tenantTable": "1234",
			"remoteVteps": "", "mtu": "1450", "underlay": "u", "gatewayMark": "unavailable: loading: operation not permitted",
		}},
		{"remote endpoint", &OperationalData{Kind: &OperationalData_Endpoint{Endpoint: &EndpointOperational{
			Role: NodeRole_NODE_ROLE_REMOTE, Bridge: "nbr1", Vtep: "192.0.2.2", Mac: "02:00:00:00:00:01",
		}}}, map[string]string{"role": "remote", "bridge": "nbr1", "vtep": "192.0.2.2", "mac": "02:00:00:00:00:01"}},
		{"local endpoint without firewall", &OperationalData{Kind: &OperationalData_Endpoint{Endpoint: &EndpointOperational{
			Role: NodeRole_NODE_ROLE_LOCAL, Bridge: "nbr1", Interface: "wl1",
		}}}, map[string]string{"role": "local", "bridge": "nbr1", "interface": "wl1"}},
		{"local endpoint guarded", &OperationalData{Kind: &OperationalData_Endpoint{Endpoint: &EndpointOperational{
			Role: NodeRole_NODE_ROLE_LOCAL, Bridge: "nbr1", Interface: "wl1",
			Firewall: &EndpointFirewall{IngressProtected: true, SourcesGuarded: true,
				Counters:      &EndpointFirewallCounters{AllowedPackets: 1, AllowedBytes: 2, DeniedPackets: 3, DeniedBytes: 4, SpoofedPackets: 5, SpoofedBytes: 6},
				MissingGroups: []string{`spec.securityGroups[0] "web"`, `spec.securityGroups[1] "db"`}},
		}}}, map[string]string{
			"role": "local", "bridge": "nbr1", "interface": "wl1",
			"firewall.ingress": "protected", "firewall.egress": "open", "firewall.sources": "guarded",
			"firewall.allowedPackets": "1", "firewall.allowedBytes": "2", "firewall.deniedPackets": "3", "firewall.deniedBytes": "4",
			"firewall.spoofedPackets": "5", "firewall.spoofedBytes": "6",
			"firewall.missingGroups": `spec.securityGroups[0] "web", spec.securityGroups[1] "db"`,
		}},
		{"local endpoint unchecked, counters unread", &OperationalData{Kind: &OperationalData_Endpoint{Endpoint: &EndpointOperational{
			Role: NodeRole_NODE_ROLE_LOCAL, Bridge: "nbr1", Interface: "wl1", Firewall: &EndpointFirewall{EgressProtected: true},
		}}}, map[string]string{
			"role": "local", "bridge": "nbr1", "interface": "wl1",
			"firewall.ingress": "open", "firewall.egress": "protected", "firewall.sources": "unchecked",
		}},
		{"policy", &OperationalData{Kind: &OperationalData_SecurityPolicy{SecurityPolicy: &SecurityPolicyOperational{
			ProtectedEndpoints: 2, Rules: []*PolicyRuleCounters{
				{Direction: PolicyRuleCounters_DIRECTION_INGRESS, Index: 0, Packets: 12, Bytes: 1000},
				{Direction: PolicyRuleCounters_DIRECTION_EGRESS, Index: 3, Packets: 1, Bytes: 64},
			},
		}}}, map[string]string{
			"protectedEndpoints": "2", "ingress[0].packets": "12", "ingress[0].bytes": "1000",
			"egress[3].packets": "1", "egress[3].bytes": "64",
		}},
		{"interface", &OperationalData{Kind: &OperationalData_Interface{Interface: &InterfaceOperational{
			OperState: LinkOperState_LINK_OPER_STATE_LOWER_LAYER_DOWN, AdminUp: true, Mtu: 1500,
			RxBytes: 1, TxBytes: 2, RxPackets: 3, TxPackets: 4, RxErrors: 5, TxErrors: 6, RxDropped: 7, TxDropped: 8,
		}}}, map[string]string{
			"operState": "lower-layer-down", "carrier": "false", "adminUp": "true", "mtu": "1500",
			"rxBytes": "1", "txBytes": "2", "rxPackets": "3", "txPackets": "4",
			"rxErrors": "5", "txErrors": "6", "rxDropped": "7", "txDropped": "8",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.op.Map()
			if !maps.Equal(got, tc.want) || (got == nil) != (tc.want == nil) {
				t.Errorf("Map() = %v\nwant     %v", got, tc.want)
			}
		})
	}
}
