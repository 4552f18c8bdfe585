package cli

import (
	"path/filepath"
	"strings"
	"testing"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// complete runs cobra's hidden __complete command, as the completion scripts do, with
// args (the last one the word being completed) and returns the completions and the
// directive line.
func (e *env) complete(args ...string) (completions []string, directive string) {
	e.t.Helper()
	out := e.ok(append([]string{"__complete"}, args...)...)
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	return lines[:len(lines)-1], lines[len(lines)-1]
}

// TestCompletion completes kinds, object names asked from the in-process nimbus, node
// names and --output values through cobra's __complete command.
func TestCompletion(t *testing.T) {
	e := newTraceEnv(t) // nodes host-a and host-b, endpoints
	e.ok("apply", "-f", e.file("objects.yaml", routeYAML("to-dc2", "198.51.100.0/24", "10.10.0.2")+"---\n"+routeYAML("to-dc3", "203.0.113.0/24", "10.10.0.3")+`---
kind: Route
meta: {name: to-acme, tenant: acme, nodes: [host-a]}
spec: {table: 100, prefix: 192.0.2.0/24, nexthops: [{gateway: 10.10.0.4}]}
`))
	const noFiles, noSpace = ":4", ":6"
	tests := []struct {
		name      string
		args      []string
		want      string
		directive string
	}{
		{"kind", []string{"get", "rou"}, "route routes", noFiles},
		{"kind, short name", []string{"get", "r"}, "route routes rt", noFiles},
		{"kind in upper case", []string{"describe", "Net"}, "network networks net networksecuritypolicy networksecuritypolicies", noFiles},
		{"kind of explain", []string{"explain", "if"}, "if", noFiles},
		{"kind of delete", []string{"delete", "e"}, "endpoint endpoints ep", noFiles},
		{"kind of wait", []string{"wait", "flow"}, "flowexportpolicy flowexportpolicies", noFiles},
		{"kind of delphi list", []string{"delphi", "list", "sec"}, "securitygroup securitygroups", noFiles},
		{"names of every tenant", []string{"get", "routes", ""}, "to-acme to-dc2 to-dc3", noFiles},
		{"names with a prefix", []string{"get", "route", "to-d"}, "to-dc2 to-dc3", noFiles},
		{"names of one tenant", []string{"get", "route", "--tenant", "acme", ""}, "to-acme", noFiles},
		{"names of another namespace", []string{"describe", "route", "-n", "blue", ""}, "", noFiles},
		{"get takes one name", []string{"get", "route", "to-dc2", ""}, "", noFiles},
		{"wait takes more names, not twice", []string{"wait", "route", "to-dc2", "to-"}, "to-acme to-dc3", noFiles},
		{"names of an unknown kind", []string{"get", "rout", ""}, "", noFiles},
		{"nodes", []string{"get", "nodes", ""}, "host-a host-b", noFiles},
		{"endpoints", []string{"delete", "endpoint", ""}, "db-b nowhere web-a", noFiles},
		{"--node", []string{"flows", "--node", ""}, "host-a host-b", noFiles},
		{"--node with a prefix", []string{"monitor", "--node", "host-b"}, "host-b", noFiles},
		{"--nodes, a list", []string{"certs", "--nodes", "host-a,host-"}, "host-a,host-a host-a,host-b", noFiles},
		{"get -o", []string{"get", "-o", ""}, "table wide name json yaml jsonpath= custom-columns=", noFiles},
		{"get -o j", []string{"get", "routes", "-o", "j"}, "json jsonpath=", noFiles},
		{"get -o c takes a template", []string{"get", "routes", "-o", "c"}, "custom-columns=", noSpace},
		{"delphi list -o", []string{"delphi", "list", "-o", ""}, "table json yaml", noFiles},
		{"flows -o", []string{"flows", "-o", ""}, "table json", noFiles},
		{"api-resources -o", []string{"api-resources", "-o", ""}, "wide name", noFiles},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, directive := e.complete(tt.args...)
			equal(t, "__complete "+strings.Join(tt.args, " "), strings.Join(got, " "), tt.want)
			equal(t, "directive of __complete "+strings.Join(tt.args, " "), directive, tt.directive)
		})
	}

	// Every kind completes, in every spelling offered, and each spelling parses.
	got, _ := e.complete("get", "")
	if len(got) != 3*len(nimbusv1.Kinds()) {
		t.Errorf("__complete get '': %d kinds, want %d (singular, plural and short of each): %q", len(got), 3*len(nimbusv1.Kinds()), got)
	}
	for i, s := range got {
		k, err := nimbusv1.ParseKind(s)
		if err != nil || k != nimbusv1.Kinds()[i/3] {
			t.Errorf("completed kind %q parses to %v, %v; want %v", s, k, err, nimbusv1.Kinds()[i/3])
		}
	}

	// A nimbus that cannot be reached completes to nothing, and says nothing but cobra's
	// own note of the directive.
	args := []string{"__complete", "--server", "unix://" + filepath.Join(e.dir, "nobody.sock"), "get", "route", ""}
	out, errOut, err := e.run("", args...)
	if err != nil || out != noFiles+"\n" || strings.TrimSpace(errOut) != "Completion ended with directive: ShellCompDirectiveNoFileComp" {
		t.Errorf("naplesctl %s: err %v, stdout %q, stderr %q; want only the directive", strings.Join(args, " "), err, out, errOut)
	}
}

// TestCompletionScripts: cobra's completion command writes a script for each shell.
func TestCompletionScripts(t *testing.T) {
	e := newEnv(t)
	for _, shell := range []string{"bash", "zsh", "fish", "powershell"} {
		if out := e.ok("completion", shell); !strings.Contains(out, "naplesctl") || !strings.Contains(out, "__complete") {
			t.Errorf("completion %s does not write a script that calls naplesctl __complete:\n%.300s", shell, out)
		}
	}
}
