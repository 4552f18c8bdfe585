package nimbusv1

import (
	"slices"
	"testing"
)

// TestKeyMap sets, replaces and deletes the values of keys in several scopes: a key's
// value is found only by its whole key, Len follows, All walks every key once, and a
// scope's map goes with its last key.
func TestKeyMap(t *testing.T) {
	var m KeyMap[int]
	keys := []Key{
		MakeKey(Kind_KIND_ENDPOINT, "", "", "a"),
		MakeKey(Kind_KIND_ENDPOINT, "", "", "b"),
		MakeKey(Kind_KIND_NETWORK, "", "", "a"),
		MakeKey(Kind_KIND_ENDPOINT, "t", "", "a"),
		MakeKey(Kind_KIND_ENDPOINT, "", "ns", "a"),
	}
	for i, k := range keys {
		m.Set(k, i)
	}
	m.Set(keys[0], 10)
	if m.Len() != len(keys) {
		t.Fatalf("Len() = %d, want %d", m.Len(), len(keys))
	}
	for i, k := range keys {
		want := i
		if i == 0 {
			want = 10
		}
		if v, ok := m.Get(k); !ok || v != want || !m.Has(k) {
			t.Errorf("Get(%v) = %v, %v; want %d, true", k, v, ok, want)
		}
	}
	var got []Key
	for k, v := range m.All() {
		if w, _ := m.Get(k); w != v {
			t.Errorf("All gave %v the value %d; Get %d", k, v, w)
		}
		got = append(got, k)
	}
	slices.SortFunc(got, Key.Compare)
	if want := slices.SortedFunc(slices.Values(keys), Key.Compare); !slices.Equal(got, want) {
		t.Errorf("All walked %v, want %v", got, want)
	}
	m.Delete(keys[2])
	m.Delete(keys[2])
	if m.Has(keys[2]) || m.Len() != len(keys)-1 || len(m.scopes) != 3 {
		t.Errorf("after deleting %v: Has %v, Len() %d, %d scopes; want false, %d, 3", keys[2], m.Has(keys[2]), m.Len(), len(m.scopes), len(keys)-1)
	}
	for _, k := range keys {
		m.Delete(k)
	}
	if m.Len() != 0 || len(m.scopes) != 0 {
		t.Errorf("emptied map: Len() %d, %d scopes; want 0 and 0", m.Len(), len(m.scopes))
	}
}
