package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/outbox-dev/outbox-operator/internal/outbox"
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
	// stream is what the relay knows of its stream, to notice a reset (streamloss.go).
	stream streamGuard
	// trimHeld is why the stream is not trimmed ("": it is), so that it is
	// said once (trim.go; the watch loop's).
	trimHeld string
	// trimFailures counts the trims that failed in a row (the watch
	// loop's): the first and every tenth are logged at warn level.
	trimFailures int
	// open are the batches that hold a transaction, which an automatic
	// replay waits for (streamloss.go).
	open openBatches
	// claimLimit is the number of rows a claim takes: one when a pipeline
	// starts, doubled
	// by each batch that succeeds up to BatchSize and the rows that fit in
	// BatchBytes (claimSize), halved after a batch or a claim that timed
	// out (claimSize, claimFailed), cut to the rows that fit after a claim
	// over BatchBytes (overBudget).
	claimLimit atomic.Int64
	// shared is what the relay last found of the table's other relays
	// (shared.go).
	shared tableShare
	// cascades is the last look for foreign keys through which a deleting
	// claim would delete unclaimed rows (cleanup mode OnDispatch only).
	cascades cascadeCheck

	// testHookBeforeCommit, when set, runs after every XADD of a batch was
	// acknowledged and before the commit; an error rolls the batch back.
	// Tests use it to fail between publish and commit, a fault no real
	// server can be made to show at exactly that point.
	testHookBeforeCommit func(ctx context.Context) error
	// testHookBeforePublish, when set, runs before a batch is published; an
	// error fails the batch before anything reached Redis. Tests use it to
	// fail a batch in the middle of the pipeline.
	testHookBeforePublish func(events []outbox.Event) error
	// testHookBeforeClaim, when set, runs in the claimer after it read the
	// pipeline's epoch and before it claims; testHookBeforeStaleRollback
	// before the publisher rolls back a batch claimed before a failure.
	// Tests use them to order a claim against a failure, which no real
	// server can be made to do at exactly that point.
	testHookBeforeClaim         func()
	testHookBeforeStaleRollback func()
	// testHookCatchUp, when set, runs in a catch-up of source
	// LogicalReplication before each page is published (done false) and
	// before the catch-up is recorded done (done true); an error ends the
	// catch-up there. Tests use it to hold two relays' catch-ups in an order
	// that no real server can be made to show.
	testHookCatchUp func(ctx context.Context, done bool) error
	// testHookBeforeSetup runs in the preparation of a slot after it read the
	// slot's status and progress, before Setup (which creates a missing slot).
	testHookBeforeSetup func(ctx context.Context)

	// partitionsPublished is what this relay last recorded of the table's
	// partitions (logical.PartitionKeys) while holding the slot: when they
	// are the same, nothing joined since; nil: read the record again.
	partitionsPublished *string
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
	r.stream.found = make(chan struct{}, 1)
	r.claimLimit.Store(int64(cfg.BatchSize)) // the pipeline starts it at one
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
// start. It returns after its background loops: the stream watch records
// a reset found at the end (and replays it, with AutoReplay) before the
// process may exit.
func (r *Relay) Run(ctx context.Context) error {
	r.log.Info("Relay started", "database", r.cfg.Database, "batchSize", r.cfg.BatchSize,
		"pollInterval", r.cfg.PollInterval.String(), "inFlight", r.cfg.InFlight, "ordering", string(r.cfg.Ordering),
		"cleanupMode", r.cfg.Dispatch.String(), "source", string(r.cfg.Source))
	r.ensureDeadLetterTable(ctx)
	saved := r.loadStreamState(ctx) // before any batch looks at the stream
	// The background ends after the batches: the last of them can still
	// find a stream reset, which the watch must record before Run returns.
	listenCtx, stopListening := context.WithCancel(context.WithoutCancel(ctx))
	var background sync.WaitGroup
	background.Go(func() { r.listen(listenCtx) })
	background.Go(func() { r.watchStream(listenCtx, saved) }) // stream resets, trimming (streamloss.go, trim.go)
	background.Go(func() { r.watchTable(listenCtx) })         // the table's other relays (shared.go)

	switch {
	case r.cfg.Source == SourceLogicalReplication:
		r.replicate(ctx) // one reader per slot: commit order, whatever the ordering
	case r.cfg.Ordering != OrderingNone:
		r.own(ctx)
	default:
		r.pipeline(ctx, nil)
	}
	stopListening()
	background.Wait()
	r.log.Info("Relay stopped")
	return nil
}

// batch is a claimed batch. Its transaction holds the rows' locks until the
// publisher commits it or rolls it back.
type batch struct {
	tx     pgx.Tx
	events []outbox.Event
	start  time.Time
	// claimed is when the claim statement returned.
	claimed time.Time
	// ctx bounds the batch from its claim to its commit; it outlives the
	// relay's context, so a SIGTERM finishes a claimed batch instead of
	// cutting it off.
	ctx    context.Context
	cancel context.CancelFunc
	// epoch is the pipeline's epoch when the claim began: a batch claimed
	// before a failure is rolled back, not published.
	epoch uint64
	// ownerEpoch is the ownership's epoch the batch publishes with (ordered
	// relays only).
	ownerEpoch int64
	// limit is the number of rows the claim asked for.
	limit int
	// bytes is the size of the events (outbox.Event.Size).
	bytes int
	// owner and parts are the ownership and the key partitions the batch
	// was fenced for (ordered relays only).
	owner *ownership
	parts []int64
}

// pipeline relays until ctx ends: one claimer feeds claimed batches, in
// claim order, through a FIFO to one publisher, which publishes and commits
// them in that order. At most InFlight batches hold a transaction at once
// (the tokens). When a batch fails, the publisher rolls it back, then moves
// the epoch on: every batch claimed before that (so claimed past the failed
// rows) is rolled back unpublished, and the claimer waits out the backoff
// and claims again from the oldest pending row, once no batch of an older
// epoch holds a row lock: a claim skips locked rows, so claiming beside
// such a batch would take rows after the ones it holds. So order holds by
// construction: the stream receives batches in claim order, and nothing is
// published after a failed batch until it has succeeded. With an ownership
// (ordering Strict or PerKey), every batch is fenced by it.
func (r *Relay) pipeline(ctx context.Context, o *ownership) {
	// Slow start: the first claim takes one row, and each batch that
	// succeeds doubles the claims up to BatchSize, as far as its rows' size
	// allows (claimSize): the relay learns how large the rows are before a
	// claim takes many (a claim over BatchBytes is made again, and a claim
	// of BatchSize large rows is a server-side sort of all of them first).
	r.claimLimit.Store(1)
	p := &pipe{
		queue:   make(chan *batch, r.cfg.InFlight),
		tokens:  make(chan struct{}, r.cfg.InFlight),
		open:    map[uint64]int{},
		changed: make(chan struct{}),
	}
	for range r.cfg.InFlight {
		p.tokens <- struct{}{}
	}
	// Each batch in flight claims on a session of its own: have them
	// warmed before the first claim (outbox.SessionSettings.WarmAllocator).
	outbox.WarmForClaims(ctx, r.db, r.cfg.InFlight)
	var wg sync.WaitGroup
	wg.Go(func() { r.publisher(p, o) })
	r.claimer(ctx, p, o)
	close(p.queue)
	wg.Wait()
}

// pipe is what the claimer and the publisher share.
type pipe struct {
	queue  chan *batch
	tokens chan struct{}
	epoch  atomic.Uint64
	// resume is when the claimer may claim again after a failure (Unix nanos).
	resume atomic.Int64

	mu sync.Mutex
	// open counts, by epoch, the batches claimed and not yet committed or
	// rolled back; changed is closed (and replaced) when a count falls.
	open    map[uint64]int
	changed chan struct{}
}

// opened counts a claimed batch of epoch e.
func (p *pipe) opened(e uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.open[e]++
}

// closed counts a batch of epoch e committed or rolled back.
func (p *pipe) closed(e uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.open[e]--; p.open[e] <= 0 {
		delete(p.open, e)
	}
	close(p.changed)
	p.changed = make(chan struct{})
}

// waitOlder waits until no batch of an epoch before e holds its rows, or
// ctx ends (false).
func (p *pipe) waitOlder(ctx context.Context, e uint64) bool {
	for {
		p.mu.Lock()
		older := false
		for oe := range p.open {
			older = older || oe < e
		}
		changed := p.changed
		p.mu.Unlock()
		if !older {
			return true
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return false
		}
	}
}

// claimer claims batches while ctx lasts and hands them to the publisher.
func (r *Relay) claimer(ctx context.Context, p *pipe, o *ownership) {
	// Ordering None claims past the batches in flight (outbox.Frontier);
	// an ordered relay claims from the start, so that a row committed late
	// is not passed over by the rows after it.
	var frontier *outbox.Frontier
	if o == nil && r.cfg.Ordering == OrderingNone {
		frontier = &outbox.Frontier{}
	}
	lastEpoch := p.epoch.Load()
	for {
		select {
		case <-p.tokens:
		case <-ctx.Done():
			return
		}
		if wait := time.Until(time.Unix(0, p.resume.Load())); wait > 0 {
			sleep(ctx, wait, nil)
		}
		epoch := p.epoch.Load()
		// The batches claimed before a failure hold rows that the claim
		// would skip; they are rolled back first.
		if ctx.Err() != nil || !p.waitOlder(ctx, epoch) {
			p.tokens <- struct{}{}
			return
		}
		if r.testHookBeforeClaim != nil {
			r.testHookBeforeClaim()
		}
		if epoch != lastEpoch && frontier != nil {
			frontier.Reset() // a batch failed: its rows are pending again, below the frontier
		}
		lastEpoch = epoch
		b, err := r.claim(ctx, o, frontier)
		var pause time.Duration
		var wake <-chan struct{}
		var over *outbox.OverBudgetError
		switch {
		case errors.As(err, &over): // rolled back: claimed again at once, fewer rows
			r.overBudget(over)
			p.tokens <- struct{}{}
		case err != nil && ctx.Err() != nil: // stopping: the claim was cut off and rolled back, not failed
			p.tokens <- struct{}{}
		case err != nil:
			if frontier != nil {
				frontier.Reset() // the database may have ended transactions below it
			}
			r.claimFailed(ctx, err)
			p.tokens <- struct{}{}
			failures := int(r.failures.Add(1))
			pause = r.retryDelay(err, failures)
			r.setErr(err)
			r.report(err, failures, pause)
		case b == nil: // nothing pending
			p.tokens <- struct{}{}
			r.setErr(nil)
			r.recovered()
			pause, wake = r.cfg.PollInterval, r.wake
		default:
			b.epoch = epoch
			p.opened(epoch)
			p.queue <- b // never blocks: a token is held for it
			if len(b.events) < b.limit {
				pause, wake = r.cfg.BusyPollInterval, r.wake
			}
		}
		if pause > 0 {
			sleep(ctx, pause, wake)
		}
	}
}

// publisher publishes and commits the batches in the order they were
// claimed, until the claimer closes the queue (not when the context ends:
// every claimed batch is finished or rolled back).
func (r *Relay) publisher(p *pipe, o *ownership) {
	for b := range p.queue {
		if b.epoch != p.epoch.Load() {
			if r.testHookBeforeStaleRollback != nil {
				r.testHookBeforeStaleRollback()
			}
			r.rollback(b) // claimed past a batch that failed
			p.closed(b.epoch)
			p.tokens <- struct{}{}
			continue
		}
		_, err := r.finish(b, o)
		p.closed(b.epoch)
		r.setErr(err)
		r.claimSize(b, err)
		if err == nil {
			p.tokens <- struct{}{}
			r.recovered()
			continue
		}
		// After finish rolled the failed batch back, and before its token
		// returns: the claimer's next claim waits out the backoff, and
		// whatever was claimed before now is rolled back unpublished.
		p.epoch.Add(1)
		failures := int(r.failures.Add(1))
		pause := r.retryDelay(err, failures)
		p.resume.Store(time.Now().Add(pause).UnixNano())
		p.tokens <- struct{}{}
		r.report(err, failures, pause)
	}
}

// claimSize sets the number of rows the next claims take after batch b
// ended with err. A batch whose payloads together cannot reach Redis within
// the publish deadline (large ones), or its replicas within WaitTimeout,
// would time out on every retry, claimed whole again each time: after a
// publish that timed out the claims take half as many rows as b, down to
// one; each batch that succeeds doubles them back up to BatchSize.
func (r *Relay) claimSize(b *batch, err error) {
	var pe *publishError
	var re *replicasError
	switch {
	case err == nil:
		r.claimLimit.Store(min(2*r.claimLimit.Load(), int64(r.cfg.BatchSize), r.rowsInBudget(b)))
	case errors.As(err, &pe) && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded) || errors.As(err, &re)):
		r.claimLimit.Store(max(int64(len(b.events))/2, 1))
	}
}

// batchLimit is a whole batch's limit: BatchSize rows within BatchBytes.
func (r *Relay) batchLimit() outbox.Limit {
	return outbox.Limit{Rows: r.cfg.BatchSize, Bytes: r.cfg.BatchBytes}
}

// rowsInBudget is how many rows of the size of b's, on average, fit in
// BatchBytes (at least one): claims that grow back after a claim over the
// budget stop short of it, as long as the rows keep their size.
func (r *Relay) rowsInBudget(b *batch) int64 {
	if b == nil {
		return int64(r.cfg.BatchSize)
	}
	return int64(r.batchLimit().RowsFitting(len(b.events), int64(b.bytes)))
}

// overBudget cuts the claims to the rows that came within BatchBytes after
// a claim that read more (outbox.OverBudgetError), so that the relay holds
// no more than its budget of rows in memory, however large they are.
func (r *Relay) overBudget(err *outbox.OverBudgetError) {
	r.claimLimit.Store(int64(max(err.Fit, 1)))
	r.cfg.Metrics.ClaimsOverBudget.Inc()
	r.log.Debug("Claim over the batch byte budget, claiming fewer rows", "rows", err.Fit, "batchBytes", err.Budget)
}

// claimFailed halves the claims after one that statement_timeout cancelled
// (its rows too large together to be read in time), for the same reason.
func (r *Relay) claimFailed(ctx context.Context, err error) {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == codeQueryCanceled && ctx.Err() == nil {
		r.claimLimit.Store(max(r.claimLimit.Load()/2, 1))
	}
}

// codeQueryCanceled is the SQLSTATE of a statement cancelled, by
// statement_timeout among others.
const codeQueryCanceled = "57014"

// recovered ends an outage: it logs how long it was and resets the count.
func (r *Relay) recovered() {
	if failures := r.failures.Swap(0); failures > 0 {
		r.log.Info("Relay recovered", "failedPasses", failures)
	}
}

// ensureDeadLetterTable creates the dead-letter table if it is missing, so
// that a row that cannot be published can be parked. A relay whose role may
// not create it says so and runs on: nothing is lost without it, but a batch
// holding such a row is retried until the table exists.
func (r *Relay) ensureDeadLetterTable(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := r.cfg.Table.EnsureDeadLetterTable(ctx, r.db); err != nil {
		r.log.Warn("Could not create the dead-letter table; "+
			"a row that cannot be published will hold up its batch until it exists (relay schema --apply)",
			"deadLetterTable", r.cfg.Table.DeadLetterTable(), "error", err.Error())
	}
}

// passSlack is the time a batch may take beyond its publish deadlines for
// the claim and the commit; statement_timeout bounds those on the server too.
const passSlack = 15 * time.Second

func (r *Relay) retryDelay(err error, failures int) time.Duration {
	if errors.Is(err, outbox.ErrTableNotFound) || errors.Is(err, outbox.ErrColumnNotFound) ||
		errors.Is(err, outbox.ErrDeleteCascades) {
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
	case ErrorKindDeleteCascades:
		msg, level = "Cleanup mode OnDispatch claims nothing: its deletes would cascade to unpublished rows, retrying", slog.LevelError
	case ErrorKindTableShared:
		msg, level = "Claiming nothing: other relays of the table publish to other streams or with the other source, retrying", slog.LevelError
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
	case errors.Is(err, outbox.ErrDeleteCascades):
		return ErrorKindDeleteCascades
	case errors.Is(err, outbox.ErrTableShared):
		return ErrorKindTableShared
	case errors.Is(err, outbox.ErrDeadLetterTableNotFound):
		return ErrorKindDeadLetterTableMissing
	case errors.As(err, &pe):
		return pe.kind() // redis, or redis_replicas (wait.go)
	default:
		return ErrorKindPostgres
	}
}

// result is what one batch did.
type result struct {
	claimed, published, deadLettered int
}

// runOnce claims, publishes and commits one batch on its own, outside the
// pipeline.
func (r *Relay) runOnce(ctx context.Context) (*result, error) {
	b, err := r.claim(ctx, nil, nil)
	r.setErr(err)
	if err != nil || b == nil {
		return &result{}, err
	}
	res, err := r.finish(b, nil)
	r.setErr(err)
	return res, err
}

// claim begins a transaction and claims a batch in it; nil when nothing is
// pending (or, for an ordered relay, when it owns no key partition). The
// transaction stays open for finish. An ordered relay fences the batch
// first (ownership.fence) and claims only rows of its partitions. A
// frontier (nil: none) says where the claim begins and records what it took.
func (r *Relay) claim(ctx context.Context, o *ownership, frontier *outbox.Frontier) (*batch, error) {
	bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.batchTimeout())
	b := &batch{ctx: bctx, cancel: cancel, start: time.Now()}
	if err := r.shared.refusal(r.cfg.Table); err != nil {
		cancel()
		return nil, err // claimed rows would go to this stream only, or beside a slot's relay
	}
	tx, err := r.db.Begin(outbox.ForClaims(ctx)) // a session's first claim warms it (SessionSettings.WarmAllocator)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("beginning batch: %w", err)
	}
	b.tx = tx
	if r.cfg.Dispatch == outbox.DeleteOnDispatch {
		if err := r.cascades.check(ctx, r.cfg.Table, tx); err != nil {
			r.rollback(b)
			return nil, err
		}
	}
	b.limit = int(r.claimLimit.Load())
	if b.limit < 1 {
		b.limit = r.cfg.BatchSize // a Relay not made by New
	}
	id := r.open.add()
	b.cancel = sync.OnceFunc(func() { cancel(); r.open.done(id) })
	var parts []int64
	if o != nil {
		if parts = *o.claimable.Load(); len(parts) == 0 {
			r.rollback(b) // a standby, or no partition fenced yet
			return nil, nil
		}
		if b.ownerEpoch, err = o.fence(ctx, tx, parts); err != nil {
			r.rollback(b)
			return nil, err
		}
		b.owner, b.parts = o, parts
	}
	limit := outbox.Limit{Rows: b.limit, Bytes: r.cfg.BatchBytes}
	switch {
	case r.cfg.Ordering == OrderingPerKey:
		b.events, err = r.cfg.Table.ClaimKeyed(ctx, tx, r.cfg.Dispatch, limit, r.cfg.Partitions, parts)
	case frontier != nil:
		b.events, err = r.cfg.Table.ClaimNext(ctx, tx, r.cfg.Dispatch, limit, frontier)
	default:
		b.events, err = r.cfg.Table.Claim(ctx, tx, r.cfg.Dispatch, limit)
	}
	if err != nil {
		r.rollback(b)
		return nil, fmt.Errorf("claiming batch: %w", err)
	}
	for i := range b.events {
		b.bytes += b.events[i].Size()
	}
	b.claimed = time.Now()
	if len(b.events) == 0 {
		r.rollback(b) // nothing to keep; ends the transaction at once
		// Nothing to publish: still make sure Redis answers, so that
		// readiness tells the truth on an idle outbox.
		if err := r.rdb.Ping(ctx).Err(); err != nil {
			return nil, &publishError{fmt.Errorf("pinging Redis: %w", err)}
		}
		return nil, nil
	}
	return b, nil
}

// cascadeRecheck is how often a relay of cleanup mode OnDispatch looks
// again for foreign keys ON DELETE CASCADE within the table's tree, once
// none was found; while one is, every claim looks.
const cascadeRecheck = 10 * time.Second

// cascadeCheck remembers when a deleting claim last found no foreign key
// through which its DELETE would delete rows it did not claim
// (outbox.Table.CheckDeleteCascades): an event referencing an earlier one
// ON DELETE CASCADE would be deleted, unpublished, with the earlier one's
// batch. Such a relay claims nothing, and says why, until the key changes.
type cascadeCheck struct {
	mu sync.Mutex
	ok time.Time
}

func (c *cascadeCheck) check(ctx context.Context, t *outbox.Table, q outbox.Querier) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.ok.IsZero() && time.Since(c.ok) < cascadeRecheck {
		return nil
	}
	if err := t.CheckDeleteCascades(ctx, q); err != nil {
		c.ok = time.Time{}
		return err
	}
	c.ok = time.Now()
	return nil
}

// openBatches numbers the batches that hold a transaction, from their
// claim until they commit or roll back.
type openBatches struct {
	mu      sync.Mutex
	last    uint64
	open    map[uint64]struct{}
	changed chan struct{} // closed (and dropped) when a batch ends; nil: nobody waits
}

// add counts a batch that began its transaction and returns its number.
func (o *openBatches) add() uint64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.open == nil {
		o.open = map[uint64]struct{}{}
	}
	o.last++
	o.open[o.last] = struct{}{}
	return o.last
}

// done counts batch id ended.
func (o *openBatches) done(id uint64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.open, id)
	if o.changed != nil {
		close(o.changed)
		o.changed = nil
	}
}

// wait returns once every batch open when it was called has ended, or ctx
// has.
func (o *openBatches) wait(ctx context.Context) {
	o.mu.Lock()
	upTo := o.last
	o.mu.Unlock()
	for {
		o.mu.Lock()
		waiting := false
		for id := range o.open {
			waiting = waiting || id <= upTo
		}
		if !waiting {
			o.mu.Unlock()
			return
		}
		if o.changed == nil {
			o.changed = make(chan struct{})
		}
		changed := o.changed
		o.mu.Unlock()
		select {
		case <-changed:
		case <-ctx.Done():
			return
		}
	}
}

// batchTimeout bounds a batch from claim to commit: its wait behind the
// batches claimed before it, its own publish, and the claim and commit.
func (r *Relay) batchTimeout() time.Duration {
	return time.Duration(r.cfg.InFlight)*r.cfg.PublishTimeout + passSlack
}

// rollback ends a batch's transaction without publishing, under a context
// that is not cancelled, so its locks are released at once.
func (r *Relay) rollback(b *batch) {
	defer b.cancel()
	rctx, cancel := context.WithTimeout(context.WithoutCancel(b.ctx), 5*time.Second)
	defer cancel()
	if err := b.tx.Rollback(rctx); err != nil && !errors.Is(err, pgx.ErrTxClosed) {
		r.lingering(b)
	}
}

// lingering handles an ordered batch whose rollback failed: its connection
// closed (pgx closes it then) before its transaction was seen to end, and
// the server may keep the session, and the batch's rows locked, until it
// notices: seconds, or up to the idle-in-transaction limit after a cut
// link. A claim beside it would skip those rows and publish the rows after
// them first. So the batch's partitions wait, as a new owner's do, until
// their fences can be taken exclusively: once that transaction is over
// (ownership.refence). (A failed commit needs none of this: the batch was
// published before it, so the rows a claim skips are in the stream already.)
func (r *Relay) lingering(b *batch) {
	if b.owner == nil {
		return
	}
	r.log.Warn("A batch's connection closed before its transaction was seen to end; "+
		"the relay waits for its transaction to end before claiming its partitions again", "partitions", b.parts)
	b.owner.refence(b.parts)
}

// finish publishes a claimed batch, parks what cannot be published, and
// commits; on any error it rolls the batch back (rollback).
func (r *Relay) finish(b *batch, o *ownership) (*result, error) {
	defer b.cancel()
	res := &result{claimed: len(b.events)}
	err := r.publishAndCommit(b, o, res)
	if err != nil {
		r.rollback(b)
	}
	return res, err
}

// publishAndCommit is finish but for the rollback: it publishes b, parks
// what cannot be published in b's transaction, commits, and counts.
func (r *Relay) publishAndCommit(b *batch, o *ownership, res *result) error {
	tx := b.tx
	if r.testHookBeforePublish != nil {
		if err := r.testHookBeforePublish(b.events); err != nil {
			return err
		}
	}
	var dead []parked
	var err error
	publishStart := time.Now()
	res.published, dead, err = r.publish(b.ctx, b.events, o, b.ownerEpoch)
	if err != nil {
		return err
	}
	published := time.Now()
	for _, d := range dead {
		if err := r.cfg.Table.Park(b.ctx, tx, r.cfg.Stream, d.event, d.reason); err != nil {
			return err
		}
	}
	res.deadLettered = len(dead)
	if r.testHookBeforeCommit != nil {
		if err := r.testHookBeforeCommit(b.ctx); err != nil {
			return err
		}
	}
	if err := tx.Commit(b.ctx); err != nil {
		return fmt.Errorf("committing batch: %w", err)
	}
	now := r.committed(b.events, res.published, dead, b.start)
	for _, p := range []struct {
		phase    string
		from, to time.Time
	}{
		{PhaseClaim, b.start, b.claimed}, {PhaseQueued, b.claimed, publishStart},
		{PhasePublish, publishStart, published}, {PhaseCommit, published, now},
	} {
		r.cfg.Metrics.BatchPhase.WithLabelValues(p.phase).Observe(p.to.Sub(p.from).Seconds())
	}
	return nil
}

// committed is what follows the commit of a batch of events begun at start,
// of which published reached the stream and dead were parked, whatever the
// source: the parked rows logged, the counters, the lag. It returns the
// time it counted the batch done.
func (r *Relay) committed(events []outbox.Event, published int, dead []parked, start time.Time) time.Time {
	for _, d := range dead {
		r.log.Error("Parked an outbox row that cannot be published", "eventID", d.event.ID,
			"eventType", d.event.Type, "reason", d.reason, "deadLetterTable", r.cfg.Table.DeadLetterTable())
	}
	r.refused.forget(dead)
	now := time.Now()
	r.cfg.Metrics.Batches.Inc()
	r.cfg.Metrics.EventsPublished.Add(float64(published))
	r.cfg.Metrics.EventsDeadLettered.Add(float64(len(dead)))
	r.cfg.Metrics.BatchDuration.Observe(now.Sub(start).Seconds())
	for _, e := range events {
		if !e.CreatedAt.IsZero() {
			r.cfg.Metrics.Lag.Observe(now.Sub(e.CreatedAt).Seconds())
		}
	}
	return now
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
