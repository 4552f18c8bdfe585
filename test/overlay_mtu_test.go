package test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/naplesnet/naples/internal/testns"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// TestOverlayNetworkMTUMustFitUnderlay runs a real agent over an uplink of MTU 1400: a
// network asking for MTU 1400, which VXLAN's 50 bytes do not leave room for, is FAILED at
// nimbus with a message naming spec.mtu, the value and the uplink's MTU, and makes no
// device, while a network beside it is programmed; asked again for 1350, it is
// programmed.
func TestOverlayNetworkMTUMustFitUnderlay(t *testing.T) {
	c := newCluster(t)
	u := newUnderlay(t)
	a := c.addHost(t, "host-a", "host-a")
	vtep := u.attach(t, a)
	testns.Run(t, "ip", "-n", u.ns, "link", "set", "up1", "mtu", "1400")
	testns.Run(t, "ip", "-n", a.ns, "link", "set", "uplink", "mtu", "1400")
	a.startAgent(t)

	network := func(name string, vni, mtu int) string {
		return fmt.Sprintf("kind: Network\nmeta: {name: %s}\nspec: {vni: %d, mtu: %d, subnet: 10.%d.0.0/24, gateway: 10.%d.0.1}\n---\n", name, vni, mtu, vni, vni)
	}
	c.apply(t, nodeYAML(a, vtep)+network("blue", 51, 1400)+network("green", 52, 0))

	want := "spec.mtu 1400: does not fit the underlay: uplink mtu 1400 carries at most 1350 with VXLAN over IPv4"
	var last *nimbusv1.NodeStatus
	waitFor(t, "network blue FAILED on host-a", func() bool {
		_, st, err := c.get(t, "network", "blue")
		last = nodeStatus(st, a.name)
		return err == nil && last.GetPhase() == nimbusv1.Phase_PHASE_FAILED
	})
	if !strings.HasPrefix(last.GetMessage(), want) || last.GetReason() != "InvalidSpec" {
		t.Errorf("network blue on host-a: reason %q, message %q; want InvalidSpec and %q", last.GetReason(), last.GetMessage(), want)
	}
	st := c.waitProgrammed(t, "network", "green", a.name, 1)
	if op := st.GetOperational(); op["mtu"] != "1350" {
		t.Errorf("network green on host-a: operational mtu %q, want 1350", op["mtu"])
	}
	// green's devices carry its alias; blue has none.
	a.networkDevices(t, "default", "green")
	links := testns.Run(t, "ip", "-n", a.ns, "-o", "link", "show")
	if !strings.Contains(links, "naples:Network/default/default/green") || strings.Contains(links, "naples:Network/default/default/blue") {
		t.Errorf("host-a's links: want green's devices and none of the FAILED network blue:\n%s", links)
	}

	c.apply(t, network("blue", 51, 1350))
	c.waitProgrammed(t, "network", "blue", a.name, 2)
	br, vx := a.networkDevices(t, "default", "blue")
	for _, dev := range []string{br, vx} {
		if out := testns.Run(t, "ip", "-n", a.ns, "-o", "link", "show", dev); !strings.Contains(out, " mtu 1350 ") {
			t.Errorf("%s with spec.mtu 1350: %s", dev, out)
		}
	}
}
