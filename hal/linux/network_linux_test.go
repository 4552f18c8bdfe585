package linux

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/naplesnet/naples/hal"
	"github.com/naplesnet/naples/internal/testns"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// overlayHost is a test host for the overlay's reconcilers: a fresh namespace, a delphi
// store with the backend's indexes, and a network reconciler for node "n1".
type overlayHost struct {
	testStore
	ns  string
	nsh netns.NsHandle
	rec *NetworkReconciler
	// bpfDir and stateFile are the reconcilers' NetworkOptions.BPFDir and StateFile,
	// which survive their restarts.
	bpfDir, stateFile string
}

// localNode is the name of the test host's Node.
const localNode = "n1"

func newOverlayHost(t *testing.T) *overlayHost {
	t.Helper()
	ns := testns.Named(t, "naples-net")
	h := &overlayHost{testStore: newTestStore(t, Indexes()), ns: ns, nsh: testns.Handle(t, ns),
		bpfDir: filepath.Join("/sys/fs/bpf", ns), stateFile: filepath.Join(t.TempDir(), "sysctls.json")}
	// Registered first, so that it runs after every reconciler is closed.
	t.Cleanup(func() { os.RemoveAll(h.bpfDir) })
	h.rec = h.newReconciler(t)
	return h
}

// newReconciler returns a fresh network reconciler on the host's namespace and store, as
// a restarted agent has.
func (h *overlayHost) newReconciler(t *testing.T) *NetworkReconciler {
	t.Helper()
	return h.newReconcilerWith(t, func(*NetworkOptions) {})
}

// newReconcilerWith is newReconciler with the options as set changes them.
func (h *overlayHost) newReconcilerWith(t *testing.T, set func(*NetworkOptions)) *NetworkReconciler {
	t.Helper()
	opts := NetworkOptions{Store: h.store, Node: localNode, Namespace: &h.nsh, Logger: quiet,
		BPFDir: h.bpfDir, StateFile: h.stateFile}
	set(&opts)
	rec, err := NewNetworkReconciler(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rec.Close() })
	return rec
}

// reconcile runs the network reconciler the way the HAL does: with the object delphi
// holds now.
func (h *overlayHost) reconcile(t *testing.T, key *nimbusv1.ObjectKey) (*nimbusv1.OperationalData, error) {
	t.Helper()
	return h.reconcileStored(h.rec, key)
}

// mustReconcile reconciles and fails the test on an error.
func (h *overlayHost) mustReconcile(t *testing.T, key *nimbusv1.ObjectKey) *nimbusv1.OperationalData {
	t.Helper()
	op, err := h.reconcile(t, key)
	if err != nil {
		t.Fatalf("reconcile %s: %v", key.ID(), err)
	}
	return op
}

// run runs a command of iproute2 (ip, bridge) in the host's namespace.
func (h *overlayHost) run(t *testing.T, cmd string, args ...string) string {
	t.Helper()
	return testns.Run(t, cmd, append([]string{"-n", h.ns}, args...)...)
}

// output runs a command of iproute2 in the host's namespace and returns its standard
// output, or nothing when it fails.
func (h *overlayHost) output(cmd string, args ...string) string {
	out, err := exec.Command(cmd, append([]string{"-n", h.ns}, args...)...).Output()
	if err != nil {
		return ""
	}
	return string(out)
}

// sysctl reads a sysctl of the host's namespace.
func (h *overlayHost) sysctl(t *testing.T, path string) string {
	t.Helper()
	return strings.TrimSpace(testns.Run(t, "ip", "netns", "exec", h.ns, "cat", "/proc/sys/"+path))
}

// hasLink reports whether the host has a link of the name.
func (h *overlayHost) hasLink(t *testing.T, name string) bool {
	t.Helper()
	return strings.Contains(h.run(t, "ip", "-o", "link", "show"), ": "+name+":")
}

// mustContain fails the test unless out contains every one of wants.
func mustContain(t *testing.T, what, out string, wants ...string) {
	t.Helper()
	for _, w := range wants {
		if !strings.Contains(out, w) {
			t.Fatalf("%s lacks %q:\n%s", what, w, out)
		}
	}
}

// mustNotContain fails the test if out contains any one of unwanted.
func mustNotContain(t *testing.T, what, out string, unwanted ...string) {
	t.Helper()
	for _, w := range unwanted {
		if strings.Contains(out, w) {
			t.Fatalf("%s holds %q:\n%s", what, w, out)
		}
	}
}

func nodeObj(name, vtep string) *nimbusv1.Object {
	return &nimbusv1.Object{
		Meta: &nimbusv1.ObjectMeta{Name: name, Generation: 1},
		Spec: &nimbusv1.Object_Node{Node: &nimbusv1.NodeSpec{Hostname: name, VtepAddress: vtep}},
	}
}

func subnet(cidr, gw string) *nimbusv1.Subnet { return &nimbusv1.Subnet{Cidr: cidr, Gateway: gw} }

func networkObj(tenant, name string, vni, mtu uint32, subnets ...*nimbusv1.Subnet) *nimbusv1.Object {
	return &nimbusv1.Object{
		Meta: &nimbusv1.ObjectMeta{Tenant: tenant, Name: name, Generation: 1},
		Spec: &nimbusv1.Object_Network{Network: &nimbusv1.NetworkSpec{Vni: vni, Mtu: mtu, Subnets: subnets}},
	}
}

func endpointObj(tenant, name, network, node string) *nimbusv1.Object {
	return &nimbusv1.Object{
		Meta: &nimbusv1.ObjectMeta{Tenant: tenant, Name: name, Generation: 1},
		Spec: &nimbusv1.Object_Endpoint{Endpoint: &nimbusv1.EndpointSpec{Network: network, Node: node, Interface: "veth-" + name}},
	}
}

// networkState is what the kernel of a test host shows of one network.
type networkState struct {
	bridge, vxlan, rules, table, fdb, addrs, main string
}

// state reads the kernel state of the network with the key and tenant table.
func (h *overlayHost) state(t *testing.T, key *nimbusv1.ObjectKey, table uint32) networkState {
	t.Helper()
	id := key.ID()
	s := networkState{}
	if h.hasLink(t, BridgeName(id)) {
		s.bridge = h.run(t, "ip", "-d", "link", "show", BridgeName(id))
		s.addrs = h.run(t, "ip", "addr", "show", "dev", BridgeName(id))
	}
	if h.hasLink(t, VXLANName(id)) {
		s.vxlan = h.run(t, "ip", "-d", "link", "show", VXLANName(id))
		s.fdb = h.run(t, "bridge", "fdb", "show", "dev", VXLANName(id))
	}
	s.rules = h.run(t, "ip", "-4", "rule") + h.run(t, "ip", "-6", "rule")
	tbl := fmt.Sprint(table)
	// A table that holds no route of a family does not exist for it.
	s.table = h.output("ip", "-4", "route", "show", "table", tbl) + h.output("ip", "-6", "route", "show", "table", tbl)
	s.main = h.run(t, "ip", "-4", "route", "show", "table", "main") + h.run(t, "ip", "-6", "route", "show", "table", "main")
	return s
}

// requireGone fails the test unless nothing of the network with the key is left.
func (h *overlayHost) requireGone(t *testing.T, key *nimbusv1.ObjectKey, table uint32) {
	t.Helper()
	id := key.ID()
	for _, name := range []string{BridgeName(id), VXLANName(id)} {
		if h.hasLink(t, name) {
			t.Fatalf("link %s survived:\n%s", name, h.run(t, "ip", "-d", "link", "show", name))
		}
	}
	s := h.state(t, key, table)
	mustNotContain(t, "rules", s.rules, BridgeName(id))
	if strings.TrimSpace(s.table) != "" {
		t.Fatalf("table %d is not empty:\n%s", table, s.table)
	}
}

// overlayFamily is the addressing of one test case of the network lifecycle.
type overlayFamily struct {
	name string
	// vtep is this host's VTEP address, remote another node's.
	vtep, remote string
	// subnets are the network's subnets; changed replaces them.
	subnets, changed []*nimbusv1.Subnet
	// addrs are what `ip addr` shows of the gateways of subnets, routes what `ip route
	// show table T` shows of their routes; changedAddrs and changedRoutes the same for
	// changed.
	addrs, routes, changedAddrs, changedRoutes []string
}

var overlayFamilies = []overlayFamily{
	{
		name: "IPv4", vtep: "192.0.2.1", remote: "192.0.2.2",
		subnets:       []*nimbusv1.Subnet{subnet("10.1.0.0/24", "10.1.0.1")},
		changed:       []*nimbusv1.Subnet{subnet("10.9.0.0/24", "10.9.0.1")},
		addrs:         []string{"inet 10.1.0.1/24 scope global noprefixroute"},
		routes:        []string{"10.1.0.0/24 dev BR proto 242 scope link src 10.1.0.1"},
		changedAddrs:  []string{"inet 10.9.0.1/24 scope global noprefixroute"},
		changedRoutes: []string{"10.9.0.0/24 dev BR proto 242 scope link src 10.9.0.1"},
	},
	{
		name: "IPv6", vtep: "2001:db8:ff::1", remote: "2001:db8:ff::2",
		subnets:       []*nimbusv1.Subnet{subnet("2001:db8:1::/64", "2001:db8:1::1")},
		changed:       []*nimbusv1.Subnet{subnet("2001:db8:9::/64", "2001:db8:9::1")},
		addrs:         []string{"inet6 2001:db8:1::1/64 scope global nodad noprefixroute"},
		routes:        []string{"2001:db8:1::/64 dev BR proto 242 src 2001:db8:1::1 metric 1024"},
		changedAddrs:  []string{"inet6 2001:db8:9::1/64 scope global nodad noprefixroute"},
		changedRoutes: []string{"2001:db8:9::/64 dev BR proto 242 src 2001:db8:9::1 metric 1024"},
	},
	{
		name: "DualStack", vtep: "192.0.2.1", remote: "192.0.2.2",
		subnets: []*nimbusv1.Subnet{subnet("10.1.0.0/24", "10.1.0.1"), subnet("2001:db8:1::/64", "2001:db8:1::1")},
		changed: []*nimbusv1.Subnet{subnet("10.1.0.0/24", "10.1.0.1"), subnet("2001:db8:9::/64", "2001:db8:9::1")},
		addrs:   []string{"inet 10.1.0.1/24 scope global noprefixroute", "inet6 2001:db8:1::1/64 scope global nodad noprefixroute"},
		routes: []string{"10.1.0.0/24 dev BR proto 242 scope link src 10.1.0.1",
			"2001:db8:1::/64 dev BR proto 242 src 2001:db8:1::1 metric 1024"},
		changedAddrs: []string{"inet 10.1.0.1/24 scope global noprefixroute", "inet6 2001:db8:9::1/64 scope global nodad noprefixroute"},
		changedRoutes: []string{"10.1.0.0/24 dev BR proto 242 scope link src 10.1.0.1",
			"2001:db8:9::/64 dev BR proto 242 src 2001:db8:9::1 metric 1024"},
	},
}

// withBridge replaces BR in each of ss with the bridge's name.
func withBridge(bridge string, ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = strings.ReplaceAll(s, "BR", bridge)
	}
	return out
}

// TestNetworkLifecycle creates a network and checks every kernel object with iproute2,
// reconciles it again without a write, changes its MTU, subnets and VNI, and deletes it,
// twice, leaving nothing behind.
func TestNetworkLifecycle(t *testing.T) {
	for _, f := range overlayFamilies {
		t.Run(f.name, func(t *testing.T) {
			h := newOverlayHost(t)
			net1 := networkObj("acme", "blue", 100, 0, f.subnets...)
			key, id := net1.Key(), net1.Key().ID()
			br, vx, table := BridgeName(id), VXLANName(id), TenantTable("acme")
			h.put(t, nodeObj(localNode, f.vtep), nodeObj("n2", f.remote), net1,
				endpointObj("acme", "remote-ep", "blue", "n2"))

			op := h.mustReconcile(t, key)
			if n := op.GetNetwork(); n.GetBridge() != br || n.GetVxlan() != vx || n.GetVni() != 100 || n.GetVtep() != f.vtep ||
				n.GetTenantTable() != table || !slices.Equal(n.GetRemoteVteps(), []string{f.remote}) {
				t.Errorf("operational = %v, want bridge %s, vxlan %s, vni 100, vtep %s, tenant_table %d, remote_vteps [%s]",
					op, br, vx, f.vtep, table, f.remote)
			}
			want := map[string]string{
				"bridge": br, "vxlan": vx, "vni": "100", "vtep": f.vtep,
				"tenantTable": fmt.Sprint(table), "remoteVteps": f.remote,
			}
			m := op.Map()
			for k, v := range want {
				if m[k] != v {
					t.Errorf("operational map %s = %q, want %q (all: %v)", k, m[k], v, m)
				}
			}
			s := h.state(t, key, table)
			mustContain(t, "the bridge", s.bridge, "<BROADCAST,MULTICAST,UP,LOWER_UP>",
				"link/ether "+GatewayMAC(id).String(), "alias "+OwnerAlias(id), "\n    bridge ")
			mustContain(t, "the VXLAN device", s.vxlan, "master "+br, "alias "+OwnerAlias(id),
				"vxlan id 100 local "+f.vtep, "dstport 4789 nolearning",
				"bridge_slave", "learning off", "neigh_suppress on", ",UP,")
			mustContain(t, "the bridge's addresses", s.addrs, f.addrs...)
			mustContain(t, "the rules", s.rules,
				fmt.Sprintf("1000:\tfrom all iif %s lookup %d proto 242", br, table),
				fmt.Sprintf("1001:\tfrom all iif %s prohibit proto 242", br))
			if n := strings.Count(s.rules, "iif "+br); n != 4 {
				t.Errorf("%d rules name the bridge, want 4 (2 per family):\n%s", n, s.rules)
			}
			mustContain(t, fmt.Sprintf("table %d", table), s.table, withBridge(br, f.routes)...)
			mustNotContain(t, "the main table", s.main, "proto 242", "10.1.0.0", "2001:db8:1::")
			mustContain(t, "the head-end replication", s.fdb, "00:00:00:00:00:00 dst "+f.remote+" self permanent")
			if f.name != "IPv6" {
				if got := h.sysctl(t, "net/ipv4/conf/"+br+"/forwarding"); got != "1" {
					t.Errorf("net.ipv4.conf.%s.forwarding = %s, want 1", br, got)
				}
			}
			if f.name != "IPv4" {
				if got := h.sysctl(t, "net/ipv6/conf/"+br+"/force_forwarding"); got != "1" {
					t.Errorf("net.ipv6.conf.%s.force_forwarding = %s, want 1", br, got)
				}
			}

			writes := h.rec.KernelWrites()
			h.mustReconcile(t, key)
			if d := h.rec.KernelWrites() - writes; d != 0 {
				t.Errorf("reconciling an unchanged network wrote the kernel %d times", d)
			}

			// MTU: both devices follow.
			h.put(t, networkObj("acme", "blue", 100, 1400, f.subnets...))
			h.mustReconcile(t, key)
			s = h.state(t, key, table)
			mustContain(t, "the bridge after an MTU change", s.bridge, " mtu 1400 ")
			mustContain(t, "the VXLAN device after an MTU change", s.vxlan, " mtu 1400 ")

			// Subnets: the old gateways and routes go, the new ones come.
			h.put(t, networkObj("acme", "blue", 100, 1400, f.changed...))
			h.mustReconcile(t, key)
			s = h.state(t, key, table)
			mustContain(t, "the bridge's addresses after a subnet change", s.addrs, f.changedAddrs...)
			mustContain(t, "the tenant table after a subnet change", s.table, withBridge(br, f.changedRoutes)...)
			for _, a := range f.addrs {
				if !strings.Contains(strings.Join(f.changedAddrs, "\n"), a) {
					mustNotContain(t, "the bridge's addresses after a subnet change", s.addrs, a)
				}
			}
			for _, r := range withBridge(br, f.routes) {
				if !strings.Contains(strings.Join(withBridge(br, f.changedRoutes), "\n"), r) {
					mustNotContain(t, "the tenant table after a subnet change", s.table, r)
				}
			}

			// VNI: the VXLAN device is made anew, still a port with its flags and its
			// replication.
			h.put(t, networkObj("acme", "blue", 200, 1400, f.changed...))
			op = h.mustReconcile(t, key)
			s = h.state(t, key, table)
			mustContain(t, "the VXLAN device after a VNI change", s.vxlan, "vxlan id 200 local "+f.vtep,
				"master "+br, "learning off", "neigh_suppress on", " mtu 1400 ")
			mustContain(t, "the head-end replication after a VNI change", s.fdb, "dst "+f.remote+" self permanent")
			if op.GetNetwork().GetVni() != 200 {
				t.Errorf("operational vni = %d after the change, want 200", op.GetNetwork().GetVni())
			}
			writes = h.rec.KernelWrites()
			h.mustReconcile(t, key)
			if d := h.rec.KernelWrites() - writes; d != 0 {
				t.Errorf("reconciling the changed network again wrote the kernel %d times", d)
			}

			// Delete, twice.
			h.del(t, key)
			for i := range 2 {
				if _, err := h.reconcile(t, key); err != nil {
					t.Fatalf("delete %d: %v", i+1, err)
				}
			}
			h.requireGone(t, key, table)
		})
	}
}

// observeNetworks runs the network reconciler's observer until the test ends, and
// returns once it is subscribed. The keys it enqueues arrive on the returned channel.
func (h *overlayHost) observeNetworks(t *testing.T) <-chan string {
	t.Helper()
	return runObserver(t, h.rec)
}

// drain empties a channel of enqueued keys.
func drain(enqueued <-chan string) {
	for {
		select {
		case <-enqueued:
		default:
			return
		}
	}
}

// repairs waits for the observer to enqueue key and reconciles it each time it does,
// as the HAL would, until ok reports the kernel repaired; it fails the test when that
// does not happen within a generous deadline.
func (h *overlayHost) repairs(t *testing.T, enqueued <-chan string, key *nimbusv1.ObjectKey, ok func() string) {
	t.Helper()
	deadline := time.After(20 * time.Second)
	seen := false
	for {
		problem := ok()
		if seen && problem == "" {
			return
		}
		select {
		case id := <-enqueued:
			if id != key.ID() {
				t.Fatalf("the observer enqueued %s, want %s", id, key.ID())
			}
			seen = true
			if _, err := h.reconcile(t, key); err != nil {
				t.Logf("reconcile during repair: %v", err)
			}
		case <-deadline:
			if !seen {
				t.Fatalf("the observer never enqueued %s", key.ID())
			}
			t.Fatalf("not repaired: %s", problem)
		}
	}
}

// wantNetworkState is what a programmed network looks like in a test host's kernel.
type wantNetworkState struct {
	key          *nimbusv1.ObjectKey
	table        uint32
	vni          uint32
	vtep, remote string
	mtu          uint32
	addrs        []string
	routes       []string
	v4, v6       bool
}

// problem returns what differs between the host's kernel and w, "" when nothing does.
func (h *overlayHost) problem(t *testing.T, w wantNetworkState) string {
	t.Helper()
	id := w.key.ID()
	br := BridgeName(id)
	s := h.state(t, w.key, w.table)
	check := func(what, out string, wants ...string) string {
		for _, want := range wants {
			if !strings.Contains(out, want) {
				return fmt.Sprintf("%s lacks %q:\n%s", what, want, out)
			}
		}
		return ""
	}
	mtu := ""
	if w.mtu != 0 {
		mtu = fmt.Sprintf(" mtu %d ", w.mtu)
	}
	for _, p := range []string{
		check("the bridge", s.bridge, "<BROADCAST,MULTICAST,UP,LOWER_UP>", "link/ether "+GatewayMAC(id).String(), "alias "+OwnerAlias(id), mtu),
		check("the VXLAN device", s.vxlan, "master "+br, fmt.Sprintf("vxlan id %d local %s", w.vni, w.vtep),
			"nolearning", "learning off", "neigh_suppress on", ",UP,", mtu),
		check("the bridge's addresses", s.addrs, w.addrs...),
		check("the tenant table", s.table, withBridge(br, w.routes)...),
		check("the rules", s.rules, fmt.Sprintf("1000:\tfrom all iif %s lookup %d", br, w.table), fmt.Sprintf("1001:\tfrom all iif %s prohibit", br)),
	} {
		if p != "" {
			return p
		}
	}
	if n := strings.Count(s.rules, "iif "+br); n != 4 {
		return fmt.Sprintf("%d rules name the bridge, want 4:\n%s", n, s.rules)
	}
	if n := strings.Count(s.rules, fmt.Sprintf("fwmark %#x lookup %d", w.table, w.table)); n != 2 {
		return fmt.Sprintf("%d gateway rules of the tenant, want 2:\n%s", n, s.rules)
	}
	if p := h.gatewayAttached(t, br, w.table); p != "" {
		return p
	}
	if w.remote != "" {
		if p := check("the head-end replication", s.fdb, "00:00:00:00:00:00 dst "+w.remote+" self permanent"); p != "" {
			return p
		}
	}
	if w.v4 {
		if got := h.sysctl(t, "net/ipv4/conf/"+br+"/forwarding"); got != "1" {
			return "net.ipv4.conf." + br + ".forwarding is " + got
		}
	}
	if w.v6 {
		if got := h.sysctl(t, "net/ipv6/conf/"+br+"/force_forwarding"); got != "1" {
			return "net.ipv6.conf." + br + ".force_forwarding is " + got
		}
	}
	return ""
}

// dualStack is the dual-stack network most tests use: blue, of tenant acme, VNI 100, MTU
// 1400, with one remote endpoint on n2.
func (h *overlayHost) dualStack(t *testing.T) wantNetworkState {
	t.Helper()
	f := overlayFamilies[2]
	obj := networkObj("acme", "blue", 100, 1400, f.subnets...)
	h.put(t, nodeObj(localNode, f.vtep), nodeObj("n2", f.remote), obj, endpointObj("acme", "remote-ep", "blue", "n2"))
	return wantNetworkState{
		key: obj.Key(), table: TenantTable("acme"), vni: 100, vtep: f.vtep, remote: f.remote, mtu: 1400,
		addrs: f.addrs, routes: f.routes, v4: true, v6: true,
	}
}

// TestNetworkPendingWithoutNode: without this host's Node object, or without its VTEP
// address, a network is PENDING for WaitingForNode and nothing is created; once the Node
// has its address, the next reconcile programs it.
func TestNetworkPendingWithoutNode(t *testing.T) {
	h := newOverlayHost(t)
	obj := networkObj("acme", "blue", 100, 0, subnet("10.1.0.0/24", "10.1.0.1"))
	h.put(t, obj)
	for _, node := range []*nimbusv1.Object{nil, nodeObj(localNode, "")} {
		if node != nil {
			h.put(t, node)
		}
		_, err := h.reconcile(t, obj.Key())
		if !hal.IsPending(err) || hal.ReasonOf(err) != ReasonWaitingForNode || !strings.Contains(err.Error(), localNode) {
			t.Fatalf("reconcile without a VTEP address: err = %v, want PENDING %s naming %s", err, ReasonWaitingForNode, localNode)
		}
		if h.hasLink(t, BridgeName(obj.Key().ID())) || h.rec.KernelWrites() != 0 {
			t.Fatalf("a pending network wrote the kernel")
		}
	}
	h.put(t, nodeObj(localNode, "192.0.2.1"))
	if got := h.rec.DependentsOf(NodeKey(localNode).Key()); len(got) != 1 || got[0] != obj.TypedKey() {
		t.Fatalf("DependentsOf(this host's Node) = %v, want [%s]", got, obj.Key().ID())
	}
	h.mustReconcile(t, obj.Key())
	if p := h.problem(t, wantNetworkState{key: obj.Key(), table: TenantTable("acme"), vni: 100, vtep: "192.0.2.1",
		addrs: overlayFamilies[0].addrs, routes: overlayFamilies[0].routes, v4: true}); p != "" {
		t.Fatal(p)
	}
}

// TestNetworkHeadEndReplication: a network replicates to exactly the VTEPs of the other
// nodes that have endpoints in it; nodes without a usable VTEP are listed; endpoints and
// nodes coming and going reach the network through DependentsOf.
func TestNetworkHeadEndReplication(t *testing.T) {
	h := newOverlayHost(t)
	blue := networkObj("acme", "blue", 100, 0, subnet("10.1.0.0/24", "10.1.0.1"))
	red := networkObj("acme", "red", 101, 0, subnet("10.2.0.0/24", "10.2.0.1"))
	key, vx := blue.Key(), VXLANName(blue.Key().ID())
	e2a, e2b := endpointObj("acme", "e2a", "blue", "n2"), endpointObj("acme", "e2b", "blue", "n2")
	h.put(t, blue, red,
		nodeObj(localNode, "192.0.2.1"), nodeObj("n2", "192.0.2.2"), nodeObj("n3", ""), nodeObj("n4", "2001:db8::4"),
		endpointObj("acme", "local", "blue", localNode), e2a, e2b,
		endpointObj("acme", "e3", "blue", "n3"), endpointObj("acme", "e4", "blue", "n4"),
		endpointObj("acme", "r2", "red", "n2"))
	fdb := func() string { return h.run(t, "bridge", "fdb", "show", "dev", vx) }
	zeroEntries := func() int { return strings.Count(fdb(), "00:00:00:00:00:00 dst ") }

	op := h.mustReconcile(t, key)
	if n := op.GetNetwork(); !slices.Equal(n.GetRemoteVteps(), []string{"192.0.2.2"}) || !slices.Equal(n.GetNodesWithoutVtep(), []string{"n3", "n4"}) {
		t.Fatalf("operational = %v, want remote_vteps 192.0.2.2 and nodes_without_vtep n3, n4", op)
	}
	mustContain(t, "the FDB", fdb(), "00:00:00:00:00:00 dst 192.0.2.2 self permanent")
	if n := zeroEntries(); n != 1 {
		t.Fatalf("%d head-end replication entries, want 1 (n2 once, nothing for this host):\n%s", n, fdb())
	}

	deps := func(id string) string {
		var ids []string
		for _, k := range h.rec.DependentsOf(mustKey(t, id)) {
			ids = append(ids, k.String())
		}
		return strings.Join(ids, ",")
	}
	if got, want := deps(NodeKey(localNode).ID()), blue.Key().ID()+","+red.Key().ID(); got != want {
		t.Errorf("DependentsOf(this host's Node) = %s, want %s", got, want)
	}
	if got, want := deps(NodeKey("n2").ID()), blue.Key().ID()+","+red.Key().ID(); got != want {
		t.Errorf("DependentsOf(Node n2) = %s, want %s", got, want)
	}
	if got := deps(NodeKey("n3").ID()); got != blue.Key().ID() {
		t.Errorf("DependentsOf(Node n3) = %s, want %s", got, blue.Key().ID())
	}
	if got := deps(e2a.Key().ID()); got != blue.Key().ID() {
		t.Errorf("DependentsOf(Endpoint e2a) = %s, want %s", got, blue.Key().ID())
	}

	// n3 gets its VTEP address: replication to it follows.
	h.put(t, nodeObj("n3", "192.0.2.3"))
	op = h.mustReconcile(t, key)
	if n := op.GetNetwork(); !slices.Equal(n.GetRemoteVteps(), []string{"192.0.2.2", "192.0.2.3"}) || !slices.Equal(n.GetNodesWithoutVtep(), []string{"n4"}) {
		t.Fatalf("operational after n3 got a VTEP = %v", op)
	}
	mustContain(t, "the FDB", fdb(), "dst 192.0.2.2 self permanent", "dst 192.0.2.3 self permanent")
	writes := h.rec.KernelWrites()
	h.mustReconcile(t, key)
	if h.rec.KernelWrites() != writes {
		t.Errorf("reconciling unchanged replication wrote the kernel")
	}

	// n2's endpoints go, one at a time: the entry stays while one is left.
	h.del(t, e2a.Key())
	h.mustReconcile(t, key)
	mustContain(t, "the FDB with one endpoint left on n2", fdb(), "dst 192.0.2.2 self permanent")
	h.del(t, e2b.Key())
	if got := deps(e2b.Key().ID()); got != blue.Key().ID() {
		t.Fatalf("DependentsOf(a deleted Endpoint) = %q, want %s, from the last reconcile", got, blue.Key().ID())
	}
	op = h.mustReconcile(t, key)
	mustNotContain(t, "the FDB after n2's endpoints left", fdb(), "192.0.2.2")
	if !slices.Equal(op.GetNetwork().GetRemoteVteps(), []string{"192.0.2.3"}) || zeroEntries() != 1 {
		t.Fatalf("operational = %v after n2's endpoints left; FDB:\n%s", op, fdb())
	}
	if got := deps(e2b.Key().ID()); got != "" {
		t.Errorf("DependentsOf(a deleted Endpoint already reconciled) = %q, want none", got)
	}
}

// TestNetworkConflicts covers the objects a network cannot take: a link of its bridge's
// name that is not naples's, a VNI another Network has, a VNI a foreign VXLAN device has,
// and a subnet another network of the tenant routes. The foreign objects are never
// touched, and the loser programs once the winner goes.
func TestNetworkConflicts(t *testing.T) {
	t.Run("ForeignLink", func(t *testing.T) {
		h := newOverlayHost(t)
		obj := networkObj("acme", "blue", 100, 0, subnet("10.1.0.0/24", "10.1.0.1"))
		br := BridgeName(obj.Key().ID())
		h.put(t, nodeObj(localNode, "192.0.2.1"), obj)
		h.run(t, "ip", "link", "add", br, "type", "bridge")
		h.run(t, "ip", "rule", "add", "iif", br, "lookup", "100", "pref", "1000")
		before := h.run(t, "ip", "-d", "link", "show", br)
		for range 2 {
			if _, err := h.reconcile(t, obj.Key()); !isConflict(err) || !strings.Contains(err.Error(), br) {
				t.Fatalf("reconcile onto a foreign link: err = %v, want a Conflict naming %s", err, br)
			}
		}
		h.del(t, obj.Key())
		if _, err := h.reconcile(t, obj.Key()); err != nil {
			t.Fatal(err)
		}
		if err := h.rec.Sweep(context.Background(), func(nimbusv1.Key) {}); err != nil {
			t.Fatal(err)
		}
		if after := h.run(t, "ip", "-d", "link", "show", br); after != before {
			t.Fatalf("the foreign link changed:\n%s\nnow:\n%s", before, after)
		}
		mustContain(t, "the rules", h.run(t, "ip", "rule"), "iif "+br+" lookup 100")
		if h.rec.KernelWrites() != 0 {
			t.Errorf("a network in conflict wrote the kernel %d times", h.rec.KernelWrites())
		}
	})
	t.Run("UnmarkedOwnLink", func(t *testing.T) {
		// What an agent stopped between creating a bridge and setting its alias leaves:
		// a link of the name in LinkGroup without an alias. The next agent adopts it.
		h := newOverlayHost(t)
		obj := networkObj("acme", "blue", 100, 0, subnet("10.1.0.0/24", "10.1.0.1"))
		br := BridgeName(obj.Key().ID())
		h.put(t, nodeObj(localNode, "192.0.2.1"), obj)
		h.run(t, "ip", "link", "add", br, "group", fmt.Sprint(LinkGroup), "type", "bridge")
		index, _, _ := strings.Cut(h.run(t, "ip", "-o", "link", "show", br), ":")
		h.mustReconcile(t, obj.Key())
		mustContain(t, "the adopted bridge", h.run(t, "ip", "-d", "link", "show", br), "alias "+OwnerAlias(obj.Key().ID()))
		if again, _, _ := strings.Cut(h.run(t, "ip", "-o", "link", "show", br), ":"); again != index {
			t.Errorf("the bridge was created anew (index %s, was %s); want it adopted", again, index)
		}

		// Left so by an agent whose network was then deleted: the sweep removes it, and
		// leaves alone a link of such a name outside LinkGroup.
		orphan := BridgeName(nimbusv1.NewKey(nimbusv1.Kind_KIND_NETWORK, "acme", "", "gone").ID())
		foreign := VXLANName(nimbusv1.NewKey(nimbusv1.Kind_KIND_NETWORK, "acme", "", "gone").ID())
		h.run(t, "ip", "link", "add", orphan, "group", fmt.Sprint(LinkGroup), "type", "bridge")
		h.run(t, "ip", "link", "add", foreign, "type", "bridge")
		if err := h.rec.Sweep(context.Background(), func(nimbusv1.Key) {}); err != nil {
			t.Fatal(err)
		}
		links := h.run(t, "ip", "-o", "link", "show")
		if strings.Contains(links, orphan+":") {
			t.Errorf("the sweep left the unmarked naples link %s of a network that is gone:\n%s", orphan, links)
		}
		if !strings.Contains(links, foreign+":") || !strings.Contains(links, br+":") {
			t.Errorf("the sweep removed %s (foreign) or %s (its network's):\n%s", foreign, br, links)
		}
	})
	t.Run("VNI", func(t *testing.T) {
		h := newOverlayHost(t)
		a := networkObj("acme", "a", 100, 0, subnet("10.1.0.0/24", "10.1.0.1"))
		b := networkObj("acme", "b", 100, 0, subnet("10.2.0.0/24", "10.2.0.1"))
		h.put(t, nodeObj(localNode, "192.0.2.1"), a, b)
		// b loses even when it comes first: a sorts first.
		if _, err := h.reconcile(t, b.Key()); !isConflict(err) || !strings.Contains(err.Error(), a.Key().ID()) {
			t.Fatalf("reconcile of the second network of a VNI: err = %v, want a Conflict naming %s", err, a.Key().ID())
		}
		h.mustReconcile(t, a.Key())
		if _, err := h.reconcile(t, b.Key()); !isConflict(err) {
			t.Fatalf("second reconcile of the loser: err = %v, want a Conflict", err)
		}
		if h.hasLink(t, BridgeName(b.Key().ID())) || h.hasLink(t, VXLANName(b.Key().ID())) {
			t.Fatal("the loser of a VNI created devices")
		}
		h.del(t, a.Key())
		if _, err := h.reconcile(t, a.Key()); err != nil {
			t.Fatal(err)
		}
		op := h.mustReconcile(t, b.Key())
		if op.GetNetwork().GetVni() != 100 {
			t.Fatalf("the loser did not take the VNI once the winner left: %v", op)
		}
	})
	t.Run("VNIFirstCome", func(t *testing.T) {
		// z runs with VNI 100; a, which sorts first, comes later with it: z keeps it.
		h := newOverlayHost(t)
		z := networkObj("acme", "z", 100, 0, subnet("10.1.0.0/24", "10.1.0.1"))
		a := networkObj("acme", "a", 100, 0, subnet("10.2.0.0/24", "10.2.0.1"))
		h.put(t, nodeObj(localNode, "192.0.2.1"), z)
		h.mustReconcile(t, z.Key())
		h.put(t, a)
		if _, err := h.reconcile(t, a.Key()); !isConflict(err) || !strings.Contains(err.Error(), z.Key().ID()) {
			t.Fatalf("reconcile of the later network of a VNI: err = %v, want a Conflict naming %s", err, z.Key().ID())
		}
		if op := h.mustReconcile(t, z.Key()); op.GetNetwork().GetVni() != 100 {
			t.Fatalf("the running network after the newcomer: %v, want VNI 100", op)
		}
		if h.hasLink(t, VXLANName(a.Key().ID())) {
			t.Fatal("the newcomer of a VNI created a VXLAN device")
		}
	})
	t.Run("ForeignVXLAN", func(t *testing.T) {
		h := newOverlayHost(t)
		obj := networkObj("acme", "blue", 100, 0, subnet("10.1.0.0/24", "10.1.0.1"))
		h.put(t, nodeObj(localNode, "192.0.2.1"), obj)
		h.run(t, "ip", "link", "add", "theirs", "type", "vxlan", "id", "100", "local", "192.0.2.1", "dstport", "4789")
		_, err := h.reconcile(t, obj.Key())
		if !isConflict(err) || !strings.Contains(err.Error(), "VNI 100") {
			t.Fatalf("reconcile with a foreign VXLAN device of the VNI: err = %v, want a Conflict about VNI 100", err)
		}
		mustContain(t, "the foreign device", h.run(t, "ip", "-d", "link", "show", "theirs"), "vxlan id 100")
		h.run(t, "ip", "link", "del", "theirs")
		h.mustReconcile(t, obj.Key())
	})
	t.Run("Subnet", func(t *testing.T) {
		h := newOverlayHost(t)
		a := networkObj("acme", "a", 100, 0, subnet("10.1.0.0/24", "10.1.0.1"))
		b := networkObj("acme", "b", 101, 0, subnet("10.1.0.0/24", "10.1.0.1"))
		other := networkObj("globex", "c", 102, 0, subnet("10.1.0.0/24", "10.1.0.1"))
		h.put(t, nodeObj(localNode, "192.0.2.1"), a, b, other)
		h.mustReconcile(t, a.Key())
		if _, err := h.reconcile(t, b.Key()); !isConflict(err) || !strings.Contains(err.Error(), a.Key().ID()) {
			t.Fatalf("a subnet another network of the tenant routes: err = %v, want a Conflict naming %s", err, a.Key().ID())
		}
		// Another tenant has a table of its own.
		h.mustReconcile(t, other.Key())
		mustContain(t, "the tenant table of a", h.output("ip", "route", "show", "table", fmt.Sprint(TenantTable("acme"))),
			"10.1.0.0/24 dev "+BridgeName(a.Key().ID()))
	})
}

// TestNetworkDriftRepaired runs the observer: each change made by hand to a programmed
// network enqueues the network's key, and the reconciles that follow repair it.
func TestNetworkDriftRepaired(t *testing.T) {
	h := newOverlayHost(t)
	w := h.dualStack(t)
	enqueued := h.observeNetworks(t)
	h.mustReconcile(t, w.key)
	if p := h.problem(t, w); p != "" {
		t.Fatal(p)
	}
	id := w.key.ID()
	br, vx, table := BridgeName(id), VXLANName(id), fmt.Sprint(w.table)
	for _, c := range []struct {
		name string
		cmd  []string
	}{
		{"BridgeDeleted", []string{"ip", "link", "del", br}},
		{"VXLANDeleted", []string{"ip", "link", "del", vx}},
		{"BridgeDown", []string{"ip", "link", "set", br, "down"}},
		{"VXLANDown", []string{"ip", "link", "set", vx, "down"}},
		{"MTUChanged", []string{"ip", "link", "set", br, "mtu", "1300"}},
		{"VXLANLeftTheBridge", []string{"ip", "link", "set", vx, "nomaster"}},
		{"PortLearningOn", []string{"bridge", "link", "set", "dev", vx, "learning", "on"}},
		{"NeighSuppressOff", []string{"ip", "link", "set", vx, "type", "bridge_slave", "neigh_suppress", "off"}},
		{"RuleDeleted", []string{"ip", "-6", "rule", "del", "pref", "1000", "iif", br}},
		{"ProhibitRuleDeleted", []string{"ip", "-4", "rule", "del", "pref", "1001", "iif", br}},
		{"GatewayRuleDeleted", []string{"ip", "-6", "rule", "del", "pref", "1002", "fwmark", fmt.Sprintf("%#x", w.table)}},
		{"IPv4RouteDeleted", []string{"ip", "route", "del", "10.1.0.0/24", "table", table}},
		{"IPv6RouteDeleted", []string{"ip", "-6", "route", "del", "2001:db8:1::/64", "table", table}},
		{"GatewayDeleted", []string{"ip", "addr", "del", "10.1.0.1/24", "dev", br}},
		{"ForeignAddressAdded", []string{"ip", "addr", "add", "10.77.0.1/24", "dev", br}},
		{"ReplicationDeleted", []string{"bridge", "fdb", "del", "00:00:00:00:00:00", "dev", vx, "dst", w.remote, "self"}},
		{"ForwardingOff", []string{"ip", "netns", "exec", h.ns, "sysctl", "-qw", "net.ipv4.conf." + br + ".forwarding=0"}},
		{"IPv6ForwardingOff", []string{"ip", "netns", "exec", h.ns, "sysctl", "-qw", "net.ipv6.conf." + br + ".force_forwarding=0"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			drain(enqueued)
			if c.cmd[0] == "ip" && c.cmd[1] == "netns" {
				testns.Run(t, c.cmd[0], c.cmd[1:]...)
			} else {
				h.run(t, c.cmd[0], c.cmd[1:]...)
			}
			h.repairs(t, enqueued, w.key, func() string {
				if p := h.problem(t, w); p != "" {
					return p
				}
				if strings.Contains(h.run(t, "ip", "addr", "show", "dev", br), "10.77.0.1") {
					return "the foreign address is still on the bridge"
				}
				return ""
			})
		})
	}
	// Our own reconciles are no drift: with the kernel settled, one more changes nothing
	// and enqueues nothing.
	h.mustReconcile(t, w.key)
	drain(enqueued)
	writes := h.rec.KernelWrites()
	h.mustReconcile(t, w.key)
	if h.rec.KernelWrites() != writes {
		t.Errorf("a reconcile after the repairs wrote the kernel")
	}
}

// TestNetworkSweepAndRestart: a restarted agent (a new reconciler) whose store lost a
// network while it was down sweeps that network's kernel state, and stale rules, and
// adopts the rest without a single write; foreign rules and routes survive.
func TestNetworkSweepAndRestart(t *testing.T) {
	h := newOverlayHost(t)
	w := h.dualStack(t)
	gone := networkObj("acme", "gone", 200, 0, subnet("10.2.0.0/24", "10.2.0.1"), subnet("2001:db8:2::/64", "2001:db8:2::1"))
	h.put(t, gone, endpointObj("acme", "gone-ep", "gone", "n2"))
	h.mustReconcile(t, w.key)
	h.mustReconcile(t, gone.Key())
	table := fmt.Sprint(w.table)
	// Left by someone else: a rule at our priority for a foreign link, a foreign route in
	// the tenant table. Left by an earlier agent: a rule for a bridge that is gone.
	h.run(t, "ip", "rule", "add", "iif", "lo", "lookup", "100", "pref", "1000")
	h.run(t, "ip", "route", "add", "198.51.100.0/24", "dev", "lo", "table", table)
	h.run(t, "ip", "rule", "add", "iif", "nbrdeadbeef", "lookup", table, "pref", "1000", "proto", "242")

	// The agent restarts with a store in which "gone" was deleted.
	h.del(t, gone.Key())
	h.rec.Close()
	h.rec = h.newReconciler(t)
	var enqueued []string
	if err := h.rec.Sweep(context.Background(), func(key nimbusv1.Key) { enqueued = append(enqueued, key.String()) }); err != nil {
		t.Fatal(err)
	}
	h.requireGone(t, gone.Key(), TenantTable("nobody"))
	rules := h.run(t, "ip", "rule")
	mustNotContain(t, "the rules after the sweep", rules, BridgeName(gone.Key().ID()), "nbrdeadbeef")
	mustContain(t, "the rules after the sweep", rules, "iif lo lookup 100")
	tbl := h.output("ip", "route", "show", "table", table) + h.output("ip", "-6", "route", "show", "table", table)
	mustContain(t, "the tenant table after the sweep", tbl, "198.51.100.0/24 dev lo")
	mustNotContain(t, "the tenant table after the sweep", tbl, "10.2.0.0/24", "2001:db8:2::/64")
	if len(enqueued) != 0 {
		t.Errorf("the first sweep of a new reconciler enqueued %v", enqueued)
	}
	if p := h.problem(t, w); p != "" {
		t.Fatalf("the sweep disturbed a desired network: %s", p)
	}
	writes := h.rec.KernelWrites()
	h.mustReconcile(t, w.key)
	if d := h.rec.KernelWrites() - writes; d != 0 {
		t.Errorf("a restarted reconciler wrote the kernel %d times for a network that was in order", d)
	}

	// Another restart with everything in order writes nothing at all.
	h.rec.Close()
	h.rec = h.newReconciler(t)
	if err := h.rec.Sweep(context.Background(), func(nimbusv1.Key) {}); err != nil {
		t.Fatal(err)
	}
	h.mustReconcile(t, w.key)
	if h.rec.KernelWrites() != 0 {
		t.Errorf("a restart with everything in order wrote the kernel %d times", h.rec.KernelWrites())
	}
}

// TestNetworkHAL runs the whole HAL with the network and node reconcilers: a network
// waits for this host's Node, is programmed once the Node comes (DependentsOf), follows
// endpoints on other nodes, is repaired after drift, and leaves nothing behind.
func TestNetworkHAL(t *testing.T) {
	h := newOverlayHost(t)
	nodes, err := NewNodeReconciler(NodeOptions{Store: h.store, Node: localNode, Namespace: &h.nsh, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nodes.Close() })
	runHAL(t, h.store, hal.Options{Reconcilers: []hal.Reconciler{h.rec, nodes}})

	blue := networkObj("acme", "blue", 100, 0, subnet("10.1.0.0/24", "10.1.0.1"))
	key, vx := blue.Key(), VXLANName(blue.Key().ID())
	h.put(t, blue, nodeObj("n2", "192.0.2.2"))
	st := waitStatus(t, h.store, key, func(s *nimbusv1.NodeStatus) bool { return s.GetPhase() == nimbusv1.Phase_PHASE_PENDING })
	if st.GetReason() != ReasonWaitingForNode {
		t.Fatalf("status without this host's Node = %v, want PENDING %s", st, ReasonWaitingForNode)
	}

	// This host's Node comes: the network is programmed; the Node waits for its address.
	h.put(t, nodeObj(localNode, "192.0.2.1"))
	waitStatus(t, h.store, key, func(s *nimbusv1.NodeStatus) bool {
		return s.GetPhase() == nimbusv1.Phase_PHASE_PROGRAMMED && s.GetOperationalData().GetNetwork().GetVtep() == "192.0.2.1"
	})
	st = waitStatus(t, h.store, NodeKey(localNode), func(s *nimbusv1.NodeStatus) bool { return s.GetPhase() == nimbusv1.Phase_PHASE_PENDING })
	if st.GetReason() != ReasonWaitingForAddress || !strings.Contains(st.GetMessage(), "192.0.2.1") {
		t.Fatalf("status of this host's Node without its address = %v", st)
	}
	h.run(t, "ip", "addr", "add", "192.0.2.1/32", "dev", "lo")
	waitStatus(t, h.store, NodeKey(localNode), func(s *nimbusv1.NodeStatus) bool {
		return s.GetPhase() == nimbusv1.Phase_PHASE_PROGRAMMED && s.GetOperationalData().GetNode().GetRole() == nimbusv1.NodeRole_NODE_ROLE_LOCAL
	})

	// An endpoint on n2 adds replication to it; its delete removes it.
	ep := endpointObj("acme", "web", "blue", "n2")
	h.put(t, ep)
	fdb := func() string { return h.run(t, "bridge", "fdb", "show", "dev", vx) }
	waitFor(t, "replication to n2", func() bool { return strings.Contains(fdb(), "dst 192.0.2.2 self permanent") })
	waitStatus(t, h.store, key, func(s *nimbusv1.NodeStatus) bool {
		return slices.Equal(s.GetOperationalData().GetNetwork().GetRemoteVteps(), []string{"192.0.2.2"})
	})
	h.del(t, ep.Key())
	waitFor(t, "replication to n2 to go", func() bool { return !strings.Contains(fdb(), "192.0.2.2") })

	// Drift: the bridge deleted by hand comes back, with its routes.
	h.run(t, "ip", "link", "del", BridgeName(key.ID()))
	waitFor(t, "the bridge and its route to come back", func() bool {
		return strings.Contains(h.output("ip", "route", "show", "table", fmt.Sprint(TenantTable("acme"))), "10.1.0.0/24 dev "+BridgeName(key.ID()))
	})

	// Delete: everything and the status go.
	h.del(t, key)
	waitFor(t, "the network and its status to go", func() bool {
		_, ok := h.store.Status(key)
		return !ok && !h.hasLink(t, BridgeName(key.ID())) && !h.hasLink(t, vx)
	})
	h.requireGone(t, key, TenantTable("acme"))
}

// TestNetworkTeardownAnyOrder: a network's delete leaves nothing behind whatever went
// before it: this host's Node deleted first, its bridge or VXLAN device already deleted
// by hand.
func TestNetworkTeardownAnyOrder(t *testing.T) {
	for _, c := range []struct {
		name   string
		before func(t *testing.T, h *overlayHost, w wantNetworkState)
	}{
		{"NodeFirst", func(t *testing.T, h *overlayHost, w wantNetworkState) {
			h.del(t, NodeKey(localNode))
			if _, err := h.reconcile(t, w.key); !hal.IsPending(err) {
				t.Fatalf("reconcile without this host's Node: err = %v, want PENDING", err)
			}
		}},
		{"BridgeGone", func(t *testing.T, h *overlayHost, w wantNetworkState) {
			h.run(t, "ip", "link", "del", BridgeName(w.key.ID()))
		}},
		{"VXLANGone", func(t *testing.T, h *overlayHost, w wantNetworkState) {
			h.run(t, "ip", "link", "del", VXLANName(w.key.ID()))
		}},
		{"EndpointsFirst", func(t *testing.T, h *overlayHost, w wantNetworkState) {
			h.del(t, endpointObj("acme", "remote-ep", "blue", "n2").Key(), NodeKey("n2"))
			h.mustReconcile(t, w.key)
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newOverlayHost(t)
			w := h.dualStack(t)
			h.mustReconcile(t, w.key)
			c.before(t, h, w)
			h.del(t, w.key)
			if _, err := h.reconcile(t, w.key); err != nil {
				t.Fatalf("delete: %v", err)
			}
			h.requireGone(t, w.key, w.table)
		})
	}
}

// TestNetworkInvalidSpec: a spec the reconciler cannot program is FAILED with
// InvalidSpec, naming the field and the value, and writes nothing.
func TestNetworkInvalidSpec(t *testing.T) {
	h := newOverlayHost(t)
	h.put(t, nodeObj(localNode, "192.0.2.1"))
	for _, c := range []struct {
		obj  *nimbusv1.Object
		want string
	}{
		{networkObj("acme", "a", 0, 0), "spec.vni 0"},
		{networkObj("acme", "b", 1<<24, 0), "spec.vni 16777216"},
		{networkObj("acme", "c", 1, 60), "spec.mtu 60"},
		{networkObj("acme", "d", 1, 0, subnet("10.1.0.0/33", "")), `spec.subnets[0].cidr "10.1.0.0/33"`},
		{networkObj("acme", "e", 1, 0, subnet("10.1.0.0/24", "10.2.0.1")), `spec.subnets[0].gateway "10.2.0.1": not inside 10.1.0.0/24`},
		{networkObj("acme", "f", 1, 0, subnet("10.1.0.0/24", ""), subnet("10.1.0.0/16", "")), `spec.subnets[1].cidr "10.1.0.0/16": overlaps`},
	} {
		h.put(t, c.obj)
		_, err := h.reconcile(t, c.obj.Key())
		if hal.ReasonOf(err) != hal.ReasonInvalid || !strings.Contains(fmt.Sprint(err), c.want) {
			t.Errorf("reconcile %s: err = %v, want %s naming %s", c.obj.GetMeta().GetName(), err, hal.ReasonInvalid, c.want)
		}
	}
	if h.rec.KernelWrites() != 0 {
		t.Errorf("invalid networks wrote the kernel %d times", h.rec.KernelWrites())
	}
}

// TestNetworkReconcileHonoursContext: a reconcile whose context has ended writes nothing
// and says why, and the reconciler works normally afterwards.
func TestNetworkReconcileHonoursContext(t *testing.T) {
	h := newOverlayHost(t)
	obj := networkObj("acme", "blue", 100, 0, subnet("10.1.0.0/24", "10.1.0.1"))
	h.put(t, nodeObj(localNode, "192.0.2.1"), obj)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := h.rec.Reconcile(ctx, obj.Key(), obj); !errors.Is(err, context.Canceled) {
		t.Fatalf("Reconcile with an ended context: err = %v, want context.Canceled", err)
	}
	if h.hasLink(t, BridgeName(obj.Key().ID())) || h.rec.KernelWrites() != 0 {
		t.Fatal("Reconcile with an ended context wrote the kernel")
	}
	h.mustReconcile(t, obj.Key())
	if !h.hasLink(t, BridgeName(obj.Key().ID())) {
		t.Fatal("no bridge after a reconcile with a live context")
	}
}

// TestRecordRemoteEndpoints: the endpoints a network's reconcile counted, those of its
// tenant and namespace kept by name and any other by key, lead to the network until a
// later reconcile of it no longer counts them, or one of another network does.
func TestRecordRemoteEndpoints(t *testing.T) {
	r := &NetworkReconciler{endpointsOf: map[nimbusv1.Key]*remoteEndpointSet{}}
	blue := nimbusv1.MakeKey(nimbusv1.Kind_KIND_NETWORK, "acme", "prod", "blue")
	red := nimbusv1.MakeKey(nimbusv1.Kind_KIND_NETWORK, "acme", "prod", "red")
	ep := func(ns, name string) nimbusv1.Key {
		return nimbusv1.MakeKey(nimbusv1.Kind_KIND_ENDPOINT, "acme", ns, name)
	}
	a, b, other := ep("prod", "a"), ep("prod", "b"), ep("dev", "c")
	networkOf := func(k nimbusv1.Key) string {
		eps, ok := r.remoteEndpoints.Get(k)
		if !ok {
			return ""
		}
		return eps.network.Name
	}
	r.recordRemoteEndpoints(blue, []nimbusv1.Key{a, b, other})
	for _, k := range []nimbusv1.Key{a, b, other} {
		if got := networkOf(k); got != "blue" {
			t.Errorf("after blue's reconcile, %v leads to %q, want blue", k, got)
		}
	}
	r.recordRemoteEndpoints(red, []nimbusv1.Key{b}) // b moved to red
	r.recordRemoteEndpoints(blue, []nimbusv1.Key{a})
	for k, want := range map[nimbusv1.Key]string{a: "blue", b: "red", other: ""} {
		if got := networkOf(k); got != want {
			t.Errorf("after b moved to red and c left, %v leads to %q, want %q", k, got, want)
		}
	}
	r.recordRemoteEndpoints(blue, nil)
	r.recordRemoteEndpoints(red, nil)
	if n := r.remoteEndpoints.Len(); n != 0 || len(r.endpointsOf) != 0 {
		t.Errorf("after both networks counted none, %d endpoints and %d networks are left", n, len(r.endpointsOf))
	}
}
