package console

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/naplesnet/naples/internal/manifest"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// failDeadline is how soon after a node reports FAILED its cell must be red in an open
// matrix (the acceptance: within 2 s).
const failDeadline = 2 * time.Second

// browser starts a headless Chromium for the test and returns the context of its first
// tab, which ends with the test or after a minute. It skips the test when there is no
// Chromium and CI is unset, and fails it when CI is set.
func browser(t *testing.T) context.Context {
	t.Helper()
	var path string
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			path = p
			break
		}
	}
	if path == "" {
		if os.Getenv("CI") == "" {
			t.Skip("no Chromium on PATH (Debian: apt-get install chromium); CI unset")
		}
		t.Fatal("no Chromium on PATH (Debian: apt-get install chromium), and CI is set")
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		// Chromium's sandbox refuses to run as root, as CI does.
		chromedp.NoSandbox,
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.WindowSize(1280, 800),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelTab := chromedp.NewContext(actx)
	ctx, cancelTimeout := context.WithTimeout(ctx, time.Minute)
	t.Cleanup(func() {
		cancelTimeout()
		cancelTab()
		cancelAlloc()
	})
	// Starts the browser now, so that its start-up does not count against a deadline.
	if err := chromedp.Do(ctx, chromedp.Navigate("about:blank")); err != nil {
		t.Fatalf("starting Chromium %s: %v", path, err)
	}
	return ctx
}

// eval evaluates the JavaScript expression in the page and returns its value.
func eval[T any](t *testing.T, ctx context.Context, expr string) T {
	t.Helper()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		t.Fatalf("evaluating %s: %v", expr, err)
	}
	return v
}

// cellJS is the expression of the matrix cell of the object on the node.
func cellJS(id, node string) string {
	return fmt.Sprintf(`document.querySelector('tr[data-key=%q] td[data-node=%q]')`, id, node)
}

func TestBrowserMatrixTurnsRedWithinDeadline(t *testing.T) {
	ctx := browser(t)
	d := startDemo(t, Options{})
	route := nimbusv1.NewKey(nimbusv1.Kind_KIND_ROUTE, "", "", "to-backup")
	id := route.ID()

	if err := chromedp.Do(ctx, chromedp.Navigate(d.url), chromedp.WaitVisible("#matrix")); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"host-b", "host-c"} {
		if got := eval[string](t, ctx, cellJS(id, n)+`.dataset.phase`); got != phaseProgrammed {
			t.Fatalf("cell of %s on %s is %q before any failure, want %s", id, n, got, phaseProgrammed)
		}
	}
	if got := eval[string](t, ctx, cellJS(id, "host-a")+`.dataset.phase`); got != "" {
		t.Fatalf("cell of %s on host-a, which it does not target, is %q, want none", id, got)
	}
	// The event stream is open before the report, so that the cell can only turn red
	// through it, not through a reload.
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](`document.getElementById("live").textContent === "live"`,
		chromedp.WithPollingTimeout(10*time.Second))); err != nil {
		t.Fatalf("the matrix's event stream did not open: %v", err)
	}

	const msg = "adding route 203.0.113.0/24 via 10.10.0.3: network is unreachable"
	d.fail(t, route, "host-b", "KernelError", msg)
	reported := time.Now()
	red := cellJS(id, "host-b") + `.dataset.phase === "FAILED" && getComputedStyle(` + cellJS(id, "host-b") + `).backgroundColor === "rgb(217, 48, 37)"`
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](red, chromedp.WithPollingInterval(10*time.Millisecond),
		chromedp.WithPollingTimeout(5*failDeadline))); err != nil {
		t.Fatalf("the cell of %s on host-b did not turn red: %v", id, err)
	}
	took := time.Since(reported)
	t.Logf("the cell turned red %v after the report", took)
	if took > failDeadline {
		t.Errorf("the cell turned red %v after the report, want at most %v", took, failDeadline)
	}
	if got := eval[string](t, ctx, cellJS(id, "host-b")+`.title`); !strings.Contains(got, msg) || !strings.Contains(got, "KernelError") {
		t.Errorf("title of the red cell = %q, want the reason and the message %q", got, msg)
	}
	if got := eval[string](t, ctx, cellJS(id, "host-c")+`.dataset.phase`); got != phaseProgrammed {
		t.Errorf("cell on host-c = %q after host-b failed, want %s", got, phaseProgrammed)
	}
	// A click shows the message under the matrix.
	if err := chromedp.Do(ctx, chromedp.Click(fmt.Sprintf(`tr[data-key=%q] td[data-node="host-b"]`, id)), chromedp.WaitVisible("#detail")); err != nil {
		t.Fatal(err)
	}
	if got := eval[string](t, ctx, `document.getElementById("detail").textContent`); !strings.Contains(got, msg) {
		t.Errorf("detail after a click = %q, want the message %q", got, msg)
	}

	// The phase filter keeps the failing object alone.
	if err := chromedp.Do(ctx, chromedp.Navigate(d.url+"?phase=FAILED"), chromedp.WaitVisible("#matrix")); err != nil {
		t.Fatal(err)
	}
	if got := eval[[]string](t, ctx, `[...document.querySelectorAll("#matrix tbody tr")].map(tr => tr.dataset.key)`); len(got) != 1 || got[0] != id {
		t.Errorf("rows with phase=FAILED = %q, want [%s]", got, id)
	}
	// The kind and tenant filters.
	if err := chromedp.Do(ctx, chromedp.Navigate(d.url+"?kind=Network&tenant=acme"), chromedp.WaitVisible("#matrix")); err != nil {
		t.Fatal(err)
	}
	if got := eval[[]string](t, ctx, `[...document.querySelectorAll("#matrix tbody tr")].map(tr => tr.dataset.key)`); len(got) != 1 || got[0] != "Network/acme/default/green" {
		t.Errorf("rows of kind=Network&tenant=acme = %q, want [Network/acme/default/green]", got)
	}
}

func TestBrowserNodesObjectAndFlowsPages(t *testing.T) {
	ctx := browser(t)
	d := startDemo(t, Options{})
	d.fakeTap(t, "host-b", demoFlows(time.Now()))

	// Nodes: every node connected and ready.
	if err := chromedp.Do(ctx, chromedp.Navigate(d.url+"nodes"), chromedp.WaitVisible("#nodes")); err != nil {
		t.Fatal(err)
	}
	rows := eval[[]string](t, ctx, `[...document.querySelectorAll("#nodes tbody tr")].map(tr => tr.dataset.node + " " + tr.querySelector(".state").textContent.trim() + " " + tr.querySelector(".ready").textContent + " " + tr.querySelector(".agent").textContent)`)
	want := []string{"host-a connected ready v1.4.2", "host-b connected ready v1.4.2", "host-c connected ready v1.4.1"}
	if strings.Join(rows, "|") != strings.Join(want, "|") {
		t.Errorf("nodes page rows = %q, want %q", rows, want)
	}

	// Each node's last report, and a node whose agent stopped watching: disconnected,
	// since when, and not ready.
	if got := eval[string](t, ctx, `document.querySelector('#nodes tr[data-node="host-a"] td.lastreport').textContent`); !strings.HasSuffix(got, " ago") {
		t.Errorf("last report of host-a = %q, want how long ago", got)
	}
	stop := d.watch(t, d.target, "host-d", "v1.4.2")
	waitFor(t, "host-d connected", func() bool { return d.connected("host-d") })
	d.report(t, &nimbusv1.StatusReport{Watermark: &nimbusv1.StatusWatermark{Node: "host-d", Epoch: d.srv.Epoch(), Revision: d.srv.Revision()}})
	stop()
	waitFor(t, "host-d disconnected", func() bool { return !d.connected("host-d") })
	if err := chromedp.Do(ctx, chromedp.Navigate(d.url+"nodes"), chromedp.WaitVisible("#nodes")); err != nil {
		t.Fatal(err)
	}
	if got := eval[string](t, ctx, `(r => r.querySelector(".state").textContent.trim() + " " + r.querySelector(".ready").textContent)(document.querySelector('#nodes tr[data-node="host-d"]'))`); !strings.HasPrefix(got, "disconnected since ") || !strings.HasSuffix(got, " not ready") {
		t.Errorf("nodes page row of host-d after its watch ended = %q, want disconnected since ..., not ready", got)
	}

	// One object: its spec as YAML, the generations its nodes run and each node's status.
	d.fail(t, nimbusv1.NewKey(nimbusv1.Kind_KIND_ROUTE, "", "", "to-backup"), "host-c", "KernelError", "network is unreachable")
	if err := chromedp.Do(ctx, chromedp.Navigate(d.url+"object?key=Route/default/default/to-backup"), chromedp.WaitVisible("#spec")); err != nil {
		t.Fatal(err)
	}
	if got := eval[string](t, ctx, `document.querySelector('#nodestatus tr[data-node="host-c"]').textContent`); !strings.Contains(got, "FAILED") || !strings.Contains(got, "KernelError") || !strings.Contains(got, "network is unreachable") {
		t.Errorf("object page status of host-c = %q, want FAILED with its reason and message", got)
	}
	if got := eval[string](t, ctx, `document.querySelector("#generations tbody").textContent.trim()`); got != "1 (current)2" {
		t.Errorf("object page generations = %q, want generation 1 (current) run by its 2 nodes", got)
	}
	spec := eval[string](t, ctx, `document.getElementById("spec").textContent`)
	for _, w := range []string{"kind: Route", "prefix: 203.0.113.0/24", "gateway: 10.10.0.4", "- host-b"} {
		if !strings.Contains(spec, w) {
			t.Errorf("object page spec lacks %q:\n%s", w, spec)
		}
	}
	if got := eval[string](t, ctx, `document.getElementById("generation").textContent`); !strings.HasPrefix(got, "1 ") {
		t.Errorf("object page generation = %q, want 1", got)
	}

	// Flows: the records of host-b's tap in the table, and a red dashed edge for the
	// denied one, once the page's event stream made nimbus subscribe the tap.
	if err := chromedp.Do(ctx, chromedp.Navigate(d.url+"flows"), chromedp.WaitVisible("#flowtable")); err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](`document.querySelectorAll("#flows tbody tr.denied").length === 1 && document.querySelectorAll("#flows tbody tr").length === 4`,
		chromedp.WithPollingTimeout(10*time.Second))); err != nil {
		t.Fatalf("the flows table did not show the 4 records with one denied: %v", err)
	}
	edges := eval[[]string](t, ctx, `[...document.querySelectorAll("#graph line.edge")].map(e => e.dataset.from + ">" + e.dataset.to + (e.classList.contains("denied") ? " denied " + getComputedStyle(e).strokeDasharray : ""))`)
	want = []string{"web-a>web-b", "web-b>db-c denied 6px, 4px"}
	if strings.Join(edges, "|") != strings.Join(want, "|") {
		t.Errorf("graph edges = %q, want %q", edges, want)
	}
}

// screenshots are the pictures of the console's pages in docs/, one a page, that
// TestScreenshots takes: the file, the page's path, what is visible once it is ready.
var screenshots = []struct {
	file, path, ready string
	// prepare runs before the screenshot, after ready is visible.
	prepare chromedp.Action[chromedp.Void]
}{
	{"ui-matrix.png", "", "#matrix", chromedp.Click(`tr[data-key="Route/default/default/to-dc2"] td[data-node="host-c"]`)},
	{"ui-nodes.png", "nodes", "#nodes", nil},
	{"ui-object.png", "object?key=Route/default/default/to-backup", "#spec", nil},
	{"ui-flows.png", "flows", "#flowtable", chromedp.Poll[chromedp.Void](`document.querySelectorAll("#flows tbody tr").length === 4`)},
}

// TestScreenshotsShownInReadme: the screenshot of each page is committed in docs/, a PNG,
// and README.md shows it.
func TestScreenshotsShownInReadme(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range screenshots {
		b, err := os.ReadFile(filepath.Join("../../docs", s.file))
		if err != nil || !strings.HasPrefix(string(b), "\x89PNG\r\n\x1a\n") {
			t.Errorf("docs/%s: not a PNG (%v); make screenshots writes it", s.file, err)
		}
		if !strings.Contains(string(readme), "](docs/"+s.file+")") {
			t.Errorf("README.md does not show docs/%s", s.file)
		}
	}
}

// TestScreenshots writes docs/ui-*.png from the demo state with host-c failing, when
// NAPLES_SCREENSHOTS names the directory to write them to (make screenshots); it skips
// otherwise, so that tests never rewrite the committed images.
func TestScreenshots(t *testing.T) {
	dir := os.Getenv("NAPLES_SCREENSHOTS")
	if dir == "" {
		t.Skip("NAPLES_SCREENSHOTS unset; make screenshots sets it")
	}
	ctx := browser(t)
	d := startDemo(t, Options{})
	d.fakeTap(t, "host-b", demoFlows(time.Now()))
	d.fail(t, nimbusv1.NewKey(nimbusv1.Kind_KIND_ROUTE, "", "", "to-dc2"), "host-c", "KernelError",
		"adding route 198.51.100.0/24 via 10.10.0.2: network is unreachable")
	d.fail(t, nimbusv1.NewKey(nimbusv1.Kind_KIND_ROUTE, "", "", "to-backup"), "host-c", "KernelError",
		"adding route 203.0.113.0/24 via 10.10.0.3: network is unreachable")
	// A route applied after the nodes last reported is PENDING everywhere.
	lab, err := manifest.Decode(strings.NewReader("kind: Route\nmeta: {name: to-lab}\nspec: {table: 100, prefix: 192.0.2.0/24, nexthops: [{gateway: 10.10.0.5}]}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.client.Apply(t.Context(), &nimbusv1.ApplyRequest{Object: lab[0]}); err != nil {
		t.Fatal(err)
	}

	for _, s := range screenshots {
		steps := []chromedp.Action[chromedp.Void]{chromedp.Navigate(d.url + s.path), chromedp.WaitVisible(s.ready)}
		if s.prepare != nil {
			steps = append(steps, s.prepare)
		}
		if err := chromedp.Do(ctx, steps...); err != nil {
			t.Fatalf("%s: %v", s.file, err)
		}
		png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatalf("%s: %v", s.file, err)
		}
		if err := os.WriteFile(filepath.Join(dir, s.file), png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote %s", filepath.Join(dir, s.file))
	}
}
