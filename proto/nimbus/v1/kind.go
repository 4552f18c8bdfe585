package nimbusv1

import (
	"fmt"
	"strings"
	"sync"

	"google.golang.org/protobuf/reflect/protoreflect"
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

// kindShortNames maps every known kind to its short name, which ParseKind accepts too: the
// one kubectl would give it, where kubectl has one ("no" for Node, "ep" for Endpoint).
var kindShortNames = map[Kind]string{
	Kind_KIND_NODE:                    "no",
	Kind_KIND_NETWORK:                 "net",
	Kind_KIND_ENDPOINT:                "ep",
	Kind_KIND_SECURITY_GROUP:          "sg",
	Kind_KIND_NETWORK_SECURITY_POLICY: "nsp",
	Kind_KIND_ROUTE:                   "rt",
	Kind_KIND_INTERFACE:               "if",
	Kind_KIND_FLOW_EXPORT_POLICY:      "fep",
	Kind_KIND_TRACE:                   "tr",
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

// ShortName returns the kind's short name, such as "rt" for Route, or "" for an unknown
// kind.
func (k Kind) ShortName() string { return kindShortNames[k] }

// Plural returns the kind's lower-case plural name, such as "routes" or
// "networksecuritypolicies", or "" for an unknown kind.
func (k Kind) Plural() string {
	if n, ok := kindNames[k]; ok {
		return plural(strings.ToLower(n))
	}
	return ""
}

// ParseKind parses a kind name case-insensitively, singular, plural or short: "route",
// "Route", "routes", "rt", "networksecuritypolicies", "nsp" and "network-security-policy"
// all work.
func ParseKind(s string) (Kind, error) {
	if k, ok := kindsBySpelling[kindSeparators.Replace(strings.ToLower(strings.TrimSpace(s)))]; ok {
		return k, nil
	}
	return Kind_KIND_UNSPECIFIED, fmt.Errorf("kind %q: %w", s, ErrUnknownKind)
}

// kindSeparators drops the separators ParseKind ignores.
var kindSeparators = strings.NewReplacer("-", "", "_", "")

// kindsBySpelling maps the lower-case singular, plural and short names of every kind to
// it. A spelling that two kinds would share panics here, at package initialisation, so
// that no name can silently mean two kinds.
var kindsBySpelling = func() map[string]Kind {
	m := make(map[string]Kind, 3*len(kindNames))
	for k, n := range kindNames {
		name := strings.ToLower(n)
		for _, s := range []string{name, plural(name), kindShortNames[k]} {
			if other, ok := m[s]; ok && other != k {
				panic(fmt.Sprintf("kind name %q names both %s and %s", s, kindNames[other], n))
			}
			m[s] = k
		}
	}
	return m
}()

// plural returns the plural of a lower-case kind name.
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

// specFields maps every known kind to the field of Object's spec oneof that carries its
// spec, read from the descriptors so that it cannot drift from Object.Kind. It is built
// on first use: the descriptors exist only once the package's init functions have run.
var specFields = sync.OnceValue(func() map[Kind]protoreflect.FieldDescriptor {
	fields := (&Object{}).ProtoReflect().Descriptor().Oneofs().ByName("spec").Fields()
	m := make(map[Kind]protoreflect.FieldDescriptor, fields.Len())
	for i := range fields.Len() {
		f := fields.Get(i)
		o := &Object{}
		r := o.ProtoReflect()
		r.Set(f, r.NewField(f))
		m[o.Kind()] = f
	}
	return m
})

// SpecDescriptor returns the descriptor of the kind's spec message, such as RouteSpec's
// for Route, or nil for an unknown kind.
func (k Kind) SpecDescriptor() protoreflect.MessageDescriptor {
	if f, ok := specFields()[k]; ok {
		return f.Message()
	}
	return nil
}

// SpecField returns the field of Object's spec oneof that carries the kind's spec, such
// as route for Route, or nil for an unknown kind.
func (k Kind) SpecField() protoreflect.FieldDescriptor { return specFields()[k] }

// Skeleton returns the object without its labels and spec: its kind (an empty spec of
// it), its meta's tenant, namespace and name, generation, revision and
// generation_revision. It is what a status stream that omits objects sends.
func (o *Object) Skeleton() *Object {
	m := o.GetMeta()
	s := &Object{Meta: &ObjectMeta{Tenant: m.GetTenant(), Namespace: m.GetNamespace(), Name: m.GetName(),
		Generation: m.GetGeneration(), Revision: m.GetRevision(), GenerationRevision: m.GetGenerationRevision()}}
	if f, ok := specFields()[o.Kind()]; ok {
		r := s.ProtoReflect()
		r.Set(f, r.NewField(f))
	}
	return s
}

// Skeleton returns the skeleton (see Object.Skeleton) of the object with the key at the
// generation, its revisions unknown. It is made without reflection, as a wait for
// thousands of objects makes one per status.
func (k *ObjectKey) Skeleton(generation int64) *Object {
	return &Object{Meta: &ObjectMeta{Tenant: k.GetTenant(), Namespace: k.GetNamespace(), Name: k.GetName(), Generation: generation},
		Spec: emptySpec(k.GetKind())}
}

// emptySpec returns the spec oneof of the kind with an empty spec; nil for an unknown
// kind. TestKeySkeleton checks it against the descriptors for every kind.
func emptySpec(k Kind) isObject_Spec {
	switch k {
	case Kind_KIND_NODE:
		return &Object_Node{Node: &NodeSpec{}}
	case Kind_KIND_NETWORK:
		return &Object_Network{Network: &NetworkSpec{}}
	case Kind_KIND_ENDPOINT:
		return &Object_Endpoint{Endpoint: &EndpointSpec{}}
	case Kind_KIND_SECURITY_GROUP:
		return &Object_SecurityGroup{SecurityGroup: &SecurityGroupSpec{}}
	case Kind_KIND_NETWORK_SECURITY_POLICY:
		return &Object_NetworkSecurityPolicy{NetworkSecurityPolicy: &NetworkSecurityPolicySpec{}}
	case Kind_KIND_ROUTE:
		return &Object_Route{Route: &RouteSpec{}}
	case Kind_KIND_INTERFACE:
		return &Object_Interface{Interface: &InterfaceSpec{}}
	case Kind_KIND_FLOW_EXPORT_POLICY:
		return &Object_FlowExportPolicy{FlowExportPolicy: &FlowExportPolicySpec{}}
	case Kind_KIND_TRACE:
		return &Object_Trace{Trace: &TraceSpec{}}
	}
	return nil
}
