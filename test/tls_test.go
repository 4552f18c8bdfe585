package test

import (
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/naplesnet/naples/internal/pki"
	"github.com/naplesnet/naples/internal/testns"
)

// TestAgentWithAnotherNodesCertificate runs host-a's agent with host-b's certificate:
// nimbus refuses its watch, so host-a's route never reaches the kernel and no status is
// reported for it.
func TestAgentWithAnotherNodesCertificate(t *testing.T) {
	c := newCluster(t)
	h := c.newHostWithCert(t, "host-a", "host-b")
	c.apply(t, toDC2)

	waitFor(t, "the agent to log its refused watch", func() bool {
		out, _ := os.ReadFile(h.agent.log)
		return strings.Contains(string(out), "PermissionDenied") && strings.Contains(string(out), `node \"host-b\" may not watch node \"host-a\"`)
	})
	if out, _ := os.ReadFile(c.nimbus.log); !strings.Contains(string(out), "permission denied") {
		t.Errorf("nimbus did not log the refusal:\n%s", out)
	}
	_, st, err := c.get(t, "route", "to-dc2")
	if err != nil {
		t.Fatal(err)
	}
	if ns := nodeStatus(st, "host-a"); ns != nil {
		t.Errorf("host-a reported %v with another node's certificate, want no status", ns)
	}
	// Table 100 does not even exist while nothing was programmed, which ip reports as an
	// error; either way the route must not be there.
	got, _ := exec.Command("ip", "-n", h.ns, "route", "show", "table", "100").CombinedOutput()
	if strings.Contains(string(got), "198.51.100.0/24") {
		t.Errorf("route programmed although the watch was refused:\n%s", got)
	}
}

// TestNaplesctlNeedsPublisherCertificate: naplesctl without TLS cannot reach nimbus, and
// with a node's certificate it may neither read nor write.
func TestNaplesctlNeedsPublisherCertificate(t *testing.T) {
	c := newCluster(t)
	c.certs(t, "host-a")

	_, err := c.ctl(t, "", "get", "routes", "--insecure")
	if err == nil || !strings.Contains(err.Error(), "unavailable") || !strings.Contains(err.Error(), "drop --insecure") {
		t.Errorf("plaintext naplesctl = %v, want nimbus unavailable and the flag that mends it", err)
	}
	waitFor(t, "nimbus to log the refused plaintext handshake", func() bool {
		out, _ := os.ReadFile(c.nimbus.log)
		return strings.Contains(string(out), "refused a TLS handshake") && strings.Contains(string(out), "the client speaks plaintext")
	})
	asNode := []string{"--tls-cert", c.file("host-a.crt"), "--tls-key", c.file("host-a.key")}
	_, err = c.ctl(t, toDC2, append([]string{"apply", "-f", "-"}, asNode...)...)
	if err == nil || !strings.Contains(err.Error(), `node "host-a" may not call Apply`) || !strings.Contains(err.Error(), "PermissionDenied") {
		t.Errorf("apply with a node certificate = %v, want PermissionDenied naming the node", err)
	}
	_, err = c.ctl(t, "", append([]string{"get", "routes"}, asNode...)...)
	if err == nil || !strings.Contains(err.Error(), "may not call List") {
		t.Errorf("get with a node certificate = %v, want PermissionDenied", err)
	}
	if _, _, err := c.get(t, "route", "to-dc2"); !errors.Is(err, errNotFound) {
		t.Errorf("get after the refused apply: err = %v, want not found", err)
	}
}

// TestNimbusPlaintextNeedsInsecure: nimbus without certificates does not start unless
// told --insecure, and then serves plaintext.
func TestNimbusPlaintextNeedsInsecure(t *testing.T) {
	testns.RequireRoot(t)
	dir := t.TempDir()
	server := "unix://" + filepath.Join(dir, "nimbus.sock")
	missing := filepath.Join(dir, "missing.crt")
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	out, err := exec.CommandContext(ctx, filepath.Join(bin, "nimbus"), "--listen", server, "--ephemeral", "--tls-cert", missing).CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 2 || !strings.Contains(string(out), missing) || !strings.Contains(string(out), "--insecure") {
		t.Fatalf("nimbus without certificates: %v\n%s\nwant exit status 2 (a configuration error) naming %s and --insecure", err, out, missing)
	}

	start(t, "nimbus", filepath.Join(bin, "nimbus"), "--listen", server, "--insecure", "--ephemeral")
	waitFor(t, "nimbus to listen", func() bool {
		conn, err := net.DialTimeout("unix", filepath.Join(dir, "nimbus.sock"), time.Second)
		if err == nil {
			conn.Close()
		}
		return err == nil
	})
	cmd := exec.CommandContext(ctx, filepath.Join(bin, "naplesctl"), "--server", server, "--insecure", "apply", "-f", "-")
	cmd.Stdin = strings.NewReader(toDC2)
	if out, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(out), "created") {
		t.Fatalf("plaintext apply to an --insecure nimbus: %v\n%s", err, out)
	}
}

// TestAgentLoadsRenewedCertificate writes a renewed certificate over host-a's files while
// its agent runs: the agent loads it without a restart, says so, and its expiry gauge
// follows; a new watch, after nimbus restarts, is made with it and programs a route.
func TestAgentLoadsRenewedCertificate(t *testing.T) {
	c := newCluster(t)
	h := c.newHostWith(t, "host-a", metricsFlags...)
	tel := h.telemetry(t)
	gauge := `naples_agent_tls_certificate_expiry_seconds{certificate="client",file="` + c.file("host-a.crt") + `"}`
	before := tel.metrics(t)[gauge]
	ca, err := pki.LoadCA(c.file("ca.crt"), c.file("ca.key"))
	if err != nil {
		t.Fatal(err)
	}
	renewed, err := ca.IssueNode("host-a", pki.CertOptions{Validity: 48 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if float64(renewed.Cert.NotAfter.Unix()) == before {
		t.Fatalf("the renewed certificate expires when the old one does (%v)", before)
	}
	if err := renewed.WriteFiles(c.file("host-a.crt"), c.file("host-a.key")); err != nil {
		t.Fatal(err)
	}
	later := time.Now().Add(time.Hour) // a file system's coarse clock must not hide the change
	for _, f := range []string{"host-a.crt", "host-a.key"} {
		if err := os.Chtimes(c.file(f), later, later); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the agent's expiry gauge to follow the renewed certificate", func() bool {
		return tel.metrics(t)[gauge] == float64(renewed.Cert.NotAfter.Unix())
	})
	if log, _ := os.ReadFile(h.agent.log); !strings.Contains(string(log), `msg="certificate loaded again"`) || !strings.Contains(string(log), "serial="+renewed.Cert.SerialNumber.String()) {
		t.Errorf("the agent's log does not say it loaded serial %s:\n%s", renewed.Cert.SerialNumber, log)
	}
	c.nimbus.stop(t)
	c.startNimbus(t)
	c.apply(t, toDC2)
	c.waitProgrammed(t, "route", "to-dc2", "host-a", 1)
}
