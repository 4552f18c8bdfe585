package halstore

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/naplesnet/naples/delphi"
	"github.com/naplesnet/naples/hal"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// openDelphi opens an in-memory delphi store, closed when the test ends, and claims
// the writing of its desired objects.
func openDelphi(t *testing.T) (*delphi.Store, *delphi.DesiredWriter) {
	t.Helper()
	ds, err := delphi.Open(delphi.Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ds.Close() })
	desired, err := ds.ClaimDesired()
	if err != nil {
		t.Fatal(err)
	}
	return ds, desired
}

// TestHALStore checks the adapter of a delphi store to hal.Store.
func TestHALStore(t *testing.T) {
	ds, desired := openDelphi(t)
	r1, r2 := testRoute("r1", 1, "10.1.0.0/16"), testRoute("r2", 2, "10.2.0.0/16")
	n1 := testNode("n1", "192.0.2.1")
	commit := func(objs ...*nimbusv1.Object) {
		t.Helper()
		txn := &delphi.DesiredTxn{}
		for _, o := range objs {
			txn.Put(o)
		}
		if err := desired.Commit(txn); err != nil {
			t.Fatal(err)
		}
	}
	commit(r1, r2, n1)

	s, err := New(ds)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if _, err := ds.ClaimStatus(); !errors.Is(err, delphi.ErrWriterClaimed) {
		t.Errorf("ClaimStatus after New: %v; want ErrWriterClaimed", err)
	}
	if _, err := New(ds); !errors.Is(err, delphi.ErrWriterClaimed) {
		t.Errorf("second New: %v; want ErrWriterClaimed", err)
	}

	for _, tc := range []struct {
		kind nimbusv1.Kind
		want []nimbusv1.Key
	}{
		{nimbusv1.Kind_KIND_ROUTE, []nimbusv1.Key{r1.TypedKey(), r2.TypedKey()}},
		{nimbusv1.Kind_KIND_NODE, []nimbusv1.Key{n1.TypedKey()}},
		{nimbusv1.Kind_KIND_INTERFACE, nil},
		{nimbusv1.Kind_KIND_UNSPECIFIED, []nimbusv1.Key{n1.TypedKey(), r1.TypedKey(), r2.TypedKey()}},
	} {
		got := s.Keys(tc.kind)
		if !slices.Equal(got, tc.want) {
			t.Errorf("Keys(%s) = %q; want %q", tc.kind.Name(), got, tc.want)
		}
	}
	if o, ok := s.Get(r2.Key()); !ok || !proto.Equal(o, r2) {
		t.Errorf("Get(%s) = %v, %v; want %v", r2.Key().ID(), o, ok, r2)
	}

	select {
	case <-s.Synced():
		t.Error("Synced closed before MarkSynced")
	default:
	}
	desired.MarkSynced()
	select {
	case <-s.Synced():
	default:
		t.Error("Synced open after MarkSynced")
	}

	feed, err := s.WatchDesired()
	if err != nil {
		t.Fatal(err)
	}
	defer feed.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ids, err := feed.Next(ctx)
	slices.SortFunc(ids, nimbusv1.Key.Compare)
	if want := []nimbusv1.Key{n1.TypedKey(), r1.TypedKey(), r2.TypedKey()}; err != nil || !slices.Equal(ids, want) {
		t.Errorf("first Next = %q, %v; want every key, %q", ids, err, want)
	}
	commit(testRoute("r1", 2, "10.1.0.0/16"), testRoute("r1", 3, "10.1.0.0/16"), testRoute("r3", 1, "10.3.0.0/16"))
	if ids, err := feed.Next(ctx); err != nil || !slices.Equal(ids, []nimbusv1.Key{r1.TypedKey(), routeKey("r3").Key()}) {
		t.Errorf("Next after changes = %q, %v; want r1 once, then r3", ids, err)
	}

	st := &nimbusv1.NodeStatus{ObservedGeneration: 2, Phase: nimbusv1.Phase_PHASE_PROGRAMMED, Operational: map[string]string{"table": "100"}}
	st1 := &nimbusv1.NodeStatus{ObservedGeneration: 1, Phase: nimbusv1.Phase_PHASE_PROGRAMMED}
	ssub, err := ds.Subscribe(delphi.SubscribeOptions{Tables: []delphi.Table{delphi.TableStatus}})
	if err != nil {
		t.Fatal(err)
	}
	defer ssub.Close()
	// One transaction, in order: r1's first status is replaced by its second.
	if err := s.WriteStatus([]hal.StatusUpdate{{Key: r1.TypedKey(), Status: st1}, {Key: r2.TypedKey(), Status: st}, {Key: r1.TypedKey(), Status: st}}); err != nil {
		t.Fatal(err)
	}
	for _, o := range []*nimbusv1.Object{r1, r2} {
		if got, ok := ds.Status(o.Key()); !ok || !proto.Equal(got, st) {
			t.Errorf("delphi status of %s = %v, %v; want %v", o.Key().ID(), got, ok, st)
		}
	}
	if ids, err := ssub.Next(ctx); err != nil || !slices.Equal(slices.SortedFunc(slices.Values(ids), nimbusv1.Key.Compare), []nimbusv1.Key{r1.TypedKey(), r2.TypedKey()}) {
		t.Errorf("status subscription after WriteStatus: %q, %v; want r1 and r2", ids, err)
	}
	if err := s.WriteStatus([]hal.StatusUpdate{{Key: r2.TypedKey()}, {Key: n1.TypedKey()}}); err != nil {
		t.Fatal(err)
	}
	if got, ok := ds.Status(r2.Key()); ok {
		t.Errorf("delphi status of %s = %v after its removal; want none", r2.Key().ID(), got)
	}
	if _, ok := ds.Status(r1.Key()); !ok {
		t.Errorf("delphi status of %s gone after removing others'", r1.Key().ID())
	}

	ds.Close()
	if _, err := feed.Next(ctx); !errors.Is(err, hal.ErrClosed) {
		t.Errorf("Next after the store closed: %v; want an error matching hal.ErrClosed", err)
	}
}

// TestHALOnDelphi runs a HAL on a delphi store through the adapter: statuses land in delphi, and Run returns
// nil when the store is closed.
func TestHALOnDelphi(t *testing.T) {
	ds, desired := openDelphi(t)
	s, err := New(ds)
	if err != nil {
		t.Fatal(err)
	}
	h, err := hal.New(hal.Options{Store: s, Reconcilers: []hal.Reconciler{programmer{}}, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- h.Run(context.Background()) }()

	a := testRoute("a", 3, "10.4.0.0/16")
	txn := &delphi.DesiredTxn{}
	txn.Put(a)
	if err := desired.Commit(txn); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "status of a in delphi", func() bool {
		st, ok := ds.Status(a.Key())
		return ok && st.GetPhase() == nimbusv1.Phase_PHASE_PROGRAMMED && st.GetObservedGeneration() == 3
	})
	txn = &delphi.DesiredTxn{}
	txn.Delete(a.Key())
	if err := desired.Commit(txn); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "status of a removed from delphi", func() bool {
		_, ok := ds.Status(a.Key())
		return !ok
	})

	ds.Close()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run after the delphi store closed: %v; want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return within 10s of the delphi store closing")
	}
}

// programmer is a route reconciler that programs every object at once.
type programmer struct{}

func (programmer) Kind() nimbusv1.Kind { return nimbusv1.Kind_KIND_ROUTE }

func (programmer) Reconcile(ctx context.Context, key *nimbusv1.ObjectKey, obj *nimbusv1.Object) (*nimbusv1.OperationalData, error) {
	return nil, nil
}

// waitFor polls cond until it holds, and fails the test when it does not within 10s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after 10s waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// quiet discards the logs of the stores and HALs the tests make.
var quiet = slog.New(slog.DiscardHandler)

// testRoute is a Route of the default tenant and namespace, in table 100.
func testRoute(name string, gen int64, prefix string) *nimbusv1.Object {
	return &nimbusv1.Object{
		Meta: &nimbusv1.ObjectMeta{Name: name, Tenant: "default", Namespace: "default", Generation: gen},
		Spec: &nimbusv1.Object_Route{Route: &nimbusv1.RouteSpec{Table: 100, Prefix: prefix, Nexthops: []*nimbusv1.NextHop{{Gateway: "10.10.0.2"}}}},
	}
}

// testNode is a Node with the VTEP address.
func testNode(name, vtep string) *nimbusv1.Object {
	return &nimbusv1.Object{
		Meta: &nimbusv1.ObjectMeta{Name: name, Generation: 1},
		Spec: &nimbusv1.Object_Node{Node: &nimbusv1.NodeSpec{VtepAddress: vtep}},
	}
}

func routeKey(name string) *nimbusv1.ObjectKey {
	return nimbusv1.NewKey(nimbusv1.Kind_KIND_ROUTE, "", "", name)
}
