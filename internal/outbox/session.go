package outbox

import (
	"context"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-dev/outbox-operator/internal/netdial"
)

// SessionSettings are the run-time parameters every session that touches the
// outbox sets, so a client cut off mid-transaction can never pin row locks
// for long. docs/relay.md ("Bounded locks") adds them up into the worst case.
type SessionSettings struct {
	// StatementTimeout bounds every statement.
	StatementTimeout time.Duration
	// LockTimeout bounds every wait for a lock.
	LockTimeout time.Duration
	// IdleInTransactionTimeout ends a session that sits in an open
	// transaction, releasing its locks.
	IdleInTransactionTimeout time.Duration
	// ApplicationName shows in pg_stat_activity.
	ApplicationName string

	// TCP bounds the link on both ends: the client's socket (keepalives,
	// TCP_USER_TIMEOUT) and, through the server's GUCs of the same names
	// (tcp_keepalives_*, tcp_user_timeout), the backend's. The backend's
	// side is what matters for locks: a backend blocked sending a claim's
	// result to a client that stopped reading ignores statement_timeout,
	// and only tcp_user_timeout ends it.
	TCP netdial.TCP

	// StablePlans makes the planner prefer index and TID scans to
	// sequential and bitmap scans and nested loops to hash and merge joins,
	// so the claim's plan does not depend on the table's statistics (an
	// outbox analyzed while nearly empty otherwise gets a sequential scan
	// per batch). For the relay's sessions, which run only the claim.
	StablePlans bool

	// WarmAllocator makes a session of a pool made by PoolConfig allocate
	// and free one 16 MiB value (warmAllocatorSQL) the first time it is
	// acquired for a claim (ForClaims), for the relay's sessions, which
	// claim all the time. A PostgreSQL backend linked with glibc (the usual
	// Linux build) gets memory blocks of 128 KiB and more from mmap,
	// returns them at once when the statement ends and takes them again
	// from the kernel, page by page, at the next claim: on a fresh session
	// a claim of 500 rows spent about a third of its time in page faults
	// and zeroing (perf, 2026-12-04), and the claim statement ran 1.4 to
	// 1.5 times as long as on a session that had once freed a large block.
	// glibc raises its mmap threshold to the size of a freed mmap block (up
	// to 32 MiB) and its trim threshold to twice that, so after this one
	// statement the claims' blocks come from the heap and stay there. It
	// costs the session one transient 16 MiB allocation, and the backend
	// the CPU of faulting its pages in: 100 to 150 ms on the benchmark's
	// virtual machines, where a page fault is slow, which is why only the
	// sessions that claim pay it (2026-12-05: warming every session at
	// connect cost PostgreSQL 4.5 ms per 1,000 events of a 100,000-row
	// drain). With another allocator (musl) it does nothing. A failure is
	// ignored: the session claims as it would have.
	WarmAllocator bool
}

// warmAllocatorSQL allocates a 16 MiB value in the backend and frees it
// (WarmAllocator): below glibc's 32 MiB ceiling for the mmap threshold.
// repeat of a 4 KiB string copies it 4,096 times, and octet_length reads the
// length without scanning the characters (length of a text counts them).
const warmAllocatorSQL = `SELECT octet_length(repeat(repeat('x', 4096), 4096))`

// warmedKey marks a session in pgconn's CustomData once it ran
// warmAllocatorSQL.
const warmedKey = "outbox.warmed"

// forClaimsKey is the context key of ForClaims.
type forClaimsKey struct{}

// ForClaims marks ctx as that of a claim's acquisition of a session (the
// relay's Begin of a batch): in a pool of SessionSettings.WarmAllocator, a
// session acquired with it is warmed first, once.
func ForClaims(ctx context.Context) context.Context {
	return context.WithValue(ctx, forClaimsKey{}, true)
}

// warmForClaims is the pool's PrepareConn for WarmAllocator: it warms a
// session acquired for a claim that was not warmed yet. The connection is
// always kept: a failed warm-up leaves a session that claims as before, and
// a broken one fails its next statement.
func warmForClaims(ctx context.Context, c *pgx.Conn) (bool, error) {
	if claims, _ := ctx.Value(forClaimsKey{}).(bool); !claims {
		return true, nil
	}
	data := c.PgConn().CustomData()
	if _, done := data[warmedKey]; done {
		return true, nil
	}
	data[warmedKey] = true // tried once, whatever the outcome
	_, _ = c.PgConn().Exec(ctx, warmAllocatorSQL).ReadAll()
	return true, nil
}

// stablePlanParams are the planner settings StablePlans sets to off: the plan
// shapes that are only right when the statistics are. Each is still used
// where nothing else can run the query.
var stablePlanParams = []string{"enable_seqscan", "enable_bitmapscan", "enable_hashjoin", "enable_mergejoin"}

// TextOutputParams are the run-time parameters that decide the text of a
// value (a column's ::text, a type's output function), each at PostgreSQL's
// default but TimeZone, which is UTC (see the package doc). Every session
// that reads events sets them, as does the logical replication reader: an
// event's id and key are that text, and a database or role may set them
// otherwise (ALTER ROLE ... SET DateStyle = 'SQL, DMY', bytea_output =
// 'escape'), which would change a date key or a bytea id from one session
// to the next, and the key's partition with it.
func TextOutputParams() map[string]string {
	return map[string]string{
		"TimeZone":           "UTC",
		"DateStyle":          "ISO",
		"IntervalStyle":      "postgres",
		"extra_float_digits": "1",
		"bytea_output":       "hex",
	}
}

// RuntimeParams returns the settings as pgx ConnConfig.RuntimeParams, with
// TextOutputParams.
func (s SessionSettings) RuntimeParams() map[string]string {
	p := TextOutputParams()
	ms := func(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) }
	secs := func(d time.Duration) string { return strconv.FormatInt(max(int64(d/time.Second), 1), 10) }
	if s.StatementTimeout > 0 {
		p["statement_timeout"] = ms(s.StatementTimeout)
	}
	if s.LockTimeout > 0 {
		p["lock_timeout"] = ms(s.LockTimeout)
	}
	if s.IdleInTransactionTimeout > 0 {
		p["idle_in_transaction_session_timeout"] = ms(s.IdleInTransactionTimeout)
	}
	if s.ApplicationName != "" {
		p["application_name"] = s.ApplicationName
	}
	if s.TCP.UserTimeout > 0 {
		p["tcp_user_timeout"] = ms(s.TCP.UserTimeout)
	}
	if s.TCP.KeepaliveIdle > 0 {
		p["tcp_keepalives_idle"] = secs(s.TCP.KeepaliveIdle)
	}
	if s.TCP.KeepaliveInterval > 0 {
		p["tcp_keepalives_interval"] = secs(s.TCP.KeepaliveInterval)
	}
	if s.TCP.KeepaliveCount > 0 {
		p["tcp_keepalives_count"] = strconv.Itoa(s.TCP.KeepaliveCount)
	}
	if s.StablePlans {
		for _, k := range stablePlanParams {
			p[k] = "off"
		}
	}
	return p
}

// Apply sets the settings on a parsed pgx configuration: the run-time
// parameters and, when TCP is set, a dialer with the same keepalives and
// user timeout on the client's socket.
func (s SessionSettings) Apply(cfg *pgconn.Config) {
	if cfg.RuntimeParams == nil {
		cfg.RuntimeParams = map[string]string{}
	}
	for k, v := range s.RuntimeParams() {
		cfg.RuntimeParams[k] = v
	}
	if s.TCP != (netdial.TCP{}) {
		cfg.DialFunc = s.TCP.Dialer(cfg.ConnectTimeout).DialContext
	}
}
