package test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/naplesnet/naples/internal/telemetry/telemetrytest"
	"github.com/naplesnet/naples/internal/testns"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// metricsFlags make the agent serve its telemetry on a free port of its namespace's
// loopback.
var metricsFlags = []string{"--metrics", "127.0.0.1:0"}

// servingMetrics matches the agent's log line that names its metrics URL.
var servingMetrics = regexp.MustCompile(`msg="serving metrics" .*url=(http://\S+)/metrics`)

// telemetry is the HTTP endpoint of a running agent, reached inside its host's namespace.
type telemetry struct {
	base   string // http://127.0.0.1:port
	client *http.Client
}

// telemetry waits for the host's running agent to log where it serves its telemetry and
// returns a client of it.
func (h *host) telemetry(t testing.TB) *telemetry {
	t.Helper()
	var base string
	waitFor(t, "the agent to log its metrics URL", func() bool {
		log, err := os.ReadFile(h.agent.log)
		if err != nil {
			t.Fatal(err)
		}
		m := servingMetrics.FindSubmatch(log)
		if m != nil {
			base = string(m[1])
		}
		return m != nil
	})
	ns := testns.Handle(t, h.ns)
	tr := &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return dialIn(ctx, ns, network, addr)
		},
		DisableKeepAlives: true,
	}
	return &telemetry{base: base, client: &http.Client{Transport: tr, Timeout: deadline}}
}

// dialIn dials addr from inside the network namespace ns: the socket is made in ns and
// stays there, while the test's thread goes back to its own namespace.
func dialIn(ctx context.Context, ns netns.NsHandle, network, addr string) (net.Conn, error) {
	return dialWith(ctx, ns, net.Dialer{}, network, addr)
}

// dialWith is dialIn with the dialer d: from a local address of its own, say.
func dialWith(ctx context.Context, ns netns.NsHandle, d net.Dialer, network, addr string) (net.Conn, error) {
	runtime.LockOSThread()
	own, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return nil, fmt.Errorf("reading the test's namespace: %w", err)
	}
	defer own.Close()
	if err := netns.Set(ns); err != nil {
		runtime.UnlockOSThread()
		return nil, fmt.Errorf("entering the host's namespace: %w", err)
	}
	conn, dialErr := d.DialContext(ctx, network, addr)
	if err := netns.Set(own); err != nil {
		// The thread stays locked, so the runtime retires it with this goroutine.
		if conn != nil {
			conn.Close()
		}
		return nil, fmt.Errorf("leaving the host's namespace: %w", err)
	}
	runtime.UnlockOSThread()
	return conn, dialErr
}

// get returns the status code and body of GET path.
func (tel *telemetry) get(t testing.TB, path string) (int, string) {
	t.Helper()
	resp, err := tel.client.Get(tel.base + path)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading GET %s: %v", path, err)
	}
	return resp.StatusCode, string(body)
}

// metrics scrapes /metrics.
func (tel *telemetry) metrics(t testing.TB) map[string]float64 {
	t.Helper()
	code, body := tel.get(t, "/metrics")
	if code != http.StatusOK {
		t.Fatalf("GET /metrics = %d: %s", code, body)
	}
	return telemetrytest.Parse(t, body)
}

// waitReady waits until /readyz answers 200, and returns the distinct bodies of the 503
// answers before.
func (tel *telemetry) waitReady(t testing.TB) []string {
	t.Helper()
	end := time.Now().Add(deadline)
	var before []string
	for {
		code, body := tel.get(t, "/readyz")
		if code == http.StatusOK {
			return before
		}
		if body = strings.TrimSpace(body); !slices.Contains(before, body) {
			before = append(before, body)
		}
		if time.Now().After(end) {
			t.Fatalf("timed out after %v waiting for /readyz to answer 200; it answers %d %q", deadline, code, body)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// wantHealthy fails the test unless /healthz answers 200.
func (tel *telemetry) wantHealthy(t *testing.T) {
	t.Helper()
	if code, body := tel.get(t, "/healthz"); code != http.StatusOK {
		t.Errorf("GET /healthz = %d %q, want 200 while the agent runs", code, body)
	}
}

// Series of the agent's metrics the tests read.
const (
	routeReconciles      = `naples_hal_reconciles_total{kind="Route"}`
	routeErrors          = `naples_hal_reconcile_errors_total{kind="Route"}`
	routeWrites          = `naples_hal_kernel_writes_total{kind="Route"}`
	routeDurations       = `naples_hal_reconcile_duration_seconds_count{kind="Route"}`
	halRetries           = "naples_hal_retries_total"
	eventsReceived       = "naples_nimbusclient_events_received_total"
	statusReports        = "naples_nimbusclient_status_reports_total"
	watchConnected       = "naples_nimbusclient_watch_connected"
	watchSnapshots       = `naples_nimbusclient_watch_starts_total{mode="snapshot"}`
	watchResumes         = `naples_nimbusclient_watch_starts_total{mode="resume"}`
	delphiDesiredCommits = `naples_delphi_commit_batch_size_count{table="desired"}`
	delphiStatusCommits  = `naples_delphi_commit_duration_seconds_count{table="status"}`
	delphiSynced         = "naples_delphi_synced"
	agentReady           = "naples_agent_ready"
	routesProgrammed     = `naples_delphi_objects{kind="Route",phase="PROGRAMMED"}`
	routesFailed         = `naples_delphi_objects{kind="Route",phase="FAILED"}`
	routesPending        = `naples_delphi_objects{kind="Route",phase="PENDING"}`
)

// TestAgentMetrics runs an agent with --metrics and checks that its metrics follow what it
// does: routes applied at nimbus are received, reconciled, written to the kernel, reported
// and counted PROGRAMMED; a route the kernel refuses is counted FAILED, with its errors
// and retries.
func TestAgentMetrics(t *testing.T) {
	c := newCluster(t)
	h := c.newHostWith(t, "host-a", metricsFlags...)
	tel := h.telemetry(t)
	tel.waitReady(t) // nimbus's empty snapshot
	tel.wantHealthy(t)
	before := tel.metrics(t)
	for series, want := range map[string]float64{
		watchConnected: 1, watchSnapshots: 1, watchResumes: 0, delphiSynced: 1, agentReady: 1,
		routesProgrammed: 0, routeReconciles: 0, routeWrites: 0,
	} {
		if v, ok := before[series]; !ok || v != want {
			t.Errorf("before any route: %s = %v (present %v), want %v", series, v, ok, want)
		}
	}
	for _, series := range []string{"go_goroutines", "process_resident_memory_bytes", "naples_hal_queue_depth"} {
		if _, ok := before[series]; !ok {
			t.Errorf("/metrics lacks %s", series)
		}
	}

	// Someone else's route holds 203.0.113.0/24 in table 100: naples's route for it fails.
	testns.Run(t, "ip", "-n", h.ns, "route", "add", "203.0.113.0/24", "via", "10.10.0.9", "table", "100")
	other := strings.NewReplacer("to-dc2", "to-dc3", "198.51.100.0/24", "192.0.2.0/24").Replace(toDC2)
	taken := strings.NewReplacer("to-dc2", "taken", "198.51.100.0/24", "203.0.113.0/24").Replace(toDC2)
	c.apply(t, toDC2+"---\n"+other+"---\n"+taken)
	c.waitProgrammed(t, "route", "to-dc2", "host-a", 1)
	c.waitProgrammed(t, "route", "to-dc3", "host-a", 1)
	waitFor(t, "taken FAILED on host-a", func() bool {
		_, st, err := c.get(t, "route", "taken")
		return err == nil && nodeStatus(st, "host-a").GetPhase() == nimbusv1.Phase_PHASE_FAILED
	})

	after := tel.metrics(t)
	grew := func(series string, by float64) {
		t.Helper()
		if after[series] < before[series]+by {
			t.Errorf("%s went from %v to %v, want an increase of at least %v", series, before[series], after[series], by)
		}
	}
	grew(routeReconciles, 3)
	grew(routeDurations, 3)
	grew(routeWrites, 2) // the two routes it programmed
	grew(routeErrors, 1)
	grew(eventsReceived, 3)
	grew(delphiDesiredCommits, 1)
	grew(delphiStatusCommits, 1)
	// nimbus takes watermarks: of the three routes, only the one that failed has its
	// status sent on its own, as an exception; the watermark says the other two.
	grew(statusReports, 1)
	if v := after["naples_nimbusclient_status_exceptions"]; v != 1 {
		t.Errorf("naples_nimbusclient_status_exceptions = %v, want 1 (the route that failed)", v)
	}
	// The failed route is retried with backoff, forever.
	waitFor(t, "taken retried", func() bool { return tel.metrics(t)[halRetries] >= 1 })
	for series, want := range map[string]float64{routesProgrammed: 2, routesFailed: 1, routesPending: 0} {
		if v, ok := after[series]; !ok || v != want {
			t.Errorf("after applying the routes: %s = %v (present %v), want %v", series, v, ok, want)
		}
	}
}

// TestAgentReadiness checks /readyz across restarts, with many routes so that reconciling
// them takes a while. An agent restarted while nimbus is down becomes ready on its restored
// state once it has reconciled all of it. An agent that starts empty while nimbus is down
// is not ready, and says it lacks its desired state; once nimbus is back it syncs,
// reconciles everything, and becomes ready.
func TestAgentReadiness(t *testing.T) {
	const n = 1000
	c := newCluster(t)
	h := c.newHostWith(t, "host-a", metricsFlags...)
	manifest := filepath.Join(t.TempDir(), "routes.yaml")
	writeRouteManifest(t, manifest, bulkPrefixes(n))
	c.mustCtl(t, "", "apply", "-f", manifest)
	tel := h.telemetry(t)
	waitFor(t, fmt.Sprintf("%d routes counted PROGRAMMED", n), func() bool { return tel.metrics(t)[routesProgrammed] == n })

	c.nimbus.stop(t)
	h.agent.stop(t)
	h.startAgentWith(t, metricsFlags...)
	tel = h.telemetry(t)
	reasons := tel.waitReady(t)
	t.Logf("/readyz before the restored agent was ready: %q", reasons)
	// Ready means every restored route was reconciled by this agent, without nimbus.
	m := tel.metrics(t)
	if m[routeReconciles] < n || m[watchConnected] != 0 || m[delphiSynced] != 1 || m[agentReady] != 1 {
		t.Errorf("once ready on restored state: %s = %v, %s = %v, %s = %v, %s = %v; want at least %d, 0, 1, 1",
			routeReconciles, m[routeReconciles], watchConnected, m[watchConnected], delphiSynced, m[delphiSynced], agentReady, m[agentReady], n)
	}
	waitFor(t, "the restored routes counted PROGRAMMED", func() bool { return tel.metrics(t)[routesProgrammed] == n })
	tel.wantHealthy(t)

	h.agent.stop(t)
	h.startAgentWith(t, append([]string{"--discard-state"}, metricsFlags...)...)
	tel = h.telemetry(t)
	const notSynced = "desired state not complete yet: neither restored from disk nor synced with nimbus"
	waitFor(t, "/readyz to say the desired state is missing", func() bool {
		code, body := tel.get(t, "/readyz")
		if code != http.StatusServiceUnavailable {
			t.Fatalf("GET /readyz of an empty agent without nimbus = %d %q, want 503", code, body)
		}
		return strings.Contains(body, notSynced)
	})
	tel.wantHealthy(t)
	m = tel.metrics(t)
	if m[delphiSynced] != 0 || m[agentReady] != 0 || m[routeReconciles] != 0 {
		t.Errorf("empty agent without nimbus: %s = %v, %s = %v, %s = %v; want 0, 0, 0",
			delphiSynced, m[delphiSynced], agentReady, m[agentReady], routeReconciles, m[routeReconciles])
	}
	if code, body := tel.get(t, "/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, notSynced) {
		t.Errorf("GET /readyz of an empty agent without nimbus = %d %q, want 503 saying %q", code, body, notSynced)
	}

	c.startNimbus(t)
	reasons = tel.waitReady(t)
	t.Logf("/readyz before the empty agent was ready: %q", reasons)
	m = tel.metrics(t)
	if m[routeReconciles] < n || m[watchSnapshots] != 1 || m[delphiSynced] != 1 {
		t.Errorf("once ready after nimbus came back: %s = %v, %s = %v, %s = %v; want at least %d, 1, 1",
			routeReconciles, m[routeReconciles], watchSnapshots, m[watchSnapshots], delphiSynced, m[delphiSynced], n)
	}
	waitFor(t, "the synced routes counted PROGRAMMED", func() bool { return tel.metrics(t)[routesProgrammed] == n })
}
