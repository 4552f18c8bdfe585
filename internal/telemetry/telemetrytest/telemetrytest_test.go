package telemetrytest

import (
	"io"
	"maps"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestParseReadsWhatValuesGathers checks that the text /metrics serves parses into the
// series Values gathers from the registry behind it, named the same way.
func TestParseReadsWhatValuesGathers(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "naples_test_things_total", Help: "Things."}, []string{"kind", "phase"})
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "naples_test_depth", Help: "Depth."})
	h := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "naples_test_seconds", Help: "Seconds.", Buckets: []float64{1, 2}}, []string{"kind"})
	reg.MustRegister(c, g, h)
	c.WithLabelValues("Route", "PROGRAMMED").Add(3)
	c.WithLabelValues("Node", "FAILED").Inc()
	g.Set(-2.5)
	h.WithLabelValues("Route").Observe(1.5)
	h.WithLabelValues("Route").Observe(0.25)

	want := map[string]float64{
		`naples_test_things_total{kind="Route",phase="PROGRAMMED"}`: 3,
		`naples_test_things_total{kind="Node",phase="FAILED"}`:      1,
		"naples_test_depth":                       -2.5,
		`naples_test_seconds_count{kind="Route"}`: 2,
		`naples_test_seconds_sum{kind="Route"}`:   1.75,
	}
	values := Values(t, reg)
	if !maps.Equal(values, want) {
		t.Errorf("Values = %v, want %v", values, want)
	}

	rec := httptest.NewRecorder()
	promhttp.HandlerFor(reg, promhttp.HandlerOpts{}).ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	text, err := io.ReadAll(rec.Result().Body)
	if err != nil {
		t.Fatal(err)
	}
	parsed := Parse(t, string(text))
	for series, v := range want {
		if got, ok := parsed[series]; !ok || got != v {
			t.Errorf("Parse: %s = %v (present %v), want %v; text:\n%s", series, got, ok, v, text)
		}
	}
	if got := parsed[`naples_test_seconds_bucket{kind="Route",le="1"}`]; got != 1 {
		t.Errorf("Parse: bucket le=1 = %v, want 1", got)
	}
}
