package main

import (
	"bytes"
	"crypto/tls"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/naplesnet/naples/internal/pki"
)

func TestParseUIFlags(t *testing.T) {
	cfg, err := parseFlags([]string{"--ui", "127.0.0.1:8443", "--ui-max-objects", "50", "--ui-update-interval", "1s"}, io.Discard, noEnv)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.ui.addr != "127.0.0.1:8443" || cfg.ui.opts.MaxObjects != 50 || cfg.ui.opts.UpdateInterval != time.Second || cfg.ui.opts.MaxNodes != 100 {
		t.Errorf("parseFlags = %+v, want the console on 127.0.0.1:8443, 50 objects, 100 nodes, 1s", cfg.ui)
	}
	for _, args := range [][]string{
		{"--ui", "8443"},
		{"--ui-max-clients", "0"},
		{"--ui-max-nodes", "-3"},
		{"--ui-update-interval", "soon"},
	} {
		var stderr bytes.Buffer
		if _, err := parseFlags(args, &stderr, noEnv); err == nil || !strings.Contains(stderr.String(), `"`+args[0]+`"`) {
			t.Errorf("parseFlags(%q) = %v, stderr %q; want an error naming %s", args, err, stderr.String(), args[0])
		}
	}
}

// get fetches the URL with the client and returns the status code and body.
func get(t *testing.T, c *http.Client, url string) (int, string, error) {
	t.Helper()
	resp, err := c.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

func TestRunServesUIWithClientCertificates(t *testing.T) {
	dir := t.TempDir()
	writePKI(t, dir, "host-a")
	url, _ := runNimbusLogging(t, "serving the web console", "--listen", "unix://"+filepath.Join(dir, "n.sock"), "--ephemeral",
		"--tls-cert", filepath.Join(dir, "nimbus.crt"), "--tls-key", filepath.Join(dir, "nimbus.key"),
		"--tls-ca", filepath.Join(dir, "ca.crt"), "--ui", "127.0.0.1:0")
	if !strings.HasPrefix(url, "https://") {
		t.Fatalf("console URL %q, want https", url)
	}

	// Any role may read: a node's certificate will do.
	cfg, err := pki.ClientConfig(filepath.Join(dir, "host-a.crt"), filepath.Join(dir, "host-a.key"), filepath.Join(dir, "ca.crt"), "")
	if err != nil {
		t.Fatal(err)
	}
	withCert := &http.Client{Transport: &http.Transport{TLSClientConfig: cfg, ForceAttemptHTTP2: true}, Timeout: 10 * time.Second}
	defer withCert.CloseIdleConnections()
	for _, page := range []string{"", "nodes", "flows"} {
		code, body, err := get(t, withCert, url+page)
		if err != nil || code != http.StatusOK || !strings.Contains(body, "read-only") {
			t.Errorf("GET %s with a client certificate = %d %v, want 200 and the page", url+page, code, err)
		}
	}
	// Without a certificate the handshake fails.
	noCert := cfg.Clone()
	noCert.Certificates, noCert.GetClientCertificate = nil, nil
	bare := &http.Client{Transport: &http.Transport{TLSClientConfig: noCert}, Timeout: 10 * time.Second}
	defer bare.CloseIdleConnections()
	if code, _, err := get(t, bare, url); err == nil {
		t.Errorf("GET %s without a client certificate = %d, want the handshake refused", url, code)
	}
	// Nor does a certificate of another CA.
	other := t.TempDir()
	writePKI(t, other, "host-a")
	stranger, err := tls.LoadX509KeyPair(filepath.Join(other, "host-a.crt"), filepath.Join(other, "host-a.key"))
	if err != nil {
		t.Fatal(err)
	}
	foreign := cfg.Clone()
	foreign.Certificates, foreign.GetClientCertificate = []tls.Certificate{stranger}, nil
	alien := &http.Client{Transport: &http.Transport{TLSClientConfig: foreign}, Timeout: 10 * time.Second}
	defer alien.CloseIdleConnections()
	if code, _, err := get(t, alien, url); err == nil {
		t.Errorf("GET %s with another CA's certificate = %d, want the handshake refused", url, code)
	}
}

// TestRunUIRefusesRevokedCertificates serves the console with --tls-crl: a certificate
// the list revokes is refused, as the API refuses it, and another is served.
func TestRunUIRefusesRevokedCertificates(t *testing.T) {
	dir := t.TempDir()
	p := func(name string) string { return filepath.Join(dir, name) }
	writePKI(t, dir, "host-a")
	ca := addNode(t, dir, "host-b")
	hostA, err := pki.ReadCertificates(p("host-a.crt"))
	if err != nil {
		t.Fatal(err)
	}
	crl, err := ca.RevocationList(nil, hostA[:1], time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := pki.WriteRevocationList(p("ca.crl"), crl); err != nil {
		t.Fatal(err)
	}
	url, _ := runNimbusLogging(t, "serving the web console", "--listen", "unix://"+p("n.sock"), "--ephemeral",
		"--tls-cert", p("nimbus.crt"), "--tls-key", p("nimbus.key"), "--tls-ca", p("ca.crt"),
		"--tls-crl", p("ca.crl"), "--ui", "127.0.0.1:0")
	for _, tc := range []struct {
		node    string
		refused bool
	}{{"host-a", true}, {"host-b", false}} {
		cfg, err := pki.ClientConfig(p(tc.node+".crt"), p(tc.node+".key"), p("ca.crt"), "")
		if err != nil {
			t.Fatal(err)
		}
		client := &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}, Timeout: 10 * time.Second}
		code, _, err := get(t, client, url)
		client.CloseIdleConnections()
		switch {
		case tc.refused && err == nil:
			t.Errorf("GET %s with %s's revoked certificate = %d, want the handshake refused", url, tc.node, code)
		case !tc.refused && (err != nil || code != http.StatusOK):
			t.Errorf("GET %s with %s's certificate = %d %v, want 200", url, tc.node, code, err)
		}
	}
}

func TestRunServesUIPlainWithInsecure(t *testing.T) {
	dir := t.TempDir()
	url, _ := runNimbusLogging(t, "serving the web console", "--listen", "unix://"+filepath.Join(dir, "n.sock"), "--ephemeral",
		"--insecure", "--ui", "127.0.0.1:0")
	if !strings.HasPrefix(url, "http://") {
		t.Fatalf("console URL %q, want http with --insecure", url)
	}
	c := &http.Client{Timeout: 10 * time.Second}
	defer c.CloseIdleConnections()
	if code, body, err := get(t, c, url); err != nil || code != http.StatusOK || !strings.Contains(body, "Propagation") {
		t.Errorf("GET %s = %d %v, want 200 and the matrix", url, code, err)
	}
}
