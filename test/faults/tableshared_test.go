//go:build faults

package faults

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// tableSharedErrors is the sample of a relay's count of looks (slot) or
// passes (Polling) that found relays of other streams on its table.
const tableSharedErrors = `outbox_relay_errors_total{kind="table_shared"}`

// insertAged inserts like insertInto, with created_at age before the
// server's clock: rows older than any short retention when committed.
func insertAged(table string, age time.Duration) insertFunc {
	sql := fmt.Sprintf(`INSERT INTO %s (event_type, payload, created_at)
SELECT 'fault.test', json_build_object('n', g, 'pad', repeat('x', 64))::text, now() - make_interval(secs => $2)
FROM generate_series(1, $1) g
RETURNING id::text, created_at`, pgx.Identifier{table}.Sanitize())
	return func(_ *rand.Rand, n int) (string, []any) { return sql, []any{n, age.Seconds()} }
}

// TestSlotCleanupBesideAPollingRelayOfAnotherStream: one outbox table, a
// Polling relay publishing to stream A and a relay of source
// LogicalReplication publishing to stream B (two OutboxRelays where one
// belongs). Producers write rows whose created_at is an hour old, older
// than the retention of `relay cleanup --slot S --retention 2s`. The
// Polling relay A1 runs, registers in outbox_events_relays and is stopped
// (SIGTERM); the producers write on, rows A has not published, before and
// while the slot's relay B streams them to B. Asserted:
//   - the slot's cleanup fails, names stream A, and deletes no row;
//   - a Polling relay A2 started beside B counts table_shared and, once it
//     has, claims nothing while rows are committed;
//   - B stopped, A2 claims again (once B's registration is 30 s old) and
//     every row committed ends up in stream A: lost 0.
//
// Before the relays table the cleanup deleted the rows A had not published
// (an hour old, inserted before B's xmin horizon), and A never published
// them. The case checks the deletes before the refusal, so that such a
// relay fails by the rows it deleted.
func TestSlotCleanupBesideAPollingRelayOfAnotherStream(t *testing.T) {
	t.Parallel()
	require.True(t, runHelpLists(t, "--source"), "this relay has no --source: it cannot stream from a slot")
	events := sized(2000, 10000)
	const rate = 200.0
	const retention = 2 * time.Second
	const slot = "faults_table_shared"
	c := startOutboxCase(t)
	streamA, streamB := c.stream+"_a", c.stream+"_b"
	polling := []string{"--stream", streamA, "--batch-size", "100", "--poll-interval", "50ms"}
	streaming := []string{"--stream", streamB, "--source", "LogicalReplication", "--slot", slot,
		"--catch-up-margin", "1s", "--batch-size", "100", "--poll-interval", "50ms"}
	cleanup := []string{"cleanup", "--slot", slot, "--retention", retention.String(), "--catch-up-margin", "1s"}

	var slotRelayGone atomic.Bool // the producers write on until B is stopped
	prod := startProducers(t, producerConfig{dsn: c.pg.DSN(), conns: 2, events: events, rate: rate,
		insert: insertAged("outbox_events", time.Hour), more: func() bool { return !slotRelayGone.Load() }})

	a1 := startRelay(t, "A1", c.env, polling...)
	eventually(t, time.Minute, "relay A1 registered and publishing", func() error {
		var n int
		err := c.conn.QueryRow(t.Context(), `SELECT count(*) FROM outbox_events_relays WHERE stream = $1 AND slot = ''`,
			streamA).Scan(&n)
		if err == nil && (n == 0 || a1.published() == 0) {
			err = fmt.Errorf("registered %d, published %.0f", n, a1.published())
		}
		return err
	})
	a1.stop(t, time.Minute)
	atStop := prod.committedCount()

	eventually(t, time.Minute, "rows committed since A1 stopped, before B starts", func() error {
		if n := prod.committedCount() - atStop; n < 200 {
			return fmt.Errorf("%d committed", n)
		}
		return nil
	})
	// Those rows are older, by transaction id, than any xmin horizon of B:
	// within the cleanup's reach, once it has a progress a retention old.
	b := startRelay(t, "B", c.env, streaming...)
	eventually(t, time.Minute, "relay B streaming, its progress logged a retention ago", func() error {
		var n int
		err := c.conn.QueryRow(t.Context(), `SELECT count(*) FROM outbox_events_relay_progress_log
			WHERE slot = $1 AND recorded_at <= now() - make_interval(secs => $2)`, slot, retention.Seconds()).Scan(&n)
		if err == nil && n == 0 {
			err = errors.New("no progress logged a retention ago")
		}
		return err
	})

	// The slot's cleanup: refused, nothing deleted.
	before := prod.committed()
	unpublished := notIn(before, streamEventIDs(t, c.rdb, streamA, 1000))
	require.NotEmpty(t, unpublished, "every row is in stream A: the cleanup had nothing of A's to delete")
	stdout, stderr, err := relayCommand(t.Context(), c.env, cleanup...)
	kept := outboxRowsWithIDs(t, c.conn, "outbox_events", ids(unpublished))
	require.Equal(t, len(unpublished), kept, "rows A had not published deleted by relay cleanup --slot: %s", stdout)
	require.Equal(t, len(before), outboxRowsWithIDs(t, c.conn, "outbox_events", ids(before)), "rows deleted by relay cleanup --slot")
	require.Error(t, err, "relay cleanup --slot beside a relay of another stream must fail: %s", stdout)
	require.Contains(t, stderr, "deleting nothing by the progress of slot "+slot)
	require.Contains(t, stderr, "stream "+streamA+" (source Polling)")

	// A Polling relay beside B: once it counts table_shared, it claims
	// nothing while rows are committed.
	a2 := startRelay(t, "A2", c.env, polling...)
	var refused float64
	eventually(t, time.Minute, "relay A2 counting table_shared", func() error {
		if refused = a2.metric(tableSharedErrors); refused == 0 {
			return errors.New("nothing counted")
		}
		return nil
	})
	// A claim begun before the first refusal may end after it: the
	// published count is taken at the next refusal.
	held := a2.published()
	eventually(t, time.Minute, "relay A2 refusing again", func() error {
		if n := a2.metric(tableSharedErrors); n <= refused {
			return fmt.Errorf("table_shared %.0f", n)
		}
		held = a2.published()
		return nil
	})
	atHeld := prod.committedCount()
	eventually(t, time.Minute, "rows committed while A2 refuses, and A2 refusing after them", func() error {
		if n := prod.committedCount() - atHeld; n < 200 {
			return fmt.Errorf("%d committed", n)
		}
		if n := a2.metric(tableSharedErrors); n <= refused+1 {
			return fmt.Errorf("table_shared %.0f", n)
		}
		refused = a2.metric(tableSharedErrors)
		return nil
	})
	require.Equal(t, held, a2.published(), "relay A2 published beside the slot's relay of another stream")
	waiting, err := pending(t.Context(), c.conn, "outbox_events")
	require.NoError(t, err)
	require.Positive(t, waiting, "no row left pending beside the slot's relay")
	require.Positive(t, b.metric(tableSharedErrors), "relay B did not count relay A2")

	// B gone, A2 claims again and drains.
	b.stop(t, time.Minute)
	slotRelayGone.Store(true)
	resumed := eventually(t, 2*time.Minute, "relay A2 claiming again", func() error {
		if a2.published() <= held {
			return errors.New("nothing published since B stopped")
		}
		return nil
	})
	prod.wait(t)
	committed := prod.committed()
	drain := waitStreamed(t, c.rdb, streamA, committed)
	waitDrained(t, c.conn, "outbox_events", time.Minute)
	a2.stop(t, time.Minute)
	r := checkStream(t, c.rdb, streamA, committed)

	figures(t, r, 2, fmt.Sprintf("unpublished_by_a_at_the_refusal=%d table_shared_counted_by_a2=%.0f "+
		"a2_claiming_again_after=%s drain=%s", len(unpublished), refused, ms(resumed), ms(drain)))
	require.GreaterOrEqual(t, r.Committed, events)
	require.Zero(t, r.Lost, "lost events, e.g. %v", r.LostIDs)
	require.Zero(t, r.Unexpected, "stream entries no producer committed")
	require.LessOrEqual(t, r.Duplicates, 200, "duplicates beyond two batches")
	require.Zero(t, countLog([]*relayProc{a1, b, a2}, "panic:"), "a relay panicked")
}

// notIn returns the committed rows whose id is not among ids.
func notIn(committed []Committed, ids []string) []Committed {
	seen := make(map[string]bool, len(ids))
	for _, id := range ids {
		seen[id] = true
	}
	var out []Committed
	for _, c := range committed {
		if !seen[c.ID] {
			out = append(out, c)
		}
	}
	return out
}

// ids returns the rows' ids.
func ids(rows []Committed) []string {
	out := make([]string, 0, len(rows))
	for _, r := range rows {
		out = append(out, r.ID)
	}
	return out
}
