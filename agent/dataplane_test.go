//go:build linux

package agent

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/vishvananda/netns"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/naplesnet/naples/delphi"
	"github.com/naplesnet/naples/hal/linux"
	"github.com/naplesnet/naples/internal/testns"
	delphiv1 "github.com/naplesnet/naples/proto/delphi/v1"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// dataplaneEnv is a fresh namespace, a delphi store whose writers the test holds, and an
// Inspector for node host-a reading that namespace, served on a unix socket.
type dataplaneEnv struct {
	t       *testing.T
	ns      string
	nsh     netns.NsHandle
	desired *delphi.DesiredWriter
	status  *delphi.StatusWriter
	api     delphiv1.DelphiClient
}

func newDataplaneEnv(t *testing.T) *dataplaneEnv {
	t.Helper()
	ns := testns.Named(t, "naples-dp")
	nsh := testns.Handle(t, ns)
	store, err := delphi.Open(delphi.Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	desired, err := store.ClaimDesired()
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.ClaimStatus()
	if err != nil {
		t.Fatal(err)
	}
	api := serveInspector(t, InspectorOptions{Store: store, Logger: quiet, Node: "host-a", Namespace: &nsh})
	return &dataplaneEnv{t: t, ns: ns, nsh: nsh, desired: desired, status: st, api: api}
}

// serveInspector serves an Inspector with opts on a unix socket until the test ends and
// returns a client of it.
func serveInspector(t *testing.T, opts InspectorOptions) delphiv1.DelphiClient {
	t.Helper()
	insp, err := NewInspector(opts)
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "agent.sock")
	ctx, cancel := context.WithCancel(context.Background())
	lis, err := listenLocalAPI(ctx, sock)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- insp.Serve(ctx, lis) }()
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return delphiv1.NewDelphiClient(conn)
}

// ip runs `ip -n NS args...`.
func (e *dataplaneEnv) ip(args ...string) {
	e.t.Helper()
	testns.Run(e.t, "ip", append([]string{"-n", e.ns}, args...)...)
}

// bridge runs `bridge -n NS args...`.
func (e *dataplaneEnv) bridge(args ...string) {
	e.t.Helper()
	testns.Run(e.t, "bridge", append([]string{"-n", e.ns}, args...)...)
}

func (e *dataplaneEnv) put(objs ...*nimbusv1.Object) {
	e.t.Helper()
	txn := &delphi.DesiredTxn{}
	for _, o := range objs {
		txn.Put(o)
	}
	if err := e.desired.Commit(txn); err != nil {
		e.t.Fatal(err)
	}
}

func (e *dataplaneEnv) setStatus(obj *nimbusv1.Object, phase nimbusv1.Phase, reason string) {
	e.t.Helper()
	st := &nimbusv1.NodeStatus{Node: "host-a", ObservedGeneration: obj.GetMeta().GetGeneration(), Phase: phase, Reason: reason}
	if err := e.status.Set(obj.Key(), st); err != nil {
		e.t.Fatal(err)
	}
}

// dataplane calls the Dataplane RPC.
func (e *dataplaneEnv) dataplane() *delphiv1.DataplaneResponse {
	e.t.Helper()
	resp, err := e.api.Dataplane(e.t.Context(), &delphiv1.DataplaneRequest{})
	if err != nil {
		e.t.Fatalf("Dataplane: %v", err)
	}
	return resp
}

// overlayNetwork makes the kernel objects of a network as hal/linux's Network
// reconciler does: bridge and VXLAN device named after the key, with naples's alias.
func (e *dataplaneEnv) overlayNetwork(keyID string, vni, mtu int, local string, gateways ...string) (br, vx string) {
	e.t.Helper()
	br, vx = linux.BridgeName(keyID), linux.VXLANName(keyID)
	alias := linux.OwnerAlias(keyID)
	e.ip("link", "add", br, "type", "bridge")
	e.ip("link", "set", br, "alias", alias, "address", linux.GatewayMAC(keyID).String(), "mtu", fmt.Sprint(mtu), "up")
	for _, gw := range gateways {
		e.ip("addr", "add", gw, "dev", br, "noprefixroute", "nodad")
	}
	e.ip("link", "add", vx, "type", "vxlan", "id", fmt.Sprint(vni), "local", local, "dstport", fmt.Sprint(linux.VXLANPort), "nolearning")
	e.ip("link", "set", vx, "alias", alias, "mtu", fmt.Sprint(mtu), "master", br, "up")
	return br, vx
}

// remoteEndpoint makes the kernel entries of an endpoint on another node as hal/linux's
// Endpoint reconciler does.
func (e *dataplaneEnv) remoteEndpoint(br, vx, mac, vtep string, ips ...string) {
	e.t.Helper()
	e.bridge("fdb", "add", mac, "dev", vx, "dst", vtep, "self", "static")
	e.bridge("fdb", "add", mac, "dev", vx, "master", "static")
	for _, ip := range ips {
		e.ip("neigh", "replace", ip, "lladdr", mac, "dev", br, "nud", "permanent")
	}
}

func testNode(name, vtep string) *nimbusv1.Object {
	return &nimbusv1.Object{
		Meta: &nimbusv1.ObjectMeta{Name: name, Generation: 1},
		Spec: &nimbusv1.Object_Node{Node: &nimbusv1.NodeSpec{VtepAddress: vtep}},
	}
}

func testNetwork(name string, gen int64, spec *nimbusv1.NetworkSpec) *nimbusv1.Object {
	return &nimbusv1.Object{
		Meta: &nimbusv1.ObjectMeta{Name: name, Generation: gen},
		Spec: &nimbusv1.Object_Network{Network: spec},
	}
}

func testEndpoint(name, network, node, iface, mac string, ips ...string) *nimbusv1.Object {
	return &nimbusv1.Object{
		Meta: &nimbusv1.ObjectMeta{Name: name, Generation: 1},
		Spec: &nimbusv1.Object_Endpoint{Endpoint: &nimbusv1.EndpointSpec{Network: network, Node: node, Interface: iface, Mac: mac, Ips: ips}},
	}
}

// dataplaneLines summarizes a Dataplane answer for comparison, one line per object.
func dataplaneLines(resp *delphiv1.DataplaneResponse) []string {
	phase := func(st *nimbusv1.NodeStatus) string {
		if st == nil {
			return "-"
		}
		return strings.TrimPrefix(st.GetPhase().String(), "PHASE_") + "/" + st.GetReason()
	}
	link := func(l *delphiv1.DataplaneLink) string {
		s := fmt.Sprintf("%s present=%t", l.GetName(), l.GetPresent())
		if l.GetMaster() != "" {
			s += " master=" + l.GetMaster()
		}
		return s + fmt.Sprintf(" problems=%q", l.GetProblems())
	}
	lines := []string{"node " + resp.GetNode() + " vtep " + resp.GetVtep()}
	for _, n := range resp.GetNetworks() {
		lines = append(lines,
			fmt.Sprintf("network %s vni=%d status=%s", n.GetKey().GetName(), n.GetVni(), phase(n.GetStatus())),
			"  bridge "+link(n.GetBridge()),
			"  vxlan "+link(n.GetVxlan()))
		for _, t := range n.GetRemoteVteps() {
			lines = append(lines, fmt.Sprintf("  vtep %s nodes=%v wanted=%t present=%t", t.GetAddress(), t.GetNodes(), t.GetWanted(), t.GetPresent()))
		}
		for _, e := range n.GetEndpoints() {
			s := fmt.Sprintf("  endpoint %s local=%t status=%s", e.GetKey().GetName(), e.GetLocal(), phase(e.GetStatus()))
			if e.GetLink() != nil {
				s += " link " + link(e.GetLink())
			}
			if e.GetVtep() != "" {
				s += " vtep=" + e.GetVtep()
			}
			if f := e.GetFdb(); f != nil {
				s += fmt.Sprintf(" fdb %s present=%t bridge=%t dsts=%v", f.GetMac(), f.GetPresent(), f.GetBridgePresent(), f.GetDsts())
			}
			for _, nb := range e.GetNeighbors() {
				s += fmt.Sprintf(" neigh %s present=%t mac=%s state=%s", nb.GetIp(), nb.GetPresent(), nb.GetMac(), nb.GetState())
			}
			lines = append(lines, s)
		}
	}
	return lines
}

func checkLines(t *testing.T, what string, got, want []string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Errorf("%s:\n got:\n%s\nwant:\n%s", what, strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestDataplane builds in a namespace, with ip and bridge, the kernel objects the
// overlay's reconcilers make for one network with a local and two remote endpoints, and
// leaves a second network's out; it checks that Dataplane reports them present, the
// second network's missing, and the statuses delphi holds. Then it changes the kernel by
// hand, deleting FDB entries of the VXLAN device and of the bridge, a neighbour, a
// head-end replication entry, a gateway address, releasing the local port, setting the VXLAN device down and putting a foreign
// link where the second network's bridge belongs, and checks that each is reported.
func TestDataplane(t *testing.T) {
	e := newDataplaneEnv(t)
	blueID := nimbusv1.NewKey(nimbusv1.Kind_KIND_NETWORK, "", "", "blue").ID()
	greenID := nimbusv1.NewKey(nimbusv1.Kind_KIND_NETWORK, "", "", "green").ID()
	br, vx := e.overlayNetwork(blueID, 100, 1400, "192.0.2.1", "10.1.0.1/24", "fd00:1::1/64")
	e.ip("link", "add", "veth-web", "mtu", "1400", "type", "veth", "peer", "name", "veth-web-wl")
	e.ip("link", "set", "veth-web", "master", br, "up")
	e.bridge("link", "set", "dev", "veth-web", "learning", "off")
	e.bridge("fdb", "replace", "02:00:00:00:00:01", "dev", "veth-web", "master", "static")
	e.bridge("fdb", "append", "00:00:00:00:00:00", "dev", vx, "dst", "192.0.2.2", "self", "permanent")
	e.bridge("fdb", "append", "00:00:00:00:00:00", "dev", vx, "dst", "192.0.2.3", "self", "permanent")
	e.remoteEndpoint(br, vx, "02:00:00:00:00:02", "192.0.2.2", "10.1.0.3", "fd00:1::3")
	e.remoteEndpoint(br, vx, "02:00:00:00:00:03", "192.0.2.3", "10.1.0.4")

	blue := testNetwork("blue", 2, &nimbusv1.NetworkSpec{Vni: 100, Mtu: 1400, Subnet: "10.1.0.0/24", Gateway: "10.1.0.1",
		Subnets: []*nimbusv1.Subnet{{Cidr: "fd00:1::/64", Gateway: "fd00:1::1"}}})
	green := testNetwork("green", 1, &nimbusv1.NetworkSpec{Vni: 200, Subnet: "10.2.0.0/24"})
	db := testEndpoint("db", "blue", "host-b", "", "02:00:00:00:00:02", "10.1.0.3", "fd00:1::3")
	e.put(testNode("host-a", "192.0.2.1"), testNode("host-b", "192.0.2.2"), testNode("host-c", "192.0.2.3"), blue, green,
		testEndpoint("web", "blue", "host-a", "veth-web", "02:00:00:00:00:01", "10.1.0.2"),
		db,
		testEndpoint("cache", "blue", "host-c", "", "02:00:00:00:00:03", "10.1.0.4"),
		testEndpoint("lost", "green", "host-b", "", "02:00:00:00:00:04", "10.2.0.4"))
	e.setStatus(blue, nimbusv1.Phase_PHASE_PROGRAMMED, "")
	e.setStatus(db, nimbusv1.Phase_PHASE_PENDING, linux.ReasonWaitingForNetwork)

	resp := e.dataplane()
	none := "[]"
	checkLines(t, "the dataplane as programmed", dataplaneLines(resp), []string{
		"node host-a vtep 192.0.2.1",
		"network blue vni=100 status=PROGRAMMED/",
		"  bridge " + br + " present=true problems=" + none,
		"  vxlan " + vx + " present=true master=" + br + " problems=" + none,
		"  vtep 192.0.2.2 nodes=[host-b] wanted=true present=true",
		"  vtep 192.0.2.3 nodes=[host-c] wanted=true present=true",
		"  endpoint cache local=false status=- vtep=192.0.2.3 fdb 02:00:00:00:00:03 present=true bridge=true dsts=[192.0.2.3]" +
			" neigh 10.1.0.4 present=true mac=02:00:00:00:00:03 state=permanent",
		"  endpoint db local=false status=PENDING/WaitingForNetwork vtep=192.0.2.2 fdb 02:00:00:00:00:02 present=true bridge=true dsts=[192.0.2.2]" +
			" neigh 10.1.0.3 present=true mac=02:00:00:00:00:02 state=permanent neigh fd00:1::3 present=true mac=02:00:00:00:00:02 state=permanent",
		"  endpoint web local=true status=- link veth-web present=true master=" + br + " problems=" + none,
		"network green vni=200 status=-",
		"  bridge " + linux.BridgeName(greenID) + ` present=false problems=["missing"]`,
		"  vxlan " + linux.VXLANName(greenID) + ` present=false problems=["missing"]`,
		"  vtep 192.0.2.2 nodes=[host-b] wanted=true present=false",
		"  endpoint lost local=false status=- vtep=192.0.2.2 fdb 02:00:00:00:00:04 present=false bridge=false dsts=[]" +
			" neigh 10.2.0.4 present=false mac= state=",
	})
	b, v := resp.GetNetworks()[0].GetBridge(), resp.GetNetworks()[0].GetVxlan()
	if b.GetKind() != "bridge" || !b.GetUp() || b.GetMtu() != 1400 || b.GetMac() != linux.GatewayMAC(blueID).String() ||
		!slices.Contains(b.GetAddresses(), "10.1.0.1/24") || !slices.Contains(b.GetAddresses(), "fd00:1::1/64") {
		t.Errorf("blue's bridge = %v", b)
	}
	if v.GetKind() != "vxlan" || !v.GetUp() || v.GetVni() != 100 || v.GetLocal() != "192.0.2.1" || v.GetDstPort() != linux.VXLANPort ||
		v.GetLearning() || v.GetAlias() != linux.OwnerAlias(blueID) {
		t.Errorf("blue's vxlan device = %v", v)
	}
	if s := resp.GetNetworks()[0].GetSubnets(); len(s) != 2 || s[0].GetCidr() != "10.1.0.0/24" || s[1].GetGateway() != "fd00:1::1" {
		t.Errorf("blue's subnets = %v", s)
	}

	// A workload's port that learns, without the static entry of its MAC.
	e.bridge("link", "set", "dev", "veth-web", "learning", "on")
	e.bridge("fdb", "del", "02:00:00:00:00:01", "dev", "veth-web", "master")
	web := e.dataplane().GetNetworks()[0].GetEndpoints()[2]
	if l := web.GetLink(); l.GetName() != "veth-web" || !l.GetLearning() ||
		!slices.Equal(l.GetProblems(), []string{"learning on (want off)", "no static entry for 02:00:00:00:00:01 on the bridge"}) {
		t.Errorf("web's port, learning and without its static entry = %v", l)
	}

	// Hands in the kernel.
	e.bridge("fdb", "del", "02:00:00:00:00:02", "dev", vx, "dst", "192.0.2.2", "self")
	e.ip("neigh", "replace", "fd00:1::3", "lladdr", "02:00:00:00:00:99", "dev", br, "nud", "reachable")
	e.ip("neigh", "del", "10.1.0.4", "dev", br)
	e.bridge("fdb", "del", "02:00:00:00:00:03", "dev", vx, "master")
	e.bridge("fdb", "del", "00:00:00:00:00:00", "dev", vx, "dst", "192.0.2.3", "self")
	e.bridge("fdb", "append", "00:00:00:00:00:00", "dev", vx, "dst", "192.0.2.9", "self", "permanent")
	e.ip("addr", "del", "fd00:1::1/64", "dev", br)
	e.ip("addr", "add", "10.9.9.9/24", "dev", br)
	e.ip("link", "set", "veth-web", "nomaster")
	e.ip("link", "set", vx, "down")
	e.ip("link", "add", linux.BridgeName(greenID), "type", "bridge")

	checkLines(t, "the dataplane after hands in the kernel", dataplaneLines(e.dataplane()), []string{
		"node host-a vtep 192.0.2.1",
		"network blue vni=100 status=PROGRAMMED/",
		"  bridge " + br + ` present=true problems=["address fd00:1::1/64 missing" "address 10.9.9.9/24 not wanted"]`,
		"  vxlan " + vx + " present=true master=" + br + ` problems=["down"]`,
		"  vtep 192.0.2.2 nodes=[host-b] wanted=true present=true",
		"  vtep 192.0.2.3 nodes=[host-c] wanted=true present=false",
		"  vtep 192.0.2.9 nodes=[] wanted=false present=true",
		"  endpoint cache local=false status=- vtep=192.0.2.3 fdb 02:00:00:00:00:03 present=true bridge=false dsts=[192.0.2.3]" +
			" neigh 10.1.0.4 present=false mac= state=",
		"  endpoint db local=false status=PENDING/WaitingForNetwork vtep=192.0.2.2 fdb 02:00:00:00:00:02 present=false bridge=true dsts=[]" +
			" neigh 10.1.0.3 present=true mac=02:00:00:00:00:02 state=permanent neigh fd00:1::3 present=false mac=02:00:00:00:00:99 state=reachable",
		"  endpoint web local=true status=- link veth-web present=true problems=" + `["not a port of ` + br + `"]`,
		"network green vni=200 status=-",
		"  bridge " + linux.BridgeName(greenID) + ` present=true problems=["not naples's (alias \"\")"]`,
		"  vxlan " + linux.VXLANName(greenID) + ` present=false problems=["missing"]`,
		"  vtep 192.0.2.2 nodes=[host-b] wanted=true present=false",
		"  endpoint lost local=false status=- vtep=192.0.2.2 fdb 02:00:00:00:00:04 present=false bridge=false dsts=[]" +
			" neigh 10.2.0.4 present=false mac= state=",
	})
}

// TestDataplaneDeviceSettings checks that the settings of a network's devices that
// differ from the network's are reported: VNI, local address, port, learning, master,
// MTU, MAC, a missing local interface.
func TestDataplaneDeviceSettings(t *testing.T) {
	e := newDataplaneEnv(t)
	id := nimbusv1.NewKey(nimbusv1.Kind_KIND_NETWORK, "", "", "blue").ID()
	br, vx := linux.BridgeName(id), linux.VXLANName(id)
	alias := linux.OwnerAlias(id)
	e.ip("link", "add", br, "type", "bridge")
	e.ip("link", "set", br, "alias", alias, "up")
	e.ip("link", "add", vx, "type", "vxlan", "id", "7", "local", "192.0.2.7", "dstport", "8472")
	e.ip("link", "set", vx, "alias", alias, "up")
	e.put(testNode("host-a", "192.0.2.1"),
		testNetwork("blue", 1, &nimbusv1.NetworkSpec{Vni: 100, Mtu: 1400, Subnet: "10.1.0.0/24"}),
		testEndpoint("web", "blue", "host-a", "veth-web", ""))

	n := e.dataplane().GetNetworks()[0]
	wantBridge := []string{"mtu 1500 (want 1400)", fmt.Sprintf("mac %s (want %s)", n.GetBridge().GetMac(), linux.GatewayMAC(id))}
	if got := n.GetBridge().GetProblems(); !slices.Equal(got, wantBridge) {
		t.Errorf("bridge problems:\n got %q\nwant %q", got, wantBridge)
	}
	wantVXLAN := []string{"mtu 1500 (want 1400)", "vni 7 (want 100)", "local 192.0.2.7 (want 192.0.2.1)",
		"dstport 8472 (want 4789)", "learning on (want off)", "master none (want " + br + ")"}
	if got := n.GetVxlan().GetProblems(); !slices.Equal(got, wantVXLAN) {
		t.Errorf("vxlan problems:\n got %q\nwant %q", got, wantVXLAN)
	}
	if l := n.GetEndpoints()[0].GetLink(); l.GetPresent() || !slices.Equal(l.GetProblems(), []string{"missing"}) {
		t.Errorf("the missing interface of a local endpoint = %v", l)
	}
}

// TestDataplaneDerivedMTU checks that the devices of a network without spec.mtu are
// held to the MTU its status says the reconciler derived from the underlay, in the typed
// operational data or, written by an agent of the release before, in the string form.
func TestDataplaneDerivedMTU(t *testing.T) {
	for name, st := range map[string]*nimbusv1.NodeStatus{
		"typed": {OperationalData: &nimbusv1.OperationalData{Kind: &nimbusv1.OperationalData_Network{
			Network: &nimbusv1.NetworkOperational{Mtu: 1450},
		}}},
		"strings": {Operational: map[string]string{"mtu": "1450"}},
	} {
		t.Run(name, func(t *testing.T) {
			e := newDataplaneEnv(t)
			blue := testNetwork("blue", 1, &nimbusv1.NetworkSpec{Vni: 100, Subnet: "10.1.0.0/24"})
			id := blue.Key().ID()
			e.overlayNetwork(id, 100, 1500, "192.0.2.1")
			e.put(testNode("host-a", "192.0.2.1"), blue)
			st.Node, st.ObservedGeneration, st.Phase = "host-a", 1, nimbusv1.Phase_PHASE_PROGRAMMED
			if err := e.status.Set(blue.Key(), st); err != nil {
				t.Fatal(err)
			}
			n := e.dataplane().GetNetworks()[0]
			for what, l := range map[string]*delphiv1.DataplaneLink{"bridge": n.GetBridge(), "vxlan": n.GetVxlan()} {
				if got := l.GetProblems(); !slices.Contains(got, "mtu 1500 (want 1450)") {
					t.Errorf("%s problems %q, want mtu 1500 (want 1450)", what, got)
				}
			}
		})
	}
}

// TestDataplaneReadsKernelOnce checks that reading the kernel for the view costs one dump
// per kind, links, bridge ports, addresses, FDB and neighbours, however many networks
// there are.
func TestDataplaneReadsKernelOnce(t *testing.T) {
	e := newDataplaneEnv(t)
	for i, name := range []string{"a", "b", "c"} {
		e.overlayNetwork(nimbusv1.NewKey(nimbusv1.Kind_KIND_NETWORK, "", "", name).ID(), 100+i, 1500, "192.0.2.1")
	}
	k, err := readKernel(t.Context(), newKernelView(&e.nsh))
	if err != nil {
		t.Fatal(err)
	}
	if k.dumps != 5 {
		t.Errorf("reading the kernel took %d dumps, want 5", k.dumps)
	}
	if len(k.byName) != 7 { // lo and three bridges and VXLAN devices
		t.Errorf("read %d links, want 7", len(k.byName))
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := readKernel(ctx, newKernelView(&e.nsh)); err == nil {
		t.Error("reading the kernel with a cancelled context succeeded")
	}
}

// TestDataplaneNeedsNode checks that an Inspector that does not know its node refuses
// Dataplane with FailedPrecondition.
func TestDataplaneNeedsNode(t *testing.T) {
	store, err := delphi.Open(delphi.Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	api := serveInspector(t, InspectorOptions{Store: store, Logger: quiet})
	_, err = api.Dataplane(t.Context(), &delphiv1.DataplaneRequest{})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "node name") {
		t.Errorf("Dataplane without a node = %v, want FailedPrecondition naming the node name", err)
	}
}
