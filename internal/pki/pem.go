package pki

import (
	"crypto"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
)

// PEM block types this package writes and reads.
const (
	pemCertificate  = "CERTIFICATE"
	pemPrivateKey   = "PRIVATE KEY"    // PKCS #8
	pemECPrivateKey = "EC PRIVATE KEY" // SEC 1, read only
	pemRSAKey       = "RSA PRIVATE KEY"
)

// EncodeCertificate returns the certificate as a PEM CERTIFICATE block.
func EncodeCertificate(cert *x509.Certificate) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: pemCertificate, Bytes: cert.Raw})
}

// EncodeKey returns the key as a PEM PRIVATE KEY block in PKCS #8.
func EncodeKey(key crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("encoding private key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: pemPrivateKey, Bytes: der}), nil
}

// WriteFiles writes the certificate to certPath with mode 0644 and the key to keyPath
// with mode 0600. Each file is replaced whole: a reader sees the old file or the new one.
func (kp KeyPair) WriteFiles(certPath, keyPath string) error {
	return kp.writeFiles(certPath, keyPath, false)
}

// ReplaceFiles writes the pair over the files of the pair it renews, as WriteFiles does,
// but keeps the group of each file there, and the group's permission to read the key
// where it had it (mode 0640): a renewed key stays readable by the group a service reads
// it as, as deploy/README.md has nimbus's.
func (kp KeyPair) ReplaceFiles(certPath, keyPath string) error {
	return kp.writeFiles(certPath, keyPath, true)
}

// writeFiles writes the pair as WriteFiles does, and with keep as ReplaceFiles does.
func (kp KeyPair) writeFiles(certPath, keyPath string, keep bool) error {
	keyPEM, err := EncodeKey(kp.Key)
	if err != nil {
		return fmt.Errorf("writing %s: %w", keyPath, err)
	}
	if err := writeFile(keyPath, keyPEM, 0o600, keep); err != nil {
		return err
	}
	return writeFile(certPath, EncodeCertificate(kp.Cert), 0o644, keep)
}

// writeFile replaces path with data through a temporary file in the same directory. With
// keep, the new file takes the group of the file it replaces, and the group's read
// permission where that had it.
func writeFile(path string, data []byte, mode os.FileMode, keep bool) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	defer os.Remove(f.Name()) // fails harmlessly once renamed
	if old, err := os.Stat(path); err == nil && keep {
		mode |= old.Mode().Perm() & 0o040
		if err := setGroupOf(f, old); err != nil {
			f.Close()
			return fmt.Errorf("writing %s: keeping its group: %w", path, err)
		}
	}
	if err := f.Chmod(mode); err != nil {
		f.Close()
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}

// ReadCertificates returns every certificate of the PEM file at path. It fails when the
// file holds none.
func ReadCertificates(path string) ([]*x509.Certificate, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading certificate: %w", err)
	}
	var certs []*x509.Certificate
	for rest := data; ; {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		if b.Type != pemCertificate {
			continue
		}
		cert, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, fmt.Errorf("parsing certificate %d of %s: %w", len(certs)+1, path, err)
		}
		certs = append(certs, cert)
	}
	if len(certs) == 0 {
		return nil, fmt.Errorf("reading certificate %s: no PEM %s block", path, pemCertificate)
	}
	return certs, nil
}

// ReadKey returns the private key of the PEM file at path: PKCS #8, SEC 1 (EC) or PKCS #1
// (RSA).
func ReadKey(path string) (crypto.Signer, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading private key: %w", err)
	}
	for rest := data; ; {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			return nil, fmt.Errorf("reading private key %s: no PEM %s block", path, pemPrivateKey)
		}
		var key any
		switch b.Type {
		case pemPrivateKey:
			key, err = x509.ParsePKCS8PrivateKey(b.Bytes)
		case pemECPrivateKey:
			key, err = x509.ParseECPrivateKey(b.Bytes)
		case pemRSAKey:
			key, err = x509.ParsePKCS1PrivateKey(b.Bytes)
		default:
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("parsing private key %s: %w", path, err)
		}
		signer, ok := key.(crypto.Signer)
		if !ok {
			return nil, fmt.Errorf("parsing private key %s: %T cannot sign", path, key)
		}
		return signer, nil
	}
}

// LoadKeyPair reads a certificate and its key from PEM files. The first certificate of
// certPath is the one the key belongs to.
func LoadKeyPair(certPath, keyPath string) (KeyPair, error) {
	certs, err := ReadCertificates(certPath)
	if err != nil {
		return KeyPair{}, err
	}
	key, err := ReadKey(keyPath)
	if err != nil {
		return KeyPair{}, err
	}
	if !publicKeysEqual(certs[0].PublicKey, key.Public()) {
		return KeyPair{}, fmt.Errorf("loading %s and %s: the private key does not belong to the certificate", certPath, keyPath)
	}
	return KeyPair{Cert: certs[0], Key: key}, nil
}

// LoadCA reads a CA certificate and its key from PEM files. Its error wraps ErrNotCA when
// the certificate is not a CA.
func LoadCA(certPath, keyPath string) (*CA, error) {
	kp, err := LoadKeyPair(certPath, keyPath)
	if err != nil {
		return nil, err
	}
	if !kp.Cert.IsCA {
		return nil, fmt.Errorf("loading CA %s: %w", certPath, ErrNotCA)
	}
	return &CA{kp}, nil
}

// ReadCertPool returns a pool of every certificate in the PEM file at path.
func ReadCertPool(path string) (*x509.CertPool, error) {
	certs, err := ReadCertificates(path)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	for _, c := range certs {
		pool.AddCert(c)
	}
	return pool, nil
}

// publicKeysEqual reports whether two public keys are the same. Every public key type of
// the standard library has an Equal method.
func publicKeysEqual(a, b crypto.PublicKey) bool {
	ea, ok := a.(interface{ Equal(crypto.PublicKey) bool })
	return ok && ea.Equal(b)
}
