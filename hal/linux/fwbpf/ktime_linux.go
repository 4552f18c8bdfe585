package fwbpf

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// KtimeNow returns the time of the clock the program stamps conntrack entries with
// (bpf_ktime_get_ns, CLOCK_MONOTONIC), in nanoseconds.
func KtimeNow() (uint64, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0, fmt.Errorf("reading CLOCK_MONOTONIC: %w", err)
	}
	return uint64(ts.Nano()), nil
}
