package nimbus

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/naplesnet/naples/internal/backoff"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// The etcd-backed store
//
// With Options.Etcd, the objects live in etcd and the Server is one of any number of
// stateless replicas that share them. Each replica keeps the same in-memory tables as the
// embedded store, but as a cache: one etcd watch on the objects' prefix feeds it, and it
// hands every change to its watchers in the order etcd committed them, exactly as the
// embedded store hands over its own commits. Writes are etcd transactions, checked
// against the cache: each object a call names, whether the cache finds it changed or not,
// must still have, in etcd, the revision the cache holds (or not exist), so replicas
// writing the same objects never overwrite each other's changes unseen, and a cache that
// is behind never answers "unchanged" or "not found" for what etcd holds; a transaction
// that loses such a race waits for the cache to catch up and is staged again. A write returns once the
// replica's own cache holds it, so a caller reads its writes on the replica it wrote to.
//
// Revisions. etcd gives every transaction one revision for all the keys it changes;
// nimbus gives every change its own. A change's revision is etcd's revision shifted left
// by 16 bits plus the change's position in its transaction (0, 1, ...); the revision
// "after all of etcd revision R" is R<<16 | 0xffff. Every replica derives the same
// revisions from the same etcd history, so a client's revision means the same on every
// replica and a watch resumes on any of them: on one whose cache is behind the client's
// revision, the watch first waits for the cache to catch up. The epoch is kept in etcd,
// under PREFIX/epoch, made by the first replica that finds none. Each replica keeps the
// last Options.HistoryWindow changes for resumes; a replica that starts reads the objects
// as they were that many etcd revisions ago (when etcd still has them) and replays the
// rest, so it can resume the watches of agents that come to it from a replica that died.
//
// Each replica compacts etcd's history every EtcdOptions.CompactionInterval, keeping the
// last interval's and the last CompactionRetention revisions, and nothing its cache has
// not applied; a replica that falls behind a compaction all the same reloads.
//
// A transaction holds at most EtcdOptions.MaxTxnOps changes and about MaxTxnBytes of
// objects; a larger batch is split into several transactions, which is logged, and it is
// then atomic per transaction only: should one fail, the error says how many of the batch's
// objects were committed before it. A transaction etcd refuses as over one of its limits
// fails the write with an error naming the limit, not wrapping ErrUnavailable.
//
// Availability. Until a replica has read the objects and caught up with etcd, it is not
// ready (Ready says why) and refuses every call with codes.Unavailable; it keeps trying
// with backoff, so a replica started while etcd is unreachable becomes ready when etcd
// returns. Once loaded, it keeps serving reads and watches from its cache while etcd has
// no quorum; writes fail with codes.Unavailable then, and work again once etcd has one.
// The watch requires etcd's leader, so a member cut off from the others does not keep a
// replica's cache behind; the client moves to another member. A replica whose watch
// hears nothing from etcd, neither a change nor the progress notification it asks for,
// for EtcdOptions.ProgressTimeout is cut off: not ready, and it ends its watch streams,
// so that clients move, though it still answers them. It starts that watch again, from
// the revision its cache holds, once it has heard nothing for half of that, so that it
// hears from etcd as soon as it reaches it again.

const (
	// subBits is how many low bits of a revision hold a change's position in its etcd
	// transaction.
	subBits = 16
	// maxSub is the largest position, which no change takes: endRev uses it.
	maxSub = 1<<subBits - 1
	// DefaultEtcdPrefix is EtcdOptions.Prefix's default.
	DefaultEtcdPrefix = "/naples"
	// DefaultEtcdMaxTxnOps is EtcdOptions.MaxTxnOps's default: etcd's own default limit.
	DefaultEtcdMaxTxnOps = 128
	// DefaultEtcdMaxTxnBytes is EtcdOptions.MaxTxnBytes's default, under etcd's default
	// request limit of 1.5 MiB.
	DefaultEtcdMaxTxnBytes = 1 << 20
	// DefaultEtcdCompactionInterval is EtcdOptions.CompactionInterval's default.
	DefaultEtcdCompactionInterval = 5 * time.Minute
	// DefaultEtcdCompactionRetention is EtcdOptions.CompactionRetention's default when
	// Options.HistoryWindow keeps no change.
	DefaultEtcdCompactionRetention = DefaultHistoryWindow
	// DefaultEtcdProgressTimeout is EtcdOptions.ProgressTimeout's default.
	DefaultEtcdProgressTimeout = 10 * time.Second
	// etcdWriteTimeout bounds a transaction and the wait for the cache to hold it.
	etcdWriteTimeout = 10 * time.Second
	// etcdResumeWait bounds how long a watch waits for the cache to catch up with the
	// revision it resumes from.
	etcdResumeWait = 5 * time.Second
	// etcdMaxConflicts is how many times a transaction is staged again after losing a
	// race with another replica before the write fails.
	etcdMaxConflicts = 100
)

// EtcdOptions configures the etcd-backed store.
type EtcdOptions struct {
	// Config is the etcd client's configuration: Endpoints, TLS and the like. Its
	// DialTimeout should be zero, so that a replica starts while etcd is unreachable.
	Config clientv3.Config
	// Prefix is the key prefix of everything nimbus keeps in etcd. Default:
	// DefaultEtcdPrefix.
	Prefix string
	// MaxTxnOps is how many object changes one etcd transaction holds at most; it must not
	// exceed the etcd server's --max-txn-ops, which the store checks before it loads: when
	// etcd refuses a transaction of that many operations, Serve returns the error. Default:
	// DefaultEtcdMaxTxnOps.
	MaxTxnOps int
	// MaxTxnBytes is about how many bytes of objects one etcd transaction holds at most;
	// it must stay under the etcd server's --max-request-bytes. Default:
	// DefaultEtcdMaxTxnBytes.
	MaxTxnBytes int
	// Advertise is where the other replicas reach this one, "unix:///path" or
	// "tcp://host:port". With Options.ReplicaName set, the replica registers it in etcd
	// under PREFIX/replicas/NAME, on a lease that ends soon after the replica does, and
	// pushes statuses to every other replica registered there (see peer.go). Empty: the
	// replica registers nothing and learns of no peer.
	Advertise string
	// CompactionInterval is how often the replica compacts etcd's history. Each time, it
	// compacts up to the etcd revision it saw the time before, so a revision outlives its
	// replacement by one interval at least, and never beyond the last CompactionRetention
	// revisions nor what its own cache holds: a replica whose watch is further behind than
	// that reloads (see session). Every replica compacts; a compaction already done by
	// another is no error. etcd compacts all of its keys, not only those under Prefix.
	// Default: DefaultEtcdCompactionInterval; negative: the replica never compacts, and
	// etcd's own --auto-compaction-retention should.
	CompactionInterval time.Duration
	// CompactionRetention is how many of the latest etcd revisions a compaction always
	// keeps; it should be no less than Options.HistoryWindow. Default: as many revisions
	// as Options.HistoryWindow keeps changes, so that a replica that starts finds in etcd
	// the history it replays into its window; DefaultEtcdCompactionRetention when that
	// keeps none.
	CompactionRetention int64
	// ProgressTimeout is how long the replica's etcd watch may go without a word from
	// etcd, an event or a progress notification, which the replica asks for every quarter
	// of it, before the replica counts as cut off from etcd: it then serves a cache that
	// may be stale, so it turns unready (Server.Ready says why, the health service says
	// NOT_SERVING) until etcd answers again, and ends its watch streams with
	// codes.Unavailable, so that clients move to another replica. It still answers the
	// calls that reach it, as when etcd has no quorum and every replica is cut off. A watch
	// silent for half of it is started again, so that one whose connection broke and came
	// back at once does not leave the replica cut off.
	// Default: DefaultEtcdProgressTimeout; negative: never.
	ProgressTimeout time.Duration
}

// withDefaults returns the options with every unset field at its default, for a Server
// that keeps historyWindow changes.
func (o *EtcdOptions) withDefaults(historyWindow int) (*EtcdOptions, error) {
	c := *o
	if len(c.Config.Endpoints) == 0 {
		return nil, fmt.Errorf("Etcd.Config.Endpoints: no endpoint: %w", ErrInvalidOptions)
	}
	if c.Prefix == "" {
		c.Prefix = DefaultEtcdPrefix
	}
	c.Prefix = strings.TrimSuffix(c.Prefix, "/")
	switch {
	case c.MaxTxnOps == 0:
		c.MaxTxnOps = DefaultEtcdMaxTxnOps
	case c.MaxTxnOps < 0 || c.MaxTxnOps >= maxSub:
		return nil, fmt.Errorf("Etcd.MaxTxnOps %d: want 1 to %d: %w", c.MaxTxnOps, maxSub-1, ErrInvalidOptions)
	}
	if c.ProgressTimeout == 0 {
		c.ProgressTimeout = DefaultEtcdProgressTimeout
	}
	if c.CompactionInterval == 0 {
		c.CompactionInterval = DefaultEtcdCompactionInterval
	}
	switch {
	case c.CompactionRetention == 0 && historyWindow > 0:
		c.CompactionRetention = int64(historyWindow)
	case c.CompactionRetention == 0:
		c.CompactionRetention = DefaultEtcdCompactionRetention
	case c.CompactionRetention < 0:
		return nil, fmt.Errorf("Etcd.CompactionRetention %d: must not be negative: %w", c.CompactionRetention, ErrInvalidOptions)
	}
	switch {
	case c.MaxTxnBytes == 0:
		c.MaxTxnBytes = DefaultEtcdMaxTxnBytes
	case c.MaxTxnBytes < 0:
		return nil, fmt.Errorf("Etcd.MaxTxnBytes %d: must not be negative: %w", c.MaxTxnBytes, ErrInvalidOptions)
	}
	return &c, nil
}

// eventRev returns the revision of the change at position sub of etcd revision rev.
func eventRev(rev int64, sub uint64) uint64 { return uint64(rev)<<subBits | sub }

// endRev returns the revision after every change of etcd revision rev.
func endRev(rev int64) uint64 { return uint64(rev)<<subBits | maxSub }

// etcdRevOf returns the etcd revision a revision belongs to.
func etcdRevOf(rev uint64) int64 { return int64(rev >> subBits) }

// etcdStore is the etcd backend of a Server.
type etcdStore struct {
	env  storeEnv
	opts *EtcdOptions
	// setPeers takes the replicas registered in etcd: the Server's SetPeers.
	setPeers func([]Peer)
	cli      *clientv3.Client
	// objects is the prefix of the objects' keys, epochKey the key of the epoch.
	objects, epochKey string
	// ctx ends when the store is closed; loops counts the goroutines start starts.
	ctx    context.Context
	cancel context.CancelFunc
	loops  sync.WaitGroup
	// closeOnce makes close safe to call twice.
	closeOnce sync.Once
	// fatal yields the error that keeps the store from ever serving (see failed).
	fatal chan error
	// txnOpsChecked tells that etcd took a transaction of MaxTxnOps operations; only
	// session uses it.
	txnOpsChecked bool
	// compactedTo is the revision etcd compacted its history up to when it refused a watch
	// that started before, and the cache missed nothing of it: the next watch starts
	// there. Only session uses it.
	compactedTo int64
	// healthMu guards hs, the health service reportHealth was given (nil before), and
	// orders the statuses set on it.
	healthMu sync.Mutex
	hs       *health.Server
	// compactedRev is the etcd revision the replica last compacted up to; only
	// compactLoop uses it.
	compactedRev int64

	txns, conflicts, watchRestarts, overLimits prometheus.Counter
	ready, compacted, cutOffGauge              prometheus.Gauge
	cacheAge                                   prometheus.GaugeFunc
	unregister                                 func()

	// mu guards the fields below.
	mu sync.Mutex
	// applied is the etcd revision the cache holds everything of.
	applied int64
	// advanced is closed, and replaced, whenever applied moves.
	advanced chan struct{}
	// loaded tells that the cache has been filled from etcd and caught up with it once;
	// firstLoad is closed the first time it is.
	loaded    bool
	firstLoad chan struct{}
	// problem says why the store is not loaded, for Ready.
	problem string
	// lastEpoch is the epoch last read from etcd.
	lastEpoch string
	// heard is when the cache's watch last heard from etcd; isCutOff tells that it is
	// longer ago than ProgressTimeout.
	heard    time.Time
	isCutOff bool
	// lastRev and nextSub carry the position of the next change in its etcd revision
	// from one watch response to the next.
	lastRev int64
	nextSub uint64
}

// newEtcdStore returns the etcd backend of the Server env names; setPeers takes the
// replicas registered in etcd. start starts loading it.
func newEtcdStore(env storeEnv, setPeers func([]Peer), o *EtcdOptions) (*etcdStore, error) {
	opts, err := o.withDefaults(env.opts.HistoryWindow)
	if err != nil {
		return nil, err
	}
	cfg := opts.Config
	if cfg.Logger == nil && cfg.LogConfig == nil {
		// nimbus logs what matters itself; the client's retries would flood the log.
		cfg.Logger = zap.NewNop()
	}
	if cfg.MaxCallSendMsgSize == 0 {
		// A transaction of MaxTxnBytes of objects, with its keys and checks.
		cfg.MaxCallSendMsgSize = opts.MaxTxnBytes + 1<<20
	}
	cli, err := clientv3.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("etcd client for %s: %w", strings.Join(cfg.Endpoints, ","), err)
	}
	e := &etcdStore{
		env: env, opts: opts, cli: cli, setPeers: setPeers,
		objects:   opts.Prefix + "/objects/",
		epochKey:  opts.Prefix + "/epoch",
		advanced:  make(chan struct{}),
		firstLoad: make(chan struct{}),
		problem:   "etcd store not loaded yet",
		fatal:     make(chan error, 1),
	}
	e.ctx, e.cancel = context.WithCancel(context.Background())
	if err := e.registerMetrics(env.opts.Registerer); err != nil {
		cli.Close()
		return nil, err
	}
	return e, nil
}

// registerMetrics registers the backend's metrics.
func (e *etcdStore) registerMetrics(reg prometheus.Registerer) error {
	const ns, sub = "naples", "nimbus_etcd"
	e.txns = prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "txns_total",
		Help: "etcd transactions that committed object changes."})
	e.conflicts = prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "txn_conflicts_total",
		Help: "etcd transactions staged again because another replica changed one of their objects first."})
	e.overLimits = prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "txns_over_limit_total",
		Help: "etcd transactions etcd refused as over its --max-txn-ops or --max-request-bytes; the writes of each failed."})
	e.watchRestarts = prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "watch_restarts_total",
		Help: "Times the etcd watch feeding the cache was started again after it failed."})
	e.ready = prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "loaded",
		Help: "1 once the cache has been loaded from etcd and caught up with it."})
	e.compacted = prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "compacted_revision",
		Help: "The etcd revision this replica last compacted etcd's history up to; 0 before its first compaction."})
	e.cutOffGauge = prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "cut_off",
		Help: "1 while the etcd watch feeding the cache has heard nothing from etcd for longer than the progress timeout; the replica is not ready then."})
	e.cacheAge = prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "cache_age_seconds",
		Help: "Seconds since the etcd watch feeding the cache last heard from etcd, a change or a progress notification: how stale the cache may be. 0 until the cache is first loaded."},
		e.cacheAgeSeconds)
	cs := []prometheus.Collector{e.txns, e.conflicts, e.overLimits, e.watchRestarts, e.ready, e.compacted, e.cutOffGauge, e.cacheAge}
	for i, c := range cs {
		if err := reg.Register(c); err != nil {
			for _, r := range cs[:i] {
				reg.Unregister(r)
			}
			return fmt.Errorf("registering etcd metrics: %w", err)
		}
	}
	e.unregister = func() {
		for _, c := range cs {
			reg.Unregister(c)
		}
	}
	return nil
}

// close stops the backend and waits for it. It is safe to call twice.
func (e *etcdStore) close() error {
	e.closeOnce.Do(func() {
		e.cancel()
		e.loops.Wait()
		e.cli.Close()
		e.unregister()
	})
	return nil
}

// notReady returns why the store cannot serve yet; empty once it can.
func (e *etcdStore) notReady() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.loaded {
		return ""
	}
	return e.problem
}

// failed returns the channel that yields the error that keeps the store from ever
// serving: etcd refuses transactions of MaxTxnOps operations.
func (e *etcdStore) failed() <-chan error { return e.fatal }

// start starts loading the cache and, for a replica with an address, registering it
// and following the other replicas (membership).
func (e *etcdStore) start() {
	e.loops.Go(func() { e.retry("etcd store", e.session) })
	if e.env.opts.ReplicaName != "" && e.opts.Advertise != "" {
		e.loops.Go(func() { e.retry("etcd: replica membership", e.membership) })
	}
	if e.opts.CompactionInterval > 0 {
		e.loops.Go(e.compactLoop)
	}
	if e.opts.ProgressTimeout > 0 {
		e.loops.Go(e.progressLoop)
	}
}

// progressLoop marks the replica cut off from etcd, every quarter of ProgressTimeout,
// once its loaded cache's watch has heard nothing from etcd for longer than that.
func (e *etcdStore) progressLoop() {
	t := time.NewTicker(e.opts.ProgressTimeout / 4)
	defer t.Stop()
	for {
		select {
		case <-e.ctx.Done():
			return
		case <-t.C:
		}
		e.mu.Lock()
		silent := time.Since(e.heard)
		cut := e.loaded && !e.isCutOff && silent > e.opts.ProgressTimeout
		if cut {
			e.isCutOff = true
		}
		e.mu.Unlock()
		if cut {
			e.cutOffGauge.Set(1)
			e.env.log.Warn("etcd: cut off, not ready until etcd answers: the watch heard nothing; ending the watch streams",
				"for", silent.Round(time.Millisecond), "progress_timeout", e.opts.ProgressTimeout)
			e.healthChanged()
			// Their clients watch again on a replica that is ready, and resume there.
			e.env.pub.endWatches(e.cutOffReason(silent) + "; watch another replica")
		}
	}
}

// heardFromEtcd records that the cache's watch heard from etcd, which ends being cut off.
func (e *etcdStore) heardFromEtcd() {
	e.mu.Lock()
	e.heard = time.Now()
	back := e.isCutOff
	e.isCutOff = false
	e.mu.Unlock()
	if back {
		e.cutOffGauge.Set(0)
		e.env.log.Info("etcd: the watch hears from etcd again; ready")
		e.healthChanged()
	}
}

// cacheAgeSeconds returns the seconds since the cache's watch last heard from etcd; 0
// until the cache is first loaded.
func (e *etcdStore) cacheAgeSeconds() float64 {
	select {
	case <-e.firstLoad:
	default:
		return 0
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return time.Since(e.heard).Seconds()
}

// cutOff returns why the replica is not ready although it serves: its watch has heard
// nothing from etcd for longer than ProgressTimeout. Empty when it has.
func (e *etcdStore) cutOff() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.isCutOff {
		return ""
	}
	return e.cutOffReason(time.Since(e.heard))
}

// cutOffReason says that the replica is cut off, its watch silent for so long.
func (e *etcdStore) cutOffReason(silent time.Duration) string {
	return fmt.Sprintf("cut off from etcd: the watch heard nothing from it for %v (progress timeout %v); the cache may be stale",
		silent.Round(time.Second), e.opts.ProgressTimeout)
}

// healthChanged sets the status of the health service, once the cache was first loaded:
// SERVING unless the replica is cut off from etcd.
func (e *etcdStore) healthChanged() {
	select {
	case <-e.firstLoad:
	default:
		return
	}
	e.healthMu.Lock()
	defer e.healthMu.Unlock()
	if e.hs == nil {
		return
	}
	st := healthpb.HealthCheckResponse_SERVING
	if e.cutOff() != "" {
		st = healthpb.HealthCheckResponse_NOT_SERVING
	}
	for _, svc := range healthServices {
		e.hs.SetServingStatus(svc, st)
	}
}

// healthServices are the services of the health service whose status follows the
// store's: the whole server and the Nimbus service.
var healthServices = []string{"", nimbusv1.Nimbus_ServiceDesc.ServiceName}

// compactLoop compacts etcd's history every CompactionInterval until the store is
// closed, up to the etcd revision it saw the time before, within CompactionRetention and
// what the cache holds (see EtcdOptions.CompactionInterval). A failed compaction is
// logged and tried again at the next interval.
func (e *etcdStore) compactLoop() {
	t := time.NewTicker(e.opts.CompactionInterval)
	defer t.Stop()
	var seen int64 // etcd's revision at the previous interval
	for {
		select {
		case <-e.ctx.Done():
			return
		case <-t.C:
		}
		cur, err := e.compact(seen)
		if err != nil {
			e.env.log.Warn("etcd: compacting its history", "error", err)
			continue
		}
		seen = cur
	}
}

// compact compacts etcd's history up to the earliest of seen, etcd's current revision
// less CompactionRetention, and the revision the cache holds everything of, when that is
// past the last compaction. It returns etcd's current revision.
func (e *etcdStore) compact(seen int64) (int64, error) {
	ctx, cancel := context.WithTimeout(e.ctx, etcdWriteTimeout)
	defer cancel()
	resp, err := e.cli.Get(ctx, e.epochKey, clientv3.WithCountOnly())
	if err != nil {
		return 0, fmt.Errorf("reading the current revision: %w", err)
	}
	cur := resp.Header.Revision
	at := min(seen, cur-e.opts.CompactionRetention, e.appliedRev())
	if at <= e.compactedRev {
		return cur, nil
	}
	// Another replica may have compacted further already: etcd refuses this one then,
	// and the history is as short as wanted.
	if _, err := e.cli.Compact(ctx, at); err != nil && !errors.Is(err, rpctypes.ErrCompacted) {
		return 0, fmt.Errorf("compacting up to revision %d: %w", at, err)
	}
	e.compactedRev = at
	e.compacted.Set(float64(at))
	e.env.log.Debug("etcd: compacted its history", "etcd_revision", at, "etcd_current", cur)
	return cur, nil
}

// retry runs fn again and again until the store is closed, with backoff after each failure;
// a run that lasted a minute or more starts the backoff over.
func (e *etcdStore) retry(what string, fn func() error) {
	bo := backoff.Backoff{Min: 100 * time.Millisecond, Max: 5 * time.Second}
	for {
		start := time.Now()
		err := fn()
		if e.ctx.Err() != nil {
			return
		}
		if errors.Is(err, errPermanent) {
			e.env.log.Error(what+": giving up", "error", err)
			e.fatal <- err
			return
		}
		if time.Since(start) > time.Minute {
			bo.Reset()
		}
		e.env.log.Warn(what+": starting over", "error", err)
		select {
		case <-e.ctx.Done():
			return
		case <-time.After(bo.Next()):
		}
	}
}

// session loads the cache when it is not loaded, then applies etcd's changes to it until
// the watch fails. A failure before the cache is loaded becomes the reason Ready gives.
func (e *etcdStore) session() (err error) {
	defer func() {
		if err == nil || e.ctx.Err() != nil {
			return
		}
		e.watchRestarts.Inc()
		e.mu.Lock()
		if !e.loaded {
			e.problem = "etcd store not loaded: " + err.Error()
		}
		e.mu.Unlock()
	}()
	ctx := e.ctx
	e.mu.Lock()
	loaded, from := e.loaded, max(e.applied, e.compactedTo)
	e.mu.Unlock()
	var caughtUp int64
	if !e.txnOpsChecked {
		if err := e.checkMaxTxnOps(ctx); err != nil {
			return err
		}
		e.txnOpsChecked = true
	}
	if !loaded {
		e.compactedTo = 0
		if from, caughtUp, err = e.load(ctx); err != nil {
			return err
		}
	}
	// The watch starts at the revision the cache holds everything of, not the one after,
	// and skips the changes the cache holds: etcd answers no progress request of a watch
	// that starts past its current revision until some write gets it there, so in a quiet
	// etcd such a watch would never hear from it.
	wctx, cancel := context.WithCancel(cacheWatchContext(ctx))
	defer cancel()
	wch := e.cli.Watch(wctx, e.objects, clientv3.WithPrefix(), clientv3.WithRev(from),
		clientv3.WithProgressNotify(), clientv3.WithCreatedNotify())
	if !loaded && caughtUp <= from {
		e.markLoaded()
		caughtUp = 0
	}
	// Until the cache has caught up, ask etcd every so often how far the watch is: a
	// progress notification moves the cache up to etcd's revision when no object changed
	// after the ones replayed.
	var tick <-chan time.Time
	if caughtUp > 0 {
		t := time.NewTicker(progressInterval)
		defer t.Stop()
		tick = t.C
	}
	// Once caught up, it asks every quarter of ProgressTimeout, so that a watch that hears
	// nothing tells that the replica is cut off from etcd (progressLoop). A watch silent
	// for half of it is started again, before the replica counts as cut off: the client
	// resumes a watch whose connection broke at the revision after the last it heard of,
	// past etcd's in a quiet etcd, and etcd then answers none of its progress requests,
	// though it is connected again.
	heard := time.Now()
	var keep <-chan time.Time
	if e.opts.ProgressTimeout > 0 {
		t := time.NewTicker(e.opts.ProgressTimeout / 4)
		defer t.Stop()
		keep = t.C
	}
	for {
		var (
			resp clientv3.WatchResponse
			ok   bool
		)
		select {
		case <-tick:
			if err := e.cli.RequestProgress(wctx); err != nil {
				e.env.log.Debug("etcd: asking for watch progress", "error", err)
			}
			continue
		case <-keep:
			if silent := time.Since(heard); silent > e.opts.ProgressTimeout/2 {
				return fmt.Errorf("etcd watch heard nothing for %v, not even the progress it asked for", silent.Round(time.Millisecond))
			}
			if tick == nil {
				// The client holds a progress request while it dials etcd again.
				rctx, rcancel := context.WithTimeout(wctx, e.opts.ProgressTimeout/4)
				if err := e.cli.RequestProgress(rctx); err != nil {
					e.env.log.Debug("etcd: asking for watch progress", "error", err)
				}
				rcancel()
			}
			continue
		case resp, ok = <-wch:
		}
		if !ok {
			break
		}
		heard = time.Now()
		e.heardFromEtcd()
		switch {
		case resp.CompactRevision != 0 && resp.CompactRevision <= e.appliedRev()+1:
			// Only what the cache holds is gone, the revision the watch started at: start
			// it again after that.
			e.compactedTo = resp.CompactRevision
			return fmt.Errorf("etcd compacted its history up to revision %d, which the cache holds; watching from there", resp.CompactRevision)
		case resp.CompactRevision != 0:
			// What the cache misses is gone from etcd: load everything again.
			e.mu.Lock()
			e.loaded = false
			e.mu.Unlock()
			return fmt.Errorf("etcd compacted revision %d, which the cache has not seen yet", resp.CompactRevision)
		case resp.Err() != nil:
			return fmt.Errorf("etcd watch: %w", resp.Err())
		case len(resp.Events) > 0:
			if evs := e.unapplied(resp.Events); len(evs) > 0 {
				e.apply(evs)
			}
		case resp.IsProgressNotify():
			e.progress(resp.Header.Revision)
		}
		if caughtUp > 0 && e.appliedRev() >= caughtUp {
			e.markLoaded()
			caughtUp, tick = 0, nil
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return errors.New("etcd watch ended")
}

// errPermanent is wrapped by the errors of the store that trying again cannot mend.
var errPermanent = errors.New("etcd refuses the store's settings")

// checkMaxTxnOps checks that etcd takes transactions of MaxTxnOps operations, and returns
// an error wrapping errPermanent when it refuses them. etcd does not report its
// --max-txn-ops, so the check is a transaction of MaxTxnOps reads of the epoch key
// (counts only), which etcd answers as any read, or refuses, as it would refuse a write of
// that many changes, with "too many operations in txn request".
func (e *etcdStore) checkMaxTxnOps(ctx context.Context) error {
	ops := make([]clientv3.Op, e.opts.MaxTxnOps)
	for i := range ops {
		ops[i] = clientv3.OpGet(e.epochKey, clientv3.WithCountOnly())
	}
	rctx, cancel := context.WithTimeout(ctx, etcdWriteTimeout)
	defer cancel()
	_, err := e.cli.Txn(rctx).Then(ops...).Commit()
	switch {
	case errors.Is(err, rpctypes.ErrTooManyOps):
		return fmt.Errorf("--etcd-max-txn-ops (EtcdOptions.MaxTxnOps) %d is more than etcd's --max-txn-ops: "+
			"a read-only transaction of %d operations was refused (%w); lower it or raise etcd's: %w",
			e.opts.MaxTxnOps, e.opts.MaxTxnOps, err, errPermanent)
	case err != nil:
		return fmt.Errorf("etcd: checking that it takes transactions of %d operations: %w", e.opts.MaxTxnOps, err)
	}
	return nil
}

// cacheWatchContext returns ctx with the metadata of the cache's etcd watch. The client
// runs the watches of contexts with the same metadata on one gRPC stream, and etcd answers
// a progress request on a stream only when every watch on it is current; the cache's watch
// has a stream of its own, so that progress requests concern it alone. It requires a
// leader, so that a member cut off from the others does not hold the cache back.
func cacheWatchContext(ctx context.Context) context.Context {
	return clientv3.WithRequireLeader(metadata.AppendToOutgoingContext(ctx, "naples-watch", "objects"))
}

// reportHealth makes the health service say NOT_SERVING, for the whole server and for
// the Nimbus service, until the cache is first loaded (a replica refuses every call until
// then) and while the replica is cut off from etcd, so that stock probes and clients
// agree with /readyz.
func (e *etcdStore) reportHealth(hs *health.Server) {
	e.healthMu.Lock()
	e.hs = hs
	for _, svc := range healthServices {
		hs.SetServingStatus(svc, healthpb.HealthCheckResponse_NOT_SERVING)
	}
	e.healthMu.Unlock()
	e.healthChanged()
	e.loops.Go(func() {
		select {
		case <-e.firstLoad:
			e.healthChanged()
		case <-e.ctx.Done():
		}
	})
}

// markLoaded records that the cache is loaded and caught up.
func (e *etcdStore) markLoaded() {
	e.mu.Lock()
	first := !e.loaded
	e.loaded, e.problem = true, ""
	e.heard = time.Now()
	rev, epoch := e.applied, e.lastEpoch
	select {
	case <-e.firstLoad:
	default:
		close(e.firstLoad)
	}
	e.mu.Unlock()
	e.ready.Set(1)
	if first {
		e.env.log.Info("etcd store loaded", "etcd_revision", rev, "revision", endRev(rev), "epoch", epoch)
	}
}

// load reads the epoch, making it when etcd has none, and every object as it was up to
// HistoryWindow etcd revisions ago, so that the watch that follows replays the rest into
// the history. It returns the etcd revision the cache then holds everything of, which the
// watch starts from, and the one the cache must reach to be caught up.
func (e *etcdStore) load(ctx context.Context) (from, caughtUp int64, err error) {
	rctx, cancel := context.WithTimeout(ctx, etcdWriteTimeout)
	defer cancel()
	epoch, err := e.epoch(rctx)
	if err != nil {
		return 0, 0, err
	}
	cur, err := e.cli.Get(rctx, e.epochKey)
	if err != nil {
		return 0, 0, fmt.Errorf("etcd: reading the current revision: %w", err)
	}
	now := cur.Header.Revision
	at := now
	if w := int64(e.env.opts.HistoryWindow); w > 0 {
		at = max(now-w, 1)
	}
	resp, err := e.cli.Get(rctx, e.objects, clientv3.WithPrefix(), clientv3.WithRev(at))
	if errors.Is(err, rpctypes.ErrCompacted) {
		at = now
		resp, err = e.cli.Get(rctx, e.objects, clientv3.WithPrefix(), clientv3.WithRev(at))
	}
	if err != nil {
		return 0, 0, fmt.Errorf("etcd: reading the objects: %w", err)
	}
	objs := make([]*nimbusv1.Object, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		obj, err := e.decode(kv)
		if err != nil {
			e.env.log.Error("etcd store: skipping a key that holds no object", "error", err)
			continue
		}
		objs = append(objs, obj)
	}
	e.replace(epoch, objs, at)
	e.env.log.Info("etcd store read", "objects", len(objs), "etcd_revision", at, "etcd_current", now)
	return at, now, nil
}

// epoch returns the epoch kept in etcd, making one when there is none.
func (e *etcdStore) epoch(ctx context.Context) (string, error) {
	fresh := newEpoch()
	resp, err := e.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(e.epochKey), "=", 0)).
		Then(clientv3.OpPut(e.epochKey, fresh)).
		Else(clientv3.OpGet(e.epochKey)).
		Commit()
	if err != nil {
		return "", fmt.Errorf("etcd: reading the epoch %s: %w", e.epochKey, err)
	}
	if resp.Succeeded {
		e.env.log.Info("etcd store: new epoch", "key", e.epochKey, "epoch", fresh)
		return fresh, nil
	}
	kvs := resp.Responses[0].GetResponseRange().GetKvs()
	if len(kvs) == 0 || len(kvs[0].Value) == 0 {
		return "", fmt.Errorf("etcd: epoch key %s: empty", e.epochKey)
	}
	return string(kvs[0].Value), nil
}

// decode returns the object a key holds, with its revision.
func (e *etcdStore) decode(kv *mvccpb.KeyValue) (*nimbusv1.Object, error) {
	id := strings.TrimPrefix(string(kv.Key), e.objects)
	obj := &nimbusv1.Object{}
	if err := obj.UnmarshalVT(kv.Value); err != nil {
		return nil, fmt.Errorf("key %s: %w", kv.Key, err)
	}
	if got := obj.Key().ID(); got != id {
		return nil, fmt.Errorf("key %s: holds object %s", kv.Key, got)
	}
	m := obj.GetMeta()
	sub := m.GetRevision()
	if sub >= maxSub {
		return nil, fmt.Errorf("key %s: position %d in its transaction is out of range", kv.Key, sub)
	}
	m.Revision = eventRev(kv.ModRevision, sub)
	if m.GetGenerationRevision() == sub {
		// The write made the generation: stageApply stored its position, as it did the
		// revision, which only etcd's revision completes.
		m.GenerationRevision = m.Revision
	}
	return obj, nil
}

// replace makes the cache hold exactly objs as of etcd revision rev, and epoch the
// Server's. Watchers are reset, and the history starts at rev: what the cache held before
// is no base to resume from.
func (e *etcdStore) replace(epoch string, objs []*nimbusv1.Object, rev int64) {
	var last uint64 // the revision of the last change, as the embedded store's gauge shows
	for _, obj := range objs {
		last = max(last, obj.GetMeta().GetRevision())
	}
	e.env.pub.restart(epoch, endRev(rev), len(objs), last, func() {
		txn := e.env.tables.write()
		keep := make(map[nimbusv1.Key]bool, len(objs))
		for _, obj := range objs {
			keep[obj.TypedKey()] = true
		}
		// The objects gone, and the claims of those kept, go first, so that what they held
		// in the claims index is free for the objects that hold it now.
		var gone []nimbusv1.Key
		txn.objects.Scan(func(_ string, rec *objectRecord) bool {
			if !keep[rec.Key] {
				gone = append(gone, rec.Key)
			}
			return true
		})
		for _, id := range gone {
			if rec := txn.object(id); rec != nil {
				stageDelete(txn, write{key: rec.Object.Key(), id: id}, 0)
			}
		}
		for _, obj := range objs {
			if rec := txn.object(obj.TypedKey()); rec != nil {
				txn.releaseClaims(rec)
			}
		}
		for _, obj := range objs {
			txn.putObject(&objectRecord{Key: obj.TypedKey(), Object: obj})
		}
		txn.setRevision(endRev(rev))
		txn.commit()
	})
	e.mu.Lock()
	e.lastRev, e.nextSub = 0, 0
	e.lastEpoch = epoch
	e.mu.Unlock()
	e.advanceTo(rev)
}

// apply applies a watch response's events to the cache and hands them to the watchers,
// each with its revision.
func (e *etcdStore) apply(evs []*clientv3.Event) {
	last := evs[len(evs)-1].Kv.ModRevision
	e.env.pub.publish(func(uint64, bool) (uint64, []stagedChange, error) {
		return endRev(last), e.stageEvents(evs), nil
	})
	e.advanceTo(last)
}

// stageEvents applies a watch response's events to the cache and returns their changes,
// each with its revision. It runs inside publisher.publish.
func (e *etcdStore) stageEvents(evs []*clientv3.Event) []stagedChange {
	txn := e.env.tables.write()
	changes := make([]stagedChange, 0, len(evs))
	e.mu.Lock()
	for _, ev := range evs {
		kv := ev.Kv
		if kv.ModRevision != e.lastRev {
			e.lastRev, e.nextSub = kv.ModRevision, 0
		}
		sub := e.nextSub
		e.nextSub++
		switch ev.Type {
		case mvccpb.PUT:
			obj, err := e.decode(kv)
			if err != nil {
				e.env.log.Error("etcd store: skipping a change that holds no object", "error", err)
				continue
			}
			id := obj.TypedKey()
			objectID := id.String()
			var old *nimbusv1.Object
			if rec := txn.objectByID(objectID); rec != nil {
				old = rec.Object
			}
			changes = append(changes, *storePut(txn, obj.Key(), id, objectID, old, obj))
		case mvccpb.DELETE:
			// The etcd key is the key ID of the object it held.
			id, err := nimbusv1.ParseKey(strings.TrimPrefix(string(kv.Key), e.objects))
			if err != nil {
				continue
			}
			rec := txn.object(id)
			if rec == nil {
				continue
			}
			c, _ := stageDelete(txn, write{key: rec.Object.Key(), id: id}, eventRev(kv.ModRevision, sub))
			changes = append(changes, *c)
		}
	}
	last := evs[len(evs)-1].Kv.ModRevision
	e.mu.Unlock()
	txn.setRevision(endRev(last))
	txn.commit()
	return changes
}

// unapplied returns the events of a watch response that the cache does not hold yet:
// those past the etcd revision it holds everything of.
func (e *etcdStore) unapplied(evs []*clientv3.Event) []*clientv3.Event {
	applied := e.appliedRev()
	for i, ev := range evs {
		if ev.Kv.ModRevision > applied {
			return evs[i:]
		}
	}
	return nil
}

// progress records that etcd has nothing more for the cache up to rev.
func (e *etcdStore) progress(rev int64) {
	// The revision gauge stays at the last change, which every replica that is caught up
	// shows alike, whatever progress each was told of.
	e.env.pub.publish(func(cur uint64, _ bool) (uint64, []stagedChange, error) {
		return max(cur, endRev(rev)), nil, nil
	})
	e.advanceTo(rev)
}

// appliedRev returns the etcd revision the cache holds everything of.
func (e *etcdStore) appliedRev() int64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.applied
}

// advanceTo moves applied up to rev and wakes whoever waits for it.
func (e *etcdStore) advanceTo(rev int64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if rev <= e.applied && rev != 0 {
		return
	}
	e.applied = rev
	close(e.advanced)
	e.advanced = make(chan struct{})
}

// waitApplied waits until the cache holds everything up to etcd revision rev. While it
// waits it asks etcd every so often for the watch's progress, so that a cache with no
// object change left to apply learns that it is current.
func (e *etcdStore) waitApplied(ctx context.Context, rev int64) error {
	var tick <-chan time.Time
	for {
		e.mu.Lock()
		applied, ch := e.applied, e.advanced
		e.mu.Unlock()
		if applied >= rev {
			return nil
		}
		if tick == nil {
			t := time.NewTicker(progressInterval)
			defer t.Stop()
			tick = t.C
		}
		select {
		case <-ch:
		case <-tick:
			if err := e.cli.RequestProgress(cacheWatchContext(ctx)); err != nil {
				e.env.log.Debug("etcd: asking for watch progress", "error", err)
			}
		case <-ctx.Done():
			return fmt.Errorf("waiting for this replica's cache to reach etcd revision %d (it is at %d): %w", rev, applied, ctx.Err())
		case <-e.ctx.Done():
			return ErrClosed
		}
	}
}

// progressInterval is how often a wait for the cache asks etcd for the watch's progress.
const progressInterval = 50 * time.Millisecond

// catchUp waits, up to etcdResumeWait, until the cache holds revision rev. It reports
// whether the cache got there.
func (e *etcdStore) catchUp(ctx context.Context, rev uint64) bool {
	ctx, cancel := context.WithTimeout(ctx, etcdResumeWait)
	defer cancel()
	return e.waitApplied(ctx, etcdRevOf(rev)) == nil
}

// commitGroup commits the batches one after the other, each in as few etcd transactions
// as its size allows, and closes their done channels.
func (e *etcdStore) commitGroup(group []*batch) {
	for _, b := range group {
		if err := e.commitBatch(b); err != nil {
			b.err = err
			if !errors.Is(err, ErrConflict) {
				// A conflict names the objects itself.
				b.err = fmt.Errorf("%s: %w", b.what(), err)
			}
			continue
		}
		logBatch(e.env.log, b)
	}
	for _, b := range group {
		close(b.done)
	}
}

// commitBatch commits one batch, split into transactions by MaxTxnOps and MaxTxnBytes.
func (e *etcdStore) commitBatch(b *batch) error {
	if why := e.notReady(); why != "" {
		return fmt.Errorf("%s: %w", why, ErrUnavailable)
	}
	b.outcomes = make([]outcome, len(b.writes))
	chunks := e.split(b.writes)
	if len(chunks) > 1 {
		e.env.log.Warn("batch split into several etcd transactions; it is atomic per transaction only",
			"objects", len(b.writes), "transactions", len(chunks), "max_txn_ops", e.opts.MaxTxnOps, "max_txn_bytes", e.opts.MaxTxnBytes)
	}
	if len(chunks) > 1 && b.mayConflict() {
		// Each transaction checks its own writes; a conflict found only in a later one
		// would leave the batch half committed, so the whole batch is checked first.
		if err := e.checkConflicts(b); err != nil {
			return err
		}
	}
	from := 0
	for i, to := range chunks {
		committed, err := e.commitChunk(b, from, to)
		if committed {
			b.txns++
		}
		if err != nil {
			if i > 0 {
				return fmt.Errorf("the first %d of %d objects were committed, in %d of %d etcd transactions; the rest were not: %w",
					from, len(b.writes), i, len(chunks), err)
			}
			return err
		}
		from = to
	}
	b.rev = e.env.pub.currentRev()
	for _, out := range b.outcomes {
		if out.changed {
			b.rev = max(b.rev, out.rev)
		}
	}
	return nil
}

// checkConflicts stages the batch's writes against the cache, and returns the error,
// wrapping ErrConflict, that refuses it when one of them would take a value that another
// object holds; nil otherwise. It stores nothing.
func (e *etcdStore) checkConflicts(b *batch) error {
	now := timestamppb.New(e.env.opts.Now())
	return e.env.pub.publish(func(cur uint64, _ bool) (uint64, []stagedChange, error) {
		txn := e.env.tables.write()
		defer txn.abort()
		var conflicts refusal
		for i, w := range b.writes {
			if w.obj == nil {
				stageDelete(txn, w, 0)
				continue
			}
			w.obj = proto.Clone(w.obj).(*nimbusv1.Object)
			if _, _, err := stageApply(txn, w, 0, now); err != nil {
				pos, id := b.at(i)
				conflicts.add(pos, id, err)
			}
		}
		return cur, nil, conflicts.conflictErr()
	})
}

// split returns where each transaction's writes end.
func (e *etcdStore) split(writes []write) []int {
	var ends []int
	ops, size := 0, 0
	for i, w := range writes {
		// The etcd key is e.objects and the key ID, of three separators.
		n := len(e.objects) + len(w.id.Kind.Name()) + len(w.id.Tenant) + len(w.id.Namespace) + len(w.id.Name) + 3 + 64
		if w.obj != nil {
			n += proto.Size(w.obj)
		}
		if ops > 0 && (ops == e.opts.MaxTxnOps || size+n > e.opts.MaxTxnBytes) {
			ends = append(ends, i)
			ops, size = 0, 0
		}
		ops++
		size += n
	}
	return append(ends, len(writes))
}

// commitChunk commits writes [from, to) of the batch in one etcd transaction, and reports
// whether it committed changes: it stages them against the cache as the embedded store
// would commit them, sends the changes with a check that each object the writes name is
// still what the cache holds, and waits for the cache to hold the transaction. A
// transaction that loses a race with another replica is staged again once the cache has
// caught up.
func (e *etcdStore) commitChunk(b *batch, from, to int) (committed bool, err error) {
	for attempt := 0; ; attempt++ {
		now := timestamppb.New(e.env.opts.Now())
		var (
			cmps []clientv3.Cmp
			ops  []clientv3.Op
			size int                    // the bytes of the changes' keys and values
			subs = make([]int, to-from) // the position of each write's change; -1: none
			outs = make([]outcome, to-from)
		)
		err := e.env.pub.publish(func(cur uint64, closed bool) (uint64, []stagedChange, error) {
			if closed {
				return cur, nil, ErrClosed
			}
			txn := e.env.tables.write()
			defer txn.abort()
			var conflicts refusal
			for i := from; i < to; i++ {
				w := b.writes[i]
				if w.obj != nil {
					// Staging fills in the object's meta; a retry starts from the caller's.
					w.obj = proto.Clone(w.obj).(*nimbusv1.Object)
				}
				key := e.objects + w.id.String()
				var modRev int64
				if rec := txn.object(w.id); rec != nil {
					modRev = etcdRevOf(rec.Object.GetMeta().GetRevision())
				}
				sub := uint64(len(ops))
				var (
					c   *stagedChange
					out outcome
					err error
				)
				if w.obj != nil {
					c, out, err = stageApply(txn, w, sub, now)
				} else {
					c, out = stageDelete(txn, w, sub)
				}
				if err != nil {
					pos, id := b.at(i)
					conflicts.add(pos, id, err)
					continue
				}
				// Every write, a change or not, holds only if etcd still has the object as the
				// cache does: an apply the cache finds unchanged, or a deletion of an object
				// the cache does not hold, is checked against etcd too, since another replica
				// may have changed the object a moment ago.
				if modRev == 0 {
					cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(key), "=", 0))
				} else {
					cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(key), "=", modRev))
				}
				subs[i-from] = -1
				if c == nil {
					out.rev = cur
					outs[i-from] = out
					continue
				}
				if c.after != nil {
					val, err := c.after.MarshalVT()
					if err != nil {
						return cur, nil, fmt.Errorf("encoding %s: %w", w.id, err)
					}
					ops = append(ops, clientv3.OpPut(key, string(val)))
					size += len(val)
				} else {
					ops = append(ops, clientv3.OpDelete(key))
				}
				size += len(key)
				subs[i-from] = int(sub)
				outs[i-from] = out
			}
			return cur, nil, conflicts.conflictErr()
		})
		if err != nil {
			return false, err
		}
		ctx, cancel := context.WithTimeout(e.ctx, etcdWriteTimeout)
		// With no change to make, the transaction only checks, linearizably, that the cache
		// was current for these objects.
		resp, err := e.cli.Txn(ctx).If(cmps...).Then(ops...).Commit()
		if err != nil {
			cancel()
			if lerr := e.overLimit(err, len(cmps), size); lerr != nil {
				return false, lerr
			}
			return false, fmt.Errorf("etcd transaction of %d changes: %w: %w", len(ops), err, ErrUnavailable)
		}
		if resp.Succeeded && len(ops) == 0 {
			cancel()
			copy(b.outcomes[from:to], outs)
			return false, nil
		}
		rev := resp.Header.Revision
		err = e.waitApplied(ctx, rev)
		cancel()
		if err != nil {
			if resp.Succeeded {
				return true, fmt.Errorf("committed at etcd revision %d, but %w: %w", rev, err, ErrUnavailable)
			}
			return false, fmt.Errorf("%w: %w", err, ErrUnavailable)
		}
		if !resp.Succeeded {
			e.conflicts.Inc()
			if attempt >= etcdMaxConflicts {
				return false, fmt.Errorf("%d etcd transactions in a row lost a race with other replicas: %w", attempt+1, ErrUnavailable)
			}
			continue
		}
		e.txns.Inc()
		for i, sub := range subs {
			if sub < 0 {
				continue
			}
			out := &outs[i]
			out.rev = eventRev(rev, uint64(sub))
			if out.obj != nil {
				m := out.obj.Meta
				if m.GenerationRevision == m.Revision {
					m.GenerationRevision = out.rev
				}
				m.Revision = out.rev
			}
		}
		copy(b.outcomes[from:to], outs)
		return true, nil
	}
}

// overLimit returns, when etcd refused a transaction of ops operations and about size
// bytes for exceeding one of its limits, an error that names the limit and what to raise
// or lower, and logs it: trying again cannot mend it, so it does not wrap
// ErrUnavailable. It returns nil for any other error.
func (e *etcdStore) overLimit(err error, ops, size int) error {
	switch {
	case errors.Is(err, rpctypes.ErrTooManyOps):
		// The check at start passed: etcd's limit was lowered since.
		err = fmt.Errorf("etcd refused a transaction of %d operations (%w): its --max-txn-ops is below "+
			"--etcd-max-txn-ops (EtcdOptions.MaxTxnOps) %d, which it took when this replica started; "+
			"raise etcd's or lower nimbus's", ops, err, e.opts.MaxTxnOps)
	case errors.Is(err, rpctypes.ErrRequestTooLarge), status.Code(err) == codes.ResourceExhausted:
		err = fmt.Errorf("etcd refused a transaction of %d operations and about %d bytes as too large (%w): "+
			"its --max-request-bytes is below the %d bytes of objects one transaction may hold "+
			"(EtcdOptions.MaxTxnBytes); raise etcd's", ops, size, err, e.opts.MaxTxnBytes)
	default:
		return nil
	}
	e.overLimits.Inc()
	e.env.log.Error("etcd: a transaction over etcd's limits; every such batch will fail", "error", err)
	return err
}

// replicaLease is how long, in seconds, a replica's registration outlives it.
const replicaLease = 10

// membership registers the replica on a lease of its own and follows the registrations.
// When the store is closed it revokes the lease, so that the peers stop pushing to it at
// once rather than when the lease expires.
func (e *etcdStore) membership() error {
	ctx := e.ctx
	prefix := e.opts.Prefix + "/replicas/"
	name := e.env.opts.ReplicaName
	lease, err := e.cli.Grant(ctx, replicaLease)
	if err != nil {
		return fmt.Errorf("granting a lease: %w", err)
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		e.cli.Revoke(rctx, lease.ID)
	}()
	if _, err := e.cli.Put(ctx, prefix+name, e.opts.Advertise, clientv3.WithLease(lease.ID)); err != nil {
		return fmt.Errorf("registering %s: %w", prefix+name, err)
	}
	kctx, cancel := context.WithCancel(ctx)
	defer cancel()
	alive, err := e.cli.KeepAlive(kctx, lease.ID)
	if err != nil {
		return fmt.Errorf("keeping the lease alive: %w", err)
	}
	resp, err := e.cli.Get(ctx, prefix, clientv3.WithPrefix())
	if err != nil {
		return fmt.Errorf("listing the replicas: %w", err)
	}
	peers := map[string]string{}
	for _, kv := range resp.Kvs {
		peers[strings.TrimPrefix(string(kv.Key), prefix)] = string(kv.Value)
	}
	e.handPeers(peers)
	e.env.log.Info("etcd: registered as a replica", "key", prefix+name, "address", e.opts.Advertise, "replicas", len(peers))
	wch := e.cli.Watch(clientv3.WithRequireLeader(kctx), prefix, clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1))
	for {
		select {
		case _, ok := <-alive:
			if !ok {
				return errors.New("the replica's lease expired or could not be renewed")
			}
		case wr, ok := <-wch:
			if !ok {
				return ctx.Err()
			}
			if err := wr.Err(); err != nil {
				return fmt.Errorf("watching the replicas: %w", err)
			}
			for _, ev := range wr.Events {
				peer := strings.TrimPrefix(string(ev.Kv.Key), prefix)
				if ev.Type == mvccpb.DELETE {
					delete(peers, peer)
				} else {
					peers[peer] = string(ev.Kv.Value)
				}
			}
			e.handPeers(peers)
		}
	}
}

// handPeers hands the registered replicas to setPeers.
func (e *etcdStore) handPeers(reg map[string]string) {
	peers := make([]Peer, 0, len(reg))
	for name, addr := range reg {
		peers = append(peers, Peer{Name: name, Address: addr})
	}
	e.setPeers(peers)
}

// catchUpForReports waits, when a report names an object the cache does not hold, until
// the cache holds everything etcd had when the reports came (up to etcdResumeWait). An
// agent that moved from another replica reports again everything it programmed, and
// what it got from there a moment ago may not have reached this replica yet: its report
// would be dropped, and the agent does not send it again.
func (e *etcdStore) catchUpForReports(reports []*nimbusv1.StatusReport) {
	read := e.env.tables.read()
	missing := false
	for _, r := range reports {
		if read.object(r.GetKey().Key()) == nil {
			missing = true
			break
		}
	}
	if !missing {
		return
	}
	ctx, cancel := context.WithTimeout(e.ctx, etcdResumeWait)
	defer cancel()
	resp, err := e.cli.Get(ctx, e.epochKey)
	if err == nil {
		err = e.waitApplied(ctx, resp.Header.Revision)
	}
	if err != nil {
		e.env.log.Debug("etcd: catching up for status reports", "error", err)
	}
}
