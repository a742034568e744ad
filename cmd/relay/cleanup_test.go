package main

import (
	"regexp"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outbox-dev/outbox-operator/internal/logical"
	"github.com/outbox-dev/outbox-operator/internal/outbox"
	"github.com/outbox-dev/outbox-operator/internal/testenv"
)

// insertRows writes n rows of kind (the event_type) created three hours ago
// and dispatched the given PostgreSQL interval ago ("" for pending rows), and
// returns their ids.
func insertRows(t *testing.T, db *pgxpool.Pool, kind string, n int, dispatchedAgo string) []string {
	t.Helper()
	var dispatched any
	if dispatchedAgo != "" {
		dispatched = dispatchedAgo
	}
	return queryStrings(t, db, `INSERT INTO outbox_events (event_type, payload, created_at, dispatched_at)
		SELECT $1, '{}', now() - $2::text::interval, now() - $3::text::interval FROM generate_series(1, $4)
		RETURNING id::text`, kind, "3 hours", dispatched, n)
}

func allRowIDs(t *testing.T, db *pgxpool.Pool) []string {
	t.Helper()
	return queryStrings(t, db, `SELECT id::text FROM outbox_events ORDER BY id`)
}

func sorted(ids ...[]string) []string {
	all := slices.Concat(ids...)
	slices.Sort(all)
	return all
}

var deletedRE = regexp.MustCompile(`^deleted (\d+) dispatched rows older than (\S+) from outbox_events in \S+\n$`)

// requireDeleted checks cleanup's report of n deleted rows.
func requireDeleted(t *testing.T, res result, n, retention string) {
	t.Helper()
	m := deletedRE.FindStringSubmatch(res.stdout)
	require.NotNil(t, m, "cleanup output: %q", res.stdout)
	require.Equal(t, n, m[1], "rows deleted")
	require.Equal(t, retention, m[2])
}

func TestCleanupDeletesOnlyOldDispatchedRows(t *testing.T) {
	t.Parallel()
	dsn, db := freshDB(t)
	env := relayEnv("DATABASE_URL=" + dsn)
	old := insertRows(t, db, "old", 3, "2 hours")
	recent := insertRows(t, db, "recent", 2, "10 minutes")
	pendingIDs := insertRows(t, db, "pending", 2, "")
	require.EqualValues(t, 2, pending(t, db))

	// The default retention is 72h: nothing is that old.
	requireDeleted(t, requireSuccess(t, env, "cleanup"), "0", "72h0m0s")
	require.Equal(t, sorted(old, recent, pendingIDs), allRowIDs(t, db))

	requireDeleted(t, requireSuccess(t, env, "cleanup", "--retention", "1h"), "3", "1h0m0s")
	require.Equal(t, sorted(recent, pendingIDs), allRowIDs(t, db),
		"only rows dispatched before the retention are gone; pending rows stay however old")
	require.ElementsMatch(t, pendingIDs,
		queryStrings(t, db, `SELECT id::text FROM outbox_events WHERE dispatched_at IS NULL`))

	requireDeleted(t, requireSuccess(t, env, "cleanup", "--retention=1h"), "0", "1h0m0s")
	require.Equal(t, sorted(recent, pendingIDs), allRowIDs(t, db), "a second run deletes nothing")

	// RELAY_RETENTION sets the flag like any other.
	requireDeleted(t, requireSuccess(t, relayEnv("DATABASE_URL="+dsn, "RELAY_RETENTION=5m"), "cleanup"), "2", "5m0s")
	require.Equal(t, sorted(pendingIDs), allRowIDs(t, db))
}

func TestCleanupDeletesInBatches(t *testing.T) {
	t.Parallel()
	dsn, db := freshDB(t)
	env := relayEnv("DATABASE_URL=" + dsn)
	insertRows(t, db, "old", 5, "2 hours")
	keep := insertRows(t, db, "recent", 1, "10 minutes")

	requireDeleted(t, requireSuccess(t, env, "cleanup", "--retention", "1h", "--batch-size", "2"), "5", "1h0m0s")
	require.Equal(t, keep, allRowIDs(t, db))

	// A batch size that divides the count: the last, empty batch ends it.
	insertRows(t, db, "old", 4, "2 hours")
	requireDeleted(t, requireSuccess(t, env, "cleanup", "--retention", "1h", "--batch-size", "2"), "4", "1h0m0s")
	require.Equal(t, keep, allRowIDs(t, db))
}

func TestCleanupRejectsInvalidFlags(t *testing.T) {
	t.Parallel()
	dsn, db := freshDB(t)
	insertRows(t, db, "old", 1, "2 hours")
	env := relayEnv("DATABASE_URL=" + dsn)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--batch-size", "0"}, "--batch-size 0 must be at least 1"},
		{[]string{"--retention", "-1h"}, "--retention -1h0m0s is negative"},
		{[]string{"--retention", "forever"}, "invalid argument"},
		{[]string{"--slot", "s", "--drop-partitions"}, "--drop-partitions judges dispatched_at"},
		{[]string{"--slot", "never_ran"}, "no published commit recorded for the slot: never_ran"},
	} {
		res := execRelay(t, env, append([]string{"cleanup"}, tc.args...)...)
		require.NotZero(t, res.code, "cleanup %v", tc.args)
		require.Contains(t, res.stderr, tc.want, "cleanup %v", tc.args)
	}
	require.Len(t, allRowIDs(t, db), 1, "nothing deleted")
}

// TestCleanupOfStreamedRows: with --slot (source LogicalReplication, whose
// rows are never marked), cleanup deletes by created_at, older than the
// retention and created before the slot's last published commit less the
// margin.
func TestCleanupOfStreamedRows(t *testing.T) {
	t.Parallel()
	dsn, db := freshDB(t)
	env := relayEnv("DATABASE_URL=" + dsn)
	old := insertRows(t, db, "old", 3, "") // created 3 hours ago, never marked
	_, err := db.Exec(t.Context(), `INSERT INTO outbox_events (event_type, payload) VALUES ('new', '{}')`)
	require.NoError(t, err)
	table := outbox.MustNew("", outbox.Columns{})
	require.NoError(t, table.EnsureProgressTable(t.Context(), db))
	require.NoError(t, table.RecordProgress(t.Context(), db, "orders", time.Now().Add(-2*time.Hour), true, nil))

	res := requireSuccess(t, env, "cleanup", "--slot", "orders", "--retention", "1h", "--catch-up-margin", "5m")
	require.Regexp(t, `^deleted 0 rows from outbox_events: the progress of slot orders was not logged 1h0m0s ago yet`, res.stdout)
	require.Len(t, allRowIDs(t, db), 4, "a relay younger than the retention: nothing known published that long ago")

	logProgress(t, db, "orders", 90*time.Minute, time.Now().Add(-2*time.Hour))
	res = requireSuccess(t, env, "cleanup", "--slot", "orders", "--retention", "1h", "--catch-up-margin", "5m")
	require.Regexp(t, `^deleted 3 rows created before \S+ \(older than 1h0m0s, and streamed by slot orders more than that ago\) `+
		`from outbox_events`, res.stdout)
	require.NotContains(t, allRowIDs(t, db), old[0])
	require.Len(t, allRowIDs(t, db), 1, "the row newer than the published commit stays")
}

// TestCleanupOfStreamedRowsRefusesWhileAChildIsNotPublished: rows of an
// inheritance child missing from the publication were never streamed, so
// cleanup --slot deletes nothing until a relay has added it.
func TestCleanupOfStreamedRowsRefusesWhileAChildIsNotPublished(t *testing.T) {
	t.Parallel()
	dsn, db := freshDB(t)
	env := relayEnv("DATABASE_URL=" + dsn)
	insertRows(t, db, "old", 2, "")
	_, err := db.Exec(t.Context(), `CREATE PUBLICATION outbox_events_pub FOR TABLE outbox_events WITH (publish = 'insert');
		CREATE TABLE outbox_late () INHERITS (outbox_events);
		INSERT INTO outbox_late (event_type, payload, created_at) VALUES ('late', '{}', now() - interval '3 hours')`)
	require.NoError(t, err)
	table := outbox.MustNew("", outbox.Columns{})
	require.NoError(t, table.EnsureProgressTable(t.Context(), db))
	require.NoError(t, table.RecordProgress(t.Context(), db, "orders", time.Now().Add(-time.Hour), true, nil))
	logProgress(t, db, "orders", 2*time.Hour, time.Now().Add(-time.Hour))

	res := execRelay(t, env, "cleanup", "--slot", "orders", "--retention", "1h", "--catch-up-margin", "5m")
	require.NotZero(t, res.code)
	require.Contains(t, res.stderr, `"public"."outbox_late" of outbox_events not in publication outbox_events_pub`)
	require.Contains(t, res.stderr, `ALTER PUBLICATION "outbox_events_pub" ADD TABLE ONLY "public"."outbox_late"`)
	require.Len(t, allRowIDs(t, db), 3, "nothing deleted")

	_, err = db.Exec(t.Context(), `ALTER PUBLICATION outbox_events_pub ADD TABLE ONLY outbox_late`)
	require.NoError(t, err)
	res = requireSuccess(t, env, "cleanup", "--slot", "orders", "--retention", "1h", "--catch-up-margin", "5m")
	require.Contains(t, res.stdout, "deleted 3 rows")
}

// TestCleanupOfStreamedRowsWaitsForAnAttachedPartition: a table attached
// as a partition brings rows the slot never streamed; cleanup --slot
// deletes nothing until the relay has published them (recorded the
// partition), and says so, exiting 0.
func TestCleanupOfStreamedRowsWaitsForAnAttachedPartition(t *testing.T) {
	t.Parallel()
	dsn, db := freshDB(t)
	env := relayEnv("DATABASE_URL=" + dsn)
	_, err := db.Exec(t.Context(), `DROP TABLE outbox_events;
		CREATE TABLE outbox_events (id uuid NOT NULL DEFAULT gen_random_uuid(), event_type text NOT NULL, payload jsonb NOT NULL,
			created_at timestamptz NOT NULL DEFAULT now(), dispatched_at timestamptz NULL) PARTITION BY RANGE (created_at);
		CREATE TABLE outbox_events_old PARTITION OF outbox_events FOR VALUES FROM (MINVALUE) TO ('2000-01-01');
		CREATE PUBLICATION outbox_events_pub FOR TABLE outbox_events WITH (publish = 'insert')`)
	require.NoError(t, err)
	table := outbox.MustNew("", outbox.Columns{})
	opts := logical.Options{Table: table, Slot: "orders"}
	require.NoError(t, table.EnsureProgressTable(t.Context(), db))
	require.NoError(t, table.RecordProgress(t.Context(), db, "orders", time.Now().Add(-time.Hour), true, nil))
	logProgress(t, db, "orders", 2*time.Hour, time.Now().Add(-time.Hour))
	recordPartitions := func() {
		t.Helper()
		parts, err := logical.Partitions(t.Context(), db, opts)
		require.NoError(t, err)
		require.NoError(t, table.RecordPartitions(t.Context(), db, "orders", logical.PartitionKeys(parts), false))
	}
	recordPartitions()

	_, err = db.Exec(t.Context(), `CREATE TABLE outbox_events_new (LIKE outbox_events INCLUDING DEFAULTS);
		INSERT INTO outbox_events_new (event_type, payload, created_at) SELECT 'backfill', '{}', now() - interval '3 hours'
			FROM generate_series(1, 2);
		ALTER TABLE outbox_events ATTACH PARTITION outbox_events_new FOR VALUES FROM ('2000-01-01') TO (MAXVALUE)`)
	require.NoError(t, err)
	res := requireSuccess(t, env, "cleanup", "--slot", "orders", "--retention", "1h", "--catch-up-margin", "5m")
	require.Contains(t, res.stdout, `deleted 0 rows from outbox_events: tables ["public"."outbox_events_new"] joined it`)
	require.Len(t, allRowIDs(t, db), 2, "nothing deleted")

	recordPartitions() // as the relay does once it published their rows
	res = requireSuccess(t, env, "cleanup", "--slot", "orders", "--retention", "1h", "--catch-up-margin", "5m")
	require.Contains(t, res.stdout, "deleted 2 rows")
}

// TestCleanupKeepsTheRowsOfAResetNotReplayed: while a stream reset waits
// for its replay, cleanup says so and keeps the rows the replay would
// republish (dispatched since the window's start; with --slot, every row),
// and exits 0: the StreamIntact condition is where the operator asks for
// the replay, not a failed Job.
func TestCleanupKeepsTheRowsOfAResetNotReplayed(t *testing.T) {
	t.Parallel()
	dsn, db := freshDB(t)
	env := relayEnv("DATABASE_URL=" + dsn)
	before := insertRows(t, db, "before", 2, "5 hours")
	inWindow := insertRows(t, db, "in the window", 3, "2 hours")
	table := outbox.MustNew("", outbox.Columns{})
	require.NoError(t, table.EnsureStreamResetsTable(t.Context(), db))
	now := time.Now()
	_, err := table.RecordStreamReset(t.Context(), db, outbox.StreamReset{
		Stream: "orders", WindowStart: now.Add(-3 * time.Hour), WindowEnd: now, Reason: "test",
	}, now)
	require.NoError(t, err)

	res := requireSuccess(t, env, "cleanup", "--retention", "1h")
	require.Regexp(t, `^keeping the rows dispatched since \S+: a stream reset waits for a replay `+
		`\(relay replay --pending; see outbox_events_stream_resets\)\n`+
		`deleted 2 dispatched rows older than 1h0m0s from outbox_events`, res.stdout)
	require.Equal(t, sorted(inWindow), allRowIDs(t, db))
	require.NotContains(t, allRowIDs(t, db), before[0])

	require.NoError(t, table.EnsureProgressTable(t.Context(), db))
	require.NoError(t, table.RecordProgress(t.Context(), db, "orders", time.Now(), true, nil))
	res = requireSuccess(t, env, "cleanup", "--slot", "orders", "--retention", "1h")
	require.Regexp(t, `^deleted 0 rows from outbox_events: a stream reset since \S+ waits for a replay \(relay replay --pending`, res.stdout)
	require.Equal(t, sorted(inWindow), allRowIDs(t, db))
}

// logProgress adds an entry to the progress log of slot (outbox_events), as
// if its relay had logged lastCommit ago.
func logProgress(t *testing.T, db *pgxpool.Pool, slot string, ago time.Duration, lastCommit time.Time) {
	t.Helper()
	_, err := db.Exec(t.Context(), `INSERT INTO outbox_events_relay_progress_log (slot, recorded_at, last_commit)
		VALUES ($1, now() - make_interval(secs => $2), $3)`, slot, ago.Seconds(), lastCommit)
	require.NoError(t, err)
}

// TestCleanupTakesTheSlotFromTheEnvironment pins why an OutboxRelay's
// relay.env may not set RELAY_SLOT (api/v1alpha1, relay.env): the operator
// passes --slot to the cleanup container only with source
// LogicalReplication, so on a Polling relay the variable fills it in, and
// cleanup --slot deletes rows by age, pending ones included.
func TestCleanupTakesTheSlotFromTheEnvironment(t *testing.T) {
	t.Parallel()
	dsn, db := freshDB(t)
	pendingIDs := insertRows(t, db, "pending", 3, "") // created 3 hours ago, never dispatched
	table := outbox.MustNew("", outbox.Columns{})
	require.NoError(t, table.EnsureProgressTable(t.Context(), db))
	// The progress a LogicalReplication relay of this table left behind.
	require.NoError(t, table.RecordProgress(t.Context(), db, "polling_was_a_slot", time.Now().Add(-2*time.Hour), true, nil))
	logProgress(t, db, "polling_was_a_slot", 90*time.Minute, time.Now().Add(-2*time.Hour))

	// The arguments of a Polling relay's cleanup CronJob (no --slot).
	args := []string{"cleanup", "--retention", "1h", "--batch-size", "1000"}
	res := requireSuccess(t, relayEnv("DATABASE_URL="+dsn), args...)
	requireDeleted(t, res, "0", "1h0m0s")
	require.ElementsMatch(t, pendingIDs, allRowIDs(t, db), "without the variable no pending row is deleted")

	requireSuccess(t, relayEnv("DATABASE_URL="+dsn, "RELAY_SLOT=polling_was_a_slot"), args...)
	require.Empty(t, allRowIDs(t, db), "with RELAY_SLOT the same command deleted the pending rows")
}

// TestCleanupOfStreamedRowsRefusesBesideARelayOfAnotherStream: one
// OutboxRelay per table. A Polling relay of another stream ran on the
// slot's table and stopped (suspended) with rows it has not published;
// cleanup --slot must not delete them by the slot's progress: it deletes
// nothing and fails, naming the other relay, until that relay is forgotten.
// A Polling relay of the slot relay's own stream is no reason: the slot's
// relay published those rows there.
func TestCleanupOfStreamedRowsRefusesBesideARelayOfAnotherStream(t *testing.T) {
	t.Parallel()
	dsn, db := freshDB(t)
	rs := testenv.StartRedis(t)
	rdb := redisClient(t, rs.URL())
	published := insertEvents(t, db, 5)
	r := startRun(t, relayEnv("DATABASE_URL="+dsn, "REDIS_URL="+rs.URL()), "--stream", "polled")
	waitUntil(t, r.relayProc, "the Polling relay published its rows", func() bool { return pending(t, db) == 0 })
	require.Equal(t, published, eventIDs(readStream(t, rdb, "polled")))
	sigterm(t, r.relayProc)

	// Rows written while the Polling relay is stopped: its to publish.
	unpublished := insertRows(t, db, "unpublished", 3, "")
	table := outbox.MustNew("", outbox.Columns{})
	require.NoError(t, table.EnsureProgressTable(t.Context(), db))
	require.NoError(t, table.RecordProgress(t.Context(), db, "orders", time.Now().Add(-2*time.Hour), true, nil))
	logProgress(t, db, "orders", 90*time.Minute, time.Now().Add(-2*time.Hour))
	// The slot's relay, of another stream, as it registers.
	_, err := table.RecordRelay(t.Context(), db, outbox.TableRelay{Stream: "streamed", Slot: "orders"})
	require.NoError(t, err)

	args := []string{"cleanup", "--slot", "orders", "--retention", "1h", "--catch-up-margin", "5m"}
	res := execRelay(t, relayEnv("DATABASE_URL="+dsn), args...)
	require.ElementsMatch(t, sorted(published, unpublished), allRowIDs(t, db),
		"no row deleted: the Polling relay has not published three of them")
	require.NotZero(t, res.code, "cleanup --slot beside a relay of another stream must fail\n%s%s", res.stdout, res.stderr)
	require.Contains(t, res.stderr, "deleting nothing by the progress of slot orders")
	require.Contains(t, res.stderr, "stream polled (source Polling)")
	require.Contains(t, res.stderr, "DELETE FROM outbox_events_relays")
	require.NotContains(t, res.stderr, dsn)

	// Gone for good: forgotten as the error says, the cleanup deletes.
	execSQL(t, db, `DELETE FROM outbox_events_relays WHERE stream = 'polled' AND slot = ''`)
	// A Polling relay of the slot's own stream is no reason to refuse.
	_, err = table.RecordRelay(t.Context(), db, outbox.TableRelay{Stream: "streamed"})
	require.NoError(t, err)
	res = requireSuccess(t, relayEnv("DATABASE_URL="+dsn), args...)
	require.Regexp(t, `^deleted 3 rows created before `, res.stdout)
	require.ElementsMatch(t, published, allRowIDs(t, db), "the rows created after the slot's commit less the margin stay")
}
