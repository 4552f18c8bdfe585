package pki

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"os"
	"sync"
	"time"
)

// ReloadInterval is how often, at most, a KeyPairFile looks whether its files changed:
// a renewed certificate is used from the next TLS handshake after it, within a second
// of being copied into place.
const ReloadInterval = time.Second

// KeyPairFile is a process's certificate and key, read from their files and read again
// when either file changes (its modification time or size), so that a certificate
// renewed in place (naplesctl certs --renew, then copied over the old files) is
// presented from the next TLS handshake on, without a restart. A pair that does not
// load (a key that does not belong to the certificate, half copied) leaves the one
// loaded before in use, and is tried again once the files change again.
type KeyPairFile struct {
	certFile, keyFile string
	// now tells the time; tests set it.
	now func() time.Time

	mu      sync.Mutex
	current *tls.Certificate
	// loaded are the stamps of the files current was read from, and tried those of the
	// last attempt, so that a pair that failed is not read again until it changes.
	loaded, tried [2]fileStamp
	checked       time.Time
	onReload      []func(leaf *x509.Certificate, err error)
}

// stampOf returns the file's stamp, the zero one when it cannot be read.
func stampOf(path string) fileStamp {
	fi, err := os.Stat(path)
	if err != nil {
		return fileStamp{}
	}
	return fileStamp{mtime: fi.ModTime(), size: fi.Size()}
}

// LoadKeyPairFile reads the certificate chain of certFile and the key of keyFile. Its
// error names the file at fault.
func LoadKeyPairFile(certFile, keyFile string) (*KeyPairFile, error) {
	k := &KeyPairFile{certFile: certFile, keyFile: keyFile, now: time.Now}
	stamps := k.stamps()
	cert, err := loadTLSCertificate(certFile, keyFile)
	if err != nil {
		return nil, err
	}
	k.current, k.loaded, k.tried, k.checked = &cert, stamps, stamps, k.now()
	return k, nil
}

// stamps returns the stamps of the certificate and key files.
func (k *KeyPairFile) stamps() [2]fileStamp {
	return [2]fileStamp{stampOf(k.certFile), stampOf(k.keyFile)}
}

// OnReload calls f, from then on, after each attempt to read the files again because
// they changed: with the new certificate when it loaded, or with the error that left
// the one before in use.
func (k *KeyPairFile) OnReload(f func(leaf *x509.Certificate, err error)) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.onReload = append(k.onReload, f)
}

// Leaf returns the certificate in use, parsed.
func (k *KeyPairFile) Leaf() *x509.Certificate { return k.Certificate().Leaf }

// Certificate returns the certificate and key to present, read again first when the
// files changed and ReloadInterval passed since the last look.
func (k *KeyPairFile) Certificate() *tls.Certificate {
	k.mu.Lock()
	now := k.now()
	if now.Sub(k.checked) < ReloadInterval {
		defer k.mu.Unlock()
		return k.current
	}
	k.checked = now
	stamps := k.stamps()
	if stamps == k.loaded || stamps == k.tried {
		defer k.mu.Unlock()
		return k.current
	}
	k.tried = stamps
	cert, err := loadTLSCertificate(k.certFile, k.keyFile)
	var leaf *x509.Certificate
	if err == nil {
		k.current, k.loaded, leaf = &cert, stamps, cert.Leaf
	}
	current, callbacks := k.current, k.onReload
	k.mu.Unlock()
	for _, f := range callbacks {
		f(leaf, err)
	}
	return current
}

// Watch looks whether the files changed every ReloadInterval until ctx ends, so that a
// renewal is loaded, and its OnReload functions called, even while no connection is
// made.
func (k *KeyPairFile) Watch(ctx context.Context) {
	tick := time.NewTicker(ReloadInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			k.Certificate()
		}
	}
}

// getCertificate is a tls.Config's GetCertificate of k.
func (k *KeyPairFile) getCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return k.Certificate(), nil
}

// getClientCertificate is a tls.Config's GetClientCertificate of k.
func (k *KeyPairFile) getClientCertificate(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	return k.Certificate(), nil
}
