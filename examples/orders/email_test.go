package orders

import (
	"context"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/outbox-dev/outbox-operator/pkg/consumer"
)

// publishOutbox adds every outbox row to the stream as the relay does,
// times copies: copies > 1 is a relay that crashed between its XADDs and
// its commit and published the rows again.
func (b *testBundle) publishOutbox(t *testing.T, copies int) {
	t.Helper()
	ctx := context.Background()
	rows, err := b.db.Query(ctx, `SELECT id::text, event_type, payload FROM outbox_events ORDER BY created_at`)
	require.NoError(t, err)
	var entries [][]any
	for rows.Next() {
		var id, typ, payload string
		require.NoError(t, rows.Scan(&id, &typ, &payload))
		entries = append(entries, []any{"event_id", id, "event_type", typ, "payload", payload})
	}
	require.NoError(t, rows.Err())
	for range copies {
		for _, e := range entries {
			require.NoError(t, b.rdb.XAdd(ctx, &redis.XAddArgs{Stream: b.stream, Values: e}).Err())
		}
	}
}

func (b *testBundle) emailsSent(t *testing.T) map[string]string {
	t.Helper()
	rows, err := b.db.Query(context.Background(), `SELECT order_id::text, customer_email FROM sent_emails`)
	require.NoError(t, err)
	out := map[string]string{}
	for rows.Next() {
		var id, email string
		require.NoError(t, rows.Scan(&id, &email))
		out[id] = email
	}
	require.NoError(t, rows.Err())
	return out
}

// drained reports whether the group has read every entry of the stream and
// acknowledged it.
func (b *testBundle) drained(t *testing.T) bool {
	t.Helper()
	ctx := context.Background()
	last, err := b.rdb.XRevRangeN(ctx, b.stream, "+", "-", 1).Result()
	if err != nil || len(last) == 0 {
		return false
	}
	groups, err := b.rdb.XInfoGroups(ctx, b.stream).Result()
	if err != nil {
		return false
	}
	for _, g := range groups {
		if g.Name == consumer.DefaultGroup {
			return g.LastDeliveredID == last[0].ID && g.Pending == 0
		}
	}
	return false
}

func TestWorkerSendsExactlyOneEmailWhenAnEventIsDeliveredTwice(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	_, created := b.post(t, `{"customer_email": "reader@example.com", "amount": "19.99"}`)
	orderID := created["order_id"]
	b.publishOutbox(t, 2)
	runInBackground(t, b.newConsumer(t, consumer.Config{}).Run)

	waitFor(t, "both entries acknowledged", func() bool { return b.drained(t) })
	require.Equal(t, map[string]string{orderID: "reader@example.com"}, b.emailsSent(t))
	line := "sending confirmation email for order " + orderID + " to reader@example.com"
	require.Equal(t, 1, strings.Count(b.logs.String(), line), b.logs.String())
	require.Contains(t, b.logs.String(), "Skipped an event already processed")
}

func TestWorkerRefusesASecondEmailForAnOrderAndIgnoresOtherEvents(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	ctx := context.Background()
	_, created := b.post(t, `{"customer_email": "reader@example.com", "amount": "19.99"}`)
	orderID := created["order_id"]
	// A producer bug: the same order announced twice, under two event ids.
	_, err := b.db.Exec(ctx, `INSERT INTO outbox_events (event_type, payload)
		SELECT event_type, payload FROM outbox_events;
		INSERT INTO outbox_events (event_type, payload) VALUES ('order_shipped', '{}'), ('order_created', 'not json')`)
	require.NoError(t, err)
	b.publishOutbox(t, 1)
	runInBackground(t, b.newConsumer(t, consumer.Config{}).Run)

	waitFor(t, "every entry acknowledged", func() bool { return b.drained(t) })
	waitFor(t, "two dead letters", func() bool {
		n, err := b.rdb.XLen(ctx, b.stream+".dead").Result()
		return err == nil && n == 2
	})
	require.Equal(t, map[string]string{orderID: "reader@example.com"}, b.emailsSent(t))
	dead, err := b.rdb.XRange(ctx, b.stream+".dead", "-", "+").Result()
	require.NoError(t, err)
	require.Contains(t, dead[0].Values["error"], "a confirmation email for order "+orderID+" was sent already")
	require.Contains(t, dead[1].Values["error"], "payload is not valid JSON")
	require.Contains(t, b.logs.String(), "Ignored an event of another type")
}

// TestWorkerDeadLettersAnEntryWithoutAnEventType: an entry that lacks the
// event_type field breaks the stream contract; the worker cannot tell whether
// it is an order_created, so it must not take it for "another type" and
// acknowledge it unhandled: it goes to the dead-letter stream.
func TestWorkerDeadLettersAnEntryWithoutAnEventType(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	ctx := context.Background()
	_, created := b.post(t, `{"customer_email": "reader@example.com", "amount": "19.99"}`)
	var eventID, payload string
	require.NoError(t, b.db.QueryRow(ctx, `SELECT id::text, payload FROM outbox_events`).Scan(&eventID, &payload))
	require.NoError(t, b.rdb.XAdd(ctx, &redis.XAddArgs{Stream: b.stream,
		Values: []any{"event_id", eventID, "payload", payload}}).Err())
	runInBackground(t, b.newConsumer(t, consumer.Config{}).Run)

	waitFor(t, "the entry acknowledged", func() bool { return b.drained(t) })
	require.Empty(t, b.emailsSent(t), "no email: the entry says nothing of its type")
	dead, err := b.rdb.XRange(ctx, b.stream+".dead", "-", "+").Result()
	require.NoError(t, err)
	require.Len(t, dead, 1, "acknowledged unhandled, and reported nowhere: order %s is never emailed", created["order_id"])
	require.Equal(t, eventID, dead[0].Values["event_id"])
	require.Contains(t, dead[0].Values["error"], "event_type")
}
