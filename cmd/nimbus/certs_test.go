package main

import (
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/naplesnet/naples/internal/pki"
	"github.com/naplesnet/naples/internal/telemetry/telemetrytest"
)

// TestCertificateExpiry serves with a server certificate that expires in 10 days: the
// expiry gauge holds its NotAfter and the CA's, and /readyz answers 200 with a warning
// naming the file, until --tls-expiry-warning is shorter than what is left.
func TestCertificateExpiry(t *testing.T) {
	dir := t.TempDir()
	ca, err := pki.NewCA(pki.CAOptions{})
	if err != nil {
		t.Fatal(err)
	}
	server, err := ca.IssueServer(nil, pki.CertOptions{Validity: 10*24*time.Hour + time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	p := func(name string) string { return filepath.Join(dir, name) }
	if err := ca.WriteFiles(p("ca.crt"), p("ca.key")); err != nil {
		t.Fatal(err)
	}
	if err := server.WriteFiles(p("nimbus.crt"), p("nimbus.key")); err != nil {
		t.Fatal(err)
	}
	args := []string{"--listen", "unix://" + p("n.sock"), "--ephemeral", "--metrics", "127.0.0.1:0",
		"--tls-cert", p("nimbus.crt"), "--tls-key", p("nimbus.key"), "--tls-ca", p("ca.crt")}
	url, stop := runNimbus(t, args...)
	base := strings.TrimSuffix(url, "/metrics")

	_, body := telemetrytest.Get(t, url)
	m := telemetrytest.Parse(t, body)
	for series, want := range map[string]time.Time{
		`naples_nimbus_tls_certificate_expiry_seconds{certificate="server",file="` + p("nimbus.crt") + `"}`: server.Cert.NotAfter,
		`naples_nimbus_tls_certificate_expiry_seconds{certificate="ca",file="` + p("ca.crt") + `"}`:         ca.Cert.NotAfter,
	} {
		if v, ok := m[series]; !ok || v != float64(want.Unix()) {
			t.Errorf("%s = %v (present %v), want %d", series, v, ok, want.Unix())
		}
	}
	want := "warning: certificate " + p("nimbus.crt") + " expires in 10 days (" + server.Cert.NotAfter.UTC().Format(time.RFC3339) + ")"
	deadline := time.Now().Add(10 * time.Second)
	for {
		code, body := telemetrytest.Get(t, base+"/readyz")
		if code == http.StatusOK {
			if body != "ready\n"+want+"\n" {
				t.Errorf("/readyz = %q, want ready and %q", body, want)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz = %d %q, want 200 within 10s", code, body)
		}
		time.Sleep(10 * time.Millisecond)
	}
	stop()

	url, _ = runNimbus(t, append(args, "--tls-expiry-warning", strconv.Itoa(9*24)+"h")...)
	deadline = time.Now().Add(10 * time.Second)
	for {
		code, body := telemetrytest.Get(t, strings.TrimSuffix(url, "/metrics")+"/readyz")
		if code == http.StatusOK {
			if body != "ready\n" {
				t.Errorf("/readyz with --tls-expiry-warning 216h = %q, want no warning", body)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz = %d %q, want 200 within 10s", code, body)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
