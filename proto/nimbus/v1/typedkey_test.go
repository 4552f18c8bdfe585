package nimbusv1

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

func TestKeyStringIsID(t *testing.T) {
	for _, pk := range []*ObjectKey{
		NewKey(Kind_KIND_NETWORK_SECURITY_POLICY, "", "prod", "web"),
		{Kind: Kind_KIND_ROUTE, Name: "to-dc2"},
		{Kind: Kind_KIND_ENDPOINT, Tenant: "t1", Namespace: "n.s", Name: "ep-1"},
		{Kind: Kind_KIND_UNSPECIFIED, Name: "x"},
	} {
		k := pk.Key()
		if k.String() != pk.ID() {
			t.Errorf("Key().String() = %q, want ID() %q", k.String(), pk.ID())
		}
		if got := k.Proto().ID(); got != pk.ID() {
			t.Errorf("Proto().ID() = %q, want %q", got, pk.ID())
		}
		back, err := ParseKey(pk.ID())
		if pk.GetKind() != Kind_KIND_UNSPECIFIED && (err != nil || back != k) {
			t.Errorf("ParseKey(%q) = %v, %v; want %v", pk.ID(), back, err, k)
		}
	}
	if k, nilKey := (*ObjectKey)(nil).Key(), (*ObjectKey)(nil); k.String() != nilKey.ID() {
		t.Errorf("nil ObjectKey's Key() = %v, want %v as ID", k, nilKey.ID())
	}
	obj := validRoute()
	if got, want := obj.TypedKey(), obj.Key().Key(); got != want {
		t.Errorf("TypedKey() = %v, want %v", got, want)
	}
}

func TestParseKey(t *testing.T) {
	k, err := ParseKey("routes//prod/to-dc2")
	if want := MakeKey(Kind_KIND_ROUTE, "", "prod", "to-dc2"); err != nil || k != want {
		t.Errorf("ParseKey = %v, %v; want %v", k, err, want)
	}
	for _, bad := range []string{"", "Route/x", "Route/a/b", "Rout/a/b/c", "Route/a/b/c/d"} {
		if _, err := ParseKey(bad); err == nil {
			t.Errorf("ParseKey(%q) succeeded", bad)
		}
	}
}

// TestKeyCompare checks that keys sort as their String forms do, also where a part holds
// bytes that sort before '/' or is a prefix of the other's.
func TestKeyCompare(t *testing.T) {
	parts := []string{"", "a", "a-b", "a.b", "ab", "a/b", "a0", "b", "default", "A", "a~"}
	kinds := []Kind{Kind_KIND_NETWORK, Kind_KIND_NETWORK_SECURITY_POLICY, Kind_KIND_NODE, Kind_KIND_ROUTE}
	rnd := rand.New(rand.NewPCG(1, 2))
	pick := func() Key {
		return Key{kinds[rnd.IntN(len(kinds))], parts[rnd.IntN(len(parts))], parts[rnd.IntN(len(parts))], parts[rnd.IntN(len(parts))]}
	}
	for range 20000 {
		a, b := pick(), pick()
		if got, want := a.Compare(b), strings.Compare(a.String(), b.String()); got != want {
			t.Fatalf("%q.Compare(%q) = %d, want %d", a, b, got, want)
		}
	}
	zero := Key{}
	if a := pick(); zero.Compare(a) != -1 || a.Compare(zero) != +1 || zero.Compare(zero) != 0 {
		t.Errorf("the zero Key does not sort before %q", a)
	}
	keys := make([]Key, 200)
	for i := range keys {
		keys[i] = pick()
	}
	slices.SortFunc(keys, Key.Compare)
	if !slices.IsSortedFunc(keys, func(a, b Key) int { return strings.Compare(a.String(), b.String()) }) {
		t.Error("keys sorted by Compare are not sorted by String")
	}
}
