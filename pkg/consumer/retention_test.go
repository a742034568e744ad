package consumer

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestRequiredRetention(t *testing.T) {
	t.Parallel()
	cfg := Config{}
	// Defaults: 5 deliveries x (1m idle + 15s claim interval + 30s handler).
	require.Equal(t, 5*(time.Minute+15*time.Second+30*time.Second), cfg.RedeliveryWindow())
	require.Equal(t, 73*time.Hour, RequiredRetention(cfg, 72*time.Hour), "the outbox's cleanup retention bounds replays")
	slow := Config{MaxDeliveries: 100, MinIdle: time.Hour}
	require.Greater(t, RequiredRetention(slow, time.Hour), 100*time.Hour)
	require.Equal(t, 5*time.Minute+time.Hour, RequiredRetention(Config{MaxDeliveries: 1, MinIdle: time.Second}, 0))
	require.GreaterOrEqual(t, DefaultProcessedRetention, RequiredRetention(cfg, 72*time.Hour))
}

// TestCleanupProcessed runs the batched cleanup on a real PostgreSQL: old
// rows go in batches, recent ones stay, a row another transaction holds is
// skipped, and a retention below the rule is refused.
func TestCleanupProcessed(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	ctx := context.Background()
	now := time.Now()
	_, err := b.db.Exec(ctx, `INSERT INTO processed_events (event_id, processed_at)
SELECT 'old-' || g, $1::timestamptz - g * interval '1 second' FROM generate_series(1, 2500) g`, now.Add(-8*24*time.Hour))
	require.NoError(t, err)
	_, err = b.db.Exec(ctx, `INSERT INTO processed_events (event_id, processed_at)
SELECT 'new-' || g, $1::timestamptz FROM generate_series(1, 10) g`, now.Add(-time.Hour))
	require.NoError(t, err)

	_, err = CleanupProcessed(ctx, b.db, CleanupOptions{Retention: time.Hour, MinRetention: RequiredRetention(Config{}, 72*time.Hour)})
	require.ErrorContains(t, err, "below the required")
	_, err = CleanupProcessed(ctx, b.db, CleanupOptions{})
	require.Error(t, err)

	// A consumer holds one old row in an open transaction.
	tx, err := b.db.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `SELECT 1 FROM processed_events WHERE event_id = 'old-1' FOR UPDATE`)
	require.NoError(t, err)

	clock := func() time.Time { return now }
	n, err := CleanupProcessed(ctx, b.db, CleanupOptions{Retention: DefaultProcessedRetention, BatchSize: 1000, Now: clock})
	require.NoError(t, err)
	require.Equal(t, int64(2499), n, "every old row but the one held")
	require.NoError(t, tx.Rollback(ctx))

	n, err = CleanupProcessed(ctx, b.db, CleanupOptions{Retention: DefaultProcessedRetention, MaxBatches: 1, Now: clock})
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	var left int
	require.NoError(t, b.db.QueryRow(ctx, `SELECT count(*) FROM processed_events`).Scan(&left))
	require.Equal(t, 10, left, "recent rows stay")
}
