//go:build faults

package faults

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-dev/outbox-operator/internal/testenv"
)

// TestKillBelowTheFrontier: while the outbox holds more than a batch, a
// relay of ordering None claims from its frontier, past the batches it and
// others hold (outbox.Frontier). Relay A is SIGKILLed holding a claim and
// not restarted, so the rows it held come back below relay B's frontier
// while B still has a long backlog ahead of it. They must be claimed again
// by B's next claim from the start (at least once a second), not left until
// B catches up: they are published while the backlog is still more than a
// batch. Nothing is lost, nothing stays locked. Both cleanup
// modes, in the CI slice too.
func TestKillBelowTheFrontier(t *testing.T) {
	t.Parallel()
	forCleanupModes(t, testKillBelowTheFrontier)
}

func testKillBelowTheFrontier(t *testing.T, mode cleanupMode) {
	rows := sized(200_000, 500_000)
	const batchSize, inFlight = 100, 2

	pg, rs := testenv.StartPostgres(t), testenv.StartRedis(t)
	env, stream := caseEnv(t, pg, rs)
	conn := connect(t, pg.DSN())
	committed := insertRows(t, conn, `INSERT INTO outbox_events (event_type, payload, created_at)
SELECT 'fault.frontier', '{"n":' || g || '}', now() - interval '1 hour' + g * interval '1 microsecond'
FROM generate_series(1, $1) g
RETURNING id::text, created_at`, rows)
	mustExec(t, conn, `VACUUM ANALYZE outbox_events`)

	args := append([]string{"--stream", stream, "--batch-size", strconv.Itoa(batchSize), "--in-flight", strconv.Itoa(inFlight)},
		mode.args(t)...)
	a := startRelay(t, "A", env, args...)
	b := startRelay(t, "B", env, args...)
	eventually(t, time.Minute, "both relays publishing", func() error {
		if a.published() == 0 || b.published() == 0 {
			return fmt.Errorf("published: A %v, B %v", a.published(), b.published())
		}
		return nil
	})
	backends := waitHoldingClaim(t, conn, pg.DSN(), time.Minute, a)
	killedAt := serverNow(t, conn)
	a.kill(t)
	lock := waitReleased(t, conn, backends, killedAt, time.Minute)

	// Below B's frontier, only batches in flight are pending: A's, released
	// now, and B's own, at most inFlight batches each. So the lowest
	// 2 x inFlight x batchSize pending rows hold every row below it; the
	// last of them bounds what must be claimed again.
	var bound time.Time
	var left int
	require.NoError(t, conn.QueryRow(t.Context(), `SELECT max(created_at), (SELECT count(*) FROM outbox_events WHERE dispatched_at IS NULL)
FROM (SELECT created_at FROM outbox_events WHERE dispatched_at IS NULL ORDER BY created_at, id LIMIT $1) AS lowest`,
		2*inFlight*batchSize).Scan(&bound, &left))
	released := time.Now()
	var claimedAgain time.Duration
	var leftThen int
	eventuallyEvery(t, 50*time.Millisecond, 5*time.Minute, "the rows below the frontier published", func() error {
		var below int
		if err := conn.QueryRow(t.Context(), `SELECT count(*) FILTER (WHERE created_at <= $1), count(*) FROM outbox_events
WHERE dispatched_at IS NULL`, bound).Scan(&below, &leftThen); err != nil {
			return err
		}
		if below > 0 {
			return fmt.Errorf("%d rows pending below %s, %d in all", below, bound.Format(time.RFC3339Nano), leftThen)
		}
		claimedAgain = time.Since(released)
		return nil
	})
	drain := waitDrained(t, conn, "outbox_events", 5*time.Minute)
	b.stop(t, time.Minute)

	requireNothingLocked(t, conn, "outbox_events")
	requireOutboxAfterDrain(t, conn, "outbox_events", mode, rows)
	r := checkStream(t, redisClient(t, rs.URL()), stream, committed)
	figures(t, r, 1, fmt.Sprintf("rows=%d pending_at_release=%d lock=%s below_frontier_published_after=%s pending_then=%d drain=%s",
		rows, left, ms(lock), ms(claimedAgain), leftThen, ms(drain)))
	require.Zero(t, r.Lost, "lost events, e.g. %v", r.LostIDs)
	require.Zero(t, r.Unexpected, "stream entries no producer committed")
	require.LessOrEqual(t, r.Duplicates, batchSize*inFlight, "duplicates beyond the batches A had in flight")
	require.Greater(t, leftThen, batchSize,
		"the rows below the frontier were claimed again while the backlog was still more than a batch, not only once caught up")
}
