package outbox

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/outbox-dev/outbox-operator/internal/testenv"
)

// TestWarmAllocatorRunsAfterConnect: a session of SessionSettings with
// WarmAllocator has run the warm-up statement once connected (the last
// statement pg_stat_activity shows for it), after an AfterConnect set
// before, which still runs.
func TestWarmAllocatorRunsAfterConnect(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := testenv.Postgres(t)
	for _, warm := range []bool{false, true} {
		cfg, err := pgx.ParseConfig(dsn)
		require.NoError(t, err)
		earlier := false
		cfg.AfterConnect = func(context.Context, *pgconn.PgConn) error { earlier = true; return nil }
		SessionSettings{WarmAllocator: warm}.Apply(&cfg.Config)
		conn, err := pgx.ConnectConfig(ctx, cfg)
		require.NoError(t, err)
		defer func() { _ = conn.Close(ctx) }()
		require.True(t, earlier, "the AfterConnect set before still runs")

		other, err := pgx.Connect(ctx, dsn)
		require.NoError(t, err)
		defer func() { _ = other.Close(ctx) }()
		var last string
		require.NoError(t, other.QueryRow(ctx, `SELECT query FROM pg_stat_activity WHERE pid = $1`,
			conn.PgConn().PID()).Scan(&last))
		if warm {
			require.Equal(t, warmAllocatorSQL, last)
		} else {
			require.Empty(t, last, "no statement without WarmAllocator")
		}
	}
}
