package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outbox-dev/outbox-operator/internal/outbox"
	"github.com/outbox-dev/outbox-operator/internal/testenv"
)

// TestDoctor runs the binary against a real PostgreSQL and real Redis
// servers: a healthy setup passes (exit 0), an evicting Redis fails (exit
// 1), and nothing prints the passwords.
func TestDoctor(t *testing.T) {
	t.Parallel()
	dsn, db := freshDB(t)
	requireSuccess(t, relayEnv("DATABASE_URL="+dsn), "schema", "--apply")

	durable := testenv.StartRedis(t, testenv.WithAppendOnly(), testenv.WithRedisArgs("--requirepass", canary))
	url := "redis://:" + canary + "@" + durable.Addr() + "/0"
	res := requireSuccess(t, relayEnv("DATABASE_URL="+dsn, "REDIS_URL="+url), "doctor", "--stream", "jobs")
	for _, want := range []string{
		"ok    outbox.table", "ok    outbox.index", "ok    outbox.privileges", "ok    redis.persistence", "ok    redis.eviction",
		"ok    redis.stream-check", "ok    outbox.relays",
	} {
		require.Contains(t, res.stdout, want)
	}
	require.Len(t, strings.Split(strings.TrimSpace(res.stdout), "\n"), 21, res.stdout)

	// A relay of another stream registered in outbox_events_relays and
	// seen just now: one relay per table fails, naming it and the fix.
	_, err := outbox.MustNew("outbox_events", outbox.Columns{}).RecordRelay(t.Context(), db, outbox.TableRelay{Stream: "audit"})
	require.NoError(t, err)
	res = execRelay(t, relayEnv("DATABASE_URL="+dsn), "doctor", "--skip-redis", "--stream", "jobs")
	require.Equal(t, 1, res.code, res.stdout+res.stderr)
	require.Regexp(t, `fail\s+outbox.relays\s+relays of other streams or sources than this one, stream jobs \(source Polling\), `+
		`relay table outbox_events: stream audit \(source Polling\), last seen `, res.stdout)
	require.Contains(t, res.stdout, "DELETE FROM outbox_events_relays WHERE stream = 'audit' AND slot = '';")
	requireSuccess(t, relayEnv("DATABASE_URL="+dsn), "doctor", "--skip-redis", "--stream", "audit")
	_, err = db.Exec(t.Context(), `DELETE FROM outbox_events_relays WHERE stream = 'audit' AND slot = ''`)
	require.NoError(t, err)

	// With --slot, the replication checks too: the test server streams
	// (wal_level logical, a superuser) without a bound on retained WAL.
	res = requireSuccess(t, relayEnv("DATABASE_URL="+dsn), "doctor", "--skip-redis", "--slot", "orders_relay")
	require.Regexp(t, `ok\s+replication.wal_level`, res.stdout)
	require.Regexp(t, `warn\s+replication.max_slot_wal_keep_size\s+max_slot_wal_keep_size is unset`, res.stdout)
	require.Regexp(t, `info\s+replication.slot\s+slot orders_relay does not exist yet`, res.stdout)

	evicting := testenv.StartRedis(t, testenv.WithRedisArgs("--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru"))
	res = execRelay(t, relayEnv("DATABASE_URL="+dsn, "REDIS_URL="+evicting.URL()), "doctor", "--output", "json", "--skip-postgres")
	require.Equal(t, 1, res.code, res.stderr)
	var report struct {
		OK     bool `json:"ok"`
		Checks []struct {
			Name, Status, Reason, Message, Fix string
		} `json:"checks"`
	}
	require.NoError(t, json.Unmarshal([]byte(res.stdout), &report), res.stdout)
	require.False(t, report.OK)
	byName := map[string]string{}
	for _, c := range report.Checks {
		byName[c.Name] = c.Status + " " + c.Reason
	}
	require.Equal(t, "fail RedisEvictionUnsafe", byName["redis.eviction"])
	require.Equal(t, "fail RedisPersistenceOff", byName["redis.persistence"])
	require.NotContains(t, byName, "postgres.connection")

	// A wrong password and an unreachable database are lines of the
	// report, without the secrets.
	res = execRelay(t, relayEnv("DATABASE_URL="+closedDSN(t), "REDIS_URL=redis://:"+canary+"x@"+durable.Addr()+"/0"),
		"doctor", "--timeout", "20s")
	require.Equal(t, 1, res.code)
	require.Regexp(t, `fail\s+postgres.connection`, res.stdout)
	require.Regexp(t, `fail\s+redis.connection\s+Redis refused the credentials`, res.stdout)
	require.NotContains(t, res.stdout+res.stderr, canary)
}

// TestRunChecksRedisDurability: `relay run` runs the Redis durability
// checks at start and every --redis-check-interval, logs a warning and
// exports the gauge, and relays all the same.
func TestRunChecksRedisDurability(t *testing.T) {
	t.Parallel()
	dsn, db := freshDB(t)
	requireSuccess(t, relayEnv("DATABASE_URL="+dsn), "schema", "--apply")
	srv := testenv.StartRedis(t, testenv.WithRedisArgs("--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru"))
	stream := testenv.Name(t)
	r := startRun(t, relayEnv("DATABASE_URL="+dsn, "REDIS_URL="+srv.URL()), "--stream", stream, "--redis-check-interval", "1s")
	waitUntil(t, r.relayProc, "the eviction gauge at 2", func() bool {
		v, ok := r.metric(t, `outbox_relay_redis_check{check="eviction"}`)
		return ok && v == 2
	})
	v, ok := r.metric(t, `outbox_relay_redis_check{check="persistence"}`)
	require.True(t, ok)
	require.Equal(t, 2.0, v)
	v, _ = r.metric(t, `outbox_relay_redis_check{check="connection"}`)
	require.Equal(t, 0.0, v)
	line, ok := findLog(r.stderr.String(), "Redis durability check did not pass")
	require.True(t, ok, r.stderr.String())
	require.Equal(t, "WARN", line["level"])

	// The relay relays all the same.
	ids := insertEvents(t, db, 10)
	rdb := redisClient(t, srv.URL())
	waitUntil(t, r.relayProc, "the events in the stream", func() bool { return streamLen(rdb, stream) == int64(len(ids)) })

	// Fixed: the gauge follows at the next run.
	require.NoError(t, rdb.ConfigSet(t.Context(), "maxmemory-policy", "noeviction").Err())
	waitUntil(t, r.relayProc, "the eviction gauge at 0", func() bool {
		v, ok := r.metric(t, `outbox_relay_redis_check{check="eviction"}`)
		return ok && v == 0
	})
}
