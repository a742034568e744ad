//go:build faults

package faults

import (
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-dev/outbox-operator/internal/testenv"
)

// TestKills SIGKILLs two relays again and again while producers write, and
// restarts each at once: nothing is lost, each kill duplicates at most the
// batches it had in flight, and at the end no row is pending or locked. It
// runs in both cleanup modes, in the CI slice too.
func TestKills(t *testing.T) {
	t.Parallel()
	forCleanupModes(t, testKills)
}

func testKills(t *testing.T, mode cleanupMode) {
	events := sized(8000, 50000)
	kills := sized(10, 20)
	rate := sized(1000.0, 2500.0) // rows per second
	const batchSize, inFlight = 100, 2

	pg, rs := testenv.StartPostgres(t), testenv.StartRedis(t)
	env, stream := caseEnv(t, pg, rs)
	conn := connect(t, pg.DSN())
	args := append([]string{"--stream", stream, "--batch-size", strconv.Itoa(batchSize), "--in-flight", strconv.Itoa(inFlight)},
		mode.args(t)...)

	relays := [2]*relayProc{startRelay(t, "A", env, args...), startRelay(t, "B", env, args...)}
	start := time.Now()
	var killing atomic.Bool
	killing.Store(true)
	prod := startProducers(t, producerConfig{
		dsn: pg.DSN(), conns: 4, events: events, rate: rate, insert: insertInto("outbox_events"),
		more: killing.Load,
	})

	// The kills are spread over the first 80% of the time the producers
	// write; each waits until its victim has published since it
	// (re)started and holds a claim, so that it dies with batches in
	// flight. Restarts take longer on a loaded machine: the producers write
	// on until the last kill, else a late victim has nothing to claim.
	every := time.Duration(0.8 * float64(events) / rate / float64(kills) * float64(time.Second))
	var worstLock time.Duration
	for i := range kills {
		victim := relays[i%2]
		require.True(t, sleepUntil(t.Context(), start.Add(time.Duration(i)*every+every/2)))
		eventually(t, time.Minute, "relay "+victim.name+" publishing", func() error {
			if victim.published() == 0 {
				return fmt.Errorf("nothing published yet")
			}
			return nil
		})
		backends := waitHoldingClaim(t, conn, pg.DSN(), time.Minute, victim)
		killedAt := serverNow(t, conn)
		victim.kill(t)
		worstLock = max(worstLock, waitReleased(t, conn, backends, killedAt, time.Minute))
		relays[i%2] = startRelay(t, fmt.Sprintf("%s%d", victim.name[:1], i+1), env, args...)
	}
	killing.Store(false)
	prod.wait(t)
	produced := time.Now()
	waitDrained(t, conn, "outbox_events", 5*time.Minute)
	drain := time.Since(produced)
	for _, r := range relays {
		r.stop(t, time.Minute)
	}

	requireNothingLocked(t, conn, "outbox_events")
	require.Zero(t, backlog(t, env, "outbox_events").Count, "relay backlog")
	requireOutboxAfterDrain(t, conn, "outbox_events", mode, prod.committedCount())
	r := checkStream(t, redisClient(t, rs.URL()), stream, prod.committed())
	bound := kills * batchSize * inFlight
	figures(t, r, kills, fmt.Sprintf("duplicate_bound=%d worst_lock=%s drain=%s", bound, ms(worstLock), ms(drain)))
	require.GreaterOrEqual(t, r.Committed, events)
	require.Zero(t, r.Lost, "lost events, e.g. %v", r.LostIDs)
	require.Zero(t, r.Unexpected, "stream entries no producer committed")
	require.LessOrEqual(t, r.Duplicates, bound, "duplicates beyond batch size x in-flight per kill")
}
