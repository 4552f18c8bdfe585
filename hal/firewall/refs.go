package firewall

import (
	"fmt"
	"strings"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// GroupRef is a field of an object that names a SecurityGroup.
type GroupRef struct {
	// Field is the field, as validation errors spell it: `spec.attachGroups[1]`,
	// `spec.ingress[0].fromGroups[2]`, `spec.securityGroups[0]`.
	Field string
	// Name is the group's name, as written.
	Name string
	// Group is the key of the SecurityGroup the name refers to, in the object's own
	// tenant and namespace.
	Group *nimbusv1.ObjectKey
}

// String returns the field and the name: `spec.attachGroups[1] "webb"`.
func (r GroupRef) String() string { return fmt.Sprintf("%s %q", r.Field, r.Name) }

// GroupRefs returns the fields of obj that name SecurityGroups, in the order of the
// spec: a NetworkSecurityPolicy's attachGroups, its ingress rules' fromGroups and its
// egress rules' toGroups (the fields that name a rule's peers); an Endpoint's
// securityGroups. Other kinds name none.
func GroupRefs(obj *nimbusv1.Object) []GroupRef {
	k := obj.Key()
	var out []GroupRef
	add := func(field string, names []string) {
		for i, n := range names {
			out = append(out, GroupRef{
				Field: fmt.Sprintf("%s[%d]", field, i),
				Name:  n,
				Group: nimbusv1.NewKey(nimbusv1.Kind_KIND_SECURITY_GROUP, k.GetTenant(), k.GetNamespace(), n),
			})
		}
	}
	switch s := obj.GetSpec().(type) {
	case *nimbusv1.Object_NetworkSecurityPolicy:
		p := s.NetworkSecurityPolicy
		add("spec.attachGroups", p.GetAttachGroups())
		for i, r := range p.GetIngress() {
			add(fmt.Sprintf("spec.ingress[%d].fromGroups", i), r.GetFromGroups())
		}
		for i, r := range p.GetEgress() {
			add(fmt.Sprintf("spec.egress[%d].toGroups", i), r.GetToGroups())
		}
	case *nimbusv1.Object_Endpoint:
		add("spec.securityGroups", s.Endpoint.GetSecurityGroups())
	}
	return out
}

// DescribeMissing says, for a status message, which fields name groups that have no
// SecurityGroup object: `spec.attachGroups[1] "webb", spec.ingress[0].fromGroups[0]
// "admn": no such SecurityGroup in tenant default, namespace default`.
func DescribeMissing(tenant, namespace string, refs []GroupRef) string {
	parts := make([]string, len(refs))
	for i, r := range refs {
		parts[i] = r.String()
	}
	k := nimbusv1.NewKey(nimbusv1.Kind_KIND_SECURITY_GROUP, tenant, namespace, "")
	return fmt.Sprintf("%s: no such SecurityGroup in tenant %s, namespace %s",
		strings.Join(parts, ", "), k.GetTenant(), k.GetNamespace())
}
