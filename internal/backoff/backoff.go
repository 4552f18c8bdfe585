// Package backoff computes the delays of clients that reconnect: exponential, capped, and
// jittered so that many clients do not reconnect in step.
package backoff

import (
	"math/rand/v2"
	"time"
)

// Backoff is a sequence of reconnect delays. The zero value is not usable: set Min and Max.
type Backoff struct {
	// Min is the first delay, before jitter.
	Min time.Duration
	// Max caps every delay, before jitter.
	Max time.Duration

	attempt int
}

// Next returns the delay before the next attempt: a random delay between half of
// Min·2^attempt capped at Max, and all of it.
func (b *Backoff) Next() time.Duration {
	d := b.Max
	if b.attempt < 32 {
		if e := b.Min << b.attempt; e > 0 && e < b.Max {
			d = e
		}
	}
	b.attempt++
	return d/2 + rand.N(d/2+1)
}

// Reset starts the delays over from Min.
func (b *Backoff) Reset() { b.attempt = 0 }
