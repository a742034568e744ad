package testenv_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/outbox-dev/outbox-operator/internal/testenv"
)

// redisDirs lists the temp dirs of this process's Redis servers.
func redisDirs(t *testing.T) map[string]bool {
	t.Helper()
	dirs := map[string]bool{}
	for _, base := range []string{os.TempDir(), "/tmp"} {
		m, err := filepath.Glob(filepath.Join(base, "outbox-testenv-redis-*"))
		require.NoError(t, err)
		for _, d := range m {
			// Only this process's: other test binaries may run meanwhile.
			if pid, err := os.ReadFile(filepath.Join(d, "owner.pid")); err == nil && strings.TrimSpace(string(pid)) == strconv.Itoa(os.Getpid()) {
				dirs[d] = true
			}
		}
	}
	return dirs
}

// TestTopologiesStopInCleanup: a sentinel set and a cluster answer while
// their test runs, and are stopped by pid, their dirs removed, after it.
func TestTopologiesStopInCleanup(t *testing.T) {
	var addrs []string
	before := redisDirs(t)
	t.Run("sentinel set", func(t *testing.T) {
		set := testenv.StartSentinelSet(t)
		require.Contains(t, set.URL(), "redis-sentinel://")
		require.Equal(t, set.Master.Addr(), set.MasterAddr(t))
		addrs = append(addrs, set.Master.URL(), set.Replica.URL())
		for _, s := range set.Sentinels {
			addrs = append(addrs, s.URL())
		}
	})
	t.Run("cluster", func(t *testing.T) {
		c := testenv.StartRedisCluster(t, 3)
		require.True(t, strings.HasPrefix(c.URL(), "redis-cluster://"))
		rc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{c.Nodes[0].Addr()}})
		defer func() { _ = rc.Close() }()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, k := range []string{"a", "b", "c", "d"} {
			require.NoError(t, rc.Set(ctx, k, "v", 0).Err())
		}
		for _, n := range c.Nodes {
			addrs = append(addrs, n.URL())
		}
	})
	t.Run("tls", func(t *testing.T) {
		srv := testenv.StartRedis(t, testenv.WithTLS(testenv.NewTestCA(t)))
		require.True(t, strings.HasPrefix(srv.URL(), "rediss://"))
		addrs = append(addrs, srv.URL())
	})
	require.Len(t, addrs, 9)
	for _, a := range addrs {
		requireRefused(t, strings.Replace(a, "rediss://", "redis://", 1))
	}
	for d := range redisDirs(t) {
		require.True(t, before[d], "dir %s left behind", d)
	}
}

// TestClusterWithReplicas: a cluster with a replica per master replicates a
// write to the replica of its key's master; a frozen replica acknowledges
// nothing (WAIT 1 times out with 0) until thawed; a frozen server is still
// stopped, its dir removed, in the cleanup.
func TestClusterWithReplicas(t *testing.T) {
	var addrs []string
	before := redisDirs(t)
	t.Run("cluster", func(t *testing.T) {
		c := testenv.StartRedisClusterWithReplicas(t, 3, 1)
		require.Len(t, c.Replicas, 3)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		const key = "frozen"
		i := c.MasterOf(t, key)
		master := redis.NewClient(&redis.Options{Addr: c.Nodes[i].Addr()})
		defer func() { _ = master.Close() }()
		require.NoError(t, master.Set(ctx, key, "v", 0).Err())
		require.Equal(t, int64(1), master.Do(ctx, "WAIT", 1, 5000).Val())

		c.Replicas[i][0].Freeze(t)
		require.NoError(t, master.Set(ctx, key, "w", 0).Err())
		require.Equal(t, int64(0), master.Do(ctx, "WAIT", 1, 300).Val())
		c.Replicas[i][0].Thaw(t)
		require.Equal(t, int64(1), master.Do(ctx, "WAIT", 1, 5000).Val())

		c.Replicas[(i+1)%3][0].Freeze(t) // stopped frozen in the cleanup
		for _, n := range c.Nodes {
			addrs = append(addrs, n.URL())
		}
		for _, rs := range c.Replicas {
			require.Len(t, rs, 1)
			addrs = append(addrs, rs[0].URL())
		}
	})
	require.Len(t, addrs, 6)
	for _, a := range addrs {
		requireRefused(t, a)
	}
	for d := range redisDirs(t) {
		require.True(t, before[d], "dir %s left behind", d)
	}
}
