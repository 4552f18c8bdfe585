package delphi

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
	"weak"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/tidwall/btree"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/naplesnet/naples/internal/statefile"
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

// record is one row of the desired table: the object in wire form, which Get decodes
// afresh for each reader, and what the table's indexes and metrics need of it, computed
// once when the record is made. An object in wire form takes a quarter of the heap of the
// decoded one, and a store holds many more objects than its readers decode at a time.
type record struct {
	// key is the object's key, with strings of its own.
	key nimbusv1.Key
	// row holds, in one string, the length of the object's data as a uvarint, the data
	// and the values the declared indexes list the object under (see encodeRow): one
	// allocation and 16 bytes of the record, so that a record fits 80 bytes, where a
	// string of each took two and 32. data and indexed read it.
	row string
	// decoded points weakly to the object as last decoded: readers share it while any of
	// them holds it, and the collector frees it once none does.
	decoded atomic.Pointer[weak.Pointer[nimbusv1.Object]]
}

// data returns the object, serialized deterministically, less what the key gives back
// (see encodeRow): an equal object has equal data. unmarshal decodes it.
func (r *record) data() string {
	size, n := stringUvarint(r.row)
	if size > uint64(len(r.row)-n) {
		return "" // never: encodeRow wrote it
	}
	return r.row[n : n+int(size)]
}

// indexed returns the values the declared indexes list the object under, in one string:
// the length of its header as a uvarint; the header, for each value the position of its
// index in Options.Indexes, its offset in the rest and its length, as uvarints; and the
// rest, where a value that another one holds, or begins with what another ends with,
// shares its bytes (see appendIndexed). The index entries find their values in it by
// offset, and an endpoint's network key ID, part of three of its values, is held once. ""
// when none.
func (r *record) indexed() string {
	size, n := stringUvarint(r.row)
	if size > uint64(len(r.row)-n) {
		return "" // never: encodeRow wrote it
	}
	return r.row[n+int(size):]
}

// The fields of an object's meta that a record's data may leave out, since its key gives
// them back, as encodeRow marks them in the data's first byte.
const (
	leftTenant byte = 1 << iota
	leftNamespace
	leftName
)

// encodeRow returns the row of the record of obj, whose key is key, and whose index
// values are laid out in indexed (see record.row). Its data is obj serialized
// deterministically, less its meta's tenant, namespace and name where they equal key's,
// after a byte that marks which it left out (1 to 7, where a wire form starts with a
// field's tag, 8 at least). So the record does not hold its key twice: an endpoint's
// data takes some 125 bytes where it took 152.
func encodeRow(obj *nimbusv1.Object, key *nimbusv1.Key, indexed []byte) ([]byte, error) {
	data, err := marshalDeterministic(obj)
	if err != nil {
		return nil, err
	}
	var left byte
	m := obj.GetMeta()
	for i, f := range [...][2]string{{m.GetTenant(), key.Tenant}, {m.GetNamespace(), key.Namespace}, {m.GetName(), key.Name}} {
		if f[0] != "" && f[0] == f[1] {
			left |= 1 << i
		}
	}
	// The meta is the first field of the deterministic form, ObjectMeta's field 1 to 3
	// the first of the meta's.
	num, typ, n := protowire.ConsumeTag(data)
	if left != 0 && num == 1 && typ == protowire.BytesType {
		if meta, k := protowire.ConsumeBytes(data[n:]); k >= 0 {
			return leaveOut(data[:n], meta, data[n+k:], left, indexed), nil
		}
	}
	return append(append(newRow(len(data), indexed), data...), indexed...), nil
}

// marshalDeterministic returns obj serialized deterministically, equal objects to equal
// bytes. The generated encoder (MarshalVT) writes the fields in order, as proto.Marshal
// does, but a map's entries in Go's random order: an object whose spec holds no map is
// encoded with it, three to four times faster, and the entries of its meta's labels
// sorted by key afterwards; any other with proto.Marshal's deterministic mode.
func marshalDeterministic(obj *nimbusv1.Object) ([]byte, error) {
	if specHasMap()[obj.Kind()] {
		return proto.MarshalOptions{Deterministic: true}.Marshal(obj)
	}
	data, err := obj.MarshalVT()
	if err != nil || len(obj.GetMeta().GetLabels()) <= 1 {
		return data, err
	}
	// The meta is the first field.
	num, typ, n := protowire.ConsumeTag(data)
	if num == 1 && typ == protowire.BytesType {
		if meta, k := protowire.ConsumeBytes(data[n:]); k >= 0 && sortLabels(meta) {
			return data, nil
		}
	}
	return proto.MarshalOptions{Deterministic: true}.Marshal(obj) // never
}

// labelsField is the field number of ObjectMeta's labels.
const labelsField = 7

// sortLabels sorts, in place, the entries of the labels in an encoded ObjectMeta by key,
// as proto.Marshal's deterministic mode orders them. It reports false, having changed
// nothing, when the entries are not all in one run, as the generated encoder writes them.
func sortLabels(meta []byte) bool {
	type entry struct {
		key  []byte
		wire []byte
	}
	// A few labels, as most objects have, sort without a heap allocation.
	var (
		room       [8]entry
		entries    = room[:0]
		start, end = -1, -1
	)
	for off := 0; off < len(meta); {
		num, typ, n := protowire.ConsumeTag(meta[off:])
		if n < 0 {
			return false
		}
		m := protowire.ConsumeFieldValue(num, typ, meta[off+n:])
		if m < 0 {
			return false
		}
		if num == labelsField {
			if start < 0 {
				start = off
			} else if end != off {
				return false // a second run
			}
			e, _ := protowire.ConsumeBytes(meta[off+n:])
			entries = append(entries, entry{key: entryKey(e), wire: meta[off : off+n+m]})
			end = off + n + m
		}
		off += n + m
	}
	if len(entries) < 2 {
		return true
	}
	if slices.IsSortedFunc(entries, func(a, b entry) int { return bytes.Compare(a.key, b.key) }) {
		return true
	}
	slices.SortFunc(entries, func(a, b entry) int { return bytes.Compare(a.key, b.key) })
	var buf [512]byte
	sorted := buf[:0]
	if end-start > len(buf) {
		sorted = make([]byte, 0, end-start)
	}
	for _, e := range entries {
		sorted = append(sorted, e.wire...)
	}
	copy(meta[start:end], sorted)
	return true
}

// entryKey returns the key, field 1, of an encoded map entry.
func entryKey(e []byte) []byte {
	for len(e) > 0 {
		num, typ, n := protowire.ConsumeTag(e)
		if n < 0 {
			return nil
		}
		if num == 1 && typ == protowire.BytesType {
			k, _ := protowire.ConsumeBytes(e[n:])
			return k
		}
		m := protowire.ConsumeFieldValue(num, typ, e[n:])
		if m < 0 {
			return nil
		}
		e = e[n+m:]
	}
	return nil
}

// specHasMap tells, per kind, whether its spec holds a map field, at any depth.
var specHasMap = sync.OnceValue(func() map[nimbusv1.Kind]bool {
	has := map[nimbusv1.Kind]bool{}
	for _, k := range nimbusv1.Kinds() {
		has[k] = holdsMap(k.SpecDescriptor(), map[protoreflect.FullName]bool{})
	}
	return has
})

// holdsMap tells whether the message has a map field, itself or in a message it holds;
// seen guards against recursive messages.
func holdsMap(md protoreflect.MessageDescriptor, seen map[protoreflect.FullName]bool) bool {
	if md == nil || seen[md.FullName()] {
		return false
	}
	seen[md.FullName()] = true
	fields := md.Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		if fd.IsMap() || (fd.Message() != nil && holdsMap(fd.Message(), seen)) {
			return true
		}
	}
	return false
}

// newRow returns a row made to hold data of a size and indexed, that holds the size.
func newRow(size int, indexed []byte) []byte {
	b := make([]byte, 0, uvarintLen(uint64(size))+size+len(indexed))
	return binary.AppendUvarint(b, uint64(size))
}

// leaveOut returns the row of the object serialized as tag, meta and rest, where meta is
// the value of the field of tag, less the fields of meta that left marks, and indexed.
func leaveOut(tag, meta, rest []byte, left byte, indexed []byte) []byte {
	kept := func(yield func([]byte) bool) {
		for b := meta; len(b) > 0; {
			num, typ, n := protowire.ConsumeTag(b)
			m := protowire.ConsumeFieldValue(num, typ, b[max(n, 0):])
			if n < 0 || m < 0 {
				return // never
			}
			if num > 3 || typ != protowire.BytesType || left&(1<<(num-1)) == 0 {
				if !yield(b[:n+m]) {
					return
				}
			}
			b = b[n+m:]
		}
	}
	size := 0
	for f := range kept {
		size += len(f)
	}
	out := newRow(1+len(tag)+protowire.SizeVarint(uint64(size))+size+len(rest), indexed)
	out = append(out, left)
	out = append(out, tag...)
	out = protowire.AppendVarint(out, uint64(size))
	for f := range kept {
		out = append(out, f...)
	}
	return append(append(out, rest...), indexed...)
}

// wire returns the wire form in the record's data, which the caller must not change,
// and which of the meta's fields it leaves out.
func (r *record) wire() ([]byte, byte) {
	data := r.data()
	b := unsafe.Slice(unsafe.StringData(data), len(data))
	if len(b) > 0 && b[0] <= leftTenant|leftNamespace|leftName {
		return b[1:], b[0]
	}
	return b, 0
}

// unmarshal decodes the record's object into obj, which is empty.
func (r *record) unmarshal(obj *nimbusv1.Object) error {
	b, left := r.wire()
	// The generated decoder, its strings views of the row rather than copies: the row is a
	// string, never changed, which they keep alive while they live; and the bytes are what
	// newRecord encoded, so their strings were checked then. An object has no bytes
	// field, which would be a view readers could write through.
	if err := obj.UnmarshalVTUnsafe(b); err != nil {
		return err
	}
	if left == 0 {
		return nil
	}
	if obj.Meta == nil {
		obj.Meta = &nimbusv1.ObjectMeta{}
	}
	if left&leftTenant != 0 {
		obj.Meta.Tenant = r.key.Tenant
	}
	if left&leftNamespace != 0 {
		obj.Meta.Namespace = r.key.Namespace
	}
	if left&leftName != 0 {
		obj.Meta.Name = r.key.Name
	}
	return nil
}

// indexedValues returns the values the record is listed under, each with the position
// of its index in Options.Indexes, in that order; each value is a part of r.indexed().
func (r *record) indexedValues() iter.Seq2[int, string] {
	return func(yield func(int, string) bool) {
		for pos, e := range r.indexEntries() {
			if !yield(pos, e.val()) {
				return
			}
		}
	}
}

// indexEntries returns the entries that list the record in the declared indexes, each
// with the position of its index in Options.Indexes, in the order of its values.
func (r *record) indexEntries() iter.Seq2[int, indexEntry] {
	return func(yield func(int, indexEntry) bool) {
		indexed := r.indexed()
		size, n := stringUvarint(indexed)
		if n == 0 || size > uint64(len(indexed)-n) {
			return // none, or never: newRecord wrote it
		}
		header, values := indexed[n:n+int(size)], indexed[n+int(size):]
		base := uint64(len(r.row) - len(values))
		for len(header) > 0 {
			var v [3]uint64
			for i := range v {
				x, m := stringUvarint(header)
				if m == 0 {
					return // never
				}
				v[i], header = x, header[m:]
			}
			pos, off, size := v[0], v[1], v[2]
			if off > uint64(len(values)) || size > uint64(len(values))-off {
				return // never
			}
			if !yield(int(pos), indexEntry{rec: r, at: uint32(base + off), size: uint32(size)}) {
				return
			}
		}
	}
}

// stringUvarint reads a uvarint at the start of s and returns it and its length, 0 when
// s does not start with one.
func stringUvarint(s string) (uint64, int) {
	var v uint64
	for i := 0; i < len(s) && i < binary.MaxVarintLen64; i++ {
		b := s[i]
		v |= uint64(b&0x7f) << (7 * i)
		if b < 0x80 {
			return v, i + 1
		}
	}
	return 0, 0
}

// indexEntry is an entry of a declared index: rec, and where the value it lists rec
// under is in rec's row, 16 bytes where the value's string and rec took 24. An index is
// ordered by value and then by key. A probe, which searches an index for a value, has a
// record of its own whose row is the value (probeEntry).
type indexEntry struct {
	rec      *record
	at, size uint32
}

// probeAt is the at of a probe.
const probeAt = ^uint32(0)

// probeEntry returns the entry that searches an index for value: it sorts before every
// entry of the value.
func probeEntry(value string) indexEntry {
	return indexEntry{rec: &record{row: value}, at: probeAt}
}

// val returns the value the entry lists its record under.
func (e indexEntry) val() string {
	if e.at == probeAt {
		return e.rec.row
	}
	return e.rec.row[e.at : e.at+e.size]
}

// desiredState is one committed state of the desired table, with the resume point: the
// records by key, each declared index, and where the table stands at nimbus. It is
// never changed once published; the writer derives the next one from a version of its
// own (see treeOptions).
type desiredState struct {
	byID    *idTree
	indexes []*indexTree
	// hasResume tells that a resume point was ever recorded.
	hasResume bool
	epoch     string
	revision  uint64
}

// Index is a secondary index of the desired table, declared by the code that looks objects
// up by it: a reconciler that needs to find objects by some derived value declares an
// Index, and a new kind adds its indexes without editing the store.
type Index struct {
	// Name names the index in Lookup. Required; unique among a store's indexes, and not
	// one of the built-in "id" and "kind".
	Name string
	// Values returns the values under which obj is listed; none leaves it out of the index.
	// It must depend on obj alone. Required.
	Values func(obj *nimbusv1.Object) []string
}

// checkIndexes checks the declarations of Options.Indexes.
func checkIndexes(indexes []Index) error {
	names := map[string]bool{"id": true, "kind": true}
	for i, ix := range indexes {
		switch {
		case ix.Name == "":
			return fmt.Errorf("Options.Indexes[%d].Name: is required", i)
		case ix.Values == nil:
			return fmt.Errorf("Options.Indexes[%d].Values (index %q): is required", i, ix.Name)
		case names[ix.Name]:
			return fmt.Errorf("Options.Indexes[%d].Name %q: index declared twice or built in", i, ix.Name)
		}
		names[ix.Name] = true
	}
	return nil
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
	log     *slog.Logger
	indexes []Index
	metrics *metrics

	// desired is the committed state of the desired table. Readers load it and read a
	// state that no one changes; writers publish the next one under writeMu.
	desired atomic.Pointer[desiredState]

	// writeMu serializes write transactions together with their writes to disk and the
	// notification of their subscribers, so that the file follows commit order and
	// subscribers see commits in commit order. It also guards disk, work, base and the
	// unregistering of metrics against Close.
	writeMu sync.Mutex
	disk    *disk // nil without Options.Dir
	// work is the writer's own version of the desired table: a write transaction changes
	// it in place, and a commit publishes a copy of it. base is a copy of the committed
	// state, which work starts over from after a failed transaction. Readers hold
	// neither.
	work, base *desiredState

	// statusMu guards statuses, the status table. Statuses are many, small, rewritten
	// often and never kept on disk, so they live in plain maps rather than in versions
	// of a table that each write would copy. Writers also hold writeMu.
	statusMu sync.RWMutex
	statuses nimbusv1.KeyMap[storedStatus]

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
	if err := checkIndexes(opts.Indexes); err != nil {
		return nil, fmt.Errorf("delphi: %w", err)
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	s := &Store{
		log:     log,
		indexes: opts.Indexes,
		subs:    make(map[*Subscription]struct{}),
		synced:  make(chan struct{}),
	}
	s.commitLocked(s.buildState(nil))
	reg := opts.Registerer
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	var err error
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
	objects := len(r.objects)
	r.objects = nil
	// The file's pages were all read once, to restore; from now on a commit reads a few.
	if err := d.release(); err != nil {
		log.Debug("state file pages stay resident", "path", path, "err", err)
	}
	if s.metrics, err = newMetrics(s, reg); err != nil {
		d.close()
		return nil, fmt.Errorf("opening delphi: %w", err)
	}
	s.disk = d
	epoch, rev := s.Resume()
	switch {
	case objects > 0 || r.resume != nil:
		close(s.synced)
		log.Info("restored desired state", "path", path, "objects", objects, "epoch", epoch, "revision", rev)
	case r.fromFile:
		log.Info("no desired state stored; starting empty", "path", path)
	default:
		log.Info("created state file", "path", path)
	}
	return s, nil
}

// restore loads what the state file held into the desired table. The objects are
// encoded again, deterministically, by as many goroutines as may run at once.
func (s *Store) restore(r *restored) error {
	recs := make([]*record, len(r.objects))
	errs := make([]error, len(r.objects))
	workers := min(runtime.GOMAXPROCS(0), len(r.objects)/1000+1)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := w; i < len(r.objects); i += workers {
				recs[i], errs[i] = s.newRecord(r.objects[i])
				r.objects[i] = nil // garbage from here on, for the collector
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("restoring desired objects: %w", err)
	}
	slices.SortFunc(recs, func(a, b *record) int { return compareKeys(&a.key, &b.key) })
	for i := 1; i < len(recs); i++ {
		if recs[i].key == recs[i-1].key {
			return fmt.Errorf("restoring %s: %w: stored twice", recs[i].key, ErrCorrupt)
		}
	}
	st := s.buildState(recs)
	if r.resume != nil {
		st.hasResume, st.epoch, st.revision = true, r.resume.Epoch, r.resume.Revision
	}
	s.commitLocked(st)
	return nil
}

// commitLocked makes work the writer's version of the desired table, publishes a copy of
// it and keeps another in base; the caller holds writeMu, or is Open.
func (s *Store) commitLocked(work *desiredState) {
	s.work = work
	s.desired.Store(work.copy())
	s.base = work.copy()
}

// buildState returns a state that holds recs, sorted by key, and no resume point.
func (s *Store) buildState(recs []*record) *desiredState {
	st := &desiredState{byID: newIDTree(), indexes: make([]*indexTree, len(s.indexes))}
	load(st.byID, recs)
	entries := make([][]indexEntry, len(s.indexes))
	for _, r := range recs {
		for pos, e := range r.indexEntries() {
			entries[pos] = append(entries[pos], e)
		}
	}
	for i, es := range entries {
		slices.SortFunc(es, func(a, b indexEntry) int {
			if c := strings.Compare(a.val(), b.val()); c != 0 {
				return c
			}
			return compareKeys(&a.rec.key, &b.rec.key)
		})
		// An index that lists an object twice under one value holds it once.
		es = slices.CompactFunc(es, func(a, b indexEntry) bool { return a.rec == b.rec && a.val() == b.val() })
		st.indexes[i] = newIndexTree()
		load(st.indexes[i], es)
	}
	return st
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
	r, ok := s.desired.Load().byID.Get(probe(key.Key()))
	if !ok {
		return nil, false
	}
	return s.decode(r), true
}

// Version is what tells one version of an object from another: its meta's generation,
// revision and generation_revision.
type Version struct {
	Generation         int64
	Revision           uint64
	GenerationRevision uint64
}

// Version returns the version of the desired object with the given key, read from its
// stored bytes without decoding the object: a reader that needs no more, such as the
// status reporter, pays for no labels and no spec.
func (s *Store) Version(key nimbusv1.Key) (Version, bool) {
	r, ok := s.desired.Load().byID.Get(probe(key))
	if !ok {
		return Version{}, false
	}
	return r.version(), true
}

// version reads the record's Version from its wire form: the meta is field 1 of the
// object, and generation, revision and generation_revision fields 5, 6 and 11 of the
// meta. A record holds what newRecord encoded, so the bytes parse.
func (r *record) version() Version {
	var v Version
	b, _ := r.wire()
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return v
		}
		b = b[n:]
		if num == 1 && typ == protowire.BytesType {
			meta, m := protowire.ConsumeBytes(b)
			if m < 0 {
				return v
			}
			v.readMeta(meta)
		}
		m := protowire.ConsumeFieldValue(num, typ, b)
		if m < 0 {
			return v
		}
		b = b[m:]
	}
	return v
}

// readMeta reads the version's fields from an encoded ObjectMeta.
func (v *Version) readMeta(b []byte) {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return
		}
		b = b[n:]
		if typ == protowire.VarintType && (num == 5 || num == 6 || num == 11) {
			x, m := protowire.ConsumeVarint(b)
			if m < 0 {
				return
			}
			switch num {
			case 5:
				v.Generation = int64(x)
			case 6:
				v.Revision = x
			case 11:
				v.GenerationRevision = x
			}
		}
		m := protowire.ConsumeFieldValue(num, typ, b)
		if m < 0 {
			return
		}
		b = b[m:]
	}
}

// decode returns the object of a record: the one decoded last when a reader still holds
// it, as objects read are immutable, and otherwise one decoded afresh. So the HAL, which
// reads an object by key and then, within the same reconcile, its owner by an index,
// decodes it once. A record holds what newRecord encoded, so decoding fails only when
// memory is corrupt; such a record reads as an empty object, and the failure is logged.
func (s *Store) decode(r *record) *nimbusv1.Object {
	if wp := r.decoded.Load(); wp != nil {
		if obj := wp.Value(); obj != nil {
			return obj
		}
	}
	obj := &nimbusv1.Object{}
	if err := r.unmarshal(obj); err != nil {
		s.log.Error("decoding a stored object", "key", r.key, "err", err)
	}
	wp := weak.Make(obj)
	r.decoded.Store(&wp)
	return obj
}

// Keys returns the keys of the desired objects of one kind, ordered; KIND_UNSPECIFIED
// lists all. Unlike List it decodes no object.
func (s *Store) Keys(kind nimbusv1.Kind) []nimbusv1.Key {
	out := make([]nimbusv1.Key, 0, s.desiredLen(kind))
	s.desiredRecords(kind, func(r *record) { out = append(out, r.key) })
	return out
}

// List returns the desired objects of one kind, ordered by key; KIND_UNSPECIFIED lists all.
func (s *Store) List(kind nimbusv1.Kind) []*nimbusv1.Object {
	var out []*nimbusv1.Object
	s.desiredRecords(kind, func(r *record) { out = append(out, s.decode(r)) })
	return out
}

// desiredLen returns the number of records in the committed desired table when kind is
// KIND_UNSPECIFIED, what desiredRecords lists then, and 0 for a kind, whose records it
// does not count.
func (s *Store) desiredLen(kind nimbusv1.Kind) int {
	if kind != nimbusv1.Kind_KIND_UNSPECIFIED {
		return 0
	}
	return s.desired.Load().byID.Len()
}

// desiredRecords calls fn with every record of one kind in the committed desired table,
// ordered by key; KIND_UNSPECIFIED lists all.
func (s *Store) desiredRecords(kind nimbusv1.Kind, fn func(r *record)) {
	byKey := s.desired.Load().byID
	if kind == nimbusv1.Kind_KIND_UNSPECIFIED {
		byKey.Scan(func(r *record) bool { fn(r); return true })
		return
	}
	// Keys sort as key IDs do, which start with their kind's name, so a kind's objects
	// are together, after the key of the kind alone.
	byKey.Ascend(probe(nimbusv1.Key{Kind: kind}), func(r *record) bool {
		if r.key.Kind != kind {
			return false
		}
		fn(r)
		return true
	})
}

// indexPos returns the position of a declared index in Options.Indexes, or an error
// wrapping ErrUnknownIndex.
func (s *Store) indexPos(index, value string) (int, error) {
	i := slices.IndexFunc(s.indexes, func(ix Index) bool { return ix.Name == index })
	if i < 0 {
		return 0, fmt.Errorf("looking up %q in index %q: %w", value, index, ErrUnknownIndex)
	}
	return i, nil
}

// Lookup returns the desired objects that the declared index lists under value, ordered by
// key. An index that was not declared in Options.Indexes is an error wrapping
// ErrUnknownIndex.
func (s *Store) Lookup(index, value string) ([]*nimbusv1.Object, error) {
	pos, err := s.indexPos(index, value)
	if err != nil {
		return nil, err
	}
	var out []*nimbusv1.Object
	s.desired.Load().indexes[pos].Ascend(probeEntry(value), func(e indexEntry) bool {
		if e.val() != value {
			return false
		}
		out = append(out, s.decode(e.rec))
		return true
	})
	return out, nil
}

// LookupKeys returns the keys of the desired objects that the declared index lists under
// value, ordered, as Lookup does but without decoding the objects.
func (s *Store) LookupKeys(index, value string) ([]nimbusv1.Key, error) {
	pos, err := s.indexPos(index, value)
	if err != nil {
		return nil, err
	}
	var out []nimbusv1.Key
	s.desired.Load().indexes[pos].Ascend(probeEntry(value), func(e indexEntry) bool {
		if e.val() != value {
			return false
		}
		out = append(out, e.rec.key)
		return true
	})
	return out, nil
}

// LookupFirst returns the first by key of the desired objects that the declared index
// lists under value, with its key; obj is nil and key the zero Key when there is none.
// It costs one index lookup, without the listing of Lookup. An index that was not
// declared in Options.Indexes is an error wrapping ErrUnknownIndex.
func (s *Store) LookupFirst(index, value string) (obj *nimbusv1.Object, key nimbusv1.Key, err error) {
	rec, err := s.lookupFirst(index, value)
	if rec == nil {
		return nil, nimbusv1.Key{}, err
	}
	return s.decode(rec), rec.key, nil
}

// LookupFirstKey returns the key of the first by key of the desired objects that the
// declared index lists under value, the zero Key when there is none, as LookupFirst does
// but without decoding the object.
func (s *Store) LookupFirstKey(index, value string) (nimbusv1.Key, error) {
	rec, err := s.lookupFirst(index, value)
	if rec == nil {
		return nimbusv1.Key{}, err
	}
	return rec.key, nil
}

// lookupFirst returns the record of the first by key of the desired objects that the
// declared index lists under value, or nil.
func (s *Store) lookupFirst(index, value string) (*record, error) {
	pos, err := s.indexPos(index, value)
	if err != nil {
		return nil, err
	}
	var rec *record
	s.desired.Load().indexes[pos].Ascend(probeEntry(value), func(e indexEntry) bool {
		if e.val() == value {
			rec = e.rec
		}
		return false
	})
	return rec, nil
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

// Resume returns the nimbus epoch and revision the desired table corresponds to.
func (s *Store) Resume() (epoch string, revision uint64) {
	st := s.desired.Load()
	return st.epoch, st.revision
}

// Status returns the status the HAL reported for the object with the given key.
func (s *Store) Status(key *nimbusv1.ObjectKey) (*nimbusv1.NodeStatus, bool) {
	return s.StatusOf(key.Key())
}

// StatusOf is Status for a key in its comparable form.
func (s *Store) StatusOf(key nimbusv1.Key) (*nimbusv1.NodeStatus, bool) {
	s.statusMu.RLock()
	r, ok := s.statuses.Get(key)
	s.statusMu.RUnlock()
	if !ok {
		return nil, false
	}
	return r.status(), true
}

// StatusEntry is one object's status as Statuses returns it.
type StatusEntry struct {
	Key    nimbusv1.Key
	Status *nimbusv1.NodeStatus
}

// Statuses returns every status, ordered by key.
func (s *Store) Statuses() []StatusEntry {
	s.statusMu.RLock()
	keys := s.statusKeysLocked()
	rows := make([]storedStatus, 0, len(keys))
	for _, key := range keys {
		r, _ := s.statuses.Get(key)
		rows = append(rows, r)
	}
	s.statusMu.RUnlock()
	out := make([]StatusEntry, 0, len(keys))
	for i, key := range keys {
		out = append(out, StatusEntry{Key: key, Status: rows[i].status()})
	}
	return out
}

// statusKeysLocked returns the keys of every status, ordered; the caller holds statusMu.
func (s *Store) statusKeysLocked() []nimbusv1.Key {
	keys := make([]nimbusv1.Key, 0, s.statuses.Len())
	for key := range s.statuses.All() {
		keys = append(keys, key)
	}
	slices.SortFunc(keys, nimbusv1.Key.Compare)
	return keys
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

// newRecord makes the desired-table row of obj: its wire form, and the values of every
// declared index.
func (s *Store) newRecord(obj *nimbusv1.Object) (*record, error) {
	// Strings of its own: obj's may be views of a whole received frame.
	key := ownKey(obj.TypedKey())
	var buf [8]indexPart
	parts := buf[:0]
	for i, ix := range s.indexes {
		for _, v := range ix.Values(obj) {
			parts = append(parts, indexPart{pos: i, val: v})
		}
	}
	var indexedBuf [256]byte
	indexed := indexedBuf[:0]
	if len(parts) > 0 {
		indexed = appendIndexed(indexed, parts)
	}
	row, err := encodeRow(obj, &key, indexed)
	if err != nil {
		return nil, fmt.Errorf("encoding %s: %w", key, err)
	}
	return &record{key: key, row: unsafe.String(unsafe.SliceData(row), len(row))}, nil
}

// indexPart is a value a record is listed under while appendIndexed lays it out: the
// position of its index in Options.Indexes, the value, and its offset among the values.
type indexPart struct {
	pos      int
	val      string
	off, end int
}

// layoutSearched is the length up to which appendIndexed looks for a value among those
// laid out already: an object's values are rarely longer, and the search then costs
// little beside encoding the object.
const layoutSearched = 512

// appendIndexed appends to b what a record's indexed holds for parts, its values in
// order, and returns it. It lays the values out longest first: a value found among
// those laid out is not added, and one that begins with what they end with adds only the
// rest. So an endpoint's values "MAC|NETWORK", "NETWORK|IP" and "NETWORK" hold the
// network's key ID once. A copy: the values may be views of a whole received frame.
func appendIndexed(b []byte, parts []indexPart) []byte {
	var orderBuf [8]int
	order := orderBuf[:0]
	total := 0
	for i, p := range parts {
		order = append(order, i)
		total += len(p.val)
	}
	slices.SortStableFunc(order, func(a, b int) int { return len(parts[b].val) - len(parts[a].val) })
	var valuesBuf [256]byte
	values := valuesBuf[:0]
	if total > len(valuesBuf) {
		values = make([]byte, 0, total)
	}
	for _, i := range order {
		p := &parts[i]
		laid := unsafe.String(unsafe.SliceData(values), len(values))
		if len(laid) <= layoutSearched {
			if at := strings.Index(laid, p.val); at >= 0 {
				p.off = at
				p.end = at + len(p.val)
				continue
			}
		}
		// The longest end of what is laid out that p.val begins with.
		at := len(values)
		for j := max(0, len(laid)-len(p.val), len(laid)-layoutSearched); j < len(laid); j++ {
			if strings.HasPrefix(p.val, laid[j:]) {
				at = j
				break
			}
		}
		p.off = at
		p.end = at + len(p.val)
		values = append(values, p.val[len(values)-at:]...)
	}
	header := 0
	for _, p := range parts {
		header += uvarintLen(uint64(p.pos)) + uvarintLen(uint64(p.off)) + uvarintLen(uint64(p.end-p.off))
	}
	b = binary.AppendUvarint(b, uint64(header))
	for _, p := range parts {
		b = binary.AppendUvarint(b, uint64(p.pos))
		b = binary.AppendUvarint(b, uint64(p.off))
		b = binary.AppendUvarint(b, uint64(p.end-p.off))
	}
	return append(b, values...)
}

// uvarintLen returns the length of x as a uvarint.
func uvarintLen(x uint64) int {
	n := 1
	for ; x >= 0x80; x >>= 7 {
		n++
	}
	return n
}

// desiredChange is what a write transaction did to one key: the record before it (nil
// when there was none) and after it (nil when there is none).
type desiredChange struct {
	key           nimbusv1.Key
	before, after *record
	// obj is after decoded, the object Put, for the state file.
	obj *nimbusv1.Object
}

// desiredWrite is a write transaction of the desired table in progress: the writer's
// version of the table, which it changes, and what it changed.
type desiredWrite struct {
	s  *Store
	st *desiredState
	// changes holds the writes that changed a key, in the order they were made, which
	// merge makes one change a key. A slice, not a map by key: a batch of a thousand
	// deletes then takes a third of the memory, and no hashing of keys.
	changes []desiredChange
	// persist tells that the transaction writes what the file keeps; resume that it
	// records a resume point.
	persist, resume bool
	// key is the record that searches by key, and hint where the last search ended,
	// where the next one starts: a batch often writes keys that sort close together.
	key  record
	hint btree.PathHint
}

// newDesiredWriteLocked starts a write transaction on the writer's version of the
// table; the caller holds writeMu.
func (s *Store) newDesiredWriteLocked() *desiredWrite {
	return &desiredWrite{s: s, st: s.work}
}

// probe returns the record that searches by key.
func (w *desiredWrite) probe(key nimbusv1.Key) *record {
	w.key.key = key
	return &w.key
}

// get returns the record of key as the transaction has it.
func (w *desiredWrite) get(key nimbusv1.Key) (*record, bool) {
	return w.st.byID.GetHint(w.probe(key), &w.hint)
}

// put stores r, the record of obj, replacing the record with its key.
func (w *desiredWrite) put(r *record, obj *nimbusv1.Object) {
	old, _ := w.st.byID.SetHint(r, &w.hint)
	w.unindex(old)
	for pos, e := range r.indexEntries() {
		w.st.indexes[pos].Set(e)
	}
	w.changed(desiredChange{key: r.key, before: old, after: r, obj: obj})
}

// delete removes the record of key, if any.
func (w *desiredWrite) delete(key nimbusv1.Key) {
	old, ok := w.st.byID.DeleteHint(w.probe(key), &w.hint)
	if !ok {
		return
	}
	w.unindex(old)
	w.changed(desiredChange{key: old.key, before: old})
}

// unindex removes the index entries of r, when not nil.
func (w *desiredWrite) unindex(r *record) {
	if r == nil {
		return
	}
	for pos, e := range r.indexEntries() {
		w.st.indexes[pos].Delete(e)
	}
}

// changed records a write that changed a key.
func (w *desiredWrite) changed(c desiredChange) {
	w.persist = true
	w.changes = append(w.changes, c)
}

// merge returns what the transaction changed, one change a key, in the order of each
// key's first write: the record before the key's first write and after its last. A key
// created and deleted again, or changed back, within the transaction did not change and
// is left out.
func (w *desiredWrite) merge() []desiredChange {
	cs := w.changes
	if len(cs) > 1 {
		// The writes by key, and those of one key in the order they were made. A batch
		// of keys in order, as a snapshot or a sweep writes, is sorted in one pass.
		pos := make([]int, len(cs))
		for i := range pos {
			pos[i] = i
		}
		slices.SortFunc(pos, func(a, b int) int {
			if c := compareKeys(&cs[a].key, &cs[b].key); c != 0 {
				return c
			}
			return cmp.Compare(a, b)
		})
		first := pos[0]
		for _, p := range pos[1:] {
			if cs[p].key != cs[first].key {
				first = p
				continue
			}
			// A later write of the key: the first takes its result, and it goes.
			cs[first].after, cs[first].obj = cs[p].after, cs[p].obj
			cs[p].before, cs[p].after = nil, nil
		}
	}
	return slices.DeleteFunc(cs, func(c desiredChange) bool { return c.before == c.after })
}

// setResume records the resume point.
func (w *desiredWrite) setResume(epoch string, revision uint64) {
	w.persist, w.resume = true, true
	w.st.hasResume, w.st.epoch, w.st.revision = true, epoch, revision
}

// write runs fn in a write transaction of the desired table, writes its changes to disk,
// publishes the new state, and tells subscribers which keys changed, all under writeMu so
// that the file and the notifications follow commit order. The disk write comes before
// the state is published, so readers never see what the file does not hold; when fn or
// the disk write fails, nothing changes, and the writer's version starts over from the
// committed state.
func (s *Store) write(fn func(w *desiredWrite) error) error {
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return ErrClosed
	}
	start := time.Now()
	w := s.newDesiredWriteLocked()
	if err := fn(w); err != nil {
		s.work = s.base.copy()
		return err
	}
	changes := w.merge()
	if s.disk != nil && w.persist {
		if err := s.disk.commit(w, changes); err != nil {
			s.work = s.base.copy()
			return fmt.Errorf("writing state file: %w", err)
		}
	}
	s.commitLocked(w.st)
	keys := make([]nimbusv1.Key, len(changes))
	for i, c := range changes {
		keys[i] = c.key
	}
	s.notify(TableDesired, keys, &resumePoint{w.st.epoch, w.st.revision})
	s.metrics.commitDuration.WithLabelValues(string(TableDesired)).Observe(time.Since(start).Seconds())
	s.metrics.commitSize.WithLabelValues(string(TableDesired)).Observe(float64(len(keys)))
	return nil
}

// notify hands the keys of one table that a commit changed, and a desired-table commit's
// resume point, to the matching subscriptions; the caller holds writeMu.
func (s *Store) notify(table Table, keys []nimbusv1.Key, resume *resumePoint) {
	if len(keys) == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for sub := range s.subs {
		if slices.Contains(sub.opts.Tables, table) {
			sub.add(keys, resume)
		}
	}
}

// DesiredWriter is the one handle that writes the desired table.
type DesiredWriter struct{ s *Store }

// DesiredTxn is a batch of desired-table writes committed atomically.
type DesiredTxn struct {
	puts    []*nimbusv1.Object
	deletes []*nimbusv1.ObjectKey
	keep    map[nimbusv1.Key]bool
	sweep   bool
	resume  *statefile.Position
}

// Put stores obj, replacing any object with the same key. The store keeps its own copy.
func (t *DesiredTxn) Put(obj *nimbusv1.Object) {
	t.puts = append(t.puts, proto.CloneOf(obj))
}

// PutOwned stores obj without the copy Put makes: the caller must not modify it until
// Commit returns. The store keeps nothing of obj past Commit (it keeps objects encoded
// afresh and index values copied), so the caller may then reuse obj's memory, as the
// nimbus client does with the frames it decodes watch events into.
func (t *DesiredTxn) PutOwned(obj *nimbusv1.Object) {
	t.puts = append(t.puts, obj)
}

// Delete removes the object with the given key; an absent key is not an error.
func (t *DesiredTxn) Delete(key *nimbusv1.ObjectKey) {
	t.deletes = append(t.deletes, key)
}

// DeleteOthers removes, at commit, every stored object whose key is not in keep and is not
// Put in this transaction. A full snapshot uses it to drop what nimbus no longer sends.
func (t *DesiredTxn) DeleteOthers(keep map[nimbusv1.Key]bool) {
	t.sweep = true
	t.keep = keep
}

// SetResume records the nimbus epoch and revision the table corresponds to after commit.
func (t *DesiredTxn) SetResume(epoch string, revision uint64) {
	// A copy: epoch may be a view of a received frame, and the store keeps it.
	t.resume = &statefile.Position{Epoch: strings.Clone(epoch), Revision: revision}
}

// Commit applies the transaction atomically. Objects equal to what is stored are not
// rewritten, so subscribers hear only of real changes.
func (w *DesiredWriter) Commit(t *DesiredTxn) error {
	return w.s.write(func(dw *desiredWrite) error {
		// Room for a change a write, so that a batch of deletes does not grow it.
		dw.changes = make([]desiredChange, 0, len(t.puts)+len(t.deletes))
		// The keys Put, which a sweep keeps; without one, nothing reads them.
		var put map[nimbusv1.Key]bool
		if t.sweep {
			put = make(map[nimbusv1.Key]bool, len(t.puts))
		}
		for _, obj := range t.puts {
			rec, err := w.s.newRecord(obj)
			if err != nil {
				return err
			}
			if put != nil {
				put[rec.key] = true
			}
			if old, ok := dw.get(rec.key); ok && old.data() == rec.data() {
				continue
			}
			dw.put(rec, obj)
		}
		for _, key := range t.deletes {
			dw.delete(key.Key())
		}
		if t.sweep {
			var stale []nimbusv1.Key
			dw.st.byID.Scan(func(r *record) bool {
				if !t.keep[r.key] && !put[r.key] {
					stale = append(stale, r.key)
				}
				return true
			})
			for _, key := range stale {
				dw.delete(key)
			}
		}
		if t.resume != nil {
			dw.setResume(t.resume.Epoch, t.resume.Revision)
		}
		return nil
	})
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

// statusOp is one write of a StatusTxn: st stored, or, with remove, the status of key
// removed.
type statusOp struct {
	key    nimbusv1.Key
	st     *nimbusv1.NodeStatus
	remove bool
}

// Set stores the status of the object with the given key. The store keeps its own copy.
func (t *StatusTxn) Set(key nimbusv1.Key, st *nimbusv1.NodeStatus) {
	t.ops = append(t.ops, statusOp{key: key, st: proto.CloneOf(st)})
}

// SetOwned stores st itself, without the copy Set makes: the caller hands it over and must
// not modify it afterwards. The HAL, which builds a fresh status for every reconcile,
// uses it.
func (t *StatusTxn) SetOwned(key nimbusv1.Key, st *nimbusv1.NodeStatus) {
	t.ops = append(t.ops, statusOp{key: key, st: st})
}

// Delete removes the status of the object with the given key; an absent one is not an
// error.
func (t *StatusTxn) Delete(key nimbusv1.Key) {
	t.ops = append(t.ops, statusOp{key: key, remove: true})
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
	rows := make([]storedStatus, len(t.ops))
	for i, op := range t.ops {
		if op.remove {
			continue
		}
		var err error
		if rows[i], err = storeStatus(op.st); err != nil {
			return fmt.Errorf("storing the status of %s: %w", op.key, err)
		}
	}
	// before holds, per key the batch wrote, its status before the batch, so that
	// subscribers hear of the keys whose status the batch as a whole changed.
	type was struct {
		st  storedStatus
		had bool
	}
	var keys []nimbusv1.Key
	before := make(map[nimbusv1.Key]was, len(t.ops))
	desired := s.desired.Load().byID
	s.statusMu.Lock()
	for i, op := range t.ops {
		old, had := s.statuses.Get(op.key)
		row := rows[i]
		switch {
		case op.remove && !had:
			continue
		case !op.remove && had && old.same(row):
			continue
		}
		if _, seen := before[op.key]; !seen {
			before[op.key] = was{old, had}
			keys = append(keys, op.key)
		}
		if op.remove {
			s.statuses.Delete(op.key)
			continue
		}
		// The map keeps the key it is given last; the desired table's key shares its
		// strings with the record, and one that is not there gets strings of its own.
		key := op.key
		if r, ok := desired.Get(probe(key)); ok {
			key = r.key
		} else {
			key = key.Clone()
		}
		s.statuses.Set(key, row)
	}
	changed := keys[:0]
	for _, key := range keys {
		st, had := s.statuses.Get(key)
		if b := before[key]; had != b.had || !st.equal(b.st) {
			changed = append(changed, key)
		}
	}
	s.statusMu.Unlock()
	keys = changed
	s.notify(TableStatus, keys, nil)
	s.metrics.commitDuration.WithLabelValues(string(TableStatus)).Observe(time.Since(start).Seconds())
	s.metrics.commitSize.WithLabelValues(string(TableStatus)).Observe(float64(len(keys)))
	return nil
}

// Set stores the status of the object with the given key, in a transaction of its own. A
// status equal to the stored one, apart from its update time, is not rewritten.
func (w *StatusWriter) Set(key *nimbusv1.ObjectKey, st *nimbusv1.NodeStatus) error {
	t := &StatusTxn{}
	t.Set(key.Key(), st)
	return w.Commit(t)
}

// Delete removes the status of the object with the given key, in a transaction of its
// own; an absent one is not an error.
func (w *StatusWriter) Delete(key *nimbusv1.ObjectKey) error {
	t := &StatusTxn{}
	t.Delete(key.Key())
	return w.Commit(t)
}
