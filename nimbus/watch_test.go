package nimbus

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

type watchStream = grpc.ServerStreamingClient[nimbusv1.WatchEvent]

// watch opens a watch for the node that ends with the test.
func watch(t *testing.T, client nimbusv1.NimbusClient, node string) watchStream {
	t.Helper()
	w, err := client.Watch(testContext(t), &nimbusv1.WatchRequest{Node: node})
	if err != nil {
		t.Fatalf("Watch %s: %v", node, err)
	}
	return w
}

// recv receives one event and fails the test on error.
func recv(t *testing.T, w watchStream) *nimbusv1.WatchEvent {
	t.Helper()
	ev, err := w.Recv()
	if err != nil {
		t.Fatalf("Recv: %v", err)
	}
	return ev
}

// recvUntilSynced receives the snapshot and returns its PUT events and the SYNCED event.
func recvUntilSynced(t *testing.T, w watchStream) ([]*nimbusv1.WatchEvent, *nimbusv1.WatchEvent) {
	t.Helper()
	var puts []*nimbusv1.WatchEvent
	for {
		ev := recv(t, w)
		switch ev.GetType() {
		case nimbusv1.WatchEvent_TYPE_SYNCED:
			return puts, ev
		case nimbusv1.WatchEvent_TYPE_PUT:
			if !ev.GetSnapshot() {
				t.Fatalf("snapshot PUT %s without snapshot set", ev.GetKey().ID())
			}
			puts = append(puts, ev)
		default:
			t.Fatalf("unexpected %v in snapshot", ev.GetType())
		}
	}
}

// wantEvent fails the test unless ev is of the type, for the key, at the revision, not part
// of a snapshot and of the server's epoch.
func wantEvent(t *testing.T, ts *testServer, ev *nimbusv1.WatchEvent, typ nimbusv1.WatchEvent_Type, key *nimbusv1.ObjectKey, rev uint64) {
	t.Helper()
	if ev.GetType() != typ || ev.GetKey().ID() != key.ID() || ev.GetRevision() != rev || ev.GetSnapshot() || ev.GetEpoch() != ts.srv.Epoch() {
		t.Fatalf("event = %v %s rev %d snapshot %v epoch %q; want %v %s rev %d epoch %q",
			ev.GetType(), ev.GetKey().ID(), ev.GetRevision(), ev.GetSnapshot(), ev.GetEpoch(),
			typ, key.ID(), rev, ts.srv.Epoch())
	}
	if typ == nimbusv1.WatchEvent_TYPE_PUT && ev.GetObject().GetMeta().GetRevision() != rev {
		t.Fatalf("PUT object revision = %d, want %d", ev.GetObject().GetMeta().GetRevision(), rev)
	}
	if typ == nimbusv1.WatchEvent_TYPE_DELETE && ev.GetObject() != nil {
		t.Fatalf("DELETE carries an object: %v", ev.GetObject())
	}
}

func TestWatchSnapshotThenChanges(t *testing.T) {
	ts := start(t, Options{})
	stored := map[string]*nimbusv1.Object{}
	for _, o := range []*nimbusv1.Object{
		route("to-a", []string{"a"}, "192.0.2.1"),
		route("to-b", []string{"b"}, "192.0.2.1"),
		route("to-all", nil, "192.0.2.1"),
		route("to-a-and-b", []string{"a", "b"}, "192.0.2.1"),
		nodeObject("a"),
	} {
		stored[o.Key().ID()] = ts.apply(t, o).GetObject()
	}

	w := watch(t, ts.client, "a")
	puts, synced := recvUntilSynced(t, w)
	var got []string
	for _, ev := range puts {
		id := ev.GetKey().ID()
		got = append(got, id)
		if !proto.Equal(ev.GetObject(), stored[id]) {
			t.Errorf("snapshot object %s = %v, want %v", id, ev.GetObject(), stored[id])
		}
		if ev.GetRevision() != stored[id].GetMeta().GetRevision() || ev.GetEpoch() != ts.srv.Epoch() {
			t.Errorf("snapshot event %s at revision %d epoch %q, want %d %q", id, ev.GetRevision(), ev.GetEpoch(), stored[id].GetMeta().GetRevision(), ts.srv.Epoch())
		}
	}
	want := []string{"Node/default/default/a", "Route/default/default/to-a", "Route/default/default/to-a-and-b", "Route/default/default/to-all"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("snapshot = %q, want %q", got, want)
	}
	if synced.GetRevision() != 5 || synced.GetEpoch() != ts.srv.Epoch() || synced.GetSnapshot() {
		t.Errorf("SYNCED at revision %d epoch %q snapshot %v, want revision 5 epoch %q", synced.GetRevision(), synced.GetEpoch(), synced.GetSnapshot(), ts.srv.Epoch())
	}

	// A change for another node only is not sent; the next event is the next change for a.
	ts.apply(t, route("to-b", []string{"b"}, "192.0.2.9"))
	put := ts.apply(t, route("to-a", []string{"a"}, "192.0.2.2")).GetObject()
	ev := recv(t, w)
	wantEvent(t, ts, ev, nimbusv1.WatchEvent_TYPE_PUT, routeKey("to-a"), put.GetMeta().GetRevision())
	if !proto.Equal(ev.GetObject(), put) {
		t.Errorf("PUT object = %v, want %v", ev.GetObject(), put)
	}

	del, err := ts.client.Delete(testContext(t), &nimbusv1.DeleteRequest{Key: routeKey("to-all")})
	if err != nil {
		t.Fatal(err)
	}
	wantEvent(t, ts, recv(t, w), nimbusv1.WatchEvent_TYPE_DELETE, routeKey("to-all"), del.GetRevision())

	created := ts.apply(t, route("new-for-all", nil, "192.0.2.1")).GetObject()
	wantEvent(t, ts, recv(t, w), nimbusv1.WatchEvent_TYPE_PUT, routeKey("new-for-all"), created.GetMeta().GetRevision())
}

func TestWatchRetarget(t *testing.T) {
	ts := start(t, Options{})
	wa := watch(t, ts.client, "a")
	wb := watch(t, ts.client, "b")
	recvUntilSynced(t, wa)
	recvUntilSynced(t, wb)

	first := ts.apply(t, route("r1", []string{"a"}, "192.0.2.1")).GetObject()
	wantEvent(t, ts, recv(t, wa), nimbusv1.WatchEvent_TYPE_PUT, routeKey("r1"), first.GetMeta().GetRevision())

	moved := ts.apply(t, route("r1", []string{"b"}, "192.0.2.1")).GetObject()
	wantEvent(t, ts, recv(t, wa), nimbusv1.WatchEvent_TYPE_DELETE, routeKey("r1"), moved.GetMeta().GetRevision())
	// b's first event is the retarget: it never heard of r1 while it targeted a.
	ev := recv(t, wb)
	wantEvent(t, ts, ev, nimbusv1.WatchEvent_TYPE_PUT, routeKey("r1"), moved.GetMeta().GetRevision())
	if got := ev.GetObject().GetMeta().GetGeneration(); got != 2 {
		t.Errorf("retargeted generation = %d, want 2", got)
	}

	// An object for both is sent to both, identically.
	both := ts.apply(t, route("r2", nil, "192.0.2.1")).GetObject()
	ea, eb := recv(t, wa), recv(t, wb)
	wantEvent(t, ts, ea, nimbusv1.WatchEvent_TYPE_PUT, routeKey("r2"), both.GetMeta().GetRevision())
	if !proto.Equal(ea, eb) {
		t.Errorf("watchers got different events for one change: %v and %v", ea, eb)
	}
}

func TestWatchRefusesBadNode(t *testing.T) {
	ts := start(t, Options{})
	for _, tc := range []struct{ node, want string }{
		{node: "", want: `node "": is required`},
		{node: "Node_A", want: `node "Node_A": must be lower-case`},
	} {
		t.Run(tc.want, func(t *testing.T) {
			w, err := ts.client.Watch(testContext(t), &nimbusv1.WatchRequest{Node: tc.node})
			if err == nil {
				_, err = w.Recv()
			}
			if st := wantCode(t, err, codes.InvalidArgument); !strings.Contains(st.Message(), tc.want) {
				t.Errorf("message = %q, want it to contain %q", st.Message(), tc.want)
			}
		})
	}
}

func TestWatchBookmarks(t *testing.T) {
	ts := start(t, Options{BookmarkInterval: 20 * time.Millisecond})
	w := watch(t, ts.client, "a")
	recvUntilSynced(t, w)
	// A change that is not for a still moves the revision bookmarks carry.
	rev := ts.apply(t, route("r1", []string{"b"}, "192.0.2.1")).GetObject().GetMeta().GetRevision()
	for {
		ev := recv(t, w)
		if ev.GetType() != nimbusv1.WatchEvent_TYPE_BOOKMARK {
			t.Fatalf("idle watch got %v, want only bookmarks", ev.GetType())
		}
		if ev.GetEpoch() != ts.srv.Epoch() {
			t.Fatalf("bookmark epoch = %q, want %q", ev.GetEpoch(), ts.srv.Epoch())
		}
		if ev.GetRevision() == rev {
			return
		}
		if ev.GetRevision() > rev {
			t.Fatalf("bookmark revision = %d, beyond the current revision %d", ev.GetRevision(), rev)
		}
	}
}

// TestSlowWatcherIsReset fills the buffer of a watcher that does not read while another
// watcher reads every event.
func TestSlowWatcherIsReset(t *testing.T) {
	const (
		buffer  = 8
		applies = 300
	)
	ts := start(t, Options{WatchBuffer: buffer, BookmarkInterval: -1})
	// A fixed 64 KiB flow-control window, so the slow watcher's transport stops taking
	// events after a known amount: 300 events of over 2 KiB are far more than that.
	slow := watch(t, dial(t, ts.path, grpc.WithStaticStreamWindowSize(64<<10)), "a")
	recvUntilSynced(t, slow)
	fast := watch(t, ts.client, "a")
	recvUntilSynced(t, fast)

	pad := strings.Repeat("x", 2048)
	for i := range applies {
		o := route(fmt.Sprintf("r%d", i), nil, "192.0.2.1")
		o.Meta.Labels = map[string]string{"pad": pad}
		rev := ts.apply(t, o).GetObject().GetMeta().GetRevision()
		wantEvent(t, ts, recv(t, fast), nimbusv1.WatchEvent_TYPE_PUT, o.Key(), rev)
	}
	if got := ts.srv.WatcherResets(); got != 1 {
		t.Fatalf("WatcherResets = %d, want 1", got)
	}

	// The slow watcher gets what was already under way, in order, then the reset.
	var next uint64 = 1
	for {
		ev, err := slow.Recv()
		if err != nil {
			st := wantCode(t, err, codes.ResourceExhausted)
			if !strings.Contains(st.Message(), "fell behind") || !strings.Contains(st.Message(), "watch again") {
				t.Errorf("reset message = %q, want it to say the watcher fell behind and must watch again", st.Message())
			}
			break
		}
		if ev.GetRevision() != next {
			t.Fatalf("slow watcher got revision %d, want %d", ev.GetRevision(), next)
		}
		next++
	}
	t.Logf("slow watcher got %d events before its reset", next-1)
	if next > applies-buffer {
		t.Errorf("slow watcher got %d events before its reset, want it reset well before the last", next-1)
	}
	// A new watch starts over with a complete snapshot.
	again := watch(t, ts.client, "a")
	puts, synced := recvUntilSynced(t, again)
	if len(puts) != applies || synced.GetRevision() != applies {
		t.Errorf("resubscribed snapshot = %d objects at revision %d, want %d at %d", len(puts), synced.GetRevision(), applies, applies)
	}
}
