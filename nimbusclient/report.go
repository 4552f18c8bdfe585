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
	sub, err := c.store.Subscribe(delphi.SubscribeOptions{Tables: []delphi.Table{delphi.TableStatus, delphi.TableDesired}})
	if err != nil {
		return fmt.Errorf("subscribing to status: %w", err)
	}
	defer sub.Close()
	if slices.Contains(md.Get(nimbusv1.StatusWatermarkHeader), "1") {
		err = c.reportWatermarks(ctx, stream, sub)
	} else {
		err = c.reportEvery(ctx, stream, sub)
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
func (c *Client) reportEvery(ctx context.Context, stream statusSender, sub *delphi.Subscription) error {
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
	key := id.Proto()
	st, ok := c.store.Status(key)
	if !ok {
		return nil
	}
	st = proto.CloneOf(st) // stored objects are immutable
	st.Node = c.opts.Node
	if err := stream.Send(&nimbusv1.StatusReport{Key: key, Status: st}); err != nil {
		return fmt.Errorf("sending status of %s: %w", id, err)
	}
	c.metrics.statusReports.Inc()
	return nil
}

// reportWatermarks reports the node's watermark and, on their own, the statuses nimbus
// cannot derive from it: the exceptions (watermark.Tracker) and the statuses that carry
// operational data. Each change of one of those goes up, and so does each change of a
// status nimbus holds from the stream, until one that is done (PROGRAMMED at the object's
// generation) tells nimbus it may derive it again; an exception without a status goes up
// as a status without a phase. Then the watermark, when it moved. All of it goes up again
// when this node's Node object comes or changes.
func (c *Client) reportWatermarks(ctx context.Context, stream statusSender, sub *delphi.Subscription) error {
	tr := watermark.New(watermark.Options{ExceptionAfter: c.opts.StatusExceptionAfter, MaxExceptions: c.opts.StatusMaxExceptions})
	// held are the keys whose status nimbus holds from this stream, as one it cannot derive.
	held := map[nimbusv1.Key]struct{}{}
	var sentEpoch string
	var sentRev uint64
	sentOnce := false
	for {
		wait := ctx
		var cancel context.CancelFunc = func() {}
		if at, ok := tr.NextAging(); ok {
			wait, cancel = context.WithDeadline(ctx, at)
		}
		ids, err := sub.Next(wait)
		cancel()
		if err != nil && (ctx.Err() != nil || !errors.Is(err, context.DeadlineExceeded)) {
			return fmt.Errorf("waiting for status changes: %w", err)
		}
		epoch, rev := sub.Resume()
		for _, id := range ids {
			key := id.Proto()
			obj, ok := c.store.Get(key)
			if !ok {
				obj = nil
			}
			st, _ := c.store.Status(key)
			tr.Set(id, obj, st)
		}
		tr.SetPosition(epoch, rev)
		epoch, w := tr.Watermark()
		all := c.selfChanged(ids)
		if all {
			for _, e := range c.store.Statuses() {
				ids = append(ids, e.Key)
			}
		}
		ids = append(ids, tr.Changed()...)
		slices.SortFunc(ids, nimbusv1.Key.Compare)
		for _, id := range slices.Compact(ids) {
			key := id.Proto()
			st, ok := c.store.Status(key)
			obj, present := c.store.Get(key)
			_, wasHeld := held[id]
			own := tr.IsException(id) || (ok && hasOperational(st))
			if !own && !wasHeld {
				continue
			}
			switch {
			case !present:
				// nimbus drops the statuses of an object gone from the node.
				delete(held, id)
				continue
			case !ok:
				// No status, and the watermark must not speak for the object: a status
				// without a phase, which counts as nothing reported.
				held[id] = struct{}{}
				if err := c.sendNoStatus(stream, id); err != nil {
					return err
				}
				continue
			case own || !isDone(st, obj):
				// nimbus holds what is sent until a status that is done clears it.
				held[id] = struct{}{}
			default:
				delete(held, id) // its status says it is done: nimbus holds it no longer
			}
			if err := c.sendStatus(stream, id); err != nil {
				return err
			}
		}
		if all || !sentOnce || epoch != sentEpoch || w != sentRev {
			wm := &nimbusv1.StatusWatermark{Node: c.opts.Node, Epoch: epoch, Revision: w}
			if err := stream.Send(&nimbusv1.StatusReport{Watermark: wm}); err != nil {
				return fmt.Errorf("sending status watermark %s/%d: %w", epoch, w, err)
			}
			sentEpoch, sentRev, sentOnce = epoch, w, true
		}
		c.metrics.statusWatermark.Set(float64(w))
		c.metrics.statusExceptions.Set(float64(tr.Exceptions()))
		c.metrics.statusPending.Set(float64(tr.Pending()))
	}
}

// sendNoStatus sends a status of the object with the key that has no phase: the node has
// no status of it to tell, and nimbus is not to derive one.
func (c *Client) sendNoStatus(stream statusSender, id nimbusv1.Key) error {
	st := &nimbusv1.NodeStatus{Node: c.opts.Node}
	if err := stream.Send(&nimbusv1.StatusReport{Key: id.Proto(), Status: st}); err != nil {
		return fmt.Errorf("sending status of %s: %w", id, err)
	}
	c.metrics.statusReports.Inc()
	return nil
}

// isDone tells whether the status is PROGRAMMED at the object's generation.
func isDone(st *nimbusv1.NodeStatus, obj *nimbusv1.Object) bool {
	return st.GetPhase() == nimbusv1.Phase_PHASE_PROGRAMMED && st.GetObservedGeneration() == obj.GetMeta().GetGeneration()
}

// hasOperational tells whether the status carries operational data, which nimbus cannot
// derive from a watermark.
func hasOperational(st *nimbusv1.NodeStatus) bool {
	return st.GetOperationalData() != nil || len(st.GetOperational()) > 0
}
