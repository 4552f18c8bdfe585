package nimbus

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/naplesnet/naples/internal/pki"
)

// TestNewRefusesBadCertificateOptions: a revocation list without TLS, and negative
// intervals, are refused naming the field.
func TestNewRefusesBadCertificateOptions(t *testing.T) {
	dir := t.TempDir()
	ca, err := pki.NewCA(pki.CAOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := ca.WriteFiles(filepath.Join(dir, "ca.crt"), filepath.Join(dir, "ca.key")); err != nil {
		t.Fatal(err)
	}
	crl, err := ca.RevocationList(nil, nil, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := pki.WriteRevocationList(filepath.Join(dir, "ca.crl"), crl); err != nil {
		t.Fatal(err)
	}
	f, err := pki.LoadRevocationFile(filepath.Join(dir, "ca.crl"), filepath.Join(dir, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		opts Options
		want string
	}{
		{Options{CRL: f}, "CRL " + filepath.Join(dir, "ca.crl") + " without TLS"},
		{Options{CRLInterval: -time.Second}, "CRLInterval -1s"},
		{Options{CertificateWarning: -time.Hour}, "CertificateWarning -1h0m0s"},
	} {
		if _, err := New(tc.opts); !errors.Is(err, ErrInvalidOptions) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New = %v, want ErrInvalidOptions naming %q", err, tc.want)
		}
	}
}
