package nimbus

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// watchFrom opens a watch for the node that asks to resume after the revision of the
// epoch; it ends with ctx.
func watchFrom(t *testing.T, ctx context.Context, client nimbusv1.NimbusClient, node, epoch string, rev uint64) watchStream {
	t.Helper()
	w, err := client.Watch(ctx, &nimbusv1.WatchRequest{Node: node, Epoch: epoch, Revision: rev})
	if err != nil {
		t.Fatalf("Watch %s from %s/%d: %v", node, epoch, rev, err)
	}
	return &eventStream{frames: w}
}

// wantResumed fails the test unless the watch's first event is RESUMED at the revision of
// the server's epoch.
func wantResumed(t *testing.T, ts *testServer, w watchStream, rev uint64) {
	t.Helper()
	ev := recv(t, w)
	if ev.GetType() != nimbusv1.WatchEvent_TYPE_RESUMED || ev.GetRevision() != rev || ev.GetEpoch() != ts.srv.Epoch() {
		t.Fatalf("first event = %v at revision %d epoch %q, want RESUMED at %d epoch %q",
			ev.GetType(), ev.GetRevision(), ev.GetEpoch(), rev, ts.srv.Epoch())
	}
}

// wantedEvent is an event a test expects, in order.
type wantedEvent struct {
	typ nimbusv1.WatchEvent_Type
	key *nimbusv1.ObjectKey
	rev uint64
}

// wantLiveNext applies a change for every node and fails the test unless it is the next
// event on the watch, which shows that nothing else was queued before it.
func wantLiveNext(t *testing.T, ts *testServer, w watchStream, name string) {
	t.Helper()
	o := ts.apply(t, route(name, nil, "192.0.2.77")).GetObject()
	wantEvent(t, ts, recv(t, w), nimbusv1.WatchEvent_TYPE_PUT, o.Key(), o.GetMeta().GetRevision())
}

func TestWatchResumesWithinWindow(t *testing.T) {
	ts := start(t, Options{})
	ts.apply(t, route("for-a", []string{"a"}, "192.0.2.1"))
	ts.apply(t, route("for-all", nil, "192.0.2.1"))
	ts.apply(t, route("moving", []string{"a"}, "192.0.2.1"))
	ts.apply(t, route("for-b", []string{"b"}, "192.0.2.1"))

	ctx, cancel := context.WithCancel(testContext(t))
	w := watchFrom(t, ctx, ts.client, "a", "", 0)
	puts, synced := recvUntilSynced(t, w)
	if len(puts) != 3 || synced.GetRevision() != 4 {
		t.Fatalf("snapshot = %d objects at revision %d, want 3 at 4", len(puts), synced.GetRevision())
	}
	last := ts.apply(t, route("for-a", []string{"a"}, "192.0.2.2")).GetObject().GetMeta().GetRevision()
	wantEvent(t, ts, recv(t, w), nimbusv1.WatchEvent_TYPE_PUT, routeKey("for-a"), last)
	epoch := ts.srv.Epoch()
	cancel()

	// While a is away: changes for it, a delete, a retarget away from it, and changes
	// that do not concern it.
	var want []wantedEvent
	put := func(o *nimbusv1.Object, forA bool) {
		rev := ts.apply(t, o).GetObject().GetMeta().GetRevision()
		if forA {
			want = append(want, wantedEvent{nimbusv1.WatchEvent_TYPE_PUT, o.Key(), rev})
		}
	}
	del := func(name string, forA bool) {
		resp, err := ts.client.Delete(testContext(t), &nimbusv1.DeleteRequest{Key: routeKey(name)})
		if err != nil || !resp.GetFound() {
			t.Fatalf("Delete %s = %v, %v", name, resp, err)
		}
		if forA {
			want = append(want, wantedEvent{nimbusv1.WatchEvent_TYPE_DELETE, routeKey(name), resp.GetRevision()})
		}
	}
	put(route("for-a", []string{"a"}, "192.0.2.3"), true)
	put(route("for-b", []string{"b"}, "192.0.2.3"), false)
	del("for-all", true)
	rev := ts.apply(t, route("moving", []string{"b"}, "192.0.2.1")).GetObject().GetMeta().GetRevision()
	want = append(want, wantedEvent{nimbusv1.WatchEvent_TYPE_DELETE, routeKey("moving"), rev})
	put(route("new-for-all", nil, "192.0.2.1"), true)
	put(route("new-for-b", []string{"b"}, "192.0.2.1"), false)
	del("for-b", false)
	put(route("moved-back", []string{"c"}, "192.0.2.1"), false)
	put(route("moved-back", []string{"a", "c"}, "192.0.2.1"), true)

	if len(want) != 5 {
		t.Fatalf("%d changes concern a, want 5", len(want))
	}

	again := watchFrom(t, testContext(t), ts.client, "a", epoch, last)
	wantResumed(t, ts, again, last)
	for _, we := range want {
		wantEvent(t, ts, recv(t, again), we.typ, we.key, we.rev)
	}
	// The next event is a live change: nothing else was replayed.
	wantLiveNext(t, ts, again, "live")
}

func TestWatchSnapshotWhenResumeImpossible(t *testing.T) {
	ts := start(t, Options{HistoryWindow: 2})
	for i := range 5 {
		ts.apply(t, route(fmt.Sprintf("r%d", i), []string{"a"}, "192.0.2.1"))
	}
	// Only the changes of revisions 4 and 5 are kept.
	for _, tc := range []struct {
		name   string
		epoch  string
		rev    uint64
		resume bool
	}{
		{name: "no epoch", epoch: "", rev: 5},
		{name: "other epoch", epoch: "0123456789abcdef0123456789abcdef", rev: 5},
		{name: "revision too old", epoch: ts.srv.Epoch(), rev: 2},
		{name: "revision ahead", epoch: ts.srv.Epoch(), rev: 6},
		{name: "oldest kept", epoch: ts.srv.Epoch(), rev: 3, resume: true},
		{name: "current", epoch: ts.srv.Epoch(), rev: 5, resume: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := watchFrom(t, testContext(t), ts.client, "a", tc.epoch, tc.rev)
			if !tc.resume {
				puts, synced := recvUntilSynced(t, w)
				if len(puts) != 5 || synced.GetRevision() != 5 || synced.GetEpoch() != ts.srv.Epoch() {
					t.Fatalf("snapshot = %d objects, SYNCED at %d epoch %q; want 5 at 5 epoch %q",
						len(puts), synced.GetRevision(), synced.GetEpoch(), ts.srv.Epoch())
				}
				return
			}
			wantResumed(t, ts, w, tc.rev)
			for rev := tc.rev + 1; rev <= 5; rev++ {
				wantEvent(t, ts, recv(t, w), nimbusv1.WatchEvent_TYPE_PUT, routeKey(fmt.Sprintf("r%d", rev-1)), rev)
			}
		})
	}
}

// TestStoppedWatcherIsResetAndResumes stands for a client stopped with SIGSTOP: its
// transport stops taking events, its buffer fills and it is reset while it reads nothing.
// The reset releases what it had queued and takes no more; once the client reads again
// it gets what was already on the wire, then ResourceExhausted, and resumes after the
// last revision it got.
func TestStoppedWatcherIsResetAndResumes(t *testing.T) {
	const buffer = 8
	ts := start(t, Options{WatchBuffer: buffer, BookmarkInterval: -1})
	stopped := watch(t, dial(t, ts.path, grpc.WithStaticStreamWindowSize(64<<10)), "a")
	recvUntilSynced(t, stopped)
	ts.srv.mu.Lock()
	var w *watcher
	for w = range ts.srv.watchers {
	}
	ts.srv.mu.Unlock()

	pad := strings.Repeat("x", 2048)
	padded := func(name string) *nimbusv1.Object {
		o := route(name, nil, "192.0.2.1")
		o.Meta.Labels = map[string]string{"pad": pad}
		return o
	}
	applied := 0
	for ts.srv.WatcherResets() == 0 {
		if applied == 1000 {
			t.Fatal("watcher not reset after 1000 changes")
		}
		ts.apply(t, padded(fmt.Sprintf("r%d", applied)))
		applied++
	}
	if n := w.queued(); n != 0 {
		t.Errorf("reset watcher still holds %d queued events", n)
	}
	wantMetrics(t, ts.srv, "naples_nimbus_watchers 0", "naples_nimbus_watcher_resets_total 1")

	// More changes while the client is still stopped, a delete among them; none is
	// queued for the reset watcher.
	for i := range 20 {
		ts.apply(t, padded(fmt.Sprintf("late%d", i)))
	}
	if _, err := ts.client.Delete(testContext(t), &nimbusv1.DeleteRequest{Key: routeKey("r0")}); err != nil {
		t.Fatal(err)
	}
	if n := w.queued(); n != 0 {
		t.Errorf("reset watcher queued %d events after its reset", n)
	}
	current := uint64(applied + 21)

	// The client reads again: what was under way, in order, then the reset.
	var last uint64
	for {
		ev, err := stopped.Recv()
		if err != nil {
			wantCode(t, err, codes.ResourceExhausted)
			break
		}
		if ev.GetRevision() != last+1 {
			t.Fatalf("stopped watcher got revision %d after %d", ev.GetRevision(), last)
		}
		last = ev.GetRevision()
	}
	t.Logf("stopped watcher got %d of %d changes before its reset", last, current)
	if last >= uint64(applied) {
		t.Fatalf("stopped watcher got revision %d, want fewer than the %d applied before its reset", last, applied)
	}

	again := watchFrom(t, testContext(t), ts.client, "a", ts.srv.Epoch(), last)
	wantResumed(t, ts, again, last)
	for rev := last + 1; rev <= current; rev++ {
		ev := recv(t, again)
		if ev.GetRevision() != rev || ev.GetType() == nimbusv1.WatchEvent_TYPE_SYNCED {
			t.Fatalf("resumed watch got %v at revision %d, want a change at %d", ev.GetType(), ev.GetRevision(), rev)
		}
		if rev == current && ev.GetType() != nimbusv1.WatchEvent_TYPE_DELETE {
			t.Fatalf("last replayed event = %v, want the DELETE of r0", ev.GetType())
		}
	}
	wantLiveNext(t, ts, again, "live")
}

// TestWatchResumesInsideBatch resumes after revisions in the middle of one batch's
// changes and of the frame that carried them, where a client that stored part of a frame
// stands: the watch gets exactly the changes after that revision that concern the node,
// the rest of the batch first, then the live ones.
func TestWatchResumesInsideBatch(t *testing.T) {
	ts := start(t, Options{BookmarkInterval: -1})
	w := watch(t, ts.client, "a")
	recvUntilSynced(t, w)

	// One batch: objects for every node, objects for b only (nothing for a), and one that
	// moves away from a (a DELETE for a).
	ts.apply(t, route("leaving", []string{"a"}, "192.0.2.1"))
	wantEvent(t, ts, recv(t, w), nimbusv1.WatchEvent_TYPE_PUT, routeKey("leaving"), 1)
	var objs []*nimbusv1.Object
	forA := map[string]bool{}
	for i := range 300 {
		name := fmt.Sprintf("r%03d", i)
		var nodes []string
		if i%3 == 0 {
			nodes = []string{"b"}
		} else {
			forA[name] = true
		}
		objs = append(objs, padded(name, 200))
		objs[i].Meta.Nodes = nodes
	}
	objs = append(objs, route("leaving", []string{"b"}, "192.0.2.1"))
	resp := applyBatch(t, ts, objs)
	last := resp.GetRevision()
	if last != 302 {
		t.Fatalf("batch ends at revision %d, want 302", last)
	}

	// The events for a, and the frames they came in.
	framesBefore := len(w.received)
	var got []*nimbusv1.WatchEvent
	for len(got) < len(forA)+1 {
		got = append(got, recv(t, w))
	}
	if ev := got[len(got)-1]; ev.GetType() != nimbusv1.WatchEvent_TYPE_DELETE || ev.GetRevision() != last {
		t.Fatalf("last event of the batch = %v at %d, want the DELETE of leaving at %d", ev.GetType(), ev.GetRevision(), last)
	}
	// A revision in the middle of a frame of the batch.
	var midFrame uint64
	for _, f := range w.received[framesBefore:] {
		if evs := f.GetEvents(); len(evs) >= 3 {
			midFrame = evs[len(evs)/2].GetRevision()
			break
		}
	}
	if midFrame == 0 {
		t.Fatalf("no frame of the batch held 3 events or more")
	}

	for i, tc := range []struct {
		name string
		rev  uint64
	}{
		{"in the middle of a frame", midFrame},
		{"at a change that does not concern the node", 2 + 3*40},
		{"at the batch's first change", 2},
		{"at the batch's last change but one", last - 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			again := watchFrom(t, testContext(t), ts.client, "a", ts.srv.Epoch(), tc.rev)
			wantResumed(t, ts, again, tc.rev)
			for _, ev := range got {
				if ev.GetRevision() > tc.rev {
					wantEvent(t, ts, recv(t, again), ev.GetType(), ev.ObjectKey(), ev.GetRevision())
				}
			}
			wantLiveNext(t, ts, again, fmt.Sprintf("live-%d", i))
			// The first watch sees the live change too; later resumes expect it.
			got = append(got, recv(t, w))
		})
	}
}
