package outbox

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestClaimDeletesOnDispatch: the deleting claim takes the oldest pending
// rows like the marking one, and they are gone only once the claim's
// transaction commits; a rollback gives every row back. Rows another mode
// marked dispatched are never taken. The backlog is the rows left.
func TestClaimDeletesOnDispatch(t *testing.T) {
	t.Parallel()
	tbl := MustNew("", Columns{})
	db := connect(t, tbl.DDL(DDLOptions{})+`
		INSERT INTO outbox_events (event_type, payload, created_at)
			SELECT 't', 'p' || g, '2026-01-01'::timestamptz + g * interval '1 second' FROM generate_series(1, 10) g;
		INSERT INTO outbox_events (event_type, payload, created_at, dispatched_at)
			VALUES ('t', 'marked', '2025-01-01', now());`)
	ctx := context.Background()
	count := func() (n int) {
		require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM outbox_events`).Scan(&n))
		return n
	}

	tx, err := db.Begin(ctx)
	require.NoError(t, err)
	events, err := tbl.Claim(ctx, tx, DeleteOnDispatch, Rows(4))
	require.NoError(t, err)
	require.Equal(t, []string{"p1", "p2", "p3", "p4"}, payloads(events))
	require.Equal(t, 11, count(), "deleted rows stay until the claim commits")
	require.NoError(t, tx.Rollback(ctx))
	require.Equal(t, 11, count(), "a rollback gives the rows back")

	tx, err = db.Begin(ctx)
	require.NoError(t, err)
	events, err = tbl.Claim(ctx, tx, DeleteOnDispatch, Rows(4))
	require.NoError(t, err)
	require.Equal(t, []string{"p1", "p2", "p3", "p4"}, payloads(events), "the same rows again, after the rollback")
	// A concurrent claim skips the locked rows, it does not wait for them.
	other, err := db.Begin(ctx)
	require.NoError(t, err)
	next, err := tbl.Claim(ctx, other, DeleteOnDispatch, Rows(100))
	require.NoError(t, err)
	require.Equal(t, []string{"p5", "p6", "p7", "p8", "p9", "p10"}, payloads(next), "the rest, never the marked row")
	require.NoError(t, other.Rollback(ctx))
	require.NoError(t, tx.Commit(ctx))
	require.Equal(t, 7, count(), "the claimed rows are gone; the marked one stays")

	b, err := tbl.Backlog(ctx, db)
	require.NoError(t, err)
	require.Equal(t, int64(6), b.Count, "the backlog counts the pending rows, never the marked one")
}

// TestDeletingClaimOnPartitions: on every partitioned shape, the deleting
// claim removes exactly the rows it returned, however the ctids overlap.
func TestDeletingClaimOnPartitions(t *testing.T) {
	t.Parallel()
	for name, ddl := range partitionedShapes {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			tbl := MustNew("", Columns{})
			db := connect(t, ddl)
			fillShape(t, db, name, 20)
			ctx := context.Background()
			var pending, all int
			require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FILTER (WHERE dispatched_at IS NULL), count(*) FROM outbox_events`).
				Scan(&pending, &all))
			require.Positive(t, pending)
			tx, err := db.Begin(ctx)
			require.NoError(t, err)
			events, err := tbl.Claim(ctx, tx, DeleteOnDispatch, Rows(7))
			require.NoError(t, err)
			require.Len(t, events, min(7, pending))
			require.NoError(t, tx.Commit(ctx))
			var left int
			require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM outbox_events`).Scan(&left))
			require.Equal(t, all-len(events), left, "exactly the claimed rows are deleted")
			for _, e := range events {
				var n int
				require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM outbox_events WHERE id::text = $1`, e.ID).Scan(&n))
				require.Zero(t, n, "claimed row %s still there", e.ID)
			}
		})
	}
}

func payloads(events []Event) []string {
	out := make([]string, len(events))
	for i, e := range events {
		out[i] = e.Payload
	}
	return out
}
