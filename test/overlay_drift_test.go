//go:build linux

package test

import (
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/naplesnet/naples/internal/testns"
)

// repairBound is how long the agent may take to repair what was changed by hand before a
// drift test fails. The goal is under 2 s; the bound is generous because the machines
// that run these tests are shared and slow.
const repairBound = 10 * time.Second

// waitRepaired waits until repaired reports true, polling often, and returns the time
// since start. It fails the test when that takes longer than repairBound.
func waitRepaired(t testing.TB, what string, start time.Time, repaired func() bool) time.Duration {
	t.Helper()
	for !repaired() {
		if time.Since(start) > repairBound {
			t.Fatalf("%s: not repaired within %v", what, repairBound)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return time.Since(start)
}

// TestOverlayDrift changes by hand, in host-a, what the agent programmed for blue (a
// dual-stack network with workloads on host-a and host-b) and for green (a workload on
// host-b that blue's workloads route to): a remote endpoint's forwarding entries on the
// VXLAN device and on the bridge, its neighbour entry, blue's route in the tenant's table,
// the local endpoint's bridge port, blue's VXLAN device, and the bridge's state. The agent
// repairs each, and blue's workload on host-a then reaches the workloads on host-b again.
func TestOverlayDrift(t *testing.T) {
	c := newCluster(t)
	u := newUnderlay(t)
	a := c.addHost(t, "host-a", "host-a")
	b := c.addHost(t, "host-b", "host-b")
	vtepA, vtepB := u.attach(t, a), u.attach(t, b)
	a.startAgent(t)
	b.startAgent(t)
	blueA := newWorkload(t, a, "wblue-a", "02:00:00:00:01:0a", []string{"10.1.0.10/24", "fd00:1::a/64"}, "10.1.0.1", "fd00:1::1")
	blueB := newWorkload(t, b, "wblue-b", "02:00:00:00:01:0b", []string{"10.1.0.11/24", "fd00:1::b/64"}, "10.1.0.1", "fd00:1::1")
	greenB := newWorkload(t, b, "wgreen-b", "02:00:00:00:02:0b", []string{"10.2.0.11/24"}, "10.2.0.1")
	for _, w := range []*workload{blueA, blueB, greenB} {
		w.serve(t)
	}
	c.apply(t, nodeYAML(a, vtepA)+nodeYAML(b, vtepB)+overlayNetworksYAML+
		blueA.endpointYAML("default", "blue", a)+blueB.endpointYAML("default", "blue", b)+
		greenB.endpointYAML("default", "green", b))
	flows := func() {
		t.Helper()
		blueA.wantReach(t, blueB.ip(4))
		blueA.wantReach(t, blueB.ip(6))
		blueA.wantReach(t, greenB.ip(4))
		greenB.wantReach(t, blueA.ip(4))
	}
	flows()

	br, vx := a.networkDevices(t, "default", "blue")
	ip := func(args ...string) string { return testns.Run(t, "ip", append([]string{"-n", a.ns}, args...)...) }
	bridge := func(args ...string) string { return testns.Run(t, "bridge", append([]string{"-n", a.ns}, args...)...) }
	// fdbHas reports whether `bridge fdb show dev DEV` lists an entry with all the words.
	fdbHas := func(dev string, words ...string) bool {
		for line := range strings.Lines(bridge("fdb", "show", "dev", dev)) {
			fields := strings.Fields(line)
			if containsAll(fields, words...) {
				return true
			}
		}
		return false
	}
	const routeSubnet = "10.1.0.0/24"
	var table string
	waitFor(t, "blue's route in the tenant's table", func() bool {
		m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(routeSubnet) + ` dev ` + br + ` table (\d+) `).
			FindStringSubmatch(ip("route", "show", "table", "all", "proto", "242"))
		if m != nil {
			table = m[1]
		}
		return m != nil
	})
	isPort := func(dev string) bool {
		out := ip("link", "show", "dev", dev)
		return strings.Contains(out, " master "+br+" ") && strings.Contains(out, ",UP")
	}

	for _, step := range []struct {
		name string
		// drift is the command, ip or bridge, that changes host-a by hand.
		drift []string
		// repaired reports whether host-a holds again what the drift changed.
		repaired func() bool
	}{{
		name:  "remote endpoint's FDB entry on the VXLAN device",
		drift: []string{"bridge", "fdb", "del", blueB.mac, "dev", vx, "self"},
		repaired: func() bool {
			return fdbHas(vx, blueB.mac, "dst", vtepB, "self", "static")
		},
	}, {
		name:  "remote endpoint's FDB entry on the bridge",
		drift: []string{"bridge", "fdb", "del", blueB.mac, "dev", vx, "master"},
		repaired: func() bool {
			return fdbHas(vx, blueB.mac, "master", br, "static")
		},
	}, {
		name:  "remote endpoint's neighbour entry",
		drift: []string{"ip", "neigh", "del", blueB.ip(4), "dev", br},
		repaired: func() bool {
			return strings.Contains(ip("neigh", "show", blueB.ip(4), "dev", br), "lladdr "+blueB.mac+" PERMANENT")
		},
	}, {
		name:  "blue's route in the tenant's table",
		drift: []string{"ip", "route", "del", routeSubnet, "dev", br, "table", table, "proto", "242"},
		repaired: func() bool {
			return strings.Contains(ip("route", "show", "table", table, "proto", "242"), routeSubnet+" dev "+br+" ")
		},
	}, {
		name:     "local endpoint's bridge port",
		drift:    []string{"ip", "link", "set", blueA.name, "nomaster"},
		repaired: func() bool { return isPort(blueA.name) },
	}, {
		name:  "blue's VXLAN device",
		drift: []string{"ip", "link", "del", vx},
		repaired: func() bool {
			if !strings.Contains(ip("link", "show"), ": "+vx+": ") || !isPort(vx) {
				return false
			}
			return fdbHas(vx, "00:00:00:00:00:00", "dst", vtepB, "self") &&
				fdbHas(vx, blueB.mac, "dst", vtepB, "self", "static") &&
				fdbHas(vx, blueB.mac, "master", br, "static")
		},
	}, {
		name:  "blue's bridge, set down",
		drift: []string{"ip", "link", "set", br, "down"},
		repaired: func() bool {
			return strings.Contains(ip("link", "show", "dev", br), ",UP")
		},
	}} {
		if !step.repaired() {
			t.Fatalf("%s: missing before the drift; the test's check is wrong", step.name)
		}
		testns.Run(t, step.drift[0], append([]string{"-n", a.ns}, step.drift[1:]...)...)
		start := time.Now()
		took := waitRepaired(t, step.name, start, step.repaired)
		flows()
		t.Logf("%s (%s): repaired in %v, traffic flows after %v", step.name, strings.Join(step.drift, " "),
			took.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
	}
}

// containsAll reports whether fields holds every one of words.
func containsAll(fields []string, words ...string) bool {
	for _, w := range words {
		if !slices.Contains(fields, w) {
			return false
		}
	}
	return true
}
