package delphi

import (
	"fmt"
	"maps"
	"unsafe"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// storedStatus is one row of the status table: the status in its wire form, without its
// update time, which the row keeps apart. A status decoded is a tree of messages and
// strings several times the size of its encoding, and the table holds one per object;
// the wire form also finds an equal status by comparing bytes. A read decodes the row.
//
// A status keeps the deprecated string form of its operational data
// (NodeStatus.operational) only when that is not the form its typed operational data
// make: for the HAL's statuses the map is made again when the status is read, so that the
// table holds the operational data once, not twice.
type storedStatus struct {
	// data is the status's deterministic wire form without its update time, the bytes
	// the encoder returned, which nothing changes: a string takes 8 bytes less than a
	// slice in every row (wire returns them as a slice again).
	data string
	// seconds and nanos are the update time, when timed.
	seconds int64
	nanos   int32
	timed   bool
	// mapped tells that the operational map was dropped because it was the one
	// OperationalData.Map() makes; a read returns the status with it made again.
	mapped bool
	// opaque tells that the status holds fields this build does not know, which make it
	// equal to no other.
	opaque bool
}

// storeStatus returns st as the status table keeps it. It may change st, which the
// transaction owns.
func storeStatus(st *nimbusv1.NodeStatus) (storedStatus, error) {
	var r storedStatus
	if st.GetOperationalData() != nil && st.GetOperational() != nil && maps.Equal(st.GetOperational(), st.GetOperationalData().Map()) {
		st.Operational, r.mapped = nil, true
	}
	if t := st.GetUpdateTime(); t != nil {
		r.seconds, r.nanos, r.timed = t.GetSeconds(), t.GetNanos(), true
	}
	r.opaque = len(st.ProtoReflect().GetUnknown()) != 0
	t := st.UpdateTime
	st.UpdateTime = nil
	defer func() { st.UpdateTime = t }()
	// Deterministic, so that equal maps encode alike. Encoding checks that strings are
	// UTF-8, which a status need not be; the generated encoder does not, and encodes a
	// map in no set order, so a status it encodes may be rewritten although equal.
	data, err := proto.MarshalOptions{Deterministic: true}.Marshal(st)
	if err != nil {
		if data, err = st.MarshalVT(); err != nil {
			return storedStatus{}, fmt.Errorf("encoding a status: %w", err)
		}
	}
	r.data = unsafe.String(unsafe.SliceData(data), len(data))
	return r, nil
}

// status returns the status as it was written, a copy of its own: with its operational
// map made again from its typed operational data when the table dropped it.
func (r storedStatus) status() *nimbusv1.NodeStatus {
	st := &nimbusv1.NodeStatus{}
	if err := st.UnmarshalVT(r.wire()); err != nil {
		// The row holds what an encoder wrote.
		panic(fmt.Sprintf("delphi: decoding a stored status: %v", err))
	}
	if r.timed {
		st.UpdateTime = &timestamppb.Timestamp{Seconds: r.seconds, Nanos: r.nanos}
	}
	if r.mapped {
		st.Operational = st.GetOperationalData().Map()
	}
	return st
}

// wire returns the status's wire form, which the caller must not change.
func (r storedStatus) wire() []byte { return unsafe.Slice(unsafe.StringData(r.data), len(r.data)) }

// same reports whether two rows hold statuses equal apart from their update times.
func (r storedStatus) same(o storedStatus) bool {
	return r.mapped == o.mapped && !r.opaque && !o.opaque && r.data == o.data
}

// equal reports whether two rows hold equal statuses, update times included.
func (r storedStatus) equal(o storedStatus) bool {
	return r.same(o) && r.timed == o.timed && r.seconds == o.seconds && r.nanos == o.nanos
}

// progress returns the status's observed generation and phase, read from its wire form
// without decoding the rest.
func (r storedStatus) progress() (generation int64, phase nimbusv1.Phase) {
	eachWireField(r.wire(), func(num protowire.Number, typ protowire.Type, v []byte) {
		if typ != protowire.VarintType || (num != 2 && num != 3) {
			return
		}
		x, _ := protowire.ConsumeVarint(v)
		if num == 2 {
			generation = int64(x)
		} else {
			phase = nimbusv1.Phase(int32(x))
		}
	})
	return generation, phase
}

// generation returns the object's meta.generation (Object field 1, ObjectMeta field 5),
// read from its wire form without decoding the rest: the record does not keep it apart.
func (r *record) generation() int64 {
	var gen int64
	b, _ := r.wire()
	eachWireField(b, func(num protowire.Number, typ protowire.Type, v []byte) {
		if num != 1 || typ != protowire.BytesType {
			return
		}
		meta, _ := protowire.ConsumeBytes(v)
		eachWireField(meta, func(num protowire.Number, typ protowire.Type, v []byte) {
			if num == 5 && typ == protowire.VarintType {
				x, _ := protowire.ConsumeVarint(v)
				gen = int64(x)
			}
		})
	})
	return gen
}

// eachWireField calls f with the number, type and encoded value of every field of b, a
// message's wire form, until the end or a field it cannot read.
func eachWireField(b []byte, f func(num protowire.Number, typ protowire.Type, v []byte)) {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return
		}
		b = b[n:]
		m := protowire.ConsumeFieldValue(num, typ, b)
		if m < 0 {
			return
		}
		f(num, typ, b[:m])
		b = b[m:]
	}
}
