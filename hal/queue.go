package hal

import (
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// newQueue returns the HAL's work queue: client-go's rate-limiting queue, named hal,
// whose first-in-first-out order is a keyFIFO.
func newQueue(limiter workqueue.TypedRateLimiter[nimbusv1.Key], clk clock.WithTicker) workqueue.TypedRateLimitingInterface[nimbusv1.Key] {
	q := workqueue.NewTypedWithConfig(workqueue.TypedQueueConfig[nimbusv1.Key]{Name: "hal", Clock: clk, Queue: new(keyFIFO)})
	d := workqueue.NewTypedDelayingQueueWithConfig(workqueue.TypedDelayingQueueConfig[nimbusv1.Key]{Name: "hal", Clock: clk, Queue: q})
	return workqueue.NewTypedRateLimitingQueueWithConfig(limiter,
		workqueue.TypedRateLimitingQueueConfig[nimbusv1.Key]{Name: "hal", Clock: clk, DelayingQueue: d})
}

// keyFIFO is the order of the keys waiting in the work queue, first in first out, as
// client-go's default: a slice that Push appends to and Pop takes the head of. Unlike
// the default it lets its array go once the last key is popped: after a restart or a
// resync has queued every key, the drained queue holds nothing, where the default kept
// an array of every key until enough new keys came to outgrow it.
type keyFIFO []nimbusv1.Key

var _ workqueue.Queue[nimbusv1.Key] = (*keyFIFO)(nil)

// Touch does nothing: a key queued again keeps its place.
func (q *keyFIFO) Touch(nimbusv1.Key) {}

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
