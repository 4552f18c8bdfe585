package delphi

import (
	"context"
	"slices"
	"sync"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// SubscribeOptions selects what a subscription hears of.
type SubscribeOptions struct {
	// Tables are the tables to watch; keys that change in any of them are handed out.
	// Required.
	Tables []Table
	// Kind limits the subscription to one kind. Default: every kind.
	Kind nimbusv1.Kind
	// Key limits the subscription to the object with this key; Kind is then ignored.
	// Default: nil, every key.
	Key *nimbusv1.ObjectKey
}

// Subscription hands out the keys of a table that changed since the last Next, in the order
// they first changed, each key once however often it changed in between.
type Subscription struct {
	s      *Store
	opts   SubscribeOptions
	kind   nimbusv1.Kind // when set, only keys of this kind
	key    nimbusv1.Key  // when set, only this key
	signal chan struct{}

	// mu guards order, pending, closed and the resume points.
	mu      sync.Mutex
	order   []nimbusv1.Key
	pending map[nimbusv1.Key]struct{}
	closed  bool
	// queued is the resume point of the last desired-table commit whose keys are queued,
	// and handed that of the last one whose keys Next has handed out.
	queued, handed resumePoint
}

// resumePoint is a nimbus epoch and revision the desired table corresponds to.
type resumePoint struct {
	epoch    string
	revision uint64
}

// Subscribe starts a subscription. Its first Next returns every selected key present now,
// so a consumer that starts late still sees the whole table.
func (s *Store) Subscribe(opts SubscribeOptions) (*Subscription, error) {
	sub := &Subscription{
		s:       s,
		opts:    opts,
		signal:  make(chan struct{}, 1),
		pending: map[nimbusv1.Key]struct{}{},
	}
	if opts.Key != nil {
		sub.key = opts.Key.Key().Clone()
	} else {
		sub.kind = opts.Kind
	}
	// Register and read the current keys under writeMu, so no commit falls between them.
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, ErrClosed
	}
	s.subs[sub] = struct{}{}
	s.mu.Unlock()
	var keys []nimbusv1.Key
	for _, t := range opts.Tables {
		switch {
		case opts.Key != nil && t == TableDesired:
			if _, ok := s.Get(opts.Key); ok {
				keys = append(keys, sub.key)
			}
		case opts.Key != nil && t == TableStatus:
			if _, ok := s.Status(opts.Key); ok {
				keys = append(keys, sub.key)
			}
		case t == TableDesired:
			keys = slices.Grow(keys, s.desiredLen(opts.Kind))
			s.desiredRecords(opts.Kind, func(r *record) { keys = append(keys, r.key) })
		case t == TableStatus:
			s.statusMu.RLock()
			keys = append(keys, s.statusKeysLocked()...)
			s.statusMu.RUnlock()
		}
	}
	st := s.desired.Load()
	sub.add(keys, &resumePoint{st.epoch, st.revision})
	return sub, nil
}

// add queues changed keys, of a desired-table commit whose resume point is resume when
// that is set; the caller holds s.mu or writeMu.
func (sub *Subscription) add(keys []nimbusv1.Key, resume *resumePoint) {
	sub.mu.Lock()
	defer sub.mu.Unlock()
	if sub.closed {
		return
	}
	if resume != nil {
		sub.queued = *resume
	}
	if len(sub.order) == 0 && sub.kind == nimbusv1.Kind_KIND_UNSPECIFIED && sub.key.IsZero() {
		// Every key is taken: the first listing of a whole table, or a commit of many
		// keys, makes the set and the order to its size at once.
		sub.pending = make(map[nimbusv1.Key]struct{}, len(keys))
		sub.order = make([]nimbusv1.Key, 0, len(keys))
	}
	added := false
	for _, key := range keys {
		if sub.kind != nimbusv1.Kind_KIND_UNSPECIFIED && key.Kind != sub.kind {
			continue
		}
		if !sub.key.IsZero() && key != sub.key {
			continue
		}
		if _, ok := sub.pending[key]; ok {
			continue
		}
		sub.pending[key] = struct{}{}
		sub.order = append(sub.order, key)
		added = true
	}
	if added {
		select {
		case sub.signal <- struct{}{}:
		default:
		}
	}
}

// Next blocks until keys have changed and returns them. It returns ctx's error when ctx
// ends and ErrClosed once the subscription or store is closed.
func (sub *Subscription) Next(ctx context.Context) ([]nimbusv1.Key, error) {
	for {
		sub.mu.Lock()
		if sub.closed {
			sub.mu.Unlock()
			return nil, ErrClosed
		}
		if len(sub.order) > 0 {
			out := sub.order
			sub.order = nil
			sub.pending = map[nimbusv1.Key]struct{}{}
			sub.handed = sub.queued
			sub.mu.Unlock()
			return out, nil
		}
		sub.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-sub.signal:
		}
	}
}

// Resume returns the nimbus epoch and revision of the desired table as of the last commit
// whose changed keys Next has handed out, the first Next's keys being the table as of
// Subscribe: every change of the table up to that revision is in what Next returned, which
// Store.Resume, read apart from Next, does not promise. Before the first Next it returns
// "" and 0.
func (sub *Subscription) Resume() (epoch string, revision uint64) {
	sub.mu.Lock()
	defer sub.mu.Unlock()
	return sub.handed.epoch, sub.handed.revision
}

// Close ends the subscription; a blocked Next returns ErrClosed. It is safe to call twice.
func (sub *Subscription) Close() {
	sub.s.mu.Lock()
	delete(sub.s.subs, sub)
	sub.s.mu.Unlock()
	sub.close()
}

func (sub *Subscription) close() {
	sub.mu.Lock()
	defer sub.mu.Unlock()
	if !sub.closed {
		sub.closed = true
		close(sub.signal)
	}
}
