package backoff

import (
	"testing"
	"time"
)

func TestNextDoublesCapsAndJitters(t *testing.T) {
	b := Backoff{Min: 100 * time.Millisecond, Max: 30 * time.Second}
	var prevCap time.Duration
	for i := range 20 {
		capd := min(b.Min<<i, b.Max)
		d := b.Next()
		if d < capd/2 || d > capd {
			t.Fatalf("attempt %d: delay %v outside [%v, %v]", i, d, capd/2, capd)
		}
		if capd < prevCap {
			t.Fatalf("attempt %d: cap shrank", i)
		}
		prevCap = capd
	}
	b.Reset()
	if d := b.Next(); d > b.Min {
		t.Errorf("after Reset: delay %v, want at most %v", d, b.Min)
	}
}
