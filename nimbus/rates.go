package nimbus

import (
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
//     to Limits.StatusReportBurstBytes at once. A ReportStatus stream takes each report's
//     encoded size from the bucket once it has read it, which may put the bucket in debt,
//     and while the bucket is in debt every stream of the node waits before it reads its
//     next report: the reports read are recorded meanwhile, and gRPC's flow control holds
//     the node back rather than nimbus buffering what it sends.
//
// An identity's buckets are freed when it has no streams open and they have refilled,
// so that many certificates that come and go leave nothing behind. Replicas' peer pushes
// are not limited.

// identityRates are the token buckets of one identity. Its fields are guarded by the
// streamLimiter's mu; the buckets have locks of their own.
type identityRates struct {
	// streams counts the identity's open streams, of every method.
	streams int
	// starts is the bucket of stream starts.
	starts *rate.Limiter
	// reports is the bucket of status report bytes; nil but for nodes.
	reports *rate.Limiter
}

// newIdentityRates returns full buckets for an identity of the role.
func newIdentityRates(role pki.Role, l *Limits) *identityRates {
	perSecond := l.PublisherStreamStarts
	if role == pki.RoleNode {
		perSecond = l.NodeStreamStarts
	}
	r := &identityRates{starts: rate.NewLimiter(rate.Limit(perSecond), perSecond*StreamStartBurstSeconds)}
	if role == pki.RoleNode {
		r.reports = rate.NewLimiter(rate.Limit(l.StatusReportBytesPerSecond), l.StatusReportBurstBytes)
	}
	return r
}

// refilled tells whether the identity's buckets are full at now: forgetting them then
// changes nothing.
func (r *identityRates) refilled(now time.Time) bool {
	full := func(b *rate.Limiter) bool { return b == nil || b.TokensAt(now) >= float64(b.Burst()) }
	return full(r.starts) && full(r.reports)
}

// refillPeriod returns the time an empty bucket of the limits takes to fill.
func (l *Limits) refillPeriod() time.Duration {
	reports := time.Duration(float64(l.StatusReportBurstBytes) / float64(l.StatusReportBytesPerSecond) * float64(time.Second))
	return max(StreamStartBurstSeconds*time.Second, reports)
}

// throttledStream is a ReportStatus stream of a node that, before it reads a report,
// waits while the node's bucket of report bytes is in debt: the reports read before, on
// any of the node's streams, are paid for first.
type throttledStream struct {
	grpc.ServerStream
	reports *rate.Limiter
	limiter *streamLimiter
}

// RecvMsg waits for the bucket, then reads the next report and takes its size from it.
func (t *throttledStream) RecvMsg(m any) error {
	for waited := false; ; waited = true {
		tokens := t.reports.TokensAt(t.limiter.now())
		if tokens >= 0 {
			break
		}
		if !waited {
			t.limiter.throttled.Inc()
		}
		if err := t.pause(time.Duration(-tokens / float64(t.reports.Limit()) * float64(time.Second))); err != nil {
			return err
		}
	}
	if err := t.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	n := 0
	if sized, ok := m.(interface{ SizeVT() int }); ok {
		n = sized.SizeVT()
	}
	// The bucket goes into debt for the report. One larger than the burst (a limit set
	// below gRPC's 16 MiB) takes the burst.
	t.reports.ReserveN(t.limiter.now(), min(n, t.reports.Burst()))
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
