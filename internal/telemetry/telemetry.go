// Package telemetry serves what operators and probes read of a running process over HTTP:
// Prometheus metrics on /metrics, liveness on /healthz and readiness on /readyz, and when
// asked the Go runtime's profiles on /debug/pprof/.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// shutdownTimeout is how long Close waits for requests under way.
const shutdownTimeout = 5 * time.Second

// Options configures a Server.
type Options struct {
	// Gatherer supplies the metrics served on /metrics. Required.
	Gatherer prometheus.Gatherer
	// Healthy returns nil while the process's loops run; /healthz answers 200 then, and
	// 503 with the error otherwise. Default: always healthy.
	Healthy func() error
	// Ready returns the reasons the process is not ready yet, none when it is; /readyz
	// answers 200 when there are none and 503 listing them, one a line, otherwise.
	// Default: always ready.
	Ready func() []string
	// Warnings returns what an operator should act on soon though the process is ready,
	// such as a certificate about to expire: /readyz lists them, one a line, after its
	// answer, with the status code Ready decides. Default: none.
	Warnings func() []string
	// Logger receives the server's logs. Default: slog.Default().
	Logger *slog.Logger
	// Pprof serves the Go runtime's profiles under /debug/pprof/, as net/http/pprof does:
	// /debug/pprof/heap?gc=1&debug=1, for one, shows the live heap after a collection.
	// Default: false, for a profile costs the process CPU and shows its internals.
	Pprof bool
}

// Server is a running telemetry endpoint.
type Server struct {
	addr string
	hs   *http.Server
	// done is closed when the HTTP server has stopped serving.
	done chan struct{}
}

// Serve listens on the TCP address host:port and serves until Close. A failure to serve
// later is logged: the process goes on without its telemetry.
func Serve(ctx context.Context, addr string, opts Options) (*Server, error) {
	if opts.Gatherer == nil {
		return nil, errors.New("telemetry: Options.Gatherer is required")
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	var lc net.ListenConfig
	l, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listening for telemetry on %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(opts.Gatherer, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		if opts.Healthy != nil {
			if err := opts.Healthy(); err != nil {
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
				return
			}
		}
		fmt.Fprintln(w, "ok")
	})
	if opts.Pprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		var warnings []string
		if opts.Warnings != nil {
			warnings = opts.Warnings()
		}
		if opts.Ready != nil {
			if reasons := opts.Ready(); len(reasons) > 0 {
				http.Error(w, strings.Join(append(reasons, warnings...), "\n"), http.StatusServiceUnavailable)
				return
			}
		}
		fmt.Fprintln(w, "ready")
		for _, line := range warnings {
			fmt.Fprintln(w, line)
		}
	})
	s := &Server{
		addr: l.Addr().String(),
		hs:   &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second},
		done: make(chan struct{}),
	}
	go func() {
		defer close(s.done)
		if err := s.hs.Serve(l); !errors.Is(err, http.ErrServerClosed) {
			opts.Logger.Error("telemetry server stopped; going on without it", "address", s.addr, "error", err)
		}
	}()
	return s, nil
}

// Addr returns the address the server listens on, with the port it got for port 0.
func (s *Server) Addr() string { return s.addr }

// Close stops the server, letting requests under way finish for up to 5s.
func (s *Server) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	err := s.hs.Shutdown(ctx)
	if err != nil {
		s.hs.Close()
	}
	<-s.done
	if err != nil {
		return fmt.Errorf("stopping telemetry server on %s: %w", s.addr, err)
	}
	return nil
}
