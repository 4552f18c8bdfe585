package nimbus

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"

	"github.com/naplesnet/naples/internal/pki"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// testPKI is a CA and the certificates of one test.
type testPKI struct {
	ca    *pki.CA
	roots *x509.CertPool
}

func newTestPKI(t *testing.T) *testPKI {
	t.Helper()
	ca, err := pki.NewCA(pki.CAOptions{})
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	return &testPKI{ca: ca, roots: roots}
}

func tlsCertificate(kp pki.KeyPair) tls.Certificate {
	return tls.Certificate{Certificate: [][]byte{kp.Cert.Raw}, PrivateKey: kp.Key, Leaf: kp.Cert}
}

// serverTLS returns the config of a nimbus requiring certificates of the CA.
func (p *testPKI) serverTLS(t *testing.T) *tls.Config {
	t.Helper()
	kp, err := p.ca.IssueServer(nil, pki.CertOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{tlsCertificate(kp)},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    p.roots,
	}
}

// clientTLS returns a client config presenting the key pair, or no certificate when kp
// is the zero KeyPair.
func (p *testPKI) clientTLS(kp pki.KeyPair) *tls.Config {
	cfg := &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: p.roots, ServerName: pki.DefaultServerName}
	if kp.Cert != nil {
		cfg.Certificates = []tls.Certificate{tlsCertificate(kp)}
	}
	return cfg
}

// node connects to the test server as the named node.
func (p *testPKI) node(t *testing.T, ts *testServer, name string) nimbusv1.NimbusClient {
	t.Helper()
	kp, err := p.ca.IssueNode(name, pki.CertOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return dial(t, ts.path, grpc.WithTransportCredentials(credentials.NewTLS(p.clientTLS(kp))))
}

// publisher connects to the test server as a publisher named admin.
func (p *testPKI) publisher(t *testing.T, ts *testServer) nimbusv1.NimbusClient {
	t.Helper()
	kp, err := p.ca.IssuePublisher("admin", pki.CertOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return dial(t, ts.path, grpc.WithTransportCredentials(credentials.NewTLS(p.clientTLS(kp))))
}

// startTLS serves a Server with TLS whose ts.client is a publisher.
func startTLS(t *testing.T) (*testServer, *testPKI) {
	t.Helper()
	p := newTestPKI(t)
	ts := start(t, Options{TLS: p.serverTLS(t)})
	ts.client = p.publisher(t, ts)
	return ts, p
}

// wantDenied fails the test unless err is PermissionDenied with a message containing
// every one of want.
func wantDenied(t *testing.T, err error, want ...string) {
	t.Helper()
	st := wantCode(t, err, codes.PermissionDenied)
	for _, w := range want {
		if !strings.Contains(st.Message(), w) {
			t.Errorf("refusal %q does not contain %q", st.Message(), w)
		}
	}
}

func TestNewRefusesTLSWithoutClientCertificates(t *testing.T) {
	if _, err := New(Options{TLS: &tls.Config{}}); !errors.Is(err, ErrInvalidOptions) {
		t.Fatalf("New with TLS not requiring client certificates: err = %v, want ErrInvalidOptions", err)
	}
}

func TestAuthWatchOnlyOwnNode(t *testing.T) {
	ts, p := startTLS(t)
	ts.apply(t, route("for-a", []string{"host-a"}, "192.0.2.1"))
	ts.apply(t, route("for-b", []string{"host-b"}, "192.0.2.1"))
	a := p.node(t, ts, "host-a")

	puts, _ := recvUntilSynced(t, watch(t, a, "host-a"))
	if len(puts) != 1 || puts[0].ObjectKey().GetName() != "for-a" {
		t.Errorf("host-a's own watch sent %d objects, want only for-a", len(puts))
	}

	w := watch(t, a, "host-b")
	ev, err := w.Recv()
	if err == nil {
		t.Fatalf("host-a watching host-b received %v, want PermissionDenied", ev)
	}
	wantDenied(t, err, `node "host-a"`, `node "host-b"`)

	// A publisher may watch any node.
	puts, _ = recvUntilSynced(t, watch(t, ts.client, "host-b"))
	if len(puts) != 1 || puts[0].ObjectKey().GetName() != "for-b" {
		t.Errorf("publisher watching host-b got %d objects, want only for-b", len(puts))
	}
}

func TestAuthStatusOnlyForOwnNode(t *testing.T) {
	ts, p := startTLS(t)
	key := routeKey("r1")
	ts.apply(t, route("r1", []string{"host-a", "host-b"}, "192.0.2.1"))
	a := p.node(t, ts, "host-a")

	stream, err := a.ReportStatus(testContext(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []*nimbusv1.StatusReport{
		statusReport(key, "host-a", 1, nimbusv1.Phase_PHASE_PROGRAMMED, ""),
		statusReport(key, "host-b", 1, nimbusv1.Phase_PHASE_FAILED, "forged"),
		statusReport(key, "host-a", 1, nimbusv1.Phase_PHASE_FAILED, "after the refusal"),
	} {
		// The stream may already be ended by the refusal; CloseAndRecv tells how.
		if err := stream.Send(r); err != nil {
			break
		}
	}
	_, err = stream.CloseAndRecv()
	wantDenied(t, err, `node "host-a"`, `node "host-b"`)

	// host-a's own report before the refusal is kept; the forged one and anything
	// after it are not.
	st := wantStatus(t, ts, key, 2, 1, 0, "host-a")
	if got := st.GetNodes()[0]; got.GetPhase() != nimbusv1.Phase_PHASE_PROGRAMMED {
		t.Errorf("host-a status = %v, want the PROGRAMMED report sent before the refusal", got)
	}

	// A watermark is checked as a status is: host-a may report its own, not host-b's.
	reportWith(t, a, ts.watermarkReport("host-a", 1))
	stream, err = a.ReportStatus(testContext(t))
	if err != nil {
		t.Fatal(err)
	}
	_ = stream.Send(ts.watermarkReport("host-b", 1))
	_, err = stream.CloseAndRecv()
	wantDenied(t, err, `node "host-a"`, `node "host-b"`)
	if ts.srv.store.read().watermark("host-b") != nil {
		t.Error("host-b's forged watermark was kept")
	}
	if ts.srv.store.read().watermark("host-a") == nil {
		t.Error("host-a's own watermark was not kept")
	}
}

func TestAuthStatusNeedsNodeCertificate(t *testing.T) {
	ts, _ := startTLS(t)
	key := routeKey("r1")
	ts.apply(t, route("r1", []string{"host-a"}, "192.0.2.1"))
	stream, err := ts.client.ReportStatus(testContext(t))
	if err != nil {
		t.Fatal(err)
	}
	_ = stream.Send(statusReport(key, "host-a", 1, nimbusv1.Phase_PHASE_PROGRAMMED, ""))
	_, err = stream.CloseAndRecv()
	wantDenied(t, err, `publisher "admin"`, "node certificate")
	wantStatus(t, ts, key, 1, 0, 0)
}

func TestAuthPublisherOperations(t *testing.T) {
	ts, p := startTLS(t)
	a := p.node(t, ts, "host-a")
	ctx := testContext(t)
	obj := route("r1", []string{"host-a"}, "192.0.2.1")

	for name, call := range map[string]func() error{
		"Apply": func() error { _, err := a.Apply(ctx, &nimbusv1.ApplyRequest{Object: obj}); return err },
		"Delete": func() error {
			_, err := a.Delete(ctx, &nimbusv1.DeleteRequest{Key: routeKey("r1")})
			return err
		},
		"Get":  func() error { _, err := a.Get(ctx, &nimbusv1.GetRequest{Key: routeKey("r1")}); return err },
		"List": func() error { _, err := a.List(ctx, &nimbusv1.ListRequest{}); return err },
		"ListNodeStatuses": func() error {
			_, err := a.ListNodeStatuses(ctx, &nimbusv1.ListNodeStatusesRequest{Key: routeKey("r1")})
			return err
		},
	} {
		t.Run("node "+name, func(t *testing.T) {
			wantDenied(t, call(), `node "host-a"`, name, "publisher certificate")
		})
	}
	resp, err := ts.client.List(ctx, &nimbusv1.ListRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(resp.GetItems()); n != 0 {
		t.Fatalf("after a node's Apply, nimbus holds %d objects, want none", n)
	}

	// The publisher applies, and the node receives what it applied.
	ts.apply(t, obj)
	puts, _ := recvUntilSynced(t, watch(t, a, "host-a"))
	if len(puts) != 1 {
		t.Errorf("host-a received %d objects after the publisher's Apply, want 1", len(puts))
	}
}

func TestAuthRefusesClientsWithoutCertificate(t *testing.T) {
	ts, p := startTLS(t)
	ctx := testContext(t)
	for name, creds := range map[string]grpc.DialOption{
		"no certificate": grpc.WithTransportCredentials(credentials.NewTLS(p.clientTLS(pki.KeyPair{}))),
		"another CA's certificate": func() grpc.DialOption {
			other := newTestPKI(t)
			kp, err := other.ca.IssuePublisher("admin", pki.CertOptions{})
			if err != nil {
				t.Fatal(err)
			}
			cfg := other.clientTLS(kp)
			cfg.RootCAs = p.roots
			return grpc.WithTransportCredentials(credentials.NewTLS(cfg))
		}(),
	} {
		t.Run(name, func(t *testing.T) {
			c := dial(t, ts.path, creds)
			_, err := c.Apply(ctx, &nimbusv1.ApplyRequest{Object: route("r1", nil, "192.0.2.1")})
			wantCode(t, err, codes.Unavailable)
		})
	}
	resp, err := ts.client.List(ctx, &nimbusv1.ListRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(resp.GetItems()); n != 0 {
		t.Fatalf("nimbus holds %d objects after refused clients, want none", n)
	}
}

func TestInsecureServerNeedsNoCertificates(t *testing.T) {
	ts := start(t, Options{})
	ts.apply(t, route("r1", []string{"host-a"}, "192.0.2.1"))
	puts, _ := recvUntilSynced(t, watch(t, ts.client, "host-b"))
	if len(puts) != 0 {
		t.Errorf("host-b received %d objects, want none", len(puts))
	}
	ts.report(t, statusReport(routeKey("r1"), "host-a", 1, nimbusv1.Phase_PHASE_PROGRAMMED, ""))
	wantStatus(t, ts, routeKey("r1"), 1, 1, 0, "host-a")
}
