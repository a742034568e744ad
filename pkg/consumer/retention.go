package consumer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// How long a processed-events row must be kept.
//
// A row dedupes an event for as long as the event can arrive again. It can
// arrive again
//
//   - from this consumer group: an entry processed and committed whose XACK
//     was lost is reclaimed after MinIdle and delivered again, up to
//     MaxDeliveries times, each pass ClaimInterval apart
//     (Config.RedeliveryWindow);
//   - from the relay: a relay that dies between its XADD and its commit
//     publishes the batch again once the row locks are released (about a
//     minute at most, docs/relay.md "Bounded locks"), and `relay replay`
//     republishes rows dispatched in a window after a stream reset, from any
//     row still in the outbox table, that is up to the outbox's cleanup
//     retention (spec.cleanup.retention, 72h by default) after it was first
//     dispatched.
//
// So the rule: keep processed-events rows at least
// max(cleanup retention of the outbox, RedeliveryWindow) plus a margin;
// RequiredRetention computes it. DefaultProcessedRetention (7 days) fits the
// defaults with room to spare.

// DefaultProcessedRetention is the retention CleanupProcessed is meant to
// run with when the outbox keeps its default cleanup retention (72h).
const DefaultProcessedRetention = 7 * 24 * time.Hour

// retentionMargin is added to the longest redelivery window.
const retentionMargin = time.Hour

// relayRepublishWindow bounds how late the relay itself publishes an event
// again after a crash between its XADD and its commit: the row locks are
// released within about a minute (docs/relay.md).
const relayRepublishWindow = 5 * time.Minute

// RedeliveryWindow is how long after it was first processed an entry can be
// delivered again to this group: every delivery up to MaxDeliveries, each
// after MinIdle plus a ClaimInterval, each running up to HandlerTimeout.
func (c Config) RedeliveryWindow() time.Duration {
	c = c.withDefaults(func(string) string { return "" }, func() (string, error) { return "", nil })
	return time.Duration(c.MaxDeliveries) * (c.MinIdle + c.ClaimInterval + c.HandlerTimeout)
}

// RequiredRetention is the least retention of processed-events rows that
// still dedupes every redelivery: of this consumer (cfg), of a relay that
// republishes after a crash, and of `relay replay` from an outbox table
// whose dispatched rows are deleted after outboxRetention.
func RequiredRetention(cfg Config, outboxRetention time.Duration) time.Duration {
	return max(outboxRetention, cfg.RedeliveryWindow(), relayRepublishWindow) + retentionMargin
}

// CleanupOptions configure CleanupProcessed.
type CleanupOptions struct {
	// Table is the processed-events table; default processed_events.
	Table string
	// Retention: rows processed longer ago than this are deleted. Required;
	// see RequiredRetention.
	Retention time.Duration
	// MinRetention, when set, refuses a Retention below it (pass
	// RequiredRetention(cfg, outboxRetention)).
	MinRetention time.Duration
	// BatchSize is the rows one DELETE removes (default 1000).
	BatchSize int
	// MaxBatches bounds one call (default: until a batch comes back short).
	MaxBatches int
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// Execer runs a statement: a *pgxpool.Pool, a *pgx.Conn.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// CleanupProcessed deletes processed-events rows older than the retention,
// in batches of BatchSize, each its own short statement that skips rows
// another transaction holds (a consumer recording the same event waits on
// nothing), until a batch comes back short. It returns the rows deleted.
// Run it from a CronJob or a ticker; it is safe to run from several places
// at once.
func CleanupProcessed(ctx context.Context, db Execer, o CleanupOptions) (int64, error) {
	if o.Retention <= 0 {
		return 0, errors.New("cleanup of processed events: a positive retention is required")
	}
	if o.MinRetention > 0 && o.Retention < o.MinRetention {
		return 0, fmt.Errorf("cleanup of processed events: retention %s is below the required %s: "+
			"an event redelivered or replayed after that would be processed twice", o.Retention, o.MinRetention)
	}
	if o.Table == "" {
		o.Table = DefaultProcessedTable
	}
	if o.BatchSize <= 0 {
		o.BatchSize = 1000
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	q, err := quoteTable(o.Table)
	if err != nil {
		return 0, err
	}
	sql := fmt.Sprintf(cleanupProcessedSQL, q)
	cutoff := o.Now().Add(-o.Retention)
	var total int64
	for batch := 0; o.MaxBatches == 0 || batch < o.MaxBatches; batch++ {
		tag, err := db.Exec(ctx, sql, cutoff, o.BatchSize)
		if err != nil {
			return total, fmt.Errorf("deleting processed events older than %s: %w", o.Retention, err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < int64(o.BatchSize) {
			break
		}
	}
	return total, nil
}
