package logical

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/stretchr/testify/require"

	"github.com/outbox-dev/outbox-operator/internal/outbox"
	"github.com/outbox-dev/outbox-operator/internal/testenv"
)

func TestEventsComeInCommitOrder(t *testing.T) {
	t.Parallel()
	b := setup(t, testenv.Postgres(t), "", outbox.Columns{}, "")
	r := b.open(t)
	ctx := b.ctx

	// Two producers interleave: A inserts first but commits last.
	a, err := b.db.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = a.Rollback(context.WithoutCancel(ctx)) }()
	bb, err := b.db.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = bb.Rollback(context.WithoutCancel(ctx)) }()
	created := time.Date(2026, 1, 2, 3, 4, 5, 123456000, time.UTC)
	_, err = a.Exec(ctx, `INSERT INTO outbox_events (id, event_type, payload, created_at) VALUES ($1, 'order.created', '{"n":1}', $2)`,
		eventID(1), created)
	require.NoError(t, err)
	b.insert(t, bb, 2)
	b.insert(t, a, 3)
	b.insert(t, bb, 4)
	require.NoError(t, bb.Commit(ctx))
	b.insert(t, b.db, 5) // a transaction of its own, committed between the two
	require.NoError(t, a.Commit(ctx))

	events, batches := read(t, r, 5, 100)
	require.Equal(t, eventIDs(2, 4, 5, 1, 3), ids(events), "commit order; a transaction's inserts together, in order")
	require.Len(t, events, 5)
	e := events[3]
	require.Empty(t, e.Malformed)
	require.Equal(t, "order.created", e.Type)
	require.Equal(t, `{"n":1}`, e.Payload)
	require.True(t, created.Equal(e.CreatedAt), "created_at %s", e.CreatedAt)
	require.Equal(t, "t2", events[0].Type)
	require.WithinDuration(t, time.Now(), events[0].CreatedAt, time.Minute, "the default now()")

	last := batches[len(batches)-1]
	require.NotZero(t, last.Confirm, "the batch ends with a whole transaction")
	require.WithinDuration(t, time.Now(), last.LastCommit, time.Minute)

	// Confirm reaches the server, and refuses a position no batch gave.
	require.Error(t, r.Confirm(ctx, last.Confirm+1))
	require.NoError(t, r.Confirm(ctx, last.Confirm))
	require.NoError(t, r.Confirm(ctx, last.Confirm-1), "behind the confirmed position: nothing happens")
	require.Equal(t, last.Confirm, r.Confirmed())
	b.requireConfirmedFlush(t, last.Confirm)
}

func TestTimestampWithoutTimeZoneJSONBAndKey(t *testing.T) {
	t.Parallel()
	cols := outbox.Columns{ID: "seq", EventType: "kind", Payload: "body", CreatedAt: "at", DispatchedAt: "sent", Key: "agg"}
	b := setup(t, testenv.Postgres(t), "app.events", cols, `CREATE SCHEMA app;
		CREATE TABLE app.events (seq bigint PRIMARY KEY, kind varchar(40) NOT NULL, body jsonb NOT NULL,
			agg text, at timestamp NOT NULL, sent timestamp)`)
	r := b.open(t)
	_, err := b.db.Exec(b.ctx, `INSERT INTO app.events (seq, kind, body, agg, at) VALUES
		(42, 'a', '{"b": 1,  "a": [2]}', 'cart-7', '2026-01-02 03:04:05.5'),
		(43, 'b', 'null', NULL, '2026-07-01 00:00:00')`)
	require.NoError(t, err)
	events, _ := read(t, r, 2, 10)
	require.Equal(t, []string{"42", "43"}, ids(events))
	require.Equal(t, `{"a": [2], "b": 1}`, events[0].Payload, "jsonb in its canonical text, as ::text gives it")
	require.Equal(t, "cart-7", events[0].Key)
	require.Empty(t, events[1].Key, "a NULL key is the empty key, as the keyed claim's")
	require.True(t, time.Date(2026, 1, 2, 3, 4, 5, 500000000, time.UTC).Equal(events[0].CreatedAt), "at %s", events[0].CreatedAt)
	require.True(t, time.Date(2026, 7, 1, 0, 0, 0, 0, time.UTC).Equal(events[1].CreatedAt), "UTC, not the server's zone")
	require.Empty(t, events[0].Malformed)
	require.Equal(t, "null", events[1].Payload)
}

func TestUnconfirmedTailIsReplayed(t *testing.T) {
	t.Parallel()
	b := setup(t, testenv.Postgres(t), "", outbox.Columns{}, "")
	r := b.open(t)
	b.insert(t, b.db, 1, 2, 3)
	events, _ := read(t, r, 3, 10)
	require.Equal(t, eventIDs(1, 2, 3), ids(events))

	// The relay dies between reading and confirming: its connection is cut.
	require.NoError(t, r.conn.Conn().Close())
	r = b.open(t)
	events, batches := read(t, r, 3, 10)
	require.Equal(t, eventIDs(1, 2, 3), ids(events), "the unconfirmed events come again")

	require.NoError(t, r.Confirm(b.ctx, lastConfirm(batches).Confirm))
	require.NoError(t, r.Close(b.ctx))
	s, err := Status(b.ctx, b.db, b.opts.Slot)
	require.NoError(t, err)
	require.False(t, s.Active, "Close ends the stream in order: the slot is free when it returns")
	b.requireConfirmedFlush(t, lastConfirm(batches).Confirm)

	r = b.open(t) // Close released the slot: no wait
	b.insert(t, b.db, 4)
	events, _ = read(t, r, 1, 10)
	require.Equal(t, eventIDs(4), ids(events), "confirmed events do not come again")
}

func TestBigTransactionIsConfirmedAtItsEnd(t *testing.T) {
	t.Parallel()
	b := setup(t, testenv.Postgres(t), "", outbox.Columns{}, "")
	r := b.open(t)
	ctx := b.ctx

	b.insert(t, b.db, 0) // a small transaction first, confirmed
	_, batches := read(t, r, 1, 10)
	small := lastConfirm(batches).Confirm
	require.NoError(t, r.Confirm(ctx, small))

	tx, err := b.db.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	var before, after pglogrepl.LSN
	require.NoError(t, tx.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&before))
	big := make([]int, 25)
	for i := range big {
		big[i] = i + 1
	}
	b.insert(t, tx, big...)
	require.NoError(t, tx.Commit(ctx))
	require.NoError(t, b.db.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&after))
	require.LessOrEqual(t, small, before, "the small transaction ends where the big one may begin")

	// The transaction arrives whole at its commit: batches of 10, 10 and 5.
	events, batches := read(t, r, 25, 10)
	require.Equal(t, eventIDs(big...), ids(events))
	require.Len(t, batches, 3)
	require.Zero(t, batches[0].Confirm, "inside the transaction: nothing to confirm")
	require.True(t, batches[0].LastCommit.IsZero())
	require.Zero(t, batches[1].Confirm)
	require.Len(t, batches[2].Events, 5)
	end := batches[2].Confirm
	require.Greater(t, end, before, "the transaction's end")
	require.LessOrEqual(t, end, after)
	require.False(t, batches[2].LastCommit.IsZero())

	// Confirmed up to the small one only, a new reader replays the big
	// transaction from its start.
	require.NoError(t, r.Close(ctx))
	r = b.open(t)
	events, batches = read(t, r, 25, 100)
	require.Equal(t, eventIDs(big...), ids(events))
	require.Equal(t, end, lastConfirm(batches).Confirm)
	require.NoError(t, r.Confirm(ctx, end))
	b.requireConfirmedFlush(t, end)
}

func TestTableAlteredMidStream(t *testing.T) {
	t.Parallel()
	b := setup(t, testenv.Postgres(t), "", outbox.Columns{}, "")
	r := b.open(t)
	ctx := b.ctx
	exec := func(sql string, args ...any) {
		t.Helper()
		_, err := b.db.Exec(ctx, sql, args...)
		require.NoError(t, err)
	}

	b.insert(t, b.db, 1)
	events, _ := read(t, r, 1, 10)
	require.Equal(t, eventIDs(1), ids(events))

	// While the reader streams: a column added (first, in its own
	// transaction; then with an insert in the same one), then dropped, then
	// the payload renamed away and back.
	exec(`ALTER TABLE outbox_events ADD COLUMN note text`)
	exec(`INSERT INTO outbox_events (id, event_type, payload, note) VALUES ($1, 't2', '{"n":2}', 'x')`, eventID(2))
	exec(`BEGIN; ALTER TABLE outbox_events ADD COLUMN seq int DEFAULT 7;
		INSERT INTO outbox_events (id, event_type, payload) VALUES ('` + eventID(3) + `', 't3', '{"n":3}'); COMMIT`)
	exec(`ALTER TABLE outbox_events DROP COLUMN note`)
	b.insert(t, b.db, 4)
	exec(`ALTER TABLE outbox_events RENAME COLUMN payload TO body`)
	exec(`INSERT INTO outbox_events (id, event_type, body) VALUES ($1, 't5', '{"n":5}')`, eventID(5))
	exec(`ALTER TABLE outbox_events RENAME COLUMN body TO payload`)
	b.insert(t, b.db, 6)

	events, _ = read(t, r, 5, 10)
	require.Equal(t, eventIDs(2, 3, 4, 5, 6), ids(events))
	for _, e := range events {
		n := e.ID[len(e.ID)-1:]
		require.Equal(t, "t"+n, e.Type)
		if n == "5" {
			require.Equal(t, "NULL in column payload", e.Malformed, "the payload column is gone: a row to park")
			require.Empty(t, e.Payload)
			continue
		}
		require.Empty(t, e.Malformed, "event %s", e.ID)
		require.Equal(t, fmt.Sprintf(`{"n":%s}`, n), e.Payload)
		require.False(t, e.CreatedAt.IsZero())
	}
}

func TestIdleReaderAdvancesItsSlot(t *testing.T) {
	t.Parallel()
	b := setup(t, testenv.Postgres(t), "", outbox.Columns{}, "")
	r := b.open(t)
	ctx := b.ctx
	_, err := b.db.Exec(ctx, `CREATE TABLE other (x text)`)
	require.NoError(t, err)
	b.insert(t, b.db, 1)
	_, batches := read(t, r, 1, 10)
	first := lastConfirm(batches).Confirm
	require.NoError(t, r.Confirm(ctx, first))

	// wait calls Next for a while, as a relay's loop does, while another
	// table takes writes; Next must return nothing.
	wait := func() {
		t.Helper()
		_, err := b.db.Exec(ctx, `INSERT INTO other SELECT 'x' FROM generate_series(1, 100)`)
		require.NoError(t, err)
		nctx, cancel := context.WithTimeout(ctx, 3*testStatusInterval)
		defer cancel()
		got, err := r.Next(nctx, outbox.Rows(10), time.Millisecond)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.Empty(t, got.Events)
	}
	// The keepalives' position is IdleEnd, which the Reader does not
	// confirm by itself: its caller records what it confirms first.
	var end pglogrepl.LSN
	testenv.Eventually(t, testTimeout, "a keepalive past writes of another table", func() error {
		wait()
		if end = r.IdleEnd(); end <= first {
			return fmt.Errorf("idle end %s, confirmed %s", end, first)
		}
		return nil
	})
	for range 3 {
		wait()
	}
	s, err := Status(ctx, b.db, b.opts.Slot)
	require.NoError(t, err)
	require.Equal(t, first, s.ConfirmedFlush, "the slot moved past what the caller confirmed")
	require.Equal(t, first, r.Confirmed())
	end = r.IdleEnd()
	require.NoError(t, r.Confirm(ctx, end))
	b.requireConfirmedFlush(t, end)

	// With a batch read and not confirmed, the slot stays where the caller
	// left it, however many keepalives arrive.
	b.insert(t, b.db, 2)
	_, batches = read(t, r, 1, 10)
	held := r.Confirmed()
	for range 5 {
		wait()
		require.Zero(t, r.IdleEnd(), "a batch is read and not confirmed")
	}
	require.Equal(t, held, r.Confirmed())
	s, err = Status(ctx, b.db, b.opts.Slot)
	require.NoError(t, err)
	require.Equal(t, held, s.ConfirmedFlush)
	require.NoError(t, r.Confirm(ctx, lastConfirm(batches).Confirm))
	b.requireConfirmedFlush(t, lastConfirm(batches).Confirm)
}

func TestNextKeepsWhatItGatheredWhenItsContextEnds(t *testing.T) {
	t.Parallel()
	b := setup(t, testenv.Postgres(t), "", outbox.Columns{}, "")
	r := b.open(t)
	b.insert(t, b.db, 1)
	ctx, cancel := context.WithTimeout(b.ctx, time.Second)
	defer cancel()
	_, err := r.Next(ctx, outbox.Rows(10), time.Hour) // lingers past its context
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.True(t, r.gathered(), "the event was received")
	events, _ := read(t, r, 1, 10)
	require.Equal(t, eventIDs(1), ids(events))
}

// TestATrickleDoesNotHoldABatchUntilFull: with events arriving steadily,
// more often than linger, Next returns about linger after the first one,
// not once maxEvents have gathered (which at 2,000 events/s held a batch of
// 500 for a quarter of a second).
func TestATrickleDoesNotHoldABatchUntilFull(t *testing.T) {
	t.Parallel()
	b := setup(t, testenv.Postgres(t), "", outbox.Columns{}, "")
	r := b.open(t)
	const n = 200
	// Each commit flushes its WAL, which the stream sends at once: with the
	// test server's synchronous_commit off it would come in bursts at the
	// WAL writer's pace instead, gaps longer than linger.
	conn, err := b.db.Acquire(b.ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(b.ctx, `SET synchronous_commit TO on`)
	require.NoError(t, err)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range n {
			b.insert(t, conn, i+1)
			time.Sleep(2 * time.Millisecond) // one every 2 ms: 400 ms in all
		}
	}()
	ctx, cancel := context.WithTimeout(b.ctx, testTimeout)
	defer cancel()
	first, err := r.Next(ctx, outbox.Rows(n), 20*time.Millisecond)
	require.NoError(t, err)
	<-done
	require.NotEmpty(t, first.Events)
	require.Less(t, len(first.Events), n/2, "the first batch waited for the trickle instead of returning 20ms after its first event")
}
