package statefile

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// rssFile returns the process's resident file-backed memory, RssFile in /proc/self/status.
func rssFile(t *testing.T) int64 {
	t.Helper()
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(bytes.NewReader(status))
	for sc.Scan() {
		f := bytes.Fields(sc.Bytes())
		if len(f) == 3 && string(f[0]) == "RssFile:" && string(f[2]) == "kB" {
			kb, err := strconv.ParseInt(string(f[1]), 10, 64)
			if err != nil {
				t.Fatalf("parsing %q: %v", sc.Text(), err)
			}
			return kb << 10
		}
	}
	t.Fatal("no RssFile in /proc/self/status")
	return 0
}

// TestReleasePages checks that the pages Open reads leave the process's resident set
// when ReleasePages is called, and that the file still reads and commits after that.
func TestReleasePages(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	const n = 20_000
	f, _ := open(t, path, Options{})
	b := Batch{Position: &Position{"e", 1}}
	for i := range n {
		b.Put = append(b.Put, route(fmt.Sprintf("r%05d", i), "192.0.2.1"))
	}
	if err := f.Commit(b); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	info, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if info.Size() < 4<<20 {
		t.Fatalf("the file of %d routes is %d bytes; the test wants 4 MiB at least", n, info.Size())
	}

	f, c := open(t, path, Options{})
	if len(c.Objects) != n {
		t.Fatalf("read %d routes, want %d", len(c.Objects), n)
	}
	before := rssFile(t)
	if err := f.ReleasePages(); err != nil {
		t.Fatal(err)
	}
	after := rssFile(t)
	// Open read every page of the file; all of them but bbolt's meta pages, which a
	// read transaction reads again, must be gone. Half the file leaves room for other
	// file pages the process faults in meanwhile.
	if drop := before - after; drop < info.Size()/2 {
		t.Errorf("ReleasePages lowered RssFile by %d bytes, from %d to %d; want half the %d-byte file at least", drop, before, after, info.Size())
	}

	if err := f.Commit(Batch{Delete: []string{routeID("r00000")}}); err != nil {
		t.Fatalf("Commit after ReleasePages: %v", err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.ReleasePages(); err == nil {
		t.Error("ReleasePages of a closed file succeeded")
	}
	_, c = open(t, path, Options{})
	if len(c.Objects) != n-1 || c.Objects[0].GetMeta().GetName() != "r00001" {
		t.Errorf("reopened after ReleasePages and a commit: %d routes from %v, want %d from r00001", len(c.Objects), c.Objects[0].GetMeta().GetName(), n-1)
	}
}
