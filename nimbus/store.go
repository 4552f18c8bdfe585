package nimbus

import (
	"cmp"
	"crypto/rand"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-memdb"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// Table and index names of the store.
const (
	tableObjects    = "objects"
	tableStatus     = "status"
	tableRevision   = "revision"
	tableWatchNodes = "watch_nodes"

	indexID   = "id"
	indexNode = "node"

	// revisionRowID is the ID of the single row of the revision table.
	revisionRowID = "current"
)

// objectRecord is one row of the objects table.
type objectRecord struct {
	// ID is the object's key ID, "Kind/tenant/namespace/name".
	ID     string
	Object *nimbusv1.Object
	// put is the PUT event of Object, shared by the change that stored it, every snapshot
	// that sends it and every status stream, so that its wire form is encoded once. A
	// record a commit stores has it from the start; one restored from disk gets it when
	// first needed (see putEvent), once and atomically.
	put atomic.Pointer[sharedEvent]
}

// putEvent returns the PUT event of the record's object, making it when no change and no
// snapshot has yet.
func (r *objectRecord) putEvent(epoch string) *sharedEvent {
	if ev := r.put.Load(); ev != nil {
		return ev
	}
	ev := newPutEvent(epoch, r.Object)
	if r.put.CompareAndSwap(nil, ev) {
		return ev
	}
	return r.put.Load()
}

// statusRecord is one row of the status table: what one node reported about one object.
type statusRecord struct {
	// ID is statusID of the object's key ID and Node.
	ID     string
	Node   string
	Status *nimbusv1.NodeStatus
}

// revisionRecord is the single row of the revision table. Keeping the revision in the store
// lets a reader see the revision that matches exactly the objects it reads.
type revisionRecord struct {
	ID       string
	Revision uint64
}

// watchNodeRecord is one row of the watch_nodes table: a node that has opened a watch since
// the server started.
type watchNodeRecord struct {
	Name string
	// Streams is how many watch streams of the node are open.
	Streams int
	// Since is when the node's last open watch stream ended; it means nothing while Streams
	// is above zero.
	Since time.Time
}

func schema() *memdb.DBSchema {
	id := func(field string) *memdb.IndexSchema {
		return &memdb.IndexSchema{Name: indexID, Unique: true, Indexer: &memdb.StringFieldIndex{Field: field}}
	}
	return &memdb.DBSchema{Tables: map[string]*memdb.TableSchema{
		tableObjects: {
			Name: tableObjects,
			Indexes: map[string]*memdb.IndexSchema{
				indexID: id("ID"),
			},
		},
		tableStatus: {
			Name: tableStatus,
			Indexes: map[string]*memdb.IndexSchema{
				indexID:   id("ID"),
				indexNode: {Name: indexNode, Indexer: &memdb.StringFieldIndex{Field: "Node"}},
			},
		},
		tableRevision: {
			Name:    tableRevision,
			Indexes: map[string]*memdb.IndexSchema{indexID: id("ID")},
		},
		tableWatchNodes: {
			Name:    tableWatchNodes,
			Indexes: map[string]*memdb.IndexSchema{indexID: id("Name")},
		},
	}}
}

func newDB() (*memdb.MemDB, error) {
	return memdb.NewMemDB(schema())
}

// statusID is the status table's ID of a node's status of an object. With node "" it is
// the prefix of the IDs of every status of the object: key IDs hold no NUL, so the
// statuses of an object are a prefix scan of the id index, with no index of their own.
func statusID(keyID, node string) string { return keyID + "\x00" + node }

// getObject returns the stored object with the key ID, or nil.
func getObject(txn *memdb.Txn, id string) (*nimbusv1.Object, error) {
	rec, err := getRecord(txn, id)
	if rec == nil {
		return nil, err
	}
	return rec.Object, nil
}

// getRecord returns the record of the object with the key ID, or nil.
func getRecord(txn *memdb.Txn, id string) (*objectRecord, error) {
	raw, err := txn.First(tableObjects, indexID, id)
	if err != nil {
		return nil, fmt.Errorf("reading object %s: %w", id, err)
	}
	if raw == nil {
		return nil, nil
	}
	return raw.(*objectRecord), nil
}

// objectsOfKind iterates over the objects of a kind in key ID order. Key IDs start with
// the kind's name, so it is a prefix scan of the id index: a kind index would cost every
// object one more radix path.
func objectsOfKind(txn *memdb.Txn, kind nimbusv1.Kind) (memdb.ResultIterator, error) {
	return txn.Get(tableObjects, indexID+"_prefix", kind.Name()+"/")
}

// putObject stores obj, which the caller must not modify afterwards.
func putObject(txn *memdb.Txn, id string, obj *nimbusv1.Object) error {
	if err := txn.Insert(tableObjects, &objectRecord{ID: id, Object: obj}); err != nil {
		return fmt.Errorf("storing object %s: %w", id, err)
	}
	return nil
}

// currentRevision returns the revision of the last committed change the transaction sees.
func currentRevision(txn *memdb.Txn) (uint64, error) {
	raw, err := txn.First(tableRevision, indexID, revisionRowID)
	if err != nil {
		return 0, fmt.Errorf("reading revision: %w", err)
	}
	if raw == nil {
		return 0, nil
	}
	return raw.(*revisionRecord).Revision, nil
}

// setRevision records rev as the revision of the transaction's change.
func setRevision(txn *memdb.Txn, rev uint64) error {
	if err := txn.Insert(tableRevision, &revisionRecord{ID: revisionRowID, Revision: rev}); err != nil {
		return fmt.Errorf("storing revision %d: %w", rev, err)
	}
	return nil
}

// statusesOf returns the statuses stored for the object with the key ID, ordered by node.
func statusesOf(txn *memdb.Txn, id string) ([]*statusRecord, error) {
	it, err := txn.Get(tableStatus, indexID+"_prefix", statusID(id, ""))
	if err != nil {
		return nil, fmt.Errorf("reading statuses of %s: %w", id, err)
	}
	var recs []*statusRecord
	for raw := it.Next(); raw != nil; raw = it.Next() {
		recs = append(recs, raw.(*statusRecord))
	}
	slices.SortFunc(recs, func(a, b *statusRecord) int { return cmp.Compare(a.Node, b.Node) })
	return recs, nil
}

// dropStatuses deletes the statuses of the object with the key ID whose node keep rejects.
func dropStatuses(txn *memdb.Txn, id string, keep func(node string) bool) error {
	recs, err := statusesOf(txn, id)
	if err != nil {
		return err
	}
	for _, r := range recs {
		if keep(r.Node) {
			continue
		}
		if err := txn.Delete(tableStatus, r); err != nil {
			return fmt.Errorf("deleting status of %s on node %s: %w", id, r.Node, err)
		}
	}
	return nil
}

// getWatchNode returns the watch_nodes row of the node, or nil when the node has never
// watched.
func getWatchNode(txn *memdb.Txn, node string) (*watchNodeRecord, error) {
	raw, err := txn.First(tableWatchNodes, indexID, node)
	if err != nil {
		return nil, fmt.Errorf("reading watch state of node %s: %w", node, err)
	}
	if raw == nil {
		return nil, nil
	}
	return raw.(*watchNodeRecord), nil
}

// newUUID returns a random UUID, version 4, in its canonical text form.
func newUUID() string {
	var b [16]byte
	rand.Read(b[:]) // never fails; see crypto/rand.Read
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
