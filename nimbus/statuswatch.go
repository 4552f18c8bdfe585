package nimbus

import (
	"cmp"
	"fmt"
	"hash/maphash"
	"iter"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// Settings of the status watch.
const (
	// maxStatusFrameBytes bounds the events of one status frame; an event larger than
	// that goes in a frame of its own.
	maxStatusFrameBytes = 1 << 20
	// maxStaleCheckInterval bounds how often a status watcher looks for nodes whose
	// statuses became stale with time.
	maxStaleCheckInterval = time.Second
)

// statusHub is the set of open status watches. Object commits, status intake and the
// watch streams of nodes mark in it what may have changed; it never blocks them.
type statusHub struct {
	// mu guards watchers. Marks take it for reading, under s.mu when they come from a
	// commit; it is never held while taking s.mu.
	mu       sync.RWMutex
	watchers map[*statusWatcher]struct{}
}

// add registers w; from now on it is marked with every change.
func (h *statusHub) add(w *statusWatcher) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.watchers == nil {
		h.watchers = map[*statusWatcher]struct{}{}
	}
	h.watchers[w] = struct{}{}
}

// remove unregisters w.
func (h *statusHub) remove(w *statusWatcher) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.watchers, w)
}

// objectChanged marks the object with the key, which has tenant and namespace defaulted,
// in every watcher that selects it: its object or a status of it changed.
func (h *statusHub) objectChanged(key *nimbusv1.ObjectKey) {
	h.mu.RLock()
	defer h.mu.RUnlock()
	if len(h.watchers) == 0 {
		return
	}
	k := key.Key()
	id := k.String()
	// A DELETE names the object by its key with tenant and namespace defaulted: the key
	// given when it has them, as a change's does, so that a mark allocates nothing more.
	wire := key
	if wire.GetTenant() != k.Tenant || wire.GetNamespace() != k.Namespace {
		wire = k.Proto()
	}
	for w := range h.watchers {
		if w.selects(id, key) {
			w.markObject(id, wire)
		}
	}
}

// nodeChanged marks the node in every watcher: the objects that target it may have a
// new status, because it joined or left the target nodes of the objects for every node
// (a watch stream opened or ended, a Node object was created or deleted), because its
// statuses are stale or no more, or because its statuses were dropped.
func (h *statusHub) nodeChanged(node string) {
	h.mu.RLock()
	defer h.mu.RUnlock()
	for w := range h.watchers {
		w.markNode(node)
	}
}

// watermarkMoved marks, in every watcher, the objects targeting the node whose generation
// revision is in the span: the node's watermark moved across it.
func (h *statusHub) watermarkMoved(node string, moved revSpan) {
	h.mu.RLock()
	defer h.mu.RUnlock()
	for w := range h.watchers {
		w.markWatermark(node, moved)
	}
}

// revSpan is the revisions in (lo, hi].
type revSpan struct{ lo, hi uint64 }

// holds tells whether rev is in the span.
func (r revSpan) holds(rev uint64) bool { return rev > r.lo && rev <= r.hi }

// published marks what a committed change may have changed: its object, and for a Node
// object created or deleted, the node.
func (h *statusHub) published(c *change) {
	if c.put == nil && c.del == nil {
		return
	}
	key := c.key
	h.objectChanged(key)
	if key.GetKind() == nimbusv1.Kind_KIND_NODE && (c.after == nil || c.del == nil) {
		h.nodeChanged(key.GetName())
	}
}

// statusWatcher is one WatchStatus stream as the marks see it: the filter and what may
// have changed since its last flush. What it holds is bounded by the objects and the
// nodes there are, however many changes come and however slowly its client reads.
type statusWatcher struct {
	filter *nimbusv1.WatchStatusRequest
	// index holds, by key ID, the index of each of the filter's keys (the first, when a
	// key repeats); nil when it names none. ids are its key IDs, sorted.
	index map[string]uint32
	ids   []string
	// wake has room for one signal: something was marked since the last take.
	wake chan struct{}

	// mu guards objects, nodes, moves and all.
	mu sync.Mutex
	// objects holds the keys of the objects marked, in their wire form, by key ID: a
	// string is cheaper to hash and to sort than a Key, and a pointer cheaper to hold.
	objects map[string]*nimbusv1.ObjectKey
	// nodes holds the nodes marked: every object that targets one is recomputed.
	nodes map[string]struct{}
	// moves holds, per node whose watermark moved, the span of revisions it moved
	// across (the hull of its moves): every object that targets the node with a
	// generation revision in it is recomputed.
	moves map[string]revSpan
	// all asks for every selected object to be recomputed.
	all bool
}

func newStatusWatcher(filter *nimbusv1.WatchStatusRequest) *statusWatcher {
	w := &statusWatcher{
		filter:  filter,
		wake:    make(chan struct{}, 1),
		objects: map[string]*nimbusv1.ObjectKey{},
		nodes:   map[string]struct{}{},
		moves:   map[string]revSpan{},
	}
	if keys := filter.GetKeys(); len(keys) > 0 {
		w.index = make(map[string]uint32, len(keys))
		for i, k := range keys {
			id := k.Key().String()
			if _, ok := w.index[id]; !ok {
				w.ids = append(w.ids, id)
				w.index[id] = uint32(i)
			}
		}
		slices.Sort(w.ids)
	}
	return w
}

// named tells whether the filter names no keys, or names the key with the key ID.
func (w *statusWatcher) named(id string) bool {
	if w.index == nil {
		return true
	}
	_, ok := w.index[id]
	return ok
}

// selects tells whether the filter selects the key, which has tenant and namespace
// defaulted and the key ID id.
func (w *statusWatcher) selects(id string, key *nimbusv1.ObjectKey) bool {
	f := w.filter
	return (f.GetKind() == nimbusv1.Kind_KIND_UNSPECIFIED || f.GetKind() == key.GetKind()) &&
		(f.GetTenant() == "" || f.GetTenant() == key.GetTenant()) &&
		(f.GetNamespace() == "" || f.GetNamespace() == key.GetNamespace()) &&
		(f.GetName() == "" || f.GetName() == key.GetName()) &&
		w.named(id)
}

// selectsRecord tells whether the filter selects the record's object.
func (w *statusWatcher) selectsRecord(rec *objectRecord) bool {
	return w.named(rec.id) && w.selectsFields(rec.Object)
}

// selectsFields tells whether the filter's fields other than its keys select the
// object, whose meta has tenant and namespace defaulted.
func (w *statusWatcher) selectsFields(obj *nimbusv1.Object) bool {
	f, m := w.filter, obj.GetMeta()
	return (f.GetKind() == nimbusv1.Kind_KIND_UNSPECIFIED || f.GetKind() == obj.Kind()) &&
		(f.GetTenant() == "" || f.GetTenant() == m.GetTenant()) &&
		(f.GetNamespace() == "" || f.GetNamespace() == m.GetNamespace()) &&
		(f.GetName() == "" || f.GetName() == m.GetName())
}

// markObject marks the object with the key ID for a recompute; key is its key, with
// tenant and namespace defaulted, which the caller does not modify.
func (w *statusWatcher) markObject(id string, key *nimbusv1.ObjectKey) {
	w.mu.Lock()
	w.objects[id] = key
	w.mu.Unlock()
	w.signal()
}

// markNode marks the objects that target the node for a recompute.
func (w *statusWatcher) markNode(node string) {
	w.mu.Lock()
	w.nodes[node] = struct{}{}
	w.mu.Unlock()
	w.signal()
}

// markWatermark marks the objects that target the node with a generation revision in
// the span for a recompute.
func (w *statusWatcher) markWatermark(node string, moved revSpan) {
	w.mu.Lock()
	if m, ok := w.moves[node]; ok {
		moved = revSpan{min(m.lo, moved.lo), max(m.hi, moved.hi)}
	}
	w.moves[node] = moved
	w.mu.Unlock()
	w.signal()
}

// markAll marks every selected object for a recompute.
func (w *statusWatcher) markAll() {
	w.mu.Lock()
	w.all = true
	w.mu.Unlock()
	w.signal()
}

// signal wakes the watcher's stream up, unless a wake-up is pending already.
func (w *statusWatcher) signal() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// take returns what was marked and starts over. A view of the store taken after take
// sees every change marked before it.
func (w *statusWatcher) take() (objects map[string]*nimbusv1.ObjectKey, nodes map[string]struct{}, moves map[string]revSpan, all bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	objects, nodes, moves, all = w.objects, w.nodes, w.moves, w.all
	w.objects, w.nodes, w.moves, w.all = map[string]*nimbusv1.ObjectKey{}, map[string]struct{}{}, map[string]revSpan{}, false
	return objects, nodes, moves, all
}

// WatchStatus streams the propagation status of the objects the request selects: first
// every selected object with its status, as Get aggregates it, then SYNCED, then a PUT
// whenever an object's status or the object itself changed and a DELETE when it was
// deleted. Changes are coalesced: an object is sent at most once per flush, at its state
// when it is sent. A brief stream (WatchStatusRequest.brief) sends an object whose status
// has nothing to tell but its counts as a brief entry instead of a PUT. It returns when
// the client goes away, and ends with codes.Unavailable when the Server is closed.
func (s *Server) WatchStatus(req *nimbusv1.WatchStatusRequest, stream grpc.ServerStreamingServer[nimbusv1.StatusFrame]) error {
	if k := req.GetKind(); k != nimbusv1.Kind_KIND_UNSPECIFIED && !slices.Contains(nimbusv1.Kinds(), k) {
		return status.Error(codes.InvalidArgument, (&nimbusv1.FieldError{Field: "kind", Value: k.String(), Reason: "unknown kind"}).Error())
	}
	for i, k := range req.GetKeys() {
		if err := k.Validate(); err != nil {
			return status.Errorf(codes.InvalidArgument, "keys[%d]: %v", i, err)
		}
	}
	if req.GetBrief() && len(req.GetKeys()) == 0 {
		return status.Error(codes.InvalidArgument, (&nimbusv1.FieldError{Field: "brief", Value: "true", Reason: "a brief stream names its objects by their index in keys, and keys is empty"}).Error())
	}
	if s.isClosed() {
		return rpcError(fmt.Errorf("watching status: %w", ErrClosed))
	}
	w := newStatusWatcher(proto.CloneOf(req))
	// Registered before the first read: every change after that read is marked.
	s.statusWatch.add(w)
	defer s.statusWatch.remove(w)
	log := s.log.With("kind", req.GetKind().Name(), "tenant", req.GetTenant(), "namespace", req.GetNamespace(), "name", req.GetName(), "keys", len(req.GetKeys()))

	ss := &statusStream{srv: s, w: w, stream: stream, seed: maphash.MakeSeed(), sent: map[string]uint64{}, knownStale: map[string]bool{}}
	if w.index != nil {
		ss.sentAt = make([]uint64, len(req.GetKeys()))
	}
	err := ss.run()
	log.Info("status watch ended", "reason", err)
	return err
}

// statusStream sends one status watcher's events.
type statusStream struct {
	srv    *Server
	w      *statusWatcher
	stream grpc.ServerStreamingServer[nimbusv1.StatusFrame]
	// frame holds the encoded events not sent yet, and brief the brief entries.
	frame []byte
	brief briefEntries
	seed  maphash.Seed
	// sent holds, per key ID of an object the client has, the hash of the last event
	// sent of it. When the watcher names keys, sentAt holds it instead, by the index of
	// the object's key, with its lowest bit set (0 for none): the index is looked up
	// anyway, and a key ID costs more to hash (markSent).
	sent   map[string]uint64
	sentAt []uint64
	// knownStale holds the nodes with a watch_nodes row, and whether their statuses were
	// stale, as of the last look.
	knownStale map[string]bool
	// startStale is true once the nodes that never watched are stale.
	startStale bool
}

// run sends the current state, SYNCED, then the changes, until the stream ends.
func (ss *statusStream) run() error {
	s := ss.srv
	v := s.view()
	ss.lookStale(v, false)
	for rec := range ss.selected(v) {
		if err := ss.put(v, rec); err != nil {
			return err
		}
	}
	if err := ss.add(&nimbusv1.StatusEvent{Type: nimbusv1.StatusEvent_TYPE_SYNCED}); err != nil {
		return err
	}
	if err := ss.flush(); err != nil {
		return err
	}
	var staleTick <-chan time.Time
	if s.opts.StaleAfter > 0 {
		t := time.NewTicker(min(s.opts.StaleAfter/2, maxStaleCheckInterval))
		defer t.Stop()
		staleTick = t.C
	}
	ctx := ss.stream.Context()
	for {
		select {
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		case <-s.done:
			return status.Error(codes.Unavailable, "nimbus is shutting down; watch status again")
		case <-staleTick:
			// Marks the nodes whose staleness changed; the wake-up follows.
			ss.lookStale(s.view(), true)
			continue
		case <-ss.w.wake:
		}
		// No timer holds a change back: what is marked while a flush is computed and sent
		// goes together in the next one, so a burst coalesces by itself and a lone change
		// leaves at once.
		if err := ss.sendChanges(); err != nil {
			return err
		}
	}
}

// sendChanges recomputes what was marked, in a view of the store taken after the marks,
// and sends what differs from what the client has.
func (ss *statusStream) sendChanges() error {
	objects, nodes, moves, all := ss.w.take()
	v := ss.srv.view()
	var recs []*objectRecord
	switch {
	case all || len(nodes) > 0:
		// Every selected object is looked at: a node joined or left the targets, or
		// its statuses became stale, which is rare.
		spans := ss.spans(moves)
		for rec := range ss.selected(v) {
			if _, ok := objects[rec.id]; ok || all || targetsAny(rec.Object, nodes) || movedUnder(rec.Object, moves, spans) {
				recs = append(recs, rec)
			}
		}
	case len(moves) > 0:
		// A watermark moved: only the objects whose generation revision it moved across
		// may have changed, which the objects by generation revision give without a
		// walk of all. An object for every node targets every node whose watermark
		// moved (or none of them, and gains nothing from a recompute): it is marked by
		// the union of the spans.
		spans := ss.spans(moves)
		for rec := range v.objectsInSpans(spans) {
			if _, ok := objects[rec.id]; !ok && ss.w.selectsRecord(rec) && movedUnder(rec.Object, moves, spans) {
				recs = append(recs, rec)
			}
		}
	}
	for _, rec := range recs {
		delete(objects, rec.id)
	}
	ids := make([]string, 0, len(objects))
	for id := range objects {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	var deleted []string
	for _, id := range ids {
		if rec := v.objectByID(id); rec != nil {
			recs = append(recs, rec)
			continue
		}
		if ss.wasSent(id) {
			deleted = append(deleted, id)
		}
		// Otherwise created and deleted before the client heard of it.
	}
	// Objects go out in key ID order, then the deletions.
	slices.SortFunc(recs, func(a, b *objectRecord) int { return strings.Compare(a.id, b.id) })
	for _, rec := range recs {
		if err := ss.put(v, rec); err != nil {
			return err
		}
	}
	for _, id := range deleted {
		ss.forgetSent(id)
		if err := ss.add(&nimbusv1.StatusEvent{Type: nimbusv1.StatusEvent_TYPE_DELETE, Key: objects[id]}); err != nil {
			return err
		}
	}
	return ss.flush()
}

// spans returns the spans of the watermark moves, sorted and merged.
func (ss *statusStream) spans(moves map[string]revSpan) []revSpan {
	spans := make([]revSpan, 0, len(moves))
	for _, m := range moves {
		spans = append(spans, m)
	}
	return mergeSpans(spans)
}

// targetsAny tells whether the object targets one of the nodes.
func targetsAny(obj *nimbusv1.Object, nodes map[string]struct{}) bool {
	targets := obj.GetMeta().GetNodes()
	if len(targets) == 0 {
		return len(nodes) > 0
	}
	for _, n := range targets {
		if _, ok := nodes[n]; ok {
			return true
		}
	}
	return false
}

// mergeSpans sorts the spans and merges those that overlap or touch.
func mergeSpans(spans []revSpan) []revSpan {
	slices.SortFunc(spans, func(a, b revSpan) int { return cmp.Compare(a.lo, b.lo) })
	out := spans[:0]
	for _, s := range spans {
		if n := len(out); n > 0 && s.lo <= out[n-1].hi {
			out[n-1].hi = max(out[n-1].hi, s.hi)
			continue
		}
		out = append(out, s)
	}
	return out
}

// movedUnder tells whether a watermark moved across the object's generation revision on
// a node it targets: for an object for every node, whether the revision is in one of
// the merged spans; for one of listed nodes, in the move of one of them.
func movedUnder(obj *nimbusv1.Object, moves map[string]revSpan, merged []revSpan) bool {
	if len(moves) == 0 {
		return false
	}
	rev := obj.GenerationRevision()
	targets := obj.GetMeta().GetNodes()
	if len(targets) == 0 {
		i, _ := slices.BinarySearchFunc(merged, rev, func(s revSpan, rev uint64) int {
			if s.hi < rev {
				return -1
			}
			return 1
		})
		return i < len(merged) && merged[i].holds(rev)
	}
	if len(moves) < len(targets) {
		for n, m := range moves {
			if m.holds(rev) && targetsNode(obj, n) {
				return true
			}
		}
		return false
	}
	for _, n := range targets {
		if m, ok := moves[n]; ok && m.holds(rev) {
			return true
		}
	}
	return false
}

// selected iterates over the objects of v the watcher selects, in key ID order: those of
// its keys that exist, when it names keys, without a walk of the kind.
func (ss *statusStream) selected(v *view) iter.Seq[*objectRecord] {
	return func(yield func(*objectRecord) bool) {
		if ss.w.index != nil {
			for _, id := range ss.w.ids {
				if rec := v.objectByID(id); rec != nil && ss.w.selectsFields(rec.Object) && !yield(rec) {
					return
				}
			}
			return
		}
		for rec := range v.objectsOfKind(ss.w.filter.GetKind()) {
			if ss.w.selectsFields(rec.Object) && !yield(rec) {
				return
			}
		}
	}
}

// put queues a PUT of the record's object with its status in v, unless the client has it
// just so. The object goes out as the bytes of the record's shared watch event, encoded
// once per revision for watchers and status streams alike; only the key and the status
// are encoded here.
func (ss *statusStream) put(v *view, rec *objectRecord) error {
	brief := ss.w.filter.GetBrief()
	if brief {
		if e, ok := v.briefStatus(rec); ok {
			return ss.putBrief(rec, e)
		}
	}
	st := v.status(rec)
	if brief && quiet(st) {
		return ss.putBrief(rec, briefEntry{generation: st.GetGeneration(), target: st.GetTargetNodes(), programmed: st.GetProgrammedNodes()})
	}
	object, key, err := ss.objectWire(rec)
	if err != nil {
		return err
	}
	stWire, err := marshalStatus(st)
	if err != nil {
		return status.Errorf(codes.Internal, "encoding status of %s: %v", rec.Key, err)
	}
	// StatusEvent{type: PUT, item: ObjectWithStatus{object, status}, key}.
	itemLen := protowire.SizeTag(1) + protowire.SizeBytes(len(object)) +
		protowire.SizeTag(2) + protowire.SizeBytes(len(stWire))
	b := make([]byte, 0, 2+protowire.SizeTag(2)+protowire.SizeBytes(itemLen)+protowire.SizeTag(3)+protowire.SizeBytes(len(key)))
	b = protowire.AppendTag(b, 1, protowire.VarintType)
	b = protowire.AppendVarint(b, uint64(nimbusv1.StatusEvent_TYPE_PUT))
	b = protowire.AppendTag(b, 2, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(itemLen))
	b = protowire.AppendTag(b, 1, protowire.BytesType)
	b = protowire.AppendBytes(b, object)
	b = protowire.AppendTag(b, 2, protowire.BytesType)
	b = protowire.AppendBytes(b, stWire)
	b = protowire.AppendTag(b, 3, protowire.BytesType)
	b = protowire.AppendBytes(b, key)

	if unchanged, _ := ss.markSent(rec.id, maphash.Bytes(ss.seed, b)); unchanged {
		return nil
	}
	return ss.addEncoded(b)
}

// quiet tells whether st has nothing to tell but its counts: no node FAILED, none with
// a reason or a message.
func quiet(st *nimbusv1.ObjectStatus) bool {
	if st.GetFailedNodes() > 0 {
		return false
	}
	for _, n := range st.GetNodes() {
		if n.GetPhase() == nimbusv1.Phase_PHASE_FAILED || n.GetReason() != "" || n.GetMessage() != "" {
			return false
		}
	}
	return true
}

// briefEntry is what a brief entry tells of an object; a brief stream hashes it as it
// hashes the PUT events it sends.
type briefEntry struct {
	generation         int64
	target, programmed int32
}

// putBrief queues the brief entry e of the record's object, unless the client has it
// just so.
func (ss *statusStream) putBrief(rec *objectRecord, e briefEntry) error {
	unchanged, i := ss.markSent(rec.id, maphash.Comparable(ss.seed, e))
	if unchanged {
		return nil
	}
	if ss.queued()+maxBriefEntryBytes > maxStatusFrameBytes {
		if err := ss.flush(); err != nil {
			return err
		}
	}
	ss.brief.add(i, e)
	return nil
}

// markSent records h as the hash of the last event sent of the object with the key ID,
// and reports whether it was that already, and the index of the object's key when the
// watcher names keys.
func (ss *statusStream) markSent(id string, h uint64) (unchanged bool, i uint32) {
	i, named := ss.w.index[id]
	if !named {
		old, ok := ss.sent[id]
		ss.sent[id] = h
		return ok && old == h, 0
	}
	h |= 1
	unchanged = ss.sentAt[i] == h
	ss.sentAt[i] = h
	return unchanged, i
}

// wasSent tells whether the client has the object with the key ID.
func (ss *statusStream) wasSent(id string) bool {
	if i, named := ss.w.index[id]; named {
		return ss.sentAt[i] != 0
	}
	_, ok := ss.sent[id]
	return ok
}

// forgetSent records that the client no longer has the object with the key ID.
func (ss *statusStream) forgetSent(id string) {
	if i, named := ss.w.index[id]; named {
		ss.sentAt[i] = 0
		return
	}
	delete(ss.sent, id)
}

// maxBriefEntryBytes bounds the encoded size of one brief entry: four varints.
const maxBriefEntryBytes = 5 + 10 + 5 + 5

// briefEntries are the brief entries of a frame, each list encoded packed.
type briefEntries struct {
	keys, generations, targets, programmed []byte
}

// add appends the entry of the object with the key index i.
func (b *briefEntries) add(i uint32, e briefEntry) {
	b.keys = protowire.AppendVarint(b.keys, uint64(i))
	b.generations = protowire.AppendVarint(b.generations, uint64(e.generation))
	// An int32 goes on the wire as its int64 would.
	b.targets = protowire.AppendVarint(b.targets, uint64(int64(e.target)))
	b.programmed = protowire.AppendVarint(b.programmed, uint64(int64(e.programmed)))
}

// size returns the encoded size of the entries as fields of a StatusFrame.
func (b *briefEntries) size() int {
	n := 0
	for _, l := range [][]byte{b.keys, b.generations, b.targets, b.programmed} {
		if len(l) > 0 {
			n += 1 + protowire.SizeBytes(len(l))
		}
	}
	return n
}

// appendTo appends the entries to an encoded StatusFrame, as its fields 2 to 5, and
// empties them.
func (b *briefEntries) appendTo(frame []byte) []byte {
	for i, l := range [][]byte{b.keys, b.generations, b.targets, b.programmed} {
		if len(l) > 0 {
			frame = protowire.AppendTag(frame, protowire.Number(2+i), protowire.BytesType)
			frame = protowire.AppendBytes(frame, l)
		}
	}
	b.keys, b.generations, b.targets, b.programmed = b.keys[:0], b.generations[:0], b.targets[:0], b.programmed[:0]
	return frame
}

// objectWire returns the encoded object of the record as the stream sends it, whole, as
// the bytes of the record's shared watch event, or its skeleton when the client asked to
// omit objects; and its encoded key.
func (ss *statusStream) objectWire(rec *objectRecord) (object, key []byte, err error) {
	if ss.w.filter.GetOmitObjects() {
		w, err := rec.statusWires(&ss.srv.encodes)
		if err != nil {
			return nil, nil, status.Errorf(codes.Internal, "encoding %s: %v", rec.Key, err)
		}
		return w.skeleton, w.key, nil
	}
	wire, err := rec.putEvent().encoded(&ss.srv.encodes)
	if err != nil {
		return nil, nil, status.Errorf(codes.Internal, "encoding %s: %v", rec.Key, err)
	}
	if object, err = eventObject(wire); err != nil {
		return nil, nil, status.Errorf(codes.Internal, "reading the event of %s: %v", rec.Key, err)
	}
	if key, err = rec.Object.Key().MarshalVT(); err != nil {
		return nil, nil, status.Errorf(codes.Internal, "encoding the key of %s: %v", rec.Key, err)
	}
	return object, key, nil
}

// marshalStatus encodes st deterministically, as the hash of what a client has needs:
// with the generated encoder, which writes a map's entries in random order, unless a
// node's status holds more than one operational entry.
func marshalStatus(st *nimbusv1.ObjectStatus) ([]byte, error) {
	for _, n := range st.GetNodes() {
		if len(n.GetOperational()) > 1 {
			return proto.MarshalOptions{Deterministic: true}.Marshal(st)
		}
	}
	return st.MarshalVT()
}

// eventObject returns the encoded object of an encoded WatchEvent: its field 2.
func eventObject(event []byte) ([]byte, error) {
	var object []byte
	for len(event) > 0 {
		num, typ, n := protowire.ConsumeTag(event)
		if n < 0 {
			return nil, protowire.ParseError(n)
		}
		event = event[n:]
		m := protowire.ConsumeFieldValue(num, typ, event)
		if m < 0 {
			return nil, protowire.ParseError(m)
		}
		if num == 2 && typ == protowire.BytesType {
			v, _ := protowire.ConsumeBytes(event)
			object = v
		}
		event = event[m:]
	}
	return object, nil
}

// add queues an event.
func (ss *statusStream) add(ev *nimbusv1.StatusEvent) error {
	b, err := proto.Marshal(ev)
	if err != nil {
		return status.Errorf(codes.Internal, "encoding status event: %v", err)
	}
	return ss.addEncoded(b)
}

// addEncoded queues an encoded event, first sending the frame it would overfill.
func (ss *statusStream) addEncoded(ev []byte) error {
	if n := ss.queued(); n > 0 && n+len(ev)+protowire.SizeVarint(uint64(len(ev)))+1 > maxStatusFrameBytes {
		if err := ss.flush(); err != nil {
			return err
		}
	}
	// StatusFrame is field 1, repeated StatusEvent: a frame is its events, each tagged
	// and length-prefixed.
	ss.frame = protowire.AppendTag(ss.frame, 1, protowire.BytesType)
	ss.frame = protowire.AppendBytes(ss.frame, ev)
	return nil
}

// queued returns the encoded size of the frame queued.
func (ss *statusStream) queued() int { return len(ss.frame) + ss.brief.size() }

// flush sends the queued events and brief entries as one frame. gRPC may hold on to the
// frame's bytes after SendMsg returns, so the next frame is a new slice.
func (ss *statusStream) flush() error {
	if ss.queued() == 0 {
		return nil
	}
	frame := ss.brief.appendTo(ss.frame)
	ss.frame = nil
	if err := ss.stream.SendMsg(preEncoded(frame)); err != nil {
		return fmt.Errorf("sending status frame: %w", err)
	}
	return nil
}

// lookStale compares the staleness of the nodes in v with what it was at the last look
// and, with mark, marks the nodes whose staleness changed. Staleness changes with time
// only, so it is looked at every StaleAfter/2, at most every second: a status turns
// stale on the stream at most that long after it does for Get.
func (ss *statusStream) lookStale(v *view, mark bool) {
	if v.staleSince.IsZero() {
		return
	}
	if !ss.startStale && !v.started.After(v.staleSince) {
		// The nodes that never watched are stale from now on. They have no row to look
		// at, so every object is recomputed, once.
		ss.startStale = true
		if mark {
			ss.w.markAll()
		}
	}
	now := make(map[string]bool, len(ss.knownStale))
	for rec := range v.allWatchNodes() {
		stale := rec.Streams == 0 && !rec.Since.After(v.staleSince)
		now[rec.Name] = stale
		// A row new since the last look counts as not stale then: it came with a watch,
		// which marked its node, and may have turned stale since.
		if mark && ss.knownStale[rec.Name] != stale {
			ss.w.markNode(rec.Name)
		}
	}
	ss.knownStale = now
}
