package outbox

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestProgressAndBacklogSince: a slot's backlog is the rows created after
// its last published commit; without a progress row every row counts. The
// recorded commit never goes back, and a catch-up stays due until done.
func TestProgressAndBacklogSince(t *testing.T) {
	t.Parallel()
	tbl := MustNew("", Columns{})
	db := connect(t, tbl.DDL(DDLOptions{})+`
		INSERT INTO outbox_events (event_type, payload, created_at)
			SELECT 't', 'p' || g, '2026-01-01'::timestamptz + g * interval '1 minute' FROM generate_series(1, 10) g;`)
	ctx := context.Background()
	require.NoError(t, tbl.EnsureProgressTable(ctx, db))

	b, err := tbl.BacklogSince(ctx, db, "s", 0)
	require.NoError(t, err)
	require.EqualValues(t, 10, b.Count, "no progress yet: every row")

	require.NoError(t, tbl.StartCatchUp(ctx, db, "s"))
	p, ok, err := tbl.ReadProgress(ctx, db, "s")
	require.NoError(t, err)
	require.True(t, ok)
	require.True(t, p.CatchUpPending)
	require.Nil(t, p.LastCommit)

	at := func(m int) time.Time { return time.Date(2026, 1, 1, 0, m, 0, 0, time.UTC) }
	require.NoError(t, tbl.RecordProgress(ctx, db, "s", at(6), false))
	p, _, err = tbl.ReadProgress(ctx, db, "s")
	require.NoError(t, err)
	require.True(t, p.CatchUpPending, "still due until a catch-up says done")
	require.NoError(t, tbl.RecordProgress(ctx, db, "s", at(4), true))
	p, _, err = tbl.ReadProgress(ctx, db, "s")
	require.NoError(t, err)
	require.False(t, p.CatchUpPending)
	require.True(t, p.LastCommit.Equal(at(6)), "the commit never goes back: %s", p.LastCommit)

	b, err = tbl.BacklogSince(ctx, db, "s", 0)
	require.NoError(t, err)
	require.EqualValues(t, 4, b.Count, "rows 7 to 10")
	require.True(t, b.Oldest.Equal(at(7)), "oldest %s", b.Oldest)
	b, err = tbl.BacklogSince(ctx, db, "s", 2)
	require.NoError(t, err)
	require.EqualValues(t, 2, b.Count)
	require.True(t, b.Capped)

	// A catch-up's pages: [since, until], after the last row of a page.
	since := at(3)
	page, err := tbl.PendingSince(ctx, db, &since, at(8), nil, "", 4)
	require.NoError(t, err)
	require.Equal(t, []string{"p3", "p4", "p5", "p6"}, payloads(page))
	page, err = tbl.PendingSince(ctx, db, &since, at(8), &page[3].CreatedAt, page[3].ID, 4)
	require.NoError(t, err)
	require.Equal(t, []string{"p7", "p8"}, payloads(page))
}

// TestDeleteStreamed: the cleanup by age of a logical replication relay's
// table deletes rows older than the retention, never those within the
// margin before the slot's last published commit, and nothing without a
// recorded commit.
func TestDeleteStreamed(t *testing.T) {
	t.Parallel()
	tbl := MustNew("", Columns{})
	db := connect(t, tbl.DDL(DDLOptions{})+`
		INSERT INTO outbox_events (event_type, payload, created_at)
			SELECT 't', 'p' || g, now() - g * interval '1 hour' FROM generate_series(1, 10) g;`)
	ctx := context.Background()
	require.NoError(t, tbl.EnsureProgressTable(ctx, db))
	_, _, err := tbl.DeleteStreamed(ctx, db, "s", time.Hour, time.Minute, 3)
	require.ErrorIs(t, err, ErrNoProgress)

	now, err := Now(ctx, db)
	require.NoError(t, err)
	// Published up to 5h30 ago: with a margin of 1h, rows up to 6h30 ago may go.
	require.NoError(t, tbl.RecordProgress(ctx, db, "s", now.Add(-330*time.Minute), true))
	n, cutoff, err := tbl.DeleteStreamed(ctx, db, "s", 2*time.Hour, time.Hour, 3)
	require.NoError(t, err)
	require.EqualValues(t, 4, n, "rows 7h to 10h old, in batches of 3")
	require.WithinDuration(t, now.Add(-390*time.Minute), cutoff, time.Second)
	var left int
	require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM outbox_events`).Scan(&left))
	require.Equal(t, 6, left)
}
