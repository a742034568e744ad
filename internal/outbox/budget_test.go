package outbox

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestClaimStopsAtTheByteBudget: a claim whose rows add up to more than
// Limit.Bytes returns none of them and says how many fit; once its
// transaction rolls back every row is pending again, and a claim of that
// many takes exactly the rows that fit, in order. A row larger than the
// budget on its own is still claimed, alone: never left behind.
func TestClaimStopsAtTheByteBudget(t *testing.T) {
	t.Parallel()
	tbl := MustNew("", Columns{})
	// Six rows of 1,000-byte payloads (the sizes add the id and the type
	// too: a few bytes each), one of 10,000, one of 1,000.
	db := connect(t, tbl.DDL(DDLOptions{})+`
		INSERT INTO outbox_events (event_type, payload, created_at)
			SELECT 't', repeat('x', 1000), '2026-01-01'::timestamptz + g * interval '1 second' FROM generate_series(1, 6) g;
		INSERT INTO outbox_events (event_type, payload, created_at)
			VALUES ('t', repeat('y', 10000), '2026-01-02'), ('t', repeat('z', 1000), '2026-01-03');`)
	ctx := context.Background()
	claim := func(limit Limit) ([]Event, error) {
		tx, err := db.Begin(ctx)
		require.NoError(t, err)
		events, err := tbl.Claim(ctx, tx, MarkDispatched, limit)
		if err != nil {
			require.NoError(t, tx.Rollback(ctx))
			return nil, err
		}
		require.NoError(t, tx.Commit(ctx))
		return events, nil
	}
	pending := func() (n int) {
		require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM outbox_events WHERE dispatched_at IS NULL`).Scan(&n))
		return n
	}

	_, err := claim(Limit{Rows: 8, Bytes: 2500})
	var over *OverBudgetError
	require.ErrorAs(t, err, &over)
	require.Equal(t, OverBudgetError{Fit: 2, Budget: 2500}, *over)
	require.Equal(t, 8, pending(), "the claim over its budget was rolled back whole")

	events, err := claim(Limit{Rows: over.Fit, Bytes: 2500})
	require.NoError(t, err)
	require.Len(t, events, 2)
	require.LessOrEqual(t, events[0].Size()+events[1].Size(), 2500)
	require.Equal(t, 6, pending())

	events, err = claim(Limit{Rows: 4, Bytes: 5000})
	require.NoError(t, err, "four rows of about 1,000 bytes fit in 5,000")
	require.Len(t, events, 4)

	_, err = claim(Limit{Rows: 10, Bytes: 5000})
	require.ErrorAs(t, err, &over, "the row of 10,000 bytes is over any budget of 5,000")
	require.Equal(t, 1, over.Fit, "a row larger than the budget fits alone")
	events, err = claim(Limit{Rows: 1, Bytes: 5000})
	require.NoError(t, err)
	require.Len(t, events, 1)
	require.Equal(t, 10000, len(events[0].Payload))
	events, err = claim(Limit{Rows: 10, Bytes: 1})
	require.NoError(t, err, "the last row, over a budget of 1 byte: alone, and nothing after it")
	require.Len(t, events, 1)
	require.Equal(t, 0, pending())

	events, err = claim(Limit{Rows: 10, Bytes: 1})
	require.False(t, errors.As(err, &over), "nothing pending is never over a budget: %v", err)
	require.Empty(t, events)
}

// TestPagesStayWithinTheByteBudget: the readers of many rows (the
// catch-up's FETCHes, the replay's one statement) hand them over in pages
// within the byte budget as well as the row count, in order, each row
// once, a row larger than the budget in a page of its own.
func TestPagesStayWithinTheByteBudget(t *testing.T) {
	t.Parallel()
	tbl := MustNew("", Columns{})
	db := connect(t, tbl.DDL(DDLOptions{})+`
		INSERT INTO outbox_events (event_type, payload, created_at)
			SELECT 't', g || repeat('x', CASE WHEN g = 4 THEN 5000 ELSE 1000 END), '2026-01-01'::timestamptz + g * interval '1 second'
			FROM generate_series(1, 7) g;`)
	ctx := context.Background()
	limit := Limit{Rows: 3, Bytes: 2500}
	var sizes []int
	var order []string
	pages := func(page []Event) error {
		sizes = append(sizes, len(page))
		size := 0
		for _, e := range page {
			order = append(order, e.Payload[:1])
			size += e.Size()
		}
		require.LessOrEqual(t, len(page), limit.Rows)
		if len(page) > 1 {
			require.LessOrEqual(t, size, limit.Bytes, "a page of %d events", len(page))
		}
		return nil
	}
	wantOrder := []string{"1", "2", "3", "4", "5", "6", "7"}

	_, err := tbl.CatchUp(ctx, db, nil, nil, limit, pages)
	require.NoError(t, err)
	require.Equal(t, wantOrder, order, "catch-up: every row once, in order")
	// Its FETCHes start at one row and grow to what fits: 1, then 2
	// (2 3), 2 (4 | 5), 1 (6), 2 (7, the end).
	require.Equal(t, []int{1, 2, 1, 1, 1, 1}, sizes, "catch-up pages")

	sizes, order = nil, nil
	require.NoError(t, tbl.Created(ctx, db, time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC),
		limit, pages))
	require.Equal(t, wantOrder, order, "replay: every row once, in order")
	require.Equal(t, []int{2, 1, 1, 2, 1}, sizes, "replay pages: 1 2 | 3 | 4 (5,000 bytes) | 5 6 | 7")
}
