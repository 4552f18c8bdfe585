package test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/naplesnet/naples/internal/testns"
	"github.com/naplesnet/naples/internal/testrand"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// The firewall tests run six workloads, three on each of two hosts, in one network of
// the default tenant, and send every kind of probe between every ordered pair of them:
// the outcomes must be those of truth tables written by hand from the firewall's
// semantics (TestFirewallTruthTable), and those of the reference evaluator for random
// groups and policies (TestFirewallRandom).

// fwEndpointDef is a workload of the firewall tests and its Endpoint.
type fwEndpointDef struct {
	name string
	// host is the index of the host in fwHosts.
	host   int
	mac    string
	v4, v6 string
}

// fwHosts are the hosts of the firewall tests.
var fwHosts = []string{"host-a", "host-b"}

// fwEndpointDefs are the workloads: web1, app1 and db1 on host-a; web2, db2 and ops on
// host-b. All are in network fwNetwork, 10.1.0.0/24 and fd00:1::/64.
var fwEndpointDefs = []fwEndpointDef{
	{"web1", 0, "02:00:00:00:f0:01", "10.1.0.11", "fd00:1::11"},
	{"app1", 0, "02:00:00:00:f0:02", "10.1.0.21", "fd00:1::21"},
	{"db1", 0, "02:00:00:00:f0:03", "10.1.0.31", "fd00:1::31"},
	{"web2", 1, "02:00:00:00:f0:04", "10.1.0.12", "fd00:1::12"},
	{"db2", 1, "02:00:00:00:f0:05", "10.1.0.32", "fd00:1::32"},
	{"ops", 1, "02:00:00:00:f0:06", "10.1.0.200", "fd00:1::200"},
}

// fwNetwork is the network of the firewall tests' endpoints.
const fwNetwork = "apps"

// fwNames returns the names of the workloads.
func fwNames() []string {
	var names []string
	for _, d := range fwEndpointDefs {
		names = append(names, d.name)
	}
	return names
}

// fwDefAddr is the fwAddrOf of fwEndpointDefs, for checks that need no cluster.
func fwDefAddr(name string, family int) netip.Addr {
	for _, d := range fwEndpointDefs {
		if d.name == name {
			if family == 6 {
				return netip.MustParseAddr(d.v6)
			}
			return netip.MustParseAddr(d.v4)
		}
	}
	panic("no firewall test workload named " + name)
}

// fwEndpoints returns the Endpoint objects of the workloads, each listing the groups
// groups gives it.
func fwEndpoints(groups map[string][]string) []*nimbusv1.Object {
	var out []*nimbusv1.Object
	for _, d := range fwEndpointDefs {
		out = append(out, fwEndpointObject(d.name, fwNetwork, fwHosts[d.host], d.mac, []string{d.v4, d.v6}, groups[d.name]...))
	}
	return out
}

// fwKinds are the probes every table sends between every ordered pair of workloads: the
// ports lie inside, at the edge of and outside the policies' ranges, and IPv6 probes
// show that IPv4 CIDRs do not match IPv6 peers while groups match both.
var fwKinds = mustFWKinds("tcp/22", "tcp/80", "tcp/5432", "tcp/8080", "tcp/8088", "udp/53", "udp/123", "icmp", "tcp6/8088", "icmp6")

// fwPortsOf returns the ports of the kinds with the protocol, each once.
func fwPortsOf(kinds []fwKind, proto string) []uint16 {
	var out []uint16
	for _, k := range kinds {
		if k.proto == proto && !slices.Contains(out, k.port) {
			out = append(out, k.port)
		}
	}
	return out
}

// The truth table's objects.
//
// Groups: web (listed by web1, web2 and app1), backend (listed by app1, db1 and db2) and
// admin (no endpoint lists it; its member is the CIDR 10.1.0.192/26, where ops's IPv4
// address is; the update adds fd00:1::200/120, ops's IPv6 address). app1 is in both web
// and backend; ops lists no group (it is in admin by its address alone) and no policy
// protects it.
//
// Policies:
//   - web, on web: ingress allows tcp 80 and 443 from anyone and icmp from admin; egress
//     allows tcp 8080-8089 to backend, udp 53 to anyone, icmp to anyone, and denies icmp
//     to 10.1.0.192/26.
//   - backend, on backend: ingress allows tcp 8080-8089 from web, tcp 5432 from backend,
//     anything from admin and udp 53 from anyone; no egress rules.
//   - guard, on backend: ingress denies tcp 8085-8089 from 10.1.0.11/32 (web1's IPv4
//     address) and udp from web. The update replaces the first rule with a denial of tcp
//     5432 from 10.1.0.32/32 (db2's IPv4 address).
//
// So web1 and web2 are protected by web both ways; db1 and db2 by backend and guard on
// ingress, their egress open; app1 by all three on ingress (their allowances together,
// less guard's denials) and by web on egress.

// fwTruthGroupsOf are the groups each workload lists in the truth table.
var fwTruthGroupsOf = map[string][]string{
	"web1": {"web"}, "app1": {"web", "backend"}, "db1": {"backend"},
	"web2": {"web"}, "db2": {"backend"}, "ops": nil,
}

// fwTruthGroups returns the truth table's SecurityGroups, before or after the update.
func fwTruthGroups(updated bool) []*nimbusv1.Object {
	admin := fwGroupObject("admin", "10.1.0.192/26")
	if updated {
		admin = fwGroupObject("admin", "10.1.0.192/26", "fd00:1::200/120")
	}
	return []*nimbusv1.Object{fwGroupObject("web"), fwGroupObject("backend"), admin}
}

// fwTruthPolicies returns the truth table's NetworkSecurityPolicies, before or after the
// update.
func fwTruthPolicies(updated bool) []*nimbusv1.Object {
	guard := fwRules(denyIn("tcp", fwPorts("8085-8089"), "10.1.0.11/32"), denyIn("udp", nil, "group:web"))
	if updated {
		guard = fwRules(denyIn("tcp", fwPorts("5432"), "10.1.0.32/32"), denyIn("udp", nil, "group:web"))
	}
	return []*nimbusv1.Object{
		fwPolicyObject("web", []string{"web"},
			fwRules(
				allowIn("tcp", fwPorts("80", "443")),
				allowIn("icmp", nil, "group:admin")),
			fwRules(
				allowOut("tcp", fwPorts("8080-8089"), "group:backend"),
				allowOut("udp", fwPorts("53")),
				allowOut("icmp", nil),
				denyOut("icmp", nil, "10.1.0.192/26"))),
		fwPolicyObject("backend", []string{"backend"},
			fwRules(
				allowIn("tcp", fwPorts("8080-8089"), "group:web"),
				allowIn("tcp", fwPorts("5432"), "group:backend"),
				allowIn("", nil, "group:admin"),
				allowIn("udp", fwPorts("53"))),
			nil),
		fwPolicyObject("guard", []string{"backend"}, guard, nil),
	}
}

// fwTruthObjects returns every firewall object of the truth table, before or after the
// update.
func fwTruthObjects(updated bool) []*nimbusv1.Object {
	objs := fwEndpoints(fwTruthGroupsOf)
	objs = append(objs, fwTruthGroups(updated)...)
	return append(objs, fwTruthPolicies(updated)...)
}

// fwTableBefore is the truth table of the policies before the update, worked out by hand
// from the policies above: rows are sources, columns destinations, ✓ delivered, ✗
// dropped.
var fwTableBefore = []fwHandKind{
	// Only ops (admin) reaches backend on 22, and db1 and db2 reach ops, which is open;
	// web's egress allows no tcp/22.
	{"tcp/22", `
		      web1 app1 db1  web2 db2  ops
		web1  -    ✗    ✗    ✗    ✗    ✗
		app1  ✗    -    ✗    ✗    ✗    ✗
		db1   ✗    ✗    -    ✗    ✗    ✓
		web2  ✗    ✗    ✗    -    ✗    ✗
		db2   ✗    ✗    ✗    ✗    -    ✓
		ops   ✗    ✓    ✓    ✗    ✓    -`},
	// web's ingress takes tcp/80 from anyone (app1 too, through web), but its egress
	// sends tcp only to 8080-8089; backend takes tcp/80 from admin only.
	{"tcp/80", `
		      web1 app1 db1  web2 db2  ops
		web1  -    ✗    ✗    ✗    ✗    ✗
		app1  ✗    -    ✗    ✗    ✗    ✗
		db1   ✓    ✓    -    ✓    ✗    ✓
		web2  ✗    ✗    ✗    -    ✗    ✗
		db2   ✓    ✓    ✗    ✓    -    ✓
		ops   ✓    ✓    ✓    ✓    ✓    -`},
	// Backend to backend, and admin to backend; web's egress allows no tcp/5432.
	{"tcp/5432", `
		      web1 app1 db1  web2 db2  ops
		web1  -    ✗    ✗    ✗    ✗    ✗
		app1  ✗    -    ✗    ✗    ✗    ✗
		db1   ✗    ✓    -    ✗    ✓    ✓
		web2  ✗    ✗    ✗    -    ✗    ✗
		db2   ✗    ✓    ✓    ✗    -    ✓
		ops   ✗    ✓    ✓    ✗    ✓    -`},
	// web (app1 included) to backend (app1 included) in both policies' range.
	{"tcp/8080", `
		      web1 app1 db1  web2 db2  ops
		web1  -    ✓    ✓    ✗    ✓    ✗
		app1  ✗    -    ✓    ✗    ✓    ✗
		db1   ✗    ✗    -    ✗    ✗    ✓
		web2  ✗    ✓    ✓    -    ✓    ✗
		db2   ✗    ✗    ✗    ✗    -    ✓
		ops   ✗    ✓    ✓    ✗    ✓    -`},
	// As tcp/8080, but guard denies web1's IPv4 address 8085-8089 into backend.
	{"tcp/8088", `
		      web1 app1 db1  web2 db2  ops
		web1  -    ✗    ✗    ✗    ✗    ✗
		app1  ✗    -    ✓    ✗    ✓    ✗
		db1   ✗    ✗    -    ✗    ✗    ✓
		web2  ✗    ✓    ✓    -    ✓    ✗
		db2   ✗    ✗    ✗    ✗    -    ✓
		ops   ✗    ✓    ✓    ✗    ✓    -`},
	// backend takes udp/53 from anyone, but guard denies udp from web; web's ingress
	// takes no udp; ops is open.
	{"udp/53", `
		      web1 app1 db1  web2 db2  ops
		web1  -    ✗    ✗    ✗    ✗    ✓
		app1  ✗    -    ✗    ✗    ✗    ✓
		db1   ✗    ✓    -    ✗    ✓    ✓
		web2  ✗    ✗    ✗    -    ✗    ✓
		db2   ✗    ✓    ✓    ✗    -    ✓
		ops   ✗    ✓    ✓    ✗    ✓    -`},
	// Only admin to backend, and the open egress of db1 and db2 to ops.
	{"udp/123", `
		      web1 app1 db1  web2 db2  ops
		web1  -    ✗    ✗    ✗    ✗    ✗
		app1  ✗    -    ✗    ✗    ✗    ✗
		db1   ✗    ✗    -    ✗    ✗    ✓
		web2  ✗    ✗    ✗    -    ✗    ✗
		db2   ✗    ✗    ✗    ✗    -    ✓
		ops   ✗    ✓    ✓    ✗    ✓    -`},
	// Everyone protected takes icmp from admin only; web's egress denies icmp to ops's
	// IPv4 address.
	{"icmp", `
		      web1 app1 db1  web2 db2  ops
		web1  -    ✗    ✗    ✗    ✗    ✗
		app1  ✗    -    ✗    ✗    ✗    ✗
		db1   ✗    ✗    -    ✗    ✗    ✓
		web2  ✗    ✗    ✗    -    ✗    ✗
		db2   ✗    ✗    ✗    ✗    -    ✓
		ops   ✓    ✓    ✓    ✓    ✓    -`},
	// Groups hold IPv6 addresses too; guard's IPv4 CIDR does not match web1 over IPv6,
	// nor admin's match ops.
	{"tcp6/8088", `
		      web1 app1 db1  web2 db2  ops
		web1  -    ✓    ✓    ✗    ✓    ✗
		app1  ✗    -    ✓    ✗    ✓    ✗
		db1   ✗    ✗    -    ✗    ✗    ✓
		web2  ✗    ✓    ✓    -    ✓    ✗
		db2   ✗    ✗    ✗    ✗    -    ✓
		ops   ✗    ✗    ✗    ✗    ✗    -`},
	// ops over IPv6 is not admin, and web's icmp denial is of an IPv4 CIDR.
	{"icmp6", `
		      web1 app1 db1  web2 db2  ops
		web1  -    ✗    ✗    ✗    ✗    ✓
		app1  ✗    -    ✗    ✗    ✗    ✓
		db1   ✗    ✗    -    ✗    ✗    ✓
		web2  ✗    ✗    ✗    -    ✗    ✓
		db2   ✗    ✗    ✗    ✗    -    ✓
		ops   ✗    ✗    ✗    ✗    ✗    -`},
}

// fwTableAfter is the truth table after the update, worked out by hand: the four kinds
// the update changes are written anew, the six others are as before (admin's new member
// is ops's IPv6 address, which only IPv6 probes use; guard keeps its udp denial).
func fwTableAfter() []fwHandKind {
	changed := []fwHandKind{
		// guard now denies db2's IPv4 address tcp/5432 into backend.
		{"tcp/5432", `
		      web1 app1 db1  web2 db2  ops
		web1  -    ✗    ✗    ✗    ✗    ✗
		app1  ✗    -    ✗    ✗    ✗    ✗
		db1   ✗    ✓    -    ✗    ✓    ✓
		web2  ✗    ✗    ✗    -    ✗    ✗
		db2   ✗    ✗    ✗    ✗    -    ✓
		ops   ✗    ✓    ✓    ✗    ✓    -`},
		// guard no longer denies web1 8085-8089: as tcp/8080.
		{"tcp/8088", `
		      web1 app1 db1  web2 db2  ops
		web1  -    ✓    ✓    ✗    ✓    ✗
		app1  ✗    -    ✓    ✗    ✓    ✗
		db1   ✗    ✗    -    ✗    ✗    ✓
		web2  ✗    ✓    ✓    -    ✓    ✗
		db2   ✗    ✗    ✗    ✗    -    ✓
		ops   ✗    ✓    ✓    ✗    ✓    -`},
		// ops over IPv6 is admin now: backend takes anything from it, web only icmp.
		{"tcp6/8088", `
		      web1 app1 db1  web2 db2  ops
		web1  -    ✓    ✓    ✗    ✓    ✗
		app1  ✗    -    ✓    ✗    ✓    ✗
		db1   ✗    ✗    -    ✗    ✗    ✓
		web2  ✗    ✓    ✓    -    ✓    ✗
		db2   ✗    ✗    ✗    ✗    -    ✓
		ops   ✗    ✓    ✓    ✗    ✓    -`},
		{"icmp6", `
		      web1 app1 db1  web2 db2  ops
		web1  -    ✗    ✗    ✗    ✗    ✓
		app1  ✗    -    ✗    ✗    ✗    ✓
		db1   ✗    ✗    -    ✗    ✗    ✓
		web2  ✗    ✗    ✗    -    ✗    ✓
		db2   ✗    ✗    ✗    ✗    -    ✓
		ops   ✓    ✓    ✓    ✓    ✓    -`},
	}
	var out []fwHandKind
	for _, hk := range fwTableBefore {
		if i := slices.IndexFunc(changed, func(c fwHandKind) bool { return c.kind == hk.kind }); i >= 0 {
			hk = changed[i]
		}
		out = append(out, hk)
	}
	return out
}

// mustHandTable parses a hand-written table of the firewall tests' workloads.
func mustHandTable(t *testing.T, table []fwHandKind) []fwCase {
	t.Helper()
	cases, err := parseHandTable(fwNames(), table)
	if err != nil {
		t.Fatalf("hand-written table: %v", err)
	}
	if want := len(fwKinds) * len(fwEndpointDefs) * (len(fwEndpointDefs) - 1); len(cases) != want {
		t.Fatalf("hand-written table: %d cases, want %d", len(cases), want)
	}
	return cases
}

// fwCluster is the firewall tests' cluster: nimbus, two hosts with agents, the
// workloads with echo servers on every port the tables probe, and the objects applied.
type fwCluster struct {
	c     *cluster
	api   nimbusv1.NimbusClient
	hosts []*host
	table *fwTable
	// desired holds the objects applied, as nimbus stored them (generation included), by
	// key ID.
	desired map[string]*nimbusv1.Object
}

// newFWCluster starts the cluster, applies the Nodes, the Network, the Endpoints and
// objs, and waits until the overlay is PROGRAMMED and every workload reaches every other
// with every kind of probe, as nothing protects them yet: objs must hold no
// NetworkSecurityPolicy.
func newFWCluster(t *testing.T, endpoints []*nimbusv1.Object, objs ...*nimbusv1.Object) *fwCluster {
	t.Helper()
	c := newCluster(t)
	u := newUnderlay(t)
	fc := &fwCluster{c: c, api: c.publisherAPI(t), desired: map[string]*nimbusv1.Object{}}
	var hosts []*host
	var infra []*nimbusv1.Object
	for _, name := range fwHosts {
		h := c.addHost(t, name, name)
		vtep := u.attach(t, h)
		h.startAgent(t)
		hosts = append(hosts, h)
		infra = append(infra, &nimbusv1.Object{
			Meta: &nimbusv1.ObjectMeta{Name: name},
			Spec: &nimbusv1.Object_Node{Node: &nimbusv1.NodeSpec{Hostname: name, VtepAddress: vtep}},
		})
	}
	infra = append(infra, &nimbusv1.Object{
		Meta: &nimbusv1.ObjectMeta{Name: fwNetwork},
		Spec: &nimbusv1.Object_Network{Network: &nimbusv1.NetworkSpec{Vni: 100, Subnets: []*nimbusv1.Subnet{
			{Cidr: "10.1.0.0/24", Gateway: "10.1.0.1"}, {Cidr: "fd00:1::/64", Gateway: "fd00:1::1"},
		}}},
	})
	var ws []*fwWorkload
	for _, d := range fwEndpointDefs {
		w := newFWWorkload(t, newWorkload(t, hosts[d.host], d.name, d.mac, []string{d.v4 + "/24", d.v6 + "/64"}, "10.1.0.1", "fd00:1::1"))
		w.serveFW(t, fwPortsOf(fwKinds, "tcp"), fwPortsOf(fwKinds, "udp"))
		ws = append(ws, w)
	}
	fc.table = newFWTable(ws...)
	fc.hosts = hosts

	fc.apply(t, slices.Concat(infra, endpoints, objs)...)
	fc.waitProgrammed(t, nimbusv1.Kind_KIND_NODE, nimbusv1.Kind_KIND_NETWORK, nimbusv1.Kind_KIND_ENDPOINT)
	open := referenceCases(fc.reference(), fc.table.names(), fc.table.addrOf, fwKinds)
	for _, c := range open {
		if !c.want {
			t.Fatalf("the reference drops %v with no policy: %s", c, c.why)
		}
	}
	// The overlay is programmed, but its first packets may wait for a bridge port to
	// come up or a neighbour to resolve: probes are tried again until all pass.
	fc.table.wantTable(t, "no policy", open, deadline)
	return fc
}

// apply applies the objects at nimbus in one batch and records them as stored; it
// returns the key IDs of those that changed.
func (fc *fwCluster) apply(t testing.TB, objs ...*nimbusv1.Object) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	resp, err := fc.api.ApplyBatch(ctx, &nimbusv1.ApplyBatchRequest{Objects: objs})
	if err != nil {
		t.Fatalf("applying %d objects: %v", len(objs), err)
	}
	var changed []string
	for i, r := range resp.GetResults() {
		id := objs[i].Key().ID()
		fc.desired[id] = r.GetObject()
		if r.GetChanged() {
			changed = append(changed, id)
		}
	}
	return changed
}

// reference returns the reference evaluator of the objects applied.
func (fc *fwCluster) reference() *fwReference {
	objs := make([]*nimbusv1.Object, 0, len(fc.desired))
	for _, o := range fc.desired {
		objs = append(objs, o)
	}
	return newFWReference(objs)
}

// waitProgrammed waits until every object applied of the kinds (all kinds when none are
// given) is PROGRAMMED at its generation on both hosts. It fails the test at once when a
// host reports one FAILED at its generation.
func (fc *fwCluster) waitProgrammed(t testing.TB, kinds ...nimbusv1.Kind) {
	t.Helper()
	var waiting []string
	end := time.Now().Add(deadline)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), deadline)
		list, err := nimbusv1.ListAll(ctx, fc.api, &nimbusv1.ListRequest{})
		cancel()
		if err != nil {
			t.Fatalf("listing the objects at nimbus: %v", err)
		}
		status := map[string]*nimbusv1.ObjectStatus{}
		for _, item := range list.GetItems() {
			status[item.GetObject().Key().ID()] = item.GetStatus()
		}
		waiting = nil
		for id, obj := range fc.desired {
			if len(kinds) > 0 && !slices.Contains(kinds, obj.Kind()) {
				continue
			}
			st, ok := status[id]
			if !ok {
				waiting = append(waiting, id+": not at nimbus")
				continue
			}
			gen := obj.GetMeta().GetGeneration()
			for _, node := range fwHosts {
				ns := nodeStatus(st, node)
				switch {
				case ns.GetObservedGeneration() == gen && ns.GetPhase() == nimbusv1.Phase_PHASE_PROGRAMMED:
				case ns.GetObservedGeneration() == gen && ns.GetPhase() == nimbusv1.Phase_PHASE_FAILED:
					t.Fatalf("%s generation %d FAILED on %s: %s: %s", id, gen, node, ns.GetReason(), ns.GetMessage())
				default:
					waiting = append(waiting, fmt.Sprintf("%s generation %d on %s: %s at generation %d %s",
						id, gen, node, ns.GetPhase(), ns.GetObservedGeneration(), ns.GetMessage()))
				}
			}
		}
		slices.Sort(waiting)
		if len(waiting) == 0 {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("timed out after %v waiting for the objects to be PROGRAMMED on %v; not yet:\n%s",
				deadline, fwHosts, strings.Join(waiting, "\n"))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// wantHarnessSeesDrops checks the probes and the tables on drops made without the
// firewall, in the destinations' namespaces (this kernel has no tc actions to drop with on
// the hosts): db1 routes its tcp/5432 answers to a blackhole, web2 its udp/53 answers,
// and ops ignores ICMPv6 echo requests. With no policy, the table of every probe must
// then show exactly these drops, and a case that wants a drop of a probe that passes must
// be reported as such. The drops are undone afterwards.
func (fc *fwCluster) wantHarnessSeesDrops(t *testing.T) {
	t.Helper()
	ns := func(name string) string { return fc.table.workloads[name].ns }
	drops := []struct {
		do, undo []string
		dropped  func(c fwCase) bool
	}{
		{[]string{"ip", "-n", ns("db1"), "rule", "add", "ipproto", "tcp", "sport", "5432", "blackhole"},
			[]string{"ip", "-n", ns("db1"), "rule", "del", "ipproto", "tcp", "sport", "5432", "blackhole"},
			func(c fwCase) bool { return c.dst == "db1" && c.kind.String() == "tcp/5432" }},
		{[]string{"ip", "-n", ns("web2"), "rule", "add", "ipproto", "udp", "sport", "53", "blackhole"},
			[]string{"ip", "-n", ns("web2"), "rule", "del", "ipproto", "udp", "sport", "53", "blackhole"},
			func(c fwCase) bool { return c.dst == "web2" && c.kind.String() == "udp/53" }},
		{[]string{"ip", "netns", "exec", ns("ops"), "sysctl", "-qw", "net.ipv6.icmp.echo_ignore_all=1"},
			[]string{"ip", "netns", "exec", ns("ops"), "sysctl", "-qw", "net.ipv6.icmp.echo_ignore_all=0"},
			func(c fwCase) bool { return c.dst == "ops" && c.kind.String() == "icmp6" }},
	}
	for _, d := range drops {
		testns.Run(t, d.do[0], d.do[1:]...)
	}
	cases := referenceCases(fc.reference(), fc.table.names(), fc.table.addrOf, fwKinds)
	dropped := 0
	for i := range cases {
		cases[i].why = ""
		for _, d := range drops {
			if d.dropped(cases[i]) {
				cases[i].want = false
				dropped++
			}
		}
	}
	// One case wants wrong: web1 → app1 tcp/80 passes.
	wrong := slices.IndexFunc(cases, func(c fwCase) bool { return c.src == "web1" && c.dst == "app1" && c.kind.String() == "tcp/80" })
	cases[wrong].want = false
	got := fc.table.run(t, "no policy, drops in the workloads, one case wrong on purpose", cases, 0)
	if want := []string{"web1 → app1 tcp/80: want drop, got pass"}; !slices.Equal(got, want) {
		t.Errorf("with %d probes dropped and one case wanting a drop that passes, the table reported:\n%s\nwant:\n%s",
			dropped, strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for _, d := range drops {
		testns.Run(t, d.undo[0], d.undo[1:]...)
	}
}

// TestFirewallTruthTable checks the firewall against truth tables written by hand. Six
// endpoints on two hosts, in groups web, backend and admin (a CIDR), are protected by
// three policies (see fwTruthPolicies); ten kinds of probes go between every ordered pair
// of endpoints. First the hand-written tables are checked against the reference
// evaluator; then, with no policy, every probe must pass, and drops made in the
// workloads must show (see wantHarnessSeesDrops); with the policies, the probes
// must match the first table; after an update of one group and one policy, the second.
func TestFirewallTruthTable(t *testing.T) {
	before, after := mustHandTable(t, fwTableBefore), mustHandTable(t, fwTableAfter())
	t.Run("hand tables agree with the reference", func(t *testing.T) {
		for _, tc := range []struct {
			what  string
			objs  []*nimbusv1.Object
			cases []fwCase
		}{{"before the update", fwTruthObjects(false), before}, {"after the update", fwTruthObjects(true), after}} {
			for _, o := range tc.objs {
				if err := o.Validate(); err != nil {
					t.Fatalf("%s: %s: %v", tc.what, o.Key().ID(), err)
				}
			}
			if bad := compareWithReference(newFWReference(tc.objs), fwDefAddr, tc.cases); len(bad) > 0 {
				t.Errorf("%s: %d of %d cases differ:\n%s", tc.what, len(bad), len(tc.cases), strings.Join(bad, "\n"))
			}
		}
	})

	// The reference's reasons make the lines of a mismatch easier to follow.
	before = withReasons(newFWReference(fwTruthObjects(false)), fwDefAddr, before)
	after = withReasons(newFWReference(fwTruthObjects(true)), fwDefAddr, after)

	fc := newFWCluster(t, fwEndpoints(fwTruthGroupsOf), fwTruthGroups(false)...)
	fc.wantHarnessSeesDrops(t)

	fc.apply(t, fwTruthPolicies(false)...)
	fc.waitProgrammed(t)
	fc.table.wantTable(t, "the policies", before, 0)

	changed := fc.apply(t, slices.Concat(fwTruthGroups(true), fwTruthPolicies(true))...)
	t.Logf("the update changed %v", changed)
	fc.waitProgrammed(t)
	fc.table.wantTable(t, "after the update", after, 0)
}

// fwRandomScenarios is how many random scenarios TestFirewallRandom runs.
const fwRandomScenarios = 5

// fwSettle is how long TestFirewallRandom lets the firewall catch up with a change of
// the endpoints' groups: no status tells when the policies that depend on them are
// enforced again.
const fwSettle = 5 * time.Second

// fwRandomGroups and fwRandomPolicies name the objects of the random scenarios: every
// scenario has all of them, so that the convergence of every change shows in a status.
var (
	fwRandomGroups   = []string{"sg-a", "sg-b", "sg-c"}
	fwRandomPolicies = []string{"np-a", "np-b", "np-c"}
)

// fwRandomCIDRs are the CIDRs random groups and rules pick from: single endpoints, a few
// of them, all of them, in either family.
var fwRandomCIDRs = []string{
	"10.1.0.11/32", "10.1.0.0/28", "10.1.0.16/28", "10.1.0.32/27", "10.1.0.192/26", "10.1.0.0/24", "0.0.0.0/0",
	"fd00:1::31/128", "fd00:1::10/124", "fd00:1::200/120", "fd00:1::/64",
}

// fwRandomPorts are the ports random rules pick from: the probed ones, ranges around
// them, ranges that hold several.
var fwRandomPorts = []string{"22", "53", "80", "123", "5432", "8080", "8088", "8080-8089", "8085-8089", "1-1024", "50-130", "5000-9000"}

// fwRandomObjects returns a random scenario: the endpoints with random groups, the
// groups with random CIDRs, the policies with random attachments and rules.
func fwRandomObjects(rng *rand.Rand) []*nimbusv1.Object {
	// pick picks up to most of from, at random.
	pick := func(from []string, most int) []string {
		var out []string
		for range rng.IntN(most + 1) {
			if s := from[rng.IntN(len(from))]; !slices.Contains(out, s) {
				out = append(out, s)
			}
		}
		return out
	}
	groupsOf := map[string][]string{}
	for _, d := range fwEndpointDefs {
		groupsOf[d.name] = pick(fwRandomGroups, 2)
	}
	objs := fwEndpoints(groupsOf)
	for _, g := range fwRandomGroups {
		objs = append(objs, fwGroupObject(g, pick(fwRandomCIDRs, 2)...))
	}
	rule := func(from bool) *nimbusv1.PolicyRule {
		action := nimbusv1.PolicyRule_ACTION_ALLOW
		if rng.IntN(4) == 0 {
			action = nimbusv1.PolicyRule_ACTION_DENY
		}
		protocol := []string{"", "tcp", "tcp", "udp", "icmp"}[rng.IntN(5)]
		var ports []string
		if (protocol == "tcp" || protocol == "udp") && rng.IntN(3) > 0 {
			ports = pick(fwRandomPorts, 2)
		}
		var peers []string
		if rng.IntN(3) > 0 {
			var pool []string
			for _, g := range fwRandomGroups {
				pool = append(pool, "group:"+g)
			}
			peers = pick(append(pool, fwRandomCIDRs...), 2)
		}
		return fwRule(action, from, protocol, ports, peers...)
	}
	for _, name := range fwRandomPolicies {
		var ingress, egress []*nimbusv1.PolicyRule
		for range rng.IntN(4) {
			ingress = append(ingress, rule(true))
		}
		for range rng.IntN(3) {
			egress = append(egress, rule(false))
		}
		objs = append(objs, fwPolicyObject(name, pick(fwRandomGroups, 2), ingress, egress))
	}
	return objs
}

// fwDescribe returns the objects as one line of JSON each, for the log of a failed
// scenario.
func fwDescribe(objs []*nimbusv1.Object) string {
	var b strings.Builder
	for _, o := range objs {
		o = proto.CloneOf(o)
		o.Meta = &nimbusv1.ObjectMeta{Name: o.GetMeta().GetName()}
		fmt.Fprintf(&b, "%s %s\n", o.Kind().Name(), protojson.MarshalOptions{}.Format(o))
	}
	return b.String()
}

// TestFirewallRandom runs random scenarios over the workloads of TestFirewallTruthTable:
// random group memberships of the endpoints, random CIDRs in three groups, three
// policies with random attachments and rules. After each scenario is applied and
// PROGRAMMED on both hosts, every kind of probe between every ordered pair of
// workloads must do what the reference evaluator says, and so must a Trace of a random
// sample of them (the traces' differential test). The seed is logged;
// NAPLES_TEST_SEED replays a run.
func TestFirewallRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(testrand.Seed(t), 0))
	scenarios := make([][]*nimbusv1.Object, fwRandomScenarios)
	for i := range scenarios {
		scenarios[i] = fwRandomObjects(rng)
		for _, o := range scenarios[i] {
			if err := o.Validate(); err != nil {
				t.Fatalf("scenario %d: %s: %v\n%s", i, o.Key().ID(), err, fwDescribe(scenarios[i]))
			}
		}
		pass := 0
		cases := referenceCases(newFWReference(scenarios[i]), fwNames(), fwDefAddr, fwKinds)
		for _, c := range cases {
			if c.want {
				pass++
			}
		}
		t.Logf("scenario %d: the reference delivers %d of %d probes", i, pass, len(cases))
	}

	fc := newFWCluster(t, fwEndpoints(nil))
	for i, objs := range scenarios {
		changed := fc.apply(t, objs...)
		fc.waitProgrammed(t)
		settle := time.Duration(0)
		for _, id := range changed {
			if strings.HasPrefix(id, nimbusv1.Kind_KIND_ENDPOINT.Name()+"/") {
				settle = fwSettle
			}
		}
		cases := referenceCases(fc.reference(), fc.table.names(), fc.table.addrOf, fwKinds)
		if bad := fc.table.run(t, fmt.Sprintf("scenario %d", i), cases, settle); len(bad) > 0 {
			t.Errorf("scenario %d: %d of %d probes differ from the reference:\n%s\nthe scenario:\n%s",
				i, len(bad), len(cases), strings.Join(bad, "\n"), fwDescribe(objs))
		}
		fc.wantTracesAgree(t, fmt.Sprintf("scenario %d", i), cases, rng)
	}
}
