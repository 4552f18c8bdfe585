package statefile

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"

	"github.com/naplesnet/naples/internal/statefile/statefiletest"
)

// once is a lock timeout that tries the lock once instead of waiting for it.
const once = time.Nanosecond

// route returns a Route object named name via gateway gw.
func route(name, gw string) *nimbusv1.Object {
	return &nimbusv1.Object{
		Meta: &nimbusv1.ObjectMeta{Name: name, Labels: map[string]string{"pad": strings.Repeat(name, 20)}},
		Spec: &nimbusv1.Object_Route{Route: &nimbusv1.RouteSpec{
			Table: 100, Prefix: "10.1.0.0/16", Nexthops: []*nimbusv1.NextHop{{Gateway: gw}},
		}},
	}
}

func routeID(name string) string { return nimbusv1.NewKey(nimbusv1.Kind_KIND_ROUTE, "", "", name).ID() }

func u64(v uint64) []byte { return binary.BigEndian.AppendUint64(nil, v) }

// open opens the file at path and fails the test on error; Close runs at cleanup.
func open(t *testing.T, path string, opts Options) (*File, *Contents) {
	t.Helper()
	f, c, err := Open(path, opts)
	if err != nil {
		t.Fatalf("Open(%s): %v", path, err)
	}
	t.Cleanup(func() { f.Close() })
	return f, c
}

// names returns the names of objs, in order.
func names(objs []*nimbusv1.Object) []string {
	var out []string
	for _, o := range objs {
		out = append(out, o.GetMeta().GetName())
	}
	return out
}

func TestCommitAndReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "new-dir", "state.db")
	f, c := open(t, path, Options{})
	if !c.Created || len(c.Objects) != 0 || c.Position != (Position{}) {
		t.Fatalf("Open of a new file = %+v, want created and empty", c)
	}
	if f.Path() != path {
		t.Errorf("Path() = %q, want %q", f.Path(), path)
	}
	commit := func(b Batch) {
		t.Helper()
		if err := f.Commit(b); err != nil {
			t.Fatal(err)
		}
	}
	commit(Batch{Put: []*nimbusv1.Object{route("b", "192.0.2.1"), route("a", "192.0.2.1"), route("gone", "192.0.2.1")}, Position: &Position{"e1", 41}})

	// A large batch is one commit; deletions come first, so a key both deleted and put
	// ends up stored.
	before := f.Commits()
	batch := Batch{Delete: []string{routeID("gone"), routeID("b"), routeID("never")}, Position: &Position{"e1", 42}}
	batch.Put = append(batch.Put, route("b", "192.0.2.2"))
	for i := range 1000 {
		batch.Put = append(batch.Put, route(fmt.Sprintf("r%04d", i), "192.0.2.1"))
	}
	commit(batch)
	if got := f.Commits() - before; got != 1 {
		t.Errorf("a %d-object batch took %d commits, want 1", len(batch.Put), got)
	}
	commit(Batch{Delete: []string{routeID("r0999")}}) // keeps the position
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}

	_, c = open(t, path, Options{})
	if c.Created || c.Position != (Position{"e1", 42}) {
		t.Errorf("reopened: created %v, position %+v; want not created, {e1 42}", c.Created, c.Position)
	}
	got := names(c.Objects)
	if len(got) != 1001 || !slices.IsSorted(got) || got[0] != "a" || got[1] != "b" || slices.Contains(got, "gone") || slices.Contains(got, "r0999") {
		t.Errorf("reopened: %d objects %v..., want a, b, r0000..r0998 in order", len(got), got[:min(len(got), 3)])
	}
	if i := slices.Index(got, "b"); i < 0 || !proto.Equal(c.Objects[i], route("b", "192.0.2.2")) {
		t.Errorf("reopened: b is not the one put last")
	}
}

func TestCommitAfterCloseFails(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	f, _ := open(t, path, Options{})
	f.Close()
	err := f.Commit(Batch{Put: []*nimbusv1.Object{route("a", "192.0.2.1")}})
	if err == nil || !strings.Contains(err.Error(), path) {
		t.Errorf("Commit after Close: err = %v, want an error naming %s", err, path)
	}
}

// damagePages writes a good file of many objects at path, then zeroes 8 bytes at offset
// off of every page after the two meta pages.
func damagePages(t *testing.T, path string, off int64) {
	t.Helper()
	f, _, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	var objs []*nimbusv1.Object
	for i := range 2000 {
		objs = append(objs, route(fmt.Sprintf("r%04d", i), "192.0.2.1"))
	}
	if err := f.Commit(Batch{Put: objs}); err != nil {
		t.Fatal(err)
	}
	f.Close()
	file, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	st, err := file.Stat()
	if err != nil {
		t.Fatal(err)
	}
	page := int64(os.Getpagesize())
	for p := 2 * page; p < st.Size(); p += page {
		if _, err := file.WriteAt(make([]byte, 8), p+off); err != nil {
			t.Fatal(err)
		}
	}
}

func TestBadFile(t *testing.T) {
	good, err := proto.Marshal(route("a", "192.0.2.1"))
	if err != nil {
		t.Fatal(err)
	}
	meta := func(kv map[string][]byte) map[string][]byte {
		if _, ok := kv[KeyFormat]; !ok {
			kv[KeyFormat] = u64(FormatVersion)
		}
		return kv
	}
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
		{"value does not parse", func(t *testing.T, path string) {
			statefiletest.Write(t, path, map[string]map[string][]byte{
				BucketMeta:    meta(map[string][]byte{KeyRevision: u64(3)}),
				BucketObjects: {routeID("a"): good, routeID("b"): {0xff, 0xff, 0xff}},
			})
		}, fmt.Sprintf("object %q", routeID("b"))},
		{"object under another key", func(t *testing.T, path string) {
			statefiletest.Write(t, path, map[string]map[string][]byte{
				BucketMeta:    meta(map[string][]byte{}),
				BucketObjects: {routeID("z"): good},
			})
		}, "holds " + routeID("a")},
		{"unknown format version", func(t *testing.T, path string) {
			statefiletest.Write(t, path, map[string]map[string][]byte{
				BucketMeta:    {KeyFormat: u64(FormatVersion + 1)},
				BucketObjects: {},
			})
		}, "format version 2, want 1"},
		{"no format version", func(t *testing.T, path string) {
			statefiletest.Write(t, path, map[string]map[string][]byte{
				BucketMeta:    {KeyEpoch: []byte("e"), KeyRevision: u64(3)},
				BucketObjects: {},
			})
		}, `meta "format" is missing`},
		{"short format version", func(t *testing.T, path string) {
			statefiletest.Write(t, path, map[string]map[string][]byte{
				BucketMeta:    {KeyFormat: {1}},
				BucketObjects: {},
			})
		}, `meta "format": 1 bytes, want 8`},
		{"objects bucket missing", func(t *testing.T, path string) {
			statefiletest.Write(t, path, map[string]map[string][]byte{BucketMeta: meta(map[string][]byte{})})
		}, `bucket "objects" is missing`},
		{"meta bucket missing", func(t *testing.T, path string) {
			statefiletest.Write(t, path, map[string]map[string][]byte{BucketObjects: {routeID("a"): good}})
		}, `bucket "meta" is missing`},
		{"short revision", func(t *testing.T, path string) {
			statefiletest.Write(t, path, map[string]map[string][]byte{
				BucketMeta:    meta(map[string][]byte{KeyRevision: {1, 2}}),
				BucketObjects: {},
			})
		}, `meta "revision": 2 bytes, want 8`},
		// bbolt panics on these; the prefixes are the ones Open gives a recovered panic.
		{"damaged page headers: panic opening", func(t *testing.T, path string) {
			damagePages(t, path, 8) // page flags: the freelist page is not one
		}, "opening: invalid freelist page"},
		{"damaged page ids: panic reading", func(t *testing.T, path string) {
			damagePages(t, path, 0) // page ids: a page is not the one it should be
		}, "reading: "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "state.db")
			tt.write(t, path)
			f, _, err := Open(path, Options{LockTimeout: once})
			if err == nil {
				f.Close()
				t.Fatal("Open succeeded on a bad file")
			}
			if !errors.Is(err, ErrCorrupt) || errors.Is(err, ErrLocked) {
				t.Errorf("err = %v, want ErrCorrupt", err)
			}
			if !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err = %q, want it to name %s and say %q", err, path, tt.want)
			}

			// The failed Open let go of the file, even after a panic: Remove gets its lock.
			if err := Remove(path, Options{LockTimeout: once}); err != nil {
				t.Fatalf("Remove: %v", err)
			}
			if _, err := os.Stat(path); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("after Remove: stat = %v, want not exist", err)
			}
			if _, c := open(t, path, Options{}); !c.Created {
				t.Error("Open after Remove did not create a new file")
			}
		})
	}
}

func TestAcceptUnversioned(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	good, err := proto.Marshal(route("a", "192.0.2.1"))
	if err != nil {
		t.Fatal(err)
	}
	statefiletest.Write(t, path, map[string]map[string][]byte{
		BucketMeta:    {KeyEpoch: []byte("e"), KeyRevision: u64(3)},
		BucketObjects: {routeID("a"): good},
	})
	f, c := open(t, path, Options{AcceptUnversioned: true})
	if c.Created || c.Position != (Position{"e", 3}) || !slices.Equal(names(c.Objects), []string{"a"}) {
		t.Errorf("Open of an unversioned file = created %v, position %+v, objects %v; want {e 3} and [a]", c.Created, c.Position, names(c.Objects))
	}
	f.Close()
	// Open recorded the version: an Open that insists on one reads the file.
	if _, c := open(t, path, Options{}); c.Position != (Position{"e", 3}) {
		t.Errorf("strict reopen: position %+v, want {e 3}", c.Position)
	}
}

func TestLocked(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	f, _ := open(t, path, Options{})
	if err := f.Commit(Batch{Put: []*nimbusv1.Object{route("a", "192.0.2.1")}}); err != nil {
		t.Fatal(err)
	}
	if g, _, err := Open(path, Options{LockTimeout: once}); !errors.Is(err, ErrLocked) || errors.Is(err, ErrCorrupt) || !strings.Contains(fmt.Sprint(err), path) {
		if err == nil {
			g.Close()
		}
		t.Errorf("Open of a file in use: err = %v, want ErrLocked naming %s", err, path)
	}
	if err := Remove(path, Options{LockTimeout: once}); !errors.Is(err, ErrLocked) {
		t.Errorf("Remove of a file in use: err = %v, want ErrLocked", err)
	}
	// The refused Remove left the file, and its holder, alone.
	if err := f.Commit(Batch{Put: []*nimbusv1.Object{route("b", "192.0.2.1")}}); err != nil {
		t.Errorf("Commit after a refused Remove: %v", err)
	}
	f.Close()
	if _, c := open(t, path, Options{}); !slices.Equal(names(c.Objects), []string{"a", "b"}) {
		t.Errorf("after a refused Remove the file holds %v, want [a b]", names(c.Objects))
	}
}

func TestRemoveAbsentFile(t *testing.T) {
	if err := Remove(filepath.Join(t.TempDir(), "state.db"), Options{}); err != nil {
		t.Errorf("Remove of an absent file: %v", err)
	}
}

func TestCallerSentinels(t *testing.T) {
	errMine := errors.New("my store is corrupt")
	errHeld := errors.New("my store is held")
	opts := Options{LockTimeout: once, Corrupt: errMine, Locked: errHeld}

	path := filepath.Join(t.TempDir(), "state.db")
	if err := os.WriteFile(path, []byte(strings.Repeat("garbage ", 1000)), 0o600); err != nil {
		t.Fatal(err)
	}
	_, _, err := Open(path, opts)
	if !errors.Is(err, errMine) || !strings.Contains(fmt.Sprint(err), errMine.Error()) {
		t.Errorf("Open of a corrupt file: err = %v, want it to wrap and say %q", err, errMine)
	}

	path = filepath.Join(t.TempDir(), "state.db")
	open(t, path, opts)
	if _, _, err := Open(path, opts); !errors.Is(err, errHeld) {
		t.Errorf("Open of a file in use: err = %v, want it to wrap %q", err, errHeld)
	}
	if err := Remove(path, opts); !errors.Is(err, errHeld) {
		t.Errorf("Remove of a file in use: err = %v, want it to wrap %q", err, errHeld)
	}
}

// TestMain turns the checkpoint after idleness off, so that what a test leaves in the log
// stays there however slowly it runs; TestIdleCheckpoint turns it on.
func TestMain(m *testing.M) {
	idleCheckpoint = 0
	os.Exit(m.Run())
}
