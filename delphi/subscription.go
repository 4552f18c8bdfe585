package delphi

import (
	"context"
	"strings"
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
	prefix string // when set, only IDs with this prefix
	keyID  string // when set, only this ID
	signal chan struct{}

	// mu guards order, pending and closed.
	mu      sync.Mutex
	order   []string
	pending map[string]struct{}
	closed  bool
}

// Subscribe starts a subscription. Its first Next returns every selected key present now,
// so a consumer that starts late still sees the whole table.
func (s *Store) Subscribe(opts SubscribeOptions) (*Subscription, error) {
	sub := &Subscription{
		s:       s,
		opts:    opts,
		signal:  make(chan struct{}, 1),
		pending: map[string]struct{}{},
	}
	switch {
	case opts.Key != nil:
		sub.keyID = opts.Key.ID()
	case opts.Kind != nimbusv1.Kind_KIND_UNSPECIFIED:
		sub.prefix = opts.Kind.Name() + "/"
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
	var ids []string
	for _, t := range opts.Tables {
		switch {
		case opts.Key != nil && t == TableDesired:
			if _, ok := s.Get(opts.Key); ok {
				ids = append(ids, sub.keyID)
			}
		case opts.Key != nil && t == TableStatus:
			if _, ok := s.Status(opts.Key); ok {
				ids = append(ids, sub.keyID)
			}
		case t == TableDesired:
			s.desiredIDs(opts.Kind, func(r *record) { ids = append(ids, r.id) })
		case t == TableStatus:
			s.statusMu.RLock()
			ids = append(ids, s.statusIDsLocked()...)
			s.statusMu.RUnlock()
		}
	}
	sub.add(ids)
	return sub, nil
}

// add queues changed keys; the caller holds s.mu or writeMu.
func (sub *Subscription) add(ids []string) {
	sub.mu.Lock()
	defer sub.mu.Unlock()
	if sub.closed {
		return
	}
	added := false
	for _, id := range ids {
		if sub.prefix != "" && !strings.HasPrefix(id, sub.prefix) {
			continue
		}
		if sub.keyID != "" && id != sub.keyID {
			continue
		}
		if _, ok := sub.pending[id]; ok {
			continue
		}
		sub.pending[id] = struct{}{}
		sub.order = append(sub.order, id)
		added = true
	}
	if added {
		select {
		case sub.signal <- struct{}{}:
		default:
		}
	}
}

// Next blocks until keys have changed and returns their IDs (ObjectKey.ID form). It
// returns ctx's error when ctx ends and ErrClosed once the subscription or store is closed.
func (sub *Subscription) Next(ctx context.Context) ([]string, error) {
	for {
		sub.mu.Lock()
		if sub.closed {
			sub.mu.Unlock()
			return nil, ErrClosed
		}
		if len(sub.order) > 0 {
			out := sub.order
			sub.order = nil
			sub.pending = map[string]struct{}{}
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
