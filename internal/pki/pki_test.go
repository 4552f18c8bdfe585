package pki

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// newCA makes a CA for the test, failing it on error.
func newCA(t *testing.T) *CA {
	t.Helper()
	ca, err := NewCA(CAOptions{})
	if err != nil {
		t.Fatalf("NewCA: %v", err)
	}
	return ca
}

// must returns a function that fails the test on a call's error and returns its value:
// must[KeyPair](t)(ca.IssueNode("host-a", CertOptions{})).
func must[T any](t *testing.T) func(T, error) T {
	return func(v T, err error) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

// verify checks cert against the CA for the key usage and returns the error.
func verify(ca *CA, cert *x509.Certificate, usage x509.ExtKeyUsage, dnsName string) error {
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	_, err := cert.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{usage}, DNSName: dnsName})
	return err
}

func TestNewCA(t *testing.T) {
	now := time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)
	ca, err := NewCA(CAOptions{Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	c := ca.Cert
	if !c.IsCA || c.Subject.CommonName != DefaultCACommonName || c.KeyUsage&x509.KeyUsageCertSign == 0 {
		t.Errorf("CA certificate: IsCA %v, CN %q, key usage %v; want a CA named %q that signs certificates",
			c.IsCA, c.Subject.CommonName, c.KeyUsage, DefaultCACommonName)
	}
	if c.PublicKeyAlgorithm != x509.ECDSA {
		t.Errorf("CA key algorithm = %v, want ECDSA", c.PublicKeyAlgorithm)
	}
	if got := c.NotAfter.Sub(now); got != DefaultCAValidity {
		t.Errorf("CA valid for %v after now, want %v", got, DefaultCAValidity)
	}
	if err := c.CheckSignatureFrom(c); err != nil {
		t.Errorf("CA certificate is not self-signed: %v", err)
	}
}

func TestIssue(t *testing.T) {
	ca := newCA(t)
	node := must[KeyPair](t)(ca.IssueNode("host-a", CertOptions{}))
	if err := verify(ca, node.Cert, x509.ExtKeyUsageClientAuth, "host-a"); err != nil {
		t.Errorf("node certificate does not verify for client auth as host-a: %v", err)
	}
	if err := verify(ca, node.Cert, x509.ExtKeyUsageServerAuth, ""); err == nil {
		t.Error("node certificate verifies for server auth, want client auth only")
	}
	if got := must[Identity](t)(IdentityOf(node.Cert)); got != (Identity{Role: RoleNode, Name: "host-a"}) {
		t.Errorf("node certificate identity = %v, want node host-a", got)
	}

	pub := must[KeyPair](t)(ca.IssuePublisher("admin", CertOptions{}))
	if err := verify(ca, pub.Cert, x509.ExtKeyUsageClientAuth, ""); err != nil {
		t.Errorf("publisher certificate does not verify for client auth: %v", err)
	}
	if got := must[Identity](t)(IdentityOf(pub.Cert)); got != (Identity{Role: RolePublisher, Name: "admin"}) {
		t.Errorf("publisher certificate identity = %v, want publisher admin", got)
	}

	srv := must[KeyPair](t)(ca.IssueServer([]string{"nimbus.example", "10.0.0.1", "localhost"}, CertOptions{}))
	for _, name := range []string{DefaultServerName, "localhost", "nimbus.example", "127.0.0.1", "::1", "10.0.0.1"} {
		if err := verify(ca, srv.Cert, x509.ExtKeyUsageServerAuth, name); err != nil {
			t.Errorf("server certificate does not verify for %s: %v", name, err)
		}
	}
	if n := len(srv.Cert.DNSNames); n != 3 {
		t.Errorf("server DNS names = %q, want nimbus, localhost and nimbus.example once each", srv.Cert.DNSNames)
	}
	if _, err := IdentityOf(srv.Cert); !errors.Is(err, ErrNoIdentity) {
		t.Errorf("server certificate identity error = %v, want ErrNoIdentity", err)
	}

	replica := must[KeyPair](t)(ca.IssueReplica("nimbus-1", []string{"10.0.0.2", "nimbus.example"}, CertOptions{}))
	for _, usage := range []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth} {
		for _, name := range []string{DefaultServerName, "localhost", "nimbus-1", "nimbus.example", "127.0.0.1", "10.0.0.2"} {
			if err := verify(ca, replica.Cert, usage, name); err != nil {
				t.Errorf("replica certificate does not verify for %v as %s: %v", usage, name, err)
			}
		}
	}
	if got := must[Identity](t)(IdentityOf(replica.Cert)); got != (Identity{Role: RoleReplica, Name: "nimbus-1"}) {
		t.Errorf("replica certificate identity = %v, want replica nimbus-1", got)
	}
	if _, err := ca.IssueReplica("", nil, CertOptions{}); err == nil {
		t.Error("IssueReplica(\"\") succeeded, want an error")
	}

	if _, err := ca.IssueNode("Host_A", CertOptions{}); err == nil || !strings.Contains(err.Error(), "Host_A") {
		t.Errorf("IssueNode(Host_A) = %v, want an error naming the bad name", err)
	}
	if _, err := ca.IssuePublisher("", CertOptions{}); err == nil {
		t.Error("IssuePublisher(\"\") succeeded, want an error")
	}
}

func TestIssuedNeverOutlastsCA(t *testing.T) {
	ca := must[*CA](t)(NewCA(CAOptions{Validity: 24 * time.Hour}))
	kp := must[KeyPair](t)(ca.IssueNode("host-a", CertOptions{Validity: 365 * 24 * time.Hour}))
	if !kp.Cert.NotAfter.Equal(ca.Cert.NotAfter) {
		t.Errorf("certificate valid until %v, CA until %v; want the CA's end", kp.Cert.NotAfter, ca.Cert.NotAfter)
	}
}

func TestIdentityOf(t *testing.T) {
	for _, tc := range []struct {
		name     string
		cert     x509.Certificate
		want     Identity
		wantFail bool
	}{
		{name: "node", cert: cert("host-a", []string{OrganizationNode}), want: Identity{RoleNode, "host-a"}},
		{name: "node named by its DNS name", cert: withDNS(cert("", []string{OrganizationNode}), "host-b"), want: Identity{RoleNode, "host-b"}},
		{name: "publisher", cert: cert("ops", []string{"acme", OrganizationPublisher}), want: Identity{RolePublisher, "ops"}},
		{name: "replica", cert: cert("nimbus-1", []string{OrganizationReplica}), want: Identity{RoleReplica, "nimbus-1"}},
		{name: "both roles", cert: cert("x", []string{OrganizationNode, OrganizationPublisher}), wantFail: true},
		{name: "replica and publisher", cert: cert("x", []string{OrganizationReplica, OrganizationPublisher}), wantFail: true},
		{name: "replica without a name", cert: cert("", []string{OrganizationReplica}), wantFail: true},
		{name: "no role", cert: cert("host-a", []string{"acme"}), wantFail: true},
		{name: "bad node name", cert: cert("Host A", []string{OrganizationNode}), wantFail: true},
		{name: "node without a name", cert: withDNS(cert("", []string{OrganizationNode}), "a", "b"), wantFail: true},
		{name: "publisher without a name", cert: cert("", []string{OrganizationPublisher}), wantFail: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := IdentityOf(&tc.cert)
			if tc.wantFail {
				if !errors.Is(err, ErrNoIdentity) {
					t.Fatalf("IdentityOf = %v, %v; want ErrNoIdentity", got, err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("IdentityOf = %v, %v; want %v", got, err, tc.want)
			}
		})
	}
}

func cert(cn string, orgs []string) x509.Certificate {
	var c x509.Certificate
	c.Subject.CommonName = cn
	c.Subject.Organization = orgs
	return c
}

func withDNS(c x509.Certificate, names ...string) x509.Certificate {
	c.DNSNames = names
	return c
}

func TestWriteAndLoad(t *testing.T) {
	dir := t.TempDir()
	ca := newCA(t)
	caCert, caKey := filepath.Join(dir, "ca.crt"), filepath.Join(dir, "ca.key")
	if err := ca.WriteFiles(caCert, caKey); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]os.FileMode{caCert: 0o644, caKey: 0o600} {
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != want {
			t.Errorf("%s has mode %v, want %v", path, fi.Mode().Perm(), want)
		}
	}
	loaded, err := LoadCA(caCert, caKey)
	if err != nil {
		t.Fatalf("LoadCA: %v", err)
	}
	if !loaded.Cert.Equal(ca.Cert) {
		t.Error("LoadCA returned another certificate than was written")
	}
	// The loaded CA signs what the written one verifies.
	kp := must[KeyPair](t)(loaded.IssueNode("host-a", CertOptions{}))
	if err := verify(ca, kp.Cert, x509.ExtKeyUsageClientAuth, ""); err != nil {
		t.Errorf("certificate issued by the loaded CA: %v", err)
	}

	nodeCert, nodeKey := filepath.Join(dir, "host-a.crt"), filepath.Join(dir, "host-a.key")
	if err := kp.WriteFiles(nodeCert, nodeKey); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadCA(nodeCert, nodeKey); !errors.Is(err, ErrNotCA) {
		t.Errorf("LoadCA of a node certificate = %v, want ErrNotCA", err)
	}
	// A key that is not the certificate's is refused, naming both files.
	if _, err := LoadKeyPair(nodeCert, caKey); err == nil || !strings.Contains(err.Error(), nodeCert) || !strings.Contains(err.Error(), caKey) {
		t.Errorf("LoadKeyPair with the wrong key = %v, want an error naming both files", err)
	}
	left, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 4 {
		t.Errorf("directory holds %d files, want the 4 written and no temporary ones", len(left))
	}
}

func TestLoadErrorsNameTheFile(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing.crt")
	garbage := filepath.Join(dir, "garbage.pem")
	if err := os.WriteFile(garbage, []byte("not pem\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		load func() error
		file string
	}{
		{"missing certificate", func() error { _, err := ReadCertificates(missing); return err }, missing},
		{"certificate not PEM", func() error { _, err := ReadCertificates(garbage); return err }, garbage},
		{"key not PEM", func() error { _, err := ReadKey(garbage); return err }, garbage},
		{"missing CA", func() error { _, err := ReadCertPool(missing); return err }, missing},
		{"server config", func() error { _, err := ServerConfig(missing, garbage, garbage); return err }, missing},
		{"client config", func() error { _, err := ClientConfig(missing, garbage, garbage, ""); return err }, missing},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.load(); err == nil || !strings.Contains(err.Error(), tc.file) {
				t.Fatalf("error = %v, want one naming %s", err, tc.file)
			}
		})
	}
}

// files writes the CA and a certificate per name ("nimbus" is the server's) into dir.
func files(t *testing.T, dir string, ca *CA, names ...string) {
	t.Helper()
	if err := ca.WriteFiles(filepath.Join(dir, "ca.crt"), filepath.Join(dir, "ca.key")); err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		var kp KeyPair
		switch n {
		case "nimbus":
			kp = must[KeyPair](t)(ca.IssueServer(nil, CertOptions{}))
		case "publisher":
			kp = must[KeyPair](t)(ca.IssuePublisher("admin", CertOptions{}))
		case "replica-a", "replica-b":
			kp = must[KeyPair](t)(ca.IssueReplica(n, nil, CertOptions{}))
		default:
			kp = must[KeyPair](t)(ca.IssueNode(n, CertOptions{}))
		}
		if err := kp.WriteFiles(filepath.Join(dir, n+".crt"), filepath.Join(dir, n+".key")); err != nil {
			t.Fatal(err)
		}
	}
}

// handshake serves one TLS connection with server on a unix socket, dials it with client
// and returns the client certificate the server verified and the client's error.
func handshake(t *testing.T, server, client *tls.Config) (*x509.Certificate, error) {
	t.Helper()
	lis, err := tls.Listen("unix", filepath.Join(t.TempDir(), "s.sock"), server)
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	verified := make(chan *x509.Certificate, 1)
	go func() {
		defer close(verified)
		conn, err := lis.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		tc := conn.(*tls.Conn)
		if tc.Handshake() != nil {
			return
		}
		if chains := tc.ConnectionState().VerifiedChains; len(chains) > 0 {
			verified <- chains[0][0]
		}
	}()
	conn, err := tls.Dial("unix", lis.Addr().String(), client)
	if err == nil {
		// TLS 1.3 clients finish before the server has checked their certificate; a read
		// sees the server's verdict: EOF after a handshake it accepted, else its alert.
		conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err = conn.Read(make([]byte, 1))
		if errors.Is(err, io.EOF) {
			err = nil
		}
		conn.Close()
	}
	return <-verified, err
}

func TestTLSConfigs(t *testing.T) {
	dir := t.TempDir()
	ca := newCA(t)
	files(t, dir, ca, "nimbus", "host-a", "publisher")
	p := func(name string) string { return filepath.Join(dir, name) }
	server := must[*tls.Config](t)(ServerConfig(p("nimbus.crt"), p("nimbus.key"), p("ca.crt")))
	if server.MinVersion != tls.VersionTLS13 || server.ClientAuth != tls.RequireAndVerifyClientCert {
		t.Errorf("server config: min version %x, client auth %v; want TLS 1.3 and verified client certificates required",
			server.MinVersion, server.ClientAuth)
	}

	t.Run("node", func(t *testing.T) {
		client := must[*tls.Config](t)(ClientConfig(p("host-a.crt"), p("host-a.key"), p("ca.crt"), ""))
		peer, err := handshake(t, server, client)
		if err != nil {
			t.Fatalf("handshake: %v", err)
		}
		if id, _ := IdentityOf(peer); id != (Identity{RoleNode, "host-a"}) {
			t.Errorf("server sees %v, want node host-a", id)
		}
	})
	t.Run("publisher by localhost", func(t *testing.T) {
		client := must[*tls.Config](t)(ClientConfig(p("publisher.crt"), p("publisher.key"), p("ca.crt"), "localhost"))
		if peer, err := handshake(t, server, client); err != nil || peer == nil {
			t.Fatalf("handshake: %v, peer %v", err, peer)
		}
	})
	t.Run("replica to replica", func(t *testing.T) {
		// One certificate serves and dials: replica-b's server config accepts
		// replica-a's client config, which verifies replica-b as nimbus.
		files(t, dir, ca, "replica-a", "replica-b")
		b := must[*tls.Config](t)(ServerConfig(p("replica-b.crt"), p("replica-b.key"), p("ca.crt")))
		a := must[*tls.Config](t)(ClientConfig(p("replica-a.crt"), p("replica-a.key"), p("ca.crt"), ""))
		peer, err := handshake(t, b, a)
		if err != nil {
			t.Fatalf("handshake: %v", err)
		}
		if id, _ := IdentityOf(peer); id != (Identity{RoleReplica, "replica-a"}) {
			t.Errorf("replica-b sees %v, want replica replica-a", id)
		}
	})
	t.Run("wrong server name", func(t *testing.T) {
		client := must[*tls.Config](t)(ClientConfig(p("host-a.crt"), p("host-a.key"), p("ca.crt"), "elsewhere.example"))
		if _, err := handshake(t, server, client); err == nil {
			t.Fatal("handshake for a name the server certificate lacks succeeded")
		}
	})
	t.Run("no client certificate", func(t *testing.T) {
		client := must[*tls.Config](t)(ClientConfig(p("host-a.crt"), p("host-a.key"), p("ca.crt"), ""))
		client.Certificates, client.GetClientCertificate = nil, nil
		if peer, err := handshake(t, server, client); err == nil || peer != nil {
			t.Fatalf("handshake without a client certificate: err %v, server verified %v; want refused", err, peer)
		}
	})
	t.Run("certificate of another CA", func(t *testing.T) {
		other := t.TempDir()
		files(t, other, newCA(t), "host-a")
		client := must[*tls.Config](t)(ClientConfig(filepath.Join(other, "host-a.crt"), filepath.Join(other, "host-a.key"), p("ca.crt"), ""))
		if peer, err := handshake(t, server, client); err == nil || peer != nil {
			t.Fatalf("handshake with a foreign certificate: err %v, server verified %v; want refused", err, peer)
		}
	})
}

func TestRoleString(t *testing.T) {
	got := []string{Role(0).String(), RoleNode.String(), RolePublisher.String(), RoleReplica.String()}
	if want := []string{"none", "node", "publisher", "replica"}; !slices.Equal(got, want) {
		t.Errorf("roles = %q, want %q", got, want)
	}
	if got := (Identity{RoleNode, "host-a"}).String(); got != `node "host-a"` {
		t.Errorf("identity = %s, want node \"host-a\"", got)
	}
}
