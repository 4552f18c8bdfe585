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
		// Documents of the fast subset that Decode makes into objects directly, and their
		// neighbours that it leaves to protojson: every kind of field, in block and flow
		// style, with values at the limits of their types and of the wrong type.
		"kind: Route\nmeta:\n  name: dc2-web-0042\n  labels:\n    app: web\n    site: dc2\n  nodes:\n    - host-a\n    - host-b\n" +
			"spec:\n  table: 4294967295\n  metric: 0\n  prefix: 100.64.0.42/32\n  nexthops:\n    - gateway: 10.10.0.2\n      weight: 2\n    - device: eth1\n",
		"kind: rt\nmeta: {name: r, generation: 999999999999999999, generation_revision: 7, revision: 1}\nspec: {metric: 4294967296}\n",
		"kind: Route\nmeta: {generation: 9223372036854775807, revision: 18446744073709551615}\n---\nkind: Route\nmeta: {generation: -9223372036854775808}\n",
		"kind: Route\nmeta: {generation: 9223372036854775808, revision: -1}\n",
		"kind: Route\nmeta: {name: a, generation_revision: 2, generationRevision: 3, labels: {app: 5}}\nspec: {nexthops: {gateway: x}}\n",
		"kind: Route\nmeta: {labels: {app: [web]}, nodes: [7]}\nspec: {prefix: 10, table: x, nextHops: []}\n",
		"kind: Network\nmeta:\n  name: net1\nspec:\n  vni: 7\n  mtu: 1450\n  subnets:\n    - cidr: 10.0.0.0/24\n      gateway: 10.0.0.1\n    - cidr: fd00::/64\n",
		"{kind: Network, meta: {name: net1}, spec: {vni: 4294967295, subnet: 10.0.0.0/24, subnets: [{cidr: 10.1.0.0/24}]}}\n",
		"kind: Endpoint\nmeta:\n  name: ep\nspec:\n  network: net1\n  node: host-a\n  mac: '02:00:00:00:00:01'\n  ips:\n    - 10.1.0.5\n" +
			"  securityGroups: [web]\n  allowed_source_prefixes: [10.1.0.0/24]\n",
		"kind: Endpoint\nspec: {ips: 10.1.0.5, security_groups: [web], securityGroups: [db]}\n",
		"kind: NetworkSecurityPolicy\nmeta: {name: p}\nspec:\n  attachGroups: [web]\n  ingress:\n    - action: ACTION_ALLOW\n      fromGroups: [client]\n" +
			"      protocol: tcp\n      ports: [\"8080\"]\n    - action: 2\n      from_cidrs: [10.0.0.0/8]\n  egress:\n    - action: 2147483647\n",
		"{kind: NetworkSecurityPolicy, spec: {ingress: [{action: ALLOW}, {action: 2147483648}, {action: -2147483648}, {action: action_deny}]}}\n",
		"kind: Interface\nmeta: {name: eth1}\nspec: {device: eth1, mtu: 9000, adminUp: false, addresses: [192.0.2.1/24]}\n",
		"kind: FlowExportPolicy\nspec: {interval: '10s', sampling: 100, targets: [192.0.2.9:4739]}\n",
		"kind: Route\nmeta: {createTime: '2026-11-21T10:00:00Z'}\nstatus: {nodes: [a]}\n",
		"kind: 7\n---\nkind: Router\n---\nkind: Route\nextra: {}\n",
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
