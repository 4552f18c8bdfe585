package nimbus

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// metricValues gathers the server's metrics as `name{label="value"}` to value.
func metricValues(t *testing.T, reg prometheus.Gatherer) map[string]float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatalf("gathering metrics: %v", err)
	}
	out := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			name := f.GetName()
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			if len(labels) > 0 {
				name += "{" + strings.Join(labels, ",") + "}"
			}
			switch {
			case m.GetCounter() != nil:
				out[name] = m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				out[name] = m.GetGauge().GetValue()
			}
		}
	}
	return out
}

// wantMetrics fails the test unless every line, `name{labels} value`, is what the server's
// registry reports.
func wantMetrics(t *testing.T, srv *Server, lines ...string) {
	t.Helper()
	got := metricValues(t, srv.Registry())
	for _, l := range lines {
		name, value, _ := strings.Cut(l, " ")
		want, err := strconv.ParseFloat(value, 64)
		if err != nil {
			t.Fatalf("bad expected metric line %q", l)
		}
		if v, ok := got[name]; !ok || v != want {
			keys := slices.Sorted(func(yield func(string) bool) {
				for k := range got {
					if !yield(k) {
						return
					}
				}
			})
			t.Errorf("metric %s = %v (present %v), want %v; have %q", name, v, ok, want, keys)
		}
	}
}

func TestMetrics(t *testing.T) {
	ts := start(t, Options{})
	wantMetrics(t, ts.srv,
		"naples_nimbus_objects 0",
		"naples_nimbus_revision 0",
		"naples_nimbus_watchers 0",
		"naples_nimbus_watcher_resets_total 0",
		`naples_nimbus_watch_starts_total{mode="resume"} 0`,
		`naples_nimbus_watch_starts_total{mode="snapshot"} 0`,
	)
	ts.apply(t, route("r1", nil, "192.0.2.1"))
	ts.apply(t, route("r2", nil, "192.0.2.1"))
	ts.apply(t, route("r2", nil, "192.0.2.2"))
	if _, err := ts.client.Delete(testContext(t), &nimbusv1.DeleteRequest{Key: routeKey("r1")}); err != nil {
		t.Fatal(err)
	}
	recvUntilSynced(t, watch(t, ts.client, "a"))
	wantResumed(t, ts, watchFrom(t, testContext(t), ts.client, "b", ts.srv.Epoch(), 2), 2)
	wantMetrics(t, ts.srv,
		"naples_nimbus_objects 1",
		"naples_nimbus_revision 4",
		"naples_nimbus_watchers 2",
		`naples_nimbus_watch_starts_total{mode="resume"} 1`,
		`naples_nimbus_watch_starts_total{mode="snapshot"} 1`,
	)
}

func TestMetricsOnGivenRegisterer(t *testing.T) {
	reg := prometheus.NewRegistry()
	opts := Options{Registerer: reg, Logger: slog.New(slog.DiscardHandler)}
	srv, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	if srv.Registry() != reg {
		t.Errorf("Registry() is not the given registry")
	}
	if _, err := New(opts); err == nil || !strings.Contains(err.Error(), "registering metrics") {
		t.Fatalf("second New on one registry = %v, want a registration error", err)
	}
	if _, ok := metricValues(t, reg)["naples_nimbus_revision"]; !ok {
		t.Fatalf("revision gauge missing from the given registry")
	}
	// Close unregisters, so the registry can take a new Server.
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	srv, err = New(opts)
	if err != nil {
		t.Fatalf("New after Close: %v", err)
	}
	srv.Close()
	var are prometheus.AlreadyRegisteredError
	if err := reg.Register(prometheus.NewGauge(prometheus.GaugeOpts{Name: "naples_nimbus_objects", Help: "x"})); errors.As(err, &are) {
		t.Errorf("metrics still registered after Close: %v", err)
	}
}
