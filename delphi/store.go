package delphi

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/go-memdb"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// Sentinel errors; check with errors.Is.
var (
	// ErrWriterClaimed is returned when a table's writer handle is claimed a second time.
	ErrWriterClaimed = errors.New("writer already claimed")
	// ErrClosed is returned by operations on a closed store or subscription.
	ErrClosed = errors.New("delphi closed")
	// ErrCorrupt is returned by Open when the state file cannot be read back: bbolt
	// rejects it, a value does not parse, or its format version is not this code's. The
	// error names the file. Options.Discard starts over without it.
	ErrCorrupt = errors.New("corrupt state file")
	// ErrLocked is returned by Open when another process holds the state file open.
	ErrLocked = errors.New("state file locked by another process")
	// ErrUnknownIndex is returned by Lookup for an index that Options.Indexes does not
	// declare.
	ErrUnknownIndex = errors.New("unknown index")
)

// Table names one of delphi's tables.
type Table string

// The tables a subscription can watch.
const (
	TableDesired Table = "desired"
	TableStatus  Table = "status"
)

const tableResume = "resume"

// desiredRecord is one row of the desired table. Indexed holds, per declared index in the
// order of Options.Indexes, the values the index lists the object under, computed once
// when the record is made; it is nil when no index lists the object.
type desiredRecord struct {
	ID      string
	Kind    int
	Object  *nimbusv1.Object
	Indexed [][]string
}

// statusRecord is one row of the status table. Its key is its key ID in the table;
// Statuses parses it back.
type statusRecord struct {
	Status *nimbusv1.NodeStatus
}

// resumeRecord is the single row that holds where the desired table stands at nimbus.
type resumeRecord struct {
	ID       string
	Epoch    string
	Revision uint64
}

// Index is a secondary index of the desired table, declared by the code that looks objects
// up by it, as go-memdb takes its schema from its caller: a reconciler that needs to find
// objects by some derived value declares an Index, and a new kind adds its indexes without
// editing the store.
type Index struct {
	// Name names the index in Lookup. Required; unique among a store's indexes, and not
	// one of the built-in "id" and "kind".
	Name string
	// Values returns the values under which obj is listed; none leaves it out of the index.
	// It must depend on obj alone. Required.
	Values func(obj *nimbusv1.Object) []string
}

// indexer is the go-memdb indexer of a declared index, the pos-th: it reads the values
// that newDesiredRecord computed.
type indexer struct {
	name string
	pos  int
}

func (ix indexer) FromObject(raw any) (bool, [][]byte, error) {
	r := raw.(*desiredRecord)
	if len(r.Indexed) == 0 {
		return false, nil, nil
	}
	vals := r.Indexed[ix.pos]
	if len(vals) == 0 {
		return false, nil, nil
	}
	out := make([][]byte, len(vals))
	for i, v := range vals {
		out[i] = append([]byte(v), 0)
	}
	return true, out, nil
}

func (ix indexer) FromArgs(args ...any) ([]byte, error) {
	if len(args) != 1 {
		return nil, fmt.Errorf("index %s: want one value, got %d", ix.name, len(args))
	}
	v, ok := args[0].(string)
	if !ok {
		return nil, fmt.Errorf("index %s: value %v is a %T, want a string", ix.name, args[0], args[0])
	}
	return append([]byte(v), 0), nil
}

func schema(indexes []Index) (*memdb.DBSchema, error) {
	desired := map[string]*memdb.IndexSchema{
		"id": {Name: "id", Unique: true, Indexer: &memdb.StringFieldIndex{Field: "ID"}},
	}
	for i, ix := range indexes {
		switch {
		case ix.Name == "":
			return nil, fmt.Errorf("Options.Indexes[%d].Name: is required", i)
		case ix.Values == nil:
			return nil, fmt.Errorf("Options.Indexes[%d].Values (index %q): is required", i, ix.Name)
		case desired[ix.Name] != nil || ix.Name == "kind":
			return nil, fmt.Errorf("Options.Indexes[%d].Name %q: index declared twice or built in", i, ix.Name)
		}
		desired[ix.Name] = &memdb.IndexSchema{Name: ix.Name, AllowMissing: true, Indexer: indexer{ix.Name, i}}
	}
	return &memdb.DBSchema{Tables: map[string]*memdb.TableSchema{
		string(TableDesired): {Name: string(TableDesired), Indexes: desired},
		tableResume: {
			Name: tableResume,
			Indexes: map[string]*memdb.IndexSchema{
				"id": {Name: "id", Unique: true, Indexer: &memdb.StringFieldIndex{Field: "ID"}},
			},
		},
	}}, nil
}

// Options configures a Store.
type Options struct {
	// Dir, when set, makes the desired table and the resume point durable: they are kept
	// in the bbolt file StateFile in Dir (created when absent) and restored by Open. The
	// status table is never kept; the HAL recomputes it. Default: "", memory only.
	Dir string
	// Discard removes any state file in Dir before opening, so the store starts empty and
	// the nimbus client resyncs from a snapshot. It is the way out of ErrCorrupt; left set,
	// it throws the stored state away on every start. Default: false.
	Discard bool
	// Indexes are the secondary indexes of the desired table, besides the built-in ones by
	// key and kind; Lookup reads them. Default: none.
	Indexes []Index
	// Logger receives the store's logs. Default: slog.Default().
	Logger *slog.Logger
	// Registerer takes the store's Prometheus metrics (see the package documentation);
	// Close unregisters them. Default: a private prometheus.Registry.
	Registerer prometheus.Registerer
}

// Store is the local object store. Its read methods are safe for concurrent use; reads of
// the desired table never block on writers, and reads of the status table wait at most
// for one status transaction to be applied to memory.
type Store struct {
	db      *memdb.MemDB
	log     *slog.Logger
	indexes []Index
	metrics *metrics

	// writeMu serializes write transactions together with their writes to disk and the
	// notification of their subscribers, so that the file follows commit order and
	// subscribers see commits in commit order. It also guards disk and the unregistering
	// of metrics against Close.
	writeMu sync.Mutex
	disk    *disk // nil without Options.Dir

	// statusMu guards statuses, the status table. Statuses are many, small, rewritten
	// often and never kept on disk, so they live in a plain map rather than in go-memdb,
	// whose radix trees copy nodes and make watch channels on every write. Writers also
	// hold writeMu.
	statusMu sync.RWMutex
	statuses map[string]*statusRecord

	// mu guards subs, desiredClaimed, statusClaimed, synced and closed.
	mu             sync.Mutex
	subs           map[*Subscription]struct{}
	desiredClaimed bool
	statusClaimed  bool
	synced         chan struct{}
	closed         bool
}

// Open returns a store. Without Options.Dir it is empty. With Dir, Open first restores
// every desired object and the resume point from the state file, so the HAL can enforce
// the last known state before nimbus is reachable. When the file held anything, Open also
// marks the store synced: the restored table was complete as of its resume revision, so
// the HAL may sweep kernel state against it; the nimbus client then brings it up to date
// by resuming, or by a snapshot that replaces it. A file that cannot be read back fails
// with ErrCorrupt, one that another process holds with ErrLocked.
func Open(opts Options) (*Store, error) {
	sch, err := schema(opts.Indexes)
	if err != nil {
		return nil, fmt.Errorf("delphi: %w", err)
	}
	db, err := memdb.NewMemDB(sch)
	if err != nil {
		return nil, fmt.Errorf("creating delphi tables: %w", err)
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	s := &Store{
		db:       db,
		log:      log,
		indexes:  opts.Indexes,
		subs:     make(map[*Subscription]struct{}),
		synced:   make(chan struct{}),
		statuses: make(map[string]*statusRecord),
	}
	reg := opts.Registerer
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	if opts.Dir == "" {
		if s.metrics, err = newMetrics(s, reg); err != nil {
			return nil, fmt.Errorf("opening delphi: %w", err)
		}
		return s, nil
	}
	path := filepath.Join(opts.Dir, StateFile)
	if opts.Discard {
		log.Warn("discarding stored desired state; starting empty", "path", path)
	}
	d, r, err := openDisk(path, opts.Discard)
	if err != nil {
		return nil, err
	}
	if err := s.restore(r); err != nil {
		d.close()
		return nil, err
	}
	if s.metrics, err = newMetrics(s, reg); err != nil {
		d.close()
		return nil, fmt.Errorf("opening delphi: %w", err)
	}
	s.disk = d
	epoch, rev := s.Resume()
	switch {
	case len(r.objects) > 0 || r.resume != nil:
		close(s.synced)
		log.Info("restored desired state", "path", path, "objects", len(r.objects), "epoch", epoch, "revision", rev)
	case r.fromFile:
		log.Info("no desired state stored; starting empty", "path", path)
	default:
		log.Info("created state file", "path", path)
	}
	return s, nil
}

// restore loads what the state file held into the tables, in one transaction.
func (s *Store) restore(r *restored) error {
	txn := s.db.Txn(true)
	defer txn.Abort()
	for _, obj := range r.objects {
		if err := txn.Insert(string(TableDesired), s.newDesiredRecord(obj)); err != nil {
			return fmt.Errorf("restoring %s: %w", obj.Key().ID(), err)
		}
	}
	if r.resume != nil {
		if err := txn.Insert(tableResume, r.resume); err != nil {
			return fmt.Errorf("restoring resume point: %w", err)
		}
	}
	txn.Commit()
	return nil
}

// Close closes every subscription and the state file, after any commit in progress. It is
// safe to call twice.
func (s *Store) Close() error {
	s.writeMu.Lock()
	s.mu.Lock()
	s.closed = true
	subs := s.subs
	s.subs = map[*Subscription]struct{}{}
	s.mu.Unlock()
	var err error
	if s.disk != nil {
		err = s.disk.close()
	}
	s.metrics.unregister()
	s.writeMu.Unlock()
	for sub := range subs {
		sub.close()
	}
	return err
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
	if kind == nimbusv1.Kind_KIND_UNSPECIFIED {
		return s.desiredBy("id")
	}
	// A key ID starts with its kind's name, so the id index lists a kind's objects
	// together: no index of its own, which would cost a radix path per object.
	return s.desiredBy("id_prefix", kind.Name()+"/")
}

// Lookup returns the desired objects that the declared index lists under value, ordered by
// key. An index that was not declared in Options.Indexes is an error wrapping
// ErrUnknownIndex.
func (s *Store) Lookup(index, value string) ([]*nimbusv1.Object, error) {
	if index == "id" || index == "kind" || !slices.ContainsFunc(s.indexes, func(ix Index) bool { return ix.Name == index }) {
		return nil, fmt.Errorf("looking up %q in index %q: %w", value, index, ErrUnknownIndex)
	}
	return s.desiredBy(index, value), nil
}

// LookupFirst returns the first by key of the desired objects that the declared index
// lists under value, with its key ID; obj is nil when there is none. It costs one index
// lookup, without the listing of Lookup. An index that was not declared in
// Options.Indexes is an error wrapping ErrUnknownIndex.
func (s *Store) LookupFirst(index, value string) (obj *nimbusv1.Object, keyID string, err error) {
	if index == "id" || index == "kind" || !slices.ContainsFunc(s.indexes, func(ix Index) bool { return ix.Name == index }) {
		return nil, "", fmt.Errorf("looking up %q in index %q: %w", value, index, ErrUnknownIndex)
	}
	raw, err := s.db.Txn(false).First(string(TableDesired), index, value)
	if err != nil {
		return nil, "", fmt.Errorf("looking up %q in index %q: %w", value, index, err)
	}
	if raw == nil {
		return nil, "", nil
	}
	r := raw.(*desiredRecord)
	return r.Object, r.ID, nil
}

// ScopedName returns the form in which the reference indexes hold a referenced object,
// "tenant/namespace/name", with tenant and namespace defaulted.
func ScopedName(key *nimbusv1.ObjectKey) string {
	return scoped(key.GetTenant(), key.GetNamespace(), key.GetName())
}

func scoped(tenant, namespace, name string) string {
	if tenant == "" {
		tenant = nimbusv1.DefaultTenant
	}
	if namespace == "" {
		namespace = nimbusv1.DefaultNamespace
	}
	return tenant + "/" + namespace + "/" + name
}

// desiredBy returns the desired objects an index lists under args, ordered by key.
func (s *Store) desiredBy(index string, args ...any) []*nimbusv1.Object {
	it, err := s.db.Txn(false).Get(string(TableDesired), index, args...)
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
	s.statusMu.RLock()
	r, ok := s.statuses[key.ID()]
	s.statusMu.RUnlock()
	if !ok {
		return nil, false
	}
	return r.Status, true
}

// StatusEntry is one object's status as Statuses returns it.
type StatusEntry struct {
	Key    *nimbusv1.ObjectKey
	Status *nimbusv1.NodeStatus
}

// Statuses returns every status, ordered by key.
func (s *Store) Statuses() []StatusEntry {
	s.statusMu.RLock()
	ids := s.statusIDsLocked()
	out := make([]StatusEntry, 0, len(ids))
	for _, id := range ids {
		key, err := nimbusv1.ParseKeyID(id)
		if err != nil {
			continue // not stored: StatusTxn takes keys, whose IDs parse
		}
		out = append(out, StatusEntry{Key: key, Status: s.statuses[id].Status})
	}
	s.statusMu.RUnlock()
	return out
}

// statusIDsLocked returns the key IDs of every status, ordered; the caller holds statusMu.
func (s *Store) statusIDsLocked() []string {
	ids := make([]string, 0, len(s.statuses))
	for id := range s.statuses {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// Synced returns a channel that is closed once the desired table has been marked complete
// (DesiredWriter.MarkSynced, or Open restoring a stored table): from then on, an object
// missing from it is meant to be absent.
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

// write runs fn in a write transaction, writes its durable changes to disk, commits it,
// and tells subscribers which keys changed, all under writeMu so that the file and the
// notifications follow commit order. The disk write comes before the commit, so readers
// never see what the file does not hold; when it fails, nothing changes. table, the table
// fn writes, labels the commit's metrics.
func (s *Store) write(table Table, fn func(txn *memdb.Txn) error) error {
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return ErrClosed
	}
	start := time.Now()
	txn := s.db.Txn(true)
	txn.TrackChanges()
	defer txn.Abort()
	if err := fn(txn); err != nil {
		return err
	}
	changes := txn.Changes()
	if s.disk != nil && persistent(changes) {
		if err := s.disk.commit(changes); err != nil {
			return fmt.Errorf("writing state file: %w", err)
		}
	}
	txn.Commit()
	var ids []string
	for _, c := range changes {
		if Table(c.Table) != TableDesired {
			continue
		}
		obj := c.After
		if obj == nil {
			obj = c.Before
		}
		ids = append(ids, obj.(*desiredRecord).ID)
	}
	s.notify(TableDesired, ids)
	s.metrics.commitDuration.WithLabelValues(string(table)).Observe(time.Since(start).Seconds())
	s.metrics.commitSize.WithLabelValues(string(table)).Observe(float64(len(ids)))
	return nil
}

// notify hands the keys of one table that a commit changed to the matching
// subscriptions; the caller holds writeMu.
func (s *Store) notify(table Table, ids []string) {
	if len(ids) == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for sub := range s.subs {
		if slices.Contains(sub.opts.Tables, table) {
			sub.add(ids)
		}
	}
}

// newDesiredRecord makes the desired-table row of obj, with the values of every declared
// index.
func (s *Store) newDesiredRecord(obj *nimbusv1.Object) *desiredRecord {
	r := &desiredRecord{ID: obj.Key().ID(), Kind: int(obj.Kind()), Object: obj}
	for i, ix := range s.indexes {
		if vals := ix.Values(obj); len(vals) > 0 {
			if r.Indexed == nil {
				r.Indexed = make([][]string, len(s.indexes))
			}
			r.Indexed[i] = vals
		}
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

// PutOwned stores obj itself, without the copy Put makes: the caller hands it over and
// must not modify it afterwards. The nimbus client, which decodes a fresh object from
// every watch event, uses it.
func (t *DesiredTxn) PutOwned(obj *nimbusv1.Object) {
	t.puts = append(t.puts, obj)
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
	return w.s.write(TableDesired, func(txn *memdb.Txn) error {
		put := map[string]bool{}
		for _, obj := range t.puts {
			rec := w.s.newDesiredRecord(obj)
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

// StatusTxn is a batch of status-table writes committed atomically, in the order they
// were added: the HAL records the statuses of many reconciles in one transaction.
type StatusTxn struct {
	ops []statusOp
}

// statusOp is one write of a StatusTxn: rec stored, or, with rec nil, the status of id
// removed.
type statusOp struct {
	id  string
	rec *statusRecord
}

// Set stores the status of the object with the given key. The store keeps its own copy.
func (t *StatusTxn) Set(key *nimbusv1.ObjectKey, st *nimbusv1.NodeStatus) {
	id := key.ID()
	t.ops = append(t.ops, statusOp{id: id, rec: &statusRecord{Status: proto.CloneOf(st)}})
}

// SetOwned stores st itself, without the copy Set makes: the caller hands it over and must
// not modify it afterwards. The HAL, which builds a fresh status for every reconcile,
// uses it.
func (t *StatusTxn) SetOwned(key *nimbusv1.ObjectKey, st *nimbusv1.NodeStatus) {
	t.ops = append(t.ops, statusOp{id: key.ID(), rec: &statusRecord{Status: st}})
}

// Delete removes the status of the object with the given key; an absent one is not an
// error.
func (t *StatusTxn) Delete(key *nimbusv1.ObjectKey) {
	t.ops = append(t.ops, statusOp{id: key.ID()})
}

// Len returns the number of writes in the transaction.
func (t *StatusTxn) Len() int { return len(t.ops) }

// Commit applies the transaction atomically, in one write transaction with one
// notification of subscribers. A status equal to the stored one, apart from its update
// time, is not rewritten, so subscribers hear only of real changes; of several writes of
// one key, the last one counts.
func (w *StatusWriter) Commit(t *StatusTxn) error {
	if len(t.ops) == 0 {
		return nil
	}
	s := w.s
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return ErrClosed
	}
	start := time.Now()
	// before holds, per key the batch wrote, its record before the batch (nil when it had
	// none), so that subscribers hear of the keys whose status the batch as a whole changed.
	var ids []string
	before := make(map[string]*statusRecord, len(t.ops))
	s.statusMu.Lock()
	for _, op := range t.ops {
		old, had := s.statuses[op.id]
		switch {
		case op.rec == nil && !had:
			continue
		case op.rec != nil && had && sameStatus(old.Status, op.rec.Status):
			continue
		}
		if _, seen := before[op.id]; !seen {
			before[op.id] = old
			ids = append(ids, op.id)
		}
		if op.rec == nil {
			delete(s.statuses, op.id)
		} else {
			s.statuses[op.id] = op.rec
		}
	}
	changed := ids[:0]
	for _, id := range ids {
		if s.statuses[id] != before[id] {
			changed = append(changed, id)
		}
	}
	s.statusMu.Unlock()
	ids = changed
	s.notify(TableStatus, ids)
	s.metrics.commitDuration.WithLabelValues(string(TableStatus)).Observe(time.Since(start).Seconds())
	s.metrics.commitSize.WithLabelValues(string(TableStatus)).Observe(float64(len(ids)))
	return nil
}

// Set stores the status of the object with the given key, in a transaction of its own. A
// status equal to the stored one, apart from its update time, is not rewritten.
func (w *StatusWriter) Set(key *nimbusv1.ObjectKey, st *nimbusv1.NodeStatus) error {
	t := &StatusTxn{}
	t.Set(key, st)
	return w.Commit(t)
}

// Delete removes the status of the object with the given key, in a transaction of its
// own; an absent one is not an error.
func (w *StatusWriter) Delete(key *nimbusv1.ObjectKey) error {
	t := &StatusTxn{}
	t.Delete(key)
	return w.Commit(t)
}

// sameStatus reports whether two statuses are equal apart from their update times. It
// compares the fields of NodeStatus one by one instead of cloning both to clear their
// times: it runs on every status write.
func sameStatus(a, b *nimbusv1.NodeStatus) bool {
	return a.GetNode() == b.GetNode() &&
		a.GetObservedGeneration() == b.GetObservedGeneration() &&
		a.GetPhase() == b.GetPhase() &&
		a.GetReason() == b.GetReason() &&
		a.GetMessage() == b.GetMessage() &&
		a.GetStale() == b.GetStale() &&
		maps.Equal(a.GetOperational(), b.GetOperational()) &&
		len(a.ProtoReflect().GetUnknown()) == 0 && len(b.ProtoReflect().GetUnknown()) == 0
}
