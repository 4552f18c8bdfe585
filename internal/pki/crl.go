package pki

import (
	"bytes"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// pemCRL is the PEM block type of a certificate revocation list.
const pemCRL = "X509 CRL"

// DefaultCRLValidity is how long after it is signed a CRL that RevocationList makes says
// it is current (its NextUpdate): one year. nimbus uses a CRL however old it is; the
// field is for other readers.
const DefaultCRLValidity = 365 * 24 * time.Hour

// ErrRevoked is wrapped by the errors of a certificate that a revocation list revokes.
var ErrRevoked = errors.New("certificate revoked")

// RevocationList makes a CRL, signed by the CA, that revokes the certificates of prev, a
// CRL the CA signed before (nil for none), and those of certs, each the CA issued. The CRL
// number is one more than prev's. It returns the CRL as a PEM X509 CRL block.
func (ca *CA) RevocationList(prev *x509.RevocationList, certs []*x509.Certificate, now time.Time) ([]byte, error) {
	number := big.NewInt(1)
	var entries []x509.RevocationListEntry
	if prev != nil {
		if err := prev.CheckSignatureFrom(ca.Cert); err != nil {
			return nil, fmt.Errorf("extending the revocation list: not signed by CA %q: %w", ca.Cert.Subject.CommonName, err)
		}
		if prev.Number != nil {
			number.Add(prev.Number, number)
		}
		entries = slices.Clone(prev.RevokedCertificateEntries)
	}
	for _, c := range certs {
		if err := c.CheckSignatureFrom(ca.Cert); err != nil {
			return nil, fmt.Errorf("revoking certificate %q: not issued by CA %q: %w", c.Subject.CommonName, ca.Cert.Subject.CommonName, err)
		}
		if slices.ContainsFunc(entries, func(e x509.RevocationListEntry) bool { return e.SerialNumber.Cmp(c.SerialNumber) == 0 }) {
			continue
		}
		entries = append(entries, x509.RevocationListEntry{SerialNumber: c.SerialNumber, RevocationTime: now})
	}
	der, err := x509.CreateRevocationList(rand.Reader, &x509.RevocationList{
		Number:                    number,
		ThisUpdate:                now,
		NextUpdate:                now.Add(DefaultCRLValidity),
		RevokedCertificateEntries: entries,
	}, ca.Cert, ca.Key)
	if err != nil {
		return nil, fmt.Errorf("signing the revocation list: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: pemCRL, Bytes: der}), nil
}

// WriteRevocationList replaces the file at path with data, a CRL from RevocationList,
// with mode 0644: a reader sees the old file or the new one.
func WriteRevocationList(path string, data []byte) error {
	return writeFile(path, data, 0o644, false)
}

// ReadRevocationList reads the CRL of the file at path, PEM or DER, and checks that one
// of cas signed it. Its errors name the file.
func ReadRevocationList(path string, cas []*x509.Certificate) (*x509.RevocationList, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading revocation list: %w", err)
	}
	der := data
	if b, _ := pem.Decode(data); b != nil {
		if b.Type != pemCRL {
			return nil, fmt.Errorf("reading revocation list %s: PEM block %s, want %s", path, b.Type, pemCRL)
		}
		der = b.Bytes
	}
	crl, err := x509.ParseRevocationList(der)
	if err != nil {
		return nil, fmt.Errorf("parsing revocation list %s: %w", path, err)
	}
	for _, ca := range cas {
		if bytes.Equal(crl.RawIssuer, ca.RawSubject) && crl.CheckSignatureFrom(ca) == nil {
			return crl, nil
		}
	}
	return nil, fmt.Errorf("revocation list %s: not signed by a CA of the CA file", path)
}

// RevocationFile is a CRL file that a server checks its clients' certificates against,
// read again by Reload when the file changed. It is safe for concurrent use.
type RevocationFile struct {
	path string
	cas  []*x509.Certificate

	// list is the CRL in force: the serials it revokes, by issuer.
	list atomic.Pointer[revoked]

	// mu guards stamp.
	mu sync.Mutex
	// stamp is the modification time and size of the file the list was read from.
	stamp fileStamp
}

// revoked is the serials a CRL revokes and the issuer it speaks for.
type revoked struct {
	rawIssuer []byte
	serials   map[string]struct{}
}

// fileStamp is what tells that a file changed: its modification time and size.
type fileStamp struct {
	mtime time.Time
	size  int64
}

// LoadRevocationFile reads the CRL of path, which a CA of caFile must have signed.
func LoadRevocationFile(path, caFile string) (*RevocationFile, error) {
	cas, err := ReadCertificates(caFile)
	if err != nil {
		return nil, err
	}
	f := &RevocationFile{path: path, cas: cas}
	if _, err := f.Reload(); err != nil {
		return nil, err
	}
	return f, nil
}

// Path returns the CRL file's path.
func (f *RevocationFile) Path() string { return f.path }

// Reload reads the file again when its modification time or size changed since it was
// last read, and reports whether it did. On error the list read before stays in force.
func (f *RevocationFile) Reload() (bool, error) {
	fi, err := os.Stat(f.path)
	if err != nil {
		return false, fmt.Errorf("reading revocation list: %w", err)
	}
	stamp := fileStamp{mtime: fi.ModTime(), size: fi.Size()}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.list.Load() != nil && stamp == f.stamp {
		return false, nil
	}
	crl, err := ReadRevocationList(f.path, f.cas)
	if err != nil {
		return false, err
	}
	r := &revoked{rawIssuer: crl.RawIssuer, serials: map[string]struct{}{}}
	for _, e := range crl.RevokedCertificateEntries {
		r.serials[e.SerialNumber.String()] = struct{}{}
	}
	f.list.Store(r)
	f.stamp = stamp
	return true, nil
}

// Check returns an error wrapping ErrRevoked when the CRL in force revokes cert.
func (f *RevocationFile) Check(cert *x509.Certificate) error {
	r := f.list.Load()
	if r == nil || !bytes.Equal(cert.RawIssuer, r.rawIssuer) {
		return nil
	}
	if _, ok := r.serials[cert.SerialNumber.String()]; ok {
		return fmt.Errorf("certificate %q (serial %s) is in %s: %w", cert.Subject.CommonName, cert.SerialNumber, f.path, ErrRevoked)
	}
	return nil
}

// VerifyPeerCertificate refuses a peer whose verified certificate the CRL in force
// revokes; it is a tls.Config's VerifyPeerCertificate for a config that verifies its
// peers, such as ServerConfig's.
func (f *RevocationFile) VerifyPeerCertificate(_ [][]byte, chains [][]*x509.Certificate) error {
	for _, chain := range chains {
		if len(chain) > 0 {
			if err := f.Check(chain[0]); err != nil {
				return err
			}
		}
	}
	return nil
}
