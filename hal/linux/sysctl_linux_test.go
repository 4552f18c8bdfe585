package linux

import (
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// TestSysctlsWritesOverlap: the writes of two sysctls overlap, as through netlink they
// wait for the kernel's answer; the first waits until the second is done, which would
// never happen if the record stayed locked across a write. Both values are recorded in
// the state file, and Restore puts them back.
func TestSysctlsWritesOverlap(t *testing.T) {
	s, err := openSysctls(filepath.Join(t.TempDir(), "sysctls.json"))
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	values := map[string]string{"a": "0", "b": "0"}
	secondDone := make(chan struct{})
	access := func(path string, write func()) sysctlAccess {
		return sysctlAccess{
			read: func() (string, error) {
				mu.Lock()
				defer mu.Unlock()
				return values[path], nil
			},
			write: func(v string) error {
				write()
				mu.Lock()
				defer mu.Unlock()
				values[path] = v
				return nil
			},
		}
	}
	first := make(chan error, 1)
	waited := false
	go func() {
		_, err := s.SetVia("a", "1", access("a", func() {
			select {
			case <-secondDone:
			case <-time.After(5 * time.Second):
				waited = true
			}
		}))
		first <- err
	}()
	// The second write starts once the first is under way, waiting for it.
	for !s.Recorded("a") {
		time.Sleep(time.Millisecond)
	}
	n, err := s.SetVia("b", "1", access("b", func() {}))
	close(secondDone)
	if n != 1 || err != nil {
		t.Fatalf("setting b while a's write is under way: %d writes, %v; want 1, nil", n, err)
	}
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if waited {
		t.Fatal("the second write waited for the first to end")
	}
	if values["a"] != "1" || values["b"] != "1" {
		t.Fatalf("values %v; want both 1", values)
	}
	again, err := openSysctls(s.path)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"a", "b"} {
		if !again.Recorded(p) {
			t.Errorf("the state file does not record %s", p)
		}
		if n, err := again.RestoreVia(p, access(p, func() {})); n != 1 || err != nil {
			t.Errorf("restoring %s: %d writes, %v; want 1, nil", p, n, err)
		}
	}
	if values["a"] != "0" || values["b"] != "0" {
		t.Errorf("values after restoring %v; want both 0", values)
	}
}
