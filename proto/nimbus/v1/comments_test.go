package nimbusv1

import (
	"testing"

	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
)

func TestComment(t *testing.T) {
	for name, want := range map[string]string{
		"nimbus.v1.RouteSpec":        "RouteSpec is a route in a policy-routing table of the node's kernel.",
		"nimbus.v1.RouteSpec.prefix": "prefix is the destination in CIDR form with no host bits set.",
		"nimbus.v1.NextHop.weight":   "weight is the ECMP weight, 1..256; 0 means 1.",
		"nimbus.v1.Kind":             "Kind names an object kind. Its string form in manifests and on the command line is the\nCamelCase name (Route, NetworkSecurityPolicy).",
		"nimbus.v1.ObjectKey.name":   "",
		"nimbus.v1.NoSuchMessage":    "",
	} {
		if got := Comment(protoreflect.FullName(name)); got != want {
			t.Errorf("Comment(%s) = %q, want %q", name, got, want)
		}
	}
}

// TestCommentsAreCurrent checks that every commented name is an element of the
// descriptors, and that every kind's spec message has a comment: a stale
// nimbusv1_comments.pb.go fails here as well as in make proto-check.
func TestCommentsAreCurrent(t *testing.T) {
	for name := range protoComments {
		if _, err := protoregistry.GlobalFiles.FindDescriptorByName(name); err != nil {
			t.Errorf("comment of %s: %v", name, err)
		}
	}
	for _, k := range Kinds() {
		if Comment(k.SpecDescriptor().FullName()) == "" {
			t.Errorf("%s has no comment", k.SpecDescriptor().FullName())
		}
	}
}
