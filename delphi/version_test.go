package delphi

import (
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"testing"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// tableIndex lists a route under its table.
var tableIndex = Index{Name: "table", Values: func(o *nimbusv1.Object) []string {
	if rt := o.GetRoute(); rt != nil {
		return []string{strconv.Itoa(int(rt.GetTable()))}
	}
	return nil
}}

// versionContents returns what one version of the desired table holds: the tables of the
// routes by key ID, read from the records, and the key IDs the table index lists per
// value, in its order.
func versionContents(t *testing.T, s *Store, st *desiredState) (tables map[string]uint32, index map[string][]string) {
	t.Helper()
	tables = map[string]uint32{}
	var ids []string
	st.byID.Scan(func(r *record) bool {
		ids = append(ids, r.key.String())
		tables[r.key.String()] = s.decode(r).GetRoute().GetTable()
		return true
	})
	if !slices.IsSorted(ids) {
		t.Fatalf("records are out of order: %v", ids)
	}
	if st.byID.Len() != len(ids) {
		t.Fatalf("Len() = %d, holds %d records", st.byID.Len(), len(ids))
	}
	index = map[string][]string{}
	st.indexes[0].Scan(func(e indexEntry) bool {
		index[e.val()] = append(index[e.val()], e.rec.key.String())
		return true
	})
	return tables, index
}

// wantIndex returns what the table index should list for the routes of tables.
func wantIndex(tables map[string]uint32) map[string][]string {
	index := map[string][]string{}
	for _, id := range slices.Sorted(maps.Keys(tables)) {
		v := strconv.Itoa(int(tables[id]))
		index[v] = append(index[v], id)
	}
	return index
}

// TestVersionsAgainstMap runs random transactions of puts and deletes, of all sizes, some
// of them failing, on a store and on a map, and checks after every one that the committed
// version holds what the map does, in order and indexed, and at the end that every
// version published before still holds what it held then.
func TestVersionsAgainstMap(t *testing.T) {
	seed := rand.Uint64()
	rng := rand.New(rand.NewPCG(seed, 0))
	t.Logf("seed %d", seed)
	s, err := Open(Options{Indexes: []Index{tableIndex}, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	type version struct {
		st     *desiredState
		tables map[string]uint32
	}
	ref := map[string]uint32{}
	var versions []version
	errFail := errors.New("failing on purpose")
	for txn := range 300 {
		ops := rng.IntN(50)
		if txn%25 == 0 {
			ops = 3000 // a transaction that splits and merges many nodes
		}
		fail := txn%7 == 3
		next := maps.Clone(ref)
		err := s.write(func(w *desiredWrite) error {
			for range ops {
				name := fmt.Sprintf("r%04d", rng.IntN(5000))
				key := nimbusv1.MakeKey(nimbusv1.Kind_KIND_ROUTE, "", "", name)
				id := key.String()
				if rng.IntN(3) == 0 {
					w.delete(key)
					delete(next, id)
					continue
				}
				table := uint32(rng.IntN(4))
				obj := route(name, table, "10.0.0.0/24", "10.0.0.1")
				r, err := s.newRecord(obj)
				if err != nil {
					return err
				}
				w.put(r, obj)
				next[id] = table
			}
			if fail {
				return errFail
			}
			return nil
		})
		if fail {
			if !errors.Is(err, errFail) {
				t.Fatalf("transaction %d: err = %v, want %v", txn, err, errFail)
			}
		} else {
			if err != nil {
				t.Fatalf("transaction %d: %v", txn, err)
			}
			ref = next
		}
		st := s.desired.Load()
		tables, index := versionContents(t, s, st)
		if !maps.Equal(tables, ref) {
			t.Fatalf("transaction %d (failed: %v): the table holds %d routes, want %d", txn, fail, len(tables), len(ref))
		}
		if want := wantIndex(ref); !maps.EqualFunc(index, want, slices.Equal) {
			t.Fatalf("transaction %d (failed: %v): the index lists %v, want %v", txn, fail, index, want)
		}
		versions = append(versions, version{st, ref})
	}
	for i, v := range versions {
		if tables, _ := versionContents(t, s, v.st); !maps.Equal(tables, v.tables) {
			t.Fatalf("version %d changed after it was published: holds %d routes, want %d", i, len(tables), len(v.tables))
		}
	}
}

// TestVersionsReadersSeeOneCommit reads the table from several goroutines while every
// commit rewrites all of it, and checks that each read sees the routes of one commit.
func TestVersionsReadersSeeOneCommit(t *testing.T) {
	s, err := Open(Options{Indexes: []Index{tableIndex}, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	d, err := s.ClaimDesired()
	if err != nil {
		t.Fatal(err)
	}
	const routes, commits = 300, 100
	write := func(gen int) {
		commit(t, d, func(txn *DesiredTxn) {
			for i := range routes {
				txn.Put(route(fmt.Sprintf("r%03d", i), 1, "10.0.0.0/24", fmt.Sprintf("10.0.%d.%d", gen>>8, gen&255)))
			}
		})
	}
	write(0)
	done := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 2 {
		wg.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				gws := map[string]bool{}
				objs := s.List(nimbusv1.Kind_KIND_ROUTE)
				for _, o := range objs {
					gws[o.GetRoute().GetNexthops()[0].GetGateway()] = true
				}
				indexed, err := s.Lookup("table", "1")
				if err != nil {
					errs <- err
					return
				}
				if len(objs) != routes || len(gws) != 1 || len(indexed) != routes {
					errs <- fmt.Errorf("a read saw %d routes with %d gateways, %d indexed; want %d of one", len(objs), len(gws), len(indexed), routes)
					return
				}
			}
		})
	}
	for gen := 1; gen <= commits; gen++ {
		write(gen)
	}
	close(done)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
