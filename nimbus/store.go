package nimbus

import (
	"crypto/rand"
	"encoding/hex"
	"hash/maphash"
	"iter"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tidwall/btree"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// objectRecord is one row of the objects table.
type objectRecord struct {
	// Key is the object's key; its strings are those of the object's meta.
	Key nimbusv1.Key
	// id is Key's String form, the key ID, which keys the objects table and orders the
	// status tables (see tables). putObject sets it when it is empty.
	id     string
	Object *nimbusv1.Object
	// genRev is Object's GenerationRevision, which orders the objects by generation
	// revision (see tables.byGenRev); putObject sets it.
	genRev uint64
	// put is the PUT event of Object, shared by the change that stored it, every snapshot
	// that sends it and every status stream, so that its wire form is encoded once. A
	// record a commit stores has it from the start; one restored from disk gets it when
	// first needed (see putEvent), once and atomically.
	put atomic.Pointer[sharedEvent]
	// statusWires holds what status streams that omit objects send of the record, made
	// when first needed.
	wires atomic.Pointer[statusWires]
}

// statusWires is a record's key and the skeleton of its object (see
// nimbusv1.Object.Skeleton), encoded.
type statusWires struct{ key, skeleton []byte }

// statusWires returns the encoded key and skeleton of the record's object, making them
// when no status stream has yet: the skeleton from the object's encoded form, which the
// record's PUT event holds, without decoding it.
func (r *objectRecord) statusWires(encodes *atomic.Uint64) (*statusWires, error) {
	if w := r.wires.Load(); w != nil {
		return w, nil
	}
	key, err := r.Key.Proto().MarshalVT()
	if err != nil {
		return nil, err
	}
	event, err := r.putEvent().encoded(encodes)
	if err != nil {
		return nil, err
	}
	object, err := eventObject(event)
	if err != nil {
		return nil, err
	}
	w := &statusWires{key: key, skeleton: skeletonWire(object)}
	r.wires.CompareAndSwap(nil, w)
	return r.wires.Load(), nil
}

// skeletonFields are the field numbers of Object that its skeleton keeps: meta, with the
// fields of ObjectMeta in meta, and the spec oneof's, whose value it empties.
var skeletonFields = sync.OnceValue(func() (f struct{ meta, spec, metaKept map[protowire.Number]bool }) {
	od := (&nimbusv1.Object{}).ProtoReflect().Descriptor()
	f.meta = map[protowire.Number]bool{od.Fields().ByName("meta").Number(): true}
	f.spec = map[protowire.Number]bool{}
	specs := od.Oneofs().ByName("spec").Fields()
	for i := range specs.Len() {
		f.spec[specs.Get(i).Number()] = true
	}
	md := (&nimbusv1.ObjectMeta{}).ProtoReflect().Descriptor()
	f.metaKept = map[protowire.Number]bool{}
	for _, name := range []protoreflect.Name{"tenant", "namespace", "name", "generation", "revision", "generation_revision"} {
		f.metaKept[md.Fields().ByName(name).Number()] = true
	}
	return f
})

// skeletonWire returns the encoded skeleton of an encoded object (what
// nimbusv1.Object.Skeleton returns, encoded): its meta's key and generation fields, and
// its spec field, empty.
func skeletonWire(object []byte) []byte {
	f := skeletonFields()
	var out []byte
	for b := object; len(b) > 0; {
		num, typ, n := protowire.ConsumeTag(b)
		m := protowire.ConsumeFieldValue(num, typ, b[max(n, 0):])
		if n < 0 || m < 0 {
			break // never: the event was encoded from the object
		}
		switch {
		case f.meta[num] && typ == protowire.BytesType:
			meta, _ := protowire.ConsumeBytes(b[n:])
			var kept []byte
			for mb := meta; len(mb) > 0; {
				mnum, mtyp, mn := protowire.ConsumeTag(mb)
				mm := protowire.ConsumeFieldValue(mnum, mtyp, mb[max(mn, 0):])
				if mn < 0 || mm < 0 {
					break
				}
				if f.metaKept[mnum] {
					kept = append(kept, mb[:mn+mm]...)
				}
				mb = mb[mn+mm:]
			}
			out = protowire.AppendTag(out, num, protowire.BytesType)
			out = protowire.AppendBytes(out, kept)
		case f.spec[num] && typ == protowire.BytesType:
			out = protowire.AppendTag(out, num, protowire.BytesType)
			out = protowire.AppendVarint(out, 0)
		}
		b = b[n+m:]
	}
	return out
}

// putEvent returns the PUT event of the record's object, making it when no change and no
// snapshot has yet.
func (r *objectRecord) putEvent() *sharedEvent {
	if ev := r.put.Load(); ev != nil {
		return ev
	}
	ev := newPutEvent(r.Object)
	if r.put.CompareAndSwap(nil, ev) {
		return ev
	}
	return r.put.Load()
}

// statusRecord is one row of the status table: what one node reported about one object.
type statusRecord struct {
	// Object is the key of the object; its strings are those of the stored object.
	Object nimbusv1.Key
	// objectID is Object's String form, which orders the status tables: putStatus sets it
	// when it is empty, and a record made from its object's record shares that record's.
	objectID string
	Node     string
	Status   *nimbusv1.NodeStatus
	// Origin is the name of the replica the node reported to: this server's
	// Options.ReplicaName for a report of its own agents, a peer's for one that peer
	// pushed (see peer.go). Empty on a server that is no replica.
	Origin string
}

// watchNodeRecord is one row of the watch_nodes table: a node that has opened a watch since
// the server started, on this server or, for a replica, on a peer replica.
type watchNodeRecord struct {
	Name string
	// Streams is how many watch streams of the node are open: on this server, and on the
	// peer replicas whose push streams to this one are alive, which Peers counts apart.
	Streams int
	// Peers holds how many of Streams are open on each peer replica that has some, by
	// replica name; nil when there is none, as on a server that is no replica. It is never
	// modified once stored.
	Peers map[string]int
	// Since is when the node's last open watch stream ended, here or on a peer; it means
	// nothing while Streams is above zero.
	Since time.Time
}

// local returns how many of the node's watch streams are open on this server.
func (r *watchNodeRecord) local() int {
	n := r.Streams
	for _, p := range r.Peers {
		n -= p
	}
	return n
}

// The tables are copy-on-write B-trees (github.com/tidwall/btree): a btree.Map where
// the key is a string, a btree.BTreeG ordered by two fields for the statuses. Objects
// and statuses are ordered by key ID, a string, not by Key: a Map keyed by key IDs finds
// an object at a third to a quarter of the cost of a BTreeG that compares Keys, which
// reads four fields through a pointer for every comparison. A tree's Copy shares every
// node with the tree it copies, and a write to either copies each node it changes the
// first time and changes in place only the nodes it has copied itself, so a commit of
// many changes copies each node it touches once, not a path per change.
//
// Copy is also a write, of the tree it copies: it gives it a new owner id, so that it no
// longer changes the nodes it shares. The trees readers hold are therefore never copied,
// nor written in any other way: the writer keeps a version of its own (store.base), and a
// commit publishes a copy of it. Readers only use the reads that change nothing (Get,
// Ascend, Scan); those read no owner id, and take no lock when the tree has none. So the
// BTreeGs are made without their locks (a Map has none), which readers would otherwise
// take for every read: a published tree is read-only, and the writer's are used under
// store.writeMu.
var treeOptions = btree.Options{NoLocks: true}

// statusTreeOptions are treeOptions with smaller nodes, for the two status tables: the
// reports of a fleet land all over them, each in a node no other write of its transaction
// touches, so a commit copies about a node of each table per status it writes. A node of
// degree 8 holds at most 15 items where one of the default 32 holds 63: a status written
// copies 1.8 KB rather than 2.9 KB in all, for lookups one level deeper
// (BenchmarkStatusTableCommits), and a replica, which commits its peers' reports as well
// as its own agents', makes that much less garbage.
var statusTreeOptions = btree.Options{NoLocks: true, Degree: 8}

// tables is one version of the store: the objects, the statuses the nodes reported, the
// revision and the watch state of the nodes. A published version never changes; its
// methods are the reads, which a write transaction has too.
type tables struct {
	// objects holds the objects by key ID.
	objects *btree.Map[string, *objectRecord]
	// byGenRev holds the same records by generation revision, then key ID: a status
	// watch finds there the objects a node's watermark moved across without a walk of
	// every object.
	byGenRev *btree.BTreeG[*objectRecord]
	// byTarget holds the objects meant for some nodes only (meta.nodes), once for each of
	// their nodes, by node then key ID: a node's snapshot reads its own objects there
	// rather than walk every object, which at fleet scale is most of them another node's.
	byTarget *btree.BTreeG[targetItem]
	// statuses holds the statuses by the hash of their object key ID, then of their node
	// (statusItem): the statuses of an object are adjacent, with those of any other key ID
	// of the same hash.
	statuses *btree.BTreeG[statusItem]
	// statusesByNode holds the same records by the hash of their node, then of their
	// object key ID.
	statusesByNode *btree.BTreeG[statusItem]
	// watchNodes holds the watch state of the nodes by name.
	watchNodes *btree.Map[string, *watchNodeRecord]
	// watermarks holds the status watermarks of the nodes that report one, by node name.
	watermarks *btree.Map[string, *watermarkRecord]
	// claims holds, by index key, the key of the object that holds each value only one
	// object may hold (see conflict.go); putObject and deleteObject keep it current.
	claims *btree.Map[string, nimbusv1.Key]
	// rev is the revision of the last committed change, kept with the objects so that a
	// reader sees the revision that matches exactly the objects it reads.
	rev uint64
	// nodesGen counts the writes that may have changed the target nodes of the objects
	// for every node or which nodes are stale: those of Node objects and of watch_nodes
	// rows that changed whether a node has a watch open or when its last one ended. Two
	// published versions with the same nodesGen have the same of both.
	nodesGen uint64
	// marksGen counts the writes of the watermarks table, and markLog journals the latest
	// of them, for the views to update the index of the watermarks they share
	// (markIndex) rather than read every node's again.
	marksGen uint64
	markLog  *markChange
}

func newTables() *tables {
	return &tables{
		objects: btree.NewMap[string, *objectRecord](0),
		byGenRev: btree.NewBTreeGOptions(func(a, b *objectRecord) bool {
			if a.genRev != b.genRev {
				return a.genRev < b.genRev
			}
			return a.id < b.id
		}, treeOptions),
		byTarget: btree.NewBTreeGOptions(func(a, b targetItem) bool {
			return a.node < b.node || a.node == b.node && a.id < b.id
		}, treeOptions),
		// A status lookup is most of a replica's work. The items hold hashes of the
		// strings they order by, which most comparisons end at, in the tree's nodes,
		// so that they need not load each record.
		statuses: btree.NewBTreeGOptions(func(a, b statusItem) bool {
			if a.first != b.first || a.second != b.second {
				return a.first < b.first || a.first == b.first && a.second < b.second
			}
			if c := strings.Compare(a.rec.objectID, b.rec.objectID); c != 0 {
				return c < 0
			}
			return a.rec.Node < b.rec.Node
		}, statusTreeOptions),
		statusesByNode: btree.NewBTreeGOptions(func(a, b statusItem) bool {
			if a.first != b.first || a.second != b.second {
				return a.first < b.first || a.first == b.first && a.second < b.second
			}
			if c := strings.Compare(a.rec.Node, b.rec.Node); c != 0 {
				return c < 0
			}
			return a.rec.objectID < b.rec.objectID
		}, statusTreeOptions),
		watchNodes: btree.NewMap[string, *watchNodeRecord](0),
		claims:     btree.NewMap[string, nimbusv1.Key](0),
		watermarks: btree.NewMap[string, *watermarkRecord](0),
	}
}

// copy returns a version that shares everything with t; writing either copies what it
// changes. It writes t (see treeOptions): t must not be a version readers hold.
func (t *tables) copy() *tables {
	c := *t
	c.objects = t.objects.Copy()
	c.byGenRev = t.byGenRev.Copy()
	c.byTarget = t.byTarget.Copy()
	c.statuses = t.statuses.Copy()
	c.statusesByNode = t.statusesByNode.Copy()
	c.watchNodes = t.watchNodes.Copy()
	c.claims = t.claims.Copy()
	c.watermarks = t.watermarks.Copy()
	return &c
}

// object returns the record of the object with the key, or nil.
func (t *tables) object(key nimbusv1.Key) *objectRecord {
	return t.objectByID(key.String())
}

// objectByID returns the record of the object with the key ID, or nil.
func (t *tables) objectByID(id string) *objectRecord {
	rec, _ := t.objects.Get(id)
	return rec
}

// objectsOfKind iterates over the objects of a kind, or of every kind with
// KIND_UNSPECIFIED, in key ID order. Key IDs start with the kind's name, so a kind is a
// range of the objects.
func (t *tables) objectsOfKind(kind nimbusv1.Kind) iter.Seq[*objectRecord] {
	return t.objectsAfter(kind, nimbusv1.Key{})
}

// objectsAfter iterates over the objects of a kind, or of every kind with
// KIND_UNSPECIFIED, whose keys come after the key after, in key ID order; every one of
// them when after is the zero Key.
func (t *tables) objectsAfter(kind nimbusv1.Kind, after nimbusv1.Key) iter.Seq[*objectRecord] {
	return func(yield func(*objectRecord) bool) {
		// The key IDs of a kind's objects start with its name and a '/'; the zero Key
		// comes before every object.
		prefix, from := "", ""
		if kind != nimbusv1.Kind_KIND_UNSPECIFIED {
			prefix = kind.Name() + "/"
		}
		if !after.IsZero() {
			from = after.String()
		}
		t.objects.Ascend(max(from, prefix), func(id string, rec *objectRecord) bool {
			if id == from {
				return true
			}
			return strings.HasPrefix(id, prefix) && yield(rec)
		})
	}
}

// objectsInSpans iterates over the objects whose generation revision is in one of the
// spans, which are sorted and do not overlap (see mergeSpans), in generation revision
// order.
func (t *tables) objectsInSpans(spans []revSpan) iter.Seq[*objectRecord] {
	return func(yield func(*objectRecord) bool) {
		for _, span := range spans {
			more := true
			t.byGenRev.Ascend(&objectRecord{genRev: span.lo + 1}, func(rec *objectRecord) bool {
				if rec.genRev > span.hi {
					return false
				}
				more = yield(rec)
				return more
			})
			if !more {
				return
			}
		}
	}
}

// revision returns the revision of the last committed change in t.
func (t *tables) revision() uint64 { return t.rev }

// objectsOnly returns a version with t's objects and revision alone, for a read that
// needs nothing else and may last long, such as a watch's snapshot, which takes minutes
// to reach a slow node: it keeps none of t's statuses, watermarks and watch state from
// being freed meanwhile. Its other reads must not be used.
func (t *tables) objectsOnly() *tables {
	return &tables{objects: t.objects, byTarget: t.byTarget, rev: t.rev}
}

// targetItem is an entry of the byTarget table: an object meant for the node, with its
// key ID, which orders the table with the node.
type targetItem struct {
	node, id string
	rec      *objectRecord
}

// objectsFor iterates over the objects whose meta.nodes names the node, in key ID order.
// The objects meant for every node are not among them.
func (t *tables) objectsFor(node string) iter.Seq[*objectRecord] {
	return func(yield func(*objectRecord) bool) {
		t.byTarget.Ascend(targetItem{node: node}, func(it targetItem) bool {
			return it.node == node && yield(it.rec)
		})
	}
}

// statusesOf returns the statuses stored for the object with the key, ordered by node.
func (t *tables) statusesOf(key nimbusv1.Key) []*statusRecord {
	return t.statusesOfID(key.String())
}

// statusesOfID returns the statuses stored for the object with the key ID, ordered by
// node.
func (t *tables) statusesOfID(id string) []*statusRecord {
	var recs []*statusRecord
	h := stringHash(id)
	t.statuses.Ascend(statusItem{first: h, rec: &statusRecord{}}, func(it statusItem) bool {
		if it.first != h {
			return false
		}
		if it.rec.objectID == id { // not another key ID of the same hash
			recs = append(recs, it.rec)
		}
		return true
	})
	// By node: the table holds an object's records by their nodes' hashes.
	slices.SortFunc(recs, func(a, b *statusRecord) int { return strings.Compare(a.Node, b.Node) })
	return recs
}

// statusesBy returns the statuses the node reported, in no particular order: its callers
// delete them, and it runs at every move of the node's watermark.
func (t *tables) statusesBy(node string) []*statusRecord {
	var recs []*statusRecord
	h := stringHash(node)
	t.statusesByNode.Ascend(statusItem{first: h, rec: &statusRecord{}}, func(it statusItem) bool {
		if it.first != h {
			return false
		}
		if it.rec.Node == node { // not another node of the same hash
			recs = append(recs, it.rec)
		}
		return true
	})
	return recs
}

// nodeStatus returns the status the node reported about the object with the key, or nil.
func (t *tables) nodeStatus(key nimbusv1.Key, node string) *statusRecord {
	return t.nodeStatusID(key.String(), node)
}

// nodeStatusID returns the status the node reported about the object with the key ID,
// or nil.
func (t *tables) nodeStatusID(id, node string) *statusRecord {
	it, _ := t.statuses.Get(statusItem{first: stringHash(id), second: stringHash(node), rec: &statusRecord{objectID: id, Node: node}})
	return it.rec
}

// allStatuses iterates over every stored status, an object's together.
func (t *tables) allStatuses() iter.Seq[*statusRecord] {
	return func(yield func(*statusRecord) bool) {
		t.statuses.Scan(func(it statusItem) bool { return yield(it.rec) })
	}
}

// hasStatusFrom tells whether a status the node reported is stored.
func (t *tables) hasStatusFrom(node string) bool {
	found := false
	h := stringHash(node)
	t.statusesByNode.Ascend(statusItem{first: h, rec: &statusRecord{}}, func(it statusItem) bool {
		found = it.rec.Node == node
		return it.first == h && !found
	})
	return found
}

// watchNode returns the watch_nodes row of the node, or nil when nothing keeps one.
func (t *tables) watchNode(node string) *watchNodeRecord {
	rec, _ := t.watchNodes.Get(node)
	return rec
}

// allWatchNodes iterates over the watch_nodes rows in name order.
func (t *tables) allWatchNodes() iter.Seq[*watchNodeRecord] {
	return func(yield func(*watchNodeRecord) bool) {
		t.watchNodes.Scan(func(_ string, rec *watchNodeRecord) bool { return yield(rec) })
	}
}

// store is the in-memory store, in versions (tables) that never change once published.
// A read takes the published version without a lock and sees one committed state however
// long it takes, whatever commits meanwhile. A write works on a copy of the last version,
// which shares every tree node with it, and its commit publishes it; one write runs at a
// time, and one that is aborted leaves nothing.
type store struct {
	// writeMu is held by the write transaction under way. It guards base.
	writeMu sync.Mutex
	// base is the writer's own copy of the published version, which no reader holds: a
	// write copies it, and its commit replaces it (see treeOptions).
	base *tables
	// published is the version reads see.
	published atomic.Pointer[tables]
	// everyNodes holds the target nodes of the objects for every node as the views of the
	// latest nodesGen that read them found them; see view.everyNode.
	everyNodes atomic.Pointer[everyNodeNames]
	// marks holds the latest index of the watermarks of those nodes that a view made;
	// see view.markIndex.
	marks atomic.Pointer[markIndex]
}

// everyNodeNames is the sorted target nodes of the objects for every node in the versions
// with nodesGen gen. It is never modified.
type everyNodeNames struct {
	gen   uint64
	names []string
}

// cachedEveryNode returns the target nodes cached for nodesGen gen, or nil.
func (st *store) cachedEveryNode(gen uint64) ([]string, bool) {
	if c := st.everyNodes.Load(); c != nil && c.gen == gen {
		return c.names, true
	}
	return nil, false
}

// cacheEveryNode caches names as the target nodes for nodesGen gen, unless those of a
// later gen are cached.
func (st *store) cacheEveryNode(gen uint64, names []string) {
	next := &everyNodeNames{gen: gen, names: names}
	for {
		cur := st.everyNodes.Load()
		if cur != nil && cur.gen >= gen {
			return
		}
		if st.everyNodes.CompareAndSwap(cur, next) {
			return
		}
	}
}

func newStore() *store {
	st := &store{base: newTables()}
	st.published.Store(st.base.copy())
	return st
}

// read returns the last committed version of the store, which the caller must not
// modify. It takes no lock.
func (st *store) read() *tables { return st.published.Load() }

// write starts a write transaction, waiting for the one under way to end. Its reads see
// its own writes. The caller must end it with commit or abort; abort is safe to defer
// after commit.
func (st *store) write() *writeTxn {
	st.writeMu.Lock()
	return &writeTxn{tables: st.base.copy(), st: st}
}

// writeTxn is a write transaction of the store.
type writeTxn struct {
	// tables is the version the transaction writes; nil once it ended.
	*tables
	st *store
}

// commit publishes what the transaction wrote, for every read that starts from now on.
func (w *writeTxn) commit() {
	st := w.st
	st.base = w.tables
	st.published.Store(w.tables.copy())
	w.tables = nil
	st.writeMu.Unlock()
}

// abort ends the transaction without publishing anything it wrote. It does nothing after
// commit or abort.
func (w *writeTxn) abort() {
	if w.tables == nil {
		return
	}
	w.tables = nil
	w.st.writeMu.Unlock()
}

// putObject stores the record, replacing the one with its key, and moves the claims of
// the object replaced to the new one. It sets the record's id when it is empty. The
// record and its object must not be modified afterwards.
func (w *writeTxn) putObject(rec *objectRecord) {
	if rec.id == "" {
		rec.id = rec.Key.String()
	}
	rec.genRev = rec.Object.GenerationRevision()
	nodes := rec.Object.GetMeta().GetNodes()
	if old, replaced := w.objects.Set(rec.id, rec); replaced {
		w.byGenRev.Delete(old)
		w.releaseClaims(old)
		if oldNodes := old.Object.GetMeta().GetNodes(); !slices.Equal(oldNodes, nodes) {
			w.untarget(old)
		}
	}
	w.byGenRev.Set(rec)
	w.addClaims(rec)
	// Setting an item replaces the one of the same node and key ID.
	for _, n := range nodes {
		w.byTarget.Set(targetItem{node: n, id: rec.id, rec: rec})
	}
	if rec.Key.Kind == nimbusv1.Kind_KIND_NODE {
		w.nodesGen++
	}
}

// deleteObject deletes the object with the key and its claims, but not its statuses.
func (w *writeTxn) deleteObject(key nimbusv1.Key) { w.deleteObjectID(key.String()) }

// deleteObjectID deletes the object with the key ID and its claims, but not its statuses.
func (w *writeTxn) deleteObjectID(id string) {
	if old, deleted := w.objects.Delete(id); deleted {
		w.byGenRev.Delete(old)
		w.releaseClaims(old)
		w.untarget(old)
		if old.Key.Kind == nimbusv1.Kind_KIND_NODE {
			w.nodesGen++
		}
	}
}

// untarget deletes the record's entries of the byTarget table.
func (w *writeTxn) untarget(rec *objectRecord) {
	for _, n := range rec.Object.GetMeta().GetNodes() {
		w.byTarget.Delete(targetItem{node: n, id: rec.id})
	}
}

// setRevision records rev as the revision of the transaction's last change.
func (w *writeTxn) setRevision(rev uint64) { w.rev = rev }

// statusItem is a status record as the status tables hold it: with the hashes of the
// strings it is ordered by, first and second, beside it.
type statusItem struct {
	first, second uint64
	rec           *statusRecord
}

// byObject returns the record's item of the statuses table, by object then node.
func byObject(rec *statusRecord) statusItem {
	return statusItem{first: stringHash(rec.objectID), second: stringHash(rec.Node), rec: rec}
}

// byNode returns the record's item of the statusesByNode table, by node then object.
func byNode(rec *statusRecord) statusItem {
	return statusItem{first: stringHash(rec.Node), second: stringHash(rec.objectID), rec: rec}
}

// statusSeed seeds stringHash: the order it gives the status tables lasts as long as the
// process, as the tables do.
var statusSeed = maphash.MakeSeed()

// stringHash returns the hash of s that orders the status tables.
func stringHash(s string) uint64 { return maphash.String(statusSeed, s) }

// putStatus stores the record, replacing the one of its object and node. It sets the
// record's objectID when it is empty. The record and its status must not be modified
// afterwards.
func (w *writeTxn) putStatus(rec *statusRecord) {
	if rec.objectID == "" {
		rec.objectID = rec.Object.String()
	}
	w.statuses.Set(byObject(rec))
	w.statusesByNode.Set(byNode(rec))
}

// deleteStatus deletes the status of the record's object and node.
func (w *writeTxn) deleteStatus(rec *statusRecord) {
	w.statuses.Delete(byObject(rec))
	w.statusesByNode.Delete(byNode(rec))
}

// putWatchNode stores the record, replacing the one of its node. The record must not be
// modified afterwards.
func (w *writeTxn) putWatchNode(rec *watchNodeRecord) {
	old, replaced := w.watchNodes.Set(rec.Name, rec)
	if !replaced || (old.Streams > 0) != (rec.Streams > 0) || (rec.Streams == 0 && !old.Since.Equal(rec.Since)) {
		w.nodesGen++
	}
}

// deleteWatchNode deletes the watch_nodes row of the node.
func (w *writeTxn) deleteWatchNode(node string) {
	if _, deleted := w.watchNodes.Delete(node); deleted {
		w.nodesGen++
	}
}

// newUUID returns a random UUID, version 4, in its canonical text form.
func newUUID() string {
	var b [16]byte
	rand.Read(b[:]) // never fails; see crypto/rand.Read
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	var out [36]byte
	hex.Encode(out[0:8], b[0:4])
	hex.Encode(out[9:13], b[4:6])
	hex.Encode(out[14:18], b[6:8])
	hex.Encode(out[19:23], b[8:10])
	hex.Encode(out[24:36], b[10:16])
	out[8], out[13], out[18], out[23] = '-', '-', '-', '-'
	return string(out[:])
}
