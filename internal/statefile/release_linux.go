package statefile

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// dropPages drops the n bytes mapped at addr from the process's resident set
// (madvise MADV_DONTNEED). The mapping is bbolt's read-only shared mapping of the file, so
// its pages stay in the page cache and the next read of one faults it back in.
func dropPages(addr uintptr, n int) error {
	page := os.Getpagesize()
	n = (n + page - 1) / page * page
	if _, _, errno := unix.Syscall(unix.SYS_MADVISE, addr, uintptr(n), unix.MADV_DONTNEED); errno != 0 {
		return fmt.Errorf("madvise %#x+%d DONTNEED: %w", addr, n, errno)
	}
	return nil
}
