package agent

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/naplesnet/naples/internal/pki"
	"github.com/naplesnet/naples/internal/telemetry/telemetrytest"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// logBuffer collects a logger's output for a test to read while the agent writes it.
type logBuffer struct {
	// mu guards buf.
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestRunServesTelemetry runs an agent with Config.Metrics against a real nimbus: it logs
// where it serves, /readyz answers 200 once the route is reconciled, /metrics shows the
// route programmed and the parts' metrics in one registry, and once Run returns nothing is
// served any more.
func TestRunServesTelemetry(t *testing.T) {
	_, ns := hostNamespace(t, "naples-telemetry")
	dir := t.TempDir()
	addr, api, _ := startNimbus(t, dir)
	route := &nimbusv1.Object{
		Meta: &nimbusv1.ObjectMeta{Name: "to-dc2", Nodes: []string{"host-a"}},
		Spec: &nimbusv1.Object_Route{Route: &nimbusv1.RouteSpec{Table: 100, Prefix: "198.51.100.0/24", Nexthops: []*nimbusv1.NextHop{{Gateway: "10.10.0.2"}}}},
	}
	if _, err := api.Apply(context.Background(), &nimbusv1.ApplyRequest{Object: route}); err != nil {
		t.Fatal(err)
	}
	// A certificate that expires in 10 days is warned of; the agent dials in plaintext, so
	// it only lends its file to Config.Certificates.
	ca, err := pki.NewCA(pki.CAOptions{})
	if err != nil {
		t.Fatal(err)
	}
	soon, err := ca.IssueNode("host-a", pki.CertOptions{Validity: 10*24*time.Hour + time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	certFile := filepath.Join(dir, "host-a.crt")
	if err := soon.WriteFiles(certFile, filepath.Join(dir, "host-a.key")); err != nil {
		t.Fatal(err)
	}
	certs, err := pki.ReadExpiry(pki.CertFile{Use: pki.UseClient, Path: certFile})
	if err != nil {
		t.Fatal(err)
	}
	var logs logBuffer
	stop := sync.OnceFunc(runAgent(t, Config{
		Node: "host-a", Nimbus: addr, StateDir: filepath.Join(dir, "state"), Metrics: "127.0.0.1:0", Pprof: true,
		Logger: slog.New(slog.NewTextHandler(&logs, nil)), netns: &ns, Certificates: certs,
	}))
	defer stop()

	re := regexp.MustCompile(`msg="serving metrics" .*url=(http://\S+)/metrics`)
	var base string
	deadline := time.Now().Add(20 * time.Second)
	for {
		if m := re.FindStringSubmatch(logs.String()); m != nil {
			base = m[1]
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the agent never logged its metrics URL; its log:\n%s", logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	for {
		code, body := telemetrytest.Get(t, base+"/readyz")
		if code == http.StatusOK {
			want := "warning: certificate " + certFile + " expires in 10 days"
			if !strings.HasPrefix(body, "ready\n") || !strings.Contains(body, want) {
				t.Errorf("GET /readyz = %q, want ready and %q", body, want)
			}
			break
		}
		if code != http.StatusServiceUnavailable || time.Now().After(deadline) {
			t.Fatalf("GET /readyz = %d %q, want 503 until ready, then 200", code, body)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if code, body := telemetrytest.Get(t, base+"/healthz"); code != http.StatusOK {
		t.Errorf("GET /healthz = %d %q, want 200", code, body)
	}
	code, body := telemetrytest.Get(t, base+"/metrics")
	if code != http.StatusOK {
		t.Fatalf("GET /metrics = %d", code)
	}
	m := telemetrytest.Parse(t, body)
	for series, want := range map[string]float64{
		"naples_agent_ready": 1,
		`naples_agent_tls_certificate_expiry_seconds{certificate="client",file="` + certFile + `"}`: float64(soon.Cert.NotAfter.Unix()),
		"naples_delphi_synced": 1,
		`naples_nimbusclient_watch_starts_total{mode="snapshot"}`: 1,
	} {
		if v, ok := m[series]; !ok || v != want {
			t.Errorf("%s = %v (present %v), want %v", series, v, ok, want)
		}
	}
	if v := m[`naples_hal_reconciles_total{kind="Route"}`]; v < 1 {
		t.Errorf("ready with %v route reconciles, want at least 1", v)
	}
	if _, ok := m["go_goroutines"]; !ok {
		t.Errorf("/metrics lacks the Go runtime's metrics")
	}
	if code, body := telemetrytest.Get(t, base+"/debug/pprof/goroutine?debug=1"); code != http.StatusOK || !strings.Contains(body, "goroutine profile") {
		t.Errorf("GET /debug/pprof/goroutine with Pprof = %d %.200q, want 200 and the profile", code, body)
	}

	stop()
	if _, err := http.Get(base + "/healthz"); err == nil {
		t.Error("still serving after Run returned")
	}
}

// TestHealthNamesWhatStopped checks what /healthz answers: healthy while every part runs,
// then the first part that stopped, with its error, or that the agent is stopping.
func TestHealthNamesWhatStopped(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var running health
	if err := running.check(ctx); err != nil {
		t.Fatalf("check while running = %v, want nil", err)
	}
	cancel()
	if err := running.check(ctx); err == nil || !strings.Contains(err.Error(), "stopping") {
		t.Errorf("check after the agent's context ended = %v, want stopping", err)
	}

	var failed health
	broken := errors.New("watching desired objects: store closed")
	failed.stopped("hal", broken)
	failed.stopped("nimbus client", nil) // stopped because the HAL's failure cancelled it
	if err := failed.check(ctx); !errors.Is(err, broken) || !strings.Contains(err.Error(), "hal failed") {
		t.Errorf("check after the HAL failed = %v, want the HAL's failure", err)
	}

	var early health
	early.stopped("local api", nil)
	if err := early.check(context.Background()); err == nil || err.Error() != "local api stopped" {
		t.Errorf("check after a part returned early = %v, want it named", err)
	}
}
