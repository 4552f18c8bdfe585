package nimbusclient

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/naplesnet/naples/delphi"
	"github.com/naplesnet/naples/internal/watermark"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// statusSender is what a status report loop needs of the stream.
type statusSender interface {
	Send(*nimbusv1.StatusReport) error
}

// report runs one ReportStatus stream. It calls taken once nimbus has sent the stream's
// headers, which it does when it takes the stream. To a nimbus that takes watermarks (its
// headers say so) it reports a watermark and its exceptions (reportWatermarks); to one that
// does not, every status first, then each change (reportEvery).
func (c *Client) report(ctx context.Context, api nimbusv1.NimbusClient, taken func()) error {
	ctx, cancel := context.WithCancel(ctx)
	stream, err := api.ReportStatus(ctx, grpc.WaitForReady(true))
	if err != nil {
		cancel()
		return fmt.Errorf("starting status stream: %w", err)
	}
	ended := make(chan error, 1)
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
	}()
	md, err := stream.Header()
	if err != nil {
		return fmt.Errorf("starting status stream: %w", err)
	}
	if md != nil {
		taken()
	}
	// gRPC ends a client stream's context only when the caller's ends, not when the
	// connection breaks or nimbus ends the stream, and a status stream is idle while no
	// status changes: it would be found dead only at the next Send, and the statuses would
	// stay with a nimbus that is gone. A receive returns as soon as the stream ends (nimbus
	// answers only once the client closes its side), so a goroutine receives and, when the
	// stream ends, ends ctx, which ends the wait for changes below.
	wg.Go(func() {
		defer cancel()
		err := stream.RecvMsg(new(nimbusv1.ReportStatusResponse))
		if err == nil {
			err = errors.New("nimbus answered a status stream that was not closed")
		}
		ended <- err
	})
	if slices.Contains(md.Get(nimbusv1.StatusWatermarkHeader), "1") {
		err = c.reportWatermarks(ctx, stream)
	} else {
		// A nimbus that takes watermarks later hears everything again.
		c.dropMarks()
		err = c.reportEvery(ctx, stream)
	}
	// When the stream ended, the receive says why: a send finds the end first (io.EOF),
	// or the wait for changes ends because the receive did.
	if errors.Is(err, io.EOF) {
		return fmt.Errorf("status stream ended: %w", <-ended)
	}
	select {
	case e := <-ended:
		return fmt.Errorf("status stream ended: %w", e)
	default:
	}
	return err
}

// selfChanged tells whether this node's Node object is among the changed keys and present:
// nimbus forgets what a node reported when its Node object is deleted, and must hear it all
// again when it comes back.
func (c *Client) selfChanged(ids []nimbusv1.Key) bool {
	self := nimbusv1.MakeKey(nimbusv1.Kind_KIND_NODE, "", "", c.opts.Node)
	if !slices.Contains(ids, self) {
		return false
	}
	_, present := c.store.Get(self.Proto())
	return present
}

// reportEvery sends every status the subscription hands out: all of them first, then each
// change. A key's status also goes up again when its object changes, so a nimbus that lost
// an object and got it back (an ephemeral restart) hears the status of the object it has
// now; and all of them go up again when this node's Node object comes or changes.
func (c *Client) reportEvery(ctx context.Context, stream statusSender) error {
	sub, err := c.subscribeStatus()
	if err != nil {
		return err
	}
	defer sub.Close()
	for {
		ids, err := sub.Next(ctx)
		if err != nil {
			return fmt.Errorf("waiting for status changes: %w", err)
		}
		if c.selfChanged(ids) {
			for _, e := range c.store.Statuses() {
				ids = append(ids, e.Key)
			}
		}
		// The statuses of one Next go out back to back, without waiting for anything in
		// between: gRPC's transport writes the messages queued by then together and flushes
		// once, so a burst of statuses costs a few writes, not one per status.
		for _, id := range ids {
			if err := c.sendStatus(stream, id); err != nil {
				return err
			}
		}
	}
}

// sendStatus sends the status delphi holds of the object with the key, if it holds one.
func (c *Client) sendStatus(stream statusSender, id nimbusv1.Key) error {
	st, ok := c.store.StatusOf(id)
	if !ok {
		return nil
	}
	key := id.Proto()
	st = proto.CloneOf(st) // stored objects are immutable
	st.Node = c.opts.Node
	if err := stream.Send(&nimbusv1.StatusReport{Key: key, Status: st}); err != nil {
		return fmt.Errorf("sending status of %s: %w", id, err)
	}
	c.metrics.statusReports.Inc()
	return nil
}

// subscribeStatus subscribes to the changes of delphi's statuses and objects; the first
// Next returns every key.
func (c *Client) subscribeStatus() (*delphi.Subscription, error) {
	sub, err := c.store.Subscribe(delphi.SubscribeOptions{Tables: []delphi.Table{delphi.TableStatus, delphi.TableDesired}})
	if err != nil {
		return nil, fmt.Errorf("subscribing to status: %w", err)
	}
	return sub, nil
}

// markReport is what the status streams to a nimbus that takes watermarks carry over from
// one to the next: the Reporter, which knows the node's exceptions and what nimbus held
// from the last stream, and the subscription whose first Next told it every key. A new
// stream sends the watermark and the exceptions again (watermark.Reporter.Restart), not a
// status per object: at ten thousand objects a node, moving to another replica costs
// kilobytes, not a walk of delphi.
type markReport struct {
	rep *watermark.Reporter
	sub *delphi.Subscription
}

// dropMarks forgets what the status streams carried over; the next stream to a nimbus
// that takes watermarks starts from every key.
func (c *Client) dropMarks() {
	if c.marks != nil {
		c.marks.sub.Close()
		c.marks = nil
	}
}

// reportWatermarks reports the node's watermark and, on their own, the statuses nimbus
// cannot derive from it, as a watermark.Reporter works them out. All of it goes up again
// when this node's Node object comes or changes. The Reporter and the subscription carry
// over to the next stream (markReport).
func (c *Client) reportWatermarks(ctx context.Context, stream statusSender) error {
	// A stream after the first starts with a Report at once: the watermark and the
	// exceptions again. The first starts with the subscription's first Next, every key.
	restarted := c.marks != nil
	if !restarted {
		sub, err := c.subscribeStatus()
		if err != nil {
			return err
		}
		c.marks = &markReport{
			rep: watermark.NewReporter(c.opts.Node, watermark.Options{ExceptionAfter: c.opts.StatusExceptionAfter, MaxExceptions: c.opts.StatusMaxExceptions}),
			sub: sub,
		}
	} else {
		c.marks.rep.Restart()
	}
	rep, sub := c.marks.rep, c.marks.sub
	tr := rep.Tracker()
	src := &storeSource{store: c.store}
	send := func(r *nimbusv1.StatusReport) error {
		if err := stream.Send(r); err != nil {
			return err
		}
		if r.GetWatermark() == nil {
			c.metrics.statusReports.Inc()
		}
		return nil
	}
	for {
		wait := ctx
		var cancel context.CancelFunc = func() {}
		if at, ok := tr.NextAging(); ok {
			wait, cancel = context.WithDeadline(ctx, at)
		}
		var ids []nimbusv1.Key
		var err error
		if restarted {
			restarted = false
		} else {
			ids, err = sub.Next(wait)
		}
		cancel()
		if err != nil && (ctx.Err() != nil || !errors.Is(err, context.DeadlineExceeded)) {
			return fmt.Errorf("waiting for status changes: %w", err)
		}
		epoch, rev := sub.Resume()
		all := c.selfChanged(ids)
		var again []nimbusv1.Key
		if all {
			for _, e := range c.store.Statuses() {
				again = append(again, e.Key)
			}
		}
		w, err := rep.Report(src, epoch, rev, ids, all, again, send)
		if err != nil {
			return err
		}
		c.metrics.statusWatermark.Set(float64(w))
		c.metrics.statusExceptions.Set(float64(tr.Exceptions()))
		c.metrics.statusPending.Set(float64(tr.Pending()))
	}
}

// storeSource is a node's store as a watermark.Reporter reads it.
type storeSource struct {
	store Store
	// scratch is the object Object returns, filled in again each time.
	scratch nimbusv1.Object
}

// Object returns the object with the key the store holds, or nil: only its meta's
// generation, revision and generation_revision, which is what a Reporter reads, read
// without decoding the stored object.
func (s *storeSource) Object(key nimbusv1.Key) *nimbusv1.Object {
	v, ok := s.store.Version(key)
	if !ok {
		return nil
	}
	if s.scratch.Meta == nil {
		s.scratch.Meta = &nimbusv1.ObjectMeta{}
	}
	m := s.scratch.Meta
	m.Generation, m.Revision, m.GenerationRevision = v.Generation, v.Revision, v.GenerationRevision
	return &s.scratch
}

// Status returns the status of the object with the key the store holds, or nil.
func (s *storeSource) Status(key nimbusv1.Key) *nimbusv1.NodeStatus {
	st, _ := s.store.StatusOf(key)
	return st
}
