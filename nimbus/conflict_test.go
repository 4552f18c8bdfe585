package nimbus

import (
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// endpoint returns an Endpoint of the network on the node, with the interface, MAC and
// addresses given (any of them may be empty).
func endpoint(name, network, node, iface, mac string, ips ...string) *nimbusv1.Object {
	return &nimbusv1.Object{
		Meta: &nimbusv1.ObjectMeta{Name: name},
		Spec: &nimbusv1.Object_Endpoint{Endpoint: &nimbusv1.EndpointSpec{
			Network: network, Node: node, Interface: iface, Mac: mac, Ips: ips,
		}},
	}
}
