package linux

import "sync"

// keyedMutex is a set of mutexes, one per key, created on demand and dropped when unused.
type keyedMutex[K comparable] struct {
	// mu guards locks.
	mu    sync.Mutex
	locks map[K]*refMutex
}

type refMutex struct {
	sync.Mutex
	refs int
}

// lock locks the mutex of key and returns its unlock function.
func (k *keyedMutex[K]) lock(key K) (unlock func()) {
	k.mu.Lock()
	if k.locks == nil {
		k.locks = map[K]*refMutex{}
	}
	m, ok := k.locks[key]
	if !ok {
		m = &refMutex{}
		k.locks[key] = m
	}
	m.refs++
	k.mu.Unlock()

	m.Lock()
	return func() {
		m.Unlock()
		k.mu.Lock()
		if m.refs--; m.refs == 0 {
			delete(k.locks, key)
		}
		k.mu.Unlock()
	}
}
