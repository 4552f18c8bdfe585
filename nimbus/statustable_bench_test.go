package nimbus

import (
	"fmt"
	"testing"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// BenchmarkStatusTable measures what a report costs the status tables at fleet scale:
// 100,000 records (10 nodes' exceptions on each of 10,000 objects with names as users
// write them), then, per op, a record looked up and replaced, and the record of another
// object looked up, deleted and put back, as applying an agent's or a peer's reports does.
func BenchmarkStatusTable(b *testing.B) {
	const objects, nodes = 10_000, 10
	t := newTables()
	w := &writeTxn{tables: t}
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
	for i := range objects {
		for _, n := range names {
			w.putStatus(&statusRecord{Object: keys[i], objectID: ids[i], Node: n, Status: &nimbusv1.NodeStatus{Node: n}})
		}
	}
	b.ResetTimer()
	for i := range b.N {
		o, n := i*7919%objects, names[i%nodes]
		rec := t.nodeStatusID(ids[o], n)
		if rec == nil {
			b.Fatal("lost a record")
		}
		w.putStatus(&statusRecord{Object: rec.Object, objectID: rec.objectID, Node: n, Status: rec.Status})
		other := t.nodeStatusID(ids[(o+1)%objects], n)
		w.deleteStatus(other)
		w.putStatus(other)
	}
}
