package relay

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

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
