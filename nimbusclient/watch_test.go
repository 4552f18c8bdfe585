package nimbusclient

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/naplesnet/naples/delphi"
	"github.com/naplesnet/naples/nimbus"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// changeLog is what a test published, revision by revision, from which it tells what a
// node should hold at any revision.
type changeLog struct {
	// changes maps a revision to the name of the route it changed and whether the route
	// was meant for the node afterwards.
	changes map[uint64]logEntry
}

type logEntry struct {
	name string
	// obj is the route as stored by the change when it targets the node; nil when the
	// change deleted it or moved it away from the node.
	obj *nimbusv1.Object
}

// objectsAt returns the routes the node should hold at revision rev, by name.
func (l *changeLog) objectsAt(rev uint64) map[string]*nimbusv1.Object {
	state := map[string]*nimbusv1.Object{}
	for _, r := range slices.Sorted(maps.Keys(l.changes)) {
		if r > rev {
			break
		}
		if e := l.changes[r]; e.obj != nil {
			state[e.name] = e.obj
		} else {
			delete(state, e.name)
		}
	}
	return state
}

// stateAt returns the routes the node should hold at revision rev, by name, with their
// revisions.
func (l *changeLog) stateAt(rev uint64) map[string]uint64 {
	state := map[string]uint64{}
	for name, o := range l.objectsAt(rev) {
		state[name] = o.GetMeta().GetRevision()
	}
	return state
}

// applyBatch applies the objects in one ApplyBatch and logs the changes for node.
func (l *changeLog) applyBatch(t *testing.T, b *bus, node string, objs []*nimbusv1.Object) uint64 {
	t.Helper()
	resp, err := b.api.ApplyBatch(context.Background(), &nimbusv1.ApplyBatchRequest{Objects: objs})
	if err != nil {
		t.Fatalf("ApplyBatch of %d objects: %v", len(objs), err)
	}
	for _, r := range resp.GetResults() {
		if !r.GetChanged() {
			continue
		}
		o := r.GetObject()
		e := logEntry{name: o.GetMeta().GetName()}
		if o.TargetsNode(node) {
			e.obj = o
		}
		l.changes[o.GetMeta().GetRevision()] = e
	}
	return resp.GetRevision()
}

// deleteBatch deletes the routes in one DeleteBatch and logs the deletions.
func (l *changeLog) deleteBatch(t *testing.T, b *bus, names []string) uint64 {
	t.Helper()
	var keys []*nimbusv1.ObjectKey
	for _, n := range names {
		keys = append(keys, routeKey(n))
	}
	resp, err := b.api.DeleteBatch(context.Background(), &nimbusv1.DeleteBatchRequest{Keys: keys})
	if err != nil {
		t.Fatalf("DeleteBatch of %d keys: %v", len(keys), err)
	}
	for i, r := range resp.GetResults() {
		if r.GetFound() {
			l.changes[r.GetRevision()] = logEntry{name: names[i]}
		}
	}
	return resp.GetRevision()
}

// routes returns n routes named prefix-NNNN whose gateway is 10.0.N.1, for nodes.
func routes(prefix string, n, gateway int, nodes ...string) []*nimbusv1.Object {
	var objs []*nimbusv1.Object
	for i := range n {
		objs = append(objs, &nimbusv1.Object{
			Meta: &nimbusv1.ObjectMeta{Name: fmt.Sprintf("%s-%04d", prefix, i), Nodes: nodes},
			Spec: &nimbusv1.Object_Route{Route: &nimbusv1.RouteSpec{
				Table: 100, Prefix: fmt.Sprintf("10.%d.%d.0/24", 100+i/256, i%256),
				Nexthops: []*nimbusv1.NextHop{{Gateway: fmt.Sprintf("10.0.%d.1", gateway)}},
			}},
		})
	}
	return objs
}

// recordingWriter is delphi's desired writer with what each commit left recorded, and
// a commit that fails on demand.
type recordingWriter struct {
	desiredWriter
	store *delphi.Store
	// calls counts the calls of Commit, as soon as they are made.
	calls atomic.Int64

	mu sync.Mutex
	// commits are the resume revision and the routes, by name with their revisions, after
	// each commit.
	commits []committed
	// failFrom, when above zero, makes the first commit that finds delphi at that
	// revision or later fail, once.
	failFrom uint64
	// failedAt is the resume revision when a commit failed; 0 while none has.
	failedAt uint64
}

type committed struct {
	rev    uint64
	routes map[string]uint64
}

var errInjected = errors.New("injected commit failure")

func (r *recordingWriter) Commit(txn *delphi.DesiredTxn) error {
	r.calls.Add(1)
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, at := r.store.Resume(); r.failFrom > 0 && at >= r.failFrom {
		r.failFrom, r.failedAt = 0, at
		return errInjected
	}
	if err := r.desiredWriter.Commit(txn); err != nil {
		return err
	}
	_, rev := r.store.Resume()
	routes := map[string]uint64{}
	for _, o := range r.store.List(nimbusv1.Kind_KIND_ROUTE) {
		routes[o.GetMeta().GetName()] = o.GetMeta().GetRevision()
	}
	r.commits = append(r.commits, committed{rev: rev, routes: routes})
	return nil
}

// recorded returns the commits recorded so far.
func (r *recordingWriter) recorded() []committed {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.commits)
}

// wantPrefixes fails the test unless every commit left delphi holding exactly what the
// node should hold at the commit's resume revision, and the revisions never go back.
func wantPrefixes(t *testing.T, log *changeLog, commits []committed) {
	t.Helper()
	var last uint64
	for i, c := range commits {
		if c.rev < last {
			t.Errorf("commit %d goes back from revision %d to %d", i, last, c.rev)
		}
		last = c.rev
		if want := log.stateAt(c.rev); !maps.Equal(c.routes, want) {
			t.Errorf("commit %d at revision %d left %d routes that are not the state at that revision (%d routes)",
				i, c.rev, len(c.routes), len(want))
		}
	}
}

// startRecordedClient runs a client for node "a" whose commits are recorded, with
// commits of at most commitEvents changes.
func startRecordedClient(t *testing.T, b *bus, commitEvents int) (*delphi.Store, *Client, *recordingWriter) {
	t.Helper()
	store, c := newClient(t, "a", "unix://"+b.path)
	rec := &recordingWriter{desiredWriter: c.desired, store: store}
	c.desired = rec
	c.commitEvents = commitEvents
	runClient(t, c)
	return store, c, rec
}

// waitRevision waits until delphi's resume point is rev.
func waitRevision(t *testing.T, store *delphi.Store, rev uint64) {
	t.Helper()
	waitFor(t, fmt.Sprintf("delphi to reach revision %d", rev), func() bool {
		_, at := store.Resume()
		return at == rev
	})
}

// TestWatchCallsBurst checks that the client calls Options.Burst as it receives the
// frames of a bulk apply, and not for a change that comes alone.
func TestWatchCallsBurst(t *testing.T) {
	b, _ := newServedBus(t, nimbus.Options{BookmarkInterval: -1})
	log := &changeLog{changes: map[uint64]logEntry{}}
	store, c := newClient(t, "a", "unix://"+b.path)
	var bursts atomic.Int32
	c.opts.Burst = func() { bursts.Add(1) }
	runClient(t, c)
	<-store.Synced()

	rev := log.applyBatch(t, b, "a", routes("one", 1, 1))
	waitRevision(t, store, rev)
	if n := bursts.Load(); n != 0 {
		t.Fatalf("Burst called %d times for one change; want none", n)
	}
	rev = log.applyBatch(t, b, "a", routes("bulk", 1000, 1))
	waitRevision(t, store, rev)
	if n := bursts.Load(); n == 0 {
		t.Fatal("Burst not called for a bulk apply of 1000 routes")
	}
	called := bursts.Load()
	rev = log.applyBatch(t, b, "a", routes("one", 1, 2))
	waitRevision(t, store, rev)
	if n := bursts.Load(); n != called {
		t.Errorf("Burst called %d times more for one change after the bulk apply; want none", n-called)
	}
}

// TestGroupCommit publishes a snapshot and thousands of changes in batches: the client
// commits them to delphi in far fewer commits than events, and every commit leaves delphi
// exactly as nimbus was at the commit's resume revision. While the last batches are
// published, delphi's commits are held up, so that the client gathers several batches
// into a commit: deletions and the same objects created again, moved away and not meant
// for the node at all.
func TestGroupCommit(t *testing.T) {
	b, _ := newServedBus(t, nimbus.Options{BookmarkInterval: -1})
	log := &changeLog{changes: map[uint64]logEntry{}}
	log.applyBatch(t, b, "a", routes("snap", 500, 1))
	store, c, rec := startRecordedClient(t, b, maxCommitEvents)
	<-store.Synced()

	log.applyBatch(t, b, "a", routes("r", 1000, 1))
	mid := log.applyBatch(t, b, "a", routes("r", 1000, 2))
	waitRevision(t, store, mid)

	// Hold commits up: the client's next commit, of one change, waits, and everything
	// published meanwhile is received and waits for the commit after.
	rec.mu.Lock()
	unlocked := false
	defer func() {
		if !unlocked {
			rec.mu.Unlock()
		}
	}()
	held := len(rec.commits)
	calls := rec.calls.Load()
	log.applyBatch(t, b, "a", routes("first", 1, 1))
	waitFor(t, "the client to commit the first change", func() bool { return rec.calls.Load() > calls })
	var gone []string
	for i := 0; i < 1000; i += 3 {
		gone = append(gone, fmt.Sprintf("r-%04d", i))
	}
	log.deleteBatch(t, b, gone)
	// Back for a, and away from it (its DELETE), and not for it at all.
	log.applyBatch(t, b, "a", routes("r", 500, 3))
	// The last change that concerns a, and changes that do not.
	last := log.applyBatch(t, b, "a", routes("snap", 200, 1, "b"))
	log.applyBatch(t, b, "a", routes("other", 300, 1, "b"))
	waitFor(t, "the client to receive the last batch", func() bool {
		return c.EventsReceived() == 500+1+2000+1+334+500+200
	})
	rec.mu.Unlock()
	unlocked = true
	waitRevision(t, store, last)

	commits := rec.recorded()
	// The commit of the first change, then everything received meanwhile.
	n := 0
	for _, c := range commits[held:] {
		n++
		if c.rev == last {
			break
		}
	}
	if n != 2 {
		t.Errorf("the batches published while commits were held went into %d commits, want 1", n-1)
	}
	wantPrefixes(t, log, commits)
	if got, want := commits[len(commits)-1].routes, log.stateAt(last); !maps.Equal(got, want) {
		t.Fatalf("delphi holds %d routes, want the %d nimbus targets at a", len(got), len(want))
	}
	events := c.EventsReceived()
	t.Logf("%d events stored in %d commits", events, len(commits))
	if len(commits) > int(events)/4 {
		t.Errorf("%d events stored in %d commits, want at most a commit per 4 events", events, len(commits))
	}
}

// TestResumeInsideFrame fails a commit of a client whose commits take at most 37 changes,
// fewer than a frame carries (a hundred or so), so that what it stored most likely ends
// inside a frame: the client watches again, resumes after what it stored rather than
// taking a snapshot, and every commit is a prefix of nimbus's history.
func TestResumeInsideFrame(t *testing.T) {
	b, srv := newServedBus(t, nimbus.Options{BookmarkInterval: -1})
	log := &changeLog{changes: map[uint64]logEntry{}}
	store, _, rec := startRecordedClient(t, b, 37)
	<-store.Synced()
	snapshots := nimbusMetric(t, srv, metricSnapshots)

	rec.mu.Lock()
	rec.failFrom = 500
	rec.mu.Unlock()
	log.applyBatch(t, b, "a", routes("r", 1000, 1))
	last := log.applyBatch(t, b, "a", routes("r", 1000, 2))
	waitRevision(t, store, last)

	rec.mu.Lock()
	failedAt := rec.failedAt
	rec.mu.Unlock()
	if failedAt == 0 || failedAt >= last {
		t.Fatalf("the failing commit found delphi at revision %d, want one within the batches, before %d", failedAt, last)
	}
	t.Logf("the commit after revision %d failed", failedAt)
	if got := nimbusMetric(t, srv, metricResumes); got != 1 {
		t.Errorf("%d watches resumed, want 1", got)
	}
	if got := nimbusMetric(t, srv, metricSnapshots); got != snapshots {
		t.Errorf("%d more watches took a snapshot, want none", got-snapshots)
	}
	commits := rec.recorded()
	wantPrefixes(t, log, commits)
	if got, want := commits[len(commits)-1].routes, log.stateAt(last); !maps.Equal(got, want) {
		t.Fatalf("delphi holds %d routes, want the %d nimbus targets at a", len(got), len(want))
	}
}

// TestResumeFromStoredPartOfBatch starts a client on a state file that holds part of a
// batch, as a client killed after storing part of a frame leaves it: the client resumes
// after the stored revision, receives exactly the rest of the batch, and ends with
// nimbus's state.
func TestResumeFromStoredPartOfBatch(t *testing.T) {
	b, srv := newServedBus(t, nimbus.Options{BookmarkInterval: -1})
	log := &changeLog{changes: map[uint64]logEntry{}}
	log.applyBatch(t, b, "a", routes("r", 300, 1))
	last := log.applyBatch(t, b, "a", routes("r", 300, 2))

	// The state as of the middle of the second batch, as nimbus stored it.
	const stored = 300 + 123
	dir := t.TempDir()
	store, err := delphi.Open(delphi.Options{Dir: dir, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	w, err := store.ClaimDesired()
	if err != nil {
		t.Fatal(err)
	}
	txn := &delphi.DesiredTxn{}
	for _, o := range log.objectsAt(stored) {
		txn.Put(o)
	}
	txn.SetResume(srv.Epoch(), stored)
	if err := w.Commit(txn); err != nil {
		t.Fatal(err)
	}
	store.Close()

	store, err = delphi.Open(delphi.Options{Dir: dir, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	c, err := New(Options{Node: "a", Address: "unix://" + b.path, Store: store, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	runClient(t, c)
	waitRevision(t, store, last)
	if got := c.EventsReceived(); got != 1+last-stored {
		t.Errorf("the client received %d events, want RESUMED and the %d changes after revision %d", got, last-stored, stored)
	}
	if got := nimbusMetric(t, srv, metricResumes); got != 1 {
		t.Errorf("%d watches resumed, want 1", got)
	}
	got := map[string]uint64{}
	for _, o := range store.List(nimbusv1.Kind_KIND_ROUTE) {
		got[o.GetMeta().GetName()] = o.GetMeta().GetRevision()
		if gw := o.GetRoute().GetNexthops()[0].GetGateway(); gw != "10.0.2.1" {
			t.Errorf("%s has gateway %s, want the second batch's 10.0.2.1", o.GetMeta().GetName(), gw)
		}
	}
	if !maps.Equal(got, log.stateAt(last)) {
		t.Errorf("delphi holds %d routes, not nimbus's state at revision %d", len(got), last)
	}
}
