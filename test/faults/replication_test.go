//go:build faults

package faults

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/outbox-dev/outbox-operator/internal/testenv"
)

// replicationSlot is the slot of the relays in TestReplication.
const replicationSlot = "faults_slot"

// TestReplication checks source LogicalReplication as processes: two relays
// share one slot (one streams, the other stands by) and
//   - the first is SIGKILLed in the middle of its catch-up, the table read
//     that publishes the rows committed before the slot existed (here a
//     prefilled table), so the standby takes the slot and does the catch-up
//     again;
//   - then the relay holding the slot is SIGKILLed again and again while a
//     producer writes (every third kill is of the standby), and its Redis
//     link is blackholed once, so a batch is XADDed and never confirmed;
//   - then, once the stream holds every committed row, PostgreSQL is shut
//     down immediately (SIGQUIT, no checkpoint) and started again, so the
//     slot resumes from the position it last saved, and the producer writes
//     more.
//
// One producer connection writes with created_at DEFAULT clock_timestamp(),
// so commit order is (created_at, id) order. Nothing may be lost, the first
// occurrences must be in that order, duplicates stay within the catch-up
// done twice, two batches per fault and the crash's replay, and the slot's confirmed position
// catches up once the stream is idle. It runs in the CI slice; the cleanup
// mode does not apply (a slot's relay marks and deletes nothing).
func TestReplication(t *testing.T) {
	t.Parallel()
	require.True(t, runHelpLists(t, "--source"), "this relay has no --source: it cannot stream from a slot")
	prefill := sized(20000, 100000)
	events := sized(6000, 30000) // written by the producer once the relays run
	afterCrash := sized(1000, 5000)
	kills := sized(6, 20)
	rate := sized(200.0, 400.0) // rows per second, one connection
	const batchSize = 100

	pg, rs := testenv.StartPostgres(t), testenv.StartRedis(t)
	direct := relayEnv{databaseURL: pg.DSN(), redisURL: rs.URL()}
	stream := testenv.Name(t)
	mustRelay(t, direct, "schema", "--apply")
	conn := connect(t, pg.DSN())
	mustExec(t, conn, `ALTER TABLE outbox_events ALTER COLUMN created_at SET DEFAULT clock_timestamp()`)
	before := prefillRows(t, conn, prefill)
	args := []string{"--stream", stream, "--source", "LogicalReplication", "--slot", replicationSlot,
		"--batch-size", fmt.Sprint(batchSize), "--publish-timeout", "1s", "--poll-interval", "50ms"}

	// Each relay reaches Redis through a proxy of its own, so that the
	// holder's link alone can be slowed or fail.
	started := newProxiedRelays(t, direct, "L", args...)
	start, proxies := started.start, started.proxies
	relays := []*relayProc{}
	holder := func() (*relayProc, error) { return slotHolder(t, conn, pg.DSN(), relays) }
	remove := func(r *relayProc) { relays = slices.DeleteFunc(relays, func(x *relayProc) bool { return x == r }) }

	// The catch-up: the first relay's Redis link is slowed so that its
	// table read takes seconds, and it is killed once it has published a
	// part of the prefilled rows, while the producer writes.
	first := start()
	relays = append(relays, first)
	proxies[first].latency(t, 20*time.Millisecond)
	prod := startProducers(t, producerConfig{
		dsn: pg.DSN(), conns: 1, events: events, rate: rate, insert: insertInto("outbox_events"),
	})
	produceStart := time.Now()
	eventually(t, time.Minute, "relay L1 streaming from the slot", func() error {
		h, err := holder()
		if err == nil && h != first {
			err = fmt.Errorf("relay %s holds the slot", h.name)
		}
		return err
	})
	relays = append(relays, start()) // the standby
	eventuallyEvery(t, 0, time.Minute, "relay L1 catching up", func() error {
		if p := first.published(); p < batchSize {
			return fmt.Errorf("published %.0f", p)
		}
		return nil
	})
	require.NotContains(t, first.out.String(), "Caught up", "relay L1 finished its catch-up before the kill")
	caughtUpBeforeKill := first.published()
	first.kill(t)
	remove(first)
	relays = append(relays, start())
	var committedAtCatchUp int
	eventually(t, 2*time.Minute, "the catch-up done again by the standby", func() error {
		if countLog(started.all, "Caught up") == 0 {
			return errors.New("no relay logged its catch-up")
		}
		committedAtCatchUp = prod.committedCount()
		return nil
	})

	// The faults, spread over the production left: kills, and one Redis
	// failure of the holder two thirds of the way.
	plan := slices.Repeat([]string{"kill"}, kills)
	plan = slices.Insert(plan, len(plan)*2/3, "fail")
	left := time.Duration(float64(events)/rate*float64(time.Second)) - time.Since(produceStart)
	every := max(left*8/10/time.Duration(len(plan)), 500*time.Millisecond)
	faultsStart := time.Now()
	var worstTakeover time.Duration
	holderKills, faultsAfterProduction := 0, 0
	for i, f := range plan {
		sleepUntil(t.Context(), faultsStart.Add(time.Duration(i)*every+every/2))
		if prod.committedCount() >= events {
			faultsAfterProduction++
		}
		var h *relayProc
		eventually(t, time.Minute, "a relay streaming", func() (err error) {
			h, err = holder()
			return err
		})
		switch f {
		case "kill":
			victim := h
			if i%3 == 2 {
				victim = relays[(slices.Index(relays, h)+1)%len(relays)]
			}
			victim.kill(t)
			killed := time.Now()
			remove(victim)
			if victim == h {
				holderKills++
				eventually(t, time.Minute, "the standby streaming after the kill", func() error {
					_, err := holder()
					return err
				})
				worstTakeover = max(worstTakeover, time.Since(killed))
			}
			relays = append(relays, start())
		case "fail":
			errorsBefore := h.metric(`outbox_relay_errors_total{kind="redis"}`)
			proxies[h].blackhole(t)
			time.Sleep(2 * time.Second) // twice --publish-timeout
			proxies[h].heal()
			eventually(t, time.Minute, "the holder's failed batch counted", func() error {
				if h.metric(`outbox_relay_errors_total{kind="redis"}`) <= errorsBefore {
					return errors.New("no Redis error counted")
				}
				return nil
			})
		}
	}
	prod.wait(t)
	committed := append(before, prod.committed()...)
	rdb := redisClient(t, rs.URL())
	drain := waitStreamed(t, rdb, stream, committed)

	// The crash: once every committed row is in the stream (so no commit
	// is lost with the unflushed WAL of synchronous_commit=off), an
	// immediate shutdown. The slot's confirmed position on disk is that of
	// the last checkpoint or slot save, so the relays replay from there:
	// duplicates, never a loss. Then a second producer run.
	dupsBeforeCrash := checkStream(t, rdb, stream, committed).Duplicates
	pg.Crash(t)
	pg.Start(t)
	conn = connect(t, pg.DSN())
	prod = startProducers(t, producerConfig{
		dsn: pg.DSN(), conns: 1, events: afterCrash, rate: rate, insert: insertInto("outbox_events"),
	})
	prod.wait(t)
	committed = append(committed, prod.committed()...)
	drain = max(drain, waitStreamed(t, rdb, stream, committed))
	replayed := checkStream(t, rdb, stream, committed).Duplicates - dupsBeforeCrash

	committed = append(committed, waitConfirmed(t, conn, replicationSlot, time.Minute))
	for _, r := range relays {
		r.stop(t, time.Minute)
	}

	r := CheckOrder(committed, streamEntries(t, rdb, stream), false)
	// The catch-up done twice, two batches per fault, and the crash's
	// replay: at most every row streamed before it.
	bound := prefill + committedAtCatchUp + (kills+1)*2*batchSize + prefill + events
	figures(t, r.Report(), kills+3, fmt.Sprintf(
		"prefill=%d kills=%d holder_kills=%d failures=1 crashes=1 catch_up_published_before_kill=%.0f "+
			"replayed_after_crash=%d duplicate_bound=%d worst_takeover=%s faults_after_production=%d drain=%s",
		prefill, kills+1, holderKills, caughtUpBeforeKill, replayed, bound, ms(worstTakeover), faultsAfterProduction, ms(drain)))
	require.Equal(t, prefill+events+afterCrash+1, r.Committed) // and waitConfirmed's row
	require.Zero(t, r.Lost, "lost events, e.g. %v", r.LostIDs)
	require.Zero(t, r.Unexpected, "stream entries no producer committed")
	require.Zero(t, r.Reorderings, "first occurrences out of commit order, e.g. %v", r.Reordered)
	require.LessOrEqual(t, r.Duplicates, bound, "duplicates beyond the catch-ups, two batches per fault and the crash's replay")
	require.Zero(t, countLog(started.all, "Replication slot invalidated"), "the slot was invalidated")
	require.Zero(t, countLog(started.all, "panic:"), "a relay panicked")
}

// waitConfirmed commits one more outbox row, once the producers are done,
// and waits until slot's confirmed position is past it: its relay
// published the last commit of the outbox table. It returns the row, which
// the case counts as committed. pg_current_wal_lsn() once the producers are
// done would not do: it may lie past WAL that an idle relay confirms only
// once it is 1 MiB past its confirmed position (its own progress writes,
// other tables).
func waitConfirmed(t testing.TB, conn *pgx.Conn, slot string, timeout time.Duration) Committed {
	t.Helper()
	last, lsn := commitLast(t, conn)
	waitConfirmedPast(t, conn, slot, lsn, timeout)
	return last
}

// slotHolder returns the relay among relays whose session streams from
// replicationSlot (the slot's active_pid, a walsender), or why there is
// none. The backend that creates the slot holds it too, until the slot is
// made: that relay does not stream yet, and another may take the slot
// first.
func slotHolder(t testing.TB, conn *pgx.Conn, dsn string, relays []*relayProc) (*relayProc, error) {
	t.Helper()
	var pid *int
	var walsender bool
	if err := conn.QueryRow(t.Context(), `SELECT s.active_pid, coalesce(a.backend_type = 'walsender', false)
		FROM pg_replication_slots s LEFT JOIN pg_stat_activity a ON a.pid = s.active_pid
		WHERE s.slot_name = $1`, replicationSlot).Scan(&pid, &walsender); err != nil {
		return nil, fmt.Errorf("reading slot %s: %w", replicationSlot, err)
	}
	if pid == nil || !walsender {
		return nil, errors.New("no relay streams from the slot")
	}
	for _, r := range relays {
		if !r.exited() && slices.Contains(relayBackends(t, conn, r, dsn), *pid) {
			return r, nil
		}
	}
	return nil, fmt.Errorf("the slot's walsender %d is no live relay's", *pid)
}

// prefillRows commits n rows in one transaction and returns them.
func prefillRows(t testing.TB, conn *pgx.Conn, n int) []Committed {
	t.Helper()
	sql, args := insertInto("outbox_events")(nil, n)
	rows, err := conn.Query(t.Context(), sql, args...)
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, scanCommitted)
	require.NoError(t, err)
	return out
}

// waitStreamed waits until every committed row is in the stream and returns
// how long that took.
func waitStreamed(t testing.TB, rdb redis.Cmdable, stream string, committed []Committed) time.Duration {
	t.Helper()
	return eventually(t, 2*time.Minute, "every committed row in the stream", func() error {
		if r := checkStream(t, rdb, stream, committed); r.Lost > 0 {
			return fmt.Errorf("%d not in the stream yet, e.g. %v", r.Lost, r.LostIDs)
		}
		return nil
	})
}
