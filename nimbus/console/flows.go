package console

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	delphiv1 "github.com/naplesnet/naples/proto/delphi/v1"
	flowsv1 "github.com/naplesnet/naples/proto/nimbus/flows/v1"
)

// Settings of the flows page.
const (
	// maxGraphVertices bounds the endpoints the graph draws: those in the most records.
	maxGraphVertices = 24
	// observeRetry is how long the recorder waits before observing again after the
	// Server ended its observation (at its limit of observers, or shutting down).
	observeRetry = time.Second
	// graphSize is the width and height of the graph's drawing, in SVG user units.
	graphSize = 560
)

// flowRecorder keeps the latest flow records of every node. It observes the Server's
// flows (which subscribes the agents' flow taps) only while a flows page listens, so
// that an idle console costs the agents nothing; the records it kept stay for the next
// page.
type flowRecorder struct {
	c *Console
	// mu guards every field below.
	mu sync.Mutex
	// flows holds the latest records, oldest first, at most MaxFlows of them.
	flows []*delphiv1.Flow
	// notConnected holds the nodes whose flow tap is not connected, err why the last
	// observation ended, if it failed.
	notConnected []string
	err          string
	// listeners are the wake-up channels of the pages listening; cancel ends the
	// observation, running is closed when it has ended. cancel is nil while none runs.
	listeners map[chan struct{}]struct{}
	cancel    context.CancelFunc
	running   chan struct{}
	closed    bool
}

// newFlowRecorder returns an idle recorder.
func newFlowRecorder(c *Console) *flowRecorder {
	return &flowRecorder{c: c, listeners: map[chan struct{}]struct{}{}}
}

// listen registers a page, starting the observation for the first one. The channel is
// signalled when records come; release unregisters it, and the last release ends the
// observation.
func (f *flowRecorder) listen() (wake chan struct{}, release func()) {
	wake = make(chan struct{}, 1)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.listeners[wake] = struct{}{}
	if f.cancel == nil && !f.closed {
		ctx, cancel := context.WithCancel(context.Background())
		f.cancel, f.running = cancel, make(chan struct{})
		go f.observe(ctx, f.running)
	}
	return wake, func() {
		f.mu.Lock()
		delete(f.listeners, wake)
		var running chan struct{}
		if len(f.listeners) == 0 && f.cancel != nil {
			f.cancel()
			f.cancel, running = nil, f.running
		}
		f.mu.Unlock()
		if running != nil {
			<-running
		}
	}
}

// observe follows the Server's flows until ctx ends, observing again when an observation
// ends on its own.
func (f *flowRecorder) observe(ctx context.Context, done chan struct{}) {
	defer close(done)
	for {
		err := f.c.src.ObserveFlowsLocal(ctx, &flowsv1.ObserveFlowsRequest{Filter: &delphiv1.FlowsRequest{Follow: true}}, f.add)
		if ctx.Err() != nil {
			return
		}
		f.mu.Lock()
		if err != nil {
			f.err = err.Error()
		}
		f.mu.Unlock()
		f.wakeAll()
		t := time.NewTimer(observeRetry)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// add keeps the records of one response and wakes the listening pages.
func (f *flowRecorder) add(resp *flowsv1.ObserveFlowsResponse) error {
	f.mu.Lock()
	f.flows = append(f.flows, resp.GetFlows()...)
	if over := len(f.flows) - f.c.opts.MaxFlows; over > 0 {
		f.flows = slices.Delete(f.flows, 0, over)
		f.c.metrics.evicted.Add(float64(over))
	}
	f.notConnected, f.err = resp.GetNotConnected(), ""
	f.mu.Unlock()
	f.wakeAll()
	return nil
}

// wakeAll signals every listening page.
func (f *flowRecorder) wakeAll() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for ch := range f.listeners {
		select {
		case ch <- struct{}{}:
		default:
			f.c.metrics.coalesced.Inc()
		}
	}
}

// close ends the observation for good.
func (f *flowRecorder) close() {
	f.mu.Lock()
	f.closed = true
	running := f.running
	if f.cancel != nil {
		f.cancel()
		f.cancel = nil
	}
	f.mu.Unlock()
	if running != nil {
		<-running
	}
}

// flowRow is one record in the table.
type flowRow struct {
	Time                 time.Time
	Node, Event, Verdict string
	Reason, Protocol     string
	From, To             string
	Policy, Rule         string
	Denied               bool
	SourcePort, DestPort uint32
	// Bytes is a denied packet's length, or a connection's IP bytes from its initiator
	// and from the responder, "initiator/responder", as naplesctl flows shows them.
	Bytes string
}

// vertex is an endpoint of the graph, at X, Y.
type vertex struct {
	Label  string
	X, Y   float64
	LabelX float64
	Anchor string
}

// edge is who talks to whom: the records from one endpoint to another.
type edge struct {
	From, To       string
	X1, Y1, X2, Y2 float64
	Records        int
	Denied         bool
}

// flowView is what the flows page shows.
type flowView struct {
	Rows         []flowRow
	Vertices     []vertex
	Edges        []edge
	Size         int
	Kept, Max    int
	NotConnected []string
	Err          string
}

// endpointLabel names one end of a record: the Endpoint's name when it is known,
// otherwise the address.
func endpointLabel(key interface{ GetName() string }, addr string) string {
	if n := key.GetName(); n != "" {
		return n
	}
	if addr == "" {
		return "?"
	}
	return addr
}

// view returns the records, newest first, and the graph drawn from them.
func (f *flowRecorder) view() flowView {
	f.mu.Lock()
	flows := slices.Clone(f.flows)
	v := flowView{NotConnected: slices.Clone(f.notConnected), Err: f.err, Kept: len(f.flows), Max: f.c.opts.MaxFlows, Size: graphSize}
	f.mu.Unlock()

	type pair struct{ from, to string }
	edges := map[pair]*edge{}
	talks := map[string]int{}
	for _, fl := range slices.Backward(flows) {
		// The local endpoint is the source of an egress record, the destination of an
		// ingress one.
		from := endpointLabel(fl.GetEndpoint(), fl.GetSource())
		to := endpointLabel(fl.GetPeerEndpoint(), fl.GetDestination())
		if fl.GetDirection() == "ingress" {
			from = endpointLabel(fl.GetPeerEndpoint(), fl.GetSource())
			to = endpointLabel(fl.GetEndpoint(), fl.GetDestination())
		}
		denied := fl.GetEvent() == delphiv1.FlowEvent_FLOW_EVENT_DENIED
		row := flowRow{Time: fl.GetTime().AsTime(), Node: fl.GetNode(), Event: eventName(fl.GetEvent()), Verdict: fl.GetVerdict(),
			Reason: fl.GetReason(), Protocol: fl.GetProtocol(), From: from, To: to, Denied: denied,
			SourcePort: fl.GetSourcePort(), DestPort: fl.GetDestinationPort(), Bytes: strconv.FormatUint(uint64(fl.GetBytes()), 10)}
		if !denied {
			row.Bytes = fmt.Sprintf("%d/%d", fl.GetInitiatorBytes(), fl.GetResponderBytes())
		}
		if p := fl.GetPolicy(); p.GetName() != "" {
			row.Policy = p.GetName()
			row.Rule = fl.GetRuleName()
		}
		v.Rows = append(v.Rows, row)
		e := edges[pair{from, to}]
		if e == nil {
			e = &edge{From: from, To: to}
			edges[pair{from, to}] = e
		}
		e.Records++
		e.Denied = e.Denied || denied
		talks[from]++
		talks[to]++
	}

	// The endpoints in the most records, up to maxGraphVertices, on a circle, in name
	// order so that the drawing stays put as records come.
	names := make([]string, 0, len(talks))
	for n := range talks {
		names = append(names, n)
	}
	slices.SortFunc(names, func(a, b string) int { return cmp.Or(talks[b]-talks[a], cmp.Compare(a, b)) })
	names = names[:min(len(names), maxGraphVertices)]
	slices.Sort(names)
	at := map[string]vertex{}
	const mid, radius = graphSize / 2, graphSize/2 - 90
	for i, n := range names {
		a := 2*math.Pi*float64(i)/float64(len(names)) - math.Pi/2
		vx := vertex{Label: n, X: mid + radius*math.Cos(a), Y: mid + radius*math.Sin(a), Anchor: "start"}
		vx.LabelX = vx.X + 10
		if vx.X < mid-1 {
			vx.LabelX, vx.Anchor = vx.X-10, "end"
		}
		at[n] = vx
		v.Vertices = append(v.Vertices, vx)
	}
	for _, e := range edges {
		a, okA := at[e.From]
		b, okB := at[e.To]
		if !okA || !okB {
			continue
		}
		e.X1, e.Y1, e.X2, e.Y2 = a.X, a.Y, b.X, b.Y
		v.Edges = append(v.Edges, *e)
	}
	// Denied edges last, so that they are drawn over allowed ones.
	slices.SortFunc(v.Edges, func(a, b edge) int {
		return cmp.Or(boolCompare(a.Denied, b.Denied), cmp.Compare(a.From, b.From), cmp.Compare(a.To, b.To))
	})
	return v
}

// boolCompare orders false before true.
func boolCompare(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return 1
	}
	return -1
}

// eventName is the short name of a flow event: STARTED, DENIED, ENDED or ACTIVE.
func eventName(e delphiv1.FlowEvent) string {
	const prefix = "FLOW_EVENT_"
	s := e.String()
	if len(s) > len(prefix) {
		return s[len(prefix):]
	}
	return s
}

// serveFlows serves the flows page.
func (c *Console) serveFlows(w http.ResponseWriter, r *http.Request) {
	c.render(w, r, "flows", "Flows", c.flows.view())
}

// serveFlowTable serves the table and the graph of the flows page alone, which the page
// fetches when its event stream says records came.
func (c *Console) serveFlowTable(w http.ResponseWriter, r *http.Request) {
	c.render(w, r, "flowtable", "Flows", c.flows.view())
}

// serveFlowEvents streams an "update" event, at most every UpdateInterval, whenever
// records came, observing the Server's flows while it is open.
func (c *Console) serveFlowEvents(w http.ResponseWriter, r *http.Request) {
	release, ok := c.acquireStream(w)
	if !ok {
		return
	}
	defer release()
	if !c.startStream(w) {
		return
	}
	wake, stop := c.flows.listen()
	defer stop()
	c.pump(r.Context(), w, wake, nil, func() bool {
		if !c.send(w, fmt.Sprintf("event: update\ndata: %d\n\n", time.Now().UnixMilli())) {
			c.metrics.dropped.Inc()
			return false
		}
		return true
	})
}
