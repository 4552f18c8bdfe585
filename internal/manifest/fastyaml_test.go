package manifest

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// subsetCases are documents simpleYAMLToJSON converts, or leaves to YAMLToJSONStrict.
var subsetCases = []struct {
	doc    string
	simple bool
}{
	{"kind: Route\nmeta:\n  name: r1\n  nodes: [host-a, host-b]\nspec:\n  table: 100\n  prefix: 10.0.0.1/32\n  nexthops:\n    - gateway: 10.10.0.2\n      dev: eth0\n    - gateway: fd00::1\n", true},
	{"kind: Route\nmeta:\n  name: r1\n  labels:\n    site: \"dc2\"\n    zone: 'a b'\nspec:\n  nexthops:\n  - gateway: 10.10.0.2\n  prefix: 2001:db8::/32\n", true},
	{"# a comment\nkind: Network\n\nspec:\n  vni: 0\n  mtu: 1450\n  subnet: 10.1.0.0/24\n  gateway: 10.1.0.1\n", true},
	{"kind: Network\nmeta:\n  nodes: []\n  name: net\n", true},
	{"kind: Network\nmeta:\n  name: n\n", false},
	{"kind: Route\nspec:\n  nexthops:\n    -\n      gateway: a\n", false},
	{"kind: Route # trailing\n", false},
	{"kind: Route\nspec:\n  stateful: yes\n", false},
	{"kind: Route\nspec:\n  stateful: true\n", false},
	{"kind: Route\nspec:\n  x: 1.5\n", false},
	{"kind: Route\nspec:\n  x: 012\n", false},
	{"kind: Route\nspec:\n  x: 1e3\n", false},
	{"kind: Route\nspec:\n  x: 2001-01-01\n", false},
	{"kind: Route\nspec:\n  x: 1.2.3\n", true},
	{"kind: Route\nspec:\n  x: ~\n", false},
	{"kind: Route\nspec:\n  x:\n", false},
	{"kind: Route\nkind: Network\n", false},
	{"kind: Route\nspec: {a: b}\n", true},
	// Flow style, as generators write it.
	{"kind: Route\nmeta: {name: dc2-web-0042, labels: {app: web, tier: 'front end'}, nodes: [host-a, host-b]}\n" +
		"spec: {table: 100, prefix: 10.0.42.0/24, nexthops: [{gateway: 10.10.0.2, weight: 2}, {gateway: \"10.10.0.3\"}]}\n", true},
	{"kind: Route\nspec:\n  nexthops:\n  - {gateway: 10.10.0.2}\n  - {gateway: 10.10.0.3, dev: eth0}\n", true},
	{"kind: Route\nspec: {a: [], b: {}, c: [[1, 2], [x]], d: {e: {f: g}}}\n", true},
	{"kind: Route\nspec: { a: b ,c: d }\n", true},
	{"{kind: Route, meta: {name: r1}}\n", true},
	{"kind: Route\nspec: {a: b, a: c}\n", false},
	{"kind: Route\nspec: {a: b,}\n", false},
	{"kind: Route\nspec: {a: }\n", false},
	{"kind: Route\nspec: {a}\n", false},
	{"kind: Route\nspec: {a:b}\n", false},
	{"kind: Route\nspec: {a: b} x\n", false},
	{"kind: Route\nspec: {a: b\n", false},
	{"kind: Route\nspec: {a: b,\n  c: d}\n", false},
	{"kind: Route\nspec: {a: fd00::1}\n", false},
	{"kind: Route\nspec: {a: yes}\n", false},
	{"kind: Route\nspec: {a: [b, c: d]}\n", false},
	{"kind: Route\nspec: {\"a\": b}\n", false},
	{"kind: Route\nspec: {a: 'b, c'}\n", true},
	{"kind: Route\nspec: {a: [b]c}\n", false},
	{"kind: Route\nspec: " + strings.Repeat("[", maxFlowDepth+1) + strings.Repeat("]", maxFlowDepth+1) + "\n", false},
	{"kind: Route\nspec: " + strings.Repeat("[", maxFlowDepth) + strings.Repeat("]", maxFlowDepth) + "\n", true},
	{"kind: Route\nspec:\n  x: [a:b]\n", false},
	{"kind: Route\nspec:\n  x: &a b\n", false},
	{"kind: Route\nspec:\n  x: \"a\\tb\"\n", false},
	{"kind: Route\nspec:\n  x: |\n    a\n", false},
	{"kind: Route\nspec:\n  x: a\n    b\n", false},
	{"kind: Route\n spec: a\n", false},
	{"- a\n- b\n", false},
	{"kind:\tRoute\n", false},
	{"on: a\n", false},
	{strings.Repeat("k", maxKeyLen) + ": 0\n", true},
	{strings.Repeat("k", 1100) + ": 0\n", false},
	{"kind: Route\nspec:\n  x: \"<&>\"\n", true},
	{"kind: Route\nspec:\n  x: 123456789012345678\n", true},
	{"kind: Route\nspec:\n  x: 1234567890123456789\n", false},
}

// TestSimpleYAMLLongMappings: a mapping of more keys than mappingKeys scans is still
// taken, and a key written twice still refused, whether the two are among the first keys
// or the second comes after the index was made; in block and in flow style.
func TestSimpleYAMLLongMappings(t *testing.T) {
	const n = 3 * indexKeysAbove
	for _, tt := range []struct {
		name     string
		dup      int // index of the key written again as the last one, -1 for none
		wantTake bool
	}{{"distinct", -1, true}, {"first key again", 0, false}, {"a late key again", n - 2, false}} {
		var block, flow []string
		for i := range n {
			block = append(block, fmt.Sprintf("    k%d: v%d\n", i, i))
			flow = append(flow, fmt.Sprintf("k%d: v%d", i, i))
		}
		if tt.dup >= 0 {
			block = append(block, fmt.Sprintf("    k%d: again\n", tt.dup))
			flow = append(flow, fmt.Sprintf("k%d: again", tt.dup))
		}
		for style, doc := range map[string]string{
			"block": "kind: Route\nmeta:\n  name: r1\n  labels:\n" + strings.Join(block, ""),
			"flow":  "kind: Route\nmeta: {name: r1, labels: {" + strings.Join(flow, ", ") + "}}\n",
		} {
			got, ok := simpleYAMLToJSON([]byte(doc))
			if ok != tt.wantTake {
				t.Errorf("%s, %s style: taken %v, want %v", tt.name, style, ok, tt.wantTake)
				continue
			}
			if ok {
				sameAsYAMLToJSON(t, []byte(doc), got)
			}
		}
	}
}

func TestSimpleYAMLToJSON(t *testing.T) {
	for _, c := range subsetCases {
		got, ok := simpleYAMLToJSON([]byte(c.doc))
		if ok != c.simple {
			t.Errorf("simpleYAMLToJSON(%q) converted %v, want %v", c.doc, ok, c.simple)
		}
		if ok {
			sameAsYAMLToJSON(t, []byte(c.doc), got)
		}
	}
}

// TestSimpleYAMLToJSONExamples converts every document of the examples as YAMLToJSONStrict
// does.
func TestSimpleYAMLToJSONExamples(t *testing.T) {
	files, _ := filepath.Glob("../../examples/*.yaml")
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, doc := range splitYAML(data) {
			if got, ok := simpleYAMLToJSON(doc.data); ok {
				sameAsYAMLToJSON(t, doc.data, got)
			}
		}
	}
}

func FuzzSimpleYAMLToJSON(f *testing.F) {
	for _, c := range subsetCases {
		f.Add(c.doc)
	}
	f.Fuzz(func(t *testing.T, doc string) {
		if got, ok := simpleYAMLToJSON([]byte(doc)); ok {
			sameAsYAMLToJSON(t, []byte(doc), got)
		}
	})
}

// sameAsYAMLToJSON fails the test unless YAMLToJSONStrict converts doc to got.
func sameAsYAMLToJSON(t *testing.T, doc, got []byte) {
	t.Helper()
	want, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		t.Errorf("simpleYAMLToJSON(%q) = %s, but YAMLToJSONStrict fails: %v", doc, got, err)
		return
	}
	if string(got) != string(want) {
		t.Errorf("simpleYAMLToJSON(%q) = %s, want %s", doc, got, want)
	}
}
