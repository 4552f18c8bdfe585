package hal

import (
	"sync"

	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// newQueue returns the HAL's work queue: client-go's rate-limiting and delaying queues,
// named hal, over a keyQueue.
func newQueue(limiter workqueue.TypedRateLimiter[nimbusv1.Key], clk clock.WithTicker) workqueue.TypedRateLimitingInterface[nimbusv1.Key] {
	d := workqueue.NewTypedDelayingQueueWithConfig(workqueue.TypedDelayingQueueConfig[nimbusv1.Key]{Name: "hal", Clock: clk, Queue: newKeyQueue()})
	return workqueue.NewTypedRateLimitingQueueWithConfig(limiter,
		workqueue.TypedRateLimitingQueueConfig[nimbusv1.Key]{Name: "hal", Clock: clk, DelayingQueue: d})
}

// keyQueue is the work queue under the HAL's rate limiting and delays. It does what
// client-go's queue (workqueue.Typed) does: a key added again while it waits keeps its
// place and is handed out once, a key added while a worker holds it waits until the
// worker is Done with it, so no key runs on two workers at once, and keys still waiting
// at ShutDown are handed out before Get reports the shutdown. Unlike client-go's, whose
// sets of waiting keys and of keys being processed keep the room they grew to, its sets
// let their room go when they empty after holding more than keySetKeep keys: after a
// restart or a resync has queued every key, the drained queue holds nothing. It keeps
// no metrics, as client-go's keeps none without a metrics provider.
type keyQueue struct {
	// mu guards every field below; cond, on mu, wakes Get and ShutDownWithDrain.
	mu   sync.Mutex
	cond sync.Cond
	// order holds the waiting keys that no worker holds, first in first out.
	order keyFIFO
	// dirty holds the keys waiting, those in order and those added again while a worker
	// held them; processing the keys that workers hold.
	dirty, processing keySet
	// shuttingDown is set by ShutDown and ShutDownWithDrain; drain while
	// ShutDownWithDrain waits for the workers.
	shuttingDown, drain bool
}

var _ workqueue.TypedInterface[nimbusv1.Key] = (*keyQueue)(nil)

// newKeyQueue returns an empty queue.
func newKeyQueue() *keyQueue {
	q := &keyQueue{}
	q.cond.L = &q.mu
	return q
}

// Add queues key unless it is waiting already or the queue is shutting down; a key a
// worker holds is handed out again once the worker is Done with it.
func (q *keyQueue) Add(key nimbusv1.Key) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.shuttingDown || q.dirty.has(key) {
		return
	}
	q.dirty.insert(key)
	if q.processing.has(key) {
		return
	}
	q.order.Push(key)
	q.cond.Signal()
}

// Len returns the number of keys waiting that no worker holds.
func (q *keyQueue) Len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.order.Len()
}

// Get waits for a key and hands it to the caller, who must call Done with it; shutdown
// is true, and key the zero key, once the queue is shutting down and no key waits.
func (q *keyQueue) Get() (key nimbusv1.Key, shutdown bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for q.order.Len() == 0 && !q.shuttingDown {
		q.cond.Wait()
	}
	if q.order.Len() == 0 {
		return nimbusv1.Key{}, true
	}
	key = q.order.Pop()
	q.processing.insert(key)
	q.dirty.remove(key)
	return key, false
}

// Done marks key as no longer held; if it was added again meanwhile, it waits again.
func (q *keyQueue) Done(key nimbusv1.Key) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.processing.remove(key)
	if q.dirty.has(key) {
		q.order.Push(key)
		q.cond.Signal()
	} else if q.processing.len() == 0 {
		q.cond.Signal()
	}
}

// ShutDown makes the queue ignore new keys and Get return shutdown once no key waits.
func (q *keyQueue) ShutDown() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.drain = false
	q.shuttingDown = true
	q.cond.Broadcast()
}

// ShutDownWithDrain shuts the queue down as ShutDown does and waits until the workers
// are Done with every key they hold, or until ShutDown is called.
func (q *keyQueue) ShutDownWithDrain() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.drain = true
	q.shuttingDown = true
	q.cond.Broadcast()
	for q.processing.len() != 0 && q.drain {
		q.cond.Wait()
	}
}

// ShuttingDown reports whether ShutDown or ShutDownWithDrain was called.
func (q *keyQueue) ShuttingDown() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.shuttingDown
}

// keySetKeep is the most keys a keySet may have held and still keep its map once it
// empties: a map keeps the room it grew to, and a small one is cheaper kept than made
// again for the next key.
const keySetKeep = 64

// keySet is a set of keys whose map is let go when the set empties after holding more
// than keySetKeep keys. The zero keySet is empty.
type keySet struct {
	m map[nimbusv1.Key]struct{}
	// peak is the most keys m has held.
	peak int
}

// has reports whether key is in the set.
func (s *keySet) has(key nimbusv1.Key) bool {
	_, ok := s.m[key]
	return ok
}

// len returns the number of keys in the set.
func (s *keySet) len() int { return len(s.m) }

// insert adds key to the set.
func (s *keySet) insert(key nimbusv1.Key) {
	if s.m == nil {
		s.m = map[nimbusv1.Key]struct{}{}
	}
	s.m[key] = struct{}{}
	s.peak = max(s.peak, len(s.m))
}

// remove takes key out of the set, and lets the map go if that empties a set that held
// more than keySetKeep keys.
func (s *keySet) remove(key nimbusv1.Key) {
	delete(s.m, key)
	if len(s.m) == 0 && s.peak > keySetKeep {
		s.m, s.peak = nil, 0
	}
}

// keyFIFO is the order of the keys waiting in the work queue, first in first out, as
// client-go's default: a slice that Push appends to and Pop takes the head of. Unlike
// the default it lets its array go once the last key is popped: after a restart or a
// resync has queued every key, the drained queue holds nothing, where the default kept
// an array of every key until enough new keys came to outgrow it.
type keyFIFO []nimbusv1.Key

// Push adds a key at the end.
func (q *keyFIFO) Push(key nimbusv1.Key) { *q = append(*q, key) }

// Len returns the number of keys waiting.
func (q *keyFIFO) Len() int { return len(*q) }

// Pop removes the first key and returns it.
func (q *keyFIFO) Pop() nimbusv1.Key {
	key := (*q)[0]
	if len(*q) == 1 {
		*q = nil
		return key
	}
	(*q)[0] = nimbusv1.Key{}
	*q = (*q)[1:]
	return key
}
