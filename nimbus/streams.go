package nimbus

import (
	"context"
	"fmt"
	"path"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/naplesnet/naples/internal/pki"
	"github.com/naplesnet/naples/internal/telemetry"
	flowsv1 "github.com/naplesnet/naples/proto/nimbus/flows/v1"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// Streams per identity
//
// With TLS, every long-lived stream a client opens (Watch, ReportStatus, WatchStatus,
// and the Flows service's FlowTap and ObserveFlows) counts against its certificate's identity, per method: a node certificate may have
// Limits.NodeStreams of each open at once, a publisher certificate Limits.PublisherStreams.
// One more is refused with codes.ResourceExhausted naming the limit and the flag that
// sets it; closing a stream frees its slot at once. An agent holds one watch and one
// status stream, and for a while after a reconnect the ones the server has not yet seen
// end, so 16 per node leaves room for many quick reconnects; a publisher certificate is
// often shared by the operators' naplesctl and the controllers, hence 64. Replicas'
// push streams (PeerStatus) and flow streams (ObserveFlows with local_only) are not
// counted: a replica has one per peer, and one per observer of a peer. Without TLS no
// client has an identity and nothing is counted, as nothing is authorized.
//
// Refusals, of a stream over the limit or of a call the identity may not make, are logged
// at most once per identity and Limits.RefusalLogInterval, with the number refused since
// the last line: a client that opens ten thousand streams makes one line a minute.

// streamKey is what streams are counted by: whose, and of which method.
type streamKey struct {
	role   pki.Role
	name   string
	method string
}

// streamLimiter counts the open streams per identity and method, and refuses the ones
// over the limits; it holds the rates of each identity with streams open (rates.go).
type streamLimiter struct {
	limits *Limits
	now    func() time.Time

	// mu guards open, ids and swept.
	mu   sync.Mutex
	open map[streamKey]int
	// ids holds the rates of the identities with streams open, and of those without
	// whose rates have not yet refilled; swept is when those that have were last freed.
	ids   map[pki.Identity]*identityRates
	swept time.Time

	// gauge is naples_nimbus_streams{role,method}; refused is
	// naples_nimbus_streams_refused_total{role,method,reason}; identities is
	// naples_nimbus_stream_identities; heldRefusals is naples_nimbus_stream_refusals_held;
	// throttled and throttledSeconds are
	// naples_nimbus_status_throttled_total and naples_nimbus_status_throttled_seconds_total.
	gauge            *prometheus.GaugeVec
	refused          *prometheus.CounterVec
	identities       prometheus.Gauge
	heldRefusals     prometheus.Gauge
	throttled        prometheus.Counter
	throttledSeconds prometheus.Counter
}

// Values of the reason label of naples_nimbus_streams_refused_total.
const (
	// refusedOpen is a stream over --max-streams-per-node or --max-streams-per-publisher.
	refusedOpen = "open"
	// refusedRate is a stream over --stream-starts-per-node or --stream-starts-per-publisher.
	refusedRate = "rate"
)

// newStreamLimiter returns a limiter of the limits on the clock now, its metrics
// registered with reg; the function it returns unregisters them.
func newStreamLimiter(limits *Limits, now func() time.Time, reg prometheus.Registerer) (*streamLimiter, func(), error) {
	const ns, sub = "naples", "nimbus"
	l := &streamLimiter{
		limits: limits,
		now:    now,
		open:   map[streamKey]int{},
		ids:    map[pki.Identity]*identityRates{},
		swept:  now(),
		gauge: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "streams",
			Help: "Streams open with a client certificate, by the certificate's role and the method: Watch, ReportStatus, WatchStatus, FlowTap or ObserveFlows.",
		}, []string{"role", "method"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "streams_refused_total",
			Help: "Streams refused with ResourceExhausted, by role, method and reason: open (the certificate had --max-streams-per-node or --max-streams-per-publisher of the method open) or rate (it started streams faster than --stream-starts-per-node or --stream-starts-per-publisher).",
		}, []string{"role", "method", "reason"}),
		identities: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "stream_identities",
			Help: "Client certificates whose stream and report rates nimbus holds: those with streams open, and for a few seconds those that closed their last.",
		}),
		heldRefusals: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "stream_refusals_held",
			Help: "Refused streams waiting out --refusal-delay before they are answered.",
		}),
		throttled: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "status_throttled_total",
			Help: "Times a ReportStatus stream waited before reading its next report, because its node certificate reported faster than --status-report-bytes-per-second.",
		}),
		throttledSeconds: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "status_throttled_seconds_total",
			Help: "Seconds ReportStatus streams waited before reading their next report, because their node certificate reported faster than --status-report-bytes-per-second.",
		}),
	}
	unregister, err := telemetry.Register(reg, "Server", l.gauge, l.refused, l.identities, l.heldRefusals, l.throttled, l.throttledSeconds)
	if err != nil {
		return nil, nil, err
	}
	return l, unregister, nil
}

// limit returns how many streams of a method the role may have open, and the flag that
// sets it; 0 when the role's streams are not counted.
func (l *streamLimiter) limit(role pki.Role) (int, string) {
	switch role {
	case pki.RoleNode:
		return l.limits.NodeStreams, "--max-streams-per-node"
	case pki.RolePublisher:
		return l.limits.PublisherStreams, "--max-streams-per-publisher"
	}
	return 0, ""
}

// acquire counts a stream of the method opened by the identity, and returns the function
// that counts it closed and the identity's rates; or, when the identity has its limit of
// them open or starts streams too fast, the ResourceExhausted error to refuse it with,
// and the identity's rates for holdRefusal.
func (l *streamLimiter) acquire(id pki.Identity, fullMethod string) (release func(), rates *identityRates, err error) {
	limit, flag := l.limit(id.Role)
	if limit == 0 {
		return func() {}, nil, nil
	}
	key := streamKey{role: id.Role, name: id.Name, method: path.Base(fullMethod)}
	labels := []string{id.Role.String(), key.method}
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sweepLocked(now)
	rates = l.ids[id]
	if l.open[key] >= limit {
		l.refused.WithLabelValues(id.Role.String(), key.method, refusedOpen).Inc()
		return nil, rates, status.Errorf(codes.ResourceExhausted,
			"%s has %d %s streams open, the most nimbus allows per %s certificate (nimbus %s); close one first",
			id, limit, key.method, id.Role, flag)
	}
	if rates == nil {
		rates = newIdentityRates(id.Role, l.limits)
		l.ids[id] = rates
		l.identities.Set(float64(len(l.ids)))
	}
	if !rates.starts.AllowN(now, 1) {
		l.refused.WithLabelValues(id.Role.String(), key.method, refusedRate).Inc()
		perSecond, flag := l.startRate(id.Role)
		return nil, rates, status.Errorf(codes.ResourceExhausted,
			"%s starts streams faster than the %d a second nimbus allows per %s certificate (nimbus %s); retry later",
			id, perSecond, id.Role, flag)
	}
	rates.streams++
	l.open[key]++
	l.gauge.WithLabelValues(labels...).Inc()
	var once sync.Once
	return func() {
		once.Do(func() {
			now := l.now()
			l.mu.Lock()
			defer l.mu.Unlock()
			if l.open[key]--; l.open[key] == 0 {
				delete(l.open, key)
			}
			if rates.streams--; rates.streams == 0 && rates.held == 0 && rates.refilled(now) {
				delete(l.ids, id)
				l.identities.Set(float64(len(l.ids)))
			}
			l.gauge.WithLabelValues(labels...).Dec()
		})
	}, rates, nil
}

// holdRefusal waits Limits.RefusalDelay before a refusal of a stream of the identity
// whose rates these are is answered, or until ctx ends; at once when MaxHeldRefusals of
// the identity's refusals wait already.
func (l *streamLimiter) holdRefusal(ctx context.Context, rates *identityRates) {
	if rates == nil {
		return
	}
	l.mu.Lock()
	if rates.held >= MaxHeldRefusals {
		l.mu.Unlock()
		return
	}
	rates.held++
	l.mu.Unlock()
	l.heldRefusals.Inc()
	defer func() {
		l.mu.Lock()
		rates.held--
		l.mu.Unlock()
		l.heldRefusals.Dec()
	}()
	timer := time.NewTimer(l.limits.RefusalDelay)
	defer timer.Stop()
	select {
	case <-ctx.Done():
	case <-timer.C:
	}
}

// startRate returns how many streams per second the role may start, and the flag that
// sets it.
func (l *streamLimiter) startRate(role pki.Role) (int, string) {
	if role == pki.RoleNode {
		return l.limits.NodeStreamStarts, "--stream-starts-per-node"
	}
	return l.limits.PublisherStreamStarts, "--stream-starts-per-publisher"
}

// sweepLocked frees the rates of the identities without streams whose rates have
// refilled, at most once per refill period: what the limiter holds of identities gone
// is bounded by the ones that started a stream within two periods.
func (l *streamLimiter) sweepLocked(now time.Time) {
	if now.Sub(l.swept) < l.limits.refillPeriod() {
		return
	}
	l.swept = now
	for id, r := range l.ids {
		if r.streams == 0 && r.held == 0 && r.refilled(now) {
			delete(l.ids, id)
		}
	}
	l.identities.Set(float64(len(l.ids)))
}

// countedStream tells whether a stream of the method counts against its identity: the
// Nimbus service's Watch, ReportStatus and WatchStatus and the Flows service's FlowTap
// and ObserveFlows, not the health service's Watch.
func countedStream(fullMethod string) bool {
	switch fullMethod {
	case nimbusv1.Nimbus_Watch_FullMethodName, nimbusv1.Nimbus_ReportStatus_FullMethodName,
		nimbusv1.Nimbus_WatchStatus_FullMethodName, flowsv1.Flows_FlowTap_FullMethodName,
		flowsv1.Flows_ObserveFlows_FullMethodName:
		return true
	}
	return false
}

// logLimiter lets a line per key through at most once per interval, and counts the ones
// it held back meanwhile. What it holds is bounded: keys quiet for an interval are
// forgotten once it holds more than maxLogLimiterKeys.
type logLimiter struct {
	interval time.Duration
	now      func() time.Time

	// mu guards keys.
	mu   sync.Mutex
	keys map[string]*logLimit
}

// logLimit is what a logLimiter knows of one key.
type logLimit struct {
	last time.Time
	// held is how many lines were held back since last.
	held int
}

// maxLogLimiterKeys is how many keys a logLimiter holds before it forgets quiet ones.
const maxLogLimiterKeys = 4096

func newLogLimiter(interval time.Duration, now func() time.Time) *logLimiter {
	return &logLimiter{interval: interval, now: now, keys: map[string]*logLimit{}}
}

// allow tells whether a line for the key may be logged now, and how many were held back
// since the last one that was.
func (l *logLimiter) allow(key string) (ok bool, held int) {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.keys[key]
	if e != nil && now.Sub(e.last) < l.interval {
		e.held++
		return false, 0
	}
	if e == nil {
		if len(l.keys) >= maxLogLimiterKeys {
			for k, old := range l.keys {
				if now.Sub(old.last) >= l.interval {
					delete(l.keys, k)
				}
			}
		}
		e = &logLimit{}
		l.keys[key] = e
	}
	held = e.held
	e.last, e.held = now, 0
	return true, held
}

// refusalKey returns the key a logLimiter counts refusals of the identity by: what was
// refused.
func refusalKey(id pki.Identity, what string) string { return fmt.Sprintf("%s/%s", id, what) }
