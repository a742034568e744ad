package outbox

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outbox-dev/outbox-operator/internal/testenv"
)

// connect opens a pool on a fresh database with the given DDL applied.
func connect(t *testing.T, ddl string) *pgxpool.Pool {
	t.Helper()
	cfg, err := PoolConfig(testenv.Postgres(t), SessionSettings{StatementTimeout: 10 * time.Second}, 4)
	require.NoError(t, err)
	db, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(db.Close)
	if ddl != "" {
		_, err = db.Exec(context.Background(), ddl)
		require.NoError(t, err)
	}
	return db
}

func TestDDLIsIdempotentAndCreatesTheIndexAndTrigger(t *testing.T) {
	t.Parallel()
	tbl := MustNew("app.outbox", Columns{})
	ddl := tbl.DDL(DDLOptions{Notify: true})
	db := connect(t, ddl)
	ctx := context.Background()
	_, err := db.Exec(ctx, ddl)
	require.NoError(t, err, "applying twice")

	var indexDef string
	require.NoError(t, db.QueryRow(ctx, `SELECT indexdef FROM pg_indexes WHERE schemaname = 'app' AND indexname = $1`,
		tbl.PendingIndexName()).Scan(&indexDef))
	require.Contains(t, indexDef, "WHERE (dispatched_at IS NULL)")
	has, err := tbl.HasNotifyTrigger(ctx, db)
	require.NoError(t, err)
	require.True(t, has)
	exists, err := tbl.Exists(ctx, db)
	require.NoError(t, err)
	require.True(t, exists)
}

func TestBacklog(t *testing.T) {
	t.Parallel()
	tbl := MustNew("", Columns{})
	db := connect(t, tbl.DDL(DDLOptions{}))
	ctx := context.Background()

	b, err := tbl.Backlog(ctx, db)
	require.NoError(t, err)
	require.Equal(t, Backlog{}, b)
	require.Zero(t, b.Age(time.Now()))

	oldest := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	_, err = db.Exec(ctx, `INSERT INTO outbox_events (event_type, payload, created_at, dispatched_at) VALUES
		('a', '1', $1, NULL), ('a', '2', $1 + interval '1 minute', NULL), ('a', '3', $1 - interval '1 day', now())`, oldest)
	require.NoError(t, err)
	b, err = tbl.Backlog(ctx, db)
	require.NoError(t, err)
	require.EqualValues(t, 2, b.Count)
	require.NotNil(t, b.Oldest)
	require.True(t, oldest.Equal(*b.Oldest), "oldest %s", b.Oldest)
	require.Equal(t, time.Hour, b.Age(oldest.Add(time.Hour)))

	// Counting stops at the limit; the oldest is still the oldest.
	for limit, want := range map[int64]Backlog{
		1: {Count: 1, Capped: true, Oldest: b.Oldest},
		2: {Count: 2, Oldest: b.Oldest},
		5: {Count: 2, Oldest: b.Oldest},
	} {
		got, err := tbl.BacklogUpTo(ctx, db, limit)
		require.NoError(t, err)
		require.Equal(t, want.Count, got.Count, "limit %d", limit)
		require.Equal(t, want.Capped, got.Capped, "limit %d", limit)
		require.True(t, oldest.Equal(*got.Oldest), "limit %d", limit)
	}
}

func TestTimestampWithoutTimeZoneIsReadAsUTC(t *testing.T) {
	t.Parallel()
	tbl := MustNew("", Columns{})
	// The reference implementation's layout: timestamp without time zone,
	// written with UTC wall-clock time.
	db := connect(t, `CREATE TABLE outbox_events (id uuid PRIMARY KEY, event_type varchar NOT NULL,
		payload text NOT NULL, created_at timestamp, dispatched_at timestamp NULL);
		INSERT INTO outbox_events VALUES (gen_random_uuid(), 'a', '1', '2026-05-06 07:08:09', NULL)`)
	b, err := tbl.Backlog(context.Background(), db)
	require.NoError(t, err)
	require.Equal(t, time.Date(2026, 5, 6, 7, 8, 9, 0, time.UTC), b.Oldest.UTC())
}

func TestMissingTableAndColumn(t *testing.T) {
	t.Parallel()
	db := connect(t, `CREATE TABLE outbox_events (id uuid, event_type text, payload text, created_at timestamptz)`)
	ctx := context.Background()

	_, err := MustNew("nope", Columns{}).Backlog(ctx, db)
	require.ErrorIs(t, err, ErrTableNotFound)
	require.ErrorContains(t, err, "nope")
	_, err = MustNew("missing_schema.outbox", Columns{}).Backlog(ctx, db)
	require.ErrorIs(t, err, ErrTableNotFound)
	_, err = MustNew("", Columns{}).Backlog(ctx, db) // no dispatched_at column
	require.ErrorIs(t, err, ErrColumnNotFound)

	exists, err := MustNew("nope", Columns{}).Exists(ctx, db)
	require.NoError(t, err)
	require.False(t, exists)
}

func TestDeleteAllDispatchedKeepsRecentAndPendingRows(t *testing.T) {
	t.Parallel()
	tbl := MustNew("", Columns{})
	db := connect(t, tbl.DDL(DDLOptions{}))
	ctx := context.Background()
	_, err := db.Exec(ctx, `INSERT INTO outbox_events (event_type, payload, created_at, dispatched_at)
		SELECT 'old', g::text, now() - interval '5 days', now() - interval '4 days' FROM generate_series(1, 25) g;
		INSERT INTO outbox_events (event_type, payload, created_at, dispatched_at)
		SELECT 'recent', g::text, now() - interval '1 hour', now() - interval '30 minutes' FROM generate_series(1, 3) g;
		INSERT INTO outbox_events (event_type, payload, created_at)
		SELECT 'pending', g::text, now() - interval '9 days' FROM generate_series(1, 4) g;`)
	require.NoError(t, err)

	var progress []int64
	n, err := tbl.DeleteAllDispatched(ctx, db, 72*time.Hour, 10, func(total int64) { progress = append(progress, total) })
	require.NoError(t, err)
	require.EqualValues(t, 25, n)
	require.Equal(t, []int64{10, 20, 25}, progress, "bounded batches of 10")

	rows, err := db.Query(ctx, `SELECT event_type, count(*) FROM outbox_events GROUP BY 1 ORDER BY 1`)
	require.NoError(t, err)
	left, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (string, error) {
		var typ string
		var c int
		err := r.Scan(&typ, &c)
		return typ + "=" + itoa(c), err
	})
	require.NoError(t, err)
	require.Equal(t, []string{"pending=4", "recent=3"}, left)
}

func TestInsertStatements(t *testing.T) {
	t.Parallel()
	tbl := MustNew("", Columns{})
	db := connect(t, tbl.DDL(DDLOptions{}))
	ctx := context.Background()
	_, err := db.Exec(ctx, tbl.InsertSQL(), "6f1c8a52-3b1e-4f7e-9d43-2f0a8c1b7e11", "t", `{"a":1}`)
	require.NoError(t, err)
	var id string
	require.NoError(t, db.QueryRow(ctx, tbl.InsertDefaultIDSQL(), "t", `{"a":2}`).Scan(&id))
	require.Len(t, id, 36)
	b, err := tbl.Backlog(ctx, db)
	require.NoError(t, err)
	require.EqualValues(t, 2, b.Count)
}

func itoa(i int) string { return strconv.Itoa(i) }

// TestIdentity: one table has one identity whatever its spelling (the
// keys of ordering Strict and PerKey), and the default spelling keeps its
// name: unqualified in public, qualified elsewhere, also when a session's
// search_path finds it unqualified.
func TestIdentity(t *testing.T) {
	t.Parallel()
	db := connect(t, MustNew("", Columns{}).DDL(DDLOptions{})+MustNew("app.outbox", Columns{}).DDL(DDLOptions{}))
	ctx := context.Background()
	for spelled, want := range map[string]string{
		"outbox_events": "outbox_events", "public.outbox_events": "outbox_events", "app.outbox": "app.outbox",
	} {
		got, err := MustNew(spelled, Columns{}).Identity(ctx, db)
		require.NoError(t, err)
		require.Equal(t, want, got, spelled)
	}
	conn, err := db.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, `SET search_path = app, public`)
	require.NoError(t, err)
	got, err := MustNew("outbox", Columns{}).Identity(ctx, conn)
	require.NoError(t, err)
	require.Equal(t, "app.outbox", got, "found by the search_path")
	_, err = conn.Exec(ctx, `RESET search_path`)
	require.NoError(t, err)

	for _, missing := range []string{"outbox", "nosuch.outbox_events"} {
		_, err = MustNew(missing, Columns{}).Identity(ctx, db)
		require.ErrorIs(t, err, ErrTableNotFound, missing)
	}
}

// TestBacklogWithInfiniteCreatedAt: a pending row whose created_at is
// 'infinity' or '-infinity' (a timestamp type's special values) is a row
// like any other: the claim publishes it, so the backlog must measure it.
// Before, min(created_at) could not be scanned into a time.Time, every
// check failed while such a row was pending (the operator's
// DatabaseUnreachable, its scaling frozen, the backlog unknown).
func TestBacklogWithInfiniteCreatedAt(t *testing.T) {
	t.Parallel()
	tbl := MustNew("", Columns{})
	db := connect(t, tbl.DDL(DDLOptions{}))
	ctx := context.Background()

	_, err := db.Exec(ctx, `INSERT INTO outbox_events (event_type, payload, created_at) VALUES ('a', '1', 'infinity')`)
	require.NoError(t, err)
	b, err := tbl.BacklogUpTo(ctx, db, 10)
	require.NoError(t, err, "a row created at infinity")
	require.EqualValues(t, 1, b.Count)
	require.Nil(t, b.Oldest, "a row created at infinity has no age yet")
	require.Zero(t, b.Age(time.Now()))

	_, err = db.Exec(ctx, `INSERT INTO outbox_events (event_type, payload, created_at) VALUES ('a', '2', '-infinity')`)
	require.NoError(t, err)
	b, err = tbl.BacklogUpTo(ctx, db, 10)
	require.NoError(t, err, "a row created at -infinity")
	require.EqualValues(t, 2, b.Count)
	require.NotNil(t, b.Oldest, "a row created at -infinity is older than any")
	require.Greater(t, b.Age(time.Now()), 24*time.Hour*365)
}
