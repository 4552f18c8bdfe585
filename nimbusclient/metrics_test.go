package nimbusclient

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/naplesnet/naples/delphi"
	"github.com/naplesnet/naples/internal/telemetry/telemetrytest"
	"github.com/naplesnet/naples/nimbus"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// Series of the client's metrics the tests read.
const (
	seriesConnected       = "naples_nimbusclient_watch_connected"
	seriesEvents          = "naples_nimbusclient_events_received_total"
	seriesReports         = "naples_nimbusclient_status_reports_total"
	seriesSnapshots       = `naples_nimbusclient_watch_starts_total{mode="snapshot"}`
	seriesResumes         = `naples_nimbusclient_watch_starts_total{mode="resume"}`
	seriesWatchReconnects = `naples_nimbusclient_reconnects_total{stream="watch"}`
)

// waitMetric waits until cond holds for the value of the series.
func waitMetric(t *testing.T, reg prometheus.Gatherer, series, what string, cond func(float64) bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		v, ok := telemetrytest.Values(t, reg)[series]
		if ok && cond(v) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s %s; it is %v (present %v)", series, what, v, ok)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestMetrics checks that the client's metrics follow its streams: a snapshot, the events
// it receives, the statuses it sends, and a connection lost and resumed.
func TestMetrics(t *testing.T) {
	b, _ := newServedBus(t, nimbus.Options{})
	proxy := newCutProxy(t, b.path)
	b.apply(t, "r1", "a")
	b.apply(t, "r2", "a")

	reg := prometheus.NewRegistry()
	a := newAgent(t)
	store, status := a.store, a.status
	c, err := New(Options{Node: "a", Address: "unix://" + proxy.path, Store: store, Logger: quiet, MaxBackoff: 200 * time.Millisecond, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	got := telemetrytest.Values(t, reg)
	for _, series := range []string{seriesConnected, seriesEvents, seriesReports, seriesSnapshots, seriesResumes, seriesWatchReconnects} {
		if v, ok := got[series]; !ok || v != 0 {
			t.Errorf("before Run %s = %v (present %v), want 0", series, v, ok)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	stop := sync.OnceValue(func() error {
		cancel()
		return <-done
	})
	t.Cleanup(func() { stop() })

	// The snapshot: two objects and SYNCED.
	waitMetric(t, reg, seriesSnapshots, "to be 1", func(v float64) bool { return v == 1 })
	waitMetric(t, reg, seriesEvents, "to count the snapshot's 3 events", func(v float64) bool { return v >= 3 })
	waitMetric(t, reg, seriesConnected, "to be 1", func(v float64) bool { return v == 1 })
	events := telemetrytest.Values(t, reg)[seriesEvents]
	b.apply(t, "r3", "a")
	waitMetric(t, reg, seriesEvents, fmt.Sprintf("to grow past %v with r3", events), func(v float64) bool { return v > events })

	// Operational data goes up as a status of its own, watermark or not.
	if err := status.Set(routeKey("r1"), &nimbusv1.NodeStatus{ObservedGeneration: 1, Phase: nimbusv1.Phase_PHASE_PROGRAMMED, Operational: map[string]string{"hits": "1"}}); err != nil {
		t.Fatal(err)
	}
	waitNodeStatus(t, b, "r1")
	waitMetric(t, reg, seriesReports, "to count r1's status", func(v float64) bool { return v >= 1 })

	// Lost: the watch is down until the proxy lets the client in again; then it resumes.
	proxy.hold()
	waitMetric(t, reg, seriesConnected, "to be 0 while nimbus is unreachable", func(v float64) bool { return v == 0 })
	proxy.release()
	waitMetric(t, reg, seriesResumes, "to be 1", func(v float64) bool { return v == 1 })
	waitMetric(t, reg, seriesConnected, "to be 1 again", func(v float64) bool { return v == 1 })
	got = telemetrytest.Values(t, reg)
	if got[seriesWatchReconnects] < 1 || got[seriesSnapshots] != 1 {
		t.Errorf("after the resume: %s = %v, %s = %v; want at least 1 and still 1",
			seriesWatchReconnects, got[seriesWatchReconnects], seriesSnapshots, got[seriesSnapshots])
	}

	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	c.Close()
	c.Close()
	if fams, err := reg.Gather(); err != nil || len(fams) != 0 {
		t.Errorf("after Close the registry holds %d metric families (err %v), want none", len(fams), err)
	}
}

func TestMetricsRegisterOnce(t *testing.T) {
	reg := prometheus.NewRegistry()
	store, err := delphi.Open(delphi.Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	c, err := New(Options{Node: "a", Address: "unix:///nimbus.sock", Store: store, Logger: quiet, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	other, err := delphi.Open(delphi.Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if _, err := New(Options{Node: "a", Address: "unix:///nimbus.sock", Store: other, Logger: quiet, Registerer: reg}); err == nil || !strings.Contains(err.Error(), "registering metrics") {
		t.Errorf("second New on one Registerer = %v, want a registration error", err)
	}
	// The failed New did not claim the other store's desired writer.
	if _, err := other.ClaimDesired(); err != nil {
		t.Errorf("claiming the desired writer after a failed New: %v", err)
	}
	c.Close()
}
