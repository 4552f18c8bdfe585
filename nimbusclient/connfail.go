package nimbusclient

import (
	"context"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/naplesnet/naples/internal/pki"
)

// connectFailureLogInterval is how often at most the same connection failure is logged
// again.
const connectFailureLogInterval = time.Minute

// logConnectFailures logs why the connection to nimbus fails, each time it falls into
// transient failure, and for a failed TLS handshake or a plaintext one to a TLS nimbus
// which flag mends it (pki.DialHint). The streams wait for the connection to be ready
// (grpc.WaitForReady), so they never see its error themselves: without this, an agent
// with --insecure against a nimbus that serves TLS would wait in silence. The same
// failure is logged again at most once a minute. It returns when ctx ends.
func (c *Client) logConnectFailures(ctx context.Context, conn *grpc.ClientConn) {
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
				(st.Message() != last || time.Since(lastAt) >= connectFailureLogInterval) {
				last, lastAt = st.Message(), time.Now()
				attrs := []any{"server", c.opts.Address, "err", st.Message()}
				if hint := pki.DialHint(err, c.opts.TLS != nil); hint != "" {
					attrs = append(attrs, "hint", hint)
				}
				c.log.Warn("cannot connect to nimbus", attrs...)
			}
		}
		if !conn.WaitForStateChange(ctx, state) {
			return
		}
	}
}
