package delphi

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

func TestMain(m *testing.M) {
	if dir := os.Getenv(crashWriterEnv); dir != "" {
		os.Exit(runCrashWriter(dir))
	}
	goleak.VerifyTestMain(m)
}

func open(t *testing.T) (*Store, *DesiredWriter, *StatusWriter) {
	t.Helper()
	return openWith(t, Options{})
}

// openWith opens a store with opts, closed when the test ends, and claims its writers.
func openWith(t *testing.T, opts Options) (*Store, *DesiredWriter, *StatusWriter) {
	t.Helper()
	s, err := Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	d, err := s.ClaimDesired()
	if err != nil {
		t.Fatal(err)
	}
	st, err := s.ClaimStatus()
	if err != nil {
		t.Fatal(err)
	}
	return s, d, st
}

func route(name string, table uint32, prefix, gw string) *nimbusv1.Object {
	return &nimbusv1.Object{
		Meta: &nimbusv1.ObjectMeta{Name: name, Generation: 1},
		Spec: &nimbusv1.Object_Route{Route: &nimbusv1.RouteSpec{Table: table, Prefix: prefix, Nexthops: []*nimbusv1.NextHop{{Gateway: gw}}}},
	}
}

func commit(t *testing.T, d *DesiredWriter, fn func(*DesiredTxn)) {
	t.Helper()
	txn := &DesiredTxn{}
	fn(txn)
	if err := d.Commit(txn); err != nil {
		t.Fatal(err)
	}
}

func next(t *testing.T, sub *Subscription) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	keys, err := sub.Next(ctx)
	if err != nil {
		t.Fatalf("Next: %v", err)
	}
	return keyIDs(keys)
}

// keyIDs returns the String forms of keys.
func keyIDs(keys []nimbusv1.Key) []string {
	ids := make([]string, len(keys))
	for i, k := range keys {
		ids[i] = k.String()
	}
	return ids
}

// pending reports whether Next would return at once.
func pending(sub *Subscription) bool {
	sub.mu.Lock()
	defer sub.mu.Unlock()
	return len(sub.order) > 0
}

func TestWritersAreClaimedOnce(t *testing.T) {
	s, _, _ := open(t)
	if _, err := s.ClaimDesired(); !errors.Is(err, ErrWriterClaimed) {
		t.Errorf("second ClaimDesired: err = %v, want ErrWriterClaimed", err)
	}
	if _, err := s.ClaimStatus(); !errors.Is(err, ErrWriterClaimed) {
		t.Errorf("second ClaimStatus: err = %v, want ErrWriterClaimed", err)
	}
}

func TestDesiredReadsAndIndexes(t *testing.T) {
	s, d, _ := open(t)
	a := route("a", 100, "198.51.100.0/24", "10.0.0.1")
	b := route("b", 100, "198.51.100.0/24", "10.0.0.2")
	c := route("c", 200, "198.51.100.0/24", "10.0.0.3")
	n := &nimbusv1.Object{Meta: &nimbusv1.ObjectMeta{Name: "host-a"}, Spec: &nimbusv1.Object_Node{Node: &nimbusv1.NodeSpec{}}}
	commit(t, d, func(txn *DesiredTxn) {
		txn.Put(c)
		txn.Put(a)
		txn.Put(b)
		txn.Put(n)
		txn.SetResume("epoch-1", 42)
	})
	a.Meta.Name = "mutated" // the store keeps its own copy
	got, ok := s.Get(nimbusv1.NewKey(nimbusv1.Kind_KIND_ROUTE, "", "", "a"))
	if !ok || got.GetMeta().GetName() != "a" {
		t.Fatalf("Get(a) = %v, %v", got, ok)
	}
	if names := names(s.List(nimbusv1.Kind_KIND_ROUTE)); !slices.Equal(names, []string{"a", "b", "c"}) {
		t.Errorf("List(Route) = %v", names)
	}
	if names := names(s.List(nimbusv1.Kind_KIND_UNSPECIFIED)); len(names) != 4 {
		t.Errorf("List(all) = %v", names)
	}
	wantIDs := []string{"Route/default/default/a", "Route/default/default/b", "Route/default/default/c"}
	if ids := keyIDs(s.Keys(nimbusv1.Kind_KIND_ROUTE)); !slices.Equal(ids, wantIDs) {
		t.Errorf("Keys(Route) = %v, want %v", ids, wantIDs)
	}
	if keys := s.Keys(nimbusv1.Kind_KIND_UNSPECIFIED); len(keys) != 4 {
		t.Errorf("Keys(all) = %v", keys)
	}
	if epoch, rev := s.Resume(); epoch != "epoch-1" || rev != 42 {
		t.Errorf("Resume() = %q, %d", epoch, rev)
	}
}

func names(objs []*nimbusv1.Object) []string {
	var out []string
	for _, o := range objs {
		out = append(out, o.GetMeta().GetName())
	}
	return out
}

func TestSnapshotReplacesStaleObjects(t *testing.T) {
	s, d, _ := open(t)
	commit(t, d, func(txn *DesiredTxn) {
		txn.Put(route("keep", 100, "10.1.0.0/24", "10.0.0.1"))
		txn.Put(route("stale", 100, "10.2.0.0/24", "10.0.0.1"))
	})
	commit(t, d, func(txn *DesiredTxn) {
		txn.Put(route("keep", 100, "10.1.0.0/24", "10.0.0.1"))
		txn.Put(route("new", 100, "10.3.0.0/24", "10.0.0.1"))
		txn.DeleteOthers(map[nimbusv1.Key]bool{})
	})
	if got := names(s.List(nimbusv1.Kind_KIND_ROUTE)); !slices.Equal(got, []string{"keep", "new"}) {
		t.Errorf("after snapshot: %v, want [keep new]", got)
	}
}

func TestSubscriptionCoalescesAndFilters(t *testing.T) {
	s, d, st := open(t)
	commit(t, d, func(txn *DesiredTxn) { txn.Put(route("existing", 1, "10.0.0.0/8", "10.0.0.1")) })

	sub, err := s.Subscribe(SubscribeOptions{Tables: []Table{TableDesired}, Kind: nimbusv1.Kind_KIND_ROUTE})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	if got := next(t, sub); !slices.Equal(got, []string{"Route/default/default/existing"}) {
		t.Fatalf("first Next = %v, want the existing key", got)
	}
	for i := range 5 {
		commit(t, d, func(txn *DesiredTxn) { txn.Put(route("x", uint32(i+1), "10.0.0.0/8", "10.0.0.1")) })
		commit(t, d, func(txn *DesiredTxn) { txn.Put(route("y", uint32(i+1), "10.0.0.0/8", "10.0.0.1")) })
	}
	commit(t, d, func(txn *DesiredTxn) {
		txn.Put(&nimbusv1.Object{Meta: &nimbusv1.ObjectMeta{Name: "n"}, Spec: &nimbusv1.Object_Node{Node: &nimbusv1.NodeSpec{}}})
	})
	if got := next(t, sub); !slices.Equal(got, []string{"Route/default/default/x", "Route/default/default/y"}) {
		t.Errorf("Next = %v, want x then y once each, and no Node", got)
	}

	// Rewriting an equal object, or an equal status, is not a change.
	commit(t, d, func(txn *DesiredTxn) { txn.Put(route("x", 5, "10.0.0.0/8", "10.0.0.1")) })
	if pending(sub) {
		t.Errorf("an unchanged Put was announced")
	}
	ssub, err := s.Subscribe(SubscribeOptions{Tables: []Table{TableStatus}})
	if err != nil {
		t.Fatal(err)
	}
	defer ssub.Close()
	key := nimbusv1.NewKey(nimbusv1.Kind_KIND_ROUTE, "", "", "x")
	status := &nimbusv1.NodeStatus{Phase: nimbusv1.Phase_PHASE_PROGRAMMED, UpdateTime: timestamppb.Now()}
	if err := st.Set(key, status); err != nil {
		t.Fatal(err)
	}
	if got := next(t, ssub); !slices.Equal(got, []string{key.ID()}) {
		t.Fatalf("status Next = %v", got)
	}
	status.UpdateTime = timestamppb.New(time.Now().Add(time.Second))
	if err := st.Set(key, status); err != nil {
		t.Fatal(err)
	}
	if pending(ssub) {
		t.Errorf("a status differing only in update time was announced")
	}
	if err := st.Delete(key); err != nil {
		t.Fatal(err)
	}
	if got := next(t, ssub); !slices.Equal(got, []string{key.ID()}) {
		t.Errorf("status delete Next = %v", got)
	}
	if _, ok := s.Status(key); ok {
		t.Errorf("status survived Delete")
	}
}

// TestSubscriptionResumeIsWhatNextHandedOut checks that a subscription's resume point is
// that of the last desired-table commit whose keys Next handed out, not of a commit it
// has yet to hand out, which the store's own resume point may already be.
func TestSubscriptionResumeIsWhatNextHandedOut(t *testing.T) {
	s, d, _ := open(t)
	commit(t, d, func(txn *DesiredTxn) {
		txn.Put(route("a", 1, "10.0.0.0/8", "10.0.0.1"))
		txn.SetResume("e1", 10)
	})
	sub, err := s.Subscribe(SubscribeOptions{Tables: []Table{TableDesired}})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	wantResume := func(when, epoch string, rev uint64) {
		t.Helper()
		if e, r := sub.Resume(); e != epoch || r != rev {
			t.Fatalf("%s: resume %s/%d, want %s/%d", when, e, r, epoch, rev)
		}
	}
	wantResume("before the first Next", "", 0)
	next(t, sub)
	wantResume("after the first Next", "e1", 10)
	commit(t, d, func(txn *DesiredTxn) {
		txn.Put(route("b", 1, "10.0.0.0/8", "10.0.0.1"))
		txn.SetResume("e1", 12)
	})
	if _, r := s.Resume(); r != 12 {
		t.Fatalf("store's resume %d, want 12", r)
	}
	wantResume("before Next hands out b", "e1", 10)
	// A commit that changes nothing a subscription hears of moves it with the next one.
	commit(t, d, func(txn *DesiredTxn) { txn.SetResume("e1", 13) })
	commit(t, d, func(txn *DesiredTxn) {
		txn.Put(route("c", 1, "10.0.0.0/8", "10.0.0.1"))
		txn.SetResume("e1", 15)
	})
	if got := next(t, sub); !slices.Equal(got, []string{"Route/default/default/b", "Route/default/default/c"}) {
		t.Fatalf("Next = %v, want b and c", got)
	}
	wantResume("after Next", "e1", 15)
}

func TestSubscriptionCloseUnblocksNext(t *testing.T) {
	s, _, _ := open(t)
	sub, err := s.Subscribe(SubscribeOptions{Tables: []Table{TableDesired}})
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		_, err := sub.Next(context.Background())
		errc <- err
	}()
	sub.Close()
	sub.Close()
	if err := <-errc; !errors.Is(err, ErrClosed) {
		t.Errorf("Next after Close: err = %v, want ErrClosed", err)
	}
	s.Close()
	if _, err := s.Subscribe(SubscribeOptions{Tables: []Table{TableDesired}}); !errors.Is(err, ErrClosed) {
		t.Errorf("Subscribe on closed store: err = %v, want ErrClosed", err)
	}
}

// TestSubscriberEndsAtFinalState writes a random mix of puts and deletes from one
// goroutine while a slow subscriber reads; once the writes stop, the state the subscriber
// last read for every key equals the store's final state.
func TestSubscriberEndsAtFinalState(t *testing.T) {
	s, d, _ := open(t)
	sub, err := s.Subscribe(SubscribeOptions{Tables: []Table{TableDesired}})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	rng := rand.New(rand.NewPCG(1, 2))
	const keys, writes = 20, 2000

	// The last write is to a sentinel key: it is the last key handed out, so once the
	// consumer has read it, it has read everything before it.
	sentinel := nimbusv1.MakeKey(nimbusv1.Kind_KIND_ROUTE, "", "", "sentinel")
	seen := map[nimbusv1.Key]*nimbusv1.Object{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			keys, err := sub.Next(context.Background())
			if err != nil {
				return
			}
			for _, id := range keys {
				obj, _ := s.Get(id.Proto())
				seen[id] = obj
				if id == sentinel {
					return
				}
			}
			time.Sleep(time.Millisecond) // a slow consumer
		}
	}()
	for i := range writes {
		name := fmt.Sprintf("r%d", rng.IntN(keys))
		commit(t, d, func(txn *DesiredTxn) {
			if rng.IntN(4) == 0 {
				txn.Delete(nimbusv1.NewKey(nimbusv1.Kind_KIND_ROUTE, "", "", name))
			} else {
				txn.Put(route(name, uint32(i+1), "10.0.0.0/8", "10.0.0.1"))
			}
		})
	}
	commit(t, d, func(txn *DesiredTxn) { txn.Put(route("sentinel", 1, "10.0.0.0/8", "10.0.0.1")) })
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the subscriber never saw the last write")
	}
	for i := range keys {
		key := nimbusv1.NewKey(nimbusv1.Kind_KIND_ROUTE, "", "", fmt.Sprintf("r%d", i))
		final, _ := s.Get(key)
		last, ok := seen[key.Key()]
		if !ok {
			t.Errorf("%s: never handed to the subscriber", key.ID())
			continue
		}
		if !proto.Equal(last, final) {
			t.Errorf("%s: subscriber ended at %v, store holds %v", key.ID(), last, final)
		}
	}
}

// TestReadsDecodeStoredObjects checks that what readers get is the object Put, decoded
// from the store's wire form, and that readers share one decoded object while one holds
// it.
func TestReadsDecodeStoredObjects(t *testing.T) {
	s, d, _ := open(t)
	obj := route("a", 1, "10.0.0.0/8", "10.0.0.1")
	obj.Meta.Labels = map[string]string{"z": "1", "a": "2", "m": "3"}
	commit(t, d, func(txn *DesiredTxn) { txn.Put(obj) })
	got, ok := s.Get(obj.Key())
	if !ok || !proto.Equal(got, obj) {
		t.Fatalf("Get = %v, %v; want %v", got, ok, obj)
	}
	if again, _ := s.Get(obj.Key()); again != got {
		t.Error("a second Get while the first object is held decoded the object again")
	}
	if list := s.List(nimbusv1.Kind_KIND_ROUTE); len(list) != 1 || list[0] != got {
		t.Errorf("List = %v, want the object Get returned", list)
	}
	// An equal object with its labels in another order is no change.
	same := proto.CloneOf(obj)
	same.Meta.Labels = map[string]string{"m": "3", "a": "2", "z": "1"}
	sub, err := s.Subscribe(SubscribeOptions{Tables: []Table{TableDesired}})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	next(t, sub)
	commit(t, d, func(txn *DesiredTxn) { txn.Put(same) })
	if pending(sub) {
		t.Error("putting an equal object announced a change")
	}
}

// TestVersionReadsTheStoredMeta checks that Version reads the generation, revision and
// generation_revision Get decodes, for objects whose tenant, namespace and name the
// record leaves out and objects that keep them, with labels and nodes between the fields.
func TestVersionReadsTheStoredMeta(t *testing.T) {
	s, d, _ := open(t)
	a := route("a", 1, "10.0.0.0/8", "10.0.0.1")
	a.Meta.Labels = map[string]string{"app": "web", "tier": "frontend", "site": "dc1"}
	a.Meta.Nodes = []string{"host-a", "host-b"}
	a.Meta.Generation, a.Meta.Revision, a.Meta.GenerationRevision = 7, 1<<40, 12345
	b := route("b", 2, "10.1.0.0/16", "10.0.0.1")
	b.Meta.Tenant, b.Meta.Namespace = "t1", "ns1"
	b.Meta.Revision = 99 // no generation_revision: a reader falls back to the revision
	c := route("c", 3, "10.2.0.0/16", "10.0.0.1")
	c.Meta = nil
	commit(t, d, func(txn *DesiredTxn) { txn.Put(a); txn.Put(b); txn.Put(c) })
	for _, obj := range []*nimbusv1.Object{a, b, c} {
		got, ok := s.Version(obj.TypedKey())
		m := obj.GetMeta()
		want := Version{Generation: m.GetGeneration(), Revision: m.GetRevision(), GenerationRevision: m.GetGenerationRevision()}
		if !ok || got != want {
			t.Errorf("Version(%s) = %+v, %v; want %+v", obj.Key().ID(), got, ok, want)
		}
	}
	if v, ok := s.Version(route("gone", 1, "10.3.0.0/16", "10.0.0.1").TypedKey()); ok {
		t.Errorf("Version of an object never stored = %+v, true", v)
	}
}
