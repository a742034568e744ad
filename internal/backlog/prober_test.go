package backlog

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/types"

	"github.com/outbox-dev/outbox-operator/internal/doctor"
	"github.com/outbox-dev/outbox-operator/internal/outbox"
)

// fakeMeasurer answers from a function per relay; a relay without one hangs
// in Measure until its context is done. A relay with a dial function
// connects through it, under the timeout the Prober asked for; one without
// connects at once.
type fakeMeasurer struct {
	mu       sync.Mutex
	answer   map[string]func(ctx context.Context) (outbox.Backlog, error)
	dial     map[string]func(ctx context.Context) error
	calls    map[string]int
	timeouts map[string][]time.Duration // the connect timeout of each Connect
	released map[string]int
	closed   bool
}

func newFakeMeasurer() *fakeMeasurer {
	return &fakeMeasurer{
		answer:   map[string]func(context.Context) (outbox.Backlog, error){},
		dial:     map[string]func(context.Context) error{},
		calls:    map[string]int{},
		timeouts: map[string][]time.Duration{},
		released: map[string]int{},
	}
}

func (f *fakeMeasurer) set(name string, fn func(ctx context.Context) (outbox.Backlog, error)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.answer[name] = fn
}

func (f *fakeMeasurer) setDial(name string, fn func(ctx context.Context) error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.dial[name] = fn
}

func (f *fakeMeasurer) Connect(ctx context.Context, key types.NamespacedName, _ Target, timeout time.Duration) (Conn, error) {
	f.mu.Lock()
	dial := f.dial[key.Name]
	f.timeouts[key.Name] = append(f.timeouts[key.Name], timeout)
	f.mu.Unlock()
	if dial != nil {
		ctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		if err := dial(ctx); err != nil {
			return nil, err
		}
	}
	return &fakeConn{f: f, name: key.Name}, nil
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

func (f *fakeMeasurer) timeoutsOf(name string) []time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.timeouts[name])
}

type fakeConn struct {
	f    *fakeMeasurer
	name string
}

func (c *fakeConn) Measure(ctx context.Context) (outbox.Backlog, error) {
	c.f.mu.Lock()
	fn := c.f.answer[c.name]
	c.f.calls[c.name]++
	c.f.mu.Unlock()
	if fn == nil {
		<-ctx.Done()
		return outbox.Backlog{}, ctx.Err()
	}
	return fn(ctx)
}

func (c *fakeConn) Release() {}

// blackhole is a dial that never answers: it fails as PoolMeasurer's do
// when the connect timeout runs out.
func blackhole(ctx context.Context) error {
	<-ctx.Done()
	return fmt.Errorf("%w: %w", errConnect, ctx.Err())
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

// failingWaits runs n failing checks of relay "a", each once the last is
// due, and returns how long the Prober said to wait after each.
func (b *proberBundle) failingWaits(t *testing.T, n int, interval time.Duration) []time.Duration {
	t.Helper()
	waits := make([]time.Duration, 0, n)
	for range n {
		b.prober.Observe(key("a"), target("postgres://a"), interval)
		b.waitNotified(t, key("a"))
		obs := b.prober.Observe(key("a"), target("postgres://a"), interval)
		require.NotNil(t, obs.Last.Failure)
		waits = append(waits, obs.NextCheckIn)
		b.clock.Step(obs.NextCheckIn)
	}
	return waits
}

func TestProberBacksOffAfterFailures(t *testing.T) {
	t.Parallel()
	b := setupProber(t, time.Second)
	b.prober.cfg.MaxBackoff = 3 * time.Minute
	// Measured once: failures from then on back off from the interval.
	b.measurer.set("a", count(1))
	b.prober.Observe(key("a"), target("postgres://a"), time.Minute)
	b.waitNotified(t, key("a"))
	b.prober.Observe(key("a"), target("postgres://a"), time.Minute) // the notification's reconcile
	b.clock.Step(time.Minute)
	b.measurer.set("a", func(context.Context) (outbox.Backlog, error) { return outbox.Backlog{}, errors.New("boom") })

	waits := b.failingWaits(t, 5, time.Minute)
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
	p := NewProber(Config{Measurer: m, Timeout: 10 * time.Second, MaxConcurrentChecks: 2, MaxConcurrentDials: 1})
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
		return s.Running == 2 && s.Dialing == 1 && s.Waiting == 2
	}, 5*time.Second, 10*time.Millisecond,
		"two run, one is connected and waits for a check slot in the only dial slot, two are queued: %+v", p.CheckStats())
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
	require.Equal(t, CheckStats{Max: 2, MaxDials: 1, Relays: 5}, p.CheckStats())
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
	require.Eventually(t, func() bool { s := p.CheckStats(); return s.Running == 1 && s.Dialing == 2 },
		5*time.Second, 10*time.Millisecond, "one failing relay hangs in its check slot, two wait for one: %+v", p.CheckStats())

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

	waits := b.failingWaits(t, 7, 30*time.Second)
	require.Equal(t, []time.Duration{2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second,
		30 * time.Second, time.Minute, 2 * time.Minute}, waits, "up to the interval, then backing off as after a success")

	b.measurer.set("a", count(3))
	b.prober.Observe(key("a"), target("postgres://a"), 30*time.Second)
	b.waitNotified(t, key("a"))
	obs := b.prober.Observe(key("a"), target("postgres://a"), 30*time.Second)
	require.Nil(t, obs.Last.Failure)
	require.Equal(t, 30*time.Second, obs.NextCheckIn, "measured: the interval")
}

// A table (or column) that does not exist yet is checked again every
// interval at most, however many checks found it missing: it is often being
// created by a migration beside the relay.
func TestProberChecksAMissingTableEveryInterval(t *testing.T) {
	t.Parallel()
	for _, missing := range []error{outbox.ErrTableNotFound, outbox.ErrColumnNotFound} {
		b := setupProber(t, time.Second)
		b.measurer.set("a", func(context.Context) (outbox.Backlog, error) {
			return outbox.Backlog{}, fmt.Errorf("checking: %w", missing)
		})
		waits := b.failingWaits(t, 8, 30*time.Second)
		require.Equal(t, []time.Duration{2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second,
			30 * time.Second, 30 * time.Second, 30 * time.Second, 30 * time.Second}, waits, "%v: soon, then every interval", missing)

		// The database then stops answering: its backoff starts over.
		b.measurer.set("a", func(context.Context) (outbox.Backlog, error) { return outbox.Backlog{}, errors.New("boom") })
		b.prober.Observe(key("a"), target("postgres://a"), 30*time.Second)
		b.waitNotified(t, key("a"))
		obs := b.prober.Observe(key("a"), target("postgres://a"), 30*time.Second)
		require.Equal(t, 2*time.Second, obs.NextCheckIn, "%v, then unreachable: the first retry", missing)
	}
}

func TestConnectTimeout(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name      string
		first     time.Duration
		connected bool
		failures  int
		want      time.Duration
	}{
		{"NeverTried", time.Second, false, 0, time.Second},
		{"OneFailure", time.Second, false, 1, 2 * time.Second},
		{"TwoFailures", time.Second, false, 2, 4 * time.Second},
		{"CappedAtTheFullTimeout", time.Second, false, 3, 5 * time.Second},
		{"ManyFailures", time.Second, false, 60, 5 * time.Second},
		{"ConnectedBefore", time.Second, true, 0, 5 * time.Second},
		{"ConnectedBeforeThenFailing", time.Second, true, 4, 5 * time.Second},
		{"FirstAboveTheFullTimeout", time.Minute, false, 0, 5 * time.Second},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tc.want, connectTimeout(tc.first, 5*time.Second, tc.connected, tc.failures))
		})
	}
}

// Until a connection to a target has been made, its checks connect under
// FirstConnectTimeout, doubling with each that could not connect; once one
// connected, under ConnectTimeout.
func TestProberShortensTheConnectTimeoutUntilConnected(t *testing.T) {
	t.Parallel()
	m := newFakeMeasurer()
	clock := &fakeClock{now: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
	notified := make(chan types.NamespacedName, 10)
	p := NewProber(Config{
		Measurer: m, Now: clock.Now, FirstConnectTimeout: 10 * time.Millisecond, ConnectTimeout: 80 * time.Millisecond,
		Notify: func(_ context.Context, k types.NamespacedName) { notified <- k },
	})
	t.Cleanup(p.Stop)
	m.setDial("a", blackhole)
	m.set("a", count(4))

	check := func() Observation {
		t.Helper()
		p.Observe(key("a"), target("postgres://a"), time.Minute)
		select {
		case <-notified:
		case <-time.After(10 * time.Second):
			t.Fatal("no notification")
		}
		obs := p.Observe(key("a"), target("postgres://a"), time.Minute)
		clock.Step(obs.NextCheckIn)
		return obs
	}
	for range 5 {
		obs := check()
		require.NotNil(t, obs.Last.Failure)
		require.Equal(t, CauseUnreachable, obs.Last.Failure.Cause)
		require.Equal(t, unreachableMessage, obs.Last.Failure.Message, "a connect timeout says no more than unreachable")
	}
	m.setDial("a", nil)
	require.Nil(t, check().Last.Failure)
	m.setDial("a", blackhole)
	require.NotNil(t, check().Last.Failure)

	ms := time.Millisecond
	require.Equal(t, []time.Duration{10 * ms, 20 * ms, 40 * ms, 80 * ms, 80 * ms, 80 * ms, 80 * ms}, m.timeoutsOf("a"),
		"doubling from FirstConnectTimeout up to ConnectTimeout; the full timeout once connected")
}

// A check waiting for a database that never answers holds a dial slot, not
// a check slot: the relays that answer are measured meanwhile, even with a
// single check slot.
func TestProberDialsHoldNoCheckSlot(t *testing.T) {
	t.Parallel()
	m := newFakeMeasurer()
	p := NewProber(Config{Measurer: m, ConnectTimeout: time.Minute, FirstConnectTimeout: time.Minute,
		MaxConcurrentChecks: 1, MaxConcurrentDials: 3})
	t.Cleanup(p.Stop)
	release := make(chan struct{})
	for _, name := range []string{"hole1", "hole2"} {
		m.setDial(name, func(ctx context.Context) error {
			select {
			case <-release:
				return fmt.Errorf("%w: refused", errConnect)
			case <-ctx.Done():
				return blackhole(ctx)
			}
		})
		require.True(t, p.Observe(key(name), target("postgres://"+name), time.Minute).InFlight)
	}
	require.Eventually(t, func() bool { s := p.CheckStats(); return s.Dialing == 2 && s.Running == 0 },
		5*time.Second, 10*time.Millisecond, "two dials, no check slot taken: %+v", p.CheckStats())

	m.set("good", count(3))
	p.Observe(key("good"), target("postgres://good"), time.Minute)
	require.Eventually(t, func() bool {
		o := p.Observe(key("good"), target("postgres://good"), time.Minute)
		return o.Last != nil && !o.InFlight
	}, 5*time.Second, 10*time.Millisecond, "measured while both dials wait")
	require.Equal(t, 2, p.CheckStats().Dialing)

	close(release)
	require.Eventually(t, func() bool { return p.CheckStats() == CheckStats{Max: 1, MaxDials: 3, Relays: 3} },
		5*time.Second, 10*time.Millisecond)
	require.Zero(t, m.callsOf("hole1"), "a check that could not connect runs no query")
}

// Relays whose last check failed get at most MaxFailingDials of the dial
// slots; the others wait in their own lane, and the relays that answer
// connect meanwhile.
func TestProberKeepsDialSlotsForRelaysThatAnswer(t *testing.T) {
	t.Parallel()
	m := newFakeMeasurer()
	clock := &fakeClock{now: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
	p := NewProber(Config{Measurer: m, Now: clock.Now, ConnectTimeout: time.Minute, FirstConnectTimeout: time.Minute,
		MaxConcurrentDials: 4})
	t.Cleanup(p.Stop)
	observe := func(name string) Observation { return p.Observe(key(name), target("postgres://"+name), time.Second) }
	done := func(name string) func() bool {
		return func() bool { o := observe(name); return o.Last != nil && !o.InFlight }
	}

	// Three relays are refused once, then hang.
	var mu sync.Mutex
	hanging, most := 0, 0
	release := make(chan struct{})
	bad := []string{"bad1", "bad2", "bad3"}
	for _, name := range bad {
		first := true
		m.setDial(name, func(context.Context) error {
			mu.Lock()
			if first {
				first = false
				mu.Unlock()
				return fmt.Errorf("%w: refused", errConnect)
			}
			hanging++
			most = max(most, hanging)
			mu.Unlock()
			<-release
			mu.Lock()
			hanging--
			mu.Unlock()
			return fmt.Errorf("%w: refused", errConnect)
		})
		observe(name)
		require.Eventually(t, done(name), 5*time.Second, 10*time.Millisecond)
	}
	clock.Step(time.Hour) // every failed relay is due again
	for _, name := range bad {
		require.True(t, observe(name).InFlight)
	}
	require.Eventually(t, func() bool { s := p.CheckStats(); return s.Dialing == 1 && s.Waiting == 2 },
		5*time.Second, 10*time.Millisecond, "one failing relay dials, two are queued: %+v", p.CheckStats())

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
	require.Equal(t, 1, most, "at most MaxFailingDials (a quarter of 4) failing dials at once")
}

// A due check waits in the queue as an entry, not a goroutine: a thousand
// due checks behind two dial slots cost about two goroutines. Not parallel:
// it counts the goroutines of the process.
func TestProberQueuesDueChecksWithoutGoroutines(t *testing.T) {
	m := newFakeMeasurer()
	p := NewProber(Config{Measurer: m, ConnectTimeout: time.Minute, FirstConnectTimeout: time.Minute,
		MaxConcurrentDials: 2, MaxConcurrentChecks: 2})
	release := make(chan struct{})
	const relays = 1000
	before := runtime.NumGoroutine()
	for i := range relays {
		name := fmt.Sprintf("r%d", i)
		m.setDial(name, func(context.Context) error { <-release; return fmt.Errorf("%w: refused", errConnect) })
		require.True(t, p.Observe(key(name), target("postgres://"+name), time.Minute).InFlight)
	}
	require.Equal(t, CheckStats{Max: 2, Waiting: relays - 2, Dialing: 2, MaxDials: 2, Relays: relays}, p.CheckStats())
	require.LessOrEqual(t, runtime.NumGoroutine()-before, 2+5, "a goroutine per dial slot, none per queued check")

	close(release)
	require.Eventually(t, func() bool { return p.CheckStats().Waiting == 0 && p.CheckStats().Dialing == 0 },
		10*time.Second, 10*time.Millisecond)
	p.Stop()
}

// Forget drops a relay's queued check; Stop drops every queued check.
func TestProberForgetAndStopDropQueuedChecks(t *testing.T) {
	t.Parallel()
	m := newFakeMeasurer()
	p := NewProber(Config{Measurer: m, ConnectTimeout: time.Minute, FirstConnectTimeout: time.Minute, MaxConcurrentDials: 1})
	t.Cleanup(p.Stop)
	m.setDial("hole", blackhole)
	for _, name := range []string{"hole", "queued", "forgotten"} {
		m.set(name, count(1))
		require.True(t, p.Observe(key(name), target("postgres://"+name), time.Minute).InFlight)
	}
	require.Equal(t, 2, p.CheckStats().Waiting)
	p.Forget(key("forgotten"))
	require.Equal(t, 1, p.CheckStats().Waiting)

	p.Stop()
	require.Equal(t, CheckStats{Max: 16, MaxDials: 1, Relays: 2}, p.CheckStats())
	require.False(t, p.Observe(key("queued"), target("postgres://queued"), time.Minute).InFlight,
		"the queued check was dropped, and a stopped Prober queues none")
	require.Empty(t, m.timeoutsOf("queued"), "never connected")
	require.Empty(t, m.timeoutsOf("forgotten"))
}

// The Redis checks do not need PostgreSQL: when they are due they run even
// though the connection could not be made.
func TestProberRunsRedisChecksWhenTheDatabaseIsUnreachable(t *testing.T) {
	t.Parallel()
	m := newFakeMeasurer()
	notified := make(chan types.NamespacedName, 1)
	p := NewProber(Config{
		Measurer: m,
		RedisCheck: func(context.Context, RedisTarget) doctor.Report {
			return doctor.Report{{Name: "redis.persistence", Status: doctor.OK}}
		},
		Notify: func(_ context.Context, k types.NamespacedName) { notified <- k },
	})
	t.Cleanup(p.Stop)
	m.setDial("a", func(context.Context) error { return fmt.Errorf("%w: refused", errConnect) })
	tgt := target("postgres://a")
	tgt.Redis = &RedisTarget{URL: "redis://r", Stream: "jobs"}
	p.Observe(key("a"), tgt, time.Minute)
	<-notified
	obs := p.Observe(key("a"), tgt, time.Minute)
	require.Equal(t, CauseUnreachable, obs.Last.Failure.Cause)
	require.NotNil(t, obs.Last.Redis)
	require.Equal(t, doctor.OK, obs.Last.Redis.Checks[0].Status)
	require.Zero(t, m.callsOf("a"))
}

// The next check is due an interval after the result was first observed,
// not after it was measured: a reconcile delayed in a busy work queue writes
// the result late, and the next write still comes an interval after it.
func TestProberCountsTheIntervalFromWhenTheResultIsSeen(t *testing.T) {
	t.Parallel()
	b := setupProber(t, time.Second)
	b.measurer.set("a", count(1))
	b.prober.Observe(key("a"), target("postgres://a"), time.Minute)
	b.waitNotified(t, key("a"))

	b.clock.Step(20 * time.Second) // the notification's reconcile waited in the queue
	obs := b.prober.Observe(key("a"), target("postgres://a"), time.Minute)
	require.NotNil(t, obs.Last)
	require.Equal(t, time.Minute, obs.NextCheckIn, "an interval from now, not 40s")
	b.clock.Step(40 * time.Second)
	obs = b.prober.Observe(key("a"), target("postgres://a"), time.Minute)
	require.False(t, obs.InFlight)
	require.Equal(t, 20*time.Second, obs.NextCheckIn)
	b.clock.Step(20 * time.Second)
	require.True(t, b.prober.Observe(key("a"), target("postgres://a"), time.Minute).InFlight)
	b.waitNotified(t, key("a"))
	require.Equal(t, 2, b.measurer.callsOf("a"))
}
