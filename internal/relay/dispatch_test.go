package relay

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-dev/outbox-operator/internal/outbox"
)

// The relay with cleanup mode OnDispatch (Config.Dispatch
// outbox.DeleteOnDispatch): the guarantees of the default mode, with the
// rows deleted by the batch's commit instead of marked.

// rowCount counts every row of the outbox, pending or not.
func (b *testBundle) rowCount(t *testing.T) int {
	t.Helper()
	var n int
	require.NoError(t, b.db.QueryRow(context.Background(), `SELECT count(*) FROM outbox_events`).Scan(&n))
	return n
}

func TestOnDispatchDrainsInOrderAndLeavesNoRow(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	ids := b.insert(t, 250)
	r := b.newRelay(t, Config{BatchSize: 100, Dispatch: outbox.DeleteOnDispatch})

	require.Equal(t, 4, b.drain(t, r), "three batches (100, 100, 50) and an empty claim")
	entries := b.readStream(t, b.stream)
	requireEachOnce(t, entries, ids)
	for i, e := range entries {
		require.Equal(t, ids[i], e[FieldEventID], "entry %d out of order", i)
	}
	require.Zero(t, b.rowCount(t), "every row deleted by its batch's commit")
}

func TestOnDispatchFailureBeforeCommitKeepsTheRows(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	ids := b.insert(t, 10)
	r := b.newRelay(t, Config{BatchSize: 10, Dispatch: outbox.DeleteOnDispatch})
	crash := errors.New("relay lost before commit")
	r.testHookBeforeCommit = func(context.Context) error { return crash }

	_, err := r.runOnce(context.Background())
	require.ErrorIs(t, err, crash)
	require.Len(t, b.readStream(t, b.stream), 10, "the batch reached Redis")
	require.Equal(t, 10, b.rowCount(t), "but the delete rolled back with the batch")

	r.testHookBeforeCommit = nil
	b.drain(t, r)
	entries := b.readStream(t, b.stream)
	require.Len(t, entries, 20, "each event twice: a duplicate, not a loss")
	require.Equal(t, 10, requireAtLeastOnce(t, entries, ids))
	require.Zero(t, b.rowCount(t))
}

func TestOnDispatchRedisDownDeletesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{redisURL: "redis://127.0.0.1:1"})
	b.insert(t, 5)
	r := b.newRelay(t, Config{Dispatch: outbox.DeleteOnDispatch, PublishTimeout: time.Second})
	_, err := r.runOnce(context.Background())
	require.Error(t, err)
	require.Equal(t, ErrorKindRedis, errorKind(err))
	require.Equal(t, 5, b.rowCount(t), "no row deleted without Redis")
}

func TestOnDispatchParksAMalformedRowAndDeletesIt(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{ddl: `CREATE TABLE outbox_events (
		id uuid PRIMARY KEY DEFAULT gen_random_uuid(), event_type text, payload text,
		created_at timestamptz NOT NULL DEFAULT now(), dispatched_at timestamptz);` +
		outbox.MustNew("", outbox.Columns{}).DeadLetterDDL()})
	_, err := b.db.Exec(context.Background(), `INSERT INTO outbox_events (event_type, payload, created_at) VALUES
		('ok', '1', now() - interval '2 s'), ('bad', NULL, now() - interval '1 s')`)
	require.NoError(t, err)
	b.drain(t, b.newRelay(t, Config{Dispatch: outbox.DeleteOnDispatch}))

	require.Len(t, b.readStream(t, b.stream), 1)
	parked := b.deadLetters(t)
	require.Len(t, parked, 1, "the bad row is kept, in the dead-letter table")
	require.Equal(t, "bad", *parked[0].EventType)
	require.Contains(t, parked[0].Reason, "NULL in column payload")
	require.Zero(t, b.rowCount(t), "and gone from the outbox in the same commit")
}

func TestOnDispatchPerKeyKeepsEachKeysOrder(t *testing.T) {
	t.Parallel()
	b, want := keyedBundle(t, 3000, 100)
	cfg := Config{Ordering: OrderingPerKey, Partitions: 8, BatchSize: 50, Dispatch: outbox.DeleteOnDispatch,
		LeaderTimeout: 2 * time.Second, StandbyPoll: 50 * time.Millisecond}
	stops := []func() error{runInBackground(t, b.newRelay(t, cfg)), runInBackground(t, b.newRelay(t, cfg))}
	waitFor(t, "every row dispatched and deleted", func() bool { return b.rowCount(t) == 0 })
	for _, stop := range stops {
		require.NoError(t, stop())
	}
	requirePerKeyOrder(t, b.readStream(t, b.stream), want)
}

func TestOnDispatchRefusesAutoReplay(t *testing.T) {
	t.Parallel()
	err := Config{Table: outbox.MustNew("", outbox.Columns{}), Dispatch: outbox.DeleteOnDispatch, AutoReplay: true}.
		withDefaults().validate()
	require.ErrorContains(t, err, "auto-replay republishes dispatched rows, which cleanup mode OnDispatch deletes")
}
