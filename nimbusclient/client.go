package nimbusclient

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	grpcbackoff "google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/naplesnet/naples/delphi"
	"github.com/naplesnet/naples/internal/address"
	"github.com/naplesnet/naples/internal/backoff"
	"github.com/naplesnet/naples/internal/codec"
	"github.com/naplesnet/naples/internal/connfail"
	"github.com/naplesnet/naples/internal/pki"
	"github.com/naplesnet/naples/internal/version"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// Store is what the client needs of delphi.
type Store interface {
	ClaimDesired() (*delphi.DesiredWriter, error)
	Resume() (epoch string, revision uint64)
	Get(key *nimbusv1.ObjectKey) (*nimbusv1.Object, bool)
	Version(key nimbusv1.Key) (delphi.Version, bool)
	StatusOf(key nimbusv1.Key) (*nimbusv1.NodeStatus, bool)
	Statuses() []delphi.StatusEntry
	Subscribe(opts delphi.SubscribeOptions) (*delphi.Subscription, error)
}

var _ Store = (*delphi.Store)(nil)

// desiredWriter is what the client needs of delphi's desired writer.
type desiredWriter interface {
	Commit(t *delphi.DesiredTxn) error
	MarkSynced()
}

var _ desiredWriter = (*delphi.DesiredWriter)(nil)

// Bounds of the watch's group commits and of what it reads ahead of them.
const (
	// maxCommitEvents bounds how many changes one delphi commit takes; a snapshot is one
	// commit however large.
	maxCommitEvents = 10000
	// maxCommitBytes bounds the wire size of the frames one delphi commit takes, but for
	// its first frame and a snapshot.
	maxCommitBytes = 8 << 20
	// readAhead is how many received frames may wait for the next commit.
	readAhead = 256
	// maxFrameBytes is the largest frame the client accepts. nimbus bounds its frames far
	// below, but sends an event larger than its bound alone, and takes objects up to
	// 16 MiB.
	maxFrameBytes = 32 << 20
	// receiveWindow is the HTTP/2 flow-control window of the connection to nimbus and of
	// each of its streams: how much nimbus may send before the client tells it how much
	// it read. See WindowOptions.
	receiveWindow = 1 << 20
)

// Options configures a Client.
type Options struct {
	// Node is this node's name; nimbus sends the objects targeted at it. Required.
	Node string
	// Address is nimbus's address, "unix:///path" or "tcp://host:port", or a
	// comma-separated list of the addresses of nimbus replicas, which may mix the two:
	// "tcp://10.0.0.1:7000,tcp://10.0.0.2:7000". The client watches one replica at a time,
	// chosen at random among those that are ready, and moves to another when its
	// connection fails, it stops serving, or it asks the client to move (see the package
	// documentation). A tcp host name given alone stands for every address it resolves
	// to. Required.
	Address string
	// Store is the local delphi store. Required.
	Store Store
	// MinBackoff and MaxBackoff bound the delay between reconnects. The delay starts at
	// MinBackoff, doubles with each stream that ends before nimbus took it, up to
	// MaxBackoff, and a random half of it is waited; it starts over once a stream is
	// taken: a watch's first event, a status stream's headers. Defaults: 100ms, 30s.
	MinBackoff, MaxBackoff time.Duration
	// TLS, when set, is the TLS configuration the client dials nimbus with: the CAs that
	// verify nimbus and this node's client certificate, whose name must be Node for nimbus
	// to let the client watch and report; internal/pki's ClientConfig builds one.
	// Default: nil, which dials plaintext.
	TLS *tls.Config
	// DialOptions are added to the client's gRPC dial options, after the ones the client
	// sets itself.
	DialOptions []grpc.DialOption
	// StatusExceptionAfter is how long an object may be short of PROGRAMMED at its
	// generation, without failing, before its status is reported on its own rather than
	// holding the node's status watermark back; StatusMaxExceptions bounds how many are
	// reported so at once (docs/status.md). Defaults: watermark.DefaultExceptionAfter (2s)
	// and watermark.DefaultMaxExceptions (1,000).
	StatusExceptionAfter time.Duration
	StatusMaxExceptions  int
	// Logger receives the client's logs. Default: slog.Default().
	Logger *slog.Logger
	// FlowTap, when set, serves the flow tap: the client keeps one open to the replica it
	// watches, alongside the watch and status streams. Default: nil, no tap.
	FlowTap FlowTapper
	// Registerer takes the client's Prometheus metrics (see the package documentation);
	// Close unregisters them. Default: a private prometheus.Registry.
	Registerer prometheus.Registerer
	// Burst, when set, is called as the client receives a frame of BurstEvents events or
	// more: a burst of changes (a bulk apply, a snapshot), for which the process raises
	// its garbage collector's target (memsettle's StartBurst) at once rather than at its
	// settler's next tick. It must be quick. Default: nil.
	Burst func()
}

// BurstEvents is how many events a frame of the watch holds at least for Options.Burst
// to be called: steady changes come a few to a frame.
const BurstEvents = 64

// Client keeps delphi's desired table in step with nimbus and reports status upstream.
type Client struct {
	opts Options
	// target and targetOptions are what grpc.NewClient reaches Options.Address with.
	target        string
	targetOptions []grpc.DialOption
	store         Store
	desired       desiredWriter
	// commitEvents bounds the changes of one commit: maxCommitEvents, less in tests.
	commitEvents int
	log          *slog.Logger
	metrics      *metrics
	closeOnce    sync.Once
	// received counts watch events received, snapshots included.
	received atomic.Uint64
	// wait waits d before a stream is started again, or until ctx ends; tests replace it.
	wait func(ctx context.Context, stream string, d time.Duration) error

	// moveMu guards moveFrom, moveTo, endStatus and endTap.
	moveMu sync.Mutex
	// moveFrom is the address of the replica that last asked the client to watch another
	// one, and moveTo the address it suggested, until a watch stream starts; see moved.
	moveFrom, moveTo string
	// endStatus ends the status stream under way, endTap the flow tap.
	endStatus context.CancelCauseFunc
	endTap    context.CancelCauseFunc

	// marks is what the status streams to a nimbus that takes watermarks carry over from
	// one to the next; only the status stream's loop uses it.
	marks *markReport
}

// errMoved is why a stream ended when nimbus asked the client to watch another replica.
var errMoved = errors.New("nimbus asked to watch another replica")

// EventsReceived returns how many watch events the client has received from nimbus,
// snapshot events and markers included.
func (c *Client) EventsReceived() uint64 { return c.received.Load() }

// New builds a client, registers its metrics and claims delphi's desired writer.
func New(opts Options) (*Client, error) {
	if opts.Node == "" {
		return nil, errors.New("nimbusclient: Options.Node is required")
	}
	if opts.Store == nil {
		return nil, errors.New("nimbusclient: Options.Store is required")
	}
	addrs, err := address.ParseList(opts.Address)
	if err != nil {
		return nil, fmt.Errorf("nimbus address: %w", err)
	}
	if opts.MinBackoff <= 0 {
		opts.MinBackoff = 100 * time.Millisecond
	}
	if opts.MaxBackoff <= 0 {
		opts.MaxBackoff = 30 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Registerer == nil {
		opts.Registerer = prometheus.NewRegistry()
	}
	c := &Client{
		opts:         opts,
		store:        opts.Store,
		commitEvents: maxCommitEvents,
		log:          opts.Logger.With("nimbus", addrs.String()),
		wait:         sleep,
	}
	c.target, c.targetOptions = addrs.GRPCTarget()
	if c.metrics, err = newMetrics(c, opts.Registerer); err != nil {
		return nil, fmt.Errorf("nimbusclient: %w", err)
	}
	if c.desired, err = opts.Store.ClaimDesired(); err != nil {
		c.metrics.unregister()
		return nil, err
	}
	return c, nil
}

// Close unregisters the client's metrics. Call it once Run has returned; it is safe to
// call twice.
func (c *Client) Close() error {
	c.closeOnce.Do(c.metrics.unregister)
	return nil
}

// CodecOption returns the dial option of the codec the client talks to nimbus with.
// Decoding watch frames is most of what the client costs; the generated code does it
// without reflection and with fewer allocations. Nimbus sends only strings it checked,
// and delphi refuses to store any other. The watch receives each frame into a
// nimbusv1.PooledFrame: one copy of its bytes, which its strings are views of, and its
// events, objects and their parts taken from arrays that the next frame received into the
// same storage reuses. Nothing here keeps them past delphi's commit, after which the frame
// is released, and delphi keeps objects encoded afresh and index values and the epoch
// copied. Other calls decode a message's strings as views of one copy of it.
func CodecOption() grpc.DialOption {
	return codec.Codec{SkipUTF8Check: true, ShareData: true}.DialOption()
}

// WindowOptions returns the dial options of the flow-control windows the client receives
// from nimbus with: 1 MiB for the connection and for each stream, fixed. gRPC's default
// window starts at 64 KiB and grows from the round trip of a ping the client sends
// whenever data comes and no ping is out: during a snapshot, a ping and its answer every
// round trip and a window update for every quarter of a small window read, each a write
// on both sides. A fixed window sends no pings and a window update per 256 KiB read. The
// client reads what it is sent as it comes (up to readAhead frames wait for delphi), so
// the window bounds the bytes in flight, not what piles up; over a long link, 1 MiB per
// round trip is what a snapshot can go at.
func WindowOptions() []grpc.DialOption {
	return []grpc.DialOption{grpc.WithInitialWindowSize(receiveWindow), grpc.WithInitialConnWindowSize(receiveWindow)}
}

// Run watches and reports until ctx ends, reconnecting whenever a stream breaks. It returns
// nil once ctx ends.
func (c *Client) Run(ctx context.Context) error {
	dial := append(append([]grpc.DialOption{
		CodecOption(),
		// nimbus shows the agent's version (its web console's nodes page).
		grpc.WithUserAgent(nimbusv1.AgentUserAgent(version.Get())),
		grpc.WithTransportCredentials(pki.TransportCredentials(c.opts.TLS)),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 10 * time.Second, Timeout: 5 * time.Second, PermitWithoutStream: true}),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           grpcbackoff.Config{BaseDelay: c.opts.MinBackoff, Multiplier: 1.6, Jitter: 0.2, MaxDelay: c.opts.MaxBackoff},
			MinConnectTimeout: 5 * time.Second,
		}),
	}, WindowOptions()...), c.targetOptions...)
	dial = append(dial, c.opts.DialOptions...)
	conn, err := grpc.NewClient(c.target, dial...)
	if err != nil {
		return fmt.Errorf("creating nimbus client: %w", err)
	}
	defer conn.Close()
	api := nimbusv1.NewNimbusClient(conn)

	var wg sync.WaitGroup
	wg.Go(func() {
		c.loop(ctx, streamWatch, func(ctx context.Context, taken func()) error { return c.watch(ctx, api, taken) })
	})
	wg.Go(func() {
		defer c.dropMarks()
		c.loop(ctx, streamStatus, func(ctx context.Context, taken func()) error { return c.reportRouted(ctx, api, taken) })
	})
	if c.opts.FlowTap != nil {
		wg.Go(func() {
			c.loop(ctx, streamFlowTap, func(ctx context.Context, taken func()) error { return c.tapRouted(ctx, conn, taken) })
		})
	}
	wg.Go(func() { connfail.Log(ctx, conn, c.log.With("server", c.opts.Address), c.opts.TLS != nil) })
	wg.Wait()
	return nil
}

// loop runs one stream again and again with backoff until ctx ends. run calls taken, from
// any goroutine, once nimbus has taken the stream; the backoff then starts over, so that
// a failover right after another is not slowed by the first.
func (c *Client) loop(ctx context.Context, stream string, run func(ctx context.Context, taken func()) error) {
	b := backoff.Backoff{Min: c.opts.MinBackoff, Max: c.opts.MaxBackoff}
	for {
		var taken atomic.Bool
		err := run(ctx, func() { taken.Store(true) })
		if ctx.Err() != nil {
			return
		}
		if taken.Load() {
			b.Reset()
		}
		delay := b.Next()
		attrs := []any{"stream", stream, "err", err, "in", delay}
		if hint := pki.DialHint(err, c.opts.TLS != nil); hint != "" {
			attrs = append(attrs, "hint", hint)
		}
		if errors.Is(err, errMoved) {
			c.log.Info("nimbus stream ended to move to another replica; reconnecting", attrs...)
		} else {
			c.log.Warn("nimbus stream ended; reconnecting", attrs...)
		}
		if c.wait(ctx, stream, delay) != nil {
			return
		}
		c.metrics.reconnects.WithLabelValues(stream).Inc()
	}
}

// route returns the Route of a stream about to start: one that moves the client off the
// replica that asked it to, while it did not watch elsewhere yet.
func (c *Client) route() *address.Route {
	c.moveMu.Lock()
	defer c.moveMu.Unlock()
	return c.routeLocked()
}

// routeLocked is route with c.moveMu held.
func (c *Client) routeLocked() *address.Route {
	return &address.Route{Avoid: c.moveFrom, Prefer: c.moveTo}
}

// moved records that the replica at the address from asked the client to watch another
// one, the one at to if it can, and ends the status stream and the flow tap, so that
// every stream starts again there.
func (c *Client) moved(from, to string) {
	c.moveMu.Lock()
	c.moveFrom, c.moveTo = from, to
	end, endTap := c.endStatus, c.endTap
	c.moveMu.Unlock()
	c.metrics.moves.Inc()
	c.log.Info("nimbus asked to watch another replica", "from", from, "suggested", to)
	if end != nil {
		end(errMoved)
	}
	if endTap != nil {
		endTap(errMoved)
	}
}

// watching records that a watch stream started: the move asked for, if any, is done.
func (c *Client) watching() {
	c.moveMu.Lock()
	c.moveFrom, c.moveTo = "", ""
	c.moveMu.Unlock()
}

// reportRouted runs one status stream (report) on the replica route picks; the stream
// ends with errMoved when nimbus asks the client to move.
func (c *Client) reportRouted(ctx context.Context, api nimbusv1.NimbusClient, taken func()) error {
	return c.routed(ctx, &c.endStatus, "status stream", func(ctx context.Context) error { return c.report(ctx, api, taken) })
}

// routed runs a stream that follows the watch, run, on the replica route picks, with
// *end set to what ends it (under c.moveMu), so that moved can; it ends with errMoved,
// wrapped in what, when nimbus asks the client to move.
func (c *Client) routed(ctx context.Context, end *context.CancelCauseFunc, what string, run func(ctx context.Context) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	c.moveMu.Lock()
	*end = cancel
	route := c.routeLocked()
	c.moveMu.Unlock()
	err := run(address.WithRoute(ctx, route))
	if errors.Is(context.Cause(ctx), errMoved) {
		return fmt.Errorf("%s: %w", what, errMoved)
	}
	return err
}

// moveAsked returns the address a watch stream's trailer asks the client to move to, and
// whether it asks at all.
func moveAsked(trailer metadata.MD) (string, bool) {
	v := trailer.Get(nimbusv1.MoveTrailer)
	if len(v) == 0 {
		return "", false
	}
	return v[0], true
}

// sleep waits d, or until ctx ends, and then returns ctx's error.
func sleep(ctx context.Context, _ string, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// watch runs one Watch stream, committing what it receives to delphi. A goroutine
// receives the frames while the last commit is written, and everything received by the
// time it is done goes into the next commit (up to maxCommitEvents and maxCommitBytes),
// with the resume point of its last event: a commit holds a prefix of the stream and says
// which, so a crash between commits leaves delphi consistent at its resume point. It
// calls taken at the stream's first event.
func (c *Client) watch(ctx context.Context, api nimbusv1.NimbusClient, taken func()) error {
	ctx, cancel := context.WithCancel(ctx)
	epoch, rev := c.store.Resume()
	route := c.route()
	stream, err := api.Watch(address.WithRoute(ctx, route), &nimbusv1.WatchRequest{Node: c.opts.Node, Epoch: epoch, Revision: rev},
		grpc.WaitForReady(true), grpc.MaxCallRecvMsgSize(maxFrameBytes))
	if err != nil {
		cancel()
		return fmt.Errorf("starting watch: %w", err)
	}
	frames := make(chan receivedFrame, readAhead)
	var recvErr error
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
		c.metrics.connected.Set(0)
		c.metrics.server.Reset()
	}()
	wg.Go(func() {
		defer close(frames)
		for {
			f := new(nimbusv1.PooledFrame)
			if err := stream.RecvMsg(f); err != nil {
				f.Release()
				recvErr = err
				return
			}
			c.received.Add(uint64(len(f.Events())))
			if len(f.Events()) >= BurstEvents && c.opts.Burst != nil {
				c.opts.Burst()
			}
			select {
			case frames <- receivedFrame{frame: f, events: f.Events(), size: f.Size()}:
			case <-ctx.Done():
				f.Release()
				recvErr = ctx.Err()
				return
			}
		}
	})

	w := &watchStream{c: c, server: peerAddress(stream.Context()), taken: taken}
	defer w.release()
	for f := range frames {
		if err := w.add(f); err != nil {
			return err
		}
		// Everything already received joins the commit, up to its bounds. This loop is the
		// only receiver, so a frame waiting is one it gets without blocking.
		for len(frames) > 0 && !w.full() {
			f := <-frames
			if w.pending.events > 0 && w.pending.size+f.size > maxCommitBytes {
				if err := w.commit(); err != nil {
					return err
				}
			}
			if err := w.add(f); err != nil {
				return err
			}
		}
		if err := w.commit(); err != nil {
			return err
		}
	}
	// Frames are closed once receiving failed; recvErr is set by then. A status from
	// nimbus comes with the stream's trailer.
	if status.Code(recvErr) == codes.Unavailable {
		if to, ok := moveAsked(stream.Trailer()); ok {
			c.moved(route.Chosen(), to)
			return fmt.Errorf("receiving watch events: %w: %w", errMoved, recvErr)
		}
	}
	return fmt.Errorf("receiving watch events: %w", recvErr)
}

// peerAddress returns the address of the nimbus a stream is up to, in the form
// Options.Address takes: the address it resolved to, for a host name. It is "unknown" when
// gRPC does not tell.
func peerAddress(ctx context.Context) string {
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return "unknown"
	}
	return address.Address{Network: p.Addr.Network(), Addr: p.Addr.String()}.String()
}

// receivedFrame is a frame, its events and its wire size.
type receivedFrame struct {
	frame  *nimbusv1.PooledFrame
	events []*nimbusv1.WatchEvent
	size   int
}

// watchStream is the state of one watch stream as its events are committed: whether it
// started, the snapshot it is receiving, and the changes received since the last commit.
type watchStream struct {
	c *Client
	// server is the address of the nimbus the stream is up to.
	server string
	// taken is called at the first event.
	taken func()
	// started tells that the stream's first event has come: RESUMED, or the first of a
	// snapshot.
	started bool
	// snapshot holds the objects of the snapshot under way; nil outside one. The events
	// of a stream that does not start with RESUMED are a snapshot up to SYNCED.
	snapshot *delphi.DesiredTxn
	// snapshotObjects counts them.
	snapshotObjects int
	// epoch is the epoch of the nimbus store serving the stream, from its RESUMED or
	// SYNCED event; changes leave it out.
	epoch   string
	pending pendingChanges
	// held are the frames taken in whole since the last commit: what the snapshot and
	// the pending changes refer to (the frame under way may be too). Each commit releases
	// them.
	held []*nimbusv1.PooledFrame
}

// release gives back the frames held, once nothing refers to their messages: after a
// commit, and when the stream ends.
func (w *watchStream) release() {
	for _, f := range w.held {
		f.Release()
	}
	clear(w.held)
	w.held = w.held[:0]
}

// pendingChanges are the changes received since the last commit, one per key: the last.
type pendingChanges struct {
	// writes are the objects to store, or keys to delete, by key ID in index, in the
	// order the keys first came.
	writes []pendingWrite
	index  map[string]int
	// events and size count the events and the frame bytes they came in.
	events int
	size   int
	// epoch and rev are the resume point of the last event; rev is 0 when there is none.
	epoch string
	rev   uint64
}

// pendingWrite is the last change of one key: an object to store, or a key to delete.
type pendingWrite struct {
	obj *nimbusv1.Object
	key *nimbusv1.ObjectKey
}

// full reports whether the changes received since the last commit reached a bound.
func (w *watchStream) full() bool {
	return w.pending.events >= w.c.commitEvents || w.pending.size >= maxCommitBytes
}

// add takes in the events of a frame in order. It commits the snapshot at SYNCED, and
// the changes received so far whenever they reach the bound of a commit. The frame's
// bytes count towards the changes' bound unless the frame ends inside a snapshot.
func (w *watchStream) add(f receivedFrame) error {
	defer func() {
		w.held = append(w.held, f.frame)
		if w.snapshot == nil {
			w.pending.size += f.size
		}
	}()
	for _, ev := range f.events {
		if err := w.addEvent(ev); err != nil {
			return err
		}
		if w.pending.events >= w.c.commitEvents {
			if err := w.commit(); err != nil {
				return err
			}
		}
	}
	return nil
}

func (w *watchStream) addEvent(ev *nimbusv1.WatchEvent) error {
	typ := ev.GetType()
	if e := ev.GetEpoch(); e != "" && e != w.epoch {
		w.epoch = strings.Clone(e) // kept past the frame's release
	}
	if !w.started {
		w.started = true
		w.taken()
		w.c.watching()
		w.c.metrics.connected.Set(1)
		w.c.metrics.server.WithLabelValues(w.server).Set(1)
		if typ == nimbusv1.WatchEvent_TYPE_RESUMED {
			// delphi already holds the state as of this revision; only changes follow.
			w.c.metrics.watchStarts.WithLabelValues(watchModeResume).Inc()
			w.c.desired.MarkSynced()
			w.c.log.Info("resumed watch", "server", w.server, "revision", ev.GetRevision(), "epoch", ev.GetEpoch())
			return nil
		}
		w.c.metrics.watchStarts.WithLabelValues(watchModeSnapshot).Inc()
		w.c.log.Debug("receiving snapshot", "server", w.server)
		w.snapshot = &delphi.DesiredTxn{}
	}
	if w.snapshot != nil {
		switch typ {
		case nimbusv1.WatchEvent_TYPE_PUT:
			w.snapshot.PutOwned(ev.GetObject()) // decoded afresh for this event, kept by no one else
			w.snapshotObjects++
			return nil
		case nimbusv1.WatchEvent_TYPE_SYNCED:
			return w.commitSnapshot(ev)
		}
		return fmt.Errorf("receiving a snapshot: unexpected %v event at revision %d", typ, ev.GetRevision())
	}
	if w.epoch == "" {
		return fmt.Errorf("receiving changes: %v event at revision %d before any epoch", typ, ev.GetRevision())
	}
	p := &w.pending
	switch typ {
	case nimbusv1.WatchEvent_TYPE_PUT:
		p.write(pendingWrite{obj: ev.GetObject(), key: ev.GetObject().Key()})
	case nimbusv1.WatchEvent_TYPE_DELETE:
		p.write(pendingWrite{key: ev.GetKey()})
	case nimbusv1.WatchEvent_TYPE_BOOKMARK:
	default:
		return fmt.Errorf("receiving changes: unexpected %v event at revision %d", typ, ev.GetRevision())
	}
	p.events++
	p.epoch, p.rev = w.epoch, ev.GetRevision()
	return nil
}

// write records the last change of a key, replacing any earlier one.
func (p *pendingChanges) write(pw pendingWrite) {
	id := pw.key.ID()
	if i, ok := p.index[id]; ok {
		p.writes[i] = pw
		return
	}
	if p.index == nil {
		p.index = map[string]int{}
	}
	p.index[id] = len(p.writes)
	p.writes = append(p.writes, pw)
}

// commitSnapshot commits the snapshot that SYNCED ends as one transaction that also
// removes every stored object the snapshot did not hold, and marks delphi synced.
func (w *watchStream) commitSnapshot(synced *nimbusv1.WatchEvent) error {
	txn := w.snapshot
	txn.DeleteOthers(nil)
	txn.SetResume(synced.GetEpoch(), synced.GetRevision())
	if err := w.c.desired.Commit(txn); err != nil {
		return fmt.Errorf("storing snapshot: %w", err)
	}
	w.c.desired.MarkSynced()
	w.c.log.Info("synced with nimbus", "server", w.server, "objects", w.snapshotObjects, "revision", synced.GetRevision(), "epoch", synced.GetEpoch())
	w.snapshot, w.snapshotObjects = nil, 0
	w.release()
	return nil
}

// commit stores the changes received since the last commit, each key's last, with the
// resume point of the last event, in one transaction.
func (w *watchStream) commit() error {
	p := &w.pending
	if p.events == 0 {
		p.size = 0
		if w.snapshot == nil {
			w.release()
		}
		return nil
	}
	txn := &delphi.DesiredTxn{}
	deleted := 0
	for _, pw := range p.writes {
		if pw.obj != nil {
			txn.PutOwned(pw.obj)
		} else {
			txn.Delete(pw.key)
			deleted++
		}
	}
	txn.SetResume(p.epoch, p.rev)
	if err := w.c.desired.Commit(txn); err != nil {
		return fmt.Errorf("storing changes up to revision %d: %w", p.rev, err)
	}
	w.c.log.Debug("changes stored", "events", p.events, "stored", len(p.writes)-deleted, "deleted", deleted, "revision", p.rev)
	clear(p.index)
	clear(p.writes)
	*p = pendingChanges{writes: p.writes[:0], index: p.index}
	w.release()
	return nil
}
