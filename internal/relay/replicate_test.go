package relay

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/outbox-dev/outbox-operator/internal/logical"
	"github.com/outbox-dev/outbox-operator/internal/outbox"
	"github.com/outbox-dev/outbox-operator/internal/syncbuf"
	"github.com/outbox-dev/outbox-operator/internal/testenv"
)

// The relay with source LogicalReplication: events from the slot in commit
// order, the slot confirmed only after Redis acknowledged them, rows never
// marked, and a catch-up from the table where the stream cannot reach.

// replicating is a Config for source LogicalReplication on the bundle's
// database, with a slot of the test's own, dropped at the end (a slot left
// behind keeps its database from being dropped).
func (b *testBundle) replicating(t *testing.T, cfg Config) Config {
	t.Helper()
	pc, err := pgconn.ParseConfig(b.dsn)
	require.NoError(t, err)
	cfg.Source, cfg.Replication = SourceLogicalReplication, pc
	if cfg.Slot == "" {
		cfg.Slot = "relay_test"
	}
	if cfg.StandbyPoll == 0 {
		cfg.StandbyPoll = 50 * time.Millisecond
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := logical.DropSlot(ctx, b.db, cfg.Slot); err != nil {
			t.Errorf("dropping slot %s: %v", cfg.Slot, err)
		}
	})
	return cfg
}

// dispatchedRows counts rows marked dispatched: a replicating relay marks none.
func (b *testBundle) dispatchedRows(t *testing.T) int {
	t.Helper()
	var n int
	require.NoError(t, b.db.QueryRow(context.Background(), `SELECT count(*) FROM outbox_events WHERE dispatched_at IS NOT NULL`).Scan(&n))
	return n
}

// waitStream waits until the stream holds every id (at least once) and
// returns its entries.
func (b *testBundle) waitStream(t *testing.T, ids []string) []entry {
	t.Helper()
	var entries []entry
	waitFor(t, fmt.Sprintf("%d events in the stream", len(ids)), func() bool {
		entries = b.readStream(t, b.stream)
		seen := map[string]bool{}
		for _, e := range entries {
			seen[e[FieldEventID]] = true
		}
		for _, id := range ids {
			if !seen[id] {
				return false
			}
		}
		return true
	})
	return entries
}

// waitCaughtUp waits until the relay on slot has recorded its catch-up
// done. A row committed while the catch-up runs can be published by both
// the catch-up and the stream (a duplicate, by design): a test that counts
// each event once writes its rows after this.
func (b *testBundle) waitCaughtUp(t *testing.T, slot string) {
	t.Helper()
	waitFor(t, "the catch-up of slot "+slot+" done", func() bool {
		p, ok, err := b.table.ReadProgress(context.Background(), b.db, slot)
		require.NoError(t, err)
		return ok && !p.CatchUpPending
	})
}

// insertNow writes n events, one transaction each, with created_at the
// column's default (the transaction's start), as the catch-up after a lost
// slot expects; it returns their ids.
func (b *testBundle) insertNow(t *testing.T, n int) []string {
	t.Helper()
	ids := make([]string, 0, n)
	for i := range n {
		var id string
		require.NoError(t, b.db.QueryRow(context.Background(),
			`INSERT INTO outbox_events (event_type, payload) VALUES ('order_created', $1) RETURNING id::text`,
			fmt.Sprintf(`{"n":%d}`, i)).Scan(&id))
		ids = append(ids, id)
	}
	return ids
}

// exec runs a statement on the bundle's database, failing the test on error.
func (b *testBundle) exec(t *testing.T, sql string) {
	t.Helper()
	_, err := b.db.Exec(context.Background(), sql)
	require.NoError(t, err)
}

// insertInTx writes n events in tx (not committed) and returns their ids.
func insertInTx(t *testing.T, tx pgx.Tx, n int) []string {
	t.Helper()
	rows, err := tx.Query(context.Background(), `INSERT INTO outbox_events (event_type, payload)
		SELECT 'gap', '{}' FROM generate_series(1, $1) RETURNING id::text`, n)
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return ids
}

func TestReplicationCatchesUpThenStreamsInCommitOrder(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	before := b.insert(t, 30) // committed before any slot: the catch-up's
	r := b.newRelay(t, b.replicating(t, Config{BatchSize: 10}))
	stop := runInBackground(t, r)
	b.waitStream(t, before)
	b.waitCaughtUp(t, "relay_test")
	after := b.insert(t, 40) // from the slot's stream
	entries := b.waitStream(t, append(append([]string{}, before...), after...))
	require.NoError(t, stop())

	requireEachOnce(t, entries, append(before, after...))
	for i, e := range entries {
		require.Equal(t, append(before, after...)[i], e[FieldEventID], "entry %d out of order", i)
	}
	require.Zero(t, b.dispatchedRows(t), "streamed rows are never marked")
	p, ok, err := b.table.ReadProgress(context.Background(), b.db, "relay_test")
	require.NoError(t, err)
	require.True(t, ok)
	require.False(t, p.CatchUpPending)
	require.NotNil(t, p.LastCommit)
	bl, err := b.table.BacklogSince(context.Background(), b.db, "relay_test", 0)
	require.NoError(t, err)
	require.Zero(t, bl.Count, "nothing created after the last published commit")

	// A new relay on the same slot does not catch up again. (The first one
	// may have stopped between a batch's XADD and its confirm: that tail
	// comes again, a duplicate by design, so only the catch-up's rows are
	// counted exactly.)
	r = b.newRelay(t, b.replicating(t, Config{BatchSize: 10}))
	stop = runInBackground(t, r)
	last := b.insert(t, 5)
	entries = b.waitStream(t, last)
	require.NoError(t, stop())
	requireAtLeastOnce(t, entries, slices.Concat(before, after, last))
	seen := map[string]int{}
	for _, e := range entries {
		seen[e[FieldEventID]]++
	}
	for _, id := range before {
		require.Equal(t, 1, seen[id], "event %s of the catch-up published again", id)
	}
}

func TestReplicationCrashBetweenXADDAndConfirmRepublishes(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	r := b.newRelay(t, b.replicating(t, Config{BatchSize: 100}))
	var crashes atomic.Int32
	crash := errors.New("relay lost before the confirm")
	r.testHookBeforeCommit = func(context.Context) error {
		if crashes.Add(1) <= 2 {
			return crash
		}
		return nil
	}
	stop := runInBackground(t, r)
	waitFor(t, "the relay streaming", func() bool { return r.Ready() == nil })
	ids := b.insert(t, 20)
	entries := b.waitStream(t, ids)
	waitFor(t, "past the crashes", func() bool { return crashes.Load() > 2 })
	require.NoError(t, stop())
	dups := requireAtLeastOnce(t, b.readStream(t, b.stream), ids)
	require.Positive(t, dups, "the unconfirmed tail came again: a duplicate, not a loss")
	require.Positive(t, testutilCounter(r.cfg.Metrics.Errors.WithLabelValues(ErrorKindPostgres)))
	_ = entries
}

func TestReplicationSurvivesAPostgresRestart(t *testing.T) {
	t.Parallel()
	pg := testenv.StartPostgres(t)
	b := setup(t, bundleOpts{dsn: pg.DSN()})
	r := b.newRelay(t, b.replicating(t, Config{BatchSize: 50}))
	stop := runInBackground(t, r)
	first := b.insert(t, 20)
	b.waitStream(t, first)
	pg.Stop(t)
	waitFor(t, "not ready while PostgreSQL is down", func() bool { return r.Ready() != nil })
	pg.Start(t)
	b.db.Reset() // the test's own pool holds connections the restart ended
	second := b.insert(t, 20)
	b.waitStream(t, append(append([]string{}, first...), second...))
	require.NoError(t, stop())
	requireAtLeastOnce(t, b.readStream(t, b.stream), append(first, second...))
}

func TestReplicationRecoversAnInvalidatedSlotFromTheTable(t *testing.T) {
	t.Parallel()
	pg := testenv.StartPostgres(t, testenv.WithPostgresSetting("max_slot_wal_keep_size=1MB"))
	b := setup(t, bundleOpts{dsn: pg.DSN()})
	cfg := b.replicating(t, Config{BatchSize: 50, CatchUpMargin: time.Second})
	stop := runInBackground(t, b.newRelay(t, cfg))
	first := b.insertNow(t, 10)
	b.waitStream(t, first)
	require.NoError(t, stop())

	// While no relay streams, rows arrive and the server removes the WAL
	// that holds them: the slot is lost.
	gap := b.insertNow(t, 15)
	ctx := context.Background()
	waitFor(t, "the slot invalidated", func() bool {
		_, err := b.db.Exec(ctx, `CREATE TABLE IF NOT EXISTS filler (x text);
			INSERT INTO filler SELECT repeat('x', 1000) FROM generate_series(1, 3000);
			SELECT pg_switch_wal(); CHECKPOINT;`)
		require.NoError(t, err)
		st, err := logical.Status(ctx, b.db, cfg.Slot)
		require.NoError(t, err)
		return st.WALStatus == "lost"
	})

	r := b.newRelay(t, cfg)
	stop = runInBackground(t, r)
	b.waitStream(t, gap) // from the table, in the catch-up
	later := b.insertNow(t, 5)
	b.waitStream(t, later) // and the new slot streams again
	require.NoError(t, stop())
	requireAtLeastOnce(t, b.readStream(t, b.stream), append(append(first, gap...), later...))
	require.InDelta(t, 1, testutilCounter(r.cfg.Metrics.Errors.WithLabelValues(ErrorKindSlotInvalidated)), 0)
}

func TestReplicationFollowsATableAltered(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	r := b.newRelay(t, b.replicating(t, Config{}))
	stop := runInBackground(t, r)
	b.waitCaughtUp(t, "relay_test")
	ctx := context.Background()
	first := b.insert(t, 3)
	b.waitStream(t, first)

	_, err := b.db.Exec(ctx, `ALTER TABLE outbox_events ADD COLUMN tenant text DEFAULT 'a'`)
	require.NoError(t, err)
	second := b.insert(t, 3)
	b.waitStream(t, second)

	// Without its payload column a row cannot be published: it is parked,
	// and the stream goes on.
	_, err = b.db.Exec(ctx, `ALTER TABLE outbox_events RENAME COLUMN payload TO body;
		INSERT INTO outbox_events (event_type, body) VALUES ('renamed', '{}');
		ALTER TABLE outbox_events RENAME COLUMN body TO payload;`)
	require.NoError(t, err)
	third := b.insert(t, 3)
	b.waitStream(t, third)
	waitFor(t, "the row without payload parked", func() bool { return len(b.deadLetters(t)) == 1 })
	require.NoError(t, stop())
	parked := b.deadLetters(t)
	require.Contains(t, parked[0].Reason, "NULL in column payload")
	requireEachOnce(t, b.readStream(t, b.stream), append(append(first, second...), third...))
}

func TestReplicationSecondRelayStandsByAndTakesOver(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	cfg := b.replicating(t, Config{})
	a := b.newRelay(t, cfg)
	stopA := runInBackground(t, a)
	b.waitCaughtUp(t, cfg.Slot)
	first := b.insert(t, 5)
	b.waitStream(t, first)
	standby := b.newRelay(t, cfg)
	stopB := runInBackground(t, standby)
	waitFor(t, "the standby ready", func() bool { return standby.Ready() == nil })
	require.Zero(t, testutilCounter(standby.cfg.Metrics.EventsPublished), "a standby publishes nothing")
	require.NoError(t, stopA())
	second := b.insert(t, 5)
	b.waitStream(t, second)
	require.NoError(t, stopB())
	require.Positive(t, testutilCounter(standby.cfg.Metrics.EventsPublished), "the standby took over")
	requireEachOnce(t, b.readStream(t, b.stream), append(first, second...))
}

func TestReplicationConfigRefusals(t *testing.T) {
	t.Parallel()
	table := outbox.MustNew("", outbox.Columns{Key: "k"})
	for name, tc := range map[string]struct {
		cfg  Config
		want string
	}{
		"no slot":       {Config{Source: SourceLogicalReplication, Replication: &pgconn.Config{}}, "slot"},
		"bad slot":      {Config{Source: SourceLogicalReplication, Slot: "Bad-Name", Replication: &pgconn.Config{}}, "slot"},
		"no connection": {Config{Source: SourceLogicalReplication, Slot: "s"}, "needs a replication connection config"},
		"on dispatch": {Config{Source: SourceLogicalReplication, Slot: "s", Replication: &pgconn.Config{},
			Dispatch: outbox.DeleteOnDispatch}, "cleanup mode OnDispatch applies to polling only"},
		"per key": {Config{Source: SourceLogicalReplication, Slot: "s", Replication: &pgconn.Config{},
			Ordering: OrderingPerKey}, "use ordering None or Strict"},
		"unknown": {Config{Source: "Carrier pigeon"}, `source "Carrier pigeon": must be Polling or LogicalReplication`},
	} {
		t.Run(name, func(t *testing.T) {
			tc.cfg.Table = table
			require.ErrorContains(t, tc.cfg.withDefaults().validate(), tc.want)
		})
	}
}

// insertSQL runs stmt (which inserts rows and returns their ids as text) in
// a transaction whose TimeZone is zone, as a producer in that zone would.
func (b *testBundle) insertIn(t *testing.T, zone, stmt string) []string {
	t.Helper()
	ctx := context.Background()
	tx, err := b.db.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `SELECT set_config('TimeZone', $1, true)`, zone)
	require.NoError(t, err)
	rows, err := tx.Query(ctx, stmt)
	require.NoError(t, err)
	var ids []string
	for rows.Next() {
		var id string
		require.NoError(t, rows.Scan(&id))
		ids = append(ids, id)
	}
	require.NoError(t, rows.Err())
	require.NoError(t, tx.Commit(ctx))
	return ids
}

// localTimeDDL is the default outbox with a nullable `timestamp without time
// zone` created_at, as an application that writes local wall time has it.
const localTimeDDL = `CREATE TABLE outbox_events (
	id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
	event_type text NOT NULL,
	payload text NOT NULL,
	created_at timestamp NULL DEFAULT now(),
	dispatched_at timestamp NULL
);`

// The first catch-up publishes rows whose created_at looks hours in the
// future (local wall time east of UTC in a timestamp column, or a producer's
// clock ahead) and rows without created_at.
func TestReplicationCatchUpTakesRowsOfAnyCreatedAt(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{ddl: localTimeDDL})
	tokyo := b.insertIn(t, "Asia/Tokyo", `INSERT INTO outbox_events (event_type, payload)
		SELECT 'tokyo', '{}' FROM generate_series(1, 5) RETURNING id::text`)
	ahead := b.insertIn(t, "UTC", `INSERT INTO outbox_events (event_type, payload, created_at)
		VALUES ('ahead', '{}', now() + interval '10 minutes') RETURNING id::text`)
	null := b.insertIn(t, "UTC", `INSERT INTO outbox_events (event_type, payload, created_at)
		VALUES ('no time', '{}', NULL) RETURNING id::text`)
	before := slices.Concat(tokyo, ahead, null)
	r := b.newRelay(t, b.replicating(t, Config{BatchSize: 2}))
	stop := runInBackground(t, r)
	b.waitCaughtUp(t, "relay_test")
	after := b.insertIn(t, "Asia/Tokyo", `INSERT INTO outbox_events (event_type, payload) VALUES ('later', '{}') RETURNING id::text`)
	b.waitStream(t, after)
	require.NoError(t, stop())
	requireAtLeastOnce(t, b.readStream(t, b.stream), append(before, after...))
}

// A catch-up after the slot was lost reaches back from the last published
// commit. Rows of a timestamp column written west of UTC look hours older
// than they are: they are caught up all the same.
func TestReplicationCatchUpAfterALostSlotTakesLocalTimesWestOfUTC(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{ddl: localTimeDDL})
	cfg := b.replicating(t, Config{BatchSize: 50, CatchUpMargin: time.Second})
	stop := runInBackground(t, b.newRelay(t, cfg))
	b.waitCaughtUp(t, cfg.Slot)
	first := b.insertIn(t, "UTC", `INSERT INTO outbox_events (event_type, payload) VALUES ('first', '{}') RETURNING id::text`)
	b.waitStream(t, first)
	waitFor(t, "the progress recorded", func() bool {
		p, ok, err := b.table.ReadProgress(context.Background(), b.db, cfg.Slot)
		require.NoError(t, err)
		return ok && p.LastCommit != nil && time.Since(*p.LastCommit) < time.Minute
	})
	require.NoError(t, stop())

	// While no relay streams, producers in New York write, and the slot is
	// lost (dropped here, as the server drops an invalidated one).
	gap := b.insertIn(t, "America/New_York", `INSERT INTO outbox_events (event_type, payload)
		SELECT 'new york', '{}' FROM generate_series(1, 5) RETURNING id::text`)
	require.NoError(t, logical.DropSlot(context.Background(), b.db, cfg.Slot))

	// The slot missing is said loudly: rows the application deleted right
	// after their commit would be in no stream.
	var logs syncbuf.Buffer
	cfg.Logger = newTestLogger(&logs)
	relay := b.newRelay(t, cfg)
	stop = runInBackground(t, relay)
	b.waitStream(t, gap)
	require.NoError(t, stop())
	requireAtLeastOnce(t, b.readStream(t, b.stream), append(first, gap...))
	require.Contains(t, logs.String(), `level=ERROR msg="Replication slot missing, though a relay had streamed from it`)
	// Counted once per pass that found it missing: more than once when a
	// pass failed before the slot was made again.
	require.GreaterOrEqual(t, testutilCounter(relay.cfg.Metrics.Errors.WithLabelValues(ErrorKindSlotMissing)), 1.0)
}

// An inheritance child created after the publication, and one that a
// publication FOR TABLE ONLY left out, are added to the publication by the
// relay, and their rows committed before are published from the table.
func TestReplicationCoversInheritanceChildren(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	ctx := context.Background()
	// A user-made publication of the parent alone, and a child with rows.
	_, err := b.db.Exec(ctx, `CREATE TABLE outbox_c1 () INHERITS (outbox_events);
		CREATE PUBLICATION outbox_events_pub FOR TABLE ONLY outbox_events WITH (publish = 'insert')`)
	require.NoError(t, err)
	insertChild := func(child, typ string, n int) []string {
		return b.insertIn(t, "UTC", fmt.Sprintf(`INSERT INTO %s (event_type, payload)
			SELECT '%s', '{}' FROM generate_series(1, %d) RETURNING id::text`, child, typ, n))
	}
	c1 := insertChild("outbox_c1", "c1 before", 3)
	r := b.newRelay(t, b.replicating(t, Config{BatchSize: 10, PollInterval: 100 * time.Millisecond}))
	stop := runInBackground(t, r)
	b.waitCaughtUp(t, "relay_test")
	c1 = append(c1, insertChild("outbox_c1", "c1 streamed", 3)...)
	b.waitStream(t, c1)

	// A child (and its own child) created while the relay streams; rows
	// are written before the relay notices and after.
	_, err = b.db.Exec(ctx, `CREATE TABLE outbox_c2 () INHERITS (outbox_events);
		CREATE TABLE outbox_c2a () INHERITS (outbox_c2)`)
	require.NoError(t, err)
	c2 := append(insertChild("outbox_c2", "c2", 4), insertChild("outbox_c2a", "c2a", 4)...)
	b.waitStream(t, c2)
	c2 = append(c2, insertChild("outbox_c2a", "c2a later", 2)...)
	parent := b.insert(t, 2)
	b.waitStream(t, append(c2, parent...))
	require.NoError(t, stop())
	requireAtLeastOnce(t, b.readStream(t, b.stream), slices.Concat(c1, c2, parent))
}

// waitClosed waits for ch to be closed, failing after 60s.
func waitClosed(t *testing.T, what string, ch <-chan struct{}) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(60 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
}

// A table migrated to partitioning while its relay streams: renamed,
// attached as a partition of a new partitioned table of the old name,
// whose other partitions take the new rows. The publication still lists
// only the old table (by its oid), so those partitions' inserts are not
// streamed: the relay adds them, with the rows they already hold, as it
// adds inheritance children, and one created later too.
func TestReplicationCoversPartitionsOfATableMigratedToPartitioning(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	ctx := context.Background()
	// A slot of its own: slot names are per server, which tests share.
	cfg := b.replicating(t, Config{Slot: "relay_partitions", BatchSize: 10, PollInterval: 100 * time.Millisecond})
	stop := runInBackground(t, b.newRelay(t, cfg))
	b.waitCaughtUp(t, cfg.Slot)
	first := b.insertNow(t, 3)
	b.waitStream(t, first)

	_, err := b.db.Exec(ctx, `ALTER TABLE outbox_events RENAME TO outbox_old;
		CREATE TABLE outbox_events (LIKE outbox_old INCLUDING DEFAULTS) PARTITION BY RANGE (created_at);
		ALTER TABLE outbox_events ATTACH PARTITION outbox_old FOR VALUES FROM (MINVALUE) TO (now());
		CREATE TABLE outbox_events_default PARTITION OF outbox_events DEFAULT`)
	require.NoError(t, err)
	second := b.insertNow(t, 4) // into outbox_events_default
	b.waitStream(t, second)

	_, err = b.db.Exec(ctx, `CREATE TABLE outbox_events_later PARTITION OF outbox_events FOR VALUES FROM ('2100-01-01') TO (MAXVALUE)`)
	require.NoError(t, err)
	third := b.insertIn(t, "UTC", `INSERT INTO outbox_events (event_type, payload, created_at)
		SELECT 'later', '{}', '2100-01-02'::timestamptz FROM generate_series(1, 3) RETURNING id::text`)
	b.waitStream(t, third)
	fourth := b.insertNow(t, 2)
	b.waitStream(t, fourth)
	require.NoError(t, stop())
	requireAtLeastOnce(t, b.readStream(t, b.stream), slices.Concat(first, second, third, fourth))

	rows, err := b.db.Query(ctx, `SELECT tablename::text FROM pg_publication_tables WHERE pubname = 'outbox_events_pub' ORDER BY 1`)
	require.NoError(t, err)
	listed, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"outbox_events_default", "outbox_events_later", "outbox_old"}, listed)
}

// partitionedDDL is a partitioned outbox table with one partition up to
// 2100, published as a whole (the relay's own publication names it).
const partitionedDDL = `CREATE TABLE outbox_events (
	id uuid NOT NULL DEFAULT gen_random_uuid(),
	event_type text NOT NULL,
	payload jsonb NOT NULL,
	created_at timestamptz NOT NULL DEFAULT now(),
	dispatched_at timestamptz NULL
) PARTITION BY RANGE (created_at);
CREATE TABLE outbox_events_now PARTITION OF outbox_events FOR VALUES FROM (MINVALUE) TO ('2100-01-01');`

// insert2100 inserts n rows dated 2100 (the partition after outbox_events_now)
// into table, and returns their ids.
func (b *testBundle) insert2100(t *testing.T, table string, n int) []string {
	t.Helper()
	return b.insertIn(t, "UTC", fmt.Sprintf(`INSERT INTO %s (event_type, payload, created_at)
		SELECT 'in2100', '{}', '2100-01-02'::timestamptz FROM generate_series(1, %d) RETURNING id::text`, table, n))
}

// A table that already holds outbox rows (a backfill, a migration) is
// attached as a partition of the partitioned outbox table, whose
// publication covers its partitions: the slot streams its inserts from the
// ATTACH on, but its rows entered the WAL as another table's and were
// never streamed; counted as covered, they were in no catch-up either, and
// cleanup --slot deleted them by age later (a review's reproduction). The
// relay now finds the partition new to what its progress records and
// publishes its rows; cleanup --slot deletes nothing until it has.
func TestReplicationPublishesTheRowsOfAnAttachedPartition(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{ddl: partitionedDDL})
	ctx := context.Background()
	cfg := b.replicating(t, Config{Slot: "relay_attached", BatchSize: 10, PollInterval: 100 * time.Millisecond})
	stop := runInBackground(t, b.newRelay(t, cfg))
	b.waitCaughtUp(t, cfg.Slot)
	first := b.insertNow(t, 3)
	b.waitStream(t, first)
	require.NoError(t, stop()) // so that the cleanup looks first

	_, err := b.db.Exec(ctx, `CREATE TABLE outbox_events_2100 (LIKE outbox_events INCLUDING DEFAULTS)`)
	require.NoError(t, err)
	attached := b.insert2100(t, "outbox_events_2100", 3)
	_, err = b.db.Exec(ctx, `ALTER TABLE outbox_events ATTACH PARTITION outbox_events_2100 FOR VALUES FROM ('2100-01-01') TO (MAXVALUE)`)
	require.NoError(t, err)
	opts := logical.Options{Table: b.table, Slot: cfg.Slot}
	fresh, err := logical.NotPublished(ctx, b.db, opts)
	require.NoError(t, err)
	require.Len(t, fresh, 1, "cleanup --slot holds for it")
	require.Equal(t, "outbox_events_2100", fresh[0].Name)

	stop = runInBackground(t, b.newRelay(t, cfg))
	later := b.insertNow(t, 3)
	b.waitStream(t, slices.Concat(first, attached, later))
	require.NoError(t, stop())
	fresh, err = logical.NotPublished(ctx, b.db, opts)
	require.NoError(t, err)
	require.Empty(t, fresh, "recorded once published")
}

// A partition made UNLOGGED: its inserts never reach the WAL, so the slot
// never streams them, while the publication lists it all the same (it
// names the partitioned table). It counted as covered: its rows were in
// no stream and no catch-up (a review's reproduction). The relay now
// refuses to go on, saying which table and how to fix it, and once the
// partition is LOGGED again publishes the rows it holds.
func TestReplicationRefusesAnUnloggedPartitionAndPublishesItOnceLogged(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{ddl: partitionedDDL})
	ctx := context.Background()
	cfg := b.replicating(t, Config{Slot: "relay_unlogged", BatchSize: 10, PollInterval: 100 * time.Millisecond})
	r := b.newRelay(t, cfg)
	stop := runInBackground(t, r)
	b.waitCaughtUp(t, cfg.Slot)
	_, err := b.db.Exec(ctx, `CREATE TABLE outbox_events_2100 PARTITION OF outbox_events FOR VALUES FROM ('2100-01-01') TO (MAXVALUE)`)
	require.NoError(t, err)
	first := slices.Concat(b.insertNow(t, 3), b.insert2100(t, "outbox_events", 2))
	b.waitStream(t, first)
	opts := logical.Options{Table: b.table, Slot: cfg.Slot}
	waitFor(t, "the new partition recorded", func() bool {
		fresh, err := logical.NotPublished(ctx, b.db, opts)
		return err == nil && len(fresh) == 0
	})

	_, err = b.db.Exec(ctx, `ALTER TABLE outbox_events_2100 SET UNLOGGED`)
	require.NoError(t, err)
	unlogged := b.insert2100(t, "outbox_events", 3)
	waitFor(t, "the relay refusing the unlogged partition", func() bool {
		err := r.Ready()
		return err != nil && errors.Is(err, logical.ErrUnlogged) && strings.Contains(err.Error(), "outbox_events_2100")
	})
	require.ErrorContains(t, r.Ready(), "SET LOGGED")
	children, err := logical.Uncovered(ctx, b.db, opts)
	require.NoError(t, err)
	require.Len(t, children, 1, "listed as not covered, so cleanup --slot deletes nothing")
	require.True(t, children[0].Unlogged)

	_, err = b.db.Exec(ctx, `ALTER TABLE outbox_events_2100 SET LOGGED`)
	require.NoError(t, err)
	later := b.insertNow(t, 3)
	b.waitStream(t, slices.Concat(first, unlogged, later))

	// UNLOGGED and LOGGED again in one transaction: no look sees it
	// unlogged, but SET LOGGED rewrote the table, so it is new to the
	// record all the same (a review's reproduction: 3 of 3 lost).
	tx, err := b.db.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `ALTER TABLE outbox_events_2100 SET UNLOGGED`)
	require.NoError(t, err)
	rows, err := tx.Query(ctx, `INSERT INTO outbox_events (event_type, payload, created_at)
		SELECT 'unseen', '{}', '2100-01-03'::timestamptz FROM generate_series(1, 3) RETURNING id::text`)
	require.NoError(t, err)
	unseen, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `ALTER TABLE outbox_events_2100 SET LOGGED`)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	b.waitStream(t, slices.Concat(first, unlogged, later, unseen))
	require.NoError(t, stop())
}

// A catch-up that ends after its slot was dropped and made again must not
// record the new slot's catch-up done: relay A catches up on slot #1 and is
// held before it records that; rows are committed (in slot #1's stream
// only) and slot #1 is dropped; relay B makes slot #2, records its
// catch-up due and is stopped before it publishes anything; then A records
// its catch-up done. The rows committed between A's snapshot and slot #2
// are in no stream: the next relay on slot #2 must catch up again.
func TestReplicationOutdatedCatchUpLeavesTheNewSlotsCatchUpDue(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	ctx := context.Background()
	cfg := b.replicating(t, Config{Slot: "relay_outdated_catch_up", BatchSize: 10})
	before := b.insertNow(t, 3)

	aAt, aGo := make(chan struct{}), make(chan struct{})
	var aHeld atomic.Bool
	a := b.newRelay(t, cfg)
	a.testHookCatchUp = func(ctx context.Context, done bool) error {
		if !done || !aHeld.CompareAndSwap(false, true) {
			return nil
		}
		close(aAt)
		select {
		case <-aGo:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	stopA := runInBackground(t, a)
	waitClosed(t, "relay A at the end of its catch-up", aAt)
	b.waitStream(t, before)

	gap := b.insertNow(t, 5) // after A's snapshot, in slot #1's stream only
	require.NoError(t, logical.DropSlot(ctx, b.db, cfg.Slot))

	bAt := make(chan struct{})
	var bHeld atomic.Bool
	rb := b.newRelay(t, cfg)
	rb.testHookCatchUp = func(ctx context.Context, _ bool) error {
		if bHeld.CompareAndSwap(false, true) {
			close(bAt)
		}
		<-ctx.Done()
		return ctx.Err()
	}
	stopB := runInBackground(t, rb)
	waitClosed(t, "relay B in its catch-up on slot #2", bAt)
	require.NoError(t, stopB())

	// A records its catch-up done, finds its slot gone and takes slot #2.
	close(aGo)
	b.waitStream(t, gap)
	require.NoError(t, stopA())
	requireAtLeastOnce(t, b.readStream(t, b.stream), append(before, gap...))
}

// TestReplicationSlotDroppedAfterItWasSeenGetsACatchUp: a relay finds its
// slot there and nothing due, and the slot is dropped before the relay's
// Setup runs (another relay dropped it as lost, and had not recorded its
// catch-up, or stopped first). The relay creates the slot again; the rows
// the dropped slot held, and those committed while there was none, are in
// no stream: the relay records a catch-up due before it creates the slot,
// and publishes them from the table. Made again: the other relay also
// recorded its catch-up due and created the slot before this relay's
// Setup, and this relay takes the slot first; it must do that catch-up
// (it read the progress before, when nothing was due: a review found the
// gap never published, and this relay's progress moving the catch-up's
// bound past it).
func TestReplicationSlotDroppedAfterItWasSeenGetsACatchUp(t *testing.T) {
	t.Parallel()
	for _, remade := range []bool{false, true} {
		t.Run(map[bool]string{false: "dropped", true: "made again"}[remade], func(t *testing.T) {
			t.Parallel()
			b := setup(t, bundleOpts{})
			cfg := b.replicating(t, Config{BatchSize: 50, Slot: map[bool]string{false: "relay_test_dropped", true: "relay_test_remade"}[remade]})
			stop := runInBackground(t, b.newRelay(t, cfg))
			first := b.insertNow(t, 10)
			b.waitStream(t, first)
			b.waitCaughtUp(t, cfg.Slot)
			require.NoError(t, stop())

			held := b.insertNow(t, 10) // in the slot's WAL, not yet streamed
			r := b.newRelay(t, cfg)
			var gap []string
			dropped := make(chan struct{})
			var once sync.Once
			r.testHookBeforeSetup = func(ctx context.Context) {
				once.Do(func() {
					defer close(dropped)
					if err := logical.DropSlot(ctx, b.db, cfg.Slot); err != nil {
						t.Errorf("dropping the slot: %v", err)
					}
					gap = b.insertNow(t, 10) // committed while there is no slot
					if !remade {
						return
					}
					// The other relay's prepareSlot: its catch-up due, then the slot.
					if _, err := b.table.StartCatchUp(ctx, b.db, cfg.Slot, true, nil); err != nil {
						t.Errorf("recording the catch-up: %v", err)
					}
					if err := logical.Setup(ctx, b.db, logical.Options{Table: b.table, Slot: cfg.Slot}); err != nil {
						t.Errorf("creating the slot: %v", err)
					}
				})
			}
			stop = runInBackground(t, r)
			<-dropped
			b.waitStream(t, slices.Concat(first, held, gap))
			later := b.insertNow(t, 5)
			b.waitStream(t, later)
			require.NoError(t, stop())
			requireAtLeastOnce(t, b.readStream(t, b.stream), slices.Concat(first, held, gap, later))
		})
	}
}

// TestReplicationCatchUpTakesATransactionLongerThanTheMargin: a producer's
// transaction inserts a row and stays open for longer than the catch-up
// margin while others commit and the relay records their progress; the
// relay stops, the long transaction commits, and the slot is lost before
// any relay streams it. The new slot's catch-up reads from the last commit
// less the margin, after the row's created_at (its transaction's start):
// the xmin horizon must take it (a review found it in no stream).
func TestReplicationCatchUpTakesATransactionLongerThanTheMargin(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	ctx := context.Background()
	const margin = time.Second
	cfg := b.replicating(t, Config{Slot: "relay_long_transaction", BatchSize: 50, CatchUpMargin: margin})
	stop := runInBackground(t, b.newRelay(t, cfg))
	b.waitCaughtUp(t, cfg.Slot)

	long := b.beginLong(t)
	var longID string
	var began time.Time
	require.NoError(t, long.QueryRow(ctx, `INSERT INTO outbox_events (event_type, payload) VALUES ('long', '{}')
		RETURNING id::text, created_at`).Scan(&longID, &began))
	var others []string
	waitFor(t, "progress recorded well past the long transaction's start", func() bool {
		others = append(others, b.insertNow(t, 1)...)
		time.Sleep(50 * time.Millisecond)
		p, _, err := b.table.ReadProgress(ctx, b.db, cfg.Slot)
		require.NoError(t, err)
		return p.LastCommit != nil && p.LastCommit.After(began.Add(3*margin))
	})
	b.waitStream(t, others)
	require.NoError(t, stop())

	require.NoError(t, long.Commit(ctx))
	require.NoError(t, logical.DropSlot(ctx, b.db, cfg.Slot)) // as the server drops an invalidated slot

	stop = runInBackground(t, b.newRelay(t, cfg))
	b.waitStream(t, []string{longID})
	require.NoError(t, stop())
	requireAtLeastOnce(t, b.readStream(t, b.stream), append(others, longID))
}

// TestReplicationPublishesRowsInsertedWhileTheTableWasUnlogged: under a
// publication FOR TABLES IN SCHEMA (or FOR ALL TABLES), ALTER TABLE SET
// UNLOGGED is allowed, and the inserts of an unlogged table are not in the
// WAL: the slot never sees them. SET LOGGED changes nothing in the
// publication's catalog, so the fingerprint came back as recorded and no gap
// was published: the rows inserted meanwhile were lost, though the relay's
// error said they would be published. A review found it.
//
// Such a publication also publishes the schema's other tables: their
// inserts are no events. The relay parked each as malformed, the dead-letter
// table among them, so each parked row was parked again, without end.
func TestReplicationPublishesRowsInsertedWhileTheTableWasUnlogged(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	ctx := context.Background()
	b.exec(t, `CREATE TABLE app_orders (order_id int PRIMARY KEY);
		CREATE PUBLICATION outbox_events_pub FOR TABLES IN SCHEMA public`)
	cfg := b.replicating(t, Config{Slot: "relay_unlogged", BatchSize: 10, PollInterval: 100 * time.Millisecond,
		CatchUpMargin: time.Second})
	relay := b.newRelay(t, cfg)
	stop := runInBackground(t, relay)
	b.waitCaughtUp(t, cfg.Slot)
	b.exec(t, `INSERT INTO app_orders VALUES (1)`) // not an event
	all := b.insertNow(t, 2)
	b.waitStream(t, all)

	b.exec(t, `ALTER TABLE outbox_events SET UNLOGGED`)
	waitFor(t, "the relay's error", func() bool {
		return errors.Is(relay.Ready(), logical.ErrPublicationChanged)
	})
	all = append(all, b.insertNow(t, 3)...) // not in the WAL
	b.exec(t, `ALTER TABLE outbox_events SET LOGGED`)
	all = append(all, b.insertNow(t, 1)...)
	b.waitStream(t, all)
	require.NoError(t, stop())
	var parked int
	require.NoError(t, b.db.QueryRow(ctx, `SELECT count(*) FROM outbox_events_dead_letters`).Scan(&parked))
	require.Zero(t, parked, "rows of other tables of the publication parked as events")
}

// The slot skips, for good, every insert made while the publication did not
// publish the table (pgoutput decodes an insert with the catalog of its
// place in the WAL): the relay watches the publication's fingerprint and
// publishes those rows from the table. Each step failed before: the rows of
// the gap never reached the stream.
func TestReplicationPublishesWhatThePublicationSkipped(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	ctx := context.Background()
	cfg := b.replicating(t, Config{Slot: "relay_publication", BatchSize: 10, PollInterval: 100 * time.Millisecond,
		CatchUpMargin: time.Second})
	relay := b.newRelay(t, cfg)
	stop := runInBackground(t, relay)
	b.waitCaughtUp(t, cfg.Slot)
	all := b.insertNow(t, 3)
	b.waitStream(t, all)

	// Dropped and added again at once, with a transaction that inserts in
	// the gap and commits well after the relay saw the change: the catch-up
	// waits for it.
	long := b.beginLong(t)
	_, err := long.Exec(ctx, `SELECT pg_current_xact_id()`)
	require.NoError(t, err)
	time.Sleep(2 * cfg.CatchUpMargin) // the catch-up's bound by time passes its start
	all = append(all, b.insertNow(t, 1)...)
	b.waitStream(t, all)
	b.exec(t, `ALTER PUBLICATION outbox_events_pub DROP TABLE outbox_events`)
	gap := append(insertInTx(t, long, 2), b.insertNow(t, 2)...)
	b.exec(t, `ALTER PUBLICATION outbox_events_pub ADD TABLE outbox_events`)
	after := b.insertNow(t, 1)
	b.waitStream(t, after)
	time.Sleep(2 * time.Second) // the relay looked (at least once a second), and waits
	// A new walsender decodes the transaction's rows with a cold cache,
	// which skips them (as PostgreSQL 15's pg_logical_slot_get_changes
	// does; a warm one may not): the next relay must wait for it too.
	require.NoError(t, stop())
	relay = b.newRelay(t, cfg)
	stop = runInBackground(t, relay)
	time.Sleep(time.Second)
	require.NoError(t, long.Commit(ctx))
	all = slices.Concat(all, gap, after, b.insertNow(t, 1))
	b.waitStream(t, all)

	// Dropped and left: the relay adds the table back.
	b.exec(t, `ALTER PUBLICATION outbox_events_pub DROP TABLE outbox_events`)
	all = append(all, b.insertNow(t, 2)...)
	b.waitStream(t, all)
	var listed bool
	require.NoError(t, b.db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_publication_tables
		WHERE pubname = 'outbox_events_pub' AND tablename = 'outbox_events')`).Scan(&listed))
	require.True(t, listed, "the relay adds the table back")

	// No inserts published for a while: an error until it does again.
	b.exec(t, `ALTER PUBLICATION outbox_events_pub SET (publish = 'update')`)
	all = append(all, b.insertNow(t, 2)...)
	waitFor(t, "the relay's error", func() bool {
		return errors.Is(relay.Ready(), logical.ErrPublicationChanged)
	})
	b.exec(t, `ALTER PUBLICATION outbox_events_pub SET (publish = 'insert')`)
	all = append(all, b.insertNow(t, 1)...)
	b.waitStream(t, all)

	// Dropped: the relay makes it again, and the slot, which cannot decode
	// past the drop, with the catch-up of a lost slot.
	b.exec(t, `DROP PUBLICATION outbox_events_pub`)
	all = append(all, b.insertNow(t, 2)...)
	b.waitStream(t, all)
	all = append(all, b.insertNow(t, 1)...)
	b.waitStream(t, all)
	require.NoError(t, stop())

	// Changed and changed back while no relay ran: the next one finds the
	// fingerprint recorded is not the publication's.
	b.exec(t, `ALTER PUBLICATION outbox_events_pub DROP TABLE outbox_events`)
	all = append(all, b.insertNow(t, 2)...)
	b.exec(t, `ALTER PUBLICATION outbox_events_pub ADD TABLE outbox_events`)
	stop = runInBackground(t, b.newRelay(t, cfg))
	all = append(all, b.insertNow(t, 1)...)
	b.waitStream(t, all)
	require.NoError(t, stop())
	requireAtLeastOnce(t, b.readStream(t, b.stream), all)
}

// A publication changed while a new slot's first catch-up reads the table
// (found by a review): the first look of the stream took what it saw as the
// baseline, and the rows inserted while the table was out were lost. The
// baseline is recorded before the slot is made.
func TestReplicationPublicationChangedDuringTheFirstCatchUp(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	cfg := b.replicating(t, Config{Slot: "relay_publication_first", BatchSize: 10, PollInterval: 100 * time.Millisecond,
		CatchUpMargin: time.Second})
	before := b.insertNow(t, 3)
	r := b.newRelay(t, cfg)
	var gap []string
	var once atomic.Bool
	r.testHookCatchUp = func(ctx context.Context, done bool) error {
		if !done || !once.CompareAndSwap(false, true) {
			return nil
		}
		_, err := b.db.Exec(ctx, `ALTER PUBLICATION outbox_events_pub DROP TABLE outbox_events`)
		require.NoError(t, err)
		gap = b.insertNow(t, 3)
		_, err = b.db.Exec(ctx, `ALTER PUBLICATION outbox_events_pub ADD TABLE outbox_events`)
		require.NoError(t, err)
		return nil
	}
	stop := runInBackground(t, r)
	b.waitStream(t, before)
	after := b.insertNow(t, 1)
	b.waitStream(t, slices.Concat(before, gap, after))
	require.NoError(t, stop())
}

// An inheritance child dropped from the publication and added back between
// two looks (found by a review): the child's entry is in the fingerprint,
// so the rows inserted into it meanwhile are published from the table,
// while the children the relay adds itself change nothing.
func TestReplicationChildDroppedAndAddedBack(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	b.exec(t, `CREATE TABLE outbox_c1 () INHERITS (outbox_events)`)
	cfg := b.replicating(t, Config{Slot: "relay_publication_child", BatchSize: 10, PollInterval: 100 * time.Millisecond,
		CatchUpMargin: time.Second})
	stop := runInBackground(t, b.newRelay(t, cfg))
	b.waitCaughtUp(t, cfg.Slot)
	insertChild := func(n int) []string {
		return b.insertIn(t, "UTC", fmt.Sprintf(`INSERT INTO outbox_c1 (event_type, payload)
			SELECT 'c1', '{}' FROM generate_series(1, %d) RETURNING id::text`, n))
	}
	all := insertChild(2)
	b.waitStream(t, all)
	time.Sleep(1500 * time.Millisecond) // a look that saw c1 in the publication
	b.exec(t, `ALTER PUBLICATION outbox_events_pub DROP TABLE ONLY outbox_c1`)
	all = append(all, insertChild(3)...)
	b.exec(t, `ALTER PUBLICATION outbox_events_pub ADD TABLE ONLY outbox_c1`)
	all = append(all, insertChild(1)...)
	b.waitStream(t, all)
	require.NoError(t, stop())
}

// A change whose commit is in the WAL but not yet visible when the relay
// looks (it waits for a synchronous standby; found by a review): a
// transaction that inserted after it and committed first is older than
// that look's xmin. A look's xmin bounds a gap only once a later look saw
// every transaction then running end; the change is one. Its own server:
// the case sets synchronous_standby_names.
func TestReplicationPublicationChangeWaitingForASynchronousStandby(t *testing.T) {
	t.Parallel()
	pg := testenv.StartPostgres(t)
	b := setup(t, bundleOpts{dsn: pg.DSN()})
	ctx := context.Background()
	cfg := b.replicating(t, Config{Slot: "relay_publication_syncrep", BatchSize: 10, PollInterval: 100 * time.Millisecond,
		CatchUpMargin: time.Second})
	stop := runInBackground(t, b.newRelay(t, cfg))
	b.waitCaughtUp(t, cfg.Slot)
	all := b.insertNow(t, 2)
	b.waitStream(t, all)
	producer, err := b.db.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = producer.Rollback(ctx) }()
	all = append(all, insertInTx(t, producer, 1)...)
	// Others insert before the DROP and commit after the producer, a
	// second apart: their rows are streamed, and the progress they record
	// moves the slot's own horizon past the producer.
	others := make([]pgx.Tx, 3)
	for i := range others {
		conn, err := pgx.Connect(ctx, pg.DSN())
		require.NoError(t, err)
		defer func() { _ = conn.Close(ctx) }()
		others[i], err = conn.Begin(ctx)
		require.NoError(t, err)
		all = append(all, insertInTx(t, others[i], 1)...)
	}
	b.exec(t, `ALTER SYSTEM SET synchronous_standby_names = 'nosuch'`)
	b.exec(t, `SELECT pg_reload_conf()`)
	time.Sleep(500 * time.Millisecond)
	dropped := make(chan error, 1)
	go func() {
		conn, err := pgx.Connect(ctx, pg.DSN())
		if err == nil {
			defer func() { _ = conn.Close(ctx) }()
			_, err = conn.Exec(ctx, `SET synchronous_commit = on; ALTER PUBLICATION outbox_events_pub DROP TABLE outbox_events`)
		}
		dropped <- err
	}()
	var pid int
	waitFor(t, "the DROP waiting for the standby", func() bool {
		return b.db.QueryRow(ctx, `SELECT pid FROM pg_stat_activity WHERE wait_event = 'SyncRep'`).Scan(&pid) == nil
	})
	all = append(all, insertInTx(t, producer, 3)...) // after the DROP in the WAL: skipped
	require.NoError(t, producer.Commit(ctx))
	for _, o := range others {
		time.Sleep(1200 * time.Millisecond) // the relay looks while the DROP is invisible
		require.NoError(t, o.Commit(ctx))
	}
	time.Sleep(3 * time.Second)
	b.exec(t, fmt.Sprintf(`SELECT pg_cancel_backend(%d)`, pid)) // the DROP, committed locally, becomes visible
	// The cancel ends the wait; the DROP stays committed (PostgreSQL warns).
	require.NoError(t, <-dropped)
	b.exec(t, `ALTER SYSTEM RESET synchronous_standby_names`)
	b.exec(t, `SELECT pg_reload_conf()`)
	all = append(all, b.insertNow(t, 1)...)
	b.waitStream(t, all)
	require.NoError(t, stop())
}

// TestReplicationCatchUpWaitsForACommitInTheWALNotYetVisible: a new slot
// streams the transactions whose commit record is after its consistent
// point; the catch-up reads the table in a snapshot taken after the slot
// streams. A commit waiting for a synchronous standby is in the WAL but not
// yet visible: when its commit record lies between the slot's FULL_SNAPSHOT
// and CONSISTENT points (it began after the former), the slot skips it, so
// the catch-up must wait for it to end before its snapshot. Before, it did
// not: the row was in no stream (found by a review, 2026-12-05). Here the
// standby acknowledges 3 seconds after the slot streams; the catch-up must
// not be done before.
//
// The two long transactions only hold the slot's creation in its phases so
// that the producer's commit lands in that window deterministically; on a
// busy server with synchronous replication, transactions overlapping the
// creation do the same by themselves.
func TestReplicationCatchUpWaitsForACommitInTheWALNotYetVisible(t *testing.T) {
	t.Parallel()
	pg := testenv.StartPostgres(t)
	b := setup(t, bundleOpts{dsn: pg.DSN()})
	ctx := context.Background()
	cfg := b.replicating(t, Config{Slot: "relay_syncrep_create", BatchSize: 10, CatchUpMargin: time.Second})
	before := b.insertNow(t, 2)

	// A synchronous standby that has not acknowledged yet. Only sessions
	// with synchronous_commit = on wait (the test server runs with off).
	b.exec(t, `ALTER SYSTEM SET synchronous_standby_names = 'nosuch'`)
	b.exec(t, `SELECT pg_reload_conf()`)
	t.Cleanup(func() {
		_, _ = b.db.Exec(context.Background(), `ALTER SYSTEM RESET synchronous_standby_names`)
		_, _ = b.db.Exec(context.Background(), `SELECT pg_reload_conf()`)
	})

	conn := func() *pgx.Conn {
		c, err := pgx.Connect(ctx, pg.DSN())
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close(context.Background()) })
		return c
	}
	begin := func(c *pgx.Conn) (pgx.Tx, int) {
		tx, err := c.Begin(ctx)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, `SELECT pg_current_xact_id()`)
		require.NoError(t, err)
		var pid int
		require.NoError(t, tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid))
		return tx, pid
	}
	creationWaitsFor := func(pid int) func() bool {
		return func() bool {
			var ok bool
			err := b.db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
				WHERE query LIKE '%pg_create_logical_replication_slot%' AND pid <> pg_backend_pid()
				AND $1 = ANY (pg_blocking_pids(pid)))`, pid).Scan(&ok)
			return err == nil && ok
		}
	}

	// A transaction running when the relay creates its slot.
	l1, pid1 := begin(conn())
	r := b.newRelay(t, cfg)
	stop := runInBackground(t, r)
	waitFor(t, "the slot's creation waiting for the first transaction (BUILDING_SNAPSHOT)", creationWaitsFor(pid1))

	// One that begins meanwhile: the creation's next phase waits for it.
	l2, pid2 := begin(conn())
	require.NoError(t, l1.Rollback(ctx))
	waitFor(t, "the slot's creation waiting for the second transaction (FULL_SNAPSHOT)", creationWaitsFor(pid2))

	// A producer commits now: its commit record is in the WAL, and it waits
	// for the standby's acknowledgement, still invisible.
	pc := conn()
	producer, err := pc.Begin(ctx)
	require.NoError(t, err)
	_, err = producer.Exec(ctx, `SET LOCAL synchronous_commit = on`)
	require.NoError(t, err)
	waiting := insertInTx(t, producer, 1)
	committed := make(chan error, 1)
	go func() { committed <- producer.Commit(ctx) }()
	waitFor(t, "the producer's commit waiting for the standby", func() bool {
		var n int
		require.NoError(t, b.db.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'`).Scan(&n))
		return n == 1
	})

	// The slot becomes consistent and streams to the relay, whose catch-up
	// waits for the producer's commit.
	require.NoError(t, l2.Rollback(ctx))
	waitFor(t, "the slot streaming", func() bool {
		var active bool
		err := b.db.QueryRow(ctx, `SELECT active FROM pg_replication_slots WHERE slot_name = $1`, cfg.Slot).Scan(&active)
		return err == nil && active
	})
	time.Sleep(3 * time.Second)
	p, ok, err := b.table.ReadProgress(ctx, b.db, cfg.Slot)
	require.NoError(t, err)
	require.True(t, ok && p.CatchUpPending, "the catch-up read the table before a commit in the WAL was visible: %v %+v", ok, p)

	// The standby acknowledges: the producer's row is visible, committed.
	b.exec(t, `ALTER SYSTEM RESET synchronous_standby_names`)
	b.exec(t, `SELECT pg_reload_conf()`)
	select {
	case err := <-committed:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("the producer's commit still waits")
	}
	var visible int
	require.NoError(t, b.db.QueryRow(ctx, `SELECT count(*) FROM outbox_events WHERE id::text = $1`, waiting[0]).Scan(&visible))
	require.Equal(t, 1, visible, "the producer's row is committed")
	b.waitCaughtUp(t, cfg.Slot)

	later := b.insertNow(t, 2)
	b.waitStream(t, slices.Concat(before, later))
	time.Sleep(2 * time.Second) // anything still on its way
	require.NoError(t, stop())

	// A relay started again does not find it either (nothing is due).
	stop = runInBackground(t, b.newRelay(t, cfg))
	last := b.insertNow(t, 1)
	b.waitStream(t, last)
	require.NoError(t, stop())

	seen := map[string]bool{}
	for _, e := range b.readStream(t, b.stream) {
		seen[e[FieldEventID]] = true
	}
	require.True(t, seen[waiting[0]], "event %s, committed (in the WAL before the new slot's consistent point, "+
		"visible only after the catch-up's snapshot), is in no stream: lost", waiting[0])
}

// swapIn replaces the outbox table by a new one of the same name (as a
// table-swap migration does: pg-osc, a column type change by copy, or a
// drop and create), and inserts n rows into the new one, in the same
// transaction: the publication lists the old table (by oid), so the slot
// skips those inserts, and the relay only adds the new table afterwards.
// It returns their ids.
func (b *testBundle) swapIn(t *testing.T, old string, n int) []string {
	t.Helper()
	ctx := context.Background()
	tx, err := b.db.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, fmt.Sprintf(`ALTER TABLE outbox_events RENAME TO %[1]s;
		CREATE TABLE outbox_events (LIKE %[1]s INCLUDING ALL)`, old))
	require.NoError(t, err)
	ids := insertInTx(t, tx, n)
	require.NoError(t, tx.Commit(ctx))
	return ids
}

// The outbox table swapped for a new one of the same name: the new table is
// not in the publication (which names tables by oid) until the relay adds
// it back, and the inserts made into it before that are skipped by the
// slot. The fingerprint's entry of the old table counted as a table that
// left the tree, so no gap was found and those rows were lost with the
// relay ready (a review's reproduction), both while the relay streamed and
// while no relay ran.
func TestReplicationPublishesTheRowsOfATableSwappedIn(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	cfg := b.replicating(t, Config{Slot: "relay_swapped", BatchSize: 10, PollInterval: 100 * time.Millisecond,
		CatchUpMargin: time.Second})
	stop := runInBackground(t, b.newRelay(t, cfg))
	b.waitCaughtUp(t, cfg.Slot)
	all := b.insertNow(t, 3)
	b.waitStream(t, all)
	time.Sleep(3 * time.Second) // a confirmed look, and a progress write past the catch-up

	// While the relay streams.
	swapped := append(b.swapIn(t, "outbox_swapped1", 3), b.insertNow(t, 2)...)
	b.waitPublished(t, "outbox_events")
	later := b.insertNow(t, 2)
	b.waitStream(t, later) // the relay streams from the new table
	all = slices.Concat(all, swapped, later)
	b.waitStream(t, all)
	time.Sleep(3 * time.Second)
	require.NoError(t, stop())

	// While no relay runs.
	all = append(all, b.swapIn(t, "outbox_swapped2", 3)...)
	stop = runInBackground(t, b.newRelay(t, cfg))
	all = append(all, b.insertNow(t, 2)...)
	b.waitStream(t, all)
	require.NoError(t, stop())
	requireAtLeastOnce(t, b.readStream(t, b.stream), all)
}

// waitPublished waits until the publication lists table (the relay adds a
// table that is missing).
func (b *testBundle) waitPublished(t *testing.T, table string) {
	t.Helper()
	waitFor(t, table+" in the publication", func() bool {
		var listed bool
		require.NoError(t, b.db.QueryRow(context.Background(), `SELECT EXISTS (SELECT 1 FROM pg_publication_rel r
			JOIN pg_publication p ON p.oid = r.prpubid WHERE p.pubname = 'outbox_events_pub' AND r.prrelid = to_regclass($1))`,
			table).Scan(&listed))
		return listed
	})
}

// TestReplicationSlotMovedWhileNoRelayStreamedGetsACatchUp: while no relay
// streams, rows are committed and the slot is moved past them by someone
// else: dropped and made again by hand (or by a tool), or advanced with
// pg_replication_slot_advance. The slot exists when the relay starts, so
// nothing says it was lost, but it never streams those rows: the relay must
// find its slot ahead of the position it confirmed, and publish the gap
// from the table. A slot left alone (also one that moved while idle, past
// another table's writes) must not be taken for a moved one.
func TestReplicationSlotMovedWhileNoRelayStreamedGetsACatchUp(t *testing.T) {
	t.Parallel()
	for _, move := range []string{"made again", "advanced", "untouched"} {
		t.Run(move, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			b := setup(t, bundleOpts{})
			cfg := b.replicating(t, Config{BatchSize: 50, CatchUpMargin: time.Second,
				Slot: "relay_test_moved_" + strings.ReplaceAll(move, " ", "_")})
			stop := runInBackground(t, b.newRelay(t, cfg))
			b.waitCaughtUp(t, cfg.Slot)
			first := b.insertNow(t, 10)
			b.waitStream(t, first)
			// Another table's writes while the relay is idle: the slot
			// moves past them (the reader's idle advance).
			b.exec(t, `CREATE TABLE other (x text)`)
			var lsn, moved pglogrepl.LSN
			require.NoError(t, b.db.QueryRow(ctx, `WITH w AS (INSERT INTO other SELECT repeat('x', 2000) FROM generate_series(1, 1000))
				SELECT pg_current_wal_lsn()::text`).Scan(&lsn)) // past idleConfirmBytes
			waitFor(t, "the idle slot to move past another table's writes", func() bool {
				st, err := logical.Status(ctx, b.db, cfg.Slot)
				require.NoError(t, err)
				moved = st.ConfirmedFlush
				return st.ConfirmedFlush >= lsn
			})
			require.NoError(t, stop())

			gap := b.insertNow(t, 10) // in the old slot's WAL, never streamed
			switch move {
			case "made again":
				require.NoError(t, logical.DropSlot(ctx, b.db, cfg.Slot))
				more := b.insertNow(t, 10) // committed while there is no slot
				gap = append(gap, more...)
				b.exec(t, fmt.Sprintf(`SELECT pg_create_logical_replication_slot('%s', 'pgoutput')`, cfg.Slot))
			case "advanced":
				// A slot advances only to WAL flushed (the test server
				// commits asynchronously): a synchronous commit flushes it.
				var end, to pglogrepl.LSN
				require.NoError(t, pgx.BeginFunc(ctx, b.db, func(tx pgx.Tx) error {
					_, err := tx.Exec(ctx, `SET LOCAL synchronous_commit TO on; INSERT INTO other VALUES ('y')`)
					return err
				}))
				require.NoError(t, b.db.QueryRow(ctx, `SELECT pg_current_wal_flush_lsn()::text`).Scan(&end))
				require.NoError(t, b.db.QueryRow(ctx, `SELECT end_lsn::text FROM pg_replication_slot_advance($1, $2::text::pg_lsn)`,
					cfg.Slot, end.String()).Scan(&to))
				require.Equal(t, end, to, "the slot advanced past the gap")
			}

			var logs syncbuf.Buffer
			cfg.Logger = newTestLogger(&logs)
			r := b.newRelay(t, cfg)
			stop = runInBackground(t, r)
			later := b.insertNow(t, 5)
			b.waitStream(t, later) // the slot streams again: any catch-up is done
			require.NoError(t, stop())
			entries := b.readStream(t, b.stream)
			all := slices.Concat(first, gap, later)
			lost := 0
			seen := map[string]bool{}
			for _, e := range entries {
				seen[e[FieldEventID]] = true
			}
			for _, id := range all {
				if !seen[id] {
					lost++
				}
			}
			t.Logf("%s: %d events, %d lost, %d stream entries; the slot had moved idle to %s", move, len(all), lost,
				len(entries), moved)
			requireAtLeastOnce(t, entries, all)
			counted := testutilCounter(r.cfg.Metrics.Errors.WithLabelValues(ErrorKindSlotMoved))
			if move == "untouched" {
				require.Zero(t, counted, "a slot left alone taken for a moved one: %s", logs.String())
				require.NotContains(t, logs.String(), "Replication slot ahead of")
				return
			}
			require.InDelta(t, 1, counted, 0)
			require.Contains(t, logs.String(), `level=ERROR msg="Replication slot ahead of the position its relays confirmed`)
		})
	}
}

// TestReplicationStandbyDoesNotRedoACatchUpDoneWhileItWaited: a standby
// reads the slot's progress while the holder's catch-up is due, and the
// holder finishes it and stops before the standby takes the slot. What was
// due when the standby looked is done: it must not read the whole table
// again (a review of a fault case found every row of the catch-up
// published twice).
func TestReplicationStandbyDoesNotRedoACatchUpDoneWhileItWaited(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	cfg := b.replicating(t, Config{Slot: "relay_stale_due", BatchSize: 10})
	before := b.insertNow(t, 20)

	hAt, hGo := make(chan struct{}), make(chan struct{})
	var hHeld atomic.Bool
	h := b.newRelay(t, cfg)
	h.testHookCatchUp = func(ctx context.Context, done bool) error {
		if !done || !hHeld.CompareAndSwap(false, true) {
			return nil
		}
		close(hAt)
		select {
		case <-hGo:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	stopH := runInBackground(t, h)
	waitClosed(t, "the holder at the end of its catch-up", hAt)

	sAt, sGo := make(chan struct{}), make(chan struct{})
	var sHeld atomic.Bool
	var sCaughtUp atomic.Int64
	s := b.newRelay(t, cfg)
	s.testHookBeforeSetup = func(ctx context.Context) {
		if !sHeld.CompareAndSwap(false, true) {
			return
		}
		close(sAt)
		select {
		case <-sGo:
		case <-ctx.Done():
		}
	}
	s.testHookCatchUp = func(context.Context, bool) error {
		sCaughtUp.Add(1)
		return nil
	}
	stopS := runInBackground(t, s)
	waitClosed(t, "the standby, having read the catch-up due", sAt)

	close(hGo)
	// A row streamed by the holder: its catch-up is recorded done.
	streamed := b.insertNow(t, 2)
	b.waitStream(t, append(before, streamed...))
	require.NoError(t, stopH())
	close(sGo)

	after := b.insertNow(t, 3)
	b.waitStream(t, after)
	require.NoError(t, stopS())
	require.Zero(t, sCaughtUp.Load(), "the standby read the table again for a catch-up the holder had done")
	// The rows the holder streamed may come again from the slot (a
	// takeover resumes at the last confirmed position); the catch-up's
	// rows may not.
	entries := b.readStream(t, b.stream)
	requireAtLeastOnce(t, entries, slices.Concat(before, streamed, after))
	requireEachOnce(t, slices.DeleteFunc(entries, func(e entry) bool { return !slices.Contains(before, e[FieldEventID]) }), before)
}
