package nimbus

import (
	"net"
	"strings"

	"google.golang.org/grpc/credentials"

	"github.com/naplesnet/naples/internal/pki"
)

// Refused handshakes
//
// With TLS, a client that speaks plaintext, sends no certificate or one no CA of
// Options.TLS.ClientCAs issued, or refuses nimbus's certificate, fails the TLS handshake
// before any call; gRPC would only close the connection. nimbus logs each refusal with
// the peer's address and the reason, at most once per peer host, reason and
// Limits.RefusalLogInterval (the next line counts the ones not logged), and counts it in
// naples_nimbus_tls_handshakes_refused_total{reason}.

// Values of the reason label of naples_nimbus_tls_handshakes_refused_total.
const (
	handshakePlaintext     = "plaintext"
	handshakeNoCertificate = "no_certificate"
	handshakeUnknownCA     = "unknown_ca"
	handshakeClientRefused = "client_refused"
	handshakeRevoked       = "revoked"
	handshakeOther         = "other"
)

// handshakeReasons are the values of the reason label, each present from the start.
var handshakeReasons = []string{handshakePlaintext, handshakeNoCertificate, handshakeUnknownCA, handshakeClientRefused, handshakeRevoked, handshakeOther}

// handshakeReason returns the reason label of a failed server handshake, and what it
// means for the log.
func handshakeReason(err error) (label, why string) {
	msg := err.Error()
	switch {
	case strings.Contains(msg, "first record does not look like a TLS handshake"):
		return handshakePlaintext, "the client speaks plaintext (its --insecure) to a nimbus that serves TLS"
	case strings.Contains(msg, "didn't provide a certificate"), strings.Contains(msg, "certificate required"):
		return handshakeNoCertificate, "the client sent no certificate (its --tls-cert and --tls-key)"
	case strings.Contains(msg, pki.ErrRevoked.Error()):
		return handshakeRevoked, "the client's certificate is in the revocation list (--tls-crl)"
	case strings.Contains(msg, "unknown authority"):
		return handshakeUnknownCA, "the client's certificate is not issued by a CA of --tls-ca"
	case strings.Contains(msg, "certificate has expired or is not yet valid"):
		return handshakeOther, "the client's certificate has expired or is not valid yet (naplesctl certs --renew)"
	case strings.Contains(msg, "incompatible key usage"):
		return handshakeOther, "the client's certificate is not one for a client (its extended key usage)"
	case strings.Contains(msg, "failed to verify certificate"):
		return handshakeOther, "the client's certificate does not verify against --tls-ca"
	case strings.Contains(msg, "remote error"):
		return handshakeClientRefused, "the client refused nimbus's certificate (its --tls-ca or --tls-server-name)"
	}
	return handshakeOther, "the TLS handshake failed"
}

// handshakeLogger is the server's transport credentials with refused handshakes logged.
type handshakeLogger struct {
	credentials.TransportCredentials
	s *Server
}

// ServerHandshake makes the server's side of the handshake, logging a refusal.
func (h handshakeLogger) ServerHandshake(conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	out, info, err := h.TransportCredentials.ServerHandshake(conn)
	if err != nil {
		h.s.handshakeRefused(conn.RemoteAddr(), err)
		return out, info, err
	}
	if h.s.opts.CRL != nil {
		out = h.s.tlsConns.track(out, info)
	}
	return out, info, err
}

// Clone returns a copy that logs alike.
func (h handshakeLogger) Clone() credentials.TransportCredentials {
	return handshakeLogger{TransportCredentials: h.TransportCredentials.Clone(), s: h.s}
}

// handshakeRefused counts and, unless one was logged for the peer's host and the reason
// within Limits.RefusalLogInterval, logs a refused TLS handshake. Reasons that share a
// label (those of "other") are logged each on its own.
func (s *Server) handshakeRefused(addr net.Addr, err error) {
	label, why := handshakeReason(err)
	s.metrics.handshakesRefused.WithLabelValues(label).Inc()
	peerAddr, host := "unknown", "unknown"
	if addr != nil {
		peerAddr, host = addr.String(), addr.String()
		if h, _, err := net.SplitHostPort(peerAddr); err == nil {
			host = h
		}
	}
	ok, held := s.refusals.allow("handshake/" + host + "/" + why)
	if !ok {
		return
	}
	s.log.Warn("refused a TLS handshake", "peer", peerAddr, "reason", why, "error", err, "refused_unlogged", held)
}
