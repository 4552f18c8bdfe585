package nimbus

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/naplesnet/naples/internal/pki"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// testPeer is one replica of a test cluster: a Server with a replica name, serving on
// a unix socket, and a client of it.
type testPeer struct {
	*testServer
	name string
	// stop stops serving and closes the Server, as a replica that goes away; the test's
	// cleanup calls it too.
	stop func()
}

// startPeer serves a replica named name with opts, telling the time with clock. setup,
// when set, runs on the Server before it serves.
func startPeer(t *testing.T, name string, opts Options, clock *fakeClock, setup func(*Server)) *testPeer {
	t.Helper()
	opts.ReplicaName = name
	opts.Now = clock.Now
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug})).With("replica", name)
	}
	srv, err := New(opts)
	if err != nil {
		t.Fatalf("New %s: %v", name, err)
	}
	if setup != nil {
		setup(srv)
	}
	path := filepath.Join(t.TempDir(), name+".sock")
	lis, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, lis) }()
	stopped := false
	stop := func() {
		t.Helper()
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-served; err != nil {
			t.Errorf("Serve %s returned %v, want nil", name, err)
		}
	}
	t.Cleanup(stop)
	var client nimbusv1.NimbusClient
	if opts.TLS == nil {
		client = dial(t, path)
	}
	return &testPeer{testServer: &testServer{srv: srv, client: client, path: path, clock: clock}, name: name, stop: stop}
}

// startPeers serves a replica for each name, with opts and one clock, and links them.
func startPeers(t *testing.T, opts Options, names ...string) []*testPeer {
	t.Helper()
	clock := &fakeClock{now: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	var rs []*testPeer
	for _, name := range names {
		rs = append(rs, startPeer(t, name, opts, clock, nil))
	}
	linkPeers(t, rs...)
	return rs
}

// linkPeers hands every replica the same list of all of them, itself included, as a
// membership list would, and waits until every push stream is up.
func linkPeers(t *testing.T, rs ...*testPeer) {
	t.Helper()
	var peers []Peer
	for _, r := range rs {
		peers = append(peers, Peer{Name: r.name, Address: "unix://" + r.path})
	}
	for _, r := range rs {
		r.srv.SetPeers(peers)
	}
	for _, r := range rs {
		waitPeerMetric(t, r, "naples_nimbus_peers", float64(len(rs)-1))
	}
}

// waitPeerMetric waits until the replica's metric has the value.
func waitPeerMetric(t *testing.T, r *testPeer, name string, want float64) {
	t.Helper()
	waitPeerCond(t, fmt.Sprintf("%s of %s to be %v", name, r.name, want), func() bool {
		return metricValues(t, r.srv.Registry())[name] == want
	})
}

// waitPeerCond waits until cond holds, failing the test after 10s.
func waitPeerCond(t *testing.T, what string, cond func() bool) {
	t.Helper()
	ctx := testContext(t)
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("waited in vain for %s", what)
		case <-time.After(time.Millisecond):
		}
	}
}

// statusOf returns the object's status as the replica's Get answers it.
func (r *testPeer) statusOf(t *testing.T, key *nimbusv1.ObjectKey) *nimbusv1.ObjectStatus {
	t.Helper()
	return r.get(t, key).GetStatus()
}

// waitPeerStatus waits until every replica answers Get for the object with the status
// want, field by field.
func waitPeerStatus(t *testing.T, key *nimbusv1.ObjectKey, want *nimbusv1.ObjectStatus, rs ...*testPeer) {
	t.Helper()
	for _, r := range rs {
		var got *nimbusv1.ObjectStatus
		ctx := testContext(t)
		for got = r.statusOf(t, key); !proto.Equal(got, want); got = r.statusOf(t, key) {
			select {
			case <-ctx.Done():
				t.Fatalf("%s: status of %s =\n%v\nwant\n%v", r.name, key.ID(), got, want)
			case <-time.After(time.Millisecond):
			}
		}
	}
}

// originOf returns the origin of the status the node reported about the object, as the
// replica keeps it, or "none".
func (r *testPeer) originOf(key *nimbusv1.ObjectKey, node string) string {
	rec := r.srv.store.read().nodeStatus(key.Key(), node)
	if rec == nil {
		return "none"
	}
	return rec.Origin
}

// peerReport returns a report of the node's status about the object, made at the time.
func peerReport(key *nimbusv1.ObjectKey, node string, gen int64, phase nimbusv1.Phase, at time.Time) *nimbusv1.StatusReport {
	r := statusReport(key, node, gen, phase, "")
	r.Status.UpdateTime = timestamppb.New(at)
	return r
}

// applyToPeers applies the objects to every replica, as their shared store would hold them.
func applyToPeers(t *testing.T, objs []*nimbusv1.Object, rs ...*testPeer) {
	t.Helper()
	for _, r := range rs {
		for _, o := range objs {
			r.apply(t, proto.Clone(o).(*nimbusv1.Object))
		}
	}
}

// TestPeerStatusesShared shows that what a node reports to one replica, and that it
// watches it, is what every replica answers.
func TestPeerStatusesShared(t *testing.T) {
	rs := startPeers(t, Options{StaleAfter: 30 * time.Second}, "a", "b", "c")
	a, b, c := rs[0], rs[1], rs[2]
	r1, all := routeKey("r1"), routeKey("all")
	applyToPeers(t, []*nimbusv1.Object{route("r1", []string{"n1", "n2"}, "192.0.2.1"), route("all", nil, "192.0.2.1")}, rs...)

	ctx := testContext(t)
	statuses := watchStatus(t, ctx, b.client, &nimbusv1.WatchStatusRequest{Name: "r1"})
	statuses.synced()

	// n1 watches a, and reports to a.
	recvUntilSynced(t, watchFrom(t, ctx, a.client, "n1", "", 0))
	a.report(t, peerReport(r1, "n1", 1, nimbusv1.Phase_PHASE_PROGRAMMED, a.clock.Now()),
		peerReport(all, "n1", 1, nimbusv1.Phase_PHASE_PROGRAMMED, a.clock.Now()))
	for _, key := range []*nimbusv1.ObjectKey{r1, all} {
		st := a.statusOf(t, key)
		if st.GetProgrammedNodes() != 1 {
			t.Fatalf("a: %s has %d nodes programmed, want n1", key.ID(), st.GetProgrammedNodes())
		}
		waitPeerStatus(t, key, st, b, c)
	}
	// n1, watching a, is a target of the object for every node on b and c too.
	if st := c.statusOf(t, all); st.GetTargetNodes() != 1 || st.GetCaughtUpTime() == nil {
		t.Errorf("c: object for every node has %d targets, caught up %v; want n1, caught up", st.GetTargetNodes(), st.GetCaughtUpTime())
	}
	// b streamed the report to its status watcher.
	for {
		item := statuses.nextPut(r1)
		if item.GetStatus().GetProgrammedNodes() == 1 {
			wantAsGet(t, b.testServer, item)
			break
		}
	}
	// n1 watches, so it stays fresh everywhere however long it takes.
	a.clock.Advance(time.Hour)
	for _, r := range rs {
		wantStale(t, r.testServer, r1)
		wantStale(t, r.testServer, all)
	}
	for _, r := range rs {
		if got := r.originOf(r1, "n1"); got != "a" {
			t.Errorf("%s keeps n1's status of r1 from %q, want a", r.name, got)
		}
	}
	// A failure no retry mends travels whole, terminal included.
	failed := peerReport(r1, "n2", 1, nimbusv1.Phase_PHASE_FAILED, a.clock.Now())
	failed.Status.Reason, failed.Status.Message, failed.Status.Terminal = "InvalidSpec", "spec.table 255: reserved", true
	recvUntilSynced(t, watchFrom(t, ctx, a.client, "n2", "", 0))
	a.report(t, failed)
	st := a.statusOf(t, r1)
	if n := st.GetNodes(); len(n) != 2 || !n[1].GetTerminal() {
		t.Fatalf("a: nodes of r1 = %v; want n2's terminal failure", n)
	}
	waitPeerStatus(t, r1, st, b, c)
}

// TestPeerReplicaGoes shows what happens to a node's statuses when the replica it
// watched goes away: they turn stale on the other replicas after StaleAfter, and fresh
// again once the node watches and reports to another replica.
func TestPeerReplicaGoes(t *testing.T) {
	const staleAfter = 30 * time.Second
	rs := startPeers(t, Options{StaleAfter: staleAfter}, "a", "b", "c")
	a, b, c := rs[0], rs[1], rs[2]
	r1, all := routeKey("r1"), routeKey("all")
	applyToPeers(t, []*nimbusv1.Object{route("r1", []string{"n1"}, "192.0.2.1"), route("all", nil, "192.0.2.1")}, rs...)
	clock := a.clock

	ctx := testContext(t)
	recvUntilSynced(t, watchFrom(t, ctx, a.client, "n1", "", 0))
	a.report(t, peerReport(r1, "n1", 1, nimbusv1.Phase_PHASE_PROGRAMMED, clock.Now()))
	waitPeerStatus(t, r1, a.statusOf(t, r1), b, c)
	waitPeerStatus(t, all, a.statusOf(t, all), b, c)
	if n := b.statusOf(t, all).GetTargetNodes(); n != 1 {
		t.Fatalf("b: object for every node has %d targets, want n1 watching a", n)
	}

	a.stop()
	// n1 no longer watches anywhere: it leaves the targets of the object for every node,
	// and its statuses turn stale StaleAfter later.
	for _, r := range []*testPeer{b, c} {
		waitPeerCond(t, r.name+" to see n1 stop watching", func() bool { return r.statusOf(t, all).GetTargetNodes() == 0 })
		wantStale(t, r.testServer, r1)
	}
	clock.Advance(staleAfter)
	wantStale(t, b.testServer, r1, "n1")
	wantStale(t, c.testServer, r1, "n1")
	waitPeerMetric(t, b, "naples_nimbus_peers", 1)

	// n1's agent fails over to b and reports again.
	recvUntilSynced(t, watchFrom(t, ctx, b.client, "n1", "", 0))
	clock.Advance(time.Second)
	b.report(t, peerReport(r1, "n1", 1, nimbusv1.Phase_PHASE_PROGRAMMED, clock.Now()))
	wantStale(t, b.testServer, r1)
	if got := b.originOf(r1, "n1"); got != "b" {
		t.Errorf("b keeps n1's status from %q, want b", got)
	}
	waitPeerCond(t, "c to take n1's status from b", func() bool { return c.originOf(r1, "n1") == "b" })
	waitPeerStatus(t, r1, b.statusOf(t, r1), c)
	waitPeerStatus(t, all, b.statusOf(t, all), c)
	wantStale(t, c.testServer, r1)
}

// TestPeerNoLoops shows that a report travels once from the replica that took it to
// each peer, and no further.
func TestPeerNoLoops(t *testing.T) {
	rs := startPeers(t, Options{}, "a", "b", "c")
	a, b, c := rs[0], rs[1], rs[2]
	r1, r2 := routeKey("r1"), routeKey("r2")
	applyToPeers(t, []*nimbusv1.Object{route("r1", []string{"n1"}, "192.0.2.1"), route("r2", []string{"n2"}, "192.0.2.1")}, rs...)

	a.report(t, peerReport(r1, "n1", 1, nimbusv1.Phase_PHASE_PROGRAMMED, a.clock.Now()))
	waitPeerStatus(t, r1, a.statusOf(t, r1), b, c)
	b.report(t, peerReport(r2, "n2", 1, nimbusv1.Phase_PHASE_PROGRAMMED, a.clock.Now()))
	waitPeerStatus(t, r2, b.statusOf(t, r2), a, c)
	// A replica that passed a's report on would have done so before b's own report, on
	// the same stream, which has arrived: the counts are final once counted. A replica
	// counts a frame just after sending or committing it, so the counts are waited for;
	// one report passed on would leave them above the wanted values for good.
	for _, tc := range []struct {
		r              *testPeer
		sent, received float64
	}{{a, 2, 1}, {b, 2, 1}, {c, 0, 2}} {
		waitPeerMetric(t, tc.r, `naples_nimbus_peer_reports_total{direction="sent"}`, tc.sent)
		waitPeerMetric(t, tc.r, `naples_nimbus_peer_reports_total{direction="received"}`, tc.received)
	}
}

// TestPeerKeepsNewerReport shows that of two reports for the same object and node from
// different replicas, every replica keeps the one with the later update_time.
func TestPeerKeepsNewerReport(t *testing.T) {
	rs := startPeers(t, Options{}, "a", "b")
	a, b := rs[0], rs[1]
	r1 := routeKey("r1")
	applyToPeers(t, []*nimbusv1.Object{route("r1", []string{"n1"}, "192.0.2.1")}, rs...)
	t0 := a.clock.Now()

	a.report(t, peerReport(r1, "n1", 1, nimbusv1.Phase_PHASE_PROGRAMMED, t0.Add(time.Minute)))
	waitPeerStatus(t, r1, a.statusOf(t, r1), b)
	// An older report reaches b: b keeps a's, and a never hears of it.
	b.report(t, peerReport(r1, "n1", 1, nimbusv1.Phase_PHASE_FAILED, t0))
	for _, r := range rs {
		if st := r.statusOf(t, r1); st.GetProgrammedNodes() != 1 || r.originOf(r1, "n1") != "a" {
			t.Errorf("%s: r1 programmed on %d nodes, kept from %q; want the later report, a's", r.name, st.GetProgrammedNodes(), r.originOf(r1, "n1"))
		}
	}
	// A newer one replaces it on both.
	b.report(t, peerReport(r1, "n1", 1, nimbusv1.Phase_PHASE_FAILED, t0.Add(2*time.Minute)))
	waitPeerCond(t, "a to take b's newer report", func() bool { return a.originOf(r1, "n1") == "b" })
	waitPeerStatus(t, r1, b.statusOf(t, r1), a)
	if st := a.statusOf(t, r1); st.GetFailedNodes() != 1 {
		t.Errorf("a: r1 failed on %d nodes, want n1's newer report", st.GetFailedNodes())
	}
}

// TestPeerGate shows that a replica takes a frame's reports only once its gate let the
// frame's revision through.
func TestPeerGate(t *testing.T) {
	clock := &fakeClock{now: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	revs := make(chan uint64)
	release := make(chan struct{})
	a := startPeer(t, "a", Options{}, clock, nil)
	b := startPeer(t, "b", Options{}, clock, func(s *Server) {
		s.peerGate = func(ctx context.Context, rev uint64) error {
			select {
			case revs <- rev:
			case <-ctx.Done():
				return ctx.Err()
			}
			select {
			case <-release:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	})
	r1 := routeKey("r1")
	applyToPeers(t, []*nimbusv1.Object{route("r1", []string{"n1"}, "192.0.2.1"), route("r2", []string{"n1"}, "192.0.2.1")}, a, b)
	linkPeers(t, a, b)

	a.report(t, peerReport(r1, "n1", 1, nimbusv1.Phase_PHASE_PROGRAMMED, clock.Now()))
	resp, err := a.client.List(testContext(t), &nimbusv1.ListRequest{})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case rev := <-revs:
		if rev != resp.GetRevision() {
			t.Errorf("gate called with revision %d, want a's %d", rev, resp.GetRevision())
		}
	case <-testContext(t).Done():
		t.Fatal("b never called its gate")
	}
	// The frame waits in the gate: b has not taken the report.
	wantStatus(t, b.testServer, r1, 1, 0, 0)
	close(release)
	waitPeerStatus(t, r1, a.statusOf(t, r1), b)
}

// TestPeerSetPeers shows that SetPeers stops pushing to a replica left out, which then
// no longer counts the nodes watching the other, and starts pushing again.
func TestPeerSetPeers(t *testing.T) {
	rs := startPeers(t, Options{}, "a", "b")
	a, b := rs[0], rs[1]
	all := routeKey("all")
	applyToPeers(t, []*nimbusv1.Object{route("all", nil, "192.0.2.1")}, rs...)
	recvUntilSynced(t, watchFrom(t, testContext(t), a.client, "n1", "", 0))
	waitPeerCond(t, "b to count n1, watching a", func() bool { return b.statusOf(t, all).GetTargetNodes() == 1 })

	a.srv.SetPeers([]Peer{{Name: "a", Address: "unix://" + a.path}})
	waitPeerMetric(t, a, "naples_nimbus_peers", 0)
	waitPeerCond(t, "b to stop counting n1", func() bool { return b.statusOf(t, all).GetTargetNodes() == 0 })

	linkPeers(t, a, b)
	waitPeerCond(t, "b to count n1 again", func() bool { return b.statusOf(t, all).GetTargetNodes() == 1 })
}

// TestPeerStatusNeedsReplica shows that a server that is no replica takes no pushes.
func TestPeerStatusNeedsReplica(t *testing.T) {
	ts := start(t, Options{})
	stream, err := ts.client.PeerStatus(testContext(t))
	if err != nil {
		t.Fatal(err)
	}
	_ = stream.Send(&nimbusv1.PeerFrame{Replica: "a"})
	_, err = stream.CloseAndRecv()
	wantCode(t, err, codes.FailedPrecondition)
}

// TestPeerAuth shows replicas pushing to each other with their replica certificates, and
// that only replicas may push, and replicas nothing else.
func TestPeerAuth(t *testing.T) {
	p := newTestPKI(t)
	clock := &fakeClock{now: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	replicaCert := func(name string) tls.Certificate {
		kp, err := p.ca.IssueReplica(name, nil, pki.CertOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return tlsCertificate(kp)
	}
	start := func(name string) *testPeer {
		cert := replicaCert(name)
		server := &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert},
			ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: p.roots}
		client := p.clientTLS(pki.KeyPair{})
		client.Certificates = []tls.Certificate{cert}
		r := startPeer(t, name, Options{TLS: server, PeerDialOptions: []grpc.DialOption{
			grpc.WithTransportCredentials(credentials.NewTLS(client)),
		}}, clock, nil)
		r.client = p.publisher(t, r.testServer)
		return r
	}
	a, b := start("a"), start("b")
	r1 := routeKey("r1")
	applyToPeers(t, []*nimbusv1.Object{route("r1", []string{"n1"}, "192.0.2.1")}, a, b)
	linkPeers(t, a, b)

	n1 := p.node(t, a.testServer, "n1")
	stream, err := n1.ReportStatus(testContext(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(peerReport(r1, "n1", 1, nimbusv1.Phase_PHASE_PROGRAMMED, clock.Now())); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.CloseAndRecv(); err != nil {
		t.Fatal(err)
	}
	waitPeerStatus(t, r1, a.statusOf(t, r1), b)

	ctx := testContext(t)
	asReplica := func(name string) nimbusv1.NimbusClient {
		cfg := p.clientTLS(pki.KeyPair{})
		cfg.Certificates = []tls.Certificate{replicaCert(name)}
		return dial(t, b.path, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	}
	push := func(client nimbusv1.NimbusClient, frame *nimbusv1.PeerFrame) error {
		stream, err := client.PeerStatus(ctx)
		if err != nil {
			return err
		}
		_ = stream.Send(frame)
		_, err = stream.CloseAndRecv()
		return err
	}
	forged := &nimbusv1.PeerFrame{Replica: "c", Revision: 1, Reports: []*nimbusv1.StatusReport{
		peerReport(r1, "n1", 1, nimbusv1.Phase_PHASE_FAILED, clock.Now().Add(time.Hour)),
	}}
	wantDenied(t, push(p.node(t, b.testServer, "n1"), forged), `node "n1"`, "replica certificate")
	wantDenied(t, push(b.client, forged), `publisher "admin"`, "replica certificate")
	wantDenied(t, push(asReplica("d"), forged), `replica "d"`, `replica "c"`)
	_, err = asReplica("c").Apply(ctx, &nimbusv1.ApplyRequest{Object: route("r9", nil, "192.0.2.1")})
	wantDenied(t, err, `replica "c"`, "Apply", "publisher certificate")
	_, err = asReplica("c").List(ctx, &nimbusv1.ListRequest{})
	wantDenied(t, err, `replica "c"`, "List")
	if st := b.statusOf(t, r1); st.GetFailedNodes() != 0 || b.originOf(r1, "n1") != "a" {
		t.Errorf("b: r1 failed on %d nodes, kept from %q; want a's report, no forged one", st.GetFailedNodes(), b.originOf(r1, "n1"))
	}
}

// startWatermarkPeers serves a replica for each name, with opts, one clock and one epoch,
// as replicas sharing an etcd have, and links them.
func startWatermarkPeers(t *testing.T, opts Options, names ...string) []*testPeer {
	t.Helper()
	clock := &fakeClock{now: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	var rs []*testPeer
	for _, name := range names {
		rs = append(rs, startPeer(t, name, opts, clock, func(s *Server) { s.setEpoch("shared-epoch") }))
	}
	linkPeers(t, rs...)
	return rs
}

// revision returns the replica's store revision.
func (r *testPeer) revision(t *testing.T) uint64 {
	t.Helper()
	resp, err := r.client.List(testContext(t), &nimbusv1.ListRequest{})
	if err != nil {
		t.Fatal(err)
	}
	return resp.GetRevision()
}

// watermarkOf returns the revision and origin of the node's watermark as the replica
// keeps it, or 0 and "none".
func (r *testPeer) watermarkOf(node string) (uint64, string) {
	wm := r.srv.store.read().watermark(node)
	if wm == nil {
		return 0, "none"
	}
	return wm.Revision, wm.Origin
}

// waitPeerWatermark waits until every replica keeps the node's watermark at rev from
// origin.
func waitPeerWatermark(t *testing.T, node string, rev uint64, origin string, rs ...*testPeer) {
	t.Helper()
	for _, r := range rs {
		waitPeerCond(t, fmt.Sprintf("%s to keep %s's watermark at %d from %s", r.name, node, rev, origin), func() bool {
			got, from := r.watermarkOf(node)
			return got == rev && from == origin
		})
	}
}

// TestPeerWatermarksShared shows that a node's watermark and exceptions, reported to one
// replica, are what every replica answers from, that a record the watermark makes
// redundant goes on every replica, and that a replica that joins gets the watermarks and
// the exceptions, not a status per object.
func TestPeerWatermarksShared(t *testing.T) {
	rs := startWatermarkPeers(t, Options{}, "a", "b", "c")
	a, b, c := rs[0], rs[1], rs[2]
	r1, r2, r3 := routeKey("r1"), routeKey("r2"), routeKey("r3")
	objs := []*nimbusv1.Object{nodeObject("n1"), route("r1", []string{"n1"}, "192.0.2.1"),
		route("r2", []string{"n1"}, "192.0.2.1"), route("r3", []string{"n1"}, "192.0.2.1")}
	applyToPeers(t, objs, rs...)
	w := a.revision(t)

	// n1 has applied everything but r2, which failed, and r3, whose HAL has said nothing yet.
	failed := statusReport(r2, "n1", 1, nimbusv1.Phase_PHASE_FAILED, "kernel says no")
	a.report(t, failed, statusReport(r3, "n1", 1, nimbusv1.Phase_PHASE_PROGRAMMED, ""),
		statusReport(r3, "n1", 1, nimbusv1.Phase_PHASE_UNSPECIFIED, ""), a.watermarkReport("n1", w))
	waitPeerWatermark(t, "n1", w, "a", rs...)
	wantStatus(t, a.testServer, r1, 1, 1, 0, "n1")
	wantStatus(t, a.testServer, r2, 1, 0, 1, "n1")
	wantStatus(t, a.testServer, r3, 1, 0, 0)
	for _, key := range []*nimbusv1.ObjectKey{r1, r2, r3} {
		waitPeerStatus(t, key, a.statusOf(t, key), b, c)
	}
	if msg := c.statusOf(t, r2).GetNodes()[0].GetMessage(); msg != "kernel says no" {
		t.Errorf("c: n1's message of r2 = %q, want the one reported to a", msg)
	}
	for _, r := range rs {
		wantMetrics(t, r.srv, `naples_nimbus_status_watermarks 1`, `naples_nimbus_statuses 2`)
	}

	// r2 and r3 are programmed now: a keeps no record of them, and neither do b and c.
	a.clock.Advance(time.Second)
	reportWith(t, a.client, statusReport(r2, "n1", 1, nimbusv1.Phase_PHASE_PROGRAMMED, ""),
		statusReport(r3, "n1", 1, nimbusv1.Phase_PHASE_PROGRAMMED, ""), a.watermarkReport("n1", w))
	for _, r := range rs {
		waitPeerCond(t, r.name+" to drop n1's records", func() bool {
			return metricValues(t, r.srv.Registry())["naples_nimbus_statuses"] == 0
		})
		wantStatus(t, r.testServer, r2, 1, 1, 0, "n1")
		wantStatus(t, r.testServer, r3, 1, 1, 0, "n1")
	}

	// A watermark that moves moves everywhere; a record it passes goes everywhere.
	a.apply(t, route("r4", []string{"n1"}, "192.0.2.4"))
	b.apply(t, route("r4", []string{"n1"}, "192.0.2.4"))
	c.apply(t, route("r4", []string{"n1"}, "192.0.2.4"))
	r4 := routeKey("r4")
	a.report(t, statusReport(r4, "n1", 1, nimbusv1.Phase_PHASE_PENDING, "waiting"), a.watermarkReport("n1", w))
	waitPeerStatus(t, r4, a.statusOf(t, r4), b, c)
	a.report(t, statusReport(r4, "n1", 1, nimbusv1.Phase_PHASE_PROGRAMMED, ""), a.watermarkReport("n1", w))
	if got := metricValues(t, a.srv.Registry())["naples_nimbus_statuses"]; got != 1 {
		t.Fatalf("a keeps %v records, want r4's, which the watermark does not pass", got)
	}
	waitPeerStatus(t, r4, a.statusOf(t, r4), b, c)
	a.report(t, a.watermarkReport("n1", a.revision(t)))
	for _, r := range rs {
		waitPeerCond(t, r.name+" to drop n1's record of r4", func() bool {
			return metricValues(t, r.srv.Registry())["naples_nimbus_statuses"] == 0
		})
		wantStatus(t, r.testServer, r4, 1, 1, 0, "n1")
	}

	// A replica that joins takes the watermark and the exception from a's full state.
	a.report(t, failed, a.watermarkReport("n1", a.revision(t)))
	d := startPeer(t, "d", Options{}, a.clock, func(s *Server) { s.setEpoch("shared-epoch") })
	applyToPeers(t, append(objs, route("r4", []string{"n1"}, "192.0.2.4")), d)
	linkPeers(t, a, b, c, d)
	waitPeerWatermark(t, "n1", a.revision(t), "a", d)
	// d gets the moves a kept of the watermark, and derives the same times.
	for _, key := range []*nimbusv1.ObjectKey{r1, r2, r3, r4} {
		waitPeerStatus(t, key, a.statusOf(t, key), d)
	}
	wantMetrics(t, d.srv, `naples_nimbus_status_watermarks 1`, `naples_nimbus_statuses 1`)
}

// TestPeerWatermarkNodeMoves shows a node that reported its watermark and exceptions to a
// replica that stops, and moves to another: it reports its exceptions and watermark
// again there, and every replica left answers as the node says, its failure's message
// included, with no record of the first replica's left over.
func TestPeerWatermarkNodeMoves(t *testing.T) {
	rs := startWatermarkPeers(t, Options{}, "a", "b", "c")
	a, b, c := rs[0], rs[1], rs[2]
	r1, r2, r3 := routeKey("r1"), routeKey("r2"), routeKey("r3")
	applyToPeers(t, []*nimbusv1.Object{nodeObject("n1"), route("r1", []string{"n1"}, "192.0.2.1"),
		route("r2", []string{"n1"}, "192.0.2.1"), route("r3", []string{"n1"}, "192.0.2.1"), route("all", nil, "192.0.2.1")}, rs...)
	w := a.revision(t)
	ctx := testContext(t)
	recvUntilSynced(t, watchFrom(t, ctx, a.client, "n1", "", 0))
	failed := statusReport(r2, "n1", 1, nimbusv1.Phase_PHASE_FAILED, "kernel says no")
	a.report(t, failed, statusReport(r3, "n1", 1, nimbusv1.Phase_PHASE_FAILED, "not yet"), a.watermarkReport("n1", w))
	waitPeerWatermark(t, "n1", w, "a", rs...)
	for _, key := range []*nimbusv1.ObjectKey{r1, r2, r3} {
		waitPeerStatus(t, key, a.statusOf(t, key), b, c)
	}

	a.stop()
	// n1 moves to b. r3 got programmed meanwhile: it is no exception any more, and the
	// agent does not report it on its new stream.
	a.clock.Advance(time.Second)
	recvUntilSynced(t, watchFrom(t, ctx, b.client, "n1", "", 0))
	b.report(t, failed, b.watermarkReport("n1", w))
	waitPeerWatermark(t, "n1", w, "b", b, c)
	for _, r := range []*testPeer{b, c} {
		wantStatus(t, r.testServer, r1, 1, 1, 0, "n1")
		wantStatus(t, r.testServer, r3, 1, 1, 0, "n1")
		st := wantStatus(t, r.testServer, r2, 1, 0, 1, "n1")
		if msg := st.GetNodes()[0].GetMessage(); msg != "kernel says no" {
			t.Errorf("%s: n1's message of r2 = %q, want the one it reported", r.name, msg)
		}
		if got := r.originOf(r2, "n1"); got != "b" {
			t.Errorf("%s keeps n1's status of r2 from %q, want b", r.name, got)
		}
		wantMetrics(t, r.srv, `naples_nimbus_status_watermarks 1`, `naples_nimbus_statuses 1`)
	}
	for _, key := range []*nimbusv1.ObjectKey{r1, r2, r3, routeKey("all")} {
		waitPeerStatus(t, key, b.statusOf(t, key), c)
	}

	// A frame of a's that was late, with the watermark n1 had there, does not take the
	// node back: b's moved later.
	stream, err := c.client.PeerStatus(ctx)
	if err != nil {
		t.Fatal(err)
	}
	late := &nimbusv1.StatusWatermark{Node: "n1", Epoch: c.srv.Epoch(), Revision: w, UpdateTime: timestamppb.New(a.clock.Now().Add(-time.Second))}
	if err := stream.Send(&nimbusv1.PeerFrame{Replica: "a", Revision: c.revision(t), Watermarks: []*nimbusv1.StatusWatermark{late}}); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.CloseAndRecv(); err != nil {
		t.Fatal(err)
	}
	if rev, origin := c.watermarkOf("n1"); rev != w || origin != "b" {
		t.Errorf("c keeps n1's watermark at %d from %s after a's late one, want %d from b", rev, origin, w)
	}
	wantStatus(t, c.testServer, r2, 1, 0, 1, "n1")
}

// TestPeerForgetsDeletedNode shows that a peer's frame built before a node's Node object
// was deleted, and taken after, does not bring back the node's watermark and records,
// which the deletion forgot; one built after the deletion is taken.
func TestPeerForgetsDeletedNode(t *testing.T) {
	b := startWatermarkPeers(t, Options{}, "b")[0]
	r1 := routeKey("r1")
	applyToPeers(t, []*nimbusv1.Object{nodeObject("n1"), route("r1", []string{"n1"}, "192.0.2.1")}, b)
	built := b.revision(t)
	if _, err := b.client.Delete(testContext(t), &nimbusv1.DeleteRequest{Key: nodeObject("n1").Key()}); err != nil {
		t.Fatal(err)
	}
	// push sends a frame of replica x built at rev, with n1's failure of r1 and its
	// watermark, and returns once b has taken it.
	push := func(rev uint64) {
		t.Helper()
		stream, err := b.client.PeerStatus(testContext(t))
		if err != nil {
			t.Fatal(err)
		}
		wm := &nimbusv1.StatusWatermark{Node: "n1", Epoch: b.srv.Epoch(), Revision: built, UpdateTime: b.clock.Timestamp()}
		if err := stream.Send(&nimbusv1.PeerFrame{Replica: "x", Revision: rev,
			Reports:    []*nimbusv1.StatusReport{peerReport(r1, "n1", 1, nimbusv1.Phase_PHASE_FAILED, b.clock.Now())},
			Watermarks: []*nimbusv1.StatusWatermark{wm}}); err != nil {
			t.Fatal(err)
		}
		if _, err := stream.CloseAndRecv(); err != nil {
			t.Fatal(err)
		}
	}
	push(built)
	wantMetrics(t, b.srv, `naples_nimbus_status_watermarks 0`, `naples_nimbus_statuses 0`)
	push(b.revision(t))
	wantMetrics(t, b.srv, `naples_nimbus_status_watermarks 1`, `naples_nimbus_statuses 1`)
}

// TestPeerWatermarkMovesByRevision shows that a watermark pushed to a peer carries every
// move the peer has not had, whatever the times of the moves: a move's time is taken in
// the write that makes it, before a frame's view may hold it, so a move can be older than
// the view of the frame before it. The peer, replaying the entries onto the record it
// had, then derives the same time for every revision as the replica.
func TestPeerWatermarkMovesByRevision(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	var first *watermarkRecord
	first = first.moved("n1", "e", 3, "a", at(0))
	for _, tc := range []struct {
		name string
		// last is what the peer had; rec what the replica holds now.
		last, rec *watermarkRecord
	}{
		{"two moves in one frame", first, first.moved("n1", "e", 5, "a", at(1)).moved("n1", "e", 7, "a", at(2))},
		{"a move back", first.moved("n1", "e", 5, "a", at(1)), first.moved("n1", "e", 5, "a", at(1)).moved("n1", "e", 4, "a", at(2))},
		{"a new epoch", first, first.moved("n1", "f", 2, "a", at(1)).moved("n1", "f", 6, "a", at(2))},
		{"nothing sent before", nil, first.moved("n1", "e", 5, "a", at(1)).moved("n1", "e", 7, "a", at(2))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var frames []*nimbusv1.PeerFrame
			fb := &peerFrameBuilder{send: func(f *nimbusv1.PeerFrame) error { frames = append(frames, f); return nil },
				frame: &nimbusv1.PeerFrame{}}
			if err := fb.addWatermark(tc.rec, tc.last); err != nil {
				t.Fatal(err)
			}
			if err := fb.flush(false); err != nil {
				t.Fatal(err)
			}
			got := tc.last
			for _, f := range frames {
				for _, wm := range f.GetWatermarks() {
					got = got.moved(wm.GetNode(), wm.GetEpoch(), wm.GetRevision(), "a", wm.GetUpdateTime().AsTime())
				}
			}
			if got.Epoch != tc.rec.Epoch || got.Revision != tc.rec.Revision || !got.UpdateTime.Equal(tc.rec.UpdateTime) {
				t.Fatalf("peer's watermark = %s %d at %v, want %s %d at %v", got.Epoch, got.Revision, got.UpdateTime,
					tc.rec.Epoch, tc.rec.Revision, tc.rec.UpdateTime)
			}
			for rev := uint64(1); rev <= tc.rec.Revision; rev++ {
				if g, w := got.passedAt(rev), tc.rec.passedAt(rev); !g.Equal(w) {
					t.Errorf("peer: passed revision %d at %v, replica at %v", rev, g, w)
				}
			}
		})
	}
}
