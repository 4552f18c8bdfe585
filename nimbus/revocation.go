package nimbus

import (
	"context"
	"crypto/x509"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc/credentials"

	"github.com/naplesnet/naples/internal/pki"
)

// Revocation
//
// With Options.CRL, a client certificate that the revocation list revokes is refused at
// the TLS handshake (reason "revoked" of naples_nimbus_tls_handshakes_refused_total).
// Serve checks the list's file every Options.CRLInterval and reads it again when its
// modification time or size changed; then it closes every open connection whose client
// certificate the new list revokes, ending the watch, status and other streams on it at
// once (naples_nimbus_tls_revoked_connections_closed_total counts them). A file that
// cannot be read or does not verify leaves the list read before in force, and is logged.

// DefaultCRLInterval is the default of Options.CRLInterval.
const DefaultCRLInterval = 5 * time.Second

// tlsConns holds the connections that finished a TLS handshake and their client
// certificates, so that a revocation can close them.
type tlsConns struct {
	// mu guards conns.
	mu    sync.Mutex
	conns map[*trackedConn]struct{}
}

// trackedConn is a connection in tlsConns; closing it takes it out.
type trackedConn struct {
	net.Conn
	cert  *x509.Certificate
	owner *tlsConns
}

// Close closes the connection and forgets it.
func (c *trackedConn) Close() error {
	c.owner.mu.Lock()
	delete(c.owner.conns, c)
	c.owner.mu.Unlock()
	return c.Conn.Close()
}

// track returns conn, whose handshake gave info, as a connection that tlsConns holds
// until it is closed. A connection without a verified client certificate is not held.
func (t *tlsConns) track(conn net.Conn, info credentials.AuthInfo) net.Conn {
	ti, ok := info.(credentials.TLSInfo)
	if !ok || len(ti.State.VerifiedChains) == 0 || len(ti.State.VerifiedChains[0]) == 0 {
		return conn
	}
	c := &trackedConn{Conn: conn, cert: ti.State.VerifiedChains[0][0], owner: t}
	t.mu.Lock()
	if t.conns == nil {
		t.conns = map[*trackedConn]struct{}{}
	}
	t.conns[c] = struct{}{}
	t.mu.Unlock()
	return c
}

// revoked returns the connections whose certificate check refuses.
func (t *tlsConns) revoked(check func(*x509.Certificate) error) []*trackedConn {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []*trackedConn
	for c := range t.conns {
		if check(c.cert) != nil {
			out = append(out, c)
		}
	}
	return out
}

// watchCRL reads Options.CRL again every Options.CRLInterval until ctx ends, closing the
// connections of the certificates a changed list revokes.
func (s *Server) watchCRL(ctx context.Context) {
	crl := s.opts.CRL
	t := time.NewTicker(s.opts.CRLInterval)
	defer t.Stop()
	lastErr := ""
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		changed, err := crl.Reload()
		if err != nil {
			if err.Error() != lastErr {
				s.log.Warn("cannot read the revocation list again; the one read before stays in force", "file", crl.Path(), "error", err)
				lastErr = err.Error()
			}
			continue
		}
		lastErr = ""
		if !changed {
			continue
		}
		s.log.Info("read the revocation list again", "file", crl.Path())
		s.closeRevoked()
	}
}

// closeRevoked closes the open connections whose client certificate Options.CRL revokes.
func (s *Server) closeRevoked() {
	for _, c := range s.tlsConns.revoked(s.opts.CRL.Check) {
		id, _ := pki.IdentityOf(c.cert)
		s.log.Info("closing the connection of a revoked certificate", "identity", id.String(), "serial", c.cert.SerialNumber.String(), "peer", c.RemoteAddr().String())
		s.metrics.revokedClosed.Inc()
		c.Close()
	}
}
