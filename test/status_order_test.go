package test

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/naplesnet/naples/internal/testns"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// orderRoute is a route for host-a in table 100 to 10.N.0.0/24 through gw.
func orderRoute(name string, n int, gw string) string {
	return fmt.Sprintf(`kind: Route
meta:
  name: %s
  nodes: [host-a]
spec:
  table: 100
  prefix: 172.16.%d.0/24
  nexthops:
    - gateway: %s
`, name, n, gw)
}

// programmedRoutes reads every route's status with `naplesctl get routes -o json` and
// returns the prefixes of the routes nimbus shows PROGRAMMED at their generation on node,
// by route name.
func (c *cluster) programmedRoutes(t *testing.T, node string) map[string]string {
	t.Helper()
	out := c.mustCtl(t, "", "get", "routes", "-o", "json")
	var doc struct {
		Items []struct {
			Meta   json.RawMessage `json:"meta"`
			Spec   json.RawMessage `json:"spec"`
			Status json.RawMessage `json:"status"`
		} `json:"items"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("parsing %.200q: %v", out, err)
	}
	got := map[string]string{}
	for _, it := range doc.Items {
		meta, st := &nimbusv1.ObjectMeta{}, &nimbusv1.ObjectStatus{}
		spec := &nimbusv1.RouteSpec{}
		if err := protojson.Unmarshal(it.Meta, meta); err != nil {
			t.Fatalf("parsing meta %s: %v", it.Meta, err)
		}
		if err := protojson.Unmarshal(it.Spec, spec); err != nil {
			t.Fatalf("parsing spec %s: %v", it.Spec, err)
		}
		if len(it.Status) > 0 {
			if err := protojson.Unmarshal(it.Status, st); err != nil {
				t.Fatalf("parsing status %s: %v", it.Status, err)
			}
		}
		if ns := nodeStatus(st, node); ns.GetPhase() == nimbusv1.Phase_PHASE_PROGRAMMED &&
			ns.GetObservedGeneration() == meta.GetGeneration() {
			got[meta.GetName()] = spec.GetPrefix()
		}
	}
	return got
}

// TestStatusNeverAheadOfKernel runs the agent out of order: of twenty routes applied
// together, the one in the middle goes through a gateway host-a cannot reach until the
// test gives it an address there, so the agent programs the routes after it first. nimbus
// derives statuses from the agent's watermark; at no time may it show a route PROGRAMMED
// on host-a that host-a's kernel does not have. Each read of the statuses is followed by a
// read of the kernel's table, and routes are only added, so a route shown PROGRAMMED must
// be in the table read after.
func TestStatusNeverAheadOfKernel(t *testing.T) {
	c := newCluster(t)
	h := c.newHost(t, "host-a")
	var manifest []string
	for i := range 20 {
		name, gw := fmt.Sprintf("order-%02d", i), "10.10.0.2"
		if i == 10 {
			name, gw = "late", "10.30.0.2"
		}
		manifest = append(manifest, orderRoute(name, i, gw))
	}
	c.apply(t, strings.Join(manifest, "---\n"))
	start := time.Now()

	check := func() map[string]string {
		shown := c.programmedRoutes(t, "host-a")
		table := tableRoutes(t, h, 100)
		for name, prefix := range shown {
			if !strings.Contains(table, prefix+" via ") {
				t.Fatalf("nimbus shows route %s (%s) PROGRAMMED on host-a, whose table 100 lacks it:\n%s", name, prefix, table)
			}
		}
		return shown
	}
	// The routes after the late one are programmed, and shown, before it.
	waitFor(t, "the routes after the late one to be shown PROGRAMMED before it", func() bool {
		shown := check()
		_, late := shown["late"]
		_, after := shown["order-19"]
		return after && !late
	})
	t.Logf("%v: the routes after the late one are shown before it", time.Since(start))
	// Checked twice more: the late route is still not shown.
	for range 2 {
		if _, late := check()["late"]; late {
			t.Fatal("route late shown PROGRAMMED while its gateway is unreachable")
		}
	}
	testns.Run(t, "ip", "-n", h.ns, "addr", "add", "10.30.0.1/24", "dev", "eth1")
	t.Logf("%v: the late route's gateway is reachable", time.Since(start))
	waitFor(t, "every route to be shown PROGRAMMED once the late one's gateway is reachable", func() bool {
		return len(check()) == 20
	})
	t.Logf("%v: every route shown", time.Since(start))
}

// tableRoutes is `ip route show table N` in the host; empty while the table does not
// exist yet.
func tableRoutes(t *testing.T, h *host, table int) string {
	t.Helper()
	out, err := exec.Command("ip", "-n", h.ns, "route", "show", "table", strconv.Itoa(table)).CombinedOutput()
	if err != nil && !strings.Contains(string(out), "does not exist") {
		t.Fatalf("ip -n %s route show table %d: %v\n%s", h.ns, table, err, out)
	}
	return string(out)
}
