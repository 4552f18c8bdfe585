package linux

import (
	"context"
	"errors"
	"maps"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/vishvananda/netns"
	"google.golang.org/protobuf/proto"

	"github.com/naplesnet/naples/delphi"
	"github.com/naplesnet/naples/hal"
	"github.com/naplesnet/naples/internal/testns"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// epIndexes returns the indexes a store for the endpoint reconciler declares: Indexes
// and the endpoint reconciler's own, unless Indexes lists them already.
func epIndexes() []delphi.Index {
	idx := Indexes()
	for _, x := range []delphi.Index{EndpointMACIndex, EndpointIPIndex} {
		if !slices.ContainsFunc(idx, func(i delphi.Index) bool { return i.Name == x.Name }) {
			idx = append(idx, x)
		}
	}
	return idx
}

// epHost is a test host for the endpoint reconciler: a fresh namespace, a delphi store
// and a reconciler for the host's node.
type epHost struct {
	testStore
	ns   string
	nsh  netns.NsHandle
	node string
	rec  *EndpointReconciler
}

func newEPHost(t testing.TB, prefix, node string) *epHost {
	t.Helper()
	ns := testns.Named(t, prefix)
	h := &epHost{testStore: newTestStore(t, epIndexes()), ns: ns, nsh: testns.Handle(t, ns), node: node}
	h.rec = h.newReconciler(t)
	return h
}

// newReconciler returns a new reconciler for the host, as a restarted agent makes.
func (h *epHost) newReconciler(t testing.TB) *EndpointReconciler {
	t.Helper()
	rec, err := NewEndpointReconciler(EndpointOptions{Store: h.store, Node: h.node, Namespace: &h.nsh, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rec.Close() })
	return rec
}

// run runs ip(8) or bridge(8) in the host's namespace.
func (h *epHost) run(t testing.TB, cmd string, args ...string) string {
	t.Helper()
	return testns.Run(t, cmd, append([]string{"-n", h.ns}, args...)...)
}

// networkDevices creates the bridge and VXLAN device of the network with the key ID as
// the network reconciler does: named BridgeName and VXLANName, marked with OwnerAlias,
// VXLAN learning off, and as a bridge port learning off and neigh_suppress on.
func (h *epHost) networkDevices(t testing.TB, networkID, vni, local string) {
	t.Helper()
	br, vx, alias := BridgeName(networkID), VXLANName(networkID), OwnerAlias(networkID)
	for _, args := range [][]string{
		{"link", "add", br, "type", "bridge"},
		{"link", "set", br, "alias", alias, "address", GatewayMAC(networkID).String()},
		{"link", "add", vx, "type", "vxlan", "id", vni, "local", local, "dstport", "4789", "nolearning"},
		{"link", "set", vx, "alias", alias, "master", br},
		{"link", "set", vx, "up"},
		{"link", "set", br, "up"},
	} {
		h.run(t, "ip", args...)
	}
	h.run(t, "bridge", "link", "set", "dev", vx, "learning", "off", "neigh_suppress", "on")
}

// reconcileWith runs rec the way the HAL does: with the object delphi holds now.
func (h *epHost) reconcileWith(rec *EndpointReconciler, key *nimbusv1.ObjectKey) (*nimbusv1.OperationalData, error) {
	return h.reconcileStored(rec, key)
}

// reconcile runs the host's reconciler on key and fails the test when it fails.
func (h *epHost) reconcile(t *testing.T, key *nimbusv1.ObjectKey) *nimbusv1.OperationalData {
	t.Helper()
	op, err := h.reconcileWith(h.rec, key)
	if err != nil {
		t.Fatalf("reconcile %s: %v", key.ID(), err)
	}
	return op
}

// observe runs rec's observer until the test ends and returns once it is subscribed. The
// keys it enqueues arrive on the returned channel.
func (h *epHost) observe(t *testing.T, rec *EndpointReconciler) <-chan string {
	t.Helper()
	return runObserver(t, rec)
}

// epNextEnqueued returns the next key the observer enqueues.
func epNextEnqueued(t *testing.T, enqueued <-chan string, what string) string {
	t.Helper()
	return nextEnqueued(t, enqueued, what)
}

// epAwaitEnqueued waits until the observer enqueues id.
func epAwaitEnqueued(t *testing.T, enqueued <-chan string, id, what string) {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		select {
		case got := <-enqueued:
			if got == id {
				return
			}
		case <-deadline:
			t.Fatalf("timed out waiting for the observer to enqueue %s after %s", id, what)
		}
	}
}

// fdb returns `bridge fdb show dev DEV`.
func (h *epHost) fdb(t *testing.T, dev string) string {
	t.Helper()
	return h.run(t, "bridge", "fdb", "show", "dev", dev)
}

// neighbours returns `ip -4 neigh show dev DEV` and `ip -6 neigh show dev DEV`, together.
func (h *epHost) neighbours(t *testing.T, dev string) string {
	t.Helper()
	return h.run(t, "ip", "-4", "neigh", "show", "dev", dev) + h.run(t, "ip", "-6", "neigh", "show", "dev", dev)
}

func epNetwork(name, vni string, mtu uint32, subnets ...string) *nimbusv1.Object {
	spec := &nimbusv1.NetworkSpec{Mtu: mtu}
	for _, s := range subnets {
		spec.Subnets = append(spec.Subnets, &nimbusv1.Subnet{Cidr: s})
	}
	for _, c := range vni {
		spec.Vni = spec.Vni*10 + uint32(c-'0')
	}
	return &nimbusv1.Object{Meta: &nimbusv1.ObjectMeta{Name: name, Generation: 1}, Spec: &nimbusv1.Object_Network{Network: spec}}
}

func epNode(name, vtep string) *nimbusv1.Object {
	return &nimbusv1.Object{Meta: &nimbusv1.ObjectMeta{Name: name, Generation: 1}, Spec: &nimbusv1.Object_Node{Node: &nimbusv1.NodeSpec{VtepAddress: vtep}}}
}

func epEndpoint(name, network, node, iface, mac string, ips ...string) *nimbusv1.Object {
	return &nimbusv1.Object{
		Meta: &nimbusv1.ObjectMeta{Name: name, Generation: 1},
		Spec: &nimbusv1.Object_Endpoint{Endpoint: &nimbusv1.EndpointSpec{Network: network, Node: node, Interface: iface, Mac: mac, Ips: ips}},
	}
}

// epOverlay is a host with network net1 (VNI 100, 10.1.0.0/24 and 2001:db8:1::/64, its
// devices made), this host's node node-a and remote nodes node-b and node-c.
type epOverlay struct {
	*epHost
	net    *nimbusv1.Object
	netID  string
	br, vx string
}

func newEPOverlay(t *testing.T, mtu uint32) *epOverlay {
	t.Helper()
	h := newEPHost(t, "naples-ep", "node-a")
	o := &epOverlay{epHost: h, net: epNetwork("net1", "100", mtu, "10.1.0.0/24", "2001:db8:1::/64")}
	o.netID = o.net.Key().ID()
	o.br, o.vx = BridgeName(o.netID), VXLANName(o.netID)
	h.networkDevices(t, o.netID, "100", "192.0.2.1")
	h.put(t, o.net, epNode("node-a", "192.0.2.1"), epNode("node-b", "192.0.2.2"), epNode("node-c", "192.0.2.3"))
	return o
}

func TestEndpointRemoteLifecycle(t *testing.T) {
	o := newEPOverlay(t, 0)
	ep := epEndpoint("web", "net1", "node-b", "", "02:00:00:00:00:01", "10.1.0.5", "2001:db8:1::5")
	key := ep.Key()
	o.put(t, ep)

	op := o.reconcile(t, key)
	wantOp := &nimbusv1.EndpointOperational{Role: nimbusv1.NodeRole_NODE_ROLE_REMOTE, Bridge: o.br, Vtep: "192.0.2.2", Mac: "02:00:00:00:00:01"}
	if !proto.Equal(op.GetEndpoint(), wantOp) {
		t.Errorf("operational = %v, want %v", op, wantOp)
	}
	wantMap := map[string]string{"role": "remote", "bridge": o.br, "vtep": "192.0.2.2", "mac": "02:00:00:00:00:01"}
	if !maps.Equal(op.Map(), wantMap) {
		t.Errorf("operational map = %v, want %v", op.Map(), wantMap)
	}
	fdb := o.fdb(t, o.vx)
	for _, want := range []string{"02:00:00:00:00:01 dst 192.0.2.2 self static", "02:00:00:00:00:01 master " + o.br + " static"} {
		if !strings.Contains(fdb, want) {
			t.Errorf("bridge fdb show dev %s lacks %q:\n%s", o.vx, want, fdb)
		}
	}
	neigh := o.neighbours(t, o.br)
	for _, want := range []string{"10.1.0.5 lladdr 02:00:00:00:00:01 PERMANENT", "2001:db8:1::5 lladdr 02:00:00:00:00:01 PERMANENT"} {
		if !strings.Contains(neigh, want) {
			t.Errorf("neighbours of %s lack %q:\n%s", o.br, want, neigh)
		}
	}
	if got := o.rec.KernelWrites(); got != 4 {
		t.Errorf("programming one MAC and two addresses wrote %d kernel objects, want 4", got)
	}
	writes := o.rec.KernelWrites()
	o.reconcile(t, key)
	if got := o.rec.KernelWrites() - writes; got != 0 {
		t.Errorf("reconciling an unchanged endpoint wrote %d kernel objects", got)
	}

	// A new MAC: the old one's entries go, the neighbours point at the new one.
	o.put(t, epEndpoint("web", "net1", "node-b", "", "02:00:00:00:00:02", "10.1.0.5", "2001:db8:1::5"))
	o.reconcile(t, key)
	if fdb := o.fdb(t, o.vx); strings.Contains(fdb, "02:00:00:00:00:01") || !strings.Contains(fdb, "02:00:00:00:00:02 dst 192.0.2.2 self static") ||
		!strings.Contains(fdb, "02:00:00:00:00:02 master "+o.br+" static") {
		t.Errorf("after the MAC changed, bridge fdb show dev %s:\n%s", o.vx, fdb)
	}
	if neigh := o.neighbours(t, o.br); strings.Contains(neigh, "02:00:00:00:00:01") || strings.Count(neigh, "lladdr 02:00:00:00:00:02 PERMANENT") != 2 {
		t.Errorf("after the MAC changed, neighbours of %s:\n%s", o.br, neigh)
	}

	// Other addresses: the old neighbours go.
	o.put(t, epEndpoint("web", "net1", "node-b", "", "02:00:00:00:00:02", "10.1.0.6"))
	o.reconcile(t, key)
	if neigh := o.neighbours(t, o.br); strings.Contains(neigh, "10.1.0.5") || strings.Contains(neigh, "2001:db8:1::5") || !strings.Contains(neigh, "10.1.0.6 lladdr 02:00:00:00:00:02 PERMANENT") {
		t.Errorf("after the addresses changed, neighbours of %s:\n%s", o.br, neigh)
	}

	// Another node: the tunnel leads there.
	o.put(t, epEndpoint("web", "net1", "node-c", "", "02:00:00:00:00:02", "10.1.0.6"))
	o.reconcile(t, key)
	if fdb := o.fdb(t, o.vx); !strings.Contains(fdb, "02:00:00:00:00:02 dst 192.0.2.3 self static") || strings.Contains(fdb, "192.0.2.2") {
		t.Errorf("after the node changed, bridge fdb show dev %s:\n%s", o.vx, fdb)
	}

	// The node's VTEP moves: the HAL reconciles the endpoints on it.
	if deps := o.rec.DependentsOf(NodeKey("node-c").Key()); !slices.Equal(deps, []nimbusv1.Key{key.Key()}) {
		t.Errorf("DependentsOf(node-c) = %v, want [%s]", deps, key.ID())
	}
	if deps := o.rec.DependentsOf(mustKey(t, o.netID)); !slices.Equal(deps, []nimbusv1.Key{key.Key()}) {
		t.Errorf("DependentsOf(%s) = %v, want [%s]", o.netID, deps, key.ID())
	}
	o.put(t, epNode("node-c", "192.0.2.33"))
	op = o.reconcile(t, key)
	if fdb := o.fdb(t, o.vx); !strings.Contains(fdb, "02:00:00:00:00:02 dst 192.0.2.33 self static") || op.GetEndpoint().GetVtep() != "192.0.2.33" {
		t.Errorf("after the VTEP moved, operational %v, bridge fdb show dev %s:\n%s", op, o.vx, fdb)
	}

	// Deleted: nothing is left, and deleting again writes nothing.
	o.del(t, key)
	o.reconcile(t, key)
	if fdb := o.fdb(t, o.vx); strings.Contains(fdb, "02:00:00:00:00:0") {
		t.Errorf("after the delete, bridge fdb show dev %s:\n%s", o.vx, fdb)
	}
	if neigh := o.neighbours(t, o.br); strings.Contains(neigh, "PERMANENT") {
		t.Errorf("after the delete, neighbours of %s:\n%s", o.br, neigh)
	}
	writes = o.rec.KernelWrites()
	o.reconcile(t, key)
	if got := o.rec.KernelWrites() - writes; got != 0 {
		t.Errorf("deleting again wrote %d kernel objects", got)
	}
}

// epLinkFlags matches the flags of `ip link show`, "<BROADCAST,MULTICAST,UP,LOWER_UP>".
var epLinkFlags = regexp.MustCompile(`<([A-Z_,-]*)>`)

// epIsUp tells whether `ip link show` output says the link is administratively up.
func epIsUp(show string) bool {
	m := epLinkFlags.FindStringSubmatch(show)
	return m != nil && slices.Contains(strings.Split(m[1], ","), "UP")
}

func TestEndpointLocalAttach(t *testing.T) {
	o := newEPOverlay(t, 1400)
	ep := epEndpoint("db", "net1", "node-a", "wl1", "02:00:00:00:0a:01", "10.1.0.10")
	key := ep.Key()
	o.put(t, ep)
	enqueued := o.observe(t, o.rec)

	// No interface yet: pending, naming it.
	_, err := o.reconcileWith(o.rec, key)
	if !hal.IsPending(err) || hal.ReasonOf(err) != ReasonWaitingForInterface || !strings.Contains(err.Error(), `"wl1"`) {
		t.Fatalf("reconcile without the interface: %v, want pending %s naming \"wl1\"", err, ReasonWaitingForInterface)
	}

	// A runtime creates the interface under another name and renames it, as CNI plugins
	// do: the observer enqueues the endpoint.
	o.run(t, "ip", "link", "add", "tmp0", "type", "veth", "peer", "name", "wl1p")
	o.run(t, "ip", "link", "set", "tmp0", "name", "wl1")
	epAwaitEnqueued(t, enqueued, key.ID(), "interface wl1 appeared")

	op := o.reconcile(t, key)
	wantOp := &nimbusv1.EndpointOperational{Role: nimbusv1.NodeRole_NODE_ROLE_LOCAL, Bridge: o.br, Interface: "wl1"}
	if !proto.Equal(op.GetEndpoint(), wantOp) {
		t.Errorf("operational = %v, want %v", op, wantOp)
	}
	wantMap := map[string]string{"role": "local", "bridge": o.br, "interface": "wl1"}
	if !maps.Equal(op.Map(), wantMap) {
		t.Errorf("operational map = %v, want %v", op.Map(), wantMap)
	}
	show := o.run(t, "ip", "link", "show", "wl1")
	if !strings.Contains(show, " master "+o.br+" ") || !strings.Contains(show, " mtu 1400 ") || !epIsUp(show) {
		t.Errorf("ip link show wl1, want master %s, mtu 1400, UP:\n%s", o.br, show)
	}
	if fdb := o.fdb(t, o.vx); strings.Contains(fdb, "02:00:00:00:0a:01") {
		t.Errorf("a local endpoint's MAC is on the VXLAN device:\n%s", fdb)
	}
	if fdb := o.fdb(t, "wl1"); !strings.Contains(fdb, "02:00:00:00:0a:01 master "+o.br+" static") {
		t.Errorf("bridge fdb show dev wl1 lacks the endpoint's static entry:\n%s", fdb)
	}
	if epLearning(t, o.epHost, "wl1") {
		t.Errorf("ip -d link show wl1: learning on, want off")
	}
	writes := o.rec.KernelWrites()
	o.reconcile(t, key)
	if got := o.rec.KernelWrites() - writes; got != 0 {
		t.Errorf("reconciling an attached interface wrote %d kernel objects", got)
	}

	// Deleted: released, not deleted, with the MTU it had before.
	o.del(t, key)
	o.reconcile(t, key)
	show = o.run(t, "ip", "link", "show", "wl1")
	if strings.Contains(show, " master ") || !strings.Contains(show, " mtu 1500 ") {
		t.Errorf("after the delete, wl1 still has a master, or not its MTU of 1500:\n%s", show)
	}
}

// epLearning tells whether the bridge port dev learns, as `ip -d link show` says.
func epLearning(t *testing.T, h *epHost, dev string) bool {
	t.Helper()
	show := h.run(t, "ip", "-d", "link", "show", dev)
	if !strings.Contains(show, "bridge_slave") {
		t.Fatalf("%s is no bridge port:\n%s", dev, show)
	}
	return strings.Contains(show, " learning on ")
}

// TestEndpointFDBMoveRepaired moves the bridge's entries of a remote and a local
// endpoint's MAC to another port of the bridge, as a workload claiming another's MAC
// would, and turns learning back on on the local endpoint's port: the observer enqueues
// the owner of each, whose reconcile puts it back.
func TestEndpointFDBMoveRepaired(t *testing.T) {
	o := newEPOverlay(t, 0)
	o.run(t, "ip", "link", "add", "wl1", "type", "veth", "peer", "name", "wl1p")
	remote := epEndpoint("web", "net1", "node-b", "", "02:00:00:00:00:01", "10.1.0.5")
	local := epEndpoint("db", "net1", "node-a", "wl1", "02:00:00:00:0a:01", "10.1.0.10")
	o.put(t, remote, local)
	enqueued := o.observe(t, o.rec)
	for _, ep := range []*nimbusv1.Object{remote, local} {
		o.reconcile(t, ep.Key())
	}
	for _, drift := range []struct {
		what  string
		key   *nimbusv1.ObjectKey
		args  []string
		check func() string
	}{
		{"remote MAC moved to a local port", remote.Key(), []string{"bridge", "fdb", "replace", "02:00:00:00:00:01", "dev", "wl1", "master", "static"},
			func() string {
				if !strings.Contains(o.fdb(t, o.vx), "02:00:00:00:00:01 master "+o.br+" static") || strings.Contains(o.fdb(t, "wl1"), "02:00:00:00:00:01") {
					return o.fdb(t, o.vx) + o.fdb(t, "wl1")
				}
				return ""
			}},
		{"local MAC moved to the VXLAN port", local.Key(), []string{"bridge", "fdb", "replace", "02:00:00:00:0a:01", "dev", o.vx, "master", "static"},
			func() string {
				if !strings.Contains(o.fdb(t, "wl1"), "02:00:00:00:0a:01 master "+o.br+" static") || strings.Contains(o.fdb(t, o.vx), "02:00:00:00:0a:01") {
					return o.fdb(t, o.vx) + o.fdb(t, "wl1")
				}
				return ""
			}},
		{"learning turned on (bridge link)", local.Key(), []string{"bridge", "link", "set", "dev", "wl1", "learning", "on"},
			func() string {
				if epLearning(t, o.epHost, "wl1") {
					return "learning on"
				}
				return ""
			}},
		{"learning turned on (ip link)", local.Key(), []string{"ip", "link", "set", "wl1", "type", "bridge_slave", "learning", "on"},
			func() string {
				if epLearning(t, o.epHost, "wl1") {
					return "learning on"
				}
				return ""
			}},
	} {
		o.run(t, drift.args[0], drift.args[1:]...)
		epAwaitEnqueued(t, enqueued, drift.key.ID(), drift.what)
		o.reconcile(t, drift.key)
		if bad := drift.check(); bad != "" {
			t.Errorf("after the %s, the reconcile did not repair it:\n%s", drift.what, bad)
		}
	}
	// Everything is back: reconciling writes nothing.
	writes := o.rec.KernelWrites()
	for _, ep := range []*nimbusv1.Object{remote, local} {
		o.reconcile(t, ep.Key())
	}
	if got := o.rec.KernelWrites() - writes; got != 0 {
		t.Errorf("reconciling after the repairs wrote %d kernel objects", got)
	}
}

func TestEndpointNotProgrammable(t *testing.T) {
	o := newEPOverlay(t, 0)
	good := epEndpoint("good", "net1", "node-b", "", "02:00:00:00:00:01", "10.1.0.5")
	o.put(t, good)
	o.observe(t, o.rec)
	for _, tt := range []struct {
		name    string
		ep      *nimbusv1.Object
		setup   func(t *testing.T)
		reason  string
		pending bool
		message string
	}{
		{name: "ip outside the subnets", ep: epEndpoint("bad", "net1", "node-b", "", "02:00:00:00:00:09", "10.1.0.9", "10.9.0.1"),
			reason: hal.ReasonInvalid, message: `spec.ips[1] "10.9.0.1": outside every subnet of ` + o.netID},
		{name: "no node", ep: epEndpoint("bad", "net1", "", "", "02:00:00:00:00:09"),
			reason: hal.ReasonInvalid, message: `spec.node ""`},
		{name: "remote without MAC", ep: epEndpoint("bad", "net1", "node-b", "", "", "10.1.0.9"),
			reason: hal.ReasonInvalid, message: `spec.mac ""`},
		{name: "local with ips without MAC", ep: epEndpoint("bad", "net1", "node-a", "wl9", "", "10.1.0.9"),
			reason: hal.ReasonInvalid, message: `spec.mac ""`},
		{name: "no network", ep: epEndpoint("bad", "net2", "node-b", "", "02:00:00:00:00:09"),
			reason: ReasonWaitingForNetwork, pending: true, message: "Network/default/default/net2: no such Network object"},
		{name: "no bridge", ep: epEndpoint("bad", "net3", "node-b", "", "02:00:00:00:00:09"),
			setup:  func(t *testing.T) { o.put(t, epNetwork("net3", "300", 0, "10.3.0.0/24")) },
			reason: ReasonWaitingForNetwork, pending: true, message: "its bridge " + BridgeName(nimbusv1.NewKey(nimbusv1.Kind_KIND_NETWORK, "", "", "net3").ID())},
		{name: "no node object", ep: epEndpoint("bad", "net1", "node-z", "", "02:00:00:00:00:09"),
			reason: ReasonWaitingForNode, pending: true, message: `"node-z"`},
		{name: "MAC of another endpoint", ep: epEndpoint("later", "net1", "node-c", "", "02:00:00:00:00:01"),
			reason: hal.ReasonConflict, message: good.Key().ID()},
		{name: "address of another endpoint", ep: epEndpoint("later", "net1", "node-c", "", "02:00:00:00:00:09", "10.1.0.5"),
			reason: hal.ReasonConflict, message: good.Key().ID()},
		{name: "interface on a foreign bridge", ep: epEndpoint("bad", "net1", "node-a", "wl9", "02:00:00:00:00:09"),
			setup: func(t *testing.T) {
				o.run(t, "ip", "link", "add", "foreign0", "type", "bridge")
				o.run(t, "ip", "link", "add", "wl9", "master", "foreign0", "type", "veth", "peer", "name", "wl9p")
				waitFor(t, "the mirror to show wl9 on foreign0", func() bool {
					_, l, ok := o.rec.links.byName("wl9")
					return ok && l.master != 0
				})
			},
			reason: hal.ReasonConflict, message: `interface "wl9" is attached to "foreign0"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if tt.setup != nil {
				tt.setup(t)
			}
			o.put(t, tt.ep)
			o.reconcile(t, good.Key())
			_, err := o.reconcileWith(o.rec, tt.ep.Key())
			if err == nil || hal.ReasonOf(err) != tt.reason || hal.IsPending(err) != tt.pending || !strings.Contains(err.Error(), tt.message) {
				t.Errorf("reconcile: %v (reason %s, pending %v), want reason %s, pending %v, message with %q",
					err, hal.ReasonOf(err), hal.IsPending(err), tt.reason, tt.pending, tt.message)
			}
			// The endpoint programs nothing; the other one stays as it was.
			fdb := o.fdb(t, o.vx)
			if strings.Contains(fdb, "02:00:00:00:00:09") || !strings.Contains(fdb, "02:00:00:00:00:01 dst 192.0.2.2 self static") {
				t.Errorf("bridge fdb show dev %s:\n%s", o.vx, fdb)
			}
			if neigh := o.neighbours(t, o.br); strings.Contains(neigh, "10.1.0.9") || !strings.Contains(neigh, "10.1.0.5 lladdr 02:00:00:00:00:01 PERMANENT") {
				t.Errorf("neighbours of %s:\n%s", o.br, neigh)
			}
			o.del(t, tt.ep.Key())
			o.reconcile(t, tt.ep.Key())
		})
	}
	if show := o.run(t, "ip", "link", "show", "wl9"); !strings.Contains(show, "master foreign0") {
		t.Errorf("an interface on a foreign bridge was moved:\n%s", show)
	}
}

func TestEndpointConflictResolvesWhenOwnerGoes(t *testing.T) {
	o := newEPOverlay(t, 0)
	first := epEndpoint("a", "net1", "node-b", "", "02:00:00:00:00:01", "10.1.0.5")
	second := epEndpoint("b", "net1", "node-c", "", "02:00:00:00:00:01", "10.1.0.5")
	o.put(t, first, second)
	o.reconcile(t, first.Key())
	if _, err := o.reconcileWith(o.rec, second.Key()); hal.ReasonOf(err) != hal.ReasonConflict {
		t.Fatalf("reconcile of the second claimant: %v, want Conflict", err)
	}
	if fdb := o.fdb(t, o.vx); !strings.Contains(fdb, "02:00:00:00:00:01 dst 192.0.2.2 self static") {
		t.Errorf("the first claimant's entry was changed:\n%s", fdb)
	}
	// The owner goes: its removal hands the entries to the next claimant, and the
	// next claimant's reconcile succeeds.
	o.del(t, first.Key())
	o.reconcile(t, first.Key())
	if fdb := o.fdb(t, o.vx); !strings.Contains(fdb, "02:00:00:00:00:01 dst 192.0.2.3 self static") {
		t.Errorf("after the owner went, bridge fdb show dev %s:\n%s", o.vx, fdb)
	}
	o.reconcile(t, second.Key())
	if neigh := o.neighbours(t, o.br); !strings.Contains(neigh, "10.1.0.5 lladdr 02:00:00:00:00:01 PERMANENT") {
		t.Errorf("neighbours of %s:\n%s", o.br, neigh)
	}
}

func TestEndpointObserverRepairsDrift(t *testing.T) {
	o := newEPOverlay(t, 0)
	o.run(t, "ip", "link", "add", "wl1", "type", "veth", "peer", "name", "wl1p")
	remote := epEndpoint("web", "net1", "node-b", "", "02:00:00:00:00:01", "10.1.0.5", "2001:db8:1::5")
	marker := epEndpoint("marker", "net1", "node-c", "", "02:00:00:00:00:02", "10.1.0.6")
	local := epEndpoint("db", "net1", "node-a", "wl1", "02:00:00:00:0a:01", "10.1.0.10")
	o.put(t, remote, marker, local)
	enqueued := o.observe(t, o.rec)
	for _, ep := range []*nimbusv1.Object{marker, remote, local} {
		o.reconcile(t, ep.Key())
	}
	// The echoes of the reconciler's own writes enqueue nothing: the first key enqueued
	// is the one whose entry someone else then deletes.
	o.run(t, "ip", "neigh", "del", "10.1.0.6", "dev", o.br)
	if got := epNextEnqueued(t, enqueued, "the marker"); got != marker.Key().ID() {
		t.Fatalf("after the reconciler's own writes and a deleted marker, enqueued %s first, want %s", got, marker.Key().ID())
	}

	for _, drift := range []struct {
		what  string
		key   *nimbusv1.ObjectKey
		args  []string
		check func() bool
	}{
		{"deleted VXLAN FDB entry", remote.Key(), []string{"bridge", "fdb", "del", "02:00:00:00:00:01", "dev", o.vx, "self"},
			func() bool { return strings.Contains(o.fdb(t, o.vx), "02:00:00:00:00:01 dst 192.0.2.2 self static") }},
		{"deleted bridge FDB entry", remote.Key(), []string{"bridge", "fdb", "del", "02:00:00:00:00:01", "dev", o.vx, "master"},
			func() bool { return strings.Contains(o.fdb(t, o.vx), "02:00:00:00:00:01 master "+o.br+" static") }},
		{"VXLAN FDB entry pointed elsewhere", remote.Key(), []string{"bridge", "fdb", "replace", "02:00:00:00:00:01", "dev", o.vx, "self", "static", "dst", "192.0.2.99"},
			func() bool { return strings.Contains(o.fdb(t, o.vx), "02:00:00:00:00:01 dst 192.0.2.2 self static") }},
		{"deleted neighbour", remote.Key(), []string{"ip", "-6", "neigh", "del", "2001:db8:1::5", "dev", o.br},
			func() bool {
				return strings.Contains(o.neighbours(t, o.br), "2001:db8:1::5 lladdr 02:00:00:00:00:01 PERMANENT")
			}},
		{"neighbour with another MAC", remote.Key(), []string{"ip", "neigh", "replace", "10.1.0.5", "lladdr", "02:00:00:00:00:99", "dev", o.br, "nud", "permanent"},
			func() bool {
				return strings.Contains(o.neighbours(t, o.br), "10.1.0.5 lladdr 02:00:00:00:00:01 PERMANENT")
			}},
		{"released interface", local.Key(), []string{"ip", "link", "set", "wl1", "nomaster"},
			func() bool { return strings.Contains(o.run(t, "ip", "link", "show", "wl1"), " master "+o.br+" ") }},
		{"interface set down", local.Key(), []string{"ip", "link", "set", "wl1", "down"},
			func() bool { return epIsUp(o.run(t, "ip", "link", "show", "wl1")) }},
	} {
		o.run(t, drift.args[0], drift.args[1:]...)
		// The key may be enqueued still from the repair before, by an event the observer
		// read before this drift's: each enqueue is followed by a reconcile until one
		// repairs it, and epAwaitEnqueued fails the test when no enqueue comes.
		for tries := 1; ; tries++ {
			epAwaitEnqueued(t, enqueued, drift.key.ID(), drift.what)
			o.reconcile(t, drift.key)
			if drift.check() {
				break
			}
			if tries == 5 {
				t.Errorf("after the %s, %d reconciles did not repair it:\n%s%s", drift.what, tries, o.fdb(t, o.vx), o.neighbours(t, o.br))
				break
			}
		}
	}
}

func TestEndpointSweepAfterRestart(t *testing.T) {
	o := newEPOverlay(t, 0)
	o.run(t, "ip", "link", "add", "wl3", "type", "veth", "peer", "name", "wl3p")
	kept := epEndpoint("kept", "net1", "node-b", "", "02:00:00:00:00:01", "10.1.0.1", "2001:db8:1::1")
	gone := epEndpoint("gone", "net1", "node-c", "", "02:00:00:00:00:02", "10.1.0.2")
	goneLocal := epEndpoint("gone-local", "net1", "node-a", "wl3", "02:00:00:00:0a:03", "10.1.0.3")
	o.put(t, kept, gone, goneLocal)
	for _, ep := range []*nimbusv1.Object{kept, gone, goneLocal} {
		o.reconcile(t, ep.Key())
	}
	// What others put there: a stale entry on our devices (ours to remove), the network's
	// head-end replication entry, and a foreign bridge with its port, a static entry and
	// a permanent neighbour (not ours).
	for _, args := range [][]string{
		{"bridge", "fdb", "add", "02:00:00:00:00:99", "dev", o.vx, "self", "static", "dst", "192.0.2.9"},
		{"bridge", "fdb", "add", "02:00:00:00:00:99", "dev", o.vx, "master", "static"},
		{"ip", "neigh", "add", "10.1.0.99", "lladdr", "02:00:00:00:00:99", "dev", o.br, "nud", "permanent"},
		{"bridge", "fdb", "append", "00:00:00:00:00:00", "dev", o.vx, "self", "permanent", "dst", "192.0.2.2"},
		{"ip", "link", "add", "foreign0", "type", "bridge"},
		{"ip", "link", "add", "fp0", "master", "foreign0", "type", "veth", "peer", "name", "fp0p"},
		{"bridge", "fdb", "add", "02:00:00:00:00:66", "dev", "fp0", "master", "static"},
		{"ip", "neigh", "add", "10.66.0.1", "lladdr", "02:00:00:00:00:66", "dev", "foreign0", "nud", "permanent"},
	} {
		o.run(t, args[0], args[1:]...)
	}

	// The agent restarts; meanwhile two endpoints were deleted.
	o.rec.Close()
	o.del(t, gone.Key(), goneLocal.Key())
	rec := o.newReconciler(t)
	var enqueued []string
	if err := rec.Sweep(context.Background(), func(key nimbusv1.Key) { enqueued = append(enqueued, key.String()) }); err != nil {
		t.Fatalf("Sweep: %v", err)
	}
	if len(enqueued) != 0 {
		t.Errorf("Sweep enqueued %v; nothing drifted", enqueued)
	}
	fdb := o.fdb(t, o.vx)
	for _, gone := range []string{"02:00:00:00:00:02", "02:00:00:00:00:99"} {
		if strings.Contains(fdb, gone) {
			t.Errorf("after the sweep, bridge fdb show dev %s still has %s:\n%s", o.vx, gone, fdb)
		}
	}
	for _, kept := range []string{"02:00:00:00:00:01 dst 192.0.2.2 self static", "02:00:00:00:00:01 master " + o.br + " static", "00:00:00:00:00:00 dst 192.0.2.2 self permanent"} {
		if !strings.Contains(fdb, kept) {
			t.Errorf("after the sweep, bridge fdb show dev %s lacks %q:\n%s", o.vx, kept, fdb)
		}
	}
	neigh := o.neighbours(t, o.br)
	if strings.Contains(neigh, "10.1.0.2 ") || strings.Contains(neigh, "10.1.0.99") || strings.Count(neigh, "lladdr 02:00:00:00:00:01 PERMANENT") != 2 {
		t.Errorf("after the sweep, neighbours of %s:\n%s", o.br, neigh)
	}
	if show := o.run(t, "ip", "link", "show", "wl3"); strings.Contains(show, " master ") {
		t.Errorf("after the sweep, wl3 is still attached:\n%s", show)
	}
	if !strings.Contains(o.run(t, "ip", "link", "show", "fp0"), "master foreign0") ||
		!strings.Contains(o.fdb(t, "fp0"), "02:00:00:00:00:66 master foreign0 static") ||
		!strings.Contains(o.neighbours(t, "foreign0"), "10.66.0.1 lladdr 02:00:00:00:00:66 PERMANENT") {
		t.Errorf("the sweep touched the foreign bridge, its port, entry or neighbour")
	}
	// Removed: gone's three entries, the stale MAC's two and its neighbour, gone-local's
	// MAC on wl3; released: wl3.
	if got := rec.KernelWrites(); got != 8 {
		t.Errorf("the sweep wrote %d kernel objects, want 8", got)
	}
	writes := rec.KernelWrites()
	if _, err := o.reconcileWith(rec, kept.Key()); err != nil {
		t.Fatal(err)
	}
	if got := rec.KernelWrites() - writes; got != 0 {
		t.Errorf("reconciling the adopted endpoint wrote %d kernel objects", got)
	}

	// Another restart with everything in place writes nothing at all.
	rec.Close()
	rec = o.newReconciler(t)
	if err := rec.Sweep(context.Background(), func(nimbusv1.Key) {}); err != nil {
		t.Fatal(err)
	}
	if _, err := o.reconcileWith(rec, kept.Key()); err != nil {
		t.Fatal(err)
	}
	if got := rec.KernelWrites(); got != 0 {
		t.Errorf("a restart with everything in place wrote %d kernel objects", got)
	}
}

func TestEndpointReconcileHonoursContext(t *testing.T) {
	o := newEPOverlay(t, 0)
	ep := epEndpoint("web", "net1", "node-b", "", "02:00:00:00:00:01", "10.1.0.5")
	o.put(t, ep)
	obj, _ := o.store.Get(ep.Key())
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	// Before the mirrors are loaded, and once they are.
	for _, when := range []string{"before the first dump", "after it"} {
		if _, err := o.rec.Reconcile(ctx, ep.Key(), obj); !errors.Is(err, context.Canceled) {
			t.Errorf("reconcile with an ended context %s: %v, want context.Canceled", when, err)
		}
		if err := o.rec.fill(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if fdb := o.fdb(t, o.vx); strings.Contains(fdb, "02:00:00:00:00:01") || o.rec.KernelWrites() != 0 {
		t.Errorf("a reconcile with an ended context wrote %d kernel objects:\n%s", o.rec.KernelWrites(), fdb)
	}
}

// TestEndpointHAL runs the whole HAL on the endpoint reconciler: endpoints wait for their
// network's devices, their interface and their node, and are programmed the moment these
// come.
func TestEndpointHAL(t *testing.T) {
	h := newEPHost(t, "naples-ep", "node-a")
	network := epNetwork("net1", "100", 0, "10.1.0.0/24")
	netID := network.Key().ID()
	local := epEndpoint("db", "net1", "node-a", "wl1", "02:00:00:00:0a:01", "10.1.0.10")
	remote := epEndpoint("web", "net1", "node-b", "", "02:00:00:00:00:01", "10.1.0.5")
	h.put(t, network, epNode("node-a", "192.0.2.1"), local, remote)

	runHAL(t, h.store, hal.Options{Reconcilers: []hal.Reconciler{h.rec}})
	pending := func(key *nimbusv1.ObjectKey, reason, message string) {
		t.Helper()
		waitStatus(t, h.store, key, func(s *nimbusv1.NodeStatus) bool {
			return s.GetPhase() == nimbusv1.Phase_PHASE_PENDING && s.GetReason() == reason && strings.Contains(s.GetMessage(), message)
		})
	}
	pending(local.Key(), ReasonWaitingForNetwork, netID)
	pending(remote.Key(), ReasonWaitingForNetwork, netID)

	// The network's devices come: the observer enqueues the network's endpoints.
	h.networkDevices(t, netID, "100", "192.0.2.1")
	pending(local.Key(), ReasonWaitingForInterface, `"wl1"`)
	pending(remote.Key(), ReasonWaitingForNode, `"node-b"`)

	// The interface and the node come.
	h.run(t, "ip", "link", "add", "wl1", "type", "veth", "peer", "name", "wl1p")
	h.put(t, epNode("node-b", "192.0.2.2"))
	st := waitStatus(t, h.store, local.Key(), func(s *nimbusv1.NodeStatus) bool { return s.GetPhase() == nimbusv1.Phase_PHASE_PROGRAMMED })
	if ep := st.GetOperationalData().GetEndpoint(); ep.GetInterface() != "wl1" || ep.GetRole() != nimbusv1.NodeRole_NODE_ROLE_LOCAL || st.GetOperational()["interface"] != "wl1" {
		t.Errorf("local endpoint's status: %v", st)
	}
	st = waitStatus(t, h.store, remote.Key(), func(s *nimbusv1.NodeStatus) bool { return s.GetPhase() == nimbusv1.Phase_PHASE_PROGRAMMED })
	if ep := st.GetOperationalData().GetEndpoint(); ep.GetVtep() != "192.0.2.2" || ep.GetRole() != nimbusv1.NodeRole_NODE_ROLE_REMOTE || st.GetOperational()["vtep"] != "192.0.2.2" {
		t.Errorf("remote endpoint's status: %v", st)
	}
	if show := h.run(t, "ip", "link", "show", "wl1"); !strings.Contains(show, " master "+BridgeName(netID)+" ") {
		t.Errorf("ip link show wl1:\n%s", show)
	}
	if fdb := h.run(t, "bridge", "fdb", "show", "dev", VXLANName(netID)); !strings.Contains(fdb, "02:00:00:00:00:01 dst 192.0.2.2 self static") {
		t.Errorf("bridge fdb show dev %s:\n%s", VXLANName(netID), fdb)
	}

	// Someone deletes the remote endpoint's neighbour: the HAL repairs it.
	h.run(t, "ip", "neigh", "del", "10.1.0.5", "dev", BridgeName(netID))
	waitFor(t, "the neighbour to be repaired", func() bool {
		return strings.Contains(h.run(t, "ip", "neigh", "show", "dev", BridgeName(netID)), "10.1.0.5 lladdr 02:00:00:00:00:01 PERMANENT")
	})

	// Someone moves the remote endpoint's bridge entry onto the local endpoint's port:
	// the HAL moves it back.
	h.run(t, "bridge", "fdb", "replace", "02:00:00:00:00:01", "dev", "wl1", "master", "static")
	waitFor(t, "the bridge entry to be moved back", func() bool {
		return strings.Contains(h.run(t, "bridge", "fdb", "show", "dev", VXLANName(netID)), "02:00:00:00:00:01 master "+BridgeName(netID)+" static") &&
			!strings.Contains(h.run(t, "bridge", "fdb", "show", "dev", "wl1"), "02:00:00:00:00:01")
	})
}

// TestEndpointFirstComeKeepsItsPlace runs the HAL with an endpoint programmed, then adds
// endpoints that claim what it holds and sort before it by name, as nimbus would refuse
// but two replicas might each accept: the running endpoint keeps its interface (or its
// address) and stays PROGRAMMED, even when reconciled again; the newcomer is FAILED with
// reason Conflict, naming it.
func TestEndpointFirstComeKeepsItsPlace(t *testing.T) {
	o := newEPOverlay(t, 0)
	o.run(t, "ip", "link", "add", "wla", "type", "veth", "peer", "name", "wlap")
	webA := epEndpoint("web-a", "net1", "node-a", "wla", "02:00:00:00:0a:01", "10.1.0.10")
	webB := epEndpoint("web-b", "net1", "node-b", "", "02:00:00:00:0b:01", "10.1.0.11")
	o.put(t, webA, webB)
	runHAL(t, o.store, hal.Options{Reconcilers: []hal.Reconciler{o.rec}})
	programmed := func(key *nimbusv1.ObjectKey, gen int64) {
		t.Helper()
		waitStatus(t, o.store, key, func(s *nimbusv1.NodeStatus) bool {
			return s.GetObservedGeneration() == gen && s.GetPhase() == nimbusv1.Phase_PHASE_PROGRAMMED
		})
	}
	programmed(webA.Key(), 1)
	programmed(webB.Key(), 1)

	aaa := epEndpoint("aaa", "net1", "node-a", "wla", "02:00:00:00:0a:02", "10.1.0.12")
	aab := epEndpoint("aab", "net1", "node-c", "", "02:00:00:00:0c:01", "10.1.0.11")
	o.put(t, aaa, aab)
	for _, tc := range []struct {
		newcomer *nimbusv1.Object
		message  string
	}{
		{aaa, `spec.interface "wla": ` + webA.Key().ID() + " has it on this node"},
		{aab, `spec.ips "10.1.0.11": ` + webB.Key().ID() + " has it in " + o.netID},
	} {
		st := waitStatus(t, o.store, tc.newcomer.Key(), func(s *nimbusv1.NodeStatus) bool { return s.GetPhase() != nimbusv1.Phase_PHASE_PENDING })
		if st.GetPhase() != nimbusv1.Phase_PHASE_FAILED || st.GetReason() != hal.ReasonConflict || st.GetMessage() != tc.message {
			t.Errorf("%s: %v %s %q, want FAILED Conflict %q", tc.newcomer.Key().ID(), st.GetPhase(), st.GetReason(), st.GetMessage(), tc.message)
		}
	}

	// Reconciled again, the running endpoints keep their place.
	for _, ep := range []*nimbusv1.Object{webA, webB} {
		ep = proto.Clone(ep).(*nimbusv1.Object)
		ep.Meta.Generation = 2
		o.put(t, ep)
		programmed(ep.Key(), 2)
	}
	if show := o.run(t, "ip", "link", "show", "wla"); !strings.Contains(show, " master "+o.br+" ") {
		t.Errorf("ip link show wla, want it on %s:\n%s", o.br, show)
	}
	if neigh := o.neighbours(t, o.br); !strings.Contains(neigh, "10.1.0.11 lladdr 02:00:00:00:0b:01 PERMANENT") {
		t.Errorf("neighbours of %s, want 10.1.0.11 at web-b's MAC:\n%s", o.br, neigh)
	}
	if fdb := o.fdb(t, o.vx); strings.Contains(fdb, "02:00:00:00:0c:01") {
		t.Errorf("the newcomer's MAC is on %s:\n%s", o.vx, fdb)
	}
}

// TestEntryHolders checks that the holders of a MAC's entries, an address's neighbour and
// an interface are kept apart, by network, and that the zero Key forgets one.
func TestEntryHolders(t *testing.T) {
	h := newEndpointTable()
	a := nimbusv1.MakeKey(nimbusv1.Kind_KIND_ENDPOINT, "", "", "a")
	b := nimbusv1.MakeKey(nimbusv1.Kind_KIND_ENDPOINT, "", "", "b")
	mac := endpointLock{network: "blue", mac: [6]byte{2, 0, 0, 0, 0, 1}}
	ip := endpointLock{network: "blue", ip: netip.MustParseAddr("10.64.0.1")}
	iface := endpointLock{iface: "wl1"}
	h.set(mac, a)
	h.set(ip, b)
	h.set(iface, a)
	for _, c := range []struct {
		entry endpointLock
		want  nimbusv1.Key
		held  bool
	}{
		{mac, a, true},
		{ip, b, true},
		{iface, a, true},
		{endpointLock{network: "red", mac: mac.mac}, nimbusv1.Key{}, false},
		{endpointLock{network: "red", ip: ip.ip}, nimbusv1.Key{}, false},
		{endpointLock{iface: "wl2"}, nimbusv1.Key{}, false},
	} {
		if got, held := h.get(c.entry); got != c.want || held != c.held {
			t.Errorf("get(%+v) = %v, %v; want %v, %v", c.entry, got, held, c.want, c.held)
		}
	}
	h.set(ip, nimbusv1.Key{})
	if _, held := h.get(ip); held {
		t.Error("the neighbour is still held after its holder was set to the zero Key")
	}
	if got, held := h.get(mac); got != a || !held {
		t.Errorf("forgetting the neighbour's holder changed the MAC's: %v, %v", got, held)
	}
	if h.records.Has(b) {
		t.Error("the table keeps a record of b, which holds and programmed nothing any more")
	}
	// Once none of blue's MACs and addresses is held, its number goes to the next network,
	// which finds none of blue's entries under it.
	h.set(mac, nimbusv1.Key{})
	if n := len(h.nets.byID); n != 0 {
		t.Errorf("the table numbers %d networks after the last entry went; want none", n)
	}
	red := endpointLock{network: "red", ip: ip.ip}
	h.set(red, b)
	if _, held := h.get(mac); held {
		t.Error("blue's MAC is held again after red took its number")
	}
	if got, held := h.get(red); got != b || !held {
		t.Errorf("get(%+v) = %v, %v; want %v, true", red, got, held, b)
	}
	if n := unsafe.Sizeof(ipHolder{}) + unsafe.Sizeof(macHolder{}); n != 36 {
		t.Errorf("an ipHolder and a macHolder take %d bytes; want 36, against %d for an ipRef and a macRef", n,
			unsafe.Sizeof(ipRef{})+unsafe.Sizeof(macRef{}))
	}
}

// TestEndpointTableRecords checks that an endpoint's record lasts while it programmed
// entries or holds one, and no longer, whichever of the two ends first.
func TestEndpointTableRecords(t *testing.T) {
	h := newEndpointTable()
	a := nimbusv1.MakeKey(nimbusv1.Kind_KIND_ENDPOINT, "", "", "a")
	b := nimbusv1.MakeKey(nimbusv1.Kind_KIND_ENDPOINT, "", "", "b")
	mac := endpointLock{network: "blue", mac: [6]byte{2, 0, 0, 0, 0, 1}}
	refs := endpointRefs{macs: []macRef{{"blue", mac.mac}}}
	h.setProgrammed(a, refs)
	h.set(mac, a)
	h.set(mac, a) // again: still one entry held
	h.setProgrammed(a, endpointRefs{})
	if got, held := h.get(mac); got != a || !held {
		t.Fatalf("a programmed nothing any more but holds the MAC: get = %v, %v", got, held)
	}
	if !h.programmed(a).empty() {
		t.Errorf("programmed(a) = %+v; want nothing", h.programmed(a))
	}
	h.set(mac, b) // b takes the entry over
	if h.records.Has(a) {
		t.Error("the table keeps a record of a, which holds and programmed nothing any more")
	}
	h.setProgrammed(b, refs)
	h.set(mac, nimbusv1.Key{})
	if got := h.programmed(b); !got.equal(refs) {
		t.Errorf("programmed(b) = %+v; want %+v", got, refs)
	}
	h.setProgrammed(b, endpointRefs{})
	if h.records.Len() != 0 || len(h.macs) != 0 {
		t.Errorf("the table keeps %d records and %d MACs' holders; want none", h.records.Len(), len(h.macs))
	}
}

// TestPackedRefs checks that an endpoint's entries come back from its record as they
// went in, whether they fit inline or not.
func TestPackedRefs(t *testing.T) {
	mac := [6]byte{2, 0, 0, 0, 0, 1}
	ip1, ip2 := netip.MustParseAddr("10.64.1.1"), netip.MustParseAddr("fd00::1")
	mapped, zoned := netip.MustParseAddr("::ffff:10.64.1.1"), netip.MustParseAddr("fe80::1%eth0")
	for _, tc := range []struct {
		name   string
		refs   endpointRefs
		inline bool
	}{
		{"none", endpointRefs{}, true},
		{"a MAC", endpointRefs{macs: []macRef{{"blue", mac}}}, true},
		{"a MAC and an address", endpointRefs{macs: []macRef{{"blue", mac}}, ips: []ipRef{{"blue", ip1}}}, true},
		{"an address alone", endpointRefs{ips: []ipRef{{"blue", ip2}}}, true},
		{"an IPv4-mapped address", endpointRefs{macs: []macRef{{"blue", mac}}, ips: []ipRef{{"blue", mapped}}}, true},
		{"an address with a zone", endpointRefs{macs: []macRef{{"blue", mac}}, ips: []ipRef{{"blue", zoned}}}, false},
		{"two addresses", endpointRefs{macs: []macRef{{"blue", mac}}, ips: []ipRef{{"blue", ip1}, {"blue", ip2}}}, false},
		{"two networks", endpointRefs{macs: []macRef{{"blue", mac}}, ips: []ipRef{{"red", ip1}}}, false},
		{"an interface", endpointRefs{ifaces: []string{"veth1"}, macs: []macRef{{"blue", mac}}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := packRefs(tc.refs)
			if got := p.unpack(); !got.equal(tc.refs) {
				t.Errorf("unpack(packRefs(%+v)) = %+v", tc.refs, got)
			}
			if inline := p.more == nil; inline != tc.inline {
				t.Errorf("packRefs(%+v) inline = %v, want %v", tc.refs, inline, tc.inline)
			}
			if p.empty() != tc.refs.empty() {
				t.Errorf("packRefs(%+v).empty() = %v", tc.refs, p.empty())
			}
		})
	}
	if n := unsafe.Sizeof(endpointRecord{}); n > 112 {
		t.Errorf("an endpointRecord takes %d bytes; want it to fit the 112-byte size class", n)
	}
}

// TestEPAddr checks that an epAddr gives back the address it was made of, zone aside,
// with its kind, and that the FDB and neighbour mirrors' keys and entries stay small.
func TestEPAddr(t *testing.T) {
	for _, s := range []string{"", "192.0.2.1", "0.0.0.0", "2001:db8::1", "::ffff:192.0.2.1", "::", "fe80::1%eth0"} {
		var a netip.Addr
		if s != "" {
			a = netip.MustParseAddr(s)
		}
		e := epAddrOf(a)
		if got := e.addr(); got != a.WithZone("") {
			t.Errorf("epAddrOf(%v).addr() = %v", a, got)
		}
		if e.valid() != a.IsValid() || e.is4() != a.Is4() || e.String() != a.WithZone("").String() {
			t.Errorf("epAddrOf(%v): valid %v, is4 %v, %q", a, e.valid(), e.is4(), e.String())
		}
	}
	if epAddrOf(netip.MustParseAddr("::ffff:192.0.2.1")) == epAddrOf(netip.MustParseAddr("192.0.2.1")) {
		t.Error("an IPv4-mapped IPv6 address and its IPv4 address have one epAddr")
	}
	if n := unsafe.Sizeof(fdbKey{}) + unsafe.Sizeof(fdbEntry{}); n > 52 {
		t.Errorf("an FDB entry takes %d bytes in the mirror; want at most 52", n)
	}
	if n := unsafe.Sizeof(neighKey{}) + unsafe.Sizeof(neighEntry{}); n > 30 {
		t.Errorf("a neighbour takes %d bytes in the mirror; want at most 30", n)
	}
}
