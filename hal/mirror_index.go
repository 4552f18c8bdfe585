package hal

import (
	"iter"
	"sync"
)

// Index is a secondary index of a Mirror: its objects by a value derived from each (the
// interface of an address, the output interface of a route, the input interface of a
// rule), so that a reader finds the objects of one value without walking the whole
// mirror. It follows every change the mirror shows, from events, writes and Replace
// alike. It is safe for concurrent use.
type Index[K comparable, V any, X comparable] struct {
	m  *Mirror[K, V]
	by func(K, V) (X, bool)
	// attached is done once the index holds the mirror's objects and follows it: at
	// NewIndex, or at the first Get or Len of an index NewLazyIndex made.
	attached sync.Once
	// mu guards keys.
	mu sync.RWMutex
	// keys holds the keys of the mirrored objects by their value.
	keys map[X]map[K]struct{}
}

// mirrorIndex is what a Mirror tells its indexes: the object with key k was old (when
// had) and is v now (when has).
type mirrorIndex[K comparable, V any] interface {
	changed(k K, old V, had bool, v V, has bool)
}

// NewIndex returns an index of m by what by returns for each object; an object for which
// by returns false is not in the index. by must derive its value from the key and the
// object alone, and be cheap: the mirror calls it on every change. The index holds the
// objects m holds when it is made, and follows m from then on; it cannot be removed.
func NewIndex[K comparable, V any, X comparable](m *Mirror[K, V], by func(K, V) (X, bool)) *Index[K, V, X] {
	ix := NewLazyIndex(m, by)
	ix.attached.Do(ix.attach)
	return ix
}

// NewLazyIndex is NewIndex for an index that few mirrors are read through: it costs the
// mirror nothing until its first Get or Len, which takes the objects m holds then (a
// walk of the whole mirror, once) and follows m from then on. Neither may then be
// called while the mirror runs a follower (Follow), as no call of m may.
func NewLazyIndex[K comparable, V any, X comparable](m *Mirror[K, V], by func(K, V) (X, bool)) *Index[K, V, X] {
	return &Index[K, V, X]{m: m, by: by, keys: map[X]map[K]struct{}{}}
}

// attach makes the index hold the mirror's objects and follow its changes, a shard at
// a time.
func (ix *Index[K, V, X]) attach() {
	m := ix.m
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		sh.indexes = append(sh.indexes, ix)
		for k, v := range sh.objs {
			ix.changed(k, v, false, v, true)
		}
		sh.mu.Unlock()
	}
}

// changed moves k from the value of old to that of v in the index.
func (ix *Index[K, V, X]) changed(k K, old V, had bool, v V, has bool) {
	var from, to X
	var inFrom, inTo bool
	if had {
		from, inFrom = ix.by(k, old)
	}
	if has {
		to, inTo = ix.by(k, v)
	}
	if inFrom == inTo && from == to {
		return
	}
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if inFrom {
		if set := ix.keys[from]; set != nil {
			delete(set, k)
			if len(set) == 0 {
				delete(ix.keys, from)
			}
		}
	}
	if inTo {
		set := ix.keys[to]
		if set == nil {
			set = map[K]struct{}{}
			ix.keys[to] = set
		}
		set[k] = struct{}{}
	}
}

// Get returns the mirrored objects whose value is x, each as the mirror shows it when
// the iteration reaches it, in no particular order. An object that changes meanwhile
// shows in its new state if it still has the value x, and not at all otherwise.
func (ix *Index[K, V, X]) Get(x X) iter.Seq2[K, V] {
	ix.attached.Do(ix.attach)
	ix.mu.RLock()
	set := ix.keys[x]
	keys := make([]K, 0, len(set))
	for k := range set {
		keys = append(keys, k)
	}
	ix.mu.RUnlock()
	return func(yield func(K, V) bool) {
		for _, k := range keys {
			v, ok := ix.m.Get(k)
			if !ok {
				continue
			}
			if got, in := ix.by(k, v); !in || got != x {
				continue
			}
			if !yield(k, v) {
				return
			}
		}
	}
}

// Len returns the number of mirrored objects whose value is x.
func (ix *Index[K, V, X]) Len(x X) int {
	ix.attached.Do(ix.attach)
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	return len(ix.keys[x])
}
