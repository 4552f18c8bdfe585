package delphi

import (
	"bytes"
	"fmt"
	"path/filepath"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/naplesnet/naples/internal/manifest"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// TestMarshalDeterministicAsProto checks that marshalDeterministic writes exactly what
// proto.Marshal's deterministic mode writes, for every object of the examples and for
// routes with many labels, whatever order Go's maps give their entries in.
func TestMarshalDeterministicAsProto(t *testing.T) {
	files, err := filepath.Glob("../examples/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no example manifests: %v", err)
	}
	var objs []*nimbusv1.Object
	for _, f := range files {
		got, err := manifest.DecodeFile(f)
		if err != nil {
			t.Fatal(err)
		}
		objs = append(objs, got...)
	}
	for i := range 20 {
		r := route(fmt.Sprintf("dc2-web-%04d", i), 100, "100.64.0.1/32", "10.10.0.2")
		r.Meta.Nodes = []string{"host-a", "host-b"}
		r.Meta.Generation, r.Meta.Revision, r.Meta.GenerationRevision = 3, 77, 70
		r.Meta.Labels = map[string]string{}
		for j := range i {
			r.Meta.Labels[fmt.Sprintf("label-%02d", (j*7)%20)] = fmt.Sprint(j)
		}
		objs = append(objs, r)
	}
	for _, obj := range objs {
		want, err := proto.MarshalOptions{Deterministic: true}.Marshal(obj)
		if err != nil {
			t.Fatal(err)
		}
		for range 5 { // maps iterate in another order each time
			got, err := marshalDeterministic(obj)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("%s: marshalDeterministic wrote\n%x\nproto.Marshal\n%x", obj.Key().ID(), got, want)
			}
		}
	}
}

// TestHoldsMap checks the walk that sends objects whose spec holds a map to
// proto.Marshal: it finds ObjectMeta's labels, directly and through Object, and no map in
// a route's spec.
func TestHoldsMap(t *testing.T) {
	meta := (&nimbusv1.ObjectMeta{}).ProtoReflect().Descriptor()
	obj := (&nimbusv1.Object{}).ProtoReflect().Descriptor()
	if !holdsMap(meta, map[protoreflect.FullName]bool{}) || !holdsMap(obj, map[protoreflect.FullName]bool{}) {
		t.Error("holdsMap misses ObjectMeta's labels")
	}
	if holdsMap(nimbusv1.Kind_KIND_ROUTE.SpecDescriptor(), map[protoreflect.FullName]bool{}) || specHasMap()[nimbusv1.Kind_KIND_ROUTE] {
		t.Error("holdsMap finds a map in RouteSpec, which has none")
	}
}

// TestObjectHoldsNoBytes checks what reading records with UnmarshalVTUnsafe relies on:
// no field of an object, at any depth, is bytes, which would be a view of the record's
// row that a reader could write through.
func TestObjectHoldsNoBytes(t *testing.T) {
	seen := map[protoreflect.FullName]bool{}
	var walk func(md protoreflect.MessageDescriptor)
	walk = func(md protoreflect.MessageDescriptor) {
		if seen[md.FullName()] {
			return
		}
		seen[md.FullName()] = true
		fields := md.Fields()
		for i := range fields.Len() {
			fd := fields.Get(i)
			if fd.Kind() == protoreflect.BytesKind || (fd.IsMap() && fd.MapValue().Kind() == protoreflect.BytesKind) {
				t.Errorf("%s is bytes: decode records with UnmarshalVT, which copies", fd.FullName())
			}
			if fd.IsMap() {
				if vd := fd.MapValue().Message(); vd != nil {
					walk(vd)
				}
				continue
			}
			if fd.Message() != nil {
				walk(fd.Message())
			}
		}
	}
	walk((&nimbusv1.Object{}).ProtoReflect().Descriptor())
	if len(seen) < 10 {
		t.Fatalf("walked %d messages of an object, want its meta, every spec and what they hold", len(seen))
	}
}
