package cli

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/naplesnet/naples/internal/exitstatus"
)

// diffRun runs naplesctl diff with args and returns what it printed and its exit status.
func (e *env) diffRun(args ...string) (string, int) {
	e.t.Helper()
	out, errOut, err := e.run("", append([]string{"diff"}, args...)...)
	if err != nil && !errors.Is(err, ErrDiffers) {
		e.t.Logf("naplesctl diff %s: %v; stderr:\n%s", strings.Join(args, " "), err, errOut)
	}
	return out, exitstatus.Of(err)
}

// TestDiff diffs a manifest against nimbus: a new object shows all added and exits 1;
// once applied, the diff is empty and exits 0; after one field is edited, the diff
// shows that field alone, with its context, and exits 1.
func TestDiff(t *testing.T) {
	e := newEnv(t)
	path := e.file("route.yaml", routeYAML("to-dc2", "198.51.100.0/24", "10.10.0.2"))
	header := "diff -u -N live/route/default/default/to-dc2 merged/route/default/default/to-dc2\n" +
		"--- live/route/default/default/to-dc2\n+++ merged/route/default/default/to-dc2\n"
	out, code := e.diffRun("-f", path)
	equal(t, "diff of a new route", out, header+`@@ -0,0 +1,12 @@
+kind: Route
+meta:
+  name: to-dc2
+  namespace: default
+  nodes:
+  - host-a
+  tenant: default
+spec:
+  nexthops:
+  - gateway: 10.10.0.2
+  prefix: 198.51.100.0/24
+  table: 100
`)
	if code != 1 {
		t.Errorf("diff of a new route exited %d, want 1", code)
	}
	if names := e.routes(); len(names) != 0 {
		t.Fatalf("diff stored routes %q", names)
	}

	e.ok("apply", "-f", path)
	out, code = e.diffRun("-f", path)
	if out != "" || code != 0 {
		t.Errorf("diff after apply printed %q and exited %d, want nothing and 0", out, code)
	}
	// The same manifest in a subdirectory, read with -R.
	sub := filepath.Join(e.dir, "manifests", "routes")
	if err := os.MkdirAll(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(sub, "route.yaml"), []byte(routeYAML("to-dc2", "198.51.100.0/24", "10.10.0.2")), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, code := e.diffRun("-R", "-f", filepath.Join(e.dir, "manifests")); out != "" || code != 0 {
		t.Errorf("diff -R of a directory holding the applied route printed %q and exited %d, want nothing and 0", out, code)
	}

	edited := e.file("edited.yaml", routeYAML("to-dc2", "198.51.100.0/24", "10.10.0.9")+"---\n"+routeYAML("to-dc3", "203.0.113.0/24", "10.10.0.3"))
	out, code = e.diffRun("-f", edited)
	if !strings.HasPrefix(out, header+`@@ -7,6 +7,6 @@
   tenant: default
 spec:
   nexthops:
-  - gateway: 10.10.0.2
+  - gateway: 10.10.0.9
   prefix: 198.51.100.0/24
   table: 100
diff -u -N live/route/default/default/to-dc3 merged/route/default/default/to-dc3
`) || code != 1 {
		t.Errorf("diff of an edited gateway and a new route exited %d and printed:\n%s", code, out)
	}
	if got := e.get("to-dc2").GetObject().GetRoute().GetNexthops()[0].GetGateway(); got != "10.10.0.2" {
		t.Errorf("diff changed the stored gateway to %s", got)
	}
}

// TestDiffManyInOrder checks that diff of a manifest that changes many stored objects,
// whose live objects it asks for several at a time, prints each object's diff once, in
// the manifest's order, leaving out the unchanged ones.
func TestDiffManyInOrder(t *testing.T) {
	e := newEnv(t)
	var applied, edited strings.Builder
	const n = 3 * diffGets
	for i := range n {
		name, prefix := fmt.Sprintf("r-%02d", n-i), fmt.Sprintf("198.51.%d.0/24", i)
		applied.WriteString("---\n" + routeYAML(name, prefix, "10.10.0.2"))
		gw := "10.10.0.2"
		if i%3 != 0 {
			gw = "10.10.0.9"
		}
		edited.WriteString("---\n" + routeYAML(name, prefix, gw))
	}
	e.ok("apply", "-f", e.file("applied.yaml", applied.String()))
	out, code := e.diffRun("-f", e.file("edited.yaml", edited.String()))
	var got, want []string
	for line := range strings.SplitSeq(out, "\n") {
		if name, ok := strings.CutPrefix(line, "diff -u -N live/route/default/default/"); ok {
			got = append(got, strings.Fields(name)[0])
		}
	}
	for i := range n {
		if i%3 != 0 {
			want = append(want, fmt.Sprintf("r-%02d", n-i))
		}
	}
	if code != 1 || !slices.Equal(got, want) || strings.Count(out, "+  - gateway: 10.10.0.9") != len(want) ||
		strings.Count(out, "-  - gateway: 10.10.0.2") != len(want) || strings.Contains(out, "+kind: Route") {
		t.Errorf("diff of %d edited routes exited %d and printed the diffs of %q, want %q:\n%s", len(want), code, got, want, out)
	}
}

// TestDiffFailures checks that diff exits 2, printing no diff, when a manifest is bad,
// when nimbus would refuse an object, and when nimbus cannot be reached.
func TestDiffFailures(t *testing.T) {
	e := newEnv(t)
	e.ok("apply", "-f", e.file("net.yaml", networkYAML("blue", "100", "10.1.0.0/24")))
	bad := e.file("bad.yaml", routeYAML("bad", "10.0.0.0/33", "10.10.0.5"))
	twin := e.file("twin.yaml", networkYAML("green", "100", "10.2.0.0/24"))
	for _, tc := range []struct {
		name string
		args []string
		says string
	}{
		{"bad manifest", []string{"-f", bad}, `spec.prefix "10.0.0.0/33"`},
		{"conflict", []string{"-f", twin}, `spec.vni "100" is already used by network "default/blue"`},
		{"no nimbus", []string{"--server", "unix://" + e.dir + "/nobody.sock", "-f", twin}, "unavailable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, _, err := e.run("", append([]string{"diff"}, tc.args...)...)
			if out != "" || exitstatus.Of(err) != exitstatus.Config || err == nil || !strings.Contains(err.Error(), tc.says) {
				t.Errorf("naplesctl diff %q printed %q, error %v (exit status %d); want exit status 2 and an error naming %s",
					tc.args, out, err, exitstatus.Of(err), tc.says)
			}
		})
	}
}

func TestUnifiedDiff(t *testing.T) {
	lines := func(s string) []string {
		if s == "" {
			return nil
		}
		return strings.Split(s, ",")
	}
	for _, tc := range []struct {
		name, a, b string
		want       string
	}{
		{"same", "a,b,c", "a,b,c", ""},
		{"both empty", "", "", ""},
		{"all added", "", "a,b", "@@ -0,0 +1,2 @@\n+a\n+b\n"},
		{"all removed", "a", "", "@@ -1 +0,0 @@\n-a\n"},
		{"one changed", "1,2,3,4,5,6,7,8,9", "1,2,3,4,X,6,7,8,9", "@@ -2,7 +2,7 @@\n 2\n 3\n 4\n-5\n+X\n 6\n 7\n 8\n"},
		{"added at the end", "1,2,3,4,5", "1,2,3,4,5,6", "@@ -3,3 +3,4 @@\n 3\n 4\n 5\n+6\n"},
		{"removed at the start", "1,2,3,4,5", "2,3,4,5", "@@ -1,4 +1,3 @@\n-1\n 2\n 3\n 4\n"},
		{"two hunks", "1,2,3,4,5,6,7,8,9,10,11,12", "X,2,3,4,5,6,7,8,9,10,11,Y",
			"@@ -1,4 +1,4 @@\n-1\n+X\n 2\n 3\n 4\n@@ -9,4 +9,4 @@\n 9\n 10\n 11\n-12\n+Y\n"},
		{"changes six apart share a hunk", "1,2,3,4,5,6,7,8", "X,2,3,4,5,6,7,Y",
			"@@ -1,8 +1,8 @@\n-1\n+X\n 2\n 3\n 4\n 5\n 6\n 7\n-8\n+Y\n"},
		{"removed before added", "a,b,c", "a,x,y,c", "@@ -1,3 +1,4 @@\n a\n-b\n+x\n+y\n c\n"},
		{"moved line", "a,b,c,d", "b,c,a,d", "@@ -1,4 +1,4 @@\n-a\n b\n c\n+a\n d\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			equal(t, fmt.Sprintf("diff of %q and %q", tc.a, tc.b), unifiedDiff(lines(tc.a), lines(tc.b), 3), tc.want)
		})
	}
}

// TestUnifiedDiffOfLargeTexts checks that texts whose differing lines are too many for
// the common subsequence's table still diff, as all removed and added, with their common
// lines around.
func TestUnifiedDiffOfLargeTexts(t *testing.T) {
	var a, b []string
	a = append(a, "first")
	b = append(b, "first")
	for i := range 2100 {
		a = append(a, fmt.Sprintf("a%d", i))
		b = append(b, fmt.Sprintf("b%d", i))
	}
	a = append(a, "last")
	b = append(b, "last")
	got := strings.Split(unifiedDiff(a, b, 3), "\n")
	if got[0] != "@@ -1,2102 +1,2102 @@" || got[1] != " first" || got[2] != "-a0" || got[2102] != "+b0" || got[4202] != " last" {
		t.Errorf("diff of 2100 changed lines starts %q, has %q and %q at 2102 and 4202", got[:3], got[2102], got[4202])
	}
}
