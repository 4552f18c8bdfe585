package linux

import (
	"slices"
	"testing"
)

// TestDumpBuffer: a dump's buffer gives back what was pushed, in order, across its
// blocks, and forgets what follows a mark when a dump starts over from it.
func TestDumpBuffer(t *testing.T) {
	for _, tc := range []struct {
		name         string
		before, mark int
		after        int
	}{
		{"empty", 0, 0, 0},
		{"within the first block", 10, 0, 5},
		{"a few blocks", 3*dumpChunk + 7, 0, 0},
		{"from the start of a block", 2*dumpChunk + 3, dumpChunk, dumpChunk + 1},
		{"from within a block", 3*dumpChunk + 1, dumpChunk + 5, 2 * dumpChunk},
		{"from the end", 2 * dumpChunk, 2 * dumpChunk, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b dumpBuffer[int]
			var want []int
			for i := range tc.before {
				b.push(i)
				want = append(want, i)
			}
			b.truncate(tc.mark)
			want = want[:tc.mark]
			for i := range tc.after {
				b.push(-i)
				want = append(want, -i)
			}
			if got := slices.Collect(b.all()); !slices.Equal(got, want) || b.len() != len(want) {
				t.Fatalf("got %d objects (len %d), want %d: %v", len(got), b.len(), len(want), got)
			}
		})
	}
}
