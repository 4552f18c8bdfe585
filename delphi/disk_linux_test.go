package delphi

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// mappedRSS returns the resident bytes of the process's mappings of the file at path,
// from /proc/self/smaps.
func mappedRSS(t *testing.T, path string) int64 {
	t.Helper()
	smaps, err := os.ReadFile("/proc/self/smaps")
	if err != nil {
		t.Fatal(err)
	}
	var rss int64
	inFile := false
	for line := range bytes.Lines(smaps) {
		f := bytes.Fields(line)
		switch {
		case len(f) >= 5 && bytes.Contains(f[0], []byte("-")) && len(f[1]) == 4:
			// The first line of a mapping: "start-end perms offset dev inode [path]".
			inFile = len(f) >= 6 && string(bytes.Join(f[5:], []byte(" "))) == path
		case inFile && len(f) == 3 && string(f[0]) == "Rss:":
			kb, err := strconv.ParseInt(string(f[1]), 10, 64)
			if err != nil {
				t.Fatalf("parsing %q: %v", line, err)
			}
			rss += kb << 10
		}
	}
	return rss
}

// TestRestoreLeavesStateFileOutOfRSS checks that the pages of the state file that Open
// reads to restore do not stay in the process's resident set, and that the store still
// reads and commits after that.
func TestRestoreLeavesStateFileOutOfRSS(t *testing.T) {
	dir, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, StateFile)
	const n = 20_000
	func() {
		s, err := Open(Options{Dir: dir, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		d, err := s.ClaimDesired()
		if err != nil {
			t.Fatal(err)
		}
		txn := &DesiredTxn{}
		for i := range n {
			txn.Put(route(fmt.Sprintf("r%05d", i), 100, fmt.Sprintf("10.%d.%d.0/24", i>>8, i&255), "10.0.0.1"))
		}
		txn.SetResume("e", 1)
		if err := d.Commit(txn); err != nil {
			t.Fatal(err)
		}
	}()
	info, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if info.Size() < 1<<20 {
		t.Fatalf("the state file of %d routes is %d bytes; the test wants one of 1 MiB at least", n, info.Size())
	}

	s, d := openDir(t, dir)
	if got := len(s.List(nimbusv1.Kind_KIND_ROUTE)); got != n {
		t.Fatalf("restored %d routes, want %d", got, n)
	}
	// bbolt reads its two meta pages again only at a commit; a few pages of slack.
	if rss := mappedRSS(t, path); rss > 64<<10 {
		t.Errorf("after Open, %d bytes of the %d-byte state file are resident, want 64 KiB at most", rss, info.Size())
	}
	commit(t, d, func(txn *DesiredTxn) { txn.Delete(nimbusv1.NewKey(nimbusv1.Kind_KIND_ROUTE, "", "", "r00000")) })
	if _, ok := s.Get(nimbusv1.NewKey(nimbusv1.Kind_KIND_ROUTE, "", "", "r00001")); !ok {
		t.Error("r00001 is gone after a commit")
	}
	s.Close()
	r, _ := openDir(t, dir)
	if got := len(r.List(nimbusv1.Kind_KIND_ROUTE)); got != n-1 {
		t.Errorf("after a commit and a restart, %d routes, want %d", got, n-1)
	}
}
