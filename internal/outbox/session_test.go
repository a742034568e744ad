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

// TestClaimTextIgnoresTheDatabasesOutputSettings: the claim reads every
// column as text (id::text, key::text), and a column's text follows the
// session's output settings, which a database or role may set
// (ALTER DATABASE ... SET bytea_output = 'escape'). The relay's sessions pin
// them, so an event's id and key are the same text whoever set what: here a
// bytea id (a binary UUID or ULID) and a date key, whose partition is the
// hash of that same text.
func TestClaimTextIgnoresTheDatabasesOutputSettings(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := testenv.Postgres(t)
	admin, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer func() { _ = admin.Close(ctx) }()
	_, err = admin.Exec(ctx, `DO $$ BEGIN
		EXECUTE format('ALTER DATABASE %I SET bytea_output = %L', current_database(), 'escape');
		EXECUTE format('ALTER DATABASE %I SET DateStyle = %L', current_database(), 'SQL, DMY');
		EXECUTE format('ALTER DATABASE %I SET IntervalStyle = %L', current_database(), 'sql_standard');
		EXECUTE format('ALTER DATABASE %I SET extra_float_digits = %L', current_database(), '-3');
	END $$;
	CREATE TABLE outbox_events (id bytea PRIMARY KEY, event_type text NOT NULL, payload text NOT NULL,
		day date, created_at timestamptz NOT NULL DEFAULT now(), dispatched_at timestamptz);
	INSERT INTO outbox_events (id, event_type, payload, day) VALUES ('\x01a2ff', 't', 'p', '2026-12-25')`)
	require.NoError(t, err)

	tbl := MustNew("", Columns{Key: "day"})
	cfg, err := PoolConfig(dsn, SessionSettings{}, 1)
	require.NoError(t, err)
	pool, err := pgxpool.NewWithConfig(ctx, cfg) // sessions opened after the ALTERs: they get the database's settings
	require.NoError(t, err)
	defer pool.Close()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	const partitions = 1024
	all := make([]int64, partitions)
	for i := range all {
		all[i] = int64(i)
	}
	events, err := tbl.ClaimKeyed(ctx, tx, MarkDispatched, Rows(10), partitions, all)
	require.NoError(t, err)
	require.Len(t, events, 1)
	require.Equal(t, `\x01a2ff`, events[0].ID, "bytea_output hex, PostgreSQL's default")
	require.Equal(t, "2026-12-25", events[0].Key, "DateStyle ISO, PostgreSQL's default")
	var want int
	require.NoError(t, admin.QueryRow(ctx, `SELECT (hashtextextended('2026-12-25', 0) & 9223372036854775807) % $1`,
		partitions).Scan(&want))
	require.Equal(t, want, events[0].Partition, "the partition of the ISO text")
}
