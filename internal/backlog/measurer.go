package backlog

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"k8s.io/apimachinery/pkg/types"

	"github.com/outbox-dev/outbox-operator/internal/outbox"
)

// Target is what one relay's check measures.
type Target struct {
	// DSN is the PostgreSQL connection string from the relay's Secret.
	DSN string
	// Table is the relay's outbox table.
	Table *outbox.Table
	// Redis, when set, is checked too (redis.go), at most every
	// Config.RedisInterval.
	Redis *RedisTarget
	// Stream, when set, is the relay's stream: the check also reads its
	// recorded resets not yet replayed (outbox.Backlog.StreamResets).
	Stream string
}

// fingerprint identifies a target: a result belongs to the target it was
// measured for, and a new DSN or layout needs a new check.
func (t Target) fingerprint() string {
	c := t.Table.Columns()
	sum := sha256.Sum256(fmt.Appendf(nil, "%q %q %q %q %q %q %q %q",
		t.DSN, t.Table.String(), c.ID, c.EventType, c.Payload, c.CreatedAt, c.DispatchedAt, t.Stream))
	return hex.EncodeToString(sum[:]) + t.Redis.fingerprint()
}

// Measurer measures the backlog of one relay's target. It is the seam of the
// Prober: tests pass a fake that hangs or fails.
type Measurer interface {
	// Measure returns the backlog of target for the relay key. It must
	// return when ctx is done.
	Measure(ctx context.Context, key types.NamespacedName, target Target) (outbox.Backlog, error)
	// Release drops what the measurer holds for key (its share of a pool).
	Release(key types.NamespacedName)
	// Close releases everything.
	Close()
}

// PoolMeasurerConfig configures a PoolMeasurer. Zero fields take the
// documented defaults.
type PoolMeasurerConfig struct {
	// MaxConns bounds the connections of one pool (default 2).
	MaxConns int32
	// ConnectTimeout bounds establishing a connection (default 5s).
	ConnectTimeout time.Duration
	// StatementTimeout is the session's statement_timeout (default 5s).
	StatementTimeout time.Duration
	// LockTimeout is the session's lock_timeout (default 2s).
	LockTimeout time.Duration
	// IdleInTransactionTimeout is the session's
	// idle_in_transaction_session_timeout (default 10s).
	IdleInTransactionTimeout time.Duration
	// MaxConnIdleTime closes a connection idle that long (default 5m).
	MaxConnIdleTime time.Duration
	// ApplicationName shows in pg_stat_activity (default outbox-operator).
	ApplicationName string
}

func (c PoolMeasurerConfig) withDefaults() PoolMeasurerConfig {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	if c.MaxConns <= 0 {
		c.MaxConns = 2
	}
	def(&c.ConnectTimeout, 5*time.Second)
	def(&c.StatementTimeout, 5*time.Second)
	def(&c.LockTimeout, 2*time.Second)
	def(&c.IdleInTransactionTimeout, 10*time.Second)
	def(&c.MaxConnIdleTime, 5*time.Minute)
	if c.ApplicationName == "" {
		c.ApplicationName = "outbox-operator"
	}
	return c
}

// PoolMeasurer measures with pgx pools: one per namespace and DSN, shared by
// the relays of that namespace that use the DSN, so that a thousand relays on
// one database hold a handful of connections, not a thousand. A pool is
// created on first use and closed when no relay holds it any more.
type PoolMeasurer struct {
	cfg PoolMeasurerConfig

	mu    sync.Mutex
	pools map[string]*sharedPool          // by poolKey
	holds map[types.NamespacedName]string // relay -> poolKey
}

type sharedPool struct {
	pool *pgxpool.Pool
	refs int
}

var _ Measurer = (*PoolMeasurer)(nil)

// NewPoolMeasurer returns a PoolMeasurer; it connects lazily.
func NewPoolMeasurer(cfg PoolMeasurerConfig) *PoolMeasurer {
	return &PoolMeasurer{
		cfg:   cfg.withDefaults(),
		pools: map[string]*sharedPool{},
		holds: map[types.NamespacedName]string{},
	}
}

// poolKey scopes pools by namespace: relays of different namespaces never
// share a connection, even with the same DSN.
func poolKey(namespace, dsn string) string {
	sum := sha256.Sum256([]byte(dsn))
	return namespace + "/" + hex.EncodeToString(sum[:])
}

// Measure implements Measurer.
func (m *PoolMeasurer) Measure(ctx context.Context, key types.NamespacedName, target Target) (outbox.Backlog, error) {
	pool, err := m.acquire(key, target.DSN)
	if err != nil {
		return outbox.Backlog{}, err
	}
	b, err := target.Table.Backlog(ctx, pool)
	if err != nil {
		return outbox.Backlog{}, fmt.Errorf("measuring backlog of %s: %w", target.Table, err)
	}
	if target.Stream != "" {
		resets, err := target.Table.PendingStreamResets(ctx, pool, target.Stream)
		if err != nil {
			return outbox.Backlog{}, err
		}
		b.StreamResets = &resets
	}
	return b, nil
}

// acquire returns the pool for the relay's DSN, moving the relay's hold from
// its previous pool (closed when that was the last hold) to this one.
func (m *PoolMeasurer) acquire(key types.NamespacedName, dsn string) (*pgxpool.Pool, error) {
	pk := poolKey(key.Namespace, dsn)
	m.mu.Lock()
	defer m.mu.Unlock()
	if held, ok := m.holds[key]; ok && held == pk {
		return m.pools[pk].pool, nil
	}
	// The relay no longer wants its previous pool, whether or not the new
	// one can be made.
	m.releaseLocked(key)
	sp, ok := m.pools[pk]
	if !ok {
		pool, err := m.newPool(dsn)
		if err != nil {
			return nil, err
		}
		sp = &sharedPool{pool: pool}
		m.pools[pk] = sp
	}
	sp.refs++
	m.holds[key] = pk
	return sp.pool, nil
}

func (m *PoolMeasurer) newPool(dsn string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("parsing DSN: %w", err)
	}
	cfg.MaxConns = m.cfg.MaxConns
	cfg.MinConns = 0
	cfg.MaxConnIdleTime = m.cfg.MaxConnIdleTime
	cfg.ConnConfig.ConnectTimeout = m.cfg.ConnectTimeout
	outbox.SessionSettings{
		StatementTimeout:         m.cfg.StatementTimeout,
		LockTimeout:              m.cfg.LockTimeout,
		IdleInTransactionTimeout: m.cfg.IdleInTransactionTimeout,
		ApplicationName:          m.cfg.ApplicationName,
	}.Apply(&cfg.ConnConfig.Config)
	// NewWithConfig does not connect (MinConns is 0), so it cannot hang.
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		return nil, fmt.Errorf("creating connection pool: %w", err)
	}
	return pool, nil
}

// Release implements Measurer.
func (m *PoolMeasurer) Release(key types.NamespacedName) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.releaseLocked(key)
}

func (m *PoolMeasurer) releaseLocked(key types.NamespacedName) {
	pk, ok := m.holds[key]
	if !ok {
		return
	}
	delete(m.holds, key)
	sp := m.pools[pk]
	sp.refs--
	if sp.refs > 0 {
		return
	}
	delete(m.pools, pk)
	// Close waits for connections in use to be returned; the checks using
	// them end at their deadline, so close in the background.
	go sp.pool.Close()
}

// Close implements Measurer.
func (m *PoolMeasurer) Close() {
	m.mu.Lock()
	pools := m.pools
	m.pools = map[string]*sharedPool{}
	m.holds = map[types.NamespacedName]string{}
	m.mu.Unlock()
	for _, sp := range pools {
		sp.pool.Close()
	}
}

// Pools returns the number of open pools, for tests and metrics.
func (m *PoolMeasurer) Pools() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.pools)
}
