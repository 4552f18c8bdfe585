package console

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// fetch GETs the URL, or sends it with another method, and returns the status code and
// the body.
func fetch(t *testing.T, method, url string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(body)
}

func TestNewRefusesNegativeLimits(t *testing.T) {
	for _, opts := range []Options{{MaxObjects: -1}, {MaxNodes: -1}, {MaxClients: -2}, {MaxFlows: -1}, {UpdateInterval: -time.Second}} {
		if _, err := New(nil, opts); err == nil || !strings.Contains(err.Error(), "must not be negative") {
			t.Errorf("New(%+v) = %v, want an error naming the field", opts, err)
		}
	}
}

func TestBadRequestsNameTheParameter(t *testing.T) {
	d := startDemo(t, Options{})
	for path, want := range map[string]string{
		"?kind=Bogus":                   `kind "Bogus"`,
		"?phase=ugly":                   `phase "ugly": want one of FAILED, PENDING, STALE, PROGRAMMED`,
		"?page=-1":                      `page "-1"`,
		"events?npage=x":                `npage "x"`,
		"object?key=Route/x":            `key "Route/x": want Kind/tenant/namespace/name`,
		"object?key=Route/a/b/missing":  "object Route/a/b/missing: not found",
		"object?key=Nothing/a/b/c":      "Nothing",
		"../etc/passwd":                 "",
		"static/../../../../etc/passwd": "",
	} {
		code, body := fetch(t, http.MethodGet, d.url+path)
		if code < 400 || code >= 500 || !strings.Contains(body, want) {
			t.Errorf("GET %s = %d %q, want 4xx naming %q", path, code, body, want)
		}
	}
}

func TestOnlyReads(t *testing.T) {
	d := startDemo(t, Options{})
	before := d.srv.Revision()
	for _, path := range []string{"", "events", "nodes", "object?key=Route/default/default/to-dc2", "flows", "flows/table"} {
		for _, method := range []string{http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodPatch} {
			if code, _ := fetch(t, method, d.url+path); code != http.StatusMethodNotAllowed {
				t.Errorf("%s /ui/%s = %d, want 405", method, path, code)
			}
		}
	}
	if after := d.srv.Revision(); after != before {
		t.Errorf("revision moved from %d to %d", before, after)
	}
}

// eventStream is an open event stream of the console.
type eventStream struct {
	resp *http.Response
	sc   *bufio.Scanner
}

// openEvents opens the event stream at the URL and fails the test unless it answers 200.
func openEvents(t *testing.T, ctx context.Context, url string) *eventStream {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("GET %s = %s %q, want 200 text/event-stream", url, resp.Status, resp.Header.Get("Content-Type"))
	}
	return &eventStream{resp: resp, sc: bufio.NewScanner(resp.Body)}
}

// next returns the data of the next update event.
func (es *eventStream) next(t *testing.T) string {
	t.Helper()
	for es.sc.Scan() {
		if data, ok := strings.CutPrefix(es.sc.Text(), "data: "); ok {
			return data
		}
	}
	t.Fatalf("event stream ended: %v", es.sc.Err())
	return ""
}

// TestFlowTableCounts shows a connection's record with its bytes both ways, as naplesctl
// flows does, and a denied packet's with its length.
func TestFlowTableCounts(t *testing.T) {
	d := startDemo(t, Options{})
	d.fakeTap(t, "host-b", demoFlows(time.Now()))
	openEvents(t, t.Context(), d.url+"flows/events")
	var body string
	waitFor(t, "the flows table to show the records", func() bool {
		_, body = fetch(t, http.MethodGet, d.url+"flows/table")
		return strings.Count(body, "<tr class=") == 4
	})
	for _, want := range []string{"<td>383/279</td>", "<td>60</td>"} {
		if !strings.Contains(body, want) {
			t.Errorf("the flows table does not show %s:\n%s", want, body)
		}
	}
	if strings.Contains(body, "<td>52</td>") {
		t.Errorf("the flows table shows the ended record's packet length as its bytes:\n%s", body)
	}
}

// TestFlowsAreLimited keeps the latest MaxFlows records and counts those let go.
func TestFlowsAreLimited(t *testing.T) {
	d := startDemo(t, Options{MaxFlows: 2})
	d.fakeTap(t, "host-b", demoFlows(time.Now()))
	openEvents(t, t.Context(), d.url+"flows/events")
	waitFor(t, "the flows page to let the oldest records go", func() bool {
		return testutil.ToFloat64(d.console.metrics.evicted) == 2
	})
	if _, body := fetch(t, http.MethodGet, d.url+"flows/table"); strings.Count(body, "<tr class=") != 2 {
		t.Errorf("the flows table with MaxFlows 2 shows %d records, want 2:\n%s", strings.Count(body, "<tr class="), body)
	}
}

func TestEventStreamsAreLimited(t *testing.T) {
	d := startDemo(t, Options{MaxClients: 2})
	ctx, cancel := context.WithCancel(t.Context())
	openEvents(t, ctx, d.url+"events")
	openEvents(t, ctx, d.url+"flows/events")
	code, body := fetch(t, http.MethodGet, d.url+"events")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "--ui-max-clients") {
		t.Errorf("third event stream = %d %q, want 503 naming --ui-max-clients", code, body)
	}
	if got := testutil.ToFloat64(d.console.metrics.refused); got != 1 {
		t.Errorf("refused streams = %v, want 1", got)
	}
	// Closing one makes room for another.
	cancel()
	waitFor(t, "the streams closed", func() bool { return d.console.clients.Load() == 0 })
	openEvents(t, t.Context(), d.url+"events")
}

func TestUpdatesAreCoalesced(t *testing.T) {
	const interval = 500 * time.Millisecond
	d := startDemo(t, Options{UpdateInterval: interval})
	key := nimbusv1.NewKey(nimbusv1.Kind_KIND_ROUTE, "", "", "to-dc2")
	es := openEvents(t, t.Context(), d.url+"events?kind=Route")
	// The first update is the state of every row of the page.
	var first []rowUpdate
	if err := json.Unmarshal([]byte(es.next(t)), &first); err != nil || len(first) != 2 {
		t.Fatalf("first update = %v %v, want the 2 routes", first, err)
	}

	// Ten reports in a row: the stream sends them as few updates, the last state in the
	// last, and never two updates less than the interval apart.
	start := time.Now()
	for i := range 10 {
		d.fail(t, key, "host-c", "KernelError", fmt.Sprintf("attempt %d", i))
	}
	var updates int
	var last time.Time
	for {
		data := es.next(t)
		now := time.Now()
		if updates > 0 && now.Sub(last) < interval-50*time.Millisecond {
			t.Errorf("two updates %v apart, want at least %v", now.Sub(last), interval)
		}
		updates, last = updates+1, now
		if strings.Contains(data, "attempt 9") {
			break
		}
		if time.Since(start) > 10*time.Second {
			t.Fatal("the last report never came")
		}
	}
	if updates > 4 {
		t.Errorf("10 reports took %d updates, want them coalesced into few", updates)
	}
	if got := testutil.ToFloat64(d.console.metrics.coalesced); got == 0 {
		t.Errorf("coalesced updates = 0, want some of the 10 reports held together")
	}
	t.Logf("10 reports in %d updates", updates)
}

func TestMatrixPages(t *testing.T) {
	// 16 objects on 3 nodes, in pages of 5 rows and 2 columns.
	d := startDemo(t, Options{MaxObjects: 5, MaxNodes: 2})
	for _, tc := range []struct {
		query            string
		rows, columns    int
		nextRows, nextNs bool
	}{
		{query: "", rows: 5, columns: 2, nextRows: true, nextNs: true},
		{query: "?page=2", rows: 5, columns: 2, nextRows: true, nextNs: true},
		{query: "?page=3", rows: 1, columns: 2, nextNs: true},
		{query: "?page=4", rows: 0, columns: 2, nextNs: true},
		{query: "?npage=1", rows: 5, columns: 1, nextRows: true},
		{query: "?kind=Route&npage=1", rows: 2, columns: 1},
	} {
		code, body := fetch(t, http.MethodGet, d.url+tc.query)
		rows, columns := strings.Count(body, "<tr data-key="), strings.Count(body, `<th class="node"`)
		if tc.rows == 0 {
			columns = tc.columns // no table at all
		}
		nextRows, nextNs := strings.Contains(body, "next objects"), strings.Contains(body, "next nodes")
		if code != http.StatusOK || rows != tc.rows || columns != tc.columns || nextRows != tc.nextRows || nextNs != tc.nextNs {
			t.Errorf("GET %s = %d, %d rows, %d columns, next rows %v, next nodes %v; want 200, %d, %d, %v, %v",
				tc.query, code, rows, columns, nextRows, nextNs, tc.rows, tc.columns, tc.nextRows, tc.nextNs)
		}
	}
}
