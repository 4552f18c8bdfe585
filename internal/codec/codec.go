package codec

import (
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// Name is the codec's name, the one of gRPC's default proto codec.
const Name = "proto"

// vtMessage is a message with the methods protoc-gen-go-vtproto generates with the
// marshal, unmarshal and size features.
type vtMessage interface {
	proto.Message
	SizeVT() int
	MarshalToSizedBufferVT(b []byte) (int, error)
	UnmarshalVT(b []byte) error
}

// Codec is a gRPC codec (encoding.CodecV2) for protobuf messages that encodes and
// decodes with a message's generated vtprotobuf methods when it has them and with the
// proto package otherwise. The zero Codec is ready to use.
type Codec struct {
	// SkipUTF8Check makes Marshal and Unmarshal take proto3 strings without checking
	// that they are UTF-8, as MarshalVT and UnmarshalVT do and proto.Marshal and
	// proto.Unmarshal do not. The check reads the whole message once more, which costs
	// about a third of what decoding it does: skip it only for a peer whose strings were
	// checked already, such as nimbus, which sends only what proto.Marshal encoded or
	// what it checked when it took it in, and which checks what it receives. Default:
	// false, which checks.
	SkipUTF8Check bool
	// ShareData makes Unmarshal decode strings and bytes fields as views of one copy of
	// the message's bytes, made for that message, instead of a copy each: one allocation
	// per message instead of one per string, with the generated UnmarshalVTUnsafe. What
	// Unmarshal decodes then holds on to the whole message's bytes for as long as any of
	// its strings or bytes lives, so use it only where decoded messages are short-lived
	// or their strings are copied before they are kept, as nimbusclient's watch does
	// (delphi keeps objects encoded afresh). The views are never written to. A message
	// with an UnmarshalVTUnsafeSlab method (nimbus's WatchFrame) is decoded with it: the
	// messages it holds are allocated together and likewise live as long as any of them
	// does. Default: false, which copies every string. A message that brings storage of
	// its own (nimbus's PooledFrame) is decoded into it either way.
	ShareData bool
	// pool takes the buffers of large encodings and of decoded messages that arrive in
	// pieces. Default (nil): mem.DefaultBufferPool(), as gRPC's proto codec uses.
	pool mem.BufferPool
}

var _ encoding.CodecV2 = Codec{}

// DialOption returns the dial option that makes every call on a client connection use c.
func (c Codec) DialOption() grpc.DialOption {
	return grpc.WithDefaultCallOptions(grpc.ForceCodecV2(c))
}

// Name returns Name.
func (Codec) Name() string { return Name }

// bufferPool returns the pool the codec takes buffers from.
func (c Codec) bufferPool() mem.BufferPool {
	if c.pool == nil {
		return mem.DefaultBufferPool()
	}
	return c.pool
}

// Marshal returns the wire form of v, a protobuf message, as gRPC's proto codec does: a
// message of mem.BufferPoolingThreshold bytes or less in a buffer of its own, a larger
// one in a buffer from the pool, which the caller frees with the returned slice. Like
// proto.Marshal, it refuses a proto3 string that is not valid UTF-8, unless
// c.SkipUTF8Check is set.
func (c Codec) Marshal(v any) (mem.BufferSlice, error) {
	m, ok := v.(vtMessage)
	if !ok {
		return c.marshalProto(v)
	}
	size := m.SizeVT()
	if mem.IsBelowBufferPoolingThreshold(size) {
		b := make([]byte, size)
		if err := c.marshalVT(m, b); err != nil {
			return nil, err
		}
		return mem.BufferSlice{mem.SliceBuffer(b)}, nil
	}
	pool := c.bufferPool()
	b := pool.Get(size)
	if err := c.marshalVT(m, (*b)[:size]); err != nil {
		pool.Put(b)
		return nil, err
	}
	return mem.BufferSlice{mem.NewBuffer(b, pool)}, nil
}

// marshalVT encodes m into b, which is exactly m's size, and checks its strings unless
// c.SkipUTF8Check is set.
func (c Codec) marshalVT(m vtMessage, b []byte) error {
	md := m.ProtoReflect().Descriptor()
	n, err := m.MarshalToSizedBufferVT(b)
	if err != nil {
		return fmt.Errorf("encoding %s: %w", md.FullName(), err)
	}
	if n != len(b) {
		// MarshalToSizedBufferVT fills b from its end: the message changed size since
		// SizeVT, which only a concurrent change does.
		return fmt.Errorf("encoding %s: %d bytes, but its size was %d: changed while encoded", md.FullName(), n, len(b))
	}
	if !c.SkipUTF8Check {
		if err := checkUTF8(b, md); err != nil {
			return fmt.Errorf("encoding %s: %w", md.FullName(), err)
		}
	}
	return nil
}

// marshalProto is gRPC's proto codec's Marshal.
func (c Codec) marshalProto(v any) (mem.BufferSlice, error) {
	m := messageV2Of(v)
	if m == nil {
		return nil, fmt.Errorf("proto: failed to marshal, message is %T, want proto.Message", v)
	}
	// UseCachedSize reuses what Size just computed.
	size := proto.Size(m)
	opts := proto.MarshalOptions{UseCachedSize: true}
	if mem.IsBelowBufferPoolingThreshold(size) {
		b, err := opts.Marshal(m)
		if err != nil {
			return nil, err
		}
		return mem.BufferSlice{mem.SliceBuffer(b)}, nil
	}
	pool := c.bufferPool()
	b := pool.Get(size)
	if _, err := opts.MarshalAppend((*b)[:0], m); err != nil {
		pool.Put(b)
		return nil, err
	}
	return mem.BufferSlice{mem.NewBuffer(b, pool)}, nil
}

// unsafeMessage is a message with the methods protoc-gen-go-vtproto generates with the
// unmarshal_unsafe feature.
type unsafeMessage interface {
	proto.Message
	UnmarshalVTUnsafe(b []byte) error
}

// slabMessage is a message with a hand-written UnmarshalVTUnsafeSlab, which decodes as
// UnmarshalVTUnsafe does but allocates the messages it holds together (nimbus's
// WatchFrame): what a watch decodes most.
type slabMessage interface {
	proto.Message
	UnmarshalVTUnsafeSlab(b []byte) error
}

// pooledMessage is a message received into storage of its own that it reuses from one
// message to the next (nimbus's PooledFrame): the codec copies the encoded message into
// the n bytes Reserve returns, and Decode decodes them there.
type pooledMessage interface {
	Reserve(n int) []byte
	Decode() error
	Descriptor() protoreflect.MessageDescriptor
}

// Unmarshal decodes data into v, a protobuf message, which it resets first, as
// proto.Unmarshal does. It leaves data to the caller, and v holds no reference to it:
// the generated UnmarshalVT copies every string and bytes field, and with c.ShareData
// they share a copy of data made for v. Like proto.Unmarshal, it refuses a proto3
// string that is not valid UTF-8, unless c.SkipUTF8Check is set.
func (c Codec) Unmarshal(data mem.BufferSlice, v any) error {
	if m, ok := v.(pooledMessage); ok {
		return c.decodePooled(data, m)
	}
	if m, ok := v.(slabMessage); ok && c.ShareData {
		return c.decode(data.Materialize(), m, m.UnmarshalVTUnsafeSlab)
	}
	if m, ok := v.(unsafeMessage); ok && c.ShareData {
		// A new slice, which only m's fields will refer to.
		return c.decode(data.Materialize(), m, m.UnmarshalVTUnsafe)
	}
	m, ok := v.(vtMessage)
	if !ok {
		return c.unmarshalProto(data, v)
	}
	buf := data.MaterializeToBuffer(c.bufferPool())
	defer buf.Free()
	return c.decode(buf.ReadOnlyData(), m, m.UnmarshalVT)
}

// decode checks the strings of b unless c.SkipUTF8Check is set, resets m and decodes b
// into it with unmarshal, one of m's generated decoders.
func (c Codec) decode(b []byte, m proto.Message, unmarshal func([]byte) error) error {
	md := m.ProtoReflect().Descriptor()
	if !c.SkipUTF8Check {
		if err := checkUTF8(b, md); err != nil {
			return fmt.Errorf("decoding %s: %w", md.FullName(), err)
		}
	}
	proto.Reset(m)
	if err := unmarshal(b); err != nil {
		return fmt.Errorf("decoding %s: %w", md.FullName(), err)
	}
	return nil
}

// decodePooled copies data into m's storage, checks its strings unless c.SkipUTF8Check
// is set, and decodes it there.
func (c Codec) decodePooled(data mem.BufferSlice, m pooledMessage) error {
	b := m.Reserve(data.Len())
	data.CopyTo(b)
	md := m.Descriptor()
	if !c.SkipUTF8Check {
		if err := checkUTF8(b, md); err != nil {
			return fmt.Errorf("decoding %s: %w", md.FullName(), err)
		}
	}
	if err := m.Decode(); err != nil {
		return fmt.Errorf("decoding %s: %w", md.FullName(), err)
	}
	return nil
}

// unmarshalProto is gRPC's proto codec's Unmarshal.
func (c Codec) unmarshalProto(data mem.BufferSlice, v any) error {
	m := messageV2Of(v)
	if m == nil {
		return fmt.Errorf("failed to unmarshal, message is %T, want proto.Message", v)
	}
	buf := data.MaterializeToBuffer(c.bufferPool())
	defer buf.Free()
	return proto.Unmarshal(buf.ReadOnlyData(), m)
}

// messageV2Of returns v as a proto.Message, or nil when it is none, as gRPC's proto
// codec does.
func messageV2Of(v any) proto.Message {
	switch v := v.(type) {
	case protoadapt.MessageV1:
		return protoadapt.MessageV2Of(v)
	case protoadapt.MessageV2:
		return v
	}
	return nil
}
