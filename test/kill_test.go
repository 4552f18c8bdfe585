package test

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/naplesnet/naples/delphi"
	"github.com/naplesnet/naples/internal/statefile"
	"github.com/naplesnet/naples/internal/testrand"
)

// The tests here SIGKILL an agent while it stores what nimbus streams to it, at random
// points, and check what its state file holds when it is dead: the desired objects must
// be exactly nimbus's state at the revision the file records, a prefix of the stream
// however many frames and commits it cut through. Then the agent restarts and converges.

// killRounds is how many times each test kills the agent.
const killRounds = 10

// killRoutes makes n Route manifests for every node, r0000 to r(n-1), each with its own
// prefix in table 100, via gateway, in the order of the indexes order, or r0000 first
// when order is nil.
func killRoutes(n int, gateway string, order []int) string {
	if order == nil {
		order = make([]int, n)
		for i := range order {
			order[i] = i
		}
	}
	var b strings.Builder
	for _, i := range order {
		name := fmt.Sprintf("r%04d", i)
		fmt.Fprintf(&b, "kind: Route\nmeta:\n  name: %s\nspec:\n  table: 100\n  prefix: 10.%d.%d.0/24\n  nexthops:\n    - gateway: %s\n---\n",
			name, 100+i/256, i%256, gateway)
	}
	return b.String()
}

// history is nimbus's history of the routes, revision by revision, as the test publishes
// it; every route is for every node.
type history struct {
	// names maps each revision to the route it changed; deleted tells the deletions.
	names   map[uint64]string
	deleted map[uint64]bool
	// rev is nimbus's revision.
	rev uint64
}

// stateAt returns the routes at revision rev, by name, with their revisions.
func (h *history) stateAt(rev uint64) map[string]uint64 {
	state := map[string]uint64{}
	for _, r := range slices.Sorted(maps.Keys(h.names)) {
		if r > rev {
			break
		}
		if h.deleted[r] {
			delete(state, h.names[r])
		} else {
			state[h.names[r]] = r
		}
	}
	return state
}

// listed records the revisions of the routes nimbus lists now, after changes that
// changed every listed route.
func (h *history) listed(t *testing.T, c *cluster) map[string]uint64 {
	t.Helper()
	revs := map[string]uint64{}
	for name, s := range revisions(t, c.mustCtl(t, "", "get", "routes", "-o", "json")) {
		rev, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("revision %q of %s: %v", s, name, err)
		}
		revs[name] = rev
		if h.names[rev] != "" && h.names[rev] != name {
			t.Fatalf("nimbus lists %s at revision %d, which changed %s", name, rev, h.names[rev])
		}
		h.names[rev] = name
		h.rev = max(h.rev, rev)
	}
	return revs
}

// deletedInOrder records the deletion of the named routes, which existed, in that order:
// they took the revisions after nimbus's.
func (h *history) deletedInOrder(names []string) {
	for _, n := range names {
		h.rev++
		h.names[h.rev], h.deleted[h.rev] = n, true
	}
}

// storedState reads the dead agent's state file: its resume point and the routes it
// holds, by name, with their revisions.
func (h *host) storedState(t *testing.T) (statefile.Position, map[string]uint64) {
	t.Helper()
	f, c, err := statefile.Open(filepath.Join(h.state, delphi.StateFile), statefile.Options{})
	if err != nil {
		t.Fatalf("reading the killed agent's state: %v", err)
	}
	defer f.Close()
	routes := map[string]uint64{}
	for _, o := range c.Objects {
		routes[o.GetMeta().GetName()] = o.GetMeta().GetRevision()
	}
	return c.Position, routes
}

// wantPrefix fails the test unless the dead agent's state file holds exactly nimbus's
// routes at the revision it records (none when it records none), and returns that
// revision.
func (h *host) wantPrefix(t *testing.T, hist *history, round int) uint64 {
	t.Helper()
	pos, routes := h.storedState(t)
	want := hist.stateAt(pos.Revision)
	if pos.Epoch == "" && pos.Revision == 0 {
		want = map[string]uint64{}
	}
	if !maps.Equal(routes, want) {
		var diff []string
		for name, rev := range want {
			if routes[name] != rev {
				diff = append(diff, fmt.Sprintf("%s at %d, want %d", name, routes[name], rev))
			}
		}
		for name, rev := range routes {
			if _, ok := want[name]; !ok {
				diff = append(diff, fmt.Sprintf("%s at %d, want none", name, rev))
			}
		}
		slices.Sort(diff)
		t.Fatalf("round %d: killed at revision %d, delphi holds %d routes that are not nimbus's %d then; first differences: %v",
			round, pos.Revision, len(routes), len(want), diff[:min(len(diff), 5)])
	}
	return pos.Revision
}

// waitConverged waits until the agent's delphi holds the routes nimbus lists, at their
// revisions.
func (h *host) waitConverged(t *testing.T, want map[string]uint64) {
	t.Helper()
	sock := filepath.Join(h.c.dir, "agent-"+h.name+".sock")
	waitFor(t, fmt.Sprintf("%s's delphi to hold nimbus's %d routes", h.name, len(want)), func() bool {
		out, err := h.c.ctl(t, "", "--agent", sock, "delphi", "list", "route", "-o", "json")
		if err != nil {
			return false
		}
		got := revisions(t, out)
		if len(got) != len(want) {
			return false
		}
		for name, rev := range want {
			if got[name] != strconv.FormatUint(rev, 10) {
				return false
			}
		}
		return true
	})
}

// killAfter kills the host's agent after d.
func (h *host) killAfter(t *testing.T, d time.Duration) {
	t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	<-timer.C
	h.agent.kill(t)
}

// TestAgentKilledDuringSnapshot kills an agent at random points while it receives and
// stores a snapshot of 2000 routes into an empty delphi: its state file holds either
// nothing or the whole snapshot at the snapshot's revision, never part of it, and once
// restarted the agent converges. The routes were applied in random order, so a snapshot,
// which comes in key order, has no prefix that is a state nimbus had.
func TestAgentKilledDuringSnapshot(t *testing.T) {
	const n = 2000
	rng := rand.New(rand.NewPCG(testrand.Seed(t), 0))
	c := newCluster(t)
	hist := &history{names: map[uint64]string{}, deleted: map[uint64]bool{}}
	c.apply(t, killRoutes(n, "10.10.0.2", rng.Perm(n)))
	want := hist.listed(t, c)
	h := c.newHost(t, "host-a")
	h.waitConverged(t, want)

	// How long a snapshot takes, from the agent's start to its log saying it stored it.
	h.agent.kill(t)
	began := time.Now()
	h.startAgentWith(t, "--discard-state")
	waitFor(t, "the agent to store the snapshot", func() bool {
		return strings.Contains(h.agentLog(t), "synced with nimbus")
	})
	took := time.Since(began)
	h.waitConverged(t, want)
	t.Logf("a snapshot of %d routes is stored %v after the agent's start", n, took)

	outcomes := map[string]int{}
	for round := range killRounds {
		h.agent.kill(t)
		h.startAgentWith(t, "--discard-state")
		h.killAfter(t, time.Duration(rng.Int64N(int64(took)*3/2)))
		switch rev := h.wantPrefix(t, hist, round); rev {
		case 0:
			outcomes["before the snapshot"]++
		default:
			outcomes["after the snapshot"]++
		}
		h.startAgent(t)
		h.waitConverged(t, want)
	}
	t.Logf("kills: %v", outcomes)
}

// TestAgentKilledDuringChanges kills an agent at random points while nimbus streams it
// rounds of changes to 1000 routes (every route changed, or a quarter of them deleted and
// then all applied again): every time, its state file holds exactly nimbus's routes at
// the revision it records, and once restarted the agent converges.
func TestAgentKilledDuringChanges(t *testing.T) {
	const n = 1000
	rng := rand.New(rand.NewPCG(testrand.Seed(t), 1))
	c := newCluster(t)
	hist := &history{names: map[uint64]string{}, deleted: map[uint64]bool{}}
	gateways := []string{"10.10.0.2", "10.20.0.2"}
	c.apply(t, killRoutes(n, gateways[0], nil))
	want := hist.listed(t, c)
	h := c.newHost(t, "host-a")
	h.waitConverged(t, want)

	// How long a round of changes takes to publish.
	began := time.Now()
	c.apply(t, killRoutes(n, gateways[1], nil))
	took := time.Since(began)
	want = hist.listed(t, c)
	h.waitConverged(t, want)
	t.Logf("publishing %d changes takes %v", n, took)

	var inside int
	for round := range killRounds {
		from := hist.rev
		gateway := gateways[round%2]
		published := make(chan error, 1)
		var gone []string
		if round%2 == 1 {
			for i := range n {
				if rng.IntN(4) == 0 {
					gone = append(gone, fmt.Sprintf("r%04d", i))
				}
			}
		}
		go func() {
			if len(gone) > 0 {
				if _, err := c.ctl(t, "", append([]string{"delete", "route"}, gone...)...); err != nil {
					published <- err
					return
				}
			}
			_, err := c.ctl(t, killRoutes(n, gateway, nil), "apply", "-f", "-")
			published <- err
		}()
		h.killAfter(t, time.Duration(rng.Int64N(int64(took)*3/2)))
		if err := <-published; err != nil {
			t.Fatal(err)
		}
		hist.deletedInOrder(gone)
		want = hist.listed(t, c)
		rev := h.wantPrefix(t, hist, round)
		if rev > from && rev < hist.rev {
			inside++
		}
		h.startAgent(t)
		h.waitConverged(t, want)
	}
	t.Logf("%d of %d kills left delphi inside a round of changes", inside, killRounds)
}
