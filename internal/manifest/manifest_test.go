package manifest_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/naplesnet/naples/internal/manifest"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

func route(name, prefix, gateway string, nodes ...string) *nimbusv1.Object {
	return &nimbusv1.Object{
		Meta: &nimbusv1.ObjectMeta{Name: name, Nodes: nodes},
		Spec: &nimbusv1.Object_Route{Route: &nimbusv1.RouteSpec{
			Table:    100,
			Prefix:   prefix,
			Nexthops: []*nimbusv1.NextHop{{Gateway: gateway}},
		}},
	}
}

func securityGroup(name string, cidrs ...string) *nimbusv1.Object {
	return &nimbusv1.Object{
		Meta: &nimbusv1.ObjectMeta{Name: name},
		Spec: &nimbusv1.Object_SecurityGroup{SecurityGroup: &nimbusv1.SecurityGroupSpec{Cidrs: cidrs}},
	}
}

func TestDecode(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want []*nimbusv1.Object
	}{
		{
			name: "yaml one document",
			in: `# a route
kind: Route
meta:
  name: to-dc2
  nodes: [host-a]
spec:
  table: 100
  prefix: 198.51.100.0/24
  nexthops:
    - gateway: 10.10.0.2
`,
			want: []*nimbusv1.Object{route("to-dc2", "198.51.100.0/24", "10.10.0.2", "host-a")},
		},
		{
			name: "yaml several documents with empty ones",
			in: `---
# nothing here
---
kind: route
meta: {name: a}
spec: {table: 100, prefix: 10.1.0.0/16, nexthops: [{gateway: 10.0.0.1}]}
---   # trailing comment on the marker
kind: SecurityGroups
meta:
  name: web
spec:
  cidrs: [192.0.2.0/24]
---
`,
			want: []*nimbusv1.Object{
				route("a", "10.1.0.0/16", "10.0.0.1"),
				securityGroup("web", "192.0.2.0/24"),
			},
		},
		{
			name: "yaml proto field names and status ignored",
			in: `kind: Node
meta:
  name: host-a
  tenant: blue
  labels: {rack: r1}
spec:
  vtep_address: 192.0.2.10
status:
  targetNodes: 1
`,
			want: []*nimbusv1.Object{{
				Meta: &nimbusv1.ObjectMeta{Name: "host-a", Tenant: "blue", Labels: map[string]string{"rack": "r1"}},
				Spec: &nimbusv1.Object_Node{Node: &nimbusv1.NodeSpec{VtepAddress: "192.0.2.10"}},
			}},
		},
		{
			name: "missing spec keeps the kind",
			in:   "kind: SecurityGroup\nmeta: {name: empty}\n",
			want: []*nimbusv1.Object{securityGroup("empty")},
		},
		{
			name: "json object",
			in:   `{"kind":"Route","meta":{"name":"a"},"spec":{"table":100,"prefix":"10.1.0.0/16","nexthops":[{"gateway":"10.0.0.1"}]}}`,
			want: []*nimbusv1.Object{route("a", "10.1.0.0/16", "10.0.0.1")},
		},
		{
			name: "json array",
			in: `[
  {"kind":"Route","meta":{"name":"a"},"spec":{"table":100,"prefix":"10.1.0.0/16","nexthops":[{"gateway":"10.0.0.1"}]}},
  {"kind":"SecurityGroup","meta":{"name":"web"},"spec":{"cidrs":["192.0.2.0/24"]}}
]`,
			want: []*nimbusv1.Object{route("a", "10.1.0.0/16", "10.0.0.1"), securityGroup("web", "192.0.2.0/24")},
		},
		{
			name: "json stream",
			in: `{"kind":"Route","meta":{"name":"a"},"spec":{"table":"100","prefix":"10.1.0.0/16","nexthops":[{"gateway":"10.0.0.1"}]}}
{"kind":"SecurityGroup","meta":{"name":"web"},"spec":{"cidrs":["192.0.2.0/24"]}}
`,
			want: []*nimbusv1.Object{route("a", "10.1.0.0/16", "10.0.0.1"), securityGroup("web", "192.0.2.0/24")},
		},
		{
			name: "items list",
			in: `items:
- kind: SecurityGroup
  meta: {name: a}
- kind: SecurityGroup
  meta: {name: b}
`,
			want: []*nimbusv1.Object{securityGroup("a"), securityGroup("b")},
		},
		{
			name: "empty input",
			in:   "# only a comment\n",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := manifest.Decode(strings.NewReader(tt.in))
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			if len(got) != len(tt.want) {
				t.Fatalf("Decode returned %d objects, want %d: %v", len(got), len(tt.want), got)
			}
			for i := range got {
				if !proto.Equal(got[i], tt.want[i]) {
					t.Errorf("object %d:\n got %v\nwant %v", i, got[i], tt.want[i])
				}
			}
		})
	}
}

func TestDecodeErrors(t *testing.T) {
	const good = "kind: SecurityGroup\nmeta: {name: a}\n"
	tests := []struct {
		name string
		in   string
		want string
		is   error
	}{
		{
			name: "unknown kind in second document",
			in:   good + "---\nkind: Rout\nmeta: {name: b}\n",
			want: `document 2: kind "Rout": unknown kind`,
			is:   nimbusv1.ErrUnknownKind,
		},
		{
			name: "missing kind",
			in:   "meta: {name: a}\n",
			want: "document 1: missing kind",
		},
		{
			name: "kind not a string",
			in:   "kind: [Route]\n",
			want: `document 1: kind ["Route"]: must be a string`,
		},
		{
			name: "unknown spec field",
			in:   "kind: Route\nmeta: {name: a}\nspec:\n  prefx: 10.0.0.0/8\n",
			want: `document 1: spec: unknown field "prefx"`,
		},
		{
			name: "unknown nested field",
			in:   "kind: Route\nspec:\n  nexthops:\n  - gateway: 10.0.0.1\n  - gw: 10.0.0.2\n",
			want: `document 1: spec.nexthops[1]: unknown field "gw"`,
		},
		{
			name: "unknown meta field",
			in:   "kind: Route\nmeta: {name: a, node: [x]}\n",
			want: `document 1: meta: unknown field "node"`,
		},
		{
			name: "unknown top-level field",
			in:   "kind: Route\nmetadata: {name: a}\n",
			want: `document 1: unknown field "metadata" (want kind, meta and spec)`,
		},
		{
			name: "wrong value type",
			in:   "kind: Route\nspec: {table: hundred}\n",
			want: `document 1: spec.table "hundred": want a whole number from 0 to 4294967295`,
		},
		{
			name: "yaml boolean for a string",
			in:   "kind: Route\nmeta: {name: a, nodes: [host-a, on]}\n",
			want: `document 1: meta.nodes[1] true: want a string (YAML reads unquoted y, yes, on, n, no and off as booleans: quote the value)`,
		},
		{
			name: "one value for a list",
			in:   "kind: Endpoint\nmeta: {name: e}\nspec: {ips: 10.1.0.5}\n",
			want: `document 1: spec.ips "10.1.0.5": want a list`,
		},
		{
			name: "wrong value type in a list",
			in:   "kind: Route\nspec: {nexthops: [{gateway: 10.10.0.2}, {weight: heavy}]}\n",
			want: `document 1: spec.nexthops[1].weight "heavy": want a whole number from 0 to 4294967295`,
		},
		{
			name: "number for a duration",
			in:   "kind: Trace\nspec: {source: a, timeout: 5}\n",
			want: `document 1: spec.timeout 5: want a duration such as "5s"`,
		},
		{
			name: "json boolean for a string",
			in:   `{"kind": "Route", "meta": {"name": true}}`,
			want: `document 1: meta.name true: want a string`,
		},
		{
			name: "bad yaml reports the file line",
			in:   good + "---\nkind: Route\nmeta:\n  name: a\n   nodes: [x]\n",
			want: "document 2: yaml: line 7: mapping values are not allowed in this context",
		},
		{
			name: "duplicate yaml key",
			in:   "kind: Route\nkind: Node\n",
			want: `document 1: yaml: unmarshal errors:
  line 2: key "kind" already set in map`,
		},
		{
			name: "not a mapping",
			in:   good + "---\njust text\n",
			want: `document 2: want a mapping with kind, meta and spec, not "just text"`,
		},
		{
			name: "bad json in stream",
			in:   `{"kind":"SecurityGroup","meta":{"name":"a"}}` + "\n{\"kind\": }",
			want: "document 2: invalid JSON at line 2: invalid character '}' looking for beginning of value",
		},
		{
			name: "truncated json",
			in:   `[{"kind":"SecurityGroup"`,
			want: "document 1: invalid JSON: unexpected end of input: unexpected EOF",
		},
		{
			name: "bad element of json array",
			in:   `[{"kind":"SecurityGroup"},{"kind":"Route","spec":{"prefx":"x"}}]`,
			want: `document 2: spec: unknown field "prefx"`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			objs, err := manifest.Decode(strings.NewReader(tt.in))
			if err == nil {
				t.Fatalf("Decode returned %v and no error, want %q", objs, tt.want)
			}
			if err.Error() != tt.want {
				t.Errorf("Decode error:\n got %q\nwant %q", err, tt.want)
			}
			if tt.is != nil && !errors.Is(err, tt.is) {
				t.Errorf("Decode error %v is not %v", err, tt.is)
			}
		})
	}
}

func TestDecodeFile(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	if err := os.WriteFile(good, []byte("kind: SecurityGroup\nmeta: {name: a}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	objs, err := manifest.DecodeFile(good)
	if err != nil {
		t.Fatalf("DecodeFile: %v", err)
	}
	if want := []*nimbusv1.Object{securityGroup("a")}; len(objs) != 1 || !proto.Equal(objs[0], want[0]) {
		t.Errorf("DecodeFile = %v, want %v", objs, want)
	}

	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("kind: Rout\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = manifest.DecodeFile(bad)
	if want := bad + `: document 1: kind "Rout": unknown kind`; err == nil || err.Error() != want {
		t.Errorf("DecodeFile error = %v, want %q", err, want)
	}

	_, err = manifest.DecodeFile(filepath.Join(dir, "missing.yaml"))
	if !errors.Is(err, os.ErrNotExist) {
		t.Errorf("DecodeFile of a missing file: error %v is not os.ErrNotExist", err)
	}
}

// TestDecodeEveryKind makes sure every kind maps to a spec field of Object.
func TestDecodeEveryKind(t *testing.T) {
	for _, k := range nimbusv1.Kinds() {
		objs, err := manifest.Decode(strings.NewReader("kind: " + k.Name() + "\nmeta: {name: a}\n"))
		if err != nil {
			t.Errorf("kind %s: %v", k.Name(), err)
			continue
		}
		if got := objs[0].Kind(); got != k {
			t.Errorf("kind %s decoded as %v", k.Name(), got)
		}
	}
}

func TestRoundTrip(t *testing.T) {
	created := timestamppb.New(timestamppb.Now().AsTime().Truncate(1e9))
	full := route("to-dc2", "198.51.100.0/24", "10.10.0.2", "host-a")
	full.Meta.Tenant = "default"
	full.Meta.Namespace = "default"
	full.Meta.Uid = "0d9f6a44-7b8e-4d2a-9c55-1f0e3f7a2b11"
	full.Meta.Generation = 3
	full.Meta.Revision = 1 << 60
	full.Meta.Labels = map[string]string{"team": "net", "yes": "no"}
	full.Meta.CreateTime = created
	full.Meta.UpdateTime = created
	full.GetRoute().Nexthops = append(full.GetRoute().Nexthops, &nimbusv1.NextHop{Device: "eth1", Weight: 2})
	full.GetRoute().Metric = 10
	policy := &nimbusv1.Object{
		Meta: &nimbusv1.ObjectMeta{Name: "web", Namespace: "true"},
		Spec: &nimbusv1.Object_NetworkSecurityPolicy{NetworkSecurityPolicy: &nimbusv1.NetworkSecurityPolicySpec{
			AttachGroups: []string{"web"},
			Ingress: []*nimbusv1.PolicyRule{{
				Action: nimbusv1.PolicyRule_ACTION_ALLOW, FromCidrs: []string{"0.0.0.0/0"},
				Protocol: "tcp", Ports: []string{"80", "8000-8080"},
			}},
		}},
	}
	status := &nimbusv1.ObjectStatus{
		TargetNodes: 2, ProgrammedNodes: 1, FailedNodes: 1,
		Nodes: []*nimbusv1.NodeStatus{
			{Node: "host-a", ObservedGeneration: 3, Phase: nimbusv1.Phase_PHASE_PROGRAMMED},
			{Node: "host-b", ObservedGeneration: 3, Phase: nimbusv1.Phase_PHASE_FAILED, Reason: "KernelError", Message: "network is unreachable"},
		},
	}
	objs := []*nimbusv1.Object{full, policy, securityGroup("empty")}

	for _, f := range []manifest.Format{manifest.JSON, manifest.YAML} {
		t.Run(string(f), func(t *testing.T) {
			var buf bytes.Buffer
			for _, o := range objs {
				if f == manifest.YAML {
					buf.WriteString("---\n")
				}
				if err := manifest.Encode(&buf, f, o, status); err != nil {
					t.Fatalf("Encode: %v", err)
				}
			}
			got, err := manifest.Decode(bytes.NewReader(buf.Bytes()))
			if err != nil {
				t.Fatalf("Decode of what Encode wrote: %v\n%s", err, buf.String())
			}
			assertEqual(t, got, objs)

			buf.Reset()
			items := make([]*nimbusv1.ObjectWithStatus, 0, len(objs))
			for _, o := range objs {
				items = append(items, &nimbusv1.ObjectWithStatus{Object: o, Status: status})
			}
			if err := manifest.EncodeList(&buf, f, items); err != nil {
				t.Fatalf("EncodeList: %v", err)
			}
			got, err = manifest.Decode(bytes.NewReader(buf.Bytes()))
			if err != nil {
				t.Fatalf("Decode of what EncodeList wrote: %v\n%s", err, buf.String())
			}
			assertEqual(t, got, objs)
		})
	}
}

func assertEqual(t *testing.T, got, want []*nimbusv1.Object) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("got %d objects, want %d", len(got), len(want))
	}
	for i := range got {
		if !proto.Equal(got[i], want[i]) {
			t.Errorf("object %d:\n got %v\nwant %v", i, got[i], want[i])
		}
	}
}

func TestMarshalShape(t *testing.T) {
	status := &nimbusv1.ObjectStatus{
		TargetNodes: 1,
		Nodes:       []*nimbusv1.NodeStatus{{Node: "host-a", ObservedGeneration: 1, Phase: nimbusv1.Phase_PHASE_PENDING}},
	}
	raw, err := manifest.Marshal(route("to-dc2", "198.51.100.0/24", "10.10.0.2", "host-a"), status)
	if err != nil {
		t.Fatalf("Marshal: %v", err)
	}
	const want = `{"kind":"Route","meta":{"name":"to-dc2","nodes":["host-a"]},` +
		`"spec":{"table":100,"prefix":"198.51.100.0/24","nexthops":[{"gateway":"10.10.0.2"}]},` +
		`"status":{"nodes":[{"node":"host-a","observedGeneration":1,"phase":"PHASE_PENDING","reason":"","message":"","operational":{},"stale":false,"terminal":false}],` +
		`"targetNodes":1,"programmedNodes":0,"failedNodes":0,"generation":0,"currentNodes":0,"pending":[],"staleNodes":0,"detailsOmitted":0,"nodesOmitted":0,"pendingOmitted":0}}`
	if string(raw) != want {
		t.Errorf("Marshal:\n got %s\nwant %s", raw, want)
	}
	if !json.Valid(raw) {
		t.Errorf("Marshal returned invalid JSON")
	}

	raw, err = manifest.Marshal(securityGroup("a"), nil)
	if err != nil {
		t.Fatalf("Marshal: %v", err)
	}
	if want := `{"kind":"SecurityGroup","meta":{"name":"a"},"spec":{}}`; string(raw) != want {
		t.Errorf("Marshal without status:\n got %s\nwant %s", raw, want)
	}

	if _, err := manifest.Marshal(&nimbusv1.Object{Meta: &nimbusv1.ObjectMeta{Name: "a"}}, nil); err == nil {
		t.Errorf("Marshal of an object without spec: no error")
	}
	if err := manifest.Encode(&bytes.Buffer{}, "xml", securityGroup("a"), nil); err == nil {
		t.Errorf("Encode in format xml: no error")
	}
}

// TestInt64Numbers: 64-bit integers, which protojson writes as strings, are JSON numbers
// in -o json and YAML integers in -o yaml, every digit kept however large, and read back
// to the same values.
func TestInt64Numbers(t *testing.T) {
	obj := route("to-dc2", "198.51.100.0/24", "10.10.0.2", "host-a")
	obj.Meta.Generation = 1<<53 + 1 // not a float64
	obj.Meta.Revision = 1<<64 - 1
	obj.Meta.GenerationRevision = 7
	// Strings that look like JSON, and an escaped quote, must not confuse the rewriting.
	obj.Meta.Labels = map[string]string{`a"},{"generation":"1`: `"x\\":[1,{"`, "b": "}]"}
	status := &nimbusv1.ObjectStatus{
		TargetNodes: 1, Generation: 9007199254740993,
		Nodes: []*nimbusv1.NodeStatus{{
			Node: "host-a", ObservedGeneration: 3, Phase: nimbusv1.Phase_PHASE_PROGRAMMED, Message: `"observedGeneration":"4"`,
			UpdateTime: timestamppb.New(time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC)),
			OperationalData: &nimbusv1.OperationalData{Kind: &nimbusv1.OperationalData_SecurityPolicy{
				SecurityPolicy: &nimbusv1.SecurityPolicyOperational{Rules: []*nimbusv1.PolicyRuleCounters{
					{Index: 1, Packets: 12, Bytes: 1500}, {Index: 2, Packets: 1 << 62},
				}},
			}},
		}},
	}
	raw, err := manifest.Marshal(obj, status)
	if err != nil {
		t.Fatalf("Marshal: %v", err)
	}
	if !json.Valid(raw) {
		t.Fatalf("Marshal returned invalid JSON:\n%s", raw)
	}
	for _, want := range []string{`"generation":9007199254740993,`, `"revision":18446744073709551615,`,
		`"generationRevision":7}`, `"observedGeneration":3,`, `"generation":9007199254740993,"currentNodes"`,
		`"message":"\"observedGeneration\":\"4\""`, `"updateTime":"2026-11-21T10:00:00Z"`,
		`"index":1,"packets":12,"bytes":1500}`, `"packets":4611686018427387904`, `"b":"}]"`} {
		if !strings.Contains(string(raw), want) {
			t.Errorf("Marshal does not write %s:\n%s", want, raw)
		}
	}
	for _, f := range []manifest.Format{manifest.JSON, manifest.YAML} {
		var buf bytes.Buffer
		if err := manifest.Encode(&buf, f, obj, status); err != nil {
			t.Fatalf("Encode %s: %v", f, err)
		}
		if f == manifest.YAML && !strings.Contains(buf.String(), "\n  generation: 9007199254740993\n") {
			t.Errorf("Encode yaml does not write generation as an integer:\n%s", buf.String())
		}
		got, err := manifest.Decode(&buf)
		if err != nil {
			t.Fatalf("Decode of what Encode %s wrote: %v", f, err)
		}
		assertEqual(t, got, []*nimbusv1.Object{obj})
	}
}

// TestInterfaceAdminUpPresence: an Interface manifest without adminUp decodes to a spec
// that leaves the state alone (no admin_up), one with adminUp false to one that sets it
// down, and each reads back as written.
func TestInterfaceAdminUpPresence(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want *bool
	}{
		{"kind: Interface\nmeta: {name: eth1}\nspec: {mtu: 9000}\n", nil},
		{"kind: Interface\nmeta: {name: eth1}\nspec: {mtu: 9000, adminUp: false}\n", proto.Bool(false)},
		{"kind: Interface\nmeta: {name: eth1}\nspec: {adminUp: true}\n", proto.Bool(true)},
	} {
		objs, err := manifest.Decode(strings.NewReader(tt.in))
		if err != nil {
			t.Fatalf("Decode(%q): %v", tt.in, err)
		}
		got := objs[0].GetInterface().AdminUp
		if (got == nil) != (tt.want == nil) || (got != nil && *got != *tt.want) {
			t.Errorf("Decode(%q): adminUp %v; want %v", tt.in, got, tt.want)
		}
		b, err := manifest.Marshal(objs[0], nil)
		if err != nil {
			t.Fatal(err)
		}
		again, err := manifest.Decode(bytes.NewReader(b))
		if err != nil {
			t.Fatalf("Decode(Marshal): %v", err)
		}
		if !proto.Equal(again[0], objs[0]) {
			t.Errorf("%q read back as %s; want %v", tt.in, b, objs[0])
		}
	}
}

// TestDecodeKeys checks that DecodeKeys reads of each document only its kind and what
// names it, so that a manifest whose spec or labels no longer decode still names its
// objects, and that it refuses a document whose kind or name it cannot read.
func TestDecodeKeys(t *testing.T) {
	in := "kind: Route\nmeta: {name: a, tenant: t1, labels: {x: [1]}}\nspec: {prefx: 10.0.0.0/8, table: hundred}\n---\n" +
		"kind: rt\nmeta:\n  name: b\n  namespace: n1\n  nodes: host-a\nspec:\n  nexthops: x  # a comment\n"
	objs, err := manifest.DecodeKeys(strings.NewReader(in))
	if err != nil {
		t.Fatalf("DecodeKeys: %v", err)
	}
	var got []string
	for _, o := range objs {
		got = append(got, o.Key().ID())
	}
	want := []string{
		nimbusv1.NewKey(nimbusv1.Kind_KIND_ROUTE, "t1", "", "a").ID(),
		nimbusv1.NewKey(nimbusv1.Kind_KIND_ROUTE, "", "n1", "b").ID(),
	}
	if !slices.Equal(got, want) {
		t.Errorf("DecodeKeys read keys %q, want %q", got, want)
	}
	for _, tc := range []struct{ in, want string }{
		{"kind: Rout\nmeta: {name: a}\n", `document 1: kind "Rout": unknown kind`},
		{"kind: Route\nmeta: {name: [a]}\n", `document 1: meta.name ["a"]: want a string`},
		{"kind: Route\nmeta: {name: no}\n", "document 1: meta.name false: want a string (YAML reads unquoted y, yes, on, n, no and off as booleans: quote the value)"},
		{`{"kind": "Route", "meta": "a"}`, `document 1: meta "a": want a mapping`},
	} {
		if _, err := manifest.DecodeKeys(strings.NewReader(tc.in)); fmt.Sprint(err) != tc.want {
			t.Errorf("DecodeKeys(%q): error %v, want %s", tc.in, err, tc.want)
		}
	}
}
