package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// TestDescribe has three target nodes report differently through the real status stream
// and checks that get counts them and describe lists every node, including the one that
// has reported nothing.
func TestDescribe(t *testing.T) {
	e := newEnv(t)
	e.ok("apply", "-f", e.file("route.yaml", routeTo("to-dc2", "198.51.100.0/24", "10.10.0.2", "host-a", "host-b", "host-c")))
	e.report("to-dc2", "host-a", 1, programmed, "", "route in table 100")
	e.report("to-dc2", "host-b", 1, failed, "KernelError", "adding route:\nnetwork is unreachable")

	equal(t, "get route", e.ok("get", "route", "to-dc2"), ""+
		"NAME     TENANT    NAMESPACE   GENERATION   PROGRAMMED   FAILED   PENDING   STALE   AGE\n"+
		"to-dc2   default   default     1            1/3          1        1         0       90s\n")

	uid := e.get("to-dc2").GetObject().GetMeta().GetUid()
	equal(t, "describe", e.ok("describe", "route", "to-dc2"), ""+
		"Key:         Route/default/default/to-dc2\n"+
		"UID:         "+uid+"\n"+
		"Generation:  1\n"+
		"Revision:    1\n"+
		"Targets:     host-a, host-b, host-c\n"+
		"Programmed:  1/3\n"+
		"Failed:      1\n"+
		"Pending:     1 (host-c)\n"+
		"Stale:       0\n"+
		"Caught up:   -\n"+
		"\n"+
		"NODE     PHASE        OBSERVED   STALE   UPDATED   REASON                   MESSAGE\n"+
		"host-a   PROGRAMMED   1          no      90s ago   -                        route in table 100\n"+
		"host-b   FAILED       1          no      90s ago   KernelError (retrying)   adding route: network is unreachable\n"+
		"host-c   -            -          -       -         -                        -\n")

	e.report("to-dc2", "host-b", 1, programmed, "", "")
	e.report("to-dc2", "host-c", 1, programmed, "", "")
	out := e.ok("describe", "route", "to-dc2")
	for _, want := range []string{"Programmed:  3/3\n", "Pending:     0\n", "Caught up:   2026-11-21T10:00:00Z (90s ago)\n",
		"host-c   PROGRAMMED   1          no      90s ago"} {
		if !strings.Contains(out, want) {
			t.Errorf("describe once every node programmed does not contain %q:\n%s", want, out)
		}
	}

	err := e.fails("describe", "route", "missing", "--namespace", "blue")
	equal(t, "describe of a missing route", err.Error(), `route "missing" not found in tenant "default", namespace "blue"`)
	if !errors.Is(err, ErrNotFound) {
		t.Errorf("error %v is not ErrNotFound", err)
	}
	contains(t, "describe without a name", e.fails("describe", "route"), "accepts 2 arg(s)")
}

// TestPropagation reads the same node reports as an older nimbus aggregates them (counts
// only) and as a newer one does (with generation, pending, current and stale nodes and the
// caught-up time): both read the same.
func TestPropagation(t *testing.T) {
	at := func(sec int) *timestamppb.Timestamp {
		return timestamppb.New(created.Add(time.Duration(sec) * time.Second))
	}
	node := func(name string, gen int64, ph nimbusv1.Phase, stale bool, sec int) *nimbusv1.NodeStatus {
		return &nimbusv1.NodeStatus{Node: name, ObservedGeneration: gen, Phase: ph, Stale: stale, UpdateTime: at(sec)}
	}
	route := func(gen int64, nodes ...string) *nimbusv1.Object {
		return &nimbusv1.Object{
			Meta: &nimbusv1.ObjectMeta{Name: "r", Generation: gen, Nodes: nodes},
			Spec: &nimbusv1.Object_Route{Route: &nimbusv1.RouteSpec{}},
		}
	}
	type want struct {
		programmed, failed, current, stale, unnamed int
		pending                                     []string
		done                                        bool
		caughtUp                                    *timestamppb.Timestamp
	}
	tests := []struct {
		name string
		item *nimbusv1.ObjectWithStatus
		gen  int64
		want want
	}{
		{
			name: "older nimbus, named targets",
			item: &nimbusv1.ObjectWithStatus{Object: route(2, "a", "b", "c", "d"), Status: &nimbusv1.ObjectStatus{
				TargetNodes: 4, ProgrammedNodes: 1, FailedNodes: 1,
				Nodes: []*nimbusv1.NodeStatus{
					node("a", 2, programmed, false, 5), node("b", 2, failed, true, 6), node("c", 1, programmed, false, 1),
				},
			}},
			want: want{programmed: 1, failed: 1, current: 2, stale: 1, pending: []string{"c", "d"}},
		},
		{
			name: "newer nimbus, named targets",
			item: &nimbusv1.ObjectWithStatus{Object: route(2, "a", "b", "c", "d"), Status: &nimbusv1.ObjectStatus{
				TargetNodes: 4, ProgrammedNodes: 1, FailedNodes: 1, Generation: 2, CurrentNodes: 2, StaleNodes: 1,
				Pending: []string{"d", "c"},
				Nodes: []*nimbusv1.NodeStatus{
					node("a", 2, programmed, false, 5), node("b", 2, failed, true, 6), node("c", 1, programmed, false, 1),
				},
			}},
			want: want{programmed: 1, failed: 1, current: 2, stale: 1, pending: []string{"c", "d"}},
		},
		{
			name: "older nimbus, every node, some unreported",
			item: &nimbusv1.ObjectWithStatus{Object: route(1), Status: &nimbusv1.ObjectStatus{
				TargetNodes: 4, ProgrammedNodes: 1,
				Nodes: []*nimbusv1.NodeStatus{node("a", 1, programmed, false, 5), node("b", 1, pending, false, 6)},
			}},
			want: want{programmed: 1, current: 2, pending: []string{"b"}, unnamed: 2},
		},
		{
			name: "newer nimbus, every node, names the unreported",
			item: &nimbusv1.ObjectWithStatus{Object: route(1), Status: &nimbusv1.ObjectStatus{
				TargetNodes: 4, ProgrammedNodes: 1, Generation: 1, CurrentNodes: 2, Pending: []string{"b", "c", "d"},
				Nodes: []*nimbusv1.NodeStatus{node("a", 1, programmed, false, 5), node("b", 1, pending, false, 6)},
			}},
			want: want{programmed: 1, current: 2, pending: []string{"b", "c", "d"}},
		},
		{
			name: "older nimbus, caught up at the latest report",
			item: &nimbusv1.ObjectWithStatus{Object: route(1, "a", "b"), Status: &nimbusv1.ObjectStatus{
				TargetNodes: 2, ProgrammedNodes: 2,
				Nodes: []*nimbusv1.NodeStatus{node("a", 1, programmed, false, 5), node("b", 1, programmed, false, 9)},
			}},
			want: want{programmed: 2, current: 2, done: true, caughtUp: at(9)},
		},
		{
			name: "newer nimbus, caught up",
			item: &nimbusv1.ObjectWithStatus{Object: route(1, "a", "b"), Status: &nimbusv1.ObjectStatus{
				TargetNodes: 2, ProgrammedNodes: 2, Generation: 1, CurrentNodes: 2, CaughtUpTime: at(9),
				Nodes: []*nimbusv1.NodeStatus{node("a", 1, programmed, false, 5), node("b", 1, programmed, false, 9)},
			}},
			want: want{programmed: 2, current: 2, done: true, caughtUp: at(9)},
		},
		{
			name: "waiting on an older generation than the current one",
			item: &nimbusv1.ObjectWithStatus{Object: route(3, "a", "b"), Status: &nimbusv1.ObjectStatus{
				TargetNodes: 2, ProgrammedNodes: 1, Generation: 3, CurrentNodes: 1, Pending: []string{"b"},
				Nodes: []*nimbusv1.NodeStatus{node("a", 3, programmed, false, 5), node("b", 2, programmed, false, 9)},
			}},
			gen:  2,
			want: want{programmed: 2, current: 1, done: true, caughtUp: at(9)},
		},
		{
			name: "waiting on an older generation, nimbus listing some nodes",
			item: &nimbusv1.ObjectWithStatus{Object: route(3, "a", "b", "c", "d"), Status: &nimbusv1.ObjectStatus{
				TargetNodes: 4, ProgrammedNodes: 3, Generation: 3, CurrentNodes: 3, Pending: []string{"b"}, NodesOmitted: 2,
				Nodes: []*nimbusv1.NodeStatus{node("a", 3, programmed, false, 5), node("b", 2, programmed, false, 9)},
			}},
			gen:  2,
			want: want{programmed: 4, current: 1, done: true, caughtUp: at(9)},
		},
		{
			name: "no target nodes is never done",
			item: &nimbusv1.ObjectWithStatus{Object: route(1), Status: &nimbusv1.ObjectStatus{}},
			want: want{},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := propagationOf(tt.item, tt.gen)
			w := tt.want
			if p.programmed != w.programmed || p.failed != w.failed || p.current != w.current || p.stale != w.stale ||
				p.unnamed != w.unnamed || !slices.Equal(p.pending, w.pending) || p.done() != w.done {
				t.Errorf("propagation = programmed %d, failed %d, current %d, stale %d, pending %q + %d, done %t;\n"+
					"want programmed %d, failed %d, current %d, stale %d, pending %q + %d, done %t",
					p.programmed, p.failed, p.current, p.stale, p.pending, p.unnamed, p.done(),
					w.programmed, w.failed, w.current, w.stale, w.pending, w.unnamed, w.done)
			}
			wantCaughtUp := time.Time{}
			if w.caughtUp != nil {
				wantCaughtUp = w.caughtUp.AsTime()
			}
			if !p.caughtUp.Equal(wantCaughtUp) {
				t.Errorf("caught up = %v, want %v", p.caughtUp, wantCaughtUp)
			}
			if w.failed > 0 && len(p.failures) != w.failed {
				t.Errorf("failures = %v, want %d", p.failures, w.failed)
			}
		})
	}
}

// TestDescribeTypedOperational has a node report typed operational data: describe shows
// them as the string form has them, says how many list entries were left out, and -o json
// and -o yaml carry them typed.
func TestDescribeTypedOperational(t *testing.T) {
	e := newEnv(t)
	e.ok("apply", "-f", e.file("route.yaml", routeTo("to-dc2", "198.51.100.0/24", "10.10.0.2", "host-a")))
	op := &nimbusv1.OperationalData{EntriesOmitted: 3, Kind: &nimbusv1.OperationalData_SecurityPolicy{
		SecurityPolicy: &nimbusv1.SecurityPolicyOperational{ProtectedEndpoints: 2, Rules: []*nimbusv1.PolicyRuleCounters{
			{Direction: nimbusv1.PolicyRuleCounters_DIRECTION_EGRESS, Index: 1, Packets: 12, Bytes: 1500},
		}},
	}}
	e.reportStatus("to-dc2", &nimbusv1.NodeStatus{Node: "host-a", ObservedGeneration: 1, Phase: programmed,
		OperationalData: op, Operational: op.Map()})

	out := e.ok("describe", "route", "to-dc2")
	for _, want := range []string{"\nOperational on host-a:\n", "  egress[1].bytes:    1500\n", "  egress[1].packets:  12\n",
		"  protectedEndpoints: 2\n", "  3 more list entries were left out: "} {
		if !strings.Contains(out, want) {
			t.Errorf("describe does not contain %q:\n%s", want, out)
		}
	}

	var doc struct {
		Status struct {
			Nodes []struct {
				OperationalData struct {
					SecurityPolicy struct {
						ProtectedEndpoints int
						Rules              []struct {
							Direction      string
							Index          int
							Packets, Bytes int64 // numbers, not protojson's strings
						}
					}
				}
			}
		}
	}
	out = e.ok("get", "route", "to-dc2", "-o", "json")
	if err := json.Unmarshal([]byte(out), &doc); err != nil || len(doc.Status.Nodes) != 1 {
		t.Fatalf("get -o json: %v\n%s", err, out)
	}
	p := doc.Status.Nodes[0].OperationalData.SecurityPolicy
	if p.ProtectedEndpoints != 2 || len(p.Rules) != 1 || p.Rules[0].Direction != "DIRECTION_EGRESS" || p.Rules[0].Index != 1 ||
		p.Rules[0].Packets != 12 || p.Rules[0].Bytes != 1500 {
		t.Errorf("get -o json: operational data %+v:\n%s", p, out)
	}
	out = e.ok("get", "route", "to-dc2", "-o", "yaml")
	for _, want := range []string{"operationalData:", "securityPolicy:", "direction: DIRECTION_EGRESS", "packets: 12"} {
		if !strings.Contains(out, want) {
			t.Errorf("get -o yaml does not contain %q:\n%s", want, out)
		}
	}
}

// TestDescribePagesThroughNodes describes a route for more nodes than nimbus sends in
// one page of ListNodeStatuses: describe lists every node, or the first --nodes-limit
// with the FAILED nodes after them and a line of how many it left out, and every FAILED
// node with its message.
func TestDescribePagesThroughNodes(t *testing.T) {
	const nodes = 2500
	e := newEnv(t)
	var names []string
	for i := range nodes {
		names = append(names, fmt.Sprintf("h%04d", i))
	}
	e.ok("apply", "-f", e.file("route.yaml", routeTo("wide", "198.51.100.0/24", "10.10.0.2", names...)))
	stream, err := e.nimbus.ReportStatus(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	failing := map[string]string{}
	for i, n := range names {
		st := &nimbusv1.NodeStatus{Node: n, ObservedGeneration: 1, Phase: programmed}
		if i%250 == 5 {
			st.Phase, st.Reason, st.Message = failed, "KernelError", "adding route: network is unreachable on "+n
			failing[n] = st.Message
		}
		if err := stream.Send(&nimbusv1.StatusReport{Key: nimbusv1.NewKey(nimbusv1.Kind_KIND_ROUTE, "", "", "wide"), Status: st}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := stream.CloseAndRecv(); err != nil {
		t.Fatal(err)
	}

	// rows returns the node names of the node table in out, and checks the FAILED ones.
	rows := func(what, out string) []string {
		t.Helper()
		var got []string
		seen := 0
		for line := range strings.Lines(out) {
			f := strings.Fields(line)
			if len(f) < 2 || !strings.HasPrefix(f[0], "h") || len(f[0]) != 5 {
				continue
			}
			got = append(got, f[0])
			if msg, ok := failing[f[0]]; ok {
				seen++
				if f[1] != "FAILED" || !strings.HasSuffix(strings.TrimSpace(line), msg) {
					t.Errorf("%s: the row of %s is %q, want FAILED with %q", what, f[0], line, msg)
				}
			} else if f[1] != "PROGRAMMED" {
				t.Errorf("%s: the row of %s is %q, want PROGRAMMED", what, f[0], line)
			}
		}
		if seen != len(failing) {
			t.Errorf("%s lists %d FAILED nodes, want %d", what, seen, len(failing))
		}
		return got
	}

	out := e.ok("describe", "route", "wide", "--nodes-limit", "0")
	if got := rows("describe of every node", out); !slices.Equal(got, names) {
		t.Errorf("describe of every node lists %d nodes, want %d", len(got), len(names))
	}
	if strings.Contains(out, "more nodes") {
		t.Errorf("describe of every node says it left some out:\n%s", out)
	}
	contains(t, "describe of every node", errors.New(out), "Programmed:  2490/2500\n", "Failed:      10\n")

	out = e.ok("describe", "route", "wide")
	want := slices.Clone(names[:defaultNodesLimit])
	for _, n := range names[defaultNodesLimit:] {
		if _, ok := failing[n]; ok {
			want = append(want, n)
		}
	}
	if got := rows("describe", out); !slices.Equal(got, want) {
		t.Errorf("describe lists %d nodes, want the first %d and the %d FAILED after them", len(got), defaultNodesLimit, len(want)-defaultNodesLimit)
	}
	contains(t, "describe", errors.New(out), fmt.Sprintf("... and %d more nodes (--nodes-limit)\n", nodes-len(want)))

	// With a limit below the FAILED nodes, it lists as many of them and says how many
	// more FAILED.
	out = e.ok("describe", "route", "wide", "--nodes-limit", "1")
	if got, want := slices.Collect(func(yield func(string) bool) {
		for line := range strings.Lines(out) {
			if f := strings.Fields(line); len(f) > 1 && strings.HasPrefix(f[0], "h") && !yield(f[0]) {
				return
			}
		}
	}), []string{"h0000", "h0005"}; !slices.Equal(got, want) {
		t.Errorf("describe --nodes-limit 1 lists %q, want %q", got, want)
	}
	contains(t, "describe --nodes-limit 1", errors.New(out), "... and 2498 more nodes (--nodes-limit), 9 of them FAILED\n")

	contains(t, "describe with a negative limit", e.fails("describe", "route", "wide", "--nodes-limit", "-1"), "--nodes-limit -1: must not be negative")
}

// TestDescribeWithoutListNodeStatuses describes an object as from a nimbus without
// ListNodeStatuses: the node table is made of the object status's nodes, as it is the
// same as the one describe pages through.
func TestDescribeWithoutListNodeStatuses(t *testing.T) {
	e := newEnv(t)
	e.ok("apply", "-f", e.file("route.yaml", routeTo("to-dc2", "198.51.100.0/24", "10.10.0.2", "host-a", "host-b", "host-c")))
	e.report("to-dc2", "host-a", 1, programmed, "", "route in table 100")
	e.report("to-dc2", "host-b", 1, failed, "KernelError", "adding route: network is unreachable")

	sess := &session{nimbus: unimplementedNodeStatuses{e.nimbus}}
	key := nimbusv1.NewKey(nimbusv1.Kind_KIND_ROUTE, "", "", "to-dc2")
	nodes, err := sess.nodeStatuses(t.Context(), key, 0)
	if err != nil || nodes != nil {
		t.Fatalf("node statuses from a nimbus without ListNodeStatuses: %v, %v; want none, no error", nodes, err)
	}
	var buf strings.Builder
	c := &cli{now: func() time.Time { return created.Add(90 * time.Second) }}
	if err := c.writeDescription(&buf, e.get("to-dc2"), nil); err != nil {
		t.Fatal(err)
	}
	equal(t, "describe without ListNodeStatuses", buf.String(), e.ok("describe", "route", "to-dc2"))
}

// unimplementedNodeStatuses is a Nimbus client of a nimbus without ListNodeStatuses.
type unimplementedNodeStatuses struct{ nimbusv1.NimbusClient }

func (unimplementedNodeStatuses) ListNodeStatuses(context.Context, *nimbusv1.ListNodeStatusesRequest, ...grpc.CallOption) (*nimbusv1.ListNodeStatusesResponse, error) {
	return nil, status.Error(codes.Unimplemented, "unknown method ListNodeStatuses")
}

// TestCompareOperational checks the order describe lists operational data in: by name,
// and the entries of a list by their index.
func TestCompareOperational(t *testing.T) {
	keys := []string{"packet", "observations[10]", "done", "observations[2]", "observations[1]", "rules[2].hits", "rules[10].hits", "rules[2].bytes", "observations"}
	slices.SortFunc(keys, compareOperational)
	equal(t, "order", strings.Join(keys, " "),
		"done observations observations[1] observations[2] observations[10] packet rules[2].bytes rules[2].hits rules[10].hits")
}
