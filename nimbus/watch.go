package nimbus

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// change is one committed change of one object. It is built once per commit, shared by
// every watcher and the history, and never modified once publishLocked has handed it
// over.
type change struct {
	rev uint64
	// key is the changed object's key.
	key *nimbusv1.ObjectKey
	// after is the stored object after the change; nil for a deletion.
	after *nimbusv1.Object
	// beforeNodes are the target nodes of the object before the change. Only they are
	// kept of the object before, so the history does not hold on to replaced objects.
	beforeNodes []string
	// put is the event for nodes after targets; nil when after is nil.
	put *sharedEvent
	// del is the event for nodes the object targeted before and after does not; nil when
	// the change created the object.
	del *sharedEvent
}

// newChange returns the change of revision rev from before to after. put is the PUT event
// of after, which its stored record shares; nil for a deletion.
func newChange(rev uint64, key *nimbusv1.ObjectKey, before, after *nimbusv1.Object, put *sharedEvent) *change {
	c := &change{rev: rev, key: key, after: after, put: put}
	if before != nil {
		c.beforeNodes = before.GetMeta().GetNodes()
		c.del = newSharedEvent(&nimbusv1.WatchEvent{
			Type: nimbusv1.WatchEvent_TYPE_DELETE, Key: key, Revision: rev,
		})
	}
	return c
}

// eventFor returns the event the change means for the node, or nil when it does not
// concern the node.
func (c *change) eventFor(node string) *sharedEvent {
	switch {
	case c.after != nil && targetsNode(c.after, node):
		return c.put
	case c.del != nil && (len(c.beforeNodes) == 0 || slices.Contains(c.beforeNodes, node)):
		return c.del
	}
	return nil
}

// sharedEvent is a watch event shared by the watchers it is sent to. Its wire form is
// encoded once, by whichever watcher sends it first; frames copy it from there.
type sharedEvent struct {
	msg  *nimbusv1.WatchEvent
	once sync.Once
	// wire and err are the result of encoding msg; set by once.
	wire []byte
	err  error
}

func newSharedEvent(msg *nimbusv1.WatchEvent) *sharedEvent {
	return &sharedEvent{msg: msg}
}

// newPutEvent returns the PUT event of a stored object. It carries the object's revision,
// so the change that stored the object and every snapshot that sends it later can share it.
// Like every change's event it leaves out what the client knows already: the key, which
// the object holds, and the epoch, which the stream's start gave.
func newPutEvent(obj *nimbusv1.Object) *sharedEvent {
	return newSharedEvent(&nimbusv1.WatchEvent{
		Type: nimbusv1.WatchEvent_TYPE_PUT, Object: obj, Revision: obj.GetMeta().GetRevision(),
	})
}

// encoded returns the event's wire form, encoding it the first time and counting that in
// encodes. The generated encoder checks no UTF-8, and needs not: every object nimbus
// stores came in through its codec, which refuses invalid strings, or from its own file.
func (e *sharedEvent) encoded(encodes *atomic.Uint64) ([]byte, error) {
	e.once.Do(func() {
		encodes.Add(1)
		e.wire, e.err = e.msg.MarshalVT()
	})
	return e.wire, e.err
}

// watcher is one node's watch stream as commits see it.
type watcher struct {
	node string
	// target tells that the watch makes its node a target of the objects for every node
	// and counts for its staleness: the node's own watch, not a publisher's look at what
	// the node receives (see watchMakesTarget).
	target bool
	// limit is how many events may be queued when a commit that concerns the node starts
	// handing over its events: Options.WatchBuffer, plus the replayed changes of a resumed
	// watch. A commit that finds limit or more queued resets the watcher; one that finds
	// fewer queues all of its events, however many, so that one large commit alone never
	// resets a watcher that keeps up.
	limit int
	// wake holds a token when events may have been queued since the stream last looked.
	wake chan struct{}
	// reset is closed by the commit that found the queue full, or by endWatches.
	reset chan struct{}
	// ended is the error the stream ends with when endWatches or moveOne closed reset;
	// set before.
	ended error
	// moveTo is the address of the replica moveOne asked the agent to move to; set
	// before reset is closed.
	moveTo string
	// caughtUp tells that the stream sent everything queued once: its snapshot or its
	// replayed changes, so that its agent resumes wherever it watches next.
	caughtUp atomic.Bool
	// agent is the version of the watching agent, as its gRPC user agent says
	// (nimbusv1.AgentVersion), empty when it says none; set once after subscribe, read by
	// Nodes.
	agent atomic.Pointer[string]
	// published is the revision of the last change handed to the watcher. A commit stores
	// it after queueing its event, so a watcher that reads published and then finds the
	// queue empty has sent everything up to published.
	published atomic.Uint64

	// mu guards queue, head and commitRev. Commits take it under s.mu; the stream takes it
	// alone, only to take an event off the queue.
	mu sync.Mutex
	// queue[head:] holds the events queued for the stream, oldest first.
	queue []*sharedEvent
	head  int
	// commitRev is the last revision of the commit whose events the watcher was last
	// handed; a change of another revision starts a new commit (see publishLocked).
	commitRev uint64
}

// newWatcher returns a watcher for the node with the events of backlog queued.
func newWatcher(node string, target bool, buffer int, backlog []*sharedEvent) *watcher {
	return &watcher{
		node:   node,
		target: target,
		limit:  buffer + len(backlog),
		wake:   make(chan struct{}, 1),
		reset:  make(chan struct{}),
		queue:  backlog,
	}
}

// queued returns how many events are queued.
func (w *watcher) queued() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.queue) - w.head
}

// pop takes the oldest queued event off the queue; nil when there is none.
func (w *watcher) pop() *sharedEvent {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.head == len(w.queue) {
		return nil
	}
	ev := w.queue[w.head]
	w.queue[w.head] = nil
	w.head++
	if w.head == len(w.queue) {
		w.queue, w.head = w.queue[:0], 0
		if cap(w.queue) > keptQueueCap {
			// A large commit grew the queue; let it go rather than keep it per watcher.
			w.queue = nil
		}
	}
	return ev
}

// keptQueueCap is the capacity of an empty watcher queue beyond which it is let go.
const keptQueueCap = 1024

// pushLocked queues the event of the change of revision rev, which belongs to the commit
// whose last revision is commitRev, and reports false, queueing nothing, when the watcher
// is to be reset: the event is the commit's first for the watcher and limit events or more
// are queued. The caller holds s.mu.
func (w *watcher) pushLocked(ev *sharedEvent, commitRev uint64) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.commitRev != commitRev {
		if len(w.queue)-w.head >= w.limit {
			return false
		}
		w.commitRev = commitRev
	}
	if w.head > 0 && len(w.queue) == cap(w.queue) {
		// Move the queued events to the front before growing the array.
		n := copy(w.queue, w.queue[w.head:])
		clear(w.queue[n:])
		w.queue, w.head = w.queue[:n], 0
	}
	w.queue = append(w.queue, ev)
	select {
	case w.wake <- struct{}{}:
	default:
	}
	return true
}

// dropLocked empties the queue of a watcher being reset. The caller holds s.mu.
func (w *watcher) dropLocked() {
	w.mu.Lock()
	defer w.mu.Unlock()
	clear(w.queue)
	w.queue, w.head = nil, 0
}

// history is the window of the latest changes a watch can resume after. Changes are
// added in revision order; revisions need not be consecutive (those of an etcd-backed
// store are not, see etcd.go), so the window also records floor, the revision after which
// every change up to the newest is kept.
type history struct {
	// max is how many changes are kept.
	max int
	// ring holds the kept changes; it grows to max, then the newest replaces the oldest,
	// which is at head.
	ring []*change
	head int
	// floor is the revision from which on every change is kept: a watch at floor or after
	// it, up to the current revision, can resume.
	floor uint64
}

// add keeps the change, which is newer than every kept one. When the window is full the
// oldest goes, and the floor moves up to it.
func (h *history) add(c *change) {
	switch {
	case h.max == 0:
		h.floor = c.rev
	case len(h.ring) < h.max:
		h.ring = append(h.ring, c)
	default:
		h.floor = h.ring[h.head].rev
		h.ring[h.head] = c
		h.head = (h.head + 1) % h.max
	}
}

// reset forgets every kept change: from now on only a watch at rev or after it resumes.
func (h *history) reset(rev uint64) {
	clear(h.ring)
	h.ring, h.head, h.floor = h.ring[:0], 0, rev
}

// at returns the i-th oldest kept change.
func (h *history) at(i int) *change { return h.ring[(h.head+i)%len(h.ring)] }

// after returns the changes after revision rev up to the current revision cur, oldest
// first, when all of them are kept.
func (h *history) after(rev, cur uint64) ([]*change, bool) {
	if rev > cur || rev < h.floor {
		return nil, false
	}
	first := sort.Search(len(h.ring), func(i int) bool { return h.at(i).rev > rev })
	out := make([]*change, 0, len(h.ring)-first)
	for i := first; i < len(h.ring); i++ {
		out = append(out, h.at(i))
	}
	return out, true
}

// publishLocked keeps a committed change in the history and hands it to every watcher,
// resetting those whose queue is full. The caller holds s.mu, which keeps the hand-over
// in commit order, and hands over the changes of one commit one by one, in revision
// order, after setting s.rev to the commit's last revision: a watcher's queue is
// checked against its limit at the first of a commit's changes that concern it, and then
// takes the rest of the commit whatever its length.
func (s *Server) publishLocked(c *change) {
	s.history.add(c)
	s.metrics.revision.Set(float64(c.rev))
	s.statusWatch.published(c)
	for w := range s.watchers {
		if ev := c.eventFor(w.node); ev != nil && !w.pushLocked(ev, s.rev) {
			s.resetLocked(w)
			s.log.Warn("watcher fell behind; resetting its stream",
				"node", w.node, "buffer", s.opts.WatchBuffer, "revision", c.rev)
			continue
		}
		w.published.Store(c.rev)
	}
}

// resetLocked unregisters a watcher that fell behind and tells its stream to end. Its
// stream may be stuck sending to a client that does not read, so the events it has
// queued are dropped here rather than when it ends: all the watcher holds on to after a
// reset is the frame it may be sending.
func (s *Server) resetLocked(w *watcher) {
	delete(s.watchers, w)
	close(w.reset)
	w.dropLocked()
	s.resets.Add(1)
	s.metrics.resets.Inc()
	s.metrics.watchers.Set(float64(len(s.watchers)))
}

// resetError returns the error a reset watcher's stream ends with: the one endWatches
// gave, else full, for a watcher that fell behind. reset must be closed.
func (w *watcher) resetError(full error) error {
	if w.ended != nil {
		return w.ended
	}
	return full
}

// endWatches ends every watch stream with codes.Unavailable and the reason, so that
// their clients watch again, on another replica when this one is not ready. Watches
// started after it are served as ever.
func (s *Server) endWatches(why string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	err := status.Error(codes.Unavailable, why)
	for w := range s.watchers {
		delete(s.watchers, w)
		w.ended = err
		close(w.reset)
		w.dropLocked()
	}
	s.metrics.watchers.Set(0)
}

// subscription is a registered watcher and where its stream starts.
type subscription struct {
	w *watcher
	// resumed is true when the watcher's stream continues after the client's revision:
	// its events start with every kept change after that revision that concerns the node.
	resumed bool
	// snap is the read of the store the snapshot is sent from; nil when resumed.
	snap *tables
	// rev is the snapshot's revision, or the client's when resumed.
	rev uint64
	// replayed is how many kept changes were queued for a resumed watcher.
	replayed int
	// why says why a client that asked to resume gets a snapshot; empty when it did not ask
	// or when resumed.
	why string
}

// subscribe registers a watcher for the node, which with target counts as watching (see
// watcher.target). When epoch is the server's and every change
// after rev is kept, the watcher resumes: the changes after rev that concern the node are
// queued ahead of the ones to come. Otherwise it gets a read of the store at the revision
// from which on every commit reaches the watcher, for a snapshot. Both happen under the
// lock every commit holds, so no change is missed or queued twice.
func (s *Server) subscribe(node string, target bool, epoch string, rev uint64) (*subscription, error) {
	// The node counts as watching from here on. Its record is written before s.mu is
	// taken, not under it: status reports take the store's writer in turn, and a watch
	// start waiting for them must not hold up the commits and the other watch starts
	// that need s.mu.
	if target {
		s.recordWatchStart(node)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		if target {
			if err := s.recordWatchEnd(node); err != nil {
				s.log.Error("recording the end of a watch", "node", node, "error", err)
			}
		}
		return nil, fmt.Errorf("watching for node %s: %w", node, ErrClosed)
	}

	sub := &subscription{rev: s.rev}
	var backlog []*sharedEvent
	switch {
	case epoch == "":
	case epoch != s.Epoch():
		sub.why = fmt.Sprintf("epoch %s is not the current %s", epoch, s.Epoch())
	case rev > s.rev:
		sub.why = fmt.Sprintf("revision %d is ahead of the current %d", rev, s.rev)
	default:
		changes, ok := s.history.after(rev, s.rev)
		if !ok {
			sub.why = fmt.Sprintf("changes after revision %d are no longer kept", rev)
			break
		}
		for _, c := range changes {
			if ev := c.eventFor(node); ev != nil {
				backlog = append(backlog, ev)
			}
		}
		sub.resumed, sub.rev, sub.replayed = true, rev, len(backlog)
	}
	// The queue has room for the replayed changes on top of the usual WatchBuffer.
	w := newWatcher(node, target, s.opts.WatchBuffer, backlog)
	w.published.Store(s.rev)
	s.watchers[w] = struct{}{}
	sub.w = w
	if sub.resumed {
		s.metrics.watchStarts.WithLabelValues(watchModeResume).Inc()
	} else {
		// Only the objects: the statuses reported while the snapshot is sent are not kept
		// alive by it.
		sub.snap = s.store.read().objectsOnly()
		s.metrics.watchStarts.WithLabelValues(watchModeSnapshot).Inc()
	}
	s.metrics.watchers.Set(float64(len(s.watchers)))
	return sub, nil
}

// unsubscribe unregisters the watcher of a stream that ended and records when the node
// last had an open watch. The watchers gauge moves last, so whoever sees it move also
// sees the node's watch state.
func (s *Server) unsubscribe(w *watcher) {
	// As in subscribe, the store's writer is not waited for under s.mu.
	if w.target {
		if err := s.recordWatchEnd(w.node); err != nil {
			s.log.Error("recording the end of a watch", "node", w.node, "error", err)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.watchers, w)
	s.metrics.watchers.Set(float64(len(s.watchers)))
}

// recordWatchStart counts one more open watch stream of the node on this server, and
// tells the status watchers and the peer replicas.
func (s *Server) recordWatchStart(node string) {
	txn := s.store.write()
	next := &watchNodeRecord{Name: node, Streams: 1}
	if rec := txn.watchNode(node); rec != nil {
		next.Streams, next.Peers = rec.Streams+1, rec.Peers
	}
	txn.putWatchNode(next)
	txn.commit()
	s.statusWatch.nodeChanged(node)
	s.peers.presenceChanged(node)
}

// recordWatchEnd counts one open watch stream of the node on this server less, records
// the time when it was the last of the node's streams, here and on the peer replicas, and
// tells the status watchers. When it was the last, the node's watch state is forgotten
// unless the node has a Node object or a stored status; see forgetIdleNodes.
func (s *Server) recordWatchEnd(node string) error {
	txn := s.store.write()
	defer txn.abort()
	rec := txn.watchNode(node)
	if rec == nil || rec.local() == 0 {
		return fmt.Errorf("node %s has no open watch stream on record", node)
	}
	next := &watchNodeRecord{Name: node, Streams: rec.Streams - 1, Peers: rec.Peers, Since: rec.Since}
	if next.Streams == 0 {
		next.Since = s.opts.Now()
	}
	txn.putWatchNode(next)
	forgetIdleNodes(txn, node)
	txn.commit()
	s.statusWatch.nodeChanged(node)
	s.peers.presenceChanged(node)
	return nil
}

// forgetIdleNodes deletes the rows of watch_nodes of those of the nodes that nothing keeps
// one for: no open watch stream, no Node object, no stored status and no watermark. Once
// a node's streams have ended, its row only serves the staleness of its statuses, and
// those matter only while it has statuses that count: as a target by its Node object, or
// by meta.nodes with a status or a watermark stored. Every commit that can end the last of
// them calls it for the node, so the rows are bounded by the nodes watching, the Node
// objects and the nodes with a status or a watermark.
func forgetIdleNodes(txn *writeTxn, nodes ...string) {
	var named map[string]bool // the names of the Node objects, read once when needed
	for _, node := range nodes {
		if rec := txn.watchNode(node); rec == nil || rec.Streams > 0 || txn.hasStatusFrom(node) || txn.watermark(node) != nil {
			continue
		}
		if named == nil {
			named = map[string]bool{}
			for rec := range txn.objectsOfKind(nimbusv1.Kind_KIND_NODE) {
				named[rec.Object.GetMeta().GetName()] = true
			}
		}
		if !named[node] {
			txn.deleteWatchNode(node)
		}
	}
}

// Watch streams the objects targeted at the requesting node, in WatchFrames of many
// events. A request with the server's epoch and a revision whose later changes are all
// kept resumes: RESUMED with that revision, then every kept change after it that concerns
// the node. Any other request gets a snapshot, then SYNCED. Either way every later change
// follows, with bookmarks while idle. It returns when the client goes away, when the
// watcher falls behind (codes.ResourceExhausted) or when the Server is closed
// (codes.Unavailable).
func (s *Server) Watch(req *nimbusv1.WatchRequest, stream grpc.ServerStreamingServer[nimbusv1.WatchFrame]) error {
	node := req.GetNode()
	if err := validateNode(node); err != nil {
		return status.Error(codes.InvalidArgument, err.Error())
	}
	if req.GetEpoch() == s.Epoch() {
		// A watch from another replica may be ahead of this one's cache: let the cache
		// catch up, so that it resumes rather than starting over.
		s.backend.catchUp(stream.Context(), req.GetRevision())
	}
	sub, err := s.subscribe(node, s.watchMakesTarget(stream.Context()), req.GetEpoch(), req.GetRevision())
	if err != nil {
		return rpcError(err)
	}
	defer s.unsubscribe(sub.w)
	sub.w.agent.Store(new(agentVersionOf(stream.Context())))
	log := s.log.With("node", node)
	fw := &frameWriter{stream: stream, node: node, encodes: &s.encodes}
	if sub.resumed {
		log.Info("watch resumed", "revision", sub.rev, "replayed", sub.replayed)
		// RESUMED goes out with the first replayed changes, in the first frame.
		err = fw.addControl(&nimbusv1.WatchEvent{Type: nimbusv1.WatchEvent_TYPE_RESUMED, Revision: sub.rev, Epoch: s.Epoch()})
	} else {
		if sub.why != "" {
			log.Info("watch cannot resume; sending a snapshot", "reason", sub.why)
		}
		log.Info("watch started", "revision", sub.rev)
		err = s.sendSnapshot(fw, sub.snap, node, sub.rev)
		// The read holds on to the store as it was; let it go before streaming changes.
		sub.snap = nil
	}
	if err == nil {
		err = s.sendChanges(fw, sub.w)
	}
	setMoveTrailer(stream, sub.w)
	log.Info("watch ended", "reason", err)
	return err
}

// validateNode checks a watching node's name.
func validateNode(node string) error {
	err := (&nimbusv1.ObjectKey{Kind: nimbusv1.Kind_KIND_NODE, Name: node}).Validate()
	if err == nil {
		return nil
	}
	reason := err.Error()
	var fe *nimbusv1.FieldError
	if errors.As(err, &fe) {
		reason = fe.Reason
	}
	return &nimbusv1.FieldError{Field: "node", Value: node, Reason: reason}
}

// sendSnapshot sends every object in snap that targets the node, then adds SYNCED at rev
// to the frame under way, which sendChanges sends with the first changes queued. Each
// object's event is the one its record shares, so a snapshot encodes only the objects no
// watcher has been sent yet.
func (s *Server) sendSnapshot(fw *frameWriter, snap *tables, node string, rev uint64) error {
	// The objects for every node go in frames that every snapshot of this revision shares;
	// then the objects that name their nodes, this node among them. A client applies a
	// snapshot whole at SYNCED, so the order of its events does not matter.
	shared := s.everyNodeSnapshot(snap)
	if shared.err != nil {
		return status.Errorf(codes.Internal, "encoding the snapshot of revision %d: %v", snap.revision(), shared.err)
	}
	for _, frame := range shared.frames {
		if err := fw.sendShared(frame); err != nil {
			return err
		}
	}
	// The events that did not fill a frame start this stream's own, so that every frame
	// but the last is full.
	for _, ev := range shared.tail {
		if err := fw.addEncoded(ev); err != nil {
			return err
		}
	}
	for rec := range snap.objectsFor(node) {
		if err := fw.add(rec.putEvent()); err != nil {
			return err
		}
	}
	return fw.addControl(&nimbusv1.WatchEvent{Type: nimbusv1.WatchEvent_TYPE_SYNCED, Revision: rev, Epoch: s.Epoch()})
}

// sharedSnapshot is the part of the snapshot of one revision that every node receives
// alike: the PUT events of the objects meant for every node (no meta.nodes), packed into
// frames once, which every snapshot of that revision sends as they are. When a thousand
// agents start over at once, the server then walks and copies the store once, not a
// thousand times. The frames are plain slices: gRPC only reads what a stream sends as
// preEncoded, so every stream can send the same bytes.
type sharedSnapshot struct {
	rev  uint64
	once sync.Once
	// frames are the full frames; tail the events left over, too few to fill one.
	frames, tail [][]byte
	err          error
}

// everyNodeSnapshot returns the shared part of the snapshot of snap, made by the first
// snapshot of its revision. The server keeps the latest revision's only; a snapshot of an
// older revision, which a newer one raced past, makes its own.
func (s *Server) everyNodeSnapshot(snap *tables) *sharedSnapshot {
	rev := snap.revision()
	cur := s.everyNode.Load()
	if cur == nil || cur.rev < rev {
		next := &sharedSnapshot{rev: rev}
		if s.everyNode.CompareAndSwap(cur, next) {
			cur = next
		} else {
			cur = s.everyNode.Load()
		}
	}
	if cur == nil || cur.rev != rev {
		cur = &sharedSnapshot{rev: rev}
	}
	cur.once.Do(func() { cur.frames, cur.tail, cur.err = s.everyNodeFrames(snap) })
	return cur
}

// everyNodeFrames packs the PUT events of the objects of snap meant for every node into
// full frames of at most maxFrameBytes (an event larger than that alone in its frame), and
// returns the events left over.
func (s *Server) everyNodeFrames(snap *tables) (frames, tail [][]byte, err error) {
	size := 0
	pack := func() {
		frame := make([]byte, 0, size)
		for _, b := range tail {
			frame = protowire.AppendTag(frame, 1, protowire.BytesType)
			frame = protowire.AppendBytes(frame, b)
		}
		frames = append(frames, frame)
		tail, size = nil, 0
	}
	for rec := range snap.objectsOfKind(nimbusv1.Kind_KIND_UNSPECIFIED) {
		if len(rec.Object.GetMeta().GetNodes()) != 0 {
			continue
		}
		b, err := rec.putEvent().encoded(&s.encodes)
		if err != nil {
			return nil, nil, fmt.Errorf("encoding %s: %w", rec.Key, err)
		}
		n := frameFieldSize(len(b))
		if len(tail) > 0 && size+n > maxFrameBytes {
			pack()
		}
		tail = append(tail, b)
		size += n
	}
	return frames, tail, nil
}

// sendChanges sends the watcher's events as they come, as many as are queued and fit in
// one frame at a time, and bookmarks while there are none. It first sends what the frame
// writer holds already.
func (s *Server) sendChanges(fw *frameWriter, w *watcher) error {
	errReset := status.Errorf(codes.ResourceExhausted,
		"watcher for node %s fell behind (more than %d events queued); watch again to resume or resubscribe",
		w.node, s.opts.WatchBuffer)
	var tick <-chan time.Time
	if s.opts.BookmarkInterval > 0 {
		t := time.NewTicker(s.opts.BookmarkInterval)
		defer t.Stop()
		tick = t.C
	}
	ctx := fw.stream.Context()
	idle := true // nothing sent since the last tick
	for {
		// A reset wins over the events still queued: the client starts over anyway.
		select {
		case <-w.reset:
			return w.resetError(errReset)
		default:
		}
		// Fill the frame with what is queued, without waiting, until an event does not fit
		// and add sends the frame; that event starts the next one, which the next round
		// fills further.
		sent := fw.sent
		for fw.sent == sent {
			ev := w.pop()
			if ev == nil {
				break
			}
			if err := fw.add(ev); err != nil {
				return err
			}
		}
		if fw.sent != sent {
			idle = false
			continue
		}
		if fw.pending() {
			if err := fw.flush(); err != nil {
				return err
			}
			idle = false
			continue
		}
		w.caughtUp.Store(true)
		select {
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		case <-s.done:
			return status.Error(codes.Unavailable, "nimbus is shutting down; watch again")
		case <-w.reset:
			return w.resetError(errReset)
		case <-w.wake:
		case <-tick:
			if !idle {
				idle = true
				continue
			}
			// Read published before looking at the queue; see watcher.published.
			rev := w.published.Load()
			if w.queued() > 0 {
				continue
			}
			err := fw.addControl(&nimbusv1.WatchEvent{Type: nimbusv1.WatchEvent_TYPE_BOOKMARK, Revision: rev, Epoch: s.Epoch()})
			if err != nil {
				return err
			}
		}
	}
}

// maxFrameBytes bounds the wire form of a WatchFrame; an event larger than that travels
// alone, in a frame just large enough. Frames far above the HTTP/2 frame size (16 KiB)
// save nothing more per event, while every frame a stream has under way is held in
// memory until it is written, so the bound stays small: it is gRPC's 32 KiB buffer size,
// which its buffer pool recycles.
const maxFrameBytes = 32 << 10

// frameWriter assembles a watch stream's events into frames and sends them. A frame is a
// WatchFrame in wire form: for each event the tag of field 1, the length and the event's
// wire form, which for an object's event is the shared one, copied and never encoded
// again.
type frameWriter struct {
	stream grpc.ServerStream
	node   string
	// encodes counts the shared events encoded; see Server.encodes.
	encodes *atomic.Uint64
	// events are the wire forms of the events of the frame under way, and size the length
	// of the frame they make.
	events [][]byte
	size   int
	// sent counts the frames sent.
	sent int
}

// frameFieldSize returns the length an event of n bytes takes in a frame.
func frameFieldSize(n int) int {
	return protowire.SizeTag(1) + protowire.SizeBytes(n)
}

// pending reports whether the frame under way holds events.
func (f *frameWriter) pending() bool { return len(f.events) > 0 }

// add adds a shared event to the frame under way, sending the frame first when the event
// does not fit in it.
func (f *frameWriter) add(ev *sharedEvent) error {
	b, err := ev.encoded(f.encodes)
	if err != nil {
		return status.Errorf(codes.Internal, "encoding event of revision %d: %v", ev.msg.GetRevision(), err)
	}
	return f.addEncoded(b)
}

// addControl adds an event made for this stream alone, such as SYNCED or a bookmark, as
// add does.
func (f *frameWriter) addControl(ev *nimbusv1.WatchEvent) error {
	b, err := proto.Marshal(ev)
	if err != nil {
		return status.Errorf(codes.Internal, "encoding %v event: %v", ev.GetType(), err)
	}
	return f.addEncoded(b)
}

func (f *frameWriter) addEncoded(b []byte) error {
	n := frameFieldSize(len(b))
	if len(f.events) > 0 && f.size+n > maxFrameBytes {
		if err := f.flush(); err != nil {
			return err
		}
	}
	f.events = append(f.events, b)
	f.size += n
	return nil
}

// sendShared sends a frame shared with other streams, after the frame under way.
func (f *frameWriter) sendShared(frame []byte) error {
	if err := f.flush(); err != nil {
		return err
	}
	f.sent++
	if err := f.stream.SendMsg(preEncoded(frame)); err != nil {
		return fmt.Errorf("sending a shared frame to node %s: %w", f.node, err)
	}
	return nil
}

// flush sends the frame under way, if it holds events. The frame is written into a buffer
// of gRPC's pool, which gRPC returns to the pool once the frame is on the wire.
func (f *frameWriter) flush() error {
	if len(f.events) == 0 {
		return nil
	}
	pool := mem.DefaultBufferPool()
	buf := pool.Get(f.size)
	frame := (*buf)[:0]
	for _, b := range f.events {
		frame = protowire.AppendTag(frame, 1, protowire.BytesType)
		frame = protowire.AppendBytes(frame, b)
	}
	*buf = frame
	n := len(f.events)
	clear(f.events)
	f.events, f.size = f.events[:0], 0
	f.sent++
	if err := f.stream.SendMsg(encodedFrame{mem.NewBuffer(buf, pool)}); err != nil {
		return fmt.Errorf("sending a frame of %d events to node %s: %w", n, f.node, err)
	}
	return nil
}
