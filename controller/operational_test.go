package controller

import (
	"slices"
	"testing"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// TestPolicyRuleHits sums the rule hits of two nodes; a node without typed data counts
// nothing.
func TestPolicyRuleHits(t *testing.T) {
	in, out := nimbusv1.PolicyRuleCounters_DIRECTION_INGRESS, nimbusv1.PolicyRuleCounters_DIRECTION_EGRESS
	policy := func(rules ...*nimbusv1.PolicyRuleCounters) *nimbusv1.OperationalData {
		return &nimbusv1.OperationalData{Kind: &nimbusv1.OperationalData_SecurityPolicy{
			SecurityPolicy: &nimbusv1.SecurityPolicyOperational{ProtectedEndpoints: 1, Rules: rules},
		}}
	}
	st := &nimbusv1.ObjectStatus{Nodes: []*nimbusv1.NodeStatus{
		{Node: "a", OperationalData: policy(
			&nimbusv1.PolicyRuleCounters{Direction: out, Index: 0, Packets: 1, Bytes: 100},
			&nimbusv1.PolicyRuleCounters{Direction: in, Index: 2, Packets: 5, Bytes: 500},
		)},
		{Node: "b", OperationalData: policy(&nimbusv1.PolicyRuleCounters{Direction: in, Index: 2, Packets: 7, Bytes: 700})},
		{Node: "c", Operational: map[string]string{"ingress[0].packets": "9"}},
	}}
	want := []RuleHits{{Direction: in, Index: 2, Packets: 12, Bytes: 1200}, {Direction: out, Index: 0, Packets: 1, Bytes: 100}}
	if got := PolicyRuleHits(st); !slices.Equal(got, want) {
		t.Errorf("PolicyRuleHits = %+v, want %+v", got, want)
	}
	if got := NodeOperational(st, "b").GetSecurityPolicy().GetRules()[0].GetPackets(); got != 7 {
		t.Errorf("NodeOperational(b) has %d packets on ingress[2], want 7", got)
	}
	if NodeOperational(st, "c") != nil || NodeOperational(st, "d") != nil {
		t.Error("NodeOperational of a node without typed data, or without a status, is not nil")
	}
}
