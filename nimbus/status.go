package nimbus

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// ReportStatus takes the status reports a node streams and keeps each for its object and
// node, and the node's watermark (see recordWatermarkIn). Reports for objects that do not
// exist or do not target the reporting node are dropped, and so are statuses the node's
// watermark says already. It sends its headers at once, saying that it takes watermarks
// (nimbusv1.StatusWatermarkHeader), answers when the client closes its side, and ends
// with codes.Unavailable when the Server is closed, and with codes.Aborted when it sends
// the watermark of a node whose Node object was deleted after its first watermark on the
// stream. A watermark that moves its node's beyond Limits.StatusWatermarkMoves is held
// back with the reports after it, and applied with them later (watermarkrate.go); the
// answer waits for them.
func (s *Server) ReportStatus(stream grpc.ClientStreamingServer[nimbusv1.StatusReport, nimbusv1.ReportStatusResponse]) error {
	if s.isClosed() {
		return rpcError(fmt.Errorf("taking status reports: %w", ErrClosed))
	}
	// The headers tell the client at once that its stream is taken (it answers only at
	// the end): the client starts its reconnect backoff over then. They say the server
	// takes watermarks.
	md := metadata.Pairs(nimbusv1.StatusWatermarkHeader, "1")
	if err := stream.SendHeader(md); err != nil {
		return fmt.Errorf("taking status reports: sending headers: %w", err)
	}
	ctx := stream.Context()
	rs := &reportStream{id: s.wmRates.newStream()}
	defer s.dropHeld(rs)
	type received struct {
		report *nimbusv1.StatusReport
		err    error
	}
	// Recv blocks, so it runs apart from the loop that must also notice Close. The
	// goroutine ends at the stream's first error, which at the latest is the cancellation
	// of ctx once this handler has returned.
	reports := make(chan received, maxStatusBatch)
	go func() {
		for {
			r, err := stream.Recv()
			select {
			case reports <- received{r, err}:
			case <-ctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()
	errClosed := status.Error(codes.Unavailable, "nimbus is shutting down; report again")
	// Reports held back for a watermark move beyond its node's rate wait for release;
	// the client's end of the stream waits for them too (eof).
	var release <-chan time.Time
	var releaseTimer *time.Timer
	defer func() {
		if releaseTimer != nil {
			releaseTimer.Stop()
		}
	}()
	eof := false
	for {
		if len(rs.held) > 0 && release == nil {
			releaseTimer = time.NewTimer(max(s.holdWait(rs), time.Millisecond))
			release = releaseTimer.C
		}
		in := reports
		if eof || len(rs.held) >= maxHeldReports {
			in = nil
		}
		select {
		case <-s.done:
			return errClosed
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		case <-release:
			release = nil
			if s.isClosed() {
				return errClosed
			}
			s.releaseReports(rs)
			if rs.forgotten != "" {
				return rs.forgottenError()
			}
			if eof && len(rs.held) == 0 {
				return stream.SendAndClose(&nimbusv1.ReportStatusResponse{})
			}
		case rcv := <-in:
			// Close wins over reports that were ready at the same time.
			if s.isClosed() {
				return errClosed
			}
			if errors.Is(rcv.err, io.EOF) && len(rs.held) > 0 {
				eof = true
				continue
			}
			if errors.Is(rcv.err, io.EOF) {
				return stream.SendAndClose(&nimbusv1.ReportStatusResponse{})
			}
			// Every report already received goes into the same transaction.
			batch := []*nimbusv1.StatusReport{}
			for rcv.err == nil {
				batch = append(batch, rcv.report)
				if len(batch) == maxStatusBatch {
					break
				}
				select {
				case rcv = <-reports:
					continue
				default:
				}
				break
			}
			if len(batch) > 0 {
				s.takeReports(rs, batch)
			}
			if rs.forgotten != "" {
				return rs.forgottenError()
			}
			if errors.Is(rcv.err, io.EOF) && len(rs.held) > 0 {
				eof = true
				continue
			}
			if errors.Is(rcv.err, io.EOF) {
				return stream.SendAndClose(&nimbusv1.ReportStatusResponse{})
			}
			if rcv.err != nil {
				return fmt.Errorf("receiving status reports: %w", rcv.err)
			}
		}
	}
}

// maxStatusBatch bounds how many status reports one transaction records.
const maxStatusBatch = 1024

// isWatermark tells whether the report is of its node's watermark rather than of one
// object's status.
func isWatermark(r *nimbusv1.StatusReport) bool { return r.GetWatermark() != nil }

// recordStatuses stores reports of the server's own agents, received on the stream rs,
// statusTxnReports per transaction, dropping those that do not belong to a stored object
// that targets the reporting node, and hands those it stores or deletes, and the
// watermarks, to the pushers to the peer replicas. A report of a watermark is recorded
// with recordWatermarkIn, in the order it came among the statuses; a status the node's
// watermark says already (derivable) is not stored, and deletes the record it replaces.
func (s *Server) recordStatuses(rs *reportStream, reports []*nimbusv1.StatusReport) {
	statuses := reports
	if slices.ContainsFunc(reports, isWatermark) {
		statuses = slices.DeleteFunc(slices.Clone(reports), isWatermark)
	}
	s.backend.catchUpForReports(statuses)
	for part := range slices.Chunk(reports, statusTxnReports) {
		txn := s.store.write()
		changed := make([]*nimbusv1.ObjectKey, 0, len(part))
		nodes := make([]string, 0, len(part))
		var deleted []nimbusv1.Key
		var deletedNodes []string
		var moved []watermarkMove
		var watermarks []string
		epoch := s.Epoch()
		for _, r := range part {
			if wm := r.GetWatermark(); wm != nil {
				m, del := s.recordWatermarkIn(txn, rs, wm, s.opts.ReplicaName)
				if wm.GetNode() != "" {
					watermarks = append(watermarks, wm.GetNode())
				}
				if m.hi > m.lo {
					moved = append(moved, watermarkMove{wm.GetNode(), m})
				}
				deleted = append(deleted, del...)
				for range del {
					deletedNodes = append(deletedNodes, wm.GetNode())
				}
				continue
			}
			node := r.GetStatus().GetNode()
			if key := r.GetKey(); node != "" && key.Validate() == nil {
				id := key.Key()
				rs.node(node).saw(id)
				if wm := txn.watermark(node); wm != nil {
					if o := txn.object(id); o != nil && targetsNode(o.Object, node) && derivable(r.GetStatus(), o.Object, wm, epoch) {
						if old := txn.nodeStatus(id, node); old != nil {
							txn.deleteStatus(old)
							deleted, deletedNodes = append(deleted, old.Object), append(deletedNodes, node)
						}
						if s.log.Enabled(context.Background(), slog.LevelDebug) {
							s.log.Debug("status said by the watermark", "key", id, "node", node,
								"observed_generation", r.GetStatus().GetObservedGeneration())
						}
						continue
					}
				}
			}
			if key := s.recordStatusIn(txn, r, s.opts.ReplicaName); key != nil {
				changed = append(changed, key)
				nodes = append(nodes, r.GetStatus().GetNode())
			}
		}
		txn.commit()
		for i, key := range changed {
			s.statusWatch.objectChanged(key)
			s.peers.statusChanged(key.Key(), nodes[i])
		}
		for i, id := range deleted {
			s.statusWatch.objectChanged(id.Proto())
			s.peers.statusChanged(id, deletedNodes[i])
		}
		for _, m := range moved {
			s.statusWatch.watermarkMoved(m.node, m.span)
		}
		for _, node := range watermarks {
			s.peers.watermarkChanged(node)
		}
	}
}

// watermarkMove is a move of a node's watermark across the revisions of span.
type watermarkMove struct {
	node string
	span revSpan
}

// statusTxnReports bounds how many status reports one store transaction records: a peer's
// frame carries many thousands, and commits wait for the store's one writer. Larger
// transactions copy fewer tree nodes per report (a transaction copies each node it
// touches once); 1,024 keeps both the copying and the wait small.
const statusTxnReports = 1024

// recordStatusIn stores one report in txn, as reported to the replica origin (empty on a
// server that is no replica), and returns the key of its object, or nil when the report
// is dropped. Of two reports for the same object and node from different origins, the
// one with the later update_time is kept, the later arrival on a tie; a report from the
// same origin always replaces the one before.
func (s *Server) recordStatusIn(txn *writeTxn, r *nimbusv1.StatusReport, origin string) *nimbusv1.ObjectKey {
	key, st := r.GetKey(), r.GetStatus()
	node := st.GetNode()
	if err := key.Validate(); err != nil {
		s.log.Debug("dropping status report with an invalid key", "node", node, "error", err)
		return nil
	}
	id := key.Key()
	if node == "" {
		s.log.Debug("dropping status report without a node", "key", id)
		return nil
	}
	rec := txn.object(id)
	switch {
	case rec == nil:
		s.log.Debug("dropping status report for an unknown object", "key", id, "node", node)
		return nil
	case !targetsNode(rec.Object, node):
		s.log.Debug("dropping status report from a node the object does not target", "key", id, "node", node)
		return nil
	}
	// The report was decoded for this call alone, so its status is stored as it is, cut
	// to fit the limits.
	for _, f := range s.opts.Limits.boundStatus(st) {
		s.metrics.statusTruncated.WithLabelValues(f).Inc()
	}
	if st.GetUpdateTime() == nil {
		st.UpdateTime = timestamppb.New(s.opts.Now())
	}
	if old := txn.nodeStatusID(rec.id, node); old != nil && old.Origin != origin &&
		old.Status.GetUpdateTime().AsTime().After(st.GetUpdateTime().AsTime()) {
		s.log.Debug("dropping status report older than the one kept from another replica", "key", id, "node", node,
			"origin", origin, "kept_origin", old.Origin)
		return nil
	}
	// The record's key and key ID share the strings of the stored object's.
	txn.putStatus(&statusRecord{Object: rec.Key, objectID: rec.id, Node: node, Status: st, Origin: origin})
	// A replica records every status of every node: the line's arguments are not even
	// made unless it is logged.
	if s.log.Enabled(context.Background(), slog.LevelDebug) {
		s.log.Debug("status recorded", "key", id, "node", node,
			"phase", st.GetPhase(), "observed_generation", st.GetObservedGeneration())
	}
	return key
}
