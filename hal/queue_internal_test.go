package hal

import (
	"fmt"
	"testing"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// TestKeyFIFO pushes keys, pops some, pushes more and pops the rest: they come out in
// the order they went in, and the drained queue holds no array.
func TestKeyFIFO(t *testing.T) {
	key := func(i int) nimbusv1.Key {
		return nimbusv1.MakeKey(nimbusv1.Kind_KIND_ENDPOINT, "", "", fmt.Sprintf("ep%d", i))
	}
	var q keyFIFO
	next, popped := 0, 0
	pop := func(n int) {
		for range n {
			if got, want := q.Pop(), key(popped); got != want {
				t.Fatalf("Pop() = %v, want %v", got, want)
			}
			popped++
		}
	}
	push := func(n int) {
		for range n {
			q.Push(key(next))
			next++
		}
	}
	push(100)
	pop(40)
	push(10)
	if q.Len() != 70 {
		t.Fatalf("Len() = %d, want 70", q.Len())
	}
	pop(70)
	if q.Len() != 0 || cap(q) != 0 {
		t.Errorf("drained queue: Len() = %d, cap = %d; want 0 and 0", q.Len(), cap(q))
	}
	push(1)
	pop(1)
}
