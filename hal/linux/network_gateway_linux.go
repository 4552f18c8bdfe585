package linux

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/naplesnet/naples/hal"
	"github.com/naplesnet/naples/hal/linux/gwbpf"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// This file holds how a network's anycast gateway answers: the host's own packets to a
// network (echo replies, ICMP errors, TCP resets, answers of host listeners) route in the
// tenant's table, although the main table has no route to the overlay.
//
//   - The programs of package gwbpf, attached with tcx to each bridge, give what comes
//     up from the bridge into the host stack the tenant's mark, GatewayMark(tenant), the
//     tenant table's id, unless it has a mark already, and clear marks of that range
//     as packets leave the host into a bridge (so the VXLAN device's outer route lookup
//     never sees one).
//   - Per tenant and family the rule `fwmark MARK lookup TABLE pref GatewayRulePriority`
//     routes the host's packets that carry the mark in the tenant's table.
//   - While some network has a gateway, the sysctls of gatewaySysctls are 1, so that the
//     kernel's replies and errors carry the mark of the packet they answer; when none
//     has, they are put back as found. NetworkOptions.StateFile keeps what was found
//     across restarts.

// GatewayRulePriority is the priority of the rules `fwmark MARK lookup TABLE` that route
// the host's packets answering a tenant's network in the tenant's table. It follows the
// rules of TenantRulePriority, which take what enters through a bridge first.
const GatewayRulePriority = TenantRulePriority + 2

// GatewayMark returns the mark of the tenant's packets in the host stack: its table's id,
// TenantTable(tenant), which lies in the range gwbpf.MarkMask, gwbpf.MarkBase.
func GatewayMark(tenant string) uint32 { return TenantTable(tenant) }

// gatewaySysctls are the sysctls (under /proc/sys) that make the kernel's own replies
// and errors, and the connections host listeners accept, carry the mark of the packet
// they answer.
var gatewaySysctls = []string{
	"net/ipv4/fwmark_reflect",
	"net/ipv6/fwmark_reflect",
	"net/ipv4/tcp_fwmark_accept",
}

// gateway is the network reconciler's part for gateways.
type gateway struct {
	// objs are the programs and map; nil when they could not be loaded (openErr says
	// why).
	objs    *gwbpf.Objects
	openErr error
	// closeOnce makes close safe to call twice.
	closeOnce sync.Once
	// capacity is the number of bridges the map holds marks for; exceeded counts the
	// reconciles that found it full.
	capacity int
	exceeded prometheus.Counter
	// checkInterval is how often the observer checks that the programs are attached;
	// detached counts the bridges it found without them.
	checkInterval time.Duration
	detached      prometheus.Counter
	// reg is where the metrics are registered, nil when they are not.
	reg prometheus.Registerer

	// mu guards the fields below, and serializes the decisions on a tenant's rules and
	// on the sysctls between networks.
	mu sync.Mutex
	// reflectOn tells that the sysctls were found or made 1 since the last sweep.
	reflectOn bool
	// attached holds, per bridge name, the index the programs were attached to.
	attached map[string]int32
}

// openGateway loads the gateway programs with room for the marks of bridges bridges,
// pinned under bpfDir/gateway when bpfDir is set. Programs that cannot load leave
// openErr set: the gateways then do not answer, and the networks' status says so.
func openGateway(bpfDir string, bridges int) *gateway {
	if bridges <= 0 {
		bridges = gwbpf.DefaultBridges
	}
	g := &gateway{attached: map[string]int32{}, capacity: bridges,
		exceeded: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "naples_gateway_capacity_exceeded_total",
			Help: "Reconciles of networks whose bridge got no gateway mark because the gateway map held --gateway-bridges bridges already.",
		}),
		detached: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "naples_gateway_detached_total",
			Help: "Times a check found the gateway programs detached from a network's bridge by something other than naples; each is attached again.",
		})}
	dir := ""
	if bpfDir != "" {
		dir = filepath.Join(bpfDir, "gateway")
	}
	g.objs, g.openErr = gwbpf.Open(dir, bridges)
	return g
}

// The gateway's metrics: the capacity of its map, and how often it was exceeded.
var gwCapacityDesc = prometheus.NewDesc("naples_gateway_bridges_capacity",
	"Bridges the gateway map holds marks for (--gateway-bridges).", nil, nil)

// Describe implements prometheus.Collector.
func (g *gateway) Describe(ch chan<- *prometheus.Desc) {
	ch <- gwCapacityDesc
	g.exceeded.Describe(ch)
	g.detached.Describe(ch)
}

// Collect implements prometheus.Collector.
func (g *gateway) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(gwCapacityDesc, prometheus.GaugeValue, float64(g.capacity))
	g.exceeded.Collect(ch)
	g.detached.Collect(ch)
}

// close releases the programs; pinned links stay, unpinned ones go.
func (g *gateway) close() {
	g.closeOnce.Do(func() {
		if g.reg != nil {
			g.reg.Unregister(g)
		}
		if g.objs != nil {
			g.objs.Close()
		}
	})
}

// ensureGateway makes the network's bridge, with index, answer from its gateway: the
// tenant's mark for the bridge in the programs' map and the programs attached, the
// tenant's rules, and the sysctls on while the network has a gateway address. It returns
// why the gateway programs are unavailable, when they could not be loaded (the gateway
// then does not answer), or "".
func (r *NetworkReconciler) ensureGateway(ctx context.Context, want networkWant, index int32) (unavailable string, err error) {
	g := r.gw
	mark := want.table // GatewayMark of the network's tenant
	if g.objs == nil {
		unavailable = g.openErr.Error()
	} else {
		g.mu.Lock()
		old, had := g.attached[want.bridge]
		g.mu.Unlock()
		if had && old != index {
			// The bridge was made anew: its old index's mark goes first.
			if err := g.objs.DeleteMark(uint32(old)); err != nil {
				return "", kernelErr(err, "removing the gateway mark of %s's old index %d", want.bridge, old)
			}
		}
		wrote, err := g.objs.SetMark(uint32(index), mark)
		if errors.Is(err, gwbpf.ErrFull) {
			g.exceeded.Inc()
			return "", hal.Errorf(ReasonCapacityExceeded, "bridge %s: no gateway mark: %v; raise --gateway-bridges", want.bridge, err)
		}
		if err != nil {
			return "", kernelErr(err, "marking what comes up from %s", want.bridge)
		}
		if wrote {
			r.writes.Add(1)
		}
		// A link detached by hand, or whose pin was removed, is attached again.
		if !had || old != index || !g.objs.Attached(want.bridge, int(index)) {
			var n int
			err := r.inNS.run(func() (err error) {
				n, err = g.objs.Attach(want.bridge, int(index))
				return err
			})
			r.writes.Add(uint64(n))
			if err != nil {
				return "", kernelErr(err, "attaching the gateway programs to %s", want.bridge)
			}
			g.mu.Lock()
			g.attached[want.bridge] = index
			g.mu.Unlock()
			if n > 0 {
				r.log.Info("gateway programs attached", "key", want.id, "bridge", want.bridge, "mark", fmt.Sprintf("%#x", mark))
			}
		}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, k := range gatewayRules(mark) {
		if _, ok := r.rules.get(k); ok {
			continue
		}
		msg := appendRuleRequest(r.nl.Buffer(), unix.RTM_NEWRULE, unix.NLM_F_CREATE|unix.NLM_F_EXCL, k, uint8(OverlayRouteProtocol))
		if _, err := kernelWrite(ctx, r.rtnlConn, r.rules.m.ExpectBy(r.ruleReader.writer(), k, uint8(OverlayRouteProtocol), nil), msg); err != nil && !errors.Is(err, unix.EEXIST) {
			return "", kernelErr(err, "adding rule %s", ruleString(k))
		}
		r.log.Debug("rule added", "key", want.id, "rule", ruleString(k))
	}
	if !want.hasV4 && !want.hasV6 {
		return unavailable, r.putBackSysctlsLocked(nimbusv1.Key{})
	}
	return unavailable, r.ensureSysctlsLocked()
}

// watchGatewayLinks checks every checkInterval, until ctx ends, that the gateway
// programs are attached to the bridges they were attached to, and enqueues the network
// of each bridge that lost them; its reconcile attaches them again. The kernel sends no
// notification when a tcx link is detached.
func (r *NetworkReconciler) watchGatewayLinks(ctx context.Context, enqueue func(nimbusv1.Key)) {
	if r.gw.objs == nil {
		return
	}
	t := time.NewTicker(r.gw.checkInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		r.checkGatewayLinks(enqueue)
	}
}

// checkGatewayLinks enqueues the network of each bridge the gateway programs were
// attached to and are not any more.
func (r *NetworkReconciler) checkGatewayLinks(enqueue func(nimbusv1.Key)) {
	g := r.gw
	if g.objs == nil {
		return
	}
	g.mu.Lock()
	attached := maps.Clone(g.attached)
	g.mu.Unlock()
	for _, bridge := range slices.Sorted(maps.Keys(attached)) {
		if g.objs.Attached(bridge, int(attached[bridge])) {
			continue
		}
		g.detached.Inc()
		r.drifted(r.ownerOfName(bridge), enqueue, "gateway programs detached", bridge)
	}
}

// gatewayRules returns the rules that route the host's packets with a tenant's mark in
// the tenant's table, in both families: `ip rule add fwmark MARK lookup T pref 1002`.
// The mark is the table's id.
func gatewayRules(mark uint32) []ruleKey {
	return []ruleKey{
		{family: unix.AF_INET, priority: GatewayRulePriority, fwmark: mark, table: mark, action: unix.FR_ACT_TO_TBL},
		{family: unix.AF_INET6, priority: GatewayRulePriority, fwmark: mark, table: mark, action: unix.FR_ACT_TO_TBL},
	}
}

// ensureSysctlsLocked makes the sysctls of gatewaySysctls 1 (one missing, IPv6 being
// off on this host, is left out), the network reconciler's sysctls recording what it
// found first, in the state file too. g.mu must be held.
func (r *NetworkReconciler) ensureSysctlsLocked() error {
	g := r.gw
	if g.reflectOn {
		return nil
	}
	writes := 0
	err := r.inNS.run(func() error {
		for _, s := range gatewaySysctls {
			n, err := r.sysctls.Set("/proc/sys/"+s, "1")
			writes += n
			if errors.Is(err, fs.ErrNotExist) {
				continue // IPv6 is off on this host
			}
			if err != nil {
				return err
			}
		}
		return nil
	})
	r.writes.Add(uint64(writes))
	if err != nil {
		return kernelErr(err, "turning on the reflection of marks (%s)", strings.Join(gatewaySysctls, ", "))
	}
	if writes > 0 {
		r.log.Info("mark reflection turned on for the gateways", "sysctls", strings.Join(gatewaySysctls, ","))
	}
	g.reflectOn = true
	return nil
}

// putBackSysctlsLocked puts back the sysctls of gatewaySysctls as naples found them,
// when it changed them and no desired network but the one with the key except has a
// gateway. g.mu must be held.
func (r *NetworkReconciler) putBackSysctlsLocked(except nimbusv1.Key) error {
	g := r.gw
	if r.gatewayWanted(except) {
		return nil
	}
	recorded := false
	for _, s := range gatewaySysctls {
		recorded = recorded || r.sysctls.Recorded("/proc/sys/"+s)
	}
	if !recorded {
		g.reflectOn = false
		return nil
	}
	writes := 0
	err := r.inNS.run(func() error {
		for _, s := range gatewaySysctls {
			n, err := r.sysctls.Restore("/proc/sys/" + s)
			writes += n
			if err != nil {
				return err
			}
		}
		return nil
	})
	r.writes.Add(uint64(writes))
	if err != nil {
		return kernelErr(err, "putting back the reflection of marks")
	}
	r.log.Info("no network has a gateway; mark reflection put back as found", "sysctls", strings.Join(gatewaySysctls, ","))
	g.reflectOn = false
	return nil
}

// teardownGateway removes the gateway state of the network with the key, before its
// bridge goes: the programs' links and the bridge's mark; the tenant's rules when no
// other network of the tenant has a bridge; and the sysctls go back as found when no
// network has a gateway any more.
func (r *NetworkReconciler) teardownGateway(ctx context.Context, key nimbusv1.Key) error {
	g := r.gw
	id := key.String()
	bridge := BridgeName(id)
	if g.objs != nil {
		if l, ok := r.link(bridge); ok && ownsLink(l, OwnerAlias(id)) {
			if err := g.objs.DeleteMark(uint32(l.index)); err != nil {
				return kernelErr(err, "removing the gateway mark of %s", bridge)
			}
		}
		if err := g.objs.Detach(bridge); err != nil {
			return kernelErr(err, "detaching the gateway programs from %s", bridge)
		}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.attached, bridge)
	if !r.tenantHasBridgeLocked(GatewayMark(key.Tenant), key) {
		for _, k := range gatewayRules(GatewayMark(key.Tenant)) {
			if proto, ok := r.rules.get(k); ok {
				if err := r.deleteRule(ctx, k, proto); err != nil {
					return err
				}
			}
		}
	}
	return r.putBackSysctlsLocked(key)
}

// gatewayWanted tells whether a desired network other than the one with the key except
// has a gateway address. It looks first among the networks whose last reconcile found
// one, and reads every desired network only when none of those is desired still.
func (r *NetworkReconciler) gatewayWanted(except nimbusv1.Key) bool {
	r.mu.Lock()
	for key := range r.gatewayNetworks {
		if key != except && r.desired(key) {
			r.mu.Unlock()
			return true
		}
	}
	r.mu.Unlock()
	for _, key := range r.store.Keys(nimbusv1.Kind_KIND_NETWORK) {
		if key == except {
			continue
		}
		if obj, ok := r.store.Get(key.Proto()); ok {
			if w, err := wantNetwork(key, obj); err == nil && (w.hasV4 || w.hasV6) {
				return true
			}
		}
	}
	return false
}

// tenantHasBridgeLocked tells whether a network of the tenant with the mark, other than
// the one with the key except, has a bridge or is being reconciled. g.mu must be held.
func (r *NetworkReconciler) tenantHasBridgeLocked(mark uint32, except nimbusv1.Key) bool {
	for _, l := range r.links.bridgesByMark.Get(mark) {
		if key, _ := networkOwner(l.alias); key != except {
			return true
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for key := range r.networksOfMark[mark] {
		if key != except {
			return true
		}
	}
	return false
}

// ruleOwner returns the key of the network whose rule k is: for a gateway rule one of
// the tenant's networks reconciled so far, for the others the network that owns the
// input interface; the zero Key when none is known.
func (r *NetworkReconciler) ruleOwner(k ruleKey) nimbusv1.Key {
	if k.fwmark == 0 {
		return r.ownerOfName(k.iif)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	var owner nimbusv1.Key
	for key := range r.networksOfMark[k.fwmark] {
		if owner.IsZero() || key.Compare(owner) < 0 {
			owner = key
		}
	}
	return owner
}

// sweepGateway removes the gateway rules of tenants that have no desired network, the
// marks of interfaces and the links of bridges that are no bridge of a desired network;
// it reads the sysctls again and makes them 1 when a desired network has a gateway (so
// that one turned off by hand comes back), and puts them back otherwise.
func (r *NetworkReconciler) sweepGateway(ctx context.Context) error {
	g := r.gw
	marks := map[uint32]bool{}
	bridges := map[int32]bool{}
	names := map[string]bool{}
	for _, key := range r.store.Keys(nimbusv1.Kind_KIND_NETWORK) {
		id := key.String()
		marks[GatewayMark(key.Tenant)] = true
		names[BridgeName(id)] = true
		if l, ok := r.link(BridgeName(id)); ok {
			bridges[l.index] = true
		}
	}
	if g.objs != nil {
		attached, err := g.objs.Bridges()
		if err != nil {
			return kernelErr(err, "sweeping the gateway links")
		}
		for _, name := range attached {
			if names[name] {
				continue
			}
			r.log.Info("detaching the gateway programs from a bridge of no network", "bridge", name)
			if err := g.objs.Detach(name); err != nil {
				return kernelErr(err, "detaching the gateway programs from %s", name)
			}
			g.mu.Lock()
			delete(g.attached, name)
			g.mu.Unlock()
		}
	}
	if g.objs != nil {
		have, err := g.objs.MarksByIndex()
		if err != nil {
			return kernelErr(err, "sweeping the gateway marks")
		}
		for index := range have {
			if !bridges[int32(index)] {
				if err := g.objs.DeleteMark(index); err != nil {
					return kernelErr(err, "sweeping the gateway marks")
				}
			}
		}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	for k, proto := range r.rules.m.All() {
		if !k.overlay() || k.fwmark == 0 || marks[k.fwmark] {
			continue
		}
		r.log.Info("removing a stale gateway rule", "rule", ruleString(k))
		if err := r.deleteRule(ctx, k, proto); err != nil {
			return err
		}
	}
	g.reflectOn = false
	if r.gatewayWanted(nimbusv1.Key{}) {
		return r.ensureSysctlsLocked()
	}
	return r.putBackSysctlsLocked(nimbusv1.Key{})
}
