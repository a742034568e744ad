package relay

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestBackoff(t *testing.T) {
	t.Parallel()
	const minDelay, maxDelay = 100 * time.Millisecond, 30 * time.Second
	lowest := func() float64 { return 0 }
	highest := func() float64 { return 0.999999 }
	for _, tc := range []struct {
		attempt int
		full    time.Duration // the doubled, capped delay before jitter
	}{
		{attempt: 0, full: minDelay},
		{attempt: 1, full: minDelay},
		{attempt: 2, full: 2 * minDelay},
		{attempt: 5, full: 16 * minDelay},
		{attempt: 9, full: 256 * minDelay},
		{attempt: 10, full: maxDelay}, // 512 * 100 ms is past the cap
		{attempt: 1000, full: maxDelay},
	} {
		// Equal jitter: never under half the delay, never at or over all of it.
		require.Equal(t, tc.full/2, backoff(tc.attempt, minDelay, maxDelay, lowest), "attempt %d, lowest", tc.attempt)
		hi := backoff(tc.attempt, minDelay, maxDelay, highest)
		require.Less(t, hi, tc.full, "attempt %d, highest", tc.attempt)
		require.Greater(t, hi, tc.full*99/100, "attempt %d, highest", tc.attempt)
	}
}
