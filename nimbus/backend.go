package nimbus

import (
	"context"
	"fmt"

	"google.golang.org/grpc/health"
	"google.golang.org/protobuf/types/known/timestamppb"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// backend is what the Server needs of the store that keeps its objects: the embedded
// store (embeddedStore: the memory tables, made durable in a state file with
// Options.DataDir) or etcd (etcdStore, with Options.Etcd). The Server calls it the same
// way whichever it is.
type backend interface {
	// commitGroup commits the batches, in order; hands every change to the watchers, in
	// revision order; sets each batch's outcomes, revision or error; and closes their done
	// channels.
	commitGroup(group []*batch)
	// catchUp waits, for a short while at most, until the store holds revision rev, which
	// another replica may have handed out already, and reports whether it got there.
	catchUp(ctx context.Context, rev uint64) bool
	// catchUpForReports waits, for a short while at most, until the store holds the
	// objects the status reports concern, when it may not hold them yet.
	catchUpForReports(reports []*nimbusv1.StatusReport)
	// notReady returns why the store cannot serve yet; empty once it can.
	notReady() string
	// reportHealth makes the health service, which Serve has set SERVING, agree with
	// notReady until the store first becomes ready.
	reportHealth(hs *health.Server)
	// close stops the store and releases what it holds. It is safe to call twice.
	close() error
}

var (
	_ backend = (*embeddedStore)(nil)
	_ backend = (*etcdStore)(nil)
)

// embeddedStore is the store of a Server on its own: its memory tables hold the objects,
// and with Options.DataDir a state file keeps them durable. It is always current and ready.
type embeddedStore struct {
	s *Server
	// disk is the durable store; nil when everything is kept in memory only.
	disk *disk
}

// load opens the durable store in Options.DataDir and fills the memory store, the revision
// and the epoch from it. It returns how many objects it loaded.
func (e *embeddedStore) load() (int, error) {
	s := e.s
	d, st, err := openDisk(s.opts.DataDir, diskLockTimeout, newEpoch)
	if err != nil {
		return 0, err
	}
	txn := s.store.write()
	for _, obj := range st.objects {
		txn.putObject(&objectRecord{ID: obj.Key().ID(), Object: obj})
	}
	txn.setRevision(st.rev)
	txn.commit()
	e.disk, s.rev = d, st.rev
	s.setEpoch(st.epoch)
	s.log.Info("store loaded", "path", d.path, "objects", len(st.objects), "revision", st.rev, "epoch", st.epoch)
	return len(st.objects), nil
}

// commitGroup commits the batches, in order, in one store transaction and, with a durable
// store, one state-file commit; hands every change to the watchers once it is durable, in
// revision order, under s.mu; and answers every batch. When the commit fails, every batch
// fails with its error and nothing of any of them is stored: the batches share the
// transactions. A batch's own bad input never gets this far; its call refuses it before
// submitting.
func (e *embeddedStore) commitGroup(group []*batch) {
	s := e.s
	defer func() {
		for _, b := range group {
			close(b.done)
		}
	}()
	now := timestamppb.New(s.opts.Now())
	s.mu.Lock()
	changes, err := e.commitLocked(group, now)
	if err == nil {
		s.publishChangesLocked(changes)
	}
	s.mu.Unlock()
	for _, b := range group {
		switch {
		case err != nil:
			b.err = fmt.Errorf("%s: %w", b.what(), err)
		case b.err == nil:
			s.logBatch(b)
		}
	}
}

// catchUp reports true at once: the embedded store hands out every revision itself.
func (e *embeddedStore) catchUp(context.Context, uint64) bool { return true }

// catchUpForReports returns at once: the embedded store holds every object it handed out.
func (e *embeddedStore) catchUpForReports([]*nimbusv1.StatusReport) {}

// notReady returns "": the embedded store is ready from New on.
func (e *embeddedStore) notReady() string { return "" }

// reportHealth does nothing: the embedded store is ready from New on.
func (e *embeddedStore) reportHealth(*health.Server) {}

// close closes the durable store, if any. It is safe to call twice.
func (e *embeddedStore) close() error {
	if e.disk == nil {
		return nil
	}
	return e.disk.close()
}
