package nimbus

import (
	"fmt"
	"testing"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// BenchmarkPusherMarks measures what a replica pays to mark its agents' reports for one
// peer: frames of 1,000 statuses, each marked, then taken whole for the next frame, as
// during a snapshot of a fleet (routes as users name them, nodes of a fleet of 10,000).
//
//	go test -run '^$' -bench PusherMarks -benchmem ./nimbus/
func BenchmarkPusherMarks(b *testing.B) {
	const frame = 1000
	p := &pusher{wake: make(chan struct{}, 1),
		statuses: map[statusKey]struct{}{}, watermarks: map[string]struct{}{}, nodes: map[string]struct{}{}}
	keys := make([]nimbusv1.Key, frame)
	nodes := make([]string, frame)
	for i := range frame {
		keys[i] = nimbusv1.Key{Kind: nimbusv1.Kind_KIND_ROUTE, Tenant: "default", Name: fmt.Sprintf("dc%d-web-%04d", 1+i%3, i)}
		nodes[i] = fmt.Sprintf("n%05d", i*7919%10000)
	}
	b.ReportAllocs()
	for b.Loop() {
		for i := range frame {
			p.markStatus(keys[i], nodes[i])
		}
		if statuses, _, _ := p.take(); len(statuses) != frame {
			b.Fatalf("%d statuses taken, want %d", len(statuses), frame)
		}
	}
}
