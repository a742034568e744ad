package backlog

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/outbox-dev/outbox-operator/internal/doctor"
	"github.com/outbox-dev/outbox-operator/internal/outbox"
)

// Result is the outcome of one finished check.
type Result struct {
	// Backlog is the measurement (pending rows, the oldest, and the parked
	// rows in DeadLetters); zero when Failure is set.
	Backlog outbox.Backlog
	// Failure is nil when the check succeeded.
	Failure *Failure
	// CheckedAt is when the check finished.
	CheckedAt time.Time
	// Duration is how long the check took.
	Duration time.Duration
	// Redis is the latest run of the Redis checks of the target (kept
	// across the checks that do not run them); nil before the first, or
	// when the target has no Redis.
	Redis *RedisResult
}

// Observation is what a Prober knows about one relay's backlog.
type Observation struct {
	// Last is the latest finished check of the relay's current target; nil
	// while none has finished.
	Last *Result
	// InFlight reports that a check is running; the Prober calls back when
	// it finishes.
	InFlight bool
	// NextCheckIn is how long until the next check is due, when none is in
	// flight: observe again then.
	NextCheckIn time.Duration
}

// Config configures a Prober. Zero fields take the documented defaults.
type Config struct {
	// Measurer takes the measurements (required).
	Measurer Measurer
	// Timeout bounds one check, connecting included (default 10s).
	Timeout time.Duration
	// MaxBackoff caps the delay between checks after consecutive failures
	// (default 5m; never below the check interval).
	MaxBackoff time.Duration
	// Notify is called, from the check's goroutine, when a check finishes;
	// ctx is done when the Prober stops, so Notify must not block past it.
	Notify func(ctx context.Context, key types.NamespacedName)
	// Now is the clock (default time.Now).
	Now func() time.Time
	// FirstRetry is the delay after a failed check of a target that has
	// never been measured, doubling with each failure up to the check
	// interval, then on as after a success, up to MaxBackoff (default 2s):
	// a new relay, or one whose table or database is being created, is
	// measured as soon as it can be, not a whole interval later, and a
	// database that never answers is not tried every interval forever.
	FirstRetry time.Duration
	// RedisCheck runs the Redis checks of a target that has Redis
	// (default CheckRedis); RedisInterval is the least time between two
	// runs for one relay (default DefaultRedisInterval).
	RedisCheck    func(ctx context.Context, t RedisTarget) doctor.Report
	RedisInterval time.Duration
	// MaxConcurrentChecks bounds the checks that run at once, across every
	// relay (default 16). A due check waits for a free slot; its Timeout
	// starts once it has one.
	MaxConcurrentChecks int
	// MaxFailingChecks bounds, within MaxConcurrentChecks, the checks of
	// relays whose last check failed (default a quarter of it, at least
	// 1): databases that hang or blackhole connections hold a slot for the
	// whole Timeout, and must not starve the checks of the relays that
	// answer.
	MaxFailingChecks int
	// AllowDSNFileKeys is PoolMeasurerConfig.AllowFileKeys, for redacting
	// the password of a DSN from messages the same way it was parsed.
	AllowDSNFileKeys bool
}

// Prober schedules the backlog checks of every relay: at most one at a time
// per relay, each in its own goroutine under Config.Timeout, so a database
// that hangs holds up only its own relays' checks.
type Prober struct {
	cfg    Config
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	entries map[types.NamespacedName]*entry

	// slots holds one token per running check; failingSlots one more per
	// running check of a relay whose last check failed.
	slots        chan struct{}
	failingSlots chan struct{}
	waiting      atomic.Int64
}

// entry is one relay's state. gen changes whenever the entry is reset, so a
// check started for an older target does not overwrite a newer one.
type entry struct {
	gen         uint64
	fingerprint string
	last        *Result
	failures    int
	inFlight    bool
	// measured: a check of this target has succeeded.
	measured bool
}

// NewProber returns a Prober. Stop it with Stop (or run it with Start).
func NewProber(cfg Config) *Prober {
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10 * time.Second
	}
	if cfg.MaxBackoff <= 0 {
		cfg.MaxBackoff = 5 * time.Minute
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.FirstRetry <= 0 {
		cfg.FirstRetry = 2 * time.Second
	}
	if cfg.RedisCheck == nil {
		cfg.RedisCheck = CheckRedis
	}
	if cfg.RedisInterval <= 0 {
		cfg.RedisInterval = DefaultRedisInterval
	}
	if cfg.Notify == nil {
		cfg.Notify = func(context.Context, types.NamespacedName) {}
	}
	if cfg.MaxConcurrentChecks <= 0 {
		cfg.MaxConcurrentChecks = 16
	}
	if cfg.MaxFailingChecks <= 0 || cfg.MaxFailingChecks > cfg.MaxConcurrentChecks {
		cfg.MaxFailingChecks = max(1, cfg.MaxConcurrentChecks/4)
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Prober{
		cfg: cfg, ctx: ctx, cancel: cancel, entries: map[types.NamespacedName]*entry{},
		slots:        make(chan struct{}, cfg.MaxConcurrentChecks),
		failingSlots: make(chan struct{}, cfg.MaxFailingChecks),
	}
}

// Start blocks until ctx is done, then stops the Prober: it lets a
// controller-runtime manager own the Prober's lifetime.
func (p *Prober) Start(ctx context.Context) error {
	<-ctx.Done()
	p.Stop()
	return nil
}

// NeedLeaderElection reports false: the Prober only measures when the
// controller (which runs under leader election) asks it to.
func (p *Prober) NeedLeaderElection() bool { return false }

// Stop cancels the running checks, waits for them and closes the measurer.
func (p *Prober) Stop() {
	p.cancel()
	p.wg.Wait()
	p.cfg.Measurer.Close()
}

// Observe returns what is known of the relay's backlog for target and starts
// a check when one is due: none has finished for this target yet, or
// interval has passed since the last one (longer after failures: the delay
// doubles with each consecutive failure, up to MaxBackoff). A new target (a
// new DSN or layout) discards the previous results.
func (p *Prober) Observe(key types.NamespacedName, target Target, interval time.Duration) Observation {
	fp := target.fingerprint()
	now := p.cfg.Now()

	p.mu.Lock()
	defer p.mu.Unlock()
	e, ok := p.entries[key]
	if !ok {
		e = &entry{}
		p.entries[key] = e
	}
	if e.fingerprint != fp {
		*e = entry{gen: e.gen + 1, fingerprint: fp}
	}

	obs := Observation{InFlight: e.inFlight}
	if e.last != nil {
		last := *e.last
		obs.Last = &last
	}
	if e.inFlight {
		return obs
	}
	if e.last != nil {
		wait := e.last.CheckedAt.Add(p.delay(interval, e.failures, e.measured)).Sub(now)
		if wait > 0 {
			obs.NextCheckIn = wait
			return obs
		}
	}
	if p.ctx.Err() != nil {
		return obs // stopped: no new checks
	}
	e.inFlight = true
	obs.InFlight = true
	checkRedis := target.Redis != nil &&
		(e.last == nil || e.last.Redis == nil || now.Sub(e.last.Redis.CheckedAt) >= p.cfg.RedisInterval)
	failing := e.last != nil && e.last.Failure != nil
	p.wg.Add(1)
	go p.check(key, target, e.gen, checkRedis, failing)
	return obs
}

// delay is the time between checks after failures consecutive failures:
// interval, doubling with each failure after the first, up to MaxBackoff.
// Until a target is first measured, the doubling starts from FirstRetry
// (2s, 4s, ... up to interval, then on as after a success).
func (p *Prober) delay(interval time.Duration, failures int, measured bool) time.Duration {
	limit := max(p.cfg.MaxBackoff, interval)
	d := interval
	if !measured && failures > 0 {
		d = min(p.cfg.FirstRetry, interval)
		for ; failures > 1 && d < interval; failures-- {
			d = min(2*d, interval)
		}
	}
	for i := 1; i < failures && d < limit; i++ {
		d *= 2
	}
	return min(d, limit)
}

// check runs one measurement and records it, unless the entry was reset or
// forgotten meanwhile.
func (p *Prober) check(key types.NamespacedName, target Target, gen uint64, checkRedis, failing bool) {
	defer p.wg.Done()
	if !p.takeSlots(failing) {
		p.finishStopped(key, gen)
		return
	}
	defer func() {
		<-p.slots
		if failing {
			<-p.failingSlots
		}
	}()
	ctx, cancel := context.WithTimeout(p.ctx, p.cfg.Timeout)
	defer cancel()

	// The Redis checks run beside the measurement, under the same deadline.
	var redisRes *RedisResult
	redisDone := make(chan struct{})
	go func() {
		defer close(redisDone)
		if checkRedis {
			checks := p.cfg.RedisCheck(ctx, *target.Redis)
			redisRes = &RedisResult{Checks: checks, CheckedAt: p.cfg.Now()}
		}
	}()
	defer func() { <-redisDone }()

	start := p.cfg.Now()
	b, err := p.cfg.Measurer.Measure(ctx, key, target)
	end := p.cfg.Now()
	res := &Result{Backlog: b, CheckedAt: end, Duration: end.Sub(start)}
	if err != nil {
		res.Backlog = outbox.Backlog{}
		res.Failure = classify(err, p.cfg.Timeout.String(), target.DSN, passwordOf(target.DSN, p.cfg.AllowDSNFileKeys))
	}

	<-redisDone
	res.Redis = redisRes

	p.mu.Lock()
	e, ok := p.entries[key]
	current := ok && e.gen == gen
	if current && res.Redis == nil && e.last != nil {
		res.Redis = e.last.Redis
	}
	if current {
		e.inFlight = false
		e.last = res
		if res.Failure != nil {
			e.failures++
		} else {
			e.failures = 0
			e.measured = true
		}
	}
	p.mu.Unlock()
	if !ok {
		// Forgotten while the check ran: the measurement may have taken a
		// share of a pool again after Forget released it.
		p.cfg.Measurer.Release(key)
	}
	if current && p.ctx.Err() == nil {
		p.cfg.Notify(p.ctx, key)
	}
}

// takeSlots waits for one of the MaxConcurrentChecks slots, and first, for
// a relay whose last check failed, for one of the MaxFailingChecks; false
// when the Prober stopped first (holding none).
func (p *Prober) takeSlots(failing bool) bool {
	if failing {
		if !p.take(p.failingSlots) {
			return false
		}
		if !p.take(p.slots) {
			<-p.failingSlots
			return false
		}
		return true
	}
	return p.take(p.slots)
}

// take puts a token into slots, waiting while it is full (counted in
// CheckStats.Waiting); false when the Prober stopped first.
func (p *Prober) take(slots chan struct{}) bool {
	select {
	case slots <- struct{}{}:
		return true
	default:
	}
	p.waiting.Add(1)
	defer p.waiting.Add(-1)
	select {
	case slots <- struct{}{}:
		return true
	case <-p.ctx.Done():
		return false
	}
}

// finishStopped ends a check that never ran because the Prober stopped.
func (p *Prober) finishStopped(key types.NamespacedName, gen uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if e, ok := p.entries[key]; ok && e.gen == gen {
		e.inFlight = false
	}
}

// CheckStats are the checks of a Prober, for metrics.
type CheckStats struct {
	// Running is the number of checks running now.
	Running int
	// Max is MaxConcurrentChecks.
	Max int
	// Waiting is the number of due checks waiting for a free slot.
	Waiting int
	// Relays is the number of relays the Prober knows.
	Relays int
}

// CheckStats returns the current check figures.
func (p *Prober) CheckStats() CheckStats {
	return CheckStats{Running: len(p.slots), Max: cap(p.slots), Waiting: int(p.waiting.Load()), Relays: p.Len()}
}

// Forget drops everything known about the relay and releases its
// connections; call it when the relay is deleted. A check in flight finishes
// in the background and is discarded.
func (p *Prober) Forget(key types.NamespacedName) {
	p.mu.Lock()
	delete(p.entries, key)
	p.mu.Unlock()
	p.cfg.Measurer.Release(key)
}

// Len returns the number of relays the Prober knows.
func (p *Prober) Len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.entries)
}
