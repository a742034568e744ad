package relay

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-dev/outbox-operator/internal/outbox"
)

// TestRetriedDeadLetterIsInALaterResetsWindow: a parked row keeps the
// dispatch time of its parking. Published again by a retry much later, its
// entry is as new as the retry, but its row said it was dispatched long
// before: a stream reset after the retry replayed the rows dispatched in its
// window and left this one out (and cleanup could delete it as old). The
// retry now moves the row's dispatch time to its own. A review raised it.
func TestRetriedDeadLetterIsInALaterResetsWindow(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	ctx := context.Background()
	var big string
	require.NoError(t, b.db.QueryRow(ctx, `INSERT INTO outbox_events (event_type, payload)
		VALUES ('t', repeat('x', 2048)) RETURNING id::text`).Scan(&big))
	b.insert(t, 3)
	b.drain(t, b.newRelay(t, Config{MaxPayloadBytes: 1024}))
	require.Len(t, b.deadLetters(t), 1)
	_, err := b.db.Exec(ctx, `UPDATE outbox_events SET dispatched_at = now() - interval '2 hours' WHERE id = $1`, big)
	require.NoError(t, err) // parked two hours ago

	res, err := Retry(ctx, b.table, b.db, b.rdb, RetryOptions{Filter: outbox.DeadLetterFilter{}, MaxPayloadBytes: 4096})
	require.NoError(t, err)
	require.Len(t, res.Republished, 1)
	var age time.Duration
	require.NoError(t, b.db.QueryRow(ctx, `SELECT now() - dispatched_at FROM outbox_events WHERE id = $1`, big).Scan(&age))
	require.Less(t, age, time.Minute, "the retried row keeps the dispatch time of its parking")

	// Redis loses the stream after the retry; the reset's window is the
	// last minutes.
	require.NoError(t, b.rdb.Del(ctx, b.stream).Err())
	_, err = Replay(ctx, b.table, b.db, b.rdb, ReplayOptions{Stream: b.stream,
		Since: time.Now().Add(-10 * time.Minute), Until: time.Now().Add(time.Minute), MaxPayloadBytes: 4096})
	require.NoError(t, err)
	require.True(t, slices.ContainsFunc(b.readStream(t, b.stream), func(e entry) bool { return e[FieldEventID] == big }),
		"the retried event, lost with the stream, was not replayed")
}

// TestRetryOfADeadLetterWhoseIDIsNoRowOfTheTable: a dead letter whose event
// id is no value of the table's id column (parked by hand, or by a relay of
// another table) is retried like any other: there is no row whose dispatch
// time to move, which is no error.
func TestRetryOfADeadLetterWhoseIDIsNoRowOfTheTable(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	ctx := context.Background()
	require.NoError(t, b.table.EnsureDeadLetterTable(ctx, b.db))
	_, err := b.db.Exec(ctx, `INSERT INTO outbox_events_dead_letters (event_id, event_type, payload, created_at, stream, reason)
		VALUES ('1', 't', '{}', now(), $1, 'parked by the test')`, b.stream)
	require.NoError(t, err)
	res, err := Retry(ctx, b.table, b.db, b.rdb, RetryOptions{Filter: outbox.DeadLetterFilter{}})
	require.NoError(t, err)
	require.Len(t, res.Republished, 1)
	require.Empty(t, b.deadLetters(t))
}
