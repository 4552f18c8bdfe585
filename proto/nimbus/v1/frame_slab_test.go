package nimbusv1

import (
	"fmt"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// slabLabels are the labels of the i-th route of the tests' frames: none, one or two, or
// an empty key and an empty value, so that routes next to each other differ.
func slabLabels(i int) map[string]string {
	switch i % 4 {
	case 1:
		return map[string]string{"app": fmt.Sprintf("web-%d", i)}
	case 2:
		return map[string]string{"app": "web", "env": "prod"}
	case 3:
		return map[string]string{"": "empty-key", "empty-value": ""}
	}
	return nil
}

// slabRoute is the i-th route of the tests' frames: hops next hops, timestamps when ts.
func slabRoute(i, hops int, ts bool) *Object {
	r := &RouteSpec{Table: uint32(100 + i), Prefix: fmt.Sprintf("10.0.%d.0/24", i%256), Metric: uint32(i), TenantTable: i%2 == 0}
	for h := range hops {
		r.Nexthops = append(r.Nexthops, &NextHop{Gateway: fmt.Sprintf("192.0.2.%d", h+1), Device: "eth0", Weight: uint32(h)})
	}
	o := &Object{
		Meta: &ObjectMeta{Name: fmt.Sprintf("route-%d", i), Uid: "u", Generation: 1, Revision: uint64(i), Labels: slabLabels(i), Nodes: []string{"n1", "n2"}[:i%3]},
		Spec: &Object_Route{Route: r},
	}
	if ts {
		o.Meta.CreateTime = &timestamppb.Timestamp{Seconds: int64(i), Nanos: 7}
		o.Meta.UpdateTime = &timestamppb.Timestamp{} // set, but empty on the wire
	}
	return o
}

// marshalFrame encodes the events as a frame, each followed by extra bytes when given.
func marshalFrame(t testing.TB, events []*WatchEvent, extra map[int][]byte) []byte {
	t.Helper()
	var b []byte
	for i, ev := range events {
		e, err := proto.Marshal(ev)
		if err != nil {
			t.Fatalf("encoding event %d: %v", i, err)
		}
		e = append(e, extra[i]...)
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		b = protowire.AppendBytes(b, e)
	}
	return b
}

// labelledFrame encodes a frame of one event, a route whose meta holds the given label
// entries, each as it is given.
func labelledFrame(t testing.TB, entries ...[]byte) []byte {
	t.Helper()
	meta := protowire.AppendString(protowire.AppendTag(nil, 3, protowire.BytesType), "labelled")
	for _, e := range entries {
		meta = protowire.AppendBytes(protowire.AppendTag(meta, 7, protowire.BytesType), e)
	}
	obj := protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), meta)
	spec, err := proto.Marshal(&RouteSpec{Table: 100, Prefix: "10.0.0.0/24"})
	if err != nil {
		t.Fatalf("encoding a route: %v", err)
	}
	obj = protowire.AppendBytes(protowire.AppendTag(obj, 15, protowire.BytesType), spec)
	ev := protowire.AppendVarint(protowire.AppendTag(nil, 1, protowire.VarintType), uint64(WatchEvent_TYPE_PUT))
	ev = protowire.AppendBytes(protowire.AppendTag(ev, 2, protowire.BytesType), obj)
	return protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), ev)
}

// entry encodes a label entry of the given fields: a number, then its value, a string
// for a length-delimited field and a uint64 for a varint.
func entry(fields ...any) []byte {
	var b []byte
	for i := 0; i < len(fields); i += 2 {
		num := protowire.Number(fields[i].(int))
		switch v := fields[i+1].(type) {
		case string:
			b = protowire.AppendString(protowire.AppendTag(b, num, protowire.BytesType), v)
		case uint64:
			b = protowire.AppendVarint(protowire.AppendTag(b, num, protowire.VarintType), v)
		}
	}
	return b
}

// TestUnmarshalVTUnsafeSlab checks that UnmarshalVTUnsafeSlab decodes frames exactly as
// UnmarshalVTUnsafe does, fast path and fallbacks alike, and that the messages it hands
// out are distinct.
func TestUnmarshalVTUnsafeSlab(t *testing.T) {
	unknown := protowire.AppendVarint(protowire.AppendTag(nil, 99, protowire.VarintType), 7)
	// A second meta in one object: the decoders merge it into the first.
	secondMeta, _ := proto.Marshal(&Object{Meta: &ObjectMeta{Tenant: "t2", CreateTime: &timestamppb.Timestamp{Seconds: 9}}})
	objWithSecondMeta := func(o *Object) []byte {
		b, _ := proto.Marshal(o)
		return append(b, secondMeta...)
	}
	nodeObj := &Object{Meta: &ObjectMeta{Name: "n1"}, Spec: &Object_Node{Node: &NodeSpec{Hostname: "h", VtepAddress: "192.0.2.9"}}}
	var routes []*WatchEvent
	for i := range 300 {
		routes = append(routes, &WatchEvent{Type: WatchEvent_TYPE_PUT, Object: slabRoute(i, i%3, i%2 == 0), Revision: uint64(i + 1)})
	}
	mixed := []*WatchEvent{
		{Type: WatchEvent_TYPE_PUT, Object: slabRoute(1, 2, true), Revision: 1},
		{Type: WatchEvent_TYPE_PUT, Object: nodeObj, Revision: 2},
		{Type: WatchEvent_TYPE_DELETE, Key: NewKey(Kind_KIND_ROUTE, "t", "ns", "gone"), Revision: 3},
		{Type: WatchEvent_TYPE_PUT, Object: &Object{Spec: &Object_Route{Route: &RouteSpec{}}}, Revision: 4},
		{Type: WatchEvent_TYPE_PUT, Object: &Object{Meta: &ObjectMeta{Name: "no-spec"}}, Revision: 5},
		{Type: WatchEvent_TYPE_PUT, Object: &Object{}, Revision: 6},
		{Type: WatchEvent_TYPE_PUT, Object: slabRoute(7, 1, false), Revision: 7},
		{Type: WatchEvent_TYPE_SYNCED, Revision: 8, Epoch: "e1"},
	}
	twoMetas := &WatchEvent{Type: WatchEvent_TYPE_PUT, Revision: 9}
	twoMetasBytes, _ := proto.Marshal(twoMetas)
	twoMetasBytes = protowire.AppendTag(twoMetasBytes, 2, protowire.BytesType)
	twoMetasBytes = protowire.AppendBytes(twoMetasBytes, objWithSecondMeta(slabRoute(9, 1, false)))

	for _, tc := range []struct {
		name string
		data []byte
		// wantErr tells that both decoders must fail.
		wantErr bool
	}{
		{"routes", marshalFrame(t, routes, nil), false},
		{"mixed", marshalFrame(t, mixed, nil), false},
		{"unknown-field-in-event", marshalFrame(t, mixed, map[int][]byte{0: unknown, 5: unknown}), false},
		{"unknown-field-in-frame", append(marshalFrame(t, mixed, nil), unknown...), false},
		{"meta-twice", append(marshalFrame(t, routes[:2], nil), protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), twoMetasBytes)...), false},
		{"empty", nil, false},
		{"labels", labelledFrame(t, entry(1, "app", 2, "web"), entry(2, "prod", 1, "env"), entry(1, "app", 2, "db")), false},
		{"label-without-value", labelledFrame(t, entry(1, "app")), false},
		{"label-without-key", labelledFrame(t, entry(2, "web")), false},
		{"label-empty", labelledFrame(t, nil), false},
		{"label-key-twice", labelledFrame(t, entry(1, "app", 1, "env", 2, "web")), false},
		{"label-value-twice", labelledFrame(t, entry(1, "app", 2, "web", 2, "db")), false},
		{"label-unknown-field", labelledFrame(t, entry(1, "app", 3, "x", 2, "web"), entry(1, "env", 2, "prod")), false},
		{"label-varint", labelledFrame(t, entry(1, "app", 2, uint64(7))), true},
		{"label-truncated", labelledFrame(t, entry(1, "app", 2, "web")[:6]), true},
		{"truncated", marshalFrame(t, routes[:3], nil)[:50], true},
		{"bad-event", protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), []byte{0x0a, 0xff}), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var want, got WatchFrame
			wantErr := want.UnmarshalVTUnsafe(tc.data)
			gotErr := got.UnmarshalVTUnsafeSlab(tc.data)
			if (wantErr != nil) != tc.wantErr || (gotErr != nil) != tc.wantErr {
				t.Fatalf("errors: UnmarshalVTUnsafe %v, UnmarshalVTUnsafeSlab %v; want an error: %v", wantErr, gotErr, tc.wantErr)
			}
			if tc.wantErr {
				return
			}
			if !proto.Equal(&want, &got) {
				t.Fatalf("UnmarshalVTUnsafeSlab decoded\n%v\nUnmarshalVTUnsafe\n%v", &got, &want)
			}
			if len(got.Events) != len(want.Events) {
				t.Fatalf("got %d events, want %d", len(got.Events), len(want.Events))
			}
			// Presence is the generated decoder's: proto.Equal tells set from empty for
			// messages, and these compare it where it matters most.
			for i, ev := range got.Events {
				w := want.Events[i]
				if (ev.Object == nil) != (w.Object == nil) || (ev.Key == nil) != (w.Key == nil) ||
					(ev.GetObject().GetMeta() == nil) != (w.GetObject().GetMeta() == nil) ||
					(ev.GetObject().GetMeta().GetCreateTime() == nil) != (w.GetObject().GetMeta().GetCreateTime() == nil) ||
					(ev.GetObject().GetMeta().GetUpdateTime() == nil) != (w.GetObject().GetMeta().GetUpdateTime() == nil) {
					t.Fatalf("event %d: presence differs: got %v, want %v", i, ev, w)
				}
			}
		})
	}

	t.Run("distinct", func(t *testing.T) {
		var f WatchFrame
		if err := f.UnmarshalVTUnsafeSlab(marshalFrame(t, routes, nil)); err != nil {
			t.Fatal(err)
		}
		// Changing every message of one event leaves the others as they were.
		ev := f.Events[2] // labelled, with nodes and timestamps
		ev.Revision = 0
		m := ev.Object.Meta
		m.Name, m.CreateTime.Seconds, m.UpdateTime.Nanos = "changed", -1, -1
		r := ev.Object.GetRoute()
		r.Prefix, r.Nexthops[0].Gateway = "changed", "changed"
		m.Labels["app"], m.Nodes[0] = "changed", "changed"
		for i, e := range f.Events {
			if i == 2 {
				continue
			}
			if !proto.Equal(e, routes[i]) {
				t.Fatalf("event %d changed with event 2: got %v, want %v", i, e, routes[i])
			}
		}
	})
}

// BenchmarkUnmarshalVTUnsafeSlab decodes a frame of 200 routes as the fan-out's clients
// receive them (three next hops; two labels, or none), with UnmarshalVTUnsafe,
// UnmarshalVTUnsafeSlab, and into the used storage of a PooledFrame.
func BenchmarkUnmarshalVTUnsafeSlab(b *testing.B) {
	for _, labels := range []map[string]string{nil, {"app": "web", "env": "prod"}} {
		var events []*WatchEvent
		for i := range 200 {
			o := slabRoute(i, 3, true)
			o.Meta.Labels, o.Meta.Nodes = labels, nil
			events = append(events, &WatchEvent{Type: WatchEvent_TYPE_PUT, Object: o, Revision: uint64(i + 1)})
		}
		data := marshalFrame(b, events, nil)
		var st frameStorage
		st.data = data
		pooled := func(*WatchFrame, []byte) error {
			st.frame.Reset()
			st.slab.reset()
			return st.slab.decode(&st.frame, st.data)
		}
		for _, bc := range []struct {
			name   string
			decode func(*WatchFrame, []byte) error
		}{
			{"UnmarshalVTUnsafe", (*WatchFrame).UnmarshalVTUnsafe},
			{"UnmarshalVTUnsafeSlab", (*WatchFrame).UnmarshalVTUnsafeSlab},
			{"PooledFrame", pooled},
		} {
			b.Run(fmt.Sprintf("labels=%d/%s", len(labels), bc.name), func(b *testing.B) {
				b.ReportAllocs()
				b.SetBytes(int64(len(data)))
				var f WatchFrame
				for b.Loop() {
					f = WatchFrame{}
					if err := bc.decode(&f, data); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(events)), "ns/event")
			})
		}
	}
}
