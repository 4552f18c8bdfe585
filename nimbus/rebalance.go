package nimbus

import (
	"context"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/naplesnet/naples/internal/telemetry"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// RebalanceOptions make a replica spread the agents over the replicas again, for instance
// after one restarted and got none: a replica that holds more than its share of them asks
// some to watch another replica, which they do without a resync (docs/replicas.md,
// "Rebalancing").
//
// A replica knows from the peers' push streams which nodes watch which replica. Its share
// is ceil(agents / replicas), the replicas being itself and the peers whose push streams
// to it are up, once that set has not changed for 2 seconds. While it is ready and holds
// more than its share plus Slack, it asks one agent at a time, at about Rate a second at
// random moments, to move to the peer that holds the fewest agents, provided that peer
// holds fewer than its share: a replica never receives more than its share, so no
// replica asks an agent to move back. It picks the agent at random among those whose
// watch is caught up and that watch nowhere else, and asks no node twice within a minute.
// An agent asked to move counts towards its peer until a replica shows it watching, for
// up to 10 seconds; a peer that three such agents in a row do not watch after 10 seconds
// (it is up but not ready, or the agents do not list it) is left out, as if it were
// down, for a minute. It asks by ending the node's watch stream with codes.Unavailable
// and the trailer nimbusv1.MoveTrailer, which names the peer's address.
type RebalanceOptions struct {
	// Rate is how many agents a second, on average, the replica asks at most to move; the
	// moments are jittered (half to one and a half times 1/Rate apart). Default: 0, which
	// asks none.
	Rate float64
	// Slack is how many agents above its share a replica may hold before it asks any to
	// move. Default: 0.
	Slack int
}

// validate checks the options.
func (o RebalanceOptions) validate() error {
	switch {
	case o.Rate < 0 || math.IsNaN(o.Rate) || math.IsInf(o.Rate, 0):
		return fmt.Errorf("Rebalance.Rate %v: must be a number of agents a second, 0 or more: %w", o.Rate, ErrInvalidOptions)
	case o.Slack < 0:
		return fmt.Errorf("Rebalance.Slack %d: must not be negative: %w", o.Slack, ErrInvalidOptions)
	}
	return nil
}

// Defaults of the nimbus command's rebalancing flags; RebalanceOptions' own defaults
// are off.
const (
	// DefaultRebalanceRate is the default of --rebalance-rate: one agent a second.
	DefaultRebalanceRate = 1.0
	// DefaultRebalanceSlack is the default of --rebalance-slack.
	DefaultRebalanceSlack = 1
)

const (
	// moveCooldown is how long a replica does not ask a node it asked to move to move
	// again.
	moveCooldown = time.Minute
	// movePending is how long, at most, an agent asked to move counts towards the load
	// of the peer it was sent to while no replica shows it watching.
	movePending = 10 * time.Second
	// missedAfter is how many agents in a row, sent to a peer, must not arrive there for
	// the peer to be left out. An agent may go elsewhere when it does not know the peer's
	// address (its list spells it otherwise than --advertise), and then chooses at random.
	missedAfter = 3
	// peersSettle is how long the set of live peers must stay the same before a replica
	// asks agents to move: replicas that start one after the other are all counted, and
	// each one's push stream has told which nodes watch it.
	peersSettle = 2 * time.Second
)

// rebalancer asks the agents of a replica that holds more than its share to move; see
// RebalanceOptions.
type rebalancer struct {
	s    *Server
	opts RebalanceOptions
	// moved counts the agents asked to move: naples_nimbus_rebalanced_total.
	moved prometheus.Counter
	// mu guards moves, misses, missed, peers and peersSince.
	mu sync.Mutex
	// moves holds the nodes asked to move within moveCooldown, by name.
	moves map[string]*agentMove
	// misses counts, by peer, the agents sent to it in a row that did not arrive.
	misses map[string]int
	// missed holds the peers that missedAfter agents in a row did not reach, by name,
	// with when that was found; they are left out for moveCooldown.
	missed map[string]time.Time
	// peers are the names of the live peers the last step saw, sorted, and peersSince
	// is when it first saw them.
	peers      []string
	peersSince time.Time
}

// agentMove is a node asked to move: to which peer, and when; checked tells that
// checkArrivals looked whether it arrived.
type agentMove struct {
	to      string
	at      time.Time
	checked bool
}

// newRebalancer returns the rebalancer of the replica s, with its metric registered, and
// the function that unregisters it.
func newRebalancer(s *Server) (*rebalancer, func(), error) {
	r := &rebalancer{s: s, opts: s.opts.Rebalance, moves: map[string]*agentMove{},
		misses: map[string]int{}, missed: map[string]time.Time{}}
	r.moved = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: "naples", Subsystem: "nimbus", Name: "rebalanced_total",
		Help: "Agents this replica asked to watch another replica because it held more than its share of them (--rebalance-rate).",
	})
	unregister, err := telemetry.Register(s.opts.Registerer, "Server", r.moved)
	if err != nil {
		return nil, nil, err
	}
	return r, unregister, nil
}

// start runs the rebalancing loop until the returned function is called, which waits
// for it to stop. It runs nothing when Rate is 0.
func (r *rebalancer) start() (stop func()) {
	if r == nil || r.opts.Rate <= 0 {
		return func() {}
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { r.run(ctx) })
	return func() {
		cancel()
		wg.Wait()
	}
}

// run takes a rebalancing step at random moments, on average Rate a second, until ctx
// ends.
func (r *rebalancer) run(ctx context.Context) {
	for {
		d := time.Duration(float64(time.Second) / r.opts.Rate * (0.5 + rand.Float64()))
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		r.step(time.Now())
	}
}

// step asks one agent to move when the replica is ready and holds more than its share
// plus Slack, and a peer holds less than its share. It reports whether it asked one.
func (r *rebalancer) step(now time.Time) bool {
	s := r.s
	if len(s.Ready()) > 0 {
		return false
	}
	peers := s.peers.livePeers()
	v := s.store.read()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.checkArrivals(v, now)
	for p, at := range r.missed {
		if now.Sub(at) >= moveCooldown {
			delete(r.missed, p)
		} else {
			delete(peers, p)
		}
	}
	if names := slices.Sorted(maps.Keys(peers)); !slices.Equal(names, r.peers) {
		r.peers, r.peersSince = names, now
	}
	if len(peers) == 0 || now.Sub(r.peersSince) < peersSettle {
		return false
	}
	load := make(map[string]int, len(peers))
	for p := range peers {
		load[p] = 0
	}
	own := 0
	for rec := range v.allWatchNodes() {
		if rec.local() > 0 {
			own++
		}
		for p, n := range rec.Peers {
			if _, ok := load[p]; ok && n > 0 {
				load[p]++
			}
		}
	}
	for node, m := range r.moves {
		age := now.Sub(m.at)
		if age >= moveCooldown {
			delete(r.moves, node)
			continue
		}
		// An agent on its way counts where it was sent until a replica says it arrived.
		if _, ok := load[m.to]; ok && age < movePending {
			if rec := v.watchNode(node); rec == nil || rec.Streams == 0 {
				load[m.to]++
			}
		}
	}
	to, share := planMove(own, load, r.opts.Slack)
	if to == "" {
		return false
	}
	msg := fmt.Sprintf("rebalancing: this replica serves %d agents, more than its share of %d; watch another replica", own, share)
	node, ok := s.moveOne(r.moves, peers[to], status.Error(codes.Unavailable, msg))
	if !ok {
		return false
	}
	r.moves[node] = &agentMove{to: to, at: now}
	r.moved.Inc()
	s.log.Info("asked an agent to watch another replica", "node", node, "to", to, "agents", own, "share", share, "slack", r.opts.Slack)
	return true
}

// planMove returns the peer a replica that holds own agents sends one to, given how
// many each peer holds (load) and the slack, and the replicas' share: ceil(agents /
// replicas). It returns no peer while the replica holds no more than its share plus
// slack, or when every peer holds its share already; of the peers that hold fewer, the
// one that holds the fewest, by name on a tie.
func planMove(own int, load map[string]int, slack int) (to string, share int) {
	total := own
	for _, n := range load {
		total += n
	}
	replicas := len(load) + 1
	share = (total + replicas - 1) / replicas
	if own <= share+slack {
		return "", share
	}
	for p, n := range load {
		if n < share && (to == "" || n < load[to] || n == load[to] && p < to) {
			to = p
		}
	}
	return to, share
}

// checkArrivals looks, once per move, whether the agents asked to move movePending ago
// or more watch the peer they were sent to. A peer that missedAfter of them in a row do
// not watch is left out for moveCooldown (missed): it is up but not ready, so agents skip
// it, or they do not list it. r.mu is held.
func (r *rebalancer) checkArrivals(v *tables, now time.Time) {
	var due []string
	for node, m := range r.moves {
		if !m.checked && now.Sub(m.at) >= movePending {
			due = append(due, node)
		}
	}
	// In the order the agents were asked, so that "in a row" means it.
	slices.SortFunc(due, func(a, b string) int { return r.moves[a].at.Compare(r.moves[b].at) })
	for _, node := range due {
		m := r.moves[node]
		m.checked = true
		if rec := v.watchNode(node); rec != nil && rec.Peers[m.to] > 0 {
			r.misses[m.to] = 0
			continue
		}
		if r.misses[m.to]++; r.misses[m.to] < missedAfter {
			continue
		}
		r.misses[m.to] = 0
		if _, ok := r.missed[m.to]; !ok {
			r.s.log.Info("agents asked to watch a peer replica did not; leaving that peer out of rebalancing for a while",
				"peer", m.to, "agents", missedAfter, "for", moveCooldown)
		}
		r.missed[m.to] = now
	}
}

// moveOne ends the watch stream of one node picked at random with err, and the trailer
// that asks its agent to move to the address. It picks among the nodes that watch this
// replica alone, with one stream, that is caught up (it received its snapshot or replayed
// changes, so it resumes wherever it goes), and that are not among skip. It reports which
// node, and false when there was none.
func (s *Server) moveOne(skip map[string]*agentMove, to string, err error) (string, bool) {
	v := s.store.read()
	s.mu.Lock()
	defer s.mu.Unlock()
	var movable []*watcher
	for w := range s.watchers {
		if !w.target || !w.caughtUp.Load() {
			continue
		}
		if _, ok := skip[w.node]; ok {
			continue
		}
		if rec := v.watchNode(w.node); rec == nil || rec.Streams != 1 || rec.local() != 1 {
			continue
		}
		movable = append(movable, w)
	}
	if len(movable) == 0 {
		return "", false
	}
	w := movable[rand.IntN(len(movable))]
	delete(s.watchers, w)
	w.ended, w.moveTo = err, to
	close(w.reset)
	w.dropLocked()
	s.metrics.watchers.Set(float64(len(s.watchers)))
	return w.node, true
}

// setMoveTrailer sets the trailer that asks the agent to move on the stream of a watcher
// that moveOne ended; it does nothing for any other.
func setMoveTrailer(stream grpc.ServerStream, w *watcher) {
	select {
	case <-w.reset:
		// moveTo was set before reset was closed.
		if w.moveTo != "" {
			stream.SetTrailer(metadata.Pairs(nimbusv1.MoveTrailer, w.moveTo))
		}
	default:
	}
}

// livePeers returns the address of each peer replica, by name, that pushes to this one
// and that this one pushes to: those whose presence it knows. It returns nil on a Server
// that is no replica.
func (h *peerHub) livePeers() map[string]string {
	if h == nil {
		return nil
	}
	addrs := map[string]string{}
	h.mu.RLock()
	for name, p := range h.pushers {
		addrs[name] = p.target.String()
	}
	h.mu.RUnlock()
	live := map[string]string{}
	h.sessionsMu.Lock()
	for name := range h.sessions {
		if a, ok := addrs[name]; ok {
			live[name] = a
		}
	}
	h.sessionsMu.Unlock()
	return live
}
