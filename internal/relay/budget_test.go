package relay

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
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
