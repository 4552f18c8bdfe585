package nimbus

import (
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	"github.com/naplesnet/naples/internal/pki"
)

// Rates per identity
//
// With TLS, each client identity with streams open has two token buckets, shared by all
// its streams:
//
//   - stream starts: a node certificate may start Limits.NodeStreamStarts streams (Watch,
//     ReportStatus) a second, a publisher Limits.PublisherStreamStarts (Watch,
//     WatchStatus), StreamStartBurstSeconds' worth at once. A stream started beyond is
//     refused with codes.ResourceExhausted naming the limit and its flag, as a stream
//     over the count of streams.go is; agents back off and retry on it. Each Watch start
//     may cost a snapshot, so a loop of watches opened and closed cannot make nimbus
//     send snapshots without end.
//   - status report bytes, for node certificates: Limits.StatusReportBytesPerSecond, up
//     to Limits.StatusReportBurstBytes at once. Before a ReportStatus stream reads a
//     report it waits while the bucket is in debt, then takes from it the size of the
//     largest report the node has sent, and once it has read the report pays what that
//     one used instead: of the many streams of a node that sends large reports only as
//     many read at once as the burst pays for, the others wait, and gRPC's flow control
//     (a window of 1 MiB a stream) holds the node back rather than nimbus buffering what
//     it sends. Before a node's first report the largest is taken to be 16 MiB, gRPC's
//     limit of a request; a node that sends small reports first and then large ones
//     has at most Limits.NodeStreams of them read at once, once.
//
// An identity's buckets are freed when it has no streams open and they have refilled,
// so that many certificates that come and go leave nothing behind. Replicas' peer pushes
// are not limited.

// identityRates are the token buckets of one identity. Its fields are guarded by the
// streamLimiter's mu; the buckets have locks of their own.
type identityRates struct {
	// streams counts the identity's open streams, of every method; held its refusals
	// waiting out Limits.RefusalDelay.
	streams, held int
	// starts is the bucket of stream starts.
	starts *rate.Limiter
	// reports is the bucket of status report bytes; nil but for nodes.
	reports *byteBucket
	// largest is the size of the largest report the identity has sent.
	largest atomic.Int64
}

// newIdentityRates returns full buckets for an identity of the role.
func newIdentityRates(role pki.Role, l *Limits) *identityRates {
	perSecond := l.PublisherStreamStarts
	if role == pki.RoleNode {
		perSecond = l.NodeStreamStarts
	}
	r := &identityRates{starts: rate.NewLimiter(rate.Limit(perSecond), perSecond*StreamStartBurstSeconds)}
	if role == pki.RoleNode {
		r.reports = newByteBucket(l.StatusReportBytesPerSecond, l.StatusReportBurstBytes)
	}
	return r
}

// refilled tells whether the identity's buckets are full at now: forgetting them then
// changes nothing.
func (r *identityRates) refilled(now time.Time) bool {
	return r.starts.TokensAt(now) >= float64(r.starts.Burst()) && (r.reports == nil || r.reports.full(now))
}

// refillPeriod returns the time an empty bucket of the limits takes to fill.
func (l *Limits) refillPeriod() time.Duration {
	reports := time.Duration(float64(l.StatusReportBurstBytes) / float64(l.StatusReportBytesPerSecond) * float64(time.Second))
	return max(StreamStartBurstSeconds*time.Second, reports)
}

// byteBucket is a token bucket of bytes that may go into debt, and that takes back what
// was taken for more than was used. Its methods are safe for concurrent use.
type byteBucket struct {
	perSecond float64
	burst     float64

	// mu guards tokens and last.
	mu     sync.Mutex
	tokens float64
	last   time.Time
}

func newByteBucket(perSecond, burst int) *byteBucket {
	return &byteBucket{perSecond: float64(perSecond), burst: float64(burst), tokens: float64(burst)}
}

// refillLocked adds what the bucket earned since last.
func (b *byteBucket) refillLocked(now time.Time) {
	if !b.last.IsZero() && now.After(b.last) {
		b.tokens = min(b.burst, b.tokens+now.Sub(b.last).Seconds()*b.perSecond)
	}
	if b.last.IsZero() || now.After(b.last) {
		b.last = now
	}
}

// debt returns how long the bucket takes, from now, to be out of debt; 0 when it is not
// in debt.
func (b *byteBucket) debt(now time.Time) time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.refillLocked(now)
	if b.tokens >= 0 {
		return 0
	}
	return time.Duration(-b.tokens / b.perSecond * float64(time.Second))
}

// take takes n bytes, going into debt if need be; a negative n gives -n back, up to the
// burst.
func (b *byteBucket) take(now time.Time, n int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.refillLocked(now)
	b.tokens = min(b.burst, b.tokens-float64(n))
}

// full tells whether the bucket holds its burst at now.
func (b *byteBucket) full(now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.refillLocked(now)
	return b.tokens >= b.burst
}

// throttledStream is a ReportStatus stream of a node that, before it reads a report,
// waits while the node's bucket of report bytes is in debt, and then takes from it the
// size of the largest report the node has sent (16 MiB before its first): the reports
// read before, on any of the node's streams, are paid for first, and of the many streams
// of a node that sends large reports only as many read at once as the burst pays for.
// Once it has read the report it pays what the report used instead.
type throttledStream struct {
	grpc.ServerStream
	rates   *identityRates
	limiter *streamLimiter
}

// RecvMsg waits for the bucket, then reads the next report and pays for it.
func (t *throttledStream) RecvMsg(m any) error {
	bucket := t.rates.reports
	for waited := false; ; waited = true {
		d := bucket.debt(t.limiter.now())
		if d == 0 {
			break
		}
		if !waited {
			t.limiter.throttled.Inc()
		}
		if err := t.pause(d); err != nil {
			return err
		}
	}
	// Until the node has sent a report, one may be as large as gRPC lets a request be.
	// A report larger than the burst (a limit set below that) takes the burst.
	ahead := t.rates.largest.Load()
	if ahead == 0 {
		ahead = maxRecvMsgSize
	}
	ahead = min(ahead, int64(bucket.burst))
	bucket.take(t.limiter.now(), int(ahead))
	if err := t.ServerStream.RecvMsg(m); err != nil {
		bucket.take(t.limiter.now(), -int(ahead))
		return err
	}
	n := 0
	if sized, ok := m.(interface{ SizeVT() int }); ok {
		n = sized.SizeVT()
	}
	for largest := t.rates.largest.Load(); int64(n) > largest && !t.rates.largest.CompareAndSwap(largest, int64(n)); {
		largest = t.rates.largest.Load()
	}
	bucket.take(t.limiter.now(), min(n, int(bucket.burst))-int(ahead))
	return nil
}

// pause waits d, or until the stream ends, and counts the time waited.
func (t *throttledStream) pause(d time.Duration) error {
	ctx := t.Context()
	timer := time.NewTimer(max(d, time.Millisecond))
	defer timer.Stop()
	start := time.Now()
	defer func() { t.limiter.throttledSeconds.Add(time.Since(start).Seconds()) }()
	select {
	case <-ctx.Done():
		return status.FromContextError(ctx.Err()).Err()
	case <-timer.C:
		return nil
	}
}
