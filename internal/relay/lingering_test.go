package relay

import (
	"context"
	"errors"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

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
	var stopped int
	t.Cleanup(func() {
		if stopped != 0 {
			_ = syscall.Kill(stopped, syscall.SIGCONT)
		}
	})
	r.testHookBeforePublish = func([]outbox.Event) error {
		var err error
		once.Do(func() {
			// The batch's session is the one idle in its transaction.
			var pids []int
			rows, qerr := b.db.Query(ctx, `SELECT pid FROM pg_stat_activity
				WHERE datname = current_database() AND state = 'idle in transaction' AND pid <> pg_backend_pid()`)
			require.NoError(t, qerr)
			for rows.Next() {
				var pid int
				require.NoError(t, rows.Scan(&pid))
				pids = append(pids, pid)
			}
			require.NoError(t, rows.Err())
			require.Len(t, pids, 1, "one batch in flight")
			stopped = pids[0]
			require.NoError(t, syscall.Kill(stopped, syscall.SIGSTOP))
			err = errors.New("test: the batch fails while its backend is stopped")
		})
		return err
	}
	runInBackground(t, r)

	// Either the relay publishes past the stopped batch (the bug), or it
	// says it waits for the batch's transaction.
	waitFor(t, "the relay passes the stopped batch or waits for it", func() bool {
		return b.streamLen(t) > 0 || strings.Contains(logs.String(), "waits for its transaction")
	})
	require.NoError(t, syscall.Kill(stopped, syscall.SIGCONT))
	stopped = 0
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
