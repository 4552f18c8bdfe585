package nimbusv1

import (
	"errors"
	"testing"

	"google.golang.org/protobuf/proto"
)

func TestParseKindShortNames(t *testing.T) {
	for in, want := range map[string]Kind{
		"rt": Kind_KIND_ROUTE, "RT": Kind_KIND_ROUTE, "net": Kind_KIND_NETWORK, "ep": Kind_KIND_ENDPOINT,
		"sg": Kind_KIND_SECURITY_GROUP, "nsp": Kind_KIND_NETWORK_SECURITY_POLICY, "if": Kind_KIND_INTERFACE,
		"no": Kind_KIND_NODE, "fep": Kind_KIND_FLOW_EXPORT_POLICY, "tr": Kind_KIND_TRACE,
	} {
		if got, err := ParseKind(in); err != nil || got != want {
			t.Errorf("ParseKind(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"rts", "nets", "r", "n"} {
		if k, err := ParseKind(in); !errors.Is(err, ErrUnknownKind) {
			t.Errorf("ParseKind(%q) = %v, %v; want ErrUnknownKind", in, k, err)
		}
	}
}

// TestKindNamesAreDistinct checks that every kind has a name, a short name and a plural,
// and that no spelling ParseKind accepts names two kinds: each of a kind's names parses
// back to that kind.
func TestKindNamesAreDistinct(t *testing.T) {
	seen := map[string]Kind{}
	for _, k := range Kinds() {
		names := []string{k.Name(), k.ShortName(), k.Plural()}
		for _, n := range names {
			if n == "" {
				t.Errorf("%v: names %q: one is empty", k, names)
				continue
			}
			if other, ok := seen[n]; ok && other != k {
				t.Errorf("name %q names both %v and %v", n, other, k)
			}
			seen[n] = k
			if got, err := ParseKind(n); err != nil || got != k {
				t.Errorf("ParseKind(%q) = %v, %v; want %v", n, got, err, k)
			}
		}
	}
	if len(kindsBySpelling) != 3*len(Kinds()) {
		t.Errorf("ParseKind knows %d spellings, want 3 for each of %d kinds", len(kindsBySpelling), len(Kinds()))
	}
}

func TestSpecDescriptor(t *testing.T) {
	for _, k := range Kinds() {
		d := k.SpecDescriptor()
		if d == nil || string(d.Name()) != k.Name()+"Spec" {
			t.Errorf("%v.SpecDescriptor() = %v, want %sSpec", k, d, k.Name())
		}
	}
	if d := Kind_KIND_UNSPECIFIED.SpecDescriptor(); d != nil {
		t.Errorf("KIND_UNSPECIFIED.SpecDescriptor() = %v, want nil", d.FullName())
	}
}

// TestKeySkeleton checks that a key's skeleton is the skeleton of the object with the key
// for every kind, as the descriptors make it.
func TestKeySkeleton(t *testing.T) {
	for _, k := range append(Kinds(), Kind_KIND_UNSPECIFIED) {
		key := NewKey(k, "t1", "ns1", "o1")
		obj := &Object{Meta: &ObjectMeta{Tenant: "t1", Namespace: "ns1", Name: "o1", Generation: 7}}
		if f := k.SpecField(); f != nil {
			r := obj.ProtoReflect()
			r.Set(f, r.NewField(f))
		}
		got := key.Skeleton(7)
		if !proto.Equal(got, obj.Skeleton()) || got.Kind() != k {
			t.Errorf("NewKey(%v, ...).Skeleton(7) = %v (kind %v), want %v", k, got, got.Kind(), obj.Skeleton())
		}
	}
}
