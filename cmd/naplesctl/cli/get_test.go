package cli

import (
	"errors"
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/naplesnet/naples/internal/exitstatus"
)

// update rewrites the golden files of the output tests with what naplesctl prints.
var update = flag.Bool("update", false, "rewrite the golden files under testdata")

// golden compares got with the golden file testdata/name, or writes it with -update.
func golden(t *testing.T, name, got string) {
	t.Helper()
	p := filepath.Join("testdata", name)
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(p)
	if err != nil {
		t.Fatalf("reading the golden file (go test -run %s -update writes it): %v", t.Name(), err)
	}
	equal(t, name, got, string(want))
}

// formatsManifest holds an object of each kind -o wide shows columns of, and two routes
// in two tenants.
const formatsManifest = `kind: Network
meta: {name: blue, nodes: [host-a, host-b, host-c, host-d, host-e]}
spec: {vni: 100, subnet: 10.1.0.0/24, gateway: 10.1.0.1, mtu: 1450}
---
kind: Endpoint
meta: {name: web-a}
spec: {network: blue, node: host-a, interface: veth-web-a, mac: "02:00:00:00:01:0a", ips: [10.1.0.2]}
---
kind: Route
meta: {name: to-dc2, nodes: [host-a, host-b], labels: {team: net}}
spec:
  table: 100
  prefix: 198.51.100.0/24
  nexthops: [{gateway: 10.10.0.2}, {gateway: 10.10.0.3, device: eth1}]
---
kind: Route
meta: {name: to-dc3, tenant: acme, nodes: [host-a]}
spec: {tenantTable: true, prefix: 203.0.113.0/24, nexthops: [{device: eth2}]}
`

// newFormatsEnv is a nimbus holding formatsManifest, with host-a's reports of the
// to-dc2 route (PROGRAMMED) and host-b's (FAILED).
func newFormatsEnv(t *testing.T) *env {
	t.Helper()
	e := newEnv(t)
	e.ok("apply", "-f", e.file("objects.yaml", formatsManifest))
	e.report("to-dc2", "host-a", 1, programmed, "", "route in table 100")
	e.report("to-dc2", "host-b", 1, failed, "KernelError", "adding route: network is unreachable")
	return e
}

// uuid matches a UID as nimbus makes them.
var uuid = regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`)

// withoutUIDs replaces the UIDs nimbus gave the objects in out, which differ from run to
// run, with <uid>.
func withoutUIDs(out string) string { return uuid.ReplaceAllString(out, "<uid>") }

// TestGetFormats prints routes, one route, networks and endpoints in every format of
// get's --output and compares what naplesctl prints with the golden files under
// testdata: go test -run TestGetFormats -update rewrites them.
func TestGetFormats(t *testing.T) {
	e := newFormatsEnv(t)
	tests := []struct {
		golden string
		args   []string
	}{
		{"get-routes.txt", []string{"get", "routes"}},
		{"get-routes-wide.txt", []string{"get", "routes", "-o", "wide"}},
		{"get-networks-wide.txt", []string{"get", "networks", "-o", "wide"}},
		{"get-endpoints-wide.txt", []string{"get", "endpoints", "-o", "wide"}},
		{"get-route-wide.txt", []string{"get", "route", "to-dc2", "-o", "wide"}},
		{"get-routes-name.txt", []string{"get", "routes", "-o", "name"}},
		{"get-route-name.txt", []string{"get", "route", "to-dc3", "--tenant", "acme", "-o", "name"}},
		{"get-routes.json", []string{"get", "routes", "-o", "json"}},
		{"get-route.yaml", []string{"get", "route", "to-dc2", "-o", "yaml"}},
		{"get-routes-jsonpath.txt", []string{"get", "routes", "-o",
			`jsonpath={range .items[*]}{.meta.tenant}/{.meta.name}{"\t"}{.spec.prefix}{"\t"}{.meta.generation}{"\t"}{.status.nodes[?(@.phase=="PHASE_FAILED")].node}{"\n"}{end}`}},
		{"get-route-jsonpath.txt", []string{"get", "route", "to-dc2", "-o", "jsonpath={.spec.nexthops[*].gateway}"}},
		{"get-routes-jsonpath-filter.txt", []string{"get", "routes", "-o",
			`jsonpath={.items[?(@.meta.generation==1)].meta.name}{"\n"}{.items[?(@.status.programmedNodes>0)].meta.name}{"\n"}`}},
		{"get-routes-custom-columns.txt", []string{"get", "routes", "-o",
			"custom-columns=NAME:.meta.name,TENANT:meta.tenant,GATEWAYS:{.spec.nexthops[*].gateway},GEN:.meta.generation,TEAM:.meta.labels.team"}},
		{"get-endpoints-custom-columns.txt", []string{"get", "endpoints", "-o", "custom-columns=NAME:.meta.name,MAC:.spec.mac,IPS:.spec.ips"}},
	}
	for _, tt := range tests {
		t.Run(tt.golden, func(t *testing.T) {
			golden(t, tt.golden, withoutUIDs(e.ok(tt.args...)))
		})
	}

	// An empty list says so on stderr in the formats that print rows, and nothing on
	// stdout; JSONPath runs over the empty list.
	for _, format := range []string{"table", "wide", "name", "custom-columns=NAME:.meta.name"} {
		out, errOut, err := e.run("", "get", "interfaces", "-o", format)
		if err != nil || out != "" || errOut != "No resources found.\n" {
			t.Errorf("get interfaces -o %s: err %v, stdout %q, stderr %q; want only No resources found. on stderr", format, err, out, errOut)
		}
	}
	equal(t, "jsonpath over no objects", e.ok("get", "interfaces", "-o", "jsonpath={.items}"), "[]")
}

// TestGetInterfacesWide checks that -o wide shows the device of each Interface: the one
// spec.device names, or the object's name when it names none, as the agent programs it.
func TestGetInterfacesWide(t *testing.T) {
	e := newEnv(t)
	e.ok("apply", "-f", e.file("interfaces.yaml", "kind: Interface\nmeta: {name: eth1, nodes: [host-a]}\nspec: {mtu: 9000}\n"+
		"---\nkind: Interface\nmeta: {name: uplink, nodes: [host-a]}\nspec: {device: eth2}\n"))
	rows := strings.Split(strings.TrimSpace(e.ok("get", "interfaces", "-o", "wide")), "\n")
	header := strings.Fields(rows[0])
	col := slices.Index(header, "DEVICE")
	if col < 0 || len(rows) != 3 {
		t.Fatalf("get interfaces -o wide printed\n%s\nwant a DEVICE column and two rows", strings.Join(rows, "\n"))
	}
	for i, want := range map[int]string{1: "eth1", 2: "eth2"} {
		if got := strings.Fields(rows[i])[col]; got != want {
			t.Errorf("row %d %q: DEVICE %q, want %q", i, rows[i], got, want)
		}
	}
}

// TestGetBadOutput: a bad format or template is a usage error naming --output and the
// value, and prints nothing.
func TestGetBadOutput(t *testing.T) {
	e := newEnv(t)
	tests := []struct {
		value string
		parts []string
	}{
		{"xml", []string{`--output "xml"`, "want table, wide, name, json, yaml, jsonpath=TEMPLATE or custom-columns=HEADER:PATH,..."}},
		{"wide=x", []string{`--output "wide=x"`, "wide takes no template"}},
		{"jsonpath", []string{`--output "jsonpath"`, "want jsonpath=TEMPLATE"}},
		{"jsonpath={.meta.name", []string{`--output "jsonpath={.meta.name"`, "parsing the template", "unclosed action"}},
		{"jsonpath={.items[?(@.x==]}", []string{`--output "jsonpath={.items[?(@.x==]}"`, "parsing the template"}},
		{"custom-columns=", []string{`--output "custom-columns="`, "want custom-columns=HEADER:PATH"}},
		{"custom-columns=NAME", []string{`--output "custom-columns=NAME"`, `column 1 "NAME": want HEADER:PATH`}},
		{"custom-columns=NAME:.meta.name,P:.spec[", []string{`column 2 "P:.spec["`, "parsing the template"}},
	}
	for _, tt := range tests {
		t.Run(tt.value, func(t *testing.T) {
			err := e.fails("get", "routes", "-o", tt.value)
			contains(t, "get -o "+tt.value, err, tt.parts...)
			if exitstatus.Of(err) != 2 {
				t.Errorf("get -o %s: exit status %d, want 2 (usage)", tt.value, exitstatus.Of(err))
			}
		})
	}
	if err := e.fails("get", "route", "missing", "-o", "name"); !errors.Is(err, ErrNotFound) {
		t.Errorf("get -o name of a missing route: %v, want ErrNotFound", err)
	}
}

// TestGetYAMLAppliesAgain: what get -o yaml and -o json print, with generations and
// revisions as numbers, applies again unchanged.
func TestGetYAMLAppliesAgain(t *testing.T) {
	e := newEnv(t)
	e.ok("apply", "-f", e.file("routes.yaml", routeYAML("to-dc2", "198.51.100.0/24", "10.10.0.2")+"---\n"+
		routeYAML("to-dc3", "203.0.113.0/24", "10.10.0.3")))
	e.report("to-dc2", "host-a", 1, programmed, "", "route in table 100")
	for _, format := range []string{"yaml", "json"} {
		out := e.ok("get", "routes", "-o", format)
		for _, want := range []string{"generation: 1\n", "revision: 1\n", "observedGeneration: 1\n"} {
			if format == "json" {
				want = `"` + strings.Replace(strings.TrimSuffix(want, "\n"), ": ", `": `, 1) + ","
			}
			if !strings.Contains(out, want) {
				t.Errorf("get routes -o %s does not contain %q:\n%s", format, want, out)
			}
		}
		equal(t, "apply of get -o "+format, e.ok("apply", "-f", e.file("got."+format, out)),
			"route/to-dc2 unchanged\nroute/to-dc3 unchanged\n")
	}
}
