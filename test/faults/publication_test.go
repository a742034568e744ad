//go:build faults

package faults

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/outbox-dev/outbox-operator/internal/testenv"
)

// TestPublicationAlteredWhileStreaming: the publication a relay streams
// through (outbox_events_pub, source LogicalReplication) is altered under it
// while producers write. PostgreSQL decodes each insert with the catalog as
// it was at that insert's place in the WAL, so an insert made while the
// publication did not publish the table's inserts is skipped by the slot for
// good, whatever the publication says by the time it is decoded. Four
// phases, 1.5 s of normal streaming apart, by a superuser session:
//   - drop and re-add between two looks: a transaction begins (nothing
//     more), the table is dropped from the publication, the transaction
//     inserts 50 rows, 300 ms later the table is added back, and the
//     transaction commits 1 s after that (its created_at is before the drop,
//     its transaction id after);
//   - dropped and left: the table is dropped from the publication and not
//     added back; the relay must add it back (within 30 s);
//   - inserts not published for 2 s: SET (publish = 'update'), then back to
//     'insert';
//   - publication dropped: the relay must create it again (within 60 s), and
//     make the slot again if it can no longer decode (PostgreSQL 15 fails at
//     the first insert after the drop, forever).
//
// Each phase also commits 20 rows of its own while the publication does not
// publish the table, so that it has rows at stake once the producers are
// done. Nothing may be lost; duplicates (each catch-up reads the table from
// before the change) are a figure within a loose bound; the relay must be
// running at the end, without a panic in its log. Before the relay looked
// at its publication, the case failed in the second phase: the table was
// never added back, and 30 s later 2,219 committed rows were not in the
// stream (102 of the first phase, the transaction's 50 among them, and
// every row since the second). It runs in the CI slice, once: a slot's
// relay marks and deletes nothing, so the cleanup mode does not apply.
func TestPublicationAlteredWhileStreaming(t *testing.T) {
	t.Parallel()
	require.True(t, runHelpLists(t, "--source"), "this relay has no --source: it cannot stream from a slot")
	events := sized(3000, 15000)
	rate := sized(300.0, 600.0) // rows per second, both connections together
	const (
		slot      = "faults_publication"
		batchSize = 100
		atStake   = 20                      // rows each phase commits itself while the table is not published
		settle    = 1500 * time.Millisecond // normal streaming between two phases
	)

	pg, rs := testenv.StartPostgres(t), testenv.StartRedis(t)
	env, stream := caseEnv(t, pg, rs)
	conn, rdb := connect(t, pg.DSN()), redisClient(t, rs.URL())
	args := []string{"--stream", stream, "--source", "LogicalReplication", "--slot", slot,
		"--batch-size", fmt.Sprint(batchSize), "--poll-interval", "50ms", "--catch-up-margin", "1s"}
	relay := startRelay(t, "P1", env, args...)
	prod := startProducers(t, producerConfig{dsn: pg.DSN(), conns: 2, events: events, rate: rate, insert: insertInto("outbox_events")})
	var committedAtStart int
	eventually(t, time.Minute, "relay P1 streaming", func() error {
		if relay.published() == 0 {
			return errors.New("nothing published yet")
		}
		committedAtStart = prod.committedCount()
		return nil
	})

	// own are the rows the phases commit themselves; phases their times
	// (the server's clock, as created_at), to tell which one lost a row.
	var own []Committed
	var phases []pubPhase
	begin := func(name string) {
		phases = append(phases, pubPhase{name: name, start: serverNow(t, conn), producing: prod.committedCount() < events})
	}
	end := func() { phases[len(phases)-1].end = serverNow(t, conn) }
	commitOwn := func() {
		sql, a := insertInto("outbox_events")(nil, atStake)
		own = append(own, insertRows(t, conn, sql, a...)...)
	}
	// notStreamed says how many rows committed so far are not in the stream
	// yet, by phase, for the messages of the waits.
	notStreamed := func() string {
		n, by := lostByPhase(phases, append(prod.committed(), own...), streamEventIDs(t, rdb, stream, 1000))
		return fmt.Sprintf("%d committed rows not in the stream (%s)", n, by)
	}

	// 1. Dropped and added back between two looks, under an open transaction.
	begin("drop-and-re-add")
	addedByRelay := false
	tx, err := connect(t, pg.DSN()).Begin(t.Context())
	require.NoError(t, err)
	mustExec(t, conn, `ALTER PUBLICATION outbox_events_pub DROP TABLE outbox_events`)
	sql, a := insertInto("outbox_events")(nil, 50)
	rows, err := tx.Query(t.Context(), sql, a...)
	require.NoError(t, err)
	txRows, err := pgx.CollectRows(rows, scanCommitted)
	require.NoError(t, err)
	time.Sleep(300 * time.Millisecond)
	// A look of the relay's within the 300 ms may have added it back first.
	_, err = conn.Exec(t.Context(), `ALTER PUBLICATION outbox_events_pub ADD TABLE outbox_events`)
	if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && pgErr.Code == "42710" { // duplicate_object: already a member
		addedByRelay, err = true, nil
	}
	require.NoError(t, err)
	time.Sleep(time.Second)
	require.NoError(t, tx.Commit(t.Context()))
	own = append(own, txRows...)
	end()

	// 2. Dropped and left: the relay adds the table back.
	time.Sleep(settle)
	begin("dropped-and-left")
	mustExec(t, conn, `ALTER PUBLICATION outbox_events_pub DROP TABLE outbox_events`)
	commitOwn()
	readd := eventuallyEvery(t, 100*time.Millisecond, 30*time.Second, "the relay adding outbox_events back to its publication", func() error {
		var n int
		if err := conn.QueryRow(t.Context(), `SELECT count(*) FROM pg_publication_tables
			WHERE pubname = 'outbox_events_pub' AND tablename = 'outbox_events'`).Scan(&n); err != nil {
			return err
		}
		if n != 1 {
			return fmt.Errorf("outbox_events not in the publication; %s", notStreamed())
		}
		return nil
	})
	end()

	// 3. Inserts not published for 2 s.
	time.Sleep(settle)
	begin("inserts-not-published")
	mustExec(t, conn, `ALTER PUBLICATION outbox_events_pub SET (publish = 'update')`)
	commitOwn()
	time.Sleep(2 * time.Second)
	mustExec(t, conn, `ALTER PUBLICATION outbox_events_pub SET (publish = 'insert')`)
	end()

	// 4. The publication dropped: the relay creates it again.
	time.Sleep(settle)
	begin("publication-dropped")
	mustExec(t, conn, `DROP PUBLICATION outbox_events_pub`)
	commitOwn()
	recreate := eventuallyEvery(t, 100*time.Millisecond, time.Minute, "the relay creating its publication again", func() error {
		var exists bool
		if err := conn.QueryRow(t.Context(), `SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = 'outbox_events_pub')`).
			Scan(&exists); err != nil {
			return err
		}
		if !exists {
			return fmt.Errorf("no publication outbox_events_pub; %s", notStreamed())
		}
		return nil
	})
	end()

	prod.wait(t)
	committed := append(prod.committed(), own...)
	drain := eventuallyEvery(t, 250*time.Millisecond, 2*time.Minute, "every committed row in the stream", func() error {
		n, by := lostByPhase(phases, committed, streamEventIDs(t, rdb, stream, 1000))
		if n > 0 {
			return fmt.Errorf("%d not in the stream (%s)", n, by)
		}
		return nil
	})
	alive := !relay.exited()

	r := Check(committed, streamEventIDs(t, rdb, stream, 1000))
	// Each catch-up reads again what the slot streamed since the look
	// before the change (the slot's catch-up after the drop, since the last
	// commit less the margin): loosely, the rows of 5 s before each phase to
	// 10 s after it, plus the first catch-up and two batches per phase.
	bound := committedAtStart + 2*batchSize*(len(phases)+1)
	producing := 0
	names := make([]string, len(phases))
	for i, p := range phases {
		bound += rowsWithin(committed, p.start.Add(-5*time.Second), p.end.Add(10*time.Second))
		names[i] = p.name
		if p.producing {
			producing++
		}
	}
	figures(t, r, len(phases), fmt.Sprintf("phases=%s phases_while_producing=%d own_rows=%d duplicate_bound=%d "+
		"added_back_by_the_relay_in_phase_1=%t catch_ups=%s readd=%s recreate=%s drain=%s", strings.Join(names, ","), producing,
		len(own), bound, addedByRelay, caughtUp(relay), ms(readd), ms(recreate), ms(drain)))
	require.Equal(t, events+len(own), r.Committed)
	require.Zero(t, r.Lost, "lost events, e.g. %v", r.LostIDs)
	require.Zero(t, r.Unexpected, "stream entries no producer committed")
	require.LessOrEqual(t, r.Duplicates, bound, "duplicates beyond the catch-ups around the phases")
	require.True(t, alive, "relay P1 exited: %v", relay.waitErr)
	require.Zero(t, countLog([]*relayProc{relay}, "panic:"), "the relay panicked")
	relay.stop(t, time.Minute)
}

// pubPhase is one phase of TestPublicationAlteredWhileStreaming: its name,
// when it began and ended (the server's clock) and whether the producers
// were still writing when it began.
type pubPhase struct {
	name       string
	start, end time.Time
	producing  bool
}

// lostByPhase counts the committed rows not among the delivered ids, and
// names how many of them each phase holds: a row belongs to the last phase
// that began at or before its created_at ("before" if none did).
func lostByPhase(phases []pubPhase, committed []Committed, delivered []string) (int, string) {
	seen := make(map[string]bool, len(delivered))
	for _, id := range delivered {
		seen[id] = true
	}
	counts := make([]int, len(phases)+1) // [0]: before the first phase
	lost := 0
	for _, c := range committed {
		if seen[c.ID] {
			continue
		}
		lost++
		i := 0
		for j, p := range phases {
			if !c.CreatedAt.Before(p.start) {
				i = j + 1
			}
		}
		counts[i]++
	}
	parts := make([]string, 0, len(counts))
	parts = append(parts, fmt.Sprintf("before=%d", counts[0]))
	for j, p := range phases {
		parts = append(parts, fmt.Sprintf("%s=%d", p.name, counts[j+1]))
	}
	return lost, strings.Join(parts, " ")
}

var caughtUpRE = regexp.MustCompile(`msg="Caught up[^\n]* events=(\d+)`)

// caughtUp lists the rows of each catch-up the relay logged, e.g. "42+310+977".
func caughtUp(relay *relayProc) string {
	found := caughtUpRE.FindAllStringSubmatch(relay.out.String(), -1)
	counts := make([]string, 0, len(found))
	for _, m := range found {
		counts = append(counts, m[1])
	}
	return strings.Join(counts, "+")
}

// rowsWithin counts the committed rows whose created_at lies in [from, to].
func rowsWithin(committed []Committed, from, to time.Time) int {
	n := 0
	for _, c := range committed {
		if !c.CreatedAt.Before(from) && !c.CreatedAt.After(to) {
			n++
		}
	}
	return n
}
