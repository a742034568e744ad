//go:build faults

package faults

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outbox-dev/outbox-operator/internal/testenv"
)

// TestSlotMadeWhileACommitWaitsForAStandby: a relay of source
// LogicalReplication creates its slot while producers write; one producer
// transaction, with synchronous_commit on and a synchronous standby that
// does not answer, commits while the slot's creation is between its last
// two phases. Its commit record is in the WAL before the slot's consistent
// point, so the slot does not stream it, and it stays invisible (waiting
// for the standby) until 2 seconds after the slot streams to the relay.
// Asserted: its rows are in the stream (the catch-up waited for it), and
// nothing else is lost. Before, the catch-up read the table at once and
// those rows were in no stream. The slot's creation is held in its phases
// by two transactions that stay open, so that the commit lands there every
// run; a busy server with a synchronous standby does it by chance.
func TestSlotMadeWhileACommitWaitsForAStandby(t *testing.T) {
	t.Parallel()
	events := sized(2000, 10000)
	syncRows := sized(20, 200)
	const slot = "faults_syncrep"

	pg, rs := testenv.StartPostgres(t), testenv.StartRedis(t)
	env, stream := caseEnv(t, pg, rs)
	conn, rdb := connect(t, pg.DSN()), redisClient(t, rs.URL())
	ctx := t.Context()
	// A synchronous standby that never answers: only sessions with
	// synchronous_commit on wait for it (the test server's default is off).
	standby := func(names string) {
		mustExec(t, conn, fmt.Sprintf(`ALTER SYSTEM SET synchronous_standby_names = '%s'`, names))
		mustExec(t, conn, `SELECT pg_reload_conf()`)
	}
	standby("nosuch")
	t.Cleanup(func() { // best effort: the server is the case's own
		_, _ = conn.Exec(context.Background(), `ALTER SYSTEM RESET synchronous_standby_names`)
		_, _ = conn.Exec(context.Background(), `SELECT pg_reload_conf()`)
	})

	// begin opens a transaction that has an id, and returns its backend.
	begin := func() (pgx.Tx, int) {
		tx, err := connect(t, pg.DSN()).Begin(ctx)
		require.NoError(t, err)
		var pid int
		var xid string
		require.NoError(t, tx.QueryRow(ctx, `SELECT pg_backend_pid(), pg_current_xact_id()::text`).Scan(&pid, &xid))
		return tx, pid
	}
	creationWaitsFor := func(what string, pid int) {
		eventually(t, time.Minute, "the slot's creation waiting for "+what, func() error {
			var ok bool
			err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
				WHERE query LIKE '%pg_create_logical_replication_slot%' AND $1 = ANY (pg_blocking_pids(pid)))`, pid).Scan(&ok)
			if err == nil && !ok {
				err = fmt.Errorf("not waiting for backend %d", pid)
			}
			return err
		})
	}

	prod := startProducers(t, producerConfig{dsn: pg.DSN(), conns: 2, events: events, rate: sized(300.0, 1000.0),
		insert: insertInto("outbox_events")})
	first, firstPID := begin() // running when the relay creates its slot
	relay := startRelay(t, "A", env, "--stream", stream, "--source", "LogicalReplication", "--slot", slot,
		"--batch-size", "100", "--poll-interval", "50ms")
	creationWaitsFor("the first open transaction", firstPID)
	second, secondPID := begin() // the creation's next phase waits for it
	require.NoError(t, first.Rollback(ctx))
	creationWaitsFor("the second open transaction", secondPID)

	// Its commit record goes into the WAL now; it waits for the standby.
	syncTx, err := connect(t, pg.DSN()).Begin(ctx)
	require.NoError(t, err)
	_, err = syncTx.Exec(ctx, `SET LOCAL synchronous_commit = on`)
	require.NoError(t, err)
	sql, args := insertInto("outbox_events")(nil, syncRows)
	rows, err := syncTx.Query(ctx, sql, args...)
	require.NoError(t, err)
	waiting, err := pgx.CollectRows(rows, scanCommitted)
	require.NoError(t, err)
	committed := make(chan error, 1)
	go func() { committed <- syncTx.Commit(context.WithoutCancel(ctx)) }()
	eventually(t, time.Minute, "the commit waiting for the standby", func() error {
		var n int
		err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'`).Scan(&n)
		if err == nil && n != 1 {
			err = fmt.Errorf("%d sessions wait for the standby", n)
		}
		return err
	})

	require.NoError(t, second.Rollback(ctx)) // the slot becomes consistent
	eventually(t, time.Minute, "the slot streaming to the relay", func() error {
		var active bool
		err := conn.QueryRow(ctx, `SELECT active FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&active)
		if err == nil && !active {
			err = fmt.Errorf("slot %s not active", slot)
		}
		return err
	})
	time.Sleep(2 * time.Second)
	standby("") // the commit returns
	select {
	case err := <-committed:
		require.NoError(t, err)
	case <-time.After(time.Minute):
		t.Fatal("the commit still waits for the standby")
	}

	prod.wait(t)
	prod.add(waitConfirmed(t, conn, slot, 5*time.Minute))
	relay.stop(t, time.Minute)
	r := checkStream(t, rdb, stream, slices.Concat(prod.committed(), waiting))
	figures(t, r, 1, fmt.Sprintf("rows_of_the_waiting_commit=%d", len(waiting)))
	require.Zero(t, r.Lost, "lost events, e.g. %v (the waiting commit's rows are %s...)", r.LostIDs, waiting[0].ID)
	require.Zero(t, r.Unexpected)
}
