package relay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outbox-dev/outbox-operator/internal/outbox"
	"github.com/outbox-dev/outbox-operator/internal/syncbuf"
	"github.com/outbox-dev/outbox-operator/internal/testenv"
)

func TestDrainsEveryRowOnceInOrder(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	ids := b.insert(t, 250)
	r := b.newRelay(t, Config{BatchSize: 100})

	passes := b.drain(t, r)

	require.Equal(t, 4, passes, "three batches (100, 100, 50) and an empty claim")
	entries := b.readStream(t, b.stream)
	requireEachOnce(t, entries, ids)
	for i, e := range entries {
		require.Equal(t, ids[i], e[FieldEventID], "entry %d out of order", i)
		require.Equal(t, "order_created", e[FieldEventType])
		require.Equal(t, `{"n":`+itoa(i)+`}`, e[FieldPayload])
		require.Len(t, e, 3, "only event_id, event_type and payload by default")
	}
	require.Zero(t, b.backlog(t))
	var undispatched int
	require.NoError(t, b.db.QueryRow(context.Background(),
		`SELECT count(*) FROM outbox_events WHERE dispatched_at IS NULL`).Scan(&undispatched))
	require.Zero(t, undispatched)
}

func TestFieldOrderMatchesTheReferenceEntry(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	b.insert(t, 1)
	b.drain(t, b.newRelay(t, Config{}))
	// XRANGE through the raw protocol keeps field order.
	raw, err := b.rdb.Do(context.Background(), "XRANGE", b.stream, "-", "+").Slice()
	require.NoError(t, err)
	require.Len(t, raw, 1)
	fields := raw[0].([]any)[1].([]any)
	require.Equal(t, []any{"event_id", fields[1], "event_type", "order_created", "payload", `{"n":0}`}, fields)
}

func TestTwoRelaysTakeDisjointBatches(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	b.insertBulk(t, 3000)
	ids := b.allIDs(t)
	r1 := b.newRelay(t, Config{BatchSize: 50})
	r2 := b.newRelay(t, Config{BatchSize: 50})
	// Each relay's first batch waits before its commit, its rows locked,
	// until the other relay holds a batch too: both claim while the other's
	// locks are held (so only SKIP LOCKED keeps the batches apart), and
	// neither can drain the table alone before the other starts, however
	// the machine schedules them. A relay that claims nothing leaves the
	// other waiting 30s, then the assertions below say which one.
	var arrived sync.WaitGroup
	arrived.Add(2)
	bothHold := make(chan struct{})
	go func() { arrived.Wait(); close(bothHold) }()
	for _, r := range []*Relay{r1, r2} {
		var first sync.Once
		r.testHookBeforeCommit = func(context.Context) error {
			first.Do(func() {
				arrived.Done()
				select {
				case <-bothHold:
				case <-time.After(30 * time.Second):
				}
			})
			return nil
		}
	}

	var wg sync.WaitGroup
	claimed := [2]int{}
	for i, r := range []*Relay{r1, r2} {
		wg.Go(func() {
			for {
				res, err := r.runOnce(context.Background())
				if !assertNoError(t, err) || res.claimed == 0 {
					return
				}
				claimed[i] += res.claimed
			}
		})
	}
	wg.Wait()

	requireEachOnce(t, b.readStream(t, b.stream), ids)
	require.Equal(t, 3000, claimed[0]+claimed[1])
	require.Positive(t, claimed[0], "relay 1 took no batch")
	require.Positive(t, claimed[1], "relay 2 took no batch")
}

func assertNoError(t *testing.T, err error) bool {
	t.Helper()
	if err != nil {
		t.Errorf("unexpected error: %v", err)
		return false
	}
	return true
}

func TestFailureBetweenPublishAndCommitRepublishes(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	ids := b.insert(t, 10)
	r := b.newRelay(t, Config{BatchSize: 10})
	crash := errors.New("relay lost before commit")
	r.testHookBeforeCommit = func(context.Context) error { return crash }

	_, err := r.runOnce(context.Background())
	require.ErrorIs(t, err, crash)
	require.Len(t, b.readStream(t, b.stream), 10, "the batch reached Redis")
	require.EqualValues(t, 10, b.backlog(t), "but the rows are still pending")

	r.testHookBeforeCommit = nil
	b.drain(t, r)
	entries := b.readStream(t, b.stream)
	require.Len(t, entries, 20, "each event twice: a duplicate, not a loss")
	require.Equal(t, 10, requireAtLeastOnce(t, entries, ids))
	require.Zero(t, b.backlog(t))
}

func TestRedisDownRollsBackAndRecovers(t *testing.T) {
	t.Parallel()
	rs := testenv.StartRedis(t, testenv.WithAppendOnly())
	b := setup(t, bundleOpts{redisURL: rs.URL()})
	b.insertBulk(t, 500)
	r := b.newRelay(t, Config{BatchSize: 100, PublishTimeout: time.Second})
	stop := runInBackground(t, r)

	waitFor(t, "first rows published", func() bool { return b.streamLen(t) > 0 })
	rs.Stop(t)
	b.insertBulk(t, 500) // arrive while Redis is down
	waitFor(t, "relay not ready while Redis is down", func() bool { return r.Ready() != nil })
	require.Positive(t, b.backlog(t), "nothing is marked dispatched without Redis")
	rs.Start(t)
	waitFor(t, "backlog drained after Redis came back", func() bool { return b.backlog(t) == 0 })
	waitFor(t, "relay ready again", func() bool { return r.Ready() == nil })
	require.NoError(t, stop())

	dups := requireAtLeastOnce(t, b.readStream(t, b.stream), b.allIDs(t))
	t.Logf("duplicates after the Redis restart: %d", dups)
	require.Positive(t, testutilCounter(r.cfg.Metrics.Errors.WithLabelValues(ErrorKindRedis)))
}

func TestPostgresRestartRecovers(t *testing.T) {
	t.Parallel()
	ps := testenv.StartPostgres(t)
	b := setup(t, bundleOpts{dsn: ps.DSN()})
	b.insertBulk(t, 500)
	r := b.newRelay(t, Config{BatchSize: 100})
	stop := runInBackground(t, r)

	waitFor(t, "first rows published", func() bool { return b.streamLen(t) > 0 })
	ps.Stop(t)
	waitFor(t, "relay not ready while PostgreSQL is down", func() bool { return r.Ready() != nil })
	ps.Start(t)
	b.db.Reset()         // the test's own pool holds connections the restart ended
	b.insertBulk(t, 500) // arrive after the restart
	waitFor(t, "backlog drained after PostgreSQL came back", func() bool {
		n, err := b.table.Backlog(context.Background(), b.db)
		return err == nil && n.Count == 0
	})
	waitFor(t, "relay ready again", func() bool { return r.Ready() == nil })
	require.NoError(t, stop())
	ids := b.allIDs(t)
	require.Len(t, ids, 1000)
	requireAtLeastOnce(t, b.readStream(t, b.stream), ids)
	require.Positive(t, testutilCounter(r.cfg.Metrics.Errors.WithLabelValues(ErrorKindPostgres)))
}

func TestCustomLayout(t *testing.T) {
	t.Parallel()
	table := outbox.MustNew("shop.Events", outbox.Columns{
		ID: "seq", EventType: "kind", Payload: "body", CreatedAt: "inserted_at", DispatchedAt: "sent_at",
	})
	b := setup(t, bundleOpts{table: table, ddl: `
		CREATE SCHEMA shop;
		CREATE TABLE shop."Events" (
			seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
			kind varchar(64) NOT NULL,
			body jsonb NOT NULL,
			inserted_at timestamp NOT NULL DEFAULT (now() AT TIME ZONE 'utc'),
			sent_at timestamp NULL);
		INSERT INTO shop."Events" (kind, body, inserted_at)
			SELECT 'k' || g, jsonb_build_object('n', g, 'tags', jsonb_build_array('a', 'b')), '2026-01-01'::timestamp
			FROM generate_series(1, 25) g;`})
	r := b.newRelay(t, Config{BatchSize: 10})
	b.drain(t, r)

	entries := b.readStream(t, b.stream)
	require.Len(t, entries, 25)
	for i, e := range entries {
		n := itoa(i + 1)
		require.Equal(t, n, e[FieldEventID], "bigint ids, in order on equal created_at")
		require.Equal(t, "k"+n, e[FieldEventType])
		require.JSONEq(t, `{"n":`+n+`,"tags":["a","b"]}`, e[FieldPayload])
	}
	var sent int
	require.NoError(t, b.db.QueryRow(context.Background(), `SELECT count(*) FROM shop."Events" WHERE sent_at IS NOT NULL`).Scan(&sent))
	require.Equal(t, 25, sent)
}

func TestMalformedRowIsDeadLettered(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{ddl: `CREATE TABLE outbox_events (
		id uuid PRIMARY KEY DEFAULT gen_random_uuid(), event_type text, payload text,
		created_at timestamptz NOT NULL DEFAULT now(), dispatched_at timestamptz);` +
		outbox.MustNew("", outbox.Columns{}).DeadLetterDDL()})
	ctx := context.Background()
	_, err := b.db.Exec(ctx, `INSERT INTO outbox_events (event_type, payload, created_at) VALUES
		('ok', '1', now() - interval '3 s'), ('bad', NULL, now() - interval '2 s'), ('ok', '3', now() - interval '1 s')`)
	require.NoError(t, err)
	r := b.newRelay(t, Config{})
	b.drain(t, r)

	main := b.readStream(t, b.stream)
	require.Len(t, main, 2)
	require.Equal(t, []string{"1", "3"}, []string{main[0][FieldPayload], main[1][FieldPayload]})
	dead := b.readStream(t, b.stream+".dead")
	require.Len(t, dead, 1)
	require.Equal(t, "bad", dead[0][FieldEventType])
	require.Contains(t, dead[0][FieldError], "NULL in column payload")
	require.Zero(t, b.backlog(t), "the bad row does not stall the outbox")
	require.InDelta(t, 1, testutilCounter(r.cfg.Metrics.EventsDeadLettered), 0)
	parked := b.deadLetters(t)
	require.Len(t, parked, 1)
	require.Equal(t, "bad", *parked[0].EventType)
	require.Nil(t, parked[0].PayloadBytes, "NULL stays NULL in the parked copy")
	require.Equal(t, b.stream, parked[0].Stream)
	require.Contains(t, parked[0].Reason, "NULL in column payload")
}

func TestOversizedPayloadIsDeadLetteredWithoutIt(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	_, err := b.db.Exec(context.Background(),
		`INSERT INTO outbox_events (event_type, payload) VALUES ('big', repeat('x', 2048)), ('small', 'y')`)
	require.NoError(t, err)
	r := b.newRelay(t, Config{MaxPayloadBytes: 1024})
	b.drain(t, r)

	require.Len(t, b.readStream(t, b.stream), 1)
	dead := b.readStream(t, b.stream+".dead")
	require.Len(t, dead, 1)
	require.Equal(t, "big", dead[0][FieldEventType])
	require.Empty(t, dead[0][FieldPayload])
	require.Contains(t, dead[0][FieldError], "payload of 2048 bytes exceeds the limit of 1024 bytes")
	parked := b.deadLetters(t)
	require.Len(t, parked, 1)
	require.EqualValues(t, 2048, *parked[0].PayloadBytes, "the payload is kept in the dead-letter table")

	// Cleanup deletes the dispatched outbox rows; the parked copy stays.
	_, err = b.db.Exec(context.Background(), `UPDATE outbox_events SET dispatched_at = now() - interval '1 day'`)
	require.NoError(t, err)
	_, err = b.table.DeleteAllDispatched(context.Background(), b.db, time.Hour, 100, nil)
	require.NoError(t, err)
	require.Len(t, b.deadLetters(t), 1)
}

func TestMissingDeadLetterTableHoldsTheBatchBack(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{ddl: `CREATE TABLE outbox_events (
		id uuid PRIMARY KEY DEFAULT gen_random_uuid(), event_type text NOT NULL, payload text NOT NULL,
		created_at timestamptz NOT NULL DEFAULT now(), dispatched_at timestamptz)`})
	_, err := b.db.Exec(context.Background(), `INSERT INTO outbox_events (event_type, payload) VALUES ('big', repeat('x', 2048))`)
	require.NoError(t, err)
	r := b.newRelay(t, Config{MaxPayloadBytes: 1024})
	_, err = r.runOnce(context.Background())
	require.ErrorIs(t, err, outbox.ErrDeadLetterTableNotFound)
	require.Equal(t, ErrorKindDeadLetterTableMissing, errorKind(err))
	require.EqualValues(t, 1, b.backlog(t), "rolled back: the row is still pending, not lost")

	require.NoError(t, b.table.EnsureDeadLetterTable(context.Background(), b.db))
	b.drain(t, r)
	require.Zero(t, b.backlog(t))
	require.Len(t, b.deadLetters(t), 1)
}

// TestEntryRefusedByRedisIsParked uses a real refusal: a Redis whose
// proto-max-bulk-len is 1 MiB closes the connection on a 2 MiB argument,
// usually before its reply can be read, so the relay checks payloads
// against the limit it reads from the server. Lowered while the relay runs,
// the limit is read again right after the failed batch: its retry parks the
// row, not a retry seconds later (each failed retry repeats the entries
// before the row: duplicates).
func TestEntryRefusedByRedisIsParked(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedis(t)
	b := setup(t, bundleOpts{redisURL: srv.URL()})
	ctx := context.Background()
	require.NoError(t, b.rdb.ConfigSet(ctx, "proto-max-bulk-len", "1048576").Err())
	_, err := b.db.Exec(ctx, `INSERT INTO outbox_events (event_type, payload, created_at) VALUES
		('a', 'fine', now() - interval '3 s'), ('b', repeat('x', 2 << 20), now() - interval '2 s'), ('c', 'after', now() - interval '1 s')`)
	require.NoError(t, err)
	r := b.newRelay(t, Config{})
	r.bulkLimit.value, r.bulkLimit.checked = 512<<20, time.Now() // as read before the limit was lowered
	_, err = r.runOnce(ctx)
	require.Error(t, err, "the connection closed on the refusal: the batch is retried")
	require.EqualValues(t, 3, b.backlog(t))
	b.drain(t, r)

	main := b.readStream(t, b.stream)
	require.Equal(t, []string{"a", "c"}, []string{main[len(main)-2][FieldEventType], main[len(main)-1][FieldEventType]})
	for _, e := range main {
		require.NotEqual(t, "b", e[FieldEventType])
	}
	dead := b.readStream(t, b.stream+".dead")
	require.Len(t, dead, 1)
	require.Equal(t, "b", dead[0][FieldEventType])
	require.Empty(t, dead[0][FieldPayload], "the parked copy keeps the payload, the entry does not")
	require.Contains(t, dead[0][FieldError], "rejected by Redis: payload of 2097152 bytes exceeds its proto-max-bulk-len of 1048576 bytes")
	parked := b.deadLetters(t)
	require.Len(t, parked, 1)
	require.EqualValues(t, 2<<20, *parked[0].PayloadBytes)
}

// TestMalformedRowOverRedisLimitIsParked: a malformed row (a NULL column)
// whose payload is over Redis's proto-max-bulk-len is parked like any
// malformed row. Its dead-letter entry cannot carry that payload (Redis
// closes the connection on it, so the batch failed on every retry and the
// whole outbox stalled behind it); the parked copy keeps it.
func TestMalformedRowOverRedisLimitIsParked(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedis(t)
	b := setup(t, bundleOpts{redisURL: srv.URL(), ddl: `CREATE TABLE outbox_events (
		id uuid PRIMARY KEY DEFAULT gen_random_uuid(), event_type text, payload text,
		created_at timestamptz NOT NULL DEFAULT now(), dispatched_at timestamptz);` +
		outbox.MustNew("", outbox.Columns{}).DeadLetterDDL()})
	ctx := context.Background()
	require.NoError(t, b.rdb.ConfigSet(ctx, "proto-max-bulk-len", "1048576").Err())
	_, err := b.db.Exec(ctx, `INSERT INTO outbox_events (event_type, payload, created_at) VALUES
		('a', 'fine', now() - interval '3 s'), (NULL, repeat('x', 2 << 20), now() - interval '2 s'), ('c', 'after', now() - interval '1 s')`)
	require.NoError(t, err)
	r := b.newRelay(t, Config{})
	for range 3 {
		_, err = r.runOnce(ctx)
		require.NoError(t, err, "the malformed row is parked, not retried forever")
	}
	require.Zero(t, b.backlog(t))

	main := b.readStream(t, b.stream)
	require.Len(t, main, 2)
	require.Equal(t, []string{"a", "c"}, []string{main[0][FieldEventType], main[1][FieldEventType]})
	dead := b.readStream(t, b.stream+".dead")
	require.Len(t, dead, 1)
	require.Empty(t, dead[0][FieldPayload], "the entry cannot carry the payload; the parked copy does")
	require.Contains(t, dead[0][FieldError], "NULL in column event_type")
	parked := b.deadLetters(t)
	require.Len(t, parked, 1)
	require.Nil(t, parked[0].EventType)
	require.EqualValues(t, 2<<20, *parked[0].PayloadBytes)
}

func TestTransientErrorRepliesAreRetriedNotParked(t *testing.T) {
	t.Parallel()
	for _, reply := range []string{"MISCONF Errors writing to the AOF file", "ERR some proxy failed this one", "OOM command not allowed"} {
		require.False(t, func() bool { _, ok := entryRejection(redisErrorReply(reply)); return ok }(), reply)
	}
	reason, ok := entryRejection(redisErrorReply("ERR Protocol error: invalid bulk length"))
	require.True(t, ok)
	require.Equal(t, "rejected by Redis: ERR Protocol error: invalid bulk length", reason)
}

type redisErrorReply string

func (e redisErrorReply) Error() string { return string(e) }
func (redisErrorReply) RedisError()     {}

func TestEveryEntryRefusedIsRetriedNotDeadLettered(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	b.insert(t, 3)
	// A key of the wrong type refuses every XADD: a fault of the stream.
	require.NoError(t, b.rdb.Set(context.Background(), b.stream, "not a stream", 0).Err())
	r := b.newRelay(t, Config{})
	_, err := r.runOnce(context.Background())
	require.ErrorContains(t, err, "WRONGTYPE")
	require.Equal(t, ErrorKindRedis, errorKind(err))
	require.EqualValues(t, 3, b.backlog(t))
	n, err := b.rdb.Exists(context.Background(), b.stream+".dead").Result()
	require.NoError(t, err)
	require.Zero(t, n)
}

func TestMissingTableIsReportedAndRetried(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{ddl: "SELECT 1"})
	var logs syncbuf.Buffer
	r := b.newRelay(t, Config{Logger: newTestLogger(&logs), MissingTableBackoff: 20 * time.Millisecond})
	_, err := r.runOnce(context.Background())
	require.ErrorIs(t, err, outbox.ErrTableNotFound)
	require.Equal(t, ErrorKindTableMissing, errorKind(err))

	stop := runInBackground(t, r)
	waitFor(t, "a log line about the missing table", func() bool {
		return strings.Contains(logs.String(), "Outbox table not found")
	})
	require.Error(t, r.Ready())
	// Under the schema lock: the relay creates its side tables meanwhile.
	require.NoError(t, b.table.ApplyDDL(context.Background(), b.db, b.table.DDL(outbox.DDLOptions{})))
	waitFor(t, "ready once the table exists", func() bool { return r.Ready() == nil })
	require.NoError(t, stop())
	require.Contains(t, logs.String(), `table=outbox_events`)
}

// TestBatchTooLargeToPublishInTimeShrinks: a batch whose payloads together
// cannot reach Redis within --publish-timeout (40 rows of 8 MiB time out
// every time under a 500 ms timeout on the test machine, while one of them
// is added in 0.4 s) was claimed again, whole, after every timeout, and the
// relay stalled for good. After a batch times out, the next claims take
// half as many rows, down to one, and grow back after each batch that
// succeeds. The hook times out every batch of more than 3 rows, as a real
// server does at a size that depends on the machine and the link.
// The same holds for a batch too large for its replicas to acknowledge
// within --wait-timeout (--wait-replicas).
func TestBatchTooLargeToPublishInTimeShrinks(t *testing.T) {
	t.Parallel()
	for name, tooLarge := range map[string]error{
		"publish timeout": fmt.Errorf("XADD: write tcp: %w", os.ErrDeadlineExceeded),
		"wait timeout":    &replicasError{acked: 0, want: 1, timeout: time.Second},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, bundleOpts{})
			ids := b.insert(t, 40)
			r := b.newRelay(t, Config{BatchSize: 16})
			r.testHookBeforePublish = func(events []outbox.Event) error {
				if len(events) > 3 {
					return &publishError{tooLarge}
				}
				return nil
			}
			stop := runInBackground(t, r)
			waitFor(t, "drained", func() bool { return b.backlog(t) == 0 })
			require.NoError(t, stop())
			entries := b.readStream(t, b.stream)
			requireEachOnce(t, entries, ids)
			for i, e := range entries {
				require.Equal(t, ids[i], e[FieldEventID], "in claim order")
			}
		})
	}
}

// TestClaimTooLargeForTheStatementTimeoutShrinks: a claim whose rows take
// longer than --statement-timeout to read (large payloads: 500 rows of a few
// MiB take more than the default 30 s) failed on every retry, the same rows
// asked for each time. After a claim is cancelled by the statement timeout
// the claims take half as many rows, down to one. A row trigger that sleeps
// 50 ms per row claimed stands in for the transfer: 16 rows take 0.8 s,
// over the relay's 400 ms statement_timeout.
func TestClaimTooLargeForTheStatementTimeoutShrinks(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	ctx := context.Background()
	_, err := b.db.Exec(ctx, `CREATE FUNCTION slow_claim() RETURNS trigger LANGUAGE plpgsql AS $$
	BEGIN PERFORM pg_sleep(0.05); RETURN NEW; END $$;
	CREATE TRIGGER slow_claim BEFORE UPDATE ON outbox_events FOR EACH ROW EXECUTE FUNCTION slow_claim();`)
	require.NoError(t, err)
	ids := b.insert(t, 24)
	cfg, err := outbox.PoolConfig(b.dsn, outbox.SessionSettings{StatementTimeout: 400 * time.Millisecond}, 4)
	require.NoError(t, err)
	db, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(db.Close)
	r, err := New(Config{Table: b.table, Stream: b.stream, BatchSize: 16, PollInterval: 20 * time.Millisecond,
		MinBackoff: 10 * time.Millisecond, MaxBackoff: 200 * time.Millisecond, Logger: newTestLogger(io.Discard)}, db, b.rdb)
	require.NoError(t, err)
	stop := runInBackground(t, r)
	waitFor(t, "drained", func() bool { return b.backlog(t) == 0 })
	require.NoError(t, stop())
	requireEachOnce(t, b.readStream(t, b.stream), ids)
}

func TestNotifyWakesTheRelay(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	_, err := b.db.Exec(context.Background(), b.table.DDL(outbox.DDLOptions{Notify: true}))
	require.NoError(t, err)
	// With an hour between polls, only a NOTIFY can make the relay claim.
	r := b.newRelay(t, Config{PollInterval: time.Hour})
	stop := runInBackground(t, r)
	waitFor(t, "first empty pass", func() bool { return r.Ready() == nil })
	// The listener runs LISTEN in its own goroutine: wait until PostgreSQL
	// shows its session, rather than for a guessed while.
	waitFor(t, "the relay's LISTEN session", func() bool {
		var n int
		err := b.db.QueryRow(context.Background(),
			`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query LIKE 'LISTEN %'`).Scan(&n)
		return err == nil && n == 1
	})
	b.insert(t, 1)
	waitFor(t, "event published on NOTIFY", func() bool { return b.streamLen(t) == 1 })
	require.NoError(t, stop())
}

func TestStopFinishesTheBatchInFlight(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	b.insert(t, 5)
	r := b.newRelay(t, Config{BatchSize: 5})
	ctx, cancel := context.WithCancel(context.Background())
	r.testHookBeforeCommit = func(context.Context) error {
		cancel() // SIGTERM arrives after the XADDs, before the commit
		return nil
	}
	require.NoError(t, r.Run(ctx))
	// The claims start at one row (slow start): the batch in flight holds
	// one or two; whatever was published was committed, nothing more.
	published := len(b.readStream(t, b.stream))
	require.GreaterOrEqual(t, published, 1)
	require.EqualValues(t, 5-published, b.backlog(t), "the batch in flight was committed")
}

func TestMaxLenTrimsTheStream(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	b.insertBulk(t, 1000)
	b.drain(t, b.newRelay(t, Config{MaxLen: 100, BatchSize: 1000}))
	n := b.streamLen(t)
	require.Less(t, n, int64(1000))
	require.GreaterOrEqual(t, n, int64(100))
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	table := outbox.MustNew("", outbox.Columns{})
	for name, tc := range map[string]struct {
		cfg  Config
		want string
	}{
		"no table":            {Config{}, "table is required"},
		"batch too large":     {Config{Table: table, BatchSize: MaxBatchSize + 1}, "batch size 10001 out of range"},
		"negative batch":      {Config{Table: table, BatchSize: -1}, "batch size -1 out of range"},
		"same dead letter":    {Config{Table: table, Stream: "s", DeadLetterStream: "s"}, "must differ"},
		"backoff upside down": {Config{Table: table, MinBackoff: time.Minute, MaxBackoff: time.Second}, "min backoff"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := New(tc.cfg, nil, nil)
			require.ErrorContains(t, err, tc.want)
		})
	}
}

func TestTwoBatchesInFlightKeepOrder(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	b.insertBulk(t, 5000)
	ids := b.allIDs(t)
	r := b.newRelay(t, Config{BatchSize: 100, InFlight: 2})
	stop := runInBackground(t, r)
	waitFor(t, "every event published", func() bool { return b.streamLen(t) == 5000 })
	waitFor(t, "backlog drained", func() bool { return b.backlog(t) == 0 })
	require.NoError(t, stop())

	entries := b.readStream(t, b.stream)
	requireEachOnce(t, entries, ids)
	for i, e := range entries {
		require.Equal(t, ids[i], e[FieldEventID], "entry %d out of created_at order", i)
	}
	// 50 of 100, and the slow start's small ones before them (1, 2, 4 ...
	// 64, each claimed up to twice with two in flight).
	batches := testutilCounter(r.cfg.Metrics.Batches)
	require.GreaterOrEqual(t, batches, 50.0)
	require.LessOrEqual(t, batches, 64.0)
}
