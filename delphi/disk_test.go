package delphi

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/naplesnet/naples/internal/statefile"
	"github.com/naplesnet/naples/internal/statefile/statefiletest"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

var quiet = slog.New(slog.DiscardHandler)

// openDir opens a store on dir and claims its desired writer; Close runs at cleanup.
func openDir(t *testing.T, dir string) (*Store, *DesiredWriter) {
	t.Helper()
	s, err := Open(Options{Dir: dir, Indexes: testIndexes, Logger: quiet})
	if err != nil {
		t.Fatalf("Open(%s): %v", dir, err)
	}
	t.Cleanup(func() { s.Close() })
	d, err := s.ClaimDesired()
	if err != nil {
		t.Fatal(err)
	}
	return s, d
}

func isSynced(s *Store) bool {
	select {
	case <-s.Synced():
		return true
	default:
		return false
	}
}

// commits returns the number of commits to the store's state file since it was opened.
func commits(t *testing.T, s *Store) int {
	t.Helper()
	return s.disk.file.Commits()
}

func TestRestartRestoresObjectsAndResumePoint(t *testing.T) {
	dir := t.TempDir()
	s, d := openDir(t, dir)
	if isSynced(s) {
		t.Fatal("a store on an empty directory is synced")
	}
	objs := []*nimbusv1.Object{
		route("a", 100, "198.51.100.0/24", "10.0.0.1"),
		route("b", 100, "198.51.100.0/24", "10.0.0.2"),
		{
			Meta: &nimbusv1.ObjectMeta{Tenant: "t1", Namespace: "prod", Name: "web-1", Generation: 3, Labels: map[string]string{"app": "web"}, Nodes: []string{"host-a"}, CreateTime: timestamppb.Now()},
			Spec: &nimbusv1.Object_Endpoint{Endpoint: &nimbusv1.EndpointSpec{Network: "blue", Mac: "02:00:00:00:00:01", Ips: []string{"10.1.0.5"}, SecurityGroups: []string{"web"}}},
		},
	}
	commit(t, d, func(txn *DesiredTxn) {
		for _, o := range objs {
			txn.Put(o)
		}
		txn.Put(route("gone", 1, "10.9.0.0/16", "10.0.0.1"))
		txn.SetResume("epoch-1", 41)
	})
	commit(t, d, func(txn *DesiredTxn) {
		txn.Delete(nimbusv1.NewKey(nimbusv1.Kind_KIND_ROUTE, "", "", "gone"))
		txn.SetResume("epoch-1", 42)
	})
	st, err := s.ClaimStatus()
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Set(objs[0].Key(), &nimbusv1.NodeStatus{Phase: nimbusv1.Phase_PHASE_PROGRAMMED}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}

	r, _ := openDir(t, dir)
	if !isSynced(r) {
		t.Error("a store restored from disk is not synced")
	}
	if epoch, rev := r.Resume(); epoch != "epoch-1" || rev != 42 {
		t.Errorf("Resume() = %q, %d; want epoch-1, 42", epoch, rev)
	}
	all := r.List(nimbusv1.Kind_KIND_UNSPECIFIED)
	if len(all) != len(objs) {
		t.Fatalf("restored %d objects %v, want %d", len(all), names(all), len(objs))
	}
	for _, want := range objs {
		got, ok := r.Get(want.Key())
		if !ok || !proto.Equal(got, want) {
			t.Errorf("restored %s = %v, want %v", want.Key().ID(), got, want)
		}
	}
	if got := lookup(t, r, "route_table", "100"); !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("route_table index after restore = %v", got)
	}
	if got := lookup(t, r, "network", "t1/prod/blue"); !slices.Equal(got, []string{"web-1"}) {
		t.Errorf("network index after restore = %v", got)
	}
	if _, ok := r.Status(objs[0].Key()); ok {
		t.Error("status was restored; it is not meant to be kept")
	}
}

func TestSnapshotIsOneFileTransactionAndPersistsDeletions(t *testing.T) {
	dir := t.TempDir()
	s, d := openDir(t, dir)
	commit(t, d, func(txn *DesiredTxn) {
		txn.Put(route("keep", 100, "10.1.0.0/24", "10.0.0.1"))
		txn.Put(route("stale", 100, "10.2.0.0/24", "10.0.0.1"))
		txn.SetResume("epoch-1", 5)
	})
	const n = 10000
	before := commits(t, s)
	commit(t, d, func(txn *DesiredTxn) {
		keep := map[nimbusv1.Key]bool{}
		txn.Put(route("keep", 100, "10.1.0.0/24", "10.0.0.1"))
		for i := range n {
			o := route(fmt.Sprintf("r%05d", i), 200, fmt.Sprintf("10.%d.%d.0/24", 100+i/256, i%256), "10.0.0.1")
			txn.Put(o)
			keep[o.TypedKey()] = true
		}
		txn.DeleteOthers(keep)
		txn.SetResume("epoch-2", 9)
	})
	if got := commits(t, s) - before; got != 1 {
		t.Errorf("a %d-object snapshot took %d file commits, want 1", n, got)
	}
	s.Close()

	r, _ := openDir(t, dir)
	if got := len(r.List(nimbusv1.Kind_KIND_ROUTE)); got != n+1 {
		t.Errorf("restored %d routes, want %d", got, n+1)
	}
	if _, ok := r.Get(nimbusv1.NewKey(nimbusv1.Kind_KIND_ROUTE, "", "", "stale")); ok {
		t.Error("the object the snapshot dropped came back after restart")
	}
	if _, ok := r.Get(nimbusv1.NewKey(nimbusv1.Kind_KIND_ROUTE, "", "", "keep")); !ok {
		t.Error("the object the snapshot kept is gone after restart")
	}
	if epoch, rev := r.Resume(); epoch != "epoch-2" || rev != 9 {
		t.Errorf("Resume() = %q, %d; want epoch-2, 9", epoch, rev)
	}
}

// TestWritesOfOneKeyInATransaction checks that a transaction that writes a key several
// times changes it once, from what it held before the first write to what the last one
// left, in memory, for subscribers, in the order of each key's first write, and in the
// file; and that a key created and deleted again does not change.
func TestWritesOfOneKeyInATransaction(t *testing.T) {
	dir := t.TempDir()
	s, d := openDir(t, dir)
	commit(t, d, func(txn *DesiredTxn) {
		for _, name := range []string{"a", "b", "c"} {
			txn.Put(route(name, 1, "10.0.0.0/8", "10.0.0.1"))
		}
	})
	sub, err := s.Subscribe(SubscribeOptions{Tables: []Table{TableDesired}})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	next(t, sub)
	key := func(name string) *nimbusv1.ObjectKey {
		return nimbusv1.NewKey(nimbusv1.Kind_KIND_ROUTE, "", "", name)
	}
	before := commits(t, s)
	commit(t, d, func(txn *DesiredTxn) {
		txn.Put(route("c", 2, "10.0.0.0/8", "10.0.0.1"))
		txn.Put(route("x", 1, "10.0.0.0/8", "10.0.0.1")) // created, then deleted
		txn.Put(route("b", 2, "10.0.0.0/8", "10.0.0.1")) // changed, then deleted
		txn.Put(route("a", 1, "10.0.0.0/8", "10.0.0.1")) // unchanged
		txn.Put(route("d", 1, "10.0.0.0/8", "10.0.0.1")) // created
		txn.Put(route("c", 3, "10.0.0.0/8", "10.0.0.1")) // changed again
		txn.Delete(key("x"))
		txn.Delete(key("b"))
		txn.Delete(key("b"))
		txn.Delete(key("y")) // never there
	})
	if got := commits(t, s) - before; got != 1 {
		t.Errorf("the transaction took %d file commits, want 1", got)
	}
	want := []string{"Route/default/default/c", "Route/default/default/b", "Route/default/default/d"}
	if got := next(t, sub); !slices.Equal(got, want) {
		t.Errorf("Next = %v, want %v", got, want)
	}
	tables := func(s *Store) map[string]uint32 {
		out := map[string]uint32{}
		for _, o := range s.List(nimbusv1.Kind_KIND_ROUTE) {
			out[o.GetMeta().GetName()] = o.GetRoute().GetTable()
		}
		return out
	}
	wantTables := map[string]uint32{"a": 1, "c": 3, "d": 1}
	if got := tables(s); !maps.Equal(got, wantTables) {
		t.Errorf("routes and their tables = %v, want %v", got, wantTables)
	}
	s.Close()
	r, _ := openDir(t, dir)
	if got := tables(r); !maps.Equal(got, wantTables) {
		t.Errorf("after restart, routes and their tables = %v, want %v", got, wantTables)
	}
}

func TestUnchangedCommitDoesNotWriteTheFile(t *testing.T) {
	s, d := openDir(t, t.TempDir())
	commit(t, d, func(txn *DesiredTxn) { txn.Put(route("a", 1, "10.0.0.0/8", "10.0.0.1")) })
	before := commits(t, s)
	commit(t, d, func(txn *DesiredTxn) { txn.Put(route("a", 1, "10.0.0.0/8", "10.0.0.1")) })
	st, err := s.ClaimStatus()
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Set(nimbusv1.NewKey(nimbusv1.Kind_KIND_ROUTE, "", "", "a"), &nimbusv1.NodeStatus{Phase: nimbusv1.Phase_PHASE_PENDING}); err != nil {
		t.Fatal(err)
	}
	if got := commits(t, s) - before; got != 0 {
		t.Errorf("an unchanged Put and a status write made %d file commits, want 0", got)
	}
}

// TestFailedDiskWriteChangesNothing checks that a commit the file refuses is not applied
// in memory either, and that nobody hears of it.
func TestFailedDiskWriteChangesNothing(t *testing.T) {
	s, d := openDir(t, t.TempDir())
	commit(t, d, func(txn *DesiredTxn) {
		txn.Put(route("a", 1, "10.0.0.0/8", "10.0.0.1"))
		txn.SetResume("e", 1)
	})
	sub, err := s.Subscribe(SubscribeOptions{Tables: []Table{TableDesired}})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	next(t, sub)
	s.disk.file.Close() // the file goes away under the store
	txn := &DesiredTxn{}
	txn.Put(route("b", 1, "10.0.0.0/8", "10.0.0.1"))
	txn.Delete(nimbusv1.NewKey(nimbusv1.Kind_KIND_ROUTE, "", "", "a"))
	txn.SetResume("e", 2)
	if err := d.Commit(txn); err == nil {
		t.Fatal("Commit succeeded with the state file closed")
	}
	if got := names(s.List(nimbusv1.Kind_KIND_UNSPECIFIED)); !slices.Equal(got, []string{"a"}) {
		t.Errorf("after a failed commit the store holds %v, want [a]", got)
	}
	if _, rev := s.Resume(); rev != 1 {
		t.Errorf("after a failed commit the revision is %d, want 1", rev)
	}
	if pending(sub) {
		t.Error("a failed commit was announced")
	}
}

func TestCommitAfterCloseFails(t *testing.T) {
	s, d := openDir(t, t.TempDir())
	s.Close()
	txn := &DesiredTxn{}
	txn.Put(route("a", 1, "10.0.0.0/8", "10.0.0.1"))
	if err := d.Commit(txn); !errors.Is(err, ErrClosed) {
		t.Errorf("Commit after Close: err = %v, want ErrClosed", err)
	}
}

// TestBadStateFile checks that Open refuses a state file it cannot read back with delphi's
// ErrCorrupt naming the file, and that Discard is the way out. The ways a file can be
// corrupt are internal/statefile's tests; these are a few, and the one delphi is strict
// about: a file without a format version.
func TestBadStateFile(t *testing.T) {
	u64 := func(v uint64) []byte { return binary.BigEndian.AppendUint64(nil, v) }
	tests := []struct {
		name  string
		write func(t *testing.T, path string)
		want  string
	}{
		{"not a bbolt file", func(t *testing.T, path string) {
			if err := os.WriteFile(path, []byte(strings.Repeat("not a database ", 1000)), 0o600); err != nil {
				t.Fatal(err)
			}
		}, "invalid database"},
		{"unknown format version", func(t *testing.T, path string) {
			statefiletest.Write(t, path, map[string]map[string][]byte{
				statefile.BucketMeta:    {statefile.KeyFormat: u64(statefile.FormatVersion + 1)},
				statefile.BucketObjects: {},
			})
		}, "format version 2"},
		{"no format version", func(t *testing.T, path string) {
			statefiletest.Write(t, path, map[string]map[string][]byte{
				statefile.BucketMeta:    {statefile.KeyEpoch: []byte("e"), statefile.KeyRevision: u64(3)},
				statefile.BucketObjects: {},
			})
		}, `meta "format" is missing`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, StateFile)
			tt.write(t, path)
			s, err := Open(Options{Dir: dir, Indexes: testIndexes, Logger: quiet})
			if err == nil {
				s.Close()
				t.Fatal("Open succeeded on a bad state file")
			}
			if !errors.Is(err, ErrCorrupt) {
				t.Errorf("err = %v, want ErrCorrupt", err)
			}
			if !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err = %q, want it to name %s and say %q", err, path, tt.want)
			}

			// Discard starts empty, and the new file works.
			s, err = Open(Options{Dir: dir, Discard: true, Logger: quiet})
			if err != nil {
				t.Fatalf("Open with Discard: %v", err)
			}
			if n := len(s.List(nimbusv1.Kind_KIND_UNSPECIFIED)); n != 0 || isSynced(s) {
				t.Errorf("after Discard: %d objects, synced %v; want empty and not synced", n, isSynced(s))
			}
			if epoch, rev := s.Resume(); epoch != "" || rev != 0 {
				t.Errorf("after Discard: Resume() = %q, %d", epoch, rev)
			}
			d, _ := s.ClaimDesired()
			commit(t, d, func(txn *DesiredTxn) {
				txn.Put(route("fresh", 1, "10.0.0.0/8", "10.0.0.1"))
				txn.SetResume("e", 7)
			})
			s.Close()
			r, _ := openDir(t, dir)
			if got := names(r.List(nimbusv1.Kind_KIND_UNSPECIFIED)); !slices.Equal(got, []string{"fresh"}) {
				t.Errorf("after Discard and a commit, restart restores %v, want [fresh]", got)
			}
		})
	}
}

func TestDiscardThrowsAwayGoodState(t *testing.T) {
	dir := t.TempDir()
	s, d := openDir(t, dir)
	commit(t, d, func(txn *DesiredTxn) {
		txn.Put(route("a", 1, "10.0.0.0/8", "10.0.0.1"))
		txn.SetResume("e", 3)
	})
	s.Close()
	r, err := Open(Options{Dir: dir, Discard: true, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if n := len(r.List(nimbusv1.Kind_KIND_UNSPECIFIED)); n != 0 || isSynced(r) {
		t.Errorf("after Discard: %d objects, synced %v; want empty and not synced", n, isSynced(r))
	}
}

func TestLockedStateFile(t *testing.T) {
	dir := t.TempDir()
	s, d := openDir(t, dir)
	commit(t, d, func(txn *DesiredTxn) { txn.Put(route("a", 1, "10.0.0.0/8", "10.0.0.1")) })
	var wg sync.WaitGroup
	for _, discard := range []bool{false, true} {
		wg.Go(func() { // each waits out the lock timeout; together, once
			_, err := Open(Options{Dir: dir, Discard: discard, Logger: quiet})
			if !errors.Is(err, ErrLocked) || errors.Is(err, ErrCorrupt) {
				t.Errorf("Open (discard %v) of a file in use: err = %v, want ErrLocked", discard, err)
			}
		})
	}
	wg.Wait()
	s.Close()
	r, _ := openDir(t, dir)
	if _, ok := r.Get(nimbusv1.NewKey(nimbusv1.Kind_KIND_ROUTE, "", "", "a")); !ok {
		t.Error("a refused Discard removed the state of the store that held it")
	}
}

// TestOpenReadsFileOfKeyIDs checks that the state file keeps its layout, objects under
// their key IDs: a store opens a file written through statefile alone, as every version
// wrote it, lists its keys in key ID order (a tenant "a-b" before "a"), and a delete
// through the store removes the object stored under its key ID.
func TestOpenReadsFileOfKeyIDs(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, StateFile)
	withTenant := func(tenant, name string) *nimbusv1.Object {
		o := route(name, 100, "198.51.100.0/24", "10.0.0.1")
		o.Meta.Tenant = tenant
		return o
	}
	objs := []*nimbusv1.Object{withTenant("a", "r1"), withTenant("a-b", "r2"), withTenant("a", "r3"), withTenant("a.b", "r4")}
	f, _, err := statefile.Open(path, fileOptions)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Commit(statefile.Batch{Put: objs, Position: &statefile.Position{Epoch: "e", Revision: 7}}); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}

	s, d := openDir(t, dir)
	want := []string{"Route/a-b/default/r2", "Route/a.b/default/r4", "Route/a/default/r1", "Route/a/default/r3"}
	if got := keyIDs(s.Keys(nimbusv1.Kind_KIND_ROUTE)); !slices.Equal(got, want) {
		t.Errorf("Keys(Route) = %q, want %q", got, want)
	}
	commit(t, d, func(txn *DesiredTxn) { txn.Delete(objs[1].Key()) })
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	f, c, err := statefile.Open(path, fileOptions)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var got []string
	for _, o := range c.Objects {
		got = append(got, o.Key().ID())
	}
	if want := []string{want[1], want[2], want[3]}; !slices.Equal(got, want) {
		t.Errorf("the file holds %q after the delete, want %q", got, want)
	}
}
