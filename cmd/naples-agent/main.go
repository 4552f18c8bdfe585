// Command naples-agent runs the naples agent of one host: it watches nimbus for the host's
// objects, keeps them in delphi and programs the kernel from there.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/naplesnet/naples/agent"
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
	logLevel := fs.String("log-level", "info", "log `level`: debug, info, warn or error")
	if err := fs.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		fmt.Fprintf(os.Stderr, "naples-agent: --log-level %q: want debug, info, warn or error\n", *logLevel)
		os.Exit(2)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	return agent.Run(ctx, agent.Config{Node: *node, Nimbus: *nimbus, StateDir: *stateDir, Logger: log})
}
