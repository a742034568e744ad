//go:build faults

package faults

import (
	"testing"
	"time"

	"github.com/outbox-dev/outbox-operator/internal/testenv"
)

// pollInterval is how often eventually checks its condition.
const pollInterval = testenv.DefaultPoll

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
	return testenv.EventuallyEvery(t, every, timeout, what, cond)
}
