//go:build !race

package nimbusv1

// poison does nothing without the race detector; see poison_race.go.
func poison([]byte) {}
