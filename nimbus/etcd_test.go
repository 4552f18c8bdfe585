package nimbus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/naplesnet/naples/internal/testetcd"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// startReplica serves a Server backed by the etcd cluster under the prefix, and waits
// for it to be ready unless wait is false.
func startReplica(t *testing.T, endpoints []string, prefix string, wait bool, opts Options) *testServer {
	t.Helper()
	eo := EtcdOptions{Config: clientv3.Config{Endpoints: endpoints}, Prefix: prefix, MaxTxnOps: 128}
	if opts.Etcd != nil {
		eo.MaxTxnOps = opts.Etcd.MaxTxnOps
		eo.CompactionInterval, eo.CompactionRetention = opts.Etcd.CompactionInterval, opts.Etcd.CompactionRetention
		eo.ProgressTimeout = opts.Etcd.ProgressTimeout
	}
	opts.Etcd = &eo
	ts := start(t, opts)
	if wait {
		waitReady(t, ts)
	}
	return ts
}

// waitReady waits until the server is ready.
func waitReady(t *testing.T, ts *testServer) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		why := ts.srv.Ready()
		if why == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("replica not ready after 20s: %v", why)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitRev waits until the replica's cache holds the revision.
func waitRev(t *testing.T, ts *testServer, rev uint64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	if err := ts.srv.backend.(*etcdStore).waitApplied(ctx, etcdRevOf(rev)); err != nil {
		t.Fatal(err)
	}
}

// testPrefix returns a key prefix of the test's own, so that tests can share a cluster.
func testPrefix(t *testing.T) string {
	return "/" + strings.ReplaceAll(t.Name(), "/", "_")
}

// cluster starts a one-member etcd cluster for the test: the tests that do not kill
// members need no more.
func cluster(t *testing.T) *testetcd.Cluster {
	t.Helper()
	return testetcd.Start(t, 1)
}

func TestEtcdReplicasShareObjectsAndRevisions(t *testing.T) {
	c := cluster(t)
	a := startReplica(t, c.Endpoints(), testPrefix(t), true, Options{})
	b := startReplica(t, c.Endpoints(), testPrefix(t), true, Options{})
	if a.srv.Epoch() != b.srv.Epoch() {
		t.Fatalf("epochs %s and %s differ: the replicas did not share the one in etcd", a.srv.Epoch(), b.srv.Epoch())
	}

	applied := a.apply(t, route("r1", nil, "192.0.2.1")).GetObject()
	waitRev(t, b, applied.GetMeta().GetRevision())
	got := b.get(t, routeKey("r1")).GetObject()
	if !proto.Equal(got, applied) {
		t.Fatalf("replica b holds\n%v\nwant what a stored\n%v", got, applied)
	}

	// An update through b bumps the generation a stored.
	updated := b.apply(t, route("r1", nil, "192.0.2.2")).GetObject()
	if updated.GetMeta().GetGeneration() != 2 || updated.GetMeta().GetUid() != applied.GetMeta().GetUid() {
		t.Fatalf("update through b: generation %d uid %s, want 2 and %s", updated.GetMeta().GetGeneration(), updated.GetMeta().GetUid(), applied.GetMeta().GetUid())
	}
	if updated.GetMeta().GetRevision() <= applied.GetMeta().GetRevision() {
		t.Fatalf("revision went from %d to %d", applied.GetMeta().GetRevision(), updated.GetMeta().GetRevision())
	}
	if gr := updated.GetMeta().GetGenerationRevision(); gr != updated.GetMeta().GetRevision() {
		t.Fatalf("update through b: generation revision %d, want its revision %d", gr, updated.GetMeta().GetRevision())
	}
	// A change of labels alone, through a, keeps the generation and its revision, as both
	// replicas hold it.
	waitRev(t, a, updated.GetMeta().GetRevision())
	relabel := route("r1", nil, "192.0.2.2")
	relabel.Meta.Labels = map[string]string{"app": "web"}
	relabeled := a.apply(t, relabel).GetObject()
	waitRev(t, b, relabeled.GetMeta().GetRevision())
	for name, got := range map[string]*nimbusv1.Object{"a's answer": relabeled, "a": a.get(t, routeKey("r1")).GetObject(), "b": b.get(t, routeKey("r1")).GetObject()} {
		m := got.GetMeta()
		if m.GetGeneration() != 2 || m.GetGenerationRevision() != updated.GetMeta().GetRevision() || m.GetRevision() <= updated.GetMeta().GetRevision() {
			t.Errorf("after a change of labels, %s: generation %d, generation revision %d, revision %d; want 2, %d and more than %d",
				name, m.GetGeneration(), m.GetGenerationRevision(), m.GetRevision(), updated.GetMeta().GetRevision(), updated.GetMeta().GetRevision())
		}
	}
	updated = relabeled
	// Applying the same again changes nothing, on either replica.
	again, err := a.client.Apply(testContext(t), &nimbusv1.ApplyRequest{Object: relabel})
	if err != nil || again.GetChanged() {
		t.Fatalf("re-apply through a: changed=%v err=%v, want unchanged", again.GetChanged(), err)
	}
	// A deletion through a reaches b.
	del, err := a.client.Delete(testContext(t), &nimbusv1.DeleteRequest{Key: routeKey("r1")})
	if err != nil {
		t.Fatal(err)
	}
	waitRev(t, b, del.GetRevision())
	_, err = b.client.Get(testContext(t), &nimbusv1.GetRequest{Key: routeKey("r1")})
	wantCode(t, err, codes.NotFound)
}

func TestEtcdBatchSplitIntoTransactions(t *testing.T) {
	c := cluster(t)
	a := startReplica(t, c.Endpoints(), testPrefix(t), true, Options{Etcd: &EtcdOptions{MaxTxnOps: 100}})
	b := startReplica(t, c.Endpoints(), testPrefix(t), true, Options{})
	w := watch(t, b.client, "n1")
	recvUntilSynced(t, w)

	var objs []*nimbusv1.Object
	for i := range 250 {
		objs = append(objs, route(fmt.Sprintf("r%03d", i), []string{"n1"}, "192.0.2.1"))
	}
	before := testutil.ToFloat64(a.srv.backend.(*etcdStore).txns)
	resp, err := a.client.ApplyBatch(testContext(t), &nimbusv1.ApplyBatchRequest{Objects: objs})
	if err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(a.srv.backend.(*etcdStore).txns) - before; got != 3 || resp.GetTransactions() != 3 {
		t.Fatalf("250 objects with MaxTxnOps 100 took %v etcd transactions, and the response says %d; want 3",
			got, resp.GetTransactions())
	}
	// Each change has its own revision, increasing in the order of the batch, and the
	// watcher on the other replica sees them in that order.
	var last uint64
	for i, r := range resp.GetResults() {
		rev := r.GetObject().GetMeta().GetRevision()
		if rev <= last {
			t.Fatalf("result %d: revision %d after %d", i, rev, last)
		}
		last = rev
	}
	for i, r := range resp.GetResults() {
		ev := recv(t, w)
		if ev.GetType() != nimbusv1.WatchEvent_TYPE_PUT || ev.GetRevision() != r.GetObject().GetMeta().GetRevision() ||
			ev.GetObject().GetMeta().GetName() != objs[i].GetMeta().GetName() {
			t.Fatalf("event %d on b: %v %s at %d, want PUT %s at %d", i, ev.GetType(), ev.GetObject().GetMeta().GetName(),
				ev.GetRevision(), objs[i].GetMeta().GetName(), r.GetObject().GetMeta().GetRevision())
		}
	}
}

func TestEtcdWatchResumesOnAnotherReplica(t *testing.T) {
	c := cluster(t)
	a := startReplica(t, c.Endpoints(), testPrefix(t), true, Options{})
	b := startReplica(t, c.Endpoints(), testPrefix(t), true, Options{})
	a.apply(t, route("early", []string{"n1"}, "192.0.2.1"))

	ctx, cancel := context.WithCancel(testContext(t))
	w := watchFrom(t, ctx, a.client, "n1", "", 0)
	_, synced := recvUntilSynced(t, w)
	first := a.apply(t, route("first", []string{"n1"}, "192.0.2.1")).GetObject()
	ev := recv(t, w)
	if ev.GetRevision() != first.GetMeta().GetRevision() {
		t.Fatalf("live event at %d, want %d", ev.GetRevision(), first.GetMeta().GetRevision())
	}
	cancel()

	// While the node is away, changes go through the other replica.
	missed := b.apply(t, route("missed", []string{"n1"}, "192.0.2.1")).GetObject()
	b.apply(t, route("other-node", []string{"n2"}, "192.0.2.1"))
	gone, err := b.client.Delete(testContext(t), &nimbusv1.DeleteRequest{Key: routeKey("early")})
	if err != nil {
		t.Fatal(err)
	}

	// The node comes back to b with what it stored from a: it resumes, and gets exactly
	// what it missed.
	w = watchFrom(t, testContext(t), b.client, "n1", synced.GetEpoch(), ev.GetRevision())
	wantResumed(t, b, w, ev.GetRevision())
	put := recv(t, w)
	del := recv(t, w)
	if put.GetType() != nimbusv1.WatchEvent_TYPE_PUT || put.GetRevision() != missed.GetMeta().GetRevision() ||
		del.GetType() != nimbusv1.WatchEvent_TYPE_DELETE || del.GetRevision() != gone.GetRevision() {
		t.Fatalf("resumed with %v at %d, %v at %d; want PUT missed at %d, DELETE early at %d",
			put.GetType(), put.GetRevision(), del.GetType(), del.GetRevision(), missed.GetMeta().GetRevision(), gone.GetRevision())
	}
	wantLiveNext(t, b, w, "live")
}

func TestEtcdResumeWaitsForALaggingCache(t *testing.T) {
	a, b, proxy := startLaggingPair(t)
	proxy.Pause()
	obj := a.apply(t, route("r", []string{"n1"}, "192.0.2.1")).GetObject()
	rev := obj.GetMeta().GetRevision()
	// The watch finds b's cache behind the revision; it must wait for the cache rather
	// than send a snapshot.
	var w watchStream
	callBehind(proxy, func() {
		stream, err := b.client.Watch(testContext(t), &nimbusv1.WatchRequest{Node: "n1", Epoch: a.srv.Epoch(), Revision: rev})
		if err != nil {
			t.Error(err)
		}
		w = &eventStream{frames: stream}
	})
	wantResumed(t, b, w, rev)
}

// startLaggingPair starts two replicas on one etcd member; b reaches etcd through a proxy
// the test can pause, which holds b's cache back.
func startLaggingPair(t *testing.T) (a, b *testServer, proxy *testetcd.Proxy) {
	t.Helper()
	c := cluster(t)
	a = startReplica(t, c.Endpoints(), testPrefix(t), true, Options{})
	proxy = c.NewProxy(t, 0)
	b = startReplica(t, []string{proxy.Endpoint()}, testPrefix(t), true, Options{})
	return a, b, proxy
}

// callBehind runs call while the proxy is paused, letting it reach the replica behind the
// proxy for 100 ms, then resumes the proxy and waits for call to return. call runs in a
// goroutine of its own: it reports failures with t.Error.
func callBehind(p *testetcd.Proxy, call func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		call()
	}()
	time.Sleep(100 * time.Millisecond) // let the call find the replica behind
	p.Resume()
	<-done
}

func TestEtcdConcurrentWritersLoseNoUpdate(t *testing.T) {
	c := cluster(t)
	a := startReplica(t, c.Endpoints(), testPrefix(t), true, Options{})
	b := startReplica(t, c.Endpoints(), testPrefix(t), true, Options{})
	const perReplica = 30
	var wg sync.WaitGroup
	errs := make(chan error, 2*perReplica)
	var last [2]uint64 // the revision of each writer's last apply
	for r, ts := range []*testServer{a, b} {
		wg.Go(func() {
			for i := range perReplica {
				// Every apply changes the spec, so every one must bump the generation once.
				gw := fmt.Sprintf("192.0.%d.%d", r+1, i+1)
				resp, err := ts.client.Apply(testContext(t), &nimbusv1.ApplyRequest{Object: route("contended", nil, gw)})
				if err != nil {
					errs <- err
					continue
				}
				last[r] = resp.GetObject().GetMeta().GetRevision()
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("Apply: %v", err)
	}
	// a reads once it has seen both writers' last change.
	waitRev(t, a, max(last[0], last[1]))
	got := a.get(t, routeKey("contended")).GetObject()
	if g := got.GetMeta().GetGeneration(); g != 2*perReplica {
		t.Fatalf("generation %d after %d changing applies through two replicas, want %d: an update was lost",
			g, 2*perReplica, 2*perReplica)
	}
	t.Logf("conflicts: a %v, b %v", testutil.ToFloat64(a.srv.backend.(*etcdStore).conflicts), testutil.ToFloat64(b.srv.backend.(*etcdStore).conflicts))
}

func TestEtcdReplicaNotReadyUntilEtcdAnswers(t *testing.T) {
	c := testetcd.Plan(t, 1)
	ts := startReplica(t, c.Endpoints(), "/naples", false, Options{})
	ts.srv.serving.Store(true) // Serve may not have started yet; readiness is the store's
	why := ts.srv.Ready()
	if len(why) == 0 || !strings.Contains(strings.Join(why, "; "), "etcd") {
		t.Fatalf("Ready() = %q before etcd runs, want a reason naming etcd", why)
	}
	_, err := ts.client.List(testContext(t), &nimbusv1.ListRequest{})
	wantCode(t, err, codes.Unavailable)
	_, err = ts.client.Apply(testContext(t), &nimbusv1.ApplyRequest{Object: route("r", nil, "192.0.2.1")})
	wantCode(t, err, codes.Unavailable)
	// A dry run would check against a cache not loaded yet.
	_, err = ts.client.Apply(testContext(t), &nimbusv1.ApplyRequest{Object: route("r", nil, "192.0.2.1"), DryRun: true})
	wantCode(t, err, codes.Unavailable)
	// Which version runs is no business of the store's.
	if v, err := ts.client.Version(testContext(t), &nimbusv1.VersionRequest{}); err != nil || v.GetVersion() == "" {
		t.Errorf("Version before etcd runs = %v, %v; want an answer", v, err)
	}

	health := healthpb.NewHealthClient(dialConn(t, ts.path))
	wantHealth := func(want healthpb.HealthCheckResponse_ServingStatus) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			resp, err := health.Check(testContext(t), &healthpb.HealthCheckRequest{Service: nimbusv1.Nimbus_ServiceDesc.ServiceName})
			if err == nil && resp.GetStatus() == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("health of the Nimbus service = %v (err %v), want %v", resp.GetStatus(), err, want)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	wantHealth(healthpb.HealthCheckResponse_NOT_SERVING)

	c.StartAll()
	waitReady(t, ts)
	ts.apply(t, route("r", nil, "192.0.2.1"))
	wantHealth(healthpb.HealthCheckResponse_SERVING)
}

func TestEtcdNewReplicaResumesFromBeforeItStarted(t *testing.T) {
	c := cluster(t)
	a := startReplica(t, c.Endpoints(), testPrefix(t), true, Options{})
	ctx, cancel := context.WithCancel(testContext(t))
	w := watchFrom(t, ctx, a.client, "n1", "", 0)
	_, synced := recvUntilSynced(t, w)
	cancel()
	var last *nimbusv1.Object
	for i := range 5 {
		last = a.apply(t, route(fmt.Sprintf("r%d", i), []string{"n1"}, "192.0.2.1")).GetObject()
	}
	// A replica started after the changes still resumes the node from before them: it
	// replays recent etcd history into its window at start.
	b := startReplica(t, c.Endpoints(), testPrefix(t), true, Options{})
	w = watchFrom(t, testContext(t), b.client, "n1", synced.GetEpoch(), synced.GetRevision())
	wantResumed(t, b, w, synced.GetRevision())
	for i := range 5 {
		ev := recv(t, w)
		if ev.GetType() != nimbusv1.WatchEvent_TYPE_PUT || ev.GetObject().GetMeta().GetName() != fmt.Sprintf("r%d", i) {
			t.Fatalf("replayed event %d: %v %s", i, ev.GetType(), ev.GetObject().GetMeta().GetName())
		}
	}
	_ = last

	// With no window it cannot, and says why with a snapshot.
	cw := startReplica(t, c.Endpoints(), testPrefix(t), true, Options{HistoryWindow: -1})
	w = watchFrom(t, testContext(t), cw.client, "n1", synced.GetEpoch(), synced.GetRevision())
	puts, _ := recvUntilSynced(t, w)
	if len(puts) != 5 {
		t.Fatalf("snapshot from a replica without history: %d objects, want 5", len(puts))
	}
}

func TestEtcdSurvivesLeaderAndFollowerKill(t *testing.T) {
	c := testetcd.Start(t, 3)
	a := startReplica(t, c.Endpoints(), "/naples", true, Options{})
	b := startReplica(t, c.Endpoints(), "/naples", true, Options{})
	w := watch(t, b.client, "n1")
	recvUntilSynced(t, w)

	ctx := testContext(t)
	applyRetrying := func(ts *testServer, name string) *nimbusv1.Object {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			resp, err := ts.client.Apply(ctx, &nimbusv1.ApplyRequest{Object: route(name, []string{"n1"}, "192.0.2.1")})
			if err == nil {
				return resp.GetObject()
			}
			if time.Now().After(deadline) {
				t.Fatalf("Apply %s still failing after 20s: %v", name, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	leader, err := c.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c.Kill(leader)
	o1 := applyRetrying(a, "after-leader-kill")
	follower := (leader + 1) % 3
	c.Kill(follower)
	// Without quorum, reads and watches still answer from the cache.
	if _, err := b.client.List(ctx, &nimbusv1.ListRequest{}); err != nil {
		t.Fatalf("List without etcd quorum: %v", err)
	}
	c.Restart(follower)
	o2 := applyRetrying(a, "after-quorum-back")
	c.Restart(leader)
	for _, want := range []*nimbusv1.Object{o1, o2} {
		ev := recv(t, w)
		if ev.GetRevision() != want.GetMeta().GetRevision() {
			t.Fatalf("watch on b got %v at %d, want %s at %d", ev.GetType(), ev.GetRevision(), want.GetMeta().GetName(), want.GetMeta().GetRevision())
		}
	}
}

func TestEtcdDeleteSeesACreateThroughAnotherReplica(t *testing.T) {
	a, b, proxy := startLaggingPair(t)

	// b's cache has not seen the creation when the deletion comes: the deletion must find
	// the object anyway.
	proxy.Pause()
	a.apply(t, route("r", nil, "192.0.2.1"))
	var resp *nimbusv1.DeleteResponse
	callBehind(proxy, func() {
		var err error
		if resp, err = b.client.Delete(testContext(t), &nimbusv1.DeleteRequest{Key: routeKey("r")}); err != nil {
			t.Error(err)
		}
	})
	if !resp.GetFound() {
		t.Fatal("a deletion through b right after the creation through a found nothing")
	}
	waitRev(t, a, resp.GetRevision())
	_, err := a.client.Get(testContext(t), &nimbusv1.GetRequest{Key: routeKey("r")})
	wantCode(t, err, codes.NotFound)
}

func TestEtcdRevisionGaugeAgreesAcrossReplicas(t *testing.T) {
	c := cluster(t)
	a := startReplica(t, c.Endpoints(), testPrefix(t), true, Options{})
	b := startReplica(t, c.Endpoints(), testPrefix(t), true, Options{})
	obj := a.apply(t, route("r", nil, "192.0.2.1")).GetObject()
	waitRev(t, b, obj.GetMeta().GetRevision())
	// etcd moves on without an object change; b is told so by a progress notification,
	// a is not. Both still show the revision of the last change.
	put, err := c.Client(t).Put(testContext(t), "/elsewhere", "x")
	if err != nil {
		t.Fatal(err)
	}
	if !b.srv.backend.(*etcdStore).catchUp(testContext(t), endRev(put.Header.Revision)) {
		t.Fatal("b did not learn of etcd's progress")
	}
	want := float64(obj.GetMeta().GetRevision())
	if ga, gb := testutil.ToFloat64(a.srv.metrics.revision), testutil.ToFloat64(b.srv.metrics.revision); ga != want || gb != want {
		t.Fatalf("naples_nimbus_revision: a %v, b %v; want both at the last change, %v", ga, gb, want)
	}
	// A replica started now, which loads from etcd, shows the same.
	cr := startReplica(t, c.Endpoints(), testPrefix(t), true, Options{})
	if g := testutil.ToFloat64(cr.srv.metrics.revision); g != want {
		t.Fatalf("naples_nimbus_revision of a new replica: %v, want %v", g, want)
	}
}

func TestEtcdApplyUnchangedOnAStaleCacheIsNotLost(t *testing.T) {
	a, b, proxy := startLaggingPair(t)
	first := a.apply(t, route("r", nil, "192.0.2.1")).GetObject()
	waitRev(t, b, first.GetMeta().GetRevision())

	// a changes the object while b's cache is held back; b is then asked to apply what
	// its cache still holds. That is a change in etcd, and must not be taken for none.
	proxy.Pause()
	a.apply(t, route("r", nil, "192.0.2.2"))
	var resp *nimbusv1.ApplyResponse
	callBehind(proxy, func() {
		var err error
		if resp, err = b.client.Apply(testContext(t), &nimbusv1.ApplyRequest{Object: route("r", nil, "192.0.2.1")}); err != nil {
			t.Error(err)
		}
	})
	waitRev(t, a, resp.GetObject().GetMeta().GetRevision())
	got := a.get(t, routeKey("r")).GetObject()
	if !resp.GetChanged() || resp.GetObject().GetMeta().GetGeneration() != 3 ||
		got.GetSpec().(*nimbusv1.Object_Route).Route.GetNexthops()[0].GetGateway() != "192.0.2.1" || got.GetMeta().GetGeneration() != 3 {
		t.Fatalf("apply through b on a stale cache: changed %v at generation %d; a holds %v at generation %d; want the apply stored at generation 3",
			resp.GetChanged(), resp.GetObject().GetMeta().GetGeneration(), got.GetSpec(), got.GetMeta().GetGeneration())
	}
}

func TestEtcdReportForAnObjectTheCacheHasNotSeenYet(t *testing.T) {
	a, b, proxy := startLaggingPair(t)

	// An agent got the object from a and reports to b, whose cache has not seen it yet:
	// the report must not be dropped.
	proxy.Pause()
	obj := a.apply(t, route("r", []string{"n1"}, "192.0.2.1")).GetObject()
	callBehind(proxy, func() {
		stream, err := b.client.ReportStatus(testContext(t))
		if err == nil {
			err = stream.Send(statusReport(routeKey("r"), "n1", obj.GetMeta().GetGeneration(), nimbusv1.Phase_PHASE_PROGRAMMED, ""))
		}
		if err == nil {
			_, err = stream.CloseAndRecv()
		}
		if err != nil {
			t.Error(err)
		}
	})
	wantStatus(t, b, routeKey("r"), 1, 1, 0, "n1")
}

func TestEtcdMaxTxnOpsOverEtcdsLimitRefusesToServe(t *testing.T) {
	c := testetcd.Start(t, 1, testetcd.MaxTxnOps(64))
	srv, err := New(Options{
		Etcd:   &EtcdOptions{Config: clientv3.Config{Endpoints: c.Endpoints()}, Prefix: testPrefix(t), MaxTxnOps: 128},
		Logger: slog.New(slog.NewTextHandler(t.Output(), nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("unix", filepath.Join(t.TempDir(), "n.sock"))
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(t.Context(), lis) }()
	select {
	case err = <-served:
	case <-time.After(20 * time.Second):
		t.Fatal("Serve still serves 20s after etcd refused transactions of MaxTxnOps operations")
	}
	for _, want := range []string{"--etcd-max-txn-ops", "128", "too many operations"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("Serve returned %v, want an error naming %q", err, want)
		}
	}
	if why := strings.Join(srv.Ready(), "; "); why == "" {
		t.Fatal("Ready() is empty after the store refused to serve")
	}

	// At etcd's limit, the replica serves.
	ts := startReplica(t, c.Endpoints(), testPrefix(t), true, Options{Etcd: &EtcdOptions{MaxTxnOps: 64}})
	ts.apply(t, route("r", nil, "192.0.2.1"))
}

func TestEtcdReplicaCompactsHistoryAndEveryReplicaServesAll(t *testing.T) {
	c := cluster(t)
	const retention = 5
	a := startReplica(t, c.Endpoints(), testPrefix(t), true,
		Options{Etcd: &EtcdOptions{MaxTxnOps: 128, CompactionInterval: 100 * time.Millisecond, CompactionRetention: retention}})
	b := startReplica(t, c.Endpoints(), testPrefix(t), true, Options{Etcd: &EtcdOptions{MaxTxnOps: 128, CompactionInterval: -1}})
	w := watch(t, b.client, "n1")
	recvUntilSynced(t, w)

	const objects = 40
	var last *nimbusv1.Object
	for i := range objects {
		last = a.apply(t, route(fmt.Sprintf("r%02d", i), []string{"n1"}, "192.0.2.1")).GetObject()
	}
	lastEtcd := etcdRevOf(last.GetMeta().GetRevision())
	// Once the writes stop, a compacts up to the retention within two intervals.
	compacted := a.srv.backend.(*etcdStore).compacted
	deadline := time.Now().Add(20 * time.Second)
	for int64(testutil.ToFloat64(compacted)) < lastEtcd-retention {
		if time.Now().After(deadline) {
			t.Fatalf("compacted up to etcd revision %v after 20s, want %d", testutil.ToFloat64(compacted), lastEtcd-retention)
		}
		time.Sleep(10 * time.Millisecond)
	}
	at := int64(testutil.ToFloat64(compacted))
	cli := c.Client(t)
	if _, err := cli.Get(testContext(t), testPrefix(t)+"/objects/", clientv3.WithPrefix(), clientv3.WithRev(at-1)); !errors.Is(err, rpctypes.ErrCompacted) {
		t.Fatalf("a read at etcd revision %d, below the compaction at %d: %v, want %v", at-1, at, err, rpctypes.ErrCompacted)
	}
	if _, err := cli.Get(testContext(t), testPrefix(t)+"/objects/", clientv3.WithPrefix(), clientv3.WithRev(lastEtcd-retention)); err != nil {
		t.Fatalf("a read at etcd revision %d, within the retention: %v", lastEtcd-retention, err)
	}

	// Every replica serves every object: the two that ran along, the watch on b, and one
	// started after the compaction, which cannot read from before it.
	for i := range objects {
		ev := recv(t, w)
		if ev.GetType() != nimbusv1.WatchEvent_TYPE_PUT || ev.GetObject().GetMeta().GetName() != fmt.Sprintf("r%02d", i) {
			t.Fatalf("event %d on b: %v %s", i, ev.GetType(), ev.GetObject().GetMeta().GetName())
		}
	}
	late := startReplica(t, c.Endpoints(), testPrefix(t), true, Options{Etcd: &EtcdOptions{MaxTxnOps: 128, CompactionInterval: -1}})
	for name, ts := range map[string]*testServer{"a": a, "b": b, "late": late} {
		waitRev(t, ts, last.GetMeta().GetRevision())
		list, err := ts.client.List(testContext(t), &nimbusv1.ListRequest{})
		if err != nil {
			t.Fatalf("List on %s: %v", name, err)
		}
		if n := len(list.GetItems()); n != objects {
			t.Fatalf("List on %s: %d objects, want %d", name, n, objects)
		}
	}
}

func TestEtcdReplicaCutOffFromEtcdTurnsUnready(t *testing.T) {
	for _, tc := range []struct {
		name string
		// cut cuts a replica's etcd client off from etcd through its proxy; restore ends it.
		cut, restore func(*testing.T, *testetcd.Proxy)
	}{
		// etcd's answers are held back, as by a partition that drops packets: the
		// connection stays up and the client sees no error.
		{"held back", func(_ *testing.T, p *testetcd.Proxy) { p.Pause() }, func(_ *testing.T, p *testetcd.Proxy) { p.Resume() }},
		// The connection is closed and new ones are refused, until the proxy serves again:
		// the client dials again with its backoff.
		{"closed", func(_ *testing.T, p *testetcd.Proxy) { p.Cut() }, func(t *testing.T, p *testetcd.Proxy) { p.Reopen(t) }},
	} {
		t.Run(tc.name, func(t *testing.T) { testCutOff(t, tc.cut, tc.restore) })
	}
}

// testCutOff checks that a replica whose etcd client is cut off from etcd, by cut, turns
// unready within its progress timeout and ends its watch streams, while another replica
// stays ready, and that it is ready again once restore lets its client through again.
func testCutOff(t *testing.T, cut, restore func(*testing.T, *testetcd.Proxy)) {
	c := cluster(t)
	const timeout = time.Second
	opts := Options{Etcd: &EtcdOptions{MaxTxnOps: 128, ProgressTimeout: timeout}}
	a := startReplica(t, c.Endpoints(), testPrefix(t), true, opts)
	proxy := c.NewProxy(t, 0)
	b := startReplica(t, []string{proxy.Endpoint()}, testPrefix(t), true, opts)
	healthA := healthpb.NewHealthClient(dialConn(t, a.path))
	healthB := healthpb.NewHealthClient(dialConn(t, b.path))
	// waitFor waits up to the bound until the replica's readiness and health are as wanted,
	// and returns how long that took.
	waitFor := func(ts *testServer, hc healthpb.HealthClient, ready bool, bound time.Duration) time.Duration {
		t.Helper()
		want := healthpb.HealthCheckResponse_SERVING
		if !ready {
			want = healthpb.HealthCheckResponse_NOT_SERVING
		}
		start := time.Now()
		for {
			why := ts.srv.Ready()
			resp, err := hc.Check(testContext(t), &healthpb.HealthCheckRequest{})
			if (len(why) == 0) == ready && err == nil && resp.GetStatus() == want {
				return time.Since(start)
			}
			if time.Since(start) > bound {
				t.Fatalf("after %v: Ready() = %q, health %v (err %v); want ready %v", bound, why, resp.GetStatus(), err, ready)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	// Quiet, both stay ready: the progress notifications they ask for are their news, and
	// keep the age of their caches under the timeout.
	time.Sleep(3 * timeout)
	waitFor(a, healthA, true, 0)
	waitFor(b, healthB, true, 0)
	cacheAge := func(ts *testServer) time.Duration {
		return time.Duration(testutil.ToFloat64(ts.srv.backend.(*etcdStore).cacheAge) * float64(time.Second))
	}
	for name, ts := range map[string]*testServer{"a": a, "b": b} {
		if age := cacheAge(ts); age <= 0 || age > timeout {
			t.Fatalf("naples_nimbus_etcd_cache_age_seconds of %s, quiet = %v, want above 0 and at most %v", name, age, timeout)
		}
	}

	// b hears nothing more from etcd: it turns unready within the timeout and a quarter
	// (plus a scheduling margin), a stays ready, and b still answers from its cache.
	obj := a.apply(t, route("r", nil, "192.0.2.1")).GetObject()
	waitRev(t, b, obj.GetMeta().GetRevision())
	w := watch(t, b.client, "n1")
	recvUntilSynced(t, w)
	cut(t, proxy)
	took := waitFor(b, healthB, false, timeout*5/4+2*time.Second)
	t.Logf("cut off: unready after %v", took)
	if why := strings.Join(b.srv.Ready(), "; "); !strings.Contains(why, "cut off from etcd") {
		t.Fatalf("Ready() of b = %q, want it to say it is cut off from etcd", why)
	}
	if g := testutil.ToFloat64(b.srv.backend.(*etcdStore).cutOffGauge); g != 1 {
		t.Fatalf("naples_nimbus_etcd_cut_off of b = %v, want 1", g)
	}
	if age := cacheAge(b); age <= timeout {
		t.Fatalf("naples_nimbus_etcd_cache_age_seconds of b, cut off = %v, want above %v", age, timeout)
	}
	waitFor(a, healthA, true, 0)
	b.get(t, routeKey("r"))
	// b ends its watch streams, so that their agents watch again on a ready replica.
	if ev, err := w.Recv(); status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "cut off from etcd") {
		t.Fatalf("watch on b once it is cut off: %v, %v; want Unavailable saying it is cut off", ev, err)
	}

	// Once etcd's answers flow again, b is ready again: at once when they were held back,
	// once its client has dialed again when the connection was closed (gRPC's backoff
	// waits 1s, then 1.6 times more each time, with a jitter of a fifth).
	restore(t, proxy)
	took = waitFor(b, healthB, true, 10*time.Second)
	t.Logf("back: ready after %v", took)
	if g := testutil.ToFloat64(b.srv.backend.(*etcdStore).cutOffGauge); g != 0 {
		t.Fatalf("naples_nimbus_etcd_cut_off of b = %v, want 0", g)
	}
	if age := cacheAge(b); age > timeout {
		t.Fatalf("naples_nimbus_etcd_cache_age_seconds of b, back = %v, want at most %v", age, timeout)
	}
}

func TestEtcdReplicaWhoseEtcdConnectionBreaksAndComesBackStaysReady(t *testing.T) {
	c := cluster(t)
	const timeout = 6 * time.Second
	proxy := c.NewProxy(t, 0)
	b := startReplica(t, []string{proxy.Endpoint()}, testPrefix(t), true,
		Options{Etcd: &EtcdOptions{MaxTxnOps: 128, ProgressTimeout: timeout}})
	// Quiet: the watch heard progress last, and the client resumes it past etcd's revision.
	time.Sleep(timeout / 2)
	w := watch(t, b.client, "n1")
	recvUntilSynced(t, w)
	e := b.srv.backend.(*etcdStore)
	proxy.Reopen(t)
	// The watch is started again before the timeout: b hears from etcd again and is never
	// cut off, and its watch stream goes on.
	var age float64
	for end := time.Now().Add(timeout * 3 / 2); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if why := b.srv.Ready(); len(why) > 0 {
			t.Fatalf("Ready() = %q after the etcd connection broke and came back at once", why)
		}
		age = max(age, testutil.ToFloat64(e.cacheAge))
	}
	t.Logf("cache age at most %.2fs", age)
	if cur := testutil.ToFloat64(e.cacheAge); cur > timeout.Seconds()/2 {
		t.Fatalf("naples_nimbus_etcd_cache_age_seconds = %v, want at most %v", cur, timeout/2)
	}
	obj := route("r", []string{"n1"}, "192.0.2.1")
	b.apply(t, obj)
	if ev := recv(t, w); ev.GetType() != nimbusv1.WatchEvent_TYPE_PUT || ev.GetObject().GetMeta().GetName() != "r" {
		t.Fatalf("watch on b after the etcd connection came back: %v %s, want PUT r", ev.GetType(), ev.GetObject().GetMeta().GetName())
	}
}

func TestEtcdCompactionOfOnlyWhatTheCacheHoldsKeepsItsWindow(t *testing.T) {
	c := cluster(t)
	a := startReplica(t, c.Endpoints(), testPrefix(t), true, Options{})
	proxy := c.NewProxy(t, 0)
	const timeout = time.Second
	b := startReplica(t, []string{proxy.Endpoint()}, testPrefix(t), true,
		Options{Etcd: &EtcdOptions{MaxTxnOps: 128, ProgressTimeout: timeout}})
	first := a.apply(t, route("first", []string{"n1"}, "192.0.2.1")).GetObject()
	waitRev(t, b, first.GetMeta().GetRevision())

	// While b is cut off, etcd compacts up to the one change b has not seen: b's next
	// watch, from the revision its cache holds, finds that revision compacted.
	proxy.Cut()
	missed := a.apply(t, route("missed", []string{"n1"}, "192.0.2.1")).GetObject()
	if _, err := c.Client(t).Compact(testContext(t), etcdRevOf(missed.GetMeta().GetRevision())); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * timeout) // b starts its watch again meanwhile
	proxy.Reopen(t)
	waitReady(t, b)
	waitRev(t, b, missed.GetMeta().GetRevision())

	// b lost nothing of its window: an agent resumes there from before the compaction.
	w := watchFrom(t, testContext(t), b.client, "n1", b.srv.Epoch(), first.GetMeta().GetRevision())
	wantResumed(t, b, w, first.GetMeta().GetRevision())
	if ev := recv(t, w); ev.GetType() != nimbusv1.WatchEvent_TYPE_PUT || ev.GetRevision() != missed.GetMeta().GetRevision() {
		t.Fatalf("resumed with %v at %d, want PUT missed at %d", ev.GetType(), ev.GetRevision(), missed.GetMeta().GetRevision())
	}
}

func TestEtcdTransactionOverEtcdsRequestLimitSaysWhich(t *testing.T) {
	c := testetcd.Start(t, 1, testetcd.MaxRequestBytes(32<<10))
	a := startReplica(t, c.Endpoints(), testPrefix(t), true, Options{})
	// 64 objects of about 1 KiB each fit one transaction of nimbus's (128 operations, 1 MiB)
	// but not etcd's 32 KiB.
	var objs []*nimbusv1.Object
	for i := range 64 {
		obj := route(fmt.Sprintf("r%02d", i), nil, "192.0.2.1")
		obj.Meta.Labels = map[string]string{"note": strings.Repeat("x", 1<<10)}
		objs = append(objs, obj)
	}
	_, err := a.client.ApplyBatch(testContext(t), &nimbusv1.ApplyBatchRequest{Objects: objs})
	if code := status.Code(err); code == codes.OK || code == codes.Unavailable {
		t.Fatalf("ApplyBatch over etcd's --max-request-bytes: %v; want an error that is not Unavailable, which clients retry", err)
	}
	for _, want := range []string{"--max-request-bytes", "too large"} {
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("ApplyBatch over etcd's --max-request-bytes: %v; want it to name %q", err, want)
		}
	}
	if n := testutil.ToFloat64(a.srv.backend.(*etcdStore).overLimits); n != 1 {
		t.Fatalf("naples_nimbus_etcd_txns_over_limit_total = %v, want 1", n)
	}
	// The replica stays ready and takes what fits.
	if why := a.srv.Ready(); len(why) > 0 {
		t.Fatalf("Ready() = %q after a refused transaction", why)
	}
	a.apply(t, objs[0])
}

func TestEtcdCompactionRetentionFollowsTheHistoryWindow(t *testing.T) {
	for _, tc := range []struct {
		retention int64
		window    int
		want      int64
	}{
		{retention: 0, window: DefaultHistoryWindow, want: DefaultHistoryWindow},
		// A replica that starts replays the window from etcd: a larger one keeps more.
		{retention: 0, window: 250000, want: 250000},
		{retention: 0, window: -1, want: DefaultEtcdCompactionRetention},
		{retention: 7, window: 250000, want: 7},
	} {
		o := EtcdOptions{Config: clientv3.Config{Endpoints: []string{"http://e:1"}}, CompactionRetention: tc.retention}
		got, err := o.withDefaults(tc.window)
		if err != nil || got.CompactionRetention != tc.want {
			t.Errorf("CompactionRetention %d with HistoryWindow %d: %v, %v; want %d", tc.retention, tc.window, got.CompactionRetention, err, tc.want)
		}
	}
}
