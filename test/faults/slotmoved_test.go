//go:build faults

package faults

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// slotMovedErrors is the sample of a relay's count of slots found moved
// by someone else.
const slotMovedErrors = `outbox_relay_errors_total{kind="slot_moved"}`

// TestReplicationSlotMovedWhileNoRelayStreamed: a relay of source
// LogicalReplication streams while producers write; it is stopped, and
// while no relay streams the slot is moved by hand, twice:
//   - after a SIGTERM, dropped and made again
//     (pg_create_logical_replication_slot(slot, 'pgoutput'));
//   - after a SIGKILL, advanced to the current WAL position
//     (pg_replication_slot_advance).
//
// Rows are committed between each stop and the move (asserted: the new
// slot's confirmed_flush_lsn is past the position the relays recorded):
// the slot never streams them. A relay started after each move must find
// the slot ahead (outbox_relay_errors_total{kind="slot_moved"}) and publish
// the gap from the table. Asserted: lost 0 over every committed row,
// duplicates within the rows the two catch-ups could read (created since
// the last published commit less the margin and a slack for the xmin
// horizon) plus the first catch-up and two batches per stop.
func TestReplicationSlotMovedWhileNoRelayStreamed(t *testing.T) {
	t.Parallel()
	require.True(t, runHelpLists(t, "--catch-up-margin"), "this relay has no --catch-up-margin")
	events := sized(3000, 15000)
	const rate = 200.0
	const margin = time.Second
	const batchSize = 100
	const slot = "faults_slot_moved"
	// horizonSlack widens the catch-up's reach by created_at for the rows
	// of transactions at or after the xmin horizon (sampled a second or so
	// before the last published commit).
	const horizonSlack = 5 * time.Second
	c := startOutboxCase(t)
	args := []string{"--stream", c.stream, "--source", "LogicalReplication", "--slot", slot,
		"--catch-up-margin", margin.String(), "--batch-size", strconv.Itoa(batchSize), "--poll-interval", "50ms"}

	var movesDone atomic.Bool // the producers write on until both moves are done
	relay := startRelay(t, "L1", c.env, args...)
	relays := make([]*relayProc, 1, 3) // L1, and one relay after each move
	relays[0] = relay
	prod := startProducers(t, producerConfig{dsn: c.pg.DSN(), conns: 2, events: events, rate: rate,
		insert: insertInto("outbox_events"), more: func() bool { return !movesDone.Load() }})

	// confirmed is the slot's confirmed position.
	confirmed := func() string {
		t.Helper()
		var lsn string
		require.NoError(t, c.conn.QueryRow(t.Context(),
			`SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&lsn))
		return lsn
	}
	// streaming waits until r confirms a position past from (the slot's
	// before r started): r did whatever catch-up it found due, which comes
	// first, and streams. It returns how many rows the producers had
	// committed by then. It judges the slot, not r's log, so that a relay
	// that did no catch-up fails by what it lost.
	streaming := func(r *relayProc, from string) int {
		t.Helper()
		var atCatchUp int
		eventually(t, time.Minute, "relay "+r.name+" streaming", func() error {
			var past bool
			err := c.conn.QueryRow(t.Context(), `SELECT confirmed_flush_lsn > $2::pg_lsn FROM pg_replication_slots
				WHERE slot_name = $1`, slot, from).Scan(&past)
			if err == nil && !past {
				err = fmt.Errorf("the slot confirmed nothing past %s", from)
			}
			atCatchUp = prod.committedCount()
			return err
		})
		return atCatchUp
	}
	// The first relay makes the slot and reads every row before it.
	eventually(t, time.Minute, "relay L1 caught up", func() error {
		if countLog(relays, "Caught up from the table") == 0 {
			return errors.New("no catch-up logged")
		}
		return nil
	})
	bound := streaming(relay, confirmed()) // the first catch-up reads every row of the table

	moves := []struct {
		name string
		sig  syscall.Signal
		move func() error
	}{
		{"made again", syscall.SIGTERM, func() error {
			if _, err := c.conn.Exec(t.Context(), `SELECT pg_drop_replication_slot($1)`, slot); err != nil {
				return err // active until the walsender noticed the relay gone
			}
			mustExec(t, c.conn, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, slot)
			return nil
		}},
		{"advanced", syscall.SIGKILL, func() error {
			_, err := c.conn.Exec(t.Context(), `SELECT pg_replication_slot_advance($1, pg_current_wal_lsn())`, slot)
			return err
		}},
	}
	gapRows := make([]int, 0, len(moves))
	moved := 0.0
	for i, m := range moves {
		switch m.sig {
		case syscall.SIGTERM:
			relay.stop(t, time.Minute)
		default:
			relay.kill(t)
		}
		atStop := prod.committedCount()
		var lastCommit time.Time
		require.NoError(t, c.conn.QueryRow(t.Context(),
			`SELECT last_commit FROM outbox_events_relay_progress WHERE slot = $1`, slot).Scan(&lastCommit))
		eventually(t, time.Minute, "rows committed while no relay streams", func() error {
			if n := prod.committedCount() - atStop; n < 2*batchSize {
				return fmt.Errorf("%d committed since the stop", n)
			}
			return nil
		})
		beforeMove := prod.committedCount()
		eventually(t, time.Minute, "the slot "+m.name, m.move)
		gapRows = append(gapRows, beforeMove-atStop)
		// The fault: the slot is past every position its relays recorded.
		var ahead bool
		require.NoError(t, c.conn.QueryRow(t.Context(), `SELECT (s.confirmed_flush_lsn - '0/0'::pg_lsn) > p.confirmed_lsn
			FROM pg_replication_slots s JOIN outbox_events_relay_progress p ON p.slot = s.slot_name
			WHERE s.slot_name = $1`, slot).Scan(&ahead))
		require.True(t, ahead, "the slot %s is not ahead of the position its relays recorded", m.name)
		from := confirmed()

		relay = startRelay(t, fmt.Sprintf("L%d", i+2), c.env, args...)
		relays = append(relays, relay)
		atCatchUp := streaming(relay, from)
		counted := relay.metric(slotMovedErrors)
		require.Positive(t, counted, "relay %s did not count the slot %s", relay.name, m.name)
		moved += counted
		// What this catch-up could read: every row created since the last
		// published commit less the margin and the slack, committed by its end.
		since := lastCommit.Add(-margin - horizonSlack)
		for _, r := range prod.committed()[:atCatchUp] {
			if !r.CreatedAt.Before(since) {
				bound++
			}
		}
		bound += 2 * batchSize // a batch published and not confirmed at the stop
	}
	movesDone.Store(true)
	prod.wait(t)
	last, lsn := commitLast(t, c.conn)
	committed := append(prod.committed(), last)
	drain := waitStreamed(t, c.rdb, c.stream, committed)
	waitConfirmedPast(t, c.conn, slot, lsn, time.Minute)
	relay.stop(t, time.Minute)

	r := checkStream(t, c.rdb, c.stream, committed)
	figures(t, r, len(moves), fmt.Sprintf("moves=made_again(SIGTERM),advanced(SIGKILL) committed_before_the_moves=%v "+
		"slot_moved_counted=%.0f catch_up_events=%v duplicate_bound=%d drain=%s",
		gapRows, moved, catchUpEvents(relays), bound, ms(drain)))
	require.Greater(t, r.Committed, events)
	require.Zero(t, r.Lost, "lost events, e.g. %v", r.LostIDs)
	require.Zero(t, r.Unexpected, "stream entries no producer committed")
	require.LessOrEqual(t, r.Duplicates, bound, "duplicates beyond the catch-ups and two batches per stop")
	require.Zero(t, countLog(relays[:1], "Replication slot ahead"), "the first relay found a slot moved")
	require.Zero(t, countLog(relays, "panic:"), "a relay panicked")
}

// commitLast commits one more outbox row, once the producers are done, and
// returns it with the WAL position read in its transaction before the
// insert: its commit lies past that position, and so does no other commit
// of the outbox table.
func commitLast(t testing.TB, conn *pgx.Conn) (Committed, string) {
	t.Helper()
	var row Committed
	var lsn string
	err := pgx.BeginFunc(t.Context(), conn, func(tx pgx.Tx) error {
		if err := tx.QueryRow(t.Context(), `SELECT pg_current_wal_insert_lsn()::text`).Scan(&lsn); err != nil {
			return err
		}
		return tx.QueryRow(t.Context(), `INSERT INTO outbox_events (event_type, payload) VALUES ('fault.test', '{}')
			RETURNING id::text, created_at`).Scan(&row.ID, &row.CreatedAt)
	})
	require.NoError(t, err)
	return row, lsn
}

// waitConfirmedPast waits until slot's confirmed position is past lsn (of
// commitLast): its relay published the last commit of the outbox table.
// waitConfirmed's position, pg_current_wal_lsn() once the producers are
// done, may lie past WAL that an idle relay confirms only once it is 1 MiB
// past its confirmed position (its own progress writes, other tables).
func waitConfirmedPast(t testing.TB, conn *pgx.Conn, slot, lsn string, timeout time.Duration) {
	t.Helper()
	eventually(t, timeout, "the slot's confirmed position past the last commit", func() error {
		var past bool
		err := conn.QueryRow(t.Context(), `SELECT confirmed_flush_lsn > $2::pg_lsn FROM pg_replication_slots WHERE slot_name = $1`,
			slot, lsn).Scan(&past)
		if err == nil && !past {
			err = fmt.Errorf("confirmed position not past %s", lsn)
		}
		return err
	})
}

// catchUpLine is the relay's log line of a catch-up done, with its events.
var catchUpLine = regexp.MustCompile(`Caught up from the table before streaming.* events=(\d+)`)

// catchUpEvents lists the events each relay's catch-ups read, in order.
func catchUpEvents(relays []*relayProc) []int {
	var n []int
	for _, r := range relays {
		for _, m := range catchUpLine.FindAllStringSubmatch(r.out.String(), -1) {
			v, _ := strconv.Atoi(m[1])
			n = append(n, v)
		}
	}
	return n
}
