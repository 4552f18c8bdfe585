// Command naples-agent runs the naples agent of one host: it watches nimbus for the host's
// objects, keeps them in delphi and programs the kernel from there, until SIGINT or SIGTERM.
// It dials nimbus with mutual TLS, presenting the node certificate of --tls-cert (default
// /etc/naples/pki/node.crt), which must name --node; --insecure dials plaintext. --nimbus
// may list several nimbus replicas, comma-separated, or name a host that resolves to
// several: the agent watches one that is ready and moves to another when it fails or stops
// serving. Bad flags and configuration (a node name nimbus refuses, certificate files that
// cannot be loaded) exit with status 2, which the systemd unit does not restart; other
// errors with 1.
//
// --metrics HOST:PORT serves Prometheus metrics on http://HOST:PORT/metrics (naples_agent_*,
// naples_delphi_*, naples_hal_* and naples_nimbusclient_*, and the Go runtime's and the
// process's), liveness on /healthz (200 while every part of the agent runs) and readiness
// on /readyz: 200 once delphi holds a complete desired state, restored from --state-dir or
// synced with nimbus, and every desired object has been reconciled at least once since
// start, programmed or failed; 503 with the reasons otherwise. Port 0 takes a free port,
// which the log line "serving metrics" names. Without --metrics there is no HTTP endpoint.
// naples_agent_tls_certificate_expiry_seconds tells when the certificates of --tls-cert and
// --tls-ca expire, and /readyz, still 200, adds a warning line for each that expires within
// --tls-expiry-warning (default 720h). With --pprof the same endpoint serves the Go
// runtime's profiles under /debug/pprof/ too, as nimbus's does. A certificate and key renewed over the files of
// --tls-cert and --tls-key are presented from the next connection on, within a second,
// without a restart; the CA file of --tls-ca is read at start.
//
// --gc-percent sets the Go garbage collector's target, as GOGC does: a collection starts
// once the heap has grown by that percentage of what the last one left live. The default,
// 50 where Go's is 100, lets the heap grow half as far above the live data, for more
// collections; GOGC in the environment is used instead when the flag is not given.
// --gc-percent-burst (default 200) is the target while the agent works through a burst
// of changes, such as a bulk apply or the restore at start: the agent allocates about
// 10 KB per route applied, garbage within milliseconds, which at 50 costs a fifth of its
// CPU in collections. When the burst ends the target goes back and the agent releases
// what the burst left; 0, or a value not above --gc-percent, keeps --gc-percent. The
// metric go_gc_gogc_percent shows what the agent runs with.
//
// naples-agent --version prints the version, the Go release and the platform, and exits 0.
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
	"runtime/debug"
	"syscall"
	"time"

	"github.com/naplesnet/naples/agent"
	"github.com/naplesnet/naples/internal/address"
	"github.com/naplesnet/naples/internal/cmdline"
	"github.com/naplesnet/naples/internal/exitstatus"
	"github.com/naplesnet/naples/internal/ipfix"
	"github.com/naplesnet/naples/internal/pki"
	"github.com/naplesnet/naples/internal/version"
	"github.com/naplesnet/naples/internal/watermark"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// defaultGCPercent is --gc-percent's default, the garbage collector's target (GOGC):
// with some 10,000 endpoints the agent's live data are tens of megabytes, and Go's default,
// 100, lets the heap grow to twice them between collections.
const defaultGCPercent = 50

// defaultBurstGCPercent is --gc-percent-burst's default: a quarter of the collections of
// defaultGCPercent while a burst lasts.
const defaultBurstGCPercent = 200

// errUsage marks errors in the command line or the environment that run has reported on
// stderr already. They exit with status 2, as configuration errors do.
var errUsage = cmdline.ErrUsage

// description is what --help says the agent is, above its flags.
const description = `naples-agent runs the naples agent of one host: it watches nimbus for the host's
objects, keeps them in delphi and programs the kernel from there, until SIGINT or SIGTERM.
It dials nimbus with mutual TLS, presenting the node certificate of --tls-cert, which must
name --node; --insecure dials plaintext. Bad flags and configuration exit with status 2.

Every flag can also be set with the environment variable named after it in its help
($NAPLES_AGENT_ and the flag's name in upper case); the command line wins.`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stderr)
	stop()
	switch {
	case err == nil, errors.Is(err, cmdline.ErrHelp):
		return
	case !errors.Is(err, errUsage):
		fmt.Fprintf(os.Stderr, "naples-agent: %v\n", err)
	}
	os.Exit(exitstatus.Of(err))
}

// run runs the agent until ctx ends, with the flags of args and the environment. It
// reports a bad flag or variable on stderr itself, so the error it returns for one only
// marks the failure as errUsage.
func run(ctx context.Context, args []string, stderr io.Writer) error {
	hostname, _ := os.Hostname()
	fs := cmdline.New("naples-agent [flags]", description, "NAPLES_AGENT_", stderr)
	node := fs.String("node", hostname, "this host's node `name` at nimbus")
	nimbus := fs.String("nimbus", "unix:///run/naples/nimbus.sock", "nimbus `address`: unix:///path or tcp://host:port, or a comma-separated list of the replicas' addresses")
	stateDir := fs.String("state-dir", "/var/lib/naples", "`directory` for the agent's state")
	discardState := fs.Bool("discard-state", false, "discard the stored desired state and resync from nimbus (recovers from a corrupt state file)")
	socket := fs.String("socket", "/run/naples/agent.sock", "unix socket `path` of the read-only local API; empty to not serve it")
	pageBytes := fs.Int("local-api-page-bytes", agent.DefaultListPageBytes, "`bytes` of one page of the local API's List; a page always holds one entry at least")
	var metrics string
	fs.Func("metrics", "`host:port` to serve Prometheus metrics (/metrics) and probes (/healthz, /readyz) on (default: none)", func(s string) error {
		if _, _, err := net.SplitHostPort(s); err != nil {
			return fmt.Errorf("address %q: want host:port: %w", s, err)
		}
		metrics = s
		return nil
	})
	pprof := fs.Bool("pprof", false, "serve the Go runtime's profiles under /debug/pprof/ on the --metrics endpoint")
	bpfDir := fs.String("bpf-dir", "/sys/fs/bpf/naples", "bpffs `directory` the firewall pins its programs' maps and links in (bpffs is mounted on /sys/fs/bpf when missing); empty disables the firewall")
	var caps agent.FirewallCapacities
	fs.IntVar(&caps.Snapshot, "fw-snapshot-entries", 65536, "capacity of a firewall snapshot: endpoints, peer prefixes and policy entries together")
	fs.IntVar(&caps.Conntrack, "fw-conntrack-entries", 262144, "connections the firewall tracks at once; the least recently used is evicted when full")
	fs.IntVar(&caps.Rules, "fw-rule-counters", 65536, "policy rules whose hits the firewall counts")
	fs.IntVar(&caps.Endpoints, "fw-endpoint-counters", 16384, "local endpoints whose packets the firewall counts")
	fs.IntVar(&caps.Fragments, "fw-fragment-entries", 8192, "fragmented datagrams whose first fragment's verdict the firewall keeps at once for their later fragments; the least recently used is evicted when full")
	fs.IntVar(&caps.FlowRing, "fw-flow-ring-bytes", 1<<20, "`bytes` of the ring the firewall writes its flow records to (new connections, denied packets, ends), a power of 2 of at least the page size; records that find it full are counted lost; 0 writes none")
	fs.DurationVar(&caps.FlowActive, "fw-flow-active-timeout", time.Minute, "how long after its last flow record a connection that still sees packets gets an ACTIVE record with its packets and bytes both ways; whole milliseconds up to 24h, 0 for none")
	fwTraces := fs.Bool("fw-traces", true, "build the firewall's programs with the checks of Trace packets; false leaves them out (no packet pays for them) and fails Trace objects with TracesOff")
	fs.IntVar(&caps.FlowEndpointRate, "fw-flow-endpoint-rate", 5000, "flow `records` a second each local endpoint may have written on each CPU, with a burst of as many; past it they are counted suppressed (naples_agent_flow_records_suppressed_total), so one workload's flood of connections does not blind the others' records; 0 for no budget")
	maxTraces := fs.Int("max-traces", agent.DefaultMaxTraces, fmt.Sprintf("Trace objects the node runs at once, at most %d; one more is FAILED with LimitExceeded until one ends", agent.MaxTraces))
	flowSweep := fs.Duration("flow-sweep-interval", agent.DefaultFlowSweep, "how often the firewall's conntrack table is swept for connections that expired without a packet, to write their ENDED flow records (reason idle) and free their entries")
	flowStreams := fs.Int("local-api-flow-streams", agent.DefaultFlowStreams, "`streams` of flow records (naplesctl flows) the local API serves at once; one more is refused")
	flowLog := fs.Int("flows-ring", agent.DefaultFlowLogSize, "flow `records` the agent keeps for `naplesctl --agent SOCK flows`, the latest")
	flowTapSubs := fs.Int("flow-tap-subscriptions", agent.DefaultFlowTapSubscriptions, "`subscriptions` of nimbus's flow observers (naplesctl flows through nimbus) the agent serves at once; one more is refused and its observer told")
	flowTapBatch := fs.Int("flow-tap-batch", agent.DefaultFlowTapBatch, "flow `records` of one message the agent sends nimbus on its flow tap")
	var export agent.FlowExportConfig
	fs.StringVar(&export.Dir, "flow-export-dir", "", "`directory` FlowExportPolicy objects of format json write their files in (spec.file); empty refuses them a file")
	fs.IntVar(&export.MaxPolicies, "flow-export-max-policies", agent.DefaultFlowExportMaxPolicies, "FlowExportPolicy objects the node exports for at once; one more is FAILED with LimitExceeded")
	fs.IntVar(&export.MaxConnections, "flow-export-max-connections", agent.DefaultFlowExportMaxConnections, "connections one flow exporter tracks for their delta counts; one beyond is exported only when it ends")
	fs.IntVar(&export.MessageBytes, "flow-export-message-bytes", ipfix.DefaultMessageBytes, fmt.Sprintf("`bytes` of an IPFIX message at most, %d to %d", ipfix.MinMessageBytes, ipfix.MaxMessageBytes))
	gatewayBridges := fs.Int("gateway-bridges", 4096, "network bridges the gateway programs mark for (their map's size); a network beyond is FAILED with CapacityExceeded")
	gatewayCheck := fs.Duration("gateway-check-interval", 10*time.Second, "how often the gateway programs are checked to be still attached to the network bridges, and attached again where they are not (the kernel does not report a detach)")
	fwStats := fs.Duration("fw-stats-interval", 10*time.Second, "how often the status of policies and endpoints is refreshed with the firewall's counters")
	statusExceptionAfter := fs.Duration("status-exception-after", watermark.DefaultExceptionAfter, "how long an object may be short of PROGRAMMED, without failing, before its status goes to nimbus on its own instead of holding the node's status watermark back")
	statusMaxExceptions := fs.Int("status-max-exceptions", watermark.DefaultMaxExceptions, "objects whose status goes to nimbus on their own at once; past it they hold the node's status watermark back")
	interfaceStats := fs.Duration("interface-stats-interval", 10*time.Second, "how often the status of Interface objects is refreshed with their NIC's counters")
	level := slog.LevelInfo
	fs.Func("log-level", "log `level`: debug, info, warn or error (default info)", func(s string) error {
		if err := level.UnmarshalText([]byte(s)); err != nil {
			return fmt.Errorf("level %q: want debug, info, warn or error", s)
		}
		return nil
	})
	tlsCert := fs.String("tls-cert", "/etc/naples/pki/node.crt", "`file` of this node's certificate, which must name --node: nimbus refuses another node's (the agent warns, and keeps trying until a certificate copied in its place names it)")
	tlsKey := fs.String("tls-key", "/etc/naples/pki/node.key", "`file` of this node's private key")
	tlsCA := fs.String("tls-ca", "/etc/naples/pki/ca.crt", "`file` of the CA certificates that verify nimbus")
	tlsServerName := fs.String("tls-server-name", pki.DefaultServerName, "`name` nimbus's certificate is verified for")
	insecure := fs.Bool("insecure", false, "dial nimbus in plaintext, without TLS")
	tlsExpiryWarning := fs.Duration("tls-expiry-warning", pki.DefaultExpiryWarning, "warn on /readyz of a certificate (--tls-cert, --tls-ca) that expires within `duration`")
	gcPercent := fs.Int("gc-percent", defaultGCPercent, "the garbage collector's target: a collection starts once the heap has grown by this `percent` of the live data, as GOGC (which is used when set and this flag is not given); lower holds less memory for more CPU, negative turns collection off")
	burstGCPercent := fs.Int("gc-percent-burst", defaultBurstGCPercent, "the garbage collector's target while the agent works through a burst of changes (a bulk apply or delete, the restore at start), in `percent`; the heap may grow further until the burst ends, when --gc-percent comes back and the agent releases what the burst left; 0, or a value not above --gc-percent, keeps --gc-percent")
	showVersion := fs.Bool("version", false, "print the version and exit")
	if err := fs.Parse(args, os.Getenv); err != nil {
		return err
	}
	if *showVersion {
		fmt.Fprintln(os.Stdout, version.String("naples-agent"))
		return nil
	}
	for name, d := range map[string]time.Duration{"interface-stats-interval": *interfaceStats, "fw-stats-interval": *fwStats, "gateway-check-interval": *gatewayCheck, "flow-sweep-interval": *flowSweep,
		"status-exception-after": *statusExceptionAfter} {
		if d <= 0 {
			return fs.Fail(fmt.Sprintf("invalid value %q for flag --%s: must be positive", d.String(), name))
		}
	}
	caps.NoTraces = !*fwTraces
	for name, n := range map[string]int{"fw-snapshot-entries": caps.Snapshot, "fw-conntrack-entries": caps.Conntrack,
		"fw-rule-counters": caps.Rules, "fw-endpoint-counters": caps.Endpoints, "fw-fragment-entries": caps.Fragments,
		"local-api-page-bytes": *pageBytes, "gateway-bridges": *gatewayBridges, "status-max-exceptions": *statusMaxExceptions,
		"flows-ring": *flowLog, "local-api-flow-streams": *flowStreams, "flow-tap-subscriptions": *flowTapSubs, "flow-tap-batch": *flowTapBatch,
		"flow-export-max-policies": export.MaxPolicies, "flow-export-max-connections": export.MaxConnections} {
		if n <= 0 {
			return fs.Fail(fmt.Sprintf("invalid value %d for flag --%s: must be positive", n, name))
		}
	}
	if n := export.MessageBytes; n < ipfix.MinMessageBytes || n > ipfix.MaxMessageBytes {
		return fs.Fail(fmt.Sprintf("invalid value %d for flag --flow-export-message-bytes: want %d to %d", n, ipfix.MinMessageBytes, ipfix.MaxMessageBytes))
	}
	if n := caps.FlowRing; n != 0 && (n < os.Getpagesize() || n > 1<<30 || n&(n-1) != 0) {
		return fs.Fail(fmt.Sprintf("invalid value %d for flag --fw-flow-ring-bytes: want 0 or a power of 2 from %d (the page size) to 1073741824", n, os.Getpagesize()))
	}
	if n := caps.FlowEndpointRate; n < 0 || n > 1e9 {
		return fs.Fail(fmt.Sprintf("invalid value %d for flag --fw-flow-endpoint-rate: want 0 (no budget) to 1000000000", n))
	}
	if n := *maxTraces; n < 1 || n > agent.MaxTraces {
		return fs.Fail(fmt.Sprintf("invalid value %d for flag --max-traces: want 1 to %d (the firewall's fw_traces)", n, agent.MaxTraces))
	}
	if d := caps.FlowActive; d < 0 || d > 24*time.Hour || d%time.Millisecond != 0 {
		return fs.Fail(fmt.Sprintf("invalid value %q for flag --fw-flow-active-timeout: want whole milliseconds from 0 (none) to 24h", d.String()))
	}
	if err := nimbusv1.ValidateNodeName(*node); err != nil {
		return fs.Fail(fmt.Sprintf("invalid value %q for flag --node: %v", *node, err))
	}
	if *stateDir == "" {
		return fs.Fail("invalid value \"\" for flag --state-dir: the agent needs a directory for its state")
	}
	if _, err := address.ParseList(*nimbus); err != nil {
		return fs.Fail(fmt.Sprintf("invalid value %q for flag --nimbus: %v", *nimbus, err))
	}
	if *pprof && metrics == "" {
		return fs.Fail("--pprof serves on the --metrics endpoint: give --metrics too")
	}
	if *tlsExpiryWarning <= 0 {
		return fs.Fail(fmt.Sprintf("invalid value %v for flag --tls-expiry-warning: must be positive", *tlsExpiryWarning))
	}

	if *burstGCPercent < 0 {
		return fs.Fail(fmt.Sprintf("invalid value %d for flag --gc-percent-burst: must be 0 or more", *burstGCPercent))
	}
	gcPercentSet := fs.Changed("gc-percent") // by the command line or $NAPLES_AGENT_GC_PERCENT
	if _, env := os.LookupEnv("GOGC"); gcPercentSet || !env {
		debug.SetGCPercent(*gcPercent)
	}

	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	var tlsConfig *tls.Config
	var certs *pki.Expiry
	if !*insecure {
		var err error
		keyPair, err := pki.LoadKeyPairFile(*tlsCert, *tlsKey)
		if err == nil {
			tlsConfig, err = pki.ClientConfigOf(keyPair, *tlsCA, *tlsServerName)
		}
		if err == nil {
			certs, err = pki.ReadExpiry(pki.CertFile{Use: pki.UseClient, Path: *tlsCert}, pki.CertFile{Use: pki.UseCA, Path: *tlsCA})
		}
		if err != nil {
			return exitstatus.Mark(fmt.Errorf("loading TLS credentials (--insecure dials plaintext): %w", err))
		}
		checkIdentity := func(leaf *x509.Certificate) {
			id, err := pki.IdentityOf(leaf)
			switch {
			case err != nil:
				log.Warn("the certificate names no node; nimbus will refuse its watch and status",
					"certificate", *tlsCert, "node", *node, "error", err)
			case id != (pki.Identity{Role: pki.RoleNode, Name: *node}):
				log.Warn("the certificate does not name this node; nimbus will refuse its watch and status",
					"certificate", *tlsCert, "identity", id.String(), "node", *node)
			}
		}
		checkIdentity(keyPair.Leaf())
		keyPair.OnReload(func(leaf *x509.Certificate, err error) {
			if err != nil {
				log.Warn("the certificate files changed but do not load; the certificate loaded before stays in use", "certificate", *tlsCert, "key", *tlsKey, "error", err)
				return
			}
			log.Info("certificate loaded again", "certificate", *tlsCert, "serial", leaf.SerialNumber.String(), "not_after", leaf.NotAfter)
			checkIdentity(leaf)
			certs.Renewed(*tlsCert, leaf.NotAfter)
		})
		go keyPair.Watch(ctx)
	}
	return agent.Run(ctx, agent.Config{Node: *node, Nimbus: *nimbus, TLS: tlsConfig, Certificates: certs, CertificateWarning: *tlsExpiryWarning, StateDir: *stateDir, DiscardState: *discardState, Logger: log, Socket: *socket, LocalAPIPageBytes: *pageBytes, LocalAPIFlowStreams: *flowStreams, Metrics: metrics, Pprof: *pprof, BurstGCPercent: *burstGCPercent,
		InterfaceStats: *interfaceStats, BPFDir: *bpfDir, FirewallCapacities: caps, FlowLogSize: *flowLog, FlowSweep: *flowSweep, MaxTraces: *maxTraces, FirewallStats: *fwStats,
		FlowTapSubscriptions: *flowTapSubs, FlowTapBatch: *flowTapBatch, FlowExport: export,
		GatewayBridges: *gatewayBridges, GatewayCheck: *gatewayCheck,
		StatusExceptionAfter: *statusExceptionAfter, StatusMaxExceptions: *statusMaxExceptions})
}
