package test

import (
	"bufio"
	"bytes"
	"os/exec"
	"strings"
	"testing"
)

// module is the import path of the naples module.
const module = "github.com/naplesnet/naples/"

// layer is one layer of the house, named by the import paths it holds, and the layers its
// packages may import. Arrows point one way (docs/datapath.md): cmd → agent →
// {nimbusclient, hal} → delphi → proto; nimbus and the controller package know nothing of
// the agent; utilities under internal/ import only the wire API and each other.
type layer struct {
	name string
	// holds reports whether the package at path (relative to the module) is in the layer.
	holds func(path string) bool
	// imports names the layers this one may import, itself included where it may.
	imports []string
}

// under returns a holds func for the packages at or below any of prefixes.
func under(prefixes ...string) func(string) bool {
	return func(path string) bool {
		for _, p := range prefixes {
			if path == p || strings.HasPrefix(path, p+"/") {
				return true
			}
		}
		return false
	}
}

// layers are the house's layers, most specific first: a package is in the first layer
// that holds it.
var layers = []layer{
	{"proto", under("proto"), []string{"proto"}},
	{"halstore", under("agent/halstore"), []string{"proto", "internal", "delphi", "hal"}},
	{"internal", under("internal"), []string{"proto", "internal"}},
	{"delphi", under("delphi"), []string{"proto", "internal"}},
	{"hal", under("hal"), []string{"proto", "internal", "delphi", "hal"}},
	{"nimbusclient", under("nimbusclient"), []string{"proto", "internal", "delphi"}},
	// nimbus's web console reads the server in-process, above it.
	{"console", under("nimbus/console"), []string{"proto", "internal", "nimbus"}},
	{"nimbus", under("nimbus"), []string{"proto", "internal"}},
	{"controller", under("controller"), []string{"proto", "internal"}},
	{"agent", under("agent"), []string{"proto", "internal", "delphi", "hal", "halstore", "nimbusclient", "agent"}},
	{"naplesctl", under("cmd/naplesctl"), []string{"proto", "internal", "controller", "naplesctl"}},
	{"cmd/naples-agent", under("cmd/naples-agent"), []string{"proto", "internal", "agent"}},
	{"cmd/nimbus", under("cmd/nimbus"), []string{"proto", "internal", "nimbus", "console"}},
	{"deploy", under("deploy"), nil},
	{"test", under("test", "bench"), nil}, // anything
}

// layerOf returns the layer that holds path, or nil.
func layerOf(path string) *layer {
	for i := range layers {
		if layers[i].holds(path) {
			return &layers[i]
		}
	}
	return nil
}

// TestImportsPointDown checks the package import graph (`go list -f '{{.ImportPath}}
// {{.Imports}}' ./...`, test files excluded) against the layers: no import runs back up,
// and every package of the module belongs to a layer.
func TestImportsPointDown(t *testing.T) {
	t.Parallel()
	cmd := exec.Command("go", "list", "-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`, "./...")
	cmd.Dir = ".."
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.String())
	}
	packages := 0
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 {
			continue
		}
		pkg, ok := strings.CutPrefix(fields[0], module)
		if !ok {
			t.Errorf("package %s is outside the module", fields[0])
			continue
		}
		packages++
		from := layerOf(pkg)
		if from == nil {
			t.Errorf("package %s belongs to no layer: add it to layers", pkg)
			continue
		}
		if from.imports == nil && from.name == "test" {
			continue
		}
		for _, imp := range fields[1:] {
			dep, ok := strings.CutPrefix(imp, module)
			if !ok {
				continue
			}
			to := layerOf(dep)
			if to == nil {
				t.Errorf("%s imports %s, which belongs to no layer", pkg, dep)
				continue
			}
			allowed := false
			for _, name := range from.imports {
				allowed = allowed || name == to.name
			}
			if !allowed {
				t.Errorf("%s (layer %s) imports %s (layer %s): the import runs back up; %s may import only %v",
					pkg, from.name, dep, to.name, from.name, from.imports)
			}
		}
	}
	if packages < 20 {
		t.Fatalf("go list named %d packages of the module, want the whole tree:\n%s", packages, out)
	}
}
