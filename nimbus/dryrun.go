package nimbus

import (
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Dry runs
//
// An Apply or ApplyBatch with dry_run is validated as the apply would be (the fields, the
// size, a key twice in a batch) and then staged as a commit of it alone would stage it:
// in a store transaction on the tables as they are now, each write seeing the ones before
// it, with the cross-object checks of conflict.go. The transaction is then aborted. So a
// dry run is refused exactly as the apply would be if nothing were committed in between,
// with the same code, message and details, and otherwise answers each object's outcome
// (created, changed, unchanged) and the object as it would be stored, but it stores
// nothing: it takes no revision, bumps no generation, hands nothing to the watchers and
// writes nothing to the state file or to etcd. It takes the store's write lock for as long
// as the staging lasts, as a commit does, and no other lock. With the etcd store it checks
// against the replica's cache, as Get and List read it.
//
// What only a commit assigns is left out of the objects of the answer (see unassigned).
// The answer's revision is the store's, which the dry run leaves where it was.

// dryRun answers the batch as its commit would without committing it: it stages the
// batch's writes on the current tables and aborts. It sets the batch's outcomes and
// revision, or returns the error, wrapping ErrConflict, that refuses it.
func (s *Server) dryRun(b *batch) error {
	if s.isClosed() {
		return ErrClosed
	}
	s.metrics.dryRuns.Inc()
	now := timestamppb.New(s.opts.Now())
	txn := s.store.write()
	defer txn.abort()
	base := txn.revision()
	_, _, conflicts := stageBatch(txn, b, base, nil, now)
	if conflicts.any() {
		b.outcomes = nil
		return conflicts.conflictErr()
	}
	b.rev = base
	for i, out := range b.outcomes {
		b.outcomes[i] = unassigned(out)
	}
	s.log.Debug("dry run", "what", b.what(), "revision", base)
	return nil
}

// unassigned returns the outcome of a staged write with what only its commit would
// assign taken out of its object: the revision and update time of a changed object, its
// generation revision when its generation changed, and the uid and create time of a
// created one. An unchanged outcome carries the stored object, which stays as it is.
func unassigned(out outcome) outcome {
	if !out.changed || out.obj == nil {
		return out
	}
	// The staged object is the batch's own clone, which the aborted transaction dropped.
	m := out.obj.GetMeta()
	if m.GetGenerationRevision() == m.GetRevision() {
		m.GenerationRevision = 0
	}
	m.Revision, m.UpdateTime = 0, nil
	if out.created {
		m.Uid, m.CreateTime = "", nil
	}
	out.rev = 0
	return out
}

// submitOrDryRun commits the batch with submit, or, when dryRun is set, answers it with
// dryRun; either sets the batch's outcomes and revision, or returns the error.
func (s *Server) submitOrDryRun(b *batch, dryRun bool) error {
	if dryRun {
		return s.dryRun(b)
	}
	return s.submit(b)
}
