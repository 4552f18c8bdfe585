package cli

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/naplesnet/naples/delphi"
	"github.com/naplesnet/naples/nimbus"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// largeRoute returns a Route whose label makes it just under nimbus's object size limit.
func largeRoute(name string) *nimbusv1.Object {
	return &nimbusv1.Object{
		Meta: &nimbusv1.ObjectMeta{Name: name, Labels: map[string]string{"pad": strings.Repeat("x", nimbus.DefaultObjectBytes-200)}},
		Spec: &nimbusv1.Object_Route{Route: &nimbusv1.RouteSpec{
			Table: 100, Prefix: "10.1.0.0/16", Nexthops: []*nimbusv1.NextHop{{Gateway: "192.0.2.1"}},
		}},
	}
}

// TestGetListsLargeObjects is issue 19's defect 3: a kind whose objects together are far
// more than a 4 MiB message stays listable, page by page.
func TestGetListsLargeObjects(t *testing.T) {
	e := newEnv(t)
	for i := range 10 {
		if _, err := e.nimbus.Apply(t.Context(), &nimbusv1.ApplyRequest{Object: largeRoute(fmt.Sprintf("big-%d", i))}); err != nil {
			t.Fatal(err)
		}
	}
	out := e.ok("get", "routes")
	for i := range 10 {
		if !strings.Contains(out, fmt.Sprintf("big-%d ", i)) {
			t.Errorf("get routes does not list big-%d:\n%s", i, out)
		}
	}
	if rows := strings.Count(out, "\n") - 1; rows != 10 {
		t.Errorf("get routes printed %d rows, want 10", rows)
	}
}

// TestDelphiListsLargeObjects is issue 19's defect 3 for the agent's local API: a kind of
// many objects each just under nimbus's limit stays readable with `delphi list`.
func TestDelphiListsLargeObjects(t *testing.T) {
	a := newAgentEnv(t)
	a.commit(func(txn *delphi.DesiredTxn) {
		for i := range 10 {
			o := largeRoute(fmt.Sprintf("big-%d", i))
			o.Meta.Tenant, o.Meta.Namespace, o.Meta.Generation = "default", "default", 1
			txn.Put(o)
		}
	})
	out := a.ok("delphi", "list", "routes")
	for i := range 10 {
		if !strings.Contains(out, fmt.Sprintf("big-%d ", i)) {
			t.Errorf("delphi list routes does not list big-%d:\n%s", i, out)
		}
	}
	if rows := strings.Count(out, "\n") - 2; rows != 10 {
		t.Errorf("delphi list routes printed %d rows, want 10", rows)
	}
}

// TestDescribeSaysDetailsOmitted shows that describe says when nimbus left the messages
// of some nodes out of an object's status, rather than showing them as empty: from a
// nimbus without ListNodeStatuses, whose node table is the object status's. Its pages
// carry every node's message.
func TestDescribeSaysDetailsOmitted(t *testing.T) {
	e := newEnvWith(t, nimbus.Options{Now: func() time.Time { return created }, Limits: nimbus.Limits{StatusDetailsBytes: 100}})
	route := &nimbusv1.Object{
		Meta: &nimbusv1.ObjectMeta{Name: "r1", Nodes: []string{"n1", "n2"}},
		Spec: &nimbusv1.Object_Route{Route: &nimbusv1.RouteSpec{Table: 100, Prefix: "10.1.0.0/16", Nexthops: []*nimbusv1.NextHop{{Gateway: "192.0.2.1"}}}},
	}
	if _, err := e.nimbus.Apply(t.Context(), &nimbusv1.ApplyRequest{Object: route}); err != nil {
		t.Fatal(err)
	}
	e.report("r1", "n1", 1, nimbusv1.Phase_PHASE_FAILED, "KernelError", strings.Repeat("a", 80))
	e.report("r1", "n2", 1, nimbusv1.Phase_PHASE_FAILED, "KernelError", strings.Repeat("b", 80))
	var buf strings.Builder
	c := &cli{now: func() time.Time { return created.Add(90 * time.Second) }}
	if err := c.writeDescription(&buf, e.get("r1"), nil); err != nil {
		t.Fatal(err)
	}
	if out := buf.String(); !strings.Contains(out, "of 1 node were left out") || !strings.Contains(out, "--status-details-bytes") {
		t.Errorf("describe without ListNodeStatuses does not say the details of 1 node were left out:\n%s", out)
	}
	out := e.ok("describe", "route", "r1")
	if !strings.Contains(out, strings.Repeat("a", 80)) || !strings.Contains(out, strings.Repeat("b", 80)) || strings.Contains(out, "left out") {
		t.Errorf("describe does not show the messages of both nodes:\n%s", out)
	}
}

// TestWaitSaysDetailsOmitted has two nodes fail for good with messages longer than
// nimbus sends for one object: wait's error shows the message it has and says that the
// other was left out, rather than show it as empty.
func TestWaitSaysDetailsOmitted(t *testing.T) {
	e := newEnvWith(t, nimbus.Options{Now: func() time.Time { return created }, Limits: nimbus.Limits{StatusDetailsBytes: 100}})
	e.ok("apply", "-f", e.file("route.yaml", routeTo("r1", "198.51.100.0/24", "10.10.0.2", "n1", "n2")))
	for _, n := range []string{"n1", "n2"} {
		e.reportStatus("r1", &nimbusv1.NodeStatus{Node: n, ObservedGeneration: 1, Phase: nimbusv1.Phase_PHASE_FAILED, Terminal: true,
			Reason: "InvalidSpec", Message: n + ": " + strings.Repeat("x", 80)})
	}
	err := e.fails("wait", "route", "r1", "--timeout", "20s")
	equal(t, "wait error", err.Error(), "route/r1: programming failed on 2 of 2 nodes (generation 1):\n"+
		"  node n1: InvalidSpec: n1: "+strings.Repeat("x", 80)+"\n"+
		"  node n2: InvalidSpec: -\n"+
		"  (the message of 1 node was left out: the object's statuses hold more than nimbus sends for one object, "+
		"its --status-details-bytes; naplesctl describe shows it)")
}
