package nimbusv1

import (
	"maps"
	"unsafe"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// UnmarshalVTUnsafeSlab decodes dAtA into m as UnmarshalVTUnsafe does, with the same
// messages, the same field values and strings that are views of dAtA, but it allocates
// the messages of the frame's events together: one array of events, one of objects, one
// of metas, and so on, for the whole frame, instead of one allocation per message. A
// frame of routes costs about ten allocations instead of ten per event, and the garbage
// collector has that many fewer objects to track.
//
// Every message it returns is still a message of its own: changing one changes no other.
// But the arrays live as long as any of their messages does, so a caller that keeps one
// object of the frame keeps the memory of the frame's other messages too, as it already
// keeps dAtA through the object's strings. Use it where, as in an agent's watch, every
// decoded event is dropped soon after (delphi keeps objects encoded afresh).
//
// Events, objects, metas (with their target nodes), keys, timestamps and routes (with
// their next hops) come from the arrays, and labels go into a map per labelled meta, one
// that the storage of a PooledFrame clears and reuses; any other field, or anything the
// fast path does not expect (an unknown field, a field repeated, a malformed event), is
// decoded by UnmarshalVTUnsafe, which gives the same result or the same error.
func (m *WatchFrame) UnmarshalVTUnsafeSlab(dAtA []byte) error {
	var s frameSlab
	return s.decode(m, dAtA)
}

// decode decodes the frame dAtA into m with messages from s, as UnmarshalVTUnsafeSlab
// describes.
func (s *frameSlab) decode(m *WatchFrame, dAtA []byte) error {
	n, ok := countEvents(dAtA)
	if !ok {
		return m.UnmarshalVTUnsafe(dAtA)
	}
	s.left = n
	events := s.events.take(n, n)
	m.Events = append(s.eventPtrs.take(len(m.Events)+n, 0)[:0], m.Events...)
	for i := 0; len(dAtA) > 0; i++ {
		// countEvents checked every tag and length.
		_, _, tn := protowire.ConsumeTag(dAtA)
		b, bn := protowire.ConsumeBytes(dAtA[tn:])
		dAtA = dAtA[tn+bn:]
		ev := &events[i]
		if !s.event(ev, b) {
			*ev = WatchEvent{}
			if err := ev.UnmarshalVTUnsafe(b); err != nil {
				return err
			}
		}
		m.Events = append(m.Events, ev)
		s.left--
	}
	return nil
}

// countEvents returns the number of events in the encoded frame b, and false when b holds
// anything but events (field 1, length-delimited) or is malformed.
func countEvents(b []byte) (int, bool) {
	n := 0
	for len(b) > 0 {
		num, typ, tn := protowire.ConsumeTag(b)
		if tn < 0 || num != 1 || typ != protowire.BytesType {
			return 0, false
		}
		_, bn := protowire.ConsumeBytes(b[tn:])
		if bn < 0 {
			return 0, false
		}
		b = b[tn+bn:]
		n++
	}
	return n, true
}

// frameSlab hands out the messages of one frame's events from arrays that each hold as
// many as the events still to decode, so that a frame of one kind of object allocates
// each array once. A frameSlab that is reset hands the same arrays out again
// (PooledFrame): a stream of frames then allocates nothing once its arrays are as large
// as its frames need.
type frameSlab struct {
	// left is the number of events still to decode, the current one included: the size of
	// the next array of any message.
	left       int
	events     slab[WatchEvent]
	eventPtrs  slab[*WatchEvent]
	objects    slab[Object]
	metas      slab[ObjectMeta]
	keys       slab[ObjectKey]
	timestamps slab[timestamppb.Timestamp]
	routes     slab[routeObject]
	nexthops   slab[NextHop]
	hopPtrs    slab[*NextHop]
	nodes      slab[string]
	labels     mapSlab
}

// reset zeroes every message handed out, so that the arrays can be handed out again.
func (s *frameSlab) reset() {
	s.left = 0
	s.events.reset()
	s.eventPtrs.reset()
	s.objects.reset()
	s.metas.reset()
	s.keys.reset()
	s.timestamps.reset()
	s.routes.reset()
	s.nexthops.reset()
	s.hopPtrs.reset()
	s.nodes.reset()
	s.labels.reset()
}

// routeObject is a route's oneof wrapper and spec, allocated together.
type routeObject struct {
	wrapper Object_Route
	spec    RouteSpec
}

// slab hands out elements of arrays of T.
type slab[T any] struct {
	// free is the current array; used counts the elements handed out from it, need those
	// handed out from every array since the last reset.
	free       []T
	used, need int
}

// take returns n elements, from a new array of at least chunk elements when the current
// one has fewer than n left.
func (s *slab[T]) take(n, chunk int) []T {
	s.need += n
	if len(s.free)-s.used < n {
		s.free, s.used = make([]T, max(n, chunk)), 0
	}
	t := s.free[s.used : s.used+n : s.used+n]
	s.used += n
	return t
}

// reset zeroes the elements handed out from the current array and makes them available
// again. When they came from more than one array, the next round starts on a new array
// that holds them all.
func (s *slab[T]) reset() {
	if s.need > s.used {
		s.free = make([]T, s.need)
	} else {
		clear(s.free[:s.used])
	}
	s.used, s.need = 0, 0
}

// one returns one element.
func (s *slab[T]) one(chunk int) *T { return &s.take(1, chunk)[0] }

// maxReusedLabels is the most labels a map of a frame's labels may have held to be handed
// out again: a map keeps the room it grew to, and one grown for a rare object with many
// labels is left to the garbage collector.
const maxReusedLabels = 16

// mapSlab hands out the maps of a frame's labels, the maps of the frames before it
// cleared: a Go map is an allocation of its own (two, once it holds an entry), which no
// array of maps can share, but a cleared map keeps its room.
type mapSlab struct {
	// maps holds the maps handed out since the last reset, then those to hand out again;
	// used counts the first. A nil map is made when handed out.
	maps []map[string]string
	used int
}

// take returns an empty map.
func (s *mapSlab) take() map[string]string {
	if s.used == len(s.maps) {
		s.maps = append(s.maps, nil)
	}
	m := s.maps[s.used]
	if m == nil {
		m = make(map[string]string)
		s.maps[s.used] = m
	}
	s.used++
	return m
}

// reset clears the maps handed out, so that they can be handed out again.
func (s *mapSlab) reset() {
	for i, m := range s.maps[:s.used] {
		if len(m) > maxReusedLabels {
			s.maps[i] = nil
		} else {
			clear(m)
		}
	}
	s.used = 0
}

// field reads the field at the start of b: its number and wire type, its value (v for a
// length-delimited field, x for any other) and the length of the whole field, or n < 0
// when b does not start with a well-formed field. Tags and lengths of one byte, nearly
// all of a frame's, take the short path.
func field(b []byte) (num protowire.Number, typ protowire.Type, v []byte, x uint64, n int) {
	if len(b) >= 2 && b[0] < 0x80 {
		num, typ, n = protowire.Number(b[0]>>3), protowire.Type(b[0]&7), 1
		if typ == protowire.BytesType && b[1] < 0x80 {
			end := 2 + int(b[1])
			if end > len(b) {
				return 0, 0, nil, 0, -1
			}
			return num, typ, b[2:end], 0, end
		}
		if typ == protowire.VarintType && b[1] < 0x80 {
			return num, typ, nil, uint64(b[1]), 2
		}
	} else {
		var tn int
		num, typ, tn = protowire.ConsumeTag(b)
		if tn < 0 {
			return 0, 0, nil, 0, -1
		}
		n = tn
	}
	vn := -1
	switch typ {
	case protowire.VarintType:
		x, vn = protowire.ConsumeVarint(b[n:])
	case protowire.BytesType:
		v, vn = protowire.ConsumeBytes(b[n:])
	case protowire.Fixed64Type:
		x, vn = protowire.ConsumeFixed64(b[n:])
	case protowire.Fixed32Type:
		var x32 uint32
		x32, vn = protowire.ConsumeFixed32(b[n:])
		x = uint64(x32)
	}
	if vn >= 0 {
		return num, typ, v, x, n + vn
	}
	return 0, 0, nil, 0, -1 // a malformed value, or a group: none in nimbus.v1
}

// event decodes the encoded event b into ev, which is empty. It returns false when b
// holds anything it does not expect, leaving ev to be reset and decoded again.
func (s *frameSlab) event(ev *WatchEvent, b []byte) bool {
	for len(b) > 0 {
		num, typ, v, x, n := field(b)
		if n < 0 {
			return false
		}
		b = b[n:]
		switch {
		case num == 1 && typ == protowire.VarintType:
			ev.Type = WatchEvent_Type(x)
		case num == 2 && typ == protowire.BytesType && ev.Object == nil:
			ev.Object = s.objects.one(s.left)
			if !s.object(ev.Object, v) {
				return false
			}
		case num == 3 && typ == protowire.BytesType && ev.Key == nil:
			ev.Key = s.keys.one(s.left)
			if ev.Key.UnmarshalVTUnsafe(v) != nil {
				return false
			}
		case num == 4 && typ == protowire.VarintType:
			ev.Revision = x
		case num == 5 && typ == protowire.BytesType:
			ev.Epoch = unsafeString(v)
		default:
			return false
		}
	}
	return true
}

// object decodes the encoded object b into o, which is empty: its meta and a route's
// spec from the slab, any other kind's spec with UnmarshalVTUnsafe. It returns false
// when b holds anything it does not expect.
func (s *frameSlab) object(o *Object, b []byte) bool {
	for len(b) > 0 {
		num, typ, v, _, n := field(b)
		if n < 0 || typ != protowire.BytesType {
			return false
		}
		switch {
		case num == 1 && o.Meta == nil:
			o.Meta = s.metas.one(s.left)
			if !s.meta(o.Meta, v) {
				return false
			}
		case num == 15 && o.Spec == nil:
			r := s.routes.one(s.left)
			r.wrapper.Route = &r.spec
			o.Spec = &r.wrapper
			if !s.route(&r.spec, v) {
				return false
			}
		case num >= 10 && num <= 16 && o.Spec == nil:
			// Another kind: the generated decoder decodes the one field into an object of
			// its own, which sets its spec.
			var one Object
			if one.UnmarshalVTUnsafe(b[:n]) != nil || one.Spec == nil {
				return false
			}
			o.Spec = one.Spec
		default:
			return false
		}
		b = b[n:]
	}
	return true
}

// meta decodes the encoded meta b into m, which is empty, with its timestamps from the
// slab. It returns false when b holds anything it does not expect.
func (s *frameSlab) meta(m *ObjectMeta, b []byte) bool {
	for len(b) > 0 {
		num, typ, v, x, n := field(b)
		if n < 0 {
			return false
		}
		f := b
		b = b[n:]
		switch {
		case num >= 1 && num <= 4 && typ == protowire.BytesType:
			switch num {
			case 1:
				m.Tenant = unsafeString(v)
			case 2:
				m.Namespace = unsafeString(v)
			case 3:
				m.Name = unsafeString(v)
			case 4:
				m.Uid = unsafeString(v)
			}
		case num == 5 && typ == protowire.VarintType:
			m.Generation = int64(x)
		case num == 6 && typ == protowire.VarintType:
			m.Revision = x
		case num == 7 && typ == protowire.BytesType:
			if m.Labels == nil {
				m.Labels = s.labels.take()
			}
			if k, v, ok := label(v); ok {
				m.Labels[k] = v
				break
			}
			// A label entry with anything else: the generated decoder decodes the one
			// field into a meta of its own.
			var one ObjectMeta
			if one.UnmarshalVTUnsafe(f[:n]) != nil {
				return false
			}
			maps.Copy(m.Labels, one.Labels)
		case num == 8 && typ == protowire.BytesType:
			if m.Nodes == nil {
				// Room for this node and those right after it: a repeated field is
				// encoded in one run. Nodes further on grow the slice.
				m.Nodes = s.nodes.take(run(b, 8), s.left)[:0]
			}
			m.Nodes = append(m.Nodes, unsafeString(v))
		case num == 9 && typ == protowire.BytesType && m.CreateTime == nil:
			m.CreateTime = s.timestamps.one(2 * s.left)
			if !timestamp(m.CreateTime, v) {
				return false
			}
		case num == 10 && typ == protowire.BytesType && m.UpdateTime == nil:
			m.UpdateTime = s.timestamps.one(2 * s.left)
			if !timestamp(m.UpdateTime, v) {
				return false
			}
		default:
			return false
		}
	}
	return true
}

// label returns the key and value of the encoded label entry b, and false when b holds
// anything but a key and a value (field 1 and 2, each at most once, either left out for
// "").
func label(b []byte) (key, value string, ok bool) {
	var seen [3]bool
	for len(b) > 0 {
		num, typ, v, _, n := field(b)
		if n < 0 || typ != protowire.BytesType || (num != 1 && num != 2) || seen[num] {
			return "", "", false
		}
		seen[num] = true
		if num == 1 {
			key = unsafeString(v)
		} else {
			value = unsafeString(v)
		}
		b = b[n:]
	}
	return key, value, true
}

// run returns the length of the run of length-delimited fields numbered num that starts
// with the one just read: that one and those at the start of b, the rest of the message.
func run(b []byte, num protowire.Number) int {
	n := 1
	for len(b) > 0 {
		fnum, typ, _, _, fn := field(b)
		if fn < 0 || fnum != num || typ != protowire.BytesType {
			break
		}
		b = b[fn:]
		n++
	}
	return n
}

// timestamp decodes the encoded timestamp b into t, which is empty. It returns false when
// b holds anything it does not expect.
func timestamp(t *timestamppb.Timestamp, b []byte) bool {
	for len(b) > 0 {
		num, typ, _, x, n := field(b)
		if n < 0 || typ != protowire.VarintType {
			return false
		}
		switch num {
		case 1:
			t.Seconds = int64(x)
		case 2:
			t.Nanos = int32(x)
		default:
			return false
		}
		b = b[n:]
	}
	return true
}

// route decodes the encoded route spec b into r, which is empty, with its next hops from
// the slab. It returns false when b holds anything it does not expect.
func (s *frameSlab) route(r *RouteSpec, b []byte) bool {
	for len(b) > 0 {
		num, typ, v, x, n := field(b)
		if n < 0 {
			return false
		}
		b = b[n:]
		switch {
		case num == 1 && typ == protowire.VarintType:
			r.Table = uint32(x)
		case num == 2 && typ == protowire.BytesType:
			r.Prefix = unsafeString(v)
		case num == 3 && typ == protowire.BytesType:
			if r.Nexthops == nil {
				// Room for this next hop and those right after it (an ECMP route's):
				// next hops further on grow the slice.
				r.Nexthops = s.hopPtrs.take(run(b, 3), s.left)[:0]
			}
			h := s.nexthops.one(s.left)
			r.Nexthops = append(r.Nexthops, h)
			if !nexthop(h, v) {
				return false
			}
		case num == 4 && typ == protowire.VarintType:
			r.Metric = uint32(x)
		case num == 5 && typ == protowire.VarintType:
			r.TenantTable = x != 0
		default:
			return false
		}
	}
	return true
}

// nexthop decodes the encoded next hop b into h, which is empty. It returns false when b
// holds anything it does not expect.
func nexthop(h *NextHop, b []byte) bool {
	for len(b) > 0 {
		num, typ, v, x, n := field(b)
		if n < 0 {
			return false
		}
		b = b[n:]
		switch {
		case num == 1 && typ == protowire.BytesType:
			h.Gateway = unsafeString(v)
		case num == 2 && typ == protowire.BytesType:
			h.Device = unsafeString(v)
		case num == 3 && typ == protowire.VarintType:
			h.Weight = uint32(x)
		default:
			return false
		}
	}
	return true
}

// unsafeString returns b as a string that shares b's bytes, as the generated
// UnmarshalVTUnsafe decodes strings.
func unsafeString(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(&b[0], len(b))
}
