package nimbus

import (
	"crypto/tls"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"

	"github.com/naplesnet/naples/internal/pki"
	"github.com/naplesnet/naples/internal/testlog"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// TestRefusedHandshakesLogged is issue 19's "refused handshakes": nimbus logs a TLS
// handshake it refuses with the peer and the reason, once per reason and interval, and
// counts every one.
func TestRefusedHandshakesLogged(t *testing.T) {
	var logs testlog.Buffer
	p := newTestPKI(t)
	ts := start(t, Options{TLS: p.serverTLS(t), Logger: logs.Logger()})
	other := newTestPKI(t)
	stranger, err := other.ca.IssuePublisher("admin", pki.CertOptions{})
	if err != nil {
		t.Fatal(err)
	}
	admin, err := p.ca.IssuePublisher("admin", pki.CertOptions{})
	if err != nil {
		t.Fatal(err)
	}
	strangerTLS := p.clientTLS(stranger) // trusts nimbus; nimbus does not trust it
	expired, err := p.ca.IssuePublisher("admin", pki.CertOptions{Validity: time.Hour, Now: func() time.Time { return time.Now().Add(-2 * time.Hour) }})
	if err != nil {
		t.Fatal(err)
	}
	server, err := p.ca.IssueServer(nil, pki.CertOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		creds  grpc.DialOption
		reason string
		log    string
	}{
		{"plaintext", nil, handshakePlaintext, "the client speaks plaintext"},
		{"plaintext again", nil, handshakePlaintext, ""},
		{"no certificate", grpc.WithTransportCredentials(credentials.NewTLS(p.clientTLS(pki.KeyPair{}))), handshakeNoCertificate, "the client sent no certificate"},
		{"unknown CA", grpc.WithTransportCredentials(credentials.NewTLS(strangerTLS)), handshakeUnknownCA, "not issued by a CA of --tls-ca"},
		{"expired certificate", grpc.WithTransportCredentials(credentials.NewTLS(p.clientTLS(expired))), handshakeOther, "the client's certificate has expired"},
		{"server certificate as a client's", grpc.WithTransportCredentials(credentials.NewTLS(p.clientTLS(server))), handshakeOther, "not one for a client"},
		{"nimbus not trusted", grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
			MinVersion: tls.VersionTLS13, RootCAs: other.roots, ServerName: pki.DefaultServerName,
			Certificates: []tls.Certificate{tlsCertificate(admin)},
		})), handshakeClientRefused, "the client refused nimbus's certificate"},
	} {
		var opts []grpc.DialOption
		if tc.creds != nil {
			opts = append(opts, tc.creds)
		}
		_, err := dial(t, ts.path, opts...).List(testContext(t), &nimbusv1.ListRequest{})
		wantCode(t, err, codes.Unavailable)
		metric := `naples_nimbus_tls_handshakes_refused_total{reason="` + tc.reason + `"}`
		waitMetricUntil(t, ts, metric, "at least 1", func(v float64) bool { return v >= 1 })
		if tc.log == "" {
			continue
		}
		ctx := testContext(t)
		for !strings.Contains(logs.String(), tc.log) {
			select {
			case <-ctx.Done():
				t.Fatalf("%s: no log line saying %q:\n%s", tc.name, tc.log, logs.String())
			case <-time.After(time.Millisecond):
			}
		}
	}
	if n := strings.Count(logs.String(), "the client speaks plaintext"); n != 1 {
		t.Errorf("two plaintext clients within a minute logged %d lines, want 1:\n%s", n, logs.String())
	}
	if !strings.Contains(logs.String(), `msg="refused a TLS handshake" peer=`) {
		t.Errorf("refusal lines do not name the peer:\n%s", logs.String())
	}
}
