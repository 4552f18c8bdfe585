package nimbus

import (
	"bytes"
	"fmt"
	"maps"
	"slices"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// TestSharedSnapshot checks the part of snapshots that every node receives alike: made
// once per revision and shared by the snapshots of that revision, holding every object
// for every node and no object that names its nodes, in full frames and a tail; made anew
// for a newer revision; and, for an older revision than the one kept, made apart without
// replacing it.
func TestSharedSnapshot(t *testing.T) {
	s, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	st := s.store
	txn := st.write()
	want := map[string]bool{}
	for i := range 3000 {
		nodes := []string(nil)
		if i%3 == 0 {
			nodes = []string{"n1"} // named nodes: sent by each stream itself
		}
		obj := route(fmt.Sprintf("r%04d", i), nodes)
		obj.Meta.Revision = uint64(i + 1)
		txn.putObject(&objectRecord{Key: obj.TypedKey(), Object: obj})
		if nodes == nil {
			want[obj.Key().ID()] = true
		}
	}
	txn.setRevision(3000)
	txn.commit()

	snap := st.read()
	first := s.everyNodeSnapshot(snap)
	if again := s.everyNodeSnapshot(st.read()); again != first {
		t.Error("a second snapshot of the same revision made its own shared part")
	}
	got := map[string]bool{}
	for i, frame := range append(slices.Clone(first.frames), bytes.Join(framed(first.tail), nil)) {
		if i < len(first.frames) && len(frame) > maxFrameBytes {
			t.Errorf("frame %d is %d bytes, over %d", i, len(frame), maxFrameBytes)
		}
		var f nimbusv1.WatchFrame
		if err := proto.Unmarshal(frame, &f); err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		for _, ev := range f.GetEvents() {
			got[ev.ObjectKey().ID()] = true
		}
	}
	if len(first.frames) < 2 {
		t.Errorf("%d full frames for 2000 objects; want several", len(first.frames))
	}
	if !maps.Equal(got, want) {
		t.Errorf("the shared part holds %d objects, want the %d for every node", len(got), len(want))
	}

	// A newer revision gets a shared part of its own, which is then kept.
	txn = st.write()
	txn.setRevision(3001)
	txn.commit()
	newer := s.everyNodeSnapshot(st.read())
	if newer == first || s.everyNode.Load() != newer {
		t.Error("a newer revision did not make and keep a shared part of its own")
	}
	// A snapshot of the older revision makes its own, without replacing the newer one.
	older := s.everyNodeSnapshot(snap)
	if older == newer || older.rev != 3000 || s.everyNode.Load() != newer {
		t.Error("a snapshot of an older revision replaced the newer shared part")
	}
}

// framed returns the events as the fields of one frame.
func framed(events [][]byte) [][]byte {
	out := make([][]byte, len(events))
	for i, b := range events {
		out[i] = protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), b)
	}
	return out
}
