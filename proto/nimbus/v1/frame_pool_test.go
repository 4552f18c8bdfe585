package nimbusv1

import (
	"testing"

	"google.golang.org/protobuf/proto"
)

// receive copies data into p as the codec does and decodes it.
func receive(t testing.TB, p *PooledFrame, data []byte) {
	t.Helper()
	copy(p.Reserve(len(data)), data)
	if err := p.Decode(); err != nil {
		t.Fatalf("Decode: %v", err)
	}
}

// TestPooledFrame receives frames of different sizes and kinds, one after the other, into
// one PooledFrame and checks each against the generated decoder: storage reused from a
// larger, a smaller or another kind of frame decodes each exactly.
func TestPooledFrame(t *testing.T) {
	var routes, relabelled, ecmp []*WatchEvent
	for i := range 300 {
		routes = append(routes, &WatchEvent{Type: WatchEvent_TYPE_PUT, Object: slabRoute(i, 1, i%2 == 0), Revision: uint64(i + 1)})
		// The same routes with their neighbours' labels and nodes: maps and slices
		// reused from routes must hold these alone.
		o := slabRoute(i, 1, i%2 == 0)
		n := slabRoute(i+1, 1, false).Meta
		o.Meta.Labels, o.Meta.Nodes = n.Labels, n.Nodes
		relabelled = append(relabelled, &WatchEvent{Type: WatchEvent_TYPE_PUT, Object: o, Revision: uint64(i + 1)})
		ecmp = append(ecmp, &WatchEvent{Type: WatchEvent_TYPE_PUT, Object: slabRoute(i, 1+i%4, true), Revision: uint64(i + 1)})
	}
	mixed := []*WatchEvent{
		{Type: WatchEvent_TYPE_DELETE, Key: NewKey(Kind_KIND_ROUTE, "t", "ns", "gone"), Revision: 3},
		{Type: WatchEvent_TYPE_PUT, Object: &Object{Meta: &ObjectMeta{Name: "n"}, Spec: &Object_Node{Node: &NodeSpec{Hostname: "h"}}}, Revision: 4},
		{Type: WatchEvent_TYPE_SYNCED, Revision: 5, Epoch: "e1"},
	}
	frames := [][]byte{
		marshalFrame(t, routes, nil),
		marshalFrame(t, relabelled, nil),
		marshalFrame(t, routes[:7], nil),
		marshalFrame(t, mixed, nil),
		marshalFrame(t, ecmp, nil), // more next hops than the storage has room for
		marshalFrame(t, ecmp[:50], nil),
		nil,
		marshalFrame(t, routes, nil),
	}
	var p PooledFrame
	defer p.Release()
	for i, data := range frames {
		receive(t, &p, data)
		var want WatchFrame
		if err := want.UnmarshalVTUnsafe(data); err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(p.Frame(), &want) || len(p.Events()) != len(want.Events) {
			t.Fatalf("frame %d: PooledFrame decoded\n%v\nwant\n%v", i, p.Frame(), &want)
		}
		if p.Size() != len(data) {
			t.Errorf("frame %d: Size() = %d, want %d", i, p.Size(), len(data))
		}
	}
}

// TestPooledFrameReleaseZeroes checks that Release zeroes the messages handed out, so
// that one kept past it reads as empty instead of as another frame's, and empties p.
func TestPooledFrameReleaseZeroes(t *testing.T) {
	var p PooledFrame
	receive(t, &p, marshalFrame(t, []*WatchEvent{{Type: WatchEvent_TYPE_PUT, Object: slabRoute(1, 2, true), Revision: 9}}, nil))
	ev := p.Events()[0]
	obj, route, labels := ev.GetObject(), ev.GetObject().GetRoute(), ev.GetObject().GetMeta().GetLabels()
	if obj.GetMeta().GetName() != "route-1" || len(route.GetNexthops()) != 2 || len(labels) != 1 {
		t.Fatalf("decoded %v", ev)
	}
	p.Release()
	if ev.GetRevision() != 0 || ev.GetObject() != nil || obj.GetMeta() != nil || route.GetPrefix() != "" || len(labels) != 0 {
		t.Errorf("after Release the event reads %v, its object %v, its route %v, its labels %v; want them empty", ev, obj, route, labels)
	}
	if p.Events() != nil || p.Size() != 0 {
		t.Errorf("after Release: %d events, %d bytes; want none", len(p.Events()), p.Size())
	}
	p.Release() // again: nothing to do
}

// TestFrameStorageReuseAllocatesNothing checks what PooledFrame is for: once its storage
// has decoded a frame, decoding a frame as large again allocates nothing, labels and
// target nodes included.
func TestFrameStorageReuseAllocatesNothing(t *testing.T) {
	var events []*WatchEvent
	for i := range 200 {
		events = append(events, &WatchEvent{Type: WatchEvent_TYPE_PUT, Object: slabRoute(i, 1+i%3, true), Revision: uint64(i + 1)})
	}
	data := marshalFrame(t, events, nil)
	var st frameStorage
	st.data = data
	decode := func() {
		st.frame.Reset()
		st.slab.reset()
		if err := st.slab.decode(&st.frame, st.data); err != nil {
			t.Fatal(err)
		}
	}
	decode()
	if n := testing.AllocsPerRun(20, decode); n != 0 {
		t.Errorf("decoding into used storage: %v allocations per frame, want 0", n)
	}
	if len(st.frame.Events) != len(events) || !proto.Equal(st.frame.Events[199], events[199]) {
		t.Errorf("decoded %d events, the last %v; want %d, the last %v", len(st.frame.Events), st.frame.Events[len(st.frame.Events)-1], len(events), events[199])
	}
}
