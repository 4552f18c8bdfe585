// Package codec is the gRPC codec of naples's nimbus connections: the protobuf codec, with
// the generated MarshalVT, UnmarshalVT and SizeVT methods (planetscale/vtprotobuf, see
// proto/nimbus/v1/nimbus_vtproto.pb.go) in place of protobuf's reflection wherever a
// message has them, and gRPC's own proto codec behaviour for every other message.
//
// Decoding watch frames is most of what an agent spends on nimbus's fan-out, and the
// generated code decodes them without reflection and with fewer allocations than
// proto.Unmarshal (BenchmarkDecodeWatchFrame). Codec accepts and refuses what
// proto.Marshal and proto.Unmarshal do: the generated code does not check that proto3
// strings are UTF-8, so Codec checks the wire bytes, unless told that its peer's strings
// were checked already (Codec.SkipUTF8Check). It never aliases the bytes it decodes,
// which gRPC reuses once Unmarshal returns: every string and bytes field of a decoded
// message is a copy.
//
// The codec is named "proto", as gRPC's default, so it speaks the same wire format under
// the same content subtype and either side may use it alone. It is not registered with
// encoding.RegisterCodecV2, which would change every gRPC connection of the process,
// the ones of other libraries included: a client connection opts in with
// Codec.DialOption, a server with grpc.ForceServerCodecV2.
package codec
