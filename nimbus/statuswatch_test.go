package nimbus

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// statusClient reads a WatchStatus stream one event at a time.
type statusClient struct {
	t      *testing.T
	stream grpc.ServerStreamingClient[nimbusv1.StatusFrame]
	queued []*nimbusv1.StatusEvent
	// events counts the events received.
	events int
}

// watchStatus opens a status watch that ends with ctx.
func watchStatus(t *testing.T, ctx context.Context, client nimbusv1.NimbusClient, req *nimbusv1.WatchStatusRequest, opts ...grpc.CallOption) *statusClient {
	t.Helper()
	stream, err := client.WatchStatus(ctx, req, opts...)
	if err != nil {
		t.Fatalf("WatchStatus: %v", err)
	}
	return &statusClient{t: t, stream: stream}
}

// recv returns the next event, or the stream's error.
func (c *statusClient) recv() (*nimbusv1.StatusEvent, error) {
	for len(c.queued) == 0 {
		f, err := c.stream.Recv()
		if err != nil {
			return nil, err
		}
		if len(f.GetEvents()) == 0 {
			c.t.Fatal("received a status frame without events")
		}
		c.queued = f.GetEvents()
	}
	ev := c.queued[0]
	c.queued = c.queued[1:]
	c.events++
	return ev, nil
}

// next returns the next event and fails the test on error.
func (c *statusClient) next() *nimbusv1.StatusEvent {
	c.t.Helper()
	ev, err := c.recv()
	if err != nil {
		c.t.Fatalf("receiving status events: %v", err)
	}
	return ev
}

// synced receives the current state up to SYNCED and returns it by key ID.
func (c *statusClient) synced() map[string]*nimbusv1.ObjectWithStatus {
	c.t.Helper()
	items := map[string]*nimbusv1.ObjectWithStatus{}
	for {
		ev := c.next()
		switch ev.GetType() {
		case nimbusv1.StatusEvent_TYPE_SYNCED:
			return items
		case nimbusv1.StatusEvent_TYPE_PUT:
			id := ev.GetKey().ID()
			if _, dup := items[id]; dup {
				c.t.Fatalf("%s sent twice before SYNCED", id)
			}
			if ev.GetItem().GetObject().Key().ID() != id {
				c.t.Fatalf("PUT of key %s carries object %s", id, ev.GetItem().GetObject().Key().ID())
			}
			items[id] = ev.GetItem()
		default:
			c.t.Fatalf("%v before SYNCED", ev.GetType())
		}
	}
}

// nextPut returns the next event, which must be a PUT of the key.
func (c *statusClient) nextPut(key *nimbusv1.ObjectKey) *nimbusv1.ObjectWithStatus {
	c.t.Helper()
	ev := c.next()
	if ev.GetType() != nimbusv1.StatusEvent_TYPE_PUT || ev.GetKey().ID() != key.ID() {
		c.t.Fatalf("event = %v %s, want PUT %s", ev.GetType(), ev.GetKey().ID(), key.ID())
	}
	return ev.GetItem()
}

// wantAsGet fails the test unless item is what Get returns for its object now.
func wantAsGet(t *testing.T, ts *testServer, item *nimbusv1.ObjectWithStatus) {
	t.Helper()
	if got := ts.get(t, item.GetObject().Key()); !proto.Equal(item, got) {
		t.Fatalf("streamed %s =\n%v\nGet returns\n%v", item.GetObject().Key().ID(), item, got)
	}
}

// wantCounts fails the test unless the status has these counts and pending nodes.
func wantCounts(t *testing.T, item *nimbusv1.ObjectWithStatus, target, programmed, stale int32, pending ...string) {
	t.Helper()
	st := item.GetStatus()
	if st.GetTargetNodes() != target || st.GetProgrammedNodes() != programmed || st.GetStaleNodes() != stale || !slices.Equal(st.GetPending(), pending) {
		t.Fatalf("%s status = target %d programmed %d stale %d pending %q; want %d %d %d %q",
			item.GetObject().Key().ID(), st.GetTargetNodes(), st.GetProgrammedNodes(), st.GetStaleNodes(), st.GetPending(),
			target, programmed, stale, pending)
	}
}

func TestWatchStatusStartsWithCurrentState(t *testing.T) {
	ts := start(t, Options{})
	r1, r2 := routeKey("r1"), routeKey("r2")
	ts.apply(t, route("r1", []string{"a", "b"}, "192.0.2.1"))
	ts.apply(t, route("r2", nil, "192.0.2.1"))
	ts.apply(t, nodeObject("n1"))
	ts.report(t, statusReport(r1, "a", 1, nimbusv1.Phase_PHASE_PROGRAMMED, "ok"))

	items := watchStatus(t, testContext(t), ts.client, &nimbusv1.WatchStatusRequest{}).synced()
	want := []string{"Node/default/default/n1", r1.ID(), r2.ID()}
	if got := slices.Sorted(func(yield func(string) bool) {
		for id := range items {
			yield(id)
		}
	}); !slices.Equal(got, want) {
		t.Fatalf("current state holds %q, want %q", got, want)
	}
	for _, item := range items {
		wantAsGet(t, ts, item)
	}
	wantCounts(t, items[r1.ID()], 2, 1, 0, "b")
	wantCounts(t, items[r2.ID()], 1, 0, 0, "n1")
}

func TestWatchStatusFollowsReportsAndChanges(t *testing.T) {
	ts := start(t, Options{})
	key := routeKey("r1")
	ts.apply(t, route("r1", []string{"a", "b"}, "192.0.2.1"))
	w := watchStatus(t, testContext(t), ts.client, &nimbusv1.WatchStatusRequest{Kind: nimbusv1.Kind_KIND_ROUTE})
	wantCounts(t, w.synced()[key.ID()], 2, 0, 0, "a", "b")

	ts.report(t, statusReport(key, "a", 1, nimbusv1.Phase_PHASE_PROGRAMMED, ""))
	item := w.nextPut(key)
	wantCounts(t, item, 2, 1, 0, "b")
	wantAsGet(t, ts, item)

	ts.report(t, statusReport(key, "b", 1, nimbusv1.Phase_PHASE_PROGRAMMED, ""))
	item = w.nextPut(key)
	wantCounts(t, item, 2, 2, 0)
	if item.GetStatus().GetCaughtUpTime() == nil {
		t.Errorf("caught up time unset once every node is PROGRAMMED")
	}

	// A new generation: the object and its status change together.
	ts.apply(t, route("r1", []string{"a", "b"}, "192.0.2.2"))
	item = w.nextPut(key)
	if g := item.GetObject().GetMeta().GetGeneration(); g != 2 || item.GetStatus().GetGeneration() != 2 {
		t.Fatalf("after the change: object generation %d, status generation %d; want 2", g, item.GetStatus().GetGeneration())
	}
	wantCounts(t, item, 2, 0, 0, "a", "b")

	if _, err := ts.client.Delete(testContext(t), &nimbusv1.DeleteRequest{Key: key}); err != nil {
		t.Fatal(err)
	}
	if ev := w.next(); ev.GetType() != nimbusv1.StatusEvent_TYPE_DELETE || ev.GetKey().ID() != key.ID() || ev.GetItem() != nil {
		t.Fatalf("after Delete: %v %s with item %v, want DELETE %s without item", ev.GetType(), ev.GetKey().ID(), ev.GetItem(), key.ID())
	}
}

// TestWatchStatusOmitObjects follows a status watch that omits objects: each item's
// object is the stored object's skeleton (kind, key and generations, no labels, no spec),
// and its status is Get's, before and after reports and a new generation.
func TestWatchStatusOmitObjects(t *testing.T) {
	ts := start(t, Options{})
	key := routeKey("r1")
	obj := route("r1", []string{"a", "b"}, "192.0.2.1")
	obj.Meta.Labels = map[string]string{"app": "web"}
	ts.apply(t, obj)
	w := watchStatus(t, testContext(t), ts.client, &nimbusv1.WatchStatusRequest{Kind: nimbusv1.Kind_KIND_ROUTE, OmitObjects: true})
	wantSkeleton := func(item *nimbusv1.ObjectWithStatus, generation int64) {
		t.Helper()
		got := ts.get(t, key)
		if !proto.Equal(item.GetObject(), got.GetObject().Skeleton()) || !proto.Equal(item.GetStatus(), got.GetStatus()) {
			t.Fatalf("item %v, want the skeleton and status of Get's %v", item, got)
		}
		if g := item.GetObject().GetMeta().GetGeneration(); g != generation || item.GetObject().GetRoute() == nil ||
			len(item.GetObject().GetMeta().GetLabels()) > 0 || len(item.GetObject().GetRoute().GetNexthops()) > 0 {
			t.Fatalf("item's object %v: want generation %d, an empty route spec and no labels", item.GetObject(), generation)
		}
		if item.GetObject().Key().ID() != key.ID() {
			t.Fatalf("item's object has key %s, want %s", item.GetObject().Key().ID(), key.ID())
		}
	}
	item := w.synced()[key.ID()]
	wantCounts(t, item, 2, 0, 0, "a", "b")
	wantSkeleton(item, 1)

	ts.report(t, statusReport(key, "a", 1, nimbusv1.Phase_PHASE_PROGRAMMED, ""))
	item = w.nextPut(key)
	wantCounts(t, item, 2, 1, 0, "b")
	wantSkeleton(item, 1)

	ts.apply(t, route("r1", []string{"a", "b"}, "192.0.2.2"))
	item = w.nextPut(key)
	wantCounts(t, item, 2, 0, 0, "a", "b")
	wantSkeleton(item, 2)
}

// TestWatchStatusFollowsTargetNodes follows an object for every node as nodes join and
// leave its targets: by watching and by their Node objects.
func TestWatchStatusFollowsTargetNodes(t *testing.T) {
	ts := start(t, Options{})
	key := routeKey("r1")
	ts.apply(t, route("r1", nil, "192.0.2.1"))
	w := watchStatus(t, testContext(t), ts.client, &nimbusv1.WatchStatusRequest{Kind: nimbusv1.Kind_KIND_ROUTE})
	wantCounts(t, w.synced()[key.ID()], 0, 0, 0)

	watchCtx, stopWatch := context.WithCancel(testContext(t))
	if _, err := ts.client.Watch(watchCtx, &nimbusv1.WatchRequest{Node: "w1"}); err != nil {
		t.Fatal(err)
	}
	wantCounts(t, w.nextPut(key), 1, 0, 0, "w1")
	ts.apply(t, nodeObject("n1"))
	wantCounts(t, w.nextPut(key), 2, 0, 0, "n1", "w1")
	ts.report(t, statusReport(key, "w1", 1, nimbusv1.Phase_PHASE_PROGRAMMED, ""))
	wantCounts(t, w.nextPut(key), 2, 1, 0, "n1")

	// w1 has no Node object: when its watch ends it is no target, and its report is
	// left out.
	stopWatch()
	item := w.nextPut(key)
	wantCounts(t, item, 1, 0, 0, "n1")
	wantAsGet(t, ts, item)
	if _, err := ts.client.Delete(testContext(t), &nimbusv1.DeleteRequest{Key: nimbusv1.NewKey(nimbusv1.Kind_KIND_NODE, "", "", "n1")}); err != nil {
		t.Fatal(err)
	}
	wantCounts(t, w.nextPut(key), 0, 0, 0)
}

// TestWatchStatusStale sees a node's status turn stale with time alone, and fresh again
// when the node watches.
func TestWatchStatusStale(t *testing.T) {
	ts := start(t, Options{StaleAfter: 100 * time.Millisecond})
	key := routeKey("r1")
	ts.apply(t, route("r1", []string{"a"}, "192.0.2.1"))
	watchCtx, stopWatch := context.WithCancel(testContext(t))
	if _, err := ts.client.Watch(watchCtx, &nimbusv1.WatchRequest{Node: "a"}); err != nil {
		t.Fatal(err)
	}
	waitWatchers(t, ts, 1)
	ts.report(t, statusReport(key, "a", 1, nimbusv1.Phase_PHASE_PROGRAMMED, ""))
	w := watchStatus(t, testContext(t), ts.client, &nimbusv1.WatchStatusRequest{Kind: nimbusv1.Kind_KIND_ROUTE})
	wantCounts(t, w.synced()[key.ID()], 1, 1, 0)

	stopWatch()
	waitWatchers(t, ts, 0)
	// Once r2 is through, so is what the end of the watch changed, which is nothing:
	// the stale mark that follows comes with time alone.
	other := ts.apply(t, route("r2", []string{"b"}, "192.0.2.1")).GetObject().Key()
	w.nextPut(other)
	ts.clock.Advance(100 * time.Millisecond)
	item := w.nextPut(key)
	wantCounts(t, item, 1, 1, 1)
	wantAsGet(t, ts, item)

	if _, err := ts.client.Watch(testContext(t), &nimbusv1.WatchRequest{Node: "a"}); err != nil {
		t.Fatal(err)
	}
	wantCounts(t, w.nextPut(key), 1, 1, 0)
}

func TestWatchStatusFilters(t *testing.T) {
	ts := start(t, Options{})
	objects := map[string]*nimbusv1.Object{}
	for _, o := range []*nimbusv1.Object{
		route("r1", []string{"a"}, "192.0.2.1"),
		withPlace(route("r2", []string{"a"}, "192.0.2.1"), "t1", ""),
		withPlace(route("r3", []string{"a"}, "192.0.2.1"), "t1", "n2"),
		nodeObject("n1"),
	} {
		objects[o.Key().ID()] = o
		ts.apply(t, o)
	}
	const (
		r1 = "Route/default/default/r1"
		r2 = "Route/t1/default/r2"
		r3 = "Route/t1/n2/r3"
		n1 = "Node/default/default/n1"
	)
	for _, tt := range []struct {
		name string
		req  *nimbusv1.WatchStatusRequest
		want []string
	}{
		{"everything", &nimbusv1.WatchStatusRequest{}, []string{n1, r1, r3, r2}},
		{"kind", &nimbusv1.WatchStatusRequest{Kind: nimbusv1.Kind_KIND_ROUTE}, []string{r1, r3, r2}},
		{"tenant", &nimbusv1.WatchStatusRequest{Tenant: "t1"}, []string{r3, r2}},
		{"namespace", &nimbusv1.WatchStatusRequest{Namespace: "default"}, []string{n1, r1, r2}},
		{"name", &nimbusv1.WatchStatusRequest{Name: "r2"}, []string{r2}},
		{"all four", &nimbusv1.WatchStatusRequest{Kind: nimbusv1.Kind_KIND_ROUTE, Tenant: "t1", Namespace: "n2", Name: "r3"}, []string{r3}},
		{"kind and name", &nimbusv1.WatchStatusRequest{Kind: nimbusv1.Kind_KIND_NODE, Name: "r1"}, nil},
		{"keys", &nimbusv1.WatchStatusRequest{Keys: []*nimbusv1.ObjectKey{
			routeKey("r1"), {Kind: nimbusv1.Kind_KIND_ROUTE, Tenant: "t1", Name: "r2"}, routeKey("r9"), routeKey("r1"),
		}}, []string{r1, r2}},
		{"keys and kind", &nimbusv1.WatchStatusRequest{Kind: nimbusv1.Kind_KIND_NODE, Keys: []*nimbusv1.ObjectKey{
			routeKey("r1"), {Kind: nimbusv1.Kind_KIND_NODE, Name: "n1"},
		}}, []string{n1}},
		{"keys none there", &nimbusv1.WatchStatusRequest{Keys: []*nimbusv1.ObjectKey{routeKey("r9")}}, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			w := watchStatus(t, testContext(t), ts.client, tt.req)
			items := w.synced()
			var got []string
			for id := range items {
				got = append(got, id)
			}
			slices.Sort(got)
			want := slices.Sorted(slices.Values(tt.want))
			if !slices.Equal(got, want) {
				t.Fatalf("current state holds %q, want %q", got, want)
			}
			if len(want) == 0 {
				return
			}
			// Change the objects not selected first, then the selected ones: if a change
			// of one not selected came through, it would come before the last selected.
			label := map[string]string{"test": tt.name}
			for _, selected := range []bool{false, true} {
				for id, o := range objects {
					if slices.Contains(want, id) == selected {
						o = proto.CloneOf(o)
						o.Meta.Labels = label
						ts.apply(t, o)
					}
				}
			}
			for seen := map[string]bool{}; len(seen) < len(want); {
				ev := w.next()
				id := ev.GetKey().ID()
				if !slices.Contains(want, id) || ev.GetType() != nimbusv1.StatusEvent_TYPE_PUT {
					t.Fatalf("after the changes: %v %s, want PUTs of %q only", ev.GetType(), id, want)
				}
				if l := ev.GetItem().GetObject().GetMeta().GetLabels()["test"]; l == tt.name {
					seen[id] = true
				}
			}
		})
	}
}

// withPlace returns o in the tenant and namespace.
func withPlace(o *nimbusv1.Object, tenant, namespace string) *nimbusv1.Object {
	o.Meta.Tenant, o.Meta.Namespace = tenant, namespace
	return o
}

// TestWatchStatusCoalescesBurst reports 10,000 statuses while a status watcher's client
// does not read: the reports are all taken, and when the client reads it receives far
// fewer events than reports, ending at exactly what Get returns.
func TestWatchStatusCoalescesBurst(t *testing.T) {
	const (
		objects = 5
		nodes   = 100
		rounds  = 20
	)
	ts := start(t, Options{})
	var names []string
	for i := range nodes {
		names = append(names, fmt.Sprintf("n%03d", i))
	}
	var keys []*nimbusv1.ObjectKey
	for i := range objects {
		o := route(fmt.Sprintf("r%d", i), names, "192.0.2.1")
		ts.apply(t, o)
		keys = append(keys, o.Key())
	}
	// A fixed flow control window, so what the server can send before the client reads
	// does not grow with the time the burst takes.
	client := dial(t, ts.path, grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	w := watchStatus(t, testContext(t), client, &nimbusv1.WatchStatusRequest{})
	w.synced()
	before := w.events

	var reports []*nimbusv1.StatusReport
	for r := range rounds {
		phase := nimbusv1.Phase_PHASE_PENDING
		if r == rounds-1 {
			phase = nimbusv1.Phase_PHASE_PROGRAMMED
		}
		for _, n := range names {
			for _, k := range keys {
				reports = append(reports, statusReport(k, n, 1, phase, fmt.Sprintf("round %d", r)))
			}
		}
	}
	ts.report(t, reports...)
	// A change after the burst: every event the burst caused comes before it.
	end := ts.apply(t, route("zz-end", names, "192.0.2.1")).GetObject().Key()

	last := map[string]*nimbusv1.ObjectWithStatus{}
	for {
		ev := w.next()
		id := ev.GetKey().ID()
		if ev.GetType() != nimbusv1.StatusEvent_TYPE_PUT {
			t.Fatalf("unexpected %v %s", ev.GetType(), id)
		}
		if id == end.ID() {
			break
		}
		last[id] = ev.GetItem()
	}
	if len(last) != objects {
		t.Fatalf("the burst changed %d objects on the stream, want %d", len(last), objects)
	}
	for _, item := range last {
		wantAsGet(t, ts, item)
	}
	events := w.events - before - 1
	t.Logf("%d reports, %d status events", len(reports), events)
	if events > len(reports)/20 {
		t.Fatalf("%d reports gave %d status events, want at most %d", len(reports), events, len(reports)/20)
	}
}

func TestWatchStatusEndsWhenClosed(t *testing.T) {
	ts := start(t, Options{})
	ts.apply(t, route("r1", nil, "192.0.2.1"))
	w := watchStatus(t, testContext(t), ts.client, &nimbusv1.WatchStatusRequest{})
	w.synced()
	if err := ts.srv.Close(); err != nil {
		t.Fatal(err)
	}
	_, err := w.recv()
	wantCode(t, err, codes.Unavailable)
}

func TestWatchStatusRefusesUnknownKind(t *testing.T) {
	ts := start(t, Options{})
	_, err := watchStatus(t, testContext(t), ts.client, &nimbusv1.WatchStatusRequest{Kind: 99}).recv()
	wantCode(t, err, codes.InvalidArgument)
}

// TestWatchStatusRefusesBadKeys: a key without a name or of an unknown kind is refused,
// naming its place among the keys and the field.
func TestWatchStatusRefusesBadKeys(t *testing.T) {
	ts := start(t, Options{})
	for _, tt := range []struct {
		key  *nimbusv1.ObjectKey
		want string
	}{
		{&nimbusv1.ObjectKey{Kind: nimbusv1.Kind_KIND_ROUTE}, "keys[1]: key.name"},
		{&nimbusv1.ObjectKey{Kind: 99, Name: "r1"}, "keys[1]: key.kind"},
	} {
		req := &nimbusv1.WatchStatusRequest{Keys: []*nimbusv1.ObjectKey{routeKey("r1"), tt.key}}
		_, err := watchStatus(t, testContext(t), ts.client, req).recv()
		wantCode(t, err, codes.InvalidArgument)
		if !strings.Contains(status.Convert(err).Message(), tt.want) {
			t.Errorf("WatchStatus with key %v: %v, want it to name %q", tt.key, err, tt.want)
		}
	}
}

func TestAuthWatchStatusPublishersOnly(t *testing.T) {
	ts, p := startTLS(t)
	ts.apply(t, route("r1", nil, "192.0.2.1"))
	if items := watchStatus(t, testContext(t), ts.client, &nimbusv1.WatchStatusRequest{}).synced(); len(items) != 1 {
		t.Fatalf("a publisher's status watch sent %d objects, want 1", len(items))
	}
	_, err := watchStatus(t, testContext(t), p.node(t, ts, "host-a"), &nimbusv1.WatchStatusRequest{}).recv()
	wantDenied(t, err, `node "host-a"`, "may not watch status")
}

// briefFrame is what a brief status frame told: its brief entries, "INDEX gen G T/P"
// (generation, target and programmed nodes), and its events, "PUT ID", "DELETE ID" or
// "SYNCED".
type briefFrame struct{ entries, events []string }

// recvBrief returns what the next frame of a brief stream told.
func recvBrief(t *testing.T, stream grpc.ServerStreamingClient[nimbusv1.StatusFrame]) (briefFrame, []*nimbusv1.StatusEvent) {
	t.Helper()
	f, err := stream.Recv()
	if err != nil {
		t.Fatalf("receiving a brief status frame: %v", err)
	}
	var bf briefFrame
	for i, k := range f.GetBriefKeys() {
		bf.entries = append(bf.entries, fmt.Sprintf("%d gen %d %d/%d", k, f.GetBriefGenerations()[i],
			f.GetBriefTargetNodes()[i], f.GetBriefProgrammedNodes()[i]))
	}
	for _, ev := range f.GetEvents() {
		switch ev.GetType() {
		case nimbusv1.StatusEvent_TYPE_SYNCED:
			bf.events = append(bf.events, "SYNCED")
		default:
			bf.events = append(bf.events, strings.TrimPrefix(ev.GetType().String(), "TYPE_")+" "+ev.GetKey().GetName())
		}
	}
	return bf, f.GetEvents()
}

// TestWatchStatusBrief: a brief stream sends an object whose status has nothing to tell
// but its counts as a brief entry by its index among the keys, and one with a FAILED
// node or a message as a PUT, whole; the current state is every selected object in one
// form or the other, and a change of either form goes out again.
func TestWatchStatusBrief(t *testing.T) {
	ts := start(t, Options{})
	r1, r2, r3 := routeKey("r1"), routeKey("r2"), routeKey("r3")
	ts.apply(t, route("r1", []string{"a", "b"}, "192.0.2.1"))
	ts.apply(t, route("r2", []string{"a"}, "192.0.2.1"))
	ts.apply(t, route("r3", []string{"a"}, "192.0.2.1"))
	ts.report(t, statusReport(r2, "a", 1, nimbusv1.Phase_PHASE_PROGRAMMED, ""))
	failed := statusReport(r3, "a", 1, nimbusv1.Phase_PHASE_FAILED, "adding route: no such table")
	failed.Status.Reason = "KernelError"
	ts.report(t, failed)

	// r1 repeats: its entries carry its first index.
	req := &nimbusv1.WatchStatusRequest{Brief: true, OmitObjects: true, Keys: []*nimbusv1.ObjectKey{r3, r1, r2, r1, routeKey("missing")}}
	stream, err := ts.client.WatchStatus(testContext(t), req)
	if err != nil {
		t.Fatal(err)
	}
	got, events := recvBrief(t, stream)
	want := briefFrame{entries: []string{"1 gen 1 2/0", "2 gen 1 1/1"}, events: []string{"PUT r3", "SYNCED"}}
	if !slices.Equal(got.entries, want.entries) || !slices.Equal(got.events, want.events) {
		t.Fatalf("current state = %+v, want %+v", got, want)
	}
	if st, get := events[0].GetItem().GetStatus(), ts.get(t, r3).GetStatus(); !proto.Equal(st, get) {
		t.Fatalf("r3's PUT carries status\n%v\nGet returns\n%v", st, get)
	}

	// A node's progress is an entry; a failure that clears, an entry; an object that
	// fails, a PUT; a deletion, a DELETE.
	ts.report(t, statusReport(r1, "a", 1, nimbusv1.Phase_PHASE_PROGRAMMED, ""))
	if got, _ := recvBrief(t, stream); !slices.Equal(got.entries, []string{"1 gen 1 2/1"}) || len(got.events) != 0 {
		t.Fatalf("after r1 programmed on a: %+v, want its entry alone", got)
	}
	ts.report(t, statusReport(r3, "a", 1, nimbusv1.Phase_PHASE_PROGRAMMED, ""))
	if got, _ := recvBrief(t, stream); !slices.Equal(got.entries, []string{"0 gen 1 1/1"}) || len(got.events) != 0 {
		t.Fatalf("after r3 programmed: %+v, want its entry alone", got)
	}
	ts.report(t, statusReport(r2, "a", 1, nimbusv1.Phase_PHASE_PENDING, "waiting for SecurityGroup sg1"))
	if got, _ := recvBrief(t, stream); len(got.entries) != 0 || !slices.Equal(got.events, []string{"PUT r2"}) {
		t.Fatalf("after r2 pending with a message: %+v, want its PUT alone", got)
	}
	if _, err := ts.client.Delete(testContext(t), &nimbusv1.DeleteRequest{Key: r1}); err != nil {
		t.Fatal(err)
	}
	if got, _ := recvBrief(t, stream); len(got.entries) != 0 || !slices.Equal(got.events, []string{"DELETE r1"}) {
		t.Fatalf("after r1 deleted: %+v, want its DELETE alone", got)
	}
}

// TestWatchStatusBriefNeedsKeys: a brief stream names its objects by their indexes in
// the keys, so one without keys is refused, naming the field.
func TestWatchStatusBriefNeedsKeys(t *testing.T) {
	ts := start(t, Options{})
	_, err := watchStatus(t, testContext(t), ts.client, &nimbusv1.WatchStatusRequest{Kind: nimbusv1.Kind_KIND_ROUTE, Brief: true}).recv()
	wantCode(t, err, codes.InvalidArgument)
	if !strings.Contains(status.Convert(err).Message(), "brief") {
		t.Errorf("WatchStatus brief without keys: %v, want it to name the field brief", err)
	}
}
