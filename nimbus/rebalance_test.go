package nimbus

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"
	"time"
)

func TestPlanMove(t *testing.T) {
	for _, tc := range []struct {
		name      string
		own       int
		load      map[string]int
		slack     int
		wantTo    string
		wantShare int
	}{
		{name: "all on one", own: 9, load: map[string]int{"b": 0, "c": 0}, wantTo: "b", wantShare: 3},
		{name: "to the fewest", own: 5, load: map[string]int{"b": 2, "c": 1}, wantTo: "c", wantShare: 3},
		{name: "even", own: 3, load: map[string]int{"b": 3, "c": 3}, wantShare: 3},
		{name: "rounding", own: 4, load: map[string]int{"b": 3, "c": 3}, wantShare: 4},
		{name: "within the slack", own: 4, load: map[string]int{"b": 3, "c": 2}, slack: 1, wantShare: 3},
		{name: "above the slack", own: 5, load: map[string]int{"b": 3, "c": 1}, slack: 1, wantTo: "c", wantShare: 3},
		{name: "no peer below its share", own: 5, load: map[string]int{"b": 4}, wantShare: 5},
		{name: "no agent", own: 0, load: map[string]int{"b": 0}, wantShare: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			to, share := planMove(tc.own, tc.load, tc.slack)
			if to != tc.wantTo || share != tc.wantShare {
				t.Fatalf("planMove(%d, %v, %d) = %q, %d, want %q, %d", tc.own, tc.load, tc.slack, to, share, tc.wantTo, tc.wantShare)
			}
		})
	}
}

// TestPlanMoveSettles lets replicas that hold agents at random take turns, each moving
// one agent as planMove says, until none moves: they end within the slack of their share,
// no replica that received an agent gives one away (an agent moved is never moved back),
// and the moves are no more than the replicas' excess over their share at the start.
func TestPlanMoveSettles(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 500 {
		replicas, slack := 2+rng.IntN(4), rng.IntN(3)
		load := make([]int, replicas)
		total := 0
		for i := range load {
			load[i] = rng.IntN(40)
			total += load[i]
		}
		share := (total + replicas - 1) / replicas
		excess := 0
		for _, n := range load {
			excess += max(n-share, 0)
		}
		received := make([]bool, replicas)
		moves := 0
		for moved := true; moved; {
			moved = false
			for _, i := range rng.Perm(replicas) {
				peers := map[string]int{}
				for j, n := range load {
					if j != i {
						peers[strconv.Itoa(j)] = n
					}
				}
				to, _ := planMove(load[i], peers, slack)
				if to == "" {
					continue
				}
				if received[i] {
					t.Fatalf("round %d: replica %d gave away an agent after receiving one: loads %v", round, i, load)
				}
				j, _ := strconv.Atoi(to)
				load[i]--
				load[j]++
				received[j] = true
				moves++
				moved = true
			}
		}
		if hi := slices.Max(load); hi > share+slack {
			t.Fatalf("round %d: settled with a replica holding %d, above share %d + slack %d: loads %v", round, hi, share, slack, load)
		}
		if moves > excess {
			t.Fatalf("round %d: %d moves, more than the excess %d", round, moves, excess)
		}
	}
}

func TestRebalanceOptionsRefused(t *testing.T) {
	for _, o := range []RebalanceOptions{{Rate: -1}, {Rate: math.NaN()}, {Rate: math.Inf(1)}, {Rate: 1, Slack: -1}} {
		if _, err := New(Options{Rebalance: o}); !errors.Is(err, ErrInvalidOptions) {
			t.Errorf("New with Rebalance %+v: err = %v, want ErrInvalidOptions", o, err)
		}
	}
}

// TestCheckArrivals sends agents to two peers: b, which each one reaches, and c, which
// none reaches; a third, d, misses one agent and gets the next. Only c is left out, and
// only once missedAfter agents in a row missed it, each looked at once.
func TestCheckArrivals(t *testing.T) {
	st := newStore()
	r := &rebalancer{s: &Server{log: slog.New(slog.DiscardHandler)}, moves: map[string]*agentMove{},
		misses: map[string]int{}, missed: map[string]time.Time{}}
	start := time.Unix(1000, 0)
	txn := st.write()
	send := func(node, to, at string, i int) {
		r.moves[node] = &agentMove{to: to, at: start.Add(time.Duration(i) * time.Second)}
		if at != "" {
			txn.putWatchNode(&watchNodeRecord{Name: node, Streams: 1, Peers: map[string]int{at: 1}})
		}
	}
	for i := range missedAfter {
		send(fmt.Sprintf("b%d", i), "b", "b", i)
		send(fmt.Sprintf("c%d", i), "c", "b", i) // went to b instead
	}
	send("d0", "d", "", 0) // watches nowhere yet
	send("d1", "d", "d", 1)
	txn.commit()

	r.checkArrivals(st.read(), start.Add(movePending-time.Second))
	if len(r.missed) != 0 {
		t.Fatalf("before movePending: missed %v, want none", r.missed)
	}
	now := start.Add(movePending + missedAfter*time.Second)
	r.checkArrivals(st.read(), now)
	if want := map[string]time.Time{"c": now}; !maps.Equal(r.missed, want) {
		t.Fatalf("missed %v, want %v", r.missed, want)
	}
	if r.misses["b"] != 0 || r.misses["d"] != 0 {
		t.Fatalf("misses %v, want none left for b and d", r.misses)
	}
	for node, m := range r.moves {
		if !m.checked {
			t.Errorf("the move of %s was not looked at", node)
		}
	}
	// Looked at once: a second look changes nothing.
	delete(r.missed, "c")
	r.checkArrivals(st.read(), now.Add(time.Second))
	if len(r.missed) != 0 {
		t.Fatalf("a second look missed %v, want none", r.missed)
	}
}
