package outbox

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outbox-dev/outbox-operator/internal/testenv"
)

// TestWarmAllocatorWarmsSessionsThatClaim: in a pool of SessionSettings
// with WarmAllocator, a session runs the warm-up statement the first time
// it is acquired for a claim (ForClaims), and only then: not when it
// connects, not for other work, not a second time. What a session ran last
// is read from pg_stat_activity on another connection; the pool has one
// session, so each acquisition gets the same one.
func TestWarmAllocatorWarmsSessionsThatClaim(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := testenv.Postgres(t)
	other, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer func() { _ = other.Close(ctx) }()

	for _, warm := range []bool{false, true} {
		cfg, err := PoolConfig(dsn, SessionSettings{WarmAllocator: warm}, 1)
		require.NoError(t, err)
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		require.NoError(t, err)
		defer pool.Close()

		// last acquires the session with ctx, and reports the last
		// statement it ran before this acquisition.
		last := func(ctx context.Context) string {
			t.Helper()
			c, err := pool.Acquire(ctx)
			require.NoError(t, err)
			defer c.Release()
			var q string
			require.NoError(t, other.QueryRow(ctx, `SELECT query FROM pg_stat_activity WHERE pid = $1`,
				c.Conn().PgConn().PID()).Scan(&q))
			return q
		}
		require.Empty(t, last(ctx), "nothing runs when the session connects")
		if !warm {
			require.Empty(t, last(ForClaims(ctx)), "no warm-up without WarmAllocator")
			continue
		}
		require.Equal(t, warmAllocatorSQL, last(ForClaims(ctx)), "the first claim's acquisition warms the session")
		_, err = pool.Exec(ctx, `SELECT 1`)
		require.NoError(t, err)
		require.Equal(t, "SELECT 1", last(ForClaims(ctx)), "a session is warmed once")
	}
}

// TestWarmForClaims: WarmForClaims leaves n sessions in the pool, each
// warmed (the warm-up is the last statement each ran).
func TestWarmForClaims(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := testenv.Postgres(t)
	cfg, err := PoolConfig(dsn, SessionSettings{WarmAllocator: true}, 4)
	require.NoError(t, err)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer pool.Close()

	WarmForClaims(ctx, pool, 2)
	require.EqualValues(t, 2, pool.Stat().TotalConns())
	other, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer func() { _ = other.Close(ctx) }()
	rows, err := other.Query(ctx, `SELECT query FROM pg_stat_activity
		WHERE datname = current_database() AND pid <> pg_backend_pid()`)
	require.NoError(t, err)
	last, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{warmAllocatorSQL, warmAllocatorSQL}, last, "each session ran the warm-up last")
}
