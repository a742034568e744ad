//go:build faults

package faults

import (
	"testing"
	"time"
)

// pollInterval is how often eventually checks its condition.
const pollInterval = 10 * time.Millisecond

// eventually polls cond until it returns nil and returns how long that
// took; after timeout it fails the test with what and cond's last error.
// The timeout is a deadline for a liveness promise, never the figure a case
// asserts.
func eventually(t testing.TB, timeout time.Duration, what string, cond func() error) time.Duration {
	t.Helper()
	return eventuallyEvery(t, pollInterval, timeout, what, cond)
}

// eventuallyEvery is eventually with another pause between checks (0: none,
// for conditions that hold only for milliseconds).
func eventuallyEvery(t testing.TB, every, timeout time.Duration, what string, cond func() error) time.Duration {
	t.Helper()
	start := time.Now()
	deadline := start.Add(timeout)
	for {
		err := cond()
		if err == nil {
			return time.Since(start)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s: %v", what, timeout, err)
		}
		time.Sleep(every)
	}
}
