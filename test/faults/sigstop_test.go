//go:build faults

package faults

import (
	"fmt"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-dev/outbox-operator/internal/testenv"
)

// TestSigstop stops relay A with SIGSTOP while it claims a large payload
// (its first claim, of one row): PostgreSQL is then blocked writing the claim's rows to a client
// that reads nothing (the kernel still acknowledges, with a zero window), a
// state that neither idle_in_transaction_session_timeout nor
// statement_timeout ends. The rows must become claimable again while A stays
// stopped (the relay's --tcp-user-timeout bounds it), and relay B then
// delivers them all. In OnDispatch (FAULTS_SCALE=full) the claim that
// PostgreSQL writes to the stopped relay is a DELETE: its rows must come
// back, not vanish.
func TestSigstop(t *testing.T) {
	t.Parallel()
	forCleanupModesOnDispatchAtFull(t, testSigstop)
}

func testSigstop(t *testing.T, mode cleanupMode) {
	rows := sized(100, 500)
	// A relay's first claim takes one row (slow start): the oldest row is
	// the large one, more than the loopback's socket buffers hold, so that
	// PostgreSQL blocks writing it to the stopped relay.
	const payloadMiB = 12
	const idleInTx, publish = 20 * time.Second, 10 * time.Second

	pg, rs := testenv.StartPostgres(t), testenv.StartRedis(t)
	env, stream := caseEnv(t, pg, rs)
	conn := connect(t, pg.DSN())
	committed := insertRows(t, conn, `INSERT INTO outbox_events (event_type, payload, created_at)
SELECT 'fault.big', repeat(md5(g::text), CASE WHEN g = 1 THEN $2 * 32768 ELSE 32 END), now() + g * interval '1 ms'
FROM generate_series(1, $1) g
RETURNING id::text, created_at`, rows, payloadMiB)

	args := []string{"--stream", stream, "--batch-size", strconv.Itoa(rows), "--in-flight", "1",
		"--publish-timeout", publish.String(), "--idle-in-transaction-timeout", idleInTx.String(),
		"--lock-timeout", "30s"}
	args = append(args, mode.args(t)...)
	userTimeout := "none"
	if runHelpLists(t, "--tcp-user-timeout") {
		userTimeout = "5s"
		args = append(args, "--tcp-user-timeout", userTimeout)
	}

	// A gate holds relay A's first claim until A is stopped: a row trigger
	// that waits for an advisory lock the test holds, on the claim's UPDATE
	// (AfterRetention) or DELETE (OnDispatch). Released, the claim completes
	// and PostgreSQL writes its rows to a stopped process.
	mustExec(t, conn, `CREATE FUNCTION fault_gate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	PERFORM pg_advisory_xact_lock_shared(4242);
	IF TG_OP = 'DELETE' THEN
		RETURN OLD;
	END IF;
	RETURN NEW;
END $$`)
	mustExec(t, conn, `CREATE TRIGGER fault_gate BEFORE UPDATE OR DELETE ON outbox_events FOR EACH ROW EXECUTE FUNCTION fault_gate()`)
	gate := connect(t, pg.DSN())
	mustExec(t, gate, `SELECT pg_advisory_lock(4242)`)
	watch := connect(t, pg.DSN())
	a := startRelay(t, "A", env, args...)
	var claimPid int
	eventually(t, time.Minute, "relay A's claim waiting at the gate", func() error {
		return watch.QueryRow(t.Context(), `SELECT pid FROM pg_stat_activity
WHERE application_name = 'outbox-relay' AND wait_event_type = 'Lock' AND wait_event = 'advisory'`).Scan(&claimPid)
	})
	a.signal(t, syscall.SIGSTOP)
	stoppedAt := time.Now()
	mustExec(t, gate, `SELECT pg_advisory_unlock(4242)`)

	// The claim has locked every row once its UPDATE ran; its backend then
	// writes the rows to relay A, or waits idle in transaction.
	var state string
	eventually(t, time.Minute, "relay A's claim holding the rows", func() error {
		var waitEvent *string
		var st *string
		var hasXid bool
		err := watch.QueryRow(t.Context(), `SELECT state, wait_event, backend_xid IS NOT NULL
FROM pg_stat_activity WHERE pid = $1`, claimPid).Scan(&st, &waitEvent, &hasXid)
		if err != nil {
			return err
		}
		switch {
		case hasXid && waitEvent != nil && *waitEvent == "ClientWrite":
			state = "blocked writing to the stopped relay"
		case hasXid && st != nil && *st == "idle in transaction":
			state = "idle in transaction"
		default:
			return fmt.Errorf("backend %d: state %v, wait event %v, xid %v", claimPid, deref(st), deref(waitEvent), hasXid)
		}
		return nil
	})
	free, err := lockableNow(t.Context(), watch, "outbox_events")
	require.NoError(t, err)
	require.Equal(t, rows-1, free, "relay A's first claim holds its one row")

	// Released while A stays stopped.
	eventually(t, idleInTx+time.Minute, "the rows claimable again while relay A is stopped", func() error {
		n, err := lockableNow(t.Context(), watch, "outbox_events")
		if err == nil && n < rows {
			err = fmt.Errorf("%d of %d rows claimable (backend state: %s)", n, rows, state)
		}
		return err
	})
	lockTime := time.Since(stoppedAt)

	b := startRelay(t, "B", env, args...)
	drain := waitDrained(t, watch, "outbox_events", 5*time.Minute)
	a.signal(t, syscall.SIGCONT)
	b.stop(t, time.Minute)
	a.stop(t, time.Minute)

	requireNothingLocked(t, watch, "outbox_events")
	requireOutboxAfterDrain(t, watch, "outbox_events", mode, rows)
	r := Check(committed, streamEventIDs(t, redisClient(t, rs.URL()), stream, 10))
	figures(t, r, 1, fmt.Sprintf("payload=%dMiB batch=%d tcp_user_timeout=%s claim=%q worst_lock=%s drain=%s",
		payloadMiB, rows, userTimeout, state, ms(lockTime), ms(drain)))
	require.Zero(t, r.Lost, "lost events, e.g. %v", r.LostIDs)
	require.Zero(t, r.Unexpected)
	require.LessOrEqual(t, r.Duplicates, rows, "duplicates beyond one batch")
}

func deref(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return *s
}
