package nimbusv1

import (
	"fmt"
	"slices"
	"strings"
)

// DefaultTenant and DefaultNamespace are used where a key or meta leaves them empty.
const (
	DefaultTenant    = "default"
	DefaultNamespace = "default"
)

// Key returns the object's key, with tenant and namespace defaulted.
func (o *Object) Key() *ObjectKey {
	m := o.GetMeta()
	return NewKey(o.Kind(), m.GetTenant(), m.GetNamespace(), m.GetName())
}

// ObjectKey returns the key of the object the event is about: the key of a DELETE, the
// object's key for a PUT (which leaves the event's key out), nil for other events.
func (e *WatchEvent) ObjectKey() *ObjectKey {
	if k := e.GetKey(); k != nil {
		return k
	}
	if o := e.GetObject(); o != nil {
		return o.Key()
	}
	return nil
}

// AllSubnets returns the network's subnets: the one of Subnet and Gateway, if set, then
// those of Subnets.
func (s *NetworkSpec) AllSubnets() []*Subnet {
	var out []*Subnet
	if s.GetSubnet() != "" {
		out = append(out, &Subnet{Cidr: s.GetSubnet(), Gateway: s.GetGateway()})
	}
	return append(out, s.GetSubnets()...)
}

// NewKey returns a key with empty tenant and namespace set to their defaults.
func NewKey(kind Kind, tenant, namespace, name string) *ObjectKey {
	if tenant == "" {
		tenant = DefaultTenant
	}
	if namespace == "" {
		namespace = DefaultNamespace
	}
	return &ObjectKey{Kind: kind, Tenant: tenant, Namespace: namespace, Name: name}
}

// Defaulted returns a copy of the key with empty tenant and namespace set to their defaults.
func (k *ObjectKey) Defaulted() *ObjectKey {
	return NewKey(k.GetKind(), k.GetTenant(), k.GetNamespace(), k.GetName())
}

// ID returns the key's canonical string form, "Kind/tenant/namespace/name", which is unique
// per object and stable: tables, queues and kernel identifiers derive from it.
func (k *ObjectKey) ID() string {
	return k.Key().String()
}

// ParseKeyID parses the form ID returns.
func ParseKeyID(id string) (*ObjectKey, error) {
	parts := strings.Split(id, "/")
	if len(parts) != 4 {
		return nil, fmt.Errorf("key %q: want Kind/tenant/namespace/name", id)
	}
	kind, err := ParseKind(parts[0])
	if err != nil {
		return nil, err
	}
	return &ObjectKey{Kind: kind, Tenant: parts[1], Namespace: parts[2], Name: parts[3]}, nil
}

// TargetsNode reports whether the object is meant for the named node: its meta lists the
// node, or lists no nodes at all.
func (o *Object) TargetsNode(node string) bool {
	nodes := o.GetMeta().GetNodes()
	return len(nodes) == 0 || slices.Contains(nodes, node)
}

// GenerationRevision returns the revision of the change that made the object's current
// generation: meta.generation_revision, or meta.revision for an object stored before nimbus
// set it, whose current generation was made at its last change or before.
func (o *Object) GenerationRevision() uint64 {
	m := o.GetMeta()
	if r := m.GetGenerationRevision(); r != 0 {
		return r
	}
	return m.GetRevision()
}
