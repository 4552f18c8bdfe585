package manifest

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// directCases are documents of the fast subset, each with whether directObject takes it
// (true) or leaves it to decodeObject (false), and for one it leaves, the error Decode
// reports for it, as it did before directObject, or "" when the JSON path decodes it.
var directCases = []struct {
	doc    string
	direct bool
	err    string
}{
	{"kind: Route\nmeta:\n  name: dc2-web-0042\n  labels:\n    app: web\n    tier: frontend\n    site: dc2\n  nodes:\n    - host-a\n" +
		"spec:\n  table: 100\n  prefix: 100.64.0.42/32\n  nexthops:\n    - gateway: 10.10.0.2\n    - gateway: 10.10.0.3\n", true, ""},
	{"kind: Route\nmeta: {name: dc2-web-0042, labels: {app: web, tier: frontend, site: dc2}, nodes: [host-a]}\n" +
		"spec: {table: 100, prefix: 100.64.0.42/32, nexthops: [{gateway: 10.10.0.2}, {gateway: 10.10.0.3, weight: 2}]}\n", true, ""},
	{"{kind: Route, meta: {name: r1}, spec: {table: 7, nexthops: []}}\n", true, ""},
	{"kind: rt\nmeta: {name: r1, generation: 922337203685477580, generation_revision: 7}\nspec: {metric: 4294967295}\n", true, ""},
	{"kind: Route\nmeta: {name: r1, generation: 999999999999999999, revision: 999999999999999999, labels: {}, nodes: []}\n" +
		"spec: {metric: 0, table: 4294967295, nexthops: [{weight: 0}, {device: eth1, weight: 4294967295}]}\n", true, ""},
	{"kind: Route\nspec: {metric: 4294967296}\n", false, "document 1: spec.metric 4294967296: want a whole number from 0 to 4294967295"},
	{"kind: Route\nspec: {nexthops: [{weight: 4294967296}]}\n", false, "document 1: spec.nexthops[0].weight 4294967296: want a whole number from 0 to 4294967295"},
	{"kind: Route\nspec: {table: '100'}\n", false, ""}, // a number as a string, which protojson takes
	{"kind: Route\nspec: {prefix: 10}\n", false, "document 1: spec.prefix 10: want a string"},
	{"kind: Route\nspec: {tenantTable: maybe}\n", false, `document 1: spec.tenantTable "maybe": want true or false`},
	{"kind: Route\nspec: {nextHops: [{gateway: x}]}\n", false, `document 1: spec: unknown field "nextHops"`},
	{"kind: Route\nspec: {nexthops: [{gateway: x}], next_hops: []}\n", false, `document 1: spec: unknown field "next_hops"`},
	{"kind: Route\nspec: {nexthops: {gateway: x}}\n", false, `document 1: spec.nexthops {"gateway":"x"}: want a list`},
	{"kind: Route\nspec: {nexthops: [x]}\n", false, `document 1: spec.nexthops[0] "x": want a mapping`},
	{"kind: Route\nspec: {nexthops: [[x]]}\n", false, `document 1: spec.nexthops[0] ["x"]: want a mapping`},
	{"kind: Route\nspec: [a]\n", false, `document 1: spec ["a"]: want a mapping`},
	{"kind: Route\nspec: a\n", false, `document 1: spec "a": want a mapping`},
	{"kind: Route\nmeta: [a]\n", false, `document 1: meta ["a"]: want a mapping`},
	{"kind: Route\nmeta: {labels: {app: [web]}}\n", false, `document 1: meta.labels["app"] ["web"]: want a string`},
	{"kind: Route\nmeta: {labels: {app: 5}}\n", false, `document 1: meta.labels["app"] 5: want a string`},
	{"kind: Route\nmeta: {labels: [app]}\n", false, `document 1: meta.labels ["app"]: want a mapping`},
	{"kind: Route\nmeta: {name: r1, nodes: host-a}\n", false, `document 1: meta.nodes "host-a": want a list`},
	{"kind: Route\nmeta: {nodes: [7]}\n", false, "document 1: meta.nodes[0] 7: want a string"},
	{"kind: Route\nmeta: {createTime: '2026-11-21T10:00:00Z'}\n", false, ""}, // a well-known type, left to protojson
	{"kind: Route\nmeta: {generation: x}\n", false, `document 1: meta.generation "x": want a whole number from -9223372036854775808 to 9223372036854775807`},
	{"kind: Router\n", false, `document 1: kind "Router": unknown kind`},
	{"kind: [Route]\n", false, `document 1: kind ["Route"]: must be a string`},
	{"kind: 7\n", false, "document 1: kind 7: must be a string"},
	{"kind: Route\nextra: {}\n", false, `document 1: unknown field "extra" (want kind, meta and spec)`},
	{"meta: {name: r1}\n", false, "document 1: missing kind"},
	{"kind: Route\nstatus: {whatever: [1, 2]}\n", true, ""},
	{"kind: Route\nmeta: {name: a, generation: 1, generation_revision: 2, generationRevision: 3}\n", false,
		`document 1: meta: duplicate field "generation_revision"`},
	{"kind: NetworkSecurityPolicy\nmeta: {name: p}\nspec:\n  attachGroups: [web]\n  ingress:\n    - action: ACTION_ALLOW\n      fromGroups: [client]\n" +
		"      protocol: tcp\n      ports: [\"8080\"]\n    - action: 2\n      protocol: udp\n", true, ""},
	{"kind: NetworkSecurityPolicy\nspec: {egress: [{action: 2147483647, to_cidrs: [10.0.0.0/8]}, {action: 0}, {action: 7}]}\n", true, ""},
	{"kind: NetworkSecurityPolicy\nspec: {ingress: [{action: ALLOW}]}\n", false, `document 1: spec.ingress[0].action "ALLOW": want one of ACTION_UNSPECIFIED, ACTION_ALLOW, ACTION_DENY`},
	{"kind: NetworkSecurityPolicy\nspec: {ingress: [{action: action_allow}]}\n", false, `document 1: spec.ingress[0].action "action_allow": want one of ACTION_UNSPECIFIED, ACTION_ALLOW, ACTION_DENY`},
	{"kind: NetworkSecurityPolicy\nspec: {ingress: [{action: 2147483648}]}\n", false, "document 1: spec.ingress[0].action 2147483648: want one of ACTION_UNSPECIFIED, ACTION_ALLOW, ACTION_DENY"},
	{"kind: NetworkSecurityPolicy\nspec: {ingress: [{action: [ACTION_ALLOW]}]}\n", false, `document 1: spec.ingress[0].action ["ACTION_ALLOW"]: want one of ACTION_UNSPECIFIED, ACTION_ALLOW, ACTION_DENY`},
	{"kind: Interface\nmeta: {name: eth1}\nspec: {mtu: 9000}\n", true, ""},
	{"kind: Interface\nspec: {adminUp: x}\n", false, `document 1: spec.adminUp "x": want true or false`},
	{"kind: Network\nmeta: {name: net1}\nspec: {vni: 7, subnet: 10.0.0.0/24}\n", true, ""},
	{"kind: Network\nspec: {vni: 7, subnets: [{cidr: 10.0.0.0/24, gateway: 10.0.0.1}, {cidr: 10.1.0.0/24}]}\n", true, ""},
	{"kind: Endpoint\nmeta: {name: ep}\nspec: {network: net1, node: host-a, mac: '02:00:00:00:00:01', ips: [10.1.0.5], securityGroups: [web]}\n", true, ""},
	{"kind: Endpoint\nspec: {ips: 10.1.0.5}\n", false, `document 1: spec.ips "10.1.0.5": want a list`},
	{"kind: FlowExportPolicy\nspec: {interval: '10s'}\n", false, ""}, // a Duration, left to protojson
}

// TestDirectObjectAsProtojson checks that directObject takes the documents it should, and
// that what it makes of them is what decodeObject makes through JSON and protojson,
// with no error; what it leaves, Decode decodes or refuses as before, with the same
// error as the general converter's path.
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
			_, err := Decode(strings.NewReader(c.doc))
			_, generalErr := DecodeGeneral(strings.NewReader(c.doc))
			if got := fmt.Sprint(err); got != fmt.Sprint(generalErr) || (c.err == "") != (err == nil) || (err != nil && got != c.err) {
				t.Errorf("Decode(%q) fails with\n%v\nthe general converter with\n%v\nwant %q", c.doc, err, generalErr, c.err)
			}
			continue
		}
		sameAsJSONPath(t, c.doc, m, direct)
	}
}

// sameAsJSONPath checks that direct, what directObject made of m, is what decodeObject
// makes of m's JSON, with no error.
func sameAsJSONPath(t *testing.T, where string, m yamlValue, direct *nimbusv1.Object) {
	t.Helper()
	fields, ok := jsonFields(m)
	if !ok {
		t.Fatalf("%s: jsonFields failed", where)
	}
	if want, err := decodeObject(fields, false); err != nil || !proto.Equal(direct, want) {
		t.Errorf("%s: directObject made\n%v\ndecodeObject\n%v, %v", where, direct, want, err)
	}
}

// asYAMLMap returns m as the subset's parser would hold it, the values of m's maps in
// key order. Its values are strings, json.Numbers (integers), []any and maps of them.
// The keys and texts are written one after the other as the document's text.
func asYAMLMap(m map[string]any) yamlValue {
	var b yamlValueBuilder
	b.add("", m)
	return yamlValue{doc: string(b.doc), nodes: b.t.nodes}
}

// yamlValueBuilder makes a yamlValue for asYAMLMap.
type yamlValueBuilder struct {
	t   treeBuilder
	doc []byte
}

// span appends s to the text and returns its span.
func (b *yamlValueBuilder) span(s string) span {
	at := len(b.doc)
	b.doc = append(b.doc, s...)
	return spanAt(at, len(s))
}

// add appends v, with its key, as asYAMLMap does.
func (b *yamlValueBuilder) add(key string, v any) {
	i := len(b.t.nodes)
	switch v := v.(type) {
	case map[string]any:
		b.t.open(yamlMapping)
		for _, k := range slices.Sorted(maps.Keys(v)) {
			b.add(k, v[k])
		}
		b.t.close(i)
	case []any:
		b.t.open(yamlSeq)
		for _, e := range v {
			b.add("", e)
		}
		b.t.close(i)
	case string:
		b.t.nodes = append(b.t.nodes, yamlNode{text: b.span(v), size: 1, kind: yamlString})
	case json.Number:
		b.t.nodes = append(b.t.nodes, yamlNode{text: b.span(string(v)), size: 1, kind: yamlInt})
	default:
		panic(fmt.Sprintf("asYAMLMap: %T is not a value of the subset", v))
	}
	b.t.setKey(i, b.span(key))
}

// TestSetMessageAsProtojson checks setMessage on messages of shapes the specs do not
// have, a oneof of messages and a map of strings among them, and on a spec and a meta,
// against protojson: on the generated messages, whose fields it mostly sets in their Go
// fields, and on dynamic ones (dynamicpb), whose every field it sets through
// protoreflect.
func TestSetMessageAsProtojson(t *testing.T) {
	for _, c := range []struct {
		m    map[string]any
		msg  proto.Message
		want bool
	}{
		{map[string]any{"node": map[string]any{"vtep": "192.0.2.1", "role": "NODE_ROLE_LOCAL"}, "entriesOmitted": json.Number("3")}, &nimbusv1.OperationalData{}, true},
		{map[string]any{"network": map[string]any{"vni": json.Number("7"), "remote_vteps": []any{"192.0.2.2"}}}, &nimbusv1.OperationalData{}, true},
		{map[string]any{"node": map[string]any{"role": json.Number("2")}, "network": map[string]any{}}, &nimbusv1.OperationalData{}, false},
		{map[string]any{"securityPolicy": map[string]any{}, "security_policy": map[string]any{}}, &nimbusv1.OperationalData{}, false},
		{map[string]any{"node": map[string]any{"role": "LOCAL"}}, &nimbusv1.OperationalData{}, false},
		{map[string]any{"node": "host-a", "reason": "ok", "operational": map[string]any{"vtep": "192.0.2.1", "bridge": "br7"}}, &nimbusv1.NodeStatus{}, true},
		{map[string]any{"operational": map[string]any{"vtep": json.Number("1")}}, &nimbusv1.NodeStatus{}, false},
		{map[string]any{"observedGeneration": json.Number("999999999999999999"), "phase": json.Number("1")}, &nimbusv1.NodeStatus{}, true},
		{map[string]any{"updateTime": "2026-11-21T10:00:00Z"}, &nimbusv1.NodeStatus{}, false},
		{map[string]any{"table": json.Number("4294967295"), "prefix": "10.0.0.0/8", "nexthops": []any{
			map[string]any{"gateway": "10.1.0.1", "weight": json.Number("2")}, map[string]any{"device": "eth1"}}}, &nimbusv1.RouteSpec{}, true},
		{map[string]any{"nexthops": []any{}, "metric": json.Number("0")}, &nimbusv1.RouteSpec{}, true},
		{map[string]any{"nexthops": []any{map[string]any{"weight": json.Number("4294967296")}}}, &nimbusv1.RouteSpec{}, false},
		{map[string]any{"ingress": []any{map[string]any{"action": "ACTION_DENY", "ports": []any{"80"}}, map[string]any{"action": json.Number("7")}},
			"attach_groups": []any{"web"}}, &nimbusv1.NetworkSecurityPolicySpec{}, true},
		{map[string]any{"name": "r1", "labels": map[string]any{"app": "web"}, "nodes": []any{"a", "b"}, "generation": json.Number("7")}, &nimbusv1.ObjectMeta{}, true},
		{map[string]any{"labels": map[string]any{}, "nodes": []any{}}, &nimbusv1.ObjectMeta{}, true},
		{map[string]any{"labels": map[string]any{"app": json.Number("5")}}, &nimbusv1.ObjectMeta{}, false},
	} {
		m := asYAMLMap(c.m)
		raw, _ := appendJSON(nil, m)
		want := c.msg.ProtoReflect().New().Interface()
		err := protojson.Unmarshal(raw, want)
		for _, msg := range []protoreflect.Message{c.msg.ProtoReflect().New(), dynamicpb.NewMessage(c.msg.ProtoReflect().Descriptor())} {
			ok := setMessage(msg, m)
			if ok != c.want {
				t.Errorf("setMessage(%T %v, %v) took it %v, want %v", msg.Interface(), msg.Descriptor().FullName(), c.m, ok, c.want)
			}
			if ok && (err != nil || !proto.Equal(msg.Interface(), want)) {
				t.Errorf("setMessage made of %s\n%v\nprotojson\n%v, %v", raw, msg.Interface(), want, err)
			}
		}
	}
}

// TestSpecTypes checks that directObject knows the spec of every kind, to set its fields.
func TestSpecTypes(t *testing.T) {
	for _, kind := range nimbusv1.Kinds() {
		if specTypes()[kind] == nil {
			t.Errorf("no spec type for %v", kind)
		}
		if k, ok := parseKind(kind.Name()); !ok || k != kind {
			t.Errorf("parseKind(%q) = %v, %v", kind.Name(), k, ok)
		}
	}
}

// TestDirectObjectTakesManifests checks every document of the examples, of the manifests
// among the tests' data and of FuzzDecode's corpus that is in the fast subset: what
// directObject makes of it is what decodeObject makes through JSON. Every such document
// of the examples it must take.
func TestDirectObjectTakesManifests(t *testing.T) {
	examples, err := filepath.Glob("../../examples/*.yaml")
	if err != nil || len(examples) == 0 {
		t.Fatalf("no example manifests: %v", err)
	}
	others, _ := filepath.Glob("../../deploy/*.yaml")
	data, _ := filepath.Glob("../../*/*/*/testdata/*.yaml")
	others = append(others, data...)
	corpus, _ := filepath.Glob("testdata/fuzz/FuzzDecode/*")
	inputs := map[string][]byte{}
	for _, f := range slices.Concat(examples, others, corpus) {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if slices.Contains(corpus, f) {
			// A corpus file is "go test fuzz v1" and a line []byte("...").
			_, arg, _ := strings.Cut(string(data), "\n[]byte(")
			s, err := strconv.Unquote(strings.TrimSuffix(strings.TrimSpace(arg), ")"))
			if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			data = []byte(s)
		}
		inputs[f] = data
	}
	taken, left := 0, 0
	for _, f := range slices.Sorted(maps.Keys(inputs)) {
		for i, doc := range splitYAML(inputs[f]) {
			m, ok := simpleYAMLMapping(doc.data)
			if !ok {
				continue
			}
			where := fmt.Sprintf("%s document %d", f, i)
			direct, ok := directObject(m)
			switch {
			case ok:
				sameAsJSONPath(t, where, m, direct)
				taken++
			case slices.Contains(examples, f):
				t.Errorf("%s: directObject left it to decodeObject", where)
			default:
				left++
			}
		}
	}
	t.Logf("%d files: %d documents made directly, %d left to the JSON path", len(inputs), taken, left)
	if taken < 5 {
		t.Errorf("only %d documents are made directly", taken)
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
						if _, err := decodeObject(fields, false); err != nil {
							b.Fatal(err)
						}
					}
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/20_000, "ns/route")
		})
	}
}

// TestSmallSet checks that smallSet finds every number it was given again, below 64 and
// above, and no other.
func TestSmallSet(t *testing.T) {
	var s smallSet
	for _, n := range []int{0, 1, 63, 64, 65, 536870911} {
		if !s.add(n) {
			t.Errorf("add(%d) to a set without it reported it there", n)
		}
		if s.add(n) {
			t.Errorf("add(%d) again reported it new", n)
		}
	}
	for _, n := range []int{2, 62, 66, 1000} {
		if !s.add(n) {
			t.Errorf("add(%d) reported it there, never added", n)
		}
	}
}

// TestSplitYAML holds the documents of a stream to their lines and text: a marker line
// is a blank first line of the document after it, with its dashes as spaces where more
// follows on it, and only "---" at a line's start followed by a blank or the end is one.
func TestSplitYAML(t *testing.T) {
	type doc struct {
		line int
		data string
	}
	for _, c := range []struct {
		name string
		in   string
		want []doc
	}{
		{"no marker", "kind: Route\nmeta: {}\n", []doc{{1, "kind: Route\nmeta: {}\n"}}},
		{"leading marker", "---\nkind: Route\n", []doc{{1, ""}, {1, "\nkind: Route\n"}}},
		{"two documents", "a: 1\n---\nb: 2\n---\nc: 3", []doc{{1, "a: 1\n"}, {2, "\nb: 2\n"}, {4, "\nc: 3"}}},
		{"more on the marker's line", "a: 1\n--- # next\nb: 2\n", []doc{{1, "a: 1\n"}, {2, "    # next\nb: 2\n"}}},
		{"content on the marker's line", "--- b: 2\n", []doc{{1, ""}, {1, "    b: 2\n"}}},
		{"CRLF", "a: 1\r\n---\r\nb: 2\r\n", []doc{{1, "a: 1\r\n"}, {2, "\r\nb: 2\r\n"}}},
		{"marker at the end", "a: 1\n---", []doc{{1, "a: 1\n"}, {2, ""}}},
		{"not markers", "a: ---\n----\n --- \nb: '\n---x'\n", []doc{{1, "a: ---\n----\n --- \nb: '\n---x'\n"}}},
		{"empty", "", []doc{{1, ""}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var got []doc
			for _, d := range splitYAML([]byte(c.in)) {
				got = append(got, doc{d.line, string(d.data)})
			}
			if !slices.Equal(got, c.want) {
				t.Errorf("splitYAML(%q) = %+v, want %+v", c.in, got, c.want)
			}
		})
	}
}
