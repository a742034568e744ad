package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/outbox-dev/outbox-operator/examples/orders"
	"github.com/outbox-dev/outbox-operator/internal/syncbuf"
	"github.com/outbox-dev/outbox-operator/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func env(vars map[string]string) func(string) string { return func(k string) string { return vars[k] } }

func TestWorkerEmailsAnOrderAndStopsOnSIGTERM(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn, redisURL, stream := testenv.Postgres(t), testenv.Redis(t), testenv.Name(t)
	db, err := pgxpool.New(ctx, dsn)
	require.NoError(t, err)
	t.Cleanup(db.Close)
	require.NoError(t, orders.Migrate(ctx, db))
	ropts, err := redis.ParseURL(redisURL)
	require.NoError(t, err)
	rdb := redis.NewClient(ropts)
	t.Cleanup(func() { _ = rdb.Close() })
	const orderID = "6f1c8a52-3b1e-4f7e-9d43-2f0a8c1b7e11"
	require.NoError(t, rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{
		"event_id", "e1", "event_type", "order_created",
		"payload", `{"order_id": "` + orderID + `", "customer_email": "reader@example.com", "amount": "19.99"}`,
	}}).Err())

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	addr := make(chan string, 1)
	done := make(chan error, 1)
	cmd := newRootCommand(env(map[string]string{
		"DATABASE_URL": dsn, "REDIS_URL": redisURL, "POD_NAME": "worker-0",
	}), func(a string) { addr <- a })
	cmd.SetArgs([]string{"--stream", stream, "--block", "50ms", "--health-probe-bind-address", "127.0.0.1:0"})
	var logs syncbuf.Buffer
	cmd.SetErr(&logs)
	go func() { done <- cmd.ExecuteContext(runCtx) }()
	probes := "http://" + <-addr

	require.Eventually(t, func() bool {
		var n int
		return db.QueryRow(ctx, `SELECT count(*) FROM sent_emails WHERE order_id = $1`, orderID).Scan(&n) == nil && n == 1
	}, 60*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool {
		resp, err := http.Get(probes + "/readyz")
		if err != nil {
			return false
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 60*time.Second, 10*time.Millisecond)
	consumers, err := rdb.XInfoConsumers(ctx, stream, "workers").Result()
	require.NoError(t, err)
	require.Len(t, consumers, 1)
	require.Equal(t, "worker-0", consumers[0].Name, "named after the pod")
	require.Contains(t, logs.String(),
		`"msg":"sending confirmation email for order `+orderID+` to reader@example.com"`)

	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("worker did not stop")
	}
}

func TestWorkerNeedsBothConnectionStringsFromTheEnvironment(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		vars map[string]string
		want string
	}{
		{nil, "DATABASE_URL is not set"},
		{map[string]string{"DATABASE_URL": "postgres://localhost/x"}, "REDIS_URL is not set"},
		{map[string]string{"DATABASE_URL": "postgres://localhost/x", "REDIS_URL": "http://x"}, "not a valid redis:// or rediss:// URL"},
	} {
		cmd := newRootCommand(env(tc.vars), nil)
		cmd.SetArgs([]string{"--health-probe-bind-address", "0"})
		cmd.SetOut(io.Discard)
		cmd.SetErr(io.Discard)
		err := cmd.ExecuteContext(context.Background())
		require.ErrorContains(t, err, tc.want)
	}
}

func TestWorkerRefusesAnInvalidConfig(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	cmd := newRootCommand(env(map[string]string{"DATABASE_URL": "postgres://localhost/x", "REDIS_URL": "redis://localhost"}), nil)
	cmd.SetArgs([]string{"--stream", "jobs", "--dead-letter-stream", "jobs", "--processed-table", "x;y"})
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	err := cmd.ExecuteContext(context.Background())
	require.ErrorContains(t, err, "dead-letter stream must differ")
	require.True(t, strings.Contains(err.Error(), "invalid identifier"), err.Error())
}
