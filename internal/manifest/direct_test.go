package manifest

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/protobuf/proto"
)

// directCases are documents of the fast subset, each with whether directObject takes it
// (true) or leaves it to decodeObject (false).
var directCases = []struct {
	doc    string
	direct bool
}{
	{"kind: Route\nmeta:\n  name: dc2-web-0042\n  labels:\n    app: web\n    tier: frontend\n    site: dc2\n  nodes:\n    - host-a\n" +
		"spec:\n  table: 100\n  prefix: 100.64.0.42/32\n  nexthops:\n    - gateway: 10.10.0.2\n    - gateway: 10.10.0.3\n", true},
	{"kind: Route\nmeta: {name: dc2-web-0042, labels: {app: web, tier: frontend, site: dc2}, nodes: [host-a]}\n" +
		"spec: {table: 100, prefix: 100.64.0.42/32, nexthops: [{gateway: 10.10.0.2}, {gateway: 10.10.0.3, weight: 2}]}\n", true},
	{"{kind: Route, meta: {name: r1}, spec: {table: 7, nexthops: []}}\n", true},
	{"kind: rt\nmeta: {name: r1, generation: 922337203685477580, generation_revision: 7}\nspec: {metric: 4294967295}\n", true},
	{"kind: Route\nspec: {metric: 4294967296}\n", false}, // out of uint32's range
	{"kind: Route\nspec: {table: '100'}\n", false},       // a number as a string
	{"kind: Route\nspec: {prefix: 10}\n", false},         // a number for a string
	{"kind: Route\nspec: {tenantTable: maybe}\n", false}, // a boolean, left to protojson
	{"kind: Route\nspec: {nextHops: [{gateway: x}]}\n", false},
	{"kind: Route\nspec: {nexthops: [{gateway: x}], next_hops: []}\n", false},
	{"kind: Route\nspec: {nexthops: {gateway: x}}\n", false},
	{"kind: Route\nspec: [a]\n", false},
	{"kind: Route\nmeta: [a]\n", false},
	{"kind: Route\nmeta: {labels: {app: [web]}}\n", false},
	{"kind: Route\nmeta: {name: r1, nodes: host-a}\n", false},
	{"kind: Router\n", false},
	{"kind: [Route]\n", false},
	{"kind: Route\nextra: {}\n", false},
	{"meta: {name: r1}\n", false},
	{"kind: Route\nstatus: {whatever: [1, 2]}\n", true},
	{"kind: Route\nmeta: {name: a, generation: 1, generation_revision: 2, generationRevision: 3}\n", false},
	{"kind: NetworkSecurityPolicy\nmeta: {name: p}\nspec:\n  attachGroups: [web]\n  ingress:\n    - action: ACTION_ALLOW\n      fromGroups: [client]\n" +
		"      protocol: tcp\n      ports: [\"8080\"]\n    - action: 2\n      protocol: udp\n", true},
	{"kind: NetworkSecurityPolicy\nspec: {ingress: [{action: ALLOW}]}\n", false},
	{"kind: NetworkSecurityPolicy\nspec: {ingress: [{action: 2147483648}]}\n", false},
	{"kind: Interface\nmeta: {name: eth1}\nspec: {mtu: 9000}\n", true},
	{"kind: Network\nmeta: {name: net1}\nspec: {vni: 7, subnet: 10.0.0.0/24}\n", true},
}

// TestDirectObjectAsProtojson checks that directObject takes the documents it should, and
// that what it makes of them is what decodeObject makes through JSON and protojson,
// with no error; what it leaves, decodeObject decodes or refuses as before.
func TestDirectObjectAsProtojson(t *testing.T) {
	for _, c := range directCases {
		m, ok := simpleYAMLMapping([]byte(c.doc))
		if !ok {
			t.Fatalf("%q is not in the fast subset", c.doc)
		}
		direct, ok := directObject(m)
		if ok != c.direct {
			t.Errorf("directObject(%q) took it %v, want %v", c.doc, ok, c.direct)
		}
		if !ok {
			continue
		}
		fields, ok := jsonFields(m)
		if !ok {
			t.Fatalf("jsonFields(%q) failed", c.doc)
		}
		want, err := decodeObject(fields)
		if err != nil || !proto.Equal(direct, want) {
			t.Errorf("%q: directObject made\n%v\ndecodeObject\n%v, %v", c.doc, direct, want, err)
		}
	}
}

// TestDirectObjectTakesExamples checks that every document of the examples that is in the
// fast subset is made directly, and the same as through JSON.
func TestDirectObjectTakesExamples(t *testing.T) {
	files, err := filepath.Glob("../../examples/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no example manifests: %v", err)
	}
	n := 0
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, doc := range splitYAML(data) {
			m, ok := simpleYAMLMapping(doc.data)
			if !ok {
				continue
			}
			where := fmt.Sprintf("%s document %d", filepath.Base(f), i)
			direct, ok := directObject(m)
			if !ok {
				t.Errorf("%s: directObject left it to decodeObject", where)
				continue
			}
			fields, _ := jsonFields(m)
			if want, err := decodeObject(fields); err != nil || !proto.Equal(direct, want) {
				t.Errorf("%s: directObject made\n%v\ndecodeObject\n%v, %v", where, direct, want, err)
			}
			n++
		}
	}
	if n < 5 {
		t.Errorf("only %d documents of the examples are in the fast subset", n)
	}
}

// BenchmarkDecodeRoutes decodes 20,000 routes as people and generators write them (three
// labels, two or three next hops), in block and in flow style, with the fast subset's
// direct path (Decode) and through JSON and protojson (DecodeGeneral's converter aside,
// the path the subset took before): ns per route.
func BenchmarkDecodeRoutes(b *testing.B) {
	for _, style := range []string{"block", "flow"} {
		var buf []byte
		for i := range 20_000 {
			hops := "    - gateway: 10.10.0.2\n    - gateway: 10.10.0.3\n"
			flowHops := "{gateway: 10.10.0.2}, {gateway: 10.10.0.3}"
			if i%3 == 0 {
				hops += "    - gateway: 10.10.0.4\n"
				flowHops += ", {gateway: 10.10.0.4}"
			}
			name, prefix := fmt.Sprintf("dc%d-web-%04d", 1+i%3, i), fmt.Sprintf("100.64.%d.%d/32", i/256, i%256)
			if style == "flow" {
				buf = fmt.Appendf(buf, "---\nkind: Route\nmeta: {name: %s, labels: {app: web, tier: frontend, site: dc2}, nodes: [host-a]}\n"+
					"spec: {table: 100, prefix: %s, nexthops: [%s]}\n", name, prefix, flowHops)
				continue
			}
			buf = fmt.Appendf(buf, "---\nkind: Route\nmeta:\n  name: %s\n  labels:\n    app: web\n    tier: frontend\n    site: dc2\n"+
				"  nodes:\n    - host-a\nspec:\n  table: 100\n  prefix: %s\n  nexthops:\n%s", name, prefix, hops)
		}
		docs := splitYAML(buf)
		b.Run("style="+style+"/path=direct", func(b *testing.B) {
			for b.Loop() {
				for _, doc := range docs {
					if m, ok := simpleYAMLMapping(doc.data); ok {
						if _, ok := directObject(m); !ok {
							b.Fatal("not taken directly")
						}
					}
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/20_000, "ns/route")
		})
		b.Run("style="+style+"/path=json", func(b *testing.B) {
			for b.Loop() {
				for _, doc := range docs {
					if m, ok := simpleYAMLMapping(doc.data); ok {
						fields, _ := jsonFields(m)
						if _, err := decodeObject(fields); err != nil {
							b.Fatal(err)
						}
					}
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/20_000, "ns/route")
		})
	}
}
