// Package connfail says why a client's connection to nimbus fails. The clients' streams
// wait for the connection to be ready (grpc.WaitForReady), so they never see its error
// themselves: without this, an agent with --insecure against a nimbus that serves TLS, or
// a `naplesctl wait` whose certificate nimbus does not trust, would wait in silence.
package connfail

import (
	"context"
	"log/slog"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/naplesnet/naples/internal/pki"
)

// Interval is how often at most the same connection failure is logged again.
const Interval = time.Minute

// Log logs a warning saying why the connection fails, each time it falls into transient
// failure, and for a failed TLS handshake or a plaintext one to a TLS nimbus which flag
// mends it (pki.DialHint); tls tells whether the client dials with TLS. The same failure
// is logged again at most once an Interval. It returns when ctx ends.
func Log(ctx context.Context, conn *grpc.ClientConn, log *slog.Logger, tls bool) {
	health := healthpb.NewHealthClient(conn)
	var last string
	var lastAt time.Time
	for {
		state := conn.GetState()
		if state == connectivity.TransientFailure {
			// A call that does not wait for the connection fails at once with its error.
			callCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
			_, err := health.Check(callCtx, &healthpb.HealthCheckRequest{})
			cancel()
			if st := status.Convert(err); err != nil && st.Code() == codes.Unavailable &&
				(st.Message() != last || time.Since(lastAt) >= Interval) {
				last, lastAt = st.Message(), time.Now()
				attrs := []any{"err", st.Message()}
				if hint := pki.DialHint(err, tls); hint != "" {
					attrs = append(attrs, "hint", hint)
				}
				log.Warn("cannot connect to nimbus", attrs...)
			}
		}
		if !conn.WaitForStateChange(ctx, state) {
			return
		}
	}
}
