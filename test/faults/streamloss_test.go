//go:build faults

package faults

import (
	"cmp"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/outbox-dev/outbox-operator/internal/testenv"
)

// Stream loss: Redis loses entries the relay added and acknowledged (a
// restart without persistence, a FLUSHALL, eviction). The relay cannot
// prevent it; it must notice, say so, and make the loss repairable: `relay
// replay` of the window it reports puts every event back.

// replayJSON is the output of `relay replay --output json`.
type replayJSON struct {
	Republished    int64 `json:"republished"`
	ResetsReplayed int64 `json:"resetsReplayed"`
}

// streamLossCase runs producers and one relay, makes Redis lose the stream
// mid-drain with fault, and checks that the relay reports the reset and
// that `relay replay --pending` leaves nothing lost. source is the relay's
// --source; for LogicalReplication, which marks no row, the replay is given
// the same --source, as the operator's StreamIntact condition says.
func streamLossCase(t *testing.T, source string, fault func(t *testing.T, rs *testenv.RedisServer)) {
	t.Helper()
	streamLoss(t, streamLossSpec{source: source, fault: fault})
}

// streamLossSpec is a stream-loss case (streamLoss).
type streamLossSpec struct {
	source string // the relay's --source
	fault  func(t *testing.T, rs *testenv.RedisServer)
	// checkInterval is the relay's --stream-check-interval; "": 200ms.
	checkInterval string
	// afterDetect, when set, runs once the relay counted the reset and
	// returns the relay that drains the rest (the same, or one started
	// instead of it).
	afterDetect func(t *testing.T, relay *relayProc, env relayEnv, args []string) *relayProc
	// cleanupFirst runs `relay cleanup --retention 0s` (what the cleanup
	// CronJob does, with the shortest retention) before the replay.
	cleanupFirst bool
	// windowFirst runs, before the replay with --pending, a replay of the
	// recorded window given by hand (--since, --until), which must mark no
	// reset replayed (a slot relay's; rows created outside it are lost too).
	windowFirst bool
	// before, when set, runs before the relay starts.
	before func(t *testing.T, rdb *redis.Client, stream string)
	// insert is the producers' statement; nil: insertInto("outbox_events").
	insert insertFunc
}

// streamLoss runs a stream-loss case: see streamLossCase.
func streamLoss(t *testing.T, c streamLossSpec) {
	t.Helper()
	source := c.source
	events := sized(3000, 30000)
	rate := sized(1500.0, 3000.0)
	oc := startOutboxCase(t)
	pg, rs, env, stream, conn, rdb := oc.pg, oc.rs, oc.env, oc.stream, oc.conn, oc.rdb
	args := []string{"--stream", stream, "--batch-size", "100", "--stream-check-interval", cmp.Or(c.checkInterval, "200ms")}
	replayArgs := []string{"replay", "--stream", stream, "--pending", "--output", "json"}
	if source != "Polling" {
		args = append(args, "--source", source, "--slot", replicationSlot)
		replayArgs = append(replayArgs, "--source", source)
	}
	if c.before != nil {
		c.before(t, rdb, stream)
	}
	relay := startRelay(t, "A", env, args...)
	insert := c.insert
	if insert == nil {
		insert = insertInto("outbox_events")
	}
	prod := startProducers(t, producerConfig{dsn: pg.DSN(), conns: 2, events: events, rate: rate, insert: insert})

	// The fault hits once a third of the events are in the stream and, for
	// a slot's relay, once it streams: the rows committed before the slot
	// existed are published by its first catch-up, which a loaded machine
	// may make a third of the events, and a reset found during it has the
	// catch-up done again (no entry lost: the case would test nothing).
	streamedFrom := -1.0
	eventually(t, time.Minute, "a third published", func() error {
		p := relay.published()
		if p < float64(events/3) {
			return fmt.Errorf("%v published", p)
		}
		if source == "Polling" {
			return nil
		}
		if !strings.Contains(relay.out.String(), "Caught up from the table") {
			return fmt.Errorf("%v published, the first catch-up not done", p)
		}
		if streamedFrom < 0 {
			streamedFrom = p
		}
		if p < streamedFrom+100 {
			return fmt.Errorf("%v streamed since the catch-up", p-streamedFrom)
		}
		return nil
	})
	c.fault(t, rs)
	detected := resetCounted(t, relay, time.Minute, "the reset reported")
	require.NotZero(t, relay.metric("outbox_relay_stream_reset_window_start_timestamp_seconds"), "the window exported")
	found := relay
	if c.afterDetect != nil {
		relay = c.afterDetect(t, relay, env, args)
	}
	prod.wait(t)
	if source == "Polling" {
		waitDrained(t, conn, "outbox_events", 5*time.Minute)
	} else {
		prod.add(waitConfirmed(t, conn, replicationSlot, 5*time.Minute))
	}
	relay.stop(t, time.Minute)
	before := checkStream(t, rdb, stream, prod.committed())
	require.Positive(t, before.Lost, "the fault lost no entry: the case tests nothing")
	require.Contains(t, found.out.String(), "level=ERROR msg=\"Stream reset", "logged at error level")

	if c.cleanupFirst {
		out := mustRelay(t, env, "cleanup", "--retention", "0s")
		require.Contains(t, out, "a stream reset waits for a replay", "cleanup says why it keeps rows")
	}

	if c.windowFirst {
		var from, to time.Time
		require.NoError(t, conn.QueryRow(t.Context(), `SELECT min(window_start), max(window_end)
			FROM outbox_events_stream_resets WHERE replayed_at IS NULL`).Scan(&from, &to))
		out := mustRelay(t, env, "replay", "--stream", stream, "--source", source, "--output", "json",
			"--since", from.UTC().Format(time.RFC3339), "--until", to.Add(time.Second).UTC().Format(time.RFC3339))
		var w struct {
			ResetsReplayed int64  `json:"resetsReplayed"`
			ResetsKept     string `json:"resetsKept"`
		}
		require.NoError(t, json.Unmarshal([]byte(out), &w), out)
		require.Zero(t, w.ResetsReplayed, "a replay of the window by created_at ended the reset: %s", out)
		require.NotEmpty(t, w.ResetsKept, out)
	}

	// The runbook: replay the recorded window.
	rep := replayResets(t, env, replayArgs)
	// One fault may be recorded as more than one reset (a restarted Redis is
	// seen first as an older last id, then as a missing stream): each window is
	// replayed, and none is left pending.
	var again replayJSON
	out := mustRelay(t, env, replayArgs...)
	require.NoError(t, json.Unmarshal([]byte(out), &again), out)
	require.Zero(t, again.ResetsReplayed, "no reset left pending after the replay")
	requireNothingLostAfterReplay(t, rdb, stream, prod.committed(), before, rep, detected)
}

// resetCounted waits until relay counted a stream reset
// (outbox_relay_stream_resets_total) and returns how long that took.
func resetCounted(t *testing.T, relay *relayProc, timeout time.Duration, what string) time.Duration {
	t.Helper()
	return eventually(t, timeout, what, func() error {
		if relay.metric("outbox_relay_stream_resets_total") < 1 {
			return fmt.Errorf("no reset counted: the lost events would stay lost")
		}
		return nil
	})
}

// resetRecorded waits until a stream reset waits for a replay in the
// stream-resets table.
func resetRecorded(t *testing.T, conn *pgx.Conn, what string) {
	t.Helper()
	eventually(t, time.Minute, what, func() error {
		var n int
		if err := conn.QueryRow(t.Context(), `SELECT count(*) FROM outbox_events_stream_resets
			WHERE replayed_at IS NULL`).Scan(&n); err != nil || n == 0 {
			return fmt.Errorf("%d resets pending (%v)", n, err)
		}
		return nil
	})
}

// replayResets runs the runbook's `relay replay` (args) and requires that
// it marked a recorded reset replayed.
func replayResets(t *testing.T, env relayEnv, args []string) replayJSON {
	t.Helper()
	var rep replayJSON
	out := mustRelay(t, env, args...)
	require.NoError(t, json.Unmarshal([]byte(out), &rep), out)
	require.GreaterOrEqual(t, rep.ResetsReplayed, int64(1), "the recorded reset is marked replayed")
	return rep
}

// requireNothingLostAfterReplay checks the stream after the replay: every
// committed event in it, nothing else; it prints the case's figures (before
// is the check before the replay, detected how long the reset took to be
// counted).
func requireNothingLostAfterReplay(t *testing.T, rdb *redis.Client, stream string, committed []Committed, before Report,
	rep replayJSON, detected time.Duration) {
	t.Helper()
	r := checkStream(t, rdb, stream, committed)
	figures(t, r, 1, fmt.Sprintf("lost_before_replay=%d replayed=%d detected_after=%s", before.Lost, rep.Republished,
		ms(detected)))
	require.Zero(t, r.Lost, "lost events after the replay, e.g. %v", r.LostIDs)
	require.Zero(t, r.Unexpected)
}

// TestRedisKilledWithoutPersistence: Redis without AOF or RDB is killed
// with SIGKILL and restarted empty while the relay drains.
func TestRedisKilledWithoutPersistence(t *testing.T) {
	t.Parallel()
	streamLossCase(t, "Polling", func(t *testing.T, rs *testenv.RedisServer) {
		rs.Kill(t)
		rs.Start(t)
	})
}

// TestFlushAllMidDrain: FLUSHALL while the relay drains.
func TestFlushAllMidDrain(t *testing.T) {
	t.Parallel()
	streamLossCase(t, "Polling", func(t *testing.T, rs *testenv.RedisServer) {
		require.NoError(t, redisClient(t, rs.URL()).FlushAll(t.Context()).Err())
	})
}

// TestFlushAllWithIDsAheadOfTheClock: FLUSHALL while the relay drains a
// stream whose ids run ten minutes ahead of the clock (another writer's
// entry with an explicit later id, before the relay started: Redis numbers
// every later entry from there, as it does when its clock runs ahead of
// PostgreSQL's). The reset's window, from stream ids, began after every
// event it lost and after its own end, and the replay failed; it now
// starts earlier by how far the relay saw the ids run ahead.
func TestFlushAllWithIDsAheadOfTheClock(t *testing.T) {
	t.Parallel()
	streamLoss(t, streamLossSpec{
		source: "Polling",
		before: func(t *testing.T, rdb *redis.Client, stream string) {
			id := strconv.FormatInt(time.Now().Add(10*time.Minute).UnixMilli(), 10) + "-0"
			require.NoError(t, rdb.XAdd(t.Context(), &redis.XAddArgs{Stream: stream, ID: id,
				Values: []string{"note", "another writer's entry, its id ahead of the clock"}}).Err())
		},
		fault: func(t *testing.T, rs *testenv.RedisServer) {
			require.NoError(t, redisClient(t, rs.URL()).FlushAll(t.Context()).Err())
		},
	})
}

// TestFlushAllMidStreamFromASlot: FLUSHALL while a relay of source
// LogicalReplication streams. Its rows are never marked dispatched, so
// `relay replay --pending` by dispatched_at would republish nothing (and
// mark the reset replayed); with --source LogicalReplication it republishes
// the rows created before the reset's end.
func TestFlushAllMidStreamFromASlot(t *testing.T) {
	t.Parallel()
	streamLossCase(t, "LogicalReplication", func(t *testing.T, rs *testenv.RedisServer) {
		require.NoError(t, redisClient(t, rs.URL()).FlushAll(t.Context()).Err())
	})
}

// TestFlushAllMidStreamFromASlotWithRowsCreatedAhead: the same, with
// every other producer transaction's created_at two minutes ahead of
// PostgreSQL's clock (a producer whose clock runs ahead, or which sets the
// time itself). Such rows are streamed like any other, and lost with the
// stream. Before, the replay by created_at stopped at the reset's end: it
// left them out and marked the reset replayed.
func TestFlushAllMidStreamFromASlotWithRowsCreatedAhead(t *testing.T) {
	t.Parallel()
	streamLoss(t, streamLossSpec{source: "LogicalReplication", insert: insertAheadSometimes("outbox_events", 2*time.Minute),
		fault: func(t *testing.T, rs *testenv.RedisServer) {
			require.NoError(t, redisClient(t, rs.URL()).FlushAll(t.Context()).Err())
		}})
}

// TestFlushAllMidStreamFromASlotReplayedByAWindow: the same, with every
// other producer transaction's created_at ten minutes behind PostgreSQL's
// clock (as rows a lagging relay streams late), and the recorded window
// replayed by hand first (`--since`, `--until`, as the relay's log line
// suggested before). That replay must leave the reset pending: the rows
// created before the window were streamed in it and lost. Before, it
// marked the reset replayed.
func TestFlushAllMidStreamFromASlotReplayedByAWindow(t *testing.T) {
	t.Parallel()
	streamLoss(t, streamLossSpec{source: "LogicalReplication", windowFirst: true,
		insert: insertAheadSometimes("outbox_events", -10*time.Minute), // behind
		fault: func(t *testing.T, rs *testenv.RedisServer) {
			require.NoError(t, redisClient(t, rs.URL()).FlushAll(t.Context()).Err())
		}})
}

// TestCleanupBeforeTheReplay: FLUSHALL mid-drain, and the cleanup (a
// CronJob's run, with the shortest retention) comes before anyone replays
// the recorded reset. Cleanup must keep the rows the replay republishes:
// deleted, their events would be in neither the stream nor the table.
func TestCleanupBeforeTheReplay(t *testing.T) {
	t.Parallel()
	streamLoss(t, streamLossSpec{
		source: "Polling", cleanupFirst: true,
		fault: func(t *testing.T, rs *testenv.RedisServer) {
			require.NoError(t, redisClient(t, rs.URL()).FlushAll(t.Context()).Err())
		},
	})
}

// TestRedisRestartedWhileNoRelayRan: the relay drains half of the events
// and stops (SIGTERM: the operator scales an idle OutboxRelay to zero, or
// it is suspended); Redis, without persistence, is SIGKILLed and restarted
// empty; then the producers write the rest and a new relay starts (the
// scale-up). That relay never saw the stream: it finds the reset by what
// the relays recorded of the stream in PostgreSQL (<table>_stream_state),
// and `relay replay --pending` leaves nothing lost. Before, nothing was
// found: the first half stayed lost, with no reset recorded.
func TestRedisRestartedWhileNoRelayRan(t *testing.T) {
	t.Parallel()
	events := sized(3000, 30000)
	oc := startOutboxCase(t)
	pg, rs, env, stream, conn, rdb := oc.pg, oc.rs, oc.env, oc.stream, oc.conn, oc.rdb
	args := []string{"--stream", stream, "--batch-size", "100", "--stream-check-interval", "200ms"}
	relay := startRelay(t, "A", env, args...)
	first := startProducers(t, producerConfig{
		dsn: pg.DSN(), conns: 2, events: events / 2, rate: sized(1500.0, 3000.0), insert: insertInto("outbox_events"),
	})
	first.wait(t)
	waitDrained(t, conn, "outbox_events", 5*time.Minute)
	relay.stop(t, time.Minute) // scaled to zero
	rs.Kill(t)
	rs.Start(t)

	relay = startRelay(t, "B", env, args...) // scaled up for the next rows
	second := startProducers(t, producerConfig{
		dsn: pg.DSN(), conns: 2, events: events - events/2, rate: sized(1500.0, 3000.0), insert: insertInto("outbox_events"),
	})
	detected := resetCounted(t, relay, time.Minute, "the reset reported")
	second.wait(t)
	waitDrained(t, conn, "outbox_events", 5*time.Minute)
	relay.stop(t, time.Minute)
	committed := append(first.committed(), second.committed()...)
	before := checkStream(t, rdb, stream, committed)
	require.Positive(t, before.Lost, "the fault lost no entry: the case tests nothing")
	rep := replayResets(t, env, []string{"replay", "--stream", stream, "--pending", "--output", "json"})
	requireNothingLostAfterReplay(t, rdb, stream, committed, before, rep, detected)
}

// TestEvictingRedis: a Redis with maxmemory and allkeys-lru can drop the
// stream whenever it fills up. The relay says so at start, before it has
// published anything (the durability check, gauge outbox_relay_redis_check),
// and when the stream is evicted it reports the reset like any other.
func TestEvictingRedis(t *testing.T) {
	t.Parallel()
	pg := testenv.StartPostgres(t)
	rs := testenv.StartRedis(t, testenv.WithRedisArgs("--maxmemory", "2mb", "--maxmemory-policy", "allkeys-lru"))
	env, stream := caseEnv(t, pg, rs)
	relay := startRelay(t, "A", env, "--stream", stream, "--stream-check-interval", "200ms")
	const evictionFails = `outbox_relay_redis_check{check="eviction"}`
	reported := eventually(t, time.Minute, "the eviction risk reported", func() error {
		if v := relay.metric(evictionFails); v != 2 {
			return fmt.Errorf("%s = %v", evictionFails, v)
		}
		return nil
	})
	require.Zero(t, relay.published(), "reported before any event was published")

	// Fill Redis past maxmemory with the stream itself: it gets evicted.
	conn := connect(t, pg.DSN())
	events := sized(3000, 10000)
	mustExec(t, conn, `INSERT INTO outbox_events (event_type, payload)
SELECT 'fault.test', repeat('x', 2048) FROM generate_series(1, $1)`, events)
	waitDrained(t, conn, "outbox_events", 2*time.Minute)
	resetCounted(t, relay, time.Minute, "the eviction reported as a reset")
	t.Logf("FIGURES %s: events=%d reported_before_publish=true reported_after=%s resets=%s", t.Name(), events, ms(reported),
		strconv.FormatFloat(relay.metric("outbox_relay_stream_resets_total"), 'f', 0, 64))
}

// TestResetFoundByABatchSurvivesAKill: the stream watch's own look is an
// hour apart, so only a batch finds the reset (FLUSHALL mid-drain), and the
// relay is SIGKILLed half a second later; a second relay drains the rest.
// The reset must be recorded by then: the second relay knows nothing of
// the stream before it and never finds the reset again, so an unrecorded
// reset is no StreamIntact condition and a replay that republishes nothing.
func TestResetFoundByABatchSurvivesAKill(t *testing.T) {
	t.Parallel()
	streamLoss(t, streamLossSpec{
		source: "Polling", checkInterval: "1h",
		fault: func(t *testing.T, rs *testenv.RedisServer) {
			require.NoError(t, redisClient(t, rs.URL()).FlushAll(t.Context()).Err())
		},
		afterDetect: func(t *testing.T, first *relayProc, env relayEnv, args []string) *relayProc {
			time.Sleep(500 * time.Millisecond)
			first.kill(t)
			return startRelay(t, "B", env, args...)
		},
	})
}

// TestResetWhoseRecordFailsIsFoundAgain: FLUSHALL mid-drain while the
// stream-resets table is locked past the relay's --lock-timeout (an ALTER,
// a VACUUM FULL), so the relay finds the reset and cannot record it; it is
// stopped (SIGTERM: a rollout) with the table still locked, and another
// relay drains the rest. The relay's save of the stream's state forgot the
// stream (seen gone) while the reset waited for its record, so the next
// relay found no reset: nothing recorded to replay, the events lost. The
// state is now kept until the reset is recorded: the next relay finds the
// reset again, and `relay replay --pending` leaves nothing lost.
func TestResetWhoseRecordFailsIsFoundAgain(t *testing.T) {
	t.Parallel()
	events := sized(3000, 30000)
	oc := startOutboxCase(t)
	pg, rs, env, stream, conn, rdb := oc.pg, oc.rs, oc.env, oc.stream, oc.conn, oc.rdb
	args := []string{"--stream", stream, "--batch-size", "100", "--stream-check-interval", "200ms"}
	relay := startRelay(t, "A", env, args...)
	prod := startProducers(t, producerConfig{
		dsn: pg.DSN(), conns: 2, events: events, rate: sized(1500.0, 3000.0), insert: insertInto("outbox_events"),
	})
	eventually(t, time.Minute, "a third published", func() error {
		if p := relay.published(); p < float64(events/3) {
			return fmt.Errorf("%v published", p)
		}
		return nil
	})
	locker := connect(t, pg.DSN())
	mustExec(t, locker, "BEGIN")
	mustExec(t, locker, "LOCK TABLE outbox_events_stream_resets IN SHARE MODE") // blocks the record's INSERT
	require.NoError(t, redisClient(t, rs.URL()).FlushAll(t.Context()).Err())
	detected := resetCounted(t, relay, time.Minute, "the reset reported")
	time.Sleep(time.Second) // a record or two refused meanwhile
	relay.stop(t, time.Minute)
	mustExec(t, locker, "ROLLBACK")
	require.Contains(t, relay.out.String(), "Could not record a stream reset", "the record failed")

	relay = startRelay(t, "B", env, args...)
	resetRecorded(t, conn, "the reset found again and recorded")
	prod.wait(t)
	waitDrained(t, conn, "outbox_events", 5*time.Minute)
	relay.stop(t, time.Minute)
	before := checkStream(t, rdb, stream, prod.committed())
	require.Positive(t, before.Lost, "the fault lost no entry: the case tests nothing")
	rep := replayResets(t, env, []string{"replay", "--stream", stream, "--pending", "--output", "json"})
	requireNothingLostAfterReplay(t, rdb, stream, prod.committed(), before, rep, detected)
}

// TestStreamMadeAgainByANewRelay: relay A publishes a fifth of the events
// and is frozen (SIGSTOP); Redis, without persistence, is killed and
// restarted empty; relay B, started then, finds no stream (no reset for a
// relay that never saw one) and publishes more entries than the lost
// stream ever had. When A runs again the stream has a later last id, more
// entries ever added, and A's own last entry older than every entry, as
// after trimming: only the count of entries (more than were added since A
// looked) shows the reset. Unseen, the lost events' rows stay dispatched
// and no replay brings them back.
func TestStreamMadeAgainByANewRelay(t *testing.T) {
	t.Parallel()
	events := sized(4000, 20000)
	oc := startOutboxCase(t)
	pg, rs, env, stream, conn, rdb := oc.pg, oc.rs, oc.env, oc.stream, oc.conn, oc.rdb
	args := []string{"--stream", stream, "--batch-size", "100", "--stream-check-interval", "200ms"}
	a := startRelay(t, "A", env, args...)
	prod := startProducers(t, producerConfig{
		dsn: pg.DSN(), conns: 2, events: events, rate: sized(1000.0, 3000.0), insert: insertInto("outbox_events"),
	})
	eventually(t, time.Minute, "a fifth published by A", func() error {
		if p := a.published(); p < float64(events/5) {
			return fmt.Errorf("%v published", p)
		}
		return nil
	})
	a.signal(t, syscall.SIGSTOP)
	info, err := rdb.XInfoStream(t.Context(), stream).Result()
	require.NoError(t, err)
	rs.Kill(t)
	rs.Start(t)
	b := startRelay(t, "B", env, args...)
	// B goes well past the lost stream's count of entries ever added, so
	// that it cannot have fallen when A looks.
	eventually(t, time.Minute, "B past the lost stream's count", func() error {
		if p := b.published(); p <= float64(info.EntriesAdded+500) {
			return fmt.Errorf("B published %v, the lost stream had %d entries", p, info.EntriesAdded)
		}
		return nil
	})
	a.signal(t, syscall.SIGCONT)
	detected := resetCounted(t, a, 30*time.Second, "A reports the reset")
	// The count moves as the reset is logged: wait for the line.
	eventually(t, 10*time.Second, "A logging the reason", func() error {
		if !strings.Contains(a.out.String(), "it was made again") {
			return fmt.Errorf("the reset is found by the count of entries, the only sign left: no such reason logged")
		}
		return nil
	})
	prod.wait(t)
	waitDrained(t, conn, "outbox_events", 5*time.Minute)
	a.stop(t, time.Minute)
	b.stop(t, time.Minute)
	require.Zero(t, b.metric("outbox_relay_stream_resets_total"), "B never saw the lost stream")
	before := checkStream(t, rdb, stream, prod.committed())
	require.Positive(t, before.Lost, "the fault lost no entry: the case tests nothing")

	rep := replayResets(t, env, []string{"replay", "--stream", stream, "--pending", "--output", "json"})
	requireNothingLostAfterReplay(t, rdb, stream, prod.committed(), before, rep, detected)
}

// TestTrimmingAfterAResetWaitsForTheGroups: trimming on (`--trim-max-len
// 200`, every 100 ms) and `--auto-replay`; two consumer groups have read
// and acknowledged everything, so the stream is trimmed as it grows.
// FLUSHALL mid-drain takes the groups with the stream; the relay replays
// the window and drains the rest. In "none back" both groups' consumers
// are down meanwhile (a rollout); in "one of two back" the workers create
// theirs again at 0 and keep up, while the audit consumers stay down. When
// the groups that are away come back at 0, every event must be there:
// trimmed by the policy alone (none back), the stream kept only its last
// 200 entries; trimmed by the groups that are back (one of two), the same.
func TestTrimmingAfterAResetWaitsForTheGroups(t *testing.T) {
	t.Parallel()
	for _, workersBack := range []bool{false, true} {
		t.Run(map[bool]string{false: "none back", true: "one of two back"}[workersBack], func(t *testing.T) {
			t.Parallel()
			trimmingAfterAReset(t, workersBack)
		})
	}
}

func trimmingAfterAReset(t *testing.T, workersBack bool) {
	events := sized(3000, 20000)
	oc := startOutboxCase(t)
	pg, env, stream, conn, rdb := oc.pg, oc.env, oc.stream, oc.conn, oc.rdb
	relay := startRelay(t, "A", env, "--stream", stream, "--batch-size", "100", "--stream-check-interval", "200ms",
		"--auto-replay", "--trim-max-len", "200", "--trim-interval", "100ms")
	prod := startProducers(t, producerConfig{
		dsn: pg.DSN(), conns: 2, events: events, rate: sized(1500.0, 3000.0), insert: insertInto("outbox_events"),
	})
	// keepUp moves a group to the stream's end, as consumers that read and
	// acknowledged everything so far.
	keepUp := func(group, from string) error {
		if err := rdb.XGroupCreateMkStream(t.Context(), stream, group, from).Err(); err != nil && !isBusyGroup(err) {
			return err
		}
		return rdb.XGroupSetID(t.Context(), stream, group, "$").Err()
	}
	eventually(t, time.Minute, "the stream trimmed while the groups keep up", func() error {
		for _, g := range []string{"workers", "audit"} {
			if err := keepUp(g, "$"); err != nil {
				return err
			}
		}
		if relay.metric("outbox_relay_stream_trimmed_entries_total") < 1 {
			return fmt.Errorf("nothing trimmed yet")
		}
		return nil
	})
	time.Sleep(500 * time.Millisecond)                  // the relay's look at the groups, every 200 ms, sees both
	require.NoError(t, rdb.FlushAll(t.Context()).Err()) // the groups go with the stream
	eventually(t, time.Minute, "the reset replayed", func() error {
		if relay.metric("outbox_relay_events_replayed_total") < 1 {
			return fmt.Errorf("nothing replayed yet")
		}
		return nil
	})
	keptUp := make(chan struct{})
	go func() {
		defer close(keptUp)
		for workersBack && t.Context().Err() == nil && prod.committedCount() < events {
			_ = keepUp("workers", "0")
			time.Sleep(50 * time.Millisecond)
		}
	}()
	prod.wait(t)
	<-keptUp
	waitDrained(t, conn, "outbox_events", 5*time.Minute)
	if workersBack {
		require.NoError(t, keepUp("workers", "0"))
	}
	// The groups away stay down for twenty trim intervals after the drain.
	time.Sleep(2 * time.Second)
	replayed, trimmed := relay.metric("outbox_relay_events_replayed_total"), relay.metric("outbox_relay_stream_trimmed_entries_total")
	relay.stop(t, time.Minute)
	r := checkStream(t, rdb, stream, prod.committed())
	figures(t, r, 1, fmt.Sprintf("replayed=%v trimmed=%v", replayed, trimmed))
	require.Zero(t, r.Lost, "events a group created now at 0 would never read, e.g. %v", r.LostIDs)
}

// isBusyGroup reports XGROUP CREATE's error for a group that exists.
func isBusyGroup(err error) bool { return err != nil && strings.Contains(err.Error(), "BUSYGROUP") }

// TestLostAgainAfterALateReplay: FLUSHALL mid-drain; nobody replays the
// reset for 100 hours (the rows' times and the reset's record are moved
// back by as much), then `relay replay --pending` puts the events back;
// the cleanup CronJob runs (`--retention 72h`, the default) before and
// after the replay; then Redis loses the replayed entries too (FLUSHALL
// again) and the relay records a second reset, whose window reaches back
// to the replay's. Asserted: cleanup deleted no row, and after the second
// `relay replay --pending` nothing is lost. Before, the replay released
// cleanup's hold while the replayed rows' dispatched_at stayed 100 hours
// old: the cleanup after it deleted every row, and the second replay found
// none.
func TestLostAgainAfterALateReplay(t *testing.T) {
	t.Parallel()
	events := sized(3000, 30000)
	oc := startOutboxCase(t)
	pg, env, stream, conn, rdb := oc.pg, oc.env, oc.stream, oc.conn, oc.rdb
	relay := startRelay(t, "A", env, "--stream", stream, "--batch-size", "100", "--stream-check-interval", "200ms")
	prod := startProducers(t, producerConfig{dsn: pg.DSN(), conns: 2, events: events, rate: sized(1500.0, 3000.0),
		insert: insertInto("outbox_events")})
	eventually(t, time.Minute, "a third published", func() error {
		if p := relay.published(); p < float64(events/3) {
			return fmt.Errorf("%v published", p)
		}
		return nil
	})
	require.NoError(t, rdb.FlushAll(t.Context()).Err())
	detected := resetCounted(t, relay, time.Minute, "the reset reported")
	prod.wait(t)
	waitDrained(t, conn, "outbox_events", 5*time.Minute)
	rows := func() (n int) {
		require.NoError(t, conn.QueryRow(t.Context(), `SELECT count(*) FROM outbox_events`).Scan(&n))
		return n
	}
	kept := rows()

	mustExec(t, conn, `UPDATE outbox_events SET dispatched_at = dispatched_at - interval '100 hours',
		created_at = created_at - interval '100 hours'`)
	mustExec(t, conn, `UPDATE outbox_events_stream_resets SET window_start = window_start - interval '100 hours',
		window_end = window_end - interval '100 hours', detected_at = detected_at - interval '100 hours'`)
	out := mustRelay(t, env, "cleanup", "--retention", "72h")
	require.Contains(t, out, "a stream reset waits for a replay", "cleanup says why it keeps rows")
	require.Equal(t, kept, rows(), "cleanup deleted rows of a reset not replayed")

	replayArgs := []string{"replay", "--stream", stream, "--pending", "--output", "json"}
	replayResets(t, env, replayArgs)
	out = mustRelay(t, env, "cleanup", "--retention", "72h")
	require.Contains(t, out, "a stream reset was replayed less than 72h0m0s ago", "cleanup says why it keeps rows")
	require.Equal(t, kept, rows(), "cleanup deleted rows the replay had just republished")

	// The relay looks at the replayed stream, then Redis loses it again.
	time.Sleep(time.Second)
	require.NoError(t, rdb.FlushAll(t.Context()).Err())
	resetRecorded(t, conn, "the second reset recorded")
	relay.stop(t, time.Minute)
	before := checkStream(t, rdb, stream, prod.committed())
	require.Positive(t, before.Lost, "the second fault lost no entry: the case tests nothing")
	rep := replayResets(t, env, replayArgs)
	requireNothingLostAfterReplay(t, rdb, stream, prod.committed(), before, rep, detected)
}

// TestRedisRestartedUnderAUserThatMayNotLookAtTheStream: the relay's Redis
// user may XADD but not XINFO STREAM (an ACL written before the relay
// needed it, or a proxy that lacks XINFO). The relay publishes, but it
// cannot see a stream reset: when Redis restarts empty, the events it lost
// are lost. That blind spot must not be silent: the relay counts and logs
// every refused check, and `relay doctor` fails `redis.stream-check`.
// Before, the relay took the refusal for "no answer" and said nothing: no
// reset, no error, no log line, with the stream's events gone.
func TestRedisRestartedUnderAUserThatMayNotLookAtTheStream(t *testing.T) {
	t.Parallel()
	oc := startOutboxCase(t)
	require.NoError(t, oc.rdb.Do(t.Context(), "ACL", "SETUSER", "relay", "on", ">relay-pw", "~*", "&*", "+@all",
		"-xinfo|stream").Err())
	env := oc.env
	env.redisURL = "redis://relay:relay-pw@" + oc.rs.Addr() + "/0"

	out, _, err := relayCommand(t.Context(), env, "doctor", "--stream", oc.stream)
	require.Error(t, err, "relay doctor passed:\n%s", out) // this Redis has no persistence either
	require.Regexp(t, `fail\s+redis.stream-check`, out)

	relay := startRelay(t, "A", env, "--stream", oc.stream, "--batch-size", "100", "--stream-check-interval", "200ms")
	prod := startProducers(t, producerConfig{dsn: oc.pg.DSN(), conns: 1, events: 600, rate: 600, insert: insertInto("outbox_events")})
	eventually(t, time.Minute, "a third published", func() error {
		if p := relay.published(); p < 200 {
			return fmt.Errorf("%v published", p)
		}
		return nil
	})
	require.NoError(t, oc.rdb.FlushAll(t.Context()).Err()) // the ACL user survives: only the data is lost
	prod.wait(t)
	waitDrained(t, oc.conn, "outbox_events", time.Minute)
	eventually(t, time.Minute, "the refused checks counted", func() error {
		if n := relay.metric(`outbox_relay_errors_total{kind="redis_stream_check"}`); n < 1 {
			return fmt.Errorf("%v counted", n)
		}
		return nil
	})
	relay.stop(t, time.Minute)
	require.Contains(t, relay.out.String(), `level=WARN msg="Cannot look at the stream`)
	require.Positive(t, checkStream(t, oc.rdb, oc.stream, prod.committed()).Lost,
		"the flush lost no entry: the case tests nothing")
}
