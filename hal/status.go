package hal

import (
	"sync"
	"sync/atomic"
)

// statusWriter records the statuses that workers hand it in batches, so that many
// reconciles cost one store transaction: its run loop takes what is pending, at most batch
// statuses, and records it with one Store.WriteStatus. While more work is queued (more
// reports true) it waits until batch statuses are pending, so a bulk of reconciles fills
// whole transactions; once the queue is empty it records at once whatever is pending. It
// keeps only the latest status of a key that is still pending, and records a key's
// statuses in the order they were handed over.
type statusWriter struct {
	store  Store
	batch  int
	more   func() bool
	failed func(ids []string, err error)
	signal chan struct{}

	// mu guards order, pending and stopped.
	mu sync.Mutex
	// order holds the key IDs of pending, in the order they became pending.
	order   []string
	pending map[string]StatusUpdate
	stopped bool

	commits, writes atomic.Uint64
}

func newStatusWriter(store Store, batch int, more func() bool, failed func(ids []string, err error)) *statusWriter {
	return &statusWriter{
		store:   store,
		batch:   batch,
		more:    more,
		failed:  failed,
		signal:  make(chan struct{}, 1),
		pending: map[string]StatusUpdate{},
	}
}

// put hands over the status of the object with key ID id, replacing a pending one.
func (w *statusWriter) put(id string, u StatusUpdate) {
	w.mu.Lock()
	if _, ok := w.pending[id]; !ok {
		w.order = append(w.order, id)
	}
	w.pending[id] = u
	w.mu.Unlock()
	w.poke()
}

// poke makes run look again whether to record what is pending: a status was handed over,
// or the work queue changed.
func (w *statusWriter) poke() {
	select {
	case w.signal <- struct{}{}:
	default:
	}
}

// run records pending statuses until stop is called and nothing is pending any more.
func (w *statusWriter) run() {
	for {
		ids, updates, stopped := w.take()
		if len(ids) == 0 {
			if stopped {
				return
			}
			<-w.signal
			continue
		}
		if err := w.store.WriteStatus(updates); err != nil {
			w.failed(ids, err)
			continue
		}
		w.commits.Add(1)
		w.writes.Add(uint64(len(updates)))
	}
}

// take removes up to batch pending statuses, oldest first; none while fewer are pending
// and more work is queued.
func (w *statusWriter) take() (ids []string, updates []StatusUpdate, stopped bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := min(len(w.order), w.batch)
	if n == 0 {
		w.order = nil
		return nil, nil, w.stopped
	}
	if n < w.batch && !w.stopped && w.more() {
		return nil, nil, false
	}
	ids = w.order[:n:n]
	w.order = w.order[n:]
	updates = make([]StatusUpdate, n)
	for i, id := range ids {
		updates[i] = w.pending[id]
		delete(w.pending, id)
	}
	return ids, updates, w.stopped
}

// stop makes run return once it has recorded what is pending.
func (w *statusWriter) stop() {
	w.mu.Lock()
	w.stopped = true
	w.mu.Unlock()
	w.poke()
}

// counts returns the number of transactions recorded and of the statuses they held.
func (w *statusWriter) counts() (commits, writes uint64) {
	return w.commits.Load(), w.writes.Load()
}
