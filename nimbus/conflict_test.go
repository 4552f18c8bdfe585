package nimbus

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// endpoint returns an Endpoint of the network on the node, with the interface, MAC and
// addresses given (any of them may be empty).
func endpoint(name, network, node, iface, mac string, ips ...string) *nimbusv1.Object {
	return &nimbusv1.Object{
		Meta: &nimbusv1.ObjectMeta{Name: name},
		Spec: &nimbusv1.Object_Endpoint{Endpoint: &nimbusv1.EndpointSpec{
			Network: network, Node: node, Interface: iface, Mac: mac, Ips: ips,
		}},
	}
}

// network returns a Network with the VNI and subnets.
func network(name string, vni uint32, subnets ...string) *nimbusv1.Object {
	spec := &nimbusv1.NetworkSpec{Vni: vni}
	for _, s := range subnets {
		spec.Subnets = append(spec.Subnets, &nimbusv1.Subnet{Cidr: s})
	}
	return &nimbusv1.Object{Meta: &nimbusv1.ObjectMeta{Name: name}, Spec: &nimbusv1.Object_Network{Network: spec}}
}

// hostInterface returns an Interface object for the device on the nodes (every node
// when none).
func hostInterface(name, device string, nodes ...string) *nimbusv1.Object {
	return &nimbusv1.Object{
		Meta: &nimbusv1.ObjectMeta{Name: name, Nodes: nodes},
		Spec: &nimbusv1.Object_Interface{Interface: &nimbusv1.InterfaceSpec{Device: device, Mtu: 9000}},
	}
}

// inTenant puts the object in the tenant.
func inTenant(tenant string, obj *nimbusv1.Object) *nimbusv1.Object {
	obj.Meta.Tenant = tenant
	return obj
}

// webA is the running endpoint the conflict tests take values from.
func webA() *nimbusv1.Object {
	return endpoint("web-a", "net1", "host-a", "veth-a", "02:00:00:00:01:0a", "10.1.0.5")
}

// conflictCases are objects applied after net1 (VNI 100, 10.1.0.0/24), web-a (webA) and
// eth1 (an Interface for eth1 on host-b): want is the refusal, "" when the object is
// accepted.
var conflictCases = []struct {
	name string
	obj  *nimbusv1.Object
	want string
}{
	{"ip in network", endpoint("aaa", "net1", "host-b", "veth-b", "02:00:00:00:01:0b", "10.1.0.5"),
		`endpoint "default/aaa": spec.ips "10.1.0.5" is already used by endpoint "default/web-a" in network "net1"`},
	{"ip in tenant", endpoint("aaa", "net9", "host-b", "veth-b", "02:00:00:00:01:0b", "10.1.0.5"),
		`endpoint "default/aaa": spec.ips "10.1.0.5" is already used by endpoint "default/web-a" in network "net1"`},
	{"ip other tenant", inTenant("t2", endpoint("aaa", "net1", "host-b", "veth-b", "02:00:00:00:01:0b", "10.1.0.5")), ""},
	{"iface on node", endpoint("aaa", "net1", "host-a", "veth-a", "02:00:00:00:01:0b", "10.1.0.6"),
		`endpoint "default/aaa": spec.interface "veth-a" is already used by endpoint "default/web-a" on node "host-a"`},
	{"iface other node", endpoint("aaa", "net1", "host-b", "veth-a", "02:00:00:00:01:0b", "10.1.0.6"), ""},
	{"iface of a nic", endpoint("aaa", "net1", "host-b", "eth1", "02:00:00:00:01:0b", "10.1.0.6"),
		`endpoint "default/aaa": spec.interface "eth1" is already used by interface "default/eth1" on node "host-b"`},
	{"mac in network", endpoint("aaa", "net1", "host-b", "veth-b", "02:00:00:00:01:0A", "10.1.0.6"),
		`endpoint "default/aaa": spec.mac "02:00:00:00:01:0A" is already used by endpoint "default/web-a" in network "net1"`},
	{"mac other network", endpoint("aaa", "net9", "host-b", "veth-b", "02:00:00:00:01:0a", "10.9.0.6"), ""},
	{"ip outside", endpoint("aaa", "net1", "host-b", "veth-b", "02:00:00:00:01:0b", "10.2.0.5"),
		`endpoint "default/aaa": spec.ips "10.2.0.5" is outside every subnet of network "net1" (10.1.0.0/24)`},
	{"vni", network("net2", 100, "10.2.0.0/24"),
		`network "default/net2": spec.vni "100" is already used by network "default/net1"`},
	{"subnet holding", network("net2", 200, "192.168.0.0/24", "10.0.0.0/8"),
		`network "default/net2": spec.subnets[1].cidr "10.0.0.0/8" overlaps subnet 10.1.0.0/24 of network "default/net1" in tenant "default"`},
	{"subnet inside", network("net2", 200, "10.1.0.128/25"),
		`network "default/net2": spec.subnets[0].cidr "10.1.0.128/25" overlaps subnet 10.1.0.0/24 of network "default/net1" in tenant "default"`},
	{"same subnet", network("net2", 200, "10.1.0.0/24"),
		`network "default/net2": spec.subnets[0].cidr "10.1.0.0/24" overlaps subnet 10.1.0.0/24 of network "default/net1" in tenant "default"`},
	{"subnet next", network("net2", 200, "10.1.1.0/24", "fd00::/64"), ""},
	{"subnet other tenant", inTenant("t2", network("net2", 200, "10.1.0.0/24")), ""},
	{"network leaving out", network("net1", 100, "10.2.0.0/24"),
		`network "default/net1": spec.subnets "10.2.0.0/24" leaves out address "10.1.0.5" of endpoint "default/web-a"`},
	{"nic twice", hostInterface("nic", "eth1", "host-b"),
		`interface "default/nic": spec.device "eth1" is already used by interface "default/eth1" on node "host-b"`},
	{"nic everywhere", hostInterface("nic", "veth-a"),
		`interface "default/nic": spec.device "veth-a" is already used by endpoint "default/web-a" on a node this object targets (it targets every node)`},
	{"nic other node", hostInterface("nic", "eth1", "host-a"), ""},
	{"endpoint update", endpoint("web-a", "net1", "host-a", "veth-a", "02:00:00:00:01:0a", "10.1.0.5", "10.1.0.7"), ""},
	{"network update", network("net1", 100, "10.1.0.0/16"), ""},
	{"trace", trace("t1", "web-a", "web-a2", ""), `trace "default/t1": spec.destination "web-a2" names no Endpoint in tenant "default", namespace "default"`},
	{"trace to an address", trace("t1", "web-a", "", "10.9.0.1"), ""},
	{"trace from nowhere", trace("t1", "web-z", "", "10.9.0.1"),
		`trace "default/t1": spec.source "web-z" names no Endpoint in tenant "default", namespace "default"`},
	{"trace other tenant", inTenant("t2", trace("t1", "web-a", "", "10.9.0.1")),
		`trace "t2/default/t1": spec.source "web-a" names no Endpoint in tenant "t2", namespace "default"`},
}

// trace returns a Trace of tcp to port 80 from the endpoint to the endpoint or address.
func trace(name, source, destination, address string) *nimbusv1.Object {
	return &nimbusv1.Object{
		Meta: &nimbusv1.ObjectMeta{Name: name},
		Spec: &nimbusv1.Object_Trace{Trace: &nimbusv1.TraceSpec{
			Source: source, Destination: destination, DestinationAddress: address, DestinationPort: 80,
		}},
	}
}

// TestApplyRefusesTraceFromNoNode checks that a Trace whose source endpoint is on no
// node is refused: no node would inject its packet.
func TestApplyRefusesTraceFromNoNode(t *testing.T) {
	t.Parallel()
	ts := startWithWebA(t, Options{})
	ts.apply(t, endpoint("nowhere", "net1", "", "", "02:00:00:00:01:0c", "10.1.0.9"))
	wantConflict(t, ts, trace("t1", "nowhere", "web-a", ""),
		`trace "default/t1": spec.source "nowhere" is on no node (its spec.node is empty): no node can inject the packet`)
}

// TestTraceTargetsItsNodes checks that a Trace without target nodes targets the nodes
// of its source and destination endpoints, the destination named or holding its
// address, and no others; that one with target nodes keeps them; and that applying the
// same Trace again changes nothing.
func TestTraceTargetsItsNodes(t *testing.T) {
	t.Parallel()
	ts := startWithWebA(t, Options{})
	ts.apply(t, endpoint("db-b", "net1", "host-b", "veth-b", "02:00:00:00:01:0b", "10.1.0.6"))
	ts.apply(t, endpoint("db-a", "net1", "host-a", "veth-c", "02:00:00:00:01:0c", "10.1.0.7"))
	ts.apply(t, endpoint("off", "net1", "", "", "02:00:00:00:01:0d", "10.1.0.8"))
	targeted := trace("t5", "web-a", "db-b", "")
	targeted.Meta.Nodes = []string{"host-c", "host-a"}
	for _, tc := range []struct {
		name string
		obj  *nimbusv1.Object
		want []string
	}{
		{"across", trace("t1", "web-a", "db-b", ""), []string{"host-a", "host-b"}},
		{"same node", trace("t2", "web-a", "db-a", ""), []string{"host-a"}},
		{"to an endpoint's address", trace("t3", "web-a", "", "10.1.0.6"), []string{"host-a", "host-b"}},
		{"to an address nobody holds", trace("t4", "web-a", "", "10.9.0.1"), []string{"host-a"}},
		{"to an endpoint on no node", trace("t6", "web-a", "off", ""), []string{"host-a"}},
		{"targeted", targeted, []string{"host-a", "host-c"}},
	} {
		resp := ts.apply(t, tc.obj)
		if got := resp.GetObject().GetMeta().GetNodes(); !slices.Equal(got, tc.want) {
			t.Errorf("%s: the Trace targets %q, want %q", tc.name, got, tc.want)
		}
		again := ts.apply(t, proto.CloneOf(tc.obj))
		if again.GetChanged() || again.GetObject().GetMeta().GetGeneration() != 1 {
			t.Errorf("%s: applied again, changed %v at generation %d; want unchanged at 1", tc.name, again.GetChanged(), again.GetObject().GetMeta().GetGeneration())
		}
		if got := ts.get(t, tc.obj.Key()).GetStatus().GetTargetNodes(); got != int32(len(tc.want)) {
			t.Errorf("%s: the status counts %d target nodes, want %d", tc.name, got, len(tc.want))
		}
	}
}

// startWithWebA starts a server holding net1, web-a and eth1 (see conflictCases).
func startWithWebA(t *testing.T, opts Options) *testServer {
	ts := start(t, opts)
	for _, obj := range []*nimbusv1.Object{network("net1", 100, "10.1.0.0/24"), webA(), hostInterface("eth1", "", "host-b")} {
		ts.apply(t, obj)
	}
	return ts
}

// TestApplyRefusesConflicts applies objects that take a value a stored object holds, and
// checks that Apply refuses them with FailedPrecondition naming both, stores nothing, and
// accepts what takes nothing.
func TestApplyRefusesConflicts(t *testing.T) {
	t.Parallel()
	for _, tc := range conflictCases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ts := startWithWebA(t, Options{})
			wantConflict(t, ts, tc.obj, tc.want)
		})
	}
}

// wantConflict applies obj and checks that it is refused with the message want and
// leaves the store as it was, or, with want "", that it is stored.
func wantConflict(t *testing.T, ts *testServer, obj *nimbusv1.Object, want string) {
	t.Helper()
	before, err := ts.client.List(testContext(t), &nimbusv1.ListRequest{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = ts.client.Apply(testContext(t), &nimbusv1.ApplyRequest{Object: obj})
	if want == "" {
		if err != nil {
			t.Fatalf("Apply %s = %v, want it stored", obj.Key().ID(), err)
		}
		return
	}
	st := wantCode(t, err, codes.FailedPrecondition)
	if st.Message() != want {
		t.Fatalf("Apply %s refused with\n%s\nwant\n%s", obj.Key().ID(), st.Message(), want)
	}
	after, err := ts.client.List(testContext(t), &nimbusv1.ListRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if after.GetRevision() != before.GetRevision() || len(after.GetItems()) != len(before.GetItems()) {
		t.Fatalf("after the refusal: %d objects at revision %d, want %d at %d", len(after.GetItems()), after.GetRevision(),
			len(before.GetItems()), before.GetRevision())
	}
}

// withGateway gives the network's subnet i the gateway address.
func withGateway(obj *nimbusv1.Object, i int, gateway string) *nimbusv1.Object {
	obj.GetNetwork().Subnets[i].Gateway = gateway
	return obj
}

// TestApplyRefusesGatewayAddress checks that an endpoint may not take an address its
// network's gateway has, which every node of the network holds on its bridge, nor a
// network take a gateway address an endpoint of it holds, both ways as other conflicts.
func TestApplyRefusesGatewayAddress(t *testing.T) {
	t.Parallel()
	ts := startWithWebA(t, Options{})
	ts.apply(t, withGateway(network("net5", 500, "10.5.0.0/24", "fd05::/64"), 1, "fd05::1"))
	short := &nimbusv1.Object{Meta: &nimbusv1.ObjectMeta{Name: "net6"}, Spec: &nimbusv1.Object_Network{
		Network: &nimbusv1.NetworkSpec{Vni: 600, Subnet: "10.6.0.0/24", Gateway: "10.6.0.1"}}}
	ts.apply(t, short)
	wantConflict(t, ts, endpoint("aaa", "net5", "host-b", "veth-b", "02:00:00:00:05:0b", "10.5.0.7", "fd05::1"),
		`endpoint "default/aaa": spec.ips "fd05::1" is the gateway address of network "net5", which every node of it holds`)
	wantConflict(t, ts, endpoint("aaa", "net6", "host-b", "veth-b", "02:00:00:00:06:0b", "10.6.0.1"),
		`endpoint "default/aaa": spec.ips "10.6.0.1" is the gateway address of network "net6", which every node of it holds`)
	wantConflict(t, ts, withGateway(network("net1", 100, "10.1.0.0/24"), 0, "10.1.0.5"),
		`network "default/net1": spec.subnets[0].gateway "10.1.0.5" is the address of endpoint "default/web-a"`)
	wantConflict(t, ts, endpoint("aaa", "net5", "host-b", "veth-b", "02:00:00:00:05:0b", "10.5.0.7", "fd05::2"), "")
	wantConflict(t, ts, withGateway(network("net1", 100, "10.1.0.0/24"), 0, "10.1.0.1"), "")
}

// TestApplyRefusesReservedAddress: an endpoint may not take its IPv4 subnet's network or
// broadcast address, which no host holds, nor may a network make an endpoint's address
// one of those; a /31 has neither, and IPv6 has no broadcast.
func TestApplyRefusesReservedAddress(t *testing.T) {
	t.Parallel()
	ts := startWithWebA(t, Options{})
	ts.apply(t, network("net5", 500, "10.5.0.0/24", "10.55.0.0/31", "fd05::/64"))
	wantConflict(t, ts, endpoint("aaa", "net5", "host-b", "veth-b", "02:00:00:00:05:0b", "10.5.0.0"),
		`endpoint "default/aaa": spec.ips "10.5.0.0" is the network address of subnet 10.5.0.0/24 of network "net5"; an endpoint needs a host address`)
	wantConflict(t, ts, endpoint("aaa", "net5", "host-b", "veth-b", "02:00:00:00:05:0b", "10.5.0.255"),
		`endpoint "default/aaa": spec.ips "10.5.0.255" is the broadcast address of subnet 10.5.0.0/24 of network "net5"; an endpoint needs a host address`)
	wantConflict(t, ts, endpoint("aaa", "net5", "host-b", "veth-b", "02:00:00:00:05:0b", "10.5.0.128", "10.55.0.0", "10.55.0.1", "fd05::"), "")

	// A network whose subnets make the endpoint's 10.5.0.128 a network address is refused.
	wantConflict(t, ts, network("net5", 500, "10.5.0.128/25", "10.55.0.0/31", "fd05::/64"),
		`network "default/net5": spec.subnets "10.5.0.128/25, 10.55.0.0/31, fd05::/64" makes address "10.5.0.128" of endpoint "default/aaa" the network address of 10.5.0.128/25`)
}

// TestApplyRefusesSharedVTEP: two nodes may not share a VTEP address, in any of its
// spellings, or the other nodes would tunnel both nodes' traffic to one host; a node
// keeps its own, and one that moves frees it for another in the same batch.
func TestApplyRefusesSharedVTEP(t *testing.T) {
	t.Parallel()
	ts := start(t, Options{})
	node := func(name, vtep string) *nimbusv1.Object {
		return &nimbusv1.Object{Meta: &nimbusv1.ObjectMeta{Name: name}, Spec: &nimbusv1.Object_Node{Node: &nimbusv1.NodeSpec{VtepAddress: vtep}}}
	}
	ts.apply(t, node("n1", "192.0.2.10"))
	want := `node "default/n2": spec.vtepAddress "%s" is already used by node "default/n1"; tunnels to both nodes would reach one host`
	wantConflict(t, ts, node("n2", "192.0.2.10"), fmt.Sprintf(want, "192.0.2.10"))
	wantConflict(t, ts, node("n2", "::ffff:192.0.2.10"), fmt.Sprintf(want, "::ffff:192.0.2.10"))
	wantConflict(t, ts, node("n1", "192.0.2.10"), "") // its own
	wantConflict(t, ts, node("n2", "192.0.2.20"), "")

	_, err := ts.client.ApplyBatch(testContext(t), &nimbusv1.ApplyBatchRequest{Objects: []*nimbusv1.Object{
		node("n1", "192.0.2.11"), node("n2", "192.0.2.10")}})
	if err != nil {
		t.Fatalf("a batch that moves n1 off 192.0.2.10 and n2 onto it: %v", err)
	}
	if _, err := ts.client.Delete(testContext(t), &nimbusv1.DeleteRequest{Key: nimbusv1.NewKey(nimbusv1.Kind_KIND_NODE, "", "", "n2")}); err != nil {
		t.Fatal(err)
	}
	wantConflict(t, ts, node("n3", "192.0.2.10"), "") // freed by the delete
}

// TestApplyConflictFreedByDelete checks that a value is free again once the object that
// held it is deleted, and that the endpoint of a network applied before it keeps the
// network from leaving its address out.
func TestApplyConflictFreedByDelete(t *testing.T) {
	t.Parallel()
	ts := startWithWebA(t, Options{})
	aaa := endpoint("aaa", "net1", "host-a", "veth-a", "02:00:00:00:01:0a", "10.1.0.5")
	wantConflict(t, ts, aaa, `endpoint "default/aaa": spec.interface "veth-a" is already used by endpoint "default/web-a" on node "host-a"`+"\n"+
		`endpoint "default/aaa": spec.mac "02:00:00:00:01:0a" is already used by endpoint "default/web-a" in network "net1"`+"\n"+
		`endpoint "default/aaa": spec.ips "10.1.0.5" is already used by endpoint "default/web-a" in network "net1"`)
	if _, err := ts.client.Delete(testContext(t), &nimbusv1.DeleteRequest{Key: webA().Key()}); err != nil {
		t.Fatal(err)
	}
	wantConflict(t, ts, aaa, "")

	// An endpoint applied before its network is accepted; the network that leaves its
	// address out is not.
	ts.apply(t, endpoint("early", "net3", "host-b", "veth-e", "02:00:00:00:03:01", "10.3.0.5"))
	wantConflict(t, ts, network("net3", 300, "10.4.0.0/24"),
		`network "default/net3": spec.subnets "10.4.0.0/24" leaves out address "10.3.0.5" of endpoint "default/early"`)
	wantConflict(t, ts, network("net3", 300, "10.3.0.0/24"), "")
}

// TestApplyBatchConflicts checks that a batch is checked in order against the store and
// its own earlier writes: one that frees a value and then takes it is stored, the same
// writes the other way round are refused whole, naming the entry by position.
func TestApplyBatchConflicts(t *testing.T) {
	t.Parallel()
	ts := startWithWebA(t, Options{})
	moved := endpoint("web-a", "net1", "host-a", "veth-a", "02:00:00:00:01:0a", "10.1.0.6")
	aaa := endpoint("aaa", "net1", "host-b", "veth-b", "02:00:00:00:01:0b", "10.1.0.5")
	before := ts.get(t, webA().Key()).GetObject()

	_, err := ts.client.ApplyBatch(testContext(t), &nimbusv1.ApplyBatchRequest{Objects: []*nimbusv1.Object{
		route("r1", nil, "192.0.2.1"), aaa, moved,
	}})
	st := wantCode(t, err, codes.FailedPrecondition)
	want := `objects[1] (Endpoint/default/default/aaa): endpoint "default/aaa": spec.ips "10.1.0.5" is already used by endpoint "default/web-a" in network "net1"`
	if st.Message() != want {
		t.Fatalf("ApplyBatch refused with\n%s\nwant\n%s", st.Message(), want)
	}
	if fields, _, _ := violations(t, st); len(fields) != 1 || fields[0] != "objects[1].spec.ips" {
		t.Errorf("violations of fields %q, want objects[1].spec.ips", fields)
	}
	if got := ts.get(t, webA().Key()).GetObject(); !proto.Equal(got, before) {
		t.Fatalf("web-a after a refused batch = %v, want it unchanged", got)
	}
	if _, err := ts.client.Get(testContext(t), &nimbusv1.GetRequest{Key: routeKey("r1")}); err == nil {
		t.Fatal("r1 of the refused batch is stored")
	}

	resp, err := ts.client.ApplyBatch(testContext(t), &nimbusv1.ApplyBatchRequest{Objects: []*nimbusv1.Object{moved, aaa}})
	if err != nil {
		t.Fatalf("ApplyBatch moving web-a's address to aaa: %v", err)
	}
	if !resp.GetResults()[1].GetCreated() {
		t.Fatal("aaa not created")
	}
	// web-a's old address now belongs to aaa.
	wantConflict(t, ts, webA(), `endpoint "default/web-a": spec.ips "10.1.0.5" is already used by endpoint "default/aaa" in network "net1"`)
}

// TestConflictIndexSurvivesRestart checks that a durable server started again refuses
// what the objects it loaded hold.
func TestConflictIndexSurvivesRestart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ts := startWithWebA(t, Options{DataDir: dir})
	if err := ts.srv.Close(); err != nil {
		t.Fatal(err)
	}
	again := start(t, Options{DataDir: dir})
	wantConflict(t, again, conflictCases[0].obj, conflictCases[0].want)
}

// TestEtcdRefusesConflicts checks that the etcd store refuses conflicts too, also when a
// replica checks against what another one wrote, and a batch split into several etcd
// transactions whose conflict is in its last one commits nothing.
func TestEtcdRefusesConflicts(t *testing.T) {
	c := cluster(t)
	a := startReplica(t, c.Endpoints(), testPrefix(t), true, Options{Etcd: &EtcdOptions{MaxTxnOps: 2}})
	b := startReplica(t, c.Endpoints(), testPrefix(t), true, Options{})
	var rev uint64
	for _, obj := range []*nimbusv1.Object{network("net1", 100, "10.1.0.0/24"), webA(), hostInterface("eth1", "", "host-b")} {
		rev = a.apply(t, obj).GetObject().GetMeta().GetRevision()
	}
	waitRev(t, b, rev)
	for _, tc := range conflictCases {
		if tc.want == "" {
			continue
		}
		_, err := b.client.Apply(testContext(t), &nimbusv1.ApplyRequest{Object: tc.obj})
		if st := wantCode(t, err, codes.FailedPrecondition); st.Message() != tc.want {
			t.Errorf("%s: Apply through the other replica refused with\n%s\nwant\n%s", tc.name, st.Message(), tc.want)
		}
	}
	var objs []*nimbusv1.Object
	for i := range 5 {
		objs = append(objs, route(fmt.Sprintf("r%d", i), nil, "192.0.2.1"))
	}
	objs = append(objs, conflictCases[0].obj)
	_, err := a.client.ApplyBatch(testContext(t), &nimbusv1.ApplyBatchRequest{Objects: objs})
	want := "objects[5] (Endpoint/default/default/aaa): " + conflictCases[0].want
	st := wantCode(t, err, codes.FailedPrecondition)
	if st.Message() != want {
		t.Fatalf("ApplyBatch of 3 transactions refused with\n%s\nwant\n%s", st.Message(), want)
	}
	if fields, _, _ := violations(t, st); len(fields) != 1 || !strings.HasPrefix(fields[0], "objects[5].spec.") {
		t.Errorf("violations of fields %q, want one of objects[5].spec", fields)
	}
	list, err := a.client.List(testContext(t), &nimbusv1.ListRequest{Kind: nimbusv1.Kind_KIND_ROUTE})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.GetItems()) != 0 {
		t.Fatalf("%d routes of the refused batch are stored", len(list.GetItems()))
	}
}

// TestConflictRefusesOneBatchOfAGroup commits, in one shared commit as concurrent calls
// make, a batch that conflicts between two that do not: the conflicting one is refused
// and leaves nothing, the others are stored, each change with its own revision.
func TestConflictRefusesOneBatchOfAGroup(t *testing.T) {
	t.Parallel()
	ts := startWithWebA(t, Options{})
	before, err := ts.client.List(testContext(t), &nimbusv1.ListRequest{})
	if err != nil {
		t.Fatal(err)
	}
	rev := before.GetRevision()
	first := &batch{writes: []write{applyWrite(route("r1", nil, "192.0.2.1"), false)}}
	refused := &batch{writes: []write{applyWrite(route("r2", nil, "192.0.2.1"), false), applyWrite(conflictCases[0].obj, false)}, positions: true}
	last := &batch{writes: []write{applyWrite(endpoint("aab", "net1", "host-b", "veth-b", "02:00:00:00:01:0b", "10.1.0.6"), false)}}
	group := []*batch{first, refused, last}
	for _, b := range group {
		b.done = make(chan struct{})
	}
	ts.srv.commitGroup(group)
	if first.err != nil || last.err != nil {
		t.Fatalf("the batches without a conflict failed: %v, %v", first.err, last.err)
	}
	want := "objects[1] (Endpoint/default/default/aaa): " + conflictCases[0].want
	if refused.err == nil || refused.err.Error() != want {
		t.Fatalf("the conflicting batch: %v, want %s", refused.err, want)
	}
	if first.rev != rev+1 || last.rev != rev+2 {
		t.Errorf("revisions of the stored batches %d and %d, want %d and %d", first.rev, last.rev, rev+1, rev+2)
	}
	list, err := ts.client.List(testContext(t), &nimbusv1.ListRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, it := range list.GetItems() {
		names = append(names, it.GetObject().GetMeta().GetName())
	}
	if got := fmt.Sprint(names); got != "[aab web-a eth1 net1 r1]" || list.GetRevision() != rev+2 {
		t.Errorf("stored %s at revision %d, want [aab web-a eth1 net1 r1] at %d", got, list.GetRevision(), rev+2)
	}
}
