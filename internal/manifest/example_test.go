package manifest_test

import (
	"fmt"
	"os"
	"strings"

	"github.com/naplesnet/naples/internal/manifest"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

func ExampleDecode() {
	objs, err := manifest.Decode(strings.NewReader(`
kind: Route
meta:
  name: to-dc2
  nodes: [host-a]
spec:
  table: 100
  prefix: 198.51.100.0/24
  nexthops:
    - gateway: 10.10.0.2
`))
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, o := range objs {
		fmt.Println(o.Key().ID(), o.GetRoute().GetPrefix(), o.Validate())
	}
	// Output:
	// Route/default/default/to-dc2 198.51.100.0/24 <nil>
}

func ExampleEncode() {
	obj := &nimbusv1.Object{
		Meta: &nimbusv1.ObjectMeta{Name: "to-dc2", Generation: 1, Nodes: []string{"host-a"}},
		Spec: &nimbusv1.Object_Route{Route: &nimbusv1.RouteSpec{
			Table:    100,
			Prefix:   "198.51.100.0/24",
			Nexthops: []*nimbusv1.NextHop{{Gateway: "10.10.0.2"}},
		}},
	}
	status := &nimbusv1.ObjectStatus{
		TargetNodes:     1,
		ProgrammedNodes: 1,
		Nodes:           []*nimbusv1.NodeStatus{{Node: "host-a", ObservedGeneration: 1, Phase: nimbusv1.Phase_PHASE_PROGRAMMED}},
	}
	if err := manifest.Encode(os.Stdout, manifest.YAML, obj, status); err != nil {
		fmt.Println(err)
	}
	// Output:
	// kind: Route
	// meta:
	//   generation: 1
	//   name: to-dc2
	//   nodes:
	//   - host-a
	// spec:
	//   nexthops:
	//   - gateway: 10.10.0.2
	//   prefix: 198.51.100.0/24
	//   table: 100
	// status:
	//   currentNodes: 0
	//   detailsOmitted: 0
	//   failedNodes: 0
	//   generation: 0
	//   nodes:
	//   - message: ""
	//     node: host-a
	//     observedGeneration: 1
	//     operational: {}
	//     phase: PHASE_PROGRAMMED
	//     reason: ""
	//     stale: false
	//     terminal: false
	//   nodesOmitted: 0
	//   pending: []
	//   pendingOmitted: 0
	//   programmedNodes: 1
	//   staleNodes: 0
	//   targetNodes: 1
}
