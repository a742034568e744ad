package testenv_test

import (
	"context"
	"net"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/outbox-dev/outbox-operator/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func connect(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

func redisClient(t *testing.T, rawURL string) *redis.Client {
	t.Helper()
	opts, err := redis.ParseURL(rawURL)
	require.NoError(t, err)
	client := redis.NewClient(opts)
	t.Cleanup(func() { _ = client.Close() })
	return client
}

// requireRefused checks that nothing listens on the host:port of rawURL anymore.
func requireRefused(t *testing.T, rawURL string) {
	t.Helper()
	u, err := url.Parse(rawURL)
	require.NoError(t, err)
	conn, err := net.DialTimeout("tcp", u.Host, time.Second)
	if err == nil {
		_ = conn.Close()
	}
	require.Error(t, err, "something still listens on %s", u.Host)
}

func TestPostgresGivesEachTestItsOwnDatabase(t *testing.T) {
	t.Parallel()
	var (
		mu  sync.Mutex
		dbs = map[string]string{} // subtest -> current_database()
		dsn string
	)
	t.Run("group", func(t *testing.T) {
		for _, name := range []string{"first", "second"} {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				conn := connect(t, testenv.Postgres(t))
				ctx := context.Background()

				var db string
				require.NoError(t, conn.QueryRow(ctx, `SELECT current_database()`).Scan(&db))
				var tables int
				require.NoError(t, conn.QueryRow(ctx,
					`SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'`).Scan(&tables))
				require.Zero(t, tables, "a new database is empty")
				_, err := conn.Exec(ctx, `CREATE TABLE outbox_events (id int PRIMARY KEY)`)
				require.NoError(t, err, "the other test's table is not in this database")

				mu.Lock()
				defer mu.Unlock()
				dbs[name] = db
				dsn = conn.Config().ConnString()
			})
		}
	})
	require.Len(t, dbs, 2)
	require.NotEqual(t, dbs["first"], dbs["second"])

	// Both databases were dropped in the subtests' cleanup.
	u, err := url.Parse(dsn)
	require.NoError(t, err)
	u.Path = "/postgres"
	conn := connect(t, u.String())
	var left int
	require.NoError(t, conn.QueryRow(context.Background(),
		`SELECT count(*) FROM pg_database WHERE datname = ANY($1)`,
		[]string{dbs["first"], dbs["second"]}).Scan(&left))
	require.Zero(t, left)
}

func TestPostgresWorksWithPgx(t *testing.T) {
	t.Parallel()
	dsn := testenv.Postgres(t)
	require.True(t, strings.HasPrefix(dsn, "postgres://"), dsn)
	conn := connect(t, dsn)
	ctx := context.Background()

	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `CREATE TABLE outbox_events (id uuid PRIMARY KEY, payload jsonb NOT NULL)`)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `INSERT INTO outbox_events VALUES (gen_random_uuid(), '{"a": 1}')`)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))

	var a int
	require.NoError(t, conn.QueryRow(ctx, `SELECT (payload->>'a')::int FROM outbox_events`).Scan(&a))
	require.Equal(t, 1, a)
}

func TestPostgresAdmitsLogicalReplication(t *testing.T) {
	t.Parallel()
	dsn := testenv.Postgres(t)
	ctx := context.Background()
	var level string
	require.NoError(t, connect(t, dsn).QueryRow(ctx, `SHOW wal_level`).Scan(&level))
	require.Equal(t, "logical", level)

	// initdb's pg_hba.conf trusts replication connections from loopback.
	repl, err := pgconn.Connect(ctx, dsn+"&replication=database")
	require.NoError(t, err)
	defer func() { _ = repl.Close(ctx) }()
	results, err := repl.Exec(ctx, `IDENTIFY_SYSTEM`).ReadAll()
	require.NoError(t, err)
	require.Len(t, results, 1)
	require.Len(t, results[0].Rows, 1)
	u, err := url.Parse(dsn)
	require.NoError(t, err)
	require.Equal(t, strings.TrimPrefix(u.Path, "/"), string(results[0].Rows[0][3]), "IDENTIFY_SYSTEM's dbname")
}

func TestStartPostgresWithSetting(t *testing.T) {
	t.Parallel()
	srv := testenv.StartPostgres(t, testenv.WithPostgresSetting("max_slot_wal_keep_size=1MB"))
	var keep string
	require.NoError(t, connect(t, srv.DSN()).QueryRow(context.Background(), `SHOW max_slot_wal_keep_size`).Scan(&keep))
	require.Equal(t, "1MB", keep)
}

func TestRedisWorksWithGoRedis(t *testing.T) {
	t.Parallel()
	rawURL := testenv.Redis(t)
	require.Regexp(t, `^redis://127\.0\.0\.1:\d+/0$`, rawURL)
	require.Equal(t, rawURL, testenv.Redis(t), "one shared server")
	client := redisClient(t, rawURL)
	ctx := context.Background()

	stream := testenv.Name(t)
	t.Cleanup(func() { _ = client.Del(context.Background(), stream).Err() }) // the server may outlive the test
	id, err := client.XAdd(ctx, &redis.XAddArgs{
		Stream: stream,
		Values: []any{"event_id", "1", "event_type", "order.created", "payload", `{"a":1}`},
	}).Result()
	require.NoError(t, err)
	entries, err := client.XRange(ctx, stream, "-", "+").Result()
	require.NoError(t, err)
	require.Len(t, entries, 1)
	require.Equal(t, id, entries[0].ID)
	require.Equal(t, "order.created", entries[0].Values["event_type"])
}

func TestStartPostgresKeepsDataAcrossStopAndStart(t *testing.T) {
	t.Parallel()
	srv := testenv.StartPostgres(t)
	dsn := srv.DSN()
	require.Regexp(t, `^postgres://postgres@127\.0\.0\.1:\d+/outbox\?sslmode=disable$`, dsn)
	ctx := context.Background()

	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `CREATE TABLE kept (v text); INSERT INTO kept VALUES ('before stop')`)
	require.NoError(t, err)

	srv.Stop(t)
	require.Error(t, conn.Ping(ctx), "the session ends with the server")
	_ = conn.Close(ctx)
	requireRefused(t, dsn)
	srv.Stop(t) // a second Stop does nothing

	srv.Start(t)
	require.Equal(t, dsn, srv.DSN())
	var v string
	require.NoError(t, connect(t, srv.DSN()).QueryRow(ctx, `SELECT v FROM kept`).Scan(&v))
	require.Equal(t, "before stop", v)
}

func TestStartRedisWithAppendOnlyKeepsStreamAcrossStopAndStart(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedis(t, testenv.WithAppendOnly())
	client := redisClient(t, srv.URL())
	ctx := context.Background()
	stream := testenv.Name(t)
	id, err := client.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{"event_id", "1"}}).Result()
	require.NoError(t, err)

	srv.Stop(t)
	requireRefused(t, srv.URL())
	srv.Start(t)

	entries, err := client.XRange(ctx, stream, "-", "+").Result()
	require.NoError(t, err)
	require.Len(t, entries, 1)
	require.Equal(t, id, entries[0].ID)
}

func TestStartRedisWithoutAppendOnlyStartsEmpty(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedis(t)
	client := redisClient(t, srv.URL())
	ctx := context.Background()
	require.NoError(t, client.Set(ctx, "k", "v", 0).Err())

	srv.Stop(t)
	srv.Start(t)

	n, err := client.Exists(ctx, "k").Result()
	require.NoError(t, err)
	require.Zero(t, n)
}

func TestDedicatedServersStopInCleanup(t *testing.T) {
	t.Parallel()
	var pgDSN, redisURL string
	t.Run("uses", func(t *testing.T) {
		pgDSN = testenv.StartPostgres(t).DSN()
		redisURL = testenv.StartRedis(t).URL()
		require.NoError(t, connect(t, pgDSN).Ping(context.Background()))
		require.NoError(t, redisClient(t, redisURL).Ping(context.Background()).Err())
	})
	requireRefused(t, pgDSN)
	requireRefused(t, redisURL)
}

var namePattern = regexp.MustCompile(`^t_[a-z0-9_]+_[0-9a-f]{6}$`)

func TestName(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for range 1000 {
		name := testenv.Name(t)
		require.Regexp(t, namePattern, name)
		require.True(t, strings.HasPrefix(name, "t_name_"), name)
		require.False(t, seen[name], "duplicate %s", name)
		seen[name] = true
	}

	t.Run("Long/Sub Test-With Ünïcode & $ymbols/and a very long tail that is cut", func(t *testing.T) {
		t.Parallel()
		name := testenv.Name(t)
		require.Regexp(t, namePattern, name)
		require.LessOrEqual(t, len(name), 40)
		require.NotContains(t, name, "__")
	})
}
