package backlog

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/types"

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

// measure runs a check's two stages on m: Connect, Measure, Release.
func measure(ctx context.Context, m *PoolMeasurer, k types.NamespacedName, tgt Target) (outbox.Backlog, error) {
	return measureWithin(ctx, m, k, tgt, 5*time.Second)
}

// measureWithin is measure with another connect timeout.
func measureWithin(
	ctx context.Context, m *PoolMeasurer, k types.NamespacedName, tgt Target, timeout time.Duration,
) (outbox.Backlog, error) {
	c, err := m.Connect(ctx, k, tgt, timeout)
	if err != nil {
		return outbox.Backlog{}, err
	}
	defer c.Release()
	return c.Measure(ctx)
}

// silentListener accepts connections on loopback and never answers (a
// database behind a blackhole); it returns its address.
func silentListener(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
		}
	}()
	t.Cleanup(func() {
		_ = l.Close()
		<-done
		for _, c := range conns {
			_ = c.Close()
		}
	})
	return l.Addr().String()
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
	b, err := measure(ctx, m, key("a"), target(dsn))
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
	b, err := measure(ctx, m, key("a"), target(dsn))
	require.NoError(t, err)
	require.Equal(t, int64(1), b.Count, "parked rows are not backlog")
	require.Equal(t, int64(3), b.DeadLetters)

	// A table laid out before parking existed has no dead-letter table:
	// nothing is parked, and the check still succeeds.
	_, err = conn.Exec(ctx, `DROP TABLE `+pgx.Identifier{table.DeadLetterTableName()}.Sanitize())
	require.NoError(t, err)
	b, err = measure(ctx, m, key("a"), target(dsn))
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
		_, err := measure(ctx, m, key(k), target(dsn))
		require.NoError(t, err)
	}
	require.Equal(t, 1, m.Pools(), "relays of one namespace on one DSN share a pool")

	other := key("a")
	other.Namespace = "other"
	_, err := measure(ctx, m, other, target(dsn))
	require.NoError(t, err)
	require.Equal(t, 2, m.Pools(), "namespaces never share a pool")

	// A relay whose DSN changes moves to another pool.
	_, err = measure(ctx, m, key("c"), target(dsn+"&application_name=x"))
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

	m := NewPoolMeasurer(PoolMeasurerConfig{LockTimeout: 300 * time.Millisecond})
	t.Cleanup(m.Close)
	const secret = "Canary-Pa55word"

	t.Run("Unreachable", func(t *testing.T) {
		unreachable := fmt.Sprintf("postgres://alice:%s@127.0.0.1:%d/db?sslmode=disable", secret, closedPort)
		_, err := measure(ctx, m, key("unreachable"), target(unreachable))
		require.Error(t, err)
		f := classify(err, "10s", unreachable, secret)
		require.Equal(t, CauseUnreachable, f.Cause)
		require.Equal(t, unreachableMessage, f.Message, "no address, no error class")
		require.NotContains(t, f.Message, secret)
		require.NotContains(t, f.Message, "alice")
	})
	t.Run("TableNotFound", func(t *testing.T) {
		tgt := Target{DSN: dsn, Table: outbox.MustNew("missing_table", outbox.Columns{})}
		_, err := measure(ctx, m, key("missing"), tgt)
		f := classify(err, "10s")
		require.Equal(t, CauseTableNotFound, f.Cause, err)
		require.Contains(t, f.Message, `relation "missing_table" does not exist`)
	})
	t.Run("ColumnNotFound", func(t *testing.T) {
		tgt := Target{DSN: dsn, Table: outbox.MustNew("", outbox.Columns{DispatchedAt: "sent_at"})}
		_, err := measure(ctx, m, key("column"), tgt)
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
		_, err = measure(ctx, m, key("locked"), target(dsn))
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
	m := NewPoolMeasurer(PoolMeasurerConfig{MaxOpenConns: 1})
	t.Cleanup(m.Close)

	// Three DSNs, three pools, one connection at a time: each measurement
	// closes the idle connection of another pool to take its slot.
	for i, name := range []string{"a", "b", "c", "a"} {
		_, err := measure(ctx, m, key(name), target(fmt.Sprintf("%s&application_name=%s", dsn, name)))
		require.NoError(t, err, "measurement %d", i)
		require.LessOrEqual(t, m.ConnStats().Open, 1)
	}
	require.Equal(t, 3, m.ConnStats().Pools)

	// A connection in use is not taken away: the next one waits for the
	// slot until its deadline, and says so.
	inUse, err := m.Connect(ctx, key("a"), target(dsn+"&application_name=a"), time.Second)
	require.NoError(t, err)
	_, err = measureWithin(ctx, m, key("b"), target(dsn+"&application_name=b"), 300*time.Millisecond)
	require.ErrorIs(t, err, errNoConnSlot)
	require.Contains(t, classify(err, "10s").Message, "--backlog-max-open-conns")
	require.Equal(t, ConnStats{Open: 1, Max: 1, Pools: 3}, m.ConnStats(), "the wait ended")
	inUse.Release()
	_, err = measure(ctx, m, key("b"), target(dsn+"&application_name=b"))
	require.NoError(t, err)
	require.Equal(t, ConnStats{Open: 1, Max: 1, Pools: 3}, m.ConnStats())
}

// A pool has at most MaxConns connections: a check of another relay on the
// same DSN waits for one, and takes it when it is given back.
func TestPoolMeasurerBoundsConnectionsPerPool(t *testing.T) {
	t.Parallel()
	dsn, _ := setupTable(t)
	ctx := context.Background()
	m := NewPoolMeasurer(PoolMeasurerConfig{MaxConns: 1})
	t.Cleanup(m.Close)

	inUse, err := m.Connect(ctx, key("a"), target(dsn), time.Second)
	require.NoError(t, err)
	_, err = measureWithin(ctx, m, key("b"), target(dsn), 300*time.Millisecond)
	require.ErrorIs(t, err, errPoolBusy)
	require.Contains(t, classify(err, "10s").Message, "--backlog-max-conns")

	pid := inUse.(*poolConn).conn.PgConn().PID()
	_, err = inUse.Measure(ctx)
	require.NoError(t, err)
	inUse.Release()
	next, err := m.Connect(ctx, key("b"), target(dsn), time.Second)
	require.NoError(t, err)
	defer next.Release()
	require.Equal(t, pid, next.(*poolConn).conn.PgConn().PID(), "the pool's idle connection, reused")
	require.Equal(t, ConnStats{Open: 1, Max: 64, Pools: 1}, m.ConnStats())
}

// The connect timeout bounds the whole connection, in the check's own
// goroutine: against a server that accepts and never answers, Connect
// gives up within it, and nothing of the dial is left open afterwards.
func TestPoolMeasurerConnectTimeoutBoundsADialThatHangs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	hole := silentListener(t)
	m := NewPoolMeasurer(PoolMeasurerConfig{})
	t.Cleanup(m.Close)

	dsn := fmt.Sprintf("postgres://app:Canary-Pa55word@%s/app?sslmode=disable", hole)
	_, err := m.Connect(ctx, key("hole"), target(dsn), 200*time.Millisecond)
	require.ErrorIs(t, err, errConnect)
	f := classify(err, "10s", dsn, "Canary-Pa55word")
	require.Equal(t, CauseUnreachable, f.Cause)
	require.Equal(t, unreachableMessage, f.Message)
	require.Equal(t, ConnStats{Max: 64, Pools: 1}, m.ConnStats(), "no connection open, none being made")
}

// A connection idle more than a second is pinged before it is lent: one the
// server closed meanwhile is replaced by a new one, and the check succeeds.
func TestPoolMeasurerReplacesADeadIdleConnection(t *testing.T) {
	t.Parallel()
	dsn, admin := setupTable(t)
	ctx := context.Background()
	clock := &fakeClock{now: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
	m := NewPoolMeasurer(PoolMeasurerConfig{Now: clock.Now})
	t.Cleanup(m.Close)

	c, err := m.Connect(ctx, key("a"), target(dsn), time.Second)
	require.NoError(t, err)
	pid := c.(*poolConn).conn.PgConn().PID()
	_, err = c.Measure(ctx)
	require.NoError(t, err)
	c.Release()
	_, err = admin.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid)
	require.NoError(t, err)

	clock.Step(2 * time.Second)
	c, err = m.Connect(ctx, key("a"), target(dsn), time.Second)
	require.NoError(t, err)
	defer c.Release()
	require.NotEqual(t, pid, c.(*poolConn).conn.PgConn().PID(), "a new connection")
	_, err = c.Measure(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, m.ConnStats().Open)
}

// Idle connections are closed after MaxConnIdleTime, and when the last
// relay holding their pool is released.
func TestPoolMeasurerClosesIdleConnections(t *testing.T) {
	t.Parallel()
	dsn, _ := setupTable(t)
	ctx := context.Background()

	t.Run("AfterMaxConnIdleTime", func(t *testing.T) {
		t.Parallel()
		clock := &fakeClock{now: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
		m := NewPoolMeasurer(PoolMeasurerConfig{Now: clock.Now, MaxConnIdleTime: time.Minute})
		t.Cleanup(m.Close)
		_, err := measure(ctx, m, key("a"), target(dsn))
		require.NoError(t, err)
		clock.Step(30 * time.Second)
		m.closeExpired()
		require.Equal(t, 1, m.ConnStats().Open, "idle for less than MaxConnIdleTime")
		clock.Step(30 * time.Second)
		m.closeExpired()
		require.Equal(t, ConnStats{Max: 64, Pools: 1}, m.ConnStats(), "the relay still holds its pool, without a connection")
	})
	t.Run("OnTheTimer", func(t *testing.T) {
		t.Parallel()
		m := NewPoolMeasurer(PoolMeasurerConfig{MaxConnIdleTime: 50 * time.Millisecond})
		t.Cleanup(m.Close)
		_, err := measure(ctx, m, key("a"), target(dsn))
		require.NoError(t, err)
		require.Eventually(t, func() bool { return m.ConnStats().Open == 0 }, 5*time.Second, 10*time.Millisecond)
	})
	t.Run("WithTheirPool", func(t *testing.T) {
		t.Parallel()
		m := NewPoolMeasurer(PoolMeasurerConfig{})
		t.Cleanup(m.Close)
		_, err := measure(ctx, m, key("a"), target(dsn))
		require.NoError(t, err)
		require.Equal(t, 1, m.ConnStats().Open)
		m.Release(key("a"))
		require.Equal(t, ConnStats{Max: 64}, m.ConnStats())
	})
}

func TestPoolMeasurerCapsTheCount(t *testing.T) {
	t.Parallel()
	dsn, conn := setupTable(t)
	ctx := context.Background()
	_, err := conn.Exec(ctx, `INSERT INTO outbox_events (event_type, payload) SELECT 't', '{}' FROM generate_series(1, 25)`)
	require.NoError(t, err)
	m := NewPoolMeasurer(PoolMeasurerConfig{CountLimit: 10})
	t.Cleanup(m.Close)
	b, err := measure(ctx, m, key("a"), target(dsn))
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
	_, err := measure(ctx, m, key("a"), target(dsn+"&passfile=/etc/passwd"))
	f := classify(err, "10s")
	require.Equal(t, CauseDSNKeyNotAllowed, f.Cause, err)
	require.Contains(t, f.Message, "passfile")
	require.Zero(t, m.ConnStats().Open)
}

// A query interrupted by its deadline leaves pgconn closing the connection
// in the background: a cancel request over a second socket, then waiting
// for the server. The connection counts against MaxOpenConns until that
// ends, and the cancel request needs a free slot of its own.
func TestPoolMeasurerCountsAnInterruptedConnectionUntilClosed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	interrupt := func(t *testing.T, m *PoolMeasurer, dsn string) {
		t.Helper()
		c, err := m.Connect(ctx, key("a"), target(dsn), time.Second)
		require.NoError(t, err)
		short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		defer cancel()
		_, err = c.Measure(short)
		require.Error(t, err, "the table is locked: the query waits past its deadline")
		c.Release()
	}
	lock := func(t *testing.T, admin *pgx.Conn) pgx.Tx {
		t.Helper()
		tx, err := admin.Begin(ctx)
		require.NoError(t, err)
		t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
		_, err = tx.Exec(ctx, `LOCK TABLE outbox_events IN ACCESS EXCLUSIVE MODE`)
		require.NoError(t, err)
		return tx
	}

	t.Run("CancelRequestWithAFreeSlot", func(t *testing.T) {
		t.Parallel()
		dsn, admin := setupTable(t)
		other, err := pgx.Connect(ctx, dsn)
		require.NoError(t, err)
		t.Cleanup(func() { _ = other.Close(context.Background()) })
		lock(t, admin)
		m := NewPoolMeasurer(PoolMeasurerConfig{LockTimeout: time.Minute})
		t.Cleanup(m.Close)
		interrupt(t, m, dsn)
		require.Eventually(t, func() bool {
			var waiting int
			require.NoError(t, other.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
				WHERE application_name = 'outbox-operator' AND wait_event_type = 'Lock'`).Scan(&waiting))
			return waiting == 0
		}, 5*time.Second, 20*time.Millisecond, "the cancel request reached the server while the lock is still held")
		require.Eventually(t, func() bool { return m.ConnStats().Open == 0 }, 5*time.Second, 10*time.Millisecond)
	})
	t.Run("CountedUntilClosed", func(t *testing.T) {
		t.Parallel()
		dsn, admin := setupTable(t)
		tx := lock(t, admin)
		m := NewPoolMeasurer(PoolMeasurerConfig{LockTimeout: time.Minute, MaxOpenConns: 1})
		t.Cleanup(m.Close)
		interrupt(t, m, dsn)
		// No slot for a cancel request: the server holds the session until
		// the lock is released, and it still counts.
		_, err := measureWithin(ctx, m, key("b"), target(dsn+"&application_name=b"), 300*time.Millisecond)
		require.ErrorIs(t, err, errNoConnSlot)
		require.NoError(t, tx.Rollback(ctx))
		require.Eventually(t, func() bool { return m.ConnStats().Open == 0 }, 10*time.Second, 10*time.Millisecond)
		_, err = measure(ctx, m, key("b"), target(dsn+"&application_name=b"))
		require.NoError(t, err)
	})
}

// TestPoolMeasurerFindsRelaysOfOtherStreams: with the relay's stream (and
// slot), the check reads the relays table beside the outbox table and
// returns the relays of other streams or of the other source seen within
// outbox.RelaySeenWindow; the relay's own registration, one of its stream
// and source, and one not seen for an hour do not count. Without the table,
// or without the right to read it, there are none and the check succeeds.
func TestPoolMeasurerFindsRelaysOfOtherStreams(t *testing.T) {
	t.Parallel()
	dsn, conn := setupTable(t)
	ctx := context.Background()
	table := outbox.MustNew("", outbox.Columns{})
	relays := pgx.Identifier{table.RelaysTableName()}.Sanitize()
	m := NewPoolMeasurer(PoolMeasurerConfig{})
	t.Cleanup(m.Close)
	polling, slot := target(dsn), target(dsn)
	polling.Stream = "jobs"
	slot.Stream, slot.Slot = "jobs", "jobs_slot"

	_, err := conn.Exec(ctx, `DROP TABLE `+relays)
	require.NoError(t, err)
	b, err := measure(ctx, m, key("a"), polling)
	require.NoError(t, err, "no relays table: nothing known, no failure")
	require.Nil(t, b.OtherRelays)

	_, err = conn.Exec(ctx, table.RelaysDDL())
	require.NoError(t, err)
	for _, r := range []outbox.TableRelay{{Stream: "jobs"}, {Stream: "jobs", Slot: "jobs_slot"}, {Stream: "audit"}, {Stream: "gone"}} {
		_, err := table.RecordRelay(ctx, conn, r)
		require.NoError(t, err)
	}
	_, err = conn.Exec(ctx, `UPDATE `+relays+` SET seen_at = now() - interval '1 hour' WHERE stream = 'gone'`)
	require.NoError(t, err)

	names := func(rs []outbox.TableRelay) []string {
		n := make([]string, 0, len(rs))
		for _, r := range rs {
			n = append(n, r.String())
		}
		return n
	}
	b, err = measure(ctx, m, key("a"), polling)
	require.NoError(t, err)
	require.Equal(t, []string{"stream audit (source Polling)", "stream jobs (source LogicalReplication, slot jobs_slot)"},
		names(b.OtherRelays))
	b, err = measure(ctx, m, key("b"), slot)
	require.NoError(t, err)
	require.Equal(t, []string{"stream audit (source Polling)", "stream jobs (source Polling)"}, names(b.OtherRelays))
	b, err = measure(ctx, m, key("c"), target(dsn))
	require.NoError(t, err)
	require.Nil(t, b.OtherRelays, "no stream asked: the relays table is not read")

	// A role that may read the outbox tables but not the relays table.
	_, err = conn.Exec(ctx, fmt.Sprintf(`CREATE ROLE backlog_no_relays LOGIN; GRANT SELECT ON %s, %s, %s TO backlog_no_relays`,
		pgx.Identifier{table.Name()}.Sanitize(), pgx.Identifier{table.DeadLetterTableName()}.Sanitize(),
		pgx.Identifier{table.StreamResetsTableName()}.Sanitize()))
	require.NoError(t, err)
	cfg, err := pgx.ParseConfig(dsn)
	require.NoError(t, err)
	limited := fmt.Sprintf("postgres://backlog_no_relays@%s/%s?sslmode=disable",
		net.JoinHostPort(cfg.Host, fmt.Sprint(cfg.Port)), cfg.Database)
	lt := target(limited)
	lt.Stream = "jobs"
	b, err = measure(ctx, m, key("d"), lt)
	require.NoError(t, err, "no right to read the relays table: nothing known, no failure")
	require.Nil(t, b.OtherRelays)
}
