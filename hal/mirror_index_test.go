package hal_test

import (
	"maps"
	"testing"

	"github.com/naplesnet/naples/hal"
)

// byLink indexes test objects by their link; link 0 is not indexed.
func byLink(_ string, v obj) (int, bool) { return v.link, v.link != 0 }

// wantIndexed checks that the index holds exactly want under each link, and that it
// agrees with a walk of the whole mirror.
func wantIndexed(t *testing.T, m *hal.Mirror[string, obj], ix *hal.Index[string, obj, int], want map[int]map[string]obj) {
	t.Helper()
	walked := map[int]map[string]obj{}
	for k, v := range m.All() {
		if l, ok := byLink(k, v); ok {
			if walked[l] == nil {
				walked[l] = map[string]obj{}
			}
			walked[l][k] = v
		}
	}
	for l := 0; l <= 9; l++ {
		got := maps.Collect(ix.Get(l))
		if !maps.Equal(got, want[l]) {
			t.Errorf("index of link %d holds %v; want %v", l, got, want[l])
		}
		if !maps.Equal(got, walked[l]) {
			t.Errorf("index of link %d holds %v; a walk of the mirror finds %v", l, got, walked[l])
		}
		if n := ix.Len(l); n != len(want[l]) {
			t.Errorf("Len(%d) = %d; want %d", l, n, len(want[l]))
		}
	}
}

// TestMirrorIndex: an index, made at once or lazily, holds what the mirror held when it
// was made and follows events, writes and dumps, moving an object whose value changes.
func TestMirrorIndex(t *testing.T) {
	for name, newIndex := range map[string]func(*hal.Mirror[string, obj], func(string, obj) (int, bool)) *hal.Index[string, obj, int]{
		"NewIndex":     hal.NewIndex[string, obj, int],
		"NewLazyIndex": hal.NewLazyIndex[string, obj, int],
	} {
		t.Run(name, func(t *testing.T) { testMirrorIndex(t, newIndex) })
	}
}

func testMirrorIndex(t *testing.T, newIndex func(*hal.Mirror[string, obj], func(string, obj) (int, bool)) *hal.Index[string, obj, int]) {
	m := newMirror(t, map[string]obj{"a": {"gw", 1}, "b": {"gw", 1}, "c": {"gw", 2}})
	ix := newIndex(m, byLink)
	wantIndexed(t, m, ix, map[int]map[string]obj{1: {"a": {"gw", 1}, "b": {"gw", 1}}, 2: {"c": {"gw", 2}}})

	m.Update("a", obj{"gw", 2})
	m.Remove("b")
	m.Update("d", obj{"gw", 0})
	wantIndexed(t, m, ix, map[int]map[string]obj{2: {"a": {"gw", 2}, "c": {"gw", 2}}})

	w := m.Expect("d", obj{"gw", 3})
	w.Done()
	w = m.ExpectGone("c")
	w.Done()
	w = m.Expect("e", obj{"gw", 4})
	w.Fail()
	wantIndexed(t, m, ix, map[int]map[string]obj{2: {"a": {"gw", 2}}, 3: {"d": {"gw", 3}}})

	if _, err := m.Replace(dumpOf(map[string]obj{"a": {"gw", 5}, "f": {"gw", 5}, "g": {"gw", 0}})); err != nil {
		t.Fatal(err)
	}
	wantIndexed(t, m, ix, map[int]map[string]obj{5: {"a": {"gw", 5}, "f": {"gw", 5}}})

	// An object removed or moved between Get and the iteration is passed over.
	seq := ix.Get(5)
	m.Remove("f")
	m.Update("a", obj{"gw", 6})
	if got := maps.Collect(seq); len(got) != 0 {
		t.Errorf("Get(5), iterated after its objects left, yields %v", got)
	}
	wantIndexed(t, m, ix, map[int]map[string]obj{6: {"a": {"gw", 6}}})
}

// TestMirrorLazyIndex: a lazy index takes, at its first use, what the mirror holds then,
// whatever changed since it was made, and follows the mirror from then on.
func TestMirrorLazyIndex(t *testing.T) {
	m := newMirror(t, map[string]obj{"a": {"gw", 1}, "b": {"gw", 1}})
	ix := hal.NewLazyIndex(m, byLink)
	m.Update("a", obj{"gw", 2})
	m.Remove("b")
	if _, err := m.Replace(dumpOf(map[string]obj{"a": {"gw", 2}, "c": {"gw", 3}})); err != nil {
		t.Fatal(err)
	}
	w := m.Expect("d", obj{"gw", 3})
	w.Done()
	if n := ix.Len(3); n != 2 {
		t.Errorf("Len(3) = %d at the first use; want 2", n)
	}
	wantIndexed(t, m, ix, map[int]map[string]obj{2: {"a": {"gw", 2}}, 3: {"c": {"gw", 3}, "d": {"gw", 3}}})
	m.Update("c", obj{"gw", 2})
	m.Update("d", obj{"gw", 3}) // the echo of the write
	m.Remove("d")
	wantIndexed(t, m, ix, map[int]map[string]obj{2: {"a": {"gw", 2}, "c": {"gw", 2}}})
}
