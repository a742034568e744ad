package testenv

import (
	"errors"
	"testing"
	"time"
)

// DefaultPoll is how often Eventually checks its condition.
const DefaultPoll = 10 * time.Millisecond

// Eventually checks cond every DefaultPoll until it returns nil, and returns
// how long that took; after timeout it fails the test with what and cond's
// last error. The timeout is a deadline for a liveness promise, never a
// figure a test asserts. It is the one polling helper of the project's
// tests; a test that can wait for a signal (a channel, a hook) does that
// instead.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() error) time.Duration {
	t.Helper()
	return EventuallyEvery(t, DefaultPoll, timeout, what, cond)
}

// EventuallyEvery is Eventually with another pause between checks (0: none,
// for conditions that hold only for milliseconds; longer, for checks that
// cost a request to a server).
func EventuallyEvery(t testing.TB, every, timeout time.Duration, what string, cond func() error) time.Duration {
	t.Helper()
	start := time.Now()
	deadline := start.Add(timeout)
	for {
		err := cond()
		if err == nil {
			return time.Since(start)
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s: %v", timeout, what, err)
		}
		time.Sleep(every)
	}
}

// errNotYet is the error of a True condition that does not hold yet.
var errNotYet = errors.New("the condition does not hold yet")

// True turns a condition that reports only whether it holds into one for
// Eventually.
func True(cond func() bool) func() error {
	return func() error {
		if cond() {
			return nil
		}
		return errNotYet
	}
}
