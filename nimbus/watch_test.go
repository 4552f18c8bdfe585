package nimbus

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// watchStream reads a watch's frames as the stream of events they carry, and records the
// frames.
type watchStream = *eventStream

type eventStream struct {
	frames grpc.ServerStreamingClient[nimbusv1.WatchFrame]
	// unread are the events of the last frame not yet returned by Recv.
	unread []*nimbusv1.WatchEvent
	// received are the frames received so far, in order.
	received []*nimbusv1.WatchFrame
}

// Recv returns the next event, receiving the next frame when every event of the last one
// has been returned. An empty frame is an error: the server never sends one.
func (s *eventStream) Recv() (*nimbusv1.WatchEvent, error) {
	if len(s.unread) == 0 {
		f, err := s.frames.Recv()
		if err != nil {
			return nil, err
		}
		if len(f.GetEvents()) == 0 {
			return nil, fmt.Errorf("received an empty frame")
		}
		s.received = append(s.received, f)
		s.unread = f.GetEvents()
	}
	ev := s.unread[0]
	s.unread = s.unread[1:]
	return ev, nil
}

// watch opens a watch for the node that ends with the test.
func watch(t *testing.T, client nimbusv1.NimbusClient, node string) watchStream {
	t.Helper()
	w, err := client.Watch(testContext(t), &nimbusv1.WatchRequest{Node: node})
	if err != nil {
		t.Fatalf("Watch %s: %v", node, err)
	}
	return &eventStream{frames: w}
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
			puts = append(puts, ev)
		default:
			t.Fatalf("unexpected %v in snapshot", ev.GetType())
		}
	}
}

// wantEvent fails the test unless ev is of the type, for the key, at the revision, and
// carries the server's epoch if it marks a position (SYNCED, RESUMED, BOOKMARK) and no
// epoch if it is a change; a PUT carries its object and no key besides.
func wantEvent(t *testing.T, ts *testServer, ev *nimbusv1.WatchEvent, typ nimbusv1.WatchEvent_Type, key *nimbusv1.ObjectKey, rev uint64) {
	t.Helper()
	if ev.GetType() != typ || ev.ObjectKey().ID() != key.ID() || ev.GetRevision() != rev {
		t.Fatalf("event = %v %s rev %d; want %v %s rev %d",
			ev.GetType(), ev.ObjectKey().ID(), ev.GetRevision(), typ, key.ID(), rev)
	}
	switch typ {
	case nimbusv1.WatchEvent_TYPE_PUT, nimbusv1.WatchEvent_TYPE_DELETE:
		if ev.GetEpoch() != "" {
			t.Fatalf("%v event carries epoch %q; changes leave it out", typ, ev.GetEpoch())
		}
	default:
		if ev.GetEpoch() != ts.srv.Epoch() {
			t.Fatalf("%v event epoch = %q, want %q", typ, ev.GetEpoch(), ts.srv.Epoch())
		}
	}
	if typ == nimbusv1.WatchEvent_TYPE_PUT {
		if ev.GetKey() != nil {
			t.Fatalf("PUT carries a key besides its object: %v", ev.GetKey())
		}
		if ev.GetObject().GetMeta().GetRevision() != rev {
			t.Fatalf("PUT object revision = %d, want %d", ev.GetObject().GetMeta().GetRevision(), rev)
		}
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
		id := ev.ObjectKey().ID()
		got = append(got, id)
		if !proto.Equal(ev.GetObject(), stored[id]) {
			t.Errorf("snapshot object %s = %v, want %v", id, ev.GetObject(), stored[id])
		}
		if ev.GetRevision() != stored[id].GetMeta().GetRevision() || ev.GetEpoch() != "" || ev.GetKey() != nil {
			t.Errorf("snapshot event %s at revision %d epoch %q key %v, want %d, no epoch and no key besides the object's", id, ev.GetRevision(), ev.GetEpoch(), ev.GetKey(), stored[id].GetMeta().GetRevision())
		}
	}
	// A snapshot's events come in no particular order: the client applies it whole.
	slices.Sort(got)
	want := []string{"Node/default/default/a", "Route/default/default/to-a", "Route/default/default/to-a-and-b", "Route/default/default/to-all"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("snapshot = %q, want %q", got, want)
	}
	if synced.GetRevision() != 5 || synced.GetEpoch() != ts.srv.Epoch() {
		t.Errorf("SYNCED at revision %d epoch %q, want revision 5 epoch %q", synced.GetRevision(), synced.GetEpoch(), ts.srv.Epoch())
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

// padded returns a Route for every node whose label makes it about size bytes on the wire.
func padded(name string, size int) *nimbusv1.Object {
	o := route(name, nil, "192.0.2.1")
	o.Meta.Labels = map[string]string{"pad": strings.Repeat("x", size)}
	return o
}

// wantFramesBounded fails the test unless every frame received is at most maxFrameBytes
// on the wire, or holds a single event, and returns how many events they held.
func wantFramesBounded(t *testing.T, frames []*nimbusv1.WatchFrame) int {
	t.Helper()
	events := 0
	for i, f := range frames {
		n := len(f.GetEvents())
		events += n
		if size := proto.Size(f); size > maxFrameBytes && n > 1 {
			t.Errorf("frame %d is %d bytes with %d events, over the bound of %d", i, size, n, maxFrameBytes)
		}
	}
	return events
}

// wantFramesFull fails the test unless each frame but the last is full: the next one's
// first event would not have fitted in it. That is how frames of events that were all
// ready to go must look.
func wantFramesFull(t *testing.T, frames []*nimbusv1.WatchFrame) {
	t.Helper()
	for i := 0; i+1 < len(frames); i++ {
		size := proto.Size(frames[i])
		next := frameFieldSize(proto.Size(frames[i+1].GetEvents()[0]))
		if size+next <= maxFrameBytes {
			t.Errorf("frame %d of %d is %d bytes with %d events, and the next frame's first event of %d bytes would have fitted in it",
				i, len(frames), size, len(frames[i].GetEvents()), next)
		}
	}
}

// TestWatchFrames checks that a snapshot, a replayed backlog and a burst of changes
// travel many events to a frame, no frame over the bound but for an event larger than
// the bound, which travels alone.
func TestWatchFrames(t *testing.T) {
	const objects = 1000
	ts := start(t, Options{BookmarkInterval: -1})
	var objs []*nimbusv1.Object
	for i := range objects {
		objs = append(objs, padded(fmt.Sprintf("r%04d", i), 100))
	}
	// An object larger than a frame, amid the others.
	objs[500] = padded("r0500", 2*maxFrameBytes)
	applyBatch(t, ts, objs)

	w := watch(t, ts.client, "a")
	puts, synced := recvUntilSynced(t, w)
	if len(puts) != objects || synced.GetRevision() != objects {
		t.Fatalf("snapshot = %d objects at revision %d, want %d at %d", len(puts), synced.GetRevision(), objects, objects)
	}
	snapshotFrames := len(w.received)
	wantFramesBounded(t, w.received)
	wantFramesFull(t, w.received)
	t.Logf("snapshot: %d events in %d frames", objects+1, snapshotFrames)
	var oversized *nimbusv1.WatchFrame
	for _, f := range w.received {
		if proto.Size(f) > maxFrameBytes {
			oversized = f
		}
	}
	if len(oversized.GetEvents()) != 1 || oversized.GetEvents()[0].ObjectKey().GetName() != "r0500" {
		t.Errorf("the oversized object did not travel alone in a frame of its own: %d events", len(oversized.GetEvents()))
	}

	// A burst: one batch of 1000 changes.
	for i := range objs {
		objs[i] = padded(fmt.Sprintf("r%04d", i), 101)
	}
	applyBatch(t, ts, objs)
	for i := range objects {
		wantEvent(t, ts, recv(t, w), nimbusv1.WatchEvent_TYPE_PUT, routeKey(fmt.Sprintf("r%04d", i)), uint64(objects+1+i))
	}
	burst := w.received[snapshotFrames:]
	if n := wantFramesBounded(t, burst); n != objects {
		t.Fatalf("burst frames hold %d events, want %d", n, objects)
	}
	t.Logf("burst: %d events in %d frames", objects, len(burst))
	if len(burst) >= objects {
		t.Errorf("burst of %d changes came in %d frames, want fewer frames than events", objects, len(burst))
	}

	// A resumed watch replays the burst from its queue, frames as full as they go.
	again := watchFrom(t, testContext(t), ts.client, "a", ts.srv.Epoch(), objects)
	wantResumed(t, ts, again, objects)
	for i := range objects {
		wantEvent(t, ts, recv(t, again), nimbusv1.WatchEvent_TYPE_PUT, routeKey(fmt.Sprintf("r%04d", i)), uint64(objects+1+i))
	}
	if n := wantFramesBounded(t, again.received); n != objects+1 {
		t.Fatalf("replay frames hold %d events, want %d", n, objects+1)
	}
	wantFramesFull(t, again.received)
	t.Logf("replay: %d events in %d frames", objects+1, len(again.received))
}

// TestWatchEncodesEachObjectOnce watches 100 nodes at once over a store of 1000 objects:
// each object's event is encoded once for all the snapshots, a change once for all the
// watchers, and a later snapshot sends the change's encoded event as it is.
func TestWatchEncodesEachObjectOnce(t *testing.T) {
	const (
		objects  = 1000
		watchers = 100
	)
	ts := start(t, Options{BookmarkInterval: -1})
	var objs []*nimbusv1.Object
	for i := range objects {
		objs = append(objs, route(fmt.Sprintf("r%04d", i), nil, "192.0.2.1"))
	}
	applyBatch(t, ts, objs)
	if n := ts.srv.encodes.Load(); n != 0 {
		t.Fatalf("%d events encoded before anyone watched, want 0", n)
	}

	clients := []nimbusv1.NimbusClient{ts.client, dial(t, ts.path), dial(t, ts.path), dial(t, ts.path)}
	streams := make([]watchStream, watchers)
	var wg sync.WaitGroup
	for i := range streams {
		streams[i] = watch(t, clients[i%len(clients)], fmt.Sprintf("node-%03d", i))
	}
	for _, w := range streams {
		wg.Go(func() {
			for {
				ev, err := w.Recv()
				if err != nil {
					t.Errorf("Recv: %v", err)
					return
				}
				if ev.GetType() == nimbusv1.WatchEvent_TYPE_SYNCED {
					if ev.GetRevision() != objects {
						t.Errorf("SYNCED at revision %d, want %d", ev.GetRevision(), objects)
					}
					return
				}
			}
		})
	}
	wg.Wait()
	if n := ts.srv.encodes.Load(); n != objects {
		t.Fatalf("%d watchers' snapshots of %d objects encoded %d events, want %d", watchers, objects, n, objects)
	}

	changed := ts.apply(t, route("r0007", nil, "192.0.2.2")).GetObject()
	var first *nimbusv1.WatchEvent
	for _, w := range streams {
		ev := recv(t, w)
		wantEvent(t, ts, ev, nimbusv1.WatchEvent_TYPE_PUT, routeKey("r0007"), changed.GetMeta().GetRevision())
		if first == nil {
			first = ev
		}
	}
	if n := ts.srv.encodes.Load(); n != objects+1 {
		t.Fatalf("a change sent to %d watchers made %d encodings in all, want %d", watchers, n, objects+1)
	}

	// A new snapshot sends the change's event, identical, without encoding anything.
	puts, _ := recvUntilSynced(t, watch(t, ts.client, "late"))
	var late *nimbusv1.WatchEvent
	for _, ev := range puts {
		if ev.ObjectKey().GetName() == "r0007" {
			late = ev
		}
	}
	if !proto.Equal(late, first) {
		t.Errorf("snapshot event of a changed object = %v, want the change's event %v", late, first)
	}
	if n := ts.srv.encodes.Load(); n != objects+1 {
		t.Errorf("a snapshot after the change made %d encodings in all, want still %d", n, objects+1)
	}
}

// applyBatch applies the objects in one ApplyBatch and fails the test on error.
func applyBatch(t *testing.T, ts *testServer, objs []*nimbusv1.Object) *nimbusv1.ApplyBatchResponse {
	t.Helper()
	resp, err := ts.client.ApplyBatch(testContext(t), &nimbusv1.ApplyBatchRequest{Objects: objs})
	if err != nil {
		t.Fatalf("ApplyBatch of %d objects: %v", len(objs), err)
	}
	return resp
}

// TestLargeBatchKeepsWatchers applies batches of many times a watcher's buffer while the
// watcher reads: a commit queues all its events for a watcher that had room when it
// started, so the watcher is not reset and gets every change; a watcher that reads
// nothing is reset by the next commit.
func TestLargeBatchKeepsWatchers(t *testing.T) {
	const (
		buffer  = 8
		batch   = 500
		batches = 3
	)
	ts := start(t, Options{WatchBuffer: buffer, BookmarkInterval: -1})
	w := watch(t, ts.client, "a")
	recvUntilSynced(t, w)
	stopped := watch(t, dial(t, ts.path, grpc.WithStaticStreamWindowSize(64<<10)), "a")
	recvUntilSynced(t, stopped)

	var rev uint64
	for b := range batches {
		var objs []*nimbusv1.Object
		for i := range batch {
			objs = append(objs, padded(fmt.Sprintf("r%03d", i), 200+b))
		}
		applyBatch(t, ts, objs)
		for i := range batch {
			rev++
			wantEvent(t, ts, recv(t, w), nimbusv1.WatchEvent_TYPE_PUT, routeKey(fmt.Sprintf("r%03d", i)), rev)
		}
	}
	if got := ts.srv.WatcherResets(); got != 1 {
		t.Fatalf("WatcherResets = %d, want 1: the watcher that reads nothing only", got)
	}
	for {
		if _, err := stopped.Recv(); err != nil {
			wantCode(t, err, codes.ResourceExhausted)
			break
		}
	}
}
