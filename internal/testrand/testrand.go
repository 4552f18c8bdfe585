// Package testrand gives randomized tests a seed that a failed run can be replayed with.
package testrand

import (
	"os"
	"strconv"
	"testing"
	"time"
)

// SeedEnv names the environment variable that fixes the seed of a randomized test, so that
// a failure can be replayed with the seed the failed run logged.
const SeedEnv = "NAPLES_TEST_SEED"

// Seed returns the seed of a randomized test, from $NAPLES_TEST_SEED when set and the clock
// otherwise, and logs it.
func Seed(t testing.TB) uint64 {
	t.Helper()
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv(SeedEnv); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("%s=%q: want an unsigned integer: %v", SeedEnv, s, err)
		}
		seed = v
	}
	t.Logf("seed %d (replay with %s=%d)", seed, SeedEnv, seed)
	return seed
}
