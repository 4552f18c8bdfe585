package linux

import (
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/naplesnet/naples/delphi"
	"github.com/naplesnet/naples/hal"
	"github.com/naplesnet/naples/internal/testns"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// BenchmarkHALNetworks measures the HAL alone programming N networks, against the floor
// of iproute2 writing the same kernel objects into a fresh namespace. Each network is a
// bridge and a VXLAN device (its own VNI, this host's VTEP as local address, both with
// the MTU the VTEP's link carries, benchNetworkMTU), an IPv4 subnet whose gateway
// address is on the bridge, the four policy-routing rules of its bridge and its route in
// the tenant's table, all in the default tenant.
//
// Delphi holds the N Network objects and this host's Node and is synced; the HAL, with
// the network reconciler alone and its default options, is timed from Run until every
// network is PROGRAMMED; then every network is deleted in one delphi transaction, and the
// HAL is timed until every status is gone. The floor is `ip -6 -batch` (the IPv6 rules),
// `ip -batch` (the IPv4 rules, `link add` of both devices, `link set` of their aliases and
// the VXLAN device's port flags, `addr add`, `route add`) and `sysctl -p` (the bridges'
// forwarding, which iproute2 cannot set), one after the other; deleting, `ip -batch` (`link
// del` of both devices, which takes addresses and routes with them, and the IPv4 rules)
// and `ip -6 -batch`. Both are checked against a dump of the kernel afterwards.
//
// The floor does not do all the HAL does: iproute2 cannot attach eBPF programs with tcx,
// so it leaves out the gateway: per bridge the two tcx links of package gwbpf, each
// attached under the rtnl lock and with an RCU grace period, and the bridge's mark in
// their map; once, the tenant's two `fwmark` rules and the three mark-reflection
// sysctls. It reads nothing back either, where the HAL asks the kernel for each link it
// creates (its index) and for the bridge's forwarding before it sets it.
//
// It reports both rates, their ratio and the absolute times, the HAL's kernel writes and
// reconciles per network (one reconcile a network added, when the observer takes none of
// the kernel's reports of the reconcile's writes for a change), and the CPU per network
// of each side: the benchmark process's while the HAL worked, the tools' (as the
// benchmark's children) for the floor. Most of either is the kernel's, in the system
// calls that write it.
// N is 100 and 1,000 (networks=N); run with -benchtime 1x.
func BenchmarkHALNetworks(b *testing.B) {
	for _, n := range []int{100, 1_000} {
		b.Run(fmt.Sprintf("networks=%d", n), func(b *testing.B) { benchHALNetworks(b, n) })
	}
}

// benchHALNetworks is BenchmarkHALNetworks with n networks.
func benchHALNetworks(b *testing.B, n int) {
	testns.RequireRoot(b)
	var hl, floor networkBenchResult
	for range b.N {
		hl.add(benchNetworksHAL(b, n))
		floor.add(benchNetworksFloor(b, n))
	}
	total := float64(b.N * n)
	rate := func(d time.Duration) float64 { return total / d.Seconds() }
	per := func(d time.Duration) float64 { return d.Seconds() / float64(b.N) }
	b.ReportMetric(rate(hl.addTime), "hal-add-networks/s")
	b.ReportMetric(rate(floor.addTime), "ip-add-networks/s")
	b.ReportMetric(rate(hl.addTime)/rate(floor.addTime), "add-ratio")
	b.ReportMetric(per(hl.addTime), "hal-add-s")
	b.ReportMetric(per(floor.addTime), "ip-add-s")
	b.ReportMetric(rate(hl.delTime), "hal-del-networks/s")
	b.ReportMetric(rate(floor.delTime), "ip-del-networks/s")
	b.ReportMetric(rate(hl.delTime)/rate(floor.delTime), "del-ratio")
	b.ReportMetric(per(hl.delTime), "hal-del-s")
	b.ReportMetric(per(floor.delTime), "ip-del-s")
	b.ReportMetric(float64(hl.addCPU.Microseconds())/total, "hal-add-cpu-µs/network")
	b.ReportMetric(float64(floor.addCPU.Microseconds())/total, "ip-add-cpu-µs/network")
	b.ReportMetric(float64(hl.delCPU.Microseconds())/total, "hal-del-cpu-µs/network")
	b.ReportMetric(float64(floor.delCPU.Microseconds())/total, "ip-del-cpu-µs/network")
	b.ReportMetric(float64(hl.addWrites)/total, "hal-add-writes/network")
	b.ReportMetric(float64(hl.addReconciles)/total, "hal-add-reconciles/network")
	b.ReportMetric(float64(hl.delWrites)/total, "hal-del-writes/network")
	b.ReportMetric(0, "ns/op")
}

// networkBenchResult is what one side of BenchmarkHALNetworks took: the times, the CPU
// (user and system) of the process that wrote the kernel, the HAL's benchmark process or
// the floor's tools, and the kernel writes and reconciles adding, which the floor leaves
// zero.
type networkBenchResult struct {
	addTime, delTime     time.Duration
	addCPU, delCPU       time.Duration
	addWrites, delWrites uint64
	addReconciles        uint64
}

// add adds the figures of o.
func (r *networkBenchResult) add(o networkBenchResult) {
	r.addTime += o.addTime
	r.delTime += o.delTime
	r.addCPU += o.addCPU
	r.delCPU += o.delCPU
	r.addWrites += o.addWrites
	r.delWrites += o.delWrites
	r.addReconciles += o.addReconciles
}

// benchVTEPAddr is the benchmark host's VTEP address, on its loopback.
const benchVTEPAddr = "192.0.2.1"

// benchNetworkMTU is the MTU the HAL gives the benchmark's networks, which set none: what
// the loopback, the link of benchVTEPAddr with an MTU of 65536, carries.
var benchNetworkMTU = underlayLink{name: "lo", mtu: 65536}.carries(netip.MustParseAddr(benchVTEPAddr))

// benchNetworkObj returns the i-th network: VNI 10000+i, subnet 10.A.B.0/24 with gateway
// 10.A.B.1, in the default tenant.
func benchNetworkObj(i int) *nimbusv1.Object {
	cidr, gw := benchNetworkSubnet(i)
	return networkObj("", fmt.Sprintf("net%05d", i), uint32(10_000+i), 0, subnet(cidr, gw))
}

// benchNetworkSubnet returns the i-th network's subnet and gateway.
func benchNetworkSubnet(i int) (cidr, gw string) {
	prefix := fmt.Sprintf("10.%d.%d", (i>>8)&0xff, i&0xff)
	return prefix + ".0/24", prefix + ".1"
}

// benchNetworkNamespace makes a fresh namespace whose loopback holds the VTEP address.
func benchNetworkNamespace(b *testing.B) string {
	ns := testns.Named(b, "naples-bench")
	testns.Run(b, "ip", "-n", ns, "addr", "add", benchVTEPAddr+"/32", "dev", "lo")
	return ns
}

// benchNetworksHAL times the HAL adding and then deleting n networks, and measures the
// CPU time (user and system) the process spent meanwhile and the kernel writes.
func benchNetworksHAL(b *testing.B, n int) networkBenchResult {
	b.StopTimer()
	defer b.StartTimer()
	ns := benchNetworkNamespace(b)
	nsh := testns.Handle(b, ns)
	// Warnings only, such as an observer whose subscription overflowed.
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	store, err := delphi.Open(delphi.Options{Indexes: Indexes(), Logger: logger})
	if err != nil {
		b.Fatal(err)
	}
	defer store.Close()
	desired, err := store.ClaimDesired()
	if err != nil {
		b.Fatal(err)
	}
	txn := &delphi.DesiredTxn{}
	node := nodeObj(localNode, benchVTEPAddr)
	txn.Put(node)
	keys := make(map[string]*nimbusv1.ObjectKey, n)
	for i := range n {
		o := benchNetworkObj(i)
		keys[o.Key().ID()] = o.Key()
		txn.Put(o)
	}
	if err := desired.Commit(txn); err != nil {
		b.Fatal(err)
	}
	desired.MarkSynced()
	rec, err := NewNetworkReconciler(NetworkOptions{Store: store, Node: localNode, Namespace: &nsh, Logger: logger})
	if err != nil {
		b.Fatal(err)
	}
	defer rec.Close()
	// The Node's status is written too (Unsupported: no reconciler here).
	watched := map[string]*nimbusv1.ObjectKey{node.Key().ID(): node.Key()}
	for id, k := range keys {
		watched[id] = k
	}
	var res networkBenchResult
	t, stats := timeHAL(b, store, desired, rec, logger, watched, keys,
		func(s hal.Stats) {
			wantNetworkObjects(b, ns, "the HAL", n)
			res.addWrites = s.Kinds[nimbusv1.Kind_KIND_NETWORK].KernelWrites
			res.addReconciles = s.Kinds[nimbusv1.Kind_KIND_NETWORK].Reconciles
		},
		func(hal.Stats) { wantNetworkObjects(b, ns, "the HAL, after deleting every network,", 0) })
	res.addTime, res.delTime, res.addCPU, res.delCPU = t.add, t.del, t.addCPU, t.delCPU
	st := stats.Kinds[nimbusv1.Kind_KIND_NETWORK]
	res.delWrites = st.KernelWrites - res.addWrites
	if st.Errors != 0 {
		b.Errorf("network stats %+v; want no errors", st)
	}
	return res
}

// benchNetworksFloor times iproute2 (and sysctl) adding and then deleting the kernel
// objects of n networks in a fresh namespace.
func benchNetworksFloor(b *testing.B, n int) networkBenchResult {
	b.StopTimer()
	defer b.StartTimer()
	ns := benchNetworkNamespace(b)
	table := TenantTable("")
	var add4, add6, sysctls, del4, del6 strings.Builder
	for i := range n {
		o := benchNetworkObj(i)
		id := o.Key().ID()
		br, vx, alias := BridgeName(id), VXLANName(id), OwnerAlias(id)
		cidr, gw := benchNetworkSubnet(i)
		for _, f := range []*strings.Builder{&add4, &add6} {
			fmt.Fprintf(f, "rule add iif %s lookup %d pref %d protocol %d\n", br, table, TenantRulePriority, OverlayRouteProtocol)
			fmt.Fprintf(f, "rule add iif %s prohibit pref %d protocol %d\n", br, TenantRulePriority+1, OverlayRouteProtocol)
		}
		// `ip link add` sets no alias; `link set` does.
		fmt.Fprintf(&add4, "link add %s address %s mtu %d up type bridge\n", br, GatewayMAC(id), benchNetworkMTU)
		fmt.Fprintf(&add4, "link set %s alias %s\n", br, alias)
		fmt.Fprintf(&add4, "link add %s master %s mtu %d up type vxlan id %d local %s dstport %d nolearning\n",
			vx, br, benchNetworkMTU, 10_000+i, benchVTEPAddr, VXLANPort)
		fmt.Fprintf(&add4, "link set %s alias %s type bridge_slave learning off neigh_suppress on\n", vx, alias)
		fmt.Fprintf(&add4, "addr add %s/24 dev %s noprefixroute\n", gw, br)
		fmt.Fprintf(&add4, "route add %s dev %s table %d proto %d scope link src %s\n", cidr, br, table, OverlayRouteProtocol, gw)
		fmt.Fprintf(&sysctls, "net.ipv4.conf.%s.forwarding = 1\n", br)

		fmt.Fprintf(&del4, "link del %s\nlink del %s\n", vx, br)
		for _, f := range []*strings.Builder{&del4, &del6} {
			fmt.Fprintf(f, "rule del iif %s lookup %d pref %d\n", br, table, TenantRulePriority)
			fmt.Fprintf(f, "rule del iif %s prohibit pref %d\n", br, TenantRulePriority+1)
		}
	}
	dir := b.TempDir()
	run := func(name, batch string, args ...string) (time.Duration, time.Duration) {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(batch), 0o600); err != nil {
			b.Fatal(err)
		}
		cmd := exec.Command(args[0], append(args[1:], path)...)
		var ru0, ru1 unix.Rusage
		unix.Getrusage(unix.RUSAGE_CHILDREN, &ru0)
		b.StartTimer()
		start := time.Now()
		out, err := cmd.CombinedOutput()
		d := time.Since(start)
		b.StopTimer()
		unix.Getrusage(unix.RUSAGE_CHILDREN, &ru1)
		if err != nil {
			b.Fatalf("%s %s: %v\n%s", strings.Join(args, " "), name, err, out)
		}
		return d, cpuTime(ru1) - cpuTime(ru0)
	}
	var res networkBenchResult
	for _, step := range []struct {
		name, batch string
		args        []string
	}{
		{"add6", add6.String(), []string{"ip", "-6", "-n", ns, "-batch"}},
		{"add4", add4.String(), []string{"ip", "-n", ns, "-batch"}},
		{"sysctl", sysctls.String(), []string{"ip", "netns", "exec", ns, "sysctl", "-q", "-p"}},
	} {
		d, cpu := run(step.name, step.batch, step.args...)
		res.addTime, res.addCPU = res.addTime+d, res.addCPU+cpu
	}
	wantNetworkObjects(b, ns, "iproute2", n)
	for _, step := range []struct {
		name, batch string
		args        []string
	}{
		{"del4", del4.String(), []string{"ip", "-n", ns, "-batch"}},
		{"del6", del6.String(), []string{"ip", "-6", "-n", ns, "-batch"}},
	} {
		d, cpu := run(step.name, step.batch, step.args...)
		res.delTime, res.delCPU = res.delTime+d, res.delCPU+cpu
	}
	wantNetworkObjects(b, ns, "iproute2, after deleting every network,", 0)
	return res
}

// wantNetworkObjects fails the benchmark unless the namespace holds the kernel objects
// of n of the benchmark's networks: n bridges and n VXLAN devices with naples's alias
// and MTU benchNetworkMTU, the bridges up with their gateway address, 4n rules at the
// tenant priorities, n routes of OverlayRouteProtocol in the tenant's table. who says
// who wrote them.
func wantNetworkObjects(b *testing.B, ns, who string, n int) {
	b.Helper()
	nl, err := netlink.NewHandleAt(testns.Handle(b, ns))
	if err != nil {
		b.Fatal(err)
	}
	defer nl.Close()
	links, err := nl.LinkList()
	if err != nil {
		b.Fatal(err)
	}
	bridges, vxlans, up := 0, 0, 0
	bridgeIndexes := map[int]bool{}
	for _, l := range links {
		a := l.Attrs()
		if !strings.HasPrefix(a.Alias, OwnerAlias(nimbusv1.Kind_KIND_NETWORK.Name()+"/")) {
			continue
		}
		if a.MTU != int(benchNetworkMTU) {
			b.Fatalf("%s left %s %s with MTU %d, want %d", who, l.Type(), a.Name, a.MTU, benchNetworkMTU)
		}
		switch l.Type() {
		case "bridge":
			bridges++
			bridgeIndexes[a.Index] = true
			if a.Flags&unix.IFF_UP != 0 {
				up++
			}
		case "vxlan":
			vxlans++
		}
	}
	addrs, err := nl.AddrList(nil, netlink.FAMILY_V4)
	if err != nil {
		b.Fatal(err)
	}
	gateways := 0
	for _, a := range addrs {
		if bridgeIndexes[a.LinkIndex] && a.Flags&unix.IFA_F_NOPREFIXROUTE != 0 {
			gateways++
		}
	}
	rules := 0
	for _, family := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		rs, err := nl.RuleList(family)
		if err != nil {
			b.Fatal(err)
		}
		for _, r := range rs {
			if r.Priority == TenantRulePriority || r.Priority == TenantRulePriority+1 {
				rules++
			}
		}
	}
	routes, err := nl.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: int(TenantTable(""))}, netlink.RT_FILTER_TABLE)
	if err != nil {
		b.Fatal(err)
	}
	tenant := 0
	for _, r := range routes {
		if r.Protocol == netlink.RouteProtocol(OverlayRouteProtocol) {
			tenant++
		}
	}
	if bridges != n || vxlans != n || up != n || gateways != n || rules != 4*n || tenant != n {
		b.Fatalf("%s left %d bridges (%d up), %d VXLAN devices, %d gateway addresses, %d rules, %d tenant routes; want %d, %d, %d, %d, %d, %d",
			who, bridges, up, vxlans, gateways, rules, tenant, n, n, n, n, 4*n, n)
	}
}
