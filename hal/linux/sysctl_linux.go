package linux

import (
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"strings"
	"sync"
)

// sysctls sets sysctls and puts back what it changed: before its first write of a sysctl
// it records the value it found there, and Restore writes that value back and forgets
// it. A sysctl it found as wanted is not recorded, so Restore leaves it alone: naples
// undoes only what it did. When it has a path the record is kept in that file, a JSON
// object of sysctl paths ({"/proc/sys/net/ipv4/conf/nbr1/forwarding": "0"}), rewritten
// whole before each write it makes undoable, so that a restarted agent still puts the
// sysctls back.
//
// A sysctl of the network namespace is read and written by the calling thread: call Set
// and Restore in the namespace (runInNamespace). SetVia and RestoreVia read and write a
// sysctl another way, such as through netlink, and record it by the same path.
//
// The calls for one path must not overlap (the network reconciler makes them under the
// network's lock, or the gateway's for the gateways' sysctls); those for different paths
// may, and their reads and writes of the kernel do: the record is locked only while it
// changes, not across a write, which through netlink waits for the kernel's answer.
type sysctls struct {
	path string

	// mu guards found and the file.
	mu    sync.Mutex
	found map[string]string
}

// openSysctls reads the record kept at path; a missing file is an empty record, and an
// empty path keeps the record in memory only.
func openSysctls(path string) (*sysctls, error) {
	found, err := readStateFile[string](path, "the sysctl state file")
	if err != nil {
		return nil, err
	}
	return &sysctls{path: path, found: found}, nil
}

// sysctlAccess reads and writes the value of one sysctl. A read of a sysctl that does
// not exist (its device gone) returns an error that unwraps to fs.ErrNotExist.
type sysctlAccess struct {
	read  func() (string, error)
	write func(value string) error
}

// sysctlFile returns the access to the sysctl file at path, by the calling thread.
func sysctlFile(path string) sysctlAccess {
	return sysctlAccess{
		read:  func() (string, error) { return readSysctl(path) },
		write: func(value string) error { return os.WriteFile(path, []byte(value+"\n"), 0o644) },
	}
}

// Set makes the sysctl file at path hold value, recording the value it found before the
// first write, and returns how many writes that took (0 or 1).
func (s *sysctls) Set(path, value string) (int, error) {
	return s.SetVia(path, value, sysctlFile(path))
}

// SetVia is Set for the sysctl at path read and written through access.
func (s *sysctls) SetVia(path, value string, access sysctlAccess) (int, error) {
	have, err := access.read()
	if err != nil {
		return 0, err
	}
	if have == value {
		return 0, nil
	}
	if err := s.record(path, have); err != nil {
		return 0, err
	}
	if err := access.write(value); err != nil {
		return 0, err
	}
	return 1, nil
}

// record records have as the value found at path, unless a value is recorded for it
// already, and saves the record before the write it makes undoable.
func (s *sysctls) record(path, have string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.found[path]; ok {
		return nil
	}
	s.found[path] = have
	if err := s.saveLocked(); err != nil {
		delete(s.found, path)
		return err
	}
	return nil
}

// Recorded reports whether Set changed the sysctl at path and Restore has not put it
// back yet.
func (s *sysctls) Recorded(path string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.found[path]
	return ok
}

// Restore writes back the value Set found at path before its first write, and forgets
// it; a sysctl Set never wrote is left as it is. It returns how many writes that took.
// A sysctl that is gone (its device deleted) is forgotten.
func (s *sysctls) Restore(path string) (int, error) {
	return s.RestoreVia(path, sysctlFile(path))
}

// RestoreVia is Restore for the sysctl at path read and written through access.
func (s *sysctls) RestoreVia(path string, access sysctlAccess) (int, error) {
	s.mu.Lock()
	found, ok := s.found[path]
	s.mu.Unlock()
	if !ok {
		return 0, nil
	}
	have, err := access.read()
	if errors.Is(err, fs.ErrNotExist) {
		return 0, s.forget(path)
	}
	if err != nil {
		return 0, err
	}
	writes := 0
	if have != found {
		if err := access.write(found); err != nil {
			return 0, err
		}
		writes = 1
	}
	return writes, s.forget(path)
}

// Forget drops what is recorded of the sysctls whose paths start with prefix, such as
// those of a device that is deleted: nothing is put back.
func (s *sysctls) Forget(prefix string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	changed := false
	for p := range s.found {
		if strings.HasPrefix(p, prefix) {
			delete(s.found, p)
			changed = true
		}
	}
	if !changed {
		return nil
	}
	return s.saveLocked()
}

// forget drops the record of path.
func (s *sysctls) forget(path string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.found, path)
	return s.saveLocked()
}

// saveLocked writes the record to its file, when it has one. mu must be held.
func (s *sysctls) saveLocked() error {
	if s.path == "" {
		return nil
	}
	b, err := json.Marshal(s.found)
	if err != nil {
		return err
	}
	return writeFileSynced(s.path, b, "the sysctl state file")
}

// readSysctl returns the value of the sysctl file at path, without its newline.
func readSysctl(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}
