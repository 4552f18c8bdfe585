package main

import (
	"crypto/x509"
	"errors"

	"fmt"
	"log/slog"
	"os"
	"os/user"
	"slices"
	"strconv"
	"time"

	"github.com/naplesnet/naples/internal/address"
	"github.com/naplesnet/naples/internal/cmdline"
	"github.com/naplesnet/naples/internal/pki"
	"github.com/naplesnet/naples/nimbus"
)

// Defaults of the socket flags.
const (
	// defaultSocketGroup is the default of --socket-group: the group whose members, such
	// as operators with naplesctl, may reach nimbus's unix sockets.
	defaultSocketGroup = "naples"
	// groupSocketMode is the mode of a unix socket shared with --socket-group.
	groupSocketMode = 0o660
)

// accessConfig is what the command line says of who may reach nimbus, and of its
// certificates beyond the files themselves.
type accessConfig struct {
	// socketGroup is the group the unix sockets are shared with; empty leaves them as
	// they are made. socketGroupSet is true when the command line names it.
	socketGroup    string
	socketGroupSet bool
	// expiryWarning is how long before a certificate expires /readyz warns of it.
	expiryWarning time.Duration
	// crl is the revocation list's file; empty for none.
	crl string
	// crlInterval is how often nimbus looks whether crl changed.
	crlInterval time.Duration
}

// addAccessFlags adds the flags of accessConfig to fs.
func addAccessFlags(fs *cmdline.FlagSet, c *accessConfig) {
	c.socketGroup = defaultSocketGroup
	fs.Func("socket-group", "`group` that may reach the unix sockets of --listen: they are made mode 0660 and this group's; "+
		"empty leaves them to nimbus's user alone (default "+defaultSocketGroup+", when that group exists)", func(s string) error {
		c.socketGroup, c.socketGroupSet = s, true
		return nil
	})
	durationFlag(fs, "tls-expiry-warning", "warn on /readyz of a certificate (--tls-cert, --tls-ca) that expires within `duration`",
		&c.expiryWarning, pki.DefaultExpiryWarning, 0)
	fs.StringVar(&c.crl, "tls-crl", "", "`file` of the revocation list (naplesctl certs --revoke writes DIR/ca.crl) that client certificates are checked against; read again when it changes, and the connections of a certificate it comes to revoke are closed (default: none)")
	durationFlag(fs, "tls-crl-interval", "how often to look whether the --tls-crl file changed, a `duration`", &c.crlInterval, nimbus.DefaultCRLInterval, 100*time.Millisecond)
}

// certOptions sets the certificate options of opts from cfg: the certificate files nimbus
// serves with, for their expiry, and the revocation list.
func certOptions(cfg config, opts *nimbus.Options) error {
	if cfg.insecure {
		if cfg.access.crl != "" {
			return fmt.Errorf("--tls-crl %s: --insecure checks no certificates", cfg.access.crl)
		}
		return nil
	}
	if cfg.access.crl != "" {
		crl, err := pki.LoadRevocationFile(cfg.access.crl, cfg.tlsCA)
		if err != nil {
			return fmt.Errorf("--tls-crl: %w (naplesctl certs --revoke writes one)", err)
		}
		opts.CRL, opts.CRLInterval = crl, cfg.access.crlInterval
	}
	e, err := pki.ReadExpiry(pki.CertFile{Use: pki.UseServer, Path: cfg.tlsCert}, pki.CertFile{Use: pki.UseCA, Path: cfg.tlsCA})
	if err != nil {
		return fmt.Errorf("loading TLS credentials: %w", err)
	}
	opts.Certificates, opts.CertificateWarning = e, cfg.access.expiryWarning
	return nil
}

// shareSocket gives the unix socket of a, which nimbus listens on, to --socket-group with
// mode 0660, so that the group's members (operators with naplesctl) reach it. The
// default group missing leaves the socket as it is, which is logged; a group the command
// line names must exist. A tcp address is left alone.
func (c accessConfig) shareSocket(a address.Address, log *slog.Logger) error {
	if a.Network != "unix" || c.socketGroup == "" {
		return nil
	}
	g, err := user.LookupGroup(c.socketGroup)
	if _, unknown := errors.AsType[user.UnknownGroupError](err); unknown && !c.socketGroupSet {
		log.Info("the socket group does not exist; the socket stays nimbus's user's alone", "group", c.socketGroup, "socket", a.Addr)
		return nil
	}
	if err != nil {
		return fmt.Errorf("--socket-group %q: %w", c.socketGroup, err)
	}
	gid, err := strconv.Atoi(g.Gid)
	if err != nil {
		return fmt.Errorf("--socket-group %q: gid %q: %w", c.socketGroup, g.Gid, err)
	}
	if err := os.Chown(a.Addr, -1, gid); err != nil {
		return fmt.Errorf("--socket-group %q: giving %s to the group (nimbus's user must be a member): %w", c.socketGroup, a.Addr, err)
	}
	if err := os.Chmod(a.Addr, groupSocketMode); err != nil {
		return fmt.Errorf("--socket-group %q: setting the mode of %s: %w", c.socketGroup, a.Addr, err)
	}
	return nil
}

// serverCertificate returns an error naming path when leaf, nimbus's certificate, is not
// one for a server: a node's or publisher's certificate, which every client refuses.
func serverCertificate(path string, leaf *x509.Certificate) error {
	if len(leaf.ExtKeyUsage) == 0 || slices.ContainsFunc(leaf.ExtKeyUsage, func(u x509.ExtKeyUsage) bool {
		return u == x509.ExtKeyUsageServerAuth || u == x509.ExtKeyUsageAny
	}) {
		return nil
	}
	what := fmt.Sprintf("%q", leaf.Subject.CommonName)
	if id, err := pki.IdentityOf(leaf); err == nil {
		what = id.String()
	}
	return fmt.Errorf("--tls-cert %s: the certificate of %s is not a server certificate (its extended key usage lacks server authentication); give nimbus.crt or replica-NAME.crt of naplesctl certs", path, what)
}
