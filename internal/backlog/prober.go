package backlog

import (
	"context"
	"errors"
	"sync"
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
	// Duration is how long the check took, from when it left the queue.
	Duration time.Duration
	// Redis is the latest run of the Redis checks of the target (kept
	// across the checks that do not run them); nil before the first, or
	// when the target has no Redis.
	Redis *RedisResult
	// Slot is the state of the target's replication slot (Target.Slot);
	// nil without one, or when Failure is set.
	Slot *SlotResult
}

// Observation is what a Prober knows about one relay's backlog.
type Observation struct {
	// Last is the latest finished check of the relay's current target; nil
	// while none has finished.
	Last *Result
	// InFlight reports that a check is queued or running; the Prober calls
	// back when it finishes.
	InFlight bool
	// NextCheckIn is how long until the next check is due, when none is in
	// flight: observe again then. The interval counts from the first
	// Observe that returned the last result, so that a reconcile delayed
	// in a busy work queue, which writes that result, does not bring the
	// next result's write closer to it than the interval.
	NextCheckIn time.Duration
}

// Config configures a Prober. Zero fields take the documented defaults.
type Config struct {
	// Measurer makes the connections and takes the measurements (required).
	Measurer Measurer
	// Timeout bounds the queries of one check, and its Redis checks
	// (default 10s). It starts when the check holds a check slot:
	// getting a connection has a deadline of its own, ConnectTimeout.
	Timeout time.Duration
	// ConnectTimeout bounds getting the connection of a check (default
	// 5s): the wait for a connection slot, dialling, TLS and
	// authentication.
	ConnectTimeout time.Duration
	// FirstConnectTimeout replaces ConnectTimeout until a connection to the
	// target has been made (default 1s; at most ConnectTimeout), doubling
	// with each check in a row that could not connect: a new relay's
	// database is measured at once when it answers, and one that accepts
	// connections and never answers holds a dial slot for a second, not
	// for ConnectTimeout, while a slow one is still reached within a few
	// checks.
	FirstConnectTimeout time.Duration
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
	// MaxConcurrentChecks bounds the checks that run their queries (and
	// Redis checks) at once, across every relay (default 16). A check
	// takes one of these check slots once it has a connection.
	MaxConcurrentChecks int
	// MaxFailingChecks bounds, within MaxConcurrentChecks, the checks of
	// relays whose last check failed (default a quarter of it, at least
	// 1): a query that hangs holds its slot until Timeout, and must not
	// starve the checks of the relays that answer.
	MaxFailingChecks int
	// MaxConcurrentDials bounds the checks that are getting a connection
	// at once (default 32), so the dials in flight: a due check waits in a
	// queue (no goroutine) for one of these dial slots, and holds it until
	// it has a connection and a check slot. A dial that waits for a
	// database that never answers holds a dial slot, not a check slot.
	MaxConcurrentDials int
	// MaxFailingDials bounds, within MaxConcurrentDials, the dial slots of
	// relays whose last check failed (default a quarter of it, at least 1).
	MaxFailingDials int
	// AllowDSNFileKeys is PoolMeasurerConfig.AllowFileKeys, for redacting
	// the password of a DSN from messages the same way it was parsed.
	AllowDSNFileKeys bool
}

// withDefaults fills the zero fields of c.
func (c Config) withDefaults() Config {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&c.Timeout, 10*time.Second)
	def(&c.ConnectTimeout, 5*time.Second)
	def(&c.FirstConnectTimeout, time.Second)
	c.FirstConnectTimeout = min(c.FirstConnectTimeout, c.ConnectTimeout)
	def(&c.MaxBackoff, 5*time.Minute)
	def(&c.FirstRetry, 2*time.Second)
	def(&c.RedisInterval, DefaultRedisInterval)
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.RedisCheck == nil {
		c.RedisCheck = CheckRedis
	}
	if c.Notify == nil {
		c.Notify = func(context.Context, types.NamespacedName) {}
	}
	share := func(n *int, of int) {
		if *n <= 0 || *n > of {
			*n = max(1, of/4)
		}
	}
	if c.MaxConcurrentChecks <= 0 {
		c.MaxConcurrentChecks = 16
	}
	share(&c.MaxFailingChecks, c.MaxConcurrentChecks)
	if c.MaxConcurrentDials <= 0 {
		c.MaxConcurrentDials = 32
	}
	share(&c.MaxFailingDials, c.MaxConcurrentDials)
	return c
}

// Prober schedules the backlog checks of every relay: at most one at a time
// per relay, each in its own goroutine once it leaves the queue of due
// checks, so a database that hangs holds up only its own relays' checks.
//
// A check has two stages, each under a bound: getting a connection (a dial
// slot, MaxConcurrentDials, under ConnectTimeout), then running its queries
// (a check slot, MaxConcurrentChecks, under Timeout). Due checks wait in a
// queue for a dial slot, in two lanes: relays whose last check failed get
// at most a quarter of each kind of slot.
type Prober struct {
	cfg    Config
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	stopped bool
	entries map[types.NamespacedName]*entry
	queue   dueQueue
	// dialing counts the checks holding a dial slot, by lane.
	dialing [laneCount]int

	// slots holds one token per check running its queries; failingSlots
	// one more per such check of a relay whose last check failed.
	slots        chan struct{}
	failingSlots chan struct{}
}

// entry is one relay's state. gen changes whenever the entry is reset, so a
// check started for an older target does not overwrite a newer one.
type entry struct {
	gen         uint64
	fingerprint string
	last        *Result
	// seenAt is when Observe first returned last: the next check is due
	// from then.
	seenAt   time.Time
	failures int
	// measured: a check of this target has succeeded.
	measured bool
	// connected: a connection to this target has been made; until then
	// connectFailures counts the checks in a row that could not connect.
	connected       bool
	connectFailures int
	state           checkState
	// next is the check that is queued or running.
	next check
}

// checkState is where a relay's check is.
type checkState int

const (
	checkIdle    checkState = iota // none queued or running
	checkQueued                    // due, waiting for a dial slot
	checkRunning                   // connecting or measuring
)

// check is one check to run.
type check struct {
	target         Target
	gen            uint64
	failing        bool // the relay's last check failed: the failing lane
	checkRedis     bool
	connectTimeout time.Duration
}

// NewProber returns a Prober. Stop it with Stop (or run it with Start).
func NewProber(cfg Config) *Prober {
	cfg = cfg.withDefaults()
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

// Stop drops the queued checks, cancels the running ones, waits for them
// and closes the measurer.
func (p *Prober) Stop() {
	p.cancel()
	p.mu.Lock()
	p.stopped = true
	for _, e := range p.entries {
		if e.state == checkQueued {
			e.state = checkIdle
		}
	}
	p.queue = dueQueue{}
	p.mu.Unlock()
	p.wg.Wait()
	p.cfg.Measurer.Close()
}

// Observe returns what is known of the relay's backlog for target and queues
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
		if e.state == checkQueued {
			p.queue.remove(key)
		}
		*e = entry{gen: e.gen + 1, fingerprint: fp}
	}

	obs := Observation{InFlight: e.state != checkIdle}
	if e.last != nil {
		last := *e.last
		obs.Last = &last
	}
	if e.state != checkIdle {
		return obs
	}
	if e.last != nil {
		if e.seenAt.IsZero() {
			e.seenAt = now
		}
		wait := e.seenAt.Add(p.delay(interval, e.failures, e.measured, e.last.Failure.answered())).Sub(now)
		if wait > 0 {
			obs.NextCheckIn = wait
			return obs
		}
	}
	if p.stopped {
		return obs // no new checks
	}
	e.state = checkQueued
	e.next = check{
		target:  target,
		gen:     e.gen,
		failing: e.last != nil && e.last.Failure != nil,
		checkRedis: target.Redis != nil &&
			(e.last == nil || e.last.Redis == nil || now.Sub(e.last.Redis.CheckedAt) >= p.cfg.RedisInterval),
		connectTimeout: connectTimeout(p.cfg.FirstConnectTimeout, p.cfg.ConnectTimeout, e.connected, e.connectFailures),
	}
	p.queue.push(key, laneOf(e.next.failing))
	p.dispatchLocked()
	obs.InFlight = true
	return obs
}

// delay is the time between checks after failures consecutive failures:
// interval, doubling with each failure after the first, up to MaxBackoff.
// Until a target is first measured, the doubling starts from FirstRetry
// (2s, 4s, ... up to interval, then on as after a success). When the
// database answered that the table or a column is missing (answered), the
// delay stops at interval: such a check costs one round trip, and the
// schema is often being created (a migration Job beside the relay), so the
// relay is measured within an interval of it, not minutes later.
func (p *Prober) delay(interval time.Duration, failures int, measured, answered bool) time.Duration {
	limit := max(p.cfg.MaxBackoff, interval)
	if answered {
		limit = interval
	}
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

// connectTimeout is the connect deadline of a check: full once a connection
// to the target has been made; before that first, doubled for each check in
// a row that could not connect, up to full.
func connectTimeout(first, full time.Duration, connected bool, failures int) time.Duration {
	if connected {
		return full
	}
	d := first
	for ; failures > 0 && d < full; failures-- {
		d *= 2
	}
	return min(d, full)
}

// dispatchLocked starts queued checks while a dial slot is free: the one
// that has waited longest, from the failing lane only while it holds fewer
// than MaxFailingDials.
func (p *Prober) dispatchLocked() {
	for !p.stopped && p.dialing[laneAnswering]+p.dialing[laneFailing] < p.cfg.MaxConcurrentDials {
		key, l, ok := p.queue.pop(p.dialing[laneFailing] < p.cfg.MaxFailingDials)
		if !ok {
			return
		}
		// Forget and a new target take a key out of the queue, so the
		// entry is there and queued.
		e := p.entries[key]
		e.state = checkRunning
		p.dialing[l]++
		p.wg.Add(1)
		go p.run(key, e.next)
	}
}

// dialDone gives back a dial slot and starts the next queued check.
func (p *Prober) dialDone(c check) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.dialing[laneOf(c.failing)]--
	p.dispatchLocked()
}

// run runs one check, holding the dial slot dispatchLocked gave it: it gets
// a connection, then takes a check slot (giving the dial slot back) and runs
// the queries, and the Redis checks when they are due. A check that could
// not connect needs no check slot, unless its Redis checks are due.
func (p *Prober) run(key types.NamespacedName, c check) {
	defer p.wg.Done()
	start := p.cfg.Now()
	conn, connErr := p.connect(key, c)
	if connErr != nil && !c.checkRedis {
		p.dialDone(c)
		if p.ctx.Err() != nil {
			p.finish(key, c, nil, nil) // stopped
			return
		}
		p.finish(key, c, p.result(c.target, start, outbox.Backlog{}, connErr, nil), connErr)
		return
	}
	slot := p.takeSlots(c.failing)
	p.dialDone(c)
	if !slot {
		if conn != nil {
			conn.Release()
		}
		p.finish(key, c, nil, nil) // stopped
		return
	}
	res := p.measure(c, conn, connErr, start)
	p.releaseSlots(c.failing)
	p.finish(key, c, res, connErr)
}

// connect gets the check's connection within its connect timeout.
func (p *Prober) connect(key types.NamespacedName, c check) (Conn, error) {
	return p.cfg.Measurer.Connect(p.ctx, key, c.target, c.connectTimeout)
}

// measure runs the queries over conn (none when the connection failed with
// connErr) and, beside them, the Redis checks when due, under Timeout.
func (p *Prober) measure(c check, conn Conn, connErr error, start time.Time) *Result {
	ctx, cancel := context.WithTimeout(p.ctx, p.cfg.Timeout)
	defer cancel()

	var (
		redisRes *RedisResult
		redis    sync.WaitGroup
	)
	if c.checkRedis {
		redis.Go(func() {
			checks := p.cfg.RedisCheck(ctx, *c.target.Redis)
			redisRes = &RedisResult{Checks: checks, CheckedAt: p.cfg.Now()}
		})
	}
	b, err := outbox.Backlog{}, connErr
	var slot *SlotResult
	if conn != nil {
		b, err = conn.Measure(ctx)
		if sc, ok := conn.(SlotConn); ok && err == nil && c.target.Slot != "" {
			var s SlotResult
			if s, err = sc.MeasureSlot(ctx); err == nil {
				slot = &s
			}
		}
		conn.Release()
	}
	redis.Wait()
	res := p.result(c.target, start, b, err, redisRes)
	if res.Failure == nil {
		res.Slot = slot
	}
	return res
}

// result makes the Result of a check that started at start.
func (p *Prober) result(t Target, start time.Time, b outbox.Backlog, err error, redis *RedisResult) *Result {
	end := p.cfg.Now()
	res := &Result{Backlog: b, CheckedAt: end, Duration: end.Sub(start), Redis: redis}
	if err != nil {
		res.Backlog = outbox.Backlog{}
		res.Failure = classify(err, p.cfg.Timeout.String(), t.DSN, passwordOf(t.DSN, p.cfg.AllowDSNFileKeys))
	}
	return res
}

// finish records a check's result (nil: the Prober stopped first) unless
// the entry was reset or forgotten meanwhile, and notifies.
func (p *Prober) finish(key types.NamespacedName, c check, res *Result, connErr error) {
	p.mu.Lock()
	e, ok := p.entries[key]
	current := ok && e.gen == c.gen
	if current {
		e.state = checkIdle
	}
	if current && res != nil {
		if res.Redis == nil && e.last != nil {
			res.Redis = e.last.Redis
		}
		// The backoff counts the failures in a row of one kind: a database
		// that stops answering after a missing table backs off from the
		// start, not from where the missing table's count had got to.
		if res.Failure != nil && e.last != nil && e.last.Failure != nil && e.last.Failure.answered() != res.Failure.answered() {
			e.failures = 0
		}
		e.last = res
		e.seenAt = time.Time{}
		if res.Failure != nil {
			e.failures++
		} else {
			e.failures = 0
			e.measured = true
		}
		switch {
		case connErr == nil:
			e.connected, e.connectFailures = true, 0
		case errors.Is(connErr, errConnect):
			e.connectFailures++
		}
	}
	p.mu.Unlock()
	if !ok {
		// Forgotten while the check ran: the connection may have taken a
		// share of a pool again after Forget released it.
		p.cfg.Measurer.Release(key)
	}
	if current && res != nil && p.ctx.Err() == nil {
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

// take puts a token into slots, waiting while it is full; false when the
// Prober stopped first.
func (p *Prober) take(slots chan struct{}) bool {
	select {
	case slots <- struct{}{}:
		return true
	case <-p.ctx.Done():
		return false
	}
}

// releaseSlots gives back what takeSlots took.
func (p *Prober) releaseSlots(failing bool) {
	<-p.slots
	if failing {
		<-p.failingSlots
	}
}

// MaxCheckDuration is the longest a check runs once it has left the queue,
// but for a wait for a check slot: ConnectTimeout and Timeout.
func (p *Prober) MaxCheckDuration() time.Duration { return p.cfg.ConnectTimeout + p.cfg.Timeout }

// CheckStats are the checks of a Prober, for metrics.
type CheckStats struct {
	// Running is the number of checks running their queries now.
	Running int
	// Max is MaxConcurrentChecks.
	Max int
	// Waiting is the number of due checks queued for a dial slot.
	Waiting int
	// Dialing is the number of checks holding a dial slot: getting a
	// connection, or waiting with one for a check slot.
	Dialing int
	// MaxDials is MaxConcurrentDials.
	MaxDials int
	// Relays is the number of relays the Prober knows.
	Relays int
}

// CheckStats returns the current check figures.
func (p *Prober) CheckStats() CheckStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return CheckStats{
		Running: len(p.slots), Max: cap(p.slots), Waiting: p.queue.len(),
		Dialing:  p.dialing[laneAnswering] + p.dialing[laneFailing],
		MaxDials: p.cfg.MaxConcurrentDials, Relays: len(p.entries),
	}
}

// Forget drops everything known about the relay and releases its
// connections; call it when the relay is deleted. A queued check is
// dropped; one running finishes in the background and is discarded.
func (p *Prober) Forget(key types.NamespacedName) {
	p.mu.Lock()
	if e, ok := p.entries[key]; ok && e.state == checkQueued {
		p.queue.remove(key)
	}
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
