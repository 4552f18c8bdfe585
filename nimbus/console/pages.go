package console

import (
	"bytes"
	"fmt"
	"html/template"
	"maps"
	"net/http"
	"slices"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/naplesnet/naples/internal/manifest"
	"github.com/naplesnet/naples/internal/version"
	"github.com/naplesnet/naples/nimbus"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// templateFuncs are the functions the templates call.
var templateFuncs = template.FuncMap{
	"ago":   ago,
	"stamp": stamp,
}

// ago says how long before now t was, "never" for the zero time.
func ago(t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	return time.Since(t).Round(time.Second).String() + " ago"
}

// stamp formats t in UTC, "" for the zero time.
func stamp(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339)
}

// render executes the page's template into a buffer and writes it, so that a failing
// template answers 500 rather than half a page.
func (c *Console) render(w http.ResponseWriter, r *http.Request, page, title string, data any) {
	var b bytes.Buffer
	err := c.pages[page].ExecuteTemplate(&b, page, struct {
		Title, Page, Version string
		Data                 any
	}{title, page, version.Version, data})
	if err != nil {
		c.serverError(w, r, fmt.Errorf("rendering the %s page: %w", page, err))
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Write(b.Bytes())
}

// serverError answers 500 and logs why.
func (c *Console) serverError(w http.ResponseWriter, r *http.Request, err error) {
	c.log.Error("console: serving a page", "path", r.URL.Path, "error", err)
	http.Error(w, err.Error(), http.StatusInternalServerError)
}

// nodeRow is one node on the nodes page.
type nodeRow struct {
	nimbus.NodeSummary
	// State is "connected", "disconnected" or "stale"; Ready says whether the node runs
	// what is meant for it as far as nimbus knows: connected and nothing FAILED.
	State string
	Ready bool
}

// serveNodes serves the nodes page.
func (c *Console) serveNodes(w http.ResponseWriter, r *http.Request) {
	var rows []nodeRow
	for _, n := range c.src.Nodes() {
		nr := nodeRow{NodeSummary: n, State: "disconnected"}
		switch {
		case n.Connected():
			nr.State = "connected"
		case n.Stale:
			nr.State = "stale"
		}
		nr.Ready = n.Connected() && n.Failed == 0
		rows = append(rows, nr)
	}
	c.render(w, r, "nodes", "Nodes", struct {
		Nodes    []nodeRow
		Revision uint64
	}{rows, c.src.Revision()})
}

// generationCount is how many nodes report one generation of an object.
type generationCount struct {
	Generation int64
	Nodes      int
	Current    bool
}

// serveObject serves the page of the object named by the query parameter key,
// Kind/tenant/namespace/name.
func (c *Console) serveObject(w http.ResponseWriter, r *http.Request) {
	id := r.URL.Query().Get("key")
	key, err := nimbusv1.ParseKeyID(id)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	resp, err := c.src.Get(r.Context(), &nimbusv1.GetRequest{Key: key})
	if status.Code(err) == codes.NotFound {
		http.Error(w, fmt.Sprintf("object %s: not found", id), http.StatusNotFound)
		return
	}
	if err != nil {
		c.serverError(w, r, fmt.Errorf("getting %s: %w", id, err))
		return
	}
	item := resp.GetItem()
	var spec bytes.Buffer
	if err := manifest.Encode(&spec, manifest.YAML, item.GetObject(), nil); err != nil {
		c.serverError(w, r, fmt.Errorf("encoding %s: %w", id, err))
		return
	}
	st := item.GetStatus()
	gens := map[int64]int{}
	for _, ns := range st.GetNodes() {
		gens[ns.GetObservedGeneration()]++
	}
	var counts []generationCount
	for _, g := range slices.Backward(slices.Sorted(maps.Keys(gens))) {
		counts = append(counts, generationCount{Generation: g, Nodes: gens[g], Current: g == st.GetGeneration()})
	}
	var nodes []string
	for _, ns := range st.GetNodes() {
		nodes = append(nodes, ns.GetNode())
	}
	nodes = append(nodes, st.GetPending()...)
	slices.Sort(nodes)
	nodes = slices.Compact(nodes)
	meta := item.GetObject().GetMeta()
	c.render(w, r, "object", id, struct {
		ID          string
		Spec        string
		Meta        *nimbusv1.ObjectMeta
		Status      *nimbusv1.ObjectStatus
		Generations []generationCount
		Row         row
		Created     time.Time
		Updated     time.Time
	}{id, spec.String(), meta, st, counts, rowOf(item, nodes), meta.GetCreateTime().AsTime(), meta.GetUpdateTime().AsTime()})
}
