package firewall

import nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"

// Lister lists the desired objects of a kind, as delphi does.
type Lister interface {
	// List returns the desired objects of one kind, ordered by key.
	List(kind nimbusv1.Kind) []*nimbusv1.Object
}

// InputOf returns what the firewall of the node compiles its snapshot from: every
// Endpoint, SecurityGroup and NetworkSecurityPolicy the store lists, and, as local
// endpoints, the endpoints of the node whose interface is in ifindexes (by name).
func InputOf(store Lister, node string, ifindexes map[string]int) Input {
	in := Input{
		Endpoints: store.List(nimbusv1.Kind_KIND_ENDPOINT),
		Groups:    store.List(nimbusv1.Kind_KIND_SECURITY_GROUP),
		Policies:  store.List(nimbusv1.Kind_KIND_NETWORK_SECURITY_POLICY),
	}
	for _, ep := range in.Endpoints {
		s := ep.GetEndpoint()
		if s.GetNode() != node || s.GetInterface() == "" {
			continue
		}
		if i, ok := ifindexes[s.GetInterface()]; ok {
			in.Local = append(in.Local, Local{Endpoint: ep.Key().ID(), Ifindex: uint32(i)})
		}
	}
	return in
}
