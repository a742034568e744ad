package relay

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/outbox-dev/outbox-operator/internal/syncbuf"
	"github.com/outbox-dev/outbox-operator/internal/testenv"
)

// TestStreamCheckRefusedIsReported: a Redis (an ACL user without
// +xinfo|stream, or a proxy that does not support XINFO) that answers every
// XADD but refuses the stream check that each batch runs before them. The
// relay publishes and commits; when Redis then loses the stream (a restart
// without persistence, here FLUSHALL), it cannot see the reset. That must
// not be silent: the relay says, at warn level and in its error counter,
// that its stream checks are refused and a loss would go unnoticed.
func TestStreamCheckRefusedIsReported(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedis(t)
	b := setup(t, bundleOpts{redisURL: srv.URL()})
	ctx := context.Background()
	require.NoError(t, b.rdb.Do(ctx, "ACL", "SETUSER", "relay", "on", ">relay-pw", "~*", "&*", "+@all", "-xinfo").Err())
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: "relay", Password: "relay-pw",
		MaxRetries: -1, ContextTimeoutEnabled: true, DialTimeout: time.Second})
	t.Cleanup(func() { _ = rdb.Close() })
	require.NoError(t, b.table.EnsureStreamResetsTable(ctx, b.db))

	var logs syncbuf.Buffer
	cfg := Config{Table: b.table, Stream: b.stream, BatchSize: 10, InFlight: 1, Logger: newTestLogger(&logs),
		MinBackoff: 10 * time.Millisecond, MaxBackoff: 200 * time.Millisecond, PollInterval: 20 * time.Millisecond}
	r, err := New(cfg, b.db, rdb)
	require.NoError(t, err)

	b.insert(t, 25)
	b.drain(t, r)
	require.EqualValues(t, 25, b.streamLen(t), "the XADDs are accepted")

	require.NoError(t, b.rdb.FlushAll(ctx).Err()) // Redis lost the stream
	b.insert(t, 5)
	b.drain(t, r)
	r.checkStream(ctx)

	resets := testutilCounter(r.cfg.Metrics.stream.Resets)
	refused := testutilCounter(r.cfg.Metrics.Errors.WithLabelValues(ErrorKindStreamCheck))
	warned := strings.Contains(logs.String(), "level=WARN msg=\"Cannot look at the stream")
	require.True(t, resets > 0 || (refused > 0 && warned),
		"Redis lost 25 committed events: no reset counted (%v), no stream check failure counted (%v) or logged:\n%s",
		resets, refused, logs.String())
	require.Contains(t, logs.String(), "NOPERM")
	// Said the first time in a row, then at most once a minute: not on every batch.
	require.Less(t, strings.Count(logs.String(), "level=WARN msg=\"Cannot look at the stream"), 2, logs.String())
}
