package statefile

import (
	"os"

	"golang.org/x/sys/unix"
)

// unlock releases the lock bbolt took on file. Closing file alone does not when bbolt has
// also mapped it: the mapping keeps the locked open file alive.
func unlock(file *os.File) {
	unix.Flock(int(file.Fd()), unix.LOCK_UN)
}
