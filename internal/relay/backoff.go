package relay

import (
	"math/rand/v2"
	"time"
)

// backoff returns the delay before retry number attempt (1-based): min
// doubled per attempt, capped at max, with "equal jitter": half fixed, half
// random, so retries of many relays spread out but never retry at once.
// rnd returns a float in [0, 1).
//
// Why not a library's backoff (k8s.io/apimachinery's wait.Backoff,
// cenkalti/backoff): both are stateful (Step mutates the backoff), while the
// relay's loops already count their consecutive failures and need the delay
// as a pure function of that count, with the randomness injected so that
// backoff_test.go can check the bounds exactly. The relay binary would also
// gain apimachinery (or a new module) for eight lines.
func backoff(attempt int, minDelay, maxDelay time.Duration, rnd func() float64) time.Duration {
	d := minDelay
	for i := 1; i < attempt && d < maxDelay; i++ {
		d *= 2
	}
	d = min(d, maxDelay)
	half := d / 2
	return half + time.Duration(rnd()*float64(d-half))
}

func jitter() float64 { return rand.Float64() }
