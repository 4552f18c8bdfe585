package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/naplesnet/naples/internal/cmdline"
	"github.com/naplesnet/naples/nimbus"
	"github.com/naplesnet/naples/nimbus/console"
)

// uiConfig is what the command line says about the web console.
type uiConfig struct {
	// addr is the host:port to serve the console on; empty for none.
	addr string
	// opts are the console's limits.
	opts console.Options
}

// addUIFlags defines the flags of the web console on fs.
func addUIFlags(fs *cmdline.FlagSet, uc *uiConfig) {
	fs.Func("ui", "`host:port` to serve the read-only web console on, under /ui/: HTTPS requiring a client certificate of --tls-ca, of any role, or plain HTTP with --insecure (default: none; docs/ui.md)", func(s string) error {
		if _, _, err := net.SplitHostPort(s); err != nil {
			return fmt.Errorf("address %q: want host:port: %w", s, err)
		}
		uc.addr = s
		return nil
	})
	positive := func(name, usage string, v *int, def int) {
		*v = def
		fs.Func(name, fmt.Sprintf("%s (default %d)", usage, def), func(s string) error {
			var n int
			if _, err := fmt.Sscan(s, &n); err != nil || n <= 0 {
				return fmt.Errorf("%q: want a positive number", s)
			}
			*v = n
			return nil
		})
	}
	positive("ui-max-objects", "how many `objects` one page of the console's propagation matrix shows", &uc.opts.MaxObjects, console.DefaultMaxObjects)
	positive("ui-max-nodes", "how many `nodes` one page of the console's propagation matrix shows", &uc.opts.MaxNodes, console.DefaultMaxNodes)
	positive("ui-max-clients", "how many live `pages` (event streams) the console serves at once", &uc.opts.MaxClients, console.DefaultMaxClients)
	positive("ui-max-flows", "how many flow `records` the console's flows page keeps", &uc.opts.MaxFlows, console.DefaultMaxFlows)
	uc.opts.UpdateInterval = console.DefaultUpdateInterval
	fs.Func("ui-update-interval", fmt.Sprintf("least `duration` between two updates of one live console page (default %v)", console.DefaultUpdateInterval), func(s string) error {
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 {
			return fmt.Errorf("%q: want a positive duration such as 250ms", s)
		}
		uc.opts.UpdateInterval = d
		return nil
	})
}

// serveUI serves the web console of srv as uc says, with the TLS configuration of the
// gRPC API (nil with --insecure). It returns what stops it.
func serveUI(ctx context.Context, uc uiConfig, srv *nimbus.Server, tlsConfig *tls.Config, reg prometheus.Registerer, log *slog.Logger) (io.Closer, error) {
	opts := uc.opts
	opts.Logger, opts.Registerer = log, reg
	c, err := console.New(srv, opts)
	if err != nil {
		return nil, err
	}
	s, err := console.Serve(ctx, uc.addr, tlsConfig, c, log)
	if err != nil {
		c.Close()
		return nil, err
	}
	scheme := "https"
	if tlsConfig == nil {
		scheme = "http"
	}
	log.Info("serving the web console", "url", scheme+"://"+s.Addr()+"/ui/", "client_certificates", tlsConfig != nil)
	return closers{s, c}, nil
}

// closers closes each of its closers in turn.
type closers []io.Closer

// Close closes every closer, returning the first error.
func (cs closers) Close() error {
	var first error
	for _, c := range cs {
		if err := c.Close(); err != nil && first == nil {
			first = err
		}
	}
	return first
}
