package controller

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/naplesnet/naples/internal/backoff"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// Filter selects objects by their key. Empty fields select everything: the zero Filter
// selects every object, and Filter{Kind: nimbusv1.Kind_KIND_ROUTE, Tenant: "t1"} every
// Route of tenant t1 in any namespace.
type Filter struct {
	Kind      nimbusv1.Kind
	Tenant    string
	Namespace string
	Name      string
	// StatusOnly asks for the objects' statuses alone: the items handed to OnStatus then
	// carry each object's kind, key and generations, not its labels and spec (see
	// nimbusv1.Object.Skeleton), which keeps the stream small.
	StatusOnly bool
	// Keys, when set, narrows the selection to these objects, among those the other
	// fields select.
	Keys []*nimbusv1.ObjectKey
}

// Reactor is what WatchStatus hands changes to. Its methods are called one at a time, on
// the goroutine that called WatchStatus; while they run, nimbus coalesces what changes.
// They must not modify what they are handed.
type Reactor interface {
	// OnStatus is called with an object and its status, as Get returns them, when the
	// watch first sees the object and whenever the object or its status changed.
	OnStatus(item *nimbusv1.ObjectWithStatus)
	// OnDelete is called with the key of an object OnStatus was called for, once the
	// object is deleted.
	OnDelete(key *nimbusv1.ObjectKey)
}

// SyncReactor is a Reactor that hears when it has been told the whole state of the
// selection: OnSynced is called after the first stream's current state and after each
// reconnect's, with the OnStatus and OnDelete calls of what changed meanwhile before it.
type SyncReactor interface {
	Reactor
	OnSynced()
}

// ReactorFuncs is a SyncReactor made of functions; nil ones are not called.
type ReactorFuncs struct {
	// Status is called by OnStatus.
	Status func(item *nimbusv1.ObjectWithStatus)
	// Delete is called by OnDelete.
	Delete func(key *nimbusv1.ObjectKey)
	// Synced is called by OnSynced.
	Synced func()
}

var _ SyncReactor = ReactorFuncs{}

// OnStatus calls f.Status.
func (f ReactorFuncs) OnStatus(item *nimbusv1.ObjectWithStatus) {
	if f.Status != nil {
		f.Status(item)
	}
}

// OnDelete calls f.Delete.
func (f ReactorFuncs) OnDelete(key *nimbusv1.ObjectKey) {
	if f.Delete != nil {
		f.Delete(key)
	}
}

// OnSynced calls f.Synced.
func (f ReactorFuncs) OnSynced() {
	if f.Synced != nil {
		f.Synced()
	}
}

// WatchStatus follows the status of the objects the filter selects and hands each change
// to r, until ctx ends, when it returns nil. When the stream breaks it opens it again
// after a backoff (see Options.MinBackoff) and calls r only for what changed meanwhile:
// OnStatus for the objects whose object or status differs from what r was last handed,
// OnDelete for those that are gone. It returns an error without retrying when nimbus
// refuses the watch for good: the filter is invalid, the client's certificate may not
// watch status (codes.PermissionDenied) or nimbus does not know the call; and ErrClosed
// when the Client is closed.
func (c *Client) WatchStatus(ctx context.Context, f Filter, r Reactor) error {
	req := &nimbusv1.WatchStatusRequest{Kind: f.Kind, Tenant: f.Tenant, Namespace: f.Namespace, Name: f.Name, OmitObjects: f.StatusOnly, Keys: f.Keys}
	return c.watchStatus(ctx, req, newStatusWatch(r))
}

// watchStatus runs WatchStatus's streams of req, which sw follows.
func (c *Client) watchStatus(ctx context.Context, req *nimbusv1.WatchStatusRequest, sw *statusWatch) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-c.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	syncer, _ := sw.r.(SyncReactor)
	b := backoff.Backoff{Min: c.opts.MinBackoff, Max: c.opts.MaxBackoff}
	for {
		synced, err := sw.stream(ctx, c.api, req, syncer)
		switch {
		case c.isClosed():
			return fmt.Errorf("watching status: %w", ErrClosed)
		case ctx.Err() != nil:
			return nil
		case atDeadline(ctx, err):
			<-ctx.Done()
			return nil
		case permanent(err):
			return fmt.Errorf("watching status: %w", err)
		}
		if synced {
			b.Reset()
		}
		delay := b.Next()
		c.log.Warn("status stream ended; watching again", "error", err, "in", delay)
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
		case <-t.C:
		}
	}
}

// deadlineSlack is how long before ctx's deadline a stream's DeadlineExceeded is taken
// for that deadline: nimbus's end of the stream, which the deadline went to with the call
// (rounded down), and gRPC's own timer may end the stream a moment before ctx ends.
const deadlineSlack = time.Second

// atDeadline tells whether err ended a stream at ctx's deadline, as ctx is about to end.
func atDeadline(ctx context.Context, err error) bool {
	dl, ok := ctx.Deadline()
	return ok && status.Code(err) == codes.DeadlineExceeded && time.Until(dl) < deadlineSlack
}

// permanent tells whether a stream's error will not go away by watching again.
func permanent(err error) bool {
	switch status.Code(err) {
	case codes.InvalidArgument, codes.PermissionDenied, codes.Unauthenticated, codes.Unimplemented:
		return true
	}
	return false
}

// statusWatch is what one WatchStatus call has handed its reactor, across streams.
type statusWatch struct {
	r Reactor
	// delivered holds, by key, the last item handed to OnStatus of every object not
	// deleted since, and not handed as a brief entry since.
	delivered map[nimbusv1.Key]*nimbusv1.ObjectWithStatus

	// For a brief stream (WatchStatusRequest.brief): brief takes its brief entries, keys
	// are the request's keys and index their indexes, by key (the first, when a key
	// repeats); briefed holds, by index, the last brief entry handed of each object, when
	// it was last handed as one and not deleted since.
	brief   briefReactor
	keys    []*nimbusv1.ObjectKey
	index   map[nimbusv1.Key]int
	briefed []briefEntry
}

// briefEntry is a brief entry handed to a brief reactor; the zero briefEntry is none.
type briefEntry struct {
	handed             bool
	generation         int64
	target, programmed int32
}

// briefReactor is a Reactor that takes the brief entries of a brief stream.
type briefReactor interface {
	Reactor
	// onBrief is called with a brief entry: the index of the object's key, its
	// generation and the counts of its status.
	onBrief(i int, generation int64, target, programmed int32)
}

// newStatusWatch returns the statusWatch of a stream that is not brief.
func newStatusWatch(r Reactor) *statusWatch {
	return &statusWatch{r: r, delivered: map[nimbusv1.Key]*nimbusv1.ObjectWithStatus{}}
}

// newBriefWatch returns the statusWatch of a brief stream of the keys.
func newBriefWatch(r briefReactor, keys []*nimbusv1.ObjectKey) *statusWatch {
	sw := newStatusWatch(r)
	sw.brief, sw.keys, sw.briefed = r, keys, make([]briefEntry, len(keys))
	sw.index = make(map[nimbusv1.Key]int, len(keys))
	for i, k := range keys {
		if _, ok := sw.index[k.Key()]; !ok {
			sw.index[k.Key()] = i
		}
	}
	return sw
}

// stream runs one status stream until it breaks, and tells whether it got to SYNCED.
func (sw *statusWatch) stream(ctx context.Context, api nimbusv1.NimbusClient, req *nimbusv1.WatchStatusRequest, syncer SyncReactor) (bool, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := api.WatchStatus(ctx, req, grpc.WaitForReady(true), recvLimit())
	if err != nil {
		return false, fmt.Errorf("opening status stream: %w", err)
	}
	// seen holds the objects of the current state until SYNCED, and seenBrief those of
	// them in brief entries, by index; nil after.
	seen := map[nimbusv1.Key]bool{}
	var seenBrief []bool
	if sw.brief != nil {
		seenBrief = make([]bool, len(sw.keys))
	}
	for {
		frame, err := stream.Recv()
		if err != nil {
			return seen == nil, fmt.Errorf("receiving status: %w", err)
		}
		if err := sw.briefEntries(frame, seenBrief); err != nil {
			return seen == nil, err
		}
		for _, ev := range frame.GetEvents() {
			switch ev.GetType() {
			case nimbusv1.StatusEvent_TYPE_PUT:
				id := ev.GetKey().Key()
				if seen != nil {
					seen[id] = true
				}
				if i, ok := sw.index[id]; ok {
					sw.briefed[i] = briefEntry{}
				}
				item := ev.GetItem()
				// The status, which is what changes, first: most often the comparison
				// ends there, before the whole object.
				if old, ok := sw.delivered[id]; ok && proto.Equal(old.GetStatus(), item.GetStatus()) && proto.Equal(old, item) {
					continue
				}
				sw.delivered[id] = item
				sw.r.OnStatus(item)
			case nimbusv1.StatusEvent_TYPE_DELETE:
				sw.deleted(ev.GetKey().Key(), ev.GetKey())
			case nimbusv1.StatusEvent_TYPE_SYNCED:
				if seen == nil {
					return true, errors.New("receiving status: SYNCED twice")
				}
				for id, item := range sw.delivered {
					if !seen[id] {
						sw.deleted(id, item.GetObject().Key())
					}
				}
				for i, b := range sw.briefed {
					if b.handed && !seenBrief[i] {
						sw.deleted(sw.keys[i].Key(), sw.keys[i])
					}
				}
				seen, seenBrief = nil, nil
				if syncer != nil {
					syncer.OnSynced()
				}
			}
			if ctx.Err() != nil {
				return seen == nil, ctx.Err()
			}
		}
	}
}

// deleted hands the deletion of an object delivered or briefed to OnDelete.
func (sw *statusWatch) deleted(id nimbusv1.Key, key *nimbusv1.ObjectKey) {
	if i, ok := sw.index[id]; ok && sw.briefed[i].handed {
		sw.briefed[i] = briefEntry{}
		sw.r.OnDelete(key)
		return
	}
	if _, ok := sw.delivered[id]; !ok {
		return
	}
	delete(sw.delivered, id)
	sw.r.OnDelete(key)
}

// briefEntries hands the frame's brief entries to the brief reactor, but those it was
// handed last already, and marks them in seen, by index, when it is not nil. An entry
// that does not name a key, or lists that differ in length, end the stream.
func (sw *statusWatch) briefEntries(frame *nimbusv1.StatusFrame, seen []bool) error {
	keys, gens, targets, programmed := frame.GetBriefKeys(), frame.GetBriefGenerations(), frame.GetBriefTargetNodes(), frame.GetBriefProgrammedNodes()
	if len(keys) == 0 {
		return nil
	}
	if sw.brief == nil {
		return errors.New("receiving status: brief entries on a stream that is not brief")
	}
	if len(gens) != len(keys) || len(targets) != len(keys) || len(programmed) != len(keys) {
		return fmt.Errorf("receiving status: brief entries' lists of %d keys, %d generations, %d target counts and %d programmed counts",
			len(keys), len(gens), len(targets), len(programmed))
	}
	for j, k := range keys {
		i := int(k)
		if i >= len(sw.keys) {
			return fmt.Errorf("receiving status: brief entry for key %d of %d", i, len(sw.keys))
		}
		if seen != nil {
			seen[i] = true
		}
		e := briefEntry{handed: true, generation: gens[j], target: targets[j], programmed: programmed[j]}
		if sw.briefed[i] == e {
			continue
		}
		sw.briefed[i] = e
		if len(sw.delivered) > 0 {
			delete(sw.delivered, sw.keys[i].Key())
		}
		sw.brief.onBrief(i, e.generation, e.target, e.programmed)
	}
	return nil
}
