package hal

import (
	"encoding/binary"
	"hash/maphash"
	"sync"
	"sync/atomic"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// statusWriter records the statuses that workers hand it in batches, so that many
// reconciles cost one store transaction: its run loop takes what is pending, at most batch
// statuses, and records it with one Store.WriteStatus. While more work is queued (more
// reports true) it waits until batch statuses are pending, so a bulk of reconciles fills
// whole transactions; once the queue is empty it records at once whatever is pending. It
// keeps only the latest status of a key that is still pending, and records a key's
// statuses in the order they were handed over.
//
// It records a status only when it changed: it remembers, per key, a hash of the key and
// the content of the last status it recorded (statusSum: everything but the update time),
// and passes over a status whose key and content hash the same, so that reconciles that
// change nothing, such as the periodic refreshes of counters, cost no store transaction
// and send nothing upstream. It remembers a key by a hash of it too (keySum), 8 bytes
// where a nimbusv1.Key takes 56 and more for its strings, in a map that holds every
// object with a status: two keys with the same keySum share a place, which costs at most
// a status recorded again, for a status is passed over only when its sum, which hashes
// the key, is the one remembered. A removal is always recorded, and the key forgotten. A transaction that fails changes
// nothing it remembers: the keys in it are reconciled again and their statuses recorded
// anew.
type statusWriter struct {
	store  Store
	batch  int
	more   func() bool
	failed func(ids []nimbusv1.Key, err error)
	signal chan struct{}

	// mu guards order, pending and stopped.
	mu sync.Mutex
	// order holds the keys of pending, in the order they became pending.
	order   []nimbusv1.Key
	pending map[nimbusv1.Key]StatusUpdate
	stopped bool

	commits, writes atomic.Uint64

	// seed seeds the hashes of statuses.
	seed maphash.Seed
	// recorded holds, by the keySum of a key, the statusSum of the last status recorded
	// for it. Only run reads and writes it.
	recorded map[uint64]uint64
}

func newStatusWriter(store Store, batch int, more func() bool, failed func(ids []nimbusv1.Key, err error)) *statusWriter {
	return &statusWriter{
		store:    store,
		batch:    batch,
		more:     more,
		failed:   failed,
		signal:   make(chan struct{}, 1),
		pending:  map[nimbusv1.Key]StatusUpdate{},
		seed:     maphash.MakeSeed(),
		recorded: map[uint64]uint64{},
	}
}

// put hands over the status of the object with the key u.Key, replacing a pending one.
func (w *statusWriter) put(u StatusUpdate) {
	w.mu.Lock()
	if _, ok := w.pending[u.Key]; !ok {
		w.order = append(w.order, u.Key)
	}
	w.pending[u.Key] = u
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
		ids, updates, sums := w.changed(ids, updates)
		if len(updates) == 0 {
			continue
		}
		if err := w.store.WriteStatus(updates); err != nil {
			w.failed(ids, err)
			continue
		}
		for i, u := range updates {
			if u.Status == nil || sums[i] == 0 {
				delete(w.recorded, w.keySum(ids[i]))
			} else {
				w.recorded[w.keySum(ids[i])] = sums[i]
			}
		}
		w.commits.Add(1)
		w.writes.Add(uint64(len(updates)))
	}
}

// changed returns the updates among those take returned that change what is recorded, with
// their keys and the sums of their statuses (0 for a removal, or a status that cannot be
// summed). It filters ids and updates in place: take hands them over.
func (w *statusWriter) changed(ids []nimbusv1.Key, updates []StatusUpdate) ([]nimbusv1.Key, []StatusUpdate, []uint64) {
	sums := make([]uint64, 0, len(updates))
	n := 0
	for i, u := range updates {
		var sum uint64
		if u.Status != nil {
			sum = w.statusSum(ids[i], u.Status)
			if last, ok := w.recorded[w.keySum(ids[i])]; ok && sum != 0 && last == sum {
				continue
			}
		}
		ids[n], updates[n] = ids[i], u
		sums = append(sums, sum)
		n++
	}
	clear(updates[n:])
	return ids[:n], updates[:n], sums
}

// keySum returns the hash by which recorded remembers a key.
func (w *statusWriter) keySum(id nimbusv1.Key) uint64 {
	var h maphash.Hash
	h.SetSeed(w.seed)
	hashKey(&h, id)
	return h.Sum64()
}

// hashKey adds a key to h.
func hashKey(h *maphash.Hash, id nimbusv1.Key) {
	hashUint(h, uint64(id.Kind))
	hashString(h, id.Tenant)
	hashString(h, id.Namespace)
	hashString(h, id.Name)
}

// statusSum returns a hash of the key of an object and the content of its status: every
// field but the update time. It returns 0, which matches no status, for a status it
// cannot hash whole (one with fields this build does not know).
func (w *statusWriter) statusSum(id nimbusv1.Key, st *nimbusv1.NodeStatus) uint64 {
	if len(st.ProtoReflect().GetUnknown()) != 0 {
		return 0
	}
	var h maphash.Hash
	h.SetSeed(w.seed)
	// A different prefix than keySum's, so that the two hashes of a key differ.
	hashUint(&h, 1)
	hashKey(&h, id)
	hashString(&h, st.GetNode())
	hashUint(&h, uint64(st.GetObservedGeneration()))
	hashUint(&h, uint64(st.GetPhase()))
	hashString(&h, st.GetReason())
	hashString(&h, st.GetMessage())
	stale := uint64(0)
	if st.GetStale() {
		stale = 1
	}
	hashUint(&h, stale)
	terminal := uint64(0)
	if st.GetTerminal() {
		terminal = 1
	}
	hashUint(&h, terminal)
	// The operational data in any order: the sum of the hashes of the entries.
	var ops uint64
	var e maphash.Hash
	e.SetSeed(w.seed)
	for k, v := range st.GetOperational() {
		e.Reset()
		hashString(&e, k)
		hashString(&e, v)
		ops += e.Sum64()
	}
	hashUint(&h, uint64(len(st.GetOperational())))
	hashUint(&h, ops)
	// The typed operational data by its encoding, which holds no map and so is the same
	// for equal messages.
	b, err := st.GetOperationalData().MarshalVT()
	if err != nil {
		return 0
	}
	hashUint(&h, uint64(len(b)))
	h.Write(b)
	if sum := h.Sum64(); sum != 0 {
		return sum
	}
	return 1
}

// take removes up to batch pending statuses, oldest first; none while fewer are pending
// and more work is queued.
func (w *statusWriter) take() (ids []nimbusv1.Key, updates []StatusUpdate, stopped bool) {
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
	if len(w.pending) == 0 {
		// A map keeps the room it grew to: a fresh one, so that a drained writer
		// does not hold room for every key a restart or a resync handed over.
		w.pending = map[nimbusv1.Key]StatusUpdate{}
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

// hashString adds s to h, preceded by its length, so that no two sequences of strings
// hash alike by their concatenation.
func hashString(h *maphash.Hash, s string) {
	hashUint(h, uint64(len(s)))
	h.WriteString(s)
}

// hashUint adds v to h.
func hashUint(h *maphash.Hash, v uint64) {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], v)
	h.Write(b[:])
}
