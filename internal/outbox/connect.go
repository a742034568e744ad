package outbox

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// PoolConfig parses a DSN into a pool configuration carrying the session
// settings. Parse errors never contain the password: pgx redacts it, and
// the error is wrapped without the DSN.
func PoolConfig(dsn string, s SessionSettings, maxConns int32) (*pgxpool.Config, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("parsing DATABASE_URL: %w", err)
	}
	s.Apply(&cfg.ConnConfig.Config)
	if s.WarmAllocator {
		cfg.PrepareConn = warmForClaims
	}
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	return cfg, nil
}

// WarmForClaims acquires n sessions of pool at once for claims (ForClaims),
// which warms those of a pool of SessionSettings.WarmAllocator that were
// not yet, and releases them: the relay's claiming sessions, warmed before
// its first claim instead of one by one on the claims' path. Best effort:
// a session that cannot be had now is warmed at its first claim.
func WarmForClaims(ctx context.Context, pool *pgxpool.Pool, n int) {
	ctx = ForClaims(ctx)
	conns := make([]*pgxpool.Conn, n)
	var wg sync.WaitGroup
	for i := range conns {
		wg.Go(func() { conns[i], _ = pool.Acquire(ctx) })
	}
	wg.Wait()
	for _, c := range conns {
		if c != nil {
			c.Release()
		}
	}
}

// DeleteAllDispatched deletes every row dispatched longer than retention
// ago, batchSize rows per statement, each statement its own short
// transaction, so no lock is held for long. progress, when not nil, is
// called after each batch with the running total.
func (t *Table) DeleteAllDispatched(ctx context.Context, q Querier, retention time.Duration, batchSize int,
	progress func(total int64)) (int64, error) {
	var total int64
	for {
		n, err := t.DeleteDispatched(ctx, q, retention, batchSize)
		if err != nil {
			return total, fmt.Errorf("deleting dispatched rows: %w", err)
		}
		total += n
		if progress != nil && n > 0 {
			progress(total)
		}
		if n < int64(batchSize) {
			return total, nil
		}
		if err := ctx.Err(); err != nil {
			return total, err
		}
	}
}
