package orders

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// commitCutConn passes everything through until it sends a COMMIT; then,
// once the commit is visible to another session, it drops the connection
// before the server's answer is read: a connection lost during COMMIT,
// after the server committed.
type commitCutConn struct {
	net.Conn
	committed func() // returns once the commit is visible elsewhere
	cut       atomic.Bool
}

func (c *commitCutConn) Write(p []byte) (int, error) {
	if len(p) > 0 && p[0] == 'Q' && bytes.Contains(bytes.ToLower(p), []byte("commit")) {
		c.cut.Store(true)
	}
	return c.Conn.Write(p)
}

func (c *commitCutConn) Read(p []byte) (int, error) {
	if c.cut.Load() {
		c.committed()
		_ = c.Close()
	}
	return c.Conn.Read(p)
}

// TestAnAmbiguousCommitIsNotReportedAsAFailure: when the connection is lost
// during COMMIT, the API cannot know whether the order was stored. It must
// not tell the client "could not be stored; try again" (a retry is a second
// order, and a second email), but say that the outcome is unknown and give
// the order's id, so the client can look it up before retrying.
func TestAnAmbiguousCommitIsNotReportedAsAFailure(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	ctx := context.Background()

	cfg := b.db.Config() // a copy: the bundle's database and session settings
	dial := cfg.ConnConfig.DialFunc
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &commitCutConn{Conn: conn, committed: func() {
			deadline := time.Now().Add(10 * time.Second)
			for time.Now().Before(deadline) && b.count(t, "orders") == 0 {
				time.Sleep(10 * time.Millisecond)
			}
		}}, nil
	}
	faulty, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(faulty.Close)
	server := httptest.NewServer(NewAPI(NewStore(faulty), b.log).Handler())
	t.Cleanup(server.Close)
	b.server = server

	status, body := b.post(t, `{"customer_email": "reader@example.com", "amount": "19.99"}`)

	// The order and its event committed: the relay will publish it and the
	// worker will email the customer.
	require.Equal(t, 1, b.count(t, "orders"))
	require.Equal(t, 1, b.count(t, "outbox_events"))
	var stored string
	require.NoError(t, b.db.QueryRow(ctx, `SELECT id::text FROM orders`).Scan(&stored))

	require.NotEqual(t, http.StatusCreated, status, "the API did not see the commit succeed")
	require.NotEqual(t, "the order could not be stored; try again", body["error"],
		"the order was stored: telling the client to try again makes a second order")
	require.Contains(t, body["error"], "unknown")
	require.Equal(t, stored, body["order_id"], "the client can look the order up before retrying")

	resp, err := http.Get(b.server.URL + "/orders/" + body["order_id"])
	require.NoError(t, err)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
}
