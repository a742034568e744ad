package relay

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/outbox-dev/outbox-operator/internal/testenv"
)

// addEntries adds n entries to stream and returns their ids.
func addEntries(t *testing.T, rdb *redis.Client, stream string, n int) []string {
	t.Helper()
	ids := make([]string, n)
	for i := range n {
		id, err := rdb.XAdd(context.Background(), &redis.XAddArgs{Stream: stream, Values: []any{"n", strconv.Itoa(i)}}).Result()
		require.NoError(t, err)
		ids[i] = id
	}
	return ids
}

func firstID(t *testing.T, rdb *redis.Client, stream string) string {
	t.Helper()
	m, err := rdb.XRangeN(context.Background(), stream, "-", "+", 1).Result()
	require.NoError(t, err)
	require.NotEmpty(t, m)
	return m[0].ID
}

// TestTrimKeepsWhatGroupsNeed: a slow group keeps its unacknowledged and
// undelivered entries, whatever the policy; once it catches up, the stream
// is trimmed to the policy. A stream without groups trims by the policy.
func TestTrimKeepsWhatGroupsNeed(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	ctx := context.Background()
	policy := TrimPolicy{MaxLen: 10}
	ids := addEntries(t, b.rdb, b.stream, 100)
	for _, g := range []string{"fast", "slow"} {
		require.NoError(t, b.rdb.XGroupCreate(ctx, b.stream, g, "0").Err())
	}
	// fast reads and acks everything; slow reads 30 and acks the first 20.
	read := func(group string, count int64) []redis.XMessage {
		s, err := b.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{
			Group: group, Consumer: "c", Streams: []string{b.stream, ">"}, Count: count,
		}).Result()
		require.NoError(t, err)
		return s[0].Messages
	}
	for _, m := range read("fast", 1000) {
		require.NoError(t, b.rdb.XAck(ctx, b.stream, "fast", m.ID).Err())
	}
	for _, m := range read("slow", 30)[:20] {
		require.NoError(t, b.rdb.XAck(ctx, b.stream, "slow", m.ID).Err())
	}

	n, bound, err := Trim(ctx, b.rdb, b.stream, policy, time.Second)
	require.NoError(t, err)
	require.Equal(t, ids[20], bound, "the slow group's oldest pending entry")
	require.Equal(t, int64(20), n)
	require.Equal(t, ids[20], firstID(t, b.rdb, b.stream))

	// slow acks its pending entries: the bound is its last delivered one.
	pend, err := b.rdb.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: b.stream, Group: "slow", Start: "-", End: "+", Count: 100}).Result()
	require.NoError(t, err)
	for _, p := range pend {
		require.NoError(t, b.rdb.XAck(ctx, b.stream, "slow", p.ID).Err())
	}
	_, bound, err = Trim(ctx, b.rdb, b.stream, policy, time.Second)
	require.NoError(t, err)
	require.Equal(t, ids[29], bound, "undelivered entries are kept")

	// slow catches up: the policy decides.
	for _, m := range read("slow", 1000) {
		require.NoError(t, b.rdb.XAck(ctx, b.stream, "slow", m.ID).Err())
	}
	_, _, err = Trim(ctx, b.rdb, b.stream, policy, time.Second)
	require.NoError(t, err)
	l, err := b.rdb.XLen(ctx, b.stream).Result()
	require.NoError(t, err)
	require.Equal(t, int64(10), l)
	require.Equal(t, ids[90], firstID(t, b.rdb, b.stream))

	// A group created at the start holds everything back.
	require.NoError(t, b.rdb.XGroupCreate(ctx, b.stream, "new", "0").Err())
	addEntries(t, b.rdb, b.stream, 5)
	n, _, err = Trim(ctx, b.rdb, b.stream, policy, time.Second)
	require.NoError(t, err)
	require.Zero(t, n)
}

// TestTrimRacingANewGroup: a group is created at "0" (a new consumer
// reading the stream from its start) after the trim read the groups and
// before it trimmed. The trim read the groups, then ran XTRIM with the
// bound they gave: the new group lost 90 entries it had never been
// delivered. The groups are read in the script that trims now.
func TestTrimRacingANewGroup(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	ctx := context.Background()
	addEntries(t, b.rdb, b.stream, 100)
	b.ackAll(t, "fast")
	b.rdb.AddHook(&beforeFirst{cmds: trimCommands, fn: func() {
		require.NoError(t, b.rdb.XGroupCreate(ctx, b.stream, "late", "0").Err())
	}})
	n, _, err := Trim(ctx, b.rdb, b.stream, TrimPolicy{MaxLen: 10}, time.Second)
	require.NoError(t, err)
	require.Zero(t, n, "entries trimmed that the group created at 0 was never delivered")
	require.EqualValues(t, 100, b.streamLen(t))
}

// TestTrimRacingAResetKeepsTheNewStream: Redis loses the stream after the
// trim read the policy's bound and before it trimmed; the stream's ids ran
// ahead of the clock (an entry added with an id ten minutes ahead), so the
// entries the relays add to the new stream, numbered from Redis's clock,
// lie below that bound. The trim ran XTRIM with it on the new stream, which
// has no group yet: every new entry gone before any consumer read it.
func TestTrimRacingAResetKeepsTheNewStream(t *testing.T) {
	t.Parallel()
	rs := testenv.StartRedis(t) // FLUSHALL: a server of its own
	b := setup(t, bundleOpts{redisURL: rs.URL()})
	ctx := context.Background()
	ahead := strconv.FormatInt(time.Now().Add(10*time.Minute).UnixMilli(), 10)
	for _, seq := range []string{"-0", "-1"} {
		require.NoError(t, b.rdb.XAdd(ctx, &redis.XAddArgs{Stream: b.stream, ID: ahead + seq, Values: []any{"n", "ahead"}}).Err())
	}
	b.ackAll(t, "g1")
	b.rdb.AddHook(&beforeFirst{cmds: trimCommands, fn: func() {
		require.NoError(t, b.rdb.FlushAll(ctx).Err())
		addEntries(t, b.rdb, b.stream, 5)
	}})
	_, _, err := Trim(ctx, b.rdb, b.stream, TrimPolicy{MaxLen: 1}, time.Second)
	require.ErrorIs(t, err, ErrNoConsumerGroup)
	require.EqualValues(t, 5, b.streamLen(t), "entries of the new stream trimmed")
}

// trimCommands are the commands that trim: XTRIM, or the script (EVALSHA,
// EVAL) that reads the groups and trims.
var trimCommands = []string{"xtrim", "evalsha", "eval"}

// TestTrimWithoutGroups: a stream without consumer groups is not trimmed,
// whatever the policy: after a stream reset (the groups go with the key)
// the replayed entries and the backlog land there before the consumers
// create their groups again at 0, and trimming them by the policy alone
// lost them (a review's reproduction: 90 of 140 events). Once a group has
// read everything, the policy applies.
func TestTrimWithoutGroups(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	ctx := context.Background()
	ids := addEntries(t, b.rdb, b.stream, 50)
	n, _, err := Trim(ctx, b.rdb, b.stream, TrimPolicy{MaxLen: 20, MaxAge: time.Millisecond}, time.Second)
	require.ErrorIs(t, err, ErrNoConsumerGroup)
	require.Zero(t, n)
	require.Equal(t, ids[0], firstID(t, b.rdb, b.stream), "every entry kept")

	require.NoError(t, b.rdb.XGroupCreate(ctx, b.stream, "read-everything", "$").Err())
	n, _, err = Trim(ctx, b.rdb, b.stream, TrimPolicy{MaxLen: 20}, time.Second)
	require.NoError(t, err)
	require.Equal(t, int64(30), n)
	require.Equal(t, ids[30], firstID(t, b.rdb, b.stream))

	// By age: entries older than the bound go, newer ones stay (the group
	// has been delivered them).
	time.Sleep(30 * time.Millisecond)
	fresh := addEntries(t, b.rdb, b.stream, 3)
	require.NoError(t, b.rdb.XGroupSetID(ctx, b.stream, "read-everything", "$").Err())
	n, _, err = Trim(ctx, b.rdb, b.stream, TrimPolicy{MaxAge: 20 * time.Millisecond}, time.Second)
	require.NoError(t, err)
	require.Equal(t, int64(20), n)
	require.Equal(t, fresh[0], firstID(t, b.rdb, b.stream))

	// A missing stream has no group either; no policy: nothing to do.
	n, _, err = Trim(ctx, b.rdb, b.stream+"-missing", TrimPolicy{MaxLen: 1, MaxAge: time.Second}, time.Second)
	require.ErrorIs(t, err, ErrNoConsumerGroup)
	require.Zero(t, n)
	n, _, err = Trim(ctx, b.rdb, b.stream, TrimPolicy{}, time.Second)
	require.NoError(t, err)
	require.Zero(t, n)
}

// TestRelayTrims: the relay's watch loop trims its stream and counts it.
func TestRelayTrims(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	r := b.newRelay(t, Config{BatchSize: 50, Trim: TrimPolicy{MaxLen: 25, Interval: 20 * time.Millisecond}})
	runInBackground(t, r)
	b.insertBulk(t, 200)
	waitFor(t, "drained", func() bool { return b.backlog(t) == 0 && b.streamLen(t) == 200 })
	require.Zero(t, testutilCounter(r.cfg.Metrics.stream.Trimmed), "no group yet: not trimmed")
	require.NoError(t, b.rdb.XGroupCreate(context.Background(), b.stream, "read-everything", "$").Err())
	waitFor(t, "trimmed", func() bool { return b.streamLen(t) == 25 })
	waitFor(t, "trimmed entries counted", func() bool { return testutilCounter(r.cfg.Metrics.stream.Trimmed) == 175 })
}

// TestTrimWaitsForEveryGroupAResetTook: two consumer groups have read the
// stream when it is lost (FLUSHALL takes the groups with it); the relay
// records the reset with both groups. Once "workers" is back at 0 and has
// read everything, the stream must not be trimmed by its position while
// "audit" is still down: audit, created again at 0, has to find every
// entry. Once both are back the reset stops holding trimming, for good.
func TestTrimWaitsForEveryGroupAResetTook(t *testing.T) {
	t.Parallel()
	rs := testenv.StartRedis(t)
	b := setup(t, bundleOpts{redisURL: rs.URL()})
	ctx := context.Background()
	require.NoError(t, b.table.EnsureStreamResetsTable(ctx, b.db))
	r := b.newRelay(t, Config{BatchSize: 10, Trim: TrimPolicy{MaxLen: 5, Interval: time.Hour}})
	b.insert(t, 20)
	b.drain(t, r)
	for _, g := range []string{"workers", "audit"} {
		require.NoError(t, b.rdb.XGroupCreate(ctx, b.stream, g, "$").Err())
	}
	r.lookAtStream(ctx)

	require.NoError(t, b.rdb.FlushAll(ctx).Err())
	r.lookAtStream(ctx) // no groups left to read, and the reset found
	after := b.insert(t, 20)
	b.drain(t, r)
	require.Equal(t, 1.0, testutilCounter(r.cfg.Metrics.stream.Resets))
	r.trimOnce(ctx) // the reset not recorded yet: no groups at all
	r.recordResets(ctx, true)
	awaited, _, err := b.table.AwaitedGroups(ctx, b.db, b.stream)
	require.NoError(t, err)
	require.ElementsMatch(t, []string{"workers", "audit"}, awaited)

	readAll := func(group string) {
		t.Helper()
		require.NoError(t, b.rdb.XGroupCreate(ctx, b.stream, group, "0").Err())
		s, err := b.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: group, Consumer: "c", Streams: []string{b.stream, ">"}}).Result()
		require.NoError(t, err)
		for _, m := range s[0].Messages {
			require.NoError(t, b.rdb.XAck(ctx, b.stream, group, m.ID).Err())
		}
	}
	readAll("workers")
	r.trimOnce(ctx)
	require.EqualValues(t, 20, b.streamLen(t), "trimmed while audit is away")
	require.Contains(t, r.trimHeld, "are back")

	readAll("audit")
	requireAtLeastOnce(t, b.readStream(t, b.stream), after)
	r.trimOnce(ctx)
	require.EqualValues(t, 5, b.streamLen(t), "both back and done: trimmed to the policy")
	awaited, _, err = b.table.AwaitedGroups(ctx, b.db, b.stream)
	require.NoError(t, err)
	require.Empty(t, awaited, "the reset's groups recorded back")
}
