package cli

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/naplesnet/naples/internal/pki"
)

// ctlErr runs naplesctl in-process with the environment vars and returns its stdout and
// stderr.
func ctlErr(t *testing.T, vars map[string]string, args ...string) (string, string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	c := &cli{stdin: strings.NewReader(""), stdout: &out, stderr: &errOut, now: time.Now}
	err := c.run(t.Context(), args, func(k string) string { return vars[k] })
	return out.String(), errOut.String(), err
}

// reissue replaces the pair name.crt, name.key of dir with one from issue, signed by the
// CA of dir.
func reissue(t *testing.T, dir, name string, issue func(ca *pki.CA) (pki.KeyPair, error)) pki.KeyPair {
	t.Helper()
	ca, err := pki.LoadCA(filepath.Join(dir, "ca.crt"), filepath.Join(dir, "ca.key"))
	if err != nil {
		t.Fatal(err)
	}
	kp, err := issue(ca)
	if err != nil {
		t.Fatal(err)
	}
	if err := kp.WriteFiles(filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")); err != nil {
		t.Fatal(err)
	}
	return kp
}

// TestClientCertificateExpiryWarning talks to nimbus with a publisher certificate that
// expires in 5 days: the command works and warns on stderr, naming the file.
func TestClientCertificateExpiryWarning(t *testing.T) {
	home := t.TempDir()
	dir := filepath.Join(home, DefaultPKIDir)
	vars := map[string]string{"HOME": home}
	if _, err := tlsCtl(t, vars, "", "certs"); err != nil {
		t.Fatalf("certs: %v", err)
	}
	vars[ServerEnv] = startTLSNimbus(t, dir)
	if _, stderr, err := ctlErr(t, vars, "get", "routes"); err != nil || strings.Contains(stderr, "warning") {
		t.Fatalf("get routes with a 5-year certificate = %v, stderr %q; want no error and no warning", err, stderr)
	}
	kp := reissue(t, dir, "publisher", func(ca *pki.CA) (pki.KeyPair, error) {
		return ca.IssuePublisher("admin", pki.CertOptions{Validity: 5*24*time.Hour + time.Hour})
	})
	_, stderr, err := ctlErr(t, vars, "get", "routes")
	want := "warning: certificate " + filepath.Join(dir, "publisher.crt") + " expires in 5 days (" + kp.Cert.NotAfter.UTC().Format(time.RFC3339) + "); naplesctl certs --renew renews it\n"
	if err != nil || !strings.HasPrefix(stderr, want) {
		t.Fatalf("get routes with a certificate that expires in 5 days = %v, stderr %q; want no error and %q", err, stderr, want)
	}
}
