package telemetry

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

func TestProbesFollowTheProcess(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "naples_test_things_total", Help: "Things."})
	reg.MustRegister(c)
	var broken atomic.Bool
	var reasons atomic.Pointer[[]string]
	reasons.Store(&[]string{"delphi not restored yet", "3 objects not reconciled yet"})
	s, err := Serve(context.Background(), "127.0.0.1:0", Options{
		Gatherer: reg,
		Healthy: func() error {
			if broken.Load() {
				return errors.New("hal: stopped")
			}
			return nil
		},
		Ready: func() []string { return *reasons.Load() },
	})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	base := "http://" + s.Addr()

	c.Add(3)
	if code, body := get(t, base+"/metrics"); code != 200 || !strings.Contains(body, "naples_test_things_total 3") {
		t.Errorf("/metrics = %d:\n%s", code, body)
	}
	if code, body := get(t, base+"/readyz"); code != 503 || !strings.Contains(body, "delphi not restored yet\n3 objects not reconciled yet") {
		t.Errorf("/readyz while not ready = %d %q, want 503 with the reasons", code, body)
	}
	reasons.Store(&[]string{})
	if code, _ := get(t, base+"/readyz"); code != 200 {
		t.Errorf("/readyz when ready = %d, want 200", code)
	}
	if code, _ := get(t, base+"/healthz"); code != 200 {
		t.Errorf("/healthz while healthy = %d, want 200", code)
	}
	broken.Store(true)
	if code, body := get(t, base+"/healthz"); code != 503 || !strings.Contains(body, "hal: stopped") {
		t.Errorf("/healthz while broken = %d %q, want 503 naming the cause", code, body)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := http.Get(base + "/healthz"); err == nil {
		t.Error("still serving after Close")
	}
}

// TestPprof shows the profiles served with Options.Pprof, and only with it.
func TestPprof(t *testing.T) {
	for _, on := range []bool{false, true} {
		s, err := Serve(context.Background(), "127.0.0.1:0", Options{Gatherer: prometheus.NewRegistry(), Pprof: on})
		if err != nil {
			t.Fatal(err)
		}
		code, body := get(t, "http://"+s.Addr()+"/debug/pprof/heap?gc=1&debug=1")
		switch {
		case on && (code != 200 || !strings.Contains(body, "# HeapAlloc = ")):
			t.Errorf("with Pprof, the heap profile = %d:\n%.500s", code, body)
		case !on && code != 404:
			t.Errorf("without Pprof, the heap profile = %d, want 404", code)
		}
		s.Close()
	}
}

func TestRegisterAllOrNone(t *testing.T) {
	reg := prometheus.NewRegistry()
	a := prometheus.NewCounter(prometheus.CounterOpts{Name: "naples_test_a_total", Help: "A."})
	b := prometheus.NewCounter(prometheus.CounterOpts{Name: "naples_test_b_total", Help: "B."})
	unregister, err := Register(reg, "Thing", a, b)
	if err != nil {
		t.Fatal(err)
	}
	// A second owner on the same registry fails, names the clash, and leaves nothing.
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "naples_test_c_total", Help: "C."})
	if _, err := Register(reg, "Thing", c, prometheus.NewCounter(prometheus.CounterOpts{Name: "naples_test_a_total", Help: "A."})); err == nil ||
		!strings.Contains(err.Error(), "is another Thing using the same Registerer?") {
		t.Fatalf("second Register = %v, want an error naming the shared Registerer", err)
	}
	if err := reg.Register(c); err != nil {
		t.Errorf("the failed Register left c registered: %v", err)
	}
	unregister()
	if err := reg.Register(a); err != nil {
		t.Errorf("unregister left a registered: %v", err)
	}
}

// TestReadyzWarnings shows the warnings after /readyz's answer, ready or not.
func TestReadyzWarnings(t *testing.T) {
	var ready atomic.Bool
	s, err := Serve(context.Background(), "127.0.0.1:0", Options{
		Gatherer: prometheus.NewRegistry(),
		Ready: func() []string {
			if ready.Load() {
				return nil
			}
			return []string{"not serving yet"}
		},
		Warnings: func() []string {
			return []string{"warning: certificate a.crt expires in 3 days (2026-12-01T00:00:00Z)"}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if code, body := get(t, "http://"+s.Addr()+"/readyz"); code != 503 || body != "not serving yet\nwarning: certificate a.crt expires in 3 days (2026-12-01T00:00:00Z)\n" {
		t.Errorf("/readyz while not ready = %d %q, want 503 with the reason, then the warning", code, body)
	}
	ready.Store(true)
	if code, body := get(t, "http://"+s.Addr()+"/readyz"); code != 200 || body != "ready\nwarning: certificate a.crt expires in 3 days (2026-12-01T00:00:00Z)\n" {
		t.Errorf("/readyz when ready = %d %q, want 200 with the warning after ready", code, body)
	}
}
