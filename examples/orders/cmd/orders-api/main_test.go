package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-dev/outbox-operator/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func env(vars map[string]string) func(string) string { return func(k string) string { return vars[k] } }

// execute runs the command line with the environment vars, until ctx ends.
func execute(ctx context.Context, vars map[string]string, listening func(string), args ...string) (string, error) {
	cmd := newRootCommand(env(vars), listening)
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	err := cmd.ExecuteContext(ctx)
	return out.String(), err
}

func TestMigrateThenServeAnOrder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	vars := map[string]string{"DATABASE_URL": testenv.Postgres(t)}
	for range 2 { // idempotent
		_, err := execute(ctx, vars, nil, "migrate", "--log-format", "text")
		require.NoError(t, err)
	}

	runCtx, cancel := context.WithCancel(ctx)
	addr := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		_, err := execute(runCtx, vars, func(a string) { addr <- a }, "--bind-address", "127.0.0.1:0")
		done <- err
	}()
	var base string
	select {
	case a := <-addr:
		base = "http://" + a
	case err := <-done:
		cancel()
		t.Fatalf("orders-api exited: %v", err)
	}

	resp, err := http.Get(base + "/readyz")
	require.NoError(t, err)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	resp, err = http.Post(base+"/orders", "application/json",
		strings.NewReader(`{"customer_email": "reader@example.com", "amount": "19.99"}`))
	require.NoError(t, err)
	var created map[string]string
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&created))
	_ = resp.Body.Close()
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	require.Equal(t, "/orders/"+created["order_id"], resp.Header.Get("Location"))

	cancel() // SIGTERM
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("orders-api did not stop")
	}
}

func TestMigratePrintsTheSchema(t *testing.T) {
	t.Parallel()
	out, err := execute(context.Background(), nil, nil, "migrate", "--print")
	require.NoError(t, err)
	for _, want := range []string{
		"CREATE TABLE IF NOT EXISTS orders (",
		`CREATE TABLE IF NOT EXISTS "outbox_events" (`,
		`WHERE "dispatched_at" IS NULL`,
		`CREATE TABLE IF NOT EXISTS "processed_events" (`,
		"CREATE TABLE IF NOT EXISTS sent_emails (",
	} {
		require.Contains(t, out, want)
	}
}

func TestTheConnectionStringComesFromTheEnvironmentOnly(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{nil, {"migrate"}} {
		_, err := execute(context.Background(), nil, nil, args...)
		require.ErrorContains(t, err, "DATABASE_URL is not set", args)
	}
	_, err := execute(context.Background(), nil, nil, "--database-url", "postgres://x")
	require.ErrorContains(t, err, "unknown flag")
	_, err = execute(context.Background(), nil, nil, "--log-format", "xml", "migrate")
	require.ErrorContains(t, err, `--log-format "xml"`)
}
