//go:build !linux

package statefile

import "os"

// unlock does nothing outside Linux: there a file bbolt panicked on stays locked by this
// process until it exits.
func unlock(*os.File) {}
