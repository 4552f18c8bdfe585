package cli

import (
	"strings"
	"testing"
)

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
