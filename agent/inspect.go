package agent

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vishvananda/netns"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/naplesnet/naples/delphi"
	"github.com/naplesnet/naples/hal/firewall"
	"github.com/naplesnet/naples/internal/address"
	"github.com/naplesnet/naples/internal/grpcserver"
	delphiv1 "github.com/naplesnet/naples/proto/delphi/v1"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// socketMode is the file mode of the local API's socket: the agent's user and group may
// read what delphi holds, nobody else.
const socketMode = 0o660

// inspectDrainTimeout is how long Serve lets running calls finish once its context ends.
const inspectDrainTimeout = 5 * time.Second

// InspectStore is what an Inspector reads of delphi. *delphi.Store implements it; the
// Inspector never writes.
type InspectStore interface {
	// Get returns the desired object with the given key.
	Get(key *nimbusv1.ObjectKey) (*nimbusv1.Object, bool)
	// List returns the desired objects of one kind, ordered by key; KIND_UNSPECIFIED lists all.
	List(kind nimbusv1.Kind) []*nimbusv1.Object
	// Status returns this node's status of the object with the given key.
	Status(key *nimbusv1.ObjectKey) (*nimbusv1.NodeStatus, bool)
	// Statuses returns every status, ordered by key.
	Statuses() []delphi.StatusEntry
	// Resume returns the nimbus epoch and revision the desired objects correspond to.
	Resume() (epoch string, revision uint64)
	// Synced returns a channel that is closed once the desired objects are complete.
	Synced() <-chan struct{}
	// Subscribe starts a subscription to the keys that change.
	Subscribe(opts delphi.SubscribeOptions) (*delphi.Subscription, error)
}

var _ InspectStore = (*delphi.Store)(nil)

// InspectorOptions configures an Inspector.
type InspectorOptions struct {
	// Store is the delphi store the API reads. Required.
	Store InspectStore
	// Logger receives the API's logs. Default: slog.Default().
	Logger *slog.Logger
	// Node is this host's node name, which tells the endpoints on this host from the
	// others in Dataplane's answer. Default: empty, and Dataplane fails.
	Node string
	// Namespace is the network namespace whose kernel Dataplane reads, the one the HAL
	// programs, and whose interfaces Firewall names; both read it through View.
	// Default: nil, the agent's own.
	Namespace *netns.NsHandle
	// View is Namespace's kernel view, the one the HAL's reconcilers share. Default: nil,
	// a view of Namespace of the Inspector's own.
	View *KernelView
	// BPFDir is the bpffs directory the firewall pins its maps in (Config.BPFDir), which
	// Firewall reads. Default: empty, the agent runs without a firewall, and Firewall
	// fails.
	BPFDir string
	// Firewall is the firewall that pins its maps in BPFDir: the snapshot it installed
	// last names the ids Firewall reads from them. Default: nil, and Firewall names no
	// id and says that no snapshot is installed.
	Firewall InstalledFirewall
	// Flows is the log of the firewall's flow records that Flows reads. Default: nil,
	// and Flows fails.
	Flows *FlowLog
	// FlowStreams bounds the Flows streams served at once; one more is refused with
	// ResourceExhausted. Default: DefaultFlowStreams.
	FlowStreams int
	// ListPageBytes bounds a page of List in bytes: a page ends before the entry that
	// would take it beyond, and always holds at least one. Default: DefaultListPageBytes
	// (2 MiB), which with the largest object nimbus takes stays below 4 MiB.
	ListPageBytes int
	// Registerer takes the API's metric, naples_agent_local_api_pages_cut_total. Default:
	// nil, which registers none.
	Registerer prometheus.Registerer
}

// InstalledFirewall is what the Inspector needs of the firewall: the snapshot it
// installed, whose ids are those of its maps.
type InstalledFirewall interface {
	// Snapshot returns the snapshot installed last, nil before the first; the Inspector
	// only reads it.
	Snapshot() *firewall.Snapshot
}

// DefaultListPageBytes is the default of InspectorOptions.ListPageBytes.
const DefaultListPageBytes = 2 << 20

// Inspector serves the agent's read-only local API, the delphi.v1.Delphi service: what
// delphi holds on this host, desired objects and this node's status of them, the
// overlay dataplane the kernel has (Dataplane) and what the firewall's maps hold
// (Firewall).
type Inspector struct {
	delphiv1.UnimplementedDelphiServer

	store InspectStore
	log   *slog.Logger
	// node and view are InspectorOptions.Node and View, for Dataplane and Firewall;
	// bpfDir and fw are InspectorOptions.BPFDir and Firewall, for Firewall.
	node   string
	view   *KernelView
	bpfDir string
	fw     InstalledFirewall
	// flows is InspectorOptions.Flows; flowStreams holds a token for each Flows stream
	// served, at most InspectorOptions.FlowStreams; flowStreamsRefused counts those
	// refused.
	flows              *FlowLog
	flowStreams        chan struct{}
	flowStreamsRefused prometheus.Counter
	// pageBytes is InspectorOptions.ListPageBytes; pagesCut counts the pages it cut.
	pageBytes int
	pagesCut  prometheus.Counter
	// done is closed by Close; it ends every watch.
	done      chan struct{}
	closeOnce sync.Once
}

var _ delphiv1.DelphiServer = (*Inspector)(nil)

// NewInspector returns an Inspector over opts.Store.
func NewInspector(opts InspectorOptions) (*Inspector, error) {
	if opts.Store == nil {
		return nil, errors.New("creating the local api: store is required")
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	switch {
	case opts.ListPageBytes < 0:
		return nil, fmt.Errorf("creating the local api: ListPageBytes %d: must not be negative", opts.ListPageBytes)
	case opts.ListPageBytes == 0:
		opts.ListPageBytes = DefaultListPageBytes
	}
	switch {
	case opts.FlowStreams < 0:
		return nil, fmt.Errorf("creating the local api: FlowStreams %d: must not be negative", opts.FlowStreams)
	case opts.FlowStreams == 0:
		opts.FlowStreams = DefaultFlowStreams
	}
	pagesCut := prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: "naples", Subsystem: "agent", Name: "local_api_pages_cut_total",
		Help: "Local API List answers that ended before the last entry, at the request's limit or --local-api-page-bytes, with a next_page_token.",
	})
	flowStreams := make(chan struct{}, opts.FlowStreams)
	streamsServed := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "naples", Subsystem: "agent", Name: "local_api_flow_streams",
		Help: "Local API Flows streams served now, at most --local-api-flow-streams.",
	}, func() float64 { return float64(len(flowStreams)) })
	streamsRefused := prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: "naples", Subsystem: "agent", Name: "local_api_flow_streams_refused_total",
		Help: "Local API Flows streams refused because --local-api-flow-streams were served already.",
	})
	if opts.Registerer != nil {
		for _, c := range []prometheus.Collector{pagesCut, streamsServed, streamsRefused} {
			if err := opts.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("creating the local api: registering its metrics: %w", err)
			}
		}
	}
	view := opts.View
	if view == nil {
		view = newKernelView(opts.Namespace)
	}
	return &Inspector{store: opts.Store, log: log, node: opts.Node, view: view, bpfDir: opts.BPFDir,
		fw: opts.Firewall, flows: opts.Flows, flowStreams: flowStreams, flowStreamsRefused: streamsRefused,
		pageBytes: opts.ListPageBytes, pagesCut: pagesCut, done: make(chan struct{})}, nil
}

// Serve serves the API on lis until ctx ends or lis fails. When ctx ends it ends every
// watch (Close), lets the other calls finish for up to 5s, stops the rest and returns nil.
// Serve closes lis in either case.
func (i *Inspector) Serve(ctx context.Context, lis net.Listener) error {
	gs := grpc.NewServer(grpc.WaitForHandlers(true))
	delphiv1.RegisterDelphiServer(gs, i)
	served := make(chan error, 1)
	go func() { served <- gs.Serve(lis) }()
	select {
	case err := <-served:
		gs.Stop()
		return fmt.Errorf("serving the local api on %s: %w", lis.Addr(), err)
	case <-ctx.Done():
	}
	i.Close()
	drainCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), inspectDrainTimeout)
	defer cancel()
	if grpcserver.Stop(drainCtx, gs) {
		i.log.Warn("stopped the local api calls still running after the drain timeout", "timeout", inspectDrainTimeout)
	}
	<-served // nil once the server has stopped
	return nil
}

// Close ends every watch, now and from then on. It is safe to call twice.
func (i *Inspector) Close() error {
	i.closeOnce.Do(func() { close(i.done) })
	return nil
}

// List returns a page of the entries of the requested kind, ordered by key, with the
// nimbus position delphi stands at. A page ends at the request's limit or before the entry
// that would take it over InspectorOptions.ListPageBytes, with a next_page_token that the
// request for the next page carries.
func (i *Inspector) List(_ context.Context, req *delphiv1.ListRequest) (*delphiv1.ListResponse, error) {
	if err := checkKind(req.GetKind()); err != nil {
		return nil, err
	}
	after, err := parsePageToken(req.GetPageToken())
	if err != nil {
		return nil, err
	}
	epoch, rev := i.store.Resume()
	byID := map[string]*delphiv1.Entry{}
	for _, obj := range i.store.List(req.GetKind()) {
		key := obj.Key()
		byID[key.ID()] = &delphiv1.Entry{Key: key, Object: obj}
	}
	for _, st := range i.store.Statuses() {
		if req.GetKind() != nimbusv1.Kind_KIND_UNSPECIFIED && st.Key.Kind != req.GetKind() {
			continue
		}
		id := st.Key.String()
		e, ok := byID[id]
		if !ok {
			e = &delphiv1.Entry{Key: st.Key.Proto()}
			byID[id] = e
		}
		e.Status = st.Status
	}
	ids := make([]string, 0, len(byID))
	for id := range byID {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	resp := &delphiv1.ListResponse{Epoch: epoch, Revision: rev, Synced: i.synced()}
	size, limit := 0, int(req.GetLimit())
	start, _ := slices.BinarySearch(ids, after)
	for j := start; j < len(ids); j++ {
		id := ids[j]
		if id == after {
			continue
		}
		e := byID[id]
		n := proto.Size(e)
		n += protowire.SizeTag(1) + protowire.SizeVarint(uint64(n))
		if len(resp.Entries) > 0 && ((limit > 0 && len(resp.Entries) == limit) || size+n > i.pageBytes) {
			resp.NextPageToken = base64.RawURLEncoding.EncodeToString([]byte(ids[j-1]))
			i.pagesCut.Inc()
			break
		}
		resp.Entries = append(resp.Entries, e)
		size += n
	}
	return resp, nil
}

// parsePageToken returns the key ID a page token of List continues after; "" for the
// first page.
func parsePageToken(token string) (string, error) {
	if token == "" {
		return "", nil
	}
	id, err := base64.RawURLEncoding.DecodeString(token)
	if err != nil || !utf8.Valid(id) {
		return "", status.Errorf(codes.InvalidArgument, "page_token %q: not a next_page_token of this agent", token)
	}
	return string(id), nil
}

// Get returns the entry of one key; codes.NotFound when delphi holds neither an object nor
// a status for it.
func (i *Inspector) Get(_ context.Context, req *delphiv1.GetRequest) (*delphiv1.GetResponse, error) {
	key := req.GetKey()
	if key == nil {
		return nil, status.Error(codes.InvalidArgument, "key: is required")
	}
	key = key.Defaulted()
	if err := key.Validate(); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	e, ok := i.entry(key)
	if !ok {
		return nil, status.Errorf(codes.NotFound, "%s: not in delphi", key.ID())
	}
	return &delphiv1.GetResponse{Entry: e}, nil
}

// Watch sends every current entry of the requested kind, ordered by key, then the entry of
// each key whose object or status changes, in the order they change; a key whose object
// and status are both gone is sent with deleted set. Changes that follow each other
// quickly are coalesced: the entry sent is always the key's latest. Watch ends when the
// client goes away, and with codes.Unavailable when the Inspector is closed.
func (i *Inspector) Watch(req *delphiv1.WatchRequest, stream grpc.ServerStreamingServer[delphiv1.WatchEvent]) error {
	if err := checkKind(req.GetKind()); err != nil {
		return err
	}
	sub, err := i.store.Subscribe(delphi.SubscribeOptions{
		Tables: []delphi.Table{delphi.TableDesired, delphi.TableStatus},
		Kind:   req.GetKind(),
	})
	if err != nil {
		return status.Errorf(codes.Unavailable, "subscribing to delphi: %v", err)
	}
	defer sub.Close()
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	// The goroutine ends with the handler at the latest: cancel is deferred.
	go func() {
		select {
		case <-i.done:
			cancel()
		case <-ctx.Done():
		}
	}()

	first := true
	for {
		ids, err := sub.Next(ctx)
		if err != nil {
			return i.watchEnd(stream.Context(), err)
		}
		if first {
			// The first batch is everything delphi holds: send it in key order.
			slices.SortFunc(ids, nimbusv1.Key.Compare)
		}
		for _, id := range ids {
			key := id.Proto()
			ev := &delphiv1.WatchEvent{}
			if e, ok := i.entry(key); ok {
				ev.Entry = e
			} else if first {
				continue // gone before it was ever sent
			} else {
				ev.Entry, ev.Deleted = &delphiv1.Entry{Key: key}, true
			}
			if err := stream.Send(ev); err != nil {
				return fmt.Errorf("sending the entry of %s: %w", id, err)
			}
		}
		first = false
	}
}

// watchEnd returns the status a watch ends with after its subscription's Next returned err.
func (i *Inspector) watchEnd(client context.Context, err error) error {
	select {
	case <-i.done:
		return status.Error(codes.Unavailable, "the agent's local api is shutting down")
	default:
	}
	if client.Err() != nil {
		return status.FromContextError(client.Err()).Err()
	}
	if errors.Is(err, delphi.ErrClosed) {
		return status.Error(codes.Unavailable, "delphi is closed")
	}
	return status.Errorf(codes.Internal, "watching delphi: %v", err)
}

// entry returns what delphi holds for key; false when it holds neither object nor status.
func (i *Inspector) entry(key *nimbusv1.ObjectKey) (*delphiv1.Entry, bool) {
	obj, hasObj := i.store.Get(key)
	st, hasStatus := i.store.Status(key)
	if !hasObj && !hasStatus {
		return nil, false
	}
	return &delphiv1.Entry{Key: key.Defaulted(), Object: obj, Status: st}, true
}

// synced reports whether delphi's desired objects are complete.
func (i *Inspector) synced() bool {
	select {
	case <-i.store.Synced():
		return true
	default:
		return false
	}
}

// checkKind refuses a kind that is neither KIND_UNSPECIFIED nor a known kind.
func checkKind(k nimbusv1.Kind) error {
	if k == nimbusv1.Kind_KIND_UNSPECIFIED || slices.Contains(nimbusv1.Kinds(), k) {
		return nil
	}
	return status.Errorf(codes.InvalidArgument, "kind %q: %v", k.String(), nimbusv1.ErrUnknownKind)
}

// listenLocalAPI listens on the unix socket at path for the local API, replacing a stale
// socket and creating its directory, and limits the socket to its owner and group.
func listenLocalAPI(ctx context.Context, path string) (net.Listener, error) {
	lis, err := address.Address{Network: "unix", Addr: path}.Listen(ctx)
	if err != nil {
		return nil, fmt.Errorf("local api: %w", err)
	}
	if err := os.Chmod(path, socketMode); err != nil {
		lis.Close()
		return nil, fmt.Errorf("local api: setting the mode of %s: %w", path, err)
	}
	return lis, nil
}

// serveLocalAPI listens on the unix socket at path and returns the function that serves
// the local API over store on it until its context ends.
func serveLocalAPI(ctx context.Context, path string, opts InspectorOptions) (func(context.Context) error, error) {
	insp, err := NewInspector(opts)
	if err != nil {
		return nil, err
	}
	lis, err := listenLocalAPI(ctx, path)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context) error { return insp.Serve(ctx, lis) }, nil
}
