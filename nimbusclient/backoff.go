package nimbusclient

import (
	"math/rand/v2"
	"time"
)

// backoff computes exponential reconnect delays with jitter.
type backoff struct {
	min, max time.Duration
	attempt  int
}

// next returns the delay before the next attempt: min·2^attempt capped at max, of which a
// random half is kept so that many agents do not reconnect in step.
func (b *backoff) next() time.Duration {
	d := b.max
	if b.attempt < 32 {
		if e := b.min << b.attempt; e > 0 && e < b.max {
			d = e
		}
	}
	b.attempt++
	return d/2 + rand.N(d/2+1)
}

// reset starts the delays over from min.
func (b *backoff) reset() { b.attempt = 0 }
