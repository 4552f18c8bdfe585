package delphi

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/naplesnet/naples/internal/telemetry/telemetrytest"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// wantMetrics fails the test unless each series has the value in want.
func wantMetrics(t *testing.T, reg prometheus.Gatherer, when string, want map[string]float64) {
	t.Helper()
	got := telemetrytest.Values(t, reg)
	for series, v := range want {
		if g, ok := got[series]; !ok || g != v {
			t.Errorf("%s: %s = %v (present %v), want %v", when, series, g, ok, v)
		}
	}
}

// objectsSeries names the naples_delphi_objects series of a kind and phase.
func objectsSeries(kind, phase string) string {
	return `naples_delphi_objects{kind="` + kind + `",phase="` + phase + `"}`
}

// TestMetrics checks that commits move the commit histograms by the objects they changed,
// and that the object counts follow both tables: the phase is the status's for the
// object's current generation, an older or missing status is PENDING, and a status
// without a desired object counts nowhere.
func TestMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	s, err := Open(Options{Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	d, err := s.ClaimDesired()
	if err != nil {
		t.Fatal(err)
	}
	st, err := s.ClaimStatus()
	if err != nil {
		t.Fatal(err)
	}
	wantMetrics(t, reg, "empty", map[string]float64{
		`naples_delphi_commit_batch_size_count{table="desired"}`:       0,
		`naples_delphi_commit_duration_seconds_count{table="desired"}`: 0,
		`naples_delphi_commit_batch_size_count{table="status"}`:        0,
		"naples_delphi_synced":               0,
		objectsSeries("Route", "PENDING"):    0,
		objectsSeries("Interface", "FAILED"): 0,
	})

	a, b, c := route("a", 100, "198.51.100.0/24", "10.0.0.1"), route("b", 100, "198.51.100.0/24", "10.0.0.2"), route("c", 100, "198.51.100.0/24", "10.0.0.3")
	c.Meta.Generation = 2
	ep := endpoint("", "", "web", "blue", nil)
	commit(t, d, func(txn *DesiredTxn) {
		for _, o := range []*nimbusv1.Object{a, b, c, ep} {
			txn.Put(o)
		}
	})
	commit(t, d, func(txn *DesiredTxn) { txn.Put(a) }) // unchanged: a commit that changes nothing
	d.MarkSynced()
	wantMetrics(t, reg, "after two desired commits", map[string]float64{
		`naples_delphi_commit_batch_size_count{table="desired"}`:       2,
		`naples_delphi_commit_batch_size_sum{table="desired"}`:         4,
		`naples_delphi_commit_duration_seconds_count{table="desired"}`: 2,
		`naples_delphi_commit_batch_size_count{table="status"}`:        0,
		"naples_delphi_synced":               1,
		objectsSeries("Route", "PENDING"):    3,
		objectsSeries("Endpoint", "PENDING"): 1,
	})

	// Statuses of keys that sort before, between and after the desired ones, and of an
	// absent object, exercise the merged walk over both tables.
	txn := &StatusTxn{}
	txn.Set(statusKey("0-gone").Key(), programmed(1))
	txn.Set(a.TypedKey(), programmed(1))
	txn.Set(b.TypedKey(), &nimbusv1.NodeStatus{ObservedGeneration: 1, Phase: nimbusv1.Phase_PHASE_FAILED, Reason: "Conflict"})
	txn.Set(c.TypedKey(), programmed(1)) // c is at generation 2: its status is stale
	txn.Set(statusKey("bb-gone").Key(), programmed(1))
	txn.Set(statusKey("zz-gone").Key(), &nimbusv1.NodeStatus{Phase: nimbusv1.Phase_PHASE_FAILED})
	if err := st.Commit(txn); err != nil {
		t.Fatal(err)
	}
	wantMetrics(t, reg, "after a status commit", map[string]float64{
		`naples_delphi_commit_batch_size_count{table="status"}`:       1,
		`naples_delphi_commit_batch_size_sum{table="status"}`:         6,
		`naples_delphi_commit_duration_seconds_count{table="status"}`: 1,
		`naples_delphi_commit_batch_size_count{table="desired"}`:      2,
		objectsSeries("Route", "PROGRAMMED"):                          1,
		objectsSeries("Route", "FAILED"):                              1,
		objectsSeries("Route", "PENDING"):                             1,
		objectsSeries("Endpoint", "PENDING"):                          1,
		objectsSeries("Endpoint", "PROGRAMMED"):                       0,
	})

	commit(t, d, func(txn *DesiredTxn) { txn.Delete(a.Key()) })
	wantMetrics(t, reg, "after deleting a", map[string]float64{
		`naples_delphi_commit_batch_size_sum{table="desired"}`: 5,
		objectsSeries("Route", "PROGRAMMED"):                   0,
		objectsSeries("Route", "FAILED"):                       1,
		objectsSeries("Route", "PENDING"):                      1,
	})
}

// TestMetricsRegistration checks that two stores cannot share a Registerer, and that
// Close unregisters, so that a store opened later can take it.
func TestMetricsRegistration(t *testing.T) {
	reg := prometheus.NewRegistry()
	s, err := Open(Options{Registerer: reg, Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Open(Options{Registerer: reg}); err == nil || !strings.Contains(err.Error(), "registering metrics") {
		t.Fatalf("second Open on one Registerer = %v, want a registration error", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if fams, err := reg.Gather(); err != nil || len(fams) != 0 {
		t.Fatalf("after Close the registry holds %d metric families (err %v), want none", len(fams), err)
	}
	s, err = Open(Options{Registerer: reg})
	if err != nil {
		t.Fatalf("Open after Close: %v", err)
	}
	s.Close()
}
