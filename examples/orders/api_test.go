package orders

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

func TestCreateOrderWritesTheOrderAndItsEventTogether(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	ctx := context.Background()

	status, body := b.post(t, `{"customer_email": "reader@example.com", "amount": "19.99"}`)
	require.Equal(t, http.StatusCreated, status, body)
	id := body["order_id"]
	require.Regexp(t, uuidRE, id)
	require.Len(t, body, 1)

	o, err := b.store.Get(ctx, id)
	require.NoError(t, err)
	require.Equal(t, "reader@example.com", o.CustomerEmail)
	require.Equal(t, "19.99", o.Amount)

	var typ, payload string
	var dispatched bool
	require.NoError(t, b.db.QueryRow(ctx,
		`SELECT event_type, payload, dispatched_at IS NOT NULL FROM outbox_events`).Scan(&typ, &payload, &dispatched))
	require.Equal(t, "order_created", typ)
	require.False(t, dispatched)
	require.JSONEq(t, `{"order_id": "`+id+`", "customer_email": "reader@example.com", "amount": "19.99"}`, payload)
	require.Equal(t, 1, b.count(t, "orders"))

	// The amount as stored: numeric(10,2), so "7.5" and 7.5 become "7.50".
	for _, amount := range []string{`"7.5"`, `7.5`} {
		status, body = b.post(t, `{"customer_email": "a@example.com", "amount": `+amount+`}`)
		require.Equal(t, http.StatusCreated, status, body)
		o, err = b.store.Get(ctx, body["order_id"])
		require.NoError(t, err)
		require.Equal(t, "7.50", o.Amount)
	}
}

func TestGetOrder(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	_, created := b.post(t, `{"customer_email": "reader@example.com", "amount": "19.99"}`)

	resp, err := http.Get(b.server.URL + "/orders/" + created["order_id"])
	require.NoError(t, err)
	defer func() { _ = resp.Body.Close() }()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var o Order
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&o))
	require.Equal(t, created["order_id"], o.ID)
	require.Equal(t, "19.99", o.Amount)
	require.WithinDuration(t, time.Now(), o.CreatedAt, time.Minute)

	for _, id := range []string{"6f1c8a52-3b1e-4f7e-9d43-2f0a8c1b7e11", "not-a-uuid", "1%27%20OR%201=1"} {
		resp, err := http.Get(b.server.URL + "/orders/" + id)
		require.NoError(t, err)
		body := decodeBody(t, resp)
		_ = resp.Body.Close()
		require.Equal(t, http.StatusNotFound, resp.StatusCode, id)
		require.Equal(t, "order not found", body["error"])
	}
}

func TestEveryBadInputGets400AndWritesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	for _, tc := range []struct {
		name, body, want string
	}{
		{"empty body", ``, "request body is empty"},
		{"malformed JSON", `{"customer_email": "reader@example.com", "amount": "19.99"`, "not valid JSON"},
		{"not JSON", `customer_email=reader@example.com`, "not valid JSON"},
		{"an array", `[{"customer_email": "reader@example.com", "amount": "19.99"}]`, "must be a JSON object"},
		{"two objects", `{"customer_email": "a@example.com", "amount": "1"}{"customer_email": "b@example.com", "amount": "1"}`, "single JSON object"},
		{"trailing data", `{"customer_email": "reader@example.com", "amount": "19.99"} x`, "single JSON object"},
		{"unknown field", `{"customer_email": "reader@example.com", "amount": "19.99", "coupon": "FREE"}`, `unknown field "coupon"`},
		{"missing email", `{"amount": "19.99"}`, "customer_email is required"},
		{"null email", `{"customer_email": null, "amount": "19.99"}`, "customer_email is required"},
		{"empty email", `{"customer_email": "", "amount": "19.99"}`, "customer_email is required"},
		{"email not a string", `{"customer_email": 42, "amount": "19.99"}`, "customer_email must be a JSON string"},
		{"no at sign", `{"customer_email": "reader.example.com", "amount": "19.99"}`, "not a valid email address"},
		{"display name", `{"customer_email": "Reader <reader@example.com>", "amount": "19.99"}`, "not a valid email address"},
		{"angle brackets", `{"customer_email": "<reader@example.com>", "amount": "19.99"}`, "not a valid email address"},
		{"spaces", `{"customer_email": " reader@example.com", "amount": "19.99"}`, "not a valid email address"},
		{"two addresses", `{"customer_email": "a@example.com, b@example.com", "amount": "19.99"}`, "not a valid email address"},
		{"newline", `{"customer_email": "reader@example.com\nBcc: x@example.com", "amount": "19.99"}`, "not a valid email address"},
		{"too long email", `{"customer_email": "` + strings.Repeat("a", 250) + `@example.com", "amount": "19.99"}`, "longer than 254"},
		{"missing amount", `{"customer_email": "reader@example.com"}`, "amount is required"},
		{"null amount", `{"customer_email": "reader@example.com", "amount": null}`, "amount is required"},
		{"zero", `{"customer_email": "reader@example.com", "amount": "0"}`, "above zero"},
		{"zero with places", `{"customer_email": "reader@example.com", "amount": "0.00"}`, "above zero"},
		{"negative", `{"customer_email": "reader@example.com", "amount": "-19.99"}`, "positive decimal"},
		{"three places", `{"customer_email": "reader@example.com", "amount": "19.999"}`, "positive decimal"},
		{"exponent", `{"customer_email": "reader@example.com", "amount": 1e3}`, "positive decimal"},
		{"too large", `{"customer_email": "reader@example.com", "amount": "123456789.00"}`, "positive decimal"},
		{"not a number", `{"customer_email": "reader@example.com", "amount": "NaN"}`, "positive decimal"},
		{"leading point", `{"customer_email": "reader@example.com", "amount": ".5"}`, "positive decimal"},
		{"trailing point", `{"customer_email": "reader@example.com", "amount": "5."}`, "positive decimal"},
		{"comma", `{"customer_email": "reader@example.com", "amount": "19,99"}`, "positive decimal"},
		{"spaces in amount", `{"customer_email": "reader@example.com", "amount": " 19.99"}`, "positive decimal"},
		{"boolean amount", `{"customer_email": "reader@example.com", "amount": true}`, "positive decimal"},
		{"object amount", `{"customer_email": "reader@example.com", "amount": {"value": "19.99"}}`, "positive decimal"},
	} {
		status, body := b.post(t, tc.body)
		require.Equal(t, http.StatusBadRequest, status, tc.name)
		require.Contains(t, body["error"], tc.want, tc.name)
	}

	resp, err := http.Post(b.server.URL+"/orders", "application/json",
		strings.NewReader(`{"customer_email": "reader@example.com", "amount": "19.99", "x": "`+strings.Repeat("a", MaxBodyBytes)+`"}`))
	require.NoError(t, err)
	body := decodeBody(t, resp)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode)
	require.Contains(t, body["error"], "larger than 16 KiB")

	resp, err = http.Get(b.server.URL + "/orders")
	require.NoError(t, err)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)

	require.Zero(t, b.count(t, "orders"))
	require.Zero(t, b.count(t, "outbox_events"))
}

func TestAFailureAfterTheOrderInsertLeavesNeitherRow(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		fault func(t *testing.T, b *testBundle)
	}{
		{"the transaction fails between the two inserts", func(_ *testing.T, b *testBundle) {
			b.store.testHookAfterOrderInsert = func(context.Context, pgx.Tx) error {
				return errors.New("process killed")
			}
		}},
		{"the connection dies between the two inserts", func(_ *testing.T, b *testBundle) {
			b.store.testHookAfterOrderInsert = func(ctx context.Context, tx pgx.Tx) error {
				var pid int32
				if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
					return err
				}
				_, err := b.db.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid)
				return err // the outbox insert then fails on the dead connection
			}
		}},
		{"the outbox insert fails", func(t *testing.T, b *testBundle) {
			_, err := b.db.Exec(context.Background(), `
				CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$
				BEGIN RAISE EXCEPTION 'outbox refuses rows'; END $$;
				CREATE TRIGGER refuse BEFORE INSERT ON outbox_events FOR EACH ROW EXECUTE FUNCTION refuse();`)
			require.NoError(t, err)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, bundleOpts{})
			tc.fault(t, b)

			status, body := b.post(t, `{"customer_email": "reader@example.com", "amount": "19.99"}`)

			require.Equal(t, http.StatusInternalServerError, status)
			require.Equal(t, "the order could not be stored; try again", body["error"])
			require.Zero(t, b.count(t, "orders"), "no order without its event")
			require.Zero(t, b.count(t, "outbox_events"))
			require.Contains(t, b.logs.String(), "Failed to create an order")
		})
	}
}

func TestProbes(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{noMigrate: true})
	get := func(path string) (int, map[string]string) {
		resp, err := http.Get(b.server.URL + path)
		require.NoError(t, err)
		defer func() { _ = resp.Body.Close() }()
		return resp.StatusCode, decodeBody(t, resp)
	}
	status, _ := get("/healthz")
	require.Equal(t, http.StatusOK, status)
	status, body := get("/readyz")
	require.Equal(t, http.StatusServiceUnavailable, status)
	require.Contains(t, body["error"], "run orders-api migrate")

	require.NoError(t, Migrate(context.Background(), b.db))
	require.NoError(t, Migrate(context.Background(), b.db), "idempotent")
	status, _ = get("/readyz")
	require.Equal(t, http.StatusOK, status)
}
