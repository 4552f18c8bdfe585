package linux

import "sync"

// keyedMutex is a set of mutexes, one per key, created on demand and dropped when unused.
type keyedMutex[K comparable] struct {
	// mu guards locks and free.
	mu    sync.Mutex
	locks map[K]*refMutex
	// free holds mutexes no key uses, for the next key to take: a busy reconciler locks
	// and unlocks a mutex per kernel write.
	free []*refMutex
}

type refMutex struct {
	sync.Mutex
	refs int
}

// lock locks the mutex of key and returns it, for unlock.
func (k *keyedMutex[K]) lock(key K) *refMutex {
	k.mu.Lock()
	if k.locks == nil {
		k.locks = map[K]*refMutex{}
	}
	m, ok := k.locks[key]
	if !ok {
		if n := len(k.free); n > 0 {
			m, k.free = k.free[n-1], k.free[:n-1]
		} else {
			m = &refMutex{}
		}
		k.locks[key] = m
	}
	m.refs++
	k.mu.Unlock()

	m.Lock()
	return m
}

// unlock unlocks m, the mutex lock returned for key.
func (k *keyedMutex[K]) unlock(key K, m *refMutex) {
	m.Unlock()
	k.mu.Lock()
	if m.refs--; m.refs == 0 {
		delete(k.locks, key)
		if len(k.free) < 64 {
			k.free = append(k.free, m)
		}
	}
	k.mu.Unlock()
}
