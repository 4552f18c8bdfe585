package nimbus

import (
	"fmt"
	"testing"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// BenchmarkStatusTableCommits writes statuses as the reports of a fleet reach a replica:
// transactions of 1,024 writes, each of a random node's status of a random object, into
// tables that hold 100,000 (10,000 objects' on 10 nodes' each), every transaction
// published as a commit publishes it. Per op: one write, and its share of the copies of
// the tree nodes its transaction touched.
func BenchmarkStatusTableCommits(b *testing.B) {
	const objects, nodes, perTxn = 10_000, 10, 1024
	st := newStore()
	ids := make([]string, objects)
	keys := make([]nimbusv1.Key, objects)
	for i := range objects {
		keys[i] = nimbusv1.MakeKey(nimbusv1.Kind_KIND_ROUTE, "tenant-a", "prod", fmt.Sprintf("dc%d-web-%05d", i%3+1, i))
		ids[i] = keys[i].String()
	}
	names := make([]string, nodes)
	for n := range nodes {
		names[n] = fmt.Sprintf("host-%04d", n*997)
	}
	w := st.write()
	for i := range objects {
		for _, n := range names {
			w.putStatus(&statusRecord{Object: keys[i], objectID: ids[i], Node: n, Status: &nimbusv1.NodeStatus{Node: n}})
		}
	}
	w.commit()
	b.ReportAllocs()
	b.ResetTimer()
	w = st.write()
	for i := range b.N {
		if i%perTxn == perTxn-1 {
			w.commit()
			w = st.write()
		}
		o, n := i*7919%objects, names[i*31%nodes]
		w.putStatus(&statusRecord{Object: keys[o], objectID: ids[o], Node: n, Status: &nimbusv1.NodeStatus{Node: n}})
	}
	w.commit()
	if got := st.read().statuses.Len(); got != objects*nodes {
		b.Fatalf("%d statuses, want %d", got, objects*nodes)
	}
}
