package hal

import (
	"testing"

	"google.golang.org/protobuf/reflect/protoreflect"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// TestStatusSumCoversEveryField sets each field of a NodeStatus in turn: every one but
// the update time changes the status's sum, so that a status that differs in it alone is
// recorded and sent upstream. It fails when NodeStatus gains a field statusSum leaves out.
func TestStatusSumCoversEveryField(t *testing.T) {
	w := newStatusWriter(nil, 1, nil, nil)
	id := nimbusv1.MakeKey(nimbusv1.Kind_KIND_ENDPOINT, "", "", "ep")
	base := &nimbusv1.NodeStatus{}
	fields := base.ProtoReflect().Descriptor().Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		if fd.Name() == "update_time" {
			continue
		}
		st := &nimbusv1.NodeStatus{}
		m := st.ProtoReflect()
		switch {
		case fd.IsMap():
			m.Mutable(fd).Map().Set(protoreflect.ValueOfString("k").MapKey(), protoreflect.ValueOfString("v"))
		case fd.Kind() == protoreflect.StringKind:
			m.Set(fd, protoreflect.ValueOfString("x"))
		case fd.Kind() == protoreflect.BoolKind:
			m.Set(fd, protoreflect.ValueOfBool(true))
		case fd.Kind() == protoreflect.Int64Kind:
			m.Set(fd, protoreflect.ValueOfInt64(7))
		case fd.Kind() == protoreflect.EnumKind:
			m.Set(fd, protoreflect.ValueOfEnum(2))
		case fd.Message() != nil && fd.Message().FullName() == "nimbus.v1.OperationalData":
			op := &nimbusv1.OperationalData{Kind: &nimbusv1.OperationalData_Node{Node: &nimbusv1.NodeOperational{Role: nimbusv1.NodeRole_NODE_ROLE_LOCAL}}}
			m.Set(fd, protoreflect.ValueOfMessage(op.ProtoReflect()))
		default:
			t.Fatalf("field %s of kind %v: teach this test to set it, and statusSum to hash it", fd.Name(), fd.Kind())
		}
		if w.statusSum(id, st) == w.statusSum(id, base) {
			t.Errorf("a status with %s set sums as the empty one: statusSum leaves the field out", fd.Name())
		}
	}
}

// TestStatusSumCoversTheKey gives one status to keys that differ in one field each: each
// sums apart, and a status is not passed over as recorded when the key that shares its
// place in recorded (the same keySum) recorded an equal status.
func TestStatusSumCoversTheKey(t *testing.T) {
	w := newStatusWriter(nil, 1, nil, nil)
	st := &nimbusv1.NodeStatus{Node: "host-a", ObservedGeneration: 1, Phase: nimbusv1.Phase_PHASE_PROGRAMMED}
	base := nimbusv1.MakeKey(nimbusv1.Kind_KIND_ENDPOINT, "t", "ns", "ep")
	others := []nimbusv1.Key{
		nimbusv1.MakeKey(nimbusv1.Kind_KIND_NETWORK, "t", "ns", "ep"),
		nimbusv1.MakeKey(nimbusv1.Kind_KIND_ENDPOINT, "u", "ns", "ep"),
		nimbusv1.MakeKey(nimbusv1.Kind_KIND_ENDPOINT, "t", "nt", "ep"),
		nimbusv1.MakeKey(nimbusv1.Kind_KIND_ENDPOINT, "t", "ns", "eq"),
		nimbusv1.MakeKey(nimbusv1.Kind_KIND_ENDPOINT, "t", "nsep", ""),
	}
	for _, id := range others {
		if w.statusSum(id, st) == w.statusSum(base, st) {
			t.Errorf("the status of %v sums as that of %v", id, base)
		}
		if w.keySum(id) == w.keySum(base) {
			t.Errorf("%v has the keySum of %v", id, base)
		}
	}
	// What recorded holds after base's status was recorded, were others[0]'s keySum the
	// same as base's.
	w.recorded[w.keySum(others[0])] = w.statusSum(base, st)
	ids, updates, _ := w.changed([]nimbusv1.Key{others[0]}, []StatusUpdate{{Key: others[0], Status: st}})
	if len(ids) != 1 || len(updates) != 1 {
		t.Errorf("a status that another key recorded was passed over")
	}
	w.recorded[w.keySum(base)] = w.statusSum(base, st)
	if ids, _, _ := w.changed([]nimbusv1.Key{base}, []StatusUpdate{{Key: base, Status: st}}); len(ids) != 0 {
		t.Errorf("a status recorded before was not passed over")
	}
}
