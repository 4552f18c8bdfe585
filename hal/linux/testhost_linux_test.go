package linux

import (
	"context"
	"github.com/naplesnet/naples/agent/halstore"
	"testing"
	"time"

	"github.com/naplesnet/naples/delphi"
	"github.com/naplesnet/naples/hal"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// This file holds what the test hosts of the package's tests share: their delphi store,
// a runner of an observer until the test ends and a reader of what it enqueues, and a
// runner of a HAL until the test ends.

// testStore is a test host's delphi store and the writer of its desired table. Test hosts
// embed it.
type testStore struct {
	store   *delphi.Store
	desired *delphi.DesiredWriter
}

// newTestStore opens a store that declares the indexes, closed when the test ends, and
// claims its desired table.
func newTestStore(t testing.TB, indexes []delphi.Index) testStore {
	t.Helper()
	store, err := delphi.Open(delphi.Options{Indexes: indexes, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	desired, err := store.ClaimDesired()
	if err != nil {
		t.Fatal(err)
	}
	return testStore{store: store, desired: desired}
}

// put writes the objects to the desired table in one transaction.
func (s testStore) put(t testing.TB, objs ...*nimbusv1.Object) {
	t.Helper()
	txn := &delphi.DesiredTxn{}
	for _, o := range objs {
		txn.Put(o)
	}
	if err := s.desired.Commit(txn); err != nil {
		t.Fatal(err)
	}
}

// del deletes the objects with the keys from the desired table in one transaction.
func (s testStore) del(t testing.TB, keys ...*nimbusv1.ObjectKey) {
	t.Helper()
	txn := &delphi.DesiredTxn{}
	for _, k := range keys {
		txn.Delete(k)
	}
	if err := s.desired.Commit(txn); err != nil {
		t.Fatal(err)
	}
}

// reconcileStored runs rec the way the HAL does: with the object the store holds now
// (nil when it holds none).
func (s testStore) reconcileStored(rec hal.Reconciler, key *nimbusv1.ObjectKey) (*nimbusv1.OperationalData, error) {
	obj, _ := s.store.Get(key)
	return rec.Reconcile(context.Background(), key, obj)
}

// mustKey returns the key whose String form is id, or fails the test.
func mustKey(t testing.TB, id string) nimbusv1.Key {
	t.Helper()
	key, err := nimbusv1.ParseKey(id)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

// runObserver runs o's observer until the test ends and returns once it is subscribed;
// an observer that ends first, or does not subscribe within 20 seconds, fails the test.
// The keys it enqueues arrive on the returned channel, which holds 10,000.
func runObserver(t testing.TB, o hal.Observer) <-chan string {
	t.Helper()
	enqueued := make(chan string, 10000)
	subscribed := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- o.Observe(ctx, func(key nimbusv1.Key) { enqueued <- key.String() }, func() { close(subscribed) })
	}()
	ended := false
	t.Cleanup(func() {
		cancel()
		if ended {
			return
		}
		if err := <-done; err != nil {
			t.Errorf("Observe: %v", err)
		}
	})
	select {
	case <-subscribed:
	case err := <-done:
		ended = true
		t.Fatalf("Observe ended before it subscribed: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("the observer did not subscribe")
	}
	return enqueued
}

// nextEnqueued waits for the observer to enqueue a key and returns it.
func nextEnqueued(t testing.TB, enqueued <-chan string, what string) string {
	t.Helper()
	select {
	case id := <-enqueued:
		return id
	case <-time.After(20 * time.Second):
		t.Fatalf("timed out waiting for the observer to enqueue %s", what)
		return ""
	}
}

// runHAL runs a HAL with the options over store until the test ends: opts.Store is
// store, through halstore.New, and opts.Logger is quiet unless set.
func runHAL(t testing.TB, store *delphi.Store, opts hal.Options) {
	t.Helper()
	var err error
	if opts.Store, err = halstore.New(store); err != nil {
		t.Fatal(err)
	}
	if opts.Logger == nil {
		opts.Logger = quiet
	}
	hl, err := hal.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- hl.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
}
