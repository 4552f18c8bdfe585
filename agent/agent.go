package agent

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"github.com/naplesnet/naples/agent/halstore"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/naplesnet/naples/delphi"
	"github.com/naplesnet/naples/hal"
	"github.com/naplesnet/naples/internal/memsettle"
	"github.com/naplesnet/naples/internal/pki"
	"github.com/naplesnet/naples/internal/telemetry"
	"github.com/naplesnet/naples/nimbusclient"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// Config is what one agent needs to run.
type Config struct {
	// Node is this host's node name. Required.
	Node string
	// Nimbus is nimbus's address, "unix:///path" or "tcp://host:port", or a
	// comma-separated list of the addresses of nimbus replicas (see nimbusclient). Required.
	Nimbus string
	// TLS is the TLS configuration the agent dials nimbus with, presenting this node's
	// certificate, which must name Node. Default: nil, which dials plaintext.
	TLS *tls.Config
	// Certificates are the certificate files TLS was loaded from (internal/pki's
	// ReadExpiry): naples_agent_tls_certificate_expiry_seconds tells when each expires,
	// and /readyz warns of those that expire within CertificateWarning. Default: nil, none.
	Certificates *pki.Expiry
	// CertificateWarning is how long before one of Certificates expires /readyz warns of
	// it. Default: internal/pki's DefaultExpiryWarning (30 days).
	CertificateWarning time.Duration
	// StateDir holds the agent's state; one agent at a time may use it. Delphi keeps the
	// desired objects and the nimbus resume point there, so a restarted agent enforces
	// them before nimbus is reachable; the interface reconciler keeps in interfaces.json
	// the state and MTU it found on host NICs before it changed them, to put them back,
	// the network reconciler in sysctls.json the sysctls it found before it changed them
	// (a bridge's forwarding), and the endpoint reconciler in endpoints.json the MTU of
	// the workloads' interfaces it changed. Required.
	StateDir string
	// DiscardState throws away the stored desired state at start, so the agent starts
	// empty and resyncs from nimbus; it is the way out of a corrupt state file.
	// Default: false.
	DiscardState bool
	// Logger receives every log. Default: slog.Default().
	Logger *slog.Logger
	// Socket is the path of the unix socket the agent serves its read-only local API on
	// (delphi.v1.Delphi); its directory is created and the socket is made mode 0660.
	// Default: empty, the API is not served.
	Socket string
	// LocalAPIPageBytes bounds a page of the local API's List in bytes (see
	// InspectorOptions.ListPageBytes). Default: DefaultListPageBytes (2 MiB).
	LocalAPIPageBytes int
	// LocalAPIFlowStreams bounds the local API's Flows streams served at once. Default:
	// DefaultFlowStreams.
	LocalAPIFlowStreams int
	// Metrics is the TCP address, host:port, the agent serves Prometheus metrics on
	// (/metrics) together with its liveness (/healthz) and readiness (/readyz); port 0
	// picks a free port, which the log's "serving metrics" line names. Default: empty,
	// nothing is served.
	Metrics string
	// Pprof serves the Go runtime's profiles under /debug/pprof/ on the Metrics
	// endpoint too. Default: false.
	Pprof bool
	// BurstGCPercent is the garbage collector's target (GOGC) while the agent works
	// through a burst, such as a bulk apply or delete or the restore at start: fewer
	// collections, for a heap that may grow further until the burst ends, when the
	// target the process ran with comes back and the agent releases what the burst left.
	// Default: 0, which keeps the process's target, as does any value not above it.
	BurstGCPercent int
	// InterfaceStats is how often the status of Interface objects is refreshed with
	// their NIC's counters; a change of a NIC's state refreshes it at once. A status goes
	// upstream only when it changed. Default: 10s.
	InterfaceStats time.Duration
	// BPFDir is the bpffs directory the firewall pins its maps and links in, so that
	// enforcement and connection tracking outlive the agent; bpffs is mounted on
	// /sys/fs/bpf when it is under it and missing. Default: empty, no firewall: security
	// groups and policies are not enforced.
	BPFDir string
	// GatewayBridges is the number of network bridges the gateway programs' map holds
	// marks for. Default: 4096.
	GatewayBridges int
	// GatewayCheck is how often the agent checks that the gateway programs are still
	// attached to the network bridges (the kernel does not say when one is detached by
	// hand) and programs again those that are not. Default: 10s.
	GatewayCheck time.Duration
	// FirewallCapacities are the sizes of the firewall's maps. Default: those of
	// FirewallCapacities' fields.
	FirewallCapacities FirewallCapacities
	// FlowLogSize is how many of the firewall's latest flow records the agent keeps for
	// the local API's Flows, when the firewall writes them (FirewallCapacities.FlowRing).
	// Default: DefaultFlowLogSize.
	FlowLogSize int
	// MaxTraces bounds the Trace objects the node runs at once (--max-traces). Default:
	// DefaultMaxTraces.
	MaxTraces int
	// FlowSweep is how often the conntrack table is swept for the connections that
	// expired without a packet, to write their ENDED flow records (reason idle) and free
	// their entries. Default: DefaultFlowSweep.
	FlowSweep time.Duration
	// FlowTapSubscriptions and FlowTapBatch bound the agent's flow tap, which serves
	// nimbus's flow observers; see FlowTapOptions' Subscriptions and Batch. Defaults:
	// DefaultFlowTapSubscriptions (16), DefaultFlowTapBatch (256).
	FlowTapSubscriptions int
	FlowTapBatch         int
	// FlowExport configures the exporters of FlowExportPolicy objects. Defaults: those
	// of FlowExportConfig's fields.
	FlowExport FlowExportConfig
	// FirewallStats is how often the statuses of policies and local endpoints are
	// refreshed with the firewall's counters. Default: 10s.
	FirewallStats time.Duration
	// StatusExceptionAfter and StatusMaxExceptions tune the node's status watermark; see
	// nimbusclient.Options. Defaults: those of internal/watermark.
	StatusExceptionAfter time.Duration
	StatusMaxExceptions  int

	// netns, when set, is the network namespace the HAL programs instead of the
	// agent's own; tests use it to keep their hands off the machine's namespace.
	netns *netns.NsHandle
}

// Run runs the agent until ctx ends, then stops every part and returns nil. It returns an
// error when the agent cannot start or a part fails. With Config.Metrics it serves its
// metrics and probes until it returns.
func Run(ctx context.Context, cfg Config) error {
	if err := nimbusv1.ValidateNodeName(cfg.Node); err != nil {
		return fmt.Errorf("agent: --node: %w", err)
	}
	if cfg.StateDir == "" {
		return errors.New("agent: state directory is required")
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	log = log.With("node", cfg.Node)
	unlock, err := lockStateDir(cfg.StateDir)
	if err != nil {
		return err
	}
	defer unlock()

	// One registry takes the metrics of every part, and of the process.
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	// Start-up is a burst: restoring the stored state and reconciling it.
	memory := memsettle.New(log, cfg.BurstGCPercent)
	memory.StartBurst()
	defer memory.EndBurst()
	// The firewall's programs load while delphi restores.
	firewall := loadFirewall(cfg, log)
	defer firewall.close()
	// Delphi restores the stored desired state before the nimbus client starts.
	store, err := delphi.Open(delphi.Options{Dir: cfg.StateDir, Discard: cfg.DiscardState, Indexes: indexes(), Logger: log, Registerer: reg})
	if errors.Is(err, delphi.ErrCorrupt) {
		return fmt.Errorf("agent: %w (start with --discard-state to discard it and resync from nimbus)", err)
	}
	if err != nil {
		return fmt.Errorf("agent: opening delphi: %w", err)
	}
	defer store.Close()
	memory.Release("restored")
	// The flow tap serves nimbus's flow observers from the flow log, once there is one.
	tap, err := NewFlowTap(FlowTapOptions{Subscriptions: cfg.FlowTapSubscriptions, Batch: cfg.FlowTapBatch, Logger: log, Registerer: reg})
	if err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	client, err := nimbusclient.New(nimbusclient.Options{Node: cfg.Node, Address: cfg.Nimbus, TLS: cfg.TLS, Store: store, Logger: log, Registerer: reg, FlowTap: tap,
		StatusExceptionAfter: cfg.StatusExceptionAfter, StatusMaxExceptions: cfg.StatusMaxExceptions, Burst: memory.StartBurst})
	if err != nil {
		return err
	}
	defer client.Close()
	// One view of the namespace's kernel, one subscription, for every reconciler's
	// observer and for the local api's reads.
	view := newKernelView(cfg.netns)
	reconcilers, fw, closeBackend, err := backend(store, cfg, view, firewall, log, reg)
	if err != nil {
		return err
	}
	defer closeBackend()
	var flows *FlowLog
	if fw != nil && cfg.FirewallCapacities.FlowRing > 0 {
		if flows, err = NewFlowLog(cmp.Or(cfg.FlowLogSize, DefaultFlowLogSize), reg); err != nil {
			return fmt.Errorf("agent: %w", err)
		}
	}
	exporters, err := NewFlowExportReconciler(FlowExportOptions{Store: store, Flows: flows, Node: cfg.Node, Dir: cfg.FlowExport.Dir,
		MaxPolicies: cfg.FlowExport.MaxPolicies, MaxConnections: cfg.FlowExport.MaxConnections, MessageBytes: cfg.FlowExport.MessageBytes,
		StatsInterval: cfg.FlowExport.StatsInterval, Logger: log, Registerer: reg})
	if err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	defer exporters.Close()
	reconcilers = append(reconcilers, exporters)
	halStore, err := halstore.New(store)
	if err != nil {
		return err
	}
	h, err := hal.New(hal.Options{Store: halStore, Reconcilers: reconcilers, Logger: log, Registerer: reg})
	if err != nil {
		return err
	}
	defer h.Close() // Run closes it too; this covers failing before Run

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	parts := map[string]func(context.Context) error{"nimbus client": client.Run, "hal": h.Run}
	if flows != nil {
		parts["flows"] = flowCollectorRun(store, cfg.BPFDir, cfg.Node, cmp.Or(cfg.FlowSweep, DefaultFlowSweep), fw, view, flows, log)
		tap.log = flows
	}
	if cfg.Socket != "" {
		serve, err := serveLocalAPI(ctx, cfg.Socket, InspectorOptions{Store: store, Logger: log, Node: cfg.Node, Namespace: cfg.netns, View: view, BPFDir: cfg.BPFDir,
			Firewall: fw, Flows: flows, ListPageBytes: cfg.LocalAPIPageBytes,
			FlowStreams: cfg.LocalAPIFlowStreams, Registerer: reg})
		if err != nil {
			return err
		}
		parts["local api"] = serve
	}
	var health health
	healthy := func() error { return health.check(ctx) }
	ready := func() []string {
		if err := healthy(); err != nil {
			return []string{err.Error()}
		}
		reasons := h.Ready()
		if len(reasons) == 0 {
			memory.ReadyNow()
		}
		return reasons
	}
	readyGauge := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "naples", Subsystem: "agent", Name: "ready",
		Help: "1 while the agent is ready (what /readyz answers 200 to): its desired state is complete and every desired object was reconciled at least once since start; 0 otherwise.",
	}, func() float64 {
		if len(ready()) > 0 {
			return 0
		}
		return 1
	})
	certGauge := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: "naples", Subsystem: "agent", Name: "tls_certificate_expiry_seconds",
		Help: "When each certificate the agent loaded expires (its NotAfter), in seconds since the Unix epoch, by certificate (client or ca) and file; for a file of several CAs, the first to expire.",
	}, []string{"certificate", "file"})
	setCerts := func() {
		for _, c := range cfg.Certificates.Certificates() {
			certGauge.WithLabelValues(c.Use, c.Path).Set(float64(c.NotAfter.Unix()))
		}
	}
	setCerts()
	cfg.Certificates.OnChange(setCerts)
	if _, err := telemetry.Register(reg, "agent", readyGauge, certGauge); err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	certWarning := cmp.Or(cfg.CertificateWarning, pki.DefaultExpiryWarning)
	warnings := func() []string { return cfg.Certificates.Warnings(time.Now(), certWarning) }
	if cfg.Metrics != "" {
		m, err := telemetry.Serve(ctx, cfg.Metrics, telemetry.Options{Gatherer: reg, Healthy: healthy, Ready: ready, Warnings: warnings, Logger: log, Pprof: cfg.Pprof})
		if err != nil {
			return fmt.Errorf("agent: %w", err)
		}
		defer m.Close()
		log.Info("serving metrics", "url", "http://"+m.Addr()+"/metrics", "probes", []string{"/healthz", "/readyz"})
	}
	errs := make(chan error, len(parts))
	for name, run := range parts {
		wg.Go(func() {
			err := run(ctx)
			health.stopped(name, err)
			if err != nil {
				errs <- fmt.Errorf("%s: %w", name, err)
				cancel()
			}
		})
	}
	settled := make(chan struct{})
	go func() {
		defer close(settled)
		t := time.NewTicker(memsettle.Interval)
		defer t.Stop()
		memory.Watch(ctx, t.C, ready)
	}()
	log.Info("agent started", "nimbus", cfg.Nimbus, "state_dir", cfg.StateDir)
	wg.Wait()
	cancel()
	<-settled
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	log.Info("agent stopped")
	return nil
}

// health tracks whether every part of the agent still runs, for /healthz.
type health struct {
	// mu guards err.
	mu sync.Mutex
	// err says which part stopped first, and why; nil while all run.
	err error
}

// stopped records that the named part's Run returned err.
func (h *health) stopped(part string, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.err != nil {
		return
	}
	h.err = fmt.Errorf("%s stopped", part)
	if err != nil {
		h.err = fmt.Errorf("%s failed: %w", part, err)
	}
}

// check returns nil while every part runs and ctx, the agent's, has not ended.
func (h *health) check(ctx context.Context) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.err != nil {
		return h.err
	}
	if ctx.Err() != nil {
		return errors.New("agent stopping")
	}
	return nil
}

// lockStateDir creates the state directory and takes an exclusive lock on it, so two
// agents never share one host's state.
func lockStateDir(dir string) (unlock func(), err error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating state directory: %w", err)
	}
	path := filepath.Join(dir, "agent.lock")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening lock file: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("locking %s (is another agent running on this state directory?): %w", path, err)
	}
	return func() { f.Close() }, nil
}

// FirewallCapacities are the sizes of the firewall's maps; zero takes the default. An
// object that would overflow one is FAILED with reason CapacityExceeded.
type FirewallCapacities struct {
	// Snapshot: entries of a snapshot, endpoints, peer prefixes and policy entries
	// together. Default: 65536.
	Snapshot int
	// Conntrack: connections tracked at once; when full the least recently used is
	// evicted. Default: 262144.
	Conntrack int
	// Rules: policy rules whose hits are counted. Default: 65536.
	Rules int
	// Endpoints: local endpoints whose packets are counted. Default: 16384.
	Endpoints int
	// Fragments: fragmented datagrams whose first fragment's verdict is kept at once (for
	// 3 seconds) for their later fragments; when full the least recently used is
	// evicted, and its later fragments are dropped. Default: 8192.
	Fragments int
	// FlowRing: bytes of the ring the firewall writes its flow records to, a power of 2
	// of at least a page. Default: 0, no flow records.
	FlowRing int
	// FlowActive: how long after its last record a connection that still sees packets
	// gets an ACTIVE flow record, with its counts. Default: 0, none.
	FlowActive time.Duration
	// FlowEndpointRate: flow records a second each local endpoint may have written on
	// each CPU, with a burst of as many; past it they are counted suppressed. Default: 0,
	// no budget.
	FlowEndpointRate int
	// NoTraces: the firewall's programs leave out the checks of Trace packets, which no
	// packet then pays for; Trace objects are FAILED with ReasonTracesOff. Default:
	// false.
	NoTraces bool
}
