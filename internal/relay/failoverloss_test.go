package relay

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/outbox-dev/outbox-operator/internal/redisconn"
	"github.com/outbox-dev/outbox-operator/internal/testenv"
)

// TestSentinelFailoverLossHiddenByAnotherWriterIsFound: a relay without
// --wait-replicas publishes its last batches to a master whose replica no
// longer receives them, and stops (a rollout); the master dies and the
// sentinels promote the replica, which lacks those entries. Another writer
// (a relay that never saw them) adds more entries to the new master before
// anyone looks: the stream's last id is later, and its count of entries
// ever added as high, as what the relays saw. Neither a relay that saw the
// lost entries only through XINFO STREAM (not its own) nor the relay that
// starts next from what the relays recorded in PostgreSQL may take that
// for an intact stream: the entry last seen is gone, though the stream
// holds older ones and deleted none.
func TestSentinelFailoverLossHiddenByAnotherWriterIsFound(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	set := testenv.StartSentinelSet(t)
	b := setup(t, bundleOpts{})
	require.NoError(t, b.table.EnsureStreamResetsTable(ctx, b.db))
	rdb := deploymentClient(t, set.URL(), redisconn.Options{})
	master := redis.NewClient(&redis.Options{Addr: set.Master.Addr(), MaxRetries: -1})
	t.Cleanup(func() { _ = master.Close() })
	replica := redis.NewClient(&redis.Options{Addr: set.Replica.Addr(), MaxRetries: -1})
	t.Cleanup(func() { _ = replica.Close() })
	xlen := func(c redis.UniversalClient) int64 {
		n, err := c.XLen(ctx, b.stream).Result()
		if err != nil {
			return -1
		}
		return n
	}

	cfg := Config{BatchSize: 10, InFlight: 1, StreamCheckInterval: 50 * time.Millisecond}
	stop := runInBackground(t, b.deploymentRelay(t, rdb, cfg))
	b.insert(t, 20)
	waitFor(t, "drained", func() bool { return b.backlog(t) == 0 && xlen(master) == 20 })
	waitFor(t, "replicated", func() bool { return xlen(replica) == 20 })

	// The replica stops receiving: frozen, its link closed by the master.
	set.Replica.Freeze(t)
	thawed := false
	t.Cleanup(func() {
		if !thawed {
			set.Replica.Thaw(t)
		}
	})
	require.NoError(t, master.Do(ctx, "CLIENT", "KILL", "TYPE", "replica").Err())
	lost := b.insert(t, 8)
	waitFor(t, "drained on the master alone", func() bool { return b.backlog(t) == 0 && xlen(master) == 28 })
	require.NoError(t, stop()) // records what it saw of the stream

	// Another relay's view: it saw the master's last entry through a look,
	// not as its own.
	observer := b.deploymentRelay(t, rdb, cfg)
	observer.checkStream(ctx)

	set.Master.Kill(t)
	set.Replica.Thaw(t)
	thawed = true
	waitFor(t, "the replica promoted", func() bool { return set.MasterAddr(t) == set.Replica.Addr() })
	waitFor(t, "the new master writable", func() bool {
		return replica.XAdd(ctx, &redis.XAddArgs{Stream: b.stream, Values: []string{"f", "v"}}).Err() == nil
	})
	for range len(lost) + 1 {
		require.NoError(t, replica.XAdd(ctx, &redis.XAddArgs{Stream: b.stream, Values: []string{"f", "v"}}).Err())
	}
	info, err := replica.XInfoStream(ctx, b.stream).Result()
	require.NoError(t, err)
	require.Equal(t, int64(20+len(lost)+2), info.Length, "the new master lacks the %d last entries", len(lost))
	require.GreaterOrEqual(t, info.EntriesAdded, int64(28), "the count of entries ever added hides the loss")

	observer.checkStream(ctx)
	require.Equal(t, 1.0, testutilCounter(observer.cfg.Metrics.stream.Resets),
		"a relay that saw the lost entries finds the reset")

	r := b.deploymentRelay(t, rdb, cfg)
	stop = runInBackground(t, r)
	b.insert(t, 3)
	waitFor(t, "the next relay finds and records the reset", func() bool {
		return b.backlog(t) == 0 && b.pendingResets(t).Count == 1
	})
	require.NoError(t, stop())
	p := b.pendingResets(t)
	var first time.Time
	require.NoError(t, b.db.QueryRow(ctx, `SELECT min(dispatched_at) FROM outbox_events WHERE id::text = ANY($1)`, lost).
		Scan(&first))
	require.False(t, p.WindowStart.After(first), "the window starts at %s, after the lost rows' dispatch %s", p.WindowStart, first)
}
