package linux

import (
	"context"
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/naplesnet/naples/hal"
	"github.com/naplesnet/naples/internal/testns"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// linkMTU reads the MTU of the link name in the host's namespace.
func (h *overlayHost) linkMTU(t *testing.T, name string) int {
	t.Helper()
	m := regexp.MustCompile(` mtu (\d+) `).FindStringSubmatch(h.run(t, "ip", "-o", "link", "show", name))
	if m == nil {
		t.Fatalf("ip link show %s: no mtu", name)
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// wantMTU fails the test unless the network's bridge and VXLAN device have the MTU.
func (h *overlayHost) wantMTU(t *testing.T, what string, key *nimbusv1.ObjectKey, mtu int) {
	t.Helper()
	for _, name := range []string{BridgeName(key.ID()), VXLANName(key.ID())} {
		if got := h.linkMTU(t, name); got != mtu {
			t.Fatalf("%s: %s has mtu %d, want %d", what, name, got, mtu)
		}
	}
}

// TestNetworkMTUFromUnderlay: a network without spec.mtu gets the underlay's MTU (the
// link that holds the VTEP address) less VXLAN's overhead, 50 bytes over IPv4 and 70
// over IPv6, and follows a change of the underlay's MTU, which the observer reports;
// spec.mtu set and then set back to 0 puts the default back; a spec.mtu that does not
// fit is FAILED, naming the underlay and the largest MTU that fits, and leaves the
// devices as they were.
func TestNetworkMTUFromUnderlay(t *testing.T) {
	for _, c := range []struct {
		name, vtep, addr string
		overhead         int
		family           string
	}{
		{"IPv4", "192.0.2.1", "192.0.2.1/24", 50, "IPv4"},
		{"IPv6", "2001:db8:ff::1", "2001:db8:ff::1/64", 70, "IPv6"},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newOverlayHost(t)
			h.run(t, "ip", "link", "add", "uplink", "mtu", "1500", "type", "veth", "peer", "name", "uplinkp")
			h.run(t, "ip", "addr", "add", c.addr, "dev", "uplink", "nodad")
			h.run(t, "ip", "link", "set", "uplink", "up")
			obj := networkObj("acme", "blue", 100, 0, subnet("10.1.0.0/24", "10.1.0.1"))
			key := obj.Key()
			h.put(t, nodeObj(localNode, c.vtep), obj)

			op := h.mustReconcile(t, key)
			def := 1500 - c.overhead
			h.wantMTU(t, "no spec.mtu over a 1500-byte underlay", key, def)
			wantUnderlay := fmt.Sprintf("uplink mtu 1500 carries at most %d with VXLAN over %s", def, c.family)
			if n := op.GetNetwork(); n.GetMtu() != uint32(def) || n.GetUnderlay() != wantUnderlay {
				t.Errorf("operational mtu %d, underlay %q; want %d, %q", n.GetMtu(), n.GetUnderlay(), def, wantUnderlay)
			}
			if m := op.Map(); m["mtu"] != fmt.Sprint(def) || m["underlay"] != wantUnderlay {
				t.Errorf("operational map mtu %q, underlay %q; want %d, %q", m["mtu"], m["underlay"], def, wantUnderlay)
			}
			writes := h.rec.KernelWrites()
			h.mustReconcile(t, key)
			if d := h.rec.KernelWrites() - writes; d != 0 {
				t.Errorf("reconciling an unchanged network wrote the kernel %d times", d)
			}

			// The underlay grows: the observer reports every network, which follows.
			enqueued := h.observeNetworks(t)
			drain(enqueued)
			h.run(t, "ip", "link", "set", "uplink", "mtu", "9000")
			epAwaitEnqueued(t, enqueued, key.ID(), "the underlay's MTU changed")
			h.mustReconcile(t, key)
			def = 9000 - c.overhead
			h.wantMTU(t, "after the underlay's MTU went to 9000", key, def)

			// spec.mtu, then back to 0: the default again, not the last value.
			h.put(t, networkObj("acme", "blue", 100, 1400, subnet("10.1.0.0/24", "10.1.0.1")))
			h.mustReconcile(t, key)
			h.wantMTU(t, "spec.mtu 1400", key, 1400)
			h.put(t, networkObj("acme", "blue", 100, 0, subnet("10.1.0.0/24", "10.1.0.1")))
			h.mustReconcile(t, key)
			h.wantMTU(t, "spec.mtu back to 0", key, def)

			// A spec.mtu that does not fit: FAILED, naming what fits, the devices as they were.
			h.put(t, networkObj("acme", "blue", 100, 9000, subnet("10.1.0.0/24", "10.1.0.1")))
			wantFailed(t, h, key, fmt.Sprintf("spec.mtu 9000: does not fit the underlay: uplink mtu 9000 carries at most %d with VXLAN over %s; set spec.mtu %d or less, or raise uplink's MTU", def, c.family, def))
			h.wantMTU(t, "spec.mtu 9000 that does not fit", key, def)

			// The underlay shrinks under a network with a spec.mtu that fitted: FAILED.
			h.put(t, networkObj("acme", "blue", 100, 8000, subnet("10.1.0.0/24", "10.1.0.1")))
			if op := h.mustReconcile(t, key); op.GetNetwork().GetMtuWarning() != "" {
				t.Errorf("operational mtu_warning %q with a spec.mtu that fits", op.GetNetwork().GetMtuWarning())
			}
			drain(enqueued)
			h.run(t, "ip", "link", "set", "uplink", "mtu", "1500")
			epAwaitEnqueued(t, enqueued, key.ID(), "the underlay's MTU shrank")
			wantFailed(t, h, key, "spec.mtu 8000: does not fit the underlay: uplink mtu 1500 ")
			h.wantMTU(t, "spec.mtu 8000 over a 1500-byte underlay", key, 8000)
		})
	}
}

// TestNetworkMTUWithoutUnderlayLink: with no link holding the VTEP address the default
// is derived from a 1500-byte underlay, and the status says so; once a link takes the
// address, the observer reports the networks, which follow its MTU.
func TestNetworkMTUWithoutUnderlayLink(t *testing.T) {
	h := newOverlayHost(t)
	obj := networkObj("acme", "blue", 100, 0, subnet("10.1.0.0/24", "10.1.0.1"))
	key := obj.Key()
	h.put(t, nodeObj(localNode, "192.0.2.1"), obj)
	op := h.mustReconcile(t, key)
	h.wantMTU(t, "no link holds the VTEP address", key, 1450)
	if want := "no link holds VTEP 192.0.2.1; a 1500-byte underlay carries at most 1450 with VXLAN over IPv4"; op.GetNetwork().GetUnderlay() != want {
		t.Errorf("operational underlay %q, want %q", op.GetNetwork().GetUnderlay(), want)
	}

	enqueued := h.observeNetworks(t)
	h.run(t, "ip", "link", "add", "uplink", "mtu", "9000", "type", "veth", "peer", "name", "uplinkp")
	h.run(t, "ip", "addr", "add", "192.0.2.1/24", "dev", "uplink")
	// The link's own event may enqueue the network before the address's has reached the
	// mirror: reconcile at each enqueue until the address's has come.
	for {
		epAwaitEnqueued(t, enqueued, key.ID(), "the VTEP address came")
		h.mustReconcile(t, key)
		if h.linkMTU(t, BridgeName(key.ID())) == 8950 {
			break
		}
	}
	h.wantMTU(t, "the VTEP address on a 9000-byte link", key, 8950)
}

// TestNetworkForwardingPutBack: the forwarding sysctls naples turned on for a network's
// bridge are put back when no gateway of the family needs them any more, also by a
// restarted reconciler; one that was on before naples needed it is left on.
func TestNetworkForwardingPutBack(t *testing.T) {
	h := newOverlayHost(t)
	state := filepath.Join(t.TempDir(), "sysctls.json")
	newRec := func() *NetworkReconciler {
		rec, err := NewNetworkReconciler(NetworkOptions{Store: h.store, Node: localNode, Namespace: &h.nsh, Logger: quiet, StateFile: state})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { rec.Close() })
		return rec
	}
	h.rec = newRec()
	v4gw, v6gw := subnet("10.1.0.0/24", "10.1.0.1"), subnet("2001:db8:1::/64", "2001:db8:1::1")
	v4, v6 := subnet("10.1.0.0/24", ""), subnet("2001:db8:1::/64", "")
	obj := networkObj("acme", "blue", 100, 0, v4gw, v6gw)
	key := obj.Key()
	br := BridgeName(key.ID())
	h.put(t, nodeObj(localNode, "192.0.2.1"), obj)
	want := func(what, fwd4, fwd6 string) {
		t.Helper()
		got4, got6 := h.sysctl(t, "net/ipv4/conf/"+br+"/forwarding"), h.sysctl(t, "net/ipv6/conf/"+br+"/force_forwarding")
		if got4 != fwd4 || got6 != fwd6 {
			t.Fatalf("%s: net.ipv4.conf.%s.forwarding %s, net.ipv6.conf.%s.force_forwarding %s; want %s, %s", what, br, got4, br, got6, fwd4, fwd6)
		}
	}

	h.mustReconcile(t, key)
	want("both gateways", "1", "1")

	// The IPv6 gateway goes: IPv6 forwarding is put back, IPv4's stays.
	h.put(t, networkObj("acme", "blue", 100, 0, v4gw, v6))
	h.mustReconcile(t, key)
	want("without the IPv6 gateway", "1", "0")
	writes := h.rec.KernelWrites()
	h.mustReconcile(t, key)
	if d := h.rec.KernelWrites() - writes; d != 0 {
		t.Errorf("reconciling an unchanged network wrote the kernel %d times", d)
	}

	// The IPv6 gateway comes back, and a restarted reconciler sees the IPv4 one go.
	h.put(t, networkObj("acme", "blue", 100, 0, v4, v6gw))
	h.rec.Close()
	h.rec = newRec()
	h.mustReconcile(t, key)
	want("a restarted reconciler, without the IPv4 gateway", "0", "1")

	// IPv4 forwarding was on before naples needed it: naples leaves it on.
	testns.Run(t, "ip", "netns", "exec", h.ns, "sysctl", "-qw", "net.ipv4.conf."+br+".forwarding=1")
	h.put(t, networkObj("acme", "blue", 100, 0, v4gw, v6gw))
	h.mustReconcile(t, key)
	want("both gateways again", "1", "1")
	h.put(t, networkObj("acme", "blue", 100, 0, v4, v6))
	h.mustReconcile(t, key)
	want("no gateway", "1", "0")
}

// TestEndpointFollowsBridgeMTU: a local endpoint's interface gets the MTU of its
// network's bridge, which the network reconciler derives from the underlay when the
// network has no spec.mtu, and follows it when it changes; released, it gets back the
// MTU it had before naples changed it, also from a restarted reconciler.
func TestEndpointFollowsBridgeMTU(t *testing.T) {
	o := newEPOverlay(t, 0)
	state := filepath.Join(t.TempDir(), "endpoints.json")
	newRec := func() *EndpointReconciler {
		rec, err := NewEndpointReconciler(EndpointOptions{Store: o.store, Node: o.node, Namespace: &o.nsh, Logger: quiet, StateFile: state})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { rec.Close() })
		return rec
	}
	o.rec = newRec()
	o.run(t, "ip", "link", "set", o.br, "mtu", "1450")
	o.run(t, "ip", "link", "add", "wl1", "mtu", "1500", "type", "veth", "peer", "name", "wl1p")
	ep := epEndpoint("db", "net1", "node-a", "wl1", "02:00:00:00:0a:01", "10.1.0.10")
	key := ep.Key()
	o.put(t, ep)
	enqueued := o.observe(t, o.rec)
	o.reconcile(t, key)
	if show := o.run(t, "ip", "link", "show", "wl1"); !strings.Contains(show, " master "+o.br+" ") || !strings.Contains(show, " mtu 1450 ") {
		t.Fatalf("ip link show wl1, want master %s, mtu 1450:\n%s", o.br, show)
	}

	o.run(t, "ip", "link", "set", o.br, "mtu", "1400")
	epAwaitEnqueued(t, enqueued, key.ID(), "the bridge's MTU changed")
	o.reconcile(t, key)
	if show := o.run(t, "ip", "link", "show", "wl1"); !strings.Contains(show, " mtu 1400 ") {
		t.Fatalf("ip link show wl1 after the bridge went to 1400, want mtu 1400:\n%s", show)
	}

	// Deleted while the agent was down: a restarted reconciler's sweep releases it, with
	// the MTU it had.
	o.rec.Close()
	o.del(t, key)
	o.rec = newRec()
	if err := o.rec.Sweep(context.Background(), func(nimbusv1.Key) {}); err != nil {
		t.Fatal(err)
	}
	if show := o.run(t, "ip", "link", "show", "wl1"); strings.Contains(show, " master ") || !strings.Contains(show, " mtu 1500 ") {
		t.Fatalf("ip link show wl1 after the delete, want no master, mtu 1500 as found:\n%s", show)
	}
}

// TestNetworkSweepSeesUnderlayMTU: an underlay MTU change that no observer reported (the
// agent was not watching) is found by the sweep's fresh read, which enqueues every
// network.
func TestNetworkSweepSeesUnderlayMTU(t *testing.T) {
	h := newOverlayHost(t)
	h.run(t, "ip", "link", "add", "uplink", "mtu", "1500", "type", "veth", "peer", "name", "uplinkp")
	h.run(t, "ip", "addr", "add", "192.0.2.1/24", "dev", "uplink")
	obj := networkObj("acme", "blue", 100, 0, subnet("10.1.0.0/24", "10.1.0.1"))
	h.put(t, nodeObj(localNode, "192.0.2.1"), obj)
	h.mustReconcile(t, obj.Key())
	h.wantMTU(t, "over a 1500-byte underlay", obj.Key(), 1450)

	var enqueued []string
	sweep := func() {
		t.Helper()
		enqueued = nil
		if err := h.rec.Sweep(context.Background(), func(key nimbusv1.Key) { enqueued = append(enqueued, key.String()) }); err != nil {
			t.Fatal(err)
		}
	}
	sweep() // what changed since the reconcile, unreported
	sweep()
	if len(enqueued) != 0 {
		t.Fatalf("a sweep with nothing changed enqueued %v", enqueued)
	}
	h.run(t, "ip", "link", "set", "uplink", "mtu", "2000")
	sweep()
	if !slices.Contains(enqueued, obj.Key().ID()) {
		t.Fatalf("the sweep after the underlay's MTU changed enqueued %v, want %s", enqueued, obj.Key().ID())
	}
	h.mustReconcile(t, obj.Key())
	h.wantMTU(t, "over a 2000-byte underlay", obj.Key(), 1950)
}

// wantFailed fails the test unless reconciling the network fails for good
// (hal.ReasonInvalid, which the HAL reports as FAILED and terminal) with a message that
// starts with want.
func wantFailed(t *testing.T, h *overlayHost, key *nimbusv1.ObjectKey, want string) {
	t.Helper()
	_, err := h.reconcile(t, key)
	if !hal.IsTerminal(err) || !strings.HasPrefix(err.Error(), want) {
		t.Fatalf("reconcile = %v (reason %s), want FAILED for good with %q", err, hal.ReasonOf(err), want)
	}
}

// TestNetworkMTUMustFitUnderlay: over an underlay of MTU 1400, a network asking for MTU
// 1400 is FAILED, naming spec.mtu, its value and the underlay link's MTU, and programs
// nothing, while a network beside it runs on; asking for 1350, what fits, programs it.
func TestNetworkMTUMustFitUnderlay(t *testing.T) {
	h := newOverlayHost(t)
	h.run(t, "ip", "link", "add", "uplink", "mtu", "1400", "type", "veth", "peer", "name", "uplinkp")
	h.run(t, "ip", "addr", "add", "192.0.2.1/24", "dev", "uplink", "nodad")
	h.run(t, "ip", "link", "set", "uplink", "up")
	other := networkObj("acme", "red", 200, 0, subnet("10.2.0.0/24", "10.2.0.1"))
	blue := networkObj("acme", "blue", 100, 1400, subnet("10.1.0.0/24", "10.1.0.1"))
	h.put(t, nodeObj(localNode, "192.0.2.1"), other, blue)
	h.mustReconcile(t, other.Key())
	h.wantMTU(t, "a network without spec.mtu", other.Key(), 1350)
	before := h.state(t, other.Key(), 0)
	writes := h.rec.KernelWrites()

	wantFailed(t, h, blue.Key(), "spec.mtu 1400: does not fit the underlay: uplink mtu 1400 carries at most 1350 with VXLAN over IPv4")
	for _, name := range []string{BridgeName(blue.Key().ID()), VXLANName(blue.Key().ID())} {
		if h.hasLink(t, name) {
			t.Errorf("the FAILED network made %s", name)
		}
	}
	// The FAILED network wrote nothing to the kernel; the other network's rules, tenant
	// routes and FDB are as they were (links and addresses are not compared: their timers
	// and IPv6 duplicate address detection move on by themselves).
	if d := h.rec.KernelWrites() - writes; d != 0 {
		t.Errorf("the FAILED network wrote the kernel %d times", d)
	}
	after := h.state(t, other.Key(), 0)
	if after.rules != before.rules || after.fdb != before.fdb || after.table != before.table {
		t.Errorf("the FAILED network disturbed the other one:\nbefore %+v\nafter  %+v", before, after)
	}

	h.put(t, networkObj("acme", "blue", 100, 1350, subnet("10.1.0.0/24", "10.1.0.1")))
	if op := h.mustReconcile(t, blue.Key()); op.GetNetwork().GetMtu() != 1350 || op.GetNetwork().GetMtuWarning() != "" {
		t.Errorf("spec.mtu 1350: operational mtu %d, warning %q; want 1350 and none", op.GetNetwork().GetMtu(), op.GetNetwork().GetMtuWarning())
	}
	h.wantMTU(t, "spec.mtu 1350 over a 1400-byte underlay", blue.Key(), 1350)
	h.wantMTU(t, "the other network", other.Key(), 1350)
}
