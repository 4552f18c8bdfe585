//go:build !linux

package statefile

import "os"

// datasync flushes the file to stable storage; systems without fdatasync(2) sync it
// whole.
func datasync(f *os.File) error { return f.Sync() }
