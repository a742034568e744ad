package relay

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
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

// TestRolloutAcrossDispatchModesLosesNothing: a rollout that switches the
// cleanup mode, the ordering and the batch size, with old (AfterRetention,
// batch 50, in-flight 2) and new (OnDispatch, batch 7; Strict OnDispatch,
// batch 20) relays running at once, producers writing, and cleanup
// (--retention 0s) in a loop: every committed row reaches the stream, and
// none is left pending.
func TestRolloutAcrossDispatchModesLosesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	ctx := context.Background()
	oldRelay := b.newRelay(t, Config{BatchSize: 50, InFlight: 2})
	newRelay := b.newRelay(t, Config{BatchSize: 7, Dispatch: outbox.DeleteOnDispatch})
	stopOld := runInBackground(t, oldRelay)
	stopNew := runInBackground(t, newRelay)
	strict := b.newRelay(t, Config{BatchSize: 20, Ordering: OrderingStrict, Dispatch: outbox.DeleteOnDispatch})
	stopStrict := runInBackground(t, strict)

	var mu sync.Mutex
	var ids []string
	var done atomic.Bool
	var wg sync.WaitGroup
	for p := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 300 {
				tx, err := b.db.Begin(ctx)
				if err != nil {
					continue
				}
				var got []string
				for j := range 1 + i%5 {
					var id string
					if err := tx.QueryRow(ctx, `INSERT INTO outbox_events (event_type, payload) VALUES ('t', $1) RETURNING id::text`,
						fmt.Sprintf(`{"p":%d,"i":%d,"j":%d}`, p, i, j)).Scan(&id); err != nil {
						break
					}
					got = append(got, id)
				}
				if tx.Commit(ctx) == nil {
					mu.Lock()
					ids = append(ids, got...)
					mu.Unlock()
				}
			}
		}()
	}
	var cleaned int64
	cleanupDone := make(chan struct{})
	go func() {
		defer close(cleanupDone)
		for !done.Load() {
			n, err := b.table.DeleteAllDispatched(ctx, b.db, 0, 13, nil)
			if err == nil {
				cleaned += n
			}
			time.Sleep(2 * time.Millisecond)
		}
	}()
	wg.Wait()
	waitFor(t, "the backlog drained", func() bool { return b.backlog(t) == 0 })
	done.Store(true)
	<-cleanupDone
	require.NoError(t, stopOld())
	require.NoError(t, stopNew())
	require.NoError(t, stopStrict())
	dups := requireAtLeastOnce(t, b.readStream(t, b.stream), ids)
	t.Logf("events %d, duplicates %d, rows cleaned %d", len(ids), dups, cleaned)
}

// TestShutdownMidBatchOnDispatchLosesNothing: the relay's context ends
// (SIGTERM) while a batch of OnDispatch is published, or committed, and the
// next is claimed. The claim deleted the rows: every row must be in the
// stream or still in the table, and a new relay drains the rest in order.
func TestShutdownMidBatchOnDispatchLosesNothing(t *testing.T) {
	t.Parallel()
	for _, where := range []string{"publish", "commit"} {
		t.Run(where, func(t *testing.T) {
			b := setup(t, bundleOpts{})
			b.insertBulk(t, 400)
			ids := b.allIDs(t)
			r := b.newRelay(t, Config{BatchSize: 20, InFlight: 2, Dispatch: outbox.DeleteOnDispatch})
			ctx, cancel := context.WithCancel(context.Background())
			var n atomic.Int64
			hold := func() {
				if n.Add(1) == 6 {
					cancel()
					time.Sleep(300 * time.Millisecond)
				}
			}
			if where == "publish" {
				r.testHookBeforePublish = func([]outbox.Event) error { hold(); return nil }
			} else {
				r.testHookBeforeCommit = func(context.Context) error { hold(); return nil }
			}
			done := make(chan error, 1)
			go func() { done <- r.Run(ctx) }()
			select {
			case err := <-done:
				require.NoError(t, err)
			case <-time.After(30 * time.Second):
				t.Fatal("relay did not stop")
			}
			b.requireInStreamOrTable(t, ids)
			// What is left is drained by a new relay.
			r2 := b.newRelay(t, Config{BatchSize: 20, InFlight: 2, Dispatch: outbox.DeleteOnDispatch})
			stop := runInBackground(t, r2)
			waitFor(t, "drained", func() bool { return b.rowCount(t) == 0 })
			require.NoError(t, stop())
			requireAtLeastOnce(t, b.readStream(t, b.stream), ids)
			requireFirstOccurrencesInOrder(t, b.readStream(t, b.stream), ids)
		})
	}
}

// requireInStreamOrTable requires that every id is in the stream or still
// in the table (OnDispatch deletes rows when their batch commits).
func (b *testBundle) requireInStreamOrTable(t *testing.T, ids []string) {
	t.Helper()
	seen := map[string]bool{}
	for _, e := range b.readStream(t, b.stream) {
		seen[e[FieldEventID]] = true
	}
	rows, err := b.db.Query(context.Background(), `SELECT id::text FROM outbox_events`)
	require.NoError(t, err)
	left, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	for _, id := range left {
		seen[id] = true
	}
	var lost []string
	for _, id := range ids {
		if !seen[id] {
			lost = append(lost, id)
		}
	}
	require.Empty(t, lost, "rows gone from the table and absent from the stream")
}

// TestOnDispatchRefusesADeleteThatCascadesToPendingRows: an outbox whose
// events reference earlier events (a foreign key to the table itself, ON
// DELETE CASCADE). A deleting claim of the first event would delete the
// later, pending one with it, unpublished. The relay refuses to claim,
// says why, and every row stays until the key is changed.
func TestOnDispatchRefusesADeleteThatCascadesToPendingRows(t *testing.T) {
	t.Parallel()
	tbl := outbox.MustNew("", outbox.Columns{})
	b := setup(t, bundleOpts{ddl: tbl.DDL(outbox.DDLOptions{}) +
		`ALTER TABLE outbox_events ADD COLUMN caused_by uuid REFERENCES outbox_events (id) ON DELETE CASCADE;`})
	ctx := context.Background()
	rows, err := b.db.Query(ctx, `WITH p AS (
		INSERT INTO outbox_events (event_type, payload, created_at) VALUES ('parent', '1', now() - interval '2 s') RETURNING id
	), c AS (
		INSERT INTO outbox_events (event_type, payload, created_at, caused_by)
		SELECT 'child', '2', now() - interval '1 s', id FROM p RETURNING id
	) SELECT id::text FROM p UNION ALL SELECT id::text FROM c`)
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Len(t, ids, 2)

	r := b.newRelay(t, Config{BatchSize: 1, Dispatch: outbox.DeleteOnDispatch})
	for range 3 {
		_, err = r.runOnce(ctx)
		if err != nil {
			break
		}
	}
	b.requireInStreamOrTable(t, ids)
	require.ErrorIs(t, err, outbox.ErrDeleteCascades)
	require.ErrorContains(t, err, "caused_by")
	require.Equal(t, 2, b.rowCount(t), "nothing deleted")

	_, err = b.db.Exec(ctx, `ALTER TABLE outbox_events DROP CONSTRAINT outbox_events_caused_by_fkey`)
	require.NoError(t, err)
	b.drain(t, r)
	requireEachOnce(t, b.readStream(t, b.stream), ids)
}
