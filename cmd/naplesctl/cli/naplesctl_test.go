package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/naplesnet/naples/internal/address"
	"github.com/naplesnet/naples/internal/exitstatus"
	"github.com/naplesnet/naples/internal/manifest"
	"github.com/naplesnet/naples/nimbus"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

func TestMain(m *testing.M) {
	if socket := os.Getenv(nimbusChildSocket); socket != "" {
		serveNimbusChild(socket)
		return
	}
	goleak.VerifyTestMain(m)
}

// created is when the test server creates every object; the CLI's clock stands 90s later.
var created = time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC)

// env is a nimbus server serving on a unix socket for one test, a client of it to check
// what naplesctl did, and what naplesctl runs with.
type env struct {
	t      *testing.T
	server string
	nimbus nimbusv1.NimbusClient
	dir    string
	// vars is the environment naplesctl sees.
	vars map[string]string
}

// newEnv starts a real nimbus server on a unix socket in a temporary directory, stopped
// when the test ends. naplesctl finds it through NAPLES_SERVER.
func newEnv(t *testing.T) *env {
	t.Helper()
	return newEnvWith(t, nimbus.Options{Now: func() time.Time { return created }})
}

// newEnvWith is newEnv with the nimbus options given; an unset Logger discards.
func newEnvWith(t *testing.T, opts nimbus.Options) *env {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	srv, err := nimbus.New(opts)
	if err != nil {
		t.Fatalf("nimbus.New: %v", err)
	}
	dir := t.TempDir()
	addr := address.Address{Network: "unix", Addr: filepath.Join(dir, "nimbus.sock")}
	ctx, cancel := context.WithCancel(context.Background())
	lis, err := addr.Listen(ctx)
	if err != nil {
		cancel()
		t.Fatalf("listening: %v", err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, lis) }()
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
		srv.Close()
	})

	conn, err := grpc.NewClient(addr.GRPCTarget(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("grpc.NewClient: %v", err)
	}
	t.Cleanup(func() { conn.Close() })
	return &env{
		t:      t,
		server: addr.String(),
		nimbus: nimbusv1.NewNimbusClient(conn),
		dir:    dir,
		vars:   map[string]string{ServerEnv: addr.String(), InsecureEnv: "1"},
	}
}

// run runs naplesctl with args and stdin and returns what it wrote.
func (e *env) run(stdin string, args ...string) (stdout, stderr string, err error) {
	e.t.Helper()
	var out, errOut bytes.Buffer
	c := &cli{
		stdin:  strings.NewReader(stdin),
		stdout: &out,
		stderr: &errOut,
		now:    func() time.Time { return created.Add(90 * time.Second) },
	}
	err = c.run(e.t.Context(), args, func(k string) string { return e.vars[k] })
	return out.String(), errOut.String(), err
}

// ok runs naplesctl with args, fails the test if it fails, and returns its stdout.
func (e *env) ok(args ...string) string {
	e.t.Helper()
	out, errOut, err := e.run("", args...)
	if err != nil {
		e.t.Fatalf("naplesctl %s: %v\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), err, out, errOut)
	}
	return out
}

// fails runs naplesctl with args, fails the test if it succeeds, and returns its error.
func (e *env) fails(args ...string) error {
	e.t.Helper()
	out, _, err := e.run("", args...)
	if err == nil {
		e.t.Fatalf("naplesctl %s succeeded, want an error; stdout:\n%s", strings.Join(args, " "), out)
	}
	if out != "" {
		e.t.Errorf("naplesctl %s failed but wrote to stdout:\n%s", strings.Join(args, " "), out)
	}
	return err
}

// file writes a manifest into the test's directory and returns its path.
func (e *env) file(name, content string) string {
	e.t.Helper()
	p := filepath.Join(e.dir, name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		e.t.Fatal(err)
	}
	return p
}

// routes returns the names of the routes stored in nimbus.
func (e *env) routes() []string {
	e.t.Helper()
	return e.names(nimbusv1.Kind_KIND_ROUTE)
}

// names returns the names of the objects of kind stored in nimbus.
func (e *env) names(kind nimbusv1.Kind) []string {
	e.t.Helper()
	resp, err := e.nimbus.List(e.t.Context(), &nimbusv1.ListRequest{Kind: kind})
	if err != nil {
		e.t.Fatalf("List: %v", err)
	}
	var names []string
	for _, it := range resp.GetItems() {
		names = append(names, it.GetObject().GetMeta().GetName())
	}
	return names
}

// get returns the route called name as nimbus stores it, with its status.
func (e *env) get(name string) *nimbusv1.ObjectWithStatus {
	e.t.Helper()
	resp, err := e.nimbus.Get(e.t.Context(), &nimbusv1.GetRequest{Key: nimbusv1.NewKey(nimbusv1.Kind_KIND_ROUTE, "", "", name)})
	if err != nil {
		e.t.Fatalf("Get %s: %v", name, err)
	}
	return resp.GetItem()
}

func routeYAML(name, prefix, gateway string) string {
	return `kind: Route
meta:
  name: ` + name + `
  nodes: [host-a]
spec:
  table: 100
  prefix: ` + prefix + `
  nexthops:
    - gateway: ` + gateway + "\n"
}

func equal(t *testing.T, what, got, want string) {
	t.Helper()
	if got != want {
		t.Errorf("%s:\n got:\n%s\nwant:\n%s", what, got, want)
	}
}

func contains(t *testing.T, what string, err error, parts ...string) {
	t.Helper()
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Errorf("%s: error %q does not mention %q", what, err, p)
		}
	}
}

func TestApplyGetDelete(t *testing.T) {
	e := newEnv(t)
	routes := e.file("routes.yaml", routeYAML("to-dc2", "198.51.100.0/24", "10.10.0.2")+"---\n"+
		routeYAML("to-dc3", "203.0.113.0/24", "10.10.0.3"))

	equal(t, "first apply", e.ok("apply", "-f", routes), "route/to-dc2 created\nroute/to-dc3 created\n")
	equal(t, "get routes", e.ok("get", "routes"), ""+
		"NAME     TENANT    NAMESPACE   GENERATION   PROGRAMMED   FAILED   PENDING   STALE   AGE\n"+
		"to-dc2   default   default     1            0/1          0        1         0       90s\n"+
		"to-dc3   default   default     1            0/1          0        1         0       90s\n")
	for _, kind := range []string{"Routes", "ROUTE", "route"} {
		if out := e.ok("get", kind, "to-dc2"); !strings.Contains(out, "to-dc2   default") || strings.Contains(out, "to-dc3") {
			t.Errorf("get %s to-dc2:\n%s", kind, out)
		}
	}

	var doc struct {
		Kind string
		Meta struct {
			UID        string
			Generation int64
		}
		Spec   struct{ Prefix string }
		Status struct{ TargetNodes int }
	}
	out := e.ok("get", "route", "to-dc2", "-o", "json")
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("get -o json: %v\n%s", err, out)
	}
	if doc.Kind != "Route" || doc.Meta.UID == "" || doc.Meta.UID != e.get("to-dc2").GetObject().GetMeta().GetUid() ||
		doc.Meta.Generation != 1 || doc.Spec.Prefix != "198.51.100.0/24" || doc.Status.TargetNodes != 1 {
		t.Errorf("get -o json: unexpected content %+v:\n%s", doc, out)
	}

	var list struct{ Items []json.RawMessage }
	out = e.ok("get", "routes", "-o", "json")
	if err := json.Unmarshal([]byte(out), &list); err != nil || len(list.Items) != 2 {
		t.Errorf("get routes -o json: want 2 items, got %d (%v):\n%s", len(list.Items), err, out)
	}

	// YAML output reads back as the stored objects.
	out = e.ok("get", "routes", "-o", "yaml")
	objs, err := manifest.Decode(strings.NewReader(out))
	if err != nil || len(objs) != 2 || objs[1].GetRoute().GetPrefix() != "203.0.113.0/24" {
		t.Errorf("get routes -o yaml does not decode to the two routes (%v): %v\n%s", err, objs, out)
	}

	equal(t, "second apply", e.ok("apply", "-f", routes), "route/to-dc2 unchanged\nroute/to-dc3 unchanged\n")

	changed := e.file("changed.yaml", routeYAML("to-dc2", "198.51.100.0/24", "10.10.0.12")+"---\n"+
		routeYAML("to-dc3", "203.0.113.0/24", "10.10.0.3"))
	equal(t, "apply of a new next hop", e.ok("apply", "-f", changed),
		"route/to-dc2 configured (generation 2)\nroute/to-dc3 unchanged\n")
	stored := e.get("to-dc2").GetObject()
	if g, gw := stored.GetMeta().GetGeneration(), stored.GetRoute().GetNexthops()[0].GetGateway(); g != 2 || gw != "10.10.0.12" {
		t.Errorf("after the change nimbus has generation %d, gateway %s; want 2, 10.10.0.12", g, gw)
	}

	// A label change is a change but not a new generation.
	labelled := e.file("labelled.yaml", strings.Replace(routeYAML("to-dc3", "203.0.113.0/24", "10.10.0.3"),
		"meta:\n", "meta:\n  labels: {site: dc3}\n", 1))
	equal(t, "apply of a label", e.ok("apply", "-f", labelled), "route/to-dc3 configured (generation 1)\n")

	// An invalid object refuses the whole file: the valid one before it is not stored.
	invalid := e.file("invalid.yaml", routeYAML("to-dc4", "192.0.2.0/24", "10.10.0.4")+"---\n"+
		routeYAML("bad", "10.0.0.0/33", "10.10.0.5"))
	err = e.fails("apply", "-f", invalid)
	contains(t, "apply of an invalid file", err, invalid, "document 2", "route/bad", `spec.prefix "10.0.0.0/33"`,
		"prefix length out of range", "nothing applied")
	if !errors.Is(err, nimbusv1.ErrInvalid) {
		t.Errorf("apply of an invalid file: error %v is not nimbusv1.ErrInvalid", err)
	}
	equal(t, "routes after the invalid apply", strings.Join(e.routes(), ","), "to-dc2,to-dc3")

	err = e.fails("get", "route", "missing")
	equal(t, "get of a missing route", err.Error(), `route "missing" not found`)
	if !errors.Is(err, ErrNotFound) {
		t.Errorf("get of a missing route: error %v is not ErrNotFound", err)
	}
	err = e.fails("get", "route", "to-dc2", "--tenant", "blue")
	equal(t, "get in another tenant", err.Error(), `route "to-dc2" not found in tenant "blue", namespace "default"`)

	equal(t, "delete", e.ok("delete", "route", "to-dc2"), "route/to-dc2 deleted\n")
	equal(t, "delete again", e.ok("delete", "route", "to-dc2"), "route/to-dc2 not found\n")
	equal(t, "delete -f", e.ok("delete", "-f", routes), "route/to-dc2 not found\nroute/to-dc3 deleted\n")
	equal(t, "delete -f again", e.ok("delete", "-f", routes), "route/to-dc2 not found\nroute/to-dc3 not found\n")
	if names := e.routes(); len(names) != 0 {
		t.Errorf("routes left after delete: %v", names)
	}

	out, errOut, err := e.run("", "get", "routes")
	if err != nil || out != "" || errOut != "No resources found.\n" {
		t.Errorf("get of no routes: err %v, stdout %q, stderr %q", err, out, errOut)
	}
	equal(t, "get -o json of no routes", e.ok("get", "routes", "-o", "json"), "{\n  \"items\": []\n}\n")
}

// TestDeleteReadsOnlyKeys checks that delete -f reads of each object only what names it,
// as its help says: a manifest whose spec no longer decodes (a field renamed, a value of
// another type) still deletes its objects, while one whose name cannot be read deletes
// nothing.
func TestDeleteReadsOnlyKeys(t *testing.T) {
	e := newEnv(t)
	e.ok("apply", "-f", e.file("routes.yaml", routeYAML("to-dc2", "198.51.100.0/24", "10.10.0.2")+"---\n"+
		routeYAML("to-dc3", "203.0.113.0/24", "10.10.0.3")))
	old := e.file("old.yaml", "kind: Route\nmeta: {name: to-dc2, labels: {tier: [1]}}\nspec: {next_hop: 10.10.0.2, table: main}\n")
	contains(t, "apply of the old manifest", e.fails("apply", "-f", old), "old.yaml: document 1")
	equal(t, "delete -f of the old manifest", e.ok("delete", "-f", old), "route/to-dc2 deleted\n")
	bad := e.file("bad.yaml", "kind: Route\nmeta: {name: to-dc3}\n---\nkind: Route\nmeta: {name: [to-dc4]}\n")
	contains(t, "delete -f of a manifest with a bad name", e.fails("delete", "-f", bad), `bad.yaml: document 2: meta.name ["to-dc4"]: want a string`)
	bad = e.file("invalid.yaml", "kind: Route\nmeta: {name: to-dc3}\n---\nkind: Route\nmeta: {name: To_DC4, tenant: Blue}\n---\nkind: rt\nmeta: {name: to-dc3, tenant: default}\n")
	contains(t, "delete -f of a manifest with invalid names", e.fails("delete", "-f", bad),
		`invalid.yaml: document 2: route/To_DC4: meta.name "To_DC4": must be lower-case`,
		`invalid.yaml: document 2: route/To_DC4: meta.tenant "Blue": must be lower-case`,
		`invalid.yaml: document 3: route/to-dc3: meta.name "to-dc3": the same object as `+bad+": document 1")
	if got := e.routes(); !slices.Equal(got, []string{"to-dc3"}) {
		t.Errorf("routes after the deletes: %q, want [to-dc3]", got)
	}
}

func TestApplyStdin(t *testing.T) {
	e := newEnv(t)
	in := `{"kind":"Route","meta":{"name":"a","nodes":["host-a"]},"spec":{"table":100,"prefix":"192.0.2.0/24","nexthops":[{"gateway":"10.0.0.1"}]}}`
	out, _, err := e.run(in, "apply", "-f", "-")
	if err != nil {
		t.Fatalf("apply -f -: %v", err)
	}
	equal(t, "apply -f -", out, "route/a created\n")

	_, _, err = e.run("kind: Rout\n", "apply", "-f", "-")
	if err == nil {
		t.Fatal("apply -f - of an unknown kind succeeded")
	}
	equal(t, "apply -f - of an unknown kind", err.Error(), `stdin: document 1: kind "Rout": unknown kind`)

	out, _, err = e.run(routeYAML("a", "192.0.2.0/24", "10.0.0.1"), "delete", "-f", "-")
	if err != nil {
		t.Fatalf("delete -f -: %v", err)
	}
	equal(t, "delete -f -", out, "route/a deleted\n")
}

func TestStatus(t *testing.T) {
	e := newEnv(t)
	e.ok("apply", "-f", e.file("route.yaml", routeYAML("to-dc2", "198.51.100.0/24", "10.10.0.2")))

	stream, err := e.nimbus.ReportStatus(t.Context())
	if err != nil {
		t.Fatalf("ReportStatus: %v", err)
	}
	err = stream.Send(&nimbusv1.StatusReport{
		Key: nimbusv1.NewKey(nimbusv1.Kind_KIND_ROUTE, "", "", "to-dc2"),
		Status: &nimbusv1.NodeStatus{
			Node: "host-a", ObservedGeneration: 1, Phase: nimbusv1.Phase_PHASE_PROGRAMMED, Message: "route in table 100",
		},
	})
	if err != nil {
		t.Fatalf("sending a status report: %v", err)
	}
	if _, err := stream.CloseAndRecv(); err != nil {
		t.Fatalf("ending the status reports: %v", err)
	}

	equal(t, "get route", e.ok("get", "route", "to-dc2"), ""+
		"NAME     TENANT    NAMESPACE   GENERATION   PROGRAMMED   FAILED   PENDING   STALE   AGE\n"+
		"to-dc2   default   default     1            1/1          0        0         0       90s\n")

	var doc struct {
		Status struct {
			ProgrammedNodes int
			Nodes           []struct {
				Node, Phase, Message string
				ObservedGeneration   int64
			}
		}
	}
	out := e.ok("get", "route", "to-dc2", "-o", "json")
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("get -o json: %v\n%s", err, out)
	}
	st := doc.Status
	if st.ProgrammedNodes != 1 || len(st.Nodes) != 1 || st.Nodes[0].Node != "host-a" || st.Nodes[0].Phase != "PHASE_PROGRAMMED" ||
		st.Nodes[0].ObservedGeneration != 1 || st.Nodes[0].Message != "route in table 100" {
		t.Errorf("get -o json: status %+v:\n%s", st, out)
	}

	out = e.ok("get", "route", "to-dc2", "-o", "yaml")
	for _, want := range []string{"phase: PHASE_PROGRAMMED", "observedGeneration: 1", "message: route in table 100", "programmedNodes: 1"} {
		if !strings.Contains(out, want) {
			t.Errorf("get -o yaml does not contain %q:\n%s", want, out)
		}
	}
}

func TestUsageErrors(t *testing.T) {
	e := newEnv(t)
	tests := []struct {
		name  string
		args  []string
		parts []string
		is    error
	}{
		{
			name:  "unknown kind",
			args:  []string{"get", "rout"},
			parts: []string{`kind "rout": unknown kind`, "valid kinds: Node (no), Network (net), Endpoint (ep), SecurityGroup (sg), NetworkSecurityPolicy (nsp), Route (rt), Interface (if), FlowExportPolicy (fep), Trace (tr)"},
			is:    nimbusv1.ErrUnknownKind,
		},
		{name: "unknown kind on delete", args: []string{"delete", "rout", "a"}, parts: []string{`kind "rout": unknown kind`}, is: nimbusv1.ErrUnknownKind},
		{name: "bad output", args: []string{"get", "routes", "-o", "xml"}, parts: []string{`--output "xml"`, "table, wide, name, json, yaml, jsonpath=TEMPLATE"}},
		{name: "apply without -f", args: []string{"apply"}, parts: []string{`"filename"`}},
		{name: "apply of a missing file", args: []string{"apply", "-f", "/nonexistent.yaml"}, parts: []string{"/nonexistent.yaml"}, is: os.ErrNotExist},
		{name: "apply of an empty file", args: []string{"apply", "-f", e.file("empty.yaml", "# nothing\n")}, parts: []string{"no objects found"}},
		{name: "delete without name", args: []string{"delete", "route"}, parts: []string{"KIND and NAME"}},
		{name: "delete with both", args: []string{"delete", "route", "a", "-f", "x.yaml"}, parts: []string{"not both"}},
		{name: "delete of a bad name", args: []string{"delete", "route", "Bad_Name"}, parts: []string{`key.name "Bad_Name"`}},
		{name: "bad server", args: []string{"--server", "ftp://x", "get", "routes"}, parts: []string{"parsing --server", `"ftp://x"`}},
		{name: "bad server in a list", args: []string{"--server", e.server + ",ftp://x", "get", "routes"}, parts: []string{"parsing --server", `"ftp://x"`}},
		{name: "empty server in a list", args: []string{"--server", e.server + ",", "get", "routes"}, parts: []string{"parsing --server", "address 2 is empty"}},
		{
			name: "unreachable servers",
			args: []string{"--server", "unix://" + filepath.Join(e.dir, "a.sock") + ",unix://" + filepath.Join(e.dir, "b.sock"), "get", "routes"},
			parts: []string{"listing Route objects",
				"nimbus at unix://" + filepath.Join(e.dir, "a.sock") + ",unix://" + filepath.Join(e.dir, "b.sock") + " is unavailable"},
		},
		{
			name:  "unreachable server",
			args:  []string{"--server", "unix://" + filepath.Join(e.dir, "nobody.sock"), "get", "routes"},
			parts: []string{"listing Route objects", "nimbus at unix://" + filepath.Join(e.dir, "nobody.sock") + " is unavailable"},
		},
		{name: "unknown command", args: []string{"frobnicate"}, parts: []string{`unknown command "frobnicate"`}},
	}
	// An empty stdin is named as its other errors name it.
	if _, _, err := e.run("# nothing\n", "apply", "-f", "-"); err == nil || !strings.Contains(err.Error(), "reading stdin: no objects found") {
		t.Errorf("apply -f - of nothing: %v; want reading stdin: no objects found", err)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := e.fails(tt.args...)
			contains(t, strings.Join(tt.args, " "), err, tt.parts...)
			if tt.is != nil && !errors.Is(err, tt.is) {
				t.Errorf("error %v is not %v", err, tt.is)
			}
		})
	}
}

// TestUnknownSubcommand checks that a command that only groups commands refuses one it
// does not have as a usage error, as naplesctl does, rather than printing its help and
// exiting 0, and that alone it still prints its help.
func TestUnknownSubcommand(t *testing.T) {
	e := newEnv(t)
	for _, args := range [][]string{{"delphi", "lst"}, {"bpf", "maps"}, {"completion", "tcsh"}} {
		err := e.fails(args...)
		contains(t, strings.Join(args, " "), err, fmt.Sprintf("unknown command %q for %q", args[1], "naplesctl "+args[0]))
		if got := exitstatus.Of(err); got != exitstatus.Config {
			t.Errorf("naplesctl %s: exit status %d, want %d (usage)", strings.Join(args, " "), got, exitstatus.Config)
		}
	}
	for _, group := range []string{"delphi", "bpf", "completion"} {
		if out := e.ok(group); !strings.Contains(out, "Available Commands:") {
			t.Errorf("naplesctl %s printed\n%s\nwant its help", group, out)
		}
	}
}

// TestBadKeyArguments checks that a name, tenant or namespace on the command line that no
// object can have is a usage error naming the argument or the flag, before nimbus is
// asked, and that delete then deletes nothing.
func TestBadKeyArguments(t *testing.T) {
	e := newEnv(t)
	e.ok("apply", "-f", e.file("route.yaml", routeYAML("to-dc2", "198.51.100.0/24", "10.10.0.2")))
	tests := []struct {
		args []string
		says string
	}{
		{[]string{"get", "route", "To_DC2"}, `argument 2: key.name "To_DC2": must be lower-case`},
		{[]string{"get", "route", "to-dc2", "--tenant", "Blue"}, `--tenant "Blue": must be lower-case`},
		{[]string{"describe", "route", "To_DC2"}, `argument 2: key.name "To_DC2"`},
		{[]string{"describe", "route", "to-dc2", "-n", "NS"}, `--namespace "NS"`},
		{[]string{"describe", "route", "to-dc2", "--nodes-limit", "-1"}, "--nodes-limit -1: must not be negative"},
		{[]string{"wait", "route", "to-dc2", ""}, `argument 3: key.name "": is required`},
		{[]string{"delete", "route", "x", "To_DC2"}, `argument 3: key.name "To_DC2"`},
		{[]string{"delete", "route", "to-dc2", "--tenant", "Blue"}, `--tenant "Blue"`},
		{[]string{"delete", "route", "to-dc2", "to-dc2"}, "argument 3: route/to-dc2: key.name \"to-dc2\": the same object as argument 2"},
	}
	for _, tt := range tests {
		err := e.fails(tt.args...)
		contains(t, strings.Join(tt.args, " "), err, tt.says)
		if got := exitstatus.Of(err); got != exitstatus.Config {
			t.Errorf("naplesctl %q: exit status %d, want %d (usage)", tt.args, got, exitstatus.Config)
		}
	}
	if got := e.routes(); !slices.Equal(got, []string{"to-dc2"}) {
		t.Errorf("routes after the refused deletes: %v, want [to-dc2]", got)
	}
}

// TestServerFlag checks that --server overrides NAPLES_SERVER and that the default is used
// when neither is set.
func TestServerFlag(t *testing.T) {
	e := newEnv(t)
	e.vars[ServerEnv] = "unix://" + filepath.Join(e.dir, "nobody.sock")
	if err := e.fails("get", "routes"); !strings.Contains(err.Error(), "nobody.sock") {
		t.Errorf("NAPLES_SERVER not used: %v", err)
	}
	e.ok("--server", e.server, "get", "routes")

	if _, err := os.Stat(strings.TrimPrefix(DefaultServer, "unix://")); err == nil {
		t.Skipf("a server listens on %s; not checking that it is the default", DefaultServer)
	}
	delete(e.vars, ServerEnv)
	if err := e.fails("get", "routes", "-o", "json"); !strings.Contains(err.Error(), DefaultServer) {
		t.Errorf("default server not used: %v", err)
	}
}

// TestServerList gives --server a dead replica and a live one: each command reaches the
// live one, whichever of the two it tries first.
func TestServerList(t *testing.T) {
	e := newEnv(t)
	list := "unix://" + filepath.Join(e.dir, "dead.sock") + "," + e.server
	e.ok("--server", list, "apply", "-f", e.file("r.yaml", routeYAML("to-dc2", "198.51.100.0/24", "10.10.0.2")))
	if got := e.routes(); !slices.Equal(got, []string{"to-dc2"}) {
		t.Fatalf("after an apply through %s nimbus holds routes %v, want [to-dc2]", list, got)
	}
	// Each command picks its first address at random: 8 commands all picking the live one
	// first is a chance of 1 in 256, and then the dead one was not tried.
	for range 8 {
		if out := e.ok("--server", list, "get", "route", "to-dc2", "-o", "json"); !strings.Contains(out, "198.51.100.0/24") {
			t.Fatalf("get through %s printed:\n%s", list, out)
		}
	}
}

func TestStatusErrorKeepsMessage(t *testing.T) {
	s := &session{addr: address.List{{Network: "unix", Addr: "/run/n.sock"}}}
	msg := `spec.prefix "10.0.0.0/33": prefix length out of range`
	err := fmt.Errorf("applying route/bad: %w", s.rpcError(status.Error(codes.InvalidArgument, msg)))
	equal(t, "invalid argument", err.Error(), "applying route/bad: "+msg)
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("status.Code(%v) = %v, want InvalidArgument", err, status.Code(err))
	}
	err = s.rpcError(status.Error(codes.Internal, "boom"))
	equal(t, "internal", err.Error(), "boom (Internal)")
}

// TestInterruptedCallIsCanceled checks that a call ended by its canceled context, which
// gRPC reports as a status of code Canceled, counts as context.Canceled wherever it is
// wrapped: an interrupt is told the same way whichever call it cut short.
func TestInterruptedCallIsCanceled(t *testing.T) {
	s := &session{addr: address.List{{Network: "unix", Addr: "/run/n.sock"}}}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	// The status gRPC returns for a call whose context was canceled.
	err := fmt.Errorf("getting endpoint/web-a: %w", s.rpcError(status.FromContextError(ctx.Err()).Err()))
	if !errors.Is(err, context.Canceled) {
		t.Errorf("errors.Is(%v, context.Canceled) = false", err)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("errors.Is(%v, context.DeadlineExceeded) = true", err)
	}
	if err := s.rpcError(status.Error(codes.Internal, "boom")); errors.Is(err, context.Canceled) {
		t.Errorf("errors.Is(%v, context.Canceled) = true for an Internal status", err)
	}
}

func TestHumanDuration(t *testing.T) {
	tests := []struct {
		d    time.Duration
		want string
	}{
		{-time.Second, "0s"},
		{0, "0s"},
		{90 * time.Second, "90s"},
		{5*time.Minute + 30*time.Second, "5m30s"},
		{10 * time.Minute, "10m"},
		{150 * time.Minute, "150m"},
		{3 * time.Hour, "3h"},
		{5*time.Hour + 20*time.Minute, "5h20m"},
		{30 * time.Hour, "30h"},
		{52 * time.Hour, "2d4h"},
		{400 * 24 * time.Hour, "400d"},
		{(3*365 + 10) * 24 * time.Hour, "3y10d"},
		{10 * 365 * 24 * time.Hour, "10y"},
	}
	for _, tt := range tests {
		if got := humanDuration(tt.d); got != tt.want {
			t.Errorf("humanDuration(%v) = %q, want %q", tt.d, got, tt.want)
		}
	}
}

// TestGlobalFlagsNameTheirVariables: every global flag's help names its environment
// variable as nimbus's and naples-agent's do ("($NAPLES_SERVER)", the prefix and the
// flag's name in upper case), and that variable sets the flag's default.
func TestGlobalFlagsNameTheirVariables(t *testing.T) {
	vars := map[string]string{}
	for _, name := range []string{"agent", "server", "tls-ca", "tls-cert", "tls-key", "tls-server-name"} {
		vars["NAPLES_"+strings.ToUpper(strings.ReplaceAll(name, "-", "_"))] = "/from/env/" + name
	}
	vars["NAPLES_INSECURE"] = "1"
	var out, errOut bytes.Buffer
	if err := Run(t.Context(), []string{"--help"}, strings.NewReader(""), &out, &errOut, func(k string) string { return vars[k] }); err != nil {
		t.Fatalf("naplesctl --help: %v\n%s", err, errOut.String())
	}
	help := out.String()
	if !strings.Contains(help, "($NAPLES_ and the flag's name in upper case); the command line wins") {
		t.Errorf("the help does not say how the variables are named:\n%s", help)
	}
	flags := 0
	for line := range strings.Lines(help) {
		f := strings.Fields(line)
		if len(f) < 2 || !strings.HasPrefix(f[0], "--") || f[0] == "--help" || f[0] == "--version" {
			continue
		}
		flags++
		name := strings.TrimPrefix(f[0], "--")
		env := "NAPLES_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
		want := fmt.Sprintf("($%s) (default %q)", env, vars[env])
		if name == "insecure" {
			want = fmt.Sprintf("($%s) (default true)", env)
		}
		if !strings.HasSuffix(strings.TrimSpace(line), want) {
			t.Errorf("help of --%s = %q, want it to end %q", name, strings.TrimSpace(line), want)
		}
	}
	if flags != len(vars) {
		t.Errorf("the help lists %d global flags, want %d:\n%s", flags, len(vars), help)
	}
}
