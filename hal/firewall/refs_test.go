package firewall

import (
	"slices"
	"testing"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

func TestGroupRefs(t *testing.T) {
	policy := &nimbusv1.Object{
		Meta: &nimbusv1.ObjectMeta{Tenant: "acme", Namespace: "prod", Name: "p"},
		Spec: &nimbusv1.Object_NetworkSecurityPolicy{NetworkSecurityPolicy: &nimbusv1.NetworkSecurityPolicySpec{
			AttachGroups: []string{"web", "webb"},
			Ingress: []*nimbusv1.PolicyRule{
				{Action: nimbusv1.PolicyRule_ACTION_ALLOW, FromCidrs: []string{"10.0.0.0/8"}},
				{Action: nimbusv1.PolicyRule_ACTION_DENY, FromGroups: []string{"ops", "admins"}},
			},
			Egress: []*nimbusv1.PolicyRule{{Action: nimbusv1.PolicyRule_ACTION_ALLOW, ToGroups: []string{"db"}}},
		}},
	}
	endpoint := &nimbusv1.Object{
		Meta: &nimbusv1.ObjectMeta{Name: "e"},
		Spec: &nimbusv1.Object_Endpoint{Endpoint: &nimbusv1.EndpointSpec{SecurityGroups: []string{"web", "stray"}}},
	}
	group := &nimbusv1.Object{Meta: &nimbusv1.ObjectMeta{Name: "web"}, Spec: &nimbusv1.Object_SecurityGroup{SecurityGroup: &nimbusv1.SecurityGroupSpec{}}}
	tests := []struct {
		obj  *nimbusv1.Object
		want []string
	}{
		{policy, []string{
			`spec.attachGroups[0] "web" SecurityGroup/acme/prod/web`,
			`spec.attachGroups[1] "webb" SecurityGroup/acme/prod/webb`,
			`spec.ingress[1].fromGroups[0] "ops" SecurityGroup/acme/prod/ops`,
			`spec.ingress[1].fromGroups[1] "admins" SecurityGroup/acme/prod/admins`,
			`spec.egress[0].toGroups[0] "db" SecurityGroup/acme/prod/db`,
		}},
		{endpoint, []string{
			`spec.securityGroups[0] "web" SecurityGroup/default/default/web`,
			`spec.securityGroups[1] "stray" SecurityGroup/default/default/stray`,
		}},
		{group, nil},
	}
	for _, tt := range tests {
		var got []string
		for _, r := range GroupRefs(tt.obj) {
			got = append(got, r.String()+" "+r.Group.ID())
		}
		if !slices.Equal(got, tt.want) {
			t.Errorf("GroupRefs(%s) = %q, want %q", tt.obj.Key().ID(), got, tt.want)
		}
	}
	refs := GroupRefs(policy)
	got := DescribeMissing("acme", "prod", []GroupRef{refs[1], refs[3]})
	want := `spec.attachGroups[1] "webb", spec.ingress[1].fromGroups[1] "admins": no such SecurityGroup in tenant acme, namespace prod`
	if got != want {
		t.Errorf("DescribeMissing = %q, want %q", got, want)
	}
}
