package test

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/naplesnet/naples/internal/backoff"
	"github.com/naplesnet/naples/internal/testetcd"
	"github.com/naplesnet/naples/internal/testns"
	"github.com/naplesnet/naples/internal/testrand"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// The tests here run nimbus as 3 replicas (real cmd/nimbus processes, --store etcd,
// mutual TLS with replica certificates) over a 3-member etcd cluster of real processes,
// with agents in network namespaces that know every replica or only some. Publishers
// write random changes to routes (creations, updates of the gateway, retargets, label
// changes, deletions) through any replica, retrying each one on the next replica until
// one takes it, while replicas or etcd members are SIGKILLed and started again. At the
// end every replica lists exactly what the publisher was told it stored, generation by
// generation, and every agent's delphi and kernel hold what nimbus targets at its node.

// churnPool is how many route names the churn draws from.
const churnPool = 32

// churnRetryLimit bounds how long one change is retried before the churn gives up.
const churnRetryLimit = 90 * time.Second

// churnAttemptTimeout bounds one attempt of a change at one replica. It is longer than
// a replica takes to answer (an etcd transaction is bounded by 10s), so that the churn
// never abandons a write a live replica is still working on: such a write could land
// after a later change of the same object.
const churnAttemptTimeout = 30 * time.Second

// churnGateways are the next hops of the routes: one on each of a host's links.
var churnGateways = []string{"10.10.0.2", "10.20.0.2"}

// churnRoute is what nimbus acknowledged storing for one route.
type churnRoute struct {
	name    string
	prefix  string
	gateway string
	// nodes are the target nodes, sorted; none for every node.
	nodes []string
	label string
	// generation is the generation nimbus answered with.
	generation int64
}

// object returns the route as an object to apply.
func (r *churnRoute) object() *nimbusv1.Object {
	meta := &nimbusv1.ObjectMeta{Name: r.name, Nodes: r.nodes}
	if r.label != "" {
		meta.Labels = map[string]string{"churn": r.label}
	}
	return &nimbusv1.Object{Meta: meta, Spec: &nimbusv1.Object_Route{Route: &nimbusv1.RouteSpec{
		Table: 100, Prefix: r.prefix, Nexthops: []*nimbusv1.NextHop{{Gateway: r.gateway}}}}}
}

// targets reports whether the route is meant for node.
func (r *churnRoute) targets(node string) bool {
	return len(r.nodes) == 0 || slices.Contains(r.nodes, node)
}

// routeChurn writes random changes to routes through the replicas, one batch at a time,
// each retried on the next replica until one takes it, and keeps what nimbus
// acknowledged.
type routeChurn struct {
	apis  []nimbusv1.NimbusClient
	nodes []string
	rng   *rand.Rand // used by the churn's goroutine only, once it runs
	// stop is closed, once, to stop the churn; done is closed when it has stopped.
	stop     chan struct{}
	stopOnce sync.Once
	done     chan struct{}

	// mu guards the fields below.
	mu sync.Mutex
	// model is what nimbus acknowledged, by name; a deleted route is absent.
	model map[string]*churnRoute
	// batches counts the batches nimbus acknowledged, retried counts the attempts that
	// failed and were tried again, and lastRetry is the error of the last of those.
	batches, retried int
	lastRetry        error
	// err is the error that stopped the churn.
	err error
}

// newRouteChurn returns a churn of routes targeted among nodes, through apis; nothing is
// written before put or run.
func newRouteChurn(apis []nimbusv1.NimbusClient, nodes []string, seed uint64) *routeChurn {
	return &routeChurn{apis: apis, nodes: nodes, rng: rand.New(rand.NewPCG(seed, 0)),
		model: map[string]*churnRoute{}, stop: make(chan struct{}), done: make(chan struct{})}
}

// put applies routes through the replicas, from the test's goroutine, before or after
// the churn runs.
func (c *routeChurn) put(t *testing.T, routes ...*churnRoute) {
	t.Helper()
	if err := c.apply(context.Background(), routes); err != nil {
		t.Fatal(err)
	}
}

// run starts writing changes, a batch of up to 4 routes every interval, until finish or
// the end of the test.
func (c *routeChurn) run(t *testing.T, interval time.Duration) {
	// A test that ends without finish, failing, also cancels the batch under way.
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() {
		c.stopOnce.Do(func() { close(c.stop) })
		cancel()
		<-c.done
	})
	go func() {
		defer close(c.done)
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			select {
			case <-c.stop:
				return
			case <-tick.C:
			}
			if err := c.step(ctx); err != nil {
				c.mu.Lock()
				c.err = err
				c.mu.Unlock()
				return
			}
		}
	}()
}

// finish stops the churn once the batch under way is acknowledged, fails the test if the
// churn failed, and returns what nimbus acknowledged.
func (c *routeChurn) finish(t *testing.T) map[string]*churnRoute {
	t.Helper()
	c.stopOnce.Do(func() { close(c.stop) })
	<-c.done
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		t.Fatalf("churn: %v", c.err)
	}
	t.Logf("churn: %d batches acknowledged, %d attempts retried (last: %v)", c.batches, c.retried, c.lastRetry)
	return maps.Clone(c.model)
}

// counts returns how many batches were acknowledged and attempts retried so far, and
// the error that stopped the churn.
func (c *routeChurn) counts() (batches, retried int, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.batches, c.retried, c.err
}

// waitBatches waits until n more batches have been acknowledged.
func (c *routeChurn) waitBatches(t *testing.T, n int, why string) {
	t.Helper()
	from, _, _ := c.counts()
	waitFor(t, fmt.Sprintf("%d more batches acknowledged (%s)", n, why), func() bool {
		got, _, err := c.counts()
		if err != nil {
			t.Fatalf("churn: %v", err)
		}
		return got >= from+n
	})
}

// step writes one random batch: up to 4 routes of the pool, each created, changed
// (gateway, target nodes or label), applied again unchanged or deleted.
func (c *routeChurn) step(ctx context.Context) error {
	c.mu.Lock()
	var puts []*churnRoute
	var dels []string
	for _, i := range c.rng.Perm(churnPool)[:1+c.rng.IntN(4)] {
		name := fmt.Sprintf("churn%02d", i)
		cur := c.model[name]
		if cur == nil {
			puts = append(puts, &churnRoute{name: name, prefix: fmt.Sprintf("10.100.%d.0/24", i),
				gateway: churnGateways[c.rng.IntN(2)], nodes: c.randomNodes()})
			continue
		}
		next := *cur
		switch k := c.rng.IntN(10); {
		case k < 2:
			dels = append(dels, name)
			continue
		case k < 5:
			next.gateway = churnGateways[(slices.Index(churnGateways, cur.gateway)+1)%2]
		case k < 8:
			for slices.Equal(next.nodes, cur.nodes) {
				next.nodes = c.randomNodes()
			}
		case k < 9:
			next.label = strconv.Itoa(c.rng.IntN(1000))
		}
		puts = append(puts, &next)
	}
	c.mu.Unlock()
	if len(puts) > 0 {
		if err := c.apply(ctx, puts); err != nil {
			return err
		}
	}
	if len(dels) > 0 {
		if err := c.delete(ctx, dels); err != nil {
			return err
		}
	}
	return nil
}

// randomNodes returns a random set of target nodes: every node (none named) a quarter of
// the time, otherwise one or more of them, sorted.
func (c *routeChurn) randomNodes() []string {
	if c.rng.IntN(4) == 0 {
		return nil
	}
	var nodes []string
	for len(nodes) == 0 {
		for _, n := range c.nodes {
			if c.rng.IntN(2) == 0 {
				nodes = append(nodes, n)
			}
		}
	}
	return nodes
}

// apply applies the routes in one batch, retried until a replica takes it, and checks
// that nimbus answers with the generation each route must have: 1 for a creation, one
// more for a change of the spec or of the target nodes, the same otherwise. A retry of a
// batch that was stored although its answer was lost finds it unchanged, with the same
// generations.
func (c *routeChurn) apply(ctx context.Context, routes []*churnRoute) error {
	c.mu.Lock()
	objs := make([]*nimbusv1.Object, len(routes))
	want := make([]int64, len(routes))
	for i, r := range routes {
		objs[i] = r.object()
		want[i] = 1
		if cur := c.model[r.name]; cur != nil {
			want[i] = cur.generation
			if cur.gateway != r.gateway || !slices.Equal(cur.nodes, r.nodes) {
				want[i]++
			}
		}
	}
	c.mu.Unlock()
	var resp *nimbusv1.ApplyBatchResponse
	err := c.retry(ctx, fmt.Sprintf("applying %d routes", len(routes)), func(ctx context.Context, api nimbusv1.NimbusClient) error {
		var err error
		resp, err = api.ApplyBatch(ctx, &nimbusv1.ApplyBatchRequest{Objects: objs, OmitObjects: true})
		return err
	})
	if err != nil {
		return err
	}
	if len(resp.GetResults()) != len(routes) {
		return fmt.Errorf("applying %d routes: %d results", len(routes), len(resp.GetResults()))
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, r := range routes {
		got := resp.GetResults()[i].GetObject().GetMeta().GetGeneration()
		if got != want[i] {
			return fmt.Errorf("route %s (gateway %s, nodes %v, label %q) stored at generation %d, want %d: an earlier change was lost",
				r.name, r.gateway, r.nodes, r.label, got, want[i])
		}
		stored := *r
		stored.generation = got
		c.model[r.name] = &stored
	}
	c.batches++
	return nil
}

// delete deletes the named routes in one batch, retried until a replica takes it.
func (c *routeChurn) delete(ctx context.Context, names []string) error {
	keys := make([]*nimbusv1.ObjectKey, len(names))
	for i, n := range names {
		keys[i] = nimbusv1.NewKey(nimbusv1.Kind_KIND_ROUTE, "", "", n)
	}
	err := c.retry(ctx, fmt.Sprintf("deleting %d routes", len(names)), func(ctx context.Context, api nimbusv1.NimbusClient) error {
		_, err := api.DeleteBatch(ctx, &nimbusv1.DeleteBatchRequest{Keys: keys})
		return err
	})
	if err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, n := range names {
		delete(c.model, n)
	}
	c.batches++
	return nil
}

// retry makes the call on one replica after the other, starting from a random one, with
// backoff, until one takes it. Only Unavailable and DeadlineExceeded are retried: a
// replica that is down, not loaded, or whose etcd has no quorum.
func (c *routeChurn) retry(ctx context.Context, what string, call func(context.Context, nimbusv1.NimbusClient) error) error {
	began := time.Now()
	bo := backoff.Backoff{Min: 20 * time.Millisecond, Max: 500 * time.Millisecond}
	c.mu.Lock()
	first := c.rng.IntN(len(c.apis))
	c.mu.Unlock()
	for attempt := 0; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, churnAttemptTimeout)
		err := call(actx, c.apis[(first+attempt)%len(c.apis)])
		cancel()
		if err == nil {
			return nil
		}
		if code := status.Code(err); code != codes.Unavailable && code != codes.DeadlineExceeded {
			return fmt.Errorf("%s at replica %s: %w", what, replicaName((first+attempt)%len(c.apis)), err)
		}
		c.mu.Lock()
		c.retried++
		c.lastRetry = err
		c.mu.Unlock()
		if time.Since(began) > churnRetryLimit {
			return fmt.Errorf("%s: no replica took it in %v; last: %w", what, churnRetryLimit, err)
		}
		timer := time.NewTimer(bo.Next())
		select {
		case <-ctx.Done():
			timer.Stop()
			return ctx.Err()
		case <-timer.C:
		}
	}
}

// wantRoutes fails the test unless, eventually, every replica lists exactly the routes
// of model at their generations, all at the same revisions; every host's delphi holds the
// routes meant for it at those revisions and its kernel those routes; and every replica
// reports each route PROGRAMMED at its generation on every target node, with the same
// node statuses.
func (rc *replicaCluster) wantRoutes(t *testing.T, hosts []*host, model map[string]*churnRoute) {
	t.Helper()
	ctx := context.Background()
	var nodes []string
	for _, h := range hosts {
		nodes = append(nodes, h.name)
	}
	apis := rc.apis(t)
	var revs map[string]uint64
	for i, api := range apis {
		var diff []string
		waitUntil(t, fmt.Sprintf("replica %s to list the %d routes acknowledged", replicaName(i), len(model)), func() bool {
			items, err := listRoutes(ctx, api)
			if err != nil {
				diff = []string{err.Error()}
				return false
			}
			got := map[string]uint64{}
			diff = nil
			for _, it := range items {
				obj := it.GetObject()
				m := obj.GetMeta()
				got[m.GetName()] = m.GetRevision()
				want := model[m.GetName()]
				if want == nil {
					diff = append(diff, m.GetName()+" listed, want none")
					continue
				}
				hops := obj.GetRoute().GetNexthops()
				if len(hops) != 1 || hops[0].GetGateway() != want.gateway || !slices.Equal(m.GetNodes(), want.nodes) ||
					m.GetLabels()["churn"] != want.label || m.GetGeneration() != want.generation {
					diff = append(diff, fmt.Sprintf("%s listed at generation %d with %v nodes %v labels %v, want generation %d via %s nodes %v label %q",
						m.GetName(), m.GetGeneration(), hops, m.GetNodes(), m.GetLabels(), want.generation, want.gateway, want.nodes, want.label))
				}
			}
			for name := range model {
				if _, ok := got[name]; !ok {
					diff = append(diff, name+" not listed")
				}
			}
			if len(diff) > 0 {
				return false
			}
			if revs == nil {
				revs = got
				return true
			}
			if !maps.Equal(got, revs) {
				diff = []string{fmt.Sprintf("revisions %v, replica r0 lists %v", got, revs)}
				return false
			}
			return true
		}, func() string { return strings.Join(diff, "; ") })
	}
	for _, h := range hosts {
		want := map[string]uint64{}
		var table []string
		for name, r := range model {
			if r.targets(h.name) {
				want[name] = revs[name]
				table = append(table, r.prefix+" via "+r.gateway)
			}
		}
		h.waitConverged(t, want)
		slices.Sort(table)
		var got []string
		waitUntil(t, fmt.Sprintf("%s's table 100 to hold its %d routes", h.name, len(table)), func() bool {
			got = h.routeTable(t)
			slices.Sort(got)
			return slices.Equal(got, table)
		}, func() string { return fmt.Sprintf("table 100 holds %q, want %q", got, table) })
	}
	var first map[string][]string
	for i, api := range apis {
		var diff []string
		waitUntil(t, fmt.Sprintf("replica %s to report every route PROGRAMMED on its target nodes", replicaName(i)), func() bool {
			items, err := listRoutes(ctx, api)
			if err != nil {
				diff = []string{err.Error()}
				return false
			}
			diff = nil
			seen := map[string][]string{}
			for _, it := range items {
				name := it.GetObject().GetMeta().GetName()
				r := model[name]
				st := it.GetStatus()
				targets := int32(len(nodes))
				if len(r.nodes) > 0 {
					targets = int32(len(r.nodes))
				}
				if st.GetGeneration() != r.generation || st.GetTargetNodes() != targets ||
					st.GetProgrammedNodes() != targets || len(st.GetPending()) > 0 || st.GetCaughtUpTime() == nil {
					diff = append(diff, fmt.Sprintf("%s: %v", name, st))
				}
				for _, ns := range st.GetNodes() {
					seen[name] = append(seen[name], fmt.Sprintf("%s %s %d", ns.GetNode(), ns.GetPhase(), ns.GetObservedGeneration()))
				}
			}
			if len(diff) > 0 {
				return false
			}
			if first == nil {
				first = seen
			}
			if !maps.EqualFunc(seen, first, slices.Equal) {
				diff = []string{fmt.Sprintf("node statuses %v, replica r0 reports %v", seen, first)}
				return false
			}
			return true
		}, func() string { return strings.Join(diff, "; ") })
	}
}

// TestReplicasChurnWhileReplicasAreKilled churns routes through 3 replicas on a 3-member
// etcd while, round after round, a replica that agents watch is SIGKILLed and started
// again. Every agent on the killed replica moves to another one and resumes its watch
// there: no agent takes a snapshot after its first sync. Writes go on through the other
// replicas, and in the end every replica lists what nimbus acknowledged, generation by
// generation, and every host's delphi and kernel hold what is meant for it.
func TestReplicasChurnWhileReplicasAreKilled(t *testing.T) {
	const rounds = 6
	testns.RequireRoot(t)
	rng := rand.New(rand.NewPCG(testrand.Seed(t), 11))
	etcd := testetcd.Start(t, 3)
	rc := newReplicaCluster(t, etcd, 3)
	names := []string{"host-a", "host-b", "host-c"}
	var hosts []*host
	for _, n := range names {
		hosts = append(hosts, rc.newHostOn(t, n, nil))
	}
	for _, h := range hosts {
		h.waitWatching(t)
	}
	churn := newRouteChurn(rc.apis(t), names, rng.Uint64())
	churn.run(t, 20*time.Millisecond)
	churn.waitBatches(t, 20, "before the first kill")

	failovers := 0
	for round := range rounds {
		// The victim is a replica that at least one agent watches; in the last round, a
		// second replica dies with it, and every agent ends up on the one left.
		starts := make([]watchStarts, len(hosts))
		var watched []int
		for k, h := range hosts {
			starts[k] = h.waitWatching(t)
			if i := rc.replicaOf(starts[k].server); i < 0 {
				t.Fatalf("%s watches %q, which is no replica's address", h.name, starts[k].server)
			} else if !slices.Contains(watched, i) {
				watched = append(watched, i)
			}
		}
		victims := []int{watched[rng.IntN(len(watched))]}
		if round == rounds-1 {
			victims = append(victims, (victims[0]+1+rng.IntN(2))%3)
		}
		var down []string
		for _, v := range victims {
			rc.kill(t, v)
			down = append(down, rc.replicas[v].name)
		}
		for k, h := range hosts {
			if !slices.Contains(victims, rc.replicaOf(starts[k].server)) {
				continue
			}
			var ws watchStarts
			waitFor(t, fmt.Sprintf("round %d: %s to watch another replica than %v", round, h.name, down), func() bool {
				ws = h.watchStarts(t)
				return ws.resumes+ws.snapshots > starts[k].resumes+starts[k].snapshots &&
					!slices.Contains(victims, rc.replicaOf(ws.server))
			})
			if ws.snapshots != starts[k].snapshots {
				t.Fatalf("round %d: %s left %s with a snapshot: %+v, had %+v", round, h.name, rc.replicas[rc.replicaOf(starts[k].server)].name, ws, starts[k])
			}
			failovers++
		}
		churn.waitBatches(t, 5+rng.IntN(20), fmt.Sprintf("round %d, with %v down", round, down))
		for _, v := range victims {
			rc.restart(t, v)
		}
		churn.waitBatches(t, 5+rng.IntN(20), fmt.Sprintf("round %d, with %v back", round, down))
	}
	model := churn.finish(t)
	rc.wantRoutes(t, hosts, model)

	resumes := 0
	for _, h := range hosts {
		ws := h.watchStarts(t)
		m := h.telemetry(t).metrics(t)
		if ws.snapshots != 1 || m[watchSnapshots] != 1 {
			t.Errorf("%s took %d snapshots (%v by its metrics), want only its first sync", h.name, ws.snapshots, m[watchSnapshots])
		}
		if m[watchResumes] != float64(ws.resumes) {
			t.Errorf("%s: %s = %v, its log says %d resumed watches", h.name, watchResumes, m[watchResumes], ws.resumes)
		}
		resumes += ws.resumes
	}
	if resumes < failovers {
		t.Errorf("%d resumed watches for %d failovers", resumes, failovers)
	}
	t.Logf("%d rounds: %d failovers, %d resumed watches, %d routes at the end", rounds, failovers, resumes, len(model))
}

// TestReplicasSurviveEtcdLeaderAndFollowerKilled churns routes through 3 replicas while
// etcd's leader is SIGKILLed, then a follower, which leaves etcd without quorum. The
// replicas keep serving reads throughout and their watches never break; a watch that
// starts without quorum is served from the replicas' caches; writes fail without quorum
// and go through again once a member is back; nothing acknowledged is lost.
func TestReplicasSurviveEtcdLeaderAndFollowerKilled(t *testing.T) {
	testns.RequireRoot(t)
	rng := rand.New(rand.NewPCG(testrand.Seed(t), 12))
	etcd := testetcd.Start(t, 3)
	// No rebalancing: a move it asks for starts a watch again, and the test counts the
	// starts etcd's failures cause, which must be none.
	rc := newReplicaCluster(t, etcd, 3, "--rebalance-rate", "0")
	names := []string{"host-a", "host-b", "host-c"}
	hosts := []*host{rc.newHostOn(t, names[0], nil), rc.newHostOn(t, names[1], nil)}
	for _, h := range hosts {
		h.waitWatching(t)
	}
	apis := rc.apis(t)
	churn := newRouteChurn(apis, names, rng.Uint64())
	steady := &churnRoute{name: "steady", prefix: "10.99.0.0/24", gateway: churnGateways[0]}
	churn.put(t, steady)
	reads := startReads(t, apis, steady.name)
	churn.run(t, 20*time.Millisecond)
	churn.waitBatches(t, 20, "before etcd loses a member")

	ctx := context.Background()
	leader, err := etcd.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	etcd.Kill(leader)
	churn.waitBatches(t, 20, fmt.Sprintf("once etcd's members but m%d elect a leader", leader))
	next, err := etcd.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	follower := 3 - leader - next
	restarts := rc.etcdWatchRestarts(t)
	etcd.Kill(follower)

	// Without quorum: writes fail, reads and watches go on.
	probe := &churnRoute{name: "probe", prefix: "10.98.0.0/24", gateway: churnGateways[1]}
	errs := tryWrites(apis, probe.object(), 1500*time.Millisecond)
	for i, err := range errs {
		if err == nil {
			t.Fatalf("replica %s applied a route with etcd's m%d alone", replicaName(i), next)
		}
	}
	t.Logf("etcd's leader m%d and follower m%d killed; applies with m%d alone fail: %v", leader, follower, next, errs)
	// etcd ends the watches of a member that has had no leader for a while; from then on,
	// the replicas serve from caches that nothing feeds.
	waitFor(t, "every replica's etcd watch to end for want of a leader", func() bool {
		for i, n := range rc.etcdWatchRestarts(t) {
			if n <= restarts[i] {
				return false
			}
		}
		return true
	})
	reads.waitRounds(t, 3, "etcd has no quorum")
	// A new agent watches while etcd has no quorum: a replica sends it what it holds.
	late := rc.newHostOn(t, names[2], nil)
	waitFor(t, "host-c's agent, started without etcd quorum, to sync and program the steady route", func() bool {
		st, ok := late.delphi(t)
		if !ok || !st.Synced {
			return false
		}
		for _, it := range st.Items {
			if it.Meta.Name == steady.name && it.Status.Phase == "PHASE_PROGRAMMED" {
				return true
			}
		}
		return false
	})
	hosts = append(hosts, late)

	etcd.Restart(follower)
	churn.put(t, probe)
	churn.waitBatches(t, 20, fmt.Sprintf("once m%d is back", follower))
	etcd.Restart(leader)
	churn.waitBatches(t, 10, fmt.Sprintf("once m%d is back", leader))
	t.Logf("etcd's m%d and m%d restarted; writes went through again", follower, leader)
	model := churn.finish(t)
	reads.finish(t)
	rc.wantRoutes(t, hosts, model)
	t.Logf("etcd watch restarts by replica: %v", rc.etcdWatchRestarts(t))

	// No watch broke: each agent synced once and never watched again.
	for _, h := range hosts {
		if ws := h.watchStarts(t); ws.snapshots != 1 || ws.resumes != 0 {
			t.Errorf("%s's watch started %d times with a snapshot and resumed %d times, want one snapshot and no other start", h.name, ws.snapshots, ws.resumes)
		}
	}
}

// tryWrites applies obj through every replica, again and again until one apply succeeds
// or d has passed, and returns the last error of each replica: nil for one that took
// the apply.
func tryWrites(apis []nimbusv1.NimbusClient, obj *nimbusv1.Object, d time.Duration) []error {
	end := time.Now().Add(d)
	errs := make([]error, len(apis))
	var wg sync.WaitGroup
	for i, api := range apis {
		wg.Go(func() {
			for time.Now().Before(end) {
				ctx, cancel := context.WithDeadline(context.Background(), end)
				_, errs[i] = api.Apply(ctx, &nimbusv1.ApplyRequest{Object: obj})
				cancel()
				if errs[i] == nil {
					return
				}
				// A call that fails at once, such as one on a connection to the member
				// that was killed, is tried again after a pause.
				time.Sleep(50 * time.Millisecond)
			}
		})
	}
	wg.Wait()
	return errs
}

// routeReads reads one object through every replica, round after round, until finish.
type routeReads struct {
	// stop is closed, once, to stop the reads; done is closed when they have stopped.
	stop     chan struct{}
	stopOnce sync.Once
	done     chan struct{}

	// mu guards the fields below.
	mu sync.Mutex
	// rounds counts the rounds in which every replica answered.
	rounds int
	// failures are the reads that failed.
	failures []string
}

// startReads starts reading the named route through every replica, until finish or the
// end of the test.
func startReads(t *testing.T, apis []nimbusv1.NimbusClient, name string) *routeReads {
	r := &routeReads{stop: make(chan struct{}), done: make(chan struct{})}
	t.Cleanup(func() {
		r.stopOnce.Do(func() { close(r.stop) })
		<-r.done
	})
	key := nimbusv1.NewKey(nimbusv1.Kind_KIND_ROUTE, "", "", name)
	go func() {
		defer close(r.done)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-r.stop:
				return
			case <-tick.C:
			}
			ok := true
			for i, api := range apis {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				resp, err := api.Get(ctx, &nimbusv1.GetRequest{Key: key})
				cancel()
				if err == nil && resp.GetItem().GetObject().GetMeta().GetName() != name {
					err = fmt.Errorf("got %v", resp.GetItem().GetObject())
				}
				if err != nil {
					ok = false
					r.mu.Lock()
					r.failures = append(r.failures, fmt.Sprintf("%s at replica %s: %v", time.Now().Format("15:04:05.000"), replicaName(i), err))
					r.mu.Unlock()
				}
			}
			if ok {
				r.mu.Lock()
				r.rounds++
				r.mu.Unlock()
			}
		}
	}()
	return r
}

// waitRounds waits until every replica has answered n more rounds of reads.
func (r *routeReads) waitRounds(t *testing.T, n int, why string) {
	t.Helper()
	r.mu.Lock()
	from := r.rounds
	r.mu.Unlock()
	waitFor(t, fmt.Sprintf("every replica to answer %d more reads (%s)", n, why), func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.rounds >= from+n
	})
}

// finish stops the reads and fails the test if any failed.
func (r *routeReads) finish(t *testing.T) {
	t.Helper()
	r.stopOnce.Do(func() { close(r.stop) })
	<-r.done
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.failures) > 0 {
		t.Errorf("%d reads failed; the first: %v", len(r.failures), r.failures[:min(5, len(r.failures))])
	}
	t.Logf("%d rounds of reads through every replica", r.rounds)
}

// TestReplicaStartedWithoutEtcdBecomesReady starts a replica while no etcd member runs:
// its /readyz answers 503 naming etcd and its API refuses calls, and once etcd starts it
// becomes ready and serves.
func TestReplicaStartedWithoutEtcdBecomesReady(t *testing.T) {
	etcd := testetcd.Plan(t, 3)
	rc := planReplicas(t, etcd, 1)
	rc.start(t, 0)
	var code int
	var body string
	waitUntil(t, "/readyz to answer 503 naming etcd", func() bool {
		code, body = rc.readyz(t, 0)
		return code == http.StatusServiceUnavailable && strings.Contains(body, "etcd")
	}, func() string { return fmt.Sprintf("it answers %d %q", code, body) })
	t.Logf("/readyz without etcd: %d %q", code, strings.TrimSpace(body))
	if _, err := rc.ctl(t, "", "get", "routes"); err == nil || !strings.Contains(err.Error(), "etcd") {
		t.Errorf("naplesctl get routes without etcd = %v, want an error naming etcd", err)
	}

	etcd.StartAll()
	rc.waitReady(t, 0)
	if out := rc.apply(t, toDC2); !strings.Contains(out, "created") {
		t.Errorf("apply once etcd runs printed %q, want the route created", out)
	}
	if gen, _, err := rc.get(t, "route", "to-dc2"); err != nil || gen != 1 {
		t.Errorf("get route to-dc2 = generation %d, %v; want generation 1", gen, err)
	}
}

// via returns a cluster that reaches replica i alone, for the helpers of a cluster.
func (rc *replicaCluster) via(i int) *cluster {
	return &cluster{dir: rc.dir, server: rc.replicas[i].addr, pki: rc.pki}
}

// TestReplicasAgreeOnPropagation runs each agent on a replica of its own: apply --wait
// through one replica returns once the agents of all three have programmed the routes,
// wait through the others agrees at once, and Get through every replica gives the same
// status, whether the routes are programmed everywhere or a target node has no agent.
func TestReplicasAgreeOnPropagation(t *testing.T) {
	testns.RequireRoot(t)
	etcd := testetcd.Start(t, 3)
	rc := newReplicaCluster(t, etcd, 3)
	var hosts []*host
	for i, name := range []string{"host-a", "host-b", "host-c"} {
		h := rc.newHostOn(t, name, []int{i})
		if ws := h.waitWatching(t); ws.server != rc.replicas[i].addr {
			t.Fatalf("%s watches %s, want %s", name, ws.server, rc.replicas[i].addr)
		}
		hosts = append(hosts, h)
	}
	routes := func(gateway string) string {
		return fmt.Sprintf(`kind: Route
meta:
  name: to-all
spec:
  table: 100
  prefix: 203.0.113.0/24
  nexthops:
    - gateway: %[1]s
---
kind: Route
meta:
  name: to-bc
  nodes: [host-b, host-c]
spec:
  table: 100
  prefix: 198.51.100.0/24
  nexthops:
    - gateway: %[1]s
`, gateway)
	}
	want := func(gen int) []string {
		return []string{
			fmt.Sprintf("route/to-all programmed on 3/3 nodes (generation %d)", gen),
			fmt.Sprintf("route/to-bc programmed on 2/2 nodes (generation %d)", gen),
		}
	}
	wantLines := func(what, out string, lines []string) {
		t.Helper()
		for _, l := range lines {
			if !strings.Contains(out, l) {
				t.Errorf("%s printed %q, want %q", what, out, l)
			}
		}
	}
	wantKernels := func(gateway string) {
		t.Helper()
		for k, h := range hosts {
			want := []string{"203.0.113.0/24 via " + gateway}
			if k > 0 {
				want = []string{"198.51.100.0/24 via " + gateway, "203.0.113.0/24 via " + gateway}
			}
			if got := h.routeTable(t); !slices.Equal(got, want) {
				t.Errorf("%s's table 100 = %q once --wait returned, want %q", h.name, got, want)
			}
		}
	}

	for gen, gateway := range churnGateways {
		gen++
		// apply --wait through one replica, wait through each of the others.
		through := (gen - 1) % 3
		out, err := rc.via(through).ctl(t, routes(gateway), "apply", "-f", "-", "--wait", "--timeout", "30s")
		if err != nil {
			t.Fatalf("apply --wait through %s: %v", rc.replicas[through].name, err)
		}
		wantLines("apply --wait through "+rc.replicas[through].name, out, []string{"2 of 2 programmed on every target node\n"})
		wantKernels(gateway)
		for i := range rc.replicas {
			if i == through {
				continue
			}
			out, err := rc.via(i).ctl(t, "", "wait", "route", "to-all", "to-bc", "--timeout", "10s")
			if err != nil {
				t.Fatalf("wait through %s after apply --wait through %s: %v", rc.replicas[i].name, rc.replicas[through].name, err)
			}
			wantLines("wait through "+rc.replicas[i].name, out, want(gen))
		}
		for _, name := range []string{"to-all", "to-bc"} {
			st := rc.sameStatus(t, name)
			targets := int32(3)
			if name == "to-bc" {
				targets = 2
			}
			if st.GetGeneration() != int64(gen) || st.GetTargetNodes() != targets || st.GetProgrammedNodes() != targets ||
				len(st.GetNodes()) != int(targets) || st.GetCaughtUpTime() == nil {
				t.Errorf("status of %s at generation %d = %v, want programmed on %d nodes", name, gen, st, targets)
			}
		}
	}

	// A target node without an agent: every replica says it is pending.
	rc.via(1).apply(t, strings.Replace(toDC2, "nodes: [host-a]", "nodes: [host-a, host-z]", 1))
	rc.via(0).waitProgrammed(t, "route", "to-dc2", "host-a", 1)
	var st *nimbusv1.ObjectStatus
	waitFor(t, "every replica to report to-dc2 programmed on host-a", func() bool {
		for i := range rc.replicas {
			_, s, err := rc.via(i).get(t, "route", "to-dc2")
			if err != nil || s.GetProgrammedNodes() != 1 {
				return false
			}
		}
		return true
	})
	st = rc.sameStatus(t, "to-dc2")
	if st.GetTargetNodes() != 2 || st.GetProgrammedNodes() != 1 || !slices.Equal(st.GetPending(), []string{"host-z"}) || st.GetCaughtUpTime() != nil {
		t.Errorf("status of to-dc2 = %v, want host-a programmed and host-z pending", st)
	}
	for i := range rc.replicas {
		_, err := rc.via(i).ctl(t, "", "wait", "route", "to-dc2", "--timeout", "500ms")
		if err == nil || !strings.Contains(err.Error(), "1/2 nodes programmed (generation 1); pending: host-z") {
			t.Errorf("wait through %s for a route of a node without an agent = %v, want a timeout naming host-z pending", rc.replicas[i].name, err)
		}
	}
}

// sameStatus returns the status of the route, and fails the test unless every replica
// gives the very same one, and the same description but for how long ago things were.
func (rc *replicaCluster) sameStatus(t *testing.T, name string) *nimbusv1.ObjectStatus {
	t.Helper()
	var first *nimbusv1.ObjectStatus
	var described string
	for i := range rc.replicas {
		_, st, err := rc.via(i).get(t, "route", name)
		if err != nil {
			t.Fatalf("get route %s through %s: %v", name, rc.replicas[i].name, err)
		}
		out, err := rc.via(i).ctl(t, "", "describe", "route", name)
		if err != nil {
			t.Fatalf("describe route %s through %s: %v", name, rc.replicas[i].name, err)
		}
		out = sinceAgo.ReplaceAllString(out, "ago")
		out = strings.Join(strings.Fields(out), " ")
		if first == nil {
			first, described = st, out
			continue
		}
		if !proto.Equal(st, first) {
			t.Errorf("status of %s through %s = %v\nthrough %s = %v", name, rc.replicas[i].name, st, rc.replicas[0].name, first)
		}
		if out != described {
			t.Errorf("describe route %s through %s:\n%s\nthrough %s:\n%s", name, rc.replicas[i].name, out, rc.replicas[0].name, described)
		}
	}
	return first
}

// sinceAgo matches how long ago describe says something happened: "12s ago".
var sinceAgo = regexp.MustCompile(`\b[0-9][0-9a-z]* ago\b`)
