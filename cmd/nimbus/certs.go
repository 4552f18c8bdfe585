package main

import (
	"flag"
	"fmt"
	"time"

	"github.com/naplesnet/naples/internal/pki"
	"github.com/naplesnet/naples/nimbus"
)

// certConfig is what the command line says of nimbus's certificates beyond the files
// themselves.
type certConfig struct {
	// expiryWarning is how long before a certificate expires /readyz warns of it.
	expiryWarning time.Duration
	// crl is the revocation list's file; empty for none.
	crl string
	// crlInterval is how often nimbus looks whether crl changed.
	crlInterval time.Duration
}

// addCertFlags adds the flags of certConfig to fs.
func addCertFlags(fs *flag.FlagSet, c *certConfig) {
	durationFlag(fs, "tls-expiry-warning", "warn on /readyz of a certificate (--tls-cert, --tls-ca) that expires within `duration`",
		&c.expiryWarning, pki.DefaultExpiryWarning, 0)
	fs.StringVar(&c.crl, "tls-crl", "", "`file` of the revocation list (naplesctl certs --revoke writes DIR/ca.crl) that client certificates are checked against; read again when it changes, and the connections of a certificate it comes to revoke are closed (default: none)")
	durationFlag(fs, "tls-crl-interval", "how often to look whether the --tls-crl file changed, a `duration`", &c.crlInterval, nimbus.DefaultCRLInterval, 100*time.Millisecond)
}

// certOptions sets the certificate options of opts from cfg: the certificate files nimbus
// serves with, for their expiry, and the revocation list.
func certOptions(cfg config, opts *nimbus.Options) error {
	if cfg.insecure {
		if cfg.certs.crl != "" {
			return fmt.Errorf("--tls-crl %s: --insecure checks no certificates", cfg.certs.crl)
		}
		return nil
	}
	if cfg.certs.crl != "" {
		crl, err := pki.LoadRevocationFile(cfg.certs.crl, cfg.tlsCA)
		if err != nil {
			return fmt.Errorf("--tls-crl: %w (naplesctl certs --revoke writes one)", err)
		}
		opts.CRL, opts.CRLInterval = crl, cfg.certs.crlInterval
	}
	e, err := pki.ReadExpiry(pki.CertFile{Use: pki.UseServer, Path: cfg.tlsCert}, pki.CertFile{Use: pki.UseCA, Path: cfg.tlsCA})
	if err != nil {
		return fmt.Errorf("loading TLS credentials: %w", err)
	}
	opts.Certificates, opts.CertificateWarning = e, cfg.certs.expiryWarning
	return nil
}
