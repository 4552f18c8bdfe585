package test

import (
	"strings"
	"testing"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// TestOverlayConflictRefused runs endpoint web-a on host-a and applies, with naplesctl,
// endpoint aaa with web-a's address, then with web-a's interface, and a multicast MAC:
// nimbus refuses each, naming what it takes and from whom, nothing of it is stored, and
// web-a stays PROGRAMMED at its generation, its workload reachable from host-b's.
func TestOverlayConflictRefused(t *testing.T) {
	c := newCluster(t)
	u := newUnderlay(t)
	a := c.addHost(t, "host-a", "host-a")
	b := c.addHost(t, "host-b", "host-b")
	vtepA, vtepB := u.attach(t, a), u.attach(t, b)
	for _, h := range []*host{a, b} {
		h.startAgent(t)
	}
	webA := newWorkload(t, a, "web-a", "02:00:00:00:01:0a", []string{"10.1.0.10/24", "fd00:1::a/64"}, "10.1.0.1", "fd00:1::1")
	webB := newWorkload(t, b, "web-b", "02:00:00:00:01:0b", []string{"10.1.0.11/24", "fd00:1::b/64"}, "10.1.0.1", "fd00:1::1")
	webA.serve(t)
	c.apply(t, nodeYAML(a, vtepA)+nodeYAML(b, vtepB)+overlayNetworksYAML+
		webA.endpointYAML("default", "blue", a)+webB.endpointYAML("default", "blue", b))
	c.waitProgrammed(t, "endpoint", "web-a", "host-a", 1)
	webB.wantReach(t, webA.ip(4))

	for _, tc := range []struct {
		name, manifest, want string
	}{
		{"address", "kind: Endpoint\nmeta: {name: aaa}\nspec: {network: blue, node: host-b, interface: aaa, mac: \"02:00:00:00:01:0c\", ips: [10.1.0.10]}\n",
			`endpoint "default/aaa": spec.ips "10.1.0.10" is already used by endpoint "default/web-a" in network "blue"`},
		{"interface", "kind: Endpoint\nmeta: {name: aaa}\nspec: {network: blue, node: host-a, interface: web-a, mac: \"02:00:00:00:01:0c\", ips: [10.1.0.12]}\n",
			`endpoint "default/aaa": spec.interface "web-a" is already used by endpoint "default/web-a" on node "host-a"`},
		{"multicast MAC", "kind: Endpoint\nmeta: {name: aaa}\nspec: {network: blue, node: host-b, interface: aaa, mac: \"01:00:5e:00:00:01\", ips: [10.1.0.12]}\n",
			`spec.mac "01:00:5e:00:00:01": a multicast or broadcast address`},
	} {
		_, err := c.ctl(t, tc.manifest, "apply", "-f", "-")
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "nothing applied") {
			t.Errorf("%s: naplesctl apply of aaa: %v\nwant a refusal saying nothing was applied and %s", tc.name, err, tc.want)
		}
		if _, _, err := c.get(t, "endpoint", "aaa"); err != errNotFound {
			t.Fatalf("%s: after the refusal, get endpoint aaa: %v, want not found", tc.name, err)
		}
	}
	gen, st, err := c.get(t, "endpoint", "web-a")
	if err != nil {
		t.Fatal(err)
	}
	if ns := nodeStatus(st, "host-a"); gen != 1 || ns.GetPhase() != nimbusv1.Phase_PHASE_PROGRAMMED || ns.GetObservedGeneration() != 1 {
		t.Errorf("web-a after the refusals: generation %d, host-a's status %v; want PROGRAMMED at 1", gen, ns)
	}
	webB.wantReach(t, webA.ip(4))
}
