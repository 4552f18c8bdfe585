package nimbus

import (
	"context"
	"fmt"
	"log/slog"

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
	// cutOff returns why the store, although it serves, is not ready: it may be stale,
	// such as an etcd-backed one whose watch has not heard from etcd for long. Empty when
	// it is not.
	cutOff() string
	// reportHealth makes the health service, which Serve has set SERVING, agree with
	// notReady until the store first becomes ready, and with cutOff after.
	reportHealth(hs *health.Server)
	// failed returns a channel that yields the error that keeps the store from ever
	// serving, such as a setting etcd refuses; Serve stops and returns it. nil: none can.
	failed() <-chan error
	// close stops the store and releases what it holds. It is safe to call twice.
	close() error
}

var (
	_ backend = (*embeddedStore)(nil)
	_ backend = (*etcdStore)(nil)
)

// publisher is what a store needs of the Server it keeps the objects of: the lock that
// orders the Server's changes with their hand-over to the watchers, and the Server's
// revision. A store writes the memory tables (storeEnv.tables) only inside publish or
// restart.
type publisher interface {
	// publish runs stage under the lock, with the Server's revision and whether the
	// Server is closed. When stage returns nil, the Server moves to the revision stage
	// returns and hands the changes, in revision order, to the watchers; otherwise publish
	// returns stage's error and changes nothing.
	publish(stage func(rev uint64, closed bool) (uint64, []stagedChange, error)) error
	// restart runs fill under the lock, then starts the Server over at revision rev of
	// epoch: every watcher is reset and the history starts at rev. objects is how many
	// objects the tables hold then, and last the revision of the last change among them.
	restart(epoch string, rev uint64, objects int, last uint64, fill func())
	// currentRev returns the Server's revision.
	currentRev() uint64
	// endWatches ends every watch stream with codes.Unavailable and the reason.
	endWatches(why string)
}

var _ publisher = (*Server)(nil)

// storeEnv is what a store is given by the Server it keeps the objects of.
type storeEnv struct {
	// pub is the Server, to hand changes over to.
	pub publisher
	// tables are the memory tables the Server reads the objects from.
	tables *store
	// opts are the Server's options, with their defaults.
	opts Options
	log  *slog.Logger
}

// publish runs stage under s.mu; see publisher.
func (s *Server) publish(stage func(rev uint64, closed bool) (uint64, []stagedChange, error)) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	rev, changes, err := stage(s.rev, s.closed)
	if err != nil {
		return err
	}
	s.rev = rev
	s.publishChangesLocked(changes)
	return nil
}

// restart runs fill under s.mu and starts the Server over; see publisher.
func (s *Server) restart(epoch string, rev uint64, objects int, last uint64, fill func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fill()
	for w := range s.watchers {
		s.resetLocked(w)
	}
	s.rev = rev
	s.history.reset(rev)
	s.setEpoch(epoch)
	s.metrics.objects.Set(float64(objects))
	s.metrics.revision.Set(float64(last))
}

// currentRev returns the Server's revision.
func (s *Server) currentRev() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rev
}

// embeddedStore is the store of a Server on its own: its memory tables hold the objects,
// and with Options.DataDir a state file keeps them durable. It is always current and ready.
type embeddedStore struct {
	env storeEnv
	// disk is the durable store; nil when everything is kept in memory only.
	disk *disk
}

// load opens the durable store in Options.DataDir and fills the memory tables and the
// Server's revision from it. It returns the store's epoch and how many objects it loaded.
func (e *embeddedStore) load() (epoch string, objects int, err error) {
	d, st, err := openDisk(e.env.opts.DataDir, diskLockTimeout, newEpoch)
	if err != nil {
		return "", 0, err
	}
	e.env.pub.publish(func(uint64, bool) (uint64, []stagedChange, error) {
		txn := e.env.tables.write()
		for _, obj := range st.objects {
			txn.putObject(&objectRecord{Key: obj.TypedKey(), Object: obj})
		}
		txn.setRevision(st.rev)
		txn.commit()
		return st.rev, nil, nil
	})
	e.disk = d
	e.env.log.Info("store loaded", "path", d.path, "objects", len(st.objects), "revision", st.rev, "epoch", st.epoch)
	return st.epoch, len(st.objects), nil
}

// commitGroup commits the batches, in order, in one store transaction and, with a durable
// store, one state-file commit; hands every change to the watchers once it is durable, in
// revision order, under the Server's lock (publisher.publish); and answers every batch. When the commit fails, every batch
// fails with its error and nothing of any of them is stored: the batches share the
// transactions. A batch's own bad input never gets this far; its call refuses it before
// submitting.
func (e *embeddedStore) commitGroup(group []*batch) {
	defer func() {
		for _, b := range group {
			close(b.done)
		}
	}()
	now := timestamppb.New(e.env.opts.Now())
	err := e.env.pub.publish(func(rev uint64, closed bool) (uint64, []stagedChange, error) {
		if closed {
			return rev, nil, ErrClosed
		}
		return e.commitLocked(group, rev, now)
	})
	for _, b := range group {
		switch {
		case err != nil:
			b.err = fmt.Errorf("%s: %w", b.what(), err)
		case b.err == nil:
			logBatch(e.env.log, b)
		}
	}
}

// catchUp reports true at once: the embedded store hands out every revision itself.
func (e *embeddedStore) catchUp(context.Context, uint64) bool { return true }

// catchUpForReports returns at once: the embedded store holds every object it handed out.
func (e *embeddedStore) catchUpForReports([]*nimbusv1.StatusReport) {}

// notReady returns "": the embedded store is ready from New on.
func (e *embeddedStore) notReady() string { return "" }

// cutOff returns "": the embedded store is the only source of its objects.
func (e *embeddedStore) cutOff() string { return "" }

// reportHealth does nothing: the embedded store is ready from New on.
func (e *embeddedStore) reportHealth(*health.Server) {}

// failed returns nil: nothing the embedded store meets after New keeps it from serving.
func (e *embeddedStore) failed() <-chan error { return nil }

// close closes the durable store, if any. It is safe to call twice.
func (e *embeddedStore) close() error {
	if e.disk == nil {
		return nil
	}
	return e.disk.close()
}
