package controller

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/naplesnet/naples/internal/pki"
	"github.com/naplesnet/naples/internal/testlog"
	"github.com/naplesnet/naples/nimbus"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// testCA issues the certificates of a test's TLS nimbus and its clients.
type testCA struct {
	ca    *pki.CA
	roots *x509.CertPool
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	ca, err := pki.NewCA(pki.CAOptions{})
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	return &testCA{ca: ca, roots: roots}
}

// certificate returns the key pair as a tls.Certificate, failing the test on err.
func certificate(t *testing.T, kp pki.KeyPair, err error) tls.Certificate {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{kp.Cert.Raw}, PrivateKey: kp.Key, Leaf: kp.Cert}
}

// server returns the TLS configuration of a nimbus that requires certificates of the CA.
func (c *testCA) server(t *testing.T) *tls.Config {
	t.Helper()
	kp, err := c.ca.IssueServer(nil, pki.CertOptions{})
	return &tls.Config{
		MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{certificate(t, kp, err)},
		ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: c.roots,
	}
}

// client returns the TLS configuration of a client presenting the certificate.
func (c *testCA) client(cert tls.Certificate) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13, RootCAs: c.roots, ServerName: pki.DefaultServerName,
		Certificates: []tls.Certificate{cert},
	}
}

// publisher returns the TLS configuration of a publisher client.
func (c *testCA) publisher(t *testing.T) *tls.Config {
	t.Helper()
	kp, err := c.ca.IssuePublisher("admin", pki.CertOptions{})
	return c.client(certificate(t, kp, err))
}

// node returns the TLS configuration of the named node's client.
func (c *testCA) node(t *testing.T, name string) *tls.Config {
	t.Helper()
	kp, err := c.ca.IssueNode(name, pki.CertOptions{})
	return c.client(certificate(t, kp, err))
}

// dialTLS returns a nimbus client of the socket with the TLS configuration.
func dialTLS(t *testing.T, socket string, cfg *tls.Config) nimbusv1.NimbusClient {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return nimbusv1.NewNimbusClient(conn)
}

// TestWaitNotHeldByAPublisherWatch is issue 19's "watching makes a target": a publisher
// watching a phantom node to see what it would receive must not make Wait wait for it.
func TestWaitNotHeldByAPublisherWatch(t *testing.T) {
	socket := socketPath(t)
	ca := newTestCA(t)
	serveWith(t, socket, nimbus.Options{TLS: ca.server(t)})
	publisher := ca.publisher(t)
	c := newClient(t, socket, Options{TLS: publisher})
	if _, err := c.Apply(testContext(t), route("r1", "192.0.2.1")); err != nil {
		t.Fatal(err)
	}

	node := dialTLS(t, socket, ca.node(t, "host-a"))
	look := dialTLS(t, socket, publisher)
	for _, w := range []struct {
		api  nimbusv1.NimbusClient
		node string
	}{{node, "host-a"}, {look, "phantom-1"}} {
		stream, err := w.api.Watch(testContext(t), &nimbusv1.WatchRequest{Node: w.node})
		if err != nil {
			t.Fatal(err)
		}
		for synced := false; !synced; {
			frame, err := stream.Recv()
			if err != nil {
				t.Fatalf("watching %s: %v", w.node, err)
			}
			for _, ev := range frame.GetEvents() {
				synced = synced || ev.GetType() == nimbusv1.WatchEvent_TYPE_SYNCED
			}
		}
	}
	report(t, node, "r1", "host-a", 1, nimbusv1.Phase_PHASE_PROGRAMMED, "", "")

	w := startWait(t, c, Target{Key: routeKey("r1")})
	w.wantProgress(t, "r1@1: 1/1")
	if err := w.result(t); err != nil {
		t.Fatalf("Wait: %v", err)
	}
}

// TestWaitSaysWhyItCannotConnect: a status watch waits for the connection, so a Wait
// whose certificate nimbus does not trust would otherwise time out without a word. The
// client logs a warning naming the failure and the flag that mends it, and the Wait
// still ends with its context.
func TestWaitSaysWhyItCannotConnect(t *testing.T) {
	socket := socketPath(t)
	ca, other := newTestCA(t), newTestCA(t)
	serveWith(t, socket, nimbus.Options{TLS: ca.server(t)})
	kp, err := other.ca.IssuePublisher("admin", pki.CertOptions{})
	var logs testlog.Buffer
	c := newClient(t, socket, Options{TLS: ca.client(certificate(t, kp, err)), Logger: logs.Logger()})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- c.Wait(ctx, []Target{{Key: routeKey("r1")}}, WaitOptions{}) }()
	for !strings.Contains(logs.String(), "cannot connect to nimbus") {
		select {
		case err := <-done:
			t.Fatalf("Wait returned %v before the client said why it cannot connect; log:\n%s", err, logs.String())
		case <-time.After(10 * time.Millisecond):
		}
	}
	if want := "issued by a CA of nimbus's --tls-ca"; !strings.Contains(logs.String(), want) {
		t.Errorf("log %q does not give the hint %q", logs.String(), want)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("Wait = %v, want the context's cancellation", err)
	}
}
