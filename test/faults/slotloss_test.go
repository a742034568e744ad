//go:build faults

package faults

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outbox-dev/outbox-operator/internal/testenv"
)

// TestLongTransactionsAcrossALostSlot: producer transactions that run
// longer than --catch-up-margin (a bulk load, say) while a relay streams
// from its slot; the relay is killed, they commit, and the server removes
// the WAL the slot needs (max_slot_wal_keep_size) before a relay streams
// again. The new slot's catch-up reads the table from the last published
// commit less the margin, which is after the long transactions' created_at
// (their start): their rows must be read by the slot's xmin horizon (the
// oldest transaction running at about that commit). Before the horizon,
// every row of the long transactions was lost. Producers write throughout,
// so the catch-up also has the rows committed while no slot streamed.
func TestLongTransactionsAcrossALostSlot(t *testing.T) {
	t.Parallel()
	require.True(t, runHelpLists(t, "--catch-up-margin"), "this relay has no --catch-up-margin")
	events := sized(3000, 15000)
	longs, rowsPerLong := sized(4, 10), 50
	const margin = time.Second
	const slot = "faults_long_transactions"

	pg, rs := testenv.StartPostgres(t, testenv.WithPostgresSetting("max_slot_wal_keep_size=1MB")), testenv.StartRedis(t)
	env, stream := caseEnv(t, pg, rs)
	conn, rdb := connect(t, pg.DSN()), redisClient(t, rs.URL())
	args := []string{"--stream", stream, "--source", "LogicalReplication", "--slot", slot,
		"--catch-up-margin", margin.String(), "--batch-size", "100", "--poll-interval", "50ms"}
	first := startRelay(t, "L1", env, args...)
	prod := startProducers(t, producerConfig{dsn: pg.DSN(), conns: 2, events: events, rate: 300, insert: insertInto("outbox_events")})
	eventually(t, time.Minute, "relay L1 streaming", func() error {
		if first.published() == 0 {
			return errors.New("nothing published yet")
		}
		return nil
	})

	// The long transactions begin half a second apart, insert, and stay
	// open while the relay records commits well past their start.
	txs := make([]pgx.Tx, longs)
	longRows := make([][]Committed, longs)
	var lastBegan time.Time
	for i := range txs {
		tx, err := connect(t, pg.DSN()).Begin(t.Context())
		require.NoError(t, err)
		sql, a := insertInto("outbox_events")(nil, rowsPerLong)
		rows, err := tx.Query(t.Context(), sql, a...)
		require.NoError(t, err)
		longRows[i], err = pgx.CollectRows(rows, scanCommitted)
		require.NoError(t, err)
		txs[i], lastBegan = tx, longRows[i][0].CreatedAt
		time.Sleep(500 * time.Millisecond)
	}
	eventually(t, time.Minute, "progress recorded past the long transactions' start and the margin", func() error {
		var last *time.Time
		err := conn.QueryRow(t.Context(), `SELECT last_commit FROM outbox_events_relay_progress WHERE slot = $1`, slot).Scan(&last)
		if err == nil && (last == nil || !last.After(lastBegan.Add(3*margin))) {
			err = fmt.Errorf("last commit %v", last)
		}
		return err
	})
	first.kill(t)
	var committed []Committed
	for i, tx := range txs {
		require.NoError(t, tx.Commit(t.Context()))
		committed = append(committed, longRows[i]...)
	}

	// While no relay streams, the server removes the WAL the slot needs.
	mustExec(t, conn, `CREATE TABLE filler (x text)`)
	eventually(t, time.Minute, "the slot invalidated", func() error {
		var status *string
		if _, err := conn.Exec(t.Context(), `INSERT INTO filler SELECT repeat('x', 1000) FROM generate_series(1, 3000);
			SELECT pg_switch_wal(); CHECKPOINT;`); err != nil {
			return err
		}
		err := conn.QueryRow(t.Context(), `SELECT wal_status FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&status)
		if err == nil && (status == nil || *status != "lost") {
			err = fmt.Errorf("wal_status %v", status)
		}
		return err
	})

	second := startRelay(t, "L2", env, args...)
	prod.wait(t)
	committed = append(committed, prod.committed()...)
	drain := waitStreamed(t, rdb, stream, committed)
	second.stop(t, time.Minute)

	r := Check(committed, streamEventIDs(t, rdb, stream, 1000))
	figures(t, r, 2, fmt.Sprintf("long_transactions=%d long_rows=%d margin=%s drain=%s",
		longs, longs*rowsPerLong, margin, ms(drain)))
	require.Equal(t, events+longs*rowsPerLong, r.Committed)
	require.Zero(t, r.Lost, "lost events, e.g. %v", r.LostIDs)
	require.Zero(t, r.Unexpected, "stream entries no producer committed")
	require.Equal(t, 1, countLog([]*relayProc{second}, "Replication slot invalidated"), "the slot was not lost")
}
