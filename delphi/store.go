package delphi

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/hashicorp/go-memdb"
	"google.golang.org/protobuf/proto"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// Sentinel errors; check with errors.Is.
var (
	// ErrWriterClaimed is returned when a table's writer handle is claimed a second time.
	ErrWriterClaimed = errors.New("writer already claimed")
	// ErrClosed is returned by operations on a closed store or subscription.
	ErrClosed = errors.New("delphi closed")
)

// Table names one of delphi's tables.
type Table string

// The tables a subscription can watch.
const (
	TableDesired Table = "desired"
	TableStatus  Table = "status"
)

const tableResume = "resume"

// desiredRecord is one row of the desired table.
type desiredRecord struct {
	ID     string
	Kind   int
	Object *nimbusv1.Object
	// RouteDst is "table/prefix" for Route objects, empty otherwise.
	RouteDst string
}

// statusRecord is one row of the status table.
type statusRecord struct {
	ID     string
	Key    *nimbusv1.ObjectKey
	Status *nimbusv1.NodeStatus
}

// resumeRecord is the single row that holds where the desired table stands at nimbus.
type resumeRecord struct {
	ID       string
	Epoch    string
	Revision uint64
}

func schema() *memdb.DBSchema {
	return &memdb.DBSchema{Tables: map[string]*memdb.TableSchema{
		string(TableDesired): {
			Name: string(TableDesired),
			Indexes: map[string]*memdb.IndexSchema{
				"id":        {Name: "id", Unique: true, Indexer: &memdb.StringFieldIndex{Field: "ID"}},
				"kind":      {Name: "kind", Indexer: &memdb.IntFieldIndex{Field: "Kind"}},
				"route_dst": {Name: "route_dst", AllowMissing: true, Indexer: &memdb.StringFieldIndex{Field: "RouteDst"}},
			},
		},
		string(TableStatus): {
			Name: string(TableStatus),
			Indexes: map[string]*memdb.IndexSchema{
				"id": {Name: "id", Unique: true, Indexer: &memdb.StringFieldIndex{Field: "ID"}},
			},
		},
		tableResume: {
			Name: tableResume,
			Indexes: map[string]*memdb.IndexSchema{
				"id": {Name: "id", Unique: true, Indexer: &memdb.StringFieldIndex{Field: "ID"}},
			},
		},
	}}
}

// Options configures a Store.
type Options struct {
	// Logger receives the store's logs. Default: slog.Default().
	Logger *slog.Logger
}

// Store is the local object store. Its read methods are safe for concurrent use and never
// block on writers.
type Store struct {
	db  *memdb.MemDB
	log *slog.Logger

	// writeMu serializes write transactions together with the notification of their
	// subscribers, so that subscribers see commits in commit order.
	writeMu sync.Mutex

	// mu guards subs, desiredClaimed, statusClaimed, synced and closed.
	mu             sync.Mutex
	subs           map[*Subscription]struct{}
	desiredClaimed bool
	statusClaimed  bool
	synced         chan struct{}
	closed         bool
}

// Open returns an empty store.
func Open(opts Options) (*Store, error) {
	db, err := memdb.NewMemDB(schema())
	if err != nil {
		return nil, fmt.Errorf("creating delphi tables: %w", err)
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	return &Store{
		db:     db,
		log:    log,
		subs:   make(map[*Subscription]struct{}),
		synced: make(chan struct{}),
	}, nil
}

// Close closes every subscription. It is safe to call twice.
func (s *Store) Close() error {
	s.mu.Lock()
	s.closed = true
	subs := s.subs
	s.subs = map[*Subscription]struct{}{}
	s.mu.Unlock()
	for sub := range subs {
		sub.close()
	}
	return nil
}

// Get returns the desired object with the given key.
func (s *Store) Get(key *nimbusv1.ObjectKey) (*nimbusv1.Object, bool) {
	raw, err := s.db.Txn(false).First(string(TableDesired), "id", key.ID())
	if err != nil || raw == nil {
		return nil, false
	}
	return raw.(*desiredRecord).Object, true
}

// List returns the desired objects of one kind, ordered by key; KIND_UNSPECIFIED lists all.
func (s *Store) List(kind nimbusv1.Kind) []*nimbusv1.Object {
	txn := s.db.Txn(false)
	var it memdb.ResultIterator
	var err error
	if kind == nimbusv1.Kind_KIND_UNSPECIFIED {
		it, err = txn.Get(string(TableDesired), "id")
	} else {
		it, err = txn.Get(string(TableDesired), "kind", int(kind))
	}
	if err != nil {
		return nil
	}
	var out []*nimbusv1.Object
	for raw := it.Next(); raw != nil; raw = it.Next() {
		out = append(out, raw.(*desiredRecord).Object)
	}
	return out
}

// RoutesTo returns the desired Route objects for the destination prefix in the given table,
// ordered by key.
func (s *Store) RoutesTo(table uint32, prefix string) []*nimbusv1.Object {
	it, err := s.db.Txn(false).Get(string(TableDesired), "route_dst", routeDst(table, prefix))
	if err != nil {
		return nil
	}
	var out []*nimbusv1.Object
	for raw := it.Next(); raw != nil; raw = it.Next() {
		out = append(out, raw.(*desiredRecord).Object)
	}
	return out
}

// Resume returns the nimbus epoch and revision the desired table corresponds to.
func (s *Store) Resume() (epoch string, revision uint64) {
	raw, err := s.db.Txn(false).First(tableResume, "id", tableResume)
	if err != nil || raw == nil {
		return "", 0
	}
	r := raw.(*resumeRecord)
	return r.Epoch, r.Revision
}

// Status returns the status the HAL reported for the object with the given key.
func (s *Store) Status(key *nimbusv1.ObjectKey) (*nimbusv1.NodeStatus, bool) {
	raw, err := s.db.Txn(false).First(string(TableStatus), "id", key.ID())
	if err != nil || raw == nil {
		return nil, false
	}
	return raw.(*statusRecord).Status, true
}

// StatusEntry is one object's status as Statuses returns it.
type StatusEntry struct {
	Key    *nimbusv1.ObjectKey
	Status *nimbusv1.NodeStatus
}

// Statuses returns every status, ordered by key.
func (s *Store) Statuses() []StatusEntry {
	it, err := s.db.Txn(false).Get(string(TableStatus), "id")
	if err != nil {
		return nil
	}
	var out []StatusEntry
	for raw := it.Next(); raw != nil; raw = it.Next() {
		r := raw.(*statusRecord)
		out = append(out, StatusEntry{Key: r.Key, Status: r.Status})
	}
	return out
}

// Synced returns a channel that is closed once the desired table has been marked complete
// (DesiredWriter.MarkSynced): from then on, an object missing from it is meant to be absent.
func (s *Store) Synced() <-chan struct{} { return s.synced }

// ClaimDesired returns the one writer handle of the desired table. Only the nimbus client
// may hold it; a second claim fails with ErrWriterClaimed.
func (s *Store) ClaimDesired() (*DesiredWriter, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.desiredClaimed {
		return nil, fmt.Errorf("claiming the desired table: %w", ErrWriterClaimed)
	}
	s.desiredClaimed = true
	return &DesiredWriter{s: s}, nil
}

// ClaimStatus returns the one writer handle of the status table. Only the HAL may hold it;
// a second claim fails with ErrWriterClaimed.
func (s *Store) ClaimStatus() (*StatusWriter, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.statusClaimed {
		return nil, fmt.Errorf("claiming the status table: %w", ErrWriterClaimed)
	}
	s.statusClaimed = true
	return &StatusWriter{s: s}, nil
}

// write runs fn in a write transaction, commits it, and tells subscribers which keys
// changed, all under writeMu so that notifications follow commit order.
func (s *Store) write(fn func(txn *memdb.Txn) error) error {
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	txn := s.db.Txn(true)
	txn.TrackChanges()
	defer txn.Abort()
	if err := fn(txn); err != nil {
		return err
	}
	changes := txn.Changes()
	txn.Commit()
	s.notify(changes)
	return nil
}

// notify hands the changed keys of a commit to the matching subscriptions.
func (s *Store) notify(changes memdb.Changes) {
	byTable := map[Table][]string{}
	for _, c := range changes {
		t := Table(c.Table)
		if t != TableDesired && t != TableStatus {
			continue
		}
		byTable[t] = append(byTable[t], changeID(c))
	}
	if len(byTable) == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for sub := range s.subs {
		for _, t := range sub.opts.Tables {
			sub.add(byTable[t])
		}
	}
}

func changeID(c memdb.Change) string {
	obj := c.After
	if obj == nil {
		obj = c.Before
	}
	switch r := obj.(type) {
	case *desiredRecord:
		return r.ID
	case *statusRecord:
		return r.ID
	}
	return ""
}

func routeDst(table uint32, prefix string) string {
	return fmt.Sprintf("%d/%s", table, prefix)
}

func newDesiredRecord(obj *nimbusv1.Object) *desiredRecord {
	r := &desiredRecord{ID: obj.Key().ID(), Kind: int(obj.Kind()), Object: obj}
	if rt := obj.GetRoute(); rt != nil {
		r.RouteDst = routeDst(rt.GetTable(), rt.GetPrefix())
	}
	return r
}

// DesiredWriter is the one handle that writes the desired table.
type DesiredWriter struct{ s *Store }

// DesiredTxn is a batch of desired-table writes committed atomically.
type DesiredTxn struct {
	puts    []*nimbusv1.Object
	deletes []*nimbusv1.ObjectKey
	keep    map[string]bool
	sweep   bool
	resume  *resumeRecord
}

// Put stores obj, replacing any object with the same key. The store keeps its own copy.
func (t *DesiredTxn) Put(obj *nimbusv1.Object) {
	t.puts = append(t.puts, proto.CloneOf(obj))
}

// Delete removes the object with the given key; an absent key is not an error.
func (t *DesiredTxn) Delete(key *nimbusv1.ObjectKey) {
	t.deletes = append(t.deletes, key)
}

// DeleteOthers removes, at commit, every stored object whose key ID is not in keep and is
// not Put in this transaction. A full snapshot uses it to drop what nimbus no longer sends.
func (t *DesiredTxn) DeleteOthers(keep map[string]bool) {
	t.sweep = true
	t.keep = keep
}

// SetResume records the nimbus epoch and revision the table corresponds to after commit.
func (t *DesiredTxn) SetResume(epoch string, revision uint64) {
	t.resume = &resumeRecord{ID: tableResume, Epoch: epoch, Revision: revision}
}

// Commit applies the transaction atomically. Objects equal to what is stored are not
// rewritten, so subscribers hear only of real changes.
func (w *DesiredWriter) Commit(t *DesiredTxn) error {
	return w.s.write(func(txn *memdb.Txn) error {
		put := map[string]bool{}
		for _, obj := range t.puts {
			rec := newDesiredRecord(obj)
			put[rec.ID] = true
			old, err := txn.First(string(TableDesired), "id", rec.ID)
			if err != nil {
				return fmt.Errorf("reading %s: %w", rec.ID, err)
			}
			if old != nil && proto.Equal(old.(*desiredRecord).Object, obj) {
				continue
			}
			if err := txn.Insert(string(TableDesired), rec); err != nil {
				return fmt.Errorf("storing %s: %w", rec.ID, err)
			}
		}
		for _, key := range t.deletes {
			if _, err := txn.DeleteAll(string(TableDesired), "id", key.ID()); err != nil {
				return fmt.Errorf("deleting %s: %w", key.ID(), err)
			}
		}
		if t.sweep {
			if err := sweepDesired(txn, func(id string) bool { return t.keep[id] || put[id] }); err != nil {
				return err
			}
		}
		if t.resume != nil {
			if err := txn.Insert(tableResume, t.resume); err != nil {
				return fmt.Errorf("storing resume point: %w", err)
			}
		}
		return nil
	})
}

func sweepDesired(txn *memdb.Txn, keep func(id string) bool) error {
	it, err := txn.Get(string(TableDesired), "id")
	if err != nil {
		return fmt.Errorf("listing desired objects: %w", err)
	}
	var stale []*desiredRecord
	for raw := it.Next(); raw != nil; raw = it.Next() {
		if r := raw.(*desiredRecord); !keep(r.ID) {
			stale = append(stale, r)
		}
	}
	for _, r := range stale {
		if err := txn.Delete(string(TableDesired), r); err != nil {
			return fmt.Errorf("deleting stale %s: %w", r.ID, err)
		}
	}
	return nil
}

// MarkSynced records that the desired table is complete: it holds everything nimbus
// targets at this node as of the stored revision. Calling it again does nothing.
func (w *DesiredWriter) MarkSynced() {
	w.s.mu.Lock()
	defer w.s.mu.Unlock()
	select {
	case <-w.s.synced:
	default:
		close(w.s.synced)
	}
}

// StatusWriter is the one handle that writes the status table.
type StatusWriter struct{ s *Store }

// Set stores the status of the object with the given key. A status equal to the stored
// one, apart from its update time, is not rewritten.
func (w *StatusWriter) Set(key *nimbusv1.ObjectKey, st *nimbusv1.NodeStatus) error {
	rec := &statusRecord{ID: key.ID(), Key: key.Defaulted(), Status: proto.CloneOf(st)}
	return w.s.write(func(txn *memdb.Txn) error {
		old, err := txn.First(string(TableStatus), "id", rec.ID)
		if err != nil {
			return fmt.Errorf("reading status of %s: %w", rec.ID, err)
		}
		if old != nil && sameStatus(old.(*statusRecord).Status, rec.Status) {
			return nil
		}
		if err := txn.Insert(string(TableStatus), rec); err != nil {
			return fmt.Errorf("storing status of %s: %w", rec.ID, err)
		}
		return nil
	})
}

// Delete removes the status of the object with the given key; an absent one is not an error.
func (w *StatusWriter) Delete(key *nimbusv1.ObjectKey) error {
	return w.s.write(func(txn *memdb.Txn) error {
		if _, err := txn.DeleteAll(string(TableStatus), "id", key.ID()); err != nil {
			return fmt.Errorf("deleting status of %s: %w", key.ID(), err)
		}
		return nil
	})
}

func sameStatus(a, b *nimbusv1.NodeStatus) bool {
	a, b = proto.CloneOf(a), proto.CloneOf(b)
	a.UpdateTime, b.UpdateTime = nil, nil
	return proto.Equal(a, b)
}
