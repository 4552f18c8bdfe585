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
}

// addCertFlags adds the flags of certConfig to fs.
func addCertFlags(fs *flag.FlagSet, c *certConfig) {
	c.expiryWarning = pki.DefaultExpiryWarning
	fs.Func("tls-expiry-warning", fmt.Sprintf("warn on /readyz of a certificate (--tls-cert, --tls-ca) that expires within `duration` (default %v)", pki.DefaultExpiryWarning),
		func(s string) error {
			d, err := time.ParseDuration(s)
			switch {
			case err != nil:
				return fmt.Errorf("%q: want a duration such as 720h: %w", s, err)
			case d <= 0:
				return fmt.Errorf("%v: must be positive", d)
			}
			c.expiryWarning = d
			return nil
		})
}

// certOptions sets the certificate options of opts from cfg: the certificate files nimbus
// serves with, for their expiry.
func certOptions(cfg config, opts *nimbus.Options) error {
	if cfg.insecure {
		return nil
	}
	e, err := pki.ReadExpiry(pki.CertFile{Use: pki.UseServer, Path: cfg.tlsCert}, pki.CertFile{Use: pki.UseCA, Path: cfg.tlsCA})
	if err != nil {
		return fmt.Errorf("loading TLS credentials: %w", err)
	}
	opts.Certificates, opts.CertificateWarning = e, cfg.certs.expiryWarning
	return nil
}
