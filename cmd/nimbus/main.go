// Command nimbus runs the naples desired-state bus: it serves the nimbus.v1.Nimbus API on
// the addresses given with --listen until SIGINT or SIGTERM, then drains and exits 0.
//
// Usage:
//
//	nimbus [--listen ADDR]... [--log-level debug|info|warn|error]
//
// ADDR is unix:///path/to/socket or tcp://host:port; the default is
// unix:///run/naples/nimbus.sock. Bad flags exit with status 2, other errors with 1.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/naplesnet/naples/internal/address"
	"github.com/naplesnet/naples/nimbus"
)

// defaultListen is where nimbus listens when no --listen is given.
const defaultListen = "unix:///run/naples/nimbus.sock"

// errUsage marks errors in the command line, which exit with status 2.
var errUsage = errors.New("usage")

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stderr)
	stop()
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
	case errors.Is(err, errUsage):
		os.Exit(2)
	default:
		fmt.Fprintf(os.Stderr, "nimbus: %v\n", err)
		os.Exit(1)
	}
}

// config is what the command line says.
type config struct {
	listen   []address.Address
	logLevel slog.Level
}

// parseFlags parses the command line. The flag package reports a bad flag on stderr
// itself, so the error it returns only marks the failure.
func parseFlags(args []string, stderr io.Writer) (config, error) {
	cfg := config{logLevel: slog.LevelInfo}
	fs := flag.NewFlagSet("nimbus", flag.ContinueOnError)
	fs.SetOutput(stderr)
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
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return cfg, err
		}
		return cfg, fmt.Errorf("parsing flags: %w: %w", errUsage, err)
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "unexpected arguments: %q\n", fs.Args())
		fs.Usage()
		return cfg, fmt.Errorf("parsing flags: %w", errUsage)
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
	cfg, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: cfg.logLevel}))
	srv, err := nimbus.New(nimbus.Options{Logger: log})
	if err != nil {
		return err
	}
	defer srv.Close()

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
		// The listener's address, so that tcp://host:0 logs the port it got.
		addrs = append(addrs, address.Address{Network: a.Network, Addr: l.Addr().String()}.String())
	}
	log.Info("serving", "addresses", addrs, "epoch", srv.Epoch())
	if err := srv.Serve(ctx, listeners...); err != nil {
		return err
	}
	log.Info("stopped")
	return nil
}
