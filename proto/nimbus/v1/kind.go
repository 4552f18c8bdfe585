package nimbusv1

import (
	"fmt"
	"strings"
)

// kindNames maps every known kind to its CamelCase manifest name.
var kindNames = map[Kind]string{
	Kind_KIND_NODE:                    "Node",
	Kind_KIND_NETWORK:                 "Network",
	Kind_KIND_ENDPOINT:                "Endpoint",
	Kind_KIND_SECURITY_GROUP:          "SecurityGroup",
	Kind_KIND_NETWORK_SECURITY_POLICY: "NetworkSecurityPolicy",
	Kind_KIND_ROUTE:                   "Route",
	Kind_KIND_INTERFACE:               "Interface",
	Kind_KIND_FLOW_EXPORT_POLICY:      "FlowExportPolicy",
	Kind_KIND_TRACE:                   "Trace",
}

// Kinds lists every known kind in enum order.
func Kinds() []Kind {
	return []Kind{
		Kind_KIND_NODE, Kind_KIND_NETWORK, Kind_KIND_ENDPOINT, Kind_KIND_SECURITY_GROUP,
		Kind_KIND_NETWORK_SECURITY_POLICY, Kind_KIND_ROUTE, Kind_KIND_INTERFACE,
		Kind_KIND_FLOW_EXPORT_POLICY, Kind_KIND_TRACE,
	}
}

// Name returns the kind's CamelCase manifest name, such as "Route".
func (k Kind) Name() string {
	if n, ok := kindNames[k]; ok {
		return n
	}
	return k.String()
}

// ParseKind parses a kind name case-insensitively, singular or plural: "route", "Route",
// "routes", "networksecuritypolicies" and "network-security-policy" all work.
func ParseKind(s string) (Kind, error) {
	if k, ok := kindsBySpelling[kindSeparators.Replace(strings.ToLower(strings.TrimSpace(s)))]; ok {
		return k, nil
	}
	return Kind_KIND_UNSPECIFIED, fmt.Errorf("kind %q: %w", s, ErrUnknownKind)
}

// kindSeparators drops the separators ParseKind ignores.
var kindSeparators = strings.NewReplacer("-", "", "_", "")

// kindsBySpelling maps the lower-case singular and plural names of every kind to it.
var kindsBySpelling = func() map[string]Kind {
	m := make(map[string]Kind, 2*len(kindNames))
	for k, n := range kindNames {
		name := strings.ToLower(n)
		m[name], m[plural(name)] = k, k
	}
	return m
}()

func plural(name string) string {
	if strings.HasSuffix(name, "y") {
		return strings.TrimSuffix(name, "y") + "ies"
	}
	return name + "s"
}

// Kind returns the kind of the object, derived from which spec it carries.
func (o *Object) Kind() Kind {
	switch o.GetSpec().(type) {
	case *Object_Node:
		return Kind_KIND_NODE
	case *Object_Network:
		return Kind_KIND_NETWORK
	case *Object_Endpoint:
		return Kind_KIND_ENDPOINT
	case *Object_SecurityGroup:
		return Kind_KIND_SECURITY_GROUP
	case *Object_NetworkSecurityPolicy:
		return Kind_KIND_NETWORK_SECURITY_POLICY
	case *Object_Route:
		return Kind_KIND_ROUTE
	case *Object_Interface:
		return Kind_KIND_INTERFACE
	case *Object_FlowExportPolicy:
		return Kind_KIND_FLOW_EXPORT_POLICY
	case *Object_Trace:
		return Kind_KIND_TRACE
	}
	return Kind_KIND_UNSPECIFIED
}
