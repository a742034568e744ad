package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/outbox-dev/outbox-operator/internal/outbox"
	"github.com/outbox-dev/outbox-operator/internal/pgtx"
)

// Relay runs the claim, publish, commit loop for one outbox table and one
// stream. Create it with New and start it with Run.
type Relay struct {
	cfg Config
	db  *pgxpool.Pool
	rdb redis.UniversalClient
	log *slog.Logger

	// lastErr is nil after a successful pass; the readiness probe reads it.
	lastErr atomic.Pointer[error]
	// wake is signalled by the NOTIFY listener.
	wake chan struct{}
	// failures counts the failed passes of the current outage.
	failures atomic.Int64
	// refused remembers events Redis refused until they are parked.
	refused refusals
	// bulkLimit is Redis's proto-max-bulk-len, read from the server.
	bulkLimit bulkLimit

	// testHookBeforeCommit, when set, runs after every XADD of a batch was
	// acknowledged and before the commit; an error rolls the batch back.
	// Tests use it to fail between publish and commit, a fault no real
	// server can be made to show at exactly that point.
	testHookBeforeCommit func(ctx context.Context) error
}

// errNotStarted is the readiness error before the first pass.
var errNotStarted = errors.New("no pass completed yet")

// New validates cfg and returns a Relay using the given pool and client,
// which the caller owns and closes.
func New(cfg Config, db *pgxpool.Pool, rdb redis.UniversalClient) (*Relay, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("invalid relay config: %w", err)
	}
	if db == nil || rdb == nil {
		return nil, errors.New("invalid relay config: a PostgreSQL pool and a Redis client are required")
	}
	r := &Relay{
		cfg:  cfg,
		db:   db,
		rdb:  rdb,
		log:  cfg.Logger.With("table", cfg.Table.String(), "stream", cfg.Stream),
		wake: make(chan struct{}, 1),
	}
	r.setErr(errNotStarted)
	return r, nil
}

// Ready returns nil when the last pass reached PostgreSQL and Redis, else
// why not.
func (r *Relay) Ready() error {
	if p := r.lastErr.Load(); p != nil {
		return *p
	}
	return nil
}

func (r *Relay) setErr(err error) {
	if err == nil {
		r.lastErr.Store(nil)
		r.cfg.Metrics.Ready.Set(1)
		return
	}
	r.lastErr.Store(&err)
	r.cfg.Metrics.Ready.Set(0)
}

// Run relays until ctx is cancelled, then finishes or rolls back the
// batches in flight and returns nil. It returns an error only if it cannot
// start.
func (r *Relay) Run(ctx context.Context) error {
	r.log.Info("Relay started", "database", r.cfg.Database, "batchSize", r.cfg.BatchSize,
		"pollInterval", r.cfg.PollInterval.String(), "inFlight", r.cfg.InFlight)
	r.ensureDeadLetterTable(ctx)
	listenCtx, stopListening := context.WithCancel(ctx)
	defer stopListening()
	go r.listen(listenCtx)

	seq := newSequencer()
	var wg sync.WaitGroup
	for range r.cfg.InFlight {
		wg.Go(func() { r.loop(ctx, seq) })
	}
	wg.Wait()
	r.log.Info("Relay stopped")
	return nil
}

// ensureDeadLetterTable creates the dead-letter table if it is missing, so
// that a row that cannot be published can be parked. A relay whose role may
// not create it says so and runs on: nothing is lost without it, but a batch
// holding such a row is retried until the table exists.
func (r *Relay) ensureDeadLetterTable(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := r.cfg.Table.EnsureDeadLetterTable(ctx, r.db); err != nil {
		r.log.Warn("Could not create the dead-letter table; a row that cannot be published will hold up its batch until it exists (relay schema --apply)",
			"deadLetterTable", r.cfg.Table.DeadLetterTable(), "error", err.Error())
	}
}

// loop runs passes, each holding the claim token of seq until its claim
// came back full (then the next claim may overlap this batch's publish) or
// until its pause is over (so that polling is not multiplied by InFlight).
func (r *Relay) loop(ctx context.Context, seq *sequencer) {
	for {
		ticket, ok := seq.acquire(ctx)
		if !ok {
			return
		}
		res, err := r.pass(ctx, seq, ticket)
		var pause time.Duration
		var wake <-chan struct{}
		switch {
		case err != nil:
			failures := int(r.failures.Add(1))
			pause = r.retryDelay(err, failures)
			r.report(err, failures, pause)
		case res.claimed == r.cfg.BatchSize:
			// More is waiting: no pause after a full batch.
		case res.claimed > 0:
			pause, wake = r.cfg.BusyPollInterval, r.wake
		default:
			pause, wake = r.cfg.PollInterval, r.wake
		}
		if err == nil {
			if failures := r.failures.Swap(0); failures > 0 {
				r.log.Info("Relay recovered", "failedPasses", failures)
			}
		}
		if pause > 0 {
			sleep(ctx, pause, wake)
		}
		if !res.released {
			seq.release()
		}
	}
}

// pass runs one batch. The batch in flight is not cut off by ctx: it
// finishes or rolls back under its own deadline, so a SIGTERM never leaves a
// half-done transaction.
func (r *Relay) pass(ctx context.Context, seq *sequencer, ticket uint64) (*result, error) {
	passCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.PublishTimeout+passSlack)
	defer cancel()
	res, err := r.runBatch(passCtx, seq, ticket)
	r.setErr(err)
	return res, err
}

// passSlack is the time a pass may take beyond its publish deadline for the
// claim and the commit; statement_timeout bounds those on the server too.
const passSlack = 15 * time.Second

func (r *Relay) retryDelay(err error, failures int) time.Duration {
	if errors.Is(err, outbox.ErrTableNotFound) || errors.Is(err, outbox.ErrColumnNotFound) {
		return r.cfg.MissingTableBackoff
	}
	return backoff(failures, r.cfg.MinBackoff, r.cfg.MaxBackoff, jitter)
}

// report logs a failed pass and counts it by kind. The first failure and
// every tenth are logged at warning level, the rest at debug, so an outage
// does not flood the log.
func (r *Relay) report(err error, failures int, delay time.Duration) {
	kind := errorKind(err)
	r.cfg.Metrics.Errors.WithLabelValues(kind).Inc()
	level := slog.LevelDebug
	if failures == 1 || failures%10 == 0 {
		level = slog.LevelWarn
	}
	msg := "Relay pass failed, retrying"
	switch kind {
	case ErrorKindTableMissing:
		msg, level = "Outbox table not found, retrying", slog.LevelError
	case ErrorKindLayout:
		msg, level = "Outbox column not found, retrying", slog.LevelError
	case ErrorKindDeadLetterTableMissing:
		msg, level = "Dead-letter table not found: a row that cannot be published holds up its batch, retrying", slog.LevelError
	}
	r.log.Log(context.Background(), level, msg, "kind", kind, "database", r.cfg.Database,
		"error", err.Error(), "failedPasses", failures, "retryIn", delay.String())
}

// errorKind maps an error to a label value of outbox_relay_errors_total.
func errorKind(err error) string {
	var pe *publishError
	switch {
	case errors.Is(err, outbox.ErrTableNotFound):
		return ErrorKindTableMissing
	case errors.Is(err, outbox.ErrColumnNotFound):
		return ErrorKindLayout
	case errors.Is(err, outbox.ErrDeadLetterTableNotFound):
		return ErrorKindDeadLetterTableMissing
	case errors.As(err, &pe):
		return ErrorKindRedis
	default:
		return ErrorKindPostgres
	}
}

// result is what one pass did.
type result struct {
	claimed, published, deadLettered int
	// released: the pass gave the claim token back early, after a full claim.
	released bool
}

// runOnce claims, publishes and commits one batch on its own, without a
// sequencer.
func (r *Relay) runOnce(ctx context.Context) (*result, error) {
	return r.runBatch(ctx, nil, 0)
}

// runBatch claims, publishes and commits one batch. With a sequencer, it
// publishes in ticket order and releases the claim token right after a full
// claim.
func (r *Relay) runBatch(ctx context.Context, seq *sequencer, ticket uint64) (*result, error) {
	res := &result{}
	turnDone := seq == nil
	endTurn := func() {
		if !turnDone {
			turnDone = true
			seq.done(ticket)
		}
	}
	defer endTurn() // on every path, so later tickets never wait forever

	err := pgtx.Run(ctx, r.db, func(tx pgx.Tx) error {
		start := time.Now()
		events, err := r.cfg.Table.Claim(ctx, tx, r.cfg.BatchSize)
		if err != nil {
			return fmt.Errorf("claiming batch: %w", err)
		}
		res.claimed = len(events)
		if seq != nil && len(events) == r.cfg.BatchSize {
			seq.release()
			res.released = true
		}
		if len(events) == 0 {
			// Nothing to publish: still make sure Redis answers, so that
			// readiness tells the truth on an idle outbox.
			if err := r.rdb.Ping(ctx).Err(); err != nil {
				return &publishError{fmt.Errorf("pinging Redis: %w", err)}
			}
			return nil
		}
		if seq != nil {
			seq.wait(ticket)
		}
		var dead []parked
		res.published, dead, err = r.publish(ctx, events)
		endTurn()
		if err != nil {
			return err
		}
		for _, d := range dead {
			if err := r.cfg.Table.Park(ctx, tx, r.cfg.Stream, d.event, d.reason); err != nil {
				return err
			}
		}
		res.deadLettered = len(dead)
		if r.testHookBeforeCommit != nil {
			if err := r.testHookBeforeCommit(ctx); err != nil {
				return err
			}
		}
		if err := tx.Commit(ctx); err != nil {
			return fmt.Errorf("committing batch: %w", err)
		}
		for _, d := range dead {
			r.log.Error("Parked an outbox row that cannot be published", "eventID", d.event.ID,
				"eventType", d.event.Type, "reason", d.reason, "deadLetterTable", r.cfg.Table.DeadLetterTable())
		}
		r.refused.forget(dead)
		now := time.Now()
		r.cfg.Metrics.Batches.Inc()
		r.cfg.Metrics.EventsPublished.Add(float64(res.published))
		r.cfg.Metrics.EventsDeadLettered.Add(float64(res.deadLettered))
		r.cfg.Metrics.BatchDuration.Observe(now.Sub(start).Seconds())
		for _, e := range events {
			if !e.CreatedAt.IsZero() {
				r.cfg.Metrics.Lag.Observe(now.Sub(e.CreatedAt).Seconds())
			}
		}
		return nil
	})
	return res, err
}

// sleep waits for d, ctx or a signal on wake (nil: never).
func sleep(ctx context.Context, d time.Duration, wake <-chan struct{}) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	case <-wake:
	}
}
