package console

import (
	"context"
	"crypto/tls"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/naplesnet/naples/internal/telemetry"
	"github.com/naplesnet/naples/nimbus"
	flowsv1 "github.com/naplesnet/naples/proto/nimbus/flows/v1"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// Defaults of Options.
const (
	// DefaultMaxObjects is the default of Options.MaxObjects.
	DefaultMaxObjects = 200
	// DefaultMaxNodes is the default of Options.MaxNodes.
	DefaultMaxNodes = 100
	// DefaultMaxClients is the default of Options.MaxClients.
	DefaultMaxClients = 16
	// DefaultUpdateInterval is the default of Options.UpdateInterval.
	DefaultUpdateInterval = 250 * time.Millisecond
	// DefaultMaxFlows is the default of Options.MaxFlows.
	DefaultMaxFlows = 500
)

// heartbeatInterval is how often an idle event stream sends a comment, so that proxies
// and the browser see it alive.
const heartbeatInterval = 15 * time.Second

// Source is what the console reads: a *nimbus.Server in the same process.
type Source interface {
	List(ctx context.Context, req *nimbusv1.ListRequest) (*nimbusv1.ListResponse, error)
	Get(ctx context.Context, req *nimbusv1.GetRequest) (*nimbusv1.GetResponse, error)
	WatchStatusLocal(ctx context.Context, req *nimbusv1.WatchStatusRequest, send func(*nimbusv1.StatusFrame) error) error
	ObserveFlowsLocal(ctx context.Context, req *flowsv1.ObserveFlowsRequest, send func(*flowsv1.ObserveFlowsResponse) error) error
	Nodes() []nimbus.NodeSummary
	Revision() uint64
}

var _ Source = (*nimbus.Server)(nil)

// Options configure a Console. The zero value of every field means its default.
type Options struct {
	// Logger receives the console's logs. Default: slog.Default().
	Logger *slog.Logger
	// Registerer receives the console's metrics (naples_nimbus_console_*). Default: none.
	Registerer prometheus.Registerer
	// MaxObjects bounds the rows of one page of the matrix. Default: DefaultMaxObjects.
	MaxObjects int
	// MaxNodes bounds the columns of one page of the matrix. Default: DefaultMaxNodes.
	MaxNodes int
	// MaxClients bounds the event streams open at once. Default: DefaultMaxClients.
	MaxClients int
	// UpdateInterval is the least time between two updates of one event stream.
	// Default: DefaultUpdateInterval.
	UpdateInterval time.Duration
	// MaxFlows bounds the flow records the flows page keeps. Default: DefaultMaxFlows.
	MaxFlows int
}

// withDefaults returns o with every zero field set to its default, or an error naming a
// negative one.
func (o Options) withDefaults() (Options, error) {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	ints := []struct {
		name string
		v    *int
		def  int
	}{
		{"MaxObjects", &o.MaxObjects, DefaultMaxObjects},
		{"MaxNodes", &o.MaxNodes, DefaultMaxNodes},
		{"MaxClients", &o.MaxClients, DefaultMaxClients},
		{"MaxFlows", &o.MaxFlows, DefaultMaxFlows},
	}
	for _, f := range ints {
		switch {
		case *f.v < 0:
			return o, fmt.Errorf("console: %s %d: must not be negative", f.name, *f.v)
		case *f.v == 0:
			*f.v = f.def
		}
	}
	switch {
	case o.UpdateInterval < 0:
		return o, fmt.Errorf("console: UpdateInterval %v: must not be negative", o.UpdateInterval)
	case o.UpdateInterval == 0:
		o.UpdateInterval = DefaultUpdateInterval
	}
	return o, nil
}

// assets holds the templates, the script and the style sheet.
//
//go:embed assets
var assets embed.FS

// Console serves the pages. Make one with New; it is an http.Handler.
type Console struct {
	src     Source
	opts    Options
	log     *slog.Logger
	mux     *http.ServeMux
	pages   map[string]*template.Template
	metrics *metrics
	// clients counts the open event streams, of every page.
	clients atomic.Int64
	// flows keeps the latest flow records while a flows page listens.
	flows *flowRecorder
	// done is closed by Close; the event streams end when it is.
	done      chan struct{}
	closeOnce sync.Once
}

// New returns a Console that reads src.
func New(src Source, opts Options) (*Console, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	c := &Console{src: src, opts: opts, log: opts.Logger, mux: http.NewServeMux(), pages: map[string]*template.Template{},
		done: make(chan struct{})}
	for _, page := range []string{"matrix", "nodes", "object", "flows", "flowtable"} {
		files := []string{"assets/layout.html", "assets/" + page + ".html"}
		switch page {
		case "flows":
			files = append(files, "assets/flowtable.html")
		case "flowtable":
			files = files[1:]
		}
		t, err := template.New(page).Funcs(templateFuncs).ParseFS(assets, files...)
		if err != nil {
			return nil, fmt.Errorf("console: parsing the %s page: %w", page, err)
		}
		c.pages[page] = t
	}
	if c.metrics, err = newMetrics(opts.Registerer, func() float64 { return float64(c.clients.Load()) }); err != nil {
		return nil, err
	}
	c.flows = newFlowRecorder(c)
	static, err := fs.Sub(assets, "assets/static")
	if err != nil {
		return nil, fmt.Errorf("console: %w", err)
	}
	c.handle("GET /{$}", "matrix", c.serveMatrix)
	c.handle("GET /events", "events", c.serveMatrixEvents)
	c.handle("GET /nodes", "nodes", c.serveNodes)
	c.handle("GET /object", "object", c.serveObject)
	c.handle("GET /flows", "flows", c.serveFlows)
	c.handle("GET /flows/table", "flowtable", c.serveFlowTable)
	c.handle("GET /flows/events", "flowevents", c.serveFlowEvents)
	c.handle("GET /static/", "static", http.StripPrefix("/static/", http.FileServerFS(static)).ServeHTTP)
	return c, nil
}

// handle registers h under pattern, counting its requests under the page label.
func (c *Console) handle(pattern, page string, h http.HandlerFunc) {
	c.mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
		rec := &statusRecorder{ResponseWriter: w, code: http.StatusOK}
		h(rec, r)
		c.metrics.requests.WithLabelValues(page, strconv.Itoa(rec.code)).Inc()
	})
}

// ServeHTTP serves the console's pages; every path is relative to where it is mounted.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Content-Security-Policy", "default-src 'self'; style-src 'self'; img-src 'self' data:")
	w.Header().Set("X-Frame-Options", "DENY")
	c.mux.ServeHTTP(w, r)
}

// Close ends the event streams and unregisters the metrics. It is safe to call twice.
func (c *Console) Close() error {
	c.closeOnce.Do(func() {
		close(c.done)
		c.flows.close()
		c.metrics.unregister()
	})
	return nil
}

// statusRecorder remembers the status code a handler wrote, for the request metric.
type statusRecorder struct {
	http.ResponseWriter
	code int
}

// WriteHeader records code and writes it.
func (s *statusRecorder) WriteHeader(code int) {
	s.code = code
	s.ResponseWriter.WriteHeader(code)
}

// Flush flushes the underlying writer, which event streams need.
func (s *statusRecorder) Flush() {
	if f, ok := s.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// metrics are the console's Prometheus metrics.
type metrics struct {
	unregister func()
	// requests counts the requests by page and status code.
	requests *prometheus.CounterVec
	// refused counts the event streams refused at MaxClients.
	refused prometheus.Counter
	// coalesced counts the changes of an object held with a later one into one update.
	coalesced prometheus.Counter
	// dropped counts the updates an event stream could not send, its client being gone
	// or too slow.
	dropped prometheus.Counter
	// evicted counts the flow records the flows page let go, the oldest, to keep at most
	// MaxFlows.
	evicted prometheus.Counter
}

// newMetrics creates the metrics and registers them with reg, when it is not nil; clients
// tells how many event streams are open.
func newMetrics(reg prometheus.Registerer, clients func() float64) (*metrics, error) {
	const ns, sub = "naples", "nimbus_console"
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "requests_total",
			Help: "Requests to the web console, by page and HTTP status code.",
		}, []string{"page", "code"}),
		refused: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "event_streams_refused_total",
			Help: "Event streams of the web console refused because --ui-max-clients were open.",
		}),
		coalesced: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "updates_coalesced_total",
			Help: "Changes of an object sent to a console page together with a later change of it, in one update.",
		}),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "updates_dropped_total",
			Help: "Updates a console event stream could not send, its page being gone or too slow.",
		}),
		evicted: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "flows_evicted_total",
			Help: "Flow records the console's flows page let go, the oldest, to keep at most --ui-max-flows.",
		}),
	}
	gauge := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: ns, Subsystem: sub, Name: "event_streams",
		Help: "Event streams of the web console open now.",
	}, clients)
	m.unregister = func() {}
	if reg == nil {
		return m, nil
	}
	unregister, err := telemetry.Register(reg, "console", m.requests, m.refused, m.coalesced, m.dropped, m.evicted, gauge)
	if err != nil {
		return nil, err
	}
	m.unregister = unregister
	return m, nil
}

// Server serves a Console on a listener of its own.
type Server struct {
	addr string
	hs   *http.Server
	done chan struct{}
}

// Serve serves c on addr (host:port) until ctx ends or Close is called: HTTPS with
// tlsConfig, which should require client certificates, or plain HTTP when tlsConfig is
// nil. The console is under /ui/; / redirects there. log, slog.Default() when nil,
// receives what goes wrong with the server itself.
func Serve(ctx context.Context, addr string, tlsConfig *tls.Config, c *Console, log *slog.Logger) (*Server, error) {
	if log == nil {
		log = slog.Default()
	}
	var lc net.ListenConfig
	l, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listening for the web console on %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/ui/", http.StripPrefix("/ui", c))
	mux.Handle("GET /{$}", http.RedirectHandler("/ui/", http.StatusFound))
	s := &Server{addr: l.Addr().String(), done: make(chan struct{}),
		hs: &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, BaseContext: func(net.Listener) context.Context { return ctx },
			// Refused handshakes (a browser without a certificate) are no news to act on.
			ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug)}}
	serve := func() error { return s.hs.Serve(l) }
	if tlsConfig != nil {
		// ServeTLS offers HTTP/2 and HTTP/1.1 on the configuration's certificates.
		s.hs.TLSConfig = tlsConfig.Clone()
		serve = func() error { return s.hs.ServeTLS(l, "", "") }
	}
	go func() {
		defer close(s.done)
		if err := serve(); !errors.Is(err, http.ErrServerClosed) {
			log.Error("web console stopped; going on without it", "address", s.addr, "error", err)
		}
	}()
	go func() {
		select {
		case <-ctx.Done():
			s.Close()
		case <-s.done:
		}
	}()
	return s, nil
}

// Addr returns the address the console listens on, with the port it got for port 0.
func (s *Server) Addr() string { return s.addr }

// Close stops serving, ending open connections, and waits for the serving goroutine. It is
// safe to call twice.
func (s *Server) Close() error {
	err := s.hs.Close()
	<-s.done
	return err
}
