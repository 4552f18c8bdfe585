// Command nimbus runs the naples desired-state bus: it serves the nimbus.v1.Nimbus API on
// the addresses given with --listen until SIGINT or SIGTERM, then drains and exits 0.
//
// Usage:
//
//	nimbus [--listen ADDR]... [--log-level debug|info|warn|error]
//	       [--tls-cert FILE --tls-key FILE --tls-ca FILE | --insecure]
//	       [--data-dir DIR | --ephemeral] [--metrics HOST:PORT [--pprof]] [--ui HOST:PORT]
//	nimbus --store etcd --etcd-endpoints URL,... [--etcd-cacert FILE] [--etcd-cert FILE --etcd-key FILE]
//	       [--etcd-prefix PREFIX] [--etcd-max-txn-ops N] [--etcd-compaction-interval D] [--replica-name NAME] [--advertise ADDR] ...
//
// ADDR is unix:///path/to/socket or tcp://host:port; the default is
// unix:///run/naples/nimbus.sock. nimbus serves mutual TLS with the certificate and key of
// --tls-cert and --tls-key (defaults /etc/naples/pki/nimbus.crt and nimbus.key), requires
// every client to present a certificate issued by a CA of --tls-ca (default
// /etc/naples/pki/ca.crt), and lets nodes and publishers do only what their certificates
// allow; `naplesctl certs` makes such certificates. A certificate and key renewed over
// those files are served (and presented to peer replicas) from the next connection on,
// within a second, without a restart; the CA file is read at start. --insecure serves plaintext instead
// and checks nothing. Bad flags and configuration (certificate files that cannot be
// loaded) exit with status 2, which the systemd unit does not restart; other errors with 1.
//
// nimbus keeps its objects in DIR/nimbus.db (default DIR /var/lib/naples/nimbus), so that
// they, the revision and the epoch survive a restart and agents resume where they were;
// --ephemeral keeps everything in memory only. A store file nimbus cannot read back, or that
// another process holds, is an error that names it. --metrics serves Prometheus metrics on
// http://HOST:PORT/metrics, liveness on /healthz and readiness on /readyz (200 while
// serving), and with --pprof the Go runtime's profiles under /debug/pprof/; without
// --metrics there is no HTTP endpoint. The gRPC listeners also serve the
// standard health service, grpc.health.v1.Health.
//
// With --store etcd the objects live in etcd instead, and nimbus is one of any number of
// replicas sharing them under --etcd-prefix (default /naples): agents resume on any replica,
// and the replicas, which find each other in etcd by --replica-name (default the hostname)
// and reach each other at --advertise (default the first --listen), share the statuses
// agents report. A replica dials its peers with its own --tls-cert, which must then be a
// replica certificate (`naplesctl certs --replicas NAME`). /readyz answers 503 until the
// replica has read etcd. A replica that holds more than its share of the agents (plus
// --rebalance-slack, default 1) asks some, up to --rebalance-rate a second (default 1; 0
// turns it off), to watch another replica, where they resume. See docs/replicas.md.
//
// A unix socket of --listen is made mode 0660 and given to the group --socket-group
// (default naples, when it exists; empty leaves it nimbus's user's alone), so that its
// members reach nimbus with naplesctl. /readyz and the gauge
// naples_nimbus_tls_certificate_expiry_seconds warn of a certificate that expires within
// --tls-expiry-warning (default 720h). --tls-crl FILE, a revocation list signed by the CA
// (naplesctl certs --revoke writes one), refuses the client certificates it revokes;
// nimbus reads it again when it changes (looking every --tls-crl-interval, default 5s)
// and closes the open connections of certificates it comes to revoke.
//
// Every size, count and rate a client could push without bound is limited; the flags of
// the limits (--max-object-bytes, --max-streams-per-node, --max-status-message-bytes and
// more) and the metrics that show them being hit are listed in docs/limits.md.
//
// --ui serves a read-only web console on http(s)://HOST:PORT/ui/: the propagation matrix
// of objects × nodes, live, the nodes, one object, and the flows. It serves HTTPS and asks
// for a client certificate under the same rules as the gRPC API (any role may read), or
// plain HTTP with --insecure. See docs/ui.md.
//
// nimbus --version prints the version, the Go release and the platform, and exits 0.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"google.golang.org/grpc"

	"github.com/naplesnet/naples/internal/address"
	"github.com/naplesnet/naples/internal/cmdline"
	"github.com/naplesnet/naples/internal/exitstatus"
	"github.com/naplesnet/naples/internal/memsettle"
	"github.com/naplesnet/naples/internal/pki"
	"github.com/naplesnet/naples/internal/telemetry"
	"github.com/naplesnet/naples/internal/version"
	"github.com/naplesnet/naples/nimbus"
)

// defaultListen is where nimbus listens when no --listen is given.
const defaultListen = "unix:///run/naples/nimbus.sock"

// defaultDataDir is where nimbus keeps its store when neither --data-dir nor --ephemeral
// is given.
const defaultDataDir = "/var/lib/naples/nimbus"

// defaultBurstGCPercent is --gc-percent-burst's default: half the collections of Go's
// default target while a burst lasts.
const defaultBurstGCPercent = 200

// Defaults of the TLS flags.
const (
	defaultTLSCert = "/etc/naples/pki/nimbus.crt"
	defaultTLSKey  = "/etc/naples/pki/nimbus.key"
	defaultTLSCA   = "/etc/naples/pki/ca.crt"
)

// errUsage marks errors in the command line or the environment that parseFlags has
// reported on stderr already. They exit with status 2, as configuration errors do.
var errUsage = cmdline.ErrUsage

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stderr)
	stop()
	switch {
	case err == nil, errors.Is(err, cmdline.ErrHelp):
		return
	case !errors.Is(err, errUsage):
		fmt.Fprintf(os.Stderr, "nimbus: %v\n", err)
	}
	os.Exit(exitstatus.Of(err))
}

// config is what the command line says.
type config struct {
	listen   []address.Address
	logLevel slog.Level
	// tlsCert, tlsKey and tlsCA are the files of the server's certificate, its key and
	// the CAs that issue client certificates.
	tlsCert, tlsKey, tlsCA string
	// insecure serves plaintext.
	insecure bool
	// dataDir is the directory of the durable store; empty with --ephemeral.
	dataDir string
	// metrics is the host:port to serve metrics on; empty for none.
	metrics string
	// pprof serves the Go runtime's profiles on the metrics endpoint too.
	pprof bool
	// burstGCPercent is the garbage collector's target during bursts (memsettle).
	burstGCPercent int
	// watchBuffer is how many events a watcher may fall behind before it is reset.
	watchBuffer int
	// historyWindow is how many of the latest changes are kept for watches to resume.
	historyWindow int
	// version prints the version instead of serving.
	version bool
	// replica says which store, and how nimbus is a replica with --store etcd.
	replica replicaConfig
	// limits are nimbus's limits (docs/limits.md).
	limits nimbus.Limits
	// access says who may reach nimbus, and how it checks their certificates and its own.
	access accessConfig
	// ui is the web console (docs/ui.md).
	ui uiConfig
}

// description is what --help says nimbus is, above its flags.
const description = `nimbus runs the naples desired-state bus: it serves the nimbus.v1.Nimbus API on the
addresses given with --listen until SIGINT or SIGTERM, then drains and exits 0. It serves
mutual TLS with --tls-cert and --tls-key and lets nodes and publishers do only what their
certificates allow; --insecure serves plaintext. Bad flags and configuration exit with
status 2. See docs/replicas.md for replicas over etcd and docs/limits.md for the limits.

Every flag can also be set with the environment variable named after it in its help
($NIMBUS_ and the flag's name in upper case); the command line wins.`

// parseFlags parses the command line and the environment, read with getenv. It reports a
// bad flag or variable on stderr itself, so the error it returns only marks the failure.
func parseFlags(args []string, stderr io.Writer, getenv func(string) string) (config, error) {
	cfg := config{logLevel: slog.LevelInfo, dataDir: defaultDataDir}
	fs := cmdline.New("nimbus [flags]", description, "NIMBUS_", stderr)
	dataDirSet, ephemeral := false, false
	fs.Func("data-dir", "`directory` of the durable store, DIR/nimbus.db (default "+defaultDataDir+")", func(s string) error {
		if s == "" {
			return errors.New("must not be empty; --ephemeral keeps everything in memory")
		}
		cfg.dataDir, dataDirSet = s, true
		return nil
	})
	addReplicaFlags(fs, &cfg.replica)
	addLimitFlags(fs, &cfg.limits)
	addAccessFlags(fs, &cfg.access)
	addUIFlags(fs, &cfg.ui)
	fs.IntVar(&cfg.watchBuffer, "watch-buffer", nimbus.DefaultWatchBuffer, "how many `events` a watcher may fall behind before it is reset and must resume")
	fs.IntVar(&cfg.historyWindow, "history-window", nimbus.DefaultHistoryWindow, "how many of the latest `changes` are kept so that a watch can resume after them; negative keeps none")
	fs.BoolVar(&ephemeral, "ephemeral", false, "keep objects in memory only: a restart loses them and every agent resyncs")
	fs.Func("metrics", "`host:port` to serve Prometheus metrics (/metrics) and probes (/healthz, /readyz) on (default: none)", func(s string) error {
		if _, _, err := net.SplitHostPort(s); err != nil {
			return fmt.Errorf("address %q: want host:port: %w", s, err)
		}
		cfg.metrics = s
		return nil
	})
	fs.BoolVar(&cfg.pprof, "pprof", false, "serve the Go runtime's profiles under /debug/pprof/ on the --metrics endpoint")
	fs.IntVar(&cfg.burstGCPercent, "gc-percent-burst", defaultBurstGCPercent, "the garbage collector's target while nimbus works through a burst of changes (a bulk apply, its start-up), in `percent`; the heap may grow further until the burst ends, when the target nimbus started with (GOGC, or 100) comes back and nimbus releases what the burst left; 0, or a value not above that target, keeps it")
	fs.StringVar(&cfg.tlsCert, "tls-cert", defaultTLSCert, "`file` of nimbus's TLS certificate")
	fs.StringVar(&cfg.tlsKey, "tls-key", defaultTLSKey, "`file` of nimbus's TLS private key")
	fs.StringVar(&cfg.tlsCA, "tls-ca", defaultTLSCA, "`file` of the CA certificates that client certificates must chain to")
	fs.BoolVar(&cfg.insecure, "insecure", false, "serve plaintext without TLS, letting every client do everything")
	fs.BoolVar(&cfg.version, "version", false, "print the version and exit")
	fs.Func("listen", "`address` to serve on, unix:///path or tcp://host:port; repeatable (default "+defaultListen+")",
		func(s string) error {
			a, err := address.Parse(s)
			if err != nil {
				return err
			}
			cfg.listen = append(cfg.listen, a)
			return nil
		})
	fs.Func("log-level", "log `level`: debug, info, warn or error (default info)", func(s string) error {
		switch strings.ToLower(s) {
		case "debug":
			cfg.logLevel = slog.LevelDebug
		case "info":
			cfg.logLevel = slog.LevelInfo
		case "warn":
			cfg.logLevel = slog.LevelWarn
		case "error":
			cfg.logLevel = slog.LevelError
		default:
			return fmt.Errorf("level %q: want debug, info, warn or error", s)
		}
		return nil
	})
	if err := fs.Parse(args, getenv); err != nil {
		return cfg, err
	}
	if cfg.burstGCPercent < 0 {
		return cfg, fs.Fail(fmt.Sprintf("invalid value %d for flag --gc-percent-burst: must be 0 or more", cfg.burstGCPercent))
	}
	if cfg.pprof && cfg.metrics == "" {
		return cfg, fs.Fail("--pprof serves on the --metrics endpoint: give --metrics too")
	}
	if ephemeral && dataDirSet {
		return cfg, fs.Fail("--ephemeral and --data-dir are mutually exclusive")
	}
	if err := cfg.replica.check(dataDirSet, ephemeral); err != nil {
		return cfg, fs.Fail(err.Error())
	}
	if ephemeral || cfg.replica.store == "etcd" {
		cfg.dataDir = ""
	}
	if len(cfg.listen) == 0 {
		a, err := address.Parse(defaultListen)
		if err != nil {
			return cfg, fmt.Errorf("parsing default address: %w", err)
		}
		cfg.listen = []address.Address{a}
	}
	return cfg, nil
}

// run serves nimbus until ctx ends.
func run(ctx context.Context, args []string, stderr io.Writer) error {
	cfg, err := parseFlags(args, stderr, os.Getenv)
	if err != nil {
		return err
	}
	if cfg.version {
		fmt.Fprintln(os.Stdout, version.String("nimbus"))
		return nil
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: cfg.logLevel}))
	var tlsConfig *tls.Config
	var keyPair *pki.KeyPairFile
	if !cfg.insecure {
		keyPair, err = pki.LoadKeyPairFile(cfg.tlsCert, cfg.tlsKey)
		if err == nil {
			err = serverCertificate(cfg.tlsCert, keyPair.Leaf())
		}
		if err == nil {
			tlsConfig, err = pki.ServerConfigOf(keyPair, cfg.tlsCA)
		}
		if err != nil {
			return exitstatus.Mark(fmt.Errorf("loading TLS credentials (--insecure serves plaintext): %w", err))
		}
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	opts := nimbus.Options{Logger: log, TLS: tlsConfig, DataDir: cfg.dataDir, Registerer: reg, WatchBuffer: cfg.watchBuffer,
		HistoryWindow: cfg.historyWindow, Limits: cfg.limits}
	if err := certOptions(cfg, &opts); err != nil {
		return exitstatus.Mark(err)
	}
	if keyPair != nil {
		certs := opts.Certificates
		keyPair.OnReload(func(leaf *x509.Certificate, err error) {
			if err != nil {
				log.Warn("the certificate files changed but do not load; the certificate loaded before stays in use", "certificate", cfg.tlsCert, "key", cfg.tlsKey, "error", err)
				return
			}
			log.Info("certificate loaded again", "certificate", cfg.tlsCert, "serial", leaf.SerialNumber.String(), "not_after", leaf.NotAfter)
			certs.Renewed(cfg.tlsCert, leaf.NotAfter)
		})
		go keyPair.Watch(ctx)
	}
	if cfg.replica.store == "etcd" {
		if opts.Etcd, err = cfg.replica.etcdOptions(cfg.listen); err != nil {
			return exitstatus.Mark(err)
		}
		opts.ReplicaName = cfg.replica.name
		opts.Rebalance = cfg.replica.rebalance
		// A replica dials its peers with its own certificate, which names it.
		var peerTLS *tls.Config
		if !cfg.insecure {
			if peerTLS, err = pki.ClientConfigOf(keyPair, cfg.tlsCA, ""); err != nil {
				return exitstatus.Mark(fmt.Errorf("loading the replica's client credentials: %w", err))
			}
		}
		opts.PeerDialOptions = []grpc.DialOption{grpc.WithTransportCredentials(pki.TransportCredentials(peerTLS))}
	}
	// Start-up is a burst: loading the stored objects, or reading etcd. The settler
	// ends it once nimbus is ready, and raises the target again for later bursts.
	memory := memsettle.New(log, cfg.burstGCPercent)
	memory.StartBurst()
	defer memory.EndBurst()
	opts.Burst = memory.StartBurst
	srv, err := nimbus.New(opts)
	switch {
	case errors.Is(err, nimbus.ErrCorrupt):
		return fmt.Errorf("%w (restore the file from a backup, or move it aside to start with an empty store: agents then remove every object until publishers apply it again)", err)
	case errors.Is(err, nimbus.ErrLocked):
		return fmt.Errorf("%w (is another nimbus running with --data-dir %s?)", err, cfg.dataDir)
	case err != nil:
		return err
	}
	defer srv.Close()
	settled := make(chan struct{})
	defer func() { <-settled }()
	settleCtx, stopSettling := context.WithCancel(ctx)
	defer stopSettling()
	go func() {
		defer close(settled)
		t := time.NewTicker(memsettle.Interval)
		defer t.Stop()
		memory.Watch(settleCtx, t.C, srv.Ready)
	}()
	switch {
	case opts.Etcd != nil:
		log.Info("store is etcd", "endpoints", cfg.replica.endpoints, "prefix", cfg.replica.prefix, "replica", cfg.replica.name)
	case cfg.dataDir == "":
		log.Info("store is ephemeral: a restart loses every object")
	}
	if cfg.metrics != "" {
		m, err := telemetry.Serve(ctx, cfg.metrics, telemetry.Options{Gatherer: reg, Ready: srv.Ready, Warnings: srv.Warnings, Logger: log, Pprof: cfg.pprof})
		if err != nil {
			return err
		}
		defer m.Close()
		log.Info("serving metrics", "url", "http://"+m.Addr()+"/metrics", "probes", []string{"/healthz", "/readyz"})
	}
	if cfg.ui.addr != "" {
		// The console refuses the certificates --tls-crl revokes, as the API does.
		uiTLS := tlsConfig
		if uiTLS != nil && opts.CRL != nil {
			uiTLS = uiTLS.Clone()
			uiTLS.VerifyPeerCertificate = opts.CRL.VerifyPeerCertificate
		}
		ui, err := serveUI(ctx, cfg.ui, srv, uiTLS, reg, log)
		if err != nil {
			return err
		}
		defer ui.Close()
	}

	var listeners []net.Listener
	defer func() {
		// Serve closes the listeners it was given; this only covers failing before it.
		for _, l := range listeners {
			l.Close()
		}
	}()
	addrs := make([]string, 0, len(cfg.listen))
	for _, a := range cfg.listen {
		l, err := a.Listen(ctx)
		if err != nil {
			return err
		}
		listeners = append(listeners, l)
		if err := cfg.access.shareSocket(a, log); err != nil {
			return exitstatus.Mark(err)
		}
		// The listener's address, so that tcp://host:0 logs the port it got.
		addrs = append(addrs, address.Address{Network: a.Network, Addr: l.Addr().String()}.String())
	}
	log.Info("serving", "addresses", addrs, "epoch", srv.Epoch(), "tls", tlsConfig != nil)
	if err := srv.Serve(ctx, listeners...); err != nil {
		return err
	}
	log.Info("stopped")
	return nil
}
