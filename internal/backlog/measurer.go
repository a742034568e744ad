package backlog

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
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
	// MaxOpenConns bounds the connections open at once across every pool
	// (default 64). A connection waits for a free slot within its connect
	// timeout; while it waits, idle connections of every pool are closed.
	MaxOpenConns int
	// CountLimit stops counting pending rows there (default 1,000,000): a
	// larger backlog is reported as CountLimit with Backlog.Capped, so a
	// huge backlog is still a number within the statement timeout.
	CountLimit int64
	// AllowFileKeys honours the DSN keys that read files of the operator's
	// pod (FileKeys); off, a DSN that sets one is refused (ParseDSN).
	AllowFileKeys bool
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
	if c.MaxOpenConns <= 0 {
		c.MaxOpenConns = 64
	}
	if c.CountLimit <= 0 {
		c.CountLimit = 1_000_000
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

	// slots holds one token per open connection, across every pool.
	slots   chan struct{}
	waiting atomic.Int64
}

type sharedPool struct {
	pool *pgxpool.Pool
	refs int
}

var _ Measurer = (*PoolMeasurer)(nil)

// NewPoolMeasurer returns a PoolMeasurer; it connects lazily.
func NewPoolMeasurer(cfg PoolMeasurerConfig) *PoolMeasurer {
	cfg = cfg.withDefaults()
	return &PoolMeasurer{
		cfg:   cfg,
		pools: map[string]*sharedPool{},
		holds: map[types.NamespacedName]string{},
		slots: make(chan struct{}, cfg.MaxOpenConns),
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
	// pgconn turns a dial that ran out of time into a plain timeout: the
	// dial marks the wait for a slot here instead.
	slotWait := new(atomic.Bool)
	ctx = context.WithValue(ctx, slotWaitKey{}, slotWait)
	conn, err := pool.Acquire(ctx)
	switch {
	case err != nil && slotWait.Load():
		return outbox.Backlog{}, fmt.Errorf("connecting: %w", errNoConnSlot)
	case err != nil:
		// Whether refused, silent or misnamed, it is one thing to the
		// tenant: errConnect (failure.go).
		return outbox.Backlog{}, fmt.Errorf("%w: %w", errConnect, err)
	}
	defer conn.Release()
	b, err := target.Table.BacklogUpTo(ctx, conn, m.cfg.CountLimit)
	if err != nil {
		return outbox.Backlog{}, fmt.Errorf("measuring backlog of %s: %w", target.Table, err)
	}
	if target.Stream != "" {
		resets, err := target.Table.PendingStreamResets(ctx, conn, target.Stream)
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
	connCfg, err := ParseDSN(dsn, m.cfg.AllowFileKeys)
	if err != nil {
		return nil, fmt.Errorf("parsing DSN: %w", err)
	}
	// A pool config around the checked connection config: parsing the DSN
	// again would honour every key.
	cfg, err := pgxpool.ParseConfig("")
	if err != nil {
		return nil, fmt.Errorf("parsing DSN: %w", err)
	}
	cfg.ConnConfig.Config = *connCfg
	cfg.ConnConfig.DialFunc = m.limitDial(connCfg.DialFunc)
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

// errConnect: no connection could be made (refused, silent, a name not
// resolved, TLS failed, or the server refused the login).
var errConnect = errors.New("connecting to PostgreSQL")

// errNoConnSlot: every slot of MaxOpenConns stayed taken until the deadline.
var errNoConnSlot = errors.New("no free backlog connection slot")

// limitDial wraps a dial function so that every connection holds one of the
// MaxOpenConns slots from the dial until it is closed.
func (m *PoolMeasurer) limitDial(next pgconn.DialFunc) pgconn.DialFunc {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		if err := m.takeSlot(ctx); err != nil {
			return nil, err
		}
		conn, err := next(ctx, network, addr)
		if err != nil {
			<-m.slots
			return nil, err
		}
		return &slotConn{Conn: conn, release: func() { <-m.slots }}, nil
	}
}

// takeSlot takes a slot, closing idle connections of every pool when none
// is free, then waiting for one until ctx is done.
func (m *PoolMeasurer) takeSlot(ctx context.Context) error {
	select {
	case m.slots <- struct{}{}:
		return nil
	default:
	}
	m.waiting.Add(1)
	defer m.waiting.Add(-1)
	m.closeIdle(ctx)
	select {
	case m.slots <- struct{}{}:
		return nil
	case <-ctx.Done():
		if w, ok := ctx.Value(slotWaitKey{}).(*atomic.Bool); ok {
			w.Store(true)
		}
		return fmt.Errorf("%w: %w", errNoConnSlot, ctx.Err())
	}
}

// slotWaitKey is the context key of the flag a dial sets when it gave up
// waiting for a slot.
type slotWaitKey struct{}

// closeIdle closes the idle connections of every pool, freeing their slots.
func (m *PoolMeasurer) closeIdle(ctx context.Context) {
	m.mu.Lock()
	pools := make([]*pgxpool.Pool, 0, len(m.pools))
	for _, sp := range m.pools {
		pools = append(pools, sp.pool)
	}
	m.mu.Unlock()
	for _, p := range pools {
		for _, c := range p.AcquireAllIdle(ctx) {
			conn := c.Hijack()
			closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
			_ = conn.Close(closeCtx)
			cancel()
		}
	}
}

// slotConn gives its slot back when closed, once.
type slotConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *slotConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

// ConnStats are the connections of a PoolMeasurer, for metrics.
type ConnStats struct {
	// Open is the number of connections open now, across every pool.
	Open int
	// Max is MaxOpenConns.
	Max int
	// Waiting is the number of dials waiting for a free slot.
	Waiting int
	// Pools is the number of pools.
	Pools int
}

// ConnStats returns the current connection figures.
func (m *PoolMeasurer) ConnStats() ConnStats {
	return ConnStats{Open: len(m.slots), Max: cap(m.slots), Waiting: int(m.waiting.Load()), Pools: m.Pools()}
}
