package relay

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/outbox-dev/outbox-operator/internal/outbox"
	"github.com/outbox-dev/outbox-operator/internal/redisconn"
	"github.com/outbox-dev/outbox-operator/internal/testenv"
)

// startReplica starts a replica of primary and waits until the primary
// sees it online.
func startReplica(t *testing.T, primary *testenv.RedisServer, rdb *redis.Client) *testenv.RedisServer {
	t.Helper()
	replica := testenv.StartRedis(t, testenv.WithRedisArgs("--replicaof", "127.0.0.1", strconv.Itoa(primary.Port())))
	waitReplicas(t, rdb, 1)
	return replica
}

func waitReplicas(t *testing.T, rdb *redis.Client, n int) {
	t.Helper()
	waitFor(t, strconv.Itoa(n)+" replicas online", func() bool {
		info, err := rdb.Info(context.Background(), "replication").Result()
		return err == nil && strings.Count(info, "state=online") == n
	})
}

// TestWaitReplicas: with WaitReplicas 1, batches commit while the replica
// acknowledges them; with the replica stopped, no batch commits (the rows
// stay pending, errors of kind redis_replicas), and once it is back the
// outbox drains, nothing lost.
func TestWaitReplicas(t *testing.T) {
	t.Parallel()
	primary := testenv.StartRedis(t)
	b := setup(t, bundleOpts{redisURL: primary.URL()})
	replica := startReplica(t, primary, b.rdb)
	r := b.newRelay(t, Config{BatchSize: 10, InFlight: 1, WaitReplicas: 1, WaitTimeout: 2 * time.Second})
	ctx := context.Background()

	ids := b.insert(t, 25)
	b.drain(t, r)
	require.Zero(t, b.backlog(t))

	replica.Stop(t)
	waitReplicas(t, b.rdb, 0)
	more := b.insert(t, 5)
	_, err := r.runOnce(ctx)
	require.Error(t, err)
	require.Equal(t, ErrorKindRedisReplicas, errorKind(err))
	require.Contains(t, err.Error(), "0 of 1 replicas")
	require.Equal(t, int64(5), b.backlog(t), "nothing committed without the replica")

	replica.Start(t)
	waitReplicas(t, b.rdb, 1)
	b.drain(t, r)
	require.Zero(t, b.backlog(t))
	requireAtLeastOnce(t, b.readStream(t, b.stream), append(ids, more...))

	_, err = New(Config{Table: b.table, WaitReplicas: 1, WaitTimeout: time.Second, PublishTimeout: time.Second}, b.db, b.rdb)
	require.ErrorContains(t, err, "wait timeout 1s must be below the publish timeout 1s")
}

// clusterWithReplicas starts a Redis Cluster of three masters with a
// replica each and a bundle whose relay client is a cluster client, as
// `relay run` builds it.
func clusterWithReplicas(t *testing.T) (*testenv.RedisCluster, *testBundle, redis.UniversalClient) {
	t.Helper()
	c := testenv.StartRedisClusterWithReplicas(t, 3, 1)
	b := setup(t, bundleOpts{})
	rdb := deploymentClient(t, c.URL(), redisconn.Options{})
	_, ok := rdb.(*redis.ClusterClient)
	require.True(t, ok)
	return c, b, rdb
}

// insertOversized writes one event whose payload is over 200 bytes.
func (b *testBundle) insertOversized(t *testing.T) {
	t.Helper()
	_, err := b.db.Exec(context.Background(), `INSERT INTO outbox_events (event_type, payload)
		VALUES ('too_big', '{"pad":"' || repeat('x', 300) || '"}')`)
	require.NoError(t, err)
}

// TestWaitReplicasOnRedisCluster: on a Redis Cluster, WAIT must run on the
// connection that wrote the batch, to the master of the stream's slot (of
// the dead-letter stream's slot for parked rows). While the replica of that
// master is frozen no batch commits, though the other masters' replicas
// answer WAIT at once; once it is thawed everything is published.
func TestWaitReplicasOnRedisCluster(t *testing.T) {
	t.Parallel()
	c, b, rdb := clusterWithReplicas(t)
	r := b.deploymentRelay(t, rdb, Config{BatchSize: 5, InFlight: 1, MaxPayloadBytes: 200,
		WaitReplicas: 1, WaitTimeout: 300 * time.Millisecond})
	ctx := context.Background()

	ids := b.insert(t, 10)
	// A replica slower than WaitTimeout (a loaded machine) fails a pass
	// here: allowed, as every pass after the thaws below.
	waitPassed(t, r, func() bool { return b.backlog(t) == 0 })

	// The stream's replica cannot acknowledge: nothing commits. Every
	// pass runs one batch (InFlight 1); a WAIT sent to another master
	// would let some of them through.
	streamReplica := c.Replicas[c.MasterOf(t, b.stream)][0]
	streamReplica.Freeze(t)
	more := b.insert(t, 30)
	for range 12 {
		_, err := r.runOnce(ctx)
		require.Error(t, err, "a batch committed while the replica of the stream's master could not acknowledge it")
		require.Equal(t, ErrorKindRedisReplicas, errorKind(err), "%v", err)
		require.Equal(t, int64(30), b.backlog(t), "nothing committed without the replica")
	}
	streamReplica.Thaw(t)
	waitPassed(t, r, func() bool { return b.backlog(t) == 0 })
	requireAtLeastOnce(t, streamEntries(t, rdb, b.stream), append(ids, more...))

	// The same for a parked row and the dead-letter stream's replica (the
	// dead-letter stream may hash to another master).
	dead := b.stream + ".dead"
	deadReplica := c.Replicas[c.MasterOf(t, dead)][0]
	deadReplica.Freeze(t)
	b.insertOversized(t)
	for range 6 {
		_, err := r.runOnce(ctx)
		require.Error(t, err, "a parked row committed while the replica of the dead-letter stream's master could not acknowledge it")
		require.Equal(t, ErrorKindRedisReplicas, errorKind(err), "%v", err)
		require.Equal(t, int64(1), b.backlog(t))
		require.Empty(t, b.deadLetters(t))
	}
	deadReplica.Thaw(t)
	waitPassed(t, r, func() bool { return b.backlog(t) == 0 })
	require.Len(t, b.deadLetters(t), 1)
	require.NotEmpty(t, streamEntries(t, rdb, dead))
}

// waitPassed runs passes of r until done, allowing failed passes.
func waitPassed(t *testing.T, r *Relay, done func() bool) {
	t.Helper()
	waitFor(t, "the relay to catch up", func() bool {
		_, _ = r.runOnce(context.Background())
		return done()
	})
}

// TestWaitReplicasOnRedisClusterFencedReplayRetry: the fenced script of the
// ordered relays, `relay replay` and `relay dead-letters retry` wait for the
// replica of the stream's master too, on a Redis Cluster (the stream is
// hash-tagged so that its fence lives in its slot).
func TestWaitReplicasOnRedisClusterFencedReplayRetry(t *testing.T) {
	t.Parallel()
	c, b, rdb := clusterWithReplicas(t)
	b.stream = "{" + b.stream + "}"
	replica := c.Replicas[c.MasterOf(t, b.stream)][0]
	ctx := context.Background()
	wait := 300 * time.Millisecond

	// Rows to replay, and one parked row to retry, published without
	// waiting while every replica is up.
	ids := b.insert(t, 20)
	b.insertOversized(t)
	plain := b.deploymentRelay(t, rdb, Config{BatchSize: 50, MaxPayloadBytes: 200})
	b.drain(t, plain)
	require.Len(t, b.deadLetters(t), 1)

	fenced := &ownership{r: b.deploymentRelay(t, rdb, Config{Ordering: OrderingStrict,
		WaitReplicas: 1, WaitTimeout: wait})}
	p0 := []outbox.Event{{ID: "fenced", Type: "t", Payload: "p", Partition: 0}}
	replay := func() error {
		_, err := Replay(ctx, b.table, b.db, rdb, ReplayOptions{Stream: b.stream, Since: time.Now().Add(-time.Hour),
			Until: time.Now().Add(time.Minute), WaitReplicas: 1, WaitTimeout: wait})
		return err
	}
	retry := func() error {
		_, err := Retry(ctx, b.table, b.db, rdb, RetryOptions{Filter: outbox.DeadLetterFilter{}, WaitReplicas: 1, WaitTimeout: wait})
		return err
	}

	replica.Freeze(t)
	for range 6 {
		var re *replicasError
		require.ErrorAs(t, fenced.publishFenced(ctx, 1, p0, []string{""}), &re, "fenced publish")
		err := replay()
		require.Error(t, err, "replay")
		require.Equal(t, ErrorKindRedisReplicas, errorKind(err), "%v", err)
		err = retry()
		require.Error(t, err, "dead-letters retry")
		require.Equal(t, ErrorKindRedisReplicas, errorKind(err), "%v", err)
		require.Len(t, b.deadLetters(t), 1, "the parked row stays until a replica has it")
	}
	replica.Thaw(t)
	waitFor(t, "the fenced publish", func() bool { return fenced.publishFenced(ctx, 1, p0, []string{""}) == nil })
	waitFor(t, "the replay", func() bool { return replay() == nil })
	require.NoError(t, retry())
	require.Empty(t, b.deadLetters(t))

	entries := streamEntries(t, rdb, b.stream)
	requireAtLeastOnce(t, entries, append(ids, "fenced"))
	types := map[string]int{}
	for _, e := range entries {
		types[e[FieldEventType]]++
	}
	require.Positive(t, types["too_big"], "the retried row is in the stream")
}
