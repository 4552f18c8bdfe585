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
		if w.statusSum(st) == w.statusSum(base) {
			t.Errorf("a status with %s set sums as the empty one: statusSum leaves the field out", fd.Name())
		}
	}
}
