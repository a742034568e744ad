package outbox

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestFrontier: a full batch moves the frontier to its last created_at, a
// short one (caught up) sends the next claim to the start, and so does a
// Reset (a failed batch) and the end of each Rescan.
func TestFrontier(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	batch := func(last time.Time, n int) []Event {
		events := make([]Event, n)
		for i := range events {
			events[i].CreatedAt = last.Add(time.Duration(i-n+1) * time.Microsecond)
		}
		return events
	}
	f := Frontier{Rescan: time.Second}
	_, ok := f.Next(t0)
	require.False(t, ok, "the first claim begins at the start")

	f.Claimed(batch(t0.Add(time.Hour), 3), 3, t0)
	from, ok := f.Next(t0.Add(10 * time.Millisecond))
	require.True(t, ok)
	require.Equal(t, t0.Add(time.Hour), from, "a full batch: the next claim begins at its last created_at")

	f.Claimed(batch(t0.Add(2*time.Hour), 3), 3, t0.Add(20*time.Millisecond))
	from, ok = f.Next(t0.Add(900 * time.Millisecond))
	require.True(t, ok)
	require.Equal(t, t0.Add(2*time.Hour), from)
	_, ok = f.Next(t0.Add(time.Second))
	require.False(t, ok, "a Rescan after the claims from a point began, the start again")

	f.Claimed(batch(t0.Add(3*time.Hour), 3), 3, t0.Add(time.Second))
	_, ok = f.Next(t0.Add(1500 * time.Millisecond))
	require.True(t, ok, "the Rescan counts again from the claim that left the start")

	f.Claimed(batch(t0.Add(4*time.Hour), 2), 3, t0.Add(1600*time.Millisecond))
	_, ok = f.Next(t0.Add(1700 * time.Millisecond))
	require.False(t, ok, "a short batch: caught up, the start again")

	f.Claimed(batch(t0.Add(5*time.Hour), 3), 3, t0.Add(1800*time.Millisecond))
	f.Reset()
	_, ok = f.Next(t0.Add(1900 * time.Millisecond))
	require.False(t, ok, "after a Reset, the start")

	f.Claimed(nil, 3, t0)
	_, ok = f.Next(t0)
	require.False(t, ok, "an empty claim")

	var d Frontier // Rescan 0: DefaultRescan
	d.Claimed(batch(t0, 1), 1, t0)
	_, ok = d.Next(t0.Add(DefaultRescan - time.Millisecond))
	require.True(t, ok)
	_, ok = d.Next(t0.Add(DefaultRescan))
	require.False(t, ok)
}

// TestClaimFromTakesRowsAtOrAfterFrom, on a timestamptz column and on the
// reference implementation's timestamp column: rows created before from
// stay pending, a row created at from is taken, and the batch is in
// created_at order like Claim's.
func TestClaimFromTakesRowsAtOrAfterFrom(t *testing.T) {
	t.Parallel()
	for _, typ := range []string{"timestamptz", "timestamp"} {
		t.Run(typ, func(t *testing.T) {
			t.Parallel()
			tbl := MustNew("", Columns{})
			db := connect(t, `CREATE TABLE outbox_events (id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
				event_type text NOT NULL, payload text NOT NULL, created_at `+typ+` NOT NULL, dispatched_at `+typ+` NULL);
				CREATE INDEX outbox_events_pending_idx ON outbox_events (created_at, id) WHERE dispatched_at IS NULL;
				INSERT INTO outbox_events (event_type, payload, created_at)
					SELECT 't', 'p' || g, '2026-01-01 00:00:00'::timestamp + g * interval '1 second' FROM generate_series(1, 10) g;`)
			ctx := context.Background()
			tx, err := db.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = tx.Rollback(ctx) }()
			from := time.Date(2026, 1, 1, 0, 0, 6, 0, time.UTC) // p6's created_at (UTC wall clock for timestamp)
			events, err := tbl.ClaimFrom(ctx, tx, MarkDispatched, Rows(3), from)
			require.NoError(t, err)
			require.Equal(t, []string{"p6", "p7", "p8"}, payloads(events))
			events, err = tbl.ClaimFrom(ctx, tx, MarkDispatched, Rows(10), from)
			require.NoError(t, err)
			require.Equal(t, []string{"p9", "p10"}, payloads(events), "the rest at or after from")
			events, err = tbl.Claim(ctx, tx, MarkDispatched, Rows(10))
			require.NoError(t, err)
			require.Equal(t, []string{"p1", "p2", "p3", "p4", "p5"}, payloads(events), "the rows before from, still pending")
		})
	}
}
