package relay

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/outbox-dev/outbox-operator/internal/outbox"
	"github.com/outbox-dev/outbox-operator/internal/testenv"
)

// testBundle is what a relay test works with: a fresh database with the
// default outbox table, a Redis client and a stream of its own.
type testBundle struct {
	dsn    string
	db     *pgxpool.Pool
	rdb    *redis.Client
	table  *outbox.Table
	stream string
}

type bundleOpts struct {
	dsn      string // default: a fresh database on the shared server
	redisURL string // default: the shared server
	table    *outbox.Table
	ddl      string // default: table.DDL
}

func setup(t testing.TB, o bundleOpts) *testBundle {
	t.Helper()
	ctx := context.Background()
	if o.dsn == "" {
		o.dsn = testenv.Postgres(t)
	}
	if o.redisURL == "" {
		o.redisURL = testenv.Redis(t)
	}
	if o.table == nil {
		o.table = outbox.MustNew("", outbox.Columns{})
	}
	if o.ddl == "" {
		o.ddl = o.table.DDL(outbox.DDLOptions{})
	}
	cfg, err := outbox.PoolConfig(o.dsn, outbox.SessionSettings{
		StatementTimeout: 10 * time.Second, LockTimeout: 5 * time.Second, IdleInTransactionTimeout: 10 * time.Second,
	}, 4)
	require.NoError(t, err)
	db, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(db.Close)
	_, err = db.Exec(ctx, o.ddl)
	require.NoError(t, err)

	ropts, err := redis.ParseURL(o.redisURL)
	require.NoError(t, err)
	ropts.MaxRetries = -1
	ropts.ContextTimeoutEnabled = true
	ropts.DialTimeout = time.Second
	rdb := redis.NewClient(ropts)
	t.Cleanup(func() { _ = rdb.Close() })
	return &testBundle{dsn: o.dsn, db: db, rdb: rdb, table: o.table, stream: testenv.Name(t)}
}

// deadLetters lists the parked rows.
func (b *testBundle) deadLetters(t *testing.T) []outbox.DeadLetter {
	t.Helper()
	d, err := b.table.ListDeadLetters(context.Background(), b.db, outbox.DeadLetterFilter{})
	require.NoError(t, err)
	return d
}

// newRelay builds a relay on the bundle with quick retries and a quiet log.
func (b *testBundle) newRelay(t testing.TB, cfg Config) *Relay {
	t.Helper()
	cfg.Table = b.table
	cfg.Stream = b.stream
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if cfg.MinBackoff == 0 {
		cfg.MinBackoff, cfg.MaxBackoff = 10*time.Millisecond, 200*time.Millisecond
	}
	if cfg.PollInterval == 0 {
		cfg.PollInterval = 20 * time.Millisecond
	}
	r, err := New(cfg, b.db, b.rdb)
	require.NoError(t, err)
	return r
}

// insert writes n events of the default layout, one statement per row so
// created_at strictly increases, and returns their ids in insertion order.
func (b *testBundle) insert(t *testing.T, n int) []string {
	t.Helper()
	ids := make([]string, 0, n)
	base := time.Now().Add(-time.Hour)
	for i := range n {
		var id string
		err := b.db.QueryRow(context.Background(),
			`INSERT INTO outbox_events (event_type, payload, created_at) VALUES ($1, $2, $3) RETURNING id::text`,
			"order_created", fmt.Sprintf(`{"n":%d}`, i), base.Add(time.Duration(i)*time.Microsecond),
		).Scan(&id)
		require.NoError(t, err)
		ids = append(ids, id)
	}
	return ids
}

// insertBulk writes n events in one statement, created_at increasing.
func (b *testBundle) insertBulk(t testing.TB, n int) {
	t.Helper()
	_, err := b.db.Exec(context.Background(), `INSERT INTO outbox_events (event_type, payload, created_at)
		SELECT 'order_created', '{"n":' || g || '}', now() - interval '1 hour' + g * interval '1 microsecond'
		FROM generate_series(1, $1) g`, n)
	require.NoError(t, err)
}

// entry is one stream entry's fields.
type entry map[string]string

func (b *testBundle) readStream(t *testing.T, stream string) []entry {
	t.Helper()
	msgs, err := b.rdb.XRange(context.Background(), stream, "-", "+").Result()
	require.NoError(t, err)
	out := make([]entry, len(msgs))
	for i, m := range msgs {
		e := entry{}
		for k, v := range m.Values {
			e[k] = v.(string)
		}
		out[i] = e
	}
	return out
}

func (b *testBundle) backlog(t testing.TB) int64 {
	t.Helper()
	bl, err := b.table.Backlog(context.Background(), b.db)
	require.NoError(t, err)
	return bl.Count
}

// drain runs passes until one claims nothing and returns the passes run.
func (b *testBundle) drain(t *testing.T, r *Relay) int {
	t.Helper()
	for passes := 1; ; passes++ {
		res, err := r.runOnce(context.Background())
		require.NoError(t, err)
		if res.claimed == 0 {
			return passes
		}
		require.Less(t, passes, 100000, "drain does not end")
	}
}

// requireExactlyOnce checks the stream holds each id once; it returns the
// number of duplicates (entries beyond the first per id).
func requireEachOnce(t *testing.T, entries []entry, ids []string) {
	t.Helper()
	seen := map[string]int{}
	for _, e := range entries {
		seen[e[FieldEventID]]++
	}
	for _, id := range ids {
		require.Equal(t, 1, seen[id], "event %s", id)
	}
	require.Len(t, entries, len(ids))
}

// requireAtLeastOnce checks every id is in the stream, and returns how many
// entries were duplicates.
func requireAtLeastOnce(t *testing.T, entries []entry, ids []string) int {
	t.Helper()
	seen := map[string]int{}
	for _, e := range entries {
		seen[e[FieldEventID]]++
	}
	for _, id := range ids {
		require.GreaterOrEqual(t, seen[id], 1, "event %s was lost", id)
	}
	return len(entries) - len(seen)
}

// runInBackground runs r until the test ends and reports Run's result.
func runInBackground(t testing.TB, r *Relay) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	stopped := false
	stop = func() error {
		if stopped {
			return nil
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			return err
		case <-time.After(30 * time.Second):
			return fmt.Errorf("relay did not stop within 30s")
		}
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

// allIDs lists every id of the table, in created_at order.
func (b *testBundle) allIDs(t *testing.T) []string {
	t.Helper()
	rows, err := b.db.Query(context.Background(), `SELECT id::text FROM outbox_events ORDER BY created_at`)
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return ids
}

func itoa(i int) string { return strconv.Itoa(i) }

// openBatches counts the sessions of the test's database that sit in an
// open transaction holding a lock on the table: claimed batches waiting to
// be published (not the stream watch's DDL of its own tables). (Locking
// the rows to count them would change what the relay claims.)
func (b *testBundle) openBatches(t *testing.T) int {
	t.Helper()
	var n int
	require.NoError(t, b.db.QueryRow(context.Background(), `SELECT count(DISTINCT a.pid) FROM pg_stat_activity a
		JOIN pg_locks l ON l.pid = a.pid
		WHERE a.datname = current_database() AND a.state = 'idle in transaction' AND l.relation = 'outbox_events'::regclass`).Scan(&n))
	return n
}

// owner opens an ownership for r and runs one rebalance, as the relay's
// maintenance loop would; it is closed when the test ends.
func (b *testBundle) owner(t *testing.T, r *Relay) *ownership {
	t.Helper()
	o, err := r.openOwnership(context.Background())
	require.NoError(t, err)
	t.Cleanup(o.close)
	require.NoError(t, o.rebalance(context.Background(), 0))
	return o
}

// beginLong begins a transaction that a test keeps open on purpose, for
// longer than the bundle's idle-in-transaction timeout allows a session
// to wait between statements on a loaded machine; it is rolled back at the
// test's end, before the pool closes, if the test has not ended it.
func (b *testBundle) beginLong(t *testing.T) pgx.Tx {
	t.Helper()
	ctx := context.Background()
	tx, err := b.db.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	_, err = tx.Exec(ctx, `SET LOCAL idle_in_transaction_session_timeout = 0`)
	require.NoError(t, err)
	return tx
}
