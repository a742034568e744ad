//go:build faults

package faults

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/outbox-dev/outbox-operator/internal/testenv"
)

// TestClusterFailover checks --wait-replicas 1 on a Redis Cluster (three
// masters with a replica each) as processes: producers write while two
// polling relays (`--batch-size 50 --in-flight 2 --wait-timeout 300ms`)
// publish, and
//   - the replica of the stream's master is frozen (SIGSTOP) for 3 s: no
//     batch may commit meanwhile (WAIT must run on the stream master's
//     connection; the other masters' replicas would answer at once), and
//     every row goes through once it is thawed;
//   - then the stream's master is SIGKILLed and its replica promoted
//     (CLUSTER FAILOVER TAKEOVER); the old master is started again and
//     rejoins as the new master's replica, and the relays, never
//     restarted, keep going.
//
// Nothing may be lost: each batch committed (its rows marked or, in
// OnDispatch, deleted) had reached the replica that became the master. The
// stream's name is chosen on another master than the slot of "1", where a
// WAIT routed by its argument would land. Both cleanup modes, in the CI
// slice too.
func TestClusterFailover(t *testing.T) {
	t.Parallel()
	require.True(t, runHelpLists(t, "--wait-replicas"), "this relay has no --wait-replicas")
	forCleanupModes(t, testClusterFailover)
}

func testClusterFailover(t *testing.T, mode cleanupMode) {
	events := sized(6000, 30000)
	rate := sized(400.0, 1000.0) // rows per second
	const batchSize, inFlight = 50, 2
	const frozenFor = 2 * time.Second

	pg := testenv.StartPostgres(t)
	cluster := testenv.StartRedisClusterWithReplicas(t, 3, 1)
	env := relayEnv{databaseURL: pg.DSN(), redisURL: cluster.URL()}
	stream := testenv.Name(t)
	for cluster.MasterOf(t, stream) == cluster.MasterOf(t, "1") {
		stream = testenv.Name(t)
	}
	i := cluster.MasterOf(t, stream)
	master, replica := cluster.Nodes[i], cluster.Replicas[i][0]
	mustRelay(t, env, "schema", "--apply")
	conn := connect(t, pg.DSN())
	args := append([]string{"--stream", stream, "--batch-size", strconv.Itoa(batchSize), "--in-flight", strconv.Itoa(inFlight),
		"--wait-replicas", "1", "--wait-timeout", "300ms", "--publish-timeout", "2s"}, mode.args(t)...)
	relays := []*relayProc{startRelay(t, "A", env, args...), startRelay(t, "B", env, args...)}
	pendingNow := func() int {
		n, err := pending(t.Context(), conn, "outbox_events")
		require.NoError(t, err)
		return n
	}
	// The relays count published events once their batch committed.
	published := func() float64 {
		n := 0.0
		for _, r := range relays {
			n += r.published()
		}
		return n
	}
	start := time.Now()
	// The producers write on past events until the thaw: the freeze must
	// find rows arriving (pending_growth, the WAIT failures), however late
	// the first batch comes on a loaded machine.
	var writing atomic.Bool
	writing.Store(true)
	prod := startProducers(t, producerConfig{
		dsn: pg.DSN(), conns: 4, events: events, rate: rate, insert: insertInto("outbox_events"), more: writing.Load,
	})
	production := time.Duration(float64(events) / rate * float64(time.Second))

	// The freeze. A batch whose WAIT was answered before it commits within
	// milliseconds (and one that waits gives up after 300ms): from a second
	// later (a margin for a loaded machine) nothing may commit until the
	// thaw.
	// The first batch may take longer on a loaded machine (the cluster's
	// replication links, the relays' start): wait for it rather than
	// assert it by a time.
	sleepUntil(t.Context(), start.Add(production/5))
	eventually(t, time.Minute, "a batch published before the freeze", func() error {
		if published() == 0 {
			return fmt.Errorf("nothing published yet")
		}
		return nil
	})
	replicasErrs := func() float64 {
		n := 0.0
		for _, r := range relays {
			n += r.metric(`outbox_relay_errors_total{kind="redis_replicas"}`)
		}
		return n
	}
	errsBefore := replicasErrs()
	replica.Freeze(t)
	time.Sleep(time.Second)
	frozenPublished, frozenPending := published(), pendingNow()
	time.Sleep(frozenFor)
	committedWhileFrozen := published() - frozenPublished
	pendingGrowth := pendingNow() - frozenPending
	waitErrs := replicasErrs() - errsBefore
	replica.Thaw(t)
	writing.Store(false)
	thawed := time.Now()
	eventually(t, time.Minute, "a batch committed after the thaw", func() error {
		if published() <= frozenPublished+committedWhileFrozen {
			return fmt.Errorf("nothing published since the thaw")
		}
		return nil
	})
	afterThaw := time.Since(thawed)

	// The failover, once the replica has caught up again (the relays
	// commit only what it acknowledged).
	sleepUntil(t.Context(), start.Add(production/2))
	master.Kill(t)
	killed := time.Now()
	replicaClient := redis.NewClient(&redis.Options{Addr: replica.Addr(), MaxRetries: -1})
	t.Cleanup(func() { _ = replicaClient.Close() })
	require.NoError(t, replicaClient.Do(t.Context(), "CLUSTER", "FAILOVER", "TAKEOVER").Err())
	eventually(t, time.Minute, "the replica promoted", func() error {
		return roleIs(t.Context(), replicaClient, "master", 0)
	})
	promoted := time.Since(killed)
	publishedAtKill := published()
	master.Start(t)
	eventually(t, time.Minute, "the old master replicating from the new one", func() error {
		return roleIs(t.Context(), replicaClient, "master", 1)
	})
	rejoined := time.Since(killed)
	eventually(t, time.Minute, "the relays publishing after the failover", func() error {
		if published() <= publishedAtKill {
			return fmt.Errorf("nothing published since the failover")
		}
		return nil
	})
	publishingAgain := time.Since(killed)

	prod.wait(t)
	produced := time.Now()
	waitDrained(t, conn, "outbox_events", 2*time.Minute)
	drain := time.Since(produced)
	for _, r := range relays {
		require.False(t, r.exited(), "relay %s exited", r.name)
		r.stop(t, time.Minute)
	}

	requireOutboxAfterDrain(t, conn, "outbox_events", mode, prod.committedCount())
	addrs := make([]string, 0, 2*len(cluster.Nodes))
	for j := range cluster.Nodes {
		addrs = append(addrs, cluster.Nodes[j].Addr(), cluster.Replicas[j][0].Addr())
	}
	crdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	t.Cleanup(func() { _ = crdb.Close() })
	r := checkStream(t, crdb, stream, prod.committed())
	figures(t, r, 2, fmt.Sprintf("frozen=%s committed_while_frozen=%.0f pending_growth_while_frozen=%d "+
		"wait_errors_while_frozen=%.0f published_after_thaw=%s promoted=%s old_master_replica=%s publishing_after_kill=%s drain=%s",
		frozenFor, committedWhileFrozen, pendingGrowth, waitErrs, ms(afterThaw), ms(promoted), ms(rejoined), ms(publishingAgain),
		ms(drain)))
	require.Zero(t, committedWhileFrozen, "events committed while the replica of the stream's master could not acknowledge them")
	require.Positive(t, pendingGrowth, "the producers wrote nothing while the replica was frozen")
	require.Positive(t, waitErrs, "no batch failed for want of a replica while it was frozen")
	require.GreaterOrEqual(t, r.Committed, events)
	require.Zero(t, r.Lost, "lost events, e.g. %v", r.LostIDs)
	require.Zero(t, r.Unexpected, "stream entries no producer committed")
}

// roleIs is nil once the server's INFO replication shows role and, for a
// master, replicas replicas online.
func roleIs(ctx context.Context, rdb *redis.Client, role string, replicas int) error {
	info, err := rdb.Info(ctx, "replication").Result()
	if err != nil {
		return err
	}
	if !strings.Contains(info, "role:"+role) {
		return fmt.Errorf("not %s: %s", role, strings.Join(strings.Fields(info), " "))
	}
	if online := strings.Count(info, "state=online"); role == "master" && online != replicas {
		return fmt.Errorf("%d replicas online, not %d", online, replicas)
	}
	return nil
}
