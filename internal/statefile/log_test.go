package statefile

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// crash closes f as a process that dies does: without the checkpoint Close makes, so
// that what was logged since the last one is in the log alone.
func crash(t *testing.T, f *File) {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.log.file.Close()
	f.log = nil
	if err := f.db.Close(); err != nil {
		t.Fatal(err)
	}
}

// mustCommit commits b to f.
func mustCommit(t *testing.T, f *File, b Batch) {
	t.Helper()
	if err := f.Commit(b); err != nil {
		t.Fatal(err)
	}
}

// gateways returns each stored route's name and first gateway, "name=gateway", in key
// order.
func gateways(c *Contents) []string {
	var out []string
	for _, o := range c.Objects {
		out = append(out, o.GetMeta().GetName()+"="+o.GetRoute().GetNexthops()[0].GetGateway())
	}
	return out
}

// largeBatch returns a batch too large for the log: n routes, whose names start with
// prefix.
func largeBatch(prefix string, n int) Batch {
	var b Batch
	for i := range n {
		b.Put = append(b.Put, route(fmt.Sprintf("%s%05d", prefix, i), "192.0.2.9"))
	}
	return b
}

// TestLogReplayedAfterCrash commits small batches, which the log alone holds, and checks
// that a process that dies before any checkpoint finds them all when it opens the file
// again, in order, with the position of the last.
func TestLogReplayedAfterCrash(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	f, _ := open(t, path, Options{})
	mustCommit(t, f, Batch{Put: []*nimbusv1.Object{route("a", "192.0.2.1"), route("b", "192.0.2.1")}, Position: &Position{"e1", 1}})
	mustCommit(t, f, Batch{Put: []*nimbusv1.Object{route("a", "192.0.2.2")}, Position: &Position{"e1", 2}})
	mustCommit(t, f, Batch{Delete: []string{routeID("b")}, Put: []*nimbusv1.Object{route("c", "192.0.2.3")}})
	if f.log.off == logStart {
		t.Fatal("the small batches went to bbolt, not to the log")
	}
	crash(t, f)

	f, c := open(t, path, Options{})
	if got, want := gateways(c), []string{"a=192.0.2.2", "c=192.0.2.3"}; !slices.Equal(got, want) || c.Position != (Position{"e1", 2}) {
		t.Errorf("after a crash: %v at %+v, want %v at e1 2", got, c.Position, want)
	}
	// Replay put the records into bbolt: the log starts over and a second crash finds
	// the same.
	mustCommit(t, f, Batch{Put: []*nimbusv1.Object{route("d", "192.0.2.4")}})
	crash(t, f)
	_, c = open(t, path, Options{})
	if got, want := gateways(c), []string{"a=192.0.2.2", "c=192.0.2.3", "d=192.0.2.4"}; !slices.Equal(got, want) {
		t.Errorf("after a second crash: %v, want %v", got, want)
	}
}

// TestLogFullAndLargeBatches commits small batches between batches that fill the log
// many times over and batches too large for it, and checks that a crash loses none of
// them and keeps their order: the log is put into bbolt when full and before a large
// batch.
func TestLogFullAndLargeBatches(t *testing.T) {
	defer func(size int64) { logSize = size }(logSize)
	logSize = 64 << 10
	path := filepath.Join(t.TempDir(), "state.db")
	f, _ := open(t, path, Options{})
	want := map[string]string{}
	// full counts the commits that found the log full: logged after it started over.
	full := 0
	commit := func(b Batch) {
		t.Helper()
		before := f.log.off
		mustCommit(t, f, b)
		if f.log.off > logStart && f.log.off <= before {
			full++
		}
		for _, id := range b.Delete {
			delete(want, id)
		}
		for _, o := range b.Put {
			want[o.Key().ID()] = o.GetRoute().GetNexthops()[0].GetGateway()
		}
	}
	const rounds = 300
	var large, medium int
	for i := range rounds {
		name := fmt.Sprintf("s%03d", i%50)
		commit(Batch{Put: []*nimbusv1.Object{route(name, fmt.Sprintf("192.0.2.%d", i%250))}})
		switch {
		case i%100 == 50:
			// Too large for the log; its deletion of the last small put comes first.
			b := largeBatch(fmt.Sprintf("l%d-", i), 300)
			if int64(recordHeader+len(mustEncode(t, b))) <= f.log.maxLogged() {
				t.Fatalf("a batch of %d routes fits the log", len(b.Put))
			}
			b.Delete = []string{routeID(name)}
			commit(b)
			large++
		case i%5 == 2:
			// About a sixth of the log: a few fill it.
			b := largeBatch(fmt.Sprintf("m%d-", i%40), 40)
			if n := int64(recordHeader + len(mustEncode(t, b))); n > f.log.maxLogged() || n < logSize/10 {
				t.Fatalf("a batch of %d routes is %d bytes, for a log of %d", len(b.Put), n, logSize)
			}
			commit(b)
			medium++
		}
	}
	if want := rounds + large + medium; f.Commits() != want {
		t.Errorf("Commits() = %d, want %d", f.Commits(), want)
	}
	if full < 5 {
		t.Errorf("the log was full %d times, want 5 or more", full)
	}
	crash(t, f)
	_, c := open(t, path, Options{})
	if len(c.Objects) != len(want) {
		t.Fatalf("after a crash: %d objects, want %d", len(c.Objects), len(want))
	}
	for _, o := range c.Objects {
		if gw := o.GetRoute().GetNexthops()[0].GetGateway(); want[o.Key().ID()] != gw {
			t.Fatalf("after a crash: %s has gateway %q, want %q", o.Key().ID(), gw, want[o.Key().ID()])
		}
	}
}

// mustEncode returns b encoded as the log takes it.
func mustEncode(t *testing.T, b Batch) []byte {
	t.Helper()
	enc, err := encodeBatch(b)
	if err != nil {
		t.Fatal(err)
	}
	return enc
}

// TestLogRecordsBeforeCheckpointNotReplayed checks that records left in the log from
// before a checkpoint are not replayed over what bbolt got since: a small put logged,
// then a large batch (into bbolt directly) that deletes it, then a crash.
func TestLogRecordsBeforeCheckpointNotReplayed(t *testing.T) {
	defer func(size int64) { logSize = size }(logSize)
	logSize = 64 << 10
	path := filepath.Join(t.TempDir(), "state.db")
	f, _ := open(t, path, Options{})
	mustCommit(t, f, Batch{Put: []*nimbusv1.Object{route("a", "192.0.2.1")}})
	b := largeBatch("l", 300)
	b.Delete = []string{routeID("a")}
	mustCommit(t, f, b)
	crash(t, f)
	_, c := open(t, path, Options{})
	if slices.Contains(names(c.Objects), "a") || len(c.Objects) != 300 {
		t.Errorf("after a crash: %d objects, a among them: %v; want the 300 of the large batch alone", len(c.Objects), slices.Contains(names(c.Objects), "a"))
	}
}

// TestLogTornRecord cuts the last record of the log short, as a crash in the middle of
// writing it would, and checks that the file opens with every commit before it.
func TestLogTornRecord(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	f, _ := open(t, path, Options{})
	mustCommit(t, f, Batch{Put: []*nimbusv1.Object{route("a", "192.0.2.1")}, Position: &Position{"e1", 1}})
	last := f.log.off
	mustCommit(t, f, Batch{Put: []*nimbusv1.Object{route("b", "192.0.2.1")}, Position: &Position{"e1", 2}})
	end := f.log.off
	crash(t, f)

	log, err := os.OpenFile(path+LogSuffix, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	// The record's last bytes never made it to disk.
	if _, err := log.WriteAt(make([]byte, 8), end-8); err != nil {
		t.Fatal(err)
	}
	log.Close()
	_, c := open(t, path, Options{})
	if got := names(c.Objects); !slices.Equal(got, []string{"a"}) || c.Position != (Position{"e1", 1}) {
		t.Errorf("after a torn record at offset %d: %v at %+v, want [a] at e1 1", last, got, c.Position)
	}
}

// TestLogOfAnotherFileNotReplayed puts the log of one state file beside another, and
// checks that the other does not replay it, and that Remove removes a file's log.
func TestLogOfAnotherFileNotReplayed(t *testing.T) {
	dir := t.TempDir()
	one, other := filepath.Join(dir, "one.db"), filepath.Join(dir, "other.db")
	f, _ := open(t, one, Options{})
	mustCommit(t, f, Batch{Put: []*nimbusv1.Object{route("a", "192.0.2.1")}})
	crash(t, f)
	g, _ := open(t, other, Options{})
	mustCommit(t, g, Batch{Put: []*nimbusv1.Object{route("b", "192.0.2.1")}})
	crash(t, g)

	data, err := os.ReadFile(one + LogSuffix)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(other+LogSuffix, data, 0o600); err != nil {
		t.Fatal(err)
	}
	g, c := open(t, other, Options{})
	if got := names(c.Objects); !slices.Equal(got, []string{}) && !slices.Equal(got, nil) {
		t.Errorf("other file with one's log: %v, want none (b was in its own log alone, a in one's)", got)
	}
	// The foreign log was replaced by a log of its own, which takes commits.
	mustCommit(t, g, Batch{Put: []*nimbusv1.Object{route("c", "192.0.2.1")}})
	crash(t, g)
	_, c = open(t, other, Options{})
	if got := names(c.Objects); !slices.Equal(got, []string{"c"}) {
		t.Errorf("after a commit to its new log and a crash: %v, want [c]", got)
	}

	f, c = open(t, one, Options{})
	if got := names(c.Objects); !slices.Equal(got, []string{"a"}) {
		t.Errorf("one: %v, want [a]", got)
	}
	f.Close()
	if err := Remove(one, Options{}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(one + LogSuffix); !os.IsNotExist(err) {
		t.Errorf("Remove left the log: %v", err)
	}
}

// TestCloseCheckpoints checks that after Close the file alone holds every commit: its log
// holds nothing to replay.
func TestCloseCheckpoints(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	f, _ := open(t, path, Options{})
	mustCommit(t, f, Batch{Put: []*nimbusv1.Object{route("a", "192.0.2.1")}, Position: &Position{"e1", 5}})
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(path + LogSuffix); err != nil {
		t.Fatal(err)
	}
	_, c := open(t, path, Options{})
	if got := names(c.Objects); !slices.Equal(got, []string{"a"}) || c.Position != (Position{"e1", 5}) ||
		!proto.Equal(c.Objects[0], route("a", "192.0.2.1")) {
		t.Errorf("after Close and without its log: %v at %+v, want [a] at e1 5", got, c.Position)
	}
}

// TestCheckpointKeepsLastWrites logs small batches that put, delete and put again the
// same objects, in an order unlike their keys', and checks that a checkpoint, at Close
// or at the replay after a crash, stores each object's last write and the last position:
// a checkpoint applies the writes in key order, not in the order they came.
func TestCheckpointKeepsLastWrites(t *testing.T) {
	batches := []Batch{
		{Put: []*nimbusv1.Object{route("c", "192.0.2.1"), route("a", "192.0.2.1")}, Position: &Position{"e1", 1}},
		{Put: []*nimbusv1.Object{route("b", "192.0.2.1")}, Position: &Position{"e1", 2}},
		{Delete: []string{routeID("a")}, Position: &Position{"e1", 3}},
		{Put: []*nimbusv1.Object{route("a", "192.0.2.2")}},
		{Delete: []string{routeID("b"), routeID("c")}, Put: []*nimbusv1.Object{route("c", "192.0.2.3")}, Position: &Position{"e2", 4}},
		{Put: []*nimbusv1.Object{route("d", "192.0.2.1")}},
		{Delete: []string{routeID("d")}},
	}
	want := []string{"a=192.0.2.2", "c=192.0.2.3"}
	for _, end := range []string{"close", "crash"} {
		t.Run(end, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "state.db")
			f, _ := open(t, path, Options{})
			for _, b := range batches {
				mustCommit(t, f, b)
			}
			if f.log.off == logStart {
				t.Fatal("the batches were not logged")
			}
			if end == "close" {
				if err := f.Close(); err != nil {
					t.Fatal(err)
				}
			} else {
				crash(t, f)
			}
			_, c := open(t, path, Options{})
			if got := gateways(c); !slices.Equal(got, want) || c.Position != (Position{"e2", 4}) {
				t.Errorf("after %s: %v at %+v, want %v at e2 4", end, got, c.Position, want)
			}
		})
	}
}

// TestLogThatCannotBeOpened checks that a log Open cannot open fails Open with an error
// naming it, and not as a corrupt file, which the file is not: a directory stands where
// the log goes.
func TestLogThatCannotBeOpened(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	f, _ := open(t, path, Options{})
	mustCommit(t, f, Batch{Put: []*nimbusv1.Object{route("a", "192.0.2.1")}})
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(path + LogSuffix); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(path+LogSuffix, 0o700); err != nil {
		t.Fatal(err)
	}
	_, _, err := Open(path, Options{})
	if err == nil || errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "log of "+path) {
		t.Fatalf("Open with a directory for its log: %v; want an error naming the log, not corruption", err)
	}
	// The file itself is fine: without the obstacle it opens with what it held.
	if err := os.Remove(path + LogSuffix); err != nil {
		t.Fatal(err)
	}
	_, c := open(t, path, Options{})
	if got := names(c.Objects); !slices.Equal(got, []string{"a"}) {
		t.Errorf("reopened: %v, want [a]", got)
	}
}

// TestEncodeBatchSizesExactly checks that encodeBatch sizes its output exactly, with
// deletions, objects of several sizes and a position, and that it decodes back to them.
func TestEncodeBatchSizesExactly(t *testing.T) {
	b := Batch{Delete: []string{"Route/default/default/gone", "Node/default/default/n9"}, Position: &Position{Epoch: "e1", Revision: 1 << 40}}
	for i := range 50 {
		obj := &nimbusv1.Object{
			Meta: &nimbusv1.ObjectMeta{Name: fmt.Sprintf("r%d", i), Labels: map[string]string{"app": strings.Repeat("w", i*7)}},
			Spec: &nimbusv1.Object_Route{Route: &nimbusv1.RouteSpec{Table: uint32(i), Prefix: "10.0.0.0/8"}},
		}
		b.Put = append(b.Put, obj)
	}
	enc, err := encodeBatch(b)
	if err != nil {
		t.Fatal(err)
	}
	if len(enc) != cap(enc) {
		t.Errorf("encodeBatch wrote %d bytes into room for %d: its count is off", len(enc), cap(enc))
	}
	var puts, deletes int
	for rest := enc; len(rest) > 0; {
		num, typ, n := protowire.ConsumeTag(rest)
		m := protowire.ConsumeFieldValue(num, typ, rest[max(n, 0):])
		if n < 0 || m < 0 {
			t.Fatalf("the encoded batch does not parse at byte %d", len(enc)-len(rest))
		}
		switch num {
		case fieldPut:
			put, _ := protowire.ConsumeBytes(rest[n:])
			_, _, k := protowire.ConsumeTag(put)
			id, l := protowire.ConsumeString(put[k:])
			_, _, k2 := protowire.ConsumeTag(put[k+l:])
			v, _ := protowire.ConsumeBytes(put[k+l+k2:])
			var got nimbusv1.Object
			if err := got.UnmarshalVT(v); err != nil || !proto.Equal(&got, b.Put[puts]) || id != b.Put[puts].Key().ID() {
				t.Fatalf("put %d decodes to %s %v (%v), want %s %v", puts, id, &got, err, b.Put[puts].Key().ID(), b.Put[puts])
			}
			puts++
		case fieldDelete:
			deletes++
		}
		rest = rest[n+m:]
	}
	if puts != len(b.Put) || deletes != len(b.Delete) {
		t.Errorf("decoded %d puts and %d deletions, want %d and %d", puts, deletes, len(b.Put), len(b.Delete))
	}
}

// BenchmarkCommitRoutes commits 20,000 routes as operators write them (names such as
// dc2-web-0042, whose key order is not the order they come in, three labels, two or three
// next hops) into an empty file: as nimbus does, in one batch too large for the log, and
// as the agent does, in batches of 200, logged and checkpointed when the log is full.
//
//	go test -run '^$' -bench CommitRoutes -benchmem ./internal/statefile/
func BenchmarkCommitRoutes(b *testing.B) {
	apps := []string{"web", "db", "cache", "api"}
	tiers := []string{"frontend", "backend", "backend", "frontend"}
	routes := make([]*nimbusv1.Object, 20_000)
	for i := range routes {
		site := fmt.Sprintf("dc%d", 1+i/len(apps)%3)
		hops := []*nimbusv1.NextHop{{Gateway: "10.10.0.2"}, {Gateway: "10.10.0.3"}}
		if i%3 == 0 {
			hops = append(hops, &nimbusv1.NextHop{Gateway: "10.10.0.4"})
		}
		routes[i] = &nimbusv1.Object{
			Meta: &nimbusv1.ObjectMeta{Name: fmt.Sprintf("%s-%s-%04d", site, apps[i%len(apps)], i), Nodes: []string{"host-a"},
				Labels: map[string]string{"app": apps[i%len(apps)], "tier": tiers[i%len(apps)], "site": site}},
			Spec: &nimbusv1.Object_Route{Route: &nimbusv1.RouteSpec{
				Table: 100, Prefix: fmt.Sprintf("100.64.%d.%d/32", i/256, i%256), Nexthops: hops,
			}},
		}
	}
	for _, batch := range []int{len(routes), 200} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			for range b.N {
				b.StopTimer()
				path := filepath.Join(b.TempDir(), "state.db")
				f, _, err := Open(path, Options{})
				if err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				for i := 0; i < len(routes); i += batch {
					if err := f.Commit(Batch{Put: routes[i:min(i+batch, len(routes))]}); err != nil {
						b.Fatal(err)
					}
				}
				if err := f.Close(); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(routes)), "ns/route")
		})
	}
}

// TestIdleCheckpoint checks that the log goes into bbolt once commits stop: after a
// pause, the log is empty, and bbolt alone holds every commit, its position included.
func TestIdleCheckpoint(t *testing.T) {
	defer func(d time.Duration) { idleCheckpoint = d }(idleCheckpoint)
	idleCheckpoint = 20 * time.Millisecond
	path := filepath.Join(t.TempDir(), "state.db")
	f, _ := open(t, path, Options{})
	for i := range 5 {
		mustCommit(t, f, Batch{Put: []*nimbusv1.Object{route(fmt.Sprintf("r%d", i), "192.0.2.1")}, Position: &Position{"e1", uint64(i + 1)}})
	}
	logged := func() int64 {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.log.off - logStart
	}
	for start := time.Now(); logged() > 0; time.Sleep(5 * time.Millisecond) {
		if time.Since(start) > 10*time.Second {
			t.Fatalf("the log still holds %d bytes 10s after the last commit", logged())
		}
	}
	crash(t, f)
	if err := os.Remove(path + LogSuffix); err != nil {
		t.Fatal(err)
	}
	_, c := open(t, path, Options{})
	if got := names(c.Objects); !slices.Equal(got, []string{"r0", "r1", "r2", "r3", "r4"}) || c.Position != (Position{"e1", 5}) {
		t.Errorf("bbolt alone holds %v at %+v, want r0 to r4 at e1 5", got, c.Position)
	}
}

// TestLogKeepsItsSize checks that a log made with another size, by an earlier version,
// keeps it: it starts over when that size is full rather than growing, and a crash
// loses nothing.
func TestLogKeepsItsSize(t *testing.T) {
	defer func(size int64) { logSize = size }(logSize)
	logSize = 64 << 10
	path := filepath.Join(t.TempDir(), "state.db")
	f, _ := open(t, path, Options{})
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	logSize = 256 << 10
	f, _ = open(t, path, Options{})
	if f.log.size != 64<<10 {
		t.Fatalf("a log of 64 KiB opened with a size of %d", f.log.size)
	}
	starts := 0
	for i := range 400 {
		before := f.log.off
		mustCommit(t, f, Batch{Put: []*nimbusv1.Object{route(fmt.Sprintf("r%03d", i), "192.0.2.1")}})
		if f.log.off < before {
			starts++
		}
	}
	if starts == 0 {
		t.Fatal("400 commits never filled a log of 64 KiB")
	}
	crash(t, f)
	if st, err := os.Stat(path + LogSuffix); err != nil || st.Size() != 64<<10 {
		t.Fatalf("the log: %v, size %d, want 64 KiB", err, st.Size())
	}
	_, c := open(t, path, Options{})
	if len(c.Objects) != 400 {
		t.Errorf("after a crash: %d objects, want 400", len(c.Objects))
	}
}
