package test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/naplesnet/naples/internal/testns"
)

// foreignRoute is a route added by hand to table 100, which the agent shares with its own
// routes and must never touch.
const foreignRoute = "192.0.2.0/24 via 10.10.0.9"

// addForeignRoute adds foreignRoute to the host's table 100.
func (h *host) addForeignRoute(t *testing.T) {
	t.Helper()
	testns.Run(t, "ip", "-n", h.ns, "route", "add", "192.0.2.0/24", "via", "10.10.0.9", "table", "100")
}

// naplesRoutes returns the host's routes of protocol 241 in every table.
func (h *host) naplesRoutes(t *testing.T) string {
	t.Helper()
	return testns.Run(t, "ip", "-n", h.ns, "route", "show", "table", "all", "proto", "241")
}

// agentLog returns what the host's current agent has logged so far.
func (h *host) agentLog(t *testing.T) string {
	t.Helper()
	out, err := os.ReadFile(h.agent.log)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// linesWith returns the lines of out that contain s, trimmed.
func linesWith(out, s string) []string {
	var lines []string
	for l := range strings.Lines(out) {
		if strings.Contains(l, s) {
			lines = append(lines, strings.TrimSpace(l))
		}
	}
	return lines
}

// TestDiscardStateRemovesNothingBeforeSync starts an agent with --discard-state, and so an
// empty delphi, on a host whose kernel holds the routes a previous agent programmed, while
// nimbus is down. Until nimbus has sent it a complete snapshot the agent must not remove
// any of them: it knows nothing yet, so a route it does not know is not a stale one. Once
// synced it removes the route nimbus deleted meanwhile and keeps, never deleting it, the
// one nimbus still has; a route added by hand survives throughout.
func TestDiscardStateRemovesNothingBeforeSync(t *testing.T) {
	c := newCluster(t)
	h := c.newHost(t, "host-a")
	h.addForeignRoute(t)
	gone := strings.NewReplacer("to-dc2", "gone", "198.51.100.0/24", "203.0.113.0/24").Replace(toDC2)
	c.apply(t, toDC2+"---\n"+gone)
	c.waitProgrammed(t, "route", "to-dc2", "host-a", 1)
	c.waitProgrammed(t, "route", "gone", "host-a", 1)

	h.agent.kill(t)
	c.mustCtl(t, "", "delete", "route", "gone")
	c.nimbus.stop(t)

	monitor := h.monitorRoutes(t) // subscribed before the agent starts
	h.startAgentWith(t, "--discard-state")
	waitFor(t, "the agent to serve its local API with an empty delphi that is not synced", func() bool {
		st, ok := h.delphi(t)
		return ok && !st.Synced && len(st.Items) == 0 && strings.Contains(h.agentLog(t), "agent started")
	})
	if got := h.routes(t, 100); !strings.Contains(got, "198.51.100.0/24 via 10.10.0.2") ||
		!strings.Contains(got, "203.0.113.0/24 via 10.10.0.2") || !strings.Contains(got, foreignRoute) {
		t.Errorf("with nimbus down, the agent removed routes before it was synced; table 100:\n%s", got)
	}
	if out := monitor.output(t); strings.TrimSpace(out) != "" {
		t.Errorf("with nimbus down and nothing in delphi, the agent wrote routes:\n%s", out)
	}

	c.startNimbus(t)
	waitFor(t, "the route deleted at nimbus to leave the kernel once the agent synced", func() bool {
		return !strings.Contains(h.routes(t, 100), "203.0.113.0/24")
	})
	c.waitProgrammed(t, "route", "to-dc2", "host-a", 1)
	waitFor(t, "delphi to hold to-dc2 alone, synced and PROGRAMMED", func() bool {
		st, ok := h.delphi(t)
		return ok && st.Synced && len(st.Items) == 1 && st.Items[0].Meta.Name == "to-dc2" &&
			st.Items[0].Status.Phase == "PHASE_PROGRAMMED"
	})
	got := h.routes(t, 100)
	for _, want := range []string{"198.51.100.0/24 via 10.10.0.2 dev eth0 proto 241", foreignRoute} {
		if !strings.Contains(got, want) {
			t.Errorf("after the sync, table 100 lacks %q:\n%s", want, got)
		}
	}
	out := monitor.output(t)
	if lines := linesWith(out, "198.51.100.0/24"); len(lines) > 0 {
		t.Errorf("the route nimbus still has was touched (deleted or rewritten): %q; the monitor saw:\n%s", lines, out)
	}
	if lines := linesWith(out, "203.0.113.0/24"); len(lines) != 1 || !strings.HasPrefix(lines[0], "Deleted ") {
		t.Errorf("the stale route's changes were %q, want one deletion; the monitor saw:\n%s", lines, out)
	}
	if lines := linesWith(out, "192.0.2.0/24"); len(lines) > 0 {
		t.Errorf("the route added by hand was touched: %q", lines)
	}
	if log := h.agentLog(t); !strings.Contains(log, "synced with nimbus") {
		t.Errorf("the agent with discarded state did not take a snapshot; its log:\n%s", log)
	}
}

// TestEmptySnapshotSweeps has an agent that programmed routes take a snapshot that holds
// no objects at all, because nimbus no longer has any for it and the agent cannot resume:
// delphi ends empty and the kernel holds no naples route, while a route added by hand to
// the same table survives.
func TestEmptySnapshotSweeps(t *testing.T) {
	for _, tc := range []struct {
		name string
		// empty leaves nimbus with no objects for the agent, in a way that makes the agent
		// take a snapshot the next time it watches.
		empty func(t *testing.T, c *cluster, h *host)
	}{{
		// The agent is down while the routes are deleted, and nimbus restarts meanwhile; a
		// restarted nimbus keeps no history, so the agent, behind by the deletions, cannot
		// resume.
		name: "agent restarted after deletions",
		empty: func(t *testing.T, c *cluster, h *host) {
			h.agent.kill(t)
			c.mustCtl(t, "", "delete", "route", "to-dc2")
			c.mustCtl(t, "", "delete", "route", "to-dc3")
			c.nimbus.stop(t)
			c.startNimbus(t)
			h.startAgent(t)
		},
	}, {
		// The agent keeps running while nimbus restarts without its store, as an
		// --ephemeral nimbus does: a new epoch, no objects.
		name: "nimbus lost its store",
		empty: func(t *testing.T, c *cluster, h *host) {
			c.nimbus.stop(t)
			if err := os.RemoveAll(filepath.Join(c.dir, "nimbus-data")); err != nil {
				t.Fatal(err)
			}
			c.startNimbus(t)
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t)
			h := c.newHost(t, "host-a")
			h.addForeignRoute(t)
			other := strings.NewReplacer("to-dc2", "to-dc3", "198.51.100.0/24", "203.0.113.0/24").Replace(toDC2)
			c.apply(t, toDC2+"---\n"+other)
			c.waitProgrammed(t, "route", "to-dc2", "host-a", 1)
			c.waitProgrammed(t, "route", "to-dc3", "host-a", 1)
			agentLog := h.agentLog(t)

			tc.empty(t, c, h)
			waitFor(t, "the agent to take a snapshot with no objects", func() bool {
				for _, l := range linesWith(strings.TrimPrefix(h.agentLog(t), agentLog), "synced with nimbus") {
					if strings.Contains(l, " objects=0 ") {
						return true
					}
				}
				return false
			})
			waitFor(t, "delphi to end synced and empty", func() bool {
				st, ok := h.delphi(t)
				return ok && st.Synced && len(st.Items) == 0
			})
			waitFor(t, "the kernel to hold no naples route", func() bool {
				return strings.TrimSpace(h.naplesRoutes(t)) == ""
			})
			if got := h.routes(t, 100); !strings.Contains(got, foreignRoute) {
				t.Errorf("the route added by hand did not survive the sweep; table 100:\n%s", got)
			}
			nimbusLog, err := os.ReadFile(c.nimbus.log)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(string(nimbusLog), "watch cannot resume; sending a snapshot") {
				t.Errorf("nimbus did not refuse the agent's resume, so the test did not cover a resync; its log:\n%s", nimbusLog)
			}
		})
	}
}
