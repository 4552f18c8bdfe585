// Command naples-agent runs the naples agent of one host: it watches nimbus for the host's
// objects, keeps them in delphi and programs the kernel from there. It dials nimbus with
// mutual TLS, presenting the node certificate of --tls-cert (default
// /etc/naples/pki/node.crt), which must name --node; --insecure dials plaintext.
package main

import (
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/naplesnet/naples/agent"
	"github.com/naplesnet/naples/internal/pki"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "naples-agent:", err)
		os.Exit(1)
	}
}

func run() error {
	hostname, _ := os.Hostname()
	fs := flag.NewFlagSet("naples-agent", flag.ContinueOnError)
	node := fs.String("node", hostname, "this host's node `name` at nimbus")
	nimbus := fs.String("nimbus", "unix:///run/naples/nimbus.sock", "nimbus `address`: unix:///path or tcp://host:port")
	stateDir := fs.String("state-dir", "/var/lib/naples", "`directory` for the agent's state")
	discardState := fs.Bool("discard-state", false, "discard the stored desired state and resync from nimbus (recovers from a corrupt state file)")
	socket := fs.String("socket", "/run/naples/agent.sock", "unix socket `path` of the read-only local API; empty to not serve it")
	logLevel := fs.String("log-level", "info", "log `level`: debug, info, warn or error")
	tlsCert := fs.String("tls-cert", "/etc/naples/pki/node.crt", "`file` of this node's certificate, which must name --node")
	tlsKey := fs.String("tls-key", "/etc/naples/pki/node.key", "`file` of this node's private key")
	tlsCA := fs.String("tls-ca", "/etc/naples/pki/ca.crt", "`file` of the CA certificates that verify nimbus")
	tlsServerName := fs.String("tls-server-name", pki.DefaultServerName, "`name` nimbus's certificate is verified for")
	insecure := fs.Bool("insecure", false, "dial nimbus in plaintext, without TLS")
	if err := fs.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		fmt.Fprintf(os.Stderr, "naples-agent: --log-level %q: want debug, info, warn or error\n", *logLevel)
		os.Exit(2)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	var tlsConfig *tls.Config
	if !*insecure {
		var err error
		tlsConfig, err = pki.ClientConfig(*tlsCert, *tlsKey, *tlsCA, *tlsServerName)
		if err != nil {
			return fmt.Errorf("loading TLS credentials (--insecure dials plaintext): %w", err)
		}
		if id, err := pki.IdentityOf(tlsConfig.Certificates[0].Leaf); err != nil || id != (pki.Identity{Role: pki.RoleNode, Name: *node}) {
			log.Warn("the certificate does not name this node; nimbus will refuse its watch and status",
				"certificate", *tlsCert, "identity", id.String(), "node", *node, "error", err)
		}
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	return agent.Run(ctx, agent.Config{Node: *node, Nimbus: *nimbus, TLS: tlsConfig, StateDir: *stateDir, DiscardState: *discardState, Logger: log, Socket: *socket})
}
