package logical

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/outbox-dev/outbox-operator/internal/outbox"
	"github.com/outbox-dev/outbox-operator/internal/testenv"
)

func TestPostgresRestartedMidStream(t *testing.T) {
	t.Parallel()
	// A walsender that stops waits, before the server can shut down, for its
	// client to confirm everything; a reader busy elsewhere does not answer,
	// so a short wal_sender_timeout keeps the fast shutdown short.
	srv := testenv.StartPostgres(t, testenv.WithPostgresSetting("wal_sender_timeout=2s"))
	b := setup(t, srv.DSN(), "", outbox.Columns{}, "")
	r := b.open(t)
	seen := map[string]int{}
	note := func(events []outbox.Event) {
		for _, e := range events {
			seen[e.ID]++
		}
	}

	b.insert(t, b.db, 1, 2, 3)
	events, batches := read(t, r, 3, 10)
	note(events)
	confirmed := lastConfirm(batches).Confirm
	require.NoError(t, r.Confirm(b.ctx, confirmed))
	b.requireConfirmedFlush(t, confirmed)
	b.insert(t, b.db, 4, 5, 6)
	events, _ = read(t, r, 3, 10) // read, not confirmed, when the server goes
	note(events)
	b.insert(t, b.db, 7, 8) // committed, perhaps not read

	srv.Stop(t)
	ctx, cancel := context.WithTimeout(b.ctx, testTimeout)
	defer cancel()
	var err error
	for err == nil { // what was on its way may come first
		var batch Batch
		batch, err = r.Next(ctx, outbox.Rows(10), 10*time.Millisecond)
		note(batch.Events)
	}
	require.NotErrorIs(t, err, context.DeadlineExceeded, "Next reports the lost server")
	require.NoError(t, r.Close(b.ctx))

	srv.Start(t)
	b.db.Reset() // its connections went with the server
	s, err := Status(b.ctx, b.db, b.opts.Slot)
	require.NoError(t, err)
	// PostgreSQL 15 writes a slot's confirmed position to disk only along
	// with other changes of the slot (17 also at a shutdown checkpoint), so
	// a restart may go back before what was confirmed: more duplicates.
	require.LessOrEqual(t, s.ConfirmedFlush, confirmed)
	t.Logf("confirmed %s before the restart, %s after", confirmed, s.ConfirmedFlush)
	b.insert(t, b.db, 9, 10)
	r = b.open(t)
	want := eventIDs(1, 2, 3, 4, 5, 6, 7, 8, 9, 10)
	testenv.Eventually(t, testTimeout, "every committed event", func() error {
		nctx, cancel := context.WithTimeout(b.ctx, time.Second)
		defer cancel()
		batch, err := r.Next(nctx, outbox.Rows(100), 10*time.Millisecond)
		if err != nil && !errors.Is(err, context.DeadlineExceeded) {
			require.NoError(t, err)
		}
		note(batch.Events)
		for _, id := range want {
			if seen[id] == 0 {
				return errors.New("missing " + id)
			}
		}
		return nil
	})
	duplicates := 0
	for _, id := range want {
		duplicates += seen[id] - 1
	}
	require.Len(t, seen, len(want), "nothing but the committed events")
	t.Logf("committed %d, read %d distinct, lost 0, duplicates %d", len(want), len(seen), duplicates)
	require.GreaterOrEqual(t, seen[eventID(4)], 2, "the unconfirmed events came again")
}

func TestSlotInvalidated(t *testing.T) {
	t.Parallel()
	// WAL segments are 16MB (initdb's default; not settable at run time), so
	// a slot allowed 1MB loses its WAL at the first checkpoint after a
	// segment switch.
	srv := testenv.StartPostgres(t, testenv.WithPostgresSetting("max_slot_wal_keep_size=1MB"))
	b := setup(t, srv.DSN(), "", outbox.Columns{}, "")
	ctx := b.ctx

	keep, err := MaxSlotWALKeepSize(ctx, b.db)
	require.NoError(t, err)
	require.EqualValues(t, 1<<20, keep)
	s, err := Status(ctx, b.db, b.opts.Slot)
	require.NoError(t, err)
	require.NotNil(t, s.SafeWALSize, "bounded by max_slot_wal_keep_size")

	r := b.open(t)
	b.insert(t, b.db, 1)
	_, batches := read(t, r, 1, 10)
	require.NoError(t, r.Confirm(ctx, lastConfirm(batches).Confirm))
	require.NoError(t, r.Close(ctx))

	// The relay is away while the database writes on.
	_, err = b.db.Exec(ctx, `CREATE TABLE filler (x text)`)
	require.NoError(t, err)
	testenv.EventuallyEvery(t, 100*time.Millisecond, testTimeout, "the slot to be lost", func() error {
		_, err := b.db.Exec(ctx, `INSERT INTO filler SELECT repeat('x', 100) FROM generate_series(1, 1000)`)
		require.NoError(t, err)
		_, err = b.db.Exec(ctx, `SELECT pg_switch_wal()`)
		require.NoError(t, err)
		_, err = b.db.Exec(ctx, `CHECKPOINT`)
		require.NoError(t, err)
		s, err = Status(ctx, b.db, b.opts.Slot)
		require.NoError(t, err)
		if s.WALStatus != walStatusLost {
			return errors.New("wal_status " + s.WALStatus)
		}
		return nil
	})
	require.True(t, s.Exists)
	require.Zero(t, s.RetainedBytes, "a lost slot keeps no WAL")

	_, err = Open(ctx, mustParse(t, b.dsn), b.opts)
	require.ErrorIs(t, err, ErrSlotInvalidated)
	require.ErrorIs(t, Setup(ctx, b.db, b.opts), ErrSlotInvalidated, "Setup reports it too")

	// START_REPLICATION itself refuses it, in the server's own words.
	err = startAnyway(t, b)
	require.ErrorIs(t, err, ErrSlotInvalidated)
	t.Logf("START_REPLICATION on the lost slot: %v", err)

	// The way out: a new slot (the events of the gap are the poller's).
	require.NoError(t, DropSlot(ctx, b.db, b.opts.Slot))
	require.NoError(t, Setup(ctx, b.db, b.opts))
	r = b.open(t)
	b.insert(t, b.db, 2)
	events, _ := read(t, r, 1, 10)
	require.Equal(t, eventIDs(2), ids(events))
}

// startAnyway issues START_REPLICATION on the bundle's slot without the
// look at its status that Open takes first, to see the server's own error.
func startAnyway(t *testing.T, b *bundle) error {
	t.Helper()
	cfg := mustParse(t, b.dsn)
	cfg.RuntimeParams["replication"] = "database"
	r := &Reader{opts: b.opts}
	var err error
	r.conn, err = pgconn.ConnectConfig(b.ctx, cfg)
	require.NoError(t, err)
	defer func() { _ = r.conn.Close(context.Background()) }()
	return r.startReplication(b.ctx)
}
