//go:build race

package nimbusv1

// poison overwrites the bytes of a released frame, in builds with the race detector, so
// that a string kept past Release reads as garbage in tests instead of as the frame it
// came from until the storage is used again.
func poison(b []byte) {
	for i := range b {
		b[i] = 'X'
	}
}
