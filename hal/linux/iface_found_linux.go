package linux

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
)

// linkFound is what the interface reconciler found on a link before it first changed
// it: the administrative state and the MTU, each recorded only once naples changed it,
// and forgotten once naples has put it back.
type linkFound struct {
	// Up is the administrative state found; nil when naples has not changed it.
	Up *bool `json:"adminUp,omitempty"`
	// MTU is the MTU found; 0 when naples has not changed it.
	MTU uint32 `json:"mtu,omitempty"`
}

// empty reports whether nothing is recorded.
func (f linkFound) empty() bool { return f.Up == nil && f.MTU == 0 }

// foundLinks records, per link name, what the interface reconciler found on the link
// before it first changed its administrative state or MTU, so that it can put them back
// when the object goes or stops setting them. When it has a path, the record is kept in
// that file, a JSON object of link names ({"eth1": {"adminUp": true, "mtu": 1500}}),
// rewritten whole (a temporary file, fsynced and renamed over it) before each kernel
// write that it makes undoable, so that a restarted agent still puts the links back.
type foundLinks struct {
	path string

	// mu guards links.
	mu    sync.Mutex
	links map[string]linkFound
}

// openFoundLinks reads the record kept at path; a missing file is an empty record, and
// an empty path keeps the record in memory only.
func openFoundLinks(path string) (*foundLinks, error) {
	links, err := readStateFile[linkFound](path, "the interface state file")
	if err != nil {
		return nil, err
	}
	return &foundLinks{path: path, links: links}, nil
}

// readStateFile reads a JSON object of V by name from the file at path, which
// writeFileSynced wrote; a missing file or an empty path is an empty object. what names
// the file in errors.
func readStateFile[V any](path, what string) (map[string]V, error) {
	m := map[string]V{}
	if path == "" {
		return m, nil
	}
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return m, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", what, err)
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("reading %s %s: %w", what, path, err)
	}
	if m == nil {
		m = map[string]V{}
	}
	return m, nil
}

// get returns what is recorded for the link.
func (f *foundLinks) get(device string) linkFound {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.links[device]
}

// devices returns the names of the links with a record.
func (f *foundLinks) devices() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]string, 0, len(f.links))
	for d := range f.links {
		out = append(out, d)
	}
	return out
}

// set records rec for the link, or forgets the link when rec is empty, and writes the
// record to its file when it changed.
func (f *foundLinks) set(device string, rec linkFound) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	old, had := f.links[device]
	if rec.empty() {
		if !had {
			return nil
		}
		delete(f.links, device)
	} else {
		if had && sameFound(old, rec) {
			return nil
		}
		f.links[device] = rec
	}
	if err := f.saveLocked(); err != nil {
		// Memory follows the file: the kernel write the record was for is not made.
		if had {
			f.links[device] = old
		} else {
			delete(f.links, device)
		}
		return err
	}
	return nil
}

// sameFound reports whether two records are equal.
func sameFound(a, b linkFound) bool {
	return a.MTU == b.MTU && (a.Up == nil) == (b.Up == nil) && (a.Up == nil || *a.Up == *b.Up)
}

// saveLocked writes the record to its file, when it has one. mu must be held.
func (f *foundLinks) saveLocked() error {
	if f.path == "" {
		return nil
	}
	b, err := json.Marshal(f.links)
	if err != nil {
		return err
	}
	return writeFileSynced(f.path, b, "the interface state file")
}

// writeFileSynced replaces the file at path with b, durably: a temporary file beside it,
// fsynced and renamed over it, and the directory fsynced. what names the file in errors.
func writeFileSynced(path string, b []byte, what string) error {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("writing %s: %w", what, err)
	}
	defer os.Remove(tmp.Name())
	_, err = tmp.Write(b)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		return fmt.Errorf("writing %s %s: %w", what, path, err)
	}
	if d, err := os.Open(dir); err == nil {
		err = d.Sync()
		d.Close()
		if err != nil {
			return fmt.Errorf("writing %s %s: syncing its directory: %w", what, path, err)
		}
	}
	return nil
}
