package pki

import (
	"crypto/x509"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestRevocationFile(t *testing.T) {
	dir := t.TempDir()
	ca := newCA(t)
	files(t, dir, ca, "host-a", "host-b")
	p := func(name string) string { return filepath.Join(dir, name) }
	hostA := must[KeyPair](t)(LoadKeyPair(p("host-a.crt"), p("host-a.key"))).Cert
	hostB := must[KeyPair](t)(LoadKeyPair(p("host-b.crt"), p("host-b.key"))).Cert

	crlPath := p("ca.crl")
	if _, err := LoadRevocationFile(crlPath, p("ca.crt")); err == nil || !strings.Contains(err.Error(), crlPath) {
		t.Errorf("LoadRevocationFile of a missing file = %v, want an error naming it", err)
	}
	empty := must[[]byte](t)(ca.RevocationList(nil, nil, time.Now()))
	if err := WriteRevocationList(crlPath, empty); err != nil {
		t.Fatal(err)
	}
	f := must[*RevocationFile](t)(LoadRevocationFile(crlPath, p("ca.crt")))
	if err := f.Check(hostA); err != nil {
		t.Errorf("Check(host-a) with an empty list = %v", err)
	}
	if changed, err := f.Reload(); changed || err != nil {
		t.Errorf("Reload of an unchanged file = %v, %v; want false, nil", changed, err)
	}

	prev := must[*x509.RevocationList](t)(ReadRevocationList(crlPath, []*x509.Certificate{ca.Cert}))
	if err := WriteRevocationList(crlPath, must[[]byte](t)(ca.RevocationList(prev, []*x509.Certificate{hostA}, time.Now()))); err != nil {
		t.Fatal(err)
	}
	if changed, err := f.Reload(); !changed || err != nil {
		t.Fatalf("Reload of a changed file = %v, %v; want true, nil", changed, err)
	}
	if err := f.Check(hostA); !errors.Is(err, ErrRevoked) || !strings.Contains(err.Error(), crlPath) {
		t.Errorf("Check(host-a) = %v, want ErrRevoked naming %s", err, crlPath)
	}
	if err := f.VerifyPeerCertificate(nil, [][]*x509.Certificate{{hostA, ca.Cert}}); !errors.Is(err, ErrRevoked) {
		t.Errorf("VerifyPeerCertificate(host-a) = %v, want ErrRevoked", err)
	}
	if err := f.Check(hostB); err != nil {
		t.Errorf("Check(host-b) = %v, want nil", err)
	}

	// A list another CA signed, or garbage, is refused and the one before stays.
	other := newCA(t)
	if err := WriteRevocationList(crlPath, must[[]byte](t)(other.RevocationList(nil, nil, time.Now()))); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Reload(); err == nil || !strings.Contains(err.Error(), "not signed") {
		t.Errorf("Reload of a list another CA signed = %v, want refused", err)
	}
	if err := os.WriteFile(crlPath, []byte("garbage"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Reload(); err == nil || !strings.Contains(err.Error(), crlPath) {
		t.Errorf("Reload of garbage = %v, want an error naming the file", err)
	}
	if err := f.Check(hostA); !errors.Is(err, ErrRevoked) {
		t.Errorf("after failed reloads, Check(host-a) = %v, want still revoked", err)
	}
	if _, err := ca.RevocationList(nil, []*x509.Certificate{must[KeyPair](t)(other.IssueNode("host-c", CertOptions{})).Cert}, time.Now()); err == nil {
		t.Error("RevocationList of another CA's certificate succeeded")
	}
}
