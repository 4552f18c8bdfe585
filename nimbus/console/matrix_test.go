package console

import (
	"testing"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

func TestCellPhases(t *testing.T) {
	const (
		programmed = nimbusv1.Phase_PHASE_PROGRAMMED
		failed     = nimbusv1.Phase_PHASE_FAILED
		pending    = nimbusv1.Phase_PHASE_PENDING
	)
	obj := &nimbusv1.Object{Meta: &nimbusv1.ObjectMeta{Name: "r", Nodes: []string{"a", "b", "c", "d", "e", "f"}},
		Spec: &nimbusv1.Object_Route{Route: &nimbusv1.RouteSpec{}}}
	st := &nimbusv1.ObjectStatus{Generation: 2, Pending: []string{"e"}, Nodes: []*nimbusv1.NodeStatus{
		{Node: "a", ObservedGeneration: 2, Phase: programmed},
		{Node: "b", ObservedGeneration: 2, Phase: failed, Reason: "KernelError", Message: "file exists"},
		{Node: "c", ObservedGeneration: 2, Phase: programmed, Stale: true},
		{Node: "d", ObservedGeneration: 1, Phase: programmed},
		{Node: "g", ObservedGeneration: 2, Phase: pending},
	}}
	for _, tc := range []struct {
		node, phase, title string
		omitted            bool
	}{
		{node: "a", phase: phaseProgrammed, title: "a: PROGRAMMED"},
		{node: "b", phase: phaseFailed, title: "b: FAILED — KernelError: file exists"},
		{node: "c", phase: phaseStale, title: "c: STALE"},
		{node: "d", phase: phasePending, title: "d: PENDING (generation 1 of 2)"},
		{node: "e", phase: phasePending, title: "e: PENDING"},
		// Targeted, neither listed nor pending: PROGRAMMED, unless nimbus left nodes out.
		{node: "f", phase: phaseProgrammed, title: "f: PROGRAMMED"},
		{node: "f", phase: phaseUnknown, title: "f: UNKNOWN", omitted: true},
		{node: "g", phase: phasePending, title: "g: PENDING"},
		// Not a target.
		{node: "h", phase: "", title: ""},
	} {
		s := st
		if tc.omitted {
			s = &nimbusv1.ObjectStatus{Generation: 2, NodesOmitted: 3, Nodes: st.Nodes, Pending: st.Pending}
		}
		r := rowOf(&nimbusv1.ObjectWithStatus{Object: obj, Status: s}, []string{tc.node})
		if c := r.Cells[0]; c.Phase != tc.phase || c.Title != tc.title {
			t.Errorf("cell of %s (omitted %v) = %q %q, want %q %q", tc.node, tc.omitted, c.Phase, c.Title, tc.phase, tc.title)
		}
	}
}
