package backlog

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/types"

	"github.com/outbox-dev/outbox-operator/internal/outbox"
)

// fakeMeasurer answers from a function per relay; a relay without one hangs
// until its context is done.
type fakeMeasurer struct {
	mu       sync.Mutex
	answer   map[string]func(ctx context.Context) (outbox.Backlog, error)
	calls    map[string]int
	released map[string]int
	closed   bool
}

func newFakeMeasurer() *fakeMeasurer {
	return &fakeMeasurer{
		answer:   map[string]func(context.Context) (outbox.Backlog, error){},
		calls:    map[string]int{},
		released: map[string]int{},
	}
}

func (f *fakeMeasurer) set(name string, fn func(ctx context.Context) (outbox.Backlog, error)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.answer[name] = fn
}

func (f *fakeMeasurer) Measure(ctx context.Context, key types.NamespacedName, _ Target) (outbox.Backlog, error) {
	f.mu.Lock()
	fn := f.answer[key.Name]
	f.calls[key.Name]++
	f.mu.Unlock()
	if fn == nil {
		<-ctx.Done()
		return outbox.Backlog{}, ctx.Err()
	}
	return fn(ctx)
}

func (f *fakeMeasurer) Release(key types.NamespacedName) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.released[key.Name]++
}

func (f *fakeMeasurer) Close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
}

func (f *fakeMeasurer) callsOf(name string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[name]
}

func count(n int64) func(context.Context) (outbox.Backlog, error) {
	return func(context.Context) (outbox.Backlog, error) { return outbox.Backlog{Count: n}, nil }
}

// fakeClock is a settable clock.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Step(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

type proberBundle struct {
	prober   *Prober
	measurer *fakeMeasurer
	clock    *fakeClock
	notified chan types.NamespacedName
}

func setupProber(t *testing.T, timeout time.Duration) *proberBundle {
	t.Helper()
	b := &proberBundle{
		measurer: newFakeMeasurer(),
		clock:    &fakeClock{now: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)},
		notified: make(chan types.NamespacedName, 100),
	}
	b.prober = NewProber(Config{
		Measurer: b.measurer,
		Timeout:  timeout,
		Notify:   func(_ context.Context, k types.NamespacedName) { b.notified <- k },
		Now:      b.clock.Now,
	})
	t.Cleanup(b.prober.Stop)
	return b
}

func (b *proberBundle) waitNotified(t *testing.T, want types.NamespacedName) {
	t.Helper()
	select {
	case got := <-b.notified:
		require.Equal(t, want, got)
	case <-time.After(10 * time.Second):
		t.Fatalf("no notification for %s", want)
	}
}

func key(name string) types.NamespacedName { return types.NamespacedName{Namespace: "ns", Name: name} }

func target(dsn string) Target {
	return Target{DSN: dsn, Table: outbox.MustNew("", outbox.Columns{})}
}

func TestProberChecksOnceAndCachesUntilInterval(t *testing.T) {
	t.Parallel()
	b := setupProber(t, time.Second)
	b.measurer.set("a", count(42))

	obs := b.prober.Observe(key("a"), target("postgres://a"), time.Minute)
	require.True(t, obs.InFlight)
	require.Nil(t, obs.Last)
	b.waitNotified(t, key("a"))

	obs = b.prober.Observe(key("a"), target("postgres://a"), time.Minute)
	require.False(t, obs.InFlight)
	require.NotNil(t, obs.Last)
	require.Nil(t, obs.Last.Failure)
	require.Equal(t, int64(42), obs.Last.Backlog.Count)
	require.Equal(t, time.Minute, obs.NextCheckIn)
	require.Equal(t, 1, b.measurer.callsOf("a"))

	b.clock.Step(time.Minute)
	obs = b.prober.Observe(key("a"), target("postgres://a"), time.Minute)
	require.True(t, obs.InFlight, "a check is due after the interval")
	require.Equal(t, int64(42), obs.Last.Backlog.Count, "the previous result stays visible meanwhile")
	b.waitNotified(t, key("a"))
	require.Equal(t, 2, b.measurer.callsOf("a"))
}

func TestProberPassesDeadLettersThrough(t *testing.T) {
	t.Parallel()
	b := setupProber(t, time.Second)
	b.measurer.set("a", func(context.Context) (outbox.Backlog, error) {
		return outbox.Backlog{Count: 2, DeadLetters: 5}, nil
	})
	b.prober.Observe(key("a"), target("postgres://a"), time.Minute)
	b.waitNotified(t, key("a"))
	obs := b.prober.Observe(key("a"), target("postgres://a"), time.Minute)
	require.NotNil(t, obs.Last)
	require.Nil(t, obs.Last.Failure)
	require.Equal(t, outbox.Backlog{Count: 2, DeadLetters: 5}, obs.Last.Backlog)
}

func TestProberHangingDatabaseDoesNotHoldUpOtherRelays(t *testing.T) {
	t.Parallel()
	b := setupProber(t, 2*time.Second)
	// "hung" has no answer: its check blocks until the timeout.
	b.measurer.set("fine", count(7))

	start := time.Now()
	obs := b.prober.Observe(key("hung"), target("postgres://hung"), time.Minute)
	require.True(t, obs.InFlight)
	require.Less(t, time.Since(start), 100*time.Millisecond, "Observe must not wait for the check")

	// A second Observe while the check hangs neither blocks nor starts another.
	b.prober.Observe(key("hung"), target("postgres://hung"), time.Minute)

	b.prober.Observe(key("fine"), target("postgres://fine"), time.Minute)
	b.waitNotified(t, key("fine"))
	require.Less(t, time.Since(start), time.Second, "the healthy relay's check finished while the other hung")

	b.waitNotified(t, key("hung"))
	obs = b.prober.Observe(key("hung"), target("postgres://hung"), time.Minute)
	require.NotNil(t, obs.Last)
	require.NotNil(t, obs.Last.Failure)
	require.Equal(t, CauseUnreachable, obs.Last.Failure.Cause)
	require.Contains(t, obs.Last.Failure.Message, "within 2s")
	require.Equal(t, 1, b.measurer.callsOf("hung"))
}

func TestProberBacksOffAfterFailures(t *testing.T) {
	t.Parallel()
	b := setupProber(t, time.Second)
	b.prober.cfg.MaxBackoff = 3 * time.Minute
	// Measured once: failures from then on back off from the interval.
	b.measurer.set("a", count(1))
	b.prober.Observe(key("a"), target("postgres://a"), time.Minute)
	b.waitNotified(t, key("a"))
	b.clock.Step(time.Minute)
	b.measurer.set("a", func(context.Context) (outbox.Backlog, error) { return outbox.Backlog{}, errors.New("boom") })

	waits := make([]time.Duration, 0, 5)
	for range 5 {
		b.prober.Observe(key("a"), target("postgres://a"), time.Minute)
		b.waitNotified(t, key("a"))
		obs := b.prober.Observe(key("a"), target("postgres://a"), time.Minute)
		waits = append(waits, obs.NextCheckIn)
		b.clock.Step(obs.NextCheckIn)
	}
	require.Equal(t, []time.Duration{time.Minute, 2 * time.Minute, 3 * time.Minute, 3 * time.Minute, 3 * time.Minute}, waits)

	b.measurer.set("a", count(1))
	b.prober.Observe(key("a"), target("postgres://a"), time.Minute)
	b.waitNotified(t, key("a"))
	obs := b.prober.Observe(key("a"), target("postgres://a"), time.Minute)
	require.Nil(t, obs.Last.Failure)
	require.Equal(t, time.Minute, obs.NextCheckIn, "a success resets the backoff")
}

func TestProberNewTargetDiscardsOldResult(t *testing.T) {
	t.Parallel()
	b := setupProber(t, time.Second)
	b.measurer.set("a", count(5))
	b.prober.Observe(key("a"), target("postgres://one"), time.Minute)
	b.waitNotified(t, key("a"))

	obs := b.prober.Observe(key("a"), target("postgres://two"), time.Minute)
	require.Nil(t, obs.Last, "a result of the old DSN must not count for the new one")
	require.True(t, obs.InFlight)
	b.waitNotified(t, key("a"))
	require.Equal(t, 2, b.measurer.callsOf("a"))
}

func TestProberForgetReleasesAndDiscards(t *testing.T) {
	t.Parallel()
	b := setupProber(t, 500*time.Millisecond)
	b.prober.Observe(key("hung"), target("postgres://hung"), time.Minute)
	b.prober.Forget(key("hung"))
	require.Equal(t, 0, b.prober.Len())

	// The discarded check neither notifies nor comes back as a result, and
	// releases what it may have taken again.
	select {
	case k := <-b.notified:
		t.Fatalf("unexpected notification for %s", k)
	case <-time.After(time.Second):
	}
	require.Eventually(t, func() bool {
		b.measurer.mu.Lock()
		defer b.measurer.mu.Unlock()
		return b.measurer.released["hung"] == 2
	}, 5*time.Second, 10*time.Millisecond)
	require.Equal(t, 0, b.prober.Len())
}

func TestProberStopCancelsChecksAndClosesMeasurer(t *testing.T) {
	t.Parallel()
	b := setupProber(t, time.Hour)
	b.prober.Observe(key("hung"), target("postgres://hung"), time.Minute)
	done := make(chan struct{})
	go func() { b.prober.Stop(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Stop did not cancel the hanging check")
	}
	require.True(t, b.measurer.closed)
	obs := b.prober.Observe(key("other"), target("postgres://other"), time.Minute)
	require.False(t, obs.InFlight, "a stopped prober starts no checks")
}

func TestProberBoundsConcurrentChecks(t *testing.T) {
	t.Parallel()
	m := newFakeMeasurer()
	p := NewProber(Config{Measurer: m, Timeout: 10 * time.Second, MaxConcurrentChecks: 2})
	t.Cleanup(p.Stop)

	var mu sync.Mutex
	running, most := 0, 0
	release := make(chan struct{})
	for _, name := range []string{"a", "b", "c", "d", "e"} {
		m.set(name, func(context.Context) (outbox.Backlog, error) {
			mu.Lock()
			running++
			most = max(most, running)
			mu.Unlock()
			<-release
			mu.Lock()
			running--
			mu.Unlock()
			return outbox.Backlog{Count: 1}, nil
		})
		require.True(t, p.Observe(key(name), target("postgres://"+name), time.Minute).InFlight)
	}
	require.Eventually(t, func() bool {
		s := p.CheckStats()
		return s.Running == 2 && s.Waiting == 3
	}, 5*time.Second, 10*time.Millisecond, "two run, three wait: %+v", p.CheckStats())
	close(release)
	require.Eventually(t, func() bool {
		for _, name := range []string{"a", "b", "c", "d", "e"} {
			if o := p.Observe(key(name), target("postgres://"+name), time.Minute); o.Last == nil {
				return false
			}
		}
		return true
	}, 5*time.Second, 10*time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, 2, most, "never more checks at once than MaxConcurrentChecks")
	require.Equal(t, CheckStats{Max: 2, Relays: 5}, p.CheckStats())
}

// Relays whose last check failed (a database that hangs or blackholes
// connections holds its slot for the whole timeout) get at most
// MaxFailingChecks of the slots: the relays that answer are still measured
// while every failing one hangs.
func TestProberKeepsSlotsForRelaysThatAnswer(t *testing.T) {
	t.Parallel()
	m := newFakeMeasurer()
	clock := &fakeClock{now: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
	p := NewProber(Config{Measurer: m, Timeout: time.Minute, MaxConcurrentChecks: 4, Now: clock.Now})
	t.Cleanup(p.Stop)
	observe := func(name string) Observation { return p.Observe(key(name), target("postgres://"+name), time.Second) }
	done := func(name string) func() bool {
		return func() bool { o := observe(name); return o.Last != nil && !o.InFlight }
	}

	// Three relays fail once, then hang.
	var mu sync.Mutex
	hanging, most := 0, 0
	release := make(chan struct{})
	bad := []string{"bad1", "bad2", "bad3"}
	for _, name := range bad {
		first := true
		m.set(name, func(context.Context) (outbox.Backlog, error) {
			mu.Lock()
			if first {
				first = false
				mu.Unlock()
				return outbox.Backlog{}, errors.New("unreachable")
			}
			hanging++
			most = max(most, hanging)
			mu.Unlock()
			<-release
			mu.Lock()
			hanging--
			mu.Unlock()
			return outbox.Backlog{}, errors.New("timeout")
		})
		observe(name)
		require.Eventually(t, done(name), 5*time.Second, 10*time.Millisecond)
	}
	clock.Step(time.Hour) // every failed relay is due again
	for _, name := range bad {
		require.True(t, observe(name).InFlight)
	}
	require.Eventually(t, func() bool { return p.CheckStats().Waiting == 2 }, 5*time.Second, 10*time.Millisecond,
		"one failing relay hangs in its slot, two wait: %+v", p.CheckStats())

	// A relay that answers is measured meanwhile.
	m.set("good", count(7))
	observe("good")
	require.Eventually(t, done("good"), 5*time.Second, 10*time.Millisecond)
	require.Equal(t, int64(7), observe("good").Last.Backlog.Count)

	close(release)
	for _, name := range bad {
		require.Eventually(t, done(name), 5*time.Second, 10*time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, 1, most, "at most MaxFailingChecks (a quarter of 4) failing checks at once")
}

// A target never measured yet (a new relay, a table being created) is
// retried soon after a failure: FirstRetry, doubling up to the interval,
// then on to MaxBackoff: a database that never answers is not tried every
// interval forever.
func TestProberRetriesSoonUntilFirstMeasured(t *testing.T) {
	t.Parallel()
	b := setupProber(t, time.Second)
	b.measurer.set("a", func(context.Context) (outbox.Backlog, error) { return outbox.Backlog{}, errors.New("no table") })

	waits := make([]time.Duration, 0, 7)
	for range 7 {
		b.prober.Observe(key("a"), target("postgres://a"), 30*time.Second)
		b.waitNotified(t, key("a"))
		obs := b.prober.Observe(key("a"), target("postgres://a"), 30*time.Second)
		require.NotNil(t, obs.Last.Failure)
		waits = append(waits, obs.NextCheckIn)
		b.clock.Step(obs.NextCheckIn)
	}
	require.Equal(t, []time.Duration{2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second,
		30 * time.Second, time.Minute, 2 * time.Minute}, waits, "up to the interval, then backing off as after a success")

	b.measurer.set("a", count(3))
	b.prober.Observe(key("a"), target("postgres://a"), 30*time.Second)
	b.waitNotified(t, key("a"))
	obs := b.prober.Observe(key("a"), target("postgres://a"), 30*time.Second)
	require.Nil(t, obs.Last.Failure)
	require.Equal(t, 30*time.Second, obs.NextCheckIn, "measured: the interval")
}
