package relay

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outbox-dev/outbox-operator/internal/outbox"
	"github.com/outbox-dev/outbox-operator/internal/syncbuf"
)

// TestOrderedBatchWhoseSessionLingersIsNotPassed: a Strict relay's batch
// fails while its backend is stopped (SIGSTOP: a server that has not yet
// seen its client's connection close, as after a cut link). The rollback
// cannot reach the backend and the relay closes the connection, but the
// server still holds the batch's rows locked, and the next claim, on
// another connection, would skip them (SKIP LOCKED) and publish the rows
// after them first. The relay must instead wait until that transaction is
// over (its partition's fence taken exclusively again, as a new owner
// does), then claim from the oldest row: every event in (created_at, id)
// order.
func TestOrderedBatchWhoseSessionLingersIsNotPassed(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	ids := b.insert(t, 30)
	var logs syncbuf.Buffer
	r := b.newRelay(t, Config{Ordering: OrderingStrict, BatchSize: 10, InFlight: 1, PublishTimeout: time.Second,
		LeaderTimeout: 2 * time.Second, StandbyPoll: 50 * time.Millisecond, Logger: newTestLogger(&logs)})
	ctx := context.Background()
	var once sync.Once
	var stopped atomic.Int64 // the stopped backend's pid
	t.Cleanup(func() {
		if pid := stopped.Load(); pid != 0 {
			_ = syscall.Kill(int(pid), syscall.SIGCONT)
		}
	})
	// The hook runs on the publisher's goroutine: it returns its errors
	// (a failed batch) rather than fail the test there.
	r.testHookBeforePublish = func([]outbox.Event) error {
		var err error
		once.Do(func() {
			err = errors.New("test: the batch fails while its backend is stopped")
			// The batch's session is the one idle in its transaction that
			// holds a lock on the table (the stream watch's DDL of its own
			// tables may be idle in a transaction too, between statements).
			rows, qerr := b.db.Query(ctx, `SELECT DISTINCT a.pid FROM pg_stat_activity a JOIN pg_locks l ON l.pid = a.pid
				WHERE a.datname = current_database() AND a.state = 'idle in transaction' AND a.pid <> pg_backend_pid()
					AND l.relation = 'outbox_events'::regclass`)
			if qerr != nil {
				err = qerr
				return
			}
			pids, qerr := pgx.CollectRows(rows, pgx.RowTo[int64])
			if qerr != nil || len(pids) != 1 {
				err = fmt.Errorf("test: the batch's session among %v: %v", pids, qerr)
				return
			}
			if kerr := syscall.Kill(int(pids[0]), syscall.SIGSTOP); kerr != nil {
				err = kerr
				return
			}
			stopped.Store(pids[0])
		})
		return err
	}
	runInBackground(t, r)

	// Either the relay publishes past the stopped batch (the bug), or it
	// says it waits for the batch's transaction.
	waitFor(t, "the relay passes the stopped batch or waits for it", func() bool {
		return b.streamLen(t) > 0 || strings.Contains(logs.String(), "waits for its transaction")
	})
	pid := stopped.Swap(0)
	require.NotZero(t, pid, "the batch's backend was stopped")
	require.NoError(t, syscall.Kill(int(pid), syscall.SIGCONT))
	waitFor(t, "every event published", func() bool { return b.backlog(t) == 0 && b.streamLen(t) >= int64(len(ids)) })

	var first []string
	seen := map[string]bool{}
	for _, e := range b.readStream(t, b.stream) {
		if id := e[FieldEventID]; !seen[id] {
			seen[id] = true
			first = append(first, id)
		}
	}
	require.Equal(t, ids, first, "first occurrences in (created_at, id) order")
}
