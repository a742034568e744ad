package orders

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/outbox-dev/outbox-operator/internal/relay"
	"github.com/outbox-dev/outbox-operator/internal/testenv"
	"github.com/outbox-dev/outbox-operator/pkg/consumer"
)

// The whole path, in process: orders-api's handler behind an HTTP server,
// two relays, two workers of one group. Every order is emailed exactly once,
// also when the stream delivers every event a second time.
func TestEveryOrderIsEmailedExactlyOnceFromAPIThroughRelayToWorker(t *testing.T) {
	t.Parallel()
	const orders = 1000
	const clients = 16
	b := setup(t, bundleOpts{maxConns: 20})
	ctx := context.Background()

	for range 2 {
		ropts, err := redis.ParseURL(testenv.Redis(t))
		require.NoError(t, err)
		ropts.MaxRetries = -1 // as cmd/relay: a retried pipeline would add entries twice
		rdb := redis.NewClient(ropts)
		t.Cleanup(func() { _ = rdb.Close() })
		r, err := relay.New(relay.Config{
			Table: OutboxTable, Stream: b.stream, BatchSize: 100, PollInterval: 20 * time.Millisecond,
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		}, b.db, rdb)
		require.NoError(t, err)
		runInBackground(t, r.Run)
	}
	for _, name := range []string{"worker-a", "worker-b"} {
		runInBackground(t, b.newConsumer(t, consumer.Config{Consumer: name, BatchSize: 50}).Run)
	}

	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: clients}, Timeout: 30 * time.Second}
	t.Cleanup(client.CloseIdleConnections)
	placed := make(map[string]string, orders) // order id -> email
	var mu sync.Mutex
	var wg sync.WaitGroup
	for c := range clients {
		wg.Go(func() {
			for i := c; i < orders; i += clients {
				email := fmt.Sprintf("customer-%04d@example.com", i)
				resp, err := client.Post(b.server.URL+"/orders", "application/json",
					strings.NewReader(fmt.Sprintf(`{"customer_email": %q, "amount": "%d.99"}`, email, i%100+1)))
				id, ok := createdOrderID(t, resp, err)
				if !ok {
					return
				}
				mu.Lock()
				placed[id] = email
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	require.Len(t, placed, orders)

	waitFor(t, "every order emailed", func() bool { return b.count(t, "sent_emails") == orders })
	waitFor(t, "every entry acknowledged", func() bool { return b.drained(t) })
	require.Equal(t, placed, b.emailsSent(t))

	// A relay that crashed between its XADDs and its commit publishes
	// everything again: the workers skip every duplicate.
	entries, err := b.rdb.XRange(ctx, b.stream, "-", "+").Result()
	require.NoError(t, err)
	require.Len(t, entries, orders, "the relays took disjoint batches")
	pipe := b.rdb.Pipeline()
	for _, e := range entries {
		pipe.XAdd(ctx, &redis.XAddArgs{Stream: b.stream, Values: []any{
			"event_id", e.Values["event_id"], "event_type", e.Values["event_type"], "payload", e.Values["payload"],
		}})
	}
	_, err = pipe.Exec(ctx)
	require.NoError(t, err)
	waitFor(t, "the duplicates acknowledged", func() bool { return b.drained(t) })

	require.Equal(t, placed, b.emailsSent(t), "exactly one email per order")
	require.Equal(t, orders, b.count(t, "processed_events"))
	require.Equal(t, orders, strings.Count(b.logs.String(), "sending confirmation email for order "))
	require.Equal(t, orders, strings.Count(b.logs.String(), "Skipped an event already processed"))
	pending, err := OutboxTable.Backlog(ctx, b.db)
	require.NoError(t, err)
	require.Zero(t, pending.Count)
	dead, err := b.rdb.XLen(ctx, b.stream+".dead").Result()
	require.NoError(t, err)
	require.Zero(t, dead)
}

// createdOrderID reads the answer to POST /orders; it may run outside the
// test's goroutine, so it reports with t.Errorf.
func createdOrderID(t *testing.T, resp *http.Response, err error) (string, bool) {
	t.Helper()
	if err != nil {
		t.Errorf("POST /orders: %v", err)
		return "", false
	}
	defer func() { _ = resp.Body.Close() }()
	raw, _ := io.ReadAll(resp.Body)
	var body map[string]string
	if resp.StatusCode != http.StatusCreated || json.Unmarshal(raw, &body) != nil || body["order_id"] == "" {
		t.Errorf("POST /orders: %s: %s", resp.Status, raw)
		return "", false
	}
	return body["order_id"], true
}
