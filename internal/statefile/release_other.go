//go:build !linux

package statefile

// dropPages does nothing outside Linux, where the file's mapping is left alone.
func dropPages(addr uintptr, n int) error { return nil }
