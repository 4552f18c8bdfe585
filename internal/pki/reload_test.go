package pki

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"math/big"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// TestKeyPairFileReloads renews a node's and the server's certificates in place, as
// naplesctl certs --renew and a copy do, and checks that the next handshakes present
// the new ones once ReloadInterval passed, not before; that a pair that does not load
// leaves the one before in use, said once; and that it is read again once fixed.
func TestKeyPairFileReloads(t *testing.T) {
	dir := t.TempDir()
	ca := newCA(t)
	files(t, dir, ca, "nimbus", "host-a")
	p := func(name string) string { return filepath.Join(dir, name) }
	now := time.Unix(1_800_000_000, 0)
	clock := func() time.Time { return now }
	load := func(name string) *KeyPairFile {
		kp := must[*KeyPairFile](t)(LoadKeyPairFile(p(name+".crt"), p(name+".key")))
		kp.now = clock
		return kp
	}
	node, srv := load("host-a"), load("nimbus")
	type reload struct {
		serial *big.Int
		err    error
	}
	var reloads []reload
	node.OnReload(func(leaf *x509.Certificate, err error) {
		r := reload{err: err}
		if leaf != nil {
			r.serial = leaf.SerialNumber
		}
		reloads = append(reloads, r)
	})
	server := must[*tls.Config](t)(ServerConfigOf(srv, p("ca.crt")))
	client := must[*tls.Config](t)(ClientConfigOf(node, p("ca.crt"), ""))
	var served *x509.Certificate
	client.VerifyConnection = func(cs tls.ConnectionState) error {
		served = cs.PeerCertificates[0]
		return nil
	}
	// check handshakes and wants the node's and the server's certificates of those serials.
	check := func(what string, nodeSerial, serverSerial *big.Int) {
		t.Helper()
		got, err := handshake(t, server, client)
		if err != nil {
			t.Fatalf("%s: handshake: %v", what, err)
		}
		if got.SerialNumber.Cmp(nodeSerial) != 0 || served.SerialNumber.Cmp(serverSerial) != 0 {
			t.Errorf("%s: the node presented serial %s and the server %s, want %s and %s", what, got.SerialNumber, served.SerialNumber, nodeSerial, serverSerial)
		}
	}
	// renew writes a new key pair for name over its files, dated later than the old.
	renew := func(name string, issue func() (KeyPair, error)) KeyPair {
		t.Helper()
		kp := must[KeyPair](t)(issue())
		if err := kp.WriteFiles(p(name+".crt"), p(name+".key")); err != nil {
			t.Fatal(err)
		}
		for _, f := range []string{name + ".crt", name + ".key"} {
			later := time.Now().Add(time.Duration(len(reloads)+1) * time.Hour)
			if err := os.Chtimes(p(f), later, later); err != nil {
				t.Fatal(err)
			}
		}
		return kp
	}
	nodeSerial, serverSerial := node.Leaf().SerialNumber, srv.Leaf().SerialNumber
	check("at the start", nodeSerial, serverSerial)

	newNode := renew("host-a", func() (KeyPair, error) { return ca.IssueNode("host-a", CertOptions{}) })
	newServer := renew("nimbus", func() (KeyPair, error) { return ca.IssueServer(nil, CertOptions{}) })
	now = now.Add(ReloadInterval / 2)
	check("renewed, within the interval", nodeSerial, serverSerial)
	now = now.Add(ReloadInterval)
	check("renewed, after the interval", newNode.Cert.SerialNumber, newServer.Cert.SerialNumber)
	if len(reloads) != 1 || reloads[0].err != nil || reloads[0].serial.Cmp(newNode.Cert.SerialNumber) != 0 {
		t.Fatalf("reloads %v, want one of serial %s", reloads, newNode.Cert.SerialNumber)
	}

	// Half copied: a new certificate beside the old key.
	other := must[KeyPair](t)(ca.IssueNode("host-a", CertOptions{}))
	mismatched := KeyPair{Cert: other.Cert, Key: newNode.Key}
	if err := mismatched.WriteFiles(p("host-a.crt"), p("host-a.key")); err != nil {
		t.Fatal(err)
	}
	later := time.Now().Add(10 * time.Hour)
	if err := os.Chtimes(p("host-a.crt"), later, later); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		now = now.Add(ReloadInterval)
		check("a certificate beside another's key", newNode.Cert.SerialNumber, newServer.Cert.SerialNumber)
	}
	if len(reloads) != 2 || reloads[1].err == nil || reloads[1].serial != nil {
		t.Fatalf("reloads %v, want a second, failed, once", reloads)
	}
	if err := other.WriteFiles(p("host-a.crt"), p("host-a.key")); err != nil {
		t.Fatal(err)
	}
	later = later.Add(time.Hour)
	for _, f := range []string{"host-a.crt", "host-a.key"} {
		if err := os.Chtimes(p(f), later, later); err != nil {
			t.Fatal(err)
		}
	}
	now = now.Add(ReloadInterval)
	check("fixed", other.Cert.SerialNumber, newServer.Cert.SerialNumber)
}

// TestExpiryRenewed checks that Renewed changes the expiry of the file's certificate,
// not of a CA file, and calls OnChange.
func TestExpiryRenewed(t *testing.T) {
	dir := t.TempDir()
	files(t, dir, newCA(t), "host-a")
	crt, caFile := filepath.Join(dir, "host-a.crt"), filepath.Join(dir, "ca.crt")
	e := must[*Expiry](t)(ReadExpiry(CertFile{Use: UseClient, Path: crt}, CertFile{Use: UseCA, Path: caFile}))
	before := e.Certificates()
	changes := 0
	e.OnChange(func() { changes++ })
	at := time.Unix(2_000_000_000, 0)
	e.Renewed(crt, at)
	got := e.Certificates()
	if changes != 1 || !got[0].NotAfter.Equal(at) || !got[1].NotAfter.Equal(before[1].NotAfter) {
		t.Errorf("after Renewed: %v and %d changes, want the client certificate at %v, the CA as before (%v), one change", got, changes, at, before[1].NotAfter)
	}
	if !slices.Equal(before[:1], []ExpiringCert{{CertFile: before[0].CertFile, NotAfter: before[0].NotAfter}}) {
		t.Errorf("Certificates returned before Renewed changed to %v", before)
	}
	var nilExpiry *Expiry
	nilExpiry.Renewed(crt, at) // must not panic
	nilExpiry.OnChange(func() { t.Error("a nil Expiry called OnChange") })
}

// TestKeyPairFileWatch checks that Watch loads a renewal with no handshake made.
func TestKeyPairFileWatch(t *testing.T) {
	dir := t.TempDir()
	ca := newCA(t)
	files(t, dir, ca, "host-a")
	crt, key := filepath.Join(dir, "host-a.crt"), filepath.Join(dir, "host-a.key")
	kp := must[*KeyPairFile](t)(LoadKeyPairFile(crt, key))
	loaded := make(chan *x509.Certificate, 1)
	kp.OnReload(func(leaf *x509.Certificate, err error) { loaded <- leaf })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go kp.Watch(ctx)
	renewed := must[KeyPair](t)(ca.IssueNode("host-a", CertOptions{}))
	if err := renewed.WriteFiles(crt, key); err != nil {
		t.Fatal(err)
	}
	later := time.Now().Add(time.Hour)
	for _, f := range []string{crt, key} {
		if err := os.Chtimes(f, later, later); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case leaf := <-loaded:
		if leaf == nil || leaf.SerialNumber.Cmp(renewed.Cert.SerialNumber) != 0 || kp.Leaf().SerialNumber.Cmp(renewed.Cert.SerialNumber) != 0 {
			t.Errorf("Watch loaded %v, want serial %s", leaf, renewed.Cert.SerialNumber)
		}
	case <-time.After(10 * ReloadInterval):
		t.Fatal("Watch did not load the renewed files")
	}
}
