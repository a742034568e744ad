package relay

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/outbox-dev/outbox-operator/internal/redisconn"
	"github.com/outbox-dev/outbox-operator/internal/syncbuf"
	"github.com/outbox-dev/outbox-operator/internal/testenv"
)

// Tests of the relay against real Redis deployments: TLS with a private CA,
// an ACL user, a sentinel set (with a failover during a drain) and a
// cluster, each made of redis-server processes on loopback.

// deploymentClient builds the client as `relay run` does (redisconn).
func deploymentClient(t *testing.T, url string, o redisconn.Options) redis.UniversalClient {
	t.Helper()
	o.DialTimeout = max(o.DialTimeout, time.Second)
	o.ReadTimeout, o.WriteTimeout = 3*time.Second, 3*time.Second
	rdb, _, err := redisconn.New(url, o)
	require.NoError(t, err)
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// deploymentRelay builds a relay of b on another Redis client.
func (b *testBundle) deploymentRelay(t *testing.T, rdb redis.UniversalClient, cfg Config) *Relay {
	t.Helper()
	cfg.Table, cfg.Stream = b.table, b.stream
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	cfg.MinBackoff, cfg.MaxBackoff = 10*time.Millisecond, 200*time.Millisecond
	cfg.PollInterval = 20 * time.Millisecond
	cfg.PublishTimeout = 3 * time.Second
	r, err := New(cfg, b.db, rdb)
	require.NoError(t, err)
	return r
}

// streamIDs reads every event id of the stream through rdb.
func streamEntries(t *testing.T, rdb redis.UniversalClient, stream string) []entry {
	t.Helper()
	msgs, err := rdb.XRange(context.Background(), stream, "-", "+").Result()
	require.NoError(t, err)
	out := make([]entry, len(msgs))
	for i, m := range msgs {
		e := entry{}
		for k, v := range m.Values {
			e[k] = v.(string)
		}
		out[i] = e
	}
	return out
}

func waitDrained(t *testing.T, b *testBundle) {
	t.Helper()
	require.Eventually(t, func() bool { return b.backlog(t) == 0 }, 60*time.Second, 50*time.Millisecond)
}

func TestRelayOverTLSWithCA(t *testing.T) {
	t.Parallel()
	files := testenv.NewTestCA(t)
	srv := testenv.StartRedis(t, testenv.WithTLS(files))
	require.True(t, strings.HasPrefix(srv.URL(), "rediss://"))
	b := setup(t, bundleOpts{})

	// Without the CA the server's certificate is not trusted.
	untrusted := deploymentClient(t, srv.URL(), redisconn.Options{})
	err := untrusted.Ping(context.Background()).Err()
	require.Error(t, err)
	require.Contains(t, err.Error(), "certificate")
	// Nor does a plain connection to the TLS port work.
	plain := deploymentClient(t, strings.Replace(srv.URL(), "rediss://", "redis://", 1), redisconn.Options{})
	require.Error(t, plain.Ping(context.Background()).Err())

	rdb := deploymentClient(t, srv.URL(), redisconn.Options{CAFile: files.CAFile})
	ids := b.insert(t, 50)
	r := b.deploymentRelay(t, rdb, Config{})
	stop := runInBackground(t, r)
	waitDrained(t, b)
	require.NoError(t, stop())
	requireEachOnce(t, streamEntries(t, rdb, b.stream), ids)
}

// minimalACL is the ACL of the relay's user in docs/relay.md: only its two
// streams, and only the commands `relay run` sends.
func minimalACL(user, password, stream string) []string {
	return []string{"--user", "default", "off",
		"--user", user, "on", ">" + password, "~" + stream, "~" + stream + ".dead", "resetchannels", "-@all",
		"+ping", "+hello", "+auth", "+client|setname", "+select",
		"+xadd", "+xinfo|stream", "+xinfo|groups", "+xrange", "+xlen", "+exists", "+wait", "+xtrim",
		"+xpending", "+time", "+evalsha", "+eval",
		"+info", "+config|get", "+type"}
}

func TestRelayWithACLUser(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	// And a consumer's user, for the groups.
	srv := testenv.StartRedis(t, testenv.WithRedisArgs(append(minimalACL("relay", "relay-pw", b.stream),
		"--user", "worker", "on", ">worker-pw", "~*", "+@all")...))
	url := "redis://relay:relay-pw@" + srv.Addr() + "/0"
	rdb := deploymentClient(t, url, redisconn.Options{})

	// The user may write its stream, and nothing else.
	ctx := context.Background()
	require.ErrorContains(t, rdb.Set(ctx, b.stream, "x", 0).Err(), "NOPERM")
	require.ErrorContains(t, rdb.XAdd(ctx, &redis.XAddArgs{Stream: "other", Values: []string{"a", "b"}}).Err(), "NOPERM")
	require.ErrorContains(t, rdb.FlushAll(ctx).Err(), "NOPERM")
	wrong := deploymentClient(t, "redis://relay:nope@"+srv.Addr()+"/0", redisconn.Options{})
	require.ErrorContains(t, wrong.Ping(ctx).Err(), "WRONGPASS")

	ids := b.insert(t, 50)
	r := b.deploymentRelay(t, rdb, Config{})
	stop := runInBackground(t, r)
	waitDrained(t, b)
	require.NoError(t, r.Ready())
	require.NoError(t, stop())
	requireEachOnce(t, streamEntries(t, rdb, b.stream), ids)

	// Trimming, by length and age, with a group that read everything and
	// one entry pending: the user may run all of it.
	admin := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: "worker", Password: "worker-pw"})
	t.Cleanup(func() { _ = admin.Close() })
	require.NoError(t, admin.XGroupCreate(ctx, b.stream, "workers", "0").Err())
	read, err := admin.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "workers", Consumer: "c", Streams: []string{b.stream, ">"}}).Result()
	require.NoError(t, err)
	for _, m := range read[0].Messages[1:] {
		require.NoError(t, admin.XAck(ctx, b.stream, "workers", m.ID).Err())
	}
	n, bound, err := Trim(ctx, rdb, b.stream, TrimPolicy{MaxLen: 10, MaxAge: time.Hour}, time.Second)
	require.NoError(t, err, "trimming under the documented ACL")
	require.Zero(t, n, "the pending first entry holds the stream")
	require.Equal(t, read[0].Messages[0].ID, bound)

	// Without the script's commands trimming fails, and says so at warn
	// level, the first time and every tenth.
	require.NoError(t, admin.Do(ctx, "ACL", "SETUSER", "relay", "-evalsha", "-eval").Err())
	var logs syncbuf.Buffer
	r = b.deploymentRelay(t, rdb, Config{Logger: newTestLogger(&logs), Trim: TrimPolicy{MaxLen: 10}})
	for range 11 {
		r.trimOnce(ctx)
	}
	require.Equal(t, 2, strings.Count(logs.String(), "level=WARN msg=\"Trimming the stream failed"), logs.String())
	require.Contains(t, logs.String(), "NOPERM")
}

func TestRelayOnRedisCluster(t *testing.T) {
	t.Parallel()
	c := testenv.StartRedisCluster(t, 3)
	b := setup(t, bundleOpts{})
	rdb := deploymentClient(t, c.URL(), redisconn.Options{})
	_, ok := rdb.(*redis.ClusterClient)
	require.True(t, ok)
	ids := b.insert(t, 200)
	r := b.deploymentRelay(t, rdb, Config{})
	stop := runInBackground(t, r)
	waitDrained(t, b)
	require.NoError(t, stop())
	requireEachOnce(t, streamEntries(t, rdb, b.stream), ids)
}

// TestRelaySentinelFailoverDuringDrain: producers keep committing while the
// relay drains through the sentinels and a failover (SENTINEL FAILOVER)
// moves the master; with WaitReplicas 1 every committed event reaches the
// stream on the new master.
func TestRelaySentinelFailoverDuringDrain(t *testing.T) {
	t.Parallel()
	set := testenv.StartSentinelSet(t, testenv.WithAppendOnly())
	b := setup(t, bundleOpts{})
	rdb := deploymentClient(t, set.URL(), redisconn.Options{})
	before := set.MasterAddr(t)

	r := b.deploymentRelay(t, rdb, Config{BatchSize: 50, WaitReplicas: 1, WaitTimeout: time.Second})
	stop := runInBackground(t, r)

	const total = 1500
	var wg sync.WaitGroup
	wg.Go(func() {
		for range total / 10 {
			b.insertBulk(t, 10)
			time.Sleep(5 * time.Millisecond)
		}
	})
	require.Eventually(t, func() bool {
		n, err := rdb.XLen(context.Background(), b.stream).Result()
		return err == nil && n >= total/4
	}, 60*time.Second, 20*time.Millisecond, "the relay publishes before the failover")
	set.Failover(t)
	require.NotEqual(t, before, set.MasterAddr(t))
	wg.Wait()
	waitDrained(t, b)
	require.NoError(t, stop())

	ids := b.allIDs(t)
	require.Len(t, ids, total)
	entries := streamEntries(t, rdb, b.stream)
	dups := requireAtLeastOnce(t, entries, ids)
	t.Logf("failover %s -> %s: %d events committed, %d stream entries, 0 lost, %d duplicates",
		before, set.MasterAddr(t), total, len(entries), dups)
}
