package outbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// The errors of a DSN that PoolConfig refuses. They never quote the DSN:
// pgx's parse errors do, with what pgx takes for the password masked, and it
// misreads some passwords (spaces around '=' or an escaped space in
// key/value pairs, an unencoded '@' in a URL), whose text then shows.
var (
	errDSNInvalid = errors.New("parsing DATABASE_URL: not a PostgreSQL connection string " +
		"(a postgres:// URL or key=value pairs; check the port, the quoting, and the percent-encoding of a URL)")
	// ErrDSNUserInfo: a postgres:// URL whose host holds an '@' (HostHoldsAt).
	ErrDSNUserInfo = errors.New("parsing DATABASE_URL: the URL's host holds an '@': " +
		"percent-encode '@' in the user and password as %40")
)

// PoolConfig parses a DSN into a pool configuration carrying the session
// settings. Its errors never contain the DSN or any part of the password.
func PoolConfig(dsn string, s SessionSettings, maxConns int32) (*pgxpool.Config, error) {
	if HostHoldsAt(dsn) {
		return nil, ErrDSNUserInfo
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, errDSNInvalid
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

// HostHoldsAt reports whether a postgres:// URL has an '@' in its hosts, after
// the user info as pgx reads it (up to the first '@'): a password with an
// unencoded '@', whose rest pgx would take for the host and quote in every
// connect error. No host name holds an '@'.
func HostHoldsAt(dsn string) bool {
	rest, ok := strings.CutPrefix(dsn, "postgres://")
	if !ok {
		if rest, ok = strings.CutPrefix(dsn, "postgresql://"); !ok {
			return false
		}
	}
	i := strings.IndexAny(rest, "@/")
	if i < 0 || rest[i] != '@' {
		return false
	}
	hosts := rest[i+1:]
	if j := strings.IndexAny(hosts, "/?"); j >= 0 {
		hosts = hosts[:j]
	}
	return strings.Contains(hosts, "@")
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
