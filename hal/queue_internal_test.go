package hal

import (
	"fmt"
	"runtime"
	"sync"
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

// TestKeyQueue hands keys out as client-go's queue does: a key added twice while it
// waits comes out once, a key added while a worker holds it comes out again only after
// Done, keys waiting at ShutDown still come out, and then Get reports the shutdown and
// Add does nothing.
func TestKeyQueue(t *testing.T) {
	key := func(i int) nimbusv1.Key {
		return nimbusv1.MakeKey(nimbusv1.Kind_KIND_ENDPOINT, "", "", fmt.Sprintf("ep%d", i))
	}
	q := newKeyQueue()
	get := func(want nimbusv1.Key) {
		t.Helper()
		if got, shutdown := q.Get(); got != want || shutdown {
			t.Fatalf("Get() = %v, %v; want %v, false", got, shutdown, want)
		}
	}
	q.Add(key(0))
	q.Add(key(1))
	q.Add(key(0))
	if q.Len() != 2 {
		t.Fatalf("Len() = %d, want 2", q.Len())
	}
	get(key(0))
	q.Add(key(0)) // held: waits for Done
	if q.Len() != 1 {
		t.Fatalf("Len() with key 0 held and added again = %d, want 1", q.Len())
	}
	get(key(1))
	q.Done(key(1))
	if q.Len() != 0 {
		t.Fatalf("Len() before key 0 is Done = %d, want 0", q.Len())
	}
	q.Done(key(0))
	get(key(0))
	q.Done(key(0))

	got := make(chan nimbusv1.Key)
	go func() {
		k, _ := q.Get()
		got <- k
	}()
	q.Add(key(2))
	if k := <-got; k != key(2) {
		t.Fatalf("a waiting Get got %v, want %v", k, key(2))
	}
	q.Done(key(2))

	q.Add(key(3))
	q.ShutDown()
	q.Add(key(4))
	if !q.ShuttingDown() {
		t.Fatal("ShuttingDown() = false after ShutDown")
	}
	get(key(3))
	q.Done(key(3))
	if k, shutdown := q.Get(); !shutdown || k != (nimbusv1.Key{}) {
		t.Fatalf("Get() after shutdown = %v, %v; want the zero key, true", k, shutdown)
	}
}

// TestKeyQueueDrained queues many keys and works them off: the drained queue holds no
// map and no array, and takes keys again.
func TestKeyQueueDrained(t *testing.T) {
	q := newKeyQueue()
	const n = 10 * keySetKeep
	for i := range n {
		q.Add(nimbusv1.MakeKey(nimbusv1.Kind_KIND_ENDPOINT, "", "", fmt.Sprintf("ep%d", i)))
	}
	var held []nimbusv1.Key
	for range n {
		k, _ := q.Get()
		held = append(held, k)
	}
	for _, k := range held {
		q.Done(k)
	}
	if q.dirty.m != nil || q.processing.m != nil || q.order != nil {
		t.Errorf("drained queue holds dirty %d, processing %d, order %d", len(q.dirty.m), len(q.processing.m), cap(q.order))
	}
	k := nimbusv1.MakeKey(nimbusv1.Kind_KIND_ENDPOINT, "", "", "again")
	q.Add(k)
	if got, _ := q.Get(); got != k {
		t.Fatalf("Get() = %v, want %v", got, k)
	}
	q.Done(k)
	if q.dirty.m == nil || q.processing.m == nil {
		t.Error("a queue that held one key let its sets go; want them kept")
	}
}

// TestKeyQueueDrain shows ShutDownWithDrain waiting until the worker holding a key is
// Done with it.
func TestKeyQueueDrain(t *testing.T) {
	q := newKeyQueue()
	k := nimbusv1.MakeKey(nimbusv1.Kind_KIND_ENDPOINT, "", "", "ep")
	q.Add(k)
	q.Get()
	drained := make(chan struct{})
	go func() {
		q.ShutDownWithDrain()
		close(drained)
	}()
	for !q.ShuttingDown() {
		runtime.Gosched()
	}
	select {
	case <-drained:
		t.Fatal("ShutDownWithDrain returned while a worker held a key")
	default:
	}
	q.Done(k)
	<-drained
}

// TestKeyQueueWorkers runs workers on keys added from several goroutines at once: every
// key is worked, and no key is held by two workers at once.
func TestKeyQueueWorkers(t *testing.T) {
	q := newKeyQueue()
	const keys, adders, workers = 50, 4, 4
	var mu sync.Mutex
	held := map[nimbusv1.Key]bool{}
	worked := map[nimbusv1.Key]int{}
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				k, shutdown := q.Get()
				if shutdown {
					return
				}
				mu.Lock()
				if held[k] {
					t.Errorf("%v held by two workers", k)
				}
				held[k] = true
				worked[k]++
				mu.Unlock()
				runtime.Gosched()
				mu.Lock()
				held[k] = false
				mu.Unlock()
				q.Done(k)
			}
		})
	}
	var add sync.WaitGroup
	for range adders {
		add.Go(func() {
			for i := range 20 * keys {
				q.Add(nimbusv1.MakeKey(nimbusv1.Kind_KIND_ENDPOINT, "", "", fmt.Sprintf("ep%d", i%keys)))
			}
		})
	}
	add.Wait()
	q.ShutDownWithDrain()
	q.ShutDown()
	wg.Wait()
	if len(worked) != keys {
		t.Errorf("%d keys worked, want %d", len(worked), keys)
	}
}
