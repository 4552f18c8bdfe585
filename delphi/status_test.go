package delphi

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"
	"unsafe"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

func statusKey(name string) *nimbusv1.ObjectKey {
	return &nimbusv1.ObjectKey{Kind: nimbusv1.Kind_KIND_ROUTE, Name: name}
}

func programmed(gen int64) *nimbusv1.NodeStatus {
	return &nimbusv1.NodeStatus{ObservedGeneration: gen, Phase: nimbusv1.Phase_PHASE_PROGRAMMED, UpdateTime: timestamppb.Now()}
}

// nextIDs returns the key IDs the subscription hands out next, sorted, or fails the test
// after 10s.
func nextIDs(t *testing.T, sub *Subscription) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	keys, err := sub.Next(ctx)
	if err != nil {
		t.Fatalf("Next: %v", err)
	}
	ids := keyIDs(keys)
	slices.Sort(ids)
	return ids
}

// TestStatusTxn checks a batch of status writes: applied in order, in one commit that
// subscribers hear of once, with unchanged statuses not rewritten.
func TestStatusTxn(t *testing.T) {
	s, _, st := open(t)
	a, b, c, d := statusKey("a"), statusKey("b"), statusKey("c"), statusKey("d")
	if err := st.Set(c, programmed(1)); err != nil {
		t.Fatal(err)
	}
	if err := st.Set(d, programmed(1)); err != nil {
		t.Fatal(err)
	}
	sub, err := s.Subscribe(SubscribeOptions{Tables: []Table{TableStatus}})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	nextIDs(t, sub) // the statuses present

	txn := &StatusTxn{}
	txn.Set(a.Key(), programmed(1))
	txn.Set(a.Key(), programmed(2)) // the last write of a key counts
	txn.Set(b.Key(), programmed(1))
	txn.Delete(b.Key()) // removed again within the batch
	txn.Delete(c.Key())
	txn.Set(d.Key(), programmed(1))       // equal but for the update time: not rewritten
	txn.Delete(statusKey("absent").Key()) // an absent status is no error
	if n := txn.Len(); n != 7 {
		t.Errorf("Len = %d; want 7", n)
	}
	if err := st.Commit(txn); err != nil {
		t.Fatalf("Commit: %v", err)
	}
	if got, ok := s.Status(a); !ok || got.GetObservedGeneration() != 2 {
		t.Errorf("status of a = %v, %v; want generation 2, the batch's last", got, ok)
	}
	for _, k := range []*nimbusv1.ObjectKey{b, c} {
		if got, ok := s.Status(k); ok {
			t.Errorf("status of %s = %v; want none", k.GetName(), got)
		}
	}
	// b came and went within the batch: nobody saw it.
	if got, want := nextIDs(t, sub), []string{a.ID(), c.ID()}; !slices.Equal(got, want) {
		t.Errorf("the subscription heard of %q; want %q, the keys the batch changed", got, want)
	}
	if err := st.Commit(&StatusTxn{}); err != nil {
		t.Errorf("Commit of an empty batch: %v", err)
	}

	s.Close()
	txn = &StatusTxn{}
	txn.Set(a.Key(), programmed(3))
	if err := st.Commit(txn); !errors.Is(err, ErrClosed) {
		t.Errorf("Commit on a closed store: %v; want ErrClosed", err)
	}
}

// TestStatusTxnIsAtomic: a reader running during the commit of a large batch sees either
// none of its statuses or all of them.
func TestStatusTxnIsAtomic(t *testing.T) {
	s, _, st := open(t)
	const n = 5000
	txn := &StatusTxn{}
	for i := range n {
		txn.Set(statusKey(fmt.Sprintf("r%05d", i)).Key(), programmed(1))
	}
	committed := make(chan error, 1)
	go func() { committed <- st.Commit(txn) }()
	seen := map[int]bool{}
	for done := false; !done; {
		select {
		case err := <-committed:
			if err != nil {
				t.Fatal(err)
			}
			done = true
		default:
		}
		seen[len(s.Statuses())] = true
	}
	for count := range seen {
		if count != 0 && count != n {
			t.Errorf("a reader saw %d of the batch's %d statuses; want none or all", count, n)
		}
	}
	if !seen[n] {
		t.Errorf("the reader never saw the batch's statuses")
	}
	want := txn.ops[42].st
	if got, ok := s.Status(statusKey("r00042")); !ok || !proto.Equal(got, want) {
		t.Errorf("status of r00042 = %v, %v; want %v", got, ok, want)
	}
}

// TestSameStatusComparesEveryField fails when NodeStatus gains a field that the status
// table's rows do not compare.
func TestSameStatusComparesEveryField(t *testing.T) {
	sameStatus := func(a, b *nimbusv1.NodeStatus) bool {
		ra, err := storeStatus(proto.CloneOf(a))
		if err != nil {
			t.Fatal(err)
		}
		rb, err := storeStatus(proto.CloneOf(b))
		if err != nil {
			t.Fatal(err)
		}
		return ra.same(rb)
	}
	fields := (&nimbusv1.NodeStatus{}).ProtoReflect().Descriptor().Fields()
	var names []string
	for i := 0; i < fields.Len(); i++ {
		names = append(names, string(fields.Get(i).Name()))
	}
	want := []string{"node", "observed_generation", "phase", "reason", "message", "update_time", "operational", "stale", "terminal", "operational_data"}
	if !slices.Equal(names, want) {
		t.Fatalf("NodeStatus fields are %v; the table's rows know %v: update them", names, want)
	}
	a := &nimbusv1.NodeStatus{Phase: nimbusv1.Phase_PHASE_PROGRAMMED, Operational: map[string]string{"a": "1"}, UpdateTime: timestamppb.Now()}
	b := &nimbusv1.NodeStatus{Phase: nimbusv1.Phase_PHASE_PROGRAMMED, Operational: map[string]string{"a": "1"}}
	if !sameStatus(a, b) {
		t.Error("statuses that differ only in update time differ")
	}
	b.Operational["a"] = "2"
	if sameStatus(a, b) {
		t.Error("statuses with different operational data are the same")
	}
	b.Operational["a"] = "1"
	b.Terminal = true
	if sameStatus(a, b) {
		t.Error("a terminal and a retried status are the same")
	}
	b.Terminal = false
	b.OperationalData = &nimbusv1.OperationalData{Kind: &nimbusv1.OperationalData_Node{Node: &nimbusv1.NodeOperational{Vtep: "192.0.2.1"}}}
	if sameStatus(a, b) {
		t.Error("statuses with and without typed operational data are the same")
	}
	a.OperationalData = &nimbusv1.OperationalData{Kind: &nimbusv1.OperationalData_Node{Node: &nimbusv1.NodeOperational{Vtep: "192.0.2.1"}}}
	if !sameStatus(a, b) {
		t.Error("statuses with equal typed operational data differ")
	}
}

// TestStatusOperationalMap checks that a status reads back as written whether its
// deprecated operational map is the one its typed operational data make, which the table
// drops and makes again, another one, or absent; and that rewriting an equal status
// notifies no one.
func TestStatusOperationalMap(t *testing.T) {
	s, _, st := open(t)
	typed := &nimbusv1.OperationalData{Kind: &nimbusv1.OperationalData_Node{Node: &nimbusv1.NodeOperational{Vtep: "192.0.2.1"}}}
	made := programmed(1)
	made.OperationalData, made.Operational = typed, typed.Map()
	other := programmed(1)
	other.OperationalData, other.Operational = typed, map[string]string{"vtep": "192.0.2.9"}
	bare := programmed(1)
	bare.OperationalData = typed
	written := []*nimbusv1.NodeStatus{bare, made, other} // in key order
	for i, name := range []string{"bare", "made", "other"} {
		if err := st.Set(statusKey(name), written[i]); err != nil {
			t.Fatal(err)
		}
		if got, ok := s.Status(statusKey(name)); !ok || !proto.Equal(got, written[i]) {
			t.Errorf("%s: Status = %v; want %v", name, got, written[i])
		}
	}
	for i, e := range s.Statuses() {
		if !proto.Equal(e.Status, written[i]) {
			t.Errorf("Statuses()[%d] = %v; want %v", i, e.Status, written[i])
		}
	}
	sub, err := s.Subscribe(SubscribeOptions{Tables: []Table{TableStatus}})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	nextIDs(t, sub) // the statuses present
	again := proto.CloneOf(made)
	again.UpdateTime = timestamppb.Now()
	if err := st.Set(statusKey("made"), again); err != nil {
		t.Fatal(err)
	}
	if err := st.Set(statusKey("last"), programmed(1)); err != nil {
		t.Fatal(err)
	}
	if ids := nextIDs(t, sub); !slices.Equal(ids, []string{statusKey("last").Key().String()}) {
		t.Errorf("rewriting an equal status and writing another notified %v; want only the other", ids)
	}
}

// TestStoredStatusProgress checks that a row tells a status's observed generation and
// phase from its wire form, around fields before and after them.
func TestStoredStatusProgress(t *testing.T) {
	st := &nimbusv1.NodeStatus{Node: "host-a", ObservedGeneration: 7, Phase: nimbusv1.Phase_PHASE_FAILED, Reason: "Conflict",
		UpdateTime: timestamppb.Now(), OperationalData: &nimbusv1.OperationalData{Kind: &nimbusv1.OperationalData_Node{Node: &nimbusv1.NodeOperational{Vtep: "192.0.2.1"}}}}
	r, err := storeStatus(st)
	if err != nil {
		t.Fatal(err)
	}
	if gen, phase := r.progress(); gen != 7 || phase != nimbusv1.Phase_PHASE_FAILED {
		t.Errorf("progress() = %d, %v; want 7, PHASE_FAILED", gen, phase)
	}
	if got := r.status(); !proto.Equal(got, st) {
		t.Errorf("status() = %v; want %v", got, st)
	}
	if gen, phase := (storedStatus{}).progress(); gen != 0 || phase != nimbusv1.Phase_PHASE_UNSPECIFIED {
		t.Errorf("an empty row's progress() = %d, %v; want 0, PHASE_UNSPECIFIED", gen, phase)
	}
}

// TestStoredStatusSize: a status table's row fits 32 bytes, so that a KeyMap's place
// (the name and the row) takes 48.
func TestStoredStatusSize(t *testing.T) {
	if n := unsafe.Sizeof(storedStatus{}); n > 32 {
		t.Errorf("a storedStatus takes %d bytes, want at most 32", n)
	}
}
