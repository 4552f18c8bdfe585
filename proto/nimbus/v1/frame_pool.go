package nimbusv1

import "google.golang.org/protobuf/reflect/protoreflect"

const (
	// maxPooledFrameBytes is the largest frame whose storage goes back to the pool: nimbus
	// bounds its frames far below, and storage grown for a rare larger one (an object
	// larger than the bound travels alone) is left to the garbage collector.
	maxPooledFrameBytes = 1 << 20
	// pooledFrames is how many storages the pool keeps, about 200 KB each for frames of
	// 32 KiB. Storage given back beyond them is left to the garbage collector: a process
	// that held many frames at once, such as an agent receiving a large snapshot, does not
	// keep them all once done, as it would in a sync.Pool until two collections had passed.
	pooledFrames = 32
)

// PooledFrame is one watch frame received into storage that a pool lends: a copy of the
// frame's bytes and its decoded messages, taken from arrays (as UnmarshalVTUnsafeSlab
// takes them) that the storage keeps from one frame to the next, with the maps of their
// labels, which it clears and keeps too. A stream of frames received this way allocates
// next to nothing once its storage is as large as its frames need, and leaves the garbage
// collector next to nothing to collect.
//
// Receive into it with a gRPC stream's RecvMsg, through a codec that knows it
// (internal/codec's, with ShareData), read Events, and call Release once nothing refers
// to the frame's messages, maps or strings any more: Release zeroes every message and
// empties every map, and the next frame decoded into the same storage fills them again
// and overwrites the bytes the strings are views of. What must outlive the frame must be
// copied first (proto.Clone, maps.Clone, strings.Clone).
//
// A PooledFrame that receives again releases the frame it held. The zero PooledFrame is
// ready to use; it is not safe for concurrent use.
type PooledFrame struct {
	st *frameStorage
}

// frameStorage is what a PooledFrame borrows from the pool.
type frameStorage struct {
	data  []byte
	frame WatchFrame
	slab  frameSlab
}

// framePool holds the storages given back, up to pooledFrames.
var framePool = make(chan *frameStorage, pooledFrames)

// Reserve releases the frame p holds, if any, borrows storage and returns n bytes of it to
// copy an encoded frame into, which Decode then decodes.
func (p *PooledFrame) Reserve(n int) []byte {
	p.Release()
	select {
	case p.st = <-framePool:
	default:
		p.st = new(frameStorage)
	}
	if cap(p.st.data) < n {
		p.st.data = make([]byte, n)
	}
	p.st.data = p.st.data[:n]
	return p.st.data
}

// Decode decodes the bytes Reserve returned as UnmarshalVTUnsafeSlab does, into the
// storage's arrays.
func (p *PooledFrame) Decode() error {
	if p.st == nil {
		p.Reserve(0)
	}
	return p.st.slab.decode(&p.st.frame, p.st.data)
}

// Descriptor returns the descriptor of WatchFrame, the message p holds.
func (*PooledFrame) Descriptor() protoreflect.MessageDescriptor {
	return (*WatchFrame)(nil).ProtoReflect().Descriptor()
}

// Frame returns the frame p holds: empty before the first Decode and after Release.
func (p *PooledFrame) Frame() *WatchFrame {
	if p.st == nil {
		return &WatchFrame{}
	}
	return &p.st.frame
}

// Events returns the events of the frame p holds.
func (p *PooledFrame) Events() []*WatchEvent {
	if p.st == nil {
		return nil
	}
	return p.st.frame.Events
}

// Size returns the encoded size of the frame p holds.
func (p *PooledFrame) Size() int {
	if p.st == nil {
		return 0
	}
	return len(p.st.data)
}

// Release zeroes the frame's messages, empties their maps and returns its storage to the
// pool; p is then empty. Releasing an empty PooledFrame does nothing.
func (p *PooledFrame) Release() {
	st := p.st
	if st == nil {
		return
	}
	p.st = nil
	st.frame.Reset()
	st.slab.reset()
	poison(st.data)
	if cap(st.data) > maxPooledFrameBytes {
		return
	}
	select {
	case framePool <- st:
	default:
	}
}
