package statefile

import (
	"os"

	"golang.org/x/sys/unix"
)

// datasync flushes the file's data to stable storage (fdatasync(2)), leaving out the
// metadata a read back does not need.
func datasync(f *os.File) error { return unix.Fdatasync(int(f.Fd())) }
