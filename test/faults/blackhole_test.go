//go:build faults

package faults

import (
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outbox-dev/outbox-operator/internal/testenv"
)

// Short relay timeouts for the black-hole cases: in-flight x publish timeout
// plus 5s of spare stays below the idle-in-transaction timeout, as the relay
// requires.
const (
	bhBatchSize  = 100
	bhInFlight   = 2
	bhIdleInTx   = 10 * time.Second
	bhPublish    = 2 * time.Second
	bhStatement  = 5 * time.Second
	bhLockTimout = 2 * time.Second
)

// TestBlackhole cuts relay A off from PostgreSQL, then from Redis, with a
// toxiproxy black hole (the connection stays open, every byte is dropped)
// while producers write and relay B, connected directly, keeps relaying:
// every row is delivered, relay A's row locks are released by the servers'
// timeouts, and once the link is healed relay A relays again on its own.
// Both links run in both cleanup modes (TestBlackhole/<mode>/<link>); the
// CI slice runs only the Redis link's in OnDispatch, FAULTS_SCALE=full both.
func TestBlackhole(t *testing.T) {
	t.Parallel()
	forCleanupModes(t, func(t *testing.T, mode cleanupMode) {
		for _, link := range []string{"postgres", "redis"} {
			if link == "postgres" && !slices.Contains(cleanupModes(true), mode) {
				continue // OnDispatch's PostgreSQL link runs at FAULTS_SCALE=full
			}
			t.Run(link, func(t *testing.T) { testBlackhole(t, link, mode) })
		}
	})
}

func testBlackhole(t *testing.T, link string, mode cleanupMode) {
	events := sized(3000, 20000)
	rate := sized(400.0, 1000.0)

	pg, rs := testenv.StartPostgres(t), testenv.StartRedis(t)
	direct := relayEnv{databaseURL: pg.DSN(), redisURL: rs.URL()}
	stream := testenv.Name(t)
	mustRelay(t, direct, "schema", "--apply")
	conn := connect(t, pg.DSN())

	viaProxy := direct
	var toxic *proxy
	switch link {
	case "postgres":
		toxic = startProxy(t, "postgres", hostPort(t, pg.DSN()))
		viaProxy.databaseURL = withHost(t, pg.DSN(), toxic.addr())
	case "redis":
		toxic = startProxy(t, "redis", hostPort(t, rs.URL()))
		viaProxy.redisURL = withHost(t, rs.URL(), toxic.addr())
	}
	args := append([]string{"--stream", stream,
		"--batch-size", strconv.Itoa(bhBatchSize), "--in-flight", strconv.Itoa(bhInFlight),
		"--publish-timeout", bhPublish.String(), "--statement-timeout", bhStatement.String(),
		"--lock-timeout", bhLockTimout.String(), "--idle-in-transaction-timeout", bhIdleInTx.String(),
	}, mode.args(t)...)
	a := startRelay(t, "A", viaProxy, args...)
	b := startRelay(t, "B", direct, args...)
	// The producers write on past events until A is cut off: A needs rows
	// to claim when its link goes dark, however late (a loaded machine) it
	// gets there; B alone could have drained a finished production.
	var writing atomic.Bool
	writing.Store(true)
	prod := startProducers(t, producerConfig{
		dsn: pg.DSN(), conns: 4, events: events, rate: rate, insert: insertInto("outbox_events"), more: writing.Load,
	})

	// Mid-batch: relay A's link is slowed down first, so that A spends most
	// of its time inside a batch, and goes dark while A holds claimed rows.
	eventually(t, time.Minute, "relay A publishing", func() error {
		if a.published() < 2*bhBatchSize {
			return fmt.Errorf("relay A published %v events", a.published())
		}
		return nil
	})
	toxic.latency(t, 300*time.Millisecond)
	aBackends := relayABackends(t, link, conn, a, b, pg.DSN())
	var faultAt time.Time
	eventually(t, time.Minute, "relay A holding a claim", func() error {
		n, err := claiming(t.Context(), conn, aBackends)
		if err == nil && n == 0 {
			err = fmt.Errorf("relay A holds no claim")
		}
		return err
	})
	faultAt = serverNow(t, conn)
	toxic.blackhole(t)
	writing.Store(false)
	cutAt := time.Now()
	lockTime := waitReleased(t, conn, aBackends, faultAt, bhIdleInTx+time.Minute)
	prod.wait(t)
	waitDrained(t, conn, "outbox_events", bhIdleInTx+5*time.Minute)
	deliveredIn := time.Since(cutAt)

	// Healed, relay A relays again on its own: with B stopped, new rows drain.
	toxic.heal()
	b.stop(t, time.Minute)
	before := a.published()
	more := startProducers(t, producerConfig{
		dsn: pg.DSN(), conns: 2, events: 500, rate: 500, insert: insertInto("outbox_events"),
	})
	more.wait(t)
	recovery := waitDrained(t, conn, "outbox_events", 5*time.Minute)
	require.Greater(t, a.published(), before, "relay A published nothing after the link was healed")
	a.stop(t, time.Minute)

	requireNothingLocked(t, conn, "outbox_events")
	require.Zero(t, backlog(t, direct, "outbox_events").Count, "relay backlog")
	requireOutboxAfterDrain(t, conn, "outbox_events", mode, prod.committedCount()+500)
	r := checkStream(t, redisClient(t, rs.URL()), stream, append(prod.committed(), more.committed()...))
	bound := bhBatchSize * bhInFlight
	figures(t, r, 1, fmt.Sprintf("duplicate_bound=%d worst_lock=%s delivered_after_cut=%s recovered_drain=%s idle_in_tx=%s",
		bound, ms(lockTime), ms(deliveredIn), ms(recovery), bhIdleInTx))
	require.GreaterOrEqual(t, r.Committed, events+500)
	require.Zero(t, r.Lost, "lost events, e.g. %v", r.LostIDs)
	require.Zero(t, r.Unexpected, "stream entries no producer committed")
	require.LessOrEqual(t, r.Duplicates, bound, "duplicates beyond batch size x in-flight")
}

// relayABackends returns relay A's PostgreSQL sessions. Through the proxy
// their client ports are the proxy's, so they are the relay sessions that
// are not relay B's.
func relayABackends(t *testing.T, link string, conn *pgx.Conn, a, b *relayProc, dsn string) []int {
	t.Helper()
	if link != "postgres" {
		return relayBackends(t, conn, a, dsn)
	}
	bPids := relayBackends(t, conn, b, dsn)
	rows, err := conn.Query(t.Context(), `SELECT pid FROM pg_stat_activity WHERE application_name = 'outbox-relay'`)
	require.NoError(t, err)
	var pids []int
	for rows.Next() {
		var pid int
		require.NoError(t, rows.Scan(&pid))
		if !slices.Contains(bPids, pid) {
			pids = append(pids, pid)
		}
	}
	require.NoError(t, rows.Err())
	require.NotEmpty(t, pids, "relay A has no PostgreSQL session")
	return pids
}

// hostPort is the host:port of a URL.
func hostPort(t testing.TB, rawURL string) string {
	t.Helper()
	u, err := url.Parse(rawURL)
	require.NoError(t, err)
	return u.Host
}
