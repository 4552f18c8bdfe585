package linux

import (
	"fmt"
	"io"
	"net"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/naplesnet/naples/internal/testns"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// workload is a test workload: a namespace whose eth0 is a veth pair's end, the other end
// a port of a network's bridge on the test host, with an IPv4 and an IPv6 address and
// default routes through the network's gateways.
type workload struct {
	ns       string
	v4, v6   string
	accepted atomic.Int64
}

// attachWorkload creates a workload on the bridge of the network with the key ID, at
// host number 2 of its subnets v4net (such as "10.1.0") and v6net ("2001:db8:1").
func (h *overlayHost) attachWorkload(t *testing.T, networkID, port, v4net, v6net string) *workload {
	t.Helper()
	w := &workload{ns: testns.Named(t, "naples-wl"), v4: v4net + ".2", v6: v6net + "::2"}
	h.run(t, "ip", "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", w.ns)
	h.run(t, "ip", "link", "set", port, "master", BridgeName(networkID), "up")
	for _, args := range [][]string{
		{"addr", "add", w.v4 + "/24", "dev", "eth0"},
		{"addr", "add", w.v6 + "/64", "dev", "eth0", "nodad"},
		{"link", "set", "eth0", "up"},
		{"route", "add", "default", "via", v4net + ".1"},
		{"-6", "route", "add", "default", "via", v6net + "::1"},
	} {
		testns.Run(t, "ip", append([]string{"-n", w.ns}, args...)...)
	}
	return w
}

// serve runs a TCP echo server on port 7000 of the workload, both families, until the
// test ends; it counts the connections it accepts.
func (w *workload) serve(t *testing.T) {
	t.Helper()
	nsh := testns.Handle(t, w.ns)
	var ln net.Listener
	if err := runInNamespace(&nsh, func() error {
		var err error
		ln, err = net.Listen("tcp", ":7000")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			w.accepted.Add(1)
			_, _ = io.CopyN(c, c, 1)
			c.Close()
		}
	})
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
	})
}

// exchange connects from the workload to addr, port 7000, within timeout, and has one
// byte echoed.
func (w *workload) exchange(t *testing.T, addr string, timeout time.Duration) error {
	t.Helper()
	nsh := testns.Handle(t, w.ns)
	return runInNamespace(&nsh, func() error {
		c, err := net.DialTimeout("tcp", net.JoinHostPort(addr, "7000"), timeout)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Write([]byte{'x'}); err != nil {
			return err
		}
		b := make([]byte, 1)
		if _, err := io.ReadFull(c, b); err != nil {
			return err
		}
		if b[0] != 'x' {
			return fmt.Errorf("echoed %q, want %q", b, "x")
		}
		return nil
	})
}

// TestNetworkTenantRouting sends real traffic between workloads: two networks of one
// tenant route to each other through their gateways, in both families, and neither
// reaches the network of another tenant, whose packets the prohibit rule refuses; the
// host's main table holds no overlay route.
func TestNetworkTenantRouting(t *testing.T) {
	h := newOverlayHost(t)
	web := networkObj("acme", "web", 10, 0, subnet("10.1.0.0/24", "10.1.0.1"), subnet("2001:db8:1::/64", "2001:db8:1::1"))
	db := networkObj("acme", "db", 11, 0, subnet("10.2.0.0/24", "10.2.0.1"), subnet("2001:db8:2::/64", "2001:db8:2::1"))
	shop := networkObj("globex", "shop", 12, 0, subnet("10.3.0.0/24", "10.3.0.1"), subnet("2001:db8:3::/64", "2001:db8:3::1"))
	h.put(t, nodeObj(localNode, "192.0.2.1"), web, db, shop)
	for _, n := range []*nimbusv1.Object{web, db, shop} {
		op := h.mustReconcile(t, n.Key())
		if why := op.GetNetwork().GetIpv6ForwardingUnavailable(); why != "" {
			t.Fatalf("this kernel lacks per-interface IPv6 forwarding: %s", why)
		}
	}
	w1 := h.attachWorkload(t, web.Key().ID(), "vw1", "10.1.0", "2001:db8:1")
	w2 := h.attachWorkload(t, db.Key().ID(), "vw2", "10.2.0", "2001:db8:2")
	w3 := h.attachWorkload(t, shop.Key().ID(), "vw3", "10.3.0", "2001:db8:3")
	w2.serve(t)
	w3.serve(t)

	for _, addr := range []string{w2.v4, w2.v6} {
		if err := w1.exchange(t, addr, 5*time.Second); err != nil {
			t.Errorf("web to db (one tenant) at %s: %v", addr, err)
		}
	}
	if got := w2.accepted.Load(); got != 2 {
		t.Errorf("db accepted %d connections, want 2", got)
	}

	// Across tenants, both ways, all at once: the prohibit rule drops the SYNs. (The
	// host cannot tell the sender: its own packets have no route to overlay subnets.)
	var wg sync.WaitGroup
	for _, c := range []struct {
		from *workload
		to   string
	}{{w1, w3.v4}, {w1, w3.v6}, {w3, w2.v4}, {w3, w2.v6}} {
		wg.Go(func() {
			if err := c.from.exchange(t, c.to, time.Second); err == nil {
				t.Errorf("%s reached %s, of another tenant", c.from.v4, c.to)
			}
		})
	}
	wg.Wait()
	if got := w3.accepted.Load(); got != 0 {
		t.Errorf("shop accepted %d connections from another tenant", got)
	}
	if got := w2.accepted.Load(); got != 2 {
		t.Errorf("db accepted %d connections, want the 2 from its own tenant", got)
	}
	// The kernel's decision for a packet from web to shop, and to db.
	webBridge := BridgeName(web.Key().ID())
	for _, c := range []struct{ flag, from, to string }{{"-4", w1.v4, w3.v4}, {"-6", w1.v6, w3.v6}} {
		out, err := exec.Command("ip", "-n", h.ns, c.flag, "route", "get", c.to, "from", c.from, "iif", webBridge).CombinedOutput()
		if err == nil || !strings.Contains(string(out), "Permission denied") {
			t.Errorf("ip route get %s from %s iif %s: %v, %s; want it refused (prohibit)", c.to, c.from, webBridge, err, out)
		}
	}
	for _, c := range []struct{ flag, from, to string }{{"-4", w1.v4, w2.v4}, {"-6", w1.v6, w2.v6}} {
		out := h.run(t, "ip", c.flag, "route", "get", c.to, "from", c.from, "iif", webBridge)
		mustContain(t, "the route from web to db", out, "dev "+BridgeName(db.Key().ID()), fmt.Sprintf("table %d", TenantTable("acme")))
	}
	main := h.run(t, "ip", "route", "show", "table", "main") + h.run(t, "ip", "-6", "route", "show", "table", "main")
	for _, p := range []string{"10.1.0.0", "10.2.0.0", "10.3.0.0", "2001:db8:1::", "2001:db8:2::", "2001:db8:3::", "proto 242"} {
		if strings.Contains(main, p) {
			t.Errorf("the main table routes %s:\n%s", p, main)
		}
	}
}
