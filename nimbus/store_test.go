package nimbus

import (
	"fmt"
	"regexp"
	"slices"
	"sync"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// storeContents is what a version of the store holds, as its reads return it.
type storeContents struct {
	rev        uint64
	objects    []string // key IDs, in the order objectsOfKind returns them
	routes     []string // key IDs of the routes
	statuses   []string // "keyID@node", by object then node
	byNode     []string // "node:keyID", by node, then sorted by object (statusesBy has no order)
	watchNodes []string // "name/streams"
}

func contentsOf(tb *tables) storeContents {
	var c storeContents
	c.rev = tb.revision()
	for rec := range tb.objectsOfKind(nimbusv1.Kind_KIND_UNSPECIFIED) {
		c.objects = append(c.objects, rec.Key.String())
		if got := tb.object(rec.Key); got != rec {
			panic(fmt.Sprintf("object(%s) is not the record the scan returned", rec.Key))
		}
		for _, st := range tb.statusesOf(rec.Key) {
			c.statuses = append(c.statuses, st.Object.String()+"@"+st.Node)
		}
	}
	for rec := range tb.objectsOfKind(nimbusv1.Kind_KIND_ROUTE) {
		c.routes = append(c.routes, rec.Key.String())
	}
	for rec := range tb.allWatchNodes() {
		c.watchNodes = append(c.watchNodes, fmt.Sprintf("%s/%d", rec.Name, rec.Streams))
		var mine []string
		for _, st := range tb.statusesBy(rec.Name) {
			mine = append(mine, st.Node+":"+st.Object.String())
		}
		slices.Sort(mine)
		c.byNode = append(c.byNode, mine...)
	}
	return c
}

func (c storeContents) String() string {
	return fmt.Sprintf("rev %d objects %q routes %q statuses %q by node %q watch nodes %q",
		c.rev, c.objects, c.routes, c.statuses, c.byNode, c.watchNodes)
}

// fillStore commits routes r0..r(n-1) and nodes n0..n(n-1), a status of every route from
// every node, a watch_nodes row per node, and revision rev.
func fillStore(st *store, n int, rev uint64) {
	txn := st.write()
	defer txn.abort()
	for i := range n {
		node := fmt.Sprintf("n%d", i)
		nobj := nodeObject(node)
		txn.putObject(&objectRecord{Key: nobj.TypedKey(), Object: nobj})
		txn.putWatchNode(&watchNodeRecord{Name: node, Streams: 1})
	}
	for i := range n {
		r := route(fmt.Sprintf("r%03d", i), nil)
		txn.putObject(&objectRecord{Key: r.TypedKey(), Object: r})
		for j := range n {
			txn.putStatus(&statusRecord{Object: r.TypedKey(), Node: fmt.Sprintf("n%d", j), Status: &nimbusv1.NodeStatus{}})
		}
	}
	txn.setRevision(rev)
	txn.commit()
}

// TestStoreReadIsolation checks that a read keeps seeing the version it started with while
// a write changes every table and commits, and that a write sees its own writes.
func TestStoreReadIsolation(t *testing.T) {
	st := newStore()
	fillStore(st, 3, 7)
	before := st.read()
	want := contentsOf(before)
	if len(want.objects) != 6 || len(want.routes) != 3 || len(want.statuses) != 9 || len(want.byNode) != 9 {
		t.Fatalf("filled store holds %v", want)
	}

	txn := st.write()
	txn.deleteObject(route("r000", nil).TypedKey())
	for _, rec := range txn.statusesOf(route("r000", nil).TypedKey()) {
		txn.deleteStatus(rec)
	}
	for _, rec := range txn.statusesBy("n1") {
		txn.deleteStatus(rec)
	}
	r := route("r999", nil)
	txn.putObject(&objectRecord{Key: r.TypedKey(), Object: r})
	txn.putStatus(&statusRecord{Object: r.TypedKey(), Node: "n2", Status: &nimbusv1.NodeStatus{}})
	txn.deleteWatchNode("n0")
	txn.putWatchNode(&watchNodeRecord{Name: "n1", Streams: 2})
	txn.setRevision(9)
	if got := txn.object(r.TypedKey()); got == nil || got.Object != r {
		t.Errorf("the write does not see the object it stored: %v", got)
	}
	if got := txn.object(route("r000", nil).TypedKey()); got != nil {
		t.Errorf("the write still sees the object it deleted: %v", got)
	}
	if txn.hasStatusFrom("n1") {
		t.Error("the write still sees a status of n1, whose statuses it deleted")
	}
	if got := contentsOf(before); got.String() != want.String() {
		t.Fatalf("a read changed while a write was under way:\n got %v\nwant %v", got, want)
	}
	txn.commit()
	txn.abort() // after commit, does nothing

	if got := contentsOf(before); got.String() != want.String() {
		t.Fatalf("a read changed when a write committed:\n got %v\nwant %v", got, want)
	}
	after := contentsOf(st.read())
	wantAfter := storeContents{
		rev: 9,
		objects: []string{
			"Node/default/default/n0", "Node/default/default/n1", "Node/default/default/n2",
			"Route/default/default/r001", "Route/default/default/r002", "Route/default/default/r999",
		},
		routes: []string{"Route/default/default/r001", "Route/default/default/r002", "Route/default/default/r999"},
		statuses: []string{
			"Route/default/default/r001@n0", "Route/default/default/r001@n2",
			"Route/default/default/r002@n0", "Route/default/default/r002@n2",
			"Route/default/default/r999@n2",
		},
		byNode: []string{
			"n2:Route/default/default/r001", "n2:Route/default/default/r002", "n2:Route/default/default/r999",
		},
		watchNodes: []string{"n1/2", "n2/1"},
	}
	if after.String() != wantAfter.String() {
		t.Fatalf("after the commit the store holds\n%v\nwant\n%v", after, wantAfter)
	}
}

// TestStoreAbortLeavesNothing checks that an aborted write changes neither what reads see
// nor what the next write starts from.
func TestStoreAbortLeavesNothing(t *testing.T) {
	st := newStore()
	fillStore(st, 2, 3)
	want := contentsOf(st.read())

	txn := st.write()
	for rec := range txn.objectsOfKind(nimbusv1.Kind_KIND_UNSPECIFIED) {
		txn.deleteObject(rec.Key)
	}
	for _, rec := range txn.statusesBy("n0") {
		txn.deleteStatus(rec)
	}
	r := route("new", nil)
	txn.putObject(&objectRecord{Key: r.TypedKey(), Object: r})
	txn.putWatchNode(&watchNodeRecord{Name: "n9", Streams: 1})
	txn.deleteWatchNode("n1")
	txn.setRevision(4)
	txn.abort()
	txn.abort() // twice does nothing

	if got := contentsOf(st.read()); got.String() != want.String() {
		t.Fatalf("an aborted write changed what reads see:\n got %v\nwant %v", got, want)
	}
	next := st.write() // would block if the abort had not ended the write
	defer next.abort()
	if got := contentsOf(next.tables); got.String() != want.String() {
		t.Fatalf("the write after an aborted one starts from\n%v\nwant\n%v", got, want)
	}
}

// TestStoreConcurrentReads has readers check, while a writer commits, that each version
// they read is one the writer committed, whole, and stays so while they read it again. Run
// with -race, it also checks that readers and the writer share no memory they race on.
func TestStoreConcurrentReads(t *testing.T) {
	const commits, perCommit = 200, 40
	st := newStore()
	// Commit i stores revision i, adds routes i*perCommit.. and a status for each from
	// node "n", deletes the routes of commit i-2 with their statuses, and sets the
	// watch_nodes row "n" to i streams; every commit is big enough to split and merge
	// tree nodes.
	consistent := func(tb *tables) error {
		rev := tb.revision()
		var want []string
		for i := max(int(rev)-1, 1); i <= int(rev); i++ {
			for j := range perCommit {
				want = append(want, fmt.Sprintf("Route/default/default/r%04d-%02d", i, j))
			}
		}
		var got []string
		for rec := range tb.objectsOfKind(nimbusv1.Kind_KIND_ROUTE) {
			got = append(got, rec.Key.String())
			if sts := tb.statusesOf(rec.Key); len(sts) != 1 || sts[0].Node != "n" {
				return fmt.Errorf("revision %d: %s has statuses %v, want one from n", rev, rec.Key, sts)
			}
		}
		if !slices.Equal(got, want) {
			return fmt.Errorf("revision %d: routes %q, want %q", rev, got, want)
		}
		if n := len(tb.statusesBy("n")); n != len(want) {
			return fmt.Errorf("revision %d: %d statuses from n, want %d", rev, n, len(want))
		}
		if wn := tb.watchNode("n"); rev > 0 && (wn == nil || wn.Streams != int(rev)) {
			return fmt.Errorf("revision %d: watch_nodes row of n is %+v, want %d streams", rev, wn, rev)
		}
		return nil
	}

	done := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for range 2 {
		wg.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				tb := st.read()
				first := contentsOf(tb)
				if err := consistent(tb); err != nil {
					errs <- err
					return
				}
				if again := contentsOf(tb); again.String() != first.String() {
					errs <- fmt.Errorf("a version changed while read:\n got %v\nwant %v", again, first)
					return
				}
			}
		})
	}
	stage := func(txn *writeTxn, i int) {
		for j := range perCommit {
			r := route(fmt.Sprintf("r%04d-%02d", i, j), nil)
			txn.putObject(&objectRecord{Key: r.TypedKey(), Object: r})
			txn.putStatus(&statusRecord{Object: r.TypedKey(), Node: "n", Status: &nimbusv1.NodeStatus{}})
			old := nimbusv1.MakeKey(nimbusv1.Kind_KIND_ROUTE, "", "", fmt.Sprintf("r%04d-%02d", i-2, j))
			txn.deleteObject(old)
			for _, rec := range txn.statusesOf(old) {
				txn.deleteStatus(rec)
			}
		}
		txn.putWatchNode(&watchNodeRecord{Name: "n", Streams: i})
		txn.setRevision(uint64(i))
	}
	for i := 1; i <= commits; i++ {
		if i%7 == 0 {
			// An aborted write in between changes nothing.
			txn := st.write()
			stage(txn, i)
			stage(txn, i+1)
			txn.abort()
		}
		txn := st.write()
		stage(txn, i)
		txn.commit()
	}
	close(done)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if err := consistent(st.read()); err != nil {
		t.Error(err)
	}
}

// TestObjectsInSpans checks the objects by generation revision: an object is found in
// the span that holds its generation revision, at its latest generation only, and no
// more once deleted.
func TestObjectsInSpans(t *testing.T) {
	st := newStore()
	put := func(name string, rev uint64) {
		txn := st.write()
		defer txn.abort()
		r := route(name, nil)
		r.Meta.GenerationRevision = rev
		txn.putObject(&objectRecord{Key: r.TypedKey(), Object: r})
		txn.setRevision(rev)
		txn.commit()
	}
	for i, name := range []string{"a", "b", "c", "d", "e"} {
		put(name, uint64(10+i)) // a@10 b@11 c@12 d@13 e@14
	}
	put("b", 20)
	txn := st.write()
	txn.deleteObject(route("d", nil).TypedKey())
	txn.setRevision(21)
	txn.commit()

	names := func(spans ...revSpan) []string {
		var got []string
		for rec := range st.read().objectsInSpans(spans) {
			got = append(got, fmt.Sprintf("%s@%d", rec.Key.Name, rec.genRev))
		}
		return got
	}
	for _, c := range []struct {
		spans []revSpan
		want  []string
	}{
		{[]revSpan{{0, 100}}, []string{"a@10", "c@12", "e@14", "b@20"}},
		{[]revSpan{{10, 12}}, []string{"c@12"}},                          // (10, 12]: b moved on, a is below
		{[]revSpan{{9, 10}, {13, 20}}, []string{"a@10", "e@14", "b@20"}}, // d is gone
		{[]revSpan{{14, 19}}, nil},
	} {
		if got := names(c.spans...); !slices.Equal(got, c.want) {
			t.Errorf("objects in %v: %q, want %q", c.spans, got, c.want)
		}
	}
}

// TestSkeletonWire checks that the skeleton status streams make from an encoded object
// decodes to the object's Skeleton, for objects of several kinds with every field of the
// meta set.
func TestSkeletonWire(t *testing.T) {
	for _, obj := range []*nimbusv1.Object{route("r1", []string{"a", "b"}, "192.0.2.1", "192.0.2.2"), nodeObject("n1"), {}} {
		if obj.Meta == nil {
			obj.Meta = &nimbusv1.ObjectMeta{}
		}
		m := obj.Meta
		m.Tenant, m.Namespace, m.Uid = "t1", "ns1", "u-1"
		m.Generation, m.Revision, m.GenerationRevision = 3, 1<<40, 1<<39
		m.Labels = map[string]string{"app": "web", "tier": "frontend"}
		m.CreateTime, m.UpdateTime = timestamppb.Now(), timestamppb.Now()
		wire, err := obj.MarshalVT()
		if err != nil {
			t.Fatal(err)
		}
		var got nimbusv1.Object
		if err := got.UnmarshalVT(skeletonWire(wire)); err != nil {
			t.Fatal(err)
		}
		if want := obj.Skeleton(); !proto.Equal(&got, want) {
			t.Errorf("skeletonWire of %v decodes to\n%v\nwant\n%v", obj, &got, want)
		}
	}
}

// TestNewUUID checks that newUUID returns distinct version 4 UUIDs in their canonical text
// form.
func TestNewUUID(t *testing.T) {
	form := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	seen := map[string]bool{}
	for range 100 {
		u := newUUID()
		if !form.MatchString(u) || seen[u] {
			t.Fatalf("newUUID() = %q: want a new version 4 UUID in canonical form", u)
		}
		seen[u] = true
	}
}

// TestObjectsFor checks the index of the objects by the nodes they name: a node finds
// the objects that name it, in key ID order, and none meant for every node; a change of
// an object's nodes, or of anything else, and its deletion show in the versions after,
// and a version read before keeps what it held, as objectsOnly's does.
func TestObjectsFor(t *testing.T) {
	st := newStore()
	put := func(txn *writeTxn, name string, nodes ...string) {
		r := route(name, nodes)
		txn.putObject(&objectRecord{Key: r.TypedKey(), Object: r})
	}
	names := func(tb *tables, node string) []string {
		var got []string
		for rec := range tb.objectsFor(node) {
			got = append(got, rec.Key.Name)
		}
		return got
	}
	txn := st.write()
	put(txn, "c", "n1", "n2")
	put(txn, "a", "n2")
	put(txn, "b") // every node
	put(txn, "d", "n10", "n1")
	txn.commit()
	before := st.read().objectsOnly()

	txn = st.write()
	put(txn, "c", "n2", "n3") // leaves n1
	r := route("a", []string{"n2"})
	r.Spec = &nimbusv1.Object_Route{Route: &nimbusv1.RouteSpec{Table: 100, Prefix: "10.9.0.0/16"}}
	txn.putObject(&objectRecord{Key: r.TypedKey(), Object: r}) // the same nodes, a new spec
	txn.deleteObject(route("d", nil).TypedKey())
	txn.commit()
	after := st.read()

	for _, c := range []struct {
		tb   *tables
		node string
		want []string
	}{
		{before, "n1", []string{"c", "d"}},
		{before, "n2", []string{"a", "c"}},
		{before, "n10", []string{"d"}},
		{before, "n3", nil},
		{after, "n1", nil},
		{after, "n2", []string{"a", "c"}},
		{after, "n3", []string{"c"}},
		{after, "n10", nil},
		{after, "n", nil}, // a prefix of other nodes' names
	} {
		if got := names(c.tb, c.node); !slices.Equal(got, c.want) {
			t.Errorf("objects for %s: %q, want %q", c.node, got, c.want)
		}
	}
	for rec := range after.objectsFor("n2") {
		if rec != after.object(rec.Key) {
			t.Errorf("objects for n2: %s is not the stored record", rec.Key.Name)
		}
	}
}
