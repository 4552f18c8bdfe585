package test

import (
	"slices"
	"strings"
	"testing"
)

const nodeHostA = `kind: Node
meta:
  name: host-a
spec:
  hostname: host-a
  vtep_address: 192.0.2.10
`

// toAll is a route for every node.
const toAll = `kind: Route
meta:
  name: to-all
spec:
  table: 100
  prefix: 203.0.113.0/24
  nexthops:
    - gateway: 10.10.0.2
`

// TestDeletedNodeIsNotWaitedFor is the report "Ghost nodes at nimbus": host-a had a Node
// object and an agent that watched, the agent is gone and the Node object deleted; an
// object for every node must then be caught up once host-b, the one live node, has it,
// and apply --wait must not wait for host-a.
func TestDeletedNodeIsNotWaitedFor(t *testing.T) {
	c := newCluster(t)
	c.apply(t, nodeHostA)
	a := c.newHost(t, "host-a")
	b := c.newHost(t, "host-b")
	// Both agents watch: each has programmed a route meant for it.
	c.apply(t, strings.Replace(toDC2, "nodes: [host-a]", "nodes: [host-a, host-b]", 1))
	c.waitProgrammed(t, "route", "to-dc2", "host-a", 1)
	c.waitProgrammed(t, "route", "to-dc2", "host-b", 1)

	a.agent.stop(t)
	c.mustCtl(t, "", "delete", "node", "host-a")

	out, err := c.ctl(t, toAll, "apply", "-f", "-", "--wait", "--timeout", "20s")
	if err != nil {
		t.Fatalf("apply --wait of a route for every node with host-a gone: %v", err)
	}
	if want := "1 of 1 programmed on every target node"; !strings.Contains(out, want) {
		t.Errorf("apply --wait printed %q, want %q", out, want)
	}
	if got := b.routes(t, 100); !strings.Contains(got, "203.0.113.0/24 via 10.10.0.2") {
		t.Errorf("route to-all not in host-b's table 100:\n%s", got)
	}
	gen, st, err := c.get(t, "route", "to-all")
	if err != nil {
		t.Fatal(err)
	}
	if st.GetTargetNodes() != 1 || st.GetProgrammedNodes() != 1 || len(st.GetPending()) != 0 ||
		nodeStatus(st, "host-a") != nil || st.GetCaughtUpTime() == nil || gen != 1 {
		t.Errorf("status of to-all at generation %d = %v; want host-b its only target, programmed and caught up", gen, st)
	}
	// host-a's agent comes back: host-a is a target again and gets the route too.
	a.startAgent(t)
	c.waitProgrammed(t, "route", "to-all", "host-a", 1)
	_, st, err = c.get(t, "route", "to-all")
	if err != nil {
		t.Fatal(err)
	}
	var nodes []string
	for _, n := range st.GetNodes() {
		nodes = append(nodes, n.GetNode())
	}
	if st.GetTargetNodes() != 2 || !slices.Equal(nodes, []string{"host-a", "host-b"}) {
		t.Errorf("status of to-all with host-a back = %v; want host-a and host-b its targets", st)
	}
}

// TestNodeDeletedWhileAgentRuns is the demo's sequence: host-a's Node object is deleted
// while its agent runs (nimbus forgets what host-a reported, its watermark too), then a
// route for host-a is applied with --wait, which must see host-a program it.
func TestNodeDeletedWhileAgentRuns(t *testing.T) {
	c := newCluster(t)
	c.apply(t, nodeHostA)
	a := c.newHost(t, "host-a")
	c.apply(t, toDC2)
	c.waitProgrammed(t, "route", "to-dc2", "host-a", 1)

	c.mustCtl(t, "", "delete", "node", "host-a")
	out, err := c.ctl(t, strings.NewReplacer("name: to-dc2", "name: to-dc3", "198.51.100.0/24", "203.0.113.0/24").Replace(toDC2), "apply", "-f", "-", "--wait", "--timeout", "20s")
	if err != nil {
		t.Fatalf("apply --wait of a route for host-a after its Node object was deleted: %v\n%s", err, out)
	}
	if want := "1 of 1 programmed on every target node"; !strings.Contains(out, want) {
		t.Errorf("apply --wait printed %q, want %q", out, want)
	}
	if got := a.routes(t, 100); !strings.Contains(got, "203.0.113.0/24 via 10.10.0.2") {
		t.Errorf("route to-dc3 not in host-a's table 100:\n%s", got)
	}
}
