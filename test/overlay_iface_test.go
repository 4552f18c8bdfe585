//go:build linux

package test

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/naplesnet/naples/internal/testns"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// This file covers the host interfaces of the overlay: Interface objects for host NICs,
// and endpoints whose host-side interface is not there yet.

// ipLink is what `ip -j -s address show dev DEV` says of a link.
type ipLink struct {
	Flags     []string `json:"flags"`
	MTU       int      `json:"mtu"`
	OperState string   `json:"operstate"`
	AddrInfo  []struct {
		Local     string `json:"local"`
		PrefixLen int    `json:"prefixlen"`
	} `json:"addr_info"`
	Stats struct {
		RX struct {
			Bytes   uint64 `json:"bytes"`
			Packets uint64 `json:"packets"`
		} `json:"rx"`
		TX struct {
			Bytes   uint64 `json:"bytes"`
			Packets uint64 `json:"packets"`
		} `json:"tx"`
	} `json:"stats64"`
}

// link reads the link dev of the host with `ip -j -s address show`.
func (h *host) link(t testing.TB, dev string) ipLink {
	t.Helper()
	out := testns.Run(t, "ip", "-n", h.ns, "-j", "-s", "address", "show", "dev", dev)
	var links []ipLink
	if err := json.Unmarshal([]byte(out), &links); err != nil || len(links) != 1 {
		t.Fatalf("parsing ip -j -s address show dev %s: %v\n%s", dev, err, out)
	}
	return links[0]
}

// up reports whether the link is administratively up.
func (l ipLink) up() bool { return slices.Contains(l.Flags, "UP") }

// addrs returns the link's addresses in CIDR form.
func (l ipLink) addrs() []string {
	var out []string
	for _, a := range l.AddrInfo {
		out = append(out, fmt.Sprintf("%s/%d", a.Local, a.PrefixLen))
	}
	return out
}

// interfaceStatus waits until host reports the Interface object PROGRAMMED at the
// generation with operational data for which ok holds, and returns that data. The typed
// operational data must say the same.
func (c *cluster) interfaceStatus(t testing.TB, name, node string, generation int64, what string, ok func(op map[string]string) bool) map[string]string {
	t.Helper()
	var last map[string]string
	var typed *nimbusv1.OperationalData
	waitFor(t, fmt.Sprintf("interface %s on %s at generation %d: %s", name, node, generation, what), func() bool {
		gen, st, err := c.get(t, "interface", name)
		if err != nil {
			return false
		}
		ns := nodeStatus(st, node)
		if gen != generation || ns.GetPhase() != nimbusv1.Phase_PHASE_PROGRAMMED || ns.GetObservedGeneration() != generation {
			return false
		}
		last, typed = ns.GetOperational(), ns.GetOperationalData()
		return ok(last)
	})
	if typed.GetInterface() == nil || !maps.Equal(typed.Map(), last) {
		t.Fatalf("interface %s on %s: typed operational data %v; want what the string form says, %v", name, node, typed, last)
	}
	return last
}

// counter returns an operational counter of an Interface's status, failing the test when it
// is missing or not a number.
func counter(t testing.TB, op map[string]string, name string) uint64 {
	t.Helper()
	v, err := strconv.ParseUint(op[name], 10, 64)
	if err != nil {
		t.Fatalf("operational %s = %q: %v (all: %v)", name, op[name], err, op)
	}
	return v
}

// TestOverlayInterface programs an Interface object for a host NIC, a veth whose peer is
// in a namespace of its own: the agent sets it up with the object's MTU and addresses,
// and the status at nimbus carries its operational state, carrier and counters, which
// grow with traffic over it. Set down, the link goes down and the status says so; deleted,
// the object's addresses go and the link is put back as the agent found it.
func TestOverlayInterface(t *testing.T) {
	c := newCluster(t)
	h := c.newHostWith(t, "host-a", "--interface-stats-interval", "200ms")
	// newWorkload makes the NIC, nic0 in the host, down, with its peer up in a namespace
	// of its own: the machine on the other end of the wire.
	peer := newWorkload(t, h, "nic0", "02:00:00:00:50:02", []string{"10.50.0.2/24"})
	testns.Run(t, "ip", "-n", peer.ns, "link", "set", "eth0", "mtu", "1400")
	// The host answers echoes on every address, nic0's included.
	(&workload{name: h.name, ns: h.ns}).serve(t)
	if l := h.link(t, "nic0"); l.up() || l.MTU != 1500 {
		t.Fatalf("nic0 before the Interface object: flags %v, mtu %d; want down, 1500", l.Flags, l.MTU)
	}

	const manifest = `kind: Interface
meta: {name: nic0, nodes: [host-a]}
spec: {adminUp: %t, mtu: 1400, addresses: [10.50.0.1/24, "fd00:50::1/64"]}
`
	c.apply(t, fmt.Sprintf(manifest, true))
	c.waitProgrammed(t, "interface", "nic0", "host-a", 1)
	l := h.link(t, "nic0")
	if !l.up() || l.MTU != 1400 || !slices.Contains(l.addrs(), "10.50.0.1/24") || !slices.Contains(l.addrs(), "fd00:50::1/64") {
		t.Errorf("nic0 programmed: flags %v, mtu %d, addresses %v; want UP, 1400, 10.50.0.1/24 and fd00:50::1/64", l.Flags, l.MTU, l.addrs())
	}
	op := c.interfaceStatus(t, "nic0", "host-a", 1, "operState up, carrier", func(op map[string]string) bool {
		return op["operState"] == "up" && op["carrier"] == "true"
	})
	if op["adminUp"] != "true" || op["mtu"] != "1400" {
		t.Errorf("operational = %v; want adminUp true, mtu 1400", op)
	}
	rxBefore, txBefore := counter(t, op, "rxBytes"), counter(t, op, "txPackets")

	// Traffic over nic0: echoes from the peer to the host's new address, and a burst of
	// datagrams that no one answers, large enough that nothing else on the link can
	// account for the growth.
	peer.wantReach(t, "10.50.0.1")
	const datagrams, size = 100, 1200
	payload := make([]byte, size)
	for range datagrams {
		peer.sendUDP(t, "10.50.0.1", 9, payload)
	}
	echoes := 0
	for range 10 {
		if peer.exchange(t, "udp", "10.50.0.1", time.Second) {
			echoes++
		}
	}
	if echoes == 0 {
		t.Fatal("no UDP echo from the host over nic0")
	}
	kernel := h.link(t, "nic0")
	op = c.interfaceStatus(t, "nic0", "host-a", 1, "counters that count the traffic", func(op map[string]string) bool {
		return counter(t, op, "rxBytes") >= max(kernel.Stats.RX.Bytes, rxBefore+datagrams*size) &&
			counter(t, op, "txPackets") >= max(kernel.Stats.TX.Packets, txBefore+uint64(echoes))
	})
	t.Logf("nic0's status after the traffic: %v (before: rxBytes %d, txPackets %d)", op, rxBefore, txBefore)

	c.apply(t, fmt.Sprintf(manifest, false))
	c.interfaceStatus(t, "nic0", "host-a", 2, "adminUp false, operState down", func(op map[string]string) bool {
		return op["adminUp"] == "false" && op["operState"] == "down"
	})
	if l := h.link(t, "nic0"); l.up() {
		t.Errorf("nic0 with adminUp false: flags %v; want it down", l.Flags)
	}

	c.mustCtl(t, "", "delete", "interface", "nic0")
	waitFor(t, "nic0 to lose the object's addresses and be put back as found: down, mtu 1500", func() bool {
		l := h.link(t, "nic0")
		a := l.addrs()
		return !slices.Contains(a, "10.50.0.1/24") && !slices.Contains(a, "fd00:50::1/64") && !l.up() && l.MTU == 1500
	})
}

// TestOverlayMissingInterface applies an endpoint on host-b whose host-side interface does
// not exist yet, beside endpoints whose interfaces do. The endpoint is PENDING at nimbus
// with a message naming the interface, while the others are PROGRAMMED and reachable; once
// its workload's veth appears, it is PROGRAMMED and reachable too.
func TestOverlayMissingInterface(t *testing.T) {
	c := newCluster(t)
	u := newUnderlay(t)
	a := c.addHost(t, "host-a", "host-a")
	b := c.addHost(t, "host-b", "host-b")
	vtepA, vtepB := u.attach(t, a), u.attach(t, b)
	a.startAgent(t)
	b.startAgent(t)
	blueA := newWorkload(t, a, "wblue-a", "02:00:00:00:01:0a", []string{"10.1.0.10/24", "fd00:1::a/64"}, "10.1.0.1", "fd00:1::1")
	blueB := newWorkload(t, b, "wblue-b", "02:00:00:00:01:0b", []string{"10.1.0.11/24", "fd00:1::b/64"}, "10.1.0.1", "fd00:1::1")
	blueA.serve(t)
	blueB.serve(t)
	// The late workload's Endpoint, written before its workload exists.
	late := &workload{name: "wlate-b", mac: "02:00:00:00:01:1b"}
	lateAddrs := []string{"10.1.0.21/24", "fd00:1::1b/64"}
	for _, p := range lateAddrs {
		late.ips = append(late.ips, netip.MustParsePrefix(p))
	}
	c.apply(t, nodeYAML(a, vtepA)+nodeYAML(b, vtepB)+overlayNetworksYAML+
		blueA.endpointYAML("default", "blue", a)+blueB.endpointYAML("default", "blue", b)+
		late.endpointYAML("default", "blue", b))

	// It may wait for its network's bridge first (WaitingForNetwork), then for its
	// interface, which never comes until the workload is made.
	var pending *nimbusv1.NodeStatus
	waitFor(t, "endpoint wlate-b PENDING on host-b, WaitingForInterface", func() bool {
		_, st, err := c.get(t, "endpoint", late.name)
		pending = nodeStatus(st, "host-b")
		return err == nil && pending.GetPhase() == nimbusv1.Phase_PHASE_PENDING && pending.GetObservedGeneration() == 1 &&
			pending.GetReason() == "WaitingForInterface"
	})
	if !strings.Contains(pending.GetMessage(), `"wlate-b"`) {
		t.Errorf("wlate-b on host-b: reason %q, message %q; want WaitingForInterface and a message naming \"wlate-b\"", pending.GetReason(), pending.GetMessage())
	}
	for _, w := range []*workload{blueA, blueB} {
		for _, node := range []string{"host-a", "host-b"} {
			c.waitProgrammed(t, "endpoint", w.name, node, 1)
		}
	}
	blueA.wantReach(t, blueB.ip(4))
	blueB.wantReach(t, blueA.ip(6))
	// Still pending: nothing came that it waits for.
	if _, st, err := c.get(t, "endpoint", late.name); err != nil || nodeStatus(st, "host-b").GetPhase() != nimbusv1.Phase_PHASE_PENDING {
		t.Errorf("wlate-b on host-b with no interface: %v, %v; want PENDING", nodeStatus(st, "host-b"), err)
	}

	start := time.Now()
	lateW := newWorkload(t, b, late.name, late.mac, lateAddrs, "10.1.0.1", "fd00:1::1")
	lateW.serve(t)
	took := firstExchange(t, blueA, "udp", lateW.ip(4), start)
	t.Logf("the interface appeared: first UDP echo from host-a %v after the workload's creation began", took.Round(time.Millisecond))
	c.waitProgrammed(t, "endpoint", late.name, "host-b", 1)
	blueA.wantReach(t, lateW.ip(4))
	blueA.wantReach(t, lateW.ip(6))
	if l := b.link(t, late.name); !l.up() {
		t.Errorf("%s on host-b: flags %v; want UP", late.name, l.Flags)
	}
	if out := testns.Run(t, "ip", "-n", b.ns, "link", "show", "dev", late.name); !strings.Contains(out, " master nbr") {
		t.Errorf("%s on host-b is not a port of a naples bridge:\n%s", late.name, out)
	}
}
