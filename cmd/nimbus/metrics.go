package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// metricsShutdownTimeout is how long stopping the metrics server waits for scrapes under way.
const metricsShutdownTimeout = 5 * time.Second

// metricsServer serves the Prometheus metrics of a gatherer on http://ADDR/metrics.
type metricsServer struct {
	addr string
	hs   *http.Server
	// done is closed when the HTTP server has stopped serving.
	done chan struct{}
}

// startMetrics listens on the TCP address and serves the gatherer's metrics on /metrics
// until close. A failure to serve later is logged; nimbus keeps running without metrics.
func startMetrics(ctx context.Context, addr string, g prometheus.Gatherer, log *slog.Logger) (*metricsServer, error) {
	var lc net.ListenConfig
	l, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listening for metrics on %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
	m := &metricsServer{
		addr: l.Addr().String(),
		hs:   &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second},
		done: make(chan struct{}),
	}
	go func() {
		defer close(m.done)
		if err := m.hs.Serve(l); !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics server stopped; nimbus goes on without it", "address", m.addr, "error", err)
		}
	}()
	return m, nil
}

// close stops the server, letting scrapes under way finish for up to 5s.
func (m *metricsServer) close() error {
	ctx, cancel := context.WithTimeout(context.Background(), metricsShutdownTimeout)
	defer cancel()
	err := m.hs.Shutdown(ctx)
	if err != nil {
		m.hs.Close()
	}
	<-m.done
	if err != nil {
		return fmt.Errorf("stopping metrics server on %s: %w", m.addr, err)
	}
	return nil
}
