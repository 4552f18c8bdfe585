package watermark

import (
	"fmt"
	"testing"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// BenchmarkTrackerBurst follows a node through a bulk apply of 20,000 routes as its agent
// sees it: the objects come in revision order, in commits of 200, each then programmed,
// out of order within its commit, with a watermark worked out after each batch of
// changes: ns per route, two Sets and a hundredth of a Watermark.
func BenchmarkTrackerBurst(b *testing.B) {
	const n, batch = 20_000, 200
	keys := make([]nimbusv1.Key, n)
	objs := make([]*nimbusv1.Object, n)
	for i := range objs {
		objs[i] = route(fmt.Sprintf("dc%d-web-%04d", 1+i%3, i), 1, uint64(i+1), uint64(i+1))
		keys[i] = objs[i].TypedKey()
	}
	done := status(programmed, 1)
	for b.Loop() {
		tr := New(Options{})
		for start := 0; start < n; start += batch {
			for i := start; i < start+batch; i++ {
				tr.Set(keys[i], objs[i], nil)
			}
			tr.SetPosition("e", uint64(start+batch))
			tr.Watermark()
			for i := start + batch - 1; i >= start; i-- {
				tr.Set(keys[i], objs[i], done)
			}
			tr.Watermark()
		}
		if tr.Pending() != 0 {
			b.Fatalf("%d pending", tr.Pending())
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/route")
}
