//go:build unix

package pki

import (
	"os"
	"syscall"
)

// setGroupOf gives f the group of the file fi describes.
func setGroupOf(f *os.File, fi os.FileInfo) error {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return nil
	}
	return f.Chown(-1, int(st.Gid))
}
