package main

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outbox-dev/outbox-operator/internal/testenv"
)

// stopTimeout is the generous bound within which a relay must exit after
// SIGTERM; the time it took is logged, not asserted.
const stopTimeout = 30 * time.Second

// sigterm stops the relay with SIGTERM and requires exit code 0 within
// stopTimeout.
func sigterm(t *testing.T, p *relayProc) {
	t.Helper()
	sent := time.Now()
	p.signal(t, syscall.SIGTERM)
	code := p.wait(t, stopTimeout)
	t.Logf("relay exited %s after SIGTERM", p.ended.Sub(sent).Round(time.Millisecond))
	require.Zero(t, code, "exit code after SIGTERM\n--- stderr:\n%s", p.stderr)
	_, stopped := findLog(p.stderr.String(), "Relay stopped")
	require.True(t, stopped, "no 'Relay stopped' log line:\n%s", p.stderr)
}

func TestRunDrainsAndExitsZeroOnSIGTERM(t *testing.T) {
	t.Parallel()
	dsn, db := freshDB(t)
	rs := testenv.StartRedis(t) // a server of its own, to see the default stream "jobs"
	rdb := redisClient(t, rs.URL())
	ids := insertEvents(t, db, 1234)

	r := startRun(t, relayEnv("DATABASE_URL="+dsn, "REDIS_URL="+rs.URL()))
	waitUntil(t, r.relayProc, "every row in the stream", func() bool {
		return streamLen(rdb, "jobs") == int64(len(ids))
	})
	waitUntil(t, r.relayProc, "ready", func() bool { return r.readyz() == http.StatusOK })
	// The last batch is in the stream before its commit: wait for the commit.
	waitUntil(t, r.relayProc, "every row marked dispatched", func() bool { return pending(t, db) == 0 })

	entries := readStream(t, rdb, "jobs")
	require.Equal(t, ids, eventIDs(entries), "each row once, in created_at order")
	for _, e := range entries {
		require.Equal(t, "order_created", e["event_type"])
		require.True(t, strings.HasPrefix(e["payload"], `{"n":`), "payload %q", e["payload"])
		require.Len(t, e, 3, "event_id, event_type and payload only: %v", e)
	}
	require.Equal(t, `{"n":1}`, entries[0]["payload"])
	require.Equal(t, int64(0), streamLen(rdb, "jobs.dead"), "nothing dead-lettered")
	published, ok := r.metric(t, "outbox_relay_events_published_total")
	require.True(t, ok)
	require.EqualValues(t, len(ids), published)

	started, ok := findLog(r.stderr.String(), "Relay started")
	require.True(t, ok, "no 'Relay started' log line:\n%s", r.stderr)
	require.EqualValues(t, 500, started["batchSize"], "default --batch-size")
	require.Equal(t, "jobs", started["stream"], "default --stream")

	sigterm(t, r.relayProc)
}

func TestRunReadsFlagsFromEnvironment(t *testing.T) {
	t.Parallel()
	redisURL := testenv.Redis(t)
	rdb := redisClient(t, redisURL)

	t.Run("env sets flags", func(t *testing.T) {
		t.Parallel()
		dsn, db := freshDB(t)
		stream := testenv.Name(t)
		insertEvents(t, db, 20)
		r := startRun(t, relayEnv("DATABASE_URL="+dsn, "REDIS_URL="+redisURL,
			"RELAY_STREAM="+stream, "RELAY_BATCH_SIZE=7"))

		waitUntil(t, r.relayProc, "20 events published", func() bool {
			v, _ := r.metric(t, "outbox_relay_events_published_total")
			return v == 20
		})
		require.EqualValues(t, 20, streamLen(rdb, stream), "RELAY_STREAM names the stream")
		batches, _ := r.metric(t, "outbox_relay_batches_total")
		// Claims start at one row and double (slow start): 1, 2, 4, then 7s.
		require.GreaterOrEqual(t, batches, 5.0, "RELAY_BATCH_SIZE=7: 1, 2, 4, 7, 6 at least")
		started, ok := findLog(r.stderr.String(), "Relay started")
		require.True(t, ok)
		require.EqualValues(t, 7, started["batchSize"])
		require.Equal(t, stream, started["stream"])
		sigterm(t, r.relayProc)
	})

	t.Run("command line wins over env", func(t *testing.T) {
		t.Parallel()
		dsn, db := freshDB(t)
		envStream, flagStream := testenv.Name(t), testenv.Name(t)
		insertEvents(t, db, 10)
		r := startRun(t, relayEnv("DATABASE_URL="+dsn, "REDIS_URL="+redisURL,
			"RELAY_STREAM="+envStream, "RELAY_BATCH_SIZE=7"),
			"--stream", flagStream, "--batch-size=4")

		waitUntil(t, r.relayProc, "10 events published", func() bool {
			v, _ := r.metric(t, "outbox_relay_events_published_total")
			return v == 10
		})
		require.EqualValues(t, 10, streamLen(rdb, flagStream), "--stream wins")
		require.EqualValues(t, 0, streamLen(rdb, envStream), "RELAY_STREAM is ignored")
		batches, _ := r.metric(t, "outbox_relay_batches_total")
		require.GreaterOrEqual(t, batches, 4.0, "--batch-size=4: 1, 2, 4, 3 at least")
		started, ok := findLog(r.stderr.String(), "Relay started")
		require.True(t, ok)
		require.EqualValues(t, 4, started["batchSize"])
		sigterm(t, r.relayProc)
	})

	t.Run("shared layout flags from env", func(t *testing.T) {
		t.Parallel()
		res := requireSuccess(t, relayEnv("RELAY_TABLE=app.events", "RELAY_PAYLOAD_COLUMN=body"), "schema")
		require.Contains(t, res.stdout, `CREATE TABLE IF NOT EXISTS "app"."events"`)
		require.Contains(t, res.stdout, `"body" text NOT NULL`)
		res = requireSuccess(t, relayEnv("RELAY_TABLE=app.events"), "schema", "--table", "other")
		require.Contains(t, res.stdout, `CREATE TABLE IF NOT EXISTS "other"`)
		require.NotContains(t, res.stdout, "app")
	})

	t.Run("invalid env value", func(t *testing.T) {
		t.Parallel()
		// Valid connection settings, so only the variable can be the problem.
		dsn := testenv.Postgres(t)
		for _, args := range [][]string{{"run"}, {"cleanup"}} {
			res := execRelay(t, relayEnv("DATABASE_URL="+dsn, "REDIS_URL="+redisURL, "RELAY_BATCH_SIZE=abc",
				"RELAY_METRICS_BIND_ADDRESS=0", "RELAY_HEALTH_PROBE_BIND_ADDRESS=0"), args...)
			require.NotZero(t, res.code, "relay %v with RELAY_BATCH_SIZE=abc", args)
			require.Contains(t, res.stderr, "RELAY_BATCH_SIZE", "relay %v", args)
			require.Contains(t, res.stderr, "abc", "relay %v", args)
			require.NotContains(t, res.stderr, "Relay started", "relay %v must not start", args)
		}
		res := execRelay(t, relayEnv("DATABASE_URL="+dsn, "REDIS_URL="+redisURL, "RELAY_POLL_INTERVAL=soon"), "run")
		require.NotZero(t, res.code)
		require.Contains(t, res.stderr, "RELAY_POLL_INTERVAL")
	})
}

// canary is the password of the role the redaction test connects as; it
// must never show in anything the relay prints or serves.
const canary = "canary-s3cret-pw"

// canaryDSN creates a login role with the canary password and returns the
// DSN of the test's database as that role, and a pool as the superuser.
// The server trusts loopback connections, so any password is accepted: the
// point is that the relay has one to leak.
func canaryDSN(t *testing.T) (string, string) {
	t.Helper()
	role := testenv.Name(t)
	var admin string
	// Registered before testenv.Postgres, so it runs after the database is
	// dropped, when nothing in it depends on the role any more.
	t.Cleanup(func() {
		if admin == "" {
			return
		}
		u, err := url.Parse(admin)
		if err != nil {
			t.Errorf("dropping role %s: %v", role, err)
			return
		}
		u.Path = "/postgres"
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, u.String())
		if err != nil {
			t.Errorf("dropping role %s: %v", role, err)
			return
		}
		defer func() { _ = conn.Close(ctx) }()
		if _, err := conn.Exec(ctx, `DROP ROLE IF EXISTS "`+role+`"`); err != nil {
			t.Errorf("dropping role %s: %v", role, err)
		}
	})
	admin = testenv.Postgres(t)
	db := connectDB(t, admin)
	execSQL(t, db, `CREATE ROLE "`+role+`" LOGIN PASSWORD '`+canary+`'`)
	u, err := url.Parse(admin)
	require.NoError(t, err)
	u.User = url.UserPassword(role, canary)
	return u.String(), admin
}

func TestRunReportsMissingTableWithoutLeakingPassword(t *testing.T) {
	t.Parallel()
	dsn, admin := canaryDSN(t)
	role := connectDB(t, dsn)
	var user string
	require.NoError(t, role.QueryRow(context.Background(), `SELECT current_user`).Scan(&user))
	require.NotEqual(t, "postgres", user, "the relay must connect as the canary role")
	redisURL := testenv.Redis(t)
	rdb := redisClient(t, redisURL)
	stream := testenv.Name(t)

	r := startRun(t, relayEnv("DATABASE_URL="+dsn, "REDIS_URL="+redisURL), "--stream", stream,
		"--missing-table-retry-interval", "200ms")
	waitUntil(t, r.relayProc, "the missing table in the log", func() bool {
		return strings.Contains(r.stderr.String(), "Outbox table not found")
	})
	line, ok := findLog(r.stderr.String(), "Outbox table not found, retrying")
	require.True(t, ok, "the line is JSON with that message:\n%s", r.stderr)
	require.Equal(t, "ERROR", line["level"])
	require.Equal(t, "table_not_found", line["kind"])
	require.Equal(t, "outbox_events", line["table"])
	require.Contains(t, line["error"], "outbox_events")
	db, _ := line["database"].(string)
	require.Contains(t, db, "xxxxx", "the database is named with its password redacted")
	require.Contains(t, db, user+":xxxxx@127.0.0.1", "the database names user and host")

	code, body := httpGet(r.url("/healthz"))
	require.Equal(t, http.StatusOK, code, "/healthz: %s", body)
	code, body = httpGet(r.url("/readyz"))
	require.Equal(t, http.StatusServiceUnavailable, code, "/readyz while the table is missing: %s", body)
	require.NotContains(t, body, canary)
	metrics := r.metrics(t)
	require.NotContains(t, metrics, canary)
	published, ok := sampleValue(t, metrics, "outbox_relay_events_published_total")
	require.True(t, ok, "outbox_relay_events_published_total is exposed:\n%s", metrics)
	require.Zero(t, published)
	missing, ok := sampleValue(t, metrics, `outbox_relay_errors_total{kind="table_not_found"}`)
	require.True(t, ok, "outbox_relay_errors_total{kind=\"table_not_found\"} is exposed:\n%s", metrics)
	require.Positive(t, missing)

	// The table appears, with rows in it, and the role may use it.
	adminDB := connectDB(t, admin)
	ddl := requireSuccess(t, relayEnv(), "schema").stdout
	execSQL(t, adminDB, ddl+`
		GRANT SELECT, INSERT, UPDATE, DELETE ON outbox_events TO "`+user+`";
		INSERT INTO outbox_events (event_type, payload) VALUES ('a', '1'), ('b', '2'), ('c', '3');`)
	waitUntil(t, r.relayProc, "ready once the table exists", func() bool {
		return r.readyz() == http.StatusOK
	})
	waitUntil(t, r.relayProc, "the rows published", func() bool {
		return streamLen(rdb, stream) == 3
	})
	waitUntil(t, r.relayProc, "published counted", func() bool {
		v, _ := r.metric(t, "outbox_relay_events_published_total")
		return v == 3
	})
	require.Zero(t, pending(t, adminDB))

	sigterm(t, r.relayProc)
	out := r.stdout.String() + r.stderr.String()
	require.NotContains(t, out, canary, "the password leaked into the relay's output")
	require.Contains(t, out, "xxxxx")
}

func TestRunSurvivesRedisOutage(t *testing.T) {
	t.Parallel()
	dsn, db := freshDB(t)
	rs := testenv.StartRedis(t)
	rs.Stop(t)
	ids := insertEvents(t, db, 100)

	r := startRun(t, relayEnv("DATABASE_URL="+dsn, "REDIS_URL="+rs.URL()),
		"--publish-timeout=1s", "--stream=events")
	waitUntil(t, r.relayProc, "three failed passes on Redis", func() bool {
		v, _ := r.metric(t, `outbox_relay_errors_total{kind="redis"}`)
		return v >= 3
	})
	require.False(t, r.exited(), "the relay keeps running while Redis is down")
	code, body := httpGet(r.url("/readyz"))
	require.Equal(t, http.StatusServiceUnavailable, code, "/readyz while Redis is down: %s", body)
	require.EqualValues(t, len(ids), pending(t, db), "nothing is marked dispatched without Redis")
	_, warned := findLog(r.stderr.String(), "Relay pass failed, retrying")
	require.True(t, warned, "the outage is logged:\n%s", r.stderr)

	rs.Start(t)
	rdb := redisClient(t, rs.URL())
	waitUntil(t, r.relayProc, "backlog drained after Redis came back", func() bool {
		return pending(t, db) == 0
	})
	waitUntil(t, r.relayProc, "ready again", func() bool { return r.readyz() == http.StatusOK })
	require.Equal(t, ids, eventIDs(readStream(t, rdb, "events")), "each row once, in order")
	_, recovered := findLog(r.stderr.String(), "Relay recovered")
	require.True(t, recovered, "recovery is logged:\n%s", r.stderr)

	sigterm(t, r.relayProc)
}

func TestRunStopsOnSIGTERMWhileRetrying(t *testing.T) {
	t.Parallel()
	dsn := testenv.Postgres(t) // no outbox table: the relay waits 30s between tries
	r := startRun(t, relayEnv("DATABASE_URL="+dsn, "REDIS_URL="+testenv.Redis(t)))
	waitUntil(t, r.relayProc, "the missing table in the log", func() bool {
		return strings.Contains(r.stderr.String(), "Outbox table not found")
	})
	sigterm(t, r.relayProc)
}

func TestRunWakesOnNotify(t *testing.T) {
	t.Parallel()
	dsn := testenv.Postgres(t)
	requireSuccess(t, relayEnv("DATABASE_URL="+dsn), "schema", "--apply", "--notify")
	db := connectDB(t, dsn)
	redisURL := testenv.Redis(t)
	rdb := redisClient(t, redisURL)
	stream := testenv.Name(t)

	// Polling once an hour: only the trigger's NOTIFY can bring the rows
	// over within the wait below.
	r := startRun(t, relayEnv("DATABASE_URL="+dsn, "REDIS_URL="+redisURL),
		"--stream", stream, "--poll-interval=1h", "--busy-poll-interval=1h")
	waitUntil(t, r.relayProc, "the listener", func() bool {
		_, ok := findLog(r.stderr.String(), "Listening for NOTIFY")
		return ok
	})
	waitUntil(t, r.relayProc, "a first pass", func() bool { return r.readyz() == http.StatusOK })
	for i := 1; i <= 3; i++ {
		ids := insertEvents(t, db, 1)
		waitUntil(t, r.relayProc, "the row relayed on NOTIFY", func() bool {
			return streamLen(rdb, stream) == int64(i)
		})
		entries := readStream(t, rdb, stream)
		require.Equal(t, ids[0], entries[i-1]["event_id"])
	}
	sigterm(t, r.relayProc)
}

// TestRunStoppedMidClaimLogsNoFailure: a SIGTERM that cuts off a claim
// stops the relay without a "Relay pass failed" warning, an error counted
// or a retry: the claim was rolled back because the relay stops, not
// because a server failed. The relay polls an empty table every
// millisecond, so a claim is in flight when the signal comes most of the
// time; five relays make a miss unlikely.
func TestRunStoppedMidClaimLogsNoFailure(t *testing.T) {
	t.Parallel()
	dsn, _ := freshDB(t)
	redisURL := testenv.Redis(t)
	for i := range 5 {
		t.Run(strconv.Itoa(i), func(t *testing.T) {
			t.Parallel()
			r := startRun(t, relayEnv("DATABASE_URL="+dsn, "REDIS_URL="+redisURL),
				"--stream=stopped-mid-claim", "--poll-interval=1ms", "--busy-poll-interval=1ms")
			waitUntil(t, r.relayProc, "ready", func() bool { return r.readyz() == http.StatusOK })
			time.Sleep(200 * time.Millisecond) // many claims
			sigterm(t, r.relayProc)
			failed, ok := findLog(r.stderr.String(), "Relay pass failed, retrying")
			require.False(t, ok, "a stop is not a failure: %v", failed)
		})
	}
}
