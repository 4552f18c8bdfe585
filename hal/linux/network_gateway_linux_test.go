package linux

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/naplesnet/naples/hal"
	"github.com/naplesnet/naples/hal/linux/gwbpf"
	"github.com/naplesnet/naples/internal/testns"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// TestNetworkGatewayState: a network with a gateway gets its tenant's mark on its
// bridge, the programs on both tcx hooks of the bridge, the tenant's fwmark rules and the
// mark reflection sysctls on; a second network of the tenant shares the rules. The
// sysctls' found values are kept in the state file, so that a restarted reconciler puts
// them back when the last network goes, with the rules, the marks and the links.
func TestNetworkGatewayState(t *testing.T) {
	h := newOverlayHost(t)
	for _, s := range gatewaySysctls {
		if got := h.sysctl(t, s); got != "0" {
			t.Fatalf("a fresh namespace has %s = %s, want 0", s, got)
		}
	}
	w := h.dualStack(t)
	other := networkObj("acme", "green", 200, 0, subnet("10.2.0.0/24", "10.2.0.1"))
	h.put(t, other)
	op := h.mustReconcile(t, w.key)
	h.mustReconcile(t, other.Key())
	mark := GatewayMark("acme")
	if n := op.GetNetwork(); n.GetGatewayMark() != mark || n.GetGatewayUnavailable() != "" {
		t.Errorf("status gateway_mark %#x, gateway_unavailable %q; want %#x, none", n.GetGatewayMark(), n.GetGatewayUnavailable(), mark)
	}
	if want := fmt.Sprintf("%#x", mark); op.Map()["gatewayMark"] != want {
		t.Errorf("status gatewayMark = %q, want %q", op.Map()["gatewayMark"], want)
	}
	for _, s := range gatewaySysctls {
		if got := h.sysctl(t, s); got != "1" {
			t.Errorf("with a gateway, %s = %s, want 1", s, got)
		}
	}
	rule := fmt.Sprintf("1002:\tfrom all fwmark %#x lookup %d proto 242", mark, mark)
	for _, family := range []string{"-4", "-6"} {
		rules := h.run(t, "ip", family, "rule", "show")
		if strings.Count(rules, rule) != 1 {
			t.Errorf("ip %s rule show: want one %q\n%s", family, rule, rules)
		}
	}
	bridge := BridgeName(w.key.ID())
	for _, hook := range []string{"ingress", "egress"} {
		if _, err := os.Stat(h.bpfDir + "/gateway/links/" + bridge + "-" + hook); err != nil {
			t.Errorf("the %s link of %s is not pinned: %v", hook, bridge, err)
		}
	}
	marks := h.gatewayMarks(t)
	if len(marks) != 2 {
		t.Errorf("the gateway map holds %v, want the marks of two bridges", marks)
	}
	if b, err := os.ReadFile(h.stateFile); err != nil || !strings.Contains(string(b), `"/proc/sys/net/ipv4/fwmark_reflect":"0"`) {
		t.Errorf("the state file holds %q (%v), want the values found", b, err)
	}

	// Turned off by hand, the sweep turns it on again.
	testns.Run(t, "ip", "netns", "exec", h.ns, "sysctl", "-qw", "net.ipv4.fwmark_reflect=0")
	if err := h.rec.Sweep(t.Context(), func(nimbusv1.Key) {}); err != nil {
		t.Fatal(err)
	}
	if got := h.sysctl(t, gatewaySysctls[0]); got != "1" {
		t.Errorf("after it was turned off by hand and a sweep, %s = %s, want 1", gatewaySysctls[0], got)
	}

	// The agent restarts; then both networks go.
	h.rec.Close()
	h.rec = h.newReconciler(t)
	h.del(t, w.key)
	h.mustReconcile(t, w.key)
	if rules := h.run(t, "ip", "rule", "show"); !strings.Contains(rules, rule) {
		t.Errorf("the tenant's rule went with one of its two networks:\n%s", rules)
	}
	if got := h.sysctl(t, gatewaySysctls[0]); got != "1" {
		t.Errorf("with a network with a gateway left, %s = %s, want 1", gatewaySysctls[0], got)
	}
	h.del(t, other.Key())
	h.mustReconcile(t, other.Key())
	for _, s := range gatewaySysctls {
		if got := h.sysctl(t, s); got != "0" {
			t.Errorf("with no network left, %s = %s, want it put back to 0", s, got)
		}
	}
	for _, family := range []string{"-4", "-6"} {
		mustNotContain(t, "the rules with no network left", h.run(t, "ip", family, "rule", "show"), "fwmark")
	}
	if marks := h.gatewayMarks(t); len(marks) != 0 {
		t.Errorf("with no network left the gateway map holds %v", marks)
	}
	if ents, _ := os.ReadDir(h.bpfDir + "/gateway/links"); len(ents) != 0 {
		t.Errorf("with no network left links are pinned: %v", ents)
	}
	if b, err := os.ReadFile(h.stateFile); err != nil || strings.Contains(string(b), "fwmark") {
		t.Errorf("with nothing to put back the state file holds %q (%v), want no record of the mark sysctls", b, err)
	}
}

// TestNetworkGatewayCapacity: with room for one bridge's mark, a second network is
// FAILED with ReasonCapacityExceeded and naples_gateway_capacity_exceeded_total counts it;
// the first one keeps its mark.
func TestNetworkGatewayCapacity(t *testing.T) {
	h := newOverlayHost(t)
	h.rec.Close()
	reg := prometheus.NewPedanticRegistry()
	rec, err := NewNetworkReconciler(NetworkOptions{Store: h.store, Node: localNode, Namespace: &h.nsh, Logger: quiet,
		BPFDir: h.bpfDir, StateFile: h.stateFile, GatewayBridges: 1, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rec.Close() })
	h.rec = rec
	w := h.dualStack(t)
	second := networkObj("acme", "green", 200, 0, subnet("10.2.0.0/24", "10.2.0.1"))
	h.put(t, second)
	h.mustReconcile(t, w.key)
	_, err = h.reconcile(t, second.Key())
	var he *hal.Error
	if !errors.As(err, &he) || he.Reason != ReasonCapacityExceeded || !strings.Contains(err.Error(), "--gateway-bridges") {
		t.Fatalf("reconciling a second network with room for one bridge: %v, want %s naming --gateway-bridges", err, ReasonCapacityExceeded)
	}
	if got := testutil.ToFloat64(h.rec.gw.exceeded); got != 1 {
		t.Errorf("naples_gateway_capacity_exceeded_total = %v, want 1", got)
	}
	if n, err := testutil.GatherAndCount(reg, "naples_gateway_capacity_exceeded_total", "naples_gateway_bridges_capacity"); err != nil || n != 2 {
		t.Errorf("gathered %d gateway metrics (%v), want 2", n, err)
	}
	if marks := h.gatewayMarks(t); len(marks) != 1 {
		t.Errorf("the gateway map holds %v, want the first network's mark", marks)
	}
}

// gatewayMarks returns what the pinned gateway map holds.
func (h *overlayHost) gatewayMarks(t *testing.T) map[uint32]uint32 {
	t.Helper()
	o, err := gwbpf.Open(h.bpfDir+"/gateway", h.rec.gw.capacity)
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	marks, err := o.MarksByIndex()
	if err != nil {
		t.Fatal(err)
	}
	return marks
}

// TestNetworkGatewaySweep: a network deleted while the agent was down, whose bridge went
// too, leaves no gateway state behind the next agent's first sweep: no pinned links, no
// rules, and the sysctls as found.
func TestNetworkGatewaySweep(t *testing.T) {
	h := newOverlayHost(t)
	w := h.dualStack(t)
	h.mustReconcile(t, w.key)
	h.rec.Close()
	bridge := BridgeName(w.key.ID())
	h.run(t, "ip", "link", "del", VXLANName(w.key.ID()))
	h.run(t, "ip", "link", "del", bridge)
	h.del(t, w.key)
	h.rec = h.newReconciler(t)
	if err := h.rec.Sweep(t.Context(), func(nimbusv1.Key) {}); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(h.bpfDir + "/gateway/links"); len(ents) != 0 {
		t.Errorf("after the sweep links are pinned: %v", ents)
	}
	for _, family := range []string{"-4", "-6"} {
		mustNotContain(t, "the rules after the sweep", h.run(t, "ip", family, "rule", "show"), "fwmark")
	}
	for _, s := range gatewaySysctls {
		if got := h.sysctl(t, s); got != "0" {
			t.Errorf("after the sweep %s = %s, want it put back to 0", s, got)
		}
	}
}

// gatewayAttached returns "" when the gateway programs' pinned links of the bridge are
// attached to it and the map holds its mark, and no mark of an interface that is gone;
// what is wrong otherwise.
func (h *overlayHost) gatewayAttached(t *testing.T, bridge string, mark uint32) string {
	t.Helper()
	var index int
	exists := map[uint32]bool{}
	if err := runInNamespace(&h.nsh, func() error {
		ifs, err := net.Interfaces()
		for _, ifi := range ifs {
			exists[uint32(ifi.Index)] = true
			if ifi.Name == bridge {
				index = ifi.Index
			}
		}
		return err
	}); err != nil || index == 0 {
		return fmt.Sprintf("bridge %s: not found (%v)", bridge, err)
	}
	marks := h.gatewayMarks(t)
	if marks[uint32(index)] != mark {
		return fmt.Sprintf("the gateway map holds %v, want %#x for %s (index %d)", marks, mark, bridge, index)
	}
	for i := range marks {
		if !exists[i] {
			return fmt.Sprintf("the gateway map holds a mark for index %d, which no interface has: %v", i, marks)
		}
	}
	for _, hook := range []string{"ingress", "egress"} {
		l, err := link.LoadPinnedLink(h.bpfDir+"/gateway/links/"+bridge+"-"+hook, nil)
		if err != nil {
			return fmt.Sprintf("the gateway's %s link of %s: %v", hook, bridge, err)
		}
		info, err := l.Info()
		l.Close()
		if err != nil || info.TCX() == nil || int(info.TCX().Ifindex) != index {
			return fmt.Sprintf("the gateway's %s link is not attached to %s (index %d): %+v %v", hook, bridge, index, info, err)
		}
	}
	return ""
}

// TestNetworkGatewayDetachedByHand: the gateway programs' links detached from a network's
// bridge by hand, by `bpftool link detach` or by removing the pin, are noticed by the
// observer, which enqueues the network and counts them in naples_gateway_detached_total,
// and its reconcile attaches them again: the bridge's tcx hooks run the pinned links once
// more.
func TestNetworkGatewayDetachedByHand(t *testing.T) {
	h := newOverlayHost(t)
	h.rec.Close()
	h.rec = h.newReconcilerWith(t, func(o *NetworkOptions) { o.GatewayCheckInterval = 50 * time.Millisecond })
	w := h.dualStack(t)
	h.mustReconcile(t, w.key)
	bridge := BridgeName(w.key.ID())
	mark := GatewayMark("acme")
	if problem := h.gatewayOnBridge(t, bridge, mark); problem != "" {
		t.Fatal(problem)
	}
	enqueued := h.observeNetworks(t)
	drain(enqueued)

	pin := func(hook string) string { return h.bpfDir + "/gateway/links/" + bridge + "-" + hook }
	for _, c := range []struct {
		how    string
		detach func(t *testing.T)
	}{
		{"bpftool link detach of the ingress link", func(t *testing.T) {
			l, err := link.LoadPinnedLink(pin("ingress"), nil)
			if err != nil {
				t.Fatal(err)
			}
			info, err := l.Info()
			l.Close()
			if err != nil {
				t.Fatal(err)
			}
			if out, err := exec.Command("bpftool", "link", "detach", "id", fmt.Sprint(info.ID)).CombinedOutput(); err != nil {
				t.Fatalf("bpftool link detach id %d: %v\n%s", info.ID, err, out)
			}
		}},
		{"the egress link's pin removed", func(t *testing.T) {
			if err := os.Remove(pin("egress")); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		before := testutil.ToFloat64(h.rec.gw.detached)
		c.detach(t)
		// Nothing attaches the programs again before repairs reconciles, so the check
		// finds them detached within its interval; an enqueue left over from before
		// could otherwise repair them before the check counts.
		deadline := time.Now().Add(20 * time.Second)
		for testutil.ToFloat64(h.rec.gw.detached) == before {
			if time.Now().After(deadline) {
				t.Fatalf("%s: naples_gateway_detached_total still %v after 20s", c.how, before)
			}
			time.Sleep(10 * time.Millisecond)
		}
		h.repairs(t, enqueued, w.key, func() string {
			if p := h.gatewayOnBridge(t, bridge, mark); p != "" {
				return c.how + ": " + p
			}
			return ""
		})
		drain(enqueued)
	}
	if got := testutil.ToFloat64(h.rec.gw.detached); got < 2 {
		t.Errorf("naples_gateway_detached_total = %v after two links were detached, want at least 2", got)
	}
}

// gatewayOnBridge returns "" when gatewayAttached finds nothing wrong and each tcx hook of
// the bridge runs the gateway's pinned link of that hook, as the kernel lists them; what
// is wrong otherwise.
func (h *overlayHost) gatewayOnBridge(t *testing.T, bridge string, mark uint32) string {
	t.Helper()
	if p := h.gatewayAttached(t, bridge, mark); p != "" {
		return p
	}
	for i, at := range []ebpf.AttachType{ebpf.AttachTCXIngress, ebpf.AttachTCXEgress} {
		hook := []string{"ingress", "egress"}[i]
		l, err := link.LoadPinnedLink(h.bpfDir+"/gateway/links/"+bridge+"-"+hook, nil)
		if err != nil {
			return fmt.Sprintf("the gateway's %s link of %s: %v", hook, bridge, err)
		}
		info, err := l.Info()
		l.Close()
		if err != nil {
			return fmt.Sprintf("the gateway's %s link of %s: %v", hook, bridge, err)
		}
		var res *link.QueryResult
		if err := runInNamespace(&h.nsh, func() error {
			ifi, err := net.InterfaceByName(bridge)
			if err != nil {
				return err
			}
			res, err = link.QueryPrograms(link.QueryOptions{Target: ifi.Index, Attach: at})
			return err
		}); err != nil {
			return fmt.Sprintf("querying the tcx %s programs of %s: %v", hook, bridge, err)
		}
		found := false
		for _, p := range res.Programs {
			if id, ok := p.LinkID(); ok && id == info.ID {
				found = true
			}
		}
		if !found {
			return fmt.Sprintf("the tcx %s hook of %s does not run the pinned link %d: %+v", hook, bridge, info.ID, res.Programs)
		}
	}
	return ""
}
