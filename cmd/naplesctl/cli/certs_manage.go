package cli

import (
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/naplesnet/naples/internal/exitstatus"
	"github.com/naplesnet/naples/internal/pki"
)

// crlFile is the name of the CA's revocation list in --dir, beside ca.crt.
const crlFile = "ca.crl"

// Modes certs checks files and directories against, and gives them with --fix-permissions.
const (
	// writableByOthers are the bits that let group or others write.
	writableByOthers = 0o022
	// caKeyPrivate are the bits a CA's key must not have: any access by group or others.
	// keyPrivate are those of another key: any access by others, and the group's but
	// reading, which lets nimbus's group read its key where it runs (deploy/README.md).
	caKeyPrivate = 0o077
	keyPrivate   = 0o037
	// dirMode is a private directory's mode, and dirGroupMode that of one whose group
	// reads it.
	dirMode      = 0o700
	dirGroupMode = 0o750
	// keyMode is a key's mode, and keyGroupMode that of one, not a CA's, whose group
	// reads it.
	keyMode      = 0o600
	keyGroupMode = 0o640
)

// checkPermissions refuses, or with fix mends, a --dir (or its etcd subdirectory) that
// group or others may write, a CA key they may read or write, another key others may
// read or write or the group write, and a certificate or revocation list they may write:
// whoever can read a key or replace a file can impersonate nimbus or a node. A key the
// group may read keeps that when mended, as a directory does, unless it is a CA's. It
// says what it mended on w. A dir that does not exist yet is fine: certs creates it
// private.
func checkPermissions(w io.Writer, dir string, fix bool) error {
	var problems []string
	check := func(path string, mode fs.FileMode, bad fs.FileMode, want fs.FileMode, what string) error {
		if mode.Perm()&bad == 0 {
			return nil
		}
		if !fix {
			problems = append(problems, fmt.Sprintf("%s %s has mode %04o: %s; chmod %04o %s", what, path, mode.Perm(), whoMay(mode, bad), want, path))
			return nil
		}
		if err := os.Chmod(path, want); err != nil {
			return fmt.Errorf("fixing the mode of %s: %w", path, err)
		}
		fmt.Fprintf(w, "fixed   %s: mode %04o, was %04o\n", path, want, mode.Perm())
		return nil
	}
	for _, d := range []string{dir, filepath.Join(dir, etcdDir)} {
		fi, err := os.Stat(d)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("checking %s: %w", d, err)
		}
		if !fi.IsDir() {
			return exitstatus.Mark(fmt.Errorf("--dir: %s is not a directory", d))
		}
		want := fs.FileMode(dirMode)
		if fi.Mode().Perm()&0o040 != 0 {
			want = dirGroupMode
		}
		if err := check(d, fi.Mode(), writableByOthers, want, "directory"); err != nil {
			return err
		}
		entries, err := os.ReadDir(d)
		if err != nil {
			return fmt.Errorf("checking %s: %w", d, err)
		}
		for _, e := range entries {
			if e.IsDir() {
				continue
			}
			path := filepath.Join(d, e.Name())
			fi, err := os.Stat(path)
			if err != nil {
				return fmt.Errorf("checking %s: %w", path, err)
			}
			switch {
			case e.Name() == caFile+".key":
				err = check(path, fi.Mode(), caKeyPrivate, keyMode, "CA key")
			case filepath.Ext(e.Name()) == ".key":
				want := fs.FileMode(keyMode)
				if fi.Mode().Perm()&0o040 != 0 {
					want = keyGroupMode
				}
				err = check(path, fi.Mode(), keyPrivate, want, "key")
			case filepath.Ext(e.Name()) == ".crt", filepath.Ext(e.Name()) == ".crl":
				err = check(path, fi.Mode(), writableByOthers, fi.Mode().Perm()&^writableByOthers, "certificate file")
			}
			if err != nil {
				return err
			}
		}
	}
	if len(problems) > 0 {
		return exitstatus.Mark(fmt.Errorf("refusing --dir %s: %s (or give --fix-permissions)", dir, strings.Join(problems, "; ")))
	}
	return nil
}

// whoMay says who may do what mode allows of bad: "group and others may write it".
func whoMay(mode, bad fs.FileMode) string {
	var who []string
	if mode.Perm()&bad&0o070 != 0 {
		who = append(who, "group")
	}
	if mode.Perm()&bad&0o007 != 0 {
		who = append(who, "others")
	}
	what := "write"
	if mode.Perm()&bad&0o044 != 0 {
		what = "read or write"
	}
	return fmt.Sprintf("%s may %s it", strings.Join(who, " and "), what)
}

// renewCerts reissues the certificates of --dir, and of its etcd subdirectory with
// etcd's CA, that expire within o.renewWithin, saying what it renewed.
func (c *cli) renewCerts(o certsOptions) error {
	if o.renewWithin <= 0 {
		return exitstatus.Mark(fmt.Errorf("--renew-within %v: must be positive", o.renewWithin))
	}
	dirs := []string{o.dir}
	if _, err := os.Stat(filepath.Join(o.dir, etcdDir, caFile+".crt")); err == nil {
		dirs = append(dirs, filepath.Join(o.dir, etcdDir))
	}
	for _, d := range dirs {
		if err := c.renewDir(d, o.renewWithin); err != nil {
			return err
		}
	}
	return nil
}

// renewDir reissues, with the CA of dir, the certificates of dir that expire within
// within.
func (c *cli) renewDir(dir string, within time.Duration) error {
	caCert, caKey := pairPaths(dir, caFile)
	ca, err := pki.LoadCA(caCert, caKey)
	if err != nil {
		return fmt.Errorf("renewing the certificates of %s: %w", dir, err)
	}
	now := c.now()
	if ca.Cert.NotAfter.Sub(now) <= within {
		fmt.Fprintf(c.stderr, "warning: the CA %s expires on %s: certificates it renews expire with it; make a new CA and roll it out before then\n",
			caCert, ca.Cert.NotAfter.Format(time.DateOnly))
	}
	names, err := filepath.Glob(filepath.Join(dir, "*.crt"))
	if err != nil {
		return err
	}
	renewed, total := 0, 0
	for _, certPath := range names {
		name := strings.TrimSuffix(filepath.Base(certPath), ".crt")
		if name == caFile {
			continue
		}
		_, keyPath := pairPaths(dir, name)
		if _, err := os.Stat(keyPath); err != nil {
			fmt.Fprintf(c.stderr, "skipped %s: no key %s beside it\n", certPath, keyPath)
			continue
		}
		kp, err := pki.LoadKeyPair(certPath, keyPath)
		if err != nil {
			return err
		}
		total++
		if kp.Cert.NotAfter.Sub(now) > within {
			continue
		}
		fresh, err := ca.Renew(kp.Cert, pki.CertOptions{Now: c.now})
		if err != nil {
			return fmt.Errorf("renewing %s: %w", certPath, err)
		}
		if err := fresh.ReplaceFiles(certPath, keyPath); err != nil {
			return err
		}
		renewed++
		fmt.Fprintf(c.stdout, "renewed %s, %s: %s, valid until %s (was %s)\n", certPath, keyPath, describeCert(fresh.Cert),
			fresh.Cert.NotAfter.Format(time.DateOnly), kp.Cert.NotAfter.Format(time.DateOnly))
	}
	fmt.Fprintf(c.stdout, "renewed %d of %d certificates in %s, those that expire within %v; copy them over the old ones (the key last): nimbus and the agents load them without a restart\n", renewed, total, dir, within)
	return nil
}

// describeCert names a certificate as certs's lines do: its naples identity, or else its
// common name.
func describeCert(cert *x509.Certificate) string {
	if id, err := pki.IdentityOf(cert); err == nil {
		return id.String() + " certificate"
	}
	return fmt.Sprintf("certificate %q", cert.Subject.CommonName)
}

// revokeCerts adds the certificates of the pairs o.revoke names in --dir to the CA's
// revocation list, DIR/ca.crl, making it when there is none.
func (c *cli) revokeCerts(o certsOptions) error {
	caCert, caKey := pairPaths(o.dir, caFile)
	ca, err := pki.LoadCA(caCert, caKey)
	if err != nil {
		return fmt.Errorf("revoking: %w", err)
	}
	var certs []*x509.Certificate
	for _, name := range o.revoke {
		if name == "" || name == caFile || strings.ContainsAny(name, `/\`) {
			return exitstatus.Mark(fmt.Errorf("--revoke: %q: want the name of a pair in --dir other than %s, such as host-a for host-a.crt", name, caFile))
		}
		certPath, _ := pairPaths(o.dir, name)
		chain, err := pki.ReadCertificates(certPath)
		if err != nil {
			return exitstatus.Mark(fmt.Errorf("--revoke %s: %w", name, err))
		}
		certs = append(certs, chain[0])
	}
	crlPath := filepath.Join(o.dir, crlFile)
	var prev *x509.RevocationList
	if _, err := os.Stat(crlPath); err == nil {
		if prev, err = pki.ReadRevocationList(crlPath, []*x509.Certificate{ca.Cert}); err != nil {
			return err
		}
	}
	data, err := ca.RevocationList(prev, certs, c.now())
	if err != nil {
		return err
	}
	if err := pki.WriteRevocationList(crlPath, data); err != nil {
		return err
	}
	for i, cert := range certs {
		certPath, _ := pairPaths(o.dir, o.revoke[i])
		was := ""
		if prev != nil && slices.ContainsFunc(prev.RevokedCertificateEntries, func(e x509.RevocationListEntry) bool { return e.SerialNumber.Cmp(cert.SerialNumber) == 0 }) {
			was = ", revoked already"
		}
		fmt.Fprintf(c.stdout, "revoked %s: %s, serial %s%s\n", certPath, describeCert(cert), cert.SerialNumber, was)
	}
	fmt.Fprintf(c.stdout, "wrote   %s: nimbus with --tls-crl %s refuses these certificates once it reads it again\n", crlPath, crlPath)
	return nil
}
