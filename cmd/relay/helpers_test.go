package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/outbox-dev/outbox-operator/internal/testenv"
)

// waitTimeout bounds every wait for a condition.
const waitTimeout = 60 * time.Second

// waitUntil polls cond until it holds, failing after waitTimeout. When p is
// not nil and exits meanwhile, it fails at once, quoting the process's output.
func waitUntil(t *testing.T, p *relayProc, what string, cond func() bool) {
	t.Helper()
	testenv.EventuallyEvery(t, 20*time.Millisecond, waitTimeout, what, func() error {
		if cond() {
			return nil
		}
		if p != nil && p.exited() {
			t.Fatalf("waiting for %s: relay exited (%v)\n--- stdout:\n%s--- stderr:\n%s",
				what, p.waitErr, p.stdout, p.stderr)
		}
		return errors.New("not yet")
	})
}

// handedOut remembers the ports given to this process's relays, so that two
// tests starting at the same moment never get the same one.
var handedOut sync.Map

// freeAddr returns 127.0.0.1:port for a port that was free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	for range 50 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		addr := l.Addr().String()
		require.NoError(t, l.Close())
		if _, taken := handedOut.LoadOrStore(addr, true); !taken {
			return addr
		}
	}
	t.Fatal("no new free port after 50 tries")
	return ""
}

// runningRelay is a `relay run` process with its metrics and probe servers.
type runningRelay struct {
	*relayProc
	metricsAddr, probeAddr string
}

// startRun starts `relay run` with args, serving /metrics and the probes on
// free loopback ports, and returns once /healthz answers. A port that another
// process took meanwhile makes it try again with other ports.
func startRun(t *testing.T, env []string, args ...string) *runningRelay {
	t.Helper()
	for attempt := 1; ; attempt++ {
		r := &runningRelay{metricsAddr: freeAddr(t), probeAddr: freeAddr(t)}
		all := append([]string{"run",
			"--metrics-bind-address=" + r.metricsAddr,
			"--health-probe-bind-address=" + r.probeAddr,
		}, args...)
		r.relayProc = startRelay(t, env, all...)
		deadline := time.Now().Add(waitTimeout)
		for !r.exited() && time.Now().Before(deadline) {
			if code, _ := httpGet(r.url("/healthz")); code == http.StatusOK {
				return r
			}
			time.Sleep(20 * time.Millisecond)
		}
		if r.exited() && strings.Contains(r.stderr.String(), "address already in use") && attempt < 3 {
			t.Logf("relay could not bind its ports, trying others: %s", r.stderr)
			continue
		}
		t.Fatalf("relay run: /healthz did not answer (exited: %v, %v)\n--- stdout:\n%s--- stderr:\n%s",
			r.exited(), r.waitErr, r.stdout, r.stderr)
	}
}

// url is the address of a probe path (/healthz, /readyz) of the relay.
func (r *runningRelay) url(path string) string { return "http://" + r.probeAddr + path }

// readyz returns the status code of /readyz, 0 when it cannot be reached.
func (r *runningRelay) readyz() int {
	code, _ := httpGet(r.url("/readyz"))
	return code
}

// metrics scrapes /metrics.
func (r *runningRelay) metrics(t *testing.T) string {
	t.Helper()
	code, body := httpGet("http://" + r.metricsAddr + "/metrics")
	require.Equal(t, http.StatusOK, code, "GET /metrics: %s", body)
	return body
}

// metric returns the value of one sample of /metrics, e.g.
// `outbox_relay_errors_total{kind="redis"}`, and whether it is there.
func (r *runningRelay) metric(t *testing.T, sample string) (float64, bool) {
	t.Helper()
	return sampleValue(t, r.metrics(t), sample)
}

// sampleValue finds a sample in the Prometheus text format.
func sampleValue(t *testing.T, body, sample string) (float64, bool) {
	t.Helper()
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), sample+" ")
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
		require.NoError(t, err, "sample %s", sample)
		return v, true
	}
	return 0, false
}

var httpClient = &http.Client{Timeout: 5 * time.Second}

// httpGet returns the status code and body of a GET; code 0 when the server
// cannot be reached.
func httpGet(url string) (int, string) {
	resp, err := httpClient.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err.Error()
	}
	return resp.StatusCode, string(body)
}

// logLine is one JSON log line of the relay.
type logLine map[string]any

// logLines parses the JSON lines of the relay's stderr; others are skipped.
func logLines(stderr string) []logLine {
	var lines []logLine
	for _, s := range strings.Split(stderr, "\n") {
		var l logLine
		if json.Unmarshal([]byte(s), &l) == nil {
			lines = append(lines, l)
		}
	}
	return lines
}

// findLog returns the first JSON log line with the message msg.
func findLog(stderr, msg string) (logLine, bool) {
	for _, l := range logLines(stderr) {
		if l["msg"] == msg {
			return l, true
		}
	}
	return nil, false
}

// freshDB returns the DSN of a new database for this test, with the default
// outbox layout applied by `relay schema --apply`, and a pool on it.
func freshDB(t *testing.T) (string, *pgxpool.Pool) {
	t.Helper()
	dsn := testenv.Postgres(t)
	res := requireSuccess(t, relayEnv("DATABASE_URL="+dsn), "schema", "--apply")
	require.Contains(t, res.stdout, "applied schema of outbox_events")
	return dsn, connectDB(t, dsn)
}

// connectDB opens a pool on dsn, closed when the test ends.
func connectDB(t *testing.T, dsn string) *pgxpool.Pool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db, err := pgxpool.New(ctx, dsn)
	require.NoError(t, err)
	t.Cleanup(db.Close)
	require.NoError(t, db.Ping(ctx))
	return db
}

// execSQL runs SQL (several statements run as one implicit transaction).
func execSQL(t *testing.T, db *pgxpool.Pool, sql string, args ...any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := db.Exec(ctx, sql, args...)
	require.NoError(t, err, "%s", sql)
}

// queryInt runs a query that returns one integer.
func queryInt(t *testing.T, db *pgxpool.Pool, sql string) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var n int64
	require.NoError(t, db.QueryRow(ctx, sql).Scan(&n), "%s", sql)
	return n
}

// queryStrings runs a query that returns one text column.
func queryStrings(t *testing.T, db *pgxpool.Pool, sql string, args ...any) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rows, err := db.Query(ctx, sql, args...)
	require.NoError(t, err, "%s", sql)
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		require.NoError(t, rows.Scan(&s))
		out = append(out, s)
	}
	require.NoError(t, rows.Err())
	return out
}

// insertEvents writes n pending events to outbox_events, created_at one
// microsecond apart an hour ago, and returns their ids in created_at order.
func insertEvents(t *testing.T, db *pgxpool.Pool, n int) []string {
	t.Helper()
	return queryStrings(t, db, `WITH ins AS (
		INSERT INTO outbox_events (event_type, payload, created_at)
		SELECT 'order_created', '{"n":' || g || '}', now() - interval '1 hour' + g * interval '1 microsecond'
		FROM generate_series(1, $1) g
		RETURNING id, created_at
	) SELECT id::text FROM ins ORDER BY created_at`, n)
}

// pending counts undispatched rows of outbox_events.
func pending(t *testing.T, db *pgxpool.Pool) int64 {
	t.Helper()
	return queryInt(t, db, `SELECT count(*) FROM outbox_events WHERE dispatched_at IS NULL`)
}

// redisClient opens a client on url, closed when the test ends.
func redisClient(t *testing.T, url string) *redis.Client {
	t.Helper()
	opts, err := redis.ParseURL(url)
	require.NoError(t, err)
	opts.MaxRetries = -1
	opts.DialTimeout = time.Second
	c := redis.NewClient(opts)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// streamLen is XLEN, -1 when Redis cannot be reached.
func streamLen(rdb *redis.Client, stream string) int64 {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	n, err := rdb.XLen(ctx, stream).Result()
	if err != nil {
		return -1
	}
	return n
}

// streamEntry is one entry of a stream: its fields.
type streamEntry map[string]string

// readStream returns the entries of a stream, oldest first.
func readStream(t *testing.T, rdb *redis.Client, stream string) []streamEntry {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	msgs, err := rdb.XRange(ctx, stream, "-", "+").Result()
	require.NoError(t, err)
	out := make([]streamEntry, len(msgs))
	for i, m := range msgs {
		e := streamEntry{}
		for k, v := range m.Values {
			e[k] = fmt.Sprint(v)
		}
		out[i] = e
	}
	return out
}

// eventIDs returns the event_id field of each entry.
func eventIDs(entries []streamEntry) []string {
	ids := make([]string, len(entries))
	for i, e := range entries {
		ids[i] = e["event_id"]
	}
	return ids
}
