package outbox

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// recordReset records a stream reset whose window starts ago before
// PostgreSQL's clock, as a relay does when Redis lost entries.
func recordReset(t *testing.T, tbl *Table, db Querier, ago time.Duration) {
	t.Helper()
	ctx := context.Background()
	now, err := Now(ctx, db)
	require.NoError(t, err)
	_, err = tbl.RecordStreamReset(ctx, db, StreamReset{Stream: "s", WindowStart: now.Add(-ago), WindowEnd: now, Reason: "test"}, now)
	require.NoError(t, err)
}

// hourlyDispatched is an outbox table of 10 rows, dispatched 1 to 10 hours
// ago (and a second), and a count of its rows.
func hourlyDispatched(t *testing.T) (*Table, *pgxpool.Pool, func() int) {
	t.Helper()
	tbl := MustNew("", Columns{})
	db := connect(t, tbl.DDL(DDLOptions{})+`
		INSERT INTO outbox_events (event_type, payload, created_at, dispatched_at)
			SELECT 't', g::text, now() - g * interval '1 hour', now() - g * interval '1 hour' + interval '1 second'
			FROM generate_series(1, 10) g;`)
	return tbl, db, func() (n int) {
		require.NoError(t, db.QueryRow(t.Context(), `SELECT count(*) FROM outbox_events`).Scan(&n))
		return n
	}
}

// TestCleanupKeepsTheRowsOfAResetNotReplayed: while a stream reset waits
// for its replay, cleanup keeps every row the replay would republish (those
// dispatched since its window's start), whatever the retention: deleted,
// their events would be in neither the stream nor the table. Rows
// dispatched before the window go as usual, and all of them once the reset
// is replayed. Without a stream-resets table nothing is held.
func TestCleanupKeepsTheRowsOfAResetNotReplayed(t *testing.T) {
	t.Parallel()
	tbl, db, count := hourlyDispatched(t)
	ctx := context.Background()
	_, err := db.Exec(ctx, `DROP TABLE outbox_events_stream_resets`)
	require.NoError(t, err)
	hold, err := tbl.ResetsHold(ctx, db, time.Hour)
	require.NoError(t, err)
	require.Nil(t, hold, "no stream-resets table: no hold")
	n, err := tbl.DeleteAllDispatched(ctx, db, 9*time.Hour+30*time.Minute, 3, nil)
	require.NoError(t, err)
	require.EqualValues(t, 1, n, "the row dispatched 10 hours ago")

	require.NoError(t, tbl.EnsureStreamResetsTable(ctx, db))
	recordReset(t, tbl, db, 6*time.Hour+30*time.Minute)
	hold, err = tbl.ResetsHold(ctx, db, time.Hour)
	require.NoError(t, err)
	require.NotNil(t, hold)
	require.True(t, hold.Pending)
	n, err = tbl.DeleteAllDispatched(ctx, db, 0, 3, nil)
	require.NoError(t, err)
	require.EqualValues(t, 3, n, "the rows dispatched 7 to 9 hours ago, before the window")
	require.Equal(t, 6, count(), "the rows dispatched in the window are kept")

	_, err = tbl.MarkStreamResetsReplayed(ctx, db, "s", time.Unix(0, 0), time.Now().Add(time.Hour), time.Now().Add(time.Hour))
	require.NoError(t, err)
	n, err = tbl.DeleteAllDispatched(ctx, db, 0, 3, nil)
	require.NoError(t, err)
	require.EqualValues(t, 6, n, "replayed, and a retention of 0 since: the hold is gone")
	require.Zero(t, count())
}

// TestCleanupKeepsAReplayedWindowForARetention: a replay republished the
// rows of its window, dispatched long before; a reset found later reaches
// back to that window, so cleanup keeps its rows for a retention after the
// replay ended, as it keeps any row for a retention after its dispatch. A
// replay that never ended (its process killed: replayed_at 'infinity')
// holds for a retention after it began.
func TestCleanupKeepsAReplayedWindowForARetention(t *testing.T) {
	t.Parallel()
	tbl, db, count := hourlyDispatched(t)
	ctx := context.Background()
	require.NoError(t, tbl.EnsureStreamResetsTable(ctx, db))
	recordReset(t, tbl, db, 6*time.Hour+30*time.Minute)
	_, err := tbl.MarkStreamResetsReplayed(ctx, db, "s", time.Unix(0, 0), time.Now().Add(time.Hour), time.Now().Add(time.Hour))
	require.NoError(t, err)

	hold, err := tbl.ResetsHold(ctx, db, time.Hour)
	require.NoError(t, err)
	require.NotNil(t, hold, "replayed less than the retention ago")
	require.False(t, hold.Pending)
	n, err := tbl.DeleteAllDispatched(ctx, db, time.Hour, 3, nil)
	require.NoError(t, err)
	require.EqualValues(t, 4, n, "the rows dispatched 7 to 10 hours ago, before the replayed window")
	require.Equal(t, 6, count(), "the rows of the replayed window stay")

	_, err = db.Exec(ctx, `UPDATE outbox_events_stream_resets SET replayed_at = replayed_at - interval '2 hours'`)
	require.NoError(t, err)
	hold, err = tbl.ResetsHold(ctx, db, time.Hour)
	require.NoError(t, err)
	require.Nil(t, hold, "replayed more than the retention ago")

	// A replay that began and never ended.
	_, err = db.Exec(ctx, `INSERT INTO outbox_events_stream_resets (stream, detected_at, window_start, window_end, reason, replayed_at)
		VALUES ('s', now() - interval '30 minutes', now() - interval '3 hours 30 minutes', now(), 'replay', 'infinity')`)
	require.NoError(t, err)
	n, err = tbl.DeleteAllDispatched(ctx, db, time.Hour, 3, nil)
	require.NoError(t, err)
	require.EqualValues(t, 3, n, "the rows dispatched 4 to 6 hours ago, before the unended replay's window")
	require.Equal(t, 3, count())
	_, err = db.Exec(ctx, `UPDATE outbox_events_stream_resets SET detected_at = detected_at - interval '1 hour'`)
	require.NoError(t, err)
	n, err = tbl.DeleteAllDispatched(ctx, db, time.Hour, 3, nil)
	require.NoError(t, err)
	require.EqualValues(t, 2, n, "a retention after the unended replay began, only the row of the last hour stays")
}

// TestDropPartitionsKeepsTheRowsOfAResetNotReplayed: a partition holding a
// row dispatched in the window of a reset not replayed is not dropped.
func TestDropPartitionsKeepsTheRowsOfAResetNotReplayed(t *testing.T) {
	t.Parallel()
	tbl := MustNew("", Columns{})
	db := connect(t, rangePartitionedDDL(tbl))
	ctx := context.Background()
	_, err := db.Exec(ctx, `INSERT INTO outbox_events (event_type, payload, created_at, dispatched_at) VALUES
		('m', '1', '2025-01-02', now() - interval '3 days'), ('m', '2', '2025-01-03', now() - interval '2 days')`)
	require.NoError(t, err)
	require.NoError(t, tbl.EnsureStreamResetsTable(ctx, db))
	recordReset(t, tbl, db, 50*time.Hour)

	dropped, _, err := tbl.DropDispatchedPartitions(ctx, db, db, time.Hour)
	require.NoError(t, err)
	require.NotContains(t, dropped, "public.outbox_events_old", "a row dispatched in the window")

	_, err = tbl.MarkStreamResetsReplayed(ctx, db, "s", time.Unix(0, 0), time.Now().Add(time.Hour), time.Now().Add(time.Hour))
	require.NoError(t, err)
	dropped, _, err = tbl.DropDispatchedPartitions(ctx, db, db, time.Hour)
	require.NoError(t, err)
	require.NotContains(t, dropped, "public.outbox_events_old", "replayed less than the retention ago")

	_, err = db.Exec(ctx, `UPDATE outbox_events_stream_resets SET replayed_at = replayed_at - interval '2 hours'`)
	require.NoError(t, err)
	dropped, _, err = tbl.DropDispatchedPartitions(ctx, db, db, time.Hour)
	require.NoError(t, err)
	require.Contains(t, dropped, "public.outbox_events_old", "replayed a retention ago: dropped")
}
