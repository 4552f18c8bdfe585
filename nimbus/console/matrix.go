package console

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// The phases of a matrix cell, also the CSS classes that colour it. A cell of a node the
// object does not target has none.
const (
	phaseProgrammed = "PROGRAMMED"
	phasePending    = "PENDING"
	phaseFailed     = "FAILED"
	phaseStale      = "STALE"
	// phaseUnknown is a target node nimbus left out of the object's status lists (more
	// nodes than --status-nodes): it is not known to be PROGRAMMED.
	phaseUnknown = "UNKNOWN"
)

// phases are the phases the matrix filters by, in the order the form offers them.
var phases = []string{phaseFailed, phasePending, phaseStale, phaseProgrammed}

// listPageLimit is how many objects the matrix asks the Server for at a time.
const listPageLimit = 500

// matrixQuery is what the matrix shows: its filters and the pages of rows and columns.
type matrixQuery struct {
	Kind   nimbusv1.Kind
	Tenant string
	// Phase keeps the objects with at least one cell of that phase; empty keeps all.
	Phase string
	// Page and NodePage are the pages of rows and columns, from 0.
	Page, NodePage int
}

// parseMatrixQuery reads the query parameters kind, tenant, phase, page and npage.
func parseMatrixQuery(v url.Values) (matrixQuery, error) {
	var q matrixQuery
	if k := v.Get("kind"); k != "" {
		kind, err := nimbusv1.ParseKind(k)
		if err != nil {
			return q, fmt.Errorf("kind %q: %w", k, err)
		}
		q.Kind = kind
	}
	q.Tenant = strings.TrimSpace(v.Get("tenant"))
	if p := strings.ToUpper(v.Get("phase")); p != "" {
		if !slices.Contains(phases, p) {
			return q, fmt.Errorf("phase %q: want one of %s", v.Get("phase"), strings.Join(phases, ", "))
		}
		q.Phase = p
	}
	for _, f := range []struct {
		name string
		v    *int
	}{{"page", &q.Page}, {"npage", &q.NodePage}} {
		if s := v.Get(f.name); s != "" {
			n, err := strconv.Atoi(s)
			if err != nil || n < 0 {
				return q, fmt.Errorf("%s %q: want a page number from 0", f.name, s)
			}
			*f.v = n
		}
	}
	return q, nil
}

// values returns q as query parameters, with the pages given.
func (q matrixQuery) values(page, nodePage int) url.Values {
	v := url.Values{}
	if q.Kind != nimbusv1.Kind_KIND_UNSPECIFIED {
		v.Set("kind", q.Kind.Name())
	}
	if q.Tenant != "" {
		v.Set("tenant", q.Tenant)
	}
	if q.Phase != "" {
		v.Set("phase", q.Phase)
	}
	if page > 0 {
		v.Set("page", strconv.Itoa(page))
	}
	if nodePage > 0 {
		v.Set("npage", strconv.Itoa(nodePage))
	}
	return v
}

// cell is one object on one node.
type cell struct {
	Node  string `json:"n"`
	Phase string `json:"p,omitempty"`
	// Title is what the cell says on hover: the phase, reason and message.
	Title string `json:"t,omitempty"`
}

// row is one object of the matrix with its cells, one per column.
type row struct {
	ID     string `json:"id"`
	Kind   string `json:"-"`
	Name   string `json:"-"`
	Tenant string `json:"-"`
	Gen    int64  `json:"g"`
	// Summary counts the object's nodes, as "2/3 programmed, 1 failed".
	Summary string `json:"s"`
	Cells   []cell `json:"c"`
}

// cellOf returns the phase of the object on the node, and what to say of it on hover.
// nodes holds the object's status lists by node and pending its pending nodes.
func cellOf(obj *nimbusv1.Object, st *nimbusv1.ObjectStatus, nodes map[string]*nimbusv1.NodeStatus, pending map[string]bool, node string) cell {
	c := cell{Node: node}
	ns, listed := nodes[node]
	switch {
	case listed && ns.GetStale():
		c.Phase = phaseStale
	case listed && ns.GetObservedGeneration() < st.GetGeneration():
		c.Phase = phasePending
	case listed && ns.GetPhase() == nimbusv1.Phase_PHASE_PROGRAMMED:
		c.Phase = phaseProgrammed
	case listed && ns.GetPhase() == nimbusv1.Phase_PHASE_FAILED:
		c.Phase = phaseFailed
	case listed, pending[node]:
		c.Phase = phasePending
	case !obj.TargetsNode(node):
		return c
	case st.GetPendingOmitted() > 0 || st.GetNodesOmitted() > 0:
		c.Phase = phaseUnknown
	default:
		// A target node that is neither listed nor pending is PROGRAMMED: pending names
		// every target node that is not, unless some were omitted.
		c.Phase = phaseProgrammed
	}
	c.Title = node + ": " + c.Phase
	if listed {
		if ns.GetObservedGeneration() != st.GetGeneration() {
			c.Title += fmt.Sprintf(" (generation %d of %d)", ns.GetObservedGeneration(), st.GetGeneration())
		}
		if r := ns.GetReason(); r != "" {
			c.Title += " — " + r
		}
		if m := ns.GetMessage(); m != "" {
			c.Title += ": " + m
		}
	}
	return c
}

// rowOf returns the row of the object with its status, with a cell per node of columns.
func rowOf(item *nimbusv1.ObjectWithStatus, columns []string) row {
	obj, st := item.GetObject(), item.GetStatus()
	nodes := make(map[string]*nimbusv1.NodeStatus, len(st.GetNodes()))
	for _, ns := range st.GetNodes() {
		nodes[ns.GetNode()] = ns
	}
	pending := make(map[string]bool, len(st.GetPending()))
	for _, n := range st.GetPending() {
		pending[n] = true
	}
	m := obj.GetMeta()
	r := row{ID: obj.Key().ID(), Kind: obj.Key().GetKind().Name(), Name: m.GetName(), Tenant: m.GetTenant(), Gen: st.GetGeneration(),
		Summary: fmt.Sprintf("%d/%d programmed", st.GetProgrammedNodes(), st.GetTargetNodes()), Cells: make([]cell, len(columns))}
	if f := st.GetFailedNodes(); f > 0 {
		r.Summary += fmt.Sprintf(", %d failed", f)
	}
	if s := st.GetStaleNodes(); s > 0 {
		r.Summary += fmt.Sprintf(", %d stale", s)
	}
	for i, n := range columns {
		r.Cells[i] = cellOf(obj, st, nodes, pending, n)
	}
	return r
}

// hasPhase tells whether the row has a cell of the phase, taking every target node into
// account through the object's counts, not only the columns shown.
func hasPhase(item *nimbusv1.ObjectWithStatus, phase string) bool {
	st := item.GetStatus()
	switch phase {
	case phaseFailed:
		return st.GetFailedNodes() > 0
	case phaseStale:
		return st.GetStaleNodes() > 0
	case phaseProgrammed:
		return st.GetProgrammedNodes() > 0
	case phasePending:
		return st.GetProgrammedNodes()+st.GetFailedNodes() < st.GetTargetNodes()
	}
	return true
}

// matrix is one page of the matrix.
type matrix struct {
	Query   matrixQuery
	Columns []string
	Rows    []row
	// MoreRows and MoreNodes tell whether there is a next page of rows or of columns;
	// Nodes is the number of nodes in all.
	MoreRows, MoreNodes bool
	Nodes               int
}

// buildMatrix reads the page of the matrix q asks for. It reads the objects of the kind
// and tenant in pages, keeps those of the phase and stops after the page's rows and one
// more, so that a page costs as much as the rows before it, not the whole store.
func (c *Console) buildMatrix(ctx context.Context, q matrixQuery) (*matrix, error) {
	m := &matrix{Query: q}
	var names []string
	for _, n := range c.src.Nodes() {
		names = append(names, n.Name)
	}
	m.Nodes = len(names)
	lo := min(q.NodePage*c.opts.MaxNodes, len(names))
	hi := min(lo+c.opts.MaxNodes, len(names))
	m.Columns, m.MoreNodes = names[lo:hi], hi < len(names)

	kinds := nimbusv1.Kinds()
	if q.Kind != nimbusv1.Kind_KIND_UNSPECIFIED {
		kinds = []nimbusv1.Kind{q.Kind}
	}
	skip := q.Page * c.opts.MaxObjects
	for _, kind := range kinds {
		token := ""
		for {
			resp, err := c.src.List(ctx, &nimbusv1.ListRequest{Kind: kind, Tenant: q.Tenant, Limit: listPageLimit, PageToken: token})
			if err != nil {
				return nil, fmt.Errorf("listing %s objects: %w", kind.Name(), err)
			}
			for _, item := range resp.GetItems() {
				if q.Phase != "" && !hasPhase(item, q.Phase) {
					continue
				}
				if skip > 0 {
					skip--
					continue
				}
				if len(m.Rows) == c.opts.MaxObjects {
					m.MoreRows = true
					return m, nil
				}
				m.Rows = append(m.Rows, rowOf(item, m.Columns))
			}
			if token = resp.GetNextPageToken(); token == "" {
				break
			}
		}
	}
	return m, nil
}

// serveMatrix serves the matrix page.
func (c *Console) serveMatrix(w http.ResponseWriter, r *http.Request) {
	q, err := parseMatrixQuery(r.URL.Query())
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	m, err := c.buildMatrix(r.Context(), q)
	if err != nil {
		c.serverError(w, r, err)
		return
	}
	var kinds []string
	for _, k := range nimbusv1.Kinds() {
		kinds = append(kinds, k.Name())
	}
	page := struct {
		*matrix
		Kinds, Phases  []string
		Kind           string
		Events         string
		Prev, Next     string
		PrevNodes      string
		NextNodes      string
		Limit, NodeCap int
	}{matrix: m, Kinds: kinds, Phases: phases, Events: "events?" + q.values(q.Page, q.NodePage).Encode(),
		Limit: c.opts.MaxObjects, NodeCap: c.opts.MaxNodes}
	if q.Kind != nimbusv1.Kind_KIND_UNSPECIFIED {
		page.Kind = q.Kind.Name()
	}
	if q.Page > 0 {
		page.Prev = "?" + q.values(q.Page-1, q.NodePage).Encode()
	}
	if m.MoreRows {
		page.Next = "?" + q.values(q.Page+1, q.NodePage).Encode()
	}
	if q.NodePage > 0 {
		page.PrevNodes = "?" + q.values(q.Page, q.NodePage-1).Encode()
	}
	if m.MoreNodes {
		page.NextNodes = "?" + q.values(q.Page, q.NodePage+1).Encode()
	}
	c.render(w, r, "matrix", "Propagation", page)
}

// rowUpdate is what the matrix's event stream sends of one object: its row, or that it
// was deleted.
type rowUpdate struct {
	row
	Deleted bool `json:"d,omitempty"`
}

// serveMatrixEvents streams the changes of the rows of one page of the matrix as
// server-sent events: an "update" event whose data is a JSON array of rows at most
// every UpdateInterval. It follows the objects of the page as it was when the stream
// started, the cells of its columns; objects created later show on a reload.
func (c *Console) serveMatrixEvents(w http.ResponseWriter, r *http.Request) {
	q, err := parseMatrixQuery(r.URL.Query())
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	release, ok := c.acquireStream(w)
	if !ok {
		return
	}
	defer release()
	m, err := c.buildMatrix(r.Context(), q)
	if err != nil {
		c.serverError(w, r, err)
		return
	}
	if !c.startStream(w) {
		return
	}
	shown := make(map[string]bool, len(m.Rows))
	for _, row := range m.Rows {
		shown[row.ID] = true
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()

	// The status stream's goroutine leaves the latest state of each object here; the
	// loop below sends what is there at most every UpdateInterval.
	var (
		mu      sync.Mutex
		pending = map[string]*nimbusv1.StatusEvent{}
		watched = make(chan error, 1)
	)
	wake := make(chan struct{}, 1)
	go func() {
		watched <- c.src.WatchStatusLocal(ctx, &nimbusv1.WatchStatusRequest{Kind: q.Kind, Tenant: q.Tenant}, func(f *nimbusv1.StatusFrame) error {
			mu.Lock()
			defer mu.Unlock()
			for _, ev := range f.GetEvents() {
				var id string
				switch ev.GetType() {
				case nimbusv1.StatusEvent_TYPE_PUT:
					id = ev.GetItem().GetObject().Key().ID()
				case nimbusv1.StatusEvent_TYPE_DELETE:
					id = ev.GetKey().ID()
				default:
					continue
				}
				if !shown[id] {
					continue
				}
				if _, ok := pending[id]; ok {
					c.metrics.coalesced.Inc()
				}
				pending[id] = ev
			}
			select {
			case wake <- struct{}{}:
			default:
			}
			return nil
		})
	}()

	c.pump(ctx, w, wake, watched, func() bool {
		mu.Lock()
		events := pending
		pending = map[string]*nimbusv1.StatusEvent{}
		mu.Unlock()
		updates := make([]rowUpdate, 0, len(events))
		for id, ev := range events {
			if ev.GetType() == nimbusv1.StatusEvent_TYPE_DELETE {
				updates = append(updates, rowUpdate{row: row{ID: id}, Deleted: true})
				continue
			}
			updates = append(updates, rowUpdate{row: rowOf(ev.GetItem(), m.Columns)})
		}
		data, err := json.Marshal(updates)
		if err != nil {
			c.log.Error("console: encoding an update", "error", err)
			return false
		}
		if !c.send(w, "event: update\ndata: "+string(data)+"\n\n") {
			c.metrics.dropped.Add(float64(len(updates)))
			return false
		}
		return true
	})
}

// pump runs an event stream: after each wake-up, and at most once every
// UpdateInterval, it calls update, which sends what came meanwhile as one event and
// returns false when the stream cannot go on. An idle stream sends a heartbeat comment
// every heartbeatInterval. It returns when ctx ends, the console closes, the source of
// the stream ends (ended yields) or update returns false.
func (c *Console) pump(ctx context.Context, w http.ResponseWriter, wake <-chan struct{}, ended <-chan error, update func() bool) {
	heartbeat := time.NewTicker(heartbeatInterval)
	defer heartbeat.Stop()
	var last time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.done:
			return
		case err := <-ended:
			c.log.Debug("console: the source of an event stream ended", "error", err)
			return
		case <-heartbeat.C:
			if !c.send(w, ": alive\n\n") {
				return
			}
			continue
		case <-wake:
		}
		// What changes while this waits goes into the same update.
		if wait := c.opts.UpdateInterval - time.Since(last); wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-c.done:
				t.Stop()
				return
			case <-t.C:
			}
		}
		last = time.Now()
		if !update() {
			return
		}
	}
}

// acquireStream takes the place of an event stream, unless MaxClients are open: then
// it answers 503 and returns false. release gives the place back.
func (c *Console) acquireStream(w http.ResponseWriter) (release func(), ok bool) {
	if n := c.clients.Add(1); n > int64(c.opts.MaxClients) {
		c.clients.Add(-1)
		c.metrics.refused.Inc()
		http.Error(w, fmt.Sprintf("too many open event streams (%d, --ui-max-clients)", c.opts.MaxClients), http.StatusServiceUnavailable)
		return nil, false
	}
	return func() { c.clients.Add(-1) }, true
}

// startStream answers 200 with the headers of an event stream and a first comment;
// false means the client is gone.
func (c *Console) startStream(w http.ResponseWriter) bool {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	return c.send(w, ": open\n\n")
}

// send writes s to the event stream and flushes it; false means the client is gone.
func (c *Console) send(w http.ResponseWriter, s string) bool {
	if _, err := w.Write([]byte(s)); err != nil {
		return false
	}
	if f, ok := w.(http.Flusher); ok {
		f.Flush()
	}
	return true
}
