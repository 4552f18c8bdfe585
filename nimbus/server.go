package nimbus

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"

	wirecodec "github.com/naplesnet/naples/internal/codec"
	"github.com/naplesnet/naples/internal/grpcserver"
	"github.com/naplesnet/naples/internal/pki"
	flowsv1 "github.com/naplesnet/naples/proto/nimbus/flows/v1"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// Sentinel errors; check with errors.Is.
var (
	// ErrClosed is returned by Serve on a closed Server. RPCs that write or watch fail with
	// codes.Unavailable once the Server is closed.
	ErrClosed = errors.New("nimbus server closed")
	// ErrNoListeners is returned by Serve when it is given no listener.
	ErrNoListeners = errors.New("no listeners")
	// ErrInvalidOptions is wrapped by New when an option has an impossible value.
	ErrInvalidOptions = errors.New("invalid options")
	// ErrCorrupt is wrapped by New when the durable store's file in Options.DataDir cannot
	// be read back: bbolt rejects it, a value does not parse or contradicts another, or
	// its format version is not one this code reads. The error names the file.
	ErrCorrupt = errors.New("corrupt store file")
	// ErrLocked is wrapped by New when another process holds the durable store's file
	// open, such as another nimbus on the same Options.DataDir.
	ErrLocked = errors.New("store file locked by another process")
	// ErrUnavailable is wrapped by writes that the etcd-backed store cannot make now: it is
	// not loaded yet, or etcd has no quorum. RPCs fail with codes.Unavailable then, and the
	// caller may try again.
	ErrUnavailable = errors.New("store unavailable")
	// ErrConflict is wrapped by the refusal of a write whose object would take a value
	// another object holds, such as an endpoint's address (see conflict.go). RPCs fail
	// with codes.FailedPrecondition then, naming both objects.
	ErrConflict = errors.New("conflict with another object")
)

// Defaults of Options and fixed settings of the gRPC server Serve builds.
const (
	// DefaultWatchBuffer is the default of Options.WatchBuffer.
	DefaultWatchBuffer = 4096
	// DefaultBookmarkInterval is the default of Options.BookmarkInterval.
	DefaultBookmarkInterval = 10 * time.Second
	// DefaultHistoryWindow is the default of Options.HistoryWindow.
	DefaultHistoryWindow = 100000
	// DefaultStaleAfter is the default of Options.StaleAfter.
	DefaultStaleAfter = 30 * time.Second

	// drainTimeout is how long Serve lets running RPCs finish after its context ends.
	drainTimeout = 10 * time.Second
	// maxRecvMsgSize bounds a request; the largest object fits with room to spare.
	maxRecvMsgSize = 16 << 20
	// streamWindowBytes is the HTTP/2 window of each stream a client sends on: what
	// nimbus buffers of a stream before the handler reads, such as the ReportStatus
	// streams of a node held back by its rate (rates.go). A message the handler reads
	// may be larger; gRPC widens the window for it. Fixed windows turn off gRPC's
	// bandwidth-delay estimate, which would let each stream buffer up to 16 MiB.
	streamWindowBytes = 1 << 20
	// connWindowBytes is the HTTP/2 window of a connection, over all its streams.
	connWindowBytes = 16 << 20
)

// Options configures a Server. The zero value is usable.
type Options struct {
	// Logger receives the server's logs. Default: slog.Default().
	Logger *slog.Logger
	// WatchBuffer is how many events each watcher may have queued before it is reset: a
	// commit that finds that many queued resets the watcher, one that finds fewer queues
	// all of its events. Default: DefaultWatchBuffer (4096). Negative values are refused.
	WatchBuffer int
	// BookmarkInterval is how often an idle watch receives a BOOKMARK with the current
	// revision. Default: DefaultBookmarkInterval (10s). A negative value disables bookmarks.
	BookmarkInterval time.Duration
	// Now tells the time that create, update and status times record, and the time
	// staleness is measured with. Default: time.Now.
	Now func() time.Time
	// HistoryWindow is how many of the latest changes are kept so that a watch can resume
	// after them. Each kept change holds the object it stored and that object's encoded
	// event. Default: DefaultHistoryWindow (100000). A negative value keeps none: only a
	// watch at the current revision resumes.
	HistoryWindow int
	// Etcd, when set, keeps the objects in etcd instead of memory and DataDir, and makes
	// the Server one of any number of replicas sharing them; see etcd.go. It excludes
	// DataDir. Default: nil.
	Etcd *EtcdOptions
	// DataDir is the directory of the durable store, whose file is DataDir/nimbus.db
	// (DBFileName). Objects, the revision and the epoch survive restarts there; statuses
	// do not. Default: "", which keeps everything in memory only.
	DataDir string
	// Registerer takes the server's Prometheus metrics. Default: a private
	// prometheus.Registry, which Registry returns.
	Registerer prometheus.Registerer
	// StaleAfter is how long a node may have no open watch before the statuses it
	// reported are marked stale. Default: DefaultStaleAfter (30s). A negative value
	// never marks them stale.
	StaleAfter time.Duration
	// TLS, when set, makes Serve speak TLS with it and authorize every call by the
	// client's certificate (see auth.go): its ClientAuth must be
	// tls.RequireAndVerifyClientCert, and its ClientCAs name the CAs that issue node and
	// publisher certificates; internal/pki's ServerConfig builds one. Default: nil, which
	// serves plaintext and lets every client call everything.
	TLS *tls.Config
	// Certificates are the certificate files TLS was loaded from (internal/pki's
	// ReadExpiry): naples_nimbus_tls_certificate_expiry_seconds tells when each expires,
	// and Warnings warns of those that expire within CertificateWarning. Default: nil,
	// none.
	Certificates *pki.Expiry
	// CRL, when set with TLS, is the revocation list client certificates are checked
	// against: a certificate it revokes is refused at the handshake, and the connections
	// of one it comes to revoke are closed (see revocation.go). Default: nil, none.
	CRL *pki.RevocationFile
	// CRLInterval is how often Serve looks whether CRL's file changed. Default:
	// DefaultCRLInterval (5s).
	CRLInterval time.Duration
	// CertificateWarning is how long before one of Certificates expires Warnings warns of
	// it. Default: internal/pki's DefaultExpiryWarning (30 days).
	CertificateWarning time.Duration
	// ReplicaName, when set, makes the Server a replica among peers that share their
	// objects: it is the name the Server goes by among them, and it pushes to the peers
	// SetPeers names the statuses its own agents report and which nodes watch it, and
	// takes theirs (see peer.go). Default: "", which is no replica and runs none of it.
	ReplicaName string
	// Limits bound what one client can make the Server hold or send; see Limits. Default:
	// every limit at its default.
	Limits Limits
	// PeerDialOptions are the options a replica dials its peers with, such as the
	// transport credentials of its replica certificate (internal/pki's IssueReplica and
	// ClientConfig). Default: none, which dials in plaintext.
	PeerDialOptions []grpc.DialOption
	// Rebalance makes a replica that holds more than its share of the agents ask some to
	// watch another replica; see RebalanceOptions. It does nothing on a Server that is no
	// replica. Default: off.
	Rebalance RebalanceOptions
	// Burst, when set, is called as an ApplyBatch of BurstObjects objects or more starts:
	// a burst of changes, for which the process raises its garbage collector's target
	// (memsettle's StartBurst) at once rather than at its settler's next tick. It must be
	// quick. Default: nil.
	Burst func()
}

// BurstObjects is how many objects a batch holds at least for Options.Burst to be called.
const BurstObjects = 256

// withDefaults returns the options with every unset field at its default.
func (o Options) withDefaults() (Options, error) {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	switch {
	case o.WatchBuffer < 0:
		return o, fmt.Errorf("WatchBuffer %d: must not be negative: %w", o.WatchBuffer, ErrInvalidOptions)
	case o.WatchBuffer == 0:
		o.WatchBuffer = DefaultWatchBuffer
	}
	if o.BookmarkInterval == 0 {
		o.BookmarkInterval = DefaultBookmarkInterval
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.HistoryWindow == 0 {
		o.HistoryWindow = DefaultHistoryWindow
	}
	if o.Registerer == nil {
		o.Registerer = prometheus.NewRegistry()
	}
	if o.StaleAfter == 0 {
		o.StaleAfter = DefaultStaleAfter
	}
	switch {
	case o.CRLInterval < 0:
		return o, fmt.Errorf("CRLInterval %v: must not be negative: %w", o.CRLInterval, ErrInvalidOptions)
	case o.CRLInterval == 0:
		o.CRLInterval = DefaultCRLInterval
	}
	if o.CRL != nil && o.TLS == nil {
		return o, fmt.Errorf("CRL %s without TLS: there are no certificates to check: %w", o.CRL.Path(), ErrInvalidOptions)
	}
	switch {
	case o.CertificateWarning < 0:
		return o, fmt.Errorf("CertificateWarning %v: must not be negative: %w", o.CertificateWarning, ErrInvalidOptions)
	case o.CertificateWarning == 0:
		o.CertificateWarning = pki.DefaultExpiryWarning
	}
	if o.Etcd != nil && o.DataDir != "" {
		return o, fmt.Errorf("Etcd and DataDir %s: a server keeps its objects in one store: %w", o.DataDir, ErrInvalidOptions)
	}
	if err := o.Rebalance.validate(); err != nil {
		return o, err
	}
	var err error
	if o.Limits, err = o.Limits.withDefaults(); err != nil {
		return o, err
	}
	if o.TLS != nil && o.TLS.ClientAuth != tls.RequireAndVerifyClientCert {
		return o, fmt.Errorf("TLS.ClientAuth %v: must be RequireAndVerifyClientCert: %w", o.TLS.ClientAuth, ErrInvalidOptions)
	}
	return o, nil
}

// Server is the nimbus bus: it implements the nimbus.v1.Nimbus gRPC service over an
// in-memory store, made durable on disk when Options.DataDir is set. Serve it with Serve;
// stop it by ending Serve's context or with Close.
type Server struct {
	nimbusv1.UnimplementedNimbusServer

	opts  Options
	log   *slog.Logger
	store *store
	// epoch is the store instance's epoch; see Epoch.
	epoch atomic.Pointer[string]
	// started is when New made the Server; a node that never watched is stale from then.
	started time.Time
	// backend keeps the objects: the embedded store, or etcd with Options.Etcd. Set by
	// New, never changed after.
	backend backend
	metrics *metrics
	// done is closed by Close; watches and status streams end when it is.
	done chan struct{}
	// resets counts the watchers reset because they fell behind.
	resets atomic.Uint64
	// encodes counts the watch events of object changes encoded: each once, however many
	// watchers and snapshots send it.
	encodes atomic.Uint64
	// everyNode is the part of the latest snapshot sent that every node receives alike;
	// see sharedSnapshot.
	everyNode atomic.Pointer[sharedSnapshot]
	// streams counts the open streams per client identity; refusals rate-limits the
	// lines that log refused calls and streams. Both have locks of their own.
	streams  *streamLimiter
	refusals *logLimiter
	// statusWatch holds the open WatchStatus streams; it has a lock of its own.
	statusWatch statusHub
	// wmRates holds the buckets of the nodes' watermark moves; it has a lock of its own.
	wmRates *watermarkRates
	// peers pushes statuses and watch presence to the peer replicas and takes theirs;
	// nil unless Options.ReplicaName is set. It has locks of its own.
	peers *peerHub
	// peerGate, when set, waits until the store has caught up with a peer's revision
	// before PeerStatus takes the reports of a frame built at that revision; see
	// peerHub.apply. Set before Serve, never changed after.
	peerGate func(ctx context.Context, rev uint64) error
	// rebalance asks agents to move to other replicas; nil unless Options.ReplicaName is
	// set. Set by New, never changed after.
	rebalance *rebalancer
	// flows relays flow records from the agents' taps to the observers; it has a lock of
	// its own. Set by New, never changed after.
	flows *flowHub
	// commits groups the writes of concurrent calls into shared commits.
	commits committer
	// serving is true while Serve serves.
	serving atomic.Bool
	// tlsConns holds the open TLS connections with their client certificates, for
	// Options.CRL; it has a lock of its own.
	tlsConns tlsConns

	// mu serializes object commits with the hand-over of their change to the watchers and
	// with watcher registration. It guards rev, history, watchers and closed, and the
	// writes to disk.
	mu       sync.Mutex
	rev      uint64
	history  history
	watchers map[*watcher]struct{}
	closed   bool
}

var _ nimbusv1.NimbusServer = (*Server)(nil)

// New returns a Server. Without Options.DataDir its store is empty and its epoch fresh;
// with it, New loads the objects, the revision and the epoch from the directory's store
// file, creating it when it does not exist. A file that cannot be read back fails with
// ErrCorrupt, one another process holds with ErrLocked; the error names the file.
func New(opts Options) (*Server, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("creating nimbus server: %w", err)
	}
	s := &Server{
		opts:     opts,
		log:      opts.Logger,
		store:    newStore(),
		started:  opts.Now(),
		history:  history{max: max(opts.HistoryWindow, 0)},
		done:     make(chan struct{}),
		watchers: map[*watcher]struct{}{},
	}
	s.setEpoch(newEpoch())
	var objects int
	env := storeEnv{pub: s, tables: s.store, opts: opts, log: s.log}
	embedded := &embeddedStore{env: env}
	if opts.DataDir != "" {
		var epoch string
		if epoch, objects, err = embedded.load(); err != nil {
			return nil, fmt.Errorf("creating nimbus server: %w", err)
		}
		s.setEpoch(epoch)
	}
	s.backend = embedded
	s.history.floor = s.rev
	if s.metrics, err = newMetrics(opts.Registerer, s.statusCount, s.watermarkCount); err != nil {
		embedded.close()
		return nil, fmt.Errorf("creating nimbus server: %w", err)
	}
	s.metrics.setCertificates(opts.Certificates)
	opts.Certificates.OnChange(func() { s.metrics.setCertificates(opts.Certificates) })
	streams, unregisterStreams, err := newStreamLimiter(&s.opts.Limits, opts.Now, opts.Registerer)
	if err != nil {
		s.metrics.unregister()
		embedded.close()
		return nil, fmt.Errorf("creating nimbus server: %w", err)
	}
	s.streams, s.refusals = streams, newLogLimiter(opts.Limits.RefusalLogInterval, opts.Now)
	s.wmRates = newWatermarkRates(&s.opts.Limits, opts.Now)
	unregisterMetrics := s.metrics.unregister
	s.metrics.unregister = func() { unregisterMetrics(); unregisterStreams() }
	if s.flows, err = newFlowHub(s); err != nil {
		s.metrics.unregister()
		embedded.close()
		return nil, fmt.Errorf("creating nimbus server: %w", err)
	}
	unregisterFlows := s.metrics.unregister
	s.metrics.unregister = func() { unregisterFlows(); s.flows.metrics.unregister() }
	s.metrics.revision.Set(float64(s.rev))
	s.metrics.objects.Set(float64(objects))
	if opts.ReplicaName != "" {
		if s.peers, err = newPeerHub(s); err != nil {
			s.metrics.unregister()
			embedded.close()
			return nil, fmt.Errorf("creating nimbus server: %w", err)
		}
		rebalance, unregisterRebalance, err := newRebalancer(s)
		if err != nil {
			s.peers.close()
			s.metrics.unregister()
			embedded.close()
			return nil, fmt.Errorf("creating nimbus server: %w", err)
		}
		s.rebalance = rebalance
		unregister := s.metrics.unregister
		s.metrics.unregister = func() { unregister(); unregisterRebalance() }
	}
	if opts.Etcd != nil {
		etcd, err := newEtcdStore(env, s.SetPeers, opts.Etcd)
		if err != nil {
			s.peers.close()
			s.metrics.unregister()
			return nil, fmt.Errorf("creating nimbus server: %w", err)
		}
		s.backend = etcd
		if s.peers != nil {
			// A peer's statuses may concern objects this replica's cache has not seen yet.
			s.peerGate = func(ctx context.Context, rev uint64) error {
				return etcd.waitApplied(ctx, etcdRevOf(rev))
			}
		}
		etcd.start()
	}
	return s, nil
}

// newEpoch returns a random epoch.
func newEpoch() string {
	var epoch [16]byte
	rand.Read(epoch[:]) // never fails; see crypto/rand.Read
	return hex.EncodeToString(epoch[:])
}

// statusCount returns how many node statuses the store holds.
func (s *Server) statusCount() float64 { return float64(s.store.read().statuses.Len()) }

// Registry returns the registry the server's metrics are registered with when that is a
// *prometheus.Registry, as the default private one is, or nil.
func (s *Server) Registry() *prometheus.Registry {
	reg, _ := s.opts.Registerer.(*prometheus.Registry)
	return reg
}

// Epoch returns the store instance's epoch, which every watch event carries.
func (s *Server) Epoch() string { return *s.epoch.Load() }

// setEpoch sets the epoch Epoch returns.
func (s *Server) setEpoch(epoch string) { s.epoch.Store(&epoch) }

// WatcherResets returns how many watchers have been reset because they fell behind.
func (s *Server) WatcherResets() uint64 { return s.resets.Load() }

// Serve serves the Nimbus service on every listener until ctx ends or one listener fails.
// When ctx ends it closes the Server, which ends the watches and status streams, lets the
// remaining RPCs finish for up to 10s, stops the rest and returns nil. When a listener
// fails it stops serving on all of them and returns that error; so it does, having closed
// the Server, when the store fails for good (etcd refuses EtcdOptions.MaxTxnOps). Serve
// closes the listeners in every case.
func (s *Server) Serve(ctx context.Context, lis ...net.Listener) error {
	if len(lis) == 0 {
		return fmt.Errorf("serving nimbus: %w", ErrNoListeners)
	}
	if s.isClosed() {
		return fmt.Errorf("serving nimbus: %w", ErrClosed)
	}
	gs := grpc.NewServer(
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{
			MinTime:             5 * time.Second,
			PermitWithoutStream: true,
		}),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			Time:    30 * time.Second,
			Timeout: 10 * time.Second,
		}),
		grpc.MaxRecvMsgSize(maxRecvMsgSize),
		grpc.InitialWindowSize(streamWindowBytes),
		grpc.InitialConnWindowSize(connWindowBytes),
		grpc.ForceServerCodecV2(codec{wirecodec.Codec{}}),
		grpc.WaitForHandlers(true),
		grpc.Creds(s.credentials()),
		grpc.ChainUnaryInterceptor(s.authorizeUnary, s.gateUnary),
		grpc.ChainStreamInterceptor(s.authorizeStream, s.gateStream),
	)
	nimbusv1.RegisterNimbusServer(gs, s)
	flowsv1.RegisterFlowsServer(gs, s.flows)
	// The standard health service, so stock probes work: SERVING for the whole server and
	// for nimbus.v1.Nimbus until Serve stops (with etcd, from when the store is loaded).
	hs := health.NewServer()
	hs.SetServingStatus(nimbusv1.Nimbus_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	// A replica serves once it has read etcd; until then it refuses every call.
	s.backend.reportHealth(hs)
	healthpb.RegisterHealthServer(gs, hs)

	errc := make(chan error, len(lis))
	var wg sync.WaitGroup
	for _, l := range lis {
		wg.Go(func() {
			if err := gs.Serve(l); err != nil {
				errc <- fmt.Errorf("serving nimbus on %s: %w", l.Addr(), err)
			}
		})
	}
	defer wg.Wait()
	s.serving.Store(true)
	defer s.serving.Store(false)
	if s.opts.CRL != nil {
		crlCtx, stopCRL := context.WithCancel(ctx)
		var crlDone sync.WaitGroup
		crlDone.Go(func() { s.watchCRL(crlCtx) })
		defer crlDone.Wait()
		defer stopCRL()
	}
	defer s.rebalance.start()()

	select {
	case err := <-errc:
		hs.Shutdown()
		gs.Stop()
		return err
	case err := <-s.backend.failed():
		hs.Shutdown()
		gs.Stop()
		s.Close()
		return fmt.Errorf("serving nimbus: %w", err)
	case <-ctx.Done():
	}
	hs.Shutdown()
	s.Close()
	drainCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), drainTimeout)
	defer cancel()
	if grpcserver.Stop(drainCtx, gs) {
		s.log.Warn("stopped the rpcs still running after the drain timeout", "timeout", drainTimeout)
	}
	return nil
}

// credentials returns the transport credentials Serve serves with: TLS with Options.TLS,
// logging refused handshakes, or plaintext.
func (s *Server) credentials() credentials.TransportCredentials {
	cfg := s.opts.TLS
	if cfg != nil && s.opts.CRL != nil {
		cfg = cfg.Clone()
		cfg.VerifyPeerCertificate = s.opts.CRL.VerifyPeerCertificate
	}
	creds := pki.TransportCredentials(cfg)
	if cfg == nil {
		return creds
	}
	return handshakeLogger{TransportCredentials: creds, s: s}
}

// Close ends every watch and status stream, refuses further writes and watches,
// unregisters the metrics and closes the durable store. Reads keep working. Close is safe
// to call more than once.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.done)
	clear(s.watchers)
	s.metrics.unregister()
	s.mu.Unlock()
	// The pushers take no lock of the Server's; they stop without s.mu all the same.
	s.peers.close()
	// The etcd store's loop takes s.mu to apply changes: stop it without holding that.
	return s.backend.close()
}

// Ready returns why the server is not ready to take requests, nothing when it is: it is
// ready while Serve serves, until it is closed, except while its store is not loaded or
// is cut off from etcd (EtcdOptions.ProgressTimeout). /readyz reports it.
func (s *Server) Ready() []string {
	switch {
	case s.isClosed():
		return []string{"nimbus is shutting down"}
	case !s.serving.Load():
		return []string{"nimbus is not serving yet"}
	}
	if err := s.available(); err != nil {
		return []string{err.Error()}
	}
	if why := s.backend.cutOff(); why != "" {
		return []string{why}
	}
	return nil
}

// Warnings returns what an operator should act on soon, though the server is ready: a
// line for each of Options.Certificates that expires within Options.CertificateWarning.
// /readyz lists them after its answer.
func (s *Server) Warnings() []string {
	return s.opts.Certificates.Warnings(s.opts.Now(), s.opts.CertificateWarning)
}

// available returns why the Server cannot serve calls yet, with codes.Unavailable: a
// store not ready yet, such as an etcd-backed one not loaded yet, which would otherwise
// hand out an empty store.
func (s *Server) available() error {
	if why := s.backend.notReady(); why != "" {
		return status.Error(codes.Unavailable, why)
	}
	return nil
}

// gateUnary refuses the nimbus calls of a Server that cannot serve yet (see available);
// the health service and Version always answer.
func (s *Server) gateUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if strings.HasPrefix(info.FullMethod, nimbusMethodPrefix) && info.FullMethod != nimbusv1.Nimbus_Version_FullMethodName {
		if err := s.available(); err != nil {
			return nil, err
		}
	}
	return handler(context.WithValue(ctx, requestOwned{}, true), req)
}

// requestOwned keys the context value that tells a handler its request is its own: one
// gRPC decoded for the call, which nothing else holds and the codec gave strings of their
// own. Apply and ApplyBatch then store the request's objects rather than clones of them,
// a twentieth of nimbus's CPU in a bulk apply. A caller in the same process that calls
// them directly keeps its objects, and they are cloned.
type requestOwned struct{}

// ownsRequest tells whether the handler's request is its own (requestOwned).
func ownsRequest(ctx context.Context) bool {
	owned, _ := ctx.Value(requestOwned{}).(bool)
	return owned
}

// gateStream is gateUnary for streams.
func (s *Server) gateStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if strings.HasPrefix(info.FullMethod, nimbusMethodPrefix) {
		if err := s.available(); err != nil {
			return err
		}
	}
	return handler(srv, ss)
}

// nimbusMethodPrefix starts the full name of every method of the Nimbus service.
var nimbusMethodPrefix = "/" + nimbusv1.Nimbus_ServiceDesc.ServiceName + "/"

func (s *Server) isClosed() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

// rpcError turns an internal error into the status an RPC returns.
func rpcError(err error) error {
	if errors.Is(err, ErrClosed) || errors.Is(err, ErrUnavailable) {
		return status.Error(codes.Unavailable, err.Error())
	}
	if errors.Is(err, ErrConflict) {
		st := status.New(codes.FailedPrecondition, err.Error())
		var ce *conflictError
		if errors.As(err, &ce) {
			st = withDetails(st, ce.details)
		}
		return st.Err()
	}
	return status.Error(codes.Internal, err.Error())
}

// preEncoded is a message already in wire form. The codec of the grpc.Server that Serve
// builds sends it as it is, which lets a stream send bytes it assembled from shared,
// already encoded parts without encoding them again.
type preEncoded []byte

// encodedFrame is a message already in wire form, in buffers whose reference passes to
// gRPC with the message: gRPC frees them once it has written them, which returns a
// pooled buffer to its pool. Watch streams send their frames as encodedFrames.
type encodedFrame mem.BufferSlice

// codec is the proto codec of internal/codec, extended to pass preEncoded messages and
// encodedFrames through. It checks that the strings of what it decodes are UTF-8, as
// proto.Unmarshal does: what nimbus takes in, it stores and encodes again with
// proto.Marshal, which refuses any other.
type codec struct{ wirecodec.Codec }

// Marshal returns the wire form of v.
func (c codec) Marshal(v any) (mem.BufferSlice, error) {
	switch m := v.(type) {
	case preEncoded:
		// SliceBuffer's Free does nothing, so gRPC never recycles the shared bytes.
		return mem.BufferSlice{mem.SliceBuffer(m)}, nil
	case encodedFrame:
		return mem.BufferSlice(m), nil
	}
	return c.Codec.Marshal(v)
}
