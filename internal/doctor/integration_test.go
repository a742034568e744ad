package doctor

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/outbox-dev/outbox-operator/internal/outbox"
	"github.com/outbox-dev/outbox-operator/internal/redisconn"
	"github.com/outbox-dev/outbox-operator/internal/testenv"
)

func redisClient(t *testing.T, url string, o redisconn.Options) redis.UniversalClient {
	t.Helper()
	rdb, _, err := redisconn.New(url, o)
	require.NoError(t, err)
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

func byName(r Report) map[string]Check {
	m := map[string]Check{}
	for _, c := range r {
		m[c.Name] = c
	}
	return m
}

func check(t *testing.T, rdb redis.UniversalClient, stream string) map[string]Check {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	target := RedisTarget{Stream: stream, DeadLetterStream: stream + ".dead"}
	r := RedisChecks(GatherRedis(ctx, rdb, target), target)
	for _, c := range r {
		t.Logf("%-5s %-26s %s %s", c.Status, c.Name, c.Message, c.Fix)
	}
	return byName(r)
}

// TestRedisSettings runs the checks against real redis-server processes
// started with the settings they judge.
func TestRedisSettings(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		opts   []testenv.RedisOption
		check  string
		status Status
		reason string
	}{
		{"no persistence", nil, "redis.persistence", Fail, ReasonPersistenceOff},
		{"appendonly always", []testenv.RedisOption{testenv.WithAppendOnly()}, "redis.persistence", OK, ReasonPersistent},
		{"appendfsync no", []testenv.RedisOption{testenv.WithRedisArgs("--appendonly", "yes", "--appendfsync", "no")}, "redis.persistence", Warn, ReasonFsyncLax},
		{"rdb only", []testenv.RedisOption{testenv.WithRedisArgs("--save", "3600 1")}, "redis.persistence", Warn, ReasonPersistenceWeak},
		{"allkeys-lru under maxmemory", []testenv.RedisOption{testenv.WithRedisArgs("--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru")}, "redis.eviction", Fail, ReasonEvictionUnsafe},
		{"noeviction under maxmemory", []testenv.RedisOption{testenv.WithRedisArgs("--maxmemory", "64mb", "--maxmemory-policy", "noeviction")}, "redis.eviction", OK, ReasonEvictionSafe},
		{"CONFIG renamed", []testenv.RedisOption{testenv.WithRedisArgs("--rename-command", "CONFIG", "")}, "redis.persistence", OK, ReasonPersistent},
		{"ACL user without CONFIG nor INFO", []testenv.RedisOption{testenv.WithRedisArgs(
			"--user", "default", "off", "--user", "admin", "on", ">adminpw", "~*", "&*", "+@all",
			"--user", "relay", "on", ">relaypw", "~jobs*", "resetchannels", "-@all", "+ping", "+hello", "+auth", "+type", "+xinfo", "+xadd")},
			"redis.persistence", Warn, ReasonCheckUnknown},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := testenv.StartRedis(t, tc.opts...)
			url := srv.URL()
			if tc.name == "ACL user without CONFIG nor INFO" {
				url = "redis://relay:relaypw@" + srv.Addr() + "/0"
			}
			if tc.name == "CONFIG renamed" {
				// The server was started with appendonly no; INFO alone
				// cannot tell whether RDB snapshots are taken.
				got := check(t, redisClient(t, url, redisconn.Options{}), "jobs")
				require.Equal(t, Warn, got["redis.persistence"].Status)
				require.Equal(t, ReasonCheckUnknown, got["redis.persistence"].Reason)
				require.Contains(t, got["redis.persistence"].Fix, "CONFIG GET")
				require.Equal(t, OK, got["redis.eviction"].Status, "INFO memory tells maxmemory")
				return
			}
			got := check(t, redisClient(t, url, redisconn.Options{}), "jobs")
			c := got[tc.check]
			require.Equal(t, tc.status, c.Status, c.Message)
			require.Equal(t, tc.reason, c.Reason)
		})
	}
}

// TestRedisStreamAndGroups: key types and consumer groups with their lag.
func TestRedisStreamAndGroups(t *testing.T) {
	t.Parallel()
	rdb := redisClient(t, testenv.Redis(t), redisconn.Options{})
	stream := testenv.Name(t)
	ctx := context.Background()
	got := check(t, rdb, stream)
	require.Equal(t, OK, got["redis.stream"].Status)
	require.Contains(t, got["redis.stream"].Message, "does not exist yet")
	require.Equal(t, Info, got["redis.consumer-groups"].Status)

	for range 5 {
		require.NoError(t, rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []string{"k", "v"}}).Err())
	}
	require.NoError(t, rdb.XGroupCreate(ctx, stream, "workers", "0").Err())
	_, err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "workers", Consumer: "c1", Streams: []string{stream, ">"}, Count: 2}).Result()
	require.NoError(t, err)
	require.NoError(t, rdb.Set(ctx, stream+".dead", "oops", 0).Err())

	got = check(t, rdb, stream)
	require.Equal(t, OK, got["redis.stream"].Status)
	require.Equal(t, Fail, got["redis.dead-letter-stream"].Status)
	require.Equal(t, ReasonWrongType, got["redis.dead-letter-stream"].Reason)
	require.Contains(t, got["redis.consumer-groups"].Message, "workers (1 consumers, lag 3, pending 2)")
	require.Equal(t, OK, got["redis.stream-check"].Status, got["redis.stream-check"].Message)
}

// TestRedisStreamCheckRefused: a user that may XADD but not look at the
// stream (no +xinfo|stream, or no +xrange) fails redis.stream-check, on a
// missing stream too: the relay could not see a stream reset.
func TestRedisStreamCheckRefused(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedis(t)
	admin := redisClient(t, srv.URL(), redisconn.Options{})
	ctx := context.Background()
	for user, rule := range map[string]string{"noxinfo": "-xinfo|stream", "noxrange": "-xrange"} {
		require.NoError(t, admin.Do(ctx, "ACL", "SETUSER", user, "on", ">pw", "~*", "&*", "+@all", rule).Err())
		rdb := redisClient(t, "redis://"+user+":pw@"+srv.Addr()+"/0", redisconn.Options{})
		c := check(t, rdb, "jobs")["redis.stream-check"]
		require.Equal(t, Fail, c.Status, "%s: %s", user, c.Message)
		require.Equal(t, ReasonStreamCheckRefused, c.Reason)
		require.Contains(t, c.Message, "NOPERM")
		require.Contains(t, c.Fix, "+xinfo|stream and +xrange")
	}
	require.Equal(t, OK, check(t, admin, "jobs")["redis.stream-check"].Status)
}

// TestRedisReplica: a second redis-server with --replicaof shows as an
// attached replica; pointed at the replica itself, the role check fails.
func TestRedisReplica(t *testing.T) {
	t.Parallel()
	master := testenv.StartRedis(t, testenv.WithAppendOnly())
	replica := testenv.StartRedis(t, testenv.WithRedisArgs("--replicaof", "127.0.0.1", itoa(master.Port())))
	rdb := redisClient(t, master.URL(), redisconn.Options{})
	require.Eventually(t, func() bool {
		return check(t, rdb, "jobs")["redis.replicas"].Status == OK
	}, 20*time.Second, 200*time.Millisecond)
	got := check(t, redisClient(t, replica.URL(), redisconn.Options{}), "jobs")
	require.Equal(t, Fail, got["redis.role"].Status)
	require.Equal(t, ReasonReadOnlyReplica, got["redis.role"].Reason)
}

// TestRedisAuthAndUnreachable: a wrong password and a closed port.
func TestRedisAuthAndUnreachable(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedis(t, testenv.WithRedisArgs("--requirepass", "s3cret"))
	got := check(t, redisClient(t, "redis://:wrong@"+srv.Addr()+"/0", redisconn.Options{}), "jobs")
	require.Equal(t, ReasonAuthFailed, got["redis.connection"].Reason, got["redis.connection"].Message)
	require.Len(t, got, 1)
	got = check(t, redisClient(t, "redis://:s3cret@"+srv.Addr()+"/0", redisconn.Options{}), "jobs")
	require.Equal(t, OK, got["redis.connection"].Status)

	srv.Stop(t)
	got = check(t, redisClient(t, srv.URL(), redisconn.Options{DialTimeout: time.Second}), "jobs")
	require.Equal(t, ReasonUnreachable, got["redis.connection"].Reason)
}

// TestRedisCluster: in a cluster, the server-level checks describe the
// master that holds the stream.
func TestRedisCluster(t *testing.T) {
	t.Parallel()
	c := testenv.StartRedisCluster(t, 3, testenv.WithAppendOnly())
	got := check(t, redisClient(t, c.URL(), redisconn.Options{}), "jobs")
	require.Equal(t, OK, got["redis.persistence"].Status)
	require.Equal(t, OK, got["redis.role"].Status)
}

func TestPostgresChecks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := testenv.Postgres(t)
	db, err := pgxpool.New(ctx, dsn)
	require.NoError(t, err)
	t.Cleanup(db.Close)
	tbl := outbox.MustNew("outbox_events", outbox.Columns{})
	run := func() map[string]Check {
		r := PostgresChecks(GatherPostgres(ctx, db, tbl), tbl)
		for _, c := range r {
			t.Logf("%-5s %-30s %s %s", c.Status, c.Name, c.Message, c.Fix)
		}
		return byName(r)
	}
	got := run()
	require.Equal(t, Fail, got["outbox.table"].Status)

	_, err = db.Exec(ctx, tbl.DDL(outbox.DDLOptions{}))
	require.NoError(t, err)
	got = run()
	for _, name := range []string{"outbox.table", "outbox.column.id", "outbox.column.event-type", "outbox.column.payload",
		"outbox.column.created-at", "outbox.column.dispatched-at", "outbox.index", "outbox.privileges", "outbox.dead-letter-table"} {
		require.Equal(t, OK, got[name].Status, "%s: %s", name, got[name].Message)
	}
	require.Equal(t, Info, got["outbox.notify-trigger"].Status)

	// Wrong types, no index, a big table, a role without DELETE.
	_, err = db.Exec(ctx, `
DROP INDEX `+tbl.PendingIndexName()+`;
CREATE TABLE bad (id bigint, event_type int, payload bytea, created_at date, dispatched_at timestamptz NOT NULL);
INSERT INTO outbox_events (id, event_type, payload) SELECT gen_random_uuid(), 't', '{}' FROM generate_series(1, 20000);
ANALYZE outbox_events;
CREATE ROLE doctor_limited LOGIN;
GRANT SELECT, UPDATE ON outbox_events TO doctor_limited;
GRANT SELECT ON bad TO doctor_limited;`)
	require.NoError(t, err)
	got = run()
	require.Equal(t, Warn, got["outbox.index"].Status)
	require.Contains(t, got["outbox.index"].Fix, "CREATE INDEX")

	bad := outbox.MustNew("bad", outbox.Columns{})
	r := byName(PostgresChecks(GatherPostgres(ctx, db, bad), bad))
	for _, name := range []string{
		"outbox.column.event-type", "outbox.column.payload", "outbox.column.created-at", "outbox.column.dispatched-at",
	} {
		require.Equal(t, Fail, r[name].Status, "%s: %s", name, r[name].Message)
	}
	// A bigint id: consumers dedupe on event_id, and such ids repeat across
	// tables publishing to one stream.
	require.Equal(t, Warn, r["outbox.column.id"].Status)
	require.Contains(t, r["outbox.column.id"].Message, "taken for a duplicate")

	// A created-at column that allows NULL: such a row is claimed last.
	_, err = db.Exec(ctx, `CREATE TABLE nullable_created (LIKE outbox_events INCLUDING DEFAULTS);
ALTER TABLE nullable_created ALTER COLUMN created_at DROP NOT NULL`)
	require.NoError(t, err)
	nullable := outbox.MustNew("nullable_created", outbox.Columns{})
	r = byName(PostgresChecks(GatherPostgres(ctx, db, nullable), nullable))
	require.Equal(t, Warn, r["outbox.column.created-at"].Status, r["outbox.column.created-at"].Message)
	require.Contains(t, r["outbox.column.created-at"].Message, "allows NULL")
	require.Contains(t, r["outbox.column.created-at"].Fix, "SET NOT NULL")

	limited, err := pgxpool.New(ctx, withUser(t, dsn, "doctor_limited"))
	require.NoError(t, err)
	t.Cleanup(limited.Close)
	r = byName(PostgresChecks(GatherPostgres(ctx, limited, tbl), tbl))
	require.Equal(t, Warn, r["outbox.privileges"].Status, r["outbox.privileges"].Message)
	require.Equal(t, Warn, r["outbox.dead-letter-table"].Status, r["outbox.dead-letter-table"].Message)
	r = byName(PostgresChecks(GatherPostgres(ctx, limited, bad), bad))
	require.Equal(t, Fail, r["outbox.privileges"].Status, r["outbox.privileges"].Message)
}
