package codec

import (
	"testing"

	"google.golang.org/grpc/encoding"
	protoenc "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// BenchmarkDecodeWatchFrame decodes a WatchFrame of 32 KiB (nimbus's bound) of PUT
// events as an agent receives it: with proto.Unmarshal, with gRPC's proto codec, with the
// generated UnmarshalVT alone, and with Codec, with and without its UTF-8 check (and the
// check alone). It
// reports the time and allocations per frame and, as ns/event, per event.
func BenchmarkDecodeWatchFrame(b *testing.B) {
	f := bigFrame(32 << 10)
	wire, err := proto.Marshal(f)
	if err != nil {
		b.Fatal(err)
	}
	events := len(f.GetEvents())
	grpcCodec := encoding.GetCodecV2(protoenc.Name)
	for _, bc := range []struct {
		name   string
		decode func(m *nimbusv1.WatchFrame) error
	}{
		{"proto.Unmarshal", func(m *nimbusv1.WatchFrame) error { return proto.Unmarshal(wire, m) }},
		{"grpc-proto-codec", func(m *nimbusv1.WatchFrame) error {
			return grpcCodec.Unmarshal(mem.BufferSlice{mem.SliceBuffer(wire)}, m)
		}},
		{"UnmarshalVT", func(m *nimbusv1.WatchFrame) error { return m.UnmarshalVT(wire) }},
		{"codec", func(m *nimbusv1.WatchFrame) error {
			return Codec{}.Unmarshal(mem.BufferSlice{mem.SliceBuffer(wire)}, m)
		}},
		{"codec-SkipUTF8Check", func(m *nimbusv1.WatchFrame) error {
			return Codec{SkipUTF8Check: true}.Unmarshal(mem.BufferSlice{mem.SliceBuffer(wire)}, m)
		}},
		{"codec-SkipUTF8Check-ShareData", func(m *nimbusv1.WatchFrame) error {
			return Codec{SkipUTF8Check: true, ShareData: true}.Unmarshal(mem.BufferSlice{mem.SliceBuffer(wire)}, m)
		}},
		{"checkUTF8", func(m *nimbusv1.WatchFrame) error { return checkUTF8(wire, m.ProtoReflect().Descriptor()) }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.SetBytes(int64(len(wire)))
			b.ReportAllocs()
			for b.Loop() {
				var m nimbusv1.WatchFrame
				if err := bc.decode(&m); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*events), "ns/event")
		})
	}
}
