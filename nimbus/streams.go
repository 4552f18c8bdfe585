package nimbus

import (
	"fmt"
	"path"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/naplesnet/naples/internal/pki"
	"github.com/naplesnet/naples/internal/telemetry"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// Streams per identity
//
// With TLS, every long-lived stream a client opens (Watch, ReportStatus, WatchStatus)
// counts against its certificate's identity, per method: a node certificate may have
// Limits.NodeStreams of each open at once, a publisher certificate Limits.PublisherStreams.
// One more is refused with codes.ResourceExhausted naming the limit and the flag that
// sets it; closing a stream frees its slot at once. An agent holds one watch and one
// status stream, and for a while after a reconnect the ones the server has not yet seen
// end, so 16 per node leaves room for many quick reconnects; a publisher certificate is
// often shared by the operators' naplesctl and the controllers, hence 64. Replicas'
// push streams (PeerStatus) are not counted: a replica has one per peer. Without TLS no
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
// over the limits.
type streamLimiter struct {
	limits *Limits

	// mu guards open.
	mu   sync.Mutex
	open map[streamKey]int

	// gauge is naples_nimbus_streams{role,method}; refused is
	// naples_nimbus_streams_refused_total{role,method}.
	gauge   *prometheus.GaugeVec
	refused *prometheus.CounterVec
}

// newStreamLimiter returns a limiter of the limits, its metrics registered with reg; the
// function it returns unregisters them.
func newStreamLimiter(limits *Limits, reg prometheus.Registerer) (*streamLimiter, func(), error) {
	const ns, sub = "naples", "nimbus"
	l := &streamLimiter{
		limits: limits,
		open:   map[streamKey]int{},
		gauge: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "streams",
			Help: "Streams open with a client certificate, by the certificate's role and the method: Watch, ReportStatus or WatchStatus.",
		}, []string{"role", "method"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "streams_refused_total",
			Help: "Streams refused with ResourceExhausted because their certificate had --max-streams-per-node or --max-streams-per-publisher of the method open, by role and method.",
		}, []string{"role", "method"}),
	}
	unregister, err := telemetry.Register(reg, "Server", l.gauge, l.refused)
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
// that counts it closed; or, when the identity has its limit of them open, the
// ResourceExhausted error to refuse it with.
func (l *streamLimiter) acquire(id pki.Identity, fullMethod string) (release func(), err error) {
	limit, flag := l.limit(id.Role)
	if limit == 0 {
		return func() {}, nil
	}
	key := streamKey{role: id.Role, name: id.Name, method: path.Base(fullMethod)}
	labels := []string{id.Role.String(), key.method}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open[key] >= limit {
		l.refused.WithLabelValues(labels...).Inc()
		return nil, status.Errorf(codes.ResourceExhausted,
			"%s has %d %s streams open, the most nimbus allows per %s certificate (nimbus %s); close one first",
			id, limit, key.method, id.Role, flag)
	}
	l.open[key]++
	l.gauge.WithLabelValues(labels...).Inc()
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			defer l.mu.Unlock()
			if l.open[key]--; l.open[key] == 0 {
				delete(l.open, key)
			}
			l.gauge.WithLabelValues(labels...).Dec()
		})
	}, nil
}

// countedStream tells whether a stream of the method counts against its identity: the
// Nimbus service's Watch, ReportStatus and WatchStatus, not the health service's Watch.
func countedStream(fullMethod string) bool {
	switch fullMethod {
	case nimbusv1.Nimbus_Watch_FullMethodName, nimbusv1.Nimbus_ReportStatus_FullMethodName,
		nimbusv1.Nimbus_WatchStatus_FullMethodName:
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
