package test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/naplesnet/naples/internal/testns"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

const toDC2 = `kind: Route
meta:
  name: to-dc2
  nodes: [host-a]
spec:
  table: 100
  prefix: 198.51.100.0/24
  nexthops:
    - gateway: 10.10.0.2
`

func TestRouteLifecycle(t *testing.T) {
	c := newCluster(t)
	h := c.newHost(t, "host-a")

	// A route added by hand to the same table must survive everything below.
	testns.Run(t, "ip", "-n", h.ns, "route", "add", "192.0.2.0/24", "via", "10.10.0.9", "table", "100")

	c.apply(t, toDC2)
	c.waitProgrammed(t, "route", "to-dc2", "host-a", 1)
	if got := h.routes(t, 100); !strings.Contains(got, "198.51.100.0/24 via 10.10.0.2 dev eth0 proto 241") {
		t.Fatalf("route not in host-a's table 100:\n%s", got)
	}

	// Change the next hop: the kernel follows and generation 2 is observed.
	c.apply(t, strings.Replace(toDC2, "10.10.0.2", "10.20.0.2", 1))
	c.waitProgrammed(t, "route", "to-dc2", "host-a", 2)
	if got := h.routes(t, 100); !strings.Contains(got, "198.51.100.0/24 via 10.20.0.2 dev eth1") {
		t.Fatalf("next hop not updated in table 100:\n%s", got)
	}
	table := c.mustCtl(t, "", "get", "routes")
	if !strings.Contains(table, "to-dc2") || !strings.Contains(table, "1/1") {
		t.Errorf("get routes table does not show to-dc2 programmed on 1/1 nodes:\n%s", table)
	}

	// Delete: the route and its status go.
	c.mustCtl(t, "", "delete", "route", "to-dc2")
	waitFor(t, "route to leave the kernel", func() bool {
		return !strings.Contains(h.routes(t, 100), "198.51.100.0/24")
	})
	if _, _, err := c.get(t, "route", "to-dc2"); !errors.Is(err, errNotFound) {
		t.Errorf("get after delete: err = %v, want not found", err)
	}
	if got := h.routes(t, 100); !strings.Contains(got, "192.0.2.0/24 via 10.10.0.9") {
		t.Errorf("the route added by hand was touched:\n%s", got)
	}
}

func TestInvalidRouteRefused(t *testing.T) {
	c := newCluster(t)
	h := c.newHost(t, "host-a")
	c.apply(t, toDC2)
	c.waitProgrammed(t, "route", "to-dc2", "host-a", 1)
	before := h.routes(t, 100)

	for _, tc := range []struct{ from, to, field string }{
		{"198.51.100.0/24", "198.51.100.0/33", "spec.prefix"},
		{"10.10.0.2", "10.10.0.999", "spec.nexthops[0].gateway"},
	} {
		bad := strings.Replace(toDC2, tc.from, tc.to, 1)
		_, err := c.ctl(t, bad, "apply", "-f", "-")
		if err == nil || !strings.Contains(err.Error(), tc.field) || !strings.Contains(err.Error(), tc.to) {
			t.Errorf("applying %s %q: err = %v, want a refusal naming the field and the value", tc.field, tc.to, err)
		}
	}
	// Nothing changed: still generation 1, still the same kernel state.
	gen, _, err := c.get(t, "route", "to-dc2")
	if err != nil || gen != 1 {
		t.Errorf("after refused applies: generation %d, err %v; want 1", gen, err)
	}
	if after := h.routes(t, 100); after != before {
		t.Errorf("kernel changed by a refused apply:\nbefore:\n%s\nafter:\n%s", before, after)
	}
}

// TestAgentRestart kills the agent with SIGKILL, changes desired state while it is gone,
// and restarts it: the programmed route stays in the kernel throughout, the object deleted
// meanwhile is removed, the one added meanwhile is programmed, and status is reported again.
func TestAgentRestart(t *testing.T) {
	c := newCluster(t)
	h := c.newHost(t, "host-a")
	gone := strings.NewReplacer("to-dc2", "gone", "198.51.100.0/24", "203.0.113.0/24").Replace(toDC2)
	c.apply(t, toDC2+"---\n"+gone)
	before := c.waitProgrammed(t, "route", "to-dc2", "host-a", 1)
	c.waitProgrammed(t, "route", "gone", "host-a", 1)

	h.agent.kill(t)
	if got := h.routes(t, 100); !strings.Contains(got, "198.51.100.0/24 via 10.10.0.2") {
		t.Fatalf("route gone after the agent was killed:\n%s", got)
	}
	c.mustCtl(t, "", "delete", "route", "gone")
	added := strings.NewReplacer("to-dc2", "added", "198.51.100.0/24", "192.0.2.0/24").Replace(toDC2)
	c.apply(t, added)

	h.startAgentWith(t, metricsFlags...)
	tel := h.telemetry(t)
	c.waitProgrammed(t, "route", "added", "host-a", 1)
	c.waitProgrammed(t, "route", "to-dc2", "host-a", 1)
	// nimbus takes watermarks: the new agent reports its status again as a watermark that
	// passes both routes, which it has programmed (it sends no status of its own for them).
	out, err := c.ctl(t, "", "get", "route", "added", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Meta json.RawMessage `json:"meta"`
	}
	meta := &nimbusv1.ObjectMeta{}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("parsing %q: %v", out, err)
	}
	if err := protojson.Unmarshal(doc.Meta, meta); err != nil {
		t.Fatalf("parsing meta %s: %v", doc.Meta, err)
	}
	if before.GetPhase() != nimbusv1.Phase_PHASE_PROGRAMMED || meta.GetGenerationRevision() == 0 {
		t.Fatalf("to-dc2 before the restart: %v; added's generation revision %d", before, meta.GetGenerationRevision())
	}
	waitFor(t, "the new agent's status watermark to pass the route added while it was down", func() bool {
		return tel.metrics(t)["naples_nimbusclient_status_watermark"] >= float64(meta.GetGenerationRevision())
	})
	waitFor(t, "the route deleted while the agent was down to leave the kernel", func() bool {
		return !strings.Contains(h.routes(t, 100), "203.0.113.0/24")
	})
	got := h.routes(t, 100)
	for _, want := range []string{"198.51.100.0/24 via 10.10.0.2", "192.0.2.0/24 via 10.10.0.2"} {
		if !strings.Contains(got, want) {
			t.Errorf("after restart, table 100 lacks %q:\n%s", want, got)
		}
	}
}
