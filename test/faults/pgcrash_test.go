//go:build faults

package faults

import (
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outbox-dev/outbox-operator/internal/testenv"
)

// TestPostgresCrash shuts PostgreSQL down immediately (SIGQUIT: no
// checkpoint; the WAL not yet flushed is lost, and with it the relays' last
// commits, since the test server runs with synchronous_commit=off) while two
// relays drain a backlog and hold claims, then starts it again. The batches
// in flight are rolled back and claimed again, and the marks (or deletes)
// lost with the unflushed WAL make their rows pending again, so they are
// published again. Nothing may be lost or stay locked, and every duplicate
// must be of an entry added before the crash. It runs in both cleanup
// modes, in the CI slice too.
func TestPostgresCrash(t *testing.T) {
	t.Parallel()
	forCleanupModes(t, testPostgresCrash)
}

func testPostgresCrash(t *testing.T, mode cleanupMode) {
	rows := sized(50000, 200000)
	const batchSize, inFlight = 100, 2

	pg, rs := testenv.StartPostgres(t), testenv.StartRedis(t)
	env, stream := caseEnv(t, pg, rs)
	conn := connect(t, pg.DSN())
	committed := prefillRows(t, conn, rows)
	// The rows are on disk before the crash: it must take only what the
	// relays did.
	waitWALFlushed(t, conn)
	args := append([]string{"--stream", stream, "--batch-size", fmt.Sprint(batchSize), "--in-flight", fmt.Sprint(inFlight)},
		mode.args(t)...)
	relays := []*relayProc{startRelay(t, "A", env, args...), startRelay(t, "B", env, args...)}
	published := func() float64 { return relays[0].published() + relays[1].published() }

	eventually(t, time.Minute, "a fifth of the rows published", func() error {
		if p := published(); p < float64(rows/5) {
			return fmt.Errorf("%.0f published", p)
		}
		return nil
	})
	waitHoldingClaim(t, conn, pg.DSN(), time.Minute, relays...)
	pg.Crash(t)
	// A batch claimed before the crash may still be published after it:
	// its commit fails. No claim succeeds while the server is down.
	time.Sleep(time.Second)
	rdb := redisClient(t, rs.URL())
	beforeCrash, err := rdb.XLen(t.Context(), stream).Result()
	require.NoError(t, err)
	publishedAtCrash := published()
	pg.Start(t)
	conn = connect(t, pg.DSN())
	recovered := eventually(t, 2*time.Minute, "the relays publishing again", func() error {
		if published() <= publishedAtCrash {
			return fmt.Errorf("nothing published since the restart")
		}
		return nil
	})
	drain := waitDrained(t, conn, "outbox_events", 5*time.Minute)
	for _, r := range relays {
		require.False(t, r.exited(), "relay %s exited: %v", r.name, r.waitErr)
		r.stop(t, time.Minute)
	}

	requireNothingLocked(t, conn, "outbox_events")
	require.Zero(t, backlog(t, env, "outbox_events").Count, "relay backlog")
	requireOutboxAfterDrain(t, conn, "outbox_events", mode, rows)
	r := checkStream(t, rdb, stream, committed)
	figures(t, r, 1, fmt.Sprintf("entries_before_crash=%d recovered=%s drain=%s",
		beforeCrash, ms(recovered), ms(drain)))
	require.Equal(t, rows, r.Committed)
	require.Zero(t, r.Lost, "lost events, e.g. %v", r.LostIDs)
	require.Zero(t, r.Unexpected, "stream entries no producer committed")
	require.LessOrEqual(t, r.Duplicates, int(beforeCrash), "duplicates of entries not added before the crash")
}

// waitWALFlushed waits until the server has flushed the WAL written so far,
// so that an immediate shutdown loses none of it.
func waitWALFlushed(t testing.TB, conn *pgx.Conn) {
	t.Helper()
	var lsn string
	require.NoError(t, conn.QueryRow(t.Context(), `SELECT pg_current_wal_insert_lsn()::text`).Scan(&lsn))
	eventually(t, time.Minute, "the WAL flushed", func() error {
		var flushed bool
		err := conn.QueryRow(t.Context(), `SELECT pg_current_wal_flush_lsn() >= $1::pg_lsn`, lsn).Scan(&flushed)
		if err == nil && !flushed {
			err = fmt.Errorf("flushed only before %s", lsn)
		}
		return err
	})
}
