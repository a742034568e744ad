package relay

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/outbox-dev/outbox-operator/internal/outbox"
	"github.com/outbox-dev/outbox-operator/internal/syncbuf"
	"github.com/outbox-dev/outbox-operator/internal/testenv"
)

func TestCompareIDs(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		a, b string
		want int
	}{
		{"1-0", "1-0", 0}, {"1-1", "1-0", 1}, {"2-0", "10-0", -1}, {"", "0-0", -1}, {"5", "5-0", 0},
		{"1700000000000-5", "1700000000000-12", -1},
	} {
		require.Equal(t, c.want, compareIDs(c.a, c.b), "%s vs %s", c.a, c.b)
		require.Equal(t, -c.want, compareIDs(c.b, c.a), "%s vs %s", c.b, c.a)
	}
	require.Equal(t, int64(1700000000000), idMs("1700000000000-5"))
}

// TestStreamResetDetected: after the stream is flushed, deleted and
// recreated with an older last id, or recreated by someone else's XADDs,
// the next batch notices, counts it once, and the reset is recorded with a
// window that covers the rows whose entries were lost; a replay of that
// window puts every event back and marks the reset replayed.
func TestStreamResetDetected(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name  string
		reset func(t *testing.T, b *testBundle)
	}{
		{"flushall", func(t *testing.T, b *testBundle) {
			require.NoError(t, b.rdb.FlushAll(context.Background()).Err())
		}},
		{"older last id", func(t *testing.T, b *testBundle) {
			ctx := context.Background()
			require.NoError(t, b.rdb.Del(ctx, b.stream).Err())
			require.NoError(t, b.rdb.Do(ctx, "XADD", b.stream, "1-1", "f", "v").Err())
		}},
		{"recreated by another writer", func(t *testing.T, b *testBundle) {
			ctx := context.Background()
			require.NoError(t, b.rdb.Del(ctx, b.stream).Err())
			require.NoError(t, b.rdb.Do(ctx, "XADD", b.stream, "*", "f", "v").Err())
		}},
		// Redis lost the stream and a relay that never saw it (started while
		// Redis was down) made it again with more entries than it ever had:
		// a later last id, more entries ever added, and the relay's own last
		// entry older than every entry, as after trimming.
		{"made again by a relay that never saw it", func(t *testing.T, b *testBundle) {
			ctx := context.Background()
			require.NoError(t, b.rdb.Del(ctx, b.stream).Err())
			for range 40 {
				require.NoError(t, b.rdb.XAdd(ctx, &redis.XAddArgs{Stream: b.stream, Values: []string{"f", "v"}}).Err())
			}
		}},
		// A failover to a replica that lacked the relay's last entries, then
		// another relay's entries: a later last id, and as many entries ever
		// added as before, so only the relay's own last entry shows the loss.
		{"lagging replica, then another relay", func(t *testing.T, b *testBundle) {
			ctx := context.Background()
			entries, err := b.rdb.XRange(ctx, b.stream, "-", "+").Result()
			require.NoError(t, err)
			require.NoError(t, b.rdb.Del(ctx, b.stream).Err())
			kept := entries[:len(entries)-10]
			for _, e := range kept {
				require.NoError(t, b.rdb.XAdd(ctx, &redis.XAddArgs{Stream: b.stream, ID: e.ID, Values: e.Values}).Err())
			}
			for range len(entries) - len(kept) + 2 {
				require.NoError(t, b.rdb.XAdd(ctx, &redis.XAddArgs{Stream: b.stream, Values: []string{"f", "v"}}).Err())
			}
			info, err := b.rdb.XInfoStream(ctx, b.stream).Result()
			require.NoError(t, err)
			require.GreaterOrEqual(t, info.EntriesAdded, int64(len(entries)), "the count of entries ever added hides the loss")
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			rs := testenv.StartRedis(t)
			b := setup(t, bundleOpts{redisURL: rs.URL()})
			r := b.newRelay(t, Config{BatchSize: 10, InFlight: 1})
			ctx := context.Background()
			require.NoError(t, b.table.EnsureStreamResetsTable(ctx, b.db))
			ids := b.insert(t, 25)
			b.drain(t, r)
			require.Zero(t, testutilCounter(r.cfg.Metrics.stream.Resets))

			c.reset(t, b)
			more := b.insert(t, 5)
			b.drain(t, r)
			require.Equal(t, 1.0, testutilCounter(r.cfg.Metrics.stream.Resets), "one reset counted")
			require.NotZero(t, testutilCounter(r.cfg.Metrics.stream.LastResetFrom))

			// Recorded for the operator, with a window covering the lost rows.
			r.recordResets(ctx, true)
			p := b.pendingResets(t)
			require.Equal(t, int64(1), p.Count)
			var minDispatched, maxDispatched time.Time
			require.NoError(t, b.db.QueryRow(ctx, `SELECT min(dispatched_at), max(dispatched_at) FROM outbox_events`).
				Scan(&minDispatched, &maxDispatched))
			require.False(t, p.WindowStart.After(minDispatched), "window %s starts after the first dispatch %s", p.WindowStart, minDispatched)

			// More batches on the new stream: no new reset.
			b.insert(t, 3)
			b.drain(t, r)
			r.checkStream(ctx)
			require.Equal(t, 1.0, testutilCounter(r.cfg.Metrics.stream.Resets))

			res, err := Replay(ctx, b.table, b.db, b.rdb, ReplayOptions{
				Stream: b.stream, Since: *p.WindowStart, Until: p.WindowEnd.Add(time.Second), BatchSize: 7,
			})
			require.NoError(t, err)
			require.Equal(t, int64(1), res.ResetsReplayed)
			require.GreaterOrEqual(t, res.Republished, int64(len(ids)))
			requireAtLeastOnce(t, b.readStream(t, b.stream), append(ids, more...))
			p = b.pendingResets(t)
			require.Zero(t, p.Count)
		})
	}
}

// TestStreamResetRedisRestartedEmpty: a Redis without persistence that
// restarts loses the stream; the relay notices at its first batch after.
// In cleanup mode OnDispatch too: the relay cannot repair the loss (the
// rows are deleted) but it still records it.
func TestStreamResetRedisRestartedEmpty(t *testing.T) {
	t.Parallel()
	for _, d := range []outbox.Dispatch{outbox.MarkDispatched, outbox.DeleteOnDispatch} {
		t.Run(d.String(), func(t *testing.T) {
			t.Parallel()
			rs := testenv.StartRedis(t)
			b := setup(t, bundleOpts{redisURL: rs.URL()})
			r := b.newRelay(t, Config{BatchSize: 10, InFlight: 1, Dispatch: d})
			b.insert(t, 12)
			b.drain(t, r)
			rs.Stop(t)
			rs.Start(t)
			b.insert(t, 2)
			waitFor(t, "a batch after the restart", func() bool {
				res, err := r.runOnce(context.Background())
				return err == nil && res.claimed == 0
			})
			require.Equal(t, 1.0, testutilCounter(r.cfg.Metrics.stream.Resets))
			r.recordResets(context.Background(), true) // what the stream watch does between batches
			p := b.pendingResets(t)
			require.EqualValues(t, 1, p.Count, "the reset is recorded, for the StreamIntact condition")
		})
	}
}

// TestStreamNoFalseReset: trimming, deleting entries, a restart with
// persistence and a stream that never existed before are no reset.
func TestStreamNoFalseReset(t *testing.T) {
	t.Parallel()
	rs := testenv.StartRedis(t, testenv.WithAppendOnly())
	b := setup(t, bundleOpts{redisURL: rs.URL()})
	r := b.newRelay(t, Config{BatchSize: 10, InFlight: 1})
	ctx := context.Background()
	r.checkStream(ctx) // missing before the first entry: not a reset
	b.insert(t, 30)
	b.drain(t, r)
	require.NoError(t, b.rdb.XTrimMaxLen(ctx, b.stream, 5).Err())
	msgs, err := b.rdb.XRangeN(ctx, b.stream, "-", "+", 1).Result()
	require.NoError(t, err)
	require.NoError(t, b.rdb.XDel(ctx, b.stream, msgs[0].ID).Err())
	rs.Stop(t)
	rs.Start(t)
	b.insert(t, 5)
	waitFor(t, "a batch after the restart", func() bool {
		res, err := r.runOnce(ctx)
		return err == nil && res.claimed == 0
	})
	r.checkStream(ctx)
	// Another relay adds entries after this one's last and the stream is
	// trimmed to fewer of them: every entry is later than this relay's last,
	// but no more of them than were added since.
	for range 20 {
		require.NoError(t, b.rdb.XAdd(ctx, &redis.XAddArgs{Stream: b.stream, Values: []string{"f", "v"}}).Err())
	}
	require.NoError(t, b.rdb.XTrimMaxLen(ctx, b.stream, 10).Err())
	r.checkStream(ctx)
	require.Zero(t, testutilCounter(r.cfg.Metrics.stream.Resets), "another writer's entries, trimmed")
	// A consumer that deletes what it read (XDEL) removes the relay's last
	// entry, and trimming every entry leaves nothing to compare with: the
	// stream counts the deletions, so neither is a reset.
	last, err := b.rdb.XRevRangeN(ctx, b.stream, "+", "-", 1).Result()
	require.NoError(t, err)
	require.NoError(t, b.rdb.XDel(ctx, b.stream, last[0].ID).Err())
	r.checkStream(ctx)
	b.insert(t, 3)
	b.drain(t, r)
	require.NoError(t, b.rdb.XTrimMaxLen(ctx, b.stream, 0).Err())
	r.checkStream(ctx)
	require.Zero(t, testutilCounter(r.cfg.Metrics.stream.Resets))
}

// TestAutoReplay: with AutoReplay the relay republishes the window of a
// reset it found, by itself, and marks it replayed.
func TestAutoReplay(t *testing.T) {
	t.Parallel()
	rs := testenv.StartRedis(t)
	b := setup(t, bundleOpts{redisURL: rs.URL()})
	r := b.newRelay(t, Config{BatchSize: 10, AutoReplay: true, StreamCheckInterval: 50 * time.Millisecond})
	stop := runInBackground(t, r)
	ids := b.insert(t, 40)
	waitFor(t, "drained", func() bool { return b.backlog(t) == 0 && b.streamLen(t) >= 40 })
	require.NoError(t, b.rdb.FlushAll(context.Background()).Err())
	waitFor(t, "the lost events replayed", func() bool {
		seen := map[string]bool{}
		for _, e := range b.readStream(t, b.stream) {
			seen[e[FieldEventID]] = true
		}
		for _, id := range ids {
			if !seen[id] {
				return false
			}
		}
		return true
	})
	// The reset is marked replayed after its events are published (a crash
	// in between replays them again: duplicates, never a loss), so the mark
	// may come a moment after the last event.
	b.waitResetsReplayed(t)
	require.NoError(t, stop())
	require.Equal(t, 1.0, testutilCounter(r.cfg.Metrics.stream.Resets))
	require.GreaterOrEqual(t, testutilCounter(r.cfg.Metrics.stream.ReplayedEvents), 40.0)
}

// TestAutoReplayFromASlot: a relay of source LogicalReplication marks no
// row dispatched, so its automatic replay selects rows by created_at: every
// event the stream lost is published again, the rows stay unmarked, and the
// reset is marked replayed.
func TestAutoReplayFromASlot(t *testing.T) {
	t.Parallel()
	rs := testenv.StartRedis(t)
	b := setup(t, bundleOpts{redisURL: rs.URL()})
	r := b.newRelay(t, b.replicating(t, Config{Slot: "relay_test_auto_replay", BatchSize: 10, AutoReplay: true,
		StreamCheckInterval: 50 * time.Millisecond}))
	stop := runInBackground(t, r)
	ids := b.insert(t, 40)
	b.waitStream(t, ids)
	require.NoError(t, b.rdb.FlushAll(context.Background()).Err())
	more := b.insert(t, 5) // streamed to the new stream meanwhile
	b.waitStream(t, append(ids, more...))
	b.waitResetsReplayed(t)
	require.NoError(t, stop())
	require.Equal(t, 1.0, testutilCounter(r.cfg.Metrics.stream.Resets))
	require.GreaterOrEqual(t, testutilCounter(r.cfg.Metrics.stream.ReplayedEvents), 40.0)
	require.Zero(t, b.dispatchedRows(t), "a replay leaves the rows as they are")
}

// TestAutoReplayFromASlotTakesRowsCreatedLongBefore: a slot relay's rows
// reach the stream any time after their created_at (a catch-up, a
// partition that joined, a producer's clock behind). Its automatic replay
// bounded the rows by created_at to --auto-replay-max-window back, so rows
// created two hours before (with the bound at one) that the stream lost
// were left out and the reset marked replayed (a review's finding). It
// reads every row the table keeps now.
func TestAutoReplayFromASlotTakesRowsCreatedLongBefore(t *testing.T) {
	t.Parallel()
	rs := testenv.StartRedis(t)
	b := setup(t, bundleOpts{redisURL: rs.URL()})
	r := b.newRelay(t, b.replicating(t, Config{Slot: "relay_test_auto_replay_old", BatchSize: 10, AutoReplay: true,
		AutoReplayMaxWindow: time.Hour, StreamCheckInterval: 50 * time.Millisecond}))
	stop := runInBackground(t, r)
	b.waitCaughtUp(t, "relay_test_auto_replay_old")
	old := b.insertIn(t, "UTC", `INSERT INTO outbox_events (event_type, payload, created_at)
		SELECT 'old', '{}', now() - interval '2 hours' FROM generate_series(1, 5) RETURNING id::text`)
	ids := append(old, b.insertNow(t, 5)...)
	b.waitStream(t, ids)
	require.NoError(t, b.rdb.FlushAll(context.Background()).Err())
	waitFor(t, "the automatic replay", func() bool { return testutilCounter(r.cfg.Metrics.stream.ReplayedEvents) > 0 })
	b.waitResetsReplayed(t)
	require.NoError(t, stop())
	requireAtLeastOnce(t, b.readStream(t, b.stream), ids)
}

// TestAutoReplayPastItsBoundSaysSo: a reset whose window began before
// AutoReplayMaxWindow (the cleanup retention) is replayed from that bound
// only, since cleanup deletes older rows, and the relay says that the
// events before it may be lost; a window within the bound says nothing.
func TestAutoReplayPastItsBoundSaysSo(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	var logs syncbuf.Buffer
	r := b.newRelay(t, Config{AutoReplay: true, AutoReplayMaxWindow: time.Hour, Logger: newTestLogger(&logs)})
	ctx := context.Background()
	now := time.Now()
	r.autoReplay(ctx, outbox.StreamReset{Stream: b.stream, WindowStart: now.Add(-30 * time.Minute), WindowEnd: now})
	require.NotContains(t, logs.String(), "the reset stays pending")
	r.autoReplay(ctx, outbox.StreamReset{Stream: b.stream, WindowStart: now.Add(-2 * time.Hour), WindowEnd: now})
	require.Contains(t, logs.String(), "the reset stays pending, replay it by hand")
}

// TestAutoReplayPastItsBoundLeavesTheResetPending: a reset whose window
// began before --auto-replay-max-window is replayed from that bound only.
// It was marked replayed over its whole window all the same, and cleanup,
// which had kept the window's older rows while the reset was pending,
// deleted them at its next run: their events in neither the stream nor the
// table (a review's reproduction). The reset now stays pending, cleanup
// keeps the rows, and a replay by hand puts every event back.
func TestAutoReplayPastItsBoundLeavesTheResetPending(t *testing.T) {
	t.Parallel()
	b := resettableBundle(t)
	ctx := context.Background()
	r := b.newRelay(t, Config{BatchSize: 10, AutoReplay: true, AutoReplayMaxWindow: 5 * time.Minute})
	ids := b.insert(t, 10)
	b.drain(t, r)
	// Dispatched ten minutes ago, past the bound; a consumer had not read them.
	_, err := b.db.Exec(ctx, `UPDATE outbox_events SET dispatched_at = dispatched_at - interval '10 minutes'`)
	require.NoError(t, err)
	require.NoError(t, b.rdb.FlushAll(ctx).Err())
	now := time.Now()
	reset, err := b.table.RecordStreamReset(ctx, b.db, outbox.StreamReset{Stream: b.stream,
		WindowStart: now.Add(-20 * time.Minute), WindowEnd: now, Reason: "test"}, now)
	require.NoError(t, err)

	r.autoReplay(ctx, reset)
	require.Equal(t, int64(1), b.pendingResets(t).Count, "the reset stays pending")
	n, err := b.table.DeleteAllDispatched(ctx, b.db, 5*time.Minute, 1000, nil)
	require.NoError(t, err)
	require.Zero(t, n, "cleanup keeps the rows of the pending reset's window")
	require.Equal(t, int64(1), b.replayRecorded(t, b.pendingResets(t)).ResetsReplayed)
	requireAtLeastOnce(t, b.readStream(t, b.stream), ids)
}

// TestAutoReplayWaitsForTheBatchInFlight: a batch whose entries were added
// to the stream before it was lost may still be between its XADDs and its
// commit when the stream watch finds the reset and replays it. Its rows are
// not committed yet, so a replay that read the table then would not see
// them and would still mark the reset replayed: the batch commits, and its
// events are in neither stream. The replay waits for the batches in flight.
// (The hook puts the watch loop's look at the stream, which runs beside the
// batches, between a batch's XADDs and its commit.)
func TestAutoReplayWaitsForTheBatchInFlight(t *testing.T) {
	t.Parallel()
	b := resettableBundle(t)
	ctx := context.Background()
	r := b.newRelay(t, Config{BatchSize: 10, InFlight: 1, AutoReplay: true})
	ids := b.insert(t, 10)
	b.drain(t, r)
	ids = append(ids, b.insert(t, 10)...)
	replayed := make(chan struct{})
	r.testHookBeforeCommit = func(ctx context.Context) error {
		r.testHookBeforeCommit = nil
		require.NoError(t, b.rdb.FlushAll(ctx).Err()) // the batch's entries are lost with the rest
		r.checkStream(ctx)                            // the stream watch finds the reset
		go func() {
			defer close(replayed)
			r.recordResets(context.Background(), true) // and replays its window
		}()
		select {
		case <-replayed:
		case <-time.After(2 * time.Second): // the replay waits for this batch
		}
		return nil
	}
	res, err := r.runOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 10, res.claimed)
	<-replayed
	require.Equal(t, 1.0, testutilCounter(r.cfg.Metrics.stream.Resets))
	requireAtLeastOnce(t, b.readStream(t, b.stream), ids)
	p := b.pendingResets(t)
	require.Zero(t, p.Count)
}

// TestResetFoundAtShutdownIsRecorded: a reset the relay found just before
// it was stopped is in the stream-resets table when Run returns, so the
// process cannot exit between finding it and recording it (the record is
// what the operator shows and what replay --pending replays).
func TestResetFoundAtShutdownIsRecorded(t *testing.T) {
	t.Parallel()
	rs := testenv.StartRedis(t)
	b := setup(t, bundleOpts{redisURL: rs.URL()})
	// The watch loop looks once at the start, then not for an hour: the
	// reset below is recorded only on the way out.
	r := b.newRelay(t, Config{BatchSize: 10, StreamCheckInterval: time.Hour})
	stop := runInBackground(t, r)
	b.insert(t, 20)
	waitFor(t, "drained", func() bool { return b.backlog(t) == 0 && b.streamLen(t) >= 20 })
	ctx := context.Background()
	require.NoError(t, b.rdb.FlushAll(ctx).Err())
	r.checkStream(ctx)
	require.Equal(t, 1.0, testutilCounter(r.cfg.Metrics.stream.Resets))
	require.NoError(t, stop())
	p := b.pendingResets(t)
	require.Equal(t, int64(1), p.Count, "the reset recorded before Run returned")
}

// TestStreamResetOfALogicalReplicationRelay: a relay of source
// LogicalReplication marks no row dispatched, so a replay of a reset's
// window by dispatched_at finds nothing (and used to be what the operator
// told users to run); replayed by created_at (`relay replay --pending
// --source LogicalReplication`: ReplayWindow, Created) every event is back.
func TestStreamResetOfALogicalReplicationRelay(t *testing.T) {
	t.Parallel()
	b := resettableBundle(t)
	ctx := context.Background()
	before := b.insert(t, 30) // published by the catch-up
	r := b.newRelay(t, b.replicating(t, Config{BatchSize: 10, StreamCheckInterval: 50 * time.Millisecond}))
	stop := runInBackground(t, r)
	b.waitStream(t, before)
	b.waitCaughtUp(t, "relay_test")
	ids := append(before, b.insertNow(t, 20)...) // from the slot
	b.waitStream(t, ids)

	require.NoError(t, b.rdb.FlushAll(ctx).Err())
	p := b.waitPendingReset(t)
	require.NoError(t, stop())
	res, err := Replay(ctx, b.table, b.db, b.rdb, ReplayOptions{
		Stream: b.stream, Since: *p.WindowStart, Until: p.WindowEnd.Add(time.Second),
	})
	require.NoError(t, err)
	require.Zero(t, res.Republished, "no row of this source is marked dispatched")
	require.Equal(t, int64(1), res.ResetsReplayed, "a replay by dispatched_at covers the window all the same")

	// The same reset, replayed as `relay replay --pending --source LogicalReplication` does.
	_, err = b.db.Exec(ctx, `UPDATE `+b.table.StreamResetsTable()+` SET replayed_at = NULL`)
	require.NoError(t, err)
	since, until := ReplayWindow(*p.WindowStart, *p.WindowEnd, true)
	res, err = Replay(ctx, b.table, b.db, b.rdb, ReplayOptions{Stream: b.stream, Since: since, Until: until, Created: true})
	require.NoError(t, err)
	require.Equal(t, int64(len(ids)), res.Republished)
	require.Equal(t, int64(1), res.ResetsReplayed)
	b.waitStream(t, ids)
}

// TestStreamResetOfALogicalReplicationRelayCoversRowsCreatedAhead: rows
// whose created_at lies ahead of the database's clock (a producer's clock
// two minutes ahead) are streamed like any other, then lost with the
// stream. The replay of the reset by created_at stopped at the window's
// end, so it left them out and still marked the reset replayed: no pending
// reset held cleanup back, and nothing said they were missing (a review's
// reproduction). It reads every row kept now.
func TestStreamResetOfALogicalReplicationRelayCoversRowsCreatedAhead(t *testing.T) {
	t.Parallel()
	b := resettableBundle(t)
	ctx := context.Background()
	r := b.newRelay(t, b.replicating(t, Config{Slot: "created_ahead", BatchSize: 10, StreamCheckInterval: 50 * time.Millisecond}))
	stop := runInBackground(t, r)
	b.waitCaughtUp(t, "created_ahead")
	ids := b.insertNow(t, 5)
	ids = append(ids, b.insertIn(t, "UTC", `INSERT INTO outbox_events (event_type, payload, created_at)
		SELECT 'ahead', '{}', now() + interval '2 minutes' FROM generate_series(1, 5) RETURNING id::text`)...)
	b.waitStream(t, ids)

	require.NoError(t, b.rdb.FlushAll(ctx).Err())
	p := b.waitPendingReset(t)
	require.NoError(t, stop())
	since, until := ReplayWindow(*p.WindowStart, *p.WindowEnd, true)
	res, err := Replay(ctx, b.table, b.db, b.rdb, ReplayOptions{Stream: b.stream, Since: since, Until: until, Created: true})
	require.NoError(t, err)
	require.Equal(t, int64(1), res.ResetsReplayed)
	requireAtLeastOnce(t, b.readStream(t, b.stream), ids)
}

// TestStreamResetAfterAReplayCoversTheReplayedRows: a replay adds the
// events of old rows again at the time it runs, while their dispatched_at
// stays old. A reset that loses the stream after that replay has a window
// that begins at the replay, not at those rows: it reaches back to the
// replay's window (recorded by the replay), so replaying it puts them back.
func TestStreamResetAfterAReplayCoversTheReplayedRows(t *testing.T) {
	t.Parallel()
	b := resettableBundle(t)
	ctx := context.Background()
	r := b.newRelay(t, Config{BatchSize: 10, StreamCheckInterval: 50 * time.Millisecond})
	stop := runInBackground(t, r)
	ids := b.insert(t, 20)
	waitFor(t, "drained", func() bool { return b.backlog(t) == 0 && b.streamLen(t) >= 20 })
	// Dispatched ten minutes ago: out of reach of any window that begins now.
	_, err := b.db.Exec(ctx, `UPDATE outbox_events SET dispatched_at = dispatched_at - interval '10 minutes'`)
	require.NoError(t, err)
	require.NoError(t, b.rdb.FlushAll(ctx).Err())
	b.waitPendingReset(t)
	since := time.Now().Add(-time.Hour)
	res, err := Replay(ctx, b.table, b.db, b.rdb, ReplayOptions{Stream: b.stream, Since: since, Until: time.Now()})
	require.NoError(t, err)
	require.Equal(t, int64(len(ids)), res.Republished)
	require.Equal(t, int64(1), res.ResetsReplayed)
	waitStreamKnown(t, r)

	require.NoError(t, b.rdb.FlushAll(ctx).Err()) // the replayed entries lost in turn
	p := b.waitPendingReset(t)
	require.NoError(t, stop())
	require.False(t, p.WindowStart.After(since), "the window %s reaches back to the replay's, %s", p.WindowStart, since)
	res = b.replayRecorded(t, p)
	require.Equal(t, int64(len(ids)), res.Republished)
	requireAtLeastOnce(t, b.readStream(t, b.stream), ids)
}

// TestResetFoundByABatchIsRecordedAtOnce: a reset that a batch finds is
// written to the stream-resets table right away, not at the watch loop's
// next round (up to --stream-check-interval later, or a minute): until it
// is written it lives only in the process, and a relay killed meanwhile
// (SIGKILL, OOM, its node) takes it along; its successor knows nothing of
// the stream before, never finds the reset again, and nothing shows it or
// replays it.
func TestResetFoundByABatchIsRecordedAtOnce(t *testing.T) {
	t.Parallel()
	b := resettableBundle(t)
	ctx := context.Background()
	r := b.newRelay(t, Config{BatchSize: 10, StreamCheckInterval: time.Hour})
	runInBackground(t, r)
	b.insert(t, 20)
	waitFor(t, "drained", func() bool { return b.backlog(t) == 0 && b.streamLen(t) >= 20 })
	require.NoError(t, b.rdb.FlushAll(ctx).Err())
	b.insert(t, 5) // the next batch finds the stream gone
	// Recorded by the batch, not by the watch loop's next round an hour
	// away: a minute's bound proves that as well as 5 s did, and holds on a
	// loaded machine (the next batch's poll, PostgreSQL shared with other
	// tests).
	waitFor(t, "the reset recorded while the relay runs", func() bool {
		p := b.pendingResets(t)
		return p.Count == 1
	})
	require.Equal(t, 1.0, testutilCounter(r.cfg.Metrics.stream.Resets))
}

// TestResetWindowEndsOnPostgresClock: a reset's window is of dispatch times,
// PostgreSQL's clock, but the relay ends it at the detection by its own
// clock. A relay whose clock is behind PostgreSQL's by more than the second
// a replay adds left out the last batches dispatched before the reset (and
// a replay of the window marked the reset replayed without them). The
// record ends the window no earlier than PostgreSQL's clock at the record.
// (One machine has one clock: the test moves the detection back by 10 s.)
func TestResetWindowEndsOnPostgresClock(t *testing.T) {
	t.Parallel()
	b := resettableBundle(t)
	ctx := context.Background()
	r := b.newRelay(t, Config{BatchSize: 10, InFlight: 1})
	ids := b.insert(t, 20)
	b.drain(t, r)
	require.NoError(t, b.rdb.FlushAll(ctx).Err())
	r.checkStream(ctx)
	r.stream.mu.Lock()
	require.Len(t, r.stream.pending, 1)
	r.stream.pending[0].WindowEnd = r.stream.pending[0].WindowEnd.Add(-10 * time.Second) // the relay's clock 10 s behind
	r.stream.mu.Unlock()
	r.recordResets(ctx, true)

	p := b.pendingResets(t)
	require.Equal(t, int64(1), p.Count)
	var lastDispatched time.Time
	require.NoError(t, b.db.QueryRow(ctx, `SELECT max(dispatched_at) FROM outbox_events`).Scan(&lastDispatched))
	require.False(t, p.WindowEnd.Before(lastDispatched), "the window ends at %s, before the last dispatch %s", p.WindowEnd, lastDispatched)
	require.Equal(t, int64(1), b.replayRecorded(t, p).ResetsReplayed)
	requireAtLeastOnce(t, b.readStream(t, b.stream), ids)
}

// replayRecorded replays the window of the pending resets p, as `relay
// replay --pending` does.
func (b *testBundle) replayRecorded(t *testing.T, p outbox.PendingResets) ReplayResult {
	t.Helper()
	since, until := ReplayWindow(*p.WindowStart, *p.WindowEnd, false)
	res, err := Replay(context.Background(), b.table, b.db, b.rdb, ReplayOptions{Stream: b.stream, Since: since, Until: until})
	require.NoError(t, err)
	return res
}

// waitPendingReset waits until one stream reset of the bundle's stream is
// recorded and not replayed, and returns it.
func (b *testBundle) waitPendingReset(t *testing.T) outbox.PendingResets {
	t.Helper()
	var p outbox.PendingResets
	waitFor(t, "a stream reset recorded", func() bool {
		p = b.pendingResets(t)
		return p.Count == 1
	})
	return p
}

// oldEntry adds an event published ago, its row dispatched then and its
// entry (with an id of then) still in the stream, and returns its id and
// when.
func (b *testBundle) oldEntry(t *testing.T, ago time.Duration) (string, time.Time) {
	t.Helper()
	ctx := context.Background()
	at := time.Now().Add(-ago).Truncate(time.Millisecond)
	var id string
	require.NoError(t, b.db.QueryRow(ctx, `INSERT INTO outbox_events (event_type, payload, created_at, dispatched_at)
		VALUES ('old', '{}', $1, $1) RETURNING id::text`, at).Scan(&id))
	require.NoError(t, b.rdb.XAdd(ctx, &redis.XAddArgs{Stream: b.stream, ID: strconv.FormatInt(at.UnixMilli(), 10) + "-0",
		Values: []string{FieldEventID, id, FieldEventType, "old", FieldPayload, "{}"}}).Err())
	return id, at
}

// pendingResets reads the bundle's stream resets not replayed yet.
func (b *testBundle) pendingResets(t *testing.T) outbox.PendingResets {
	t.Helper()
	p, err := b.table.PendingStreamResets(context.Background(), b.db, b.stream)
	require.NoError(t, err)
	return p
}

// waitResetsReplayed waits until no stream reset of the bundle's stream is
// left to replay.
func (b *testBundle) waitResetsReplayed(t *testing.T) {
	t.Helper()
	waitFor(t, "the reset marked replayed", func() bool { return b.pendingResets(t).Count == 0 })
}

// TestStreamResetWindowCoversAGroupThatStartsOver: the window of a reset
// begins where every consumer group had read and acknowledged at the last
// check, not where they once had: a group created at "0" after the others
// consumed everything (a new consumer reading the stream from its start)
// has consumed nothing, so the window reaches back to the stream's first
// entry, and a replay of it gives that group every event it lost.
func TestStreamResetWindowCoversAGroupThatStartsOver(t *testing.T) {
	t.Parallel()
	b, r, old, ids := oldStreamDrained(t)
	ctx := context.Background()
	// Group g1 reads and acknowledges everything, and the watch sees it.
	b.ackAll(t, "g1")
	r.lookAtStream(ctx)
	// Then group g2 starts from the beginning; the next look sees it.
	require.NoError(t, b.rdb.XGroupCreate(ctx, b.stream, "g2", "0").Err())
	r.lookAtStream(ctx)

	require.NoError(t, b.rdb.FlushAll(ctx).Err())
	r.checkStream(ctx)
	b.requireResetReplayedFrom(t, r, old, ids)
}

// resettableBundle sets up a bundle on a Redis of its own (a test may lose
// its stream: FLUSHALL, a restart), with the stream-resets table.
func resettableBundle(t *testing.T) *testBundle {
	t.Helper()
	rs := testenv.StartRedis(t)
	b := setup(t, bundleOpts{redisURL: rs.URL()})
	require.NoError(t, b.table.EnsureStreamResetsTable(context.Background(), b.db))
	return b
}

// waitingReplayBundle is resettableBundle on a PostgreSQL server of its
// own, for a test whose replay waits (InFlightWait) for the transactions
// running on the server: other tests' long ones on a shared server would
// hold that wait, and a batch left idle in its transaction meanwhile would
// pass its timeout.
func waitingReplayBundle(t *testing.T) *testBundle {
	t.Helper()
	b := setup(t, bundleOpts{dsn: testenv.StartPostgres(t).DSN(), redisURL: testenv.StartRedis(t).URL()})
	require.NoError(t, b.table.EnsureStreamResetsTable(context.Background(), b.db))
	return b
}

// oldStreamDrained sets up a bundle with a stream-resets table, an event
// published ten minutes ago (oldEntry) and 20 more a relay drained; it
// returns the relay, when the old event was published and every event's id.
func oldStreamDrained(t *testing.T) (*testBundle, *Relay, time.Time, []string) {
	t.Helper()
	b := resettableBundle(t)
	oldID, old := b.oldEntry(t, 10*time.Minute)
	r := b.newRelay(t, Config{BatchSize: 10, InFlight: 1})
	ids := b.insert(t, 20)
	b.drain(t, r)
	return b, r, old, append([]string{oldID}, ids...)
}

// ackAll creates consumer group at 0 (making the stream if missing) and
// has it read and acknowledge every entry.
func (b *testBundle) ackAll(t *testing.T, group string) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, b.rdb.XGroupCreateMkStream(ctx, b.stream, group, "0").Err())
	read, err := b.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: group, Consumer: "c", Streams: []string{b.stream, ">"}}).Result()
	require.NoError(t, err)
	for _, m := range read[0].Messages {
		require.NoError(t, b.rdb.XAck(ctx, b.stream, group, m.ID).Err())
	}
}

// requireResetReplayedFrom requires that r found one reset, records it,
// and that its window reaches back to from; a replay of it then puts every
// event of ids in the stream.
func (b *testBundle) requireResetReplayedFrom(t *testing.T, r *Relay, from time.Time, ids []string) {
	t.Helper()
	require.Equal(t, 1.0, testutilCounter(r.cfg.Metrics.stream.Resets))
	r.recordResets(context.Background(), true)
	p := b.pendingResets(t)
	require.Equal(t, int64(1), p.Count)
	require.False(t, p.WindowStart.After(from), "the window %s reaches back to %s, the first entry not consumed", p.WindowStart, from)
	b.replayRecorded(t, p)
	requireAtLeastOnce(t, b.readStream(t, b.stream), ids)
}

// TestStreamResetWhileNoRelayRanIsFound: the relays publish and stop (the
// operator scales them to zero on an empty backlog, or the OutboxRelay is
// suspended); Redis restarts empty meanwhile. The relay started for the
// next rows never saw the stream, but the relays recorded what they saw of
// it in PostgreSQL: it finds the reset, records it, and the replay puts
// every event back. A review found it unnoticed: no reset recorded, the
// events gone for good.
func TestStreamResetWhileNoRelayRanIsFound(t *testing.T) {
	t.Parallel()
	resetWhileNoRelayRan(t, 0)
}

// resetWhileNoRelayRan runs TestStreamResetWhileNoRelayRanIsFound on a
// stream whose ids run ahead of the clock by ahead (0: they do not).
func resetWhileNoRelayRan(t *testing.T, ahead time.Duration) {
	t.Helper()
	rs := testenv.StartRedis(t)
	b := setup(t, bundleOpts{redisURL: rs.URL()})
	entries := int64(12)
	if ahead > 0 {
		b.aheadEntry(t, ahead)
		entries++
	}
	cfg := Config{BatchSize: 10, StreamCheckInterval: 50 * time.Millisecond}
	stop := runInBackground(t, b.newRelay(t, cfg))
	ids := b.insert(t, 12)
	waitFor(t, "drained", func() bool { return b.backlog(t) == 0 && b.streamLen(t) == entries })
	require.NoError(t, stop())

	rs.Stop(t)
	rs.Start(t) // no persistence: empty
	r := b.newRelay(t, cfg)
	stop = runInBackground(t, r)
	more := b.insert(t, 2)
	waitFor(t, "the reset recorded", func() bool { return b.pendingResets(t).Count == 1 })
	waitFor(t, "drained", func() bool { return b.backlog(t) == 0 })
	require.NoError(t, stop())
	require.Equal(t, 1.0, testutilCounter(r.cfg.Metrics.stream.Resets))

	p := b.pendingResets(t)
	b.requireWindowFromFirstDispatch(t, p)
	b.replayRecorded(t, p)
	requireAtLeastOnce(t, b.readStream(t, b.stream), append(ids, more...))

	// The stream made anew is no reset for the next relay.
	stop = runInBackground(t, b.newRelay(t, cfg))
	b.insert(t, 1)
	waitFor(t, "drained", func() bool { return b.backlog(t) == 0 })
	require.NoError(t, stop())
	require.Zero(t, b.pendingResets(t).Count, "no reset after the replay")
}

// requireWindowFromFirstDispatch requires that the window of the pending
// resets p starts no later than the first row's dispatch.
func (b *testBundle) requireWindowFromFirstDispatch(t *testing.T, p outbox.PendingResets) {
	t.Helper()
	var first time.Time
	require.NoError(t, b.db.QueryRow(context.Background(), `SELECT min(dispatched_at) FROM outbox_events`).Scan(&first))
	require.False(t, p.WindowStart.After(first), "the window starts at %s, after the first dispatch %s", p.WindowStart, first)
}

// TestRedisSwitchedToALaggingReplicaIsFound: the relays are moved to
// another Redis (its URL Secret changed: the pods roll) that holds the
// stream without its last entries, a replica that lagged. The new relays
// never saw the old stream; what the relays recorded of it tells them its
// last id went back.
func TestRedisSwitchedToALaggingReplicaIsFound(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, bundleOpts{redisURL: testenv.StartRedis(t).URL()})
	cfg := Config{BatchSize: 10, StreamCheckInterval: 50 * time.Millisecond}
	stop := runInBackground(t, b.newRelay(t, cfg))
	b.insert(t, 20)
	waitFor(t, "drained", func() bool { return b.backlog(t) == 0 && b.streamLen(t) == 20 })
	require.NoError(t, stop())

	replica := setup(t, bundleOpts{dsn: b.dsn, redisURL: testenv.StartRedis(t).URL()})
	replica.stream = b.stream
	entries, err := b.rdb.XRange(ctx, b.stream, "-", "+").Result()
	require.NoError(t, err)
	for _, e := range entries[:12] {
		require.NoError(t, replica.rdb.XAdd(ctx, &redis.XAddArgs{Stream: b.stream, ID: e.ID, Values: e.Values}).Err())
	}
	stop = runInBackground(t, replica.newRelay(t, cfg))
	replica.insert(t, 3)
	waitFor(t, "the reset recorded", func() bool { return replica.pendingResets(t).Count == 1 })
	require.NoError(t, stop())
}

// TestResetFoundByTheLastBatchAtShutdownIsRecorded: a relay is stopped
// while a claimed batch waits for the publisher, and the stream was flushed
// meanwhile. The publisher finishes that batch after the stop, and the
// batch's own look finds the reset: it must be recorded before Run
// returns. A review found the stream watch gone at the stop (its context
// was a child of Run's): the reset logged and counted, never recorded.
func TestResetFoundByTheLastBatchAtShutdownIsRecorded(t *testing.T) {
	t.Parallel()
	b := resettableBundle(t)
	ctx := context.Background()
	var block atomic.Bool
	held, release := make(chan struct{}, 1), make(chan struct{})
	r := b.newRelay(t, Config{BatchSize: 10, StreamCheckInterval: time.Hour})
	r.testHookBeforePublish = func([]outbox.Event) error {
		if block.CompareAndSwap(true, false) {
			held <- struct{}{}
			<-release
		}
		return nil
	}
	stop := runInBackground(t, r)
	ids := b.insert(t, 20)
	waitFor(t, "drained", func() bool { return b.backlog(t) == 0 && b.streamLen(t) >= 20 })

	block.Store(true)
	b.insert(t, 1) // claimed, then held before its publish
	<-held
	require.NoError(t, b.rdb.FlushAll(ctx).Err())
	stopped := make(chan error, 1)
	go func() { stopped <- stop() }()
	time.Sleep(500 * time.Millisecond) // the stop under way
	close(release)
	require.NoError(t, <-stopped)
	require.Equal(t, 1.0, testutilCounter(r.cfg.Metrics.stream.Resets), "the last batch found the reset")
	require.Less(t, len(b.readStream(t, b.stream)), len(ids), "the flush lost the events")
	require.Equal(t, int64(1), b.pendingResets(t).Count, "recorded before Run returned")
}

// TestReplayKeepsTheResetWhenItSkipsRowsNobodyParked: the relays publish a
// payload over the replay's --max-payload-bytes (they run with a larger
// one); the stream is lost. A replay with the smaller limit skips that row
// as unpublishable: it must say so and leave the reset pending, not mark
// it replayed (a review found the event lost for good that way). A replay
// with the relays' limit then puts everything back and marks it. A row
// the relays parked is skipped without a word, as before.
func TestReplayKeepsTheResetWhenItSkipsRowsNobodyParked(t *testing.T) {
	t.Parallel()
	b := resettableBundle(t)
	ctx := context.Background()
	r := b.newRelay(t, Config{BatchSize: 10, MaxPayloadBytes: 100_000, StreamCheckInterval: 50 * time.Millisecond})
	stop := runInBackground(t, r)
	var bigID, parkedID string
	require.NoError(t, b.db.QueryRow(ctx, `INSERT INTO outbox_events (event_type, payload)
		VALUES ('big', repeat('x', 60000)) RETURNING id::text`).Scan(&bigID))
	require.NoError(t, b.db.QueryRow(ctx, `INSERT INTO outbox_events (event_type, payload)
		VALUES ('huge', repeat('x', 200000)) RETURNING id::text`).Scan(&parkedID))
	ids := append(b.insert(t, 5), bigID)
	waitFor(t, "drained", func() bool { return b.backlog(t) == 0 && b.streamLen(t) >= 6 })
	require.NoError(t, b.rdb.FlushAll(ctx).Err())
	waitFor(t, "the reset recorded", func() bool { return b.pendingResets(t).Count == 1 })
	require.NoError(t, stop())
	p := b.pendingResets(t)

	opts := ReplayOptions{Stream: b.stream, Since: *p.WindowStart, Until: p.WindowEnd.Add(time.Second), MaxPayloadBytes: 50_000}
	res, err := Replay(ctx, b.table, b.db, b.rdb, opts)
	require.ErrorContains(t, err, "1 rows of the window were not republished")
	require.ErrorContains(t, err, bigID)
	require.Zero(t, res.ResetsReplayed)
	require.EqualValues(t, 1, b.pendingResets(t).Count, "the reset stays pending")

	opts.MaxPayloadBytes = 100_000
	res, err = Replay(ctx, b.table, b.db, b.rdb, opts)
	require.NoError(t, err)
	require.EqualValues(t, 1, res.ResetsReplayed)
	require.EqualValues(t, 1, res.Skipped, "the parked row")
	requireAtLeastOnce(t, b.readStream(t, b.stream), ids)

	// The parked copy discarded on purpose (relay dead-letters discard):
	// the replay names the row, and --accept-unparked lets it go.
	_, err = b.db.Exec(ctx, `DELETE FROM outbox_events_dead_letters`)
	require.NoError(t, err)
	_, err = b.table.RecordStreamReset(ctx, b.db, outbox.StreamReset{Stream: b.stream, WindowStart: time.Now().Add(-time.Hour),
		WindowEnd: time.Now(), Reason: "test"}, time.Now())
	require.NoError(t, err)
	p = b.pendingResets(t)
	opts.Since, opts.Until = *p.WindowStart, p.WindowEnd.Add(time.Second)
	_, err = Replay(ctx, b.table, b.db, b.rdb, opts)
	require.ErrorContains(t, err, parkedID)
	require.ErrorContains(t, err, "--accept-unparked")
	opts.AcceptUnparked = true
	res, err = Replay(ctx, b.table, b.db, b.rdb, opts)
	require.NoError(t, err)
	require.EqualValues(t, 1, res.ResetsReplayed)
}

// TestAutoReplayWaitsForAnotherRelaysBatch: relay B's batch has added its
// entries to the stream and not committed when the stream is flushed.
// Relay A (--auto-replay) finds the reset and records it; its replay must
// not read the table before B's batch ended: B's rows, committed a moment
// later, are in the window, and B stops before it looks at the stream
// again. A review found A's replay done and the reset marked replayed
// before B's commit: B's events lost for good.
func TestAutoReplayWaitsForAnotherRelaysBatch(t *testing.T) {
	t.Parallel()
	b := resettableBundle(t)
	ctx := context.Background()
	var paused atomic.Bool
	a := b.newRelay(t, Config{BatchSize: 10, AutoReplay: true, StreamCheckInterval: 50 * time.Millisecond})
	a.testHookBeforeClaim = func() {
		for paused.Load() {
			time.Sleep(5 * time.Millisecond)
		}
	}
	stopA := runInBackground(t, a)
	ids := b.insert(t, 20)
	waitFor(t, "A drained", func() bool { return b.backlog(t) == 0 && b.streamLen(t) >= 20 })
	paused.Store(true) // B takes the next rows
	time.Sleep(300 * time.Millisecond)

	relayB := b.newRelay(t, Config{BatchSize: 10, InFlight: 1, StreamCheckInterval: time.Hour})
	idsB := b.insert(t, 10)
	relayB.testHookBeforeCommit = func(ctx context.Context) error {
		require.NoError(t, b.rdb.FlushAll(ctx).Err()) // B's entries go with the rest
		waitFor(t, "A recorded the reset", func() bool { return b.pendingResets(t).Count >= 1 })
		time.Sleep(500 * time.Millisecond) // time for A's replay, had it not waited
		return nil
	}
	res, err := relayB.runOnce(ctx) // and B stops
	require.NoError(t, err)
	require.Equal(t, 10, res.claimed)
	b.waitResetsReplayed(t)
	paused.Store(false)
	require.NoError(t, stopA())
	requireAtLeastOnce(t, b.readStream(t, b.stream), append(ids, idsB...))
}

// TestResetFoundAtShutdownIsNotReplayedThen: with --auto-replay, a reset
// that the last look at shutdown finds is recorded and left for a replay
// by hand: an automatic replay waits for the transactions in flight and
// reads the whole window, longer than a pod's grace period (a review found
// the stop held by an unrelated open transaction).
func TestResetFoundAtShutdownIsNotReplayedThen(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	ctx := context.Background()
	require.NoError(t, b.table.EnsureStreamResetsTable(ctx, b.db))
	r := b.newRelay(t, Config{BatchSize: 10, AutoReplay: true, StreamCheckInterval: time.Hour})
	stop := runInBackground(t, r)
	b.insert(t, 5)
	waitFor(t, "drained", func() bool { return b.backlog(t) == 0 && b.streamLen(t) >= 5 })
	require.NoError(t, b.rdb.Del(ctx, b.stream).Err())
	require.NoError(t, stop())
	require.EqualValues(t, 1, b.pendingResets(t).Count, "recorded, and left pending")
	require.Zero(t, testutilCounter(r.cfg.Metrics.stream.ReplayedEvents), "not replayed at shutdown")
}

// TestReplayWaitsForABatchInFlight: `relay replay` run at once after a
// reset (by a script watching StreamIntact) while a relay's batch that
// added its entries to the lost stream has not committed: the replay waits
// for the transactions running when it starts (--in-flight-wait), so it
// reads the batch's rows. Without the wait they were not in its snapshot,
// and their events were lost with the stream.
func TestReplayWaitsForABatchInFlight(t *testing.T) {
	t.Parallel()
	b := resettableBundle(t)
	ctx := context.Background()
	relay := b.newRelay(t, Config{BatchSize: 10, InFlight: 1, StreamCheckInterval: time.Hour})
	ids := b.insert(t, 10)
	var res ReplayResult
	done := make(chan error, 1)
	relay.testHookBeforeCommit = func(context.Context) error {
		require.NoError(t, b.rdb.FlushAll(ctx).Err()) // the batch's entries go with the rest
		go func() {
			var err error
			res, err = Replay(ctx, b.table, b.db, b.rdb, ReplayOptions{Stream: b.stream,
				Since: time.Now().Add(-time.Hour), Until: time.Now().Add(time.Hour), InFlightWait: 30 * time.Second})
			done <- err
		}()
		time.Sleep(500 * time.Millisecond) // the replay's read, had it not waited
		return nil
	}
	claimed, err := relay.runOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 10, claimed.claimed)
	require.NoError(t, <-done)
	require.Empty(t, res.StillRunning)
	require.EqualValues(t, 10, res.Republished)
	requireAtLeastOnce(t, b.readStream(t, b.stream), ids)

	// A transaction that outlasts the wait: the replay goes on, and says so.
	long, err := b.db.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = long.Rollback(ctx) }()
	_, err = long.Exec(ctx, `SELECT pg_current_xact_id()`)
	require.NoError(t, err)
	res, err = Replay(ctx, b.table, b.db, b.rdb, ReplayOptions{Stream: b.stream,
		Since: time.Now().Add(-time.Hour), Until: time.Now().Add(time.Hour), InFlightWait: 200 * time.Millisecond})
	require.NoError(t, err)
	require.Contains(t, res.StillRunning, "had not ended after 200ms")
	require.EqualValues(t, 10, res.Republished)
}

// aheadEntry adds an entry to the bundle's stream with an id ahead of the
// clock by d: Redis numbers every later entry from there, as it does when
// its clock runs ahead of PostgreSQL's, or was stepped back after it had.
func (b *testBundle) aheadEntry(t *testing.T, d time.Duration) {
	t.Helper()
	id := strconv.FormatInt(time.Now().Add(d).UnixMilli(), 10) + "-0"
	require.NoError(t, b.rdb.XAdd(context.Background(), &redis.XAddArgs{Stream: b.stream, ID: id,
		Values: []string{"note", "an entry of another writer, its id ahead of the clock"}}).Err())
}

// TestResetWindowCoversIDsAheadOfTheClock: a reset's window starts from
// stream ids (the oldest entry held, or the groups' positions), which
// Redis makes from its own clock and never lets go back, and it selects
// rows by dispatched_at, PostgreSQL's clock. With the stream's ids ten
// minutes ahead, the window began eight minutes after the last dispatch
// and the replay put back none of the lost events. The relay measures how
// far the ids it adds run ahead of its clock and starts the window that
// much earlier.
func TestResetWindowCoversIDsAheadOfTheClock(t *testing.T) {
	t.Parallel()
	b := resettableBundle(t)
	ctx := context.Background()
	b.aheadEntry(t, 10*time.Minute)
	r := b.newRelay(t, Config{BatchSize: 10, InFlight: 1})
	ids := b.insert(t, 20)
	b.drain(t, r)
	require.NoError(t, b.rdb.FlushAll(ctx).Err())
	r.checkStream(ctx)
	require.Equal(t, 1.0, testutilCounter(r.cfg.Metrics.stream.Resets))
	r.recordResets(ctx, false)

	p := b.pendingResets(t)
	require.Equal(t, int64(1), p.Count)
	b.requireWindowFromFirstDispatch(t, p)
	b.replayRecorded(t, p)
	requireAtLeastOnce(t, b.readStream(t, b.stream), ids)
}

// TestResetWhileNoRelayRanCoversIDsAheadOfTheClock: the same ids ahead,
// and the reset happens while no relay runs (Redis restarted empty). The
// relay started next adds its first entries to the new stream, whose ids
// are from Redis's clock again, so it cannot measure how far the lost
// stream's ran ahead; what the relays recorded of the stream (its last id,
// and when PostgreSQL wrote it) tells it.
func TestResetWhileNoRelayRanCoversIDsAheadOfTheClock(t *testing.T) {
	t.Parallel()
	resetWhileNoRelayRan(t, 10*time.Minute)
}

// TestResetAmidALookKeepsItsWindow: the watch reads the consumer groups'
// positions and looks at the stream, in two commands. Redis loses the
// stream between them, and a group of the new stream has already read its
// first entry. The watch looked at the stream first, then read the groups:
// those of the new stream, so the window of the reset, found at the next
// look, began at that group's position, after every event the old stream
// lost (ten minutes before). It reads the groups first now, and keeps them
// only when the look at the stream after finds no reset.
func TestResetAmidALookKeepsItsWindow(t *testing.T) {
	t.Parallel()
	b, r, old, ids := oldStreamDrained(t)
	ctx := context.Background()
	r.lookAtStream(ctx) // a good look: nothing consumed

	r.rdb.AddHook(&beforeFirst{cmds: []string{"xinfo groups"}, fn: func() {
		require.NoError(t, b.rdb.FlushAll(ctx).Err())
		require.NoError(t, b.rdb.XAdd(ctx, &redis.XAddArgs{Stream: b.stream,
			Values: []string{FieldEventID, "new", FieldEventType, "new", FieldPayload, "{}"}}).Err())
		b.ackAll(t, "g1")
	}})
	r.lookAtStream(ctx) // Redis loses the stream amid this look
	r.lookAtStream(ctx)
	b.requireResetReplayedFrom(t, r, old, ids)
}

// beforeFirst is a go-redis hook that runs fn once, right before the first
// command its client sends whose first words are one of cmds ("xinfo
// groups").
type beforeFirst struct {
	cmds []string
	once sync.Once
	fn   func()
}

func (h *beforeFirst) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *beforeFirst) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, c redis.Cmder) error {
		if slices.ContainsFunc(h.cmds, func(cmd string) bool { return startsWith(c, cmd) }) {
			h.once.Do(h.fn)
		}
		return next(ctx, c)
	}
}
func (h *beforeFirst) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// startsWith reports whether the command's first words are cmd's.
func startsWith(c redis.Cmder, cmd string) bool {
	words := strings.Fields(cmd)
	return len(c.Args()) >= len(words) && slices.EqualFunc(words, c.Args()[:len(words)], func(w string, a any) bool {
		s, ok := a.(string)
		return ok && strings.EqualFold(w, s)
	})
}

// afterFirstXAdds is a go-redis hook that runs fn once, right after the
// first pipeline of XADDs its client sends.
type afterFirstXAdds struct {
	once sync.Once
	fn   func()
}

func (h *afterFirstXAdds) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *afterFirstXAdds) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *afterFirstXAdds) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		if slices.ContainsFunc(cmds, func(c redis.Cmder) bool { return c.Name() == "xadd" }) {
			h.once.Do(h.fn)
		}
		return err
	}
}

// TestResetWhileAReplayRunsCoversWhatItAddedBefore: a replay republishes a
// window page by page; Redis loses the stream again after its first page
// (a Redis without persistence crash-looping), and the relay records that
// second reset while the replay runs. The replay recorded itself only at
// its end, so the second reset's window did not reach back to the rows of
// its first page, and the replay then marked the first reset replayed:
// those events were in no stream and no pending window (a review's
// reproduction). The replay now records itself before each page, so the
// second window reaches back to its rows, and it marks only the resets
// detected before it started.
func TestResetWhileAReplayRunsCoversWhatItAddedBefore(t *testing.T) {
	t.Parallel()
	b := resettableBundle(t)
	ctx := context.Background()
	r := b.newRelay(t, Config{BatchSize: 10, StreamCheckInterval: 50 * time.Millisecond})
	stop := runInBackground(t, r)
	ids := b.insert(t, 20)
	waitFor(t, "drained", func() bool { return b.backlog(t) == 0 && b.streamLen(t) >= 20 })
	// Dispatched ten minutes ago: before the second reset's window, which
	// starts from the entries the replay adds.
	_, err := b.db.Exec(ctx, `UPDATE outbox_events SET dispatched_at = dispatched_at - interval '10 minutes'`)
	require.NoError(t, err)
	require.NoError(t, b.rdb.FlushAll(ctx).Err()) // the first reset
	b.waitPendingReset(t)
	ids = append(ids, b.insert(t, 1)...) // the relay sees the new stream
	waitFor(t, "drained again", func() bool { return b.backlog(t) == 0 && b.streamLen(t) >= 1 })

	opts := *b.rdb.Options() // a client of its own, for the hook
	replaying := redis.NewClient(&opts)
	t.Cleanup(func() { _ = replaying.Close() })
	replaying.AddHook(&afterFirstXAdds{fn: func() {
		require.NoError(t, b.rdb.FlushAll(ctx).Err()) // the second reset
		waitFor(t, "the second reset recorded", func() bool { return b.pendingResets(t).Count == 2 })
	}})
	res, err := Replay(ctx, b.table, b.db, replaying, ReplayOptions{Stream: b.stream, Since: time.Now().Add(-time.Hour),
		Until: time.Now(), BatchSize: 5})
	require.NoError(t, err)
	require.Equal(t, int64(1), res.ResetsReplayed, "the first reset, not the one found while the replay ran")

	p := b.pendingResets(t)
	require.Equal(t, int64(1), p.Count)
	b.requireWindowFromFirstDispatch(t, p)
	require.Equal(t, int64(1), b.replayRecorded(t, p).ResetsReplayed)
	require.NoError(t, stop())
	requireAtLeastOnce(t, b.readStream(t, b.stream), ids)
}

// TestResetFoundAtShutdownWhoseRecordFailsIsFoundAgain: the last look at
// shutdown finds the stream gone, and recording the reset fails (the
// stream-resets table locked past the lock timeout: an ALTER, a VACUUM
// FULL). Saving the stream's state, a table of its own, then forgot the
// stream (seen gone), so the next relay found neither a state nor a reset:
// nothing recorded to replay (a review's reproduction). The state is not
// saved while a reset waits for its record, and the next relay finds the
// reset again.
func TestResetFoundAtShutdownWhoseRecordFailsIsFoundAgain(t *testing.T) {
	t.Parallel()
	b := resettableBundle(t)
	ctx := context.Background()
	looking := Config{BatchSize: 10, StreamCheckInterval: 50 * time.Millisecond}
	stop := runInBackground(t, b.newRelay(t, looking))
	b.insert(t, 20)
	waitFor(t, "the stream's state saved", func() bool {
		s, ok, err := b.table.ReadStreamState(ctx, b.db, b.stream)
		return err == nil && ok && s.EntriesAdded >= 20
	})
	require.NoError(t, stop())
	// A relay that looks only at its start and its end: it restores the
	// state, and its last look finds the reset.
	stop = runInBackground(t, b.newRelay(t, Config{BatchSize: 10, StreamCheckInterval: time.Hour}))
	time.Sleep(200 * time.Millisecond) // its first look, at the stream still there

	tx := b.beginLong(t)
	// SHARE blocks the record's INSERT and, unlike ACCESS EXCLUSIVE, takes
	// no transaction id: the tests that wait for the server's transactions
	// to end do not wait for this one.
	_, err := tx.Exec(ctx, "LOCK TABLE "+b.table.StreamResetsTable()+" IN SHARE MODE")
	require.NoError(t, err)
	require.NoError(t, b.rdb.FlushAll(ctx).Err())
	require.NoError(t, stop()) // its last look finds the reset; the record waits past the lock timeout
	require.NoError(t, tx.Rollback(ctx))
	require.Zero(t, b.pendingResets(t).Count, "the record failed")
	_, ok, err := b.table.ReadStreamState(ctx, b.db, b.stream)
	require.NoError(t, err)
	require.True(t, ok, "the stream's state is kept while its reset is not recorded")

	stop = runInBackground(t, b.newRelay(t, looking))
	b.insert(t, 1)
	waitFor(t, "the reset found again and recorded", func() bool { return b.pendingResets(t).Count == 1 })
	require.NoError(t, stop())
}

// TestCleanupAfterALateReplayKeepsWhatTheNextResetNeeds: a reset replayed
// late (its rows dispatched more than the retention before the replay)
// keeps its rows for a retention after the replay. The replay republished
// them; if Redis loses those entries too, the second reset's window reaches
// back to the replay's and its replay must find the rows again. Before,
// marking the reset replayed released cleanup's hold at once, the next
// cleanup deleted every row just republished, and the second replay found
// none (found by a review, 2026-12-05).
func TestCleanupAfterALateReplayKeepsWhatTheNextResetNeeds(t *testing.T) {
	t.Parallel()
	b := resettableBundle(t)
	ctx := context.Background()
	const retention = 72 * time.Hour // the default cleanup.retention
	r := b.newRelay(t, Config{BatchSize: 10, StreamCheckInterval: 50 * time.Millisecond})
	stop := runInBackground(t, r)
	ids := b.insert(t, 20)
	waitFor(t, "drained", func() bool { return b.backlog(t) == 0 && b.streamLen(t) >= 20 })

	require.NoError(t, b.rdb.FlushAll(ctx).Err())
	b.waitPendingReset(t)
	// Nobody replays it for 100 hours: the dispatch times and the reset's
	// record move back by as much.
	_, err := b.db.Exec(ctx, `UPDATE outbox_events SET dispatched_at = dispatched_at - interval '100 hours',
		created_at = created_at - interval '100 hours'`)
	require.NoError(t, err)
	_, err = b.db.Exec(ctx, `UPDATE outbox_events_stream_resets SET window_start = window_start - interval '100 hours',
		window_end = window_end - interval '100 hours', detected_at = detected_at - interval '100 hours'`)
	require.NoError(t, err)
	n, err := b.table.DeleteAllDispatched(ctx, b.db, retention, 1000, nil)
	require.NoError(t, err)
	require.Zero(t, n, "cleanup keeps the rows of a reset not replayed")

	first := b.pendingResets(t)
	res := b.replayRecorded(t, first)
	require.Equal(t, int64(len(ids)), res.Republished)
	require.Equal(t, int64(1), res.ResetsReplayed)
	waitStreamKnown(t, r)
	n, err = b.table.DeleteAllDispatched(ctx, b.db, retention, 1000, nil)
	require.NoError(t, err)
	require.Zero(t, n, "cleanup right after the replay deleted rows it had just republished")

	// Redis loses the replayed entries before any consumer read them.
	require.NoError(t, b.rdb.FlushAll(ctx).Err())
	second := b.waitPendingReset(t)
	require.NoError(t, stop())
	require.False(t, second.WindowStart.After(*first.WindowStart),
		"the second window %s reaches back to the replay's, %s", second.WindowStart, first.WindowStart)
	res = b.replayRecorded(t, second)
	require.Equal(t, int64(len(ids)), res.Republished, "incomplete: %q", res.Incomplete)
	requireAtLeastOnce(t, b.readStream(t, b.stream), ids)

	// A retention after the last replay, the rows go.
	_, err = b.db.Exec(ctx, `UPDATE outbox_events_stream_resets SET replayed_at = replayed_at - interval '73 hours',
		detected_at = detected_at - interval '73 hours'`)
	require.NoError(t, err)
	n, err = b.table.DeleteAllDispatched(ctx, b.db, retention, 1000, nil)
	require.NoError(t, err)
	require.EqualValues(t, len(ids), n, "a retention after the replay, cleanup deletes as usual")
}

// TestReplayOfAnExplicitCreatedWindowKeepsTheResetPending: a slot relay's
// reset has a window of stream times, and the relay streams a row any time
// after its created_at (a lag, a catch-up, a long producer transaction): a
// replay by created_at over the reset's window (`relay replay --source
// LogicalReplication --since ... --until ...`, as the relay's log line and
// the kubectl plugin offered) leaves out rows created before it. It must
// not mark the reset replayed: it says why (ResetsKept), and a replay of
// every row kept (--pending) ends it with nothing lost. Before, the reset
// was marked replayed, and the rows created ten minutes before the window
// stayed lost (found by two reviews, 2026-12-05).
func TestReplayOfAnExplicitCreatedWindowKeepsTheResetPending(t *testing.T) {
	t.Parallel()
	b := resettableBundle(t)
	ctx := context.Background()
	const slot = "explicit_created_window"
	r := b.newRelay(t, b.replicating(t, Config{Slot: slot, BatchSize: 10, StreamCheckInterval: 50 * time.Millisecond}))
	stop := runInBackground(t, r)
	b.waitCaughtUp(t, slot)
	ids := b.insertIn(t, "UTC", `INSERT INTO outbox_events (event_type, payload, created_at)
		SELECT 'late', '{}', now() - interval '10 minutes' FROM generate_series(1, 5) RETURNING id::text`)
	ids = append(ids, b.insertNow(t, 5)...)
	b.waitStream(t, ids)

	require.NoError(t, b.rdb.FlushAll(ctx).Err())
	p := b.waitPendingReset(t)
	require.NoError(t, stop())
	since := p.WindowStart.Truncate(time.Second)
	until := p.WindowEnd.Truncate(time.Second).Add(time.Second)
	res, err := Replay(ctx, b.table, b.db, b.rdb, ReplayOptions{Stream: b.stream, Since: since, Until: until, Created: true})
	require.NoError(t, err)
	require.EqualValues(t, 5, res.Republished, "the rows created in the window")
	require.Zero(t, res.ResetsReplayed)
	require.Contains(t, res.ResetsKept, "--pending")
	require.EqualValues(t, 1, b.pendingResets(t).Count, "the reset still waits for a replay")

	since, until = ReplayWindow(*p.WindowStart, *p.WindowEnd, true)
	res, err = Replay(ctx, b.table, b.db, b.rdb, ReplayOptions{Stream: b.stream, Since: since, Until: until, Created: true})
	require.NoError(t, err)
	require.EqualValues(t, 1, res.ResetsReplayed)
	require.Empty(t, res.ResetsKept)
	requireAtLeastOnce(t, b.readStream(t, b.stream), ids)
}

// TestReplayDoesNotMarkAResetFoundDuringItsInFlightWait: a replay waits
// (InFlightWait) for the transactions running when it starts. A batch
// that claims after the wait took its transaction id is neither waited for
// nor seen by the replay's read; if a reset of its entries is recorded
// while the replay waits (the stream lost again), the replay must leave
// that reset pending. Before, the replay read its cutoff for the resets it
// marks after the wait, marked that reset replayed, and the batch's events
// stayed lost (found by a review, 2026-12-05).
func TestReplayDoesNotMarkAResetFoundDuringItsInFlightWait(t *testing.T) {
	t.Parallel()
	b := waitingReplayBundle(t)
	ctx := context.Background()
	relay := b.newRelay(t, Config{BatchSize: 10, InFlight: 1, StreamCheckInterval: time.Hour})
	ids := b.insert(t, 10)

	// Another relay's batch, in flight when the replay starts.
	earlier, err := b.db.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = earlier.Rollback(ctx) }()
	_, err = earlier.Exec(ctx, `SELECT pg_current_xact_id()`)
	require.NoError(t, err)

	var res ReplayResult
	done := make(chan error, 1)
	go func() {
		var err error
		res, err = Replay(ctx, b.table, b.db, b.rdb, ReplayOptions{Stream: b.stream,
			Since: time.Now().Add(-time.Hour), Until: time.Now().Add(time.Hour), InFlightWait: 30 * time.Second})
		done <- err
	}()
	// The replay took its transaction id and waits: it looks at the oldest
	// transaction running. (A batch begun before it took its id would be
	// waited for, and wait for the replay in its hook below.)
	waitFor(t, "the replay waiting", func() bool {
		var n int
		require.NoError(t, b.db.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND query LIKE 'SELECT pg_snapshot_xmin(pg_current_snapshot())%'`).Scan(&n))
		return n > 0
	})

	relay.testHookBeforeCommit = func(context.Context) error {
		// This batch's entries are in the stream; Redis loses it, and a
		// relay records the reset, while the replay still waits.
		require.NoError(t, b.rdb.FlushAll(ctx).Err())
		_, err := b.table.RecordStreamReset(ctx, b.db, outbox.StreamReset{Stream: b.stream,
			WindowStart: time.Now().Add(-time.Minute), WindowEnd: time.Now(), Reason: "test: the stream is missing"}, time.Now())
		require.NoError(t, err)
		require.NoError(t, earlier.Commit(ctx)) // the replay's wait ends
		require.NoError(t, <-done)              // it reads, republishes, marks
		return nil                              // then the batch commits
	}
	claimed, err := relay.runOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 10, claimed.claimed)
	require.Zero(t, res.ResetsReplayed, "a reset recorded during the replay's wait is not the replay's")
	p := b.pendingResets(t)
	require.EqualValues(t, 1, p.Count)

	since, until := ReplayWindow(*p.WindowStart, *p.WindowEnd, false)
	res, err = Replay(ctx, b.table, b.db, b.rdb, ReplayOptions{Stream: b.stream, Since: since, Until: until})
	require.NoError(t, err)
	require.EqualValues(t, 1, res.ResetsReplayed)
	requireAtLeastOnce(t, b.readStream(t, b.stream), ids)
}

// waitStreamKnown waits until r has looked at its stream (a replayed one,
// say) and knows it.
func waitStreamKnown(t *testing.T, r *Relay) {
	t.Helper()
	waitFor(t, "the relay saw the replayed stream", func() bool {
		r.stream.mu.Lock()
		defer r.stream.mu.Unlock()
		return r.stream.known
	})
}

// TestAutoReplayKeepsTheResetWhenABatchOutlivesItsWait: another relay's
// batch added its entries to the stream and has not committed when the
// stream is lost, and its transaction outlives the automatic replay's wait
// (a COMMIT that waits for a synchronous standby stays in progress on the
// server, whatever the relay's deadline: its client gave up). The replay
// cannot see its rows; it used to go on silently and mark the reset
// replayed, and the batch's events, committed a moment later, were in
// neither stream with nothing left to say so. The reset now stays pending,
// with an error, for a replay by hand once that transaction has ended.
func TestAutoReplayKeepsTheResetWhenABatchOutlivesItsWait(t *testing.T) {
	t.Parallel()
	b := resettableBundle(t)
	ctx := context.Background()
	var logs syncbuf.Buffer
	var paused atomic.Bool
	a := b.newRelay(t, Config{BatchSize: 10, InFlight: 1, PublishTimeout: 200 * time.Millisecond, AutoReplay: true,
		StreamCheckInterval: 50 * time.Millisecond, Logger: newTestLogger(&logs)})
	a.testHookBeforeClaim = func() {
		for paused.Load() {
			time.Sleep(5 * time.Millisecond)
		}
	}
	stopA := runInBackground(t, a)
	ids := b.insert(t, 10)
	waitFor(t, "A drained", func() bool { return b.backlog(t) == 0 && b.streamLen(t) >= 10 })
	paused.Store(true)
	time.Sleep(300 * time.Millisecond)

	// The other relay's batch: claimed and marked, its entries added, not
	// committed.
	idsB := b.insert(t, 10)
	tx := b.beginLong(t)
	events, err := b.table.Claim(ctx, tx, outbox.MarkDispatched, outbox.Rows(10))
	require.NoError(t, err)
	require.Len(t, events, 10)
	for _, e := range events {
		require.NoError(t, b.rdb.XAdd(ctx, &redis.XAddArgs{Stream: b.stream,
			Values: []any{FieldEventID, e.ID, FieldEventType, e.Type, FieldPayload, e.Payload}}).Err())
	}
	require.NoError(t, b.rdb.FlushAll(ctx).Err()) // its entries go with the rest
	waitFor(t, "A recorded the reset", func() bool { return b.pendingResets(t).Count >= 1 })
	waitFor(t, "A's automatic replay ended", func() bool {
		return strings.Contains(logs.String(), "Replayed the window of a stream reset") ||
			strings.Contains(logs.String(), "Automatic replay of a stream reset failed")
	})
	require.NoError(t, tx.Commit(ctx)) // the batch ends at last
	paused.Store(false)
	require.NoError(t, stopA())

	if p := b.pendingResets(t); p.Count == 0 {
		// Marked replayed: then every event must be in the stream.
		requireAtLeastOnce(t, b.readStream(t, b.stream), append(ids, idsB...))
	}
	require.Contains(t, logs.String(), "had not ended")
}

// TestReplayKeepsTheResetsWhenItsInFlightWaitEnds: `relay replay` run
// while a relay's batch that added its entries to the lost stream has not
// committed, and the batch outlives --in-flight-wait. The replay's read
// does not see the batch's rows, so it must not mark the reset replayed:
// the reset stays pending (StreamIntact False, cleanup's hold, --pending),
// as the automatic replay does in that case. Before, it warned
// (stillRunning) but marked the reset replayed, and the batch's events,
// never republished, were lost with the condition True and --pending
// finding nothing.
func TestReplayKeepsTheResetsWhenItsInFlightWaitEnds(t *testing.T) {
	t.Parallel()
	b := waitingReplayBundle(t)
	ctx := context.Background()
	relay := b.newRelay(t, Config{BatchSize: 10, InFlight: 1, StreamCheckInterval: time.Hour})
	ids := b.insert(t, 10)
	var res ReplayResult
	relay.testHookBeforeCommit = func(context.Context) error {
		// The batch's entries are in the stream; Redis loses it, a relay
		// records the reset, and a person replays at once, while this
		// batch has not committed (a COMMIT waiting for a standby, say).
		require.NoError(t, b.rdb.FlushAll(ctx).Err())
		_, err := b.table.RecordStreamReset(ctx, b.db, outbox.StreamReset{Stream: b.stream,
			WindowStart: time.Now().Add(-time.Minute), WindowEnd: time.Now(), Reason: "test: the stream is missing"}, time.Now())
		require.NoError(t, err)
		res, err = Replay(ctx, b.table, b.db, b.rdb, ReplayOptions{Stream: b.stream,
			Since: time.Now().Add(-time.Hour), Until: time.Now().Add(time.Hour), InFlightWait: 300 * time.Millisecond})
		require.NoError(t, err)
		return nil // then the batch commits
	}
	claimed, err := relay.runOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 10, claimed.claimed)
	require.Contains(t, res.StillRunning, "had not ended after 300ms")
	require.Zero(t, res.Republished, "the batch's rows were not committed yet")
	require.Zero(t, res.ResetsReplayed, "a replay that did not see the batch's rows must not mark the reset replayed")
	require.NotEmpty(t, res.ResetsKept)
	p := b.pendingResets(t)
	require.EqualValues(t, 1, p.Count, "the reset stays pending")

	// Once the batch has ended, --pending republishes its rows and ends the reset.
	since, until := ReplayWindow(*p.WindowStart, *p.WindowEnd, false)
	res, err = Replay(ctx, b.table, b.db, b.rdb, ReplayOptions{Stream: b.stream, Since: since, Until: until,
		InFlightWait: 30 * time.Second})
	require.NoError(t, err)
	require.Empty(t, res.StillRunning)
	require.EqualValues(t, 1, res.ResetsReplayed)
	requireAtLeastOnce(t, b.readStream(t, b.stream), ids)
}

// TestReplayOfExactlyTheRecordedWindowCoversItsEnd: a reset's window
// [start, end] includes its end (ReplayWindow adds a second), and a
// replay reads the rows dispatched in [since, until), until excluded. A
// person who replays exactly the recorded window (copied from `relay
// backlog -o json`) reads no row dispatched at its end; such a replay must
// not mark the reset replayed. Before, the mark took window_end <= until
// and ended the reset without that row's event.
func TestReplayOfExactlyTheRecordedWindowCoversItsEnd(t *testing.T) {
	t.Parallel()
	b := resettableBundle(t)
	ctx := context.Background()
	relay := b.newRelay(t, Config{BatchSize: 10, InFlight: 1, StreamCheckInterval: time.Hour})
	ids := b.insert(t, 3)
	claimed, err := relay.runOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 3, claimed.claimed)
	require.NoError(t, b.rdb.Del(ctx, b.stream).Err())
	rec, err := b.table.RecordStreamReset(ctx, b.db, outbox.StreamReset{Stream: b.stream,
		WindowStart: time.Now().Add(-time.Minute), WindowEnd: time.Now(), Reason: "test: the stream is missing"}, time.Now())
	require.NoError(t, err)
	// A batch whose transaction began as the record's did, to the microsecond.
	_, err = b.db.Exec(ctx, `UPDATE `+b.table.String()+` SET dispatched_at = $1 WHERE id::text = $2`, rec.WindowEnd, ids[2])
	require.NoError(t, err)
	p := b.pendingResets(t)
	res, err := Replay(ctx, b.table, b.db, b.rdb, ReplayOptions{Stream: b.stream, Since: *p.WindowStart, Until: *p.WindowEnd})
	require.NoError(t, err)
	require.EqualValues(t, 2, res.Republished)
	require.Zero(t, res.ResetsReplayed, "the row dispatched at the window's end was not republished")
	require.EqualValues(t, 1, b.pendingResets(t).Count)
}
