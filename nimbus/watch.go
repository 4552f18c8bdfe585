package nimbus

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-memdb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// change is one committed change of one object. It is built once per commit, shared by
// every watcher and never modified. Keeping changes as values with their revision is what
// a resume buffer will retain.
type change struct {
	rev uint64
	// before and after are the stored object before and after the change; either may be
	// nil.
	before, after *nimbusv1.Object
	// put is the event for nodes after targets; nil when after is nil.
	put *sharedEvent
	// del is the event for nodes before targeted and after does not; nil when before is nil.
	del *sharedEvent
}

func newChange(epoch string, rev uint64, key *nimbusv1.ObjectKey, before, after *nimbusv1.Object) *change {
	c := &change{rev: rev, before: before, after: after}
	if after != nil {
		c.put = newSharedEvent(&nimbusv1.WatchEvent{
			Type: nimbusv1.WatchEvent_TYPE_PUT, Object: after, Key: key, Revision: rev, Epoch: epoch,
		})
	}
	if before != nil {
		c.del = newSharedEvent(&nimbusv1.WatchEvent{
			Type: nimbusv1.WatchEvent_TYPE_DELETE, Key: key, Revision: rev, Epoch: epoch,
		})
	}
	return c
}

// eventFor returns the event the change means for the node, or nil when it does not
// concern the node.
func (c *change) eventFor(node string) *sharedEvent {
	switch {
	case c.after != nil && c.after.TargetsNode(node):
		return c.put
	case c.before != nil && c.before.TargetsNode(node):
		return c.del
	}
	return nil
}

// sharedEvent is a watch event shared by the watchers it is sent to. Its wire form is
// encoded once, by whichever watcher sends it first.
type sharedEvent struct {
	msg     *nimbusv1.WatchEvent
	encoded func() ([]byte, error)
}

func newSharedEvent(msg *nimbusv1.WatchEvent) *sharedEvent {
	return &sharedEvent{
		msg:     msg,
		encoded: sync.OnceValues(func() ([]byte, error) { return proto.Marshal(msg) }),
	}
}

// watcher is one node's watch stream as commits see it.
type watcher struct {
	node string
	// events holds the events queued for the stream; its capacity is Options.WatchBuffer.
	events chan *sharedEvent
	// reset is closed by the commit that found events full.
	reset chan struct{}
	// published is the revision of the last commit handed to the watcher. A commit stores
	// it after queueing its event, so a watcher that reads published and then finds events
	// empty has sent everything up to published.
	published atomic.Uint64
}

// publishLocked hands a committed change to every watcher, resetting those whose buffer is
// full. The caller holds s.mu, which keeps the hand-over in commit order.
func (s *Server) publishLocked(c *change) {
	for w := range s.watchers {
		if ev := c.eventFor(w.node); ev != nil {
			select {
			case w.events <- ev:
			default:
				delete(s.watchers, w)
				close(w.reset)
				s.resets.Add(1)
				s.log.Warn("watcher fell behind; resetting its stream",
					"node", w.node, "buffer", cap(w.events), "revision", c.rev)
				continue
			}
		}
		w.published.Store(c.rev)
	}
}

// subscribe registers a watcher for the node and returns it with a read of the store at
// the revision from which on every commit reaches the watcher.
func (s *Server) subscribe(node string) (*watcher, *memdb.Txn, uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, nil, 0, fmt.Errorf("watching for node %s: %w", node, ErrClosed)
	}
	txn := s.db.Txn(true)
	if err := txn.Insert(tableWatchNodes, &watchNodeRecord{Name: node}); err != nil {
		txn.Abort()
		return nil, nil, 0, fmt.Errorf("recording watching node %s: %w", node, err)
	}
	txn.Commit()
	w := &watcher{
		node:   node,
		events: make(chan *sharedEvent, s.opts.WatchBuffer),
		reset:  make(chan struct{}),
	}
	w.published.Store(s.rev)
	s.watchers[w] = struct{}{}
	return w, s.db.Txn(false), s.rev, nil
}

func (s *Server) unsubscribe(w *watcher) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.watchers, w)
}

// Watch streams the objects targeted at the requesting node: a snapshot, SYNCED, then
// every change, with bookmarks while idle. It returns when the client goes away, when the
// watcher falls behind (codes.ResourceExhausted) or when the Server is closed
// (codes.Unavailable).
func (s *Server) Watch(req *nimbusv1.WatchRequest, stream grpc.ServerStreamingServer[nimbusv1.WatchEvent]) error {
	node := req.GetNode()
	if err := validateNode(node); err != nil {
		return status.Error(codes.InvalidArgument, err.Error())
	}
	// req.Epoch and req.Revision are not honoured yet: every watch starts with a snapshot.
	// Resuming will replay the retained changes after req.Revision when req.Epoch matches.
	w, snap, rev, err := s.subscribe(node)
	if err != nil {
		return rpcError(err)
	}
	defer s.unsubscribe(w)
	log := s.log.With("node", node)
	log.Info("watch started", "revision", rev)
	err = s.sendSnapshot(stream, snap, node, rev)
	if err == nil {
		err = s.sendChanges(stream, w)
	}
	log.Info("watch ended", "reason", err)
	return err
}

// validateNode checks a watching node's name.
func validateNode(node string) error {
	err := (&nimbusv1.ObjectKey{Kind: nimbusv1.Kind_KIND_NODE, Name: node}).Validate()
	if err == nil {
		return nil
	}
	reason := err.Error()
	var fe *nimbusv1.FieldError
	if errors.As(err, &fe) {
		reason = fe.Reason
	}
	return &nimbusv1.FieldError{Field: "node", Value: node, Reason: reason}
}

// sendSnapshot sends every object in snap that targets the node, then SYNCED at rev.
func (s *Server) sendSnapshot(stream grpc.ServerStreamingServer[nimbusv1.WatchEvent], snap *memdb.Txn, node string, rev uint64) error {
	it, err := snap.Get(tableObjects, indexID)
	if err != nil {
		return rpcError(fmt.Errorf("reading snapshot for node %s: %w", node, err))
	}
	for raw := it.Next(); raw != nil; raw = it.Next() {
		obj := raw.(*objectRecord).Object
		if !obj.TargetsNode(node) {
			continue
		}
		err := stream.Send(&nimbusv1.WatchEvent{
			Type:     nimbusv1.WatchEvent_TYPE_PUT,
			Object:   obj,
			Key:      obj.Key(),
			Revision: obj.GetMeta().GetRevision(),
			Epoch:    s.epoch,
			Snapshot: true,
		})
		if err != nil {
			return fmt.Errorf("sending snapshot to node %s: %w", node, err)
		}
	}
	err = stream.Send(&nimbusv1.WatchEvent{Type: nimbusv1.WatchEvent_TYPE_SYNCED, Revision: rev, Epoch: s.epoch})
	if err != nil {
		return fmt.Errorf("sending snapshot end to node %s: %w", node, err)
	}
	return nil
}

// sendChanges sends the watcher's events as they come, and bookmarks while there are none.
func (s *Server) sendChanges(stream grpc.ServerStreamingServer[nimbusv1.WatchEvent], w *watcher) error {
	errReset := status.Errorf(codes.ResourceExhausted,
		"watcher for node %s fell behind (more than %d events queued); watch again to resubscribe",
		w.node, cap(w.events))
	var tick <-chan time.Time
	if s.opts.BookmarkInterval > 0 {
		t := time.NewTicker(s.opts.BookmarkInterval)
		defer t.Stop()
		tick = t.C
	}
	ctx := stream.Context()
	idle := true // nothing sent since the last tick
	for {
		// A reset wins over the events still queued: the client starts over anyway.
		select {
		case <-w.reset:
			return errReset
		default:
		}
		select {
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		case <-s.done:
			return status.Error(codes.Unavailable, "nimbus is shutting down; watch again")
		case <-w.reset:
			return errReset
		case ev := <-w.events:
			b, err := ev.encoded()
			if err != nil {
				return status.Errorf(codes.Internal, "encoding event of revision %d: %v", ev.msg.GetRevision(), err)
			}
			if err := stream.SendMsg(preEncoded(b)); err != nil {
				return fmt.Errorf("sending revision %d to node %s: %w", ev.msg.GetRevision(), w.node, err)
			}
			idle = false
		case <-tick:
			if !idle {
				idle = true
				continue
			}
			// Read published before looking at events; see watcher.published.
			rev := w.published.Load()
			if len(w.events) > 0 {
				continue
			}
			err := stream.Send(&nimbusv1.WatchEvent{Type: nimbusv1.WatchEvent_TYPE_BOOKMARK, Revision: rev, Epoch: s.epoch})
			if err != nil {
				return fmt.Errorf("sending bookmark to node %s: %w", w.node, err)
			}
		}
	}
}
