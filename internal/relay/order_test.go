package relay

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-dev/outbox-operator/internal/outbox"
)

// requireFirstOccurrencesInOrder checks what a consumer that dedupes on
// event_id sees: each id once, in the order of ids.
func requireFirstOccurrencesInOrder(t *testing.T, entries []entry, ids []string) {
	t.Helper()
	seen := map[string]bool{}
	var first []string
	for _, e := range entries {
		if id := e[FieldEventID]; !seen[id] {
			seen[id] = true
			first = append(first, id)
		}
	}
	require.Len(t, first, len(ids), "every event, once deduplicated")
	for i := range ids {
		require.Equal(t, ids[i], first[i], "event %d out of order", i)
	}
}

// TestFailedBatchHoldsBackTheBatchesClaimedAfterIt forces batches to
// overlap (three in flight) and fails one in the middle of the pipeline,
// before it reaches Redis: the batches claimed after it are rolled back,
// not published, and the stream stays in claim order.
func TestFailedBatchHoldsBackTheBatchesClaimedAfterIt(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	b.insertBulk(t, 400)
	ids := b.allIDs(t)
	r := b.newRelay(t, Config{BatchSize: 20, InFlight: 3})
	var batches atomic.Int64
	var failedOnce atomic.Bool
	release := make(chan struct{})
	r.testHookBeforePublish = func(events []outbox.Event) error {
		switch batches.Add(1) {
		case 2:
			<-release // hold batch 2 until the claimer has filled the pipeline behind it
			if failedOnce.CompareAndSwap(false, true) {
				return errors.New("injected failure of batch 2")
			}
		}
		return nil
	}
	stop := runInBackground(t, r)
	// Batches 3 and 4 are claimed (the tokens allow 3 in flight) while 2 waits.
	waitFor(t, "the pipeline full behind batch 2", func() bool { return b.openBatches(t) >= 3 })
	close(release)
	waitFor(t, "backlog drained", func() bool { return b.backlog(t) == 0 })
	require.NoError(t, stop())
	require.True(t, failedOnce.Load())
	requireFirstOccurrencesInOrder(t, b.readStream(t, b.stream), ids)
}

// TestStrictOneLeaderAndTakeover runs two relays with ordering Strict:
// one publishes, the other stands by; when the leader stops, the standby
// takes over, and the stream is in order throughout.
func TestStrictOneLeaderAndTakeover(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	b.insertBulk(t, 3000)
	ids := b.allIDs(t)
	cfg := Config{Ordering: OrderingStrict, BatchSize: 50, InFlight: 2, LeaderTimeout: 2 * time.Second,
		StandbyPoll: 50 * time.Millisecond}
	first := b.newRelay(t, cfg)
	second := b.newRelay(t, cfg)
	var published [2]atomic.Int64
	hold := make(chan struct{})
	var once sync.Once
	first.testHookBeforePublish = func(events []outbox.Event) error {
		if published[0].Add(int64(len(events))) >= 500 {
			once.Do(func() { close(hold) })
		}
		return nil
	}
	second.testHookBeforePublish = func(events []outbox.Event) error {
		published[1].Add(int64(len(events)))
		return nil
	}
	stopFirst := runInBackground(t, first)
	waitFor(t, "the first relay leading", func() bool { return published[0].Load() > 0 })
	stopSecond := runInBackground(t, second)
	<-hold
	require.Zero(t, published[1].Load(), "the standby publishes nothing while the leader runs")
	require.NoError(t, stopFirst())
	waitFor(t, "backlog drained by the new leader", func() bool { return b.backlog(t) == 0 })
	require.NoError(t, stopSecond())
	require.Positive(t, published[1].Load(), "the standby took over")
	requireFirstOccurrencesInOrder(t, b.readStream(t, b.stream), ids)
}

// TestStrictLeaderWhoseSessionEndsStopsPublishing ends the leader's session
// on the server, as when it went silent: its next batch is refused by the
// fence, and the relay becomes the leader again with a new epoch.
func TestStrictLeaderWhoseSessionEndsStopsPublishing(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	b.insertBulk(t, 100)
	r := b.newRelay(t, Config{Ordering: OrderingStrict, BatchSize: 10, LeaderTimeout: 2 * time.Second, StandbyPoll: 50 * time.Millisecond})
	ctx := context.Background()
	l, err := r.acquireLeadership(ctx)
	require.NoError(t, err)
	defer l.release()

	tx, err := b.db.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, l.fence(ctx, tx))
	require.NoError(t, tx.Rollback(ctx))

	_, err = b.db.Exec(ctx, `SELECT pg_terminate_backend($1)`, int64(l.pid))
	require.NoError(t, err)
	waitFor(t, "the leader session gone", func() bool {
		var n int
		require.NoError(t, b.db.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, int64(l.pid)).Scan(&n))
		return n == 0
	})
	tx, err = b.db.Begin(ctx)
	require.NoError(t, err)
	require.ErrorIs(t, l.fence(ctx, tx), errNotLeader)
	require.NoError(t, tx.Rollback(ctx))

	again, err := r.acquireLeadership(ctx)
	require.NoError(t, err, "the lock went with the session")
	defer again.release()
	require.Greater(t, again.epoch, l.epoch)
}

// TestFenceRefusesAnOlderEpoch: once a newer leader has published, a former
// one cannot add anything to the stream.
func TestFenceRefusesAnOlderEpoch(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	r := b.newRelay(t, Config{Ordering: OrderingStrict})
	ctx := context.Background()
	events := []outbox.Event{{ID: "1", Type: "t", Payload: "p"}}
	newer := &leadership{r: r, epoch: 200}
	older := &leadership{r: r, epoch: 100}
	require.NoError(t, newer.publishFenced(ctx, events, []string{""}))
	err := older.publishFenced(ctx, events, []string{""})
	require.ErrorContains(t, err, "FENCED")
	require.EqualValues(t, 1, b.streamLen(t))
	require.NoError(t, newer.publishFenced(ctx, events, []string{""}), "the same epoch goes on")
}
