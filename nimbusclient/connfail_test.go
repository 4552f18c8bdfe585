package nimbusclient

import (
	"crypto/tls"
	"crypto/x509"
	"strings"
	"testing"

	"github.com/naplesnet/naples/delphi"
	"github.com/naplesnet/naples/internal/pki"
	"github.com/naplesnet/naples/internal/testlog"
)

// TestConnectFailureNamesTheFlag is issue 19's "refused handshakes" for the agent: its
// streams wait for a connection that a TLS handshake with a plaintext nimbus never makes,
// and the log says so and which flag mends it.
func TestConnectFailureNamesTheFlag(t *testing.T) {
	b := newBus(t) // plaintext
	ca, err := pki.NewCA(pki.CAOptions{})
	if err != nil {
		t.Fatal(err)
	}
	kp, err := ca.IssueNode("a", pki.CertOptions{})
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	store, err := delphi.Open(delphi.Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	var logs testlog.Buffer
	c, err := New(Options{
		Node: "a", Address: "unix://" + b.path, Store: store, Logger: logs.Logger(),
		TLS: &tls.Config{
			MinVersion: tls.VersionTLS13, RootCAs: roots, ServerName: pki.DefaultServerName,
			Certificates: []tls.Certificate{{Certificate: [][]byte{kp.Cert.Raw}, PrivateKey: kp.Key, Leaf: kp.Cert}},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	runClient(t, c)
	waitFor(t, "the agent to log why it cannot connect", func() bool {
		return strings.Contains(logs.String(), "cannot connect to nimbus") && strings.Contains(logs.String(), "give --insecure here too")
	})
}
