//go:build faults

package faults

import (
	"context"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/outbox-dev/outbox-operator/internal/testenv"
)

// connect opens a connection closed in the test's cleanup.
func connect(t testing.TB, dsn string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), dsn)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// outboxCase is what most cases start from: a PostgreSQL and a Redis of
// their own, the relay's schema applied (relay schema --apply), the relay's
// environment, a stream named after the test and clients of both servers.
type outboxCase struct {
	pg     *testenv.PostgresServer
	rs     *testenv.RedisServer // no persistence
	env    relayEnv
	stream string
	conn   *pgx.Conn
	rdb    *redis.Client
}

// startOutboxCase starts the servers of an outboxCase.
func startOutboxCase(t testing.TB) outboxCase {
	t.Helper()
	pg, rs := testenv.StartPostgres(t), testenv.StartRedis(t)
	c := outboxCase{pg: pg, rs: rs, env: relayEnv{databaseURL: pg.DSN(), redisURL: rs.URL()}, stream: testenv.Name(t)}
	mustRelay(t, c.env, "schema", "--apply")
	c.conn, c.rdb = connect(t, pg.DSN()), redisClient(t, rs.URL())
	return c
}

// mustExec runs a statement that must succeed.
func mustExec(t testing.TB, conn *pgx.Conn, sql string, args ...any) {
	t.Helper()
	_, err := conn.Exec(t.Context(), sql, args...)
	require.NoError(t, err, "%s", sql)
}

// pending counts the table's undispatched rows.
func pending(ctx context.Context, conn *pgx.Conn, table string) (int, error) {
	var n int
	err := conn.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM %s WHERE dispatched_at IS NULL`, table)).Scan(&n)
	return n, err
}

// waitDrained polls until no row of table is pending; it returns how long
// that took.
func waitDrained(t testing.TB, conn *pgx.Conn, table string, timeout time.Duration) time.Duration {
	t.Helper()
	return eventually(t, timeout, "outbox "+table+" drained", func() error {
		n, err := pending(t.Context(), conn, table)
		if err == nil && n > 0 {
			err = fmt.Errorf("%d rows pending", n)
		}
		return err
	})
}

// lockableNow counts the pending rows a new session could claim now: the
// relay's own SKIP LOCKED select, rolled back at once.
func lockableNow(ctx context.Context, conn *pgx.Conn, table string) (int, error) {
	var n int
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM (
	SELECT 1 FROM %s WHERE dispatched_at IS NULL FOR UPDATE SKIP LOCKED) s`, table)).Scan(&n)
	})
	if err != nil {
		return 0, err
	}
	return n, nil
}

// requireNothingLocked asserts that no session holds a lock on the table (or
// its partitions and children): a FOR UPDATE NOWAIT over every row succeeds,
// and pg_locks shows no other session on it.
func requireNothingLocked(t testing.TB, conn *pgx.Conn, table string) {
	t.Helper()
	err := pgx.BeginFunc(t.Context(), conn, func(tx pgx.Tx) error {
		_, err := tx.Exec(t.Context(), fmt.Sprintf(`SELECT 1 FROM %s FOR UPDATE NOWAIT`, table))
		return err
	})
	require.NoError(t, err, "SELECT ... FOR UPDATE NOWAIT over %s: a row is still locked", table)
	var holders []string
	rows, err := conn.Query(t.Context(), `SELECT DISTINCT
	a.pid::text || ' ' || coalesce(a.application_name, '') || ' ' || coalesce(a.state, '')
FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.pid <> pg_backend_pid()
  AND l.relation IN (SELECT $1::regclass UNION ALL SELECT inhrelid FROM pg_inherits WHERE inhparent = $1::regclass)`, table)
	require.NoError(t, err)
	holders, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Empty(t, holders, "sessions holding locks on %s", table)
}

// backendsOf returns the PostgreSQL backend pids whose client ports are ports.
func backendsOf(ctx context.Context, conn *pgx.Conn, ports []int) ([]int, error) {
	rows, err := conn.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE client_port = ANY($1)`, ports)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[int])
}

// claiming counts which of the backend pids are inside a transaction that
// has written (a claim holds row locks once its UPDATE ran).
func claiming(ctx context.Context, conn *pgx.Conn, pids []int) (int, error) {
	var n int
	err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
WHERE pid = ANY($1) AND backend_xid IS NOT NULL`, pids).Scan(&n)
	return n, err
}

// waitHoldingClaim polls, without pause (a claim lasts milliseconds), until
// a session of one of the relays holds a claim, and returns the relays'
// backend pids. The pids are found again every 200 polls, so a session a
// relay opened after the first look is watched too. On timeout it fails with
// what each of their sessions was doing (all idle: nothing left to claim).
func waitHoldingClaim(t testing.TB, conn *pgx.Conn, dsn string, timeout time.Duration, relays ...*relayProc) []int {
	t.Helper()
	var backends []int
	names := make([]string, 0, len(relays))
	for _, r := range relays {
		names = append(names, r.name)
	}
	polls := 0
	eventuallyEvery(t, 0, timeout, "relay "+strings.Join(names, " or ")+" holding a claim", func() error {
		if polls%200 == 0 {
			backends = backends[:0]
			for _, r := range relays {
				backends = append(backends, relayBackends(t, conn, r, dsn)...)
			}
		}
		polls++
		n, err := claiming(t.Context(), conn, backends)
		if err == nil && n == 0 {
			err = fmt.Errorf("no claim held after %d polls, their sessions: %s", polls, sessions(t.Context(), conn, backends))
		}
		return err
	})
	return backends
}

// sessions describes what the backends are doing, from pg_stat_activity,
// for a failure message.
func sessions(ctx context.Context, conn *pgx.Conn, pids []int) string {
	rows, err := conn.Query(ctx, `SELECT format('pid %s %s xid=%s wait=%s/%s xact_start=%s: %s',
	pid, state, backend_xid, wait_event_type, wait_event, xact_start, left(query, 80))
FROM pg_stat_activity WHERE pid = ANY($1) ORDER BY pid`, pids)
	if err != nil {
		return err.Error()
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err.Error()
	}
	return fmt.Sprintf("%v", lines)
}

// serverNow is the server's clock_timestamp(), to compare with xact_start.
func serverNow(t testing.TB, conn *pgx.Conn) time.Time {
	t.Helper()
	var now time.Time
	require.NoError(t, conn.QueryRow(t.Context(), `SELECT clock_timestamp()`).Scan(&now))
	return now
}

// inTransaction counts which of the backend pids are still inside a
// transaction that began before since, that is, may still hold the row
// locks they held then.
func inTransaction(ctx context.Context, conn *pgx.Conn, pids []int, since time.Time) (int, error) {
	var n int
	err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
WHERE pid = ANY($1) AND xact_start IS NOT NULL AND xact_start <= $2`, pids, since).Scan(&n)
	return n, err
}

// waitReleased polls until none of the backends is in a transaction begun
// before since, and returns how long that took.
func waitReleased(t testing.TB, conn *pgx.Conn, pids []int, since time.Time, timeout time.Duration) time.Duration {
	t.Helper()
	return eventually(t, timeout, "locks of the relay's sessions released", func() error {
		n, err := inTransaction(t.Context(), conn, pids, since)
		if err == nil && n > 0 {
			err = fmt.Errorf("%d of its sessions still in a transaction", n)
		}
		return err
	})
}

// relayBackends returns the backend pids of relay p's PostgreSQL sessions,
// found by the local ports of its connections to the server's port.
func relayBackends(t testing.TB, conn *pgx.Conn, p *relayProc, dsn string) []int {
	t.Helper()
	ports, err := p.tcpPortsTo(dsnPort(t, dsn))
	require.NoError(t, err)
	pids, err := backendsOf(t.Context(), conn, ports)
	require.NoError(t, err)
	return pids
}

// dsnPort is the port of a postgres:// or redis:// URL.
func dsnPort(t testing.TB, dsn string) int {
	t.Helper()
	u, err := url.Parse(dsn)
	require.NoError(t, err)
	port, err := strconv.Atoi(u.Port())
	require.NoError(t, err)
	return port
}

// withHost returns the URL with its host:port replaced, e.g. by a proxy's.
func withHost(t testing.TB, rawURL, hostPort string) string {
	t.Helper()
	u, err := url.Parse(rawURL)
	require.NoError(t, err)
	u.Host = hostPort
	return u.String()
}
