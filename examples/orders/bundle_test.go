package orders

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	ioutbox "github.com/outbox-dev/outbox-operator/internal/outbox"
	"github.com/outbox-dev/outbox-operator/internal/syncbuf"
	"github.com/outbox-dev/outbox-operator/internal/testenv"
	"github.com/outbox-dev/outbox-operator/pkg/consumer"
)

// testBundle is a fresh, migrated database, the API on it behind an
// httptest server, a Redis client and a stream of the test's own.
type testBundle struct {
	db     *pgxpool.Pool
	store  *Store
	server *httptest.Server
	rdb    *redis.Client
	stream string
	logs   *syncbuf.Buffer
	log    *slog.Logger
}

type bundleOpts struct {
	noMigrate bool
	maxConns  int32
}

func setup(t *testing.T, o bundleOpts) *testBundle {
	t.Helper()
	ctx := context.Background()
	cfg, err := ioutbox.PoolConfig(testenv.Postgres(t), ioutbox.SessionSettings{
		StatementTimeout: 10 * time.Second, LockTimeout: 5 * time.Second, IdleInTransactionTimeout: 10 * time.Second,
	}, max(o.maxConns, 4))
	require.NoError(t, err)
	db, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(db.Close)
	if !o.noMigrate {
		require.NoError(t, Migrate(ctx, db))
	}
	ropts, err := redis.ParseURL(testenv.Redis(t))
	require.NoError(t, err)
	ropts.DialTimeout = time.Second
	rdb := redis.NewClient(ropts)
	t.Cleanup(func() { _ = rdb.Close() })

	logs := &syncbuf.Buffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	store := NewStore(db)
	server := httptest.NewServer(NewAPI(store, log).Handler())
	t.Cleanup(server.Close)
	return &testBundle{db: db, store: store, server: server, rdb: rdb, stream: testenv.Name(t), logs: logs, log: log}
}

// post sends a body to POST /orders and returns the status and the decoded
// JSON answer.
func (b *testBundle) post(t *testing.T, body string) (int, map[string]string) {
	t.Helper()
	resp, err := http.Post(b.server.URL+"/orders", "application/json", strings.NewReader(body))
	require.NoError(t, err)
	defer func() { _ = resp.Body.Close() }()
	return resp.StatusCode, decodeBody(t, resp)
}

func decodeBody(t *testing.T, resp *http.Response) map[string]string {
	t.Helper()
	require.Equal(t, "application/json", resp.Header.Get("Content-Type"))
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	var out map[string]string
	require.NoError(t, json.NewDecoder(bytes.NewReader(raw)).Decode(&out), "body %s", raw)
	return out
}

func (b *testBundle) count(t *testing.T, table string) int {
	t.Helper()
	var n int
	require.NoError(t, b.db.QueryRow(context.Background(), `SELECT count(*) FROM `+table).Scan(&n))
	return n
}

// newConsumer builds the worker's consumer on the bundle's stream.
func (b *testBundle) newConsumer(t *testing.T, cfg consumer.Config) *consumer.Consumer {
	t.Helper()
	cfg.Stream = b.stream
	cfg.Consumer = cmpOr(cfg.Consumer, "worker-1")
	cfg.Handler = ConfirmationEmails(b.log)
	cfg.Block = 50 * time.Millisecond
	cfg.MinBackoff, cfg.MaxBackoff = 10*time.Millisecond, 200*time.Millisecond
	cfg.Logger = b.log
	c, err := consumer.New(cfg, b.db, b.rdb)
	require.NoError(t, err)
	return c
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// runInBackground runs fn(ctx) until the test ends.
func runInBackground(t *testing.T, fn func(context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- fn(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("background run: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Errorf("background run did not stop within 30s")
		}
	})
}

// waitFor polls cond until it holds, failing after 120s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testenv.Eventually(t, 120*time.Second, what, testenv.True(cond))
}
