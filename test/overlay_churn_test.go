//go:build linux

package test

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/naplesnet/naples/hal/linux"
	"github.com/naplesnet/naples/internal/testns"
	"github.com/naplesnet/naples/internal/testrand"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// This file churns the overlay: the same desired set of Nodes, Networks, Endpoints and
// Routes is reached again and again through random sequences of applies, changes and
// deletes, and each time every host's kernel must hold the very same state of naples's.

// stateReader reads the kernel state of naples's in one host, through a netlink handle
// bound to the host's namespace.
type stateReader struct {
	name string // the namespace's name, for ip(8)
	ns   netns.NsHandle
	nl   *netlink.Handle
}

// newStateReader returns a reader of the host's kernel, closed when the test ends.
func newStateReader(t testing.TB, h *host) *stateReader {
	t.Helper()
	ns := testns.Handle(t, h.ns)
	nh, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatalf("netlink handle in %s: %v", h.name, err)
	}
	t.Cleanup(nh.Close)
	return &stateReader{name: h.ns, ns: ns, nl: nh}
}

// naplesLink tells whether a link is naples's: marked with its alias, or named like a
// network's bridge or VXLAN device (linux.BridgeName, linux.VXLANName), for an unmarked
// one would be a leak too.
func naplesLink(l netlink.Link) bool {
	a := l.Attrs()
	_, marked := linux.OwnerOfAlias(a.Alias)
	return marked || strings.HasPrefix(a.Name, "nbr") || strings.HasPrefix(a.Name, "nvx")
}

// state returns a canonical dump of naples's kernel state in the host, one sorted line per
// object, the same whenever the host holds the same state:
//
//   - "link": naples's links (bridges and VXLAN devices) with their kind, alias, master,
//     MTU, admin state, and for a bridge its MAC address, for a VXLAN device its VNI,
//     local address, port and flags. A VXLAN device's own MAC address is random when it
//     is made and no one uses it, so it is left out;
//   - "port": the ports of naples's bridges (VXLAN devices and endpoints' interfaces)
//     with their MTU, admin state and bridge port flags;
//   - "addr": the addresses of naples's links but IPv6 link-local ones, with their flags;
//   - "rule": policy-routing rules from or at the priorities of naples's bridges;
//   - "route": routes of protocols 241 and 242 in every table, both families;
//   - "fdb": static and permanent FDB entries of naples's links and bridge ports; the
//     bridge's entries for its ports' own addresses name the address "own" (see link);
//     dynamic entries, learned from traffic, are left out;
//   - "neigh": permanent neighbours on naples's links; dynamic ones, and the kernel's own
//     NOARP ones of multicast groups, are left out;
//   - "sysctl": the forwarding sysctls of naples's bridges.
func (r *stateReader) state() ([]string, error) {
	var lines []string
	var err error
	// The kernel may change between the dumps of one read (a port released between the
	// list of links and the read of its flags): read again.
	for range 20 {
		if lines, err = r.read(); err == nil {
			slices.Sort(lines)
			return lines, nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil, err
}

// read is state's single attempt; it fails when the kernel changed during a dump
// (netlink.ErrDumpInterrupted) or between two.
func (r *stateReader) read() ([]string, error) {
	links, err := r.nl.LinkList()
	if err != nil {
		return nil, fmt.Errorf("listing links: %w", err)
	}
	name := map[int]string{}
	mine := map[int]bool{}
	bridges := map[int]bool{}
	for _, l := range links {
		a := l.Attrs()
		name[a.Index] = a.Name
		if naplesLink(l) {
			mine[a.Index] = true
			if l.Type() == "bridge" {
				bridges[a.Index] = true
			}
		}
	}
	nameOf := func(i int) string {
		if i == 0 {
			return "-"
		}
		if n, ok := name[i]; ok {
			return n
		}
		return fmt.Sprintf("if%d", i)
	}
	var lines []string
	add := func(format string, args ...any) { lines = append(lines, fmt.Sprintf(format, args...)) }
	ownMAC := map[string]bool{}
	port := map[int]bool{}
	for _, l := range links {
		a := l.Attrs()
		up := a.Flags&net.FlagUp != 0
		if mine[a.Index] {
			switch v := l.(type) {
			case *netlink.Bridge:
				add("link %s bridge alias=%q master=%s mtu=%d up=%v mac=%s", a.Name, a.Alias, nameOf(a.MasterIndex), a.MTU, up, a.HardwareAddr)
			case *netlink.Vxlan:
				add("link %s vxlan alias=%q master=%s mtu=%d up=%v vni=%d local=%s group=%s dev=%s port=%d learning=%v proxy=%v l2miss=%v l3miss=%v flowbased=%v",
					a.Name, a.Alias, nameOf(a.MasterIndex), a.MTU, up, v.VxlanId, v.SrcAddr, v.Group, nameOf(v.VtepDevIndex),
					v.Port, v.Learning, v.Proxy, v.L2miss, v.L3miss, v.FlowBased)
			default:
				add("link %s %s alias=%q master=%s mtu=%d up=%v mac=%s", a.Name, l.Type(), a.Alias, nameOf(a.MasterIndex), a.MTU, up, a.HardwareAddr)
			}
		}
		if bridges[a.MasterIndex] {
			port[a.Index] = true
			ownMAC[fmt.Sprintf("%d|%s", a.Index, a.HardwareAddr)] = true
			pi, err := r.nl.LinkGetProtinfo(l)
			if err != nil {
				return nil, fmt.Errorf("reading bridge port flags of %s: %w", a.Name, err)
			}
			add("port %s master=%s mtu=%d up=%v learning=%v flood=%v neigh_suppress=%v proxy_arp=%v hairpin=%v isolated=%v",
				a.Name, nameOf(a.MasterIndex), a.MTU, up, pi.Learning, pi.Flood, pi.NeighSuppress, pi.ProxyArp, pi.Hairpin, pi.Isolated)
		}
	}

	for _, l := range links {
		a := l.Attrs()
		if !mine[a.Index] {
			continue
		}
		addrs, err := r.nl.AddrList(l, netlink.FAMILY_ALL)
		if err != nil {
			return nil, fmt.Errorf("listing addresses of %s: %w", a.Name, err)
		}
		for _, ad := range addrs {
			if ad.IP.IsLinkLocalUnicast() {
				continue
			}
			add("addr %s %s flags=%#x scope=%d", a.Name, ad.IPNet, ad.Flags, ad.Scope)
		}
	}

	for family, flag := range map[int]string{netlink.FAMILY_V4: "-4", netlink.FAMILY_V6: "-6"} {
		// ip(8) rather than the netlink library, which does not decode a rule's action.
		out, err := exec.Command("ip", "-n", r.name, flag, "rule", "show").CombinedOutput()
		if err != nil {
			return nil, fmt.Errorf("listing rules: %v: %s", err, out)
		}
		for line := range strings.Lines(string(out)) {
			line = strings.Join(strings.Fields(line), " ")
			if strings.Contains(line, " iif nbr") || strings.HasPrefix(line, fmt.Sprintf("%d:", linux.TenantRulePriority)) ||
				strings.HasPrefix(line, fmt.Sprintf("%d:", linux.TenantRulePriority+1)) {
				add("rule family=%d %s", family, line)
			}
		}
		for _, proto := range []netlink.RouteProtocol{netlink.RouteProtocol(linux.RouteProtocol), netlink.RouteProtocol(linux.OverlayRouteProtocol)} {
			routes, err := r.nl.RouteListFiltered(family, &netlink.Route{Table: unix.RT_TABLE_UNSPEC, Protocol: proto},
				netlink.RT_FILTER_TABLE|netlink.RT_FILTER_PROTOCOL)
			if err != nil {
				return nil, fmt.Errorf("listing routes of protocol %d: %w", proto, err)
			}
			for _, rt := range routes {
				var hops []string
				for _, nh := range rt.MultiPath {
					hops = append(hops, fmt.Sprintf("%s@%s/%d", nh.Gw, nameOf(nh.LinkIndex), nh.Hops))
				}
				add("route table=%d dst=%v proto=%d type=%d scope=%d metric=%d dev=%s gw=%v src=%v hops=%v",
					rt.Table, rt.Dst, rt.Protocol, rt.Type, rt.Scope, rt.Priority, nameOf(rt.LinkIndex), rt.Gw, rt.Src, hops)
			}
		}
		neighs, err := r.nl.NeighList(0, family)
		if err != nil {
			return nil, fmt.Errorf("listing neighbours: %w", err)
		}
		for _, n := range neighs {
			if !mine[n.LinkIndex] || n.State&unix.NUD_PERMANENT == 0 {
				continue
			}
			add("neigh %s %s lladdr=%s state=%#x flags=%#x", nameOf(n.LinkIndex), n.IP, n.HardwareAddr, n.State, n.Flags)
		}
	}

	fdb, err := r.nl.NeighList(0, unix.AF_BRIDGE)
	if err != nil {
		return nil, fmt.Errorf("listing FDB entries: %w", err)
	}
	for _, n := range fdb {
		if !mine[n.LinkIndex] && !port[n.LinkIndex] {
			continue
		}
		if n.State&(unix.NUD_PERMANENT|unix.NUD_NOARP) == 0 {
			continue
		}
		mac := n.HardwareAddr.String()
		if n.MasterIndex != 0 && n.State&unix.NUD_PERMANENT != 0 && ownMAC[fmt.Sprintf("%d|%s", n.LinkIndex, n.HardwareAddr)] {
			// A port's own address, which the bridge holds for it: random for a VXLAN
			// device (see link).
			mac = "own"
		}
		add("fdb %s %s dst=%v vni=%d vlan=%d master=%s state=%#x flags=%#x", nameOf(n.LinkIndex), mac, n.IP, n.VNI, n.Vlan,
			nameOf(n.MasterIndex), n.State, n.Flags)
	}

	var names []string
	for i := range bridges {
		names = append(names, name[i])
	}
	sysctls, err := r.forwarding(names)
	if err != nil {
		return nil, err
	}
	return append(lines, sysctls...), nil
}

// forwarding returns the forwarding sysctls of the bridges, read inside the host's
// namespace: "sysctl PATH VALUE", the path under /proc/sys/net.
func (r *stateReader) forwarding(bridges []string) ([]string, error) {
	var lines []string
	err := inNamespace(r.ns, func() error {
		for _, br := range bridges {
			for _, p := range []string{"ipv4/conf/" + br + "/forwarding", "ipv6/conf/" + br + "/force_forwarding", "ipv6/conf/" + br + "/forwarding"} {
				v, err := os.ReadFile("/proc/sys/net/" + p)
				if errors.Is(err, os.ErrNotExist) {
					// Gone with its bridge, or a kernel without it.
					continue
				}
				if err != nil {
					return err
				}
				lines = append(lines, fmt.Sprintf("sysctl %s %s", p, strings.TrimSpace(string(v))))
			}
		}
		return nil
	})
	return lines, err
}

// inNamespace runs f on an OS thread in the namespace ns; unlike inNetns it takes an
// open handle, so that calling it often opens nothing.
func inNamespace(ns netns.NsHandle, f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// The thread is left locked and so dies with the goroutine: its namespace changed.
		if err := netns.Set(ns); err != nil {
			errc <- fmt.Errorf("entering namespace: %w", err)
			return
		}
		errc <- f()
	}()
	return <-errc
}

// mustState is state that fails the test on error.
func (r *stateReader) mustState(t testing.TB) []string {
	t.Helper()
	s, err := r.state()
	if err != nil {
		t.Fatalf("reading kernel state: %v", err)
	}
	return s
}

// stateDiff returns the lines only in want (prefixed "-") and only in got ("+").
func stateDiff(want, got []string) string {
	var b strings.Builder
	w := map[string]int{}
	for _, l := range want {
		w[l]++
	}
	g := map[string]int{}
	for _, l := range got {
		g[l]++
	}
	for _, l := range want {
		if g[l] == 0 {
			fmt.Fprintf(&b, "- %s\n", l)
		} else {
			g[l]--
		}
	}
	for _, l := range got {
		if w[l] == 0 {
			fmt.Fprintf(&b, "+ %s\n", l)
		} else {
			w[l]--
		}
	}
	return b.String()
}

// quickExit makes the race-enabled binaries that the test starts from now on exit at
// once: the race detector otherwise sleeps a second before a process exits (GORACE
// atexit_sleep_ms, 1000 by default), which every naplesctl call would pay.
func quickExit(t testing.TB) {
	t.Setenv("GORACE", strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
}

// churnObject is one object of the churn's desired set.
type churnObject struct {
	kind string
	name string
	// doc is the object as desired, a manifest document ending in "---\n".
	doc string
	// variant is the same object with another spec, applied in the middle of runs; empty
	// when the object has none.
	variant string
}

// churnState is where an object stands at nimbus during a run.
type churnState int

const (
	// churnAbsent: nimbus does not have the object.
	churnAbsent churnState = iota
	// churnDesired: nimbus has the object as desired.
	churnDesired
	// churnChanged: nimbus has the object's variant.
	churnChanged
)

// churnCluster is the churn's cluster: three hosts on one underlay, the desired set
// and the workloads whose traffic shows the set at work.
type churnCluster struct {
	c       *cluster
	hosts   []*host
	readers []*stateReader
	objects []churnObject
	state   []churnState
	rng     *rand.Rand
	// calls counts naplesctl apply and delete calls.
	calls int

	blueA, blueB, greenC, redA, redC *workload
}

// newChurnCluster starts nimbus, three hosts with agents and the workloads, and returns
// the cluster with every object of the set absent.
func newChurnCluster(t *testing.T, rng *rand.Rand) *churnCluster {
	c := newCluster(t)
	u := newUnderlay(t)
	cc := &churnCluster{c: c, rng: rng}
	var vteps []string
	for _, n := range []string{"host-a", "host-b", "host-c"} {
		h := c.addHost(t, n, n)
		vteps = append(vteps, u.attach(t, h))
		h.startAgent(t)
		cc.hosts = append(cc.hosts, h)
		cc.readers = append(cc.readers, newStateReader(t, h))
	}
	a, b, hc := cc.hosts[0], cc.hosts[1], cc.hosts[2]

	cc.blueA = newWorkload(t, a, "wblue-a", "02:00:00:00:01:0a", []string{"10.1.0.10/24", "fd00:1::a/64"}, "10.1.0.1", "fd00:1::1")
	cc.blueB = newWorkload(t, b, "wblue-b", "02:00:00:00:01:0b", []string{"10.1.0.11/24", "fd00:1::b/64"}, "10.1.0.1", "fd00:1::1")
	cc.greenC = newWorkload(t, hc, "wgreen-c", "02:00:00:00:02:0c", []string{"10.2.0.12/24"}, "10.2.0.1")
	cc.redA = newWorkload(t, a, "wred-a", "02:00:00:00:03:0a", []string{"10.3.0.10/24"}, "10.3.0.1")
	cc.redC = newWorkload(t, hc, "wred-c", "02:00:00:00:03:0c", []string{"10.3.0.12/24"}, "10.3.0.1")
	// A service address behind wblue-a, which the tenant route r-svc leads to.
	testns.Run(t, "ip", "-n", cc.blueA.ns, "addr", "add", "172.16.0.5/32", "dev", "lo")
	for _, w := range []*workload{cc.blueA, cc.blueB, cc.greenC, cc.redA, cc.redC} {
		w.serve(t)
	}

	node := func(h *host, vtep string) churnObject {
		return churnObject{kind: "node", name: h.name, doc: nodeYAML(h, vtep)}
	}
	endpoint := func(w *workload, tenant, network string, h *host) churnObject {
		return churnObject{kind: "endpoint", name: w.name, doc: w.endpointYAML(tenant, network, h)}
	}
	cc.objects = []churnObject{
		node(a, vteps[0]),
		// host-b's VTEP moves to an address no interface holds, and back.
		{kind: "node", name: b.name, doc: nodeYAML(b, vteps[1]), variant: nodeYAML(b, "192.168.100.99")},
		node(hc, vteps[2]),
		{kind: "network", name: "blue", doc: `kind: Network
meta: {name: blue}
spec:
  vni: 100
  mtu: 1450
  subnets:
  - {cidr: 10.1.0.0/24, gateway: 10.1.0.1}
  - {cidr: "fd00:1::/64", gateway: "fd00:1::1"}
---
`,
			// Another MTU, and another IPv6 gateway. (Without the IPv6 subnet nimbus would
			// refuse it, or the endpoints with IPv6 addresses after it: an endpoint's
			// addresses are inside its network's subnets.)
			variant: `kind: Network
meta: {name: blue}
spec:
  vni: 100
  mtu: 1400
  subnets:
  - {cidr: 10.1.0.0/24, gateway: 10.1.0.1}
  - {cidr: "fd00:1::/64", gateway: "fd00:1::fe"}
---
`},
		// A change of VNI makes green's VXLAN device anew.
		{kind: "network", name: "green", doc: "kind: Network\nmeta: {name: green}\nspec: {vni: 200, subnet: 10.2.0.0/24, gateway: 10.2.0.1}\n---\n",
			variant: "kind: Network\nmeta: {name: green}\nspec: {vni: 201, subnet: 10.2.0.0/24, gateway: 10.2.0.1}\n---\n"},
		{kind: "network", name: "red", doc: "kind: Network\nmeta: {name: red, tenant: acme}\nspec: {vni: 300, subnet: 10.3.0.0/24, gateway: 10.3.0.1}\n---\n"},
		// wblue-a answers from the service address behind it: it may send from it.
		{kind: "endpoint", name: cc.blueA.name, doc: strings.Replace(cc.blueA.endpointYAML("default", "blue", a),
			"\n---\n", "\n  allowedSourcePrefixes: [172.16.0.0/24]\n---\n", 1)},
		// wblue-b's address moves and comes back.
		{kind: "endpoint", name: cc.blueB.name, doc: cc.blueB.endpointYAML("default", "blue", b),
			variant: strings.Replace(cc.blueB.endpointYAML("default", "blue", b), "10.1.0.11", "10.1.0.21", 1)},
		endpoint(cc.greenC, "default", "green", hc),
		endpoint(cc.redA, "acme", "red", a),
		// wred-c moves to host-b, which has no such interface, and back.
		{kind: "endpoint", name: cc.redC.name, doc: cc.redC.endpointYAML("acme", "red", hc),
			variant: strings.Replace(cc.redC.endpointYAML("acme", "red", hc), "node: host-c", "node: host-b", 1)},
		{kind: "route", name: "r-dc2", doc: `kind: Route
meta: {name: r-dc2}
spec: {table: 100, prefix: 198.51.100.0/24, nexthops: [{gateway: 10.10.0.2}]}
---
`, variant: `kind: Route
meta: {name: r-dc2}
spec: {table: 100, prefix: 198.51.100.0/24, nexthops: [{gateway: 10.20.0.2}]}
---
`},
		// Routes in the tenants' tables: acme's to outside through the host's eth0, and
		// on host-c only, default's to the service behind wblue-a, whose next hop is in
		// network blue, so that the route goes through blue's bridge.
		{kind: "route", name: "r-acme-out", doc: `kind: Route
meta: {name: r-acme-out, tenant: acme}
spec: {tenantTable: true, prefix: 192.0.2.0/24, nexthops: [{gateway: 10.10.0.2}]}
---
`, variant: `kind: Route
meta: {name: r-acme-out, tenant: acme}
spec: {tenantTable: true, prefix: 192.0.2.0/24, metric: 50, nexthops: [{gateway: 10.10.0.2}]}
---
`},
		{kind: "route", name: "r-svc", doc: `kind: Route
meta: {name: r-svc, nodes: [host-c]}
spec: {tenantTable: true, prefix: 172.16.0.0/24, nexthops: [{gateway: 10.1.0.10}]}
---
`},
	}
	cc.state = make([]churnState, len(cc.objects))
	return cc
}

// do applies (or deletes) the objects with the indexes, one naplesctl call, and records
// their new state.
func (cc *churnCluster) do(t *testing.T, to churnState, idx []int) {
	t.Helper()
	var docs, names []string
	for _, i := range idx {
		o := cc.objects[i]
		names = append(names, o.kind+"/"+o.name)
		switch to {
		case churnChanged:
			docs = append(docs, o.variant)
		default:
			docs = append(docs, o.doc)
		}
		cc.state[i] = to
	}
	cc.calls++
	if to == churnAbsent {
		t.Logf("delete %s", strings.Join(names, " "))
		cc.c.mustCtl(t, strings.Join(docs, ""), "delete", "-f", "-")
		return
	}
	if to == churnChanged {
		t.Logf("apply %s (changed)", strings.Join(names, " "))
	} else {
		t.Logf("apply %s", strings.Join(names, " "))
	}
	cc.c.apply(t, strings.Join(docs, ""))
}

// batches runs do over idx in order, in batches of one to three objects.
func (cc *churnCluster) batches(t *testing.T, to churnState, idx []int) {
	t.Helper()
	for len(idx) > 0 {
		k := min(1+cc.rng.IntN(3), len(idx))
		cc.do(t, to, idx[:k])
		idx = idx[k:]
	}
}

// churn changes the set at random: steps times it picks an object and deletes it, applies
// its variant or applies it as desired, one to three objects of one kind of step per
// naplesctl call.
func (cc *churnCluster) churn(t *testing.T, steps int) {
	t.Helper()
	for steps > 0 {
		to := churnState(cc.rng.IntN(3))
		var idx []int
		for k := 1 + cc.rng.IntN(3); k > 0 && steps > 0; k-- {
			steps--
			i := cc.rng.IntN(len(cc.objects))
			if slices.Contains(idx, i) || (to == churnChanged && cc.objects[i].variant == "") || (to == churnAbsent && cc.state[i] == churnAbsent) {
				continue
			}
			idx = append(idx, i)
		}
		if len(idx) > 0 {
			cc.do(t, to, idx)
		}
	}
}

// applyAll applies, in random order, every object that is not as desired.
func (cc *churnCluster) applyAll(t *testing.T) {
	t.Helper()
	var idx []int
	for _, i := range cc.rng.Perm(len(cc.objects)) {
		if cc.state[i] != churnDesired {
			idx = append(idx, i)
		}
	}
	cc.batches(t, churnDesired, idx)
}

// deleteAll deletes, in random order, every object that nimbus has.
func (cc *churnCluster) deleteAll(t *testing.T) {
	t.Helper()
	var idx []int
	for _, i := range cc.rng.Perm(len(cc.objects)) {
		if cc.state[i] != churnAbsent {
			idx = append(idx, i)
		}
	}
	cc.batches(t, churnAbsent, idx)
}

// overlayUnprogrammed describes the Nodes, Networks, Endpoints and Routes at nimbus that
// are not PROGRAMMED at their current generation on every node they target, or returns
// the error of listing them.
func overlayUnprogrammed(t *testing.T, c *cluster) ([]string, error) {
	t.Helper()
	var out []string
	for _, kind := range []string{"nodes", "networks", "endpoints", "routes"} {
		list, err := c.ctl(t, "", "get", kind, "-o", "json")
		if err != nil {
			return nil, err
		}
		var doc struct {
			Items []struct {
				Meta   json.RawMessage `json:"meta"`
				Status json.RawMessage `json:"status"`
			} `json:"items"`
		}
		if err := json.Unmarshal([]byte(list), &doc); err != nil {
			return nil, fmt.Errorf("parsing %.200q: %w", list, err)
		}
		for _, it := range doc.Items {
			meta, st := &nimbusv1.ObjectMeta{}, &nimbusv1.ObjectStatus{}
			if err := protojson.Unmarshal(it.Meta, meta); err != nil {
				return nil, fmt.Errorf("parsing meta %s: %w", it.Meta, err)
			}
			if len(it.Status) > 0 {
				if err := protojson.Unmarshal(it.Status, st); err != nil {
					return nil, fmt.Errorf("parsing status %s: %w", it.Status, err)
				}
			}
			if st.GetGeneration() != meta.GetGeneration() || st.GetTargetNodes() == 0 || st.GetProgrammedNodes() != st.GetTargetNodes() {
				var nodes []string
				for _, n := range st.GetNodes() {
					nodes = append(nodes, fmt.Sprintf("%s %s %s at generation %d", n.GetNode(),
						strings.TrimPrefix(n.GetPhase().String(), "PHASE_"), n.GetReason(), n.GetObservedGeneration()))
				}
				out = append(out, fmt.Sprintf("%s %s/%s generation %d: programmed on %d of %d nodes, pending on %v; reported: %s",
					kind, meta.GetTenant(), meta.GetName(), meta.GetGeneration(), st.GetProgrammedNodes(), st.GetTargetNodes(),
					st.GetPending(), strings.Join(nodes, "; ")))
			}
		}
	}
	return out, nil
}

// waitOverlayProgrammed waits until every Node, Network, Endpoint and Route at nimbus is
// PROGRAMMED at its current generation on every node it targets.
func waitOverlayProgrammed(t *testing.T, c *cluster) {
	t.Helper()
	var last []string
	end := time.Now().Add(deadline)
	for {
		bad, err := overlayUnprogrammed(t, c)
		if err == nil && len(bad) == 0 {
			return
		}
		if err != nil {
			bad = []string{err.Error()}
		}
		last = bad
		if time.Now().After(end) {
			t.Fatalf("timed out after %v waiting for every object to be PROGRAMMED everywhere; not yet:\n%s", deadline, strings.Join(last, "\n"))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitStates waits until every host's kernel state is want[host], and fails the test with
// the differences when one does not get there.
func (cc *churnCluster) waitStates(t *testing.T, what string, want [][]string) {
	t.Helper()
	end := time.Now().Add(deadline)
	for i, r := range cc.readers {
		for {
			got := r.mustState(t)
			if slices.Equal(got, want[i]) {
				break
			}
			if time.Now().After(end) {
				t.Fatalf("%s: %s's kernel state differs after %v (- want, + got):\n%s", what, cc.hosts[i].name, deadline, stateDiff(want[i], got))
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// churnFlow is a flow the desired set allows: from a workload to an address.
type churnFlow struct {
	from *workload
	to   string
	// tcpOnly is set for an address that is not the workload's primary one: its UDP echo
	// server answers from the primary address, which a connected client refuses.
	tcpOnly bool
}

// reaches returns the flows the desired set allows.
func (cc *churnCluster) reaches() []churnFlow {
	return []churnFlow{
		{cc.blueA, cc.blueB.ip(4), false},  // blue across hosts a and b
		{cc.blueB, cc.blueA.ip(6), false},  // the same over IPv6
		{cc.greenC, cc.blueA.ip(4), false}, // green to blue through the gateways, host-c to host-a
		{cc.blueB, cc.greenC.ip(4), false}, // and blue to green, host-b to host-c
		{cc.redA, cc.redC.ip(4), false},    // red across hosts a and c, in tenant acme
		{cc.greenC, "172.16.0.5", true},    // the tenant route r-svc on host-c, to wblue-a on host-a
	}
}

// wantTraffic waits until every flow of the set passes over UDP, and with tcp over TCP
// too (a tcpOnly flow always over TCP); with isolation it also checks that flows between
// tenants do not pass.
func (cc *churnCluster) wantTraffic(t *testing.T, tcp, isolation bool) {
	t.Helper()
	for _, r := range cc.reaches() {
		protos := []string{"udp"}
		switch {
		case r.tcpOnly:
			protos = []string{"tcp"}
		case tcp:
			protos = append(protos, "tcp")
		}
		for _, proto := range protos {
			waitFor(t, fmt.Sprintf("%s to reach %s over %s", r.from.name, r.to, proto), func() bool {
				return r.from.exchange(t, proto, r.to, 500*time.Millisecond)
			})
		}
	}
	if !isolation {
		return
	}
	// Flows between tenants, tried at once; each must time out.
	blocked := []churnFlow{
		{cc.redA, cc.blueA.ip(4), false},
		{cc.redC, cc.greenC.ip(4), false},
		{cc.blueB, cc.redC.ip(4), false},
		{cc.greenC, cc.redA.ip(4), false},
		{cc.redA, "172.16.0.5", false},
	}
	var wg sync.WaitGroup
	passed := make([]bool, len(blocked))
	for i, r := range blocked {
		wg.Go(func() {
			for _, proto := range []string{"udp", "tcp"} {
				if r.from.exchange(t, proto, r.to, 300*time.Millisecond) {
					passed[i] = true
				}
			}
		})
	}
	wg.Wait()
	for i, r := range blocked {
		if passed[i] {
			t.Errorf("%s reached %s in another tenant; want no path", r.from.name, r.to)
		}
	}
}

// churnRuns is how many times the churn reaches the desired set.
const churnRuns = 20

// TestOverlayChurn reaches one desired set of three Nodes, three Networks in two tenants,
// five Endpoints and three Routes (two in tenants' tables, one of them through a
// workload) on three hosts again and again. The first run applies the set in random order,
// one to three objects per naplesctl call, and records every host's kernel state of
// naples's (links, ports, addresses, rules, routes, FDB entries, neighbours, sysctls; see
// stateReader.state) once every object is PROGRAMMED and the workloads reach each other
// as the set allows and no further. Each of the 19 runs after it deletes, changes and
// applies objects at random, now and then deletes everything first, and ends by applying
// the whole set again: the kernel state on every host must then equal the first run's,
// every object must be PROGRAMMED on every node it targets, and traffic must flow. Then
// everything is deleted in random order and no kernel object of naples's is left on any
// host. The seed is logged; NAPLES_TEST_SEED replays a run.
func TestOverlayChurn(t *testing.T) {
	quickExit(t)
	rng := rand.New(rand.NewPCG(testrand.Seed(t), 0))
	cc := newChurnCluster(t, rng)
	began := time.Now()

	// The first run: the set from nothing.
	cc.applyAll(t)
	waitOverlayProgrammed(t, cc.c)
	var want [][]string
	for _, r := range cc.readers {
		want = append(want, r.mustState(t))
	}
	t.Cleanup(func() {
		if t.Failed() {
			for i, h := range cc.hosts {
				t.Logf("%s's kernel state of naples's after the first run:\n%s", h.name, strings.Join(want[i], "\n"))
			}
		}
	})
	cc.wantTraffic(t, true, true)
	cc.waitStates(t, "the first run, after traffic", want)

	for run := 1; run < churnRuns; run++ {
		t.Logf("run %d", run)
		if run%5 == 0 {
			// Now and then from nothing, so that the set is built in a new order.
			cc.deleteAll(t)
		}
		cc.churn(t, 2*len(cc.objects))
		cc.applyAll(t)
		cc.waitStates(t, fmt.Sprintf("run %d", run), want)
		waitOverlayProgrammed(t, cc.c)
		last := run == churnRuns-1
		cc.wantTraffic(t, last, last)
		// Traffic leaves nothing of naples's behind.
		cc.waitStates(t, fmt.Sprintf("run %d, after traffic", run), want)
	}

	cc.deleteAll(t)
	none := make([][]string, len(cc.hosts))
	cc.waitStates(t, "after deleting everything", none)
	t.Logf("%d runs, %d naplesctl calls, %v", churnRuns, cc.calls, time.Since(began).Round(time.Millisecond))
}
