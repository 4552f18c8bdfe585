package delphi

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/hashicorp/go-memdb"
	bolt "go.etcd.io/bbolt"
	"google.golang.org/protobuf/proto"

	"github.com/naplesnet/naples/internal/statefile"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// The write benchmarks compare, per object and in the same run, four ways to keep the
// same objects: delphi with a state file (Options.Dir), delphi in memory only, plain
// go-memdb with a table indexed by key ID (what delphi's desired table was built on
// before its copy-on-write B-trees), and plain bbolt with delphi's buckets. The
// baselines get their input ready-made (memdb the records, bbolt the serialized bytes),
// so they measure the engine alone; delphi pays for everything it does. ns/op is per object: with
// batch=1000, one commit carries 1000 objects.
//
// The restore benchmarks measure Open on a state file of 10k and 100k objects, and 1M when
// asked for by name (-bench 'Restore/objects=1M'), as that one alone takes minutes and
// about 5 GiB. They also report the heap that the restored store occupies per object, the
// part of it the decoded objects take, and the file size per object. BENCHMARKS.md at the
// repository root holds the figures.

// benchObject returns a representative Endpoint: labels, a target node, two addresses
// and two security groups. gen varies its content.
func benchObject(i, gen int) *nimbusv1.Object {
	return &nimbusv1.Object{
		Meta: &nimbusv1.ObjectMeta{
			Tenant: "acme", Namespace: "prod", Name: fmt.Sprintf("ep-%07d", i),
			Uid: fmt.Sprintf("6b1f0c6e-%08x", i), Generation: int64(gen), Revision: uint64(i),
			Labels: map[string]string{"app": "web", "tier": "frontend"},
			Nodes:  []string{"host-a"},
		},
		Spec: &nimbusv1.Object_Endpoint{Endpoint: &nimbusv1.EndpointSpec{
			Network: "blue", Node: "host-a", Interface: fmt.Sprintf("veth%d", i),
			Mac:            fmt.Sprintf("02:00:%02x:%02x:%02x:%02x", byte(i>>24), byte(i>>16), byte(i>>8), byte(i)),
			Ips:            []string{fmt.Sprintf("10.%d.%d.%d", byte(i>>16), byte(i>>8), byte(i)), "fd00::1"},
			SecurityGroups: []string{"web", "ssh"},
		}},
	}
}

// benchOp is one object written or deleted, in every baseline's input form.
type benchOp struct {
	obj *nimbusv1.Object
	rec *memdbRecord
	id  []byte
	val []byte
}

func benchOps(b *testing.B, n, gen int) []benchOp {
	ops := make([]benchOp, n)
	for i := range ops {
		obj := benchObject(i, gen)
		val, err := proto.Marshal(obj)
		if err != nil {
			b.Fatal(err)
		}
		ops[i] = benchOp{obj: obj, rec: &memdbRecord{ID: obj.Key().ID(), Object: obj}, id: []byte(obj.Key().ID()), val: val}
	}
	return ops
}

// benchStore is one way of keeping objects.
type benchStore interface {
	// write commits ops in one transaction, as puts or as deletes.
	write(ops []benchOp, del bool) error
	close()
}

type delphiStore struct {
	s *Store
	d *DesiredWriter
}

func (s *delphiStore) write(ops []benchOp, del bool) error {
	txn := &DesiredTxn{}
	for _, op := range ops {
		if del {
			txn.Delete(op.obj.Key())
		} else {
			txn.Put(op.obj)
		}
	}
	return s.d.Commit(txn)
}

func (s *delphiStore) close() { s.s.Close() }

// memdbRecord is a row of the memdb baseline's table.
type memdbRecord struct {
	ID     string
	Object *nimbusv1.Object
}

// memdbSchema is the memdb baseline's schema: one table, indexed by key ID.
var memdbSchema = &memdb.DBSchema{Tables: map[string]*memdb.TableSchema{
	string(TableDesired): {Name: string(TableDesired), Indexes: map[string]*memdb.IndexSchema{
		"id": {Name: "id", Unique: true, Indexer: &memdb.StringFieldIndex{Field: "ID"}},
	}},
}}

type memdbStore struct{ db *memdb.MemDB }

func (s *memdbStore) write(ops []benchOp, del bool) error {
	txn := s.db.Txn(true)
	defer txn.Abort()
	for _, op := range ops {
		var err error
		if del {
			err = txn.Delete(string(TableDesired), op.rec)
		} else {
			err = txn.Insert(string(TableDesired), op.rec)
		}
		if err != nil {
			return err
		}
	}
	txn.Commit()
	return nil
}

func (s *memdbStore) close() {}

type boltStore struct{ db *bolt.DB }

func (s *boltStore) write(ops []benchOp, del bool) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		objs := tx.Bucket([]byte(statefile.BucketObjects))
		for _, op := range ops {
			var err error
			if del {
				err = objs.Delete(op.id)
			} else {
				err = objs.Put(op.id, op.val)
			}
			if err != nil {
				return err
			}
		}
		return nil
	})
}

func (s *boltStore) close() { s.db.Close() }

var benchStores = []struct {
	name string
	open func(b *testing.B) benchStore
}{
	{"delphi", func(b *testing.B) benchStore { return openDelphiBench(b, b.TempDir()) }},
	{"delphi-memory", func(b *testing.B) benchStore { return openDelphiBench(b, "") }},
	{"memdb", func(b *testing.B) benchStore {
		db, err := memdb.NewMemDB(memdbSchema)
		if err != nil {
			b.Fatal(err)
		}
		return &memdbStore{db: db}
	}},
	{"bbolt", func(b *testing.B) benchStore {
		db, err := bolt.Open(filepath.Join(b.TempDir(), StateFile), 0o600, &bolt.Options{Timeout: lockTimeout})
		if err != nil {
			b.Fatal(err)
		}
		if err := db.Update(func(tx *bolt.Tx) error {
			_, err := tx.CreateBucket([]byte(statefile.BucketObjects))
			return err
		}); err != nil {
			b.Fatal(err)
		}
		return &boltStore{db: db}
	}},
}

func openDelphiBench(b *testing.B, dir string) *delphiStore {
	s, err := Open(Options{Dir: dir, Logger: quiet})
	if err != nil {
		b.Fatal(err)
	}
	d, err := s.ClaimDesired()
	if err != nil {
		b.Fatal(err)
	}
	return &delphiStore{s: s, d: d}
}

// writeBatched writes ops in commits of batch objects.
func writeBatched(b *testing.B, s benchStore, ops []benchOp, batch int, del bool) {
	for len(ops) > 0 {
		n := min(batch, len(ops))
		if err := s.write(ops[:n], del); err != nil {
			b.Fatal(err)
		}
		ops = ops[n:]
	}
}

// BenchmarkWrite measures inserts, updates and deletes per object, one object per commit
// and 1000 per commit.
func BenchmarkWrite(b *testing.B) {
	for _, op := range []string{"insert", "update", "delete"} {
		for _, batch := range []int{1, 1000} {
			for _, st := range benchStores {
				b.Run(fmt.Sprintf("%s/batch=%d/%s", op, batch, st.name), func(b *testing.B) {
					s := st.open(b)
					defer s.close()
					ops := benchOps(b, b.N, 1)
					if op != "insert" {
						writeBatched(b, s, ops, 10000, false)
					}
					if op == "update" {
						ops = benchOps(b, b.N, 2)
					}
					b.ResetTimer()
					writeBatched(b, s, ops, batch, op == "delete")
					b.StopTimer()
					b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "objects/s")
				})
			}
		}
	}
}

// BenchmarkRestore measures Open on a state file of n objects, and the heap the restored
// store then occupies per object.
func BenchmarkRestore(b *testing.B) {
	for _, n := range []struct {
		name  string
		count int
	}{{"10k", 10_000}, {"100k", 100_000}, {"1M", 1_000_000}} {
		b.Run("objects="+n.name, func(b *testing.B) {
			if n.count >= 1_000_000 && !benchNamed("1M") {
				b.Skip("run with -bench 'Restore/objects=1M'")
			}
			dir := b.TempDir()
			writeStateFile(b, dir, n.count)
			info, err := os.Stat(filepath.Join(dir, StateFile))
			if err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for b.Loop() {
				s, err := Open(Options{Dir: dir, Logger: quiet})
				if err != nil {
					b.Fatal(err)
				}
				s.Close()
			}
			b.StopTimer()
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n.count), "ns/object")
			b.ReportMetric(float64(info.Size())/float64(n.count), "file-B/object")
			b.ReportMetric(heapPerObject(b, dir, n.count), "heap-B/object")
			b.ReportMetric(objectHeapPerObject(b, dir, n.count), "proto-heap-B/object")
		})
	}
}

// writeStateFile fills a state file in dir with n benchmark objects.
func writeStateFile(b *testing.B, dir string, n int) {
	s := openDelphiBench(b, dir)
	defer s.close()
	const batch = 50_000
	for start := 0; start < n; start += batch {
		txn := &DesiredTxn{}
		for i := start; i < min(start+batch, n); i++ {
			txn.Put(benchObject(i, 1))
		}
		txn.SetResume("bench", uint64(n))
		if err := s.d.Commit(txn); err != nil {
			b.Fatal(err)
		}
	}
}

// heapPerObject returns the in-use heap growth of restoring the store in dir, per object.
func heapPerObject(b *testing.B, dir string, n int) float64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	s, err := Open(Options{Dir: dir, Logger: quiet})
	if err != nil {
		b.Fatal(err)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	if got := len(s.List(nimbusv1.Kind_KIND_ENDPOINT)); got != n {
		b.Fatalf("restored %d objects, want %d", got, n)
	}
	s.Close()
	return float64(after.HeapInuse-before.HeapInuse) / float64(n)
}

// objectHeapPerObject returns the in-use heap of the file's objects alone, decoded into a
// slice, per object: the part of heap-B/object that is not delphi's tables and indexes.
func objectHeapPerObject(b *testing.B, dir string, n int) float64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	d, r, err := openDisk(filepath.Join(dir, StateFile), false)
	if err != nil {
		b.Fatal(err)
	}
	d.close()
	runtime.GC()
	runtime.ReadMemStats(&after)
	if len(r.objects) != n {
		b.Fatalf("read %d objects, want %d", len(r.objects), n)
	}
	return float64(after.HeapInuse-before.HeapInuse) / float64(n)
}

// benchNamed reports whether the -test.bench pattern names s explicitly.
func benchNamed(s string) bool {
	f := flag.Lookup("test.bench")
	return f != nil && strings.Contains(f.Value.String(), s)
}
