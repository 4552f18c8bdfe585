package cli

import (
	"crypto"
	"crypto/x509"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/naplesnet/naples/internal/pki"
	"github.com/naplesnet/naples/nimbus"
)

// mode returns the permission bits of path.
func mode(t *testing.T, path string) os.FileMode {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Mode().Perm()
}

func TestCertsRefusesLoosePermissions(t *testing.T) {
	for _, tc := range []struct {
		name string
		// loosen makes one path of dir too open and returns it.
		loosen  func(t *testing.T, dir string) string
		want    string
		wantFix os.FileMode
	}{
		{name: "world-writable dir", loosen: func(t *testing.T, dir string) string { return chmod(t, dir, 0o777) }, want: "has mode 0777: group and others may write it", wantFix: 0o750},
		{name: "group-writable dir", loosen: func(t *testing.T, dir string) string { return chmod(t, dir, 0o770) }, want: "has mode 0770: group may write it", wantFix: 0o750},
		{name: "dir writable by others only", loosen: func(t *testing.T, dir string) string { return chmod(t, dir, 0o703) }, want: "has mode 0703: others may write it", wantFix: 0o700},
		{name: "group-writable key", loosen: func(t *testing.T, dir string) string { return chmod(t, filepath.Join(dir, "host-a.key"), 0o660) }, want: "has mode 0660: group may write it", wantFix: 0o640},
		{name: "world-readable key", loosen: func(t *testing.T, dir string) string { return chmod(t, filepath.Join(dir, "nimbus.key"), 0o604) }, want: "has mode 0604: others may read or write it", wantFix: 0o600},
		{name: "group-readable CA key", loosen: func(t *testing.T, dir string) string { return chmod(t, filepath.Join(dir, "ca.key"), 0o640) }, want: "has mode 0640: group may read or write it", wantFix: 0o600},
		{name: "world-readable CA key", loosen: func(t *testing.T, dir string) string { return chmod(t, filepath.Join(dir, "ca.key"), 0o644) }, want: "has mode 0644: group and others may read or write it", wantFix: 0o600},
		{name: "group-writable certificate", loosen: func(t *testing.T, dir string) string { return chmod(t, filepath.Join(dir, "ca.crt"), 0o664) }, want: "has mode 0664: group may write it", wantFix: 0o644},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "pki")
			if _, err := tlsCtl(t, nil, "", "certs", "--dir", dir, "--nodes", "host-a"); err != nil {
				t.Fatal(err)
			}
			path := tc.loosen(t, dir)
			before := mode(t, path)
			_, err := tlsCtl(t, nil, "", "certs", "--dir", dir, "--nodes", "host-b")
			if err == nil || !strings.Contains(err.Error(), path+" "+tc.want) || !strings.Contains(err.Error(), "--fix-permissions") {
				t.Fatalf("certs with %s = %v, want an error naming %s, %q and --fix-permissions", tc.name, err, path, tc.want)
			}
			if _, err := os.Stat(filepath.Join(dir, "host-b.crt")); err == nil {
				t.Error("the refused run wrote host-b.crt")
			}
			if got := mode(t, path); got != before {
				t.Errorf("the refused run changed %s to %04o", path, got)
			}
			out, err := tlsCtl(t, nil, "", "certs", "--dir", dir, "--nodes", "host-b", "--fix-permissions")
			if err != nil || !strings.Contains(out, "fixed   "+path) {
				t.Fatalf("certs --fix-permissions = %q, %v; want it to say it fixed %s", out, err, path)
			}
			if got := mode(t, path); got != tc.wantFix {
				t.Errorf("after --fix-permissions %s has mode %04o, want %04o", path, got, tc.wantFix)
			}
			if _, err := os.Stat(filepath.Join(dir, "host-b.crt")); err != nil {
				t.Errorf("certs --fix-permissions did not go on to write host-b.crt: %v", err)
			}
		})
	}
}

// TestCertsKeepsGroupReadableKeys runs certs on a directory laid out as deploy/README.md
// lays out one on a nimbus machine, the directory 0750 and nimbus's key 0640 for the
// group nimbus runs as: certs adds a node without refusing it, and --fix-permissions
// leaves both as they are, while it makes a group-readable CA key private.
func TestCertsKeepsGroupReadableKeys(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "pki")
	if _, err := tlsCtl(t, nil, "", "certs", "--dir", dir); err != nil {
		t.Fatal(err)
	}
	chmod(t, dir, 0o750)
	key := chmod(t, filepath.Join(dir, "nimbus.key"), 0o640)
	if out, err := tlsCtl(t, nil, "", "certs", "--dir", dir, "--nodes", "host-a"); err != nil || strings.Contains(out, "fixed") {
		t.Fatalf("certs with a group-readable nimbus.key = %q, %v; want it to add host-a and fix nothing", out, err)
	}
	caKey := chmod(t, filepath.Join(dir, "ca.key"), 0o640)
	out, err := tlsCtl(t, nil, "", "certs", "--dir", dir, "--fix-permissions")
	if err != nil || strings.Contains(out, "fixed   "+key) || !strings.Contains(out, "fixed   "+caKey) {
		t.Fatalf("certs --fix-permissions = %q, %v; want %s fixed and %s not", out, err, caKey, key)
	}
	for path, want := range map[string]os.FileMode{dir: 0o750, key: 0o640, caKey: 0o600, filepath.Join(dir, "host-a.key"): 0o600} {
		if got := mode(t, path); got != want {
			t.Errorf("%s has mode %04o, want %04o", path, got, want)
		}
	}
}

// chmod sets the mode of path and returns path.
func chmod(t *testing.T, path string, m os.FileMode) string {
	t.Helper()
	if err := os.Chmod(path, m); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestCertsRenew renews the certificates of a directory that expire within the window:
// those, and only those, get a new key and serial, the same names, and verify against
// the same CA; a client with the renewed certificate talks to nimbus without a warning.
func TestCertsRenew(t *testing.T) {
	home := t.TempDir()
	dir := filepath.Join(home, DefaultPKIDir)
	vars := map[string]string{"HOME": home}
	if _, err := tlsCtl(t, vars, "", "certs", "--nodes", "host-a,host-b", "--server-hosts", "nimbus.example,192.0.2.1"); err != nil {
		t.Fatal(err)
	}
	short := pki.CertOptions{Validity: 5*24*time.Hour + time.Hour}
	old := map[string]pki.KeyPair{
		"host-a": reissue(t, dir, "host-a", func(ca *pki.CA) (pki.KeyPair, error) { return ca.IssueNode("host-a", short) }),
		"nimbus": reissue(t, dir, "nimbus", func(ca *pki.CA) (pki.KeyPair, error) {
			return ca.IssueServer([]string{"nimbus.example", "192.0.2.1"}, short)
		}),
		"publisher": reissue(t, dir, "publisher", func(ca *pki.CA) (pki.KeyPair, error) { return ca.IssuePublisher("admin", short) }),
	}
	hostB := loadPair(t, dir, "host-b")
	caBefore, err := os.ReadFile(filepath.Join(dir, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}

	// nimbus's key is its group's to read, as deploy/README.md has it on a nimbus machine:
	// the renewed one stays so.
	chmod(t, filepath.Join(dir, "nimbus.key"), 0o640)

	// Nothing expires within a day.
	out, err := tlsCtl(t, vars, "", "certs", "--renew", "--renew-within", "24h")
	if err != nil || !strings.Contains(out, "renewed 0 of 4 certificates") {
		t.Fatalf("certs --renew --renew-within 24h = %q, %v; want nothing renewed", out, err)
	}
	out, err = tlsCtl(t, vars, "", "certs", "--renew")
	if err != nil {
		t.Fatalf("certs --renew: %v", err)
	}
	for _, want := range []string{
		"renewed " + filepath.Join(dir, "host-a.crt") + ", " + filepath.Join(dir, "host-a.key") + `: node "host-a" certificate`,
		"renewed " + filepath.Join(dir, "nimbus.crt"),
		"renewed " + filepath.Join(dir, "publisher.crt") + ", " + filepath.Join(dir, "publisher.key") + `: publisher "admin" certificate`,
		"renewed 3 of 4 certificates in " + dir,
		"nimbus and the agents load them without a restart",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("certs --renew output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "host-b.crt") {
		t.Errorf("certs --renew renewed host-b, which expires in 5 years:\n%s", out)
	}
	ca, err := pki.LoadCA(filepath.Join(dir, "ca.crt"), filepath.Join(dir, "ca.key"))
	if err != nil {
		t.Fatal(err)
	}
	if caAfter, _ := os.ReadFile(filepath.Join(dir, "ca.crt")); string(caAfter) != string(caBefore) {
		t.Error("certs --renew replaced the CA")
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	for name, was := range old {
		kp := loadPair(t, dir, name)
		switch {
		case kp.Cert.SerialNumber.Cmp(was.Cert.SerialNumber) == 0:
			t.Errorf("%s: serial unchanged", name)
		case kp.Cert.PublicKey.(interface{ Equal(crypto.PublicKey) bool }).Equal(was.Cert.PublicKey):
			t.Errorf("%s: key unchanged", name)
		case !kp.Cert.NotAfter.After(time.Now().Add(4 * 365 * 24 * time.Hour)):
			t.Errorf("%s: valid until %v, want five years", name, kp.Cert.NotAfter)
		case kp.Cert.Subject.String() != was.Cert.Subject.String() || !equalStrings(kp.Cert.DNSNames, was.Cert.DNSNames) || len(kp.Cert.IPAddresses) != len(was.Cert.IPAddresses):
			t.Errorf("%s: subject %v, names %v %v; want %v, %v %v", name, kp.Cert.Subject, kp.Cert.DNSNames, kp.Cert.IPAddresses, was.Cert.Subject, was.Cert.DNSNames, was.Cert.IPAddresses)
		}
		if _, err := kp.Cert.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: kp.Cert.ExtKeyUsage}); err != nil {
			t.Errorf("%s: renewed certificate does not verify against the CA: %v", name, err)
		}
		want := os.FileMode(0o600)
		if name == "nimbus" {
			want = 0o640
		}
		if got := mode(t, filepath.Join(dir, name+".key")); got != want {
			t.Errorf("%s.key: mode %04o, want %04o", name, got, want)
		}
	}
	if kp := loadPair(t, dir, "host-b"); kp.Cert.SerialNumber.Cmp(hostB.Cert.SerialNumber) != 0 {
		t.Error("host-b was renewed")
	}
	if err := loadPair(t, dir, "nimbus").Cert.VerifyHostname("192.0.2.1"); err != nil {
		t.Errorf("renewed server certificate lost an IP address: %v", err)
	}

	// The renewed server and publisher certificates serve and dial, without a warning.
	vars[ServerEnv] = startTLSNimbus(t, dir)
	if _, stderr, err := ctlErr(t, vars, "get", "routes"); err != nil || strings.Contains(stderr, "warning") {
		t.Errorf("get routes with renewed certificates = %v, stderr %q; want no error and no warning", err, stderr)
	}

	// --renew is for what --dir holds.
	if _, err := tlsCtl(t, vars, "", "certs", "--renew", "--nodes", "host-c"); err == nil || !strings.Contains(err.Error(), "--nodes") {
		t.Errorf("certs --renew --nodes host-c = %v, want an error naming --nodes", err)
	}
	if _, err := tlsCtl(t, vars, "", "certs", "--renew-within", "1h"); err == nil || !strings.Contains(err.Error(), "--renew-within") {
		t.Errorf("certs --renew-within without --renew = %v, want an error naming --renew-within", err)
	}
}

// loadPair loads the pair name.crt, name.key of dir.
func loadPair(t *testing.T, dir, name string) pki.KeyPair {
	t.Helper()
	kp, err := pki.LoadKeyPair(filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key"))
	if err != nil {
		t.Fatal(err)
	}
	return kp
}

// equalStrings reports whether a and b hold the same strings in the same order.
func equalStrings(a, b []string) bool {
	return strings.Join(a, "\x00") == strings.Join(b, "\x00")
}

// TestCertsRevoke adds certificates to DIR/ca.crl: the list is signed by the CA, keeps
// what it revoked before and counts up; nimbus refuses a revoked publisher.
func TestCertsRevoke(t *testing.T) {
	home := t.TempDir()
	dir := filepath.Join(home, DefaultPKIDir)
	vars := map[string]string{"HOME": home}
	if _, err := tlsCtl(t, vars, "", "certs", "--nodes", "host-a,host-b"); err != nil {
		t.Fatal(err)
	}
	crlPath := filepath.Join(dir, "ca.crl")
	serial := func(name string) string { return loadPair(t, dir, name).Cert.SerialNumber.String() }
	out, err := tlsCtl(t, vars, "", "certs", "--revoke", "host-a")
	if err != nil || !strings.Contains(out, "revoked "+filepath.Join(dir, "host-a.crt")+`: node "host-a" certificate, serial `+serial("host-a")) ||
		!strings.Contains(out, "--tls-crl "+crlPath) {
		t.Fatalf("certs --revoke host-a = %q, %v; want it to name the certificate, its serial and --tls-crl %s", out, err, crlPath)
	}
	ca := loadPair(t, dir, "ca")
	revoked := func() (*x509.RevocationList, []string) {
		t.Helper()
		crl, err := pki.ReadRevocationList(crlPath, []*x509.Certificate{ca.Cert})
		if err != nil {
			t.Fatal(err)
		}
		var serials []string
		for _, e := range crl.RevokedCertificateEntries {
			serials = append(serials, e.SerialNumber.String())
		}
		return crl, serials
	}
	if crl, serials := revoked(); crl.Number.Int64() != 1 || !equalStrings(serials, []string{serial("host-a")}) {
		t.Errorf("ca.crl number %v revokes %q, want number 1 revoking host-a's %s", crl.Number, serials, serial("host-a"))
	}
	if mode(t, crlPath) != 0o644 {
		t.Errorf("ca.crl has mode %04o, want 0644", mode(t, crlPath))
	}
	out, err = tlsCtl(t, vars, "", "certs", "--revoke", "host-a,publisher")
	if err != nil || !strings.Contains(out, "revoked already") {
		t.Fatalf("certs --revoke host-a,publisher = %q, %v; want host-a revoked already", out, err)
	}
	if crl, serials := revoked(); crl.Number.Int64() != 2 || !equalStrings(serials, []string{serial("host-a"), serial("publisher")}) {
		t.Errorf("ca.crl number %v revokes %q, want number 2 revoking host-a and the publisher", crl.Number, serials)
	}
	// --renew and --renew-within with --revoke are refused rather than ignored, and the
	// list stays as it was.
	for _, extra := range [][]string{{"--renew"}, {"--renew-within", "48h"}} {
		args := append([]string{"certs", "--revoke", "host-b"}, extra...)
		if _, err := tlsCtl(t, vars, "", args...); err == nil || !strings.Contains(err.Error(), extra[0]) {
			t.Errorf("%s = %v, want an error naming %s", strings.Join(args, " "), err, extra[0])
		}
		if crl, serials := revoked(); crl.Number.Int64() != 2 || slices.Contains(serials, serial("host-b")) {
			t.Errorf("%s changed ca.crl: number %v revokes %q", strings.Join(args, " "), crl.Number, serials)
		}
	}
	for _, bad := range []string{"ca", "../x", "nope"} {
		if _, err := tlsCtl(t, vars, "", "certs", "--revoke", bad); err == nil || !strings.Contains(err.Error(), bad) {
			t.Errorf("certs --revoke %s = %v, want an error naming it", bad, err)
		}
	}

	// nimbus with the list refuses the revoked publisher certificate.
	crl, err := pki.LoadRevocationFile(crlPath, filepath.Join(dir, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	vars[ServerEnv] = startTLSNimbusAs(t, dir, "nimbus", nimbus.Options{CRL: crl})
	if _, err := tlsCtl(t, vars, "", "get", "routes"); status.Code(err) != codes.Unavailable {
		t.Errorf("get routes with a revoked publisher certificate = %v, want Unavailable", err)
	}
	if _, err := tlsCtl(t, vars, "", "get", "routes", "--tls-cert", filepath.Join(dir, "host-b.crt"), "--tls-key", filepath.Join(dir, "host-b.key")); status.Code(err) != codes.PermissionDenied {
		t.Errorf("get routes with host-b's certificate = %v, want PermissionDenied (verified, not revoked, not a publisher)", err)
	}
}
