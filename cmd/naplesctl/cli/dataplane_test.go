package cli

import (
	"context"
	"encoding/json"
	"net"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	delphiv1 "github.com/naplesnet/naples/proto/delphi/v1"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// dataplaneAgent is an agent's local API whose Dataplane answers what the test sets.
type dataplaneAgent struct {
	delphiv1.UnimplementedDelphiServer
	resp *delphiv1.DataplaneResponse
	err  error
}

// Dataplane returns the answer the test set.
func (a *dataplaneAgent) Dataplane(context.Context, *delphiv1.DataplaneRequest) (*delphiv1.DataplaneResponse, error) {
	return a.resp, a.err
}

// serveDataplaneAgent serves a on a unix socket in e's directory until the test ends and
// points NAPLES_AGENT at it.
func serveDataplaneAgent(t *testing.T, e *env, a *dataplaneAgent) {
	t.Helper()
	sock := filepath.Join(e.dir, "agent.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	delphiv1.RegisterDelphiServer(gs, a)
	served := make(chan error, 1)
	go func() { served <- gs.Serve(lis) }()
	t.Cleanup(func() {
		gs.Stop()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	e.vars[AgentEnv] = sock
}

// cannedDataplane is an agent's view of two networks: blue, programmed with a few things
// wrong, and green, not programmed yet.
func cannedDataplane() *delphiv1.DataplaneResponse {
	key := func(kind nimbusv1.Kind, name string) *nimbusv1.ObjectKey { return nimbusv1.NewKey(kind, "", "", name) }
	programmed := &nimbusv1.NodeStatus{Node: "host-a", ObservedGeneration: 2, Phase: nimbusv1.Phase_PHASE_PROGRAMMED}
	return &delphiv1.DataplaneResponse{
		Node: "host-a",
		Vtep: "192.0.2.1",
		Networks: []*delphiv1.DataplaneNetwork{{
			Key: key(nimbusv1.Kind_KIND_NETWORK, "blue"), Generation: 2, Vni: 100, Mtu: 1400,
			Subnets: []*nimbusv1.Subnet{{Cidr: "10.1.0.0/24", Gateway: "10.1.0.1"}, {Cidr: "fd00:1::/64"}},
			Status:  programmed,
			Bridge: &delphiv1.DataplaneLink{Name: "nbr1b71817d", Present: true, Kind: "bridge", Up: true, Mtu: 1400,
				Mac: "02:aa:bb:cc:dd:ee", Addresses: []string{"10.1.0.1/24", "fe80::aa:bbff:fecc:ddee/64"}},
			Vxlan: &delphiv1.DataplaneLink{Name: "nvx1b71817d", Present: true, Kind: "vxlan", Mtu: 1400, Vni: 100,
				Local: "192.0.2.1", DstPort: 4789, Master: "nbr1b71817d", Problems: []string{"down"}},
			RemoteVteps: []*delphiv1.DataplaneVtep{
				{Address: "192.0.2.2", Nodes: []string{"host-b"}, Wanted: true, Present: true},
				{Address: "192.0.2.3", Nodes: []string{"host-c", "host-d"}, Wanted: true},
				{Address: "192.0.2.9", Present: true},
			},
			Endpoints: []*delphiv1.DataplaneEndpoint{
				{
					Key: key(nimbusv1.Kind_KIND_ENDPOINT, "api"), Generation: 1, Node: "host-a", Interface: "veth-api", Local: true,
					Status: &nimbusv1.NodeStatus{ObservedGeneration: 1, Phase: nimbusv1.Phase_PHASE_PENDING,
						Reason: "WaitingForInterface", Message: "waiting for interface\n\"veth-api\""},
					Link: &delphiv1.DataplaneLink{Name: "veth-api", Problems: []string{"missing"}},
				},
				{
					Key: key(nimbusv1.Kind_KIND_ENDPOINT, "cache"), Generation: 3, Node: "host-c", Mac: "02:00:00:00:00:03",
					Ips:       []string{"10.1.0.4"},
					Status:    &nimbusv1.NodeStatus{ObservedGeneration: 2, Phase: nimbusv1.Phase_PHASE_PROGRAMMED},
					Vtep:      "192.0.2.3",
					Fdb:       &delphiv1.DataplaneFdb{Mac: "02:00:00:00:00:03"},
					Neighbors: []*delphiv1.DataplaneNeighbor{{Ip: "10.1.0.4"}},
				},
				{
					Key: key(nimbusv1.Kind_KIND_ENDPOINT, "db"), Generation: 1, Node: "host-b", Mac: "02:00:00:00:00:02",
					Ips:    []string{"10.1.0.3", "fd00:1::3"},
					Status: &nimbusv1.NodeStatus{ObservedGeneration: 1, Phase: nimbusv1.Phase_PHASE_PROGRAMMED},
					Vtep:   "192.0.2.2",
					Fdb:    &delphiv1.DataplaneFdb{Mac: "02:00:00:00:00:02", Present: true, Dsts: []string{"192.0.2.2"}, BridgePresent: true},
					Neighbors: []*delphiv1.DataplaneNeighbor{
						{Ip: "10.1.0.3", Present: true, Mac: "02:00:00:00:00:02", State: "permanent"},
						{Ip: "fd00:1::3", Mac: "02:00:00:00:00:99", State: "reachable"},
					},
				},
				{
					Key: key(nimbusv1.Kind_KIND_ENDPOINT, "queue"), Generation: 1, Node: "host-b", Mac: "02:00:00:00:00:05",
					Vtep: "192.0.2.2",
					Fdb:  &delphiv1.DataplaneFdb{Mac: "02:00:00:00:00:05", Dsts: []string{"192.0.2.7"}},
				},
				{
					Key: key(nimbusv1.Kind_KIND_ENDPOINT, "web"), Generation: 1, Node: "host-a", Interface: "veth-web", Local: true,
					Status: &nimbusv1.NodeStatus{ObservedGeneration: 1, Phase: nimbusv1.Phase_PHASE_PROGRAMMED},
					Link: &delphiv1.DataplaneLink{Name: "veth-web", Present: true, Kind: "veth", Up: true, Mtu: 1400,
						Master: "nbr1b71817d"},
				},
			},
		}, {
			Key: key(nimbusv1.Kind_KIND_NETWORK, "green"), Generation: 1, Vni: 200,
			Subnets: []*nimbusv1.Subnet{{Cidr: "10.2.0.0/24"}},
			Bridge:  &delphiv1.DataplaneLink{Name: "nbrb52f4df4", Problems: []string{"missing"}},
			Vxlan: &delphiv1.DataplaneLink{Name: "nvxb52f4df4", Present: true, Kind: "vxlan", Up: true, Mtu: 1500,
				Alias: "someone", Problems: []string{`not naples's (alias "someone")`}},
		}},
	}
}

// TestDataplaneCommand checks the tree, JSON and YAML forms of an agent's dataplane view
// and how an agent's refusal reads.
func TestDataplaneCommand(t *testing.T) {
	e := newEnv(t)
	a := &dataplaneAgent{resp: cannedDataplane()}
	serveDataplaneAgent(t, e, a)

	equal(t, "dataplane", e.ok("dataplane"), `node host-a, vtep 192.0.2.1

network default/default/blue: vni 100, mtu 1400, PROGRAMMED
  subnet 10.1.0.0/24, gateway 10.1.0.1
  subnet fd00:1::/64, gateway none
  bridge nbr1b71817d: ok; up, mtu 1400, mac 02:aa:bb:cc:dd:ee, addresses 10.1.0.1/24 fe80::aa:bbff:fecc:ddee/64
  vxlan nvx1b71817d: WRONG: down; mtu 1400, vni 100, local 192.0.2.1, dstport 4789, master nbr1b71817d
  remote vtep 192.0.2.2 (host-b): ok
  remote vtep 192.0.2.3 (host-c, host-d): MISSING
  remote vtep 192.0.2.9: NOT WANTED
  endpoint api on host-a (local): PENDING WaitingForInterface: waiting for interface "veth-api"
    interface veth-api: MISSING
  endpoint cache on host-c (vtep 192.0.2.3): PROGRAMMED at generation 2 of 3
    fdb 02:00:00:00:00:03 dst 192.0.2.3: MISSING
    neighbour 10.1.0.4 lladdr 02:00:00:00:00:03: MISSING
  endpoint db on host-b (vtep 192.0.2.2): PROGRAMMED
    fdb 02:00:00:00:00:02 dst 192.0.2.2: ok
    neighbour 10.1.0.3 lladdr 02:00:00:00:00:02: ok
    neighbour fd00:1::3 lladdr 02:00:00:00:00:02: WRONG: lladdr 02:00:00:00:00:99 reachable
  endpoint queue on host-b (vtep 192.0.2.2): no status yet
    fdb 02:00:00:00:00:05 dst 192.0.2.2: WRONG: dst 192.0.2.7 (want 192.0.2.2), no static entry on the bridge
  endpoint web on host-a (local): PROGRAMMED
    interface veth-web: ok; up, mtu 1400, master nbr1b71817d

network default/default/green: vni 200, no status yet
  subnet 10.2.0.0/24, gateway none
  bridge nbrb52f4df4: MISSING
  vxlan nvxb52f4df4: WRONG: not naples's (alias "someone"); up, mtu 1500, vni 0, local none, dstport 0, master none
`)

	var doc struct {
		Node     string
		Networks []struct {
			Key         struct{ Name string }
			Generation  int64
			Vni         int
			Bridge      struct{ Name, Mac string }
			Vxlan       struct{ Present, Up bool }
			RemoteVteps []struct {
				Address         string
				Wanted, Present bool
			}
			Endpoints []struct {
				Key       struct{ Name string }
				Status    *struct{ Phase string }
				Fdb       *struct{ Present, BridgePresent bool }
				Neighbors []struct {
					Ip      string
					Present bool
				}
			}
		}
	}
	out := e.ok("dataplane", "-o", "json")
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("dataplane -o json: %v\n%s", err, out)
	}
	if doc.Node != "host-a" || len(doc.Networks) != 2 {
		t.Fatalf("dataplane -o json: %+v\n%s", doc, out)
	}
	blue := doc.Networks[0]
	if blue.Key.Name != "blue" || blue.Generation != 2 || blue.Vni != 100 || blue.Bridge.Name != "nbr1b71817d" ||
		!blue.Vxlan.Present || blue.Vxlan.Up || len(blue.RemoteVteps) != 3 || !blue.RemoteVteps[1].Wanted || blue.RemoteVteps[1].Present {
		t.Errorf("dataplane -o json: blue %+v", blue)
	}
	// Every field is there, false ones too: a missing entry reads "present": false.
	if cache := blue.Endpoints[1]; cache.Key.Name != "cache" || cache.Fdb == nil || cache.Fdb.Present ||
		len(cache.Neighbors) != 1 || cache.Neighbors[0].Present || !strings.Contains(out, `"present": false`) {
		t.Errorf("dataplane -o json: cache %+v", cache)
	}
	if queue := blue.Endpoints[3]; queue.Status != nil {
		t.Errorf("dataplane -o json: queue has status %+v, want none", queue.Status)
	}
	out = e.ok("dataplane", "-o", "yaml")
	for _, want := range []string{"networks:\n- bridge:\n", "  remoteVteps:\n", "    present: false\n", "node: host-a\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("dataplane -o yaml does not contain %q:\n%s", want, out)
		}
	}

	contains(t, "dataplane -o table", e.fails("dataplane", "-o", "table"), `--output "table": want tree, json or yaml`)
	a.resp, a.err = nil, status.Error(codes.FailedPrecondition, "the dataplane view needs this host's node name")
	contains(t, "an agent's refusal", e.fails("dataplane"), "reading the dataplane: the dataplane view needs this host's node name (FailedPrecondition)")
}

// TestDataplaneCommandEmpty checks the view of an agent with no networks.
func TestDataplaneCommandEmpty(t *testing.T) {
	e := newEnv(t)
	serveDataplaneAgent(t, e, &dataplaneAgent{resp: &delphiv1.DataplaneResponse{Node: "host-a"}})
	out, errOut, err := e.run("", "dataplane")
	if err != nil || out != "node host-a, vtep none\n" || errOut != "No networks found.\n" {
		t.Errorf("dataplane of an agent without networks: err %v, stdout %q, stderr %q", err, out, errOut)
	}
}
