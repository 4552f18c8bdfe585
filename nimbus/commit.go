package nimbus

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// write is one object to store, or one key to delete, of a batch.
type write struct {
	// key is the object's key with tenant and namespace defaulted.
	key *nimbusv1.ObjectKey
	// id is key in its comparable form, which keys the store's tables.
	id nimbusv1.Key
	// obj is the object to store: a valid object the batch owns, with tenant, namespace and
	// target nodes normalized. nil for a deletion.
	obj *nimbusv1.Object
}

// applyWrite returns the write that stores the valid object in: in itself when the call
// owns it (ownsRequest), a clone otherwise.
func applyWrite(in *nimbusv1.Object, owned bool) write {
	key := in.Key()
	obj := in
	if !owned {
		obj = in.CloneVT()
	}
	m := obj.GetMeta()
	m.Tenant, m.Namespace = key.GetTenant(), key.GetNamespace()
	m.Nodes = normalizeNodes(m.GetNodes())
	return write{key: key, id: key.Key(), obj: obj}
}

// deleteWrite returns the write that deletes the object with the valid key.
func deleteWrite(key *nimbusv1.ObjectKey) write {
	key = key.Defaulted()
	return write{key: key, id: key.Key()}
}

// outcome is what one write did.
type outcome struct {
	// obj is the stored object after an apply: the new one, or the one already stored when
	// nothing changed. nil after a deletion.
	obj *nimbusv1.Object
	// changed tells that the write took a revision: an apply that changed something, or the
	// deletion of an object that existed.
	changed bool
	// created tells that an apply created the object.
	created bool
	// rev is the revision of the change, or the store's revision at the write when it
	// changed nothing.
	rev uint64
}

// batch is the writes of one call, in order: a single Apply or Delete is a batch of one,
// ApplyBatch and DeleteBatch a batch of many. A batch is committed whole, each write
// seeing the ones before it, or not at all.
type batch struct {
	writes []write
	// deleting tells that the writes are deletions, for what the batch is called in errors
	// and logs.
	deleting bool
	// positions tells that the call named the writes by position, as ApplyBatch does
	// (`objects[3]`), so that a refusal names them so too.
	positions bool

	// The commit sets outcomes, rev and err, then closes done.

	// outcomes are the outcomes of the writes, in their order.
	outcomes []outcome
	// rev is the store's revision after the batch's last write.
	rev uint64
	// txns is how many store transactions committed the batch's changes.
	txns int
	err  error
	// done is closed once the batch is committed, and durable, or has failed.
	done chan struct{}
	// lead tells a waiting caller that it is to commit the queue.
	lead chan struct{}
}

// what names what the batch does, for errors and logs: "applying Route/default/default/r1",
// "deleting 1000 objects".
func (b *batch) what() string {
	verb := "applying"
	if b.deleting {
		verb = "deleting"
	}
	if len(b.writes) == 1 {
		return verb + " " + b.writes[0].id.String()
	}
	return fmt.Sprintf("%s %d objects", verb, len(b.writes))
}

// at names the write at position i for a refusal (refusal.add): its position,
// `objects[3]`, and its key ID for a batch of a call that names writes by position; "", ""
// otherwise.
func (b *batch) at(i int) (pos, id string) {
	if !b.positions {
		return "", ""
	}
	return fmt.Sprintf("objects[%d]", i), b.writes[i].id.String()
}

// mayConflict tells whether a write of the batch stores an object that holds claims, and
// may be refused for a conflict.
func (b *batch) mayConflict() bool {
	for _, w := range b.writes {
		if w.obj != nil && holdsClaims(w.obj) {
			return true
		}
	}
	return false
}

// committer groups the batches of concurrent calls into shared commits. The caller whose
// batch finds no commit under way leads: it takes every batch queued, its own included,
// and commits them together in one store transaction and one state-file commit. The
// batches of the calls that arrive meanwhile queue, and when the commit is done and
// answered, the leader hands over to the oldest of them, which commits everything queued
// by then. So while one commit is being written and synced, the next one gathers, and
// concurrent callers share fsyncs; a lone caller commits at once, without waiting for
// company.
type committer struct {
	// mu guards queue and leading.
	mu sync.Mutex
	// queue holds the batches waiting for a commit, oldest first.
	queue []*batch
	// leading tells that a caller is committing or about to.
	leading bool
}

// submit commits the batch, together with the batches of concurrent calls, and returns
// once it is durable and its changes are handed to the watchers, or once it failed. The
// batch's outcomes and revision are set when it returns nil.
func (s *Server) submit(b *batch) error {
	b.done = make(chan struct{})
	b.lead = make(chan struct{}, 1)
	c := &s.commits
	c.mu.Lock()
	c.queue = append(c.queue, b)
	if c.leading {
		c.mu.Unlock()
		select {
		case <-b.done:
			return b.err
		case <-b.lead:
		}
		c.mu.Lock()
	}
	c.leading = true
	group := c.queue
	c.queue = nil
	c.mu.Unlock()

	s.commitGroup(group)

	c.mu.Lock()
	if len(c.queue) > 0 {
		c.queue[0].lead <- struct{}{}
	} else {
		c.leading = false
	}
	c.mu.Unlock()
	return b.err
}

// stagedChange is a change a commit has made in its store transaction.
type stagedChange struct {
	key *nimbusv1.ObjectKey
	id  nimbusv1.Key
	// objectID is id's String form, shared with the record stored or deleted.
	objectID string
	rev      uint64
	// before is the object before the change, nil when the change created it; after is
	// the object after it, nil for a deletion.
	before, after *nimbusv1.Object
	// put is the PUT event of after, which its stored record shares; nil for a deletion.
	put *sharedEvent
}

// commitGroup commits the batches with the Server's store; see backend.commitGroup.
func (s *Server) commitGroup(group []*batch) { s.backend.commitGroup(group) }

// publishChangesLocked hands the committed changes, in revision order, to the watchers
// and counts them. The caller holds s.mu and has set s.rev to the last one's revision or
// after it: see publish.
func (s *Server) publishChangesLocked(changes []stagedChange) {
	for _, c := range changes {
		s.publishLocked(newChange(c.rev, c.key, c.before, c.after, c.put))
		switch {
		case c.before == nil:
			s.metrics.objects.Inc()
		case c.after == nil:
			s.metrics.objects.Dec()
		}
	}
	if len(changes) > 0 {
		s.metrics.commits.Inc()
		s.metrics.commitSize.Observe(float64(len(changes)))
	}
}

// commitLocked makes the writes of the batches, after the Server's revision base, in one
// store transaction, stores the changes durably, then commits the transaction, and
// returns the revision after them and the changes in revision order. Writes that change
// nothing take no revision, and a group that changes nothing writes nothing. It runs
// inside publisher.publish.
func (e *embeddedStore) commitLocked(group []*batch, base uint64, now *timestamppb.Timestamp) (uint64, []stagedChange, error) {
	txn := e.env.tables.write()
	defer txn.abort()
	rev := base
	var changes []stagedChange
	for _, b := range group {
		// A batch refused for a conflict leaves nothing: the transaction goes back to
		// where it was before it. Only batches that can conflict pay for the copy.
		var before *tables
		if b.mayConflict() {
			before = txn.tables.copy()
		}
		revBefore, changesBefore := rev, len(changes)
		var conflicts refusal
		rev, changes, conflicts = stageBatch(txn, b, rev, changes, now)
		if conflicts.any() {
			txn.tables = before
			rev, changes = revBefore, changes[:changesBefore]
			b.outcomes, b.err = nil, conflicts.conflictErr()
			continue
		}
		b.rev = rev
	}
	if len(changes) == 0 {
		return base, nil, nil
	}
	for _, b := range group {
		for _, out := range b.outcomes {
			if out.changed {
				b.txns = 1
				break
			}
		}
	}
	txn.setRevision(rev)
	if e.disk != nil {
		puts, dels := finalStates(changes)
		if err := e.disk.commit(puts, dels, base+1, rev); err != nil {
			return base, nil, err
		}
	}
	txn.commit()
	return rev, changes, nil
}

// stageBatch makes the writes of the batch in txn, after revision rev, as a commit makes
// them: each write sees the ones before it. It sets the batch's outcomes, and returns the
// revision after its last change, changes with the batch's changes appended in revision
// order, and the refusal of the writes that would take a value another object holds,
// which the caller must not commit when it has any.
func stageBatch(txn *writeTxn, b *batch, rev uint64, changes []stagedChange, now *timestamppb.Timestamp) (uint64, []stagedChange, refusal) {
	var conflicts refusal
	b.outcomes = make([]outcome, len(b.writes))
	for i, w := range b.writes {
		var (
			c   *stagedChange
			out outcome
			err error
		)
		if w.obj != nil {
			c, out, err = stageApply(txn, w, rev+1, now)
		} else {
			c, out = stageDelete(txn, w, rev+1)
		}
		if err != nil {
			pos, id := b.at(i)
			conflicts.add(pos, id, err)
			continue
		}
		if c != nil {
			rev++
			changes = append(changes, *c)
		} else {
			out.rev = rev
		}
		b.outcomes[i] = out
	}
	return rev, changes, conflicts
}

// finalStates returns what the changes leave of each object they touch: the objects
// stored, and the key IDs of those deleted. A key is in one of them only, however many
// changes touch it.
func finalStates(changes []stagedChange) (puts []*nimbusv1.Object, dels []string) {
	last := make(map[string]int, len(changes))
	for i, c := range changes {
		last[c.objectID] = i
	}
	for i, c := range changes {
		switch {
		case last[c.objectID] != i:
		case c.after == nil:
			dels = append(dels, c.objectID)
		default:
			puts = append(puts, c.after)
		}
	}
	return puts, dels
}

// stageApply stores the write's object in txn as the change of revision rev, unless it
// is what is stored already. It assigns uid, generation, revision, generation revision and
// times as the package documentation says, and drops the statuses of nodes a retarget leaves. The change is nil
// when nothing changed; the outcome's rev is set only when something did. An object that
// would take a value another object holds is not stored: the error, which wraps
// ErrConflict, names both (see conflict.go).
func stageApply(txn *writeTxn, w write, rev uint64, now *timestamppb.Timestamp) (*stagedChange, outcome, error) {
	obj := w.obj
	var old *nimbusv1.Object
	objectID := w.id.String()
	if rec := txn.objectByID(objectID); rec != nil {
		old = rec.Object
	}
	m := obj.GetMeta()
	if tr := obj.GetTrace(); tr != nil && len(m.GetNodes()) == 0 {
		m.Nodes = txn.traceNodes(m.GetTenant(), m.GetNamespace(), tr)
	}
	m.GenerationRevision = rev
	if old == nil {
		m.Uid = newUUID()
		m.Generation = 1
		m.CreateTime = now
	} else {
		om := old.GetMeta()
		specChanged := !proto.Equal(&nimbusv1.Object{Spec: old.GetSpec()}, &nimbusv1.Object{Spec: obj.GetSpec()})
		retargeted := !slices.Equal(om.GetNodes(), m.GetNodes())
		if !specChanged && !retargeted && maps.Equal(om.GetLabels(), m.GetLabels()) {
			return nil, outcome{obj: old}, nil
		}
		m.Uid, m.CreateTime, m.Generation = om.GetUid(), om.GetCreateTime(), om.GetGeneration()
		if specChanged || retargeted {
			m.Generation++
		} else {
			m.GenerationRevision = old.GenerationRevision()
		}
	}
	if holdsClaims(obj) {
		if err := txn.checkConflicts(w.id, obj); err != nil {
			return nil, outcome{}, err
		}
	}
	m.Revision = rev
	m.UpdateTime = now
	c := storePut(txn, w.key, w.id, objectID, old, obj)
	return c, outcome{obj: obj, changed: true, created: old == nil, rev: rev}, nil
}

// storePut stores obj, whose meta is complete and whose key is id, with key ID objectID,
// in txn in place of old (nil when obj is new), drops the statuses of nodes a retarget
// leaves, and returns the change.
func storePut(txn *writeTxn, key *nimbusv1.ObjectKey, id nimbusv1.Key, objectID string, old, obj *nimbusv1.Object) *stagedChange {
	// The record shares the change's PUT event, so that snapshots and status streams send
	// the very bytes the change is sent as, encoded once. Its key shares the strings of
	// the stored object.
	rec := &objectRecord{Key: obj.TypedKey(), id: objectID, Object: obj}
	put := newPutEvent(obj)
	rec.put.Store(put)
	txn.putObject(rec)
	if old != nil && !slices.Equal(old.GetMeta().GetNodes(), obj.GetMeta().GetNodes()) {
		dropRetargetedStatuses(txn, rec.Key, obj)
	}
	if old != nil && old.GetMeta().GetGeneration() != obj.GetMeta().GetGeneration() {
		dropClearedStatuses(txn, rec.Key)
	}
	return &stagedChange{key: key, id: id, objectID: rec.id, rev: obj.GetMeta().GetRevision(), before: old, after: obj, put: put}
}

// dropRetargetedStatuses deletes the statuses of the object with the key, retargeted to
// obj, that nodes it no longer targets reported, and forgets the watch state of those nodes
// when nothing else keeps it.
func dropRetargetedStatuses(txn *writeTxn, key nimbusv1.Key, obj *nimbusv1.Object) {
	var dropped []string
	for _, r := range txn.statusesOf(key) {
		if !targetsNode(obj, r.Node) {
			txn.deleteStatus(r)
			dropped = append(dropped, r.Node)
		}
	}
	forgetIdleNodes(txn, dropped...)
}

// dropClearedStatuses deletes, at a new generation of the object with the key, the
// PROGRAMMED statuses without operational data that nodes with a watermark reported of an
// older one. Such a node's agent sends its own statuses again when it gets the new
// generation; a PROGRAMMED status it is not sending again is one it sent to clear an
// exception, which the watermark would have dropped had it passed the old generation
// before this change (see recordWatermarkIn), and which would otherwise outlive it.
func dropClearedStatuses(txn *writeTxn, key nimbusv1.Key) {
	if txn.watermarks.Len() == 0 {
		return
	}
	for _, r := range txn.statusesOf(key) {
		st := r.Status
		if st.GetPhase() == nimbusv1.Phase_PHASE_PROGRAMMED && st.GetOperationalData() == nil &&
			len(st.GetOperational()) == 0 && txn.watermark(r.Node) != nil {
			txn.deleteStatus(r)
		}
	}
}

// stageDelete deletes the write's object and every status reported for it in txn as the
// change of revision rev. The change is nil when there is no such object.
func stageDelete(txn *writeTxn, w write, rev uint64) (*stagedChange, outcome) {
	rec := txn.object(w.id)
	if rec == nil {
		return nil, outcome{}
	}
	old := rec.Object
	txn.deleteObjectID(rec.id)
	recs := txn.statusesOfID(rec.id)
	for _, r := range recs {
		txn.deleteStatus(r)
	}
	// The nodes that reported, and a deleted Node object's node, may have nothing left
	// that keeps their watch state.
	idle := make([]string, 0, len(recs)+1)
	for _, r := range recs {
		idle = append(idle, r.Node)
	}
	if name := w.key.GetName(); w.key.GetKind() == nimbusv1.Kind_KIND_NODE {
		// The node is gone: what it reported about any object goes with it, and so does
		// its watermark.
		for _, r := range txn.statusesBy(name) {
			txn.deleteStatus(r)
		}
		txn.deleteWatermark(name)
		idle = append(idle, name)
	}
	forgetIdleNodes(txn, idle...)
	c := &stagedChange{key: w.key, id: w.id, objectID: rec.id, rev: rev, before: old}
	return c, outcome{changed: true, rev: rev}
}

// logBatch logs what a committed batch did: a line per change at INFO for a single
// write, as a person following one object wants; for a batch of many, one INFO line with
// the counts and, when DEBUG is on, a line per write.
func logBatch(log *slog.Logger, b *batch) {
	if len(b.writes) == 0 {
		return
	}
	single := len(b.writes) == 1
	perWrite := single || log.Enabled(context.Background(), slog.LevelDebug)
	changed, created := 0, 0
	for i, w := range b.writes {
		out := b.outcomes[i]
		if out.changed {
			changed++
		}
		if out.created {
			created++
		}
		if !perWrite {
			continue
		}
		level := log.Debug
		if single && out.changed {
			level = log.Info
		}
		switch {
		case w.obj != nil && out.changed:
			level("object applied", "key", w.id, "revision", out.rev,
				"generation", out.obj.GetMeta().GetGeneration(), "created", out.created)
		case w.obj != nil:
			level("object unchanged", "key", w.id, "revision", out.obj.GetMeta().GetRevision())
		case out.changed:
			level("object deleted", "key", w.id, "revision", out.rev)
		default:
			level("object to delete not found", "key", w.id)
		}
	}
	switch {
	case single:
	case b.deleting:
		log.Info("objects deleted", "objects", len(b.writes), "deleted", changed, "revision", b.rev)
	default:
		log.Info("objects applied", "objects", len(b.writes), "changed", changed, "created", created, "revision", b.rev)
	}
}
