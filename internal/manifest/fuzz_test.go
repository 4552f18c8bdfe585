package manifest_test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/naplesnet/naples/internal/manifest"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// FuzzDecode decodes any input as a manifest, YAML (through the fast subset or the general
// converter, whichever takes the document) or JSON. Decode must not panic, must return the
// same objects and the same error as decoding with the general converter alone, and every
// object it returns that has a spec must come back the same from Encode, in both formats,
// and Decode again. FuzzSimpleYAMLToJSON checks the fast subset against the general
// converter on its own.
func FuzzDecode(f *testing.F) {
	files, _ := filepath.Glob("../../examples/*.yaml")
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	for _, s := range []string{
		"kind: Route\nmeta:\n  name: r1\n  nodes: [host-a]\nspec:\n  table: 100\n  prefix: 10.0.0.0/8\n  nexthops:\n  - gateway: 10.1.0.1\n",
		"kind: Endpoint\nmeta: {name: ep, labels: {app: web}}\nspec: {network: net1, node: host-a, mac: '02:00:00:00:00:01', ips: [10.1.0.5]}\n",
		"---\n---\nkind: Node\nmeta:\n  name: n\nspec:\n  vtepAddress: 192.0.2.1\n",
		`{"items": [{"kind": "Network", "meta": {"name": "n"}, "spec": {"vni": 7, "subnet": "10.0.0.0/24"}}]}`,
		`[{"kind": "Interface", "meta": {"name": "eth1"}, "spec": {"mtu": 9000, "adminUp": true}}] {"kind": "SecurityGroup", "meta": {"name": "g"}, "spec": {"cidrs": ["10.0.0.0/8"]}}`,
		"kind: NetworkSecurityPolicy\nmeta:\n  name: p\nspec:\n  ingress:\n  - action: ACTION_ALLOW\n    protocol: tcp\n    ports: [\"80\"]\n",
		"kind: Route\nspec:\n  stateful: yes\n",
		"\xef\xbb\xbfkind: Node\n",
		"kind: Route\nmeta: {name: dc2-web-0042, labels: {app: web, tier: frontend}, nodes: [host-a]}\n" +
			"spec: {table: 100, prefix: 10.0.42.0/24, nexthops: [{gateway: 10.10.0.2}, {gateway: 10.10.0.3, weight: 2}]}\n",
		"kind: Route\nmeta: {name: r1, nodes: [host-a]}\nspec: {table: 100, prefix: 10.0.0.0/33, nexthop: [{gateway: x}]}\n---\n" +
			"{kind: Route, meta: {name: r2}, spec: {table: 7, nexthops: []}}\n",
		"kind: Route\nmeta: {name: r1, nodes: host-a}\n",
		"kind: Route\nspec: {table: '100', nexthops: [{gateway: [a]}]}\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		objs, err := manifest.Decode(bytes.NewReader(data))
		general, generalErr := manifest.DecodeGeneral(bytes.NewReader(data))
		if fmt.Sprint(err) != fmt.Sprint(generalErr) {
			t.Fatalf("Decode fails with %v, the general converter with %v", err, generalErr)
		}
		if err != nil {
			return
		}
		if len(objs) != len(general) {
			t.Fatalf("Decode returns %d objects, the general converter %d", len(objs), len(general))
		}
		for i := range objs {
			if !proto.Equal(objs[i], general[i]) {
				t.Fatalf("Decode's object %d is\n%v\nthe general converter's\n%v", i+1, objs[i], general[i])
			}
		}
		for _, obj := range objs {
			if obj.GetSpec() == nil {
				continue
			}
			if obj.GetMeta() == nil {
				// Encode writes an absent meta as an empty one, "meta": {}.
				obj.Meta = &nimbusv1.ObjectMeta{}
			}
			for _, format := range []manifest.Format{manifest.JSON, manifest.YAML} {
				var buf bytes.Buffer
				if err := manifest.Encode(&buf, format, obj, nil); err != nil {
					// What protojson cannot write (a string that is not UTF-8) is no round trip.
					continue
				}
				again, err := manifest.Decode(bytes.NewReader(buf.Bytes()))
				if err != nil {
					t.Fatalf("%s of a decoded object does not decode: %v\n%s", format, err, buf.Bytes())
				}
				if len(again) != 1 || !proto.Equal(again[0], obj) {
					t.Fatalf("%s round trip changed the object:\n%v\nbecame\n%v\nthrough\n%s", format, obj, again, buf.Bytes())
				}
			}
		}
	})
}
