package hal

import (
	"fmt"
	"sync"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// States of a HAL's Run, for Ready.
const (
	runNotStarted int32 = iota
	runRunning
	runStopped
)

// readiness tracks which desired objects the HAL has reconciled at least once since it
// was made. It learns of keys from the desired feed, and once the store's desired table is
// complete, from one pass over the table (complete), so that a key committed together
// with the mark of completeness counts even before the feed hands it out.
type readiness struct {
	// mu guards keys, pending and done.
	mu sync.Mutex
	// keys holds the keys of the desired objects the HAL knows of: false until the
	// first reconcile of the key ends, true after. A key whose object is gone is dropped.
	keys map[nimbusv1.Key]bool
	// pending counts the keys that are false.
	pending int
	// done tells that complete has run.
	done bool
	// caughtUp tells that every key was reconciled once the table was complete; from then
	// on the HAL stays ready and keys is no longer kept.
	caughtUp bool
}

// checkLocked latches caughtUp once the table is complete and nothing is pending, and
// lets go of the keys. The caller holds mu.
func (r *readiness) checkLocked() {
	if r.done && r.pending == 0 && !r.caughtUp {
		r.caughtUp, r.keys = true, nil
	}
}

func newReadiness() *readiness { return &readiness{keys: map[nimbusv1.Key]bool{}} }

// heard records keys whose objects changed; those it did not know yet wait for their
// first reconcile.
func (r *readiness) heard(ids []nimbusv1.Key) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.caughtUp {
		return
	}
	for _, id := range ids {
		if _, ok := r.keys[id]; !ok {
			r.keys[id] = false
			r.pending++
		}
	}
}

// reconciled records that a reconcile of the key ended, with the object present or not.
// A key without an object is no desired object: it is dropped.
func (r *readiness) reconciled(id nimbusv1.Key, present bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.caughtUp {
		return
	}
	defer r.checkLocked()
	done, ok := r.keys[id]
	if ok && !done {
		r.pending--
	}
	if present {
		r.keys[id] = true
	} else {
		delete(r.keys, id)
	}
}

// complete records that the desired table is complete and holds the keys ids. It returns
// the keys it did not know yet, which the caller must enqueue: one may be the key of an
// object that was deleted, and reconciled as such, after ids was read, and only a
// reconcile drops it again.
func (r *readiness) complete(ids []nimbusv1.Key) (unknown []nimbusv1.Key) {
	r.mu.Lock()
	defer r.mu.Unlock()
	defer r.checkLocked()
	for _, id := range ids {
		if _, ok := r.keys[id]; !ok {
			r.keys[id] = false
			r.pending++
			unknown = append(unknown, id)
		}
	}
	r.done = true
	return unknown
}

// unreconciled returns the number of desired objects not reconciled yet.
func (r *readiness) unreconciled() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.pending
}

// Ready returns why the HAL has not caught up with the desired state, nothing once it has:
// Run is running, the store's desired table is complete (Store.Synced: restored from disk,
// or synced with nimbus), and every desired object has been reconciled at least once since
// New. A reconcile that failed counts: the object is FAILED and its status says why, and
// retrying it is no reason to wait. Once ready, the HAL stays ready while Run runs: objects
// added later are ordinary work, not a reason to take the agent out of service, and the
// keys it tracked until then are let go. It is safe to call at any time.
func (h *HAL) Ready() []string {
	switch h.state.Load() {
	case runNotStarted:
		return []string{"hal not running yet"}
	case runStopped:
		return []string{"hal stopped"}
	}
	r := h.ready
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.done {
		return []string{"desired state not complete yet: neither restored from disk nor synced with nimbus"}
	}
	switch {
	case r.pending == 1:
		return []string{"1 desired object not reconciled yet since start"}
	case r.pending > 1:
		return []string{fmt.Sprintf("%d desired objects not reconciled yet since start", r.pending)}
	}
	return nil
}
