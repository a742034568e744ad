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

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"k8s.io/apimachinery/pkg/types"

	"github.com/outbox-dev/outbox-operator/internal/logical"
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
	// recorded resets not yet replayed (outbox.Backlog.StreamResets), and
	// the relays of the table of other streams or sources, seen recently
	// (outbox.Backlog.OtherRelays).
	Stream string
	// Slot, when set, is the replication slot of a relay of source
	// LogicalReplication: the backlog is then the rows created after the
	// slot's last published commit (outbox.Table.BacklogSince), and the
	// check reads the slot's state too (Result.Slot).
	Slot string
}

// fingerprint identifies a target: a result belongs to the target it was
// measured for, and a new DSN or layout needs a new check.
func (t Target) fingerprint() string {
	c := t.Table.Columns()
	sum := sha256.Sum256(fmt.Appendf(nil, "%q %q %q %q %q %q %q %q %q",
		t.DSN, t.Table.String(), c.ID, c.EventType, c.Payload, c.CreatedAt, c.DispatchedAt, t.Stream, t.Slot))
	return hex.EncodeToString(sum[:]) + t.Redis.fingerprint()
}

// Measurer makes the connections of the checks and measures over them. It
// is the seam of the Prober: tests pass a fake that hangs or fails.
type Measurer interface {
	// Connect returns a connection for a check of target by the relay key,
	// made within timeout: one kept idle from an earlier check, or a new
	// one. It must return when ctx is done.
	Connect(ctx context.Context, key types.NamespacedName, target Target, timeout time.Duration) (Conn, error)
	// Release drops what the measurer holds for key (its share of a pool).
	Release(key types.NamespacedName)
	// Close releases everything.
	Close()
}

// Conn is the connection of one check.
type Conn interface {
	// Measure returns the backlog of the target the connection was made
	// for. It must return when ctx is done.
	Measure(ctx context.Context) (outbox.Backlog, error)
	// Release ends the check's use of the connection, once Measure has
	// returned: the measurer keeps it for a later check, or closes it.
	Release()
}

// SlotConn is a Conn that also reads the state of a target's replication
// slot (Target.Slot); the Prober calls MeasureSlot after Measure, before
// Release.
type SlotConn interface {
	Conn
	MeasureSlot(ctx context.Context) (SlotResult, error)
}

// SlotResult is the state of a replication slot and what bounds it.
type SlotResult struct {
	// Status is the slot's row of pg_replication_slots.
	Status logical.SlotStatus
	// MaxWALKeepSize is the server's max_slot_wal_keep_size in bytes, -1
	// when unset (nothing bounds the WAL a slot keeps).
	MaxWALKeepSize int64
}

// SlotDropper drops the replication slot of a target (Target.Slot) over a
// connection made like a check's; an OutboxRelay of source
// LogicalReplication that is deleted needs it. The error is a *Failure:
// safe to show, no password and no connection string in it.
type SlotDropper interface {
	DropSlot(ctx context.Context, key types.NamespacedName, target Target, timeout time.Duration) error
}

// PoolMeasurerConfig configures a PoolMeasurer. Zero fields take the
// documented defaults.
type PoolMeasurerConfig struct {
	// MaxConns bounds the connections of one pool (default 2).
	MaxConns int32
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
	// MaxOpenConns bounds the connections open at once, those being made
	// included, across every pool (default 64). When none is free, the
	// connection idle the longest, of any pool, is closed to make room;
	// when none is idle, Connect waits for one within its timeout.
	MaxOpenConns int
	// CountLimit stops counting pending rows there (default 1,000,000): a
	// larger backlog is reported as CountLimit with Backlog.Capped, so a
	// huge backlog is still a number within the statement timeout.
	CountLimit int64
	// AllowFileKeys honours the DSN keys that read files of the operator's
	// pod (FileKeys); off, a DSN that sets one is refused (ParseDSN).
	AllowFileKeys bool
	// Now is the clock of the idle times (default time.Now).
	Now func() time.Time
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
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// PoolMeasurer measures over pgx connections, pooled per namespace and DSN:
// a pool is shared by the relays of that namespace that use the DSN, so
// that a thousand relays on one database hold a handful of connections, not
// a thousand. A pool is no goroutine and no connection of its own, only an
// account of its connections (at most MaxConns) and the relays that hold
// it; every connection counts against MaxOpenConns from its dial until it
// is closed, and an idle one is closed after MaxConnIdleTime, or to make
// room for another pool's. A dial runs in the goroutine of the check that
// needs it, within that check's connect timeout: none outlives its check.
type PoolMeasurer struct {
	cfg  PoolMeasurerConfig
	base *pgx.ConnConfig // ParseConfig("") once: the DSN's checked settings replace its Config

	mu    sync.Mutex
	pools map[string]*pool                // by poolKey
	holds map[types.NamespacedName]string // relay -> poolKey
	conns connSet
}

var (
	_ Measurer    = (*PoolMeasurer)(nil)
	_ SlotDropper = (*PoolMeasurer)(nil)
	_ SlotConn    = (*poolConn)(nil)
)

// NewPoolMeasurer returns a PoolMeasurer; it connects lazily.
func NewPoolMeasurer(cfg PoolMeasurerConfig) *PoolMeasurer {
	cfg = cfg.withDefaults()
	base, err := pgx.ParseConfig("")
	if err != nil {
		// ParseConfig("") fails only on a malformed PG* environment
		// variable of the operator's own process; each dial says so.
		base = nil
	}
	return &PoolMeasurer{
		cfg:   cfg,
		base:  base,
		pools: map[string]*pool{},
		holds: map[types.NamespacedName]string{},
		conns: newConnSet(cfg.MaxOpenConns),
	}
}

// pool is the account of one namespace and DSN.
type pool struct {
	// refs counts the relays holding the pool.
	refs int
	// open counts its connections, idle, in use or being made.
	open int
}

// poolKey scopes pools by namespace: relays of different namespaces never
// share a connection, even with the same DSN.
func poolKey(namespace, dsn string) string {
	sum := sha256.Sum256([]byte(dsn))
	return namespace + "/" + hex.EncodeToString(sum[:])
}

// Connect implements Measurer: an idle connection of the relay's pool
// (pinged first when idle more than a second), else a new one when the
// pool and MaxOpenConns have room (closing another pool's idle connection
// for it if need be), else it waits for one until timeout.
func (m *PoolMeasurer) Connect(ctx context.Context, key types.NamespacedName, target Target, timeout time.Duration) (Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	pk := poolKey(key.Namespace, target.DSN)
	// The relay no longer wants its previous pool, whether or not this
	// DSN can be used.
	m.releaseOther(key, pk)
	cfg, err := m.connConfig(target.DSN)
	if err != nil {
		return nil, err
	}
	m.hold(key, pk)
	for {
		pg, dial, evicted, wait, err := m.reserve(pk)
		switch {
		case err != nil:
			return nil, err
		case evicted != nil:
			// Closed to make room: look again, now that its slot is free.
			m.closeConns(evicted)
			continue
		case pg != nil:
			if m.cfg.Now().Sub(pg.since) > time.Second {
				if err := pg.conn.Ping(ctx); err != nil {
					m.closeConns(pg)
					continue
				}
			}
			return &poolConn{m: m, pool: pk, conn: pg.conn, table: target.Table, stream: target.Stream, slot: target.Slot}, nil
		case dial:
			d := &connDialer{m: m, next: cfg.DialFunc}
			cfg.DialFunc = d.dial
			conn, err := pgx.ConnectConfig(ctx, cfg)
			d.established.Store(true)
			m.dialDone(pk, err == nil)
			if err != nil {
				// Whether refused, silent or misnamed, it is one thing to
				// the tenant: errConnect (failure.go).
				return nil, fmt.Errorf("%w: %w", errConnect, err)
			}
			return &poolConn{m: m, pool: pk, conn: conn, table: target.Table, stream: target.Stream, slot: target.Slot}, nil
		}
		select {
		case <-wait:
			m.mu.Lock()
			m.conns.waitEnd()
			m.mu.Unlock()
		case <-ctx.Done():
			return nil, m.waitFailed(pk, ctx.Err())
		}
	}
}

// connConfig is the connection config of a DSN, its keys checked.
func (m *PoolMeasurer) connConfig(dsn string) (*pgx.ConnConfig, error) {
	connCfg, err := ParseDSN(dsn, m.cfg.AllowFileKeys)
	if err != nil {
		return nil, fmt.Errorf("parsing DSN: %w", err)
	}
	if m.base == nil {
		// See NewPoolMeasurer.
		_, err := pgx.ParseConfig("")
		return nil, fmt.Errorf("parsing DSN: the operator's PG* environment: %w", err)
	}
	// A config around the checked one: parsing the DSN again would honour
	// every key.
	cfg := m.base.Copy()
	cfg.Config = *connCfg
	outbox.SessionSettings{
		StatementTimeout:         m.cfg.StatementTimeout,
		LockTimeout:              m.cfg.LockTimeout,
		IdleInTransactionTimeout: m.cfg.IdleInTransactionTimeout,
		ApplicationName:          m.cfg.ApplicationName,
	}.Apply(&cfg.Config)
	// The context's deadline (the check's connect timeout) bounds the
	// connection, over every host the DSN names.
	cfg.ConnectTimeout = 0
	// A check runs three statements: a cache of a few keeps them prepared
	// on a reused connection, where pgx's defaults (two caches of 512
	// entries) take some 50 KiB a connection.
	cfg.StatementCacheCapacity = checkStatements
	cfg.DescriptionCacheCapacity = 0
	return cfg, nil
}

// reserve finds the relay's connection under the lock: an idle one of pool
// pk, or room to dial one (dial), or another pool's idle connection to close
// for room (evicted, then look again), or a channel closed when a
// connection is given back or closed (wait).
func (m *PoolMeasurer) reserve(pk string) (idle *idleConn, dial bool, evicted *idleConn, wait <-chan struct{}, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.conns.closed {
		return nil, false, nil, nil, errMeasurerClosed
	}
	p := m.poolLocked(pk)
	if idle = m.conns.takeIdle(pk); idle != nil {
		return idle, false, nil, nil, nil
	}
	if p.open < int(m.cfg.MaxConns) {
		if !m.conns.full() {
			p.open++
			m.conns.startDial()
			return nil, true, nil, nil, nil
		}
		if evicted = m.conns.evict(); evicted != nil {
			return nil, false, evicted, nil, nil
		}
	}
	return nil, false, nil, m.conns.waitStart(), nil
}

// dialDone accounts for a dial that ended, and for its connection if it
// failed.
func (m *PoolMeasurer) dialDone(pk string, ok bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.conns.endDial()
	if !ok {
		m.closedLocked(pk)
	}
}

// waitFailed ends a wait for a connection that ran out of time: because
// the pool's connections were all in use, or every connection slot.
func (m *PoolMeasurer) waitFailed(pk string, err error) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.conns.waitEnd()
	if p := m.pools[pk]; p != nil && p.open >= int(m.cfg.MaxConns) {
		return fmt.Errorf("connecting: %w: %w", errPoolBusy, err)
	}
	return fmt.Errorf("connecting: %w: %w", errNoConnSlot, err)
}

// closeConns closes connections taken out of the idle ones, or given back,
// then counts them closed: a connection counts against MaxOpenConns until
// its sockets are closed. pgconn closes a connection whose query was
// interrupted in the background (a cancel request, then draining, for up to
// 15 s): such a one is counted closed when that ends.
func (m *PoolMeasurer) closeConns(conns ...*idleConn) {
	closed := make([]*idleConn, 0, len(conns))
	for _, ic := range conns {
		ic.close()
		done := ic.conn.PgConn().CleanupDone()
		select {
		case <-done:
			closed = append(closed, ic)
		default:
			go func() {
				<-done
				m.mu.Lock()
				defer m.mu.Unlock()
				m.closedLocked(ic.pool)
			}()
		}
	}
	if len(closed) == 0 {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, ic := range closed {
		m.closedLocked(ic.pool)
	}
}

// connDialer dials for one connection. Its first socket, and those of the
// attempts of the same connect (each made after the previous one closed),
// use the slot reserve took; a later dial, pgconn's cancel request after an
// interrupted query, opens a second socket while the first is open, and
// needs a free slot of its own at once, or is not made.
type connDialer struct {
	m           *PoolMeasurer
	next        pgconn.DialFunc
	established atomic.Bool
}

func (d *connDialer) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	if !d.established.Load() {
		return d.next(ctx, network, addr)
	}
	if !d.m.takeExtraSlot() {
		return nil, errNoConnSlot
	}
	conn, err := d.next(ctx, network, addr)
	if err != nil {
		d.m.releaseExtraSlot()
		return nil, err
	}
	return &slotConn{Conn: conn, release: d.m.releaseExtraSlot}, nil
}

// takeExtraSlot takes a connection slot if one is free, without waiting.
func (m *PoolMeasurer) takeExtraSlot() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.conns.closed || m.conns.full() {
		return false
	}
	m.conns.open++
	return true
}

// releaseExtraSlot gives back what takeExtraSlot took.
func (m *PoolMeasurer) releaseExtraSlot() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.conns.closedOne()
}

// slotConn gives its slot back once closed.
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

// giveBack takes back the connection of a finished check: idle, for the
// next check of its pool, when the check succeeded and the pool is still
// held; closed otherwise.
func (m *PoolMeasurer) giveBack(pk string, conn *pgx.Conn, ok bool) {
	ic := &idleConn{conn: conn, pool: pk, since: m.cfg.Now()}
	m.mu.Lock()
	p := m.pools[pk]
	keep := ok && !conn.IsClosed() && !m.conns.closed && p != nil && p.refs > 0
	var expired []*idleConn
	if keep {
		expired = m.conns.putIdle(ic, m.cfg.MaxConnIdleTime, m.closeExpired)
	}
	m.mu.Unlock()
	if !keep {
		expired = append(expired, ic)
	}
	m.closeConns(expired...)
}

// closeExpired closes the connections idle longer than MaxConnIdleTime.
func (m *PoolMeasurer) closeExpired() {
	m.mu.Lock()
	expired := m.conns.expire(m.cfg.Now(), m.cfg.MaxConnIdleTime, m.closeExpired)
	m.mu.Unlock()
	m.closeConns(expired...)
}

// poolLocked returns pool pk, made when missing.
func (m *PoolMeasurer) poolLocked(pk string) *pool {
	p, ok := m.pools[pk]
	if !ok {
		p = &pool{}
		m.pools[pk] = p
	}
	return p
}

// closedLocked accounts for a connection of pool pk whose socket is closed
// (or whose dial failed), dropping the pool when nothing is left of it.
func (m *PoolMeasurer) closedLocked(pk string) {
	m.conns.closedOne()
	if p := m.pools[pk]; p != nil {
		p.open--
		m.dropIfUnusedLocked(pk, p)
	}
}

func (m *PoolMeasurer) dropIfUnusedLocked(pk string, p *pool) {
	if p.refs <= 0 && p.open <= 0 {
		delete(m.pools, pk)
	}
}

// hold makes the relay a holder of pool pk.
func (m *PoolMeasurer) hold(key types.NamespacedName, pk string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.holds[key] == pk {
		return
	}
	m.poolLocked(pk).refs++
	m.holds[key] = pk
}

// releaseOther drops the relay's hold on a pool other than pk.
func (m *PoolMeasurer) releaseOther(key types.NamespacedName, pk string) {
	m.mu.Lock()
	held, ok := m.holds[key]
	var idle []*idleConn
	if ok && held != pk {
		idle = m.releaseLocked(key)
	}
	m.mu.Unlock()
	m.closeConns(idle...)
}

// Release implements Measurer.
func (m *PoolMeasurer) Release(key types.NamespacedName) {
	m.mu.Lock()
	idle := m.releaseLocked(key)
	m.mu.Unlock()
	m.closeConns(idle...)
}

// releaseLocked drops the relay's hold; when it was the pool's last, it
// returns the pool's idle connections to close (those in use are closed
// when given back).
func (m *PoolMeasurer) releaseLocked(key types.NamespacedName) []*idleConn {
	pk, ok := m.holds[key]
	if !ok {
		return nil
	}
	delete(m.holds, key)
	p := m.pools[pk]
	p.refs--
	if p.refs > 0 {
		return nil
	}
	m.dropIfUnusedLocked(pk, p)
	return m.conns.takeAllIdle(pk)
}

// Close implements Measurer: it closes the idle connections, and those in
// use when they are given back.
func (m *PoolMeasurer) Close() {
	m.mu.Lock()
	idle := m.conns.close()
	m.holds = map[types.NamespacedName]string{}
	for pk, p := range m.pools {
		p.refs = 0
		m.dropIfUnusedLocked(pk, p)
	}
	m.mu.Unlock()
	m.closeConns(idle...)
}

// Pools returns the number of pools, for tests and metrics.
func (m *PoolMeasurer) Pools() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.pools)
}

// poolConn is a connection of a pool, lent to one check.
type poolConn struct {
	m      *PoolMeasurer
	pool   string
	conn   *pgx.Conn
	table  *outbox.Table
	stream string
	slot   string

	ok   bool
	once sync.Once
}

// Measure implements Conn.
func (c *poolConn) Measure(ctx context.Context) (outbox.Backlog, error) {
	var b outbox.Backlog
	var err error
	if c.slot != "" {
		b, err = c.backlogSince(ctx)
	} else {
		b, err = c.table.BacklogUpTo(ctx, c.conn, c.m.cfg.CountLimit)
	}
	if err != nil {
		return outbox.Backlog{}, fmt.Errorf("measuring backlog of %s: %w", c.table, err)
	}
	if c.stream != "" {
		resets, err := c.table.PendingStreamResets(ctx, c.conn, c.stream)
		if err != nil {
			return outbox.Backlog{}, err
		}
		b.StreamResets = &resets
		// One OutboxRelay per table: the relays of this one register
		// with its stream and slot, so they never count.
		b.OtherRelays, err = c.table.ConflictingRelays(ctx, c.conn, outbox.TableRelay{Stream: c.stream, Slot: c.slot})
		if err != nil {
			return outbox.Backlog{}, err
		}
	}
	c.ok = true
	return b, nil
}

// backlogSince is the backlog of a logical replication relay: the rows
// created after its slot's last published commit. Until a relay of that
// source has run, there is no progress table: then nothing has been
// streamed, and the backlog is every row not marked dispatched (what the
// relay's first catch-up publishes).
func (c *poolConn) backlogSince(ctx context.Context) (outbox.Backlog, error) {
	b, err := c.table.BacklogSince(ctx, c.conn, c.slot, c.m.cfg.CountLimit)
	if errors.Is(err, outbox.ErrTableNotFound) {
		if exists, existsErr := c.table.Exists(ctx, c.conn); existsErr == nil && exists {
			return c.table.BacklogUpTo(ctx, c.conn, c.m.cfg.CountLimit)
		}
	}
	return b, err
}

// MeasureSlot implements SlotConn.
func (c *poolConn) MeasureSlot(ctx context.Context) (SlotResult, error) {
	status, err := logical.Status(ctx, c.conn, c.slot)
	if err != nil {
		c.ok = false
		return SlotResult{}, err
	}
	keep, err := logical.MaxSlotWALKeepSize(ctx, c.conn)
	if err != nil {
		c.ok = false
		return SlotResult{}, err
	}
	return SlotResult{Status: status, MaxWALKeepSize: keep}, nil
}

// DropSlot implements SlotDropper: it drops target.Slot over a connection
// of the relay's pool, within timeout for the connection and again for the
// drop (which terminates a walsender still holding the slot first).
func (m *PoolMeasurer) DropSlot(ctx context.Context, key types.NamespacedName, target Target, timeout time.Duration) error {
	secret := passwordOf(target.DSN, m.cfg.AllowFileKeys)
	conn, err := m.Connect(ctx, key, target, timeout)
	if err != nil {
		return classify(err, timeout.String(), target.DSN, secret)
	}
	pc := conn.(*poolConn)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	err = logical.DropSlot(ctx, pc.conn, target.Slot)
	pc.ok = err == nil
	pc.Release()
	if err != nil {
		return classify(err, timeout.String(), target.DSN, secret)
	}
	return nil
}

// Release implements Conn.
func (c *poolConn) Release() {
	c.once.Do(func() { c.m.giveBack(c.pool, c.conn, c.ok) })
}

// checkStatements is the size of a connection's statement cache: more than
// the statements of a check (the backlog, the dead letters, the stream
// resets, the relays table; with a replication slot, its status and max_slot_wal_keep_size).
const checkStatements = 10

// errConnect: no connection could be made (refused, silent, a name not
// resolved, TLS failed, or the server refused the login).
var errConnect = errors.New("connecting to PostgreSQL")

// errNoConnSlot: every slot of MaxOpenConns stayed taken until the deadline.
var errNoConnSlot = errors.New("no free backlog connection slot")

// errPoolBusy: every connection of the relay's pool (MaxConns) stayed in
// use until the deadline.
var errPoolBusy = errors.New("every connection of the backlog pool in use")

// errMeasurerClosed: the measurer was closed (the manager stops).
var errMeasurerClosed = errors.New("the backlog measurer is closed")

// ConnStats are the connections of a PoolMeasurer, for metrics.
type ConnStats struct {
	// Open is the number of connections open now (being made included),
	// across every pool.
	Open int
	// Max is MaxOpenConns.
	Max int
	// Dialing is the number of connections being made now.
	Dialing int
	// Waiting is the number of checks waiting for a connection: every
	// slot taken and none idle, or every connection of their pool in use.
	Waiting int
	// Pools is the number of pools.
	Pools int
}

// ConnStats returns the current connection figures.
func (m *PoolMeasurer) ConnStats() ConnStats {
	m.mu.Lock()
	defer m.mu.Unlock()
	return ConnStats{
		Open: m.conns.open, Max: m.conns.max, Dialing: m.conns.dialing, Waiting: m.conns.waiting, Pools: len(m.pools),
	}
}
