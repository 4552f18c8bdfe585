package controller

import (
	"cmp"
	"slices"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// RuleHits is what one rule of a NetworkSecurityPolicy matched.
type RuleHits struct {
	// Direction and Index name the rule: spec.ingress[Index] or spec.egress[Index].
	Direction nimbusv1.PolicyRuleCounters_Direction
	Index     uint32
	// Packets are the packets the rule matched, Bytes their bytes.
	Packets, Bytes uint64
}

// PolicyRuleHits returns the hits of the rules of a NetworkSecurityPolicy as its status
// st reports them, summed over the nodes: ingress rules first, each direction by index.
// A rule no node reports hits of is left out. Nodes whose details nimbus left out
// (ObjectStatus.details_omitted), nodes the status does not list
// (ObjectStatus.nodes_omitted: nimbus lists the nodes with operational data before the
// nodes whose status it derives, up to its --status-nodes) and nodes whose agent reports
// only the deprecated string form of operational data count nothing.
func PolicyRuleHits(st *nimbusv1.ObjectStatus) []RuleHits {
	var hits []RuleHits
	for _, ns := range st.GetNodes() {
		for _, r := range ns.GetOperationalData().GetSecurityPolicy().GetRules() {
			i := slices.IndexFunc(hits, func(h RuleHits) bool { return h.Direction == r.GetDirection() && h.Index == r.GetIndex() })
			if i < 0 {
				hits = append(hits, RuleHits{Direction: r.GetDirection(), Index: r.GetIndex()})
				i = len(hits) - 1
			}
			hits[i].Packets += r.GetPackets()
			hits[i].Bytes += r.GetBytes()
		}
	}
	slices.SortFunc(hits, func(a, b RuleHits) int {
		return cmp.Or(cmp.Compare(a.Direction, b.Direction), cmp.Compare(a.Index, b.Index))
	})
	return hits
}

// NodeOperational returns the typed operational data the node reports in the status st;
// nil when it reports none: the node has not reported, its details were left out, the
// status does not list it (nimbus's --status-nodes), the object's kind has none, or its
// agent reports only the deprecated string form.
func NodeOperational(st *nimbusv1.ObjectStatus, node string) *nimbusv1.OperationalData {
	for _, ns := range st.GetNodes() {
		if ns.GetNode() == node {
			return ns.GetOperationalData()
		}
	}
	return nil
}
