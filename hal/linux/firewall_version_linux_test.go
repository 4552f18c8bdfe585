package linux

import (
	"testing"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// TestObjectVersion checks that versions tell uids and generations apart as their
// strings do: a UUID held as its bytes, any other uid (upper case, empty, not a UUID) as
// a digest.
func TestObjectVersion(t *testing.T) {
	obj := func(uid string, gen int64) *nimbusv1.Object {
		return &nimbusv1.Object{Meta: &nimbusv1.ObjectMeta{Uid: uid, Generation: gen}}
	}
	const uuid = "0f8fad5b-d9cb-469f-a165-70867728950e"
	v := versionOf(obj(uuid, 3))
	want := [16]byte{0x0f, 0x8f, 0xad, 0x5b, 0xd9, 0xcb, 0x46, 0x9f, 0xa1, 0x65, 0x70, 0x86, 0x77, 0x28, 0x95, 0x0e}
	if v.uid != want || v.gen != 3 {
		t.Errorf("versionOf(%q, 3) = %+v; want the UUID's bytes, generation 3", uuid, v)
	}
	uids := []string{
		uuid, "0f8fad5b-d9cb-469f-a165-70867728950f", "0F8FAD5B-D9CB-469F-A165-70867728950E",
		"", "uid-1", "uid-2", "0f8fad5b-d9cb-469f-a165-70867728950", "0f8fad5b+d9cb-469f-a165-70867728950e",
	}
	seen := map[objectVersion]string{}
	for _, uid := range uids {
		for _, gen := range []int64{1, 2} {
			v := versionOf(obj(uid, gen))
			if v != versionOf(obj(uid, gen)) {
				t.Errorf("versionOf(%q, %d) differs between calls", uid, gen)
			}
			if other, ok := seen[v]; ok {
				t.Errorf("uid %q, generation %d has the version of %s", uid, gen, other)
			}
			seen[v] = uid
		}
	}
}
