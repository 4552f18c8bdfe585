package delphi

import (
	"cmp"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
)

// contents returns the items of o in the order ascend visits them.
func contents(o *ordered[int]) []int {
	var out []int
	o.ascend(nil, func(v int) bool { out = append(out, v); return true })
	return out
}

func cmpInt(target int) func(int) int { return func(v int) int { return cmp.Compare(v, target) } }

// TestOrderedAgainstMap runs random transactions of inserts and deletes, of all sizes, on
// an ordered set and on a map, and checks after every one that the set holds what the map
// does, in order, in chunks within their bounds, and that every earlier version still
// holds what it held when it was published.
func TestOrderedAgainstMap(t *testing.T) {
	seed := rand.Uint64()
	rng := rand.New(rand.NewPCG(seed, 0))
	t.Logf("seed %d", seed)
	type version struct {
		o    *ordered[int]
		want []int
	}
	cur := buildOrdered(slices.Collect(func(yield func(int) bool) {
		for i := 0; i < 1000; i += 2 {
			yield(i)
		}
	}))
	ref := map[int]bool{}
	for _, v := range contents(cur) {
		ref[v] = true
	}
	var versions []version
	for txn := range 300 {
		next := cur.clone(&txnMark{})
		ops := rng.IntN(50)
		if txn%25 == 0 {
			ops = 2000 // a transaction that splits and merges many chunks
		}
		for range ops {
			v := rng.IntN(3000)
			if rng.IntN(2) == 0 {
				_, replaced := next.set(cmpInt(v), v)
				if replaced != ref[v] {
					t.Fatalf("set(%d) replaced = %v, want %v", v, replaced, ref[v])
				}
				ref[v] = true
			} else {
				old, deleted := next.delete(cmpInt(v))
				if deleted != ref[v] || deleted && old != v {
					t.Fatalf("delete(%d) = %d, %v; want %v", v, old, deleted, ref[v])
				}
				delete(ref, v)
			}
		}
		next.publish()
		want := slices.Sorted(maps.Keys(ref))
		if got := contents(next); !slices.Equal(got, want) {
			t.Fatalf("transaction %d: set holds %v, want %v", txn, got, want)
		}
		if next.len() != len(want) {
			t.Fatalf("transaction %d: len() = %d, want %d", txn, next.len(), len(want))
		}
		for i, c := range next.chunks {
			if len(c.items) == 0 || len(c.items) > maxChunk {
				t.Fatalf("transaction %d: chunk %d holds %d items", txn, i, len(c.items))
			}
		}
		versions = append(versions, version{next, want})
		cur = next
	}
	for i, v := range versions {
		if got := contents(v.o); !slices.Equal(got, v.want) {
			t.Fatalf("version %d changed after it was published: holds %d items, want %d", i, len(got), len(v.want))
		}
	}
}

func TestOrderedSeek(t *testing.T) {
	o := buildOrdered([]int{10, 20, 30})
	for _, tc := range []struct {
		target int
		want   []int
		found  bool
	}{
		{5, []int{10, 20, 30}, false},
		{10, []int{10, 20, 30}, true},
		{25, []int{30}, false},
		{35, nil, false},
	} {
		t.Run(fmt.Sprint(tc.target), func(t *testing.T) {
			var got []int
			o.ascend(cmpInt(tc.target), func(v int) bool { got = append(got, v); return true })
			if !slices.Equal(got, tc.want) {
				t.Errorf("ascend from %d = %v, want %v", tc.target, got, tc.want)
			}
			if _, ok := o.get(cmpInt(tc.target)); ok != tc.found {
				t.Errorf("get(%d) found = %v, want %v", tc.target, ok, tc.found)
			}
		})
	}
	if _, ok := buildOrdered[int](nil).get(cmpInt(1)); ok {
		t.Error("an empty set found 1")
	}
}

func TestOrderedRefusesWritesOncePublished(t *testing.T) {
	o := buildOrdered([]int{1})
	defer func() {
		if recover() == nil {
			t.Error("a write to a published set did not panic")
		}
	}()
	o.set(cmpInt(2), 2)
}
