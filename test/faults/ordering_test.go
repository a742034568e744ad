//go:build faults

package faults

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outbox-dev/outbox-operator/internal/testenv"
)

// Timings of the ordered relays in these cases: a short leader timeout and
// quick polls, so that takeovers and drains take seconds.
var orderedArgs = []string{
	"--leader-timeout", "2s", "--batch-size", "100", "--in-flight", "2",
	"--publish-timeout", "1s", "--poll-interval", "50ms",
}

// requireOrdering fails the case when the relay under test has no
// --ordering (an older build given with FAULTS_RELAY_BIN).
func requireOrdering(t *testing.T) {
	t.Helper()
	require.True(t, runHelpLists(t, "--ordering"), "this relay has no --ordering: it cannot keep an order")
}

// ownersOf returns, for each relay, how many advisory locks its PostgreSQL
// sessions hold in exclusive mode at session level: the key partitions it
// owns (a new owner's fence is also taken exclusively, for a moment).
func ownersOf(t testing.TB, conn *pgx.Conn, dsn string, relays []*relayProc) []int {
	t.Helper()
	out := make([]int, len(relays))
	for i, r := range relays {
		if r.exited() {
			continue
		}
		pids := relayBackends(t, conn, r, dsn)
		if len(pids) == 0 {
			continue
		}
		require.NoError(t, conn.QueryRow(t.Context(), `SELECT count(*) FROM pg_locks
WHERE locktype = 'advisory' AND mode = 'ExclusiveLock' AND granted AND pid = ANY($1)`, pids).Scan(&out[i]))
	}
	return out
}

// killHoldingClaim SIGKILLs victim while one of its sessions holds a claim
// (a transaction that has written), or after 3 s without one (the
// producers may have finished); it reports whether a claim was held.
func killHoldingClaim(t testing.TB, conn *pgx.Conn, dsn string, victim *relayProc) bool {
	t.Helper()
	var backends []int
	held := false
	deadline := time.Now().Add(3 * time.Second)
	for polls := 0; time.Now().Before(deadline); polls++ {
		if polls%200 == 0 {
			backends = relayBackends(t, conn, victim, dsn)
		}
		n, err := claiming(t.Context(), conn, backends)
		require.NoError(t, err)
		if n > 0 {
			held = true
			break
		}
	}
	victim.kill(t)
	return held
}

// countLog counts the lines of the relays' output that contain s.
func countLog(relays []*relayProc, s string) int {
	n := 0
	for _, r := range relays {
		n += strings.Count(r.out.String(), s)
	}
	return n
}

// TestOrderingStrict checks ordering Strict: one producer connection writes
// one row per transaction (created_at DEFAULT clock_timestamp()), so commit
// order is (created_at, id) order and the whole stream must be in that
// order, while two relays (three during the rollout) are SIGKILLed, leaders
// while they hold a claim, a rollout hands over (a new relay started, then
// SIGTERM to the leader) and the leader's Redis replies are blackholed (its
// batches were published, but fail: they and every batch claimed after them
// are rolled back and claimed again). The first occurrences must be in
// order, nothing lost. It runs in both cleanup modes, in the CI slice too:
// in OnDispatch the rolled-back batches are deletes undone.
func TestOrderingStrict(t *testing.T) {
	t.Parallel()
	requireOrdering(t)
	forCleanupModes(t, testOrderingStrict)
}

func testOrderingStrict(t *testing.T, mode cleanupMode) {
	events := sized(4000, 20000)
	kills := sized(6, 20)
	failures := sized(1, 3)
	rate := sized(200.0, 400.0) // rows per second, one connection

	pg, rs := testenv.StartPostgres(t), testenv.StartRedis(t)
	direct := relayEnv{databaseURL: pg.DSN(), redisURL: rs.URL()}
	stream := testenv.Name(t)
	mustRelay(t, direct, "schema", "--apply")
	conn := connect(t, pg.DSN())
	mustExec(t, conn, `ALTER TABLE outbox_events ALTER COLUMN created_at SET DEFAULT clock_timestamp()`)
	args := append(append([]string{"--stream", stream, "--ordering", "Strict"}, orderedArgs...), mode.args(t)...)

	// Each relay reaches Redis through a proxy of its own, so that the
	// leader's link alone can fail.
	started := newProxiedRelays(t, direct, "S", args...)
	start := started.start
	relays := []*relayProc{start()}
	leaderIndex := func() int {
		owners := ownersOf(t, conn, pg.DSN(), relays)
		for i, o := range owners {
			if o > 0 {
				return i
			}
		}
		return -1
	}
	eventually(t, time.Minute, "a leader", func() error {
		if leaderIndex() < 0 {
			return errors.New("no relay holds the leadership")
		}
		return nil
	})
	relays = append(relays, start())

	var prod *producers
	// waitLeader waits until a relay leads and, while the producer writes,
	// has published; it returns that relay.
	waitLeader := func(what string) *relayProc {
		var leader *relayProc
		eventually(t, time.Minute, what, func() error {
			i := leaderIndex()
			if i < 0 {
				return errors.New("no relay holds the leadership")
			}
			if relays[i].published() == 0 && prod.committedCount() < events {
				return fmt.Errorf("leader %s has published nothing yet", relays[i].name)
			}
			leader = relays[i]
			return nil
		})
		return leader
	}
	remove := func(r *relayProc) { relays = slices.DeleteFunc(relays, func(x *relayProc) bool { return x == r }) }

	prod = startProducers(t, producerConfig{
		dsn: pg.DSN(), conns: 1, maxRows: 1, events: events, rate: rate, insert: insertInto("outbox_events"),
	})
	produceStart := time.Now()

	// The faults, spread over the first 80% of the production: kills (every
	// third of the standby, the others of the leader holding a claim), one
	// rollout a third of the way, the failures after it.
	type fault struct{ kind string }
	var plan []fault
	for range kills {
		plan = append(plan, fault{"kill"})
	}
	plan = slices.Insert(plan, len(plan)/3, fault{"rollout"})
	for i := range failures {
		plan = slices.Insert(plan, (len(plan)*(2+i))/(3+failures), fault{"fail"})
	}
	every := time.Duration(0.8 * float64(events) / rate / float64(len(plan)) * float64(time.Second))
	var worstTakeover, handover time.Duration
	faultsAfterProduction := 0
	var leaderKills, claimsHeld, failed int
	kill := 0
	for i, f := range plan {
		sleepUntil(t.Context(), produceStart.Add(time.Duration(i)*every+every/2))
		leader := waitLeader("a leader publishing")
		if prod.committedCount() >= events {
			faultsAfterProduction++
		}
		switch f.kind {
		case "kill":
			kill++
			victim := leader
			if kill%3 == 0 {
				victim = relays[(slices.Index(relays, leader)+1)%len(relays)]
			}
			if victim != leader {
				victim.kill(t) // a standby holds no claim
			} else if killHoldingClaim(t, conn, pg.DSN(), victim) {
				claimsHeld++
			}
			killed := time.Now()
			remove(victim)
			if victim == leader {
				// The standby takes over; the replacement starts after, as a
				// restarted pod would.
				leaderKills++
				waitLeader("a new leader after the kill")
				worstTakeover = max(worstTakeover, time.Since(killed))
			}
			relays = append(relays, start())
		case "rollout":
			relays = append(relays, start()) // three relays for a moment
			stopped := time.Now()
			leader.stop(t, time.Minute)
			remove(leader)
			waitLeader("a new leader after the rollout")
			handover = time.Since(stopped)
		case "fail":
			errorsBefore := leader.metric(`outbox_relay_errors_total{kind="redis"}`)
			x := started.proxies[leader]
			// Redis runs the leader's scripts, but its replies are lost: the
			// batch was published and fails (a run of duplicates), and every
			// batch claimed after it is rolled back unpublished. The last
			// failure of a full run cuts both ways.
			dir := "downstream"
			if failed == 2 {
				dir = "both"
			}
			blackholeDir(t, x, dir)
			time.Sleep(2 * time.Second) // twice --publish-timeout
			x.heal()
			failed++
			eventually(t, time.Minute, "the leader's failed batches counted", func() error {
				if leader.metric(`outbox_relay_errors_total{kind="redis"}`) <= errorsBefore {
					return errors.New("no Redis error counted")
				}
				return nil
			})
		}
	}
	prod.wait(t)
	// The producer's own time, not the harness's: the fault loop may end
	// well after the production on a loaded machine (relay starts, takeovers).
	require.Less(t, prod.took(), time.Duration(float64(events)/rate*float64(time.Second))+30*time.Second,
		"the producer fell far behind its rate")
	drain := waitDrained(t, conn, "outbox_events", 2*time.Minute)
	for _, r := range relays {
		r.stop(t, time.Minute)
	}
	requireNothingLocked(t, conn, "outbox_events")
	requireOutboxAfterDrain(t, conn, "outbox_events", mode, events)

	r := CheckOrder(prod.committed(), streamEntries(t, redisClient(t, rs.URL()), stream), false)
	faults := kills + 1 + failures
	figures(t, r.Report(), faults, fmt.Sprintf(
		"kills=%d leader_kills=%d leader_kills_holding_claim=%d rollouts=1 failures=%d worst_takeover=%s handover=%s "+
			"fenced_refusals=%d faults_after_production=%d drain=%s",
		kills, leaderKills, claimsHeld, failures, ms(worstTakeover), ms(handover), countLog(started.all, "FENCED"),
		faultsAfterProduction, ms(drain)))
	require.Equal(t, events, r.Committed)
	require.Zero(t, r.Lost, "lost events, e.g. %v", r.LostIDs)
	require.Zero(t, r.Unexpected, "stream entries no producer committed")
	require.Zero(t, r.Reorderings, "first occurrences out of (created_at, id) order, e.g. %v", r.Reordered)
}

// blackholeDir blackholes one direction of a proxy's link ("upstream",
// "downstream") or both.
func blackholeDir(t testing.TB, x *proxy, dir string) {
	t.Helper()
	if dir == "both" {
		x.blackhole(t)
		return
	}
	x.add(t, fmt.Sprintf(`{"name":"blackhole_%s","type":"timeout","stream":"%s","attributes":{"timeout":0}}`, dir, dir))
}

// insertKeyed inserts n small JSON events into table with keys drawn from
// keys, returning id::text, created_at and the key.
func insertKeyed(table, keyColumn string, keys []string) insertFunc {
	sql := fmt.Sprintf(`INSERT INTO %s (event_type, payload, %s)
SELECT 'fault.test', json_build_object('n', g, 'pad', repeat('x', 64))::text, ($2::text[])[g]
FROM generate_series(1, $1) g
RETURNING id::text, created_at, %[2]s`, pgx.Identifier{table}.Sanitize(), pgx.Identifier{keyColumn}.Sanitize())
	return func(rng *rand.Rand, n int) (string, []any) {
		pick := make([]string, n)
		for i := range pick {
			pick[i] = keys[rng.IntN(len(keys))]
		}
		return sql, []any{n, pick}
	}
}

// TestOrderingPerKey checks ordering PerKey: producers each own a disjoint
// set of keys and write serially (so per key, commit order is created_at
// order) while the relay count goes 1 -> 4 -> 2, with relays SIGKILLed while
// they hold a claim in between (and restarted), and the step down made of a
// SIGKILL and a SIGTERM. Per key, the first occurrences must be in
// (created_at, id) order, nothing lost, every entry carrying its key.
// OnDispatch runs it at FAULTS_SCALE=full.
func TestOrderingPerKey(t *testing.T) {
	t.Parallel()
	requireOrdering(t)
	forCleanupModesOnDispatchAtFull(t, testOrderingPerKey)
}

func testOrderingPerKey(t *testing.T, mode cleanupMode) {
	events := sized(8000, 50000)
	keyCount := sized(200, 1000)
	killsAt4, killsAt2 := sized(2, 5), sized(1, 3)
	rate := sized(800.0, 2000.0)
	const conns = 4

	pg, rs := testenv.StartPostgres(t), testenv.StartRedis(t)
	env, stream := caseEnv(t, pg, rs)
	conn := connect(t, pg.DSN())
	mustExec(t, conn, `ALTER TABLE outbox_events ADD COLUMN aggregate_id text`)
	args := append(append([]string{"--stream", stream, "--ordering", "PerKey", "--key-column", "aggregate_id"}, orderedArgs...),
		mode.args(t)...)

	var all []*relayProc
	n := 0
	start := func() *relayProc {
		n++
		r := startRelay(t, fmt.Sprintf("K%d", n), env, args...)
		all = append(all, r)
		return r
	}
	relays := []*relayProc{start()}
	remove := func(r *relayProc) { relays = slices.DeleteFunc(relays, func(x *relayProc) bool { return x == r }) }

	keys := make([][]string, conns)
	for k := range keyCount {
		keys[k%conns] = append(keys[k%conns], "agg-"+strconv.Itoa(k))
	}
	prod := startProducers(t, producerConfig{
		dsn: pg.DSN(), conns: conns, maxRows: 10, events: events, rate: rate,
		insertFor: func(i int) insertFunc { return insertKeyed("outbox_events", "aggregate_id", keys[i]) },
	})
	produceStart := time.Now()

	// The plan: 1 -> 4 relays, kills at 4, down to 2 (one SIGKILL, one
	// SIGTERM), kills at 2; spread over the first 80% of the production.
	plan := make([]string, 0, 2+killsAt4+killsAt2)
	plan = append(plan, "up")
	for range killsAt4 {
		plan = append(plan, "kill")
	}
	plan = append(plan, "down")
	for range killsAt2 {
		plan = append(plan, "kill")
	}
	every := time.Duration(0.8 * float64(events) / rate / float64(len(plan)) * float64(time.Second))
	var sigkills, claimsHeld int
	counts := make([]string, 1, 1+len(plan))
	counts[0] = "1"
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	// publishing picks a running relay that has published, at random.
	publishing := func() *relayProc {
		var victim *relayProc
		eventually(t, time.Minute, "a relay publishing", func() error {
			var ok []*relayProc
			for _, r := range relays {
				if r.published() > 0 {
					ok = append(ok, r)
				}
			}
			if len(ok) == 0 {
				return errors.New("no relay has published yet")
			}
			victim = ok[rng.IntN(len(ok))]
			return nil
		})
		return victim
	}
	for i, step := range plan {
		sleepUntil(t.Context(), produceStart.Add(time.Duration(i)*every+every/2))
		switch step {
		case "up":
			for range 3 {
				relays = append(relays, start())
			}
		case "kill":
			victim := publishing()
			if killHoldingClaim(t, conn, pg.DSN(), victim) {
				claimsHeld++
			}
			sigkills++
			remove(victim)
			relays = append(relays, start())
		case "down":
			victim := publishing()
			if killHoldingClaim(t, conn, pg.DSN(), victim) {
				claimsHeld++
			}
			sigkills++
			remove(victim)
			other := relays[rng.IntN(len(relays))]
			other.stop(t, time.Minute)
			remove(other)
		}
		counts = append(counts, strconv.Itoa(len(relays)))
	}
	prod.wait(t)
	drain := waitDrained(t, conn, "outbox_events", 2*time.Minute)
	// Every running relay owns a share once the ownership settled.
	owners := ownersOf(t, conn, pg.DSN(), relays)
	for _, r := range relays {
		r.stop(t, time.Minute)
	}
	requireNothingLocked(t, conn, "outbox_events")
	requireOutboxAfterDrain(t, conn, "outbox_events", mode, events)

	r := CheckOrder(prod.committed(), streamEntries(t, redisClient(t, rs.URL()), stream), true)
	figures(t, r.Report(), sigkills+1, fmt.Sprintf(
		"keys=%d relays=%s sigkills=%d kills_holding_claim=%d sigterms=1 partitions_at_end=%v fenced_refusals=%d drain=%s",
		r.Groups, strings.Join(slices.Compact(counts), "->"), sigkills, claimsHeld, owners, countLog(all, "FENCED"), ms(drain)))
	require.Equal(t, events, r.Committed)
	require.Equal(t, keyCount, r.Groups, "keys that received events")
	require.Zero(t, r.Lost, "lost events, e.g. %v", r.LostIDs)
	require.Zero(t, r.Unexpected, "stream entries no producer committed")
	require.Zero(t, r.KeyMismatches, "entries whose key field is not the row's key")
	require.Zero(t, r.Reorderings, "first occurrences of a key out of (created_at, id) order, e.g. %v", r.Reordered)
}
