//go:build !unix

package xds

import "time"

// cpuTime returns 0: the process's CPU time is only read on Unix systems, and the
// snapshot's CPU time reads 0 elsewhere.
func cpuTime() time.Duration { return 0 }
