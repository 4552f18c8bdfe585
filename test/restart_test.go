package test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// delphiState is what `naplesctl delphi list -o json` says of one host.
type delphiState struct {
	Synced bool `json:"synced"`
	Items  []struct {
		Meta struct {
			Name string `json:"name"`
		} `json:"meta"`
		Status struct {
			Phase string `json:"phase"`
		} `json:"status"`
	} `json:"items"`
}

func (h *host) delphi(t *testing.T) (delphiState, bool) {
	t.Helper()
	out, err := h.c.ctl(t, "", "--agent", filepath.Join(h.c.dir, "agent-"+h.name+".sock"), "delphi", "list", "route", "-o", "json")
	if err != nil {
		return delphiState{}, false
	}
	var st delphiState
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("parsing delphi list %.200q: %v", out, err)
	}
	return st, true
}

// TestAgentRestartWithoutNimbus restarts an agent while nimbus is down: it restores its
// objects from its state directory, reports them PROGRAMMED without writing a single route
// (an `ip monitor route` in the host sees nothing), and once nimbus is back it resumes from
// the stored revision instead of taking a new snapshot.
func TestAgentRestartWithoutNimbus(t *testing.T) {
	c := newCluster(t)
	h := c.newHost(t, "host-a")
	other := strings.NewReplacer("to-dc2", "to-dc3", "198.51.100.0/24", "203.0.113.0/24").Replace(toDC2)
	c.apply(t, toDC2+"---\n"+other)
	c.waitProgrammed(t, "route", "to-dc2", "host-a", 1)
	c.waitProgrammed(t, "route", "to-dc3", "host-a", 1)

	c.nimbus.stop(t)
	h.agent.kill(t)

	monitor := h.monitorRoutes(t) // subscribed before the agent starts

	h.startAgent(t)
	waitFor(t, "the restarted agent to restore and report both routes with nimbus down", func() bool {
		st, ok := h.delphi(t)
		if !ok || !st.Synced || len(st.Items) != 2 {
			return false
		}
		for _, it := range st.Items {
			if it.Status.Phase != "PHASE_PROGRAMMED" {
				return false
			}
		}
		return true
	})
	if got := h.routes(t, 100); !strings.Contains(got, "198.51.100.0/24") || !strings.Contains(got, "203.0.113.0/24") {
		t.Fatalf("routes missing after the restart:\n%s", got)
	}
	if out := monitor.output(t); strings.TrimSpace(out) != "" {
		t.Errorf("the restarted agent rewrote routes that were already correct:\n%s", out)
	}

	c.startNimbus(t)
	changed := strings.Replace(toDC2, "10.10.0.2", "10.20.0.2", 1)
	c.apply(t, changed)
	c.waitProgrammed(t, "route", "to-dc2", "host-a", 2)
	log, err := os.ReadFile(h.agent.log)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(log), "resumed watch") {
		t.Errorf("the agent did not resume from its stored revision; its log:\n%s", log)
	}
	if strings.Contains(string(log), "synced with nimbus") {
		t.Errorf("the agent took a snapshot instead of resuming; its log:\n%s", log)
	}
}
