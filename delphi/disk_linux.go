package delphi

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// release takes the state file's pages out of the process's resident set. bbolt reads
// the file through a shared read-only mapping, and restoring it touches every page: left
// alone, they count in the agent's RSS for as long as the kernel does not need the memory,
// while a commit reads only the few pages it changes. Dropping them from the mapping
// (madvise MADV_DONTNEED) leaves them in the page cache, and a later read faults them back
// in. It must run before any commit, while nothing else uses the file; it is best effort
// and logs nothing: an RSS that stays high is all that can go wrong.
func (d *disk) release() {
	_ = releaseMapped(d.path)
}

// releaseMapped drops the pages of every mapping of the file at path from the process's
// resident set. It finds the mappings in /proc/self/maps by the file's device and inode,
// or by its resolved path, which overlay file systems show where the device and inode are
// those of the layer below.
func releaseMapped(path string) error {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return err
	}
	resolved, err := filepath.Abs(path)
	if err == nil {
		resolved, err = filepath.EvalSymlinks(resolved)
	}
	if err != nil {
		return err
	}
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		return err
	}
	// A line: "start-end perms offset major:minor inode path".
	for line := range bytes.Lines(maps) {
		f := bytes.Fields(line)
		if len(f) < 6 {
			continue
		}
		if !sameFile(f, &st) && string(bytes.Join(f[5:], []byte(" "))) != resolved {
			continue
		}
		lo, hi, ok := bytes.Cut(f[0], []byte("-"))
		start, err1 := strconv.ParseUint(string(lo), 16, 64)
		end, err2 := strconv.ParseUint(string(hi), 16, 64)
		if !ok || err1 != nil || err2 != nil || end <= start {
			continue
		}
		if _, _, errno := unix.Syscall(unix.SYS_MADVISE, uintptr(start), uintptr(end-start), unix.MADV_DONTNEED); errno != 0 {
			return fmt.Errorf("madvise %s: %w", f[0], errno)
		}
	}
	return nil
}

// sameFile reports whether the fields of a line of /proc/self/maps name the device and
// inode of st.
func sameFile(f [][]byte, st *unix.Stat_t) bool {
	ino, err := strconv.ParseUint(string(f[4]), 10, 64)
	if err != nil || ino != st.Ino {
		return false
	}
	major, minor, ok := bytes.Cut(f[3], []byte(":"))
	maj, err1 := strconv.ParseUint(string(major), 16, 32)
	mnr, err2 := strconv.ParseUint(string(minor), 16, 32)
	return ok && err1 == nil && err2 == nil && unix.Mkdev(uint32(maj), uint32(mnr)) == st.Dev
}
