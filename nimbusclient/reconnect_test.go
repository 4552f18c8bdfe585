package nimbusclient

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/naplesnet/naples/internal/telemetry/telemetrytest"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// seriesStatusReconnects counts the status streams started again.
const seriesStatusReconnects = `naples_nimbusclient_reconnects_total{stream="status"}`

// delays records the reconnect delays of a client, by stream, in place of waiting them.
type delays struct {
	// mu guards byStream.
	mu       sync.Mutex
	byStream map[string][]time.Duration
}

// wait records d and returns at once, as Client.wait.
func (r *delays) wait(ctx context.Context, stream string, d time.Duration) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.byStream[stream] = append(r.byStream[stream], d)
	return ctx.Err()
}

// of returns the delays of a stream so far.
func (r *delays) of(stream string) []time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]time.Duration(nil), r.byStream[stream]...)
}

// TestBackoffStartsOverOnceStreamTaken cuts the client's connection again and again, each
// time once nimbus has taken both its streams (the watch sent its first event, a status
// sent on the status stream arrived): the first reconnect delay after each cut is at most
// MinBackoff, however many cuts came before, rather than doubling with each one.
func TestBackoffStartsOverOnceStreamTaken(t *testing.T) {
	b := newBus(t)
	proxy := newCutProxy(t, b.path)
	b.apply(t, "r1", "a")
	reg := prometheus.NewRegistry()
	a := newAgent(t)
	store, status := a.store, a.status
	const minBackoff = 100 * time.Millisecond
	c, err := New(Options{Node: "a", Address: "unix://" + proxy.path, Store: store, Logger: quiet,
		MinBackoff: minBackoff, MaxBackoff: 30 * time.Second, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	rec := &delays{byStream: map[string][]time.Duration{}}
	c.wait = rec.wait
	runClient(t, c)

	const cuts = 6
	firsts := map[string][]time.Duration{}
	for cut := range cuts + 1 {
		// Both streams are taken: the watch is up, and a status of this round has arrived.
		waitMetric(t, reg, seriesConnected, "to be 1", func(v float64) bool { return v == 1 })
		gen := int64(cut + 1)
		if err := status.Set(routeKey("r1"), &nimbusv1.NodeStatus{ObservedGeneration: gen, Phase: nimbusv1.Phase_PHASE_PROGRAMMED}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, fmt.Sprintf("r1's status of generation %d at nimbus", gen), func() bool {
			resp, err := b.api.Get(context.Background(), &nimbusv1.GetRequest{Key: routeKey("r1")})
			if err != nil {
				return false
			}
			for _, st := range resp.GetItem().GetStatus().GetNodes() {
				if st.GetNode() == "a" && st.GetObservedGeneration() == gen {
					return true
				}
			}
			return false
		})
		if cut == cuts {
			break
		}
		before := map[string]int{streamWatch: len(rec.of(streamWatch)), streamStatus: len(rec.of(streamStatus))}
		proxy.cut()
		for _, s := range []string{streamWatch, streamStatus} {
			waitFor(t, fmt.Sprintf("a reconnect of the %s stream after cut %d", s, cut+1), func() bool { return len(rec.of(s)) > before[s] })
			firsts[s] = append(firsts[s], rec.of(s)[before[s]])
		}
	}
	for s, ds := range firsts {
		for i, d := range ds {
			if d > minBackoff {
				t.Errorf("%s stream: first reconnect delay after cut %d of %d = %v, want at most MinBackoff %v (delays after each cut: %v)", s, i+1, cuts, d, minBackoff, ds)
				break
			}
		}
	}
	for _, series := range []string{seriesWatchReconnects, seriesStatusReconnects} {
		waitMetric(t, reg, series, fmt.Sprintf("to count at least %d reconnects", cuts), func(v float64) bool { return v >= cuts })
	}
}

// proxiedClient runs a client for node a that reaches nimbus through the proxy, and
// returns its delphi store and status writer, and its metrics.
func proxiedClient(t *testing.T, proxy *cutProxy) (*agent, *prometheus.Registry) {
	t.Helper()
	a := newAgent(t)
	reg := prometheus.NewRegistry()
	c, err := New(Options{Node: "a", Address: "unix://" + proxy.path, Store: a.store, Logger: quiet, MaxBackoff: 200 * time.Millisecond, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	runClient(t, c)
	return a, reg
}

// TestIdleStatusStreamReconnects cuts the client's connection while its status stream is
// idle: the client notices at once, not at the next status change, opens a new status
// stream and sends every status again on it.
func TestIdleStatusStreamReconnects(t *testing.T) {
	b := newBus(t)
	proxy := newCutProxy(t, b.path)
	b.apply(t, "r1", "a")
	a, reg := proxiedClient(t, proxy)
	waitMetric(t, reg, seriesConnected, "to be 1", func(v float64) bool { return v == 1 })
	// Operational data goes up as a status of its own, watermark or not.
	if err := a.status.Set(routeKey("r1"), &nimbusv1.NodeStatus{ObservedGeneration: 1, Phase: nimbusv1.Phase_PHASE_PROGRAMMED, Operational: map[string]string{"hits": "1"}}); err != nil {
		t.Fatal(err)
	}
	waitNodeStatus(t, b, "r1")
	waitMetric(t, reg, seriesReports, "to count r1's status", func(v float64) bool { return v == 1 })

	proxy.cut()
	waitMetric(t, reg, seriesStatusReconnects, "to count the status stream started again", func(v float64) bool { return v >= 1 })
	waitMetric(t, reg, seriesReports, "to count r1's status sent again", func(v float64) bool { return v >= 2 })
}

// TestStatusStreamCarriesOverExceptions holds the client away from nimbus while statuses
// change: an exception is cleared and another object fails. The next status stream, which
// starts from what the last one left (the reporter and its subscription carry over), tells
// nimbus both, and the objects that were done all along stay PROGRAMMED without their
// statuses going up again.
func TestStatusStreamCarriesOverExceptions(t *testing.T) {
	b := newBus(t)
	proxy := newCutProxy(t, b.path)
	names := []string{"r1", "r2", "r3", "r4", "r5"}
	for _, name := range names {
		b.apply(t, name, "a")
	}
	a, reg := proxiedClient(t, proxy)
	waitFor(t, "the client to hold every route", func() bool { return len(a.names()) >= len(names) })
	set := func(name string, phase nimbusv1.Phase, msg string) {
		t.Helper()
		if err := a.status.Set(routeKey(name), &nimbusv1.NodeStatus{ObservedGeneration: 1, Phase: phase, Message: msg}); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range names[:4] {
		set(name, nimbusv1.Phase_PHASE_PROGRAMMED, "")
	}
	set("r5", nimbusv1.Phase_PHASE_FAILED, "r5 refused")
	phases := func(want map[string]nimbusv1.Phase) func() bool {
		return func() bool {
			for name, phase := range want {
				resp, err := b.api.Get(context.Background(), &nimbusv1.GetRequest{Key: routeKey(name)})
				if err != nil {
					return false
				}
				var got nimbusv1.Phase
				for _, st := range resp.GetItem().GetStatus().GetNodes() {
					if st.GetNode() == "a" {
						got = st.GetPhase()
					}
				}
				if got != phase {
					return false
				}
			}
			return true
		}
	}
	const done, failed = nimbusv1.Phase_PHASE_PROGRAMMED, nimbusv1.Phase_PHASE_FAILED
	waitFor(t, "r1-r4 PROGRAMMED and r5 FAILED on node a", phases(map[string]nimbusv1.Phase{"r1": done, "r2": done, "r3": done, "r4": done, "r5": failed}))
	waitMetric(t, reg, seriesReports, "to count r5's status", func(v float64) bool { return v == 1 })

	proxy.hold()
	set("r5", done, "")
	set("r4", failed, "r4 refused")
	proxy.release()
	waitFor(t, "r4 FAILED and the others PROGRAMMED on node a after the reconnect", phases(map[string]nimbusv1.Phase{"r1": done, "r2": done, "r3": done, "r4": failed, "r5": done}))
	// r5 failed and done, r4 failed, each at most once more: no status of r1-r3 went up.
	if v := telemetrytest.Values(t, reg)[seriesReports]; v < 2 || v > 4 {
		t.Errorf("%s = %v, want 2 to 4: r5's and r4's statuses, not every one", seriesReports, v)
	}
}
