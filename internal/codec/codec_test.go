package codec

import (
	"bytes"
	"fmt"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc/encoding"
	protoenc "google.golang.org/grpc/encoding/proto"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// nimbusMessages returns, for every message of nimbus.v1, populated instances: every
// field set, one instance per member of its largest oneof.
func nimbusMessages(t testing.TB) map[string]proto.Message {
	t.Helper()
	out := map[string]proto.Message{}
	var walk func(protoreflect.MessageDescriptors)
	walk = func(mds protoreflect.MessageDescriptors) {
		for i := range mds.Len() {
			md := mds.Get(i)
			if md.IsMapEntry() {
				continue
			}
			walk(md.Messages())
			mt, err := protoregistry.GlobalTypes.FindMessageByName(md.FullName())
			if err != nil {
				t.Fatalf("finding %s: %v", md.FullName(), err)
			}
			variants := 1
			for j := range md.Oneofs().Len() {
				variants = max(variants, md.Oneofs().Get(j).Fields().Len())
			}
			for v := range variants {
				m := mt.New()
				populate(m, v, 3)
				out[fmt.Sprintf("%s/%d", md.FullName(), v)] = m.Interface()
			}
		}
	}
	walk(nimbusv1.File_nimbus_v1_nimbus_proto.Messages())
	if len(out) < 40 {
		t.Fatalf("found %d nimbus.v1 messages, want at least 40", len(out))
	}
	return out
}

// populate sets every field of m to a value other than its default, strings with
// characters beyond ASCII; of each oneof it sets the member choice selects, modulo the
// oneof's size. It stops depth messages down.
func populate(m protoreflect.Message, choice, depth int) {
	fields := m.Descriptor().Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		if od := fd.ContainingOneof(); od != nil && !od.IsSynthetic() {
			if od.Fields().Get(choice%od.Fields().Len()) != fd {
				continue
			}
		}
		switch {
		case fd.IsMap():
			mp := m.Mutable(fd).Map()
			for k := range 2 {
				key := scalar(fd.MapKey(), k).MapKey()
				if fd.MapValue().Message() != nil {
					v := mp.NewValue()
					populate(v.Message(), choice, depth-1)
					mp.Set(key, v)
				} else {
					mp.Set(key, scalar(fd.MapValue(), k))
				}
			}
		case fd.IsList():
			l := m.Mutable(fd).List()
			for k := range 2 {
				if fd.Message() != nil {
					if depth == 0 {
						break
					}
					v := l.NewElement()
					populate(v.Message(), choice, depth-1)
					l.Append(v)
				} else {
					l.Append(scalar(fd, k))
				}
			}
		case fd.Message() != nil:
			if depth > 0 {
				populate(m.Mutable(fd).Message(), choice, depth-1)
			}
		default:
			m.Set(fd, scalar(fd, 0))
		}
	}
}

// scalar returns the k-th test value of a scalar field.
func scalar(fd protoreflect.FieldDescriptor, k int) protoreflect.Value {
	n := int64(fd.Number())*1000 + int64(k) + 1
	switch fd.Kind() {
	case protoreflect.BoolKind:
		return protoreflect.ValueOfBool(true)
	case protoreflect.EnumKind:
		vals := fd.Enum().Values()
		return protoreflect.ValueOfEnum(vals.Get(vals.Len() - 1 - k%vals.Len()).Number())
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		return protoreflect.ValueOfInt32(int32(-n))
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		return protoreflect.ValueOfInt64(-n << 33)
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		return protoreflect.ValueOfUint32(uint32(n))
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return protoreflect.ValueOfUint64(uint64(n) << 33)
	case protoreflect.FloatKind:
		return protoreflect.ValueOfFloat32(float32(n) / 3)
	case protoreflect.DoubleKind:
		return protoreflect.ValueOfFloat64(float64(n) / 3)
	case protoreflect.StringKind:
		return protoreflect.ValueOfString(fmt.Sprintf("%s-%d-é名", fd.Name(), k))
	case protoreflect.BytesKind:
		return protoreflect.ValueOfBytes([]byte{byte(k), 0xff, 0})
	}
	panic(fmt.Sprintf("no test value for %v", fd.Kind()))
}

// countingPool is a mem.BufferPool that counts what it hands out and takes back.
type countingPool struct {
	mu       sync.Mutex
	got, put int
	// last is the last buffer handed out.
	last *[]byte
}

func (p *countingPool) Get(n int) *[]byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.got++
	b := make([]byte, n)
	p.last = &b
	return &b
}

func (p *countingPool) Put(b *[]byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.put++
	// A buffer back in the pool is reused: whatever still points into it sees this.
	for i := range *b {
		(*b)[i] = 0xAA
	}
}

func (p *countingPool) counts() (got, put int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.got, p.put
}

// split cuts b into pieces of at most n bytes, each in a buffer of pool.
func split(b []byte, n int, pool mem.BufferPool) mem.BufferSlice {
	var s mem.BufferSlice
	for len(b) > 0 {
		k := min(n, len(b))
		buf := pool.Get(k)
		copy(*buf, b[:k])
		s = append(s, mem.NewBuffer(buf, pool))
		b = b[k:]
	}
	return s
}

func TestEveryNimbusMessageHasVTMethods(t *testing.T) {
	for name, m := range nimbusMessages(t) {
		if _, ok := m.(vtMessage); !ok {
			t.Errorf("%s (%T) lacks the generated vtprotobuf methods: run make proto", name, m)
		}
	}
}

// TestRoundTrip checks, for every nimbus message, that Codec decodes what proto.Marshal
// encodes and encodes what proto.Unmarshal decodes, to equal messages.
func TestRoundTrip(t *testing.T) {
	for name, want := range nimbusMessages(t) {
		t.Run(name, func(t *testing.T) {
			wire, err := proto.Marshal(want)
			if err != nil {
				t.Fatal(err)
			}
			got := want.ProtoReflect().New().Interface()
			if err := (Codec{}).Unmarshal(mem.BufferSlice{mem.SliceBuffer(wire)}, got); err != nil {
				t.Fatalf("Unmarshal: %v", err)
			}
			if !proto.Equal(got, want) {
				t.Errorf("Unmarshal(proto.Marshal(m)) = %v, want %v", got, want)
			}

			data, err := Codec{}.Marshal(want)
			if err != nil {
				t.Fatalf("Marshal: %v", err)
			}
			defer data.Free()
			enc := data.Materialize()
			if len(enc) != len(wire) {
				t.Errorf("Marshal: %d bytes, proto.Marshal: %d", len(enc), len(wire))
			}
			back := want.ProtoReflect().New().Interface()
			if err := proto.Unmarshal(enc, back); err != nil {
				t.Fatalf("proto.Unmarshal(Marshal(m)): %v", err)
			}
			if !proto.Equal(back, want) {
				t.Errorf("proto.Unmarshal(Marshal(m)) = %v, want %v", back, want)
			}
		})
	}
}

// TestFallback checks that messages without vtprotobuf methods are encoded and decoded
// as gRPC's proto codec does, and that values that are no messages are refused.
func TestFallback(t *testing.T) {
	grpcCodec := encoding.GetCodecV2(protoenc.Name)
	// One field: proto.Marshal writes a map's entries in random order.
	large, err := structpb.NewStruct(map[string]any{"name": strings.Repeat("é", 4000)})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []proto.Message{
		&healthpb.HealthCheckRequest{Service: "nimbus.v1.Nimbus"},
		timestamppb.New(timestamppb.Now().AsTime()),
		large,
	} {
		t.Run(fmt.Sprintf("%T", m), func(t *testing.T) {
			if _, ok := m.(vtMessage); ok {
				t.Fatalf("%T has vtprotobuf methods; pick another message", m)
			}
			data, err := Codec{}.Marshal(m)
			if err != nil {
				t.Fatalf("Marshal: %v", err)
			}
			defer data.Free()
			want, err := grpcCodec.Marshal(m)
			if err != nil {
				t.Fatal(err)
			}
			defer want.Free()
			if !bytes.Equal(data.Materialize(), want.Materialize()) {
				t.Errorf("Marshal differs from gRPC's proto codec")
			}
			got := m.ProtoReflect().New().Interface()
			if err := (Codec{}).Unmarshal(data, got); err != nil {
				t.Fatalf("Unmarshal: %v", err)
			}
			if !proto.Equal(got, m) {
				t.Errorf("Unmarshal(Marshal(m)) = %v, want %v", got, m)
			}
		})
	}
	if _, err := (Codec{}).Marshal("not a message"); err == nil {
		t.Error("Marshal of a string: no error")
	}
	var s string
	if err := (Codec{}).Unmarshal(mem.BufferSlice{mem.SliceBuffer{}}, &s); err == nil {
		t.Error("Unmarshal into a string: no error")
	}
}

// bigFrame returns a WatchFrame of about n bytes of PUT events, as nimbus sends them.
func bigFrame(n int) *nimbusv1.WatchFrame {
	f := &nimbusv1.WatchFrame{}
	for i := 0; proto.Size(f) < n; i++ {
		f.Events = append(f.Events, putEvent(i))
	}
	f.Events = f.Events[:len(f.Events)-1]
	return f
}

// putEvent is the i-th event of a stream, a Route as nimbus stores it.
func putEvent(i int) *nimbusv1.WatchEvent {
	ts := &timestamppb.Timestamp{Seconds: 1_760_000_000 + int64(i), Nanos: int32(i)}
	obj := &nimbusv1.Object{
		Meta: &nimbusv1.ObjectMeta{
			Tenant: "default", Namespace: "default", Name: fmt.Sprintf("route-%05d", i),
			Uid: fmt.Sprintf("6f1c2a4e-0d3b-4c55-9a7e-%012d", i), Generation: 1, Revision: uint64(i + 1),
			Labels: map[string]string{"app": "bench"}, CreateTime: ts, UpdateTime: ts,
		},
		Spec: &nimbusv1.Object_Route{Route: &nimbusv1.RouteSpec{
			Table: 100, Prefix: fmt.Sprintf("10.%d.%d.0/24", i/256%256, i%256),
			Nexthops: []*nimbusv1.NextHop{{Gateway: "192.0.2.1", Device: "eth0", Weight: 1}},
		}},
	}
	return &nimbusv1.WatchEvent{
		Type: nimbusv1.WatchEvent_TYPE_PUT, Object: obj, Key: obj.Key(),
		Revision: uint64(i + 1), Epoch: "0f5e3c1d9a7b2e4f",
	}
}

// TestUnmarshalBuffers checks that Unmarshal handles data in one buffer or in pieces,
// frees the buffer it gathers pieces into (with ShareData, takes none from the pool),
// leaves data to its caller, and keeps nothing of either: the message stays intact once
// the buffers are back in their pool and overwritten.
func TestUnmarshalBuffers(t *testing.T) {
	want := bigFrame(32 << 10)
	wire, err := proto.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	for _, share := range []bool{false, true} {
		for _, piece := range []int{len(wire), 8 << 10, 1000} {
			t.Run(fmt.Sprintf("ShareData=%v/pieces-of-%d", share, piece), func(t *testing.T) {
				testUnmarshalBuffers(t, Codec{ShareData: share}, wire, want, piece)
			})
		}
	}
}

func testUnmarshalBuffers(t *testing.T, c Codec, wire []byte, want proto.Message, piece int) {
	t.Helper()
	dataPool, codecPool := &countingPool{}, &countingPool{}
	c.pool = codecPool
	data := split(wire, piece, dataPool)
	got := &nimbusv1.WatchFrame{}
	if err := c.Unmarshal(data, got); err != nil {
		t.Fatalf("Unmarshal: %v", err)
	}
	if g, p := codecPool.counts(); g != p {
		t.Errorf("codec pool: %d buffers taken, %d given back", g, p)
	}
	wantTaken := 0
	if len(data) > 1 && !c.ShareData {
		wantTaken = 1
	}
	if g, p := codecPool.counts(); g != wantTaken {
		t.Errorf("codec pool: %d buffers taken (%d given back) for %d pieces, want %d", g, p, len(data), wantTaken)
	}
	if _, p := dataPool.counts(); p != 0 {
		t.Errorf("Unmarshal gave back %d of the caller's buffers", p)
	}
	if !bytes.Equal(data.Materialize(), wire) {
		t.Errorf("Unmarshal changed the caller's buffers")
	}
	data.Free() // As gRPC does once Unmarshal returns; the pool overwrites them.
	if g, p := dataPool.counts(); piece >= 1<<10 && g != p {
		t.Errorf("data pool: %d buffers taken, %d given back after Free", g, p)
	}
	if !proto.Equal(got, want) {
		t.Errorf("decoded frame changed once its buffers were reused: aliasing")
	}
}

// TestUnmarshalPooledFrame checks that a PooledFrame is decoded into its own storage,
// whatever pieces the message arrives in and whether or not ShareData is set: it equals
// the frame sent, holds nothing of the caller's buffers, takes nothing from the codec's
// pool, and has its strings checked unless SkipUTF8Check is set.
func TestUnmarshalPooledFrame(t *testing.T) {
	want := bigFrame(32 << 10)
	wire, err := proto.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	for _, share := range []bool{false, true} {
		for _, piece := range []int{len(wire), 8 << 10, 1000} {
			t.Run(fmt.Sprintf("ShareData=%v/pieces-of-%d", share, piece), func(t *testing.T) {
				dataPool, codecPool := &countingPool{}, &countingPool{}
				data := split(wire, piece, dataPool)
				var got nimbusv1.PooledFrame
				defer got.Release()
				if err := (Codec{ShareData: share, pool: codecPool}).Unmarshal(data, &got); err != nil {
					t.Fatalf("Unmarshal: %v", err)
				}
				if g, _ := codecPool.counts(); g != 0 {
					t.Errorf("codec pool: %d buffers taken, want none", g)
				}
				data.Free()
				if !proto.Equal(got.Frame(), want) || got.Size() != len(wire) {
					t.Errorf("decoded %d events in %d bytes, unlike the %d events in %d bytes sent, once the caller's buffers were freed", len(got.Events()), got.Size(), len(want.GetEvents()), len(wire))
				}
			})
		}
	}
	t.Run("invalid-UTF-8", func(t *testing.T) {
		ev := putEvent(1)
		ev.Object.GetRoute().Nexthops[0].Device = "eth\xff"
		bad, err := Codec{SkipUTF8Check: true}.Marshal(&nimbusv1.WatchFrame{Events: []*nimbusv1.WatchEvent{ev}})
		if err != nil {
			t.Fatal(err)
		}
		var got nimbusv1.PooledFrame
		defer got.Release()
		if err := (Codec{ShareData: true}).Unmarshal(bad, &got); err == nil {
			t.Error("Unmarshal of a string that is not UTF-8: no error")
		}
		if err := (Codec{ShareData: true, SkipUTF8Check: true}).Unmarshal(bad, &got); err != nil || len(got.Events()) != 1 {
			t.Errorf("Unmarshal with SkipUTF8Check: %d events, error %v; want 1 event", len(got.Events()), err)
		}
	})
}

// TestMarshalBuffers checks that a large message is encoded into a buffer of the pool,
// which Free gives back, and a small one into a buffer of its own, as gRPC's proto codec
// does.
func TestMarshalBuffers(t *testing.T) {
	for _, tc := range []struct {
		name   string
		m      proto.Message
		pooled bool
	}{
		{"small", putEvent(1), false},
		{"large", bigFrame(32 << 10), true},
		{"large-fallback", func() proto.Message {
			s, _ := structpb.NewStruct(map[string]any{"k": strings.Repeat("x", 4000)})
			return s
		}(), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pool := &countingPool{}
			data, err := Codec{pool: pool}.Marshal(tc.m)
			if err != nil {
				t.Fatal(err)
			}
			want, err := proto.Marshal(tc.m)
			if err != nil {
				t.Fatal(err)
			}
			if got := data.Len(); got != len(want) {
				t.Errorf("Marshal: %d bytes, want %d", got, len(want))
			}
			if g, _ := pool.counts(); (g == 1) != tc.pooled || g > 1 {
				t.Errorf("Marshal took %d buffers from the pool; pooled: %v", g, tc.pooled)
			}
			data.Free()
			if g, p := pool.counts(); g != p {
				t.Errorf("after Free: %d buffers taken, %d given back", g, p)
			}
		})
	}
}

// TestUnmarshalResets checks that Unmarshal replaces what the message held, as
// proto.Unmarshal does, and does not merge into it.
func TestUnmarshalResets(t *testing.T) {
	want := putEvent(1)
	wire, err := proto.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	got := putEvent(2)
	got.Key.Tenant = "other"
	if err := (Codec{}).Unmarshal(mem.BufferSlice{mem.SliceBuffer(wire)}, got); err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(got, want) {
		t.Errorf("Unmarshal into a used message = %v, want %v", got, want)
	}
}

// TestMarshalRefusesInvalidUTF8 checks that Marshal refuses, as proto.Marshal does, a
// proto3 string that is not UTF-8, unless told to skip the check.
func TestMarshalRefusesInvalidUTF8(t *testing.T) {
	ev := putEvent(1)
	ev.Object.GetRoute().Nexthops[0].Device = "eth\xff"
	m := &nimbusv1.WatchFrame{Events: []*nimbusv1.WatchEvent{putEvent(0), ev}}
	if _, err := proto.Marshal(m); err == nil {
		t.Fatal("proto.Marshal accepts the test message")
	}
	if _, err := (Codec{}).Marshal(m); err == nil {
		t.Error("Marshal: no error")
	}
	data, err := Codec{SkipUTF8Check: true}.Marshal(m)
	if err != nil {
		t.Fatalf("Marshal with SkipUTF8Check: %v", err)
	}
	got := &nimbusv1.WatchFrame{}
	if err := (proto.UnmarshalOptions{}).Unmarshal(data.Materialize(), got); err == nil {
		t.Error("proto.Unmarshal accepts what Marshal with SkipUTF8Check encoded")
	}
}

// TestUnmarshalRefuses checks that Unmarshal refuses what proto.Unmarshal refuses:
// proto3 strings that are not UTF-8, wherever they are nested, and malformed wire.
func TestUnmarshalRefuses(t *testing.T) {
	const mark = "MARK"
	invalid := func(mutate func(ev *nimbusv1.WatchEvent)) []byte {
		ev := putEvent(3)
		mutate(ev)
		b, err := proto.Marshal(&nimbusv1.WatchFrame{Events: []*nimbusv1.WatchEvent{putEvent(1), ev}})
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Count(b, []byte(mark)) != 1 {
			t.Fatalf("mark not found once in %q", b)
		}
		return bytes.Replace(b, []byte(mark), []byte("\xff\xfe\xfd\xfc"), 1)
	}
	valid, err := proto.Marshal(bigFrame(2000))
	if err != nil {
		t.Fatal(err)
	}
	utf8Only := map[string]bool{"epoch": true, "key-name": true, "label-key": true, "label-value": true, "nexthop-gateway": true, "node": true}
	for _, tc := range []struct {
		name string
		wire []byte
	}{
		{"epoch", invalid(func(ev *nimbusv1.WatchEvent) { ev.Epoch = mark })},
		{"key-name", invalid(func(ev *nimbusv1.WatchEvent) { ev.Key.Name = mark })},
		{"label-key", invalid(func(ev *nimbusv1.WatchEvent) { ev.Object.Meta.Labels[mark] = "v" })},
		{"label-value", invalid(func(ev *nimbusv1.WatchEvent) { ev.Object.Meta.Labels["k"] = mark })},
		{"nexthop-gateway", invalid(func(ev *nimbusv1.WatchEvent) { ev.Object.GetRoute().Nexthops[0].Gateway = mark })},
		{"node", invalid(func(ev *nimbusv1.WatchEvent) { ev.Object.Meta.Nodes = []string{"a", mark} })},
		{"truncated", valid[:len(valid)-3]},
		{"bad-length", append(bytes.Clone(valid), 0x0a, 0x20, 0x01)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := proto.Unmarshal(tc.wire, &nimbusv1.WatchFrame{}); err == nil {
				t.Fatal("proto.Unmarshal accepts the test input")
			}
			if err := (Codec{}).Unmarshal(mem.BufferSlice{mem.SliceBuffer(tc.wire)}, &nimbusv1.WatchFrame{}); err == nil {
				t.Error("Unmarshal: no error")
			}
			skip := Codec{SkipUTF8Check: true}
			err := skip.Unmarshal(mem.BufferSlice{mem.SliceBuffer(tc.wire)}, &nimbusv1.WatchFrame{})
			if malformed := !utf8Only[tc.name]; malformed && err == nil {
				t.Error("Unmarshal with SkipUTF8Check of malformed wire: no error")
			} else if !malformed && err != nil {
				t.Errorf("Unmarshal with SkipUTF8Check: %v, want it to skip the UTF-8 check", err)
			}
		})
	}
}
