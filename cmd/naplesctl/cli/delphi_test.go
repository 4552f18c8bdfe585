package cli

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"github.com/naplesnet/naples/agent"
	"github.com/naplesnet/naples/delphi"
	"github.com/naplesnet/naples/internal/address"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// agentEnv is a real delphi store, whose writers the test holds, served by the agent's
// local API on a unix socket that naplesctl finds through NAPLES_AGENT.
type agentEnv struct {
	*env
	desired *delphi.DesiredWriter
	status  *delphi.StatusWriter
	sock    string
}

func newAgentEnv(t *testing.T) *agentEnv {
	t.Helper()
	e := newEnv(t)
	store, err := delphi.Open(delphi.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	desired, err := store.ClaimDesired()
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.ClaimStatus()
	if err != nil {
		t.Fatal(err)
	}
	insp, err := agent.NewInspector(agent.InspectorOptions{Store: store, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(e.dir, "agent.sock")
	ctx, cancel := context.WithCancel(context.Background())
	lis, err := address.Address{Network: "unix", Addr: sock}.Listen(ctx)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- insp.Serve(ctx, lis) }()
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	e.vars[AgentEnv] = sock
	return &agentEnv{env: e, desired: desired, status: st, sock: sock}
}

func (a *agentEnv) commit(fn func(*delphi.DesiredTxn)) {
	a.t.Helper()
	txn := &delphi.DesiredTxn{}
	fn(txn)
	if err := a.desired.Commit(txn); err != nil {
		a.t.Fatal(err)
	}
}

func (a *agentEnv) setStatus(name string, gen int64, phase nimbusv1.Phase, msg string) {
	a.t.Helper()
	err := a.status.Set(nimbusv1.NewKey(nimbusv1.Kind_KIND_ROUTE, "", "", name),
		&nimbusv1.NodeStatus{Node: "host-a", ObservedGeneration: gen, Phase: phase, Message: msg})
	if err != nil {
		a.t.Fatal(err)
	}
}

func delphiRoute(name string, gen int64, prefix string) *nimbusv1.Object {
	return &nimbusv1.Object{
		Meta: &nimbusv1.ObjectMeta{Name: name, Tenant: "default", Namespace: "default", Generation: gen, Nodes: []string{"host-a"}},
		Spec: &nimbusv1.Object_Route{Route: &nimbusv1.RouteSpec{Table: 100, Prefix: prefix, Nexthops: []*nimbusv1.NextHop{{Gateway: "10.10.0.2"}}}},
	}
}

// fill puts two routes and a network into delphi, a status for one route and a status
// whose object is gone.
func (a *agentEnv) fill() {
	a.commit(func(txn *delphi.DesiredTxn) {
		txn.Put(delphiRoute("to-dc2", 2, "198.51.100.0/24"))
		txn.Put(delphiRoute("to-dc3", 1, "203.0.113.0/24"))
		txn.Put(&nimbusv1.Object{
			Meta: &nimbusv1.ObjectMeta{Name: "blue", Generation: 1},
			Spec: &nimbusv1.Object_Network{Network: &nimbusv1.NetworkSpec{Vni: 10, Subnet: "10.1.0.0/24"}},
		})
		txn.SetResume("3f2a", 42)
	})
	a.desired.MarkSynced()
	a.setStatus("to-dc2", 2, programmed, "route in table 100")
	a.setStatus("gone", 1, failed, "deleting route:\nno such process")
}

func TestDelphiList(t *testing.T) {
	a := newAgentEnv(t)
	out, errOut, err := a.run("", "delphi", "list")
	if err != nil || out != "epoch: -   revision: 0   synced: false\n" || errOut != "No entries found.\n" {
		t.Errorf("delphi list of an empty delphi: err %v, stdout %q, stderr %q", err, out, errOut)
	}

	a.fill()
	equal(t, "delphi list", a.ok("delphi", "list"), ""+
		"epoch: 3f2a   revision: 42   synced: true\n"+
		"KIND      NAME     TENANT    NAMESPACE   GENERATION   PHASE        OBSERVED   MESSAGE\n"+
		"Network   blue     default   default     1            -            -          -\n"+
		"Route     gone     default   default     -            FAILED       1          deleting route: no such process\n"+
		"Route     to-dc2   default   default     2            PROGRAMMED   2          route in table 100\n"+
		"Route     to-dc3   default   default     1            -            -          -\n")
	equal(t, "delphi list networks", a.ok("delphi", "list", "networks"), ""+
		"epoch: 3f2a   revision: 42   synced: true\n"+
		"KIND      NAME   TENANT    NAMESPACE   GENERATION   PHASE   OBSERVED   MESSAGE\n"+
		"Network   blue   default   default     1            -       -          -\n")

	var doc struct {
		Epoch    string
		Revision int
		Synced   bool
		Items    []struct {
			Kind string
			Meta struct {
				Name       string
				Generation int64
			}
			Spec struct{ Prefix string }
			// Status is this node's status: a NodeStatus, not an ObjectStatus.
			Status *struct {
				Node, Phase, Message string
				ObservedGeneration   int64
			}
		}
	}
	out = a.ok("delphi", "list", "routes", "-o", "json")
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("delphi list -o json: %v\n%s", err, out)
	}
	if doc.Epoch != "3f2a" || doc.Revision != 42 || !doc.Synced || len(doc.Items) != 3 {
		t.Fatalf("delphi list -o json: %+v\n%s", doc, out)
	}
	gone, dc2, dc3 := doc.Items[0], doc.Items[1], doc.Items[2]
	if gone.Meta.Name != "gone" || gone.Kind != "Route" || gone.Status == nil || gone.Status.Phase != "PHASE_FAILED" || gone.Spec.Prefix != "" {
		t.Errorf("delphi list -o json: status-only entry %+v", gone)
	}
	if dc2.Meta.Name != "to-dc2" || dc2.Meta.Generation != 2 || dc2.Spec.Prefix != "198.51.100.0/24" || dc2.Status == nil ||
		dc2.Status.Node != "host-a" || dc2.Status.ObservedGeneration != 2 || dc2.Status.Message != "route in table 100" {
		t.Errorf("delphi list -o json: to-dc2 %+v", dc2)
	}
	if dc3.Meta.Name != "to-dc3" || dc3.Status != nil {
		t.Errorf("delphi list -o json: to-dc3 %+v, want no status", dc3)
	}
	if out := a.ok("delphi", "list", "-o", "yaml"); !strings.Contains(out, "epoch: 3f2a\n") || !strings.Contains(out, "prefix: 198.51.100.0/24") {
		t.Errorf("delphi list -o yaml:\n%s", out)
	}
}

func TestDelphiGet(t *testing.T) {
	a := newAgentEnv(t)
	a.fill()
	equal(t, "delphi get", a.ok("delphi", "get", "route", "to-dc2"), `kind: Route
meta:
  generation: 2
  name: to-dc2
  namespace: default
  nodes:
  - host-a
  tenant: default
spec:
  nexthops:
  - gateway: 10.10.0.2
  prefix: 198.51.100.0/24
  table: 100
status:
  message: route in table 100
  node: host-a
  observedGeneration: 2
  operational: {}
  phase: PHASE_PROGRAMMED
  reason: ""
  stale: false
  terminal: false
`)
	out := a.ok("delphi", "get", "route", "gone", "-o", "json")
	var doc struct {
		Kind   string
		Meta   map[string]string
		Spec   json.RawMessage
		Status struct{ Message string }
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("delphi get -o json: %v\n%s", err, out)
	}
	if doc.Kind != "Route" || doc.Spec != nil || len(doc.Meta) != 3 || doc.Meta["name"] != "gone" ||
		doc.Meta["tenant"] != "default" || doc.Meta["namespace"] != "default" || doc.Status.Message != "deleting route:\nno such process" {
		t.Errorf("delphi get of a status-only entry:\n%s", out)
	}

	err := a.fails("delphi", "get", "route", "missing")
	equal(t, "delphi get of a missing route", err.Error(), `route "missing" not found in delphi`)
	if !errors.Is(err, ErrNotFound) {
		t.Errorf("error %v is not ErrNotFound", err)
	}
	contains(t, "delphi get -o table", a.fails("delphi", "get", "route", "to-dc2", "-o", "table"), `--output "table": want json or yaml`)
}

func TestDelphiWatch(t *testing.T) {
	a := newAgentEnv(t)
	a.fill()
	r := a.start("delphi", "watch", "routes", "-o", "json")
	eventually(t, "the three routes", func() bool { return strings.Count(r.stdout.String(), "\n") == 3 })
	lines := strings.Split(strings.TrimSpace(r.stdout.String()), "\n")
	for i, name := range []string{"gone", "to-dc2", "to-dc3"} {
		if !strings.Contains(lines[i], `"name":"`+name+`"`) {
			t.Errorf("initial event %d = %s, want %s", i, lines[i], name)
		}
	}

	a.commit(func(txn *delphi.DesiredTxn) { txn.Delete(nimbusv1.NewKey(nimbusv1.Kind_KIND_ROUTE, "", "", "to-dc3")) })
	eventually(t, "the delete of to-dc3", func() bool { return strings.Count(r.stdout.String(), "\n") == 4 })
	equal(t, "delete event", strings.Split(r.stdout.String(), "\n")[3],
		`{"deleted":true,"kind":"Route","meta":{"name":"to-dc3","namespace":"default","tenant":"default"}}`)

	a.setStatus("to-dc2", 2, failed, "link down")
	eventually(t, "the status of to-dc2", func() bool { return strings.Count(r.stdout.String(), "\n") == 5 })
	if last := strings.Split(r.stdout.String(), "\n")[4]; !strings.Contains(last, `"phase":"PHASE_FAILED"`) || strings.Contains(last, "deleted") {
		t.Errorf("status event = %s", last)
	}

	r.cancel() // as an interrupt does
	if err := r.result(t); err != nil {
		t.Errorf("delphi watch after an interrupt = %v, want nil", err)
	}

	y := a.start("delphi", "watch")
	eventually(t, "YAML documents", func() bool { return strings.Count(y.stdout.String(), "---\n") == 3 })
	if out := y.stdout.String(); !strings.HasPrefix(out, "---\nkind: Network\n") {
		t.Errorf("delphi watch -o yaml starts:\n%s", out)
	}
}

func TestAgentFlag(t *testing.T) {
	a := newAgentEnv(t)
	nobody := filepath.Join(a.dir, "nobody.sock")
	a.vars[AgentEnv] = nobody
	err := a.fails("delphi", "list")
	contains(t, "NAPLES_AGENT of a socket nobody serves", err, "listing delphi entries", "the agent at "+nobody+" is unavailable")
	a.ok("--agent", a.sock, "delphi", "list")
	a.ok("--agent", "unix://"+a.sock, "delphi", "list")
	contains(t, "--agent tcp", a.fails("--agent", "tcp://127.0.0.1:1", "delphi", "list"), `--agent "tcp://127.0.0.1:1"`, "unix socket")
	contains(t, "bad kind", a.fails("delphi", "list", "rout"), `kind "rout": unknown kind`)
	contains(t, "watch -o table", a.fails("delphi", "watch", "-o", "table"), `--output "table": want json or yaml`)
}
