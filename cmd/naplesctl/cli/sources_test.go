package cli

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/naplesnet/naples/internal/exitstatus"
)

// manifestDir writes files, path to content, under a new directory of the test's and
// returns the directory.
func (e *env) manifestDir(name string, files map[string]string) string {
	e.t.Helper()
	dir := filepath.Join(e.dir, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		e.t.Fatal(err)
	}
	for p, content := range files {
		p = filepath.Join(dir, p)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			e.t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			e.t.Fatal(err)
		}
	}
	return dir
}

// routeJSON is routeYAML's route as JSON.
func routeJSON(name, prefix, gateway string) string {
	return `{"kind":"Route","meta":{"name":"` + name + `","nodes":["host-a"]},"spec":{"table":100,"prefix":"` + prefix + `","nexthops":[{"gateway":"` + gateway + `"}]}}`
}

// TestApplyDirectory checks that -f DIR applies the directory's manifest files in name
// order and nothing else, that -R adds its subdirectories' in the place of their name,
// and that delete -f DIR -R deletes them all.
func TestApplyDirectory(t *testing.T) {
	e := newEnv(t)
	dir := e.manifestDir("manifests", map[string]string{
		"c.yml":          routeYAML("c", "192.0.2.32/27", "10.0.0.1"),
		"a.json":         routeJSON("a", "192.0.2.0/27", "10.0.0.1"),
		"B.YAML":         routeYAML("b", "192.0.2.64/27", "10.0.0.1"),
		"notes.txt":      "not a manifest\n",
		"aa/d.yaml":      routeYAML("d", "192.0.2.96/27", "10.0.0.1"),
		"aa/deep/e.yaml": routeYAML("e", "192.0.2.128/27", "10.0.0.1"),
	})
	// A link to a manifest file is read; one to a directory only as the directory given.
	if err := os.Symlink(e.file("f.yaml", routeYAML("f", "192.0.2.160/27", "10.0.0.1")), filepath.Join(dir, "z.yaml")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(dir, "aa"), filepath.Join(dir, "ab")); err != nil {
		t.Fatal(err)
	}
	// B.YAML sorts first: names are ordered byte by byte.
	equal(t, "apply -f DIR", e.ok("apply", "-f", dir), "route/b created\nroute/a created\nroute/c created\nroute/f created\n")
	if got := e.routes(); len(got) != 4 {
		t.Errorf("routes after apply -f DIR: %q, want a, b, c and f only", got)
	}
	equal(t, "apply -f DIR -R", e.ok("apply", "-f", dir, "-R"),
		"route/b unchanged\nroute/a unchanged\nroute/d created\nroute/e created\nroute/c unchanged\nroute/f unchanged\n")
	equal(t, "delete -f DIR --recursive", e.ok("delete", "-f", filepath.Join(dir, "aa"), "--recursive"), "route/d deleted\nroute/e deleted\n")
	if got := e.routes(); len(got) != 4 {
		t.Errorf("routes after delete -f DIR/aa -R: %q, want a, b, c and f", got)
	}
}

// TestApplyStdinAndDirectory checks that -f - and -f DIR go together, in the order given.
func TestApplyStdinAndDirectory(t *testing.T) {
	e := newEnv(t)
	dir := e.manifestDir("m", map[string]string{"b.yaml": routeYAML("b", "192.0.2.64/27", "10.0.0.1")})
	out, _, err := e.run(routeYAML("a", "192.0.2.0/27", "10.0.0.1"), "apply", "-f", "-", "-f", dir)
	if err != nil {
		t.Fatalf("apply -f - -f DIR: %v", err)
	}
	equal(t, "apply -f - -f DIR", out, "route/a created\nroute/b created\n")
}

// TestManifestSourceErrors checks that a bad file in a directory is named, that nothing
// of the directory is applied then, and the usage errors of -f.
func TestManifestSourceErrors(t *testing.T) {
	e := newEnv(t)
	bad := e.manifestDir("bad", map[string]string{
		"a.yaml": routeYAML("a", "192.0.2.0/27", "10.0.0.1"),
		"b.yaml": "kind: Route\nmeta: {name: b}\nspec: {tabel: 1}\n",
	})
	err := e.fails("apply", "-f", bad)
	contains(t, "apply -f DIR with a bad file", err, filepath.Join(bad, "b.yaml"), "tabel")
	invalid := e.manifestDir("invalid", map[string]string{
		"a.yaml":     routeYAML("a", "192.0.2.0/27", "10.0.0.1"),
		"sub/b.yaml": routeYAML("b", "192.0.2.0/33", "10.0.0.1"),
	})
	err = e.fails("apply", "-f", invalid, "-R")
	contains(t, "apply -f DIR -R with an invalid object", err, filepath.Join(invalid, "sub", "b.yaml")+": document 1", `"192.0.2.0/33"`, "nothing applied")
	if got := e.routes(); len(got) != 0 {
		t.Errorf("routes after failed applies: %q, want none", got)
	}

	empty := e.manifestDir("empty", map[string]string{"README": "x\n", "sub/a.yaml": routeYAML("a", "192.0.2.0/27", "10.0.0.1")})
	for _, tc := range []struct {
		name  string
		stdin string
		args  []string
		parts []string
	}{
		{name: "directory without manifests", args: []string{"apply", "-f", empty}, parts: []string{"directory " + empty, "no *.yaml, *.yml or *.json files", "-R reads its subdirectories"}},
		{name: "stdin twice", stdin: routeYAML("a", "192.0.2.0/27", "10.0.0.1"), args: []string{"apply", "-f", "-", "-f", "-"}, parts: []string{`-f "-"`, "twice"}},
		{name: "-R without -f", args: []string{"delete", "route", "a", "-R"}, parts: []string{"-R", "needs -f"}},
		{name: "missing file in a list", args: []string{"delete", "-f", empty, "-R", "-f", filepath.Join(e.dir, "nothing.yaml")}, parts: []string{filepath.Join(e.dir, "nothing.yaml")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, _, err := e.run(tc.stdin, tc.args...)
			if err == nil {
				t.Fatalf("succeeded, want an error; stdout:\n%s", out)
			}
			contains(t, tc.name, err, tc.parts...)
			if exitstatus.Of(err) != 2 {
				t.Errorf("exit status %d, want 2 (usage): %v", exitstatus.Of(err), err)
			}
		})
	}
	if got := e.routes(); len(got) != 0 {
		t.Errorf("routes after failed commands: %q, want none", got)
	}
}
