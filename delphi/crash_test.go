package delphi

import (
	"bufio"
	"fmt"
	"hash/fnv"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"

	"github.com/naplesnet/naples/internal/testrand"
)

// crashWriterEnv switches the test binary into the writer process of TestCrashSafety: it
// holds the directory to write to.
const crashWriterEnv = "DELPHI_CRASH_WRITER"

const (
	crashKeys     = 300         // objects r000..r299 come and go
	crashChecksum = "checksum"  // a Node object describing the rest
	crashMaxLife  = time.Minute // a writer whose parent died stops by itself
)

// crashObject is the object batch rev writes under name: its content is a function of
// both, so a restored object shows which batch wrote it.
func crashObject(name string, rev uint64) *nimbusv1.Object {
	return &nimbusv1.Object{
		Meta: &nimbusv1.ObjectMeta{
			Name:       name,
			Generation: int64(rev),
			Labels:     map[string]string{"pad": strings.Repeat(name, 100)},
		},
		Spec: &nimbusv1.Object_Route{Route: &nimbusv1.RouteSpec{
			Table:    uint32(rev),
			Prefix:   "10.0.0.0/8",
			Nexthops: []*nimbusv1.NextHop{{Gateway: "192.0.2.1"}},
		}},
	}
}

// crashSum returns the count and a hash of a state, name → revision of the last write.
func crashSum(state map[string]uint64) (count int, hash string) {
	h := fnv.New64a()
	for _, name := range slices.Sorted(maps.Keys(state)) {
		fmt.Fprintf(h, "%s=%d;", name, state[name])
	}
	return len(state), strconv.FormatUint(h.Sum64(), 16)
}

// crashBatch applies batch rev to state and returns it as a transaction. Batch rev is a
// function of rev and the state before it only, so replaying batches 1..rev from empty
// gives exactly the state batch rev produced.
func crashBatch(state map[string]uint64, rev uint64) *DesiredTxn {
	rng := rand.New(rand.NewPCG(rev, 0x5eed))
	txn := &DesiredTxn{}
	if rev%25 == 0 {
		// A snapshot: keep a random half, rewrite some of it, drop the rest.
		keep := map[nimbusv1.Key]bool{}
		for _, name := range slices.Sorted(maps.Keys(state)) {
			if rng.IntN(2) == 0 {
				keep[nimbusv1.MakeKey(nimbusv1.Kind_KIND_ROUTE, "", "", name)] = true
			}
		}
		for name := range state {
			if !keep[nimbusv1.MakeKey(nimbusv1.Kind_KIND_ROUTE, "", "", name)] {
				delete(state, name)
			}
		}
		keep[nimbusv1.MakeKey(nimbusv1.Kind_KIND_NODE, "", "", crashChecksum)] = true
		txn.DeleteOthers(keep)
	}
	// Commit applies every Put before every Delete; so does the state.
	var deletes []string
	for range 20 + rng.IntN(80) {
		name := fmt.Sprintf("r%03d", rng.IntN(crashKeys))
		if rng.IntN(4) == 0 {
			txn.Delete(nimbusv1.NewKey(nimbusv1.Kind_KIND_ROUTE, "", "", name))
			deletes = append(deletes, name)
			continue
		}
		txn.Put(crashObject(name, rev))
		state[name] = rev
	}
	for _, name := range deletes {
		delete(state, name)
	}
	count, hash := crashSum(state)
	txn.Put(&nimbusv1.Object{
		Meta: &nimbusv1.ObjectMeta{Name: crashChecksum, Labels: map[string]string{
			"rev": strconv.FormatUint(rev, 10), "count": strconv.Itoa(count), "hash": hash,
		}},
		Spec: &nimbusv1.Object_Node{Node: &nimbusv1.NodeSpec{}},
	})
	txn.SetResume("crash", rev)
	return txn
}

// storedState reads the r objects of a store as name → revision of the last write.
func storedState(s *Store) map[string]uint64 {
	state := map[string]uint64{}
	for _, obj := range s.List(nimbusv1.Kind_KIND_ROUTE) {
		state[obj.GetMeta().GetName()] = uint64(obj.GetMeta().GetGeneration())
	}
	return state
}

// runCrashWriter is the writer process: it continues the batch sequence from what the
// store holds, as fast as it can, until it is killed.
func runCrashWriter(dir string) int {
	s, err := Open(Options{Dir: dir, Logger: quiet})
	if err != nil {
		fmt.Fprintln(os.Stderr, "crash writer:", err)
		return 1
	}
	d, err := s.ClaimDesired()
	if err != nil {
		fmt.Fprintln(os.Stderr, "crash writer:", err)
		return 1
	}
	state := storedState(s)
	_, rev := s.Resume()
	fmt.Println("ready")
	for start := time.Now(); time.Since(start) < crashMaxLife; {
		rev++
		if err := d.Commit(crashBatch(state, rev)); err != nil {
			fmt.Fprintln(os.Stderr, "crash writer:", err)
			return 1
		}
		fmt.Println("committed", rev)
	}
	return 0
}

// TestCrashSafety kills a writer process 20 times, each time once it has reported a
// random number of commits, so that the kill lands in the middle of a later batch. After
// each kill the store must open, hold at least every batch the writer reported committed,
// and hold exactly the state of the batch its resume revision names.
func TestCrashSafety(t *testing.T) {
	if testing.Short() {
		t.Skip("re-executes the test binary")
	}
	rng := rand.New(rand.NewPCG(testrand.Seed(t), 0))
	dir := t.TempDir()

	const kills = 20
	expected := map[string]uint64{} // the state after batch expectedRev
	var expectedRev uint64
	afterCommits := 0 // kills after which the store held more batches than before
	for kill := range kills {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), crashWriterEnv+"="+dir)
		cmd.Stderr = os.Stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		stdout := bufio.NewReader(out)
		line, err := stdout.ReadString('\n')
		if err != nil || line != "ready\n" {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("kill %d: the writer did not start: %q, %v", kill, line, err)
		}
		// Kill once the writer has reported n commits: it is then somewhere in a later one.
		n := 1 + rng.IntN(20)
		var reported uint64
		for range n {
			line, err := stdout.ReadString('\n')
			rev, perr := strconv.ParseUint(strings.TrimPrefix(strings.TrimSuffix(line, "\n"), "committed "), 10, 64)
			if err != nil || perr != nil || !strings.HasPrefix(line, "committed ") {
				cmd.Process.Kill()
				cmd.Wait()
				t.Fatalf("kill %d: reading the writer's commit reports: %q, %v", kill, line, err)
			}
			reported = rev
		}
		if err := cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		cmd.Wait()

		s, err := Open(Options{Dir: dir, Logger: quiet})
		if err != nil {
			t.Fatalf("kill %d: reopening: %v", kill, err)
		}
		_, rev := s.Resume()
		if rev < reported {
			s.Close()
			t.Fatalf("kill %d: the writer reported batch %d committed, the reopened store holds up to %d", kill, reported, rev)
		}
		if rev < expectedRev {
			s.Close()
			t.Fatalf("kill %d: revision went back from %d to %d", kill, expectedRev, rev)
		}
		if rev > expectedRev {
			afterCommits++
		}
		for expectedRev < rev {
			expectedRev++
			crashBatch(expected, expectedRev)
		}
		verifyCrashState(t, s, rev, expected)
		s.Close()
		if t.Failed() {
			t.Fatalf("kill %d: inconsistent state at revision %d", kill, rev)
		}
	}
	t.Logf("%d kills, %d of them after new commits; %d batches committed", kills, afterCommits, expectedRev)
	if afterCommits < kills*3/4 {
		t.Errorf("only %d of %d kills landed after the writer committed; the test meant to kill it mid-way", afterCommits, kills)
	}
}

// verifyCrashState checks that a store holds exactly the given state, that every object
// is the one its batch wrote, and that the checksum object agrees with the objects.
func verifyCrashState(t *testing.T, s *Store, rev uint64, want map[string]uint64) {
	t.Helper()
	got := storedState(s)
	if !maps.Equal(got, want) {
		t.Errorf("revision %d: store holds %d objects, replay %d; they differ", rev, len(got), len(want))
	}
	for _, obj := range s.List(nimbusv1.Kind_KIND_ROUTE) {
		if w := crashObject(obj.GetMeta().GetName(), uint64(obj.GetMeta().GetGeneration())); !proto.Equal(obj, w) {
			t.Errorf("revision %d: %s is not what its batch wrote", rev, obj.Key().ID())
		}
	}
	sum, ok := s.Get(nimbusv1.NewKey(nimbusv1.Kind_KIND_NODE, "", "", crashChecksum))
	if rev == 0 {
		if ok || len(got) > 0 {
			t.Errorf("revision 0 with objects stored")
		}
		return
	}
	if !ok {
		t.Errorf("revision %d: no checksum object", rev)
		return
	}
	count, hash := crashSum(got)
	l := sum.GetMeta().GetLabels()
	if l["rev"] != strconv.FormatUint(rev, 10) || l["count"] != strconv.Itoa(count) || l["hash"] != hash {
		t.Errorf("revision %d: checksum object %v, objects give count %d hash %s", rev, l, count, hash)
	}
}
