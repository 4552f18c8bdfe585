package test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// BenchmarkTraceApplyToPath measures a trace across two nodes as an operator meets it:
// from the apply of a Trace of web1 (host-a) to db2 (host-b) to the moment its status
// at nimbus holds the full path, delivered. It reports the p50 and p99 of traces run
// one after another (goal: p99 ≤ 1 s).
func BenchmarkTraceApplyToPath(b *testing.B) {
	const traces = 50
	sc := traceCluster(b)
	spec := &nimbusv1.TraceSpec{Source: "web1", Destination: "db2", Protocol: "udp", DestinationPort: 9}
	for b.Loop() {
		var took []time.Duration
		for i := range traces {
			r := sc.trace(b, fmt.Sprintf("bench-%d", i), spec)
			if r.outcome.Result != nimbusv1.TraceDelivered || len(r.outcome.Hops) != 6 {
				b.Fatalf("trace %d: %s, want delivered in 6 hops", i, r)
			}
			took = append(took, r.took)
		}
		slices.Sort(took)
		ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
		b.ReportMetric(ms(took[len(took)/2]), "p50-ms")
		b.ReportMetric(ms(took[len(took)*99/100]), "p99-ms")
	}
}

// BenchmarkTraceDatapathCost measures what the trace checks cost real traffic while no
// trace runs: connections a second and request-response p99 between two workloads across
// the tunnel (datapathCost), with the agents' firewalls built with the checks (the
// default) and without (--fw-traces=false). Goal: conn-rate-x ≥ 1/1.02, rr-p99-x ≤ 1.02.
func BenchmarkTraceDatapathCost(b *testing.B) {
	datapathCost(b, "trace checks", nil, []string{"--fw-traces=false"})
}
