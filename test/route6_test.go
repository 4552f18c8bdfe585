package test

import (
	"strings"
	"testing"

	"github.com/naplesnet/naples/internal/testns"
)

const toDC2v6 = `kind: Route
meta:
  name: to-dc2-v6
  nodes: [host-a]
spec:
  table: 100
  prefix: 2001:db8:ff::/48
  nexthops:
    - gateway: 2001:db8:1::2
`

// routes6 returns `ip -6 route show table N` inside the host.
func (h *host) routes6(t *testing.T, table string) string {
	t.Helper()
	return testns.Run(t, "ip", "-n", h.ns, "-6", "route", "show", "table", table)
}

// TestIPv6RouteLifecycle is the IPv6 route through the whole chain: programmed at the
// kernel's metric 1024, changed, deleted; a foreign route on the same prefix is reported
// as a Conflict and survives the object's delete, and a spelling in capitals is refused.
func TestIPv6RouteLifecycle(t *testing.T) {
	c := newCluster(t)
	h := c.newHost(t, "host-a")
	testns.Run(t, "ip", "-n", h.ns, "addr", "add", "2001:db8:1::1/64", "dev", "eth0", "nodad")
	testns.Run(t, "ip", "-n", h.ns, "addr", "add", "2001:db8:2::1/64", "dev", "eth1", "nodad")

	c.apply(t, toDC2v6)
	c.waitProgrammed(t, "route", "to-dc2-v6", "host-a", 1)
	if got := h.routes6(t, "100"); !strings.Contains(got, "2001:db8:ff::/48 via 2001:db8:1::2 dev eth0 proto 241 metric 1024") {
		t.Fatalf("route not in host-a's table 100:\n%s", got)
	}
	c.apply(t, strings.Replace(toDC2v6, "2001:db8:1::2", "2001:db8:2::2", 1))
	c.waitProgrammed(t, "route", "to-dc2-v6", "host-a", 2)
	if got := h.routes6(t, "100"); !strings.Contains(got, "2001:db8:ff::/48 via 2001:db8:2::2 dev eth1 proto 241") {
		t.Fatalf("next hop not updated in table 100:\n%s", got)
	}
	c.mustCtl(t, "", "delete", "route", "to-dc2-v6")
	waitFor(t, "the route to leave the kernel", func() bool {
		return !strings.Contains(h.routes6(t, "100"), "2001:db8:ff::/48")
	})

	// Someone else's route holds the prefix: the object fails with Conflict, and deleting
	// it leaves their route as it was.
	testns.Run(t, "ip", "-n", h.ns, "-6", "route", "add", "2001:db8:ff::/48", "via", "2001:db8:1::9", "table", "100")
	c.apply(t, toDC2v6)
	waitFor(t, "a Conflict for the foreign route's prefix", func() bool {
		_, st, err := c.get(t, "route", "to-dc2-v6")
		return err == nil && nodeStatus(st, "host-a").GetReason() == "Conflict"
	})
	c.mustCtl(t, "", "delete", "route", "to-dc2-v6")
	waitFor(t, "the object to go", func() bool {
		_, _, err := c.get(t, "route", "to-dc2-v6")
		return err == errNotFound
	})
	// Another object on another prefix, programmed after the delete was handled, shows the
	// agent has caught up; the foreign route must still be there.
	c.apply(t, strings.NewReplacer("to-dc2-v6", "marker", "2001:db8:ff::/48", "2001:db8:fe::/48").Replace(toDC2v6))
	c.waitProgrammed(t, "route", "marker", "host-a", 1)
	if got := h.routes6(t, "100"); !strings.Contains(got, "2001:db8:ff::/48 via 2001:db8:1::9 dev eth0 metric 1024") {
		t.Fatalf("the foreign route was touched:\n%s", got)
	}

	_, err := c.ctl(t, strings.Replace(toDC2v6, "2001:db8:ff::/48", "2001:DB8:FF::/48", 1), "apply", "-f", "-")
	if err == nil || !strings.Contains(err.Error(), `spec.prefix "2001:DB8:FF::/48"`) || !strings.Contains(err.Error(), "write 2001:db8:ff::/48") {
		t.Errorf("applying a prefix in capitals: err = %v, want a refusal naming the field, the value and the canonical form", err)
	}
}
