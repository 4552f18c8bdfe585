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
	t := newTables()
	w := &writeTxn{tables: t}
	keys, ids, names := fillStatusTables(w)
	objects, nodes := len(keys), len(names)
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

// The statuses the status table benchmarks hold: 10 nodes' on each of 10,000 objects.
const benchStatusObjects, benchStatusNodes = 10_000, 10

// fillStatusTables writes into w a status of each of benchStatusNodes nodes on each of
// benchStatusObjects routes with names as users write them, and returns the routes'
// keys, their key IDs and the nodes' names.
func fillStatusTables(w *writeTxn) (keys []nimbusv1.Key, ids, names []string) {
	keys = make([]nimbusv1.Key, benchStatusObjects)
	ids = make([]string, benchStatusObjects)
	for i := range keys {
		keys[i] = nimbusv1.MakeKey(nimbusv1.Kind_KIND_ROUTE, "tenant-a", "prod", fmt.Sprintf("dc%d-web-%05d", i%3+1, i))
		ids[i] = keys[i].String()
	}
	names = make([]string, benchStatusNodes)
	for n := range names {
		names[n] = fmt.Sprintf("host-%04d", n*997)
	}
	for i := range keys {
		for _, n := range names {
			w.putStatus(&statusRecord{Object: keys[i], objectID: ids[i], Node: n, Status: &nimbusv1.NodeStatus{Node: n}})
		}
	}
	return keys, ids, names
}

// BenchmarkStatusTableCommits writes statuses as the reports of a fleet reach a replica:
// transactions of 1,024 writes, each of a random node's status of a random object, into
// the tables fillStatusTables fills, every transaction published as a commit publishes
// it. Per op: one write, and its share of the copies of the tree nodes its transaction
// touched.
func BenchmarkStatusTableCommits(b *testing.B) {
	const perTxn = 1024
	st := newStore()
	w := st.write()
	keys, ids, names := fillStatusTables(w)
	objects, nodes := len(keys), len(names)
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
