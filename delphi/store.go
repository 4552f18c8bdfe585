package delphi

import (
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strconv"
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
	// ErrCorrupt is returned by Open when the state file cannot be read back: bbolt
	// rejects it, a value does not parse, or its format version is not this code's. The
	// error names the file. Options.Discard starts over without it.
	ErrCorrupt = errors.New("corrupt state file")
	// ErrLocked is returned by Open when another process holds the state file open.
	ErrLocked = errors.New("state file locked by another process")
)

// Table names one of delphi's tables.
type Table string

// The tables a subscription can watch.
const (
	TableDesired Table = "desired"
	TableStatus  Table = "status"
)

const tableResume = "resume"

// desiredRecord is one row of the desired table. Its fields other than Object are derived
// from Object for the indexes; references are scoped, "tenant/namespace/name".
type desiredRecord struct {
	ID     string
	Kind   int
	Object *nimbusv1.Object
	// RouteDst is "table/prefix" for Route objects, empty otherwise.
	RouteDst string
	// RouteTable is the decimal table of Route objects, empty otherwise.
	RouteTable string
	// Network is the scoped network of Endpoint objects, empty otherwise.
	Network string
	// Groups are the scoped security groups of Endpoint objects.
	Groups []string
	// AttachGroups are the scoped groups a NetworkSecurityPolicy is attached to.
	AttachGroups []string
	// Nodes are the nodes meta.nodes lists; empty for objects meant for every node.
	Nodes []string
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
				"id":           {Name: "id", Unique: true, Indexer: &memdb.StringFieldIndex{Field: "ID"}},
				"kind":         {Name: "kind", Indexer: &memdb.IntFieldIndex{Field: "Kind"}},
				"route_dst":    {Name: "route_dst", AllowMissing: true, Indexer: &memdb.StringFieldIndex{Field: "RouteDst"}},
				"route_table":  {Name: "route_table", AllowMissing: true, Indexer: &memdb.StringFieldIndex{Field: "RouteTable"}},
				"network":      {Name: "network", AllowMissing: true, Indexer: &memdb.StringFieldIndex{Field: "Network"}},
				"group":        {Name: "group", AllowMissing: true, Indexer: &memdb.StringSliceFieldIndex{Field: "Groups"}},
				"attach_group": {Name: "attach_group", AllowMissing: true, Indexer: &memdb.StringSliceFieldIndex{Field: "AttachGroups"}},
				"node":         {Name: "node", AllowMissing: true, Indexer: &memdb.StringSliceFieldIndex{Field: "Nodes"}},
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
	// Dir, when set, makes the desired table and the resume point durable: they are kept
	// in the bbolt file StateFile in Dir (created when absent) and restored by Open. The
	// status table is never kept; the HAL recomputes it. Default: "", memory only.
	Dir string
	// Discard removes any state file in Dir before opening, so the store starts empty and
	// the nimbus client resyncs from a snapshot. It is the way out of ErrCorrupt; left set,
	// it throws the stored state away on every start. Default: false.
	Discard bool
	// Logger receives the store's logs. Default: slog.Default().
	Logger *slog.Logger
}

// Store is the local object store. Its read methods are safe for concurrent use and never
// block on writers.
type Store struct {
	db  *memdb.MemDB
	log *slog.Logger

	// writeMu serializes write transactions together with their writes to disk and the
	// notification of their subscribers, so that the file follows commit order and
	// subscribers see commits in commit order. It also guards disk against Close.
	writeMu sync.Mutex
	disk    *disk // nil without Options.Dir

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
	db, err := memdb.NewMemDB(schema())
	if err != nil {
		return nil, fmt.Errorf("creating delphi tables: %w", err)
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	s := &Store{
		db:     db,
		log:    log,
		subs:   make(map[*Subscription]struct{}),
		synced: make(chan struct{}),
	}
	if opts.Dir == "" {
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
		if err := txn.Insert(string(TableDesired), newDesiredRecord(obj)); err != nil {
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
	return s.desiredBy("kind", int(kind))
}

// RoutesTo returns the desired Route objects for the destination prefix in the given table,
// ordered by key.
func (s *Store) RoutesTo(table uint32, prefix string) []*nimbusv1.Object {
	return s.desiredBy("route_dst", routeDst(table, prefix))
}

// RoutesInTable returns the desired Route objects in the given kernel routing table,
// ordered by key.
func (s *Store) RoutesInTable(table uint32) []*nimbusv1.Object {
	return s.desiredBy("route_table", strconv.FormatUint(uint64(table), 10))
}

// EndpointsOn returns the desired Endpoint objects attached to a network, ordered by key.
// References resolve within the referring object's tenant and namespace, so network is
// the network's scoped name, "tenant/namespace/name" (see ScopedName).
func (s *Store) EndpointsOn(network string) []*nimbusv1.Object {
	return s.desiredBy("network", network)
}

// EndpointsInGroup returns the desired Endpoint objects that list a security group,
// ordered by key. group is the group's scoped name, "tenant/namespace/name".
func (s *Store) EndpointsInGroup(group string) []*nimbusv1.Object {
	return s.desiredBy("group", group)
}

// PoliciesFor returns the desired NetworkSecurityPolicy objects attached to a security
// group, ordered by key. group is the group's scoped name, "tenant/namespace/name".
func (s *Store) PoliciesFor(group string) []*nimbusv1.Object {
	return s.desiredBy("attach_group", group)
}

// ObjectsFor returns the desired objects whose meta.nodes lists the node, ordered by key.
// Objects meant for every node list no nodes, so they have no entry here; List returns
// them.
func (s *Store) ObjectsFor(node string) []*nimbusv1.Object {
	return s.desiredBy("node", node)
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
// never see what the file does not hold; when it fails, nothing changes.
func (s *Store) write(fn func(txn *memdb.Txn) error) error {
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return ErrClosed
	}
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
		if id := changeID(c); id != "" {
			byTable[t] = append(byTable[t], id)
		}
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
	m := obj.GetMeta()
	r := &desiredRecord{ID: obj.Key().ID(), Kind: int(obj.Kind()), Object: obj, Nodes: m.GetNodes()}
	ref := func(name string) string { return scoped(m.GetTenant(), m.GetNamespace(), name) }
	refs := func(names []string) []string {
		if len(names) == 0 {
			return nil
		}
		out := make([]string, 0, len(names))
		for _, n := range names {
			if n != "" {
				out = append(out, ref(n))
			}
		}
		return out
	}
	switch {
	case obj.GetRoute() != nil:
		rt := obj.GetRoute()
		r.RouteDst = routeDst(rt.GetTable(), rt.GetPrefix())
		r.RouteTable = strconv.FormatUint(uint64(rt.GetTable()), 10)
	case obj.GetEndpoint() != nil:
		ep := obj.GetEndpoint()
		if ep.GetNetwork() != "" {
			r.Network = ref(ep.GetNetwork())
		}
		r.Groups = refs(ep.GetSecurityGroups())
	case obj.GetNetworkSecurityPolicy() != nil:
		r.AttachGroups = refs(obj.GetNetworkSecurityPolicy().GetAttachGroups())
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
