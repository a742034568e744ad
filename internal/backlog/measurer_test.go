package backlog

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outbox-dev/outbox-operator/internal/outbox"
	"github.com/outbox-dev/outbox-operator/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// setupTable creates the default outbox table in a fresh database and
// returns the DSN and a connection for the test's own statements.
func setupTable(t *testing.T) (string, *pgx.Conn) {
	t.Helper()
	dsn := testenv.Postgres(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	_, err = conn.Exec(ctx, outbox.MustNew("", outbox.Columns{}).DDL(outbox.DDLOptions{}))
	require.NoError(t, err)
	return dsn, conn
}

func TestPoolMeasurerMeasuresBacklog(t *testing.T) {
	t.Parallel()
	dsn, conn := setupTable(t)
	ctx := context.Background()
	created := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	_, err := conn.Exec(ctx, `INSERT INTO outbox_events (event_type, payload, created_at)
		SELECT 't', '{}', $1::timestamptz + make_interval(secs => g) FROM generate_series(0, 9) g`, created)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `UPDATE outbox_events SET dispatched_at = now() WHERE created_at < $1`, created.Add(3*time.Second))
	require.NoError(t, err)

	m := NewPoolMeasurer(PoolMeasurerConfig{})
	t.Cleanup(m.Close)
	b, err := m.Measure(ctx, key("a"), target(dsn))
	require.NoError(t, err)
	require.Equal(t, int64(7), b.Count)
	require.NotNil(t, b.Oldest)
	require.True(t, created.Add(3*time.Second).Equal(*b.Oldest), "oldest is %s", b.Oldest)
}

func TestPoolMeasurerCountsParkedRowsApart(t *testing.T) {
	t.Parallel()
	dsn, conn := setupTable(t)
	ctx := context.Background()
	table := outbox.MustNew("", outbox.Columns{})
	_, err := conn.Exec(ctx, table.DeadLetterDDL())
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `INSERT INTO outbox_events (event_type, payload) VALUES ('t', '{}')`)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `INSERT INTO `+pgx.Identifier{table.DeadLetterTableName()}.Sanitize()+`
		(event_id, event_type, payload, created_at, stream, reason)
		SELECT g::text, 't', NULL, now(), 'jobs', 'payload is NULL' FROM generate_series(1, 3) g`)
	require.NoError(t, err)

	m := NewPoolMeasurer(PoolMeasurerConfig{})
	t.Cleanup(m.Close)
	b, err := m.Measure(ctx, key("a"), target(dsn))
	require.NoError(t, err)
	require.Equal(t, int64(1), b.Count, "parked rows are not backlog")
	require.Equal(t, int64(3), b.DeadLetters)

	// A table laid out before parking existed has no dead-letter table:
	// nothing is parked, and the check still succeeds.
	_, err = conn.Exec(ctx, `DROP TABLE `+pgx.Identifier{table.DeadLetterTableName()}.Sanitize())
	require.NoError(t, err)
	b, err = m.Measure(ctx, key("a"), target(dsn))
	require.NoError(t, err)
	require.Equal(t, int64(1), b.Count)
	require.Zero(t, b.DeadLetters)
}

func TestPoolMeasurerSharesPoolsPerNamespaceAndDSN(t *testing.T) {
	t.Parallel()
	dsn, _ := setupTable(t)
	ctx := context.Background()
	m := NewPoolMeasurer(PoolMeasurerConfig{})
	t.Cleanup(m.Close)

	for _, k := range []string{"a", "b", "c"} {
		_, err := m.Measure(ctx, key(k), target(dsn))
		require.NoError(t, err)
	}
	require.Equal(t, 1, m.Pools(), "relays of one namespace on one DSN share a pool")

	other := key("a")
	other.Namespace = "other"
	_, err := m.Measure(ctx, other, target(dsn))
	require.NoError(t, err)
	require.Equal(t, 2, m.Pools(), "namespaces never share a pool")

	// A relay whose DSN changes moves to another pool.
	_, err = m.Measure(ctx, key("c"), target(dsn+"&application_name=x"))
	require.NoError(t, err)
	require.Equal(t, 3, m.Pools())

	m.Release(key("a"))
	m.Release(key("b"))
	require.Equal(t, 2, m.Pools(), "the pool is closed when its last relay is released")
	m.Release(key("c"))
	m.Release(other)
	require.Equal(t, 0, m.Pools())
}

func TestPoolMeasurerFailures(t *testing.T) {
	t.Parallel()
	dsn, conn := setupTable(t)
	ctx := context.Background()

	// A port nothing listens on.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closedPort := l.Addr().(*net.TCPAddr).Port
	require.NoError(t, l.Close())

	m := NewPoolMeasurer(PoolMeasurerConfig{LockTimeout: 300 * time.Millisecond, ConnectTimeout: 2 * time.Second})
	t.Cleanup(m.Close)
	const secret = "Canary-Pa55word"

	t.Run("Unreachable", func(t *testing.T) {
		unreachable := fmt.Sprintf("postgres://alice:%s@127.0.0.1:%d/db?sslmode=disable", secret, closedPort)
		_, err := m.Measure(ctx, key("unreachable"), target(unreachable))
		require.Error(t, err)
		f := classify(err, "10s", unreachable, secret)
		require.Equal(t, CauseUnreachable, f.Cause)
		require.Equal(t, unreachableMessage, f.Message, "no address, no error class")
		require.NotContains(t, f.Message, secret)
		require.NotContains(t, f.Message, "alice")
	})
	t.Run("TableNotFound", func(t *testing.T) {
		tgt := Target{DSN: dsn, Table: outbox.MustNew("missing_table", outbox.Columns{})}
		_, err := m.Measure(ctx, key("missing"), tgt)
		f := classify(err, "10s")
		require.Equal(t, CauseTableNotFound, f.Cause, err)
		require.Contains(t, f.Message, `relation "missing_table" does not exist`)
	})
	t.Run("ColumnNotFound", func(t *testing.T) {
		tgt := Target{DSN: dsn, Table: outbox.MustNew("", outbox.Columns{DispatchedAt: "sent_at"})}
		_, err := m.Measure(ctx, key("column"), tgt)
		f := classify(err, "10s")
		require.Equal(t, CauseColumnNotFound, f.Cause, err)
	})
	t.Run("LockedTableTimesOut", func(t *testing.T) {
		tx, err := conn.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(context.Background()) }()
		_, err = tx.Exec(ctx, `LOCK TABLE outbox_events IN ACCESS EXCLUSIVE MODE`)
		require.NoError(t, err)

		start := time.Now()
		_, err = m.Measure(ctx, key("locked"), target(dsn))
		require.Error(t, err)
		require.Less(t, time.Since(start), 5*time.Second, "lock_timeout bounds the wait")
		f := classify(err, "10s")
		require.Equal(t, CauseUnreachable, f.Cause)
		require.Contains(t, f.Message, "SQLSTATE 55P03") // lock_not_available
	})
}

func TestPoolMeasurerBoundsOpenConnections(t *testing.T) {
	t.Parallel()
	dsn, _ := setupTable(t)
	ctx := context.Background()
	m := NewPoolMeasurer(PoolMeasurerConfig{MaxOpenConns: 1, ConnectTimeout: 500 * time.Millisecond})
	t.Cleanup(m.Close)

	// Three DSNs, three pools, one connection at a time: each measurement
	// closes the idle connection of another pool to take its slot.
	for i, name := range []string{"a", "b", "c", "a"} {
		_, err := m.Measure(ctx, key(name), target(fmt.Sprintf("%s&application_name=%s", dsn, name)))
		require.NoError(t, err, "measurement %d", i)
		require.LessOrEqual(t, m.ConnStats().Open, 1)
	}
	require.Equal(t, 3, m.ConnStats().Pools)

	// A connection in use is not taken away: the next dial waits for the
	// slot until its deadline, and says so.
	pool, err := m.acquire(key("a"), dsn+"&application_name=a")
	require.NoError(t, err)
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	_, err = m.Measure(ctx, key("b"), target(dsn+"&application_name=b"))
	conn.Release()
	require.ErrorIs(t, err, errNoConnSlot)
	require.Contains(t, classify(err, "10s").Message, "--backlog-max-open-conns")
	_, err = m.Measure(ctx, key("b"), target(dsn+"&application_name=b"))
	require.NoError(t, err)
	require.Equal(t, ConnStats{Open: 1, Max: 1, Pools: 3}, m.ConnStats())
}

func TestPoolMeasurerCapsTheCount(t *testing.T) {
	t.Parallel()
	dsn, conn := setupTable(t)
	ctx := context.Background()
	_, err := conn.Exec(ctx, `INSERT INTO outbox_events (event_type, payload) SELECT 't', '{}' FROM generate_series(1, 25)`)
	require.NoError(t, err)
	m := NewPoolMeasurer(PoolMeasurerConfig{CountLimit: 10})
	t.Cleanup(m.Close)
	b, err := m.Measure(ctx, key("a"), target(dsn))
	require.NoError(t, err)
	require.Equal(t, int64(10), b.Count)
	require.True(t, b.Capped)
	require.NotNil(t, b.Oldest)
}

func TestPoolMeasurerRefusesFileKeys(t *testing.T) {
	t.Parallel()
	dsn, _ := setupTable(t)
	ctx := context.Background()
	m := NewPoolMeasurer(PoolMeasurerConfig{})
	t.Cleanup(m.Close)
	_, err := m.Measure(ctx, key("a"), target(dsn+"&passfile=/etc/passwd"))
	f := classify(err, "10s")
	require.Equal(t, CauseDSNKeyNotAllowed, f.Cause, err)
	require.Contains(t, f.Message, "passfile")
	require.Zero(t, m.ConnStats().Open)
}
