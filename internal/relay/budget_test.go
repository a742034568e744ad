package relay

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outbox-dev/outbox-operator/internal/outbox"
)

// TestLargeRowsAreClaimedWithinTheByteBudget: 100 small rows, then 60 rows
// of 20,000-byte payloads, a batch size of 500 and a budget of 64 KiB. The
// claims grow from one row (slow start) over the small rows; the first
// claim that reaches the large ones reads past the budget and is made
// again with the rows that fit, and from then on each batch holds at most
// three large rows (60,000 bytes), not the whole outbox. Every event
// arrives once, in order, for ordering None and Strict alike (a claim over
// budget is rolled back before anything after it is claimed).
func TestLargeRowsAreClaimedWithinTheByteBudget(t *testing.T) {
	t.Parallel()
	for _, ordering := range []Ordering{OrderingNone, OrderingStrict} {
		t.Run(string(ordering), func(t *testing.T) {
			t.Parallel()
			b := setup(t, bundleOpts{})
			_, err := b.db.Exec(context.Background(), `INSERT INTO outbox_events (event_type, payload, created_at)
				SELECT 'order_created', '"' || g || repeat('x', CASE WHEN g > 100 THEN 20000 ELSE 100 END) || '"',
					now() - interval '1 hour' + g * interval '1 ms'
				FROM generate_series(1, 160) g`)
			require.NoError(t, err)
			ids := b.allIDs(t)
			r := b.newRelay(t, Config{Ordering: ordering, BatchSize: 500, BatchBytes: MinBatchBytes})
			runInBackground(t, r)
			large := 0

			waitFor(t, "the backlog drained", func() bool { return b.backlog(t) == 0 })
			entries := b.readStream(t, b.stream)
			requireEachOnce(t, entries, ids)
			for i, e := range entries {
				require.Equal(t, ids[i], e[FieldEventID], "entry %d out of order", i)
				if len(e[FieldPayload]) > 1000 {
					large++
				}
			}
			require.Equal(t, 60, large)
			require.GreaterOrEqual(t, testutilCounter(r.cfg.Metrics.ClaimsOverBudget), 1.0)
			batches := testutilCounter(r.cfg.Metrics.Batches)
			require.GreaterOrEqual(t, batches, 20.0, "60 large rows at most 3 to a batch")
			require.Less(t, testutilCounter(r.cfg.Metrics.ClaimsOverBudget), batches/2,
				"the claims stay within the budget once they know the rows' size")
		})
	}
}

// TestRetryPageFitting: a retry's page ends before the row whose payload
// would pass the budget, takes at least one row, and counts no bytes for a
// payload it does not read (NULL, or over the payload limit).
func TestRetryPageFitting(t *testing.T) {
	t.Parallel()
	parked := func(sizes ...int64) []outbox.DeadLetter {
		out := make([]outbox.DeadLetter, len(sizes))
		for i, s := range sizes {
			if s >= 0 {
				out[i].PayloadBytes = &s
			}
		}
		return out
	}
	for _, c := range []struct {
		name  string
		sizes []int64 // -1: NULL
		want  int
	}{
		{"all fit", []int64{10, 20, 30}, 3},
		{"exactly the budget", []int64{50, 50, 1}, 2},
		{"the first alone, over the budget", []int64{150, 1}, 1},
		{"cut before the row that passes it", []int64{40, 40, 40}, 2},
		{"NULL and over the limit read nothing", []int64{-1, 5000, 90, -1, 5000, 10, 1}, 6},
		{"none", nil, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			require.Equal(t, c.want, retryPageFitting(parked(c.sizes...), 1000, 100))
		})
	}
}
