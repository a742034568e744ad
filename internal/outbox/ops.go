package outbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// Querier is what the operations need from a connection, pool or
// transaction: pgx.Tx, *pgx.Conn and *pgxpool.Pool all satisfy it.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Event is one outbox row as the relay publishes it.
type Event struct {
	ID        string
	Type      string
	Payload   string
	CreatedAt time.Time
	// Malformed says why the row cannot be published as an event (a NULL
	// id, type or payload); empty for a well-formed row. Such rows are
	// claimed like the others, so that the relay can park them instead of
	// stalling on them.
	Malformed string

	// Key and Partition are the row's key and key partition, set by
	// ClaimKeyed only.
	Key       string
	Partition int
	// keyed: Key was read (a keyed claim; "" is a NULL key then), so a
	// parked copy keeps it.
	keyed bool

	// null marks the id, type and payload columns that were NULL, so that a
	// parked copy keeps NULL rather than an empty string.
	null [3]bool
}

// Size is what the event holds in memory, about: its id, type, payload and
// key. A claim's byte budget (Limit.Bytes) adds these up.
func (e *Event) Size() int { return len(e.ID) + len(e.Type) + len(e.Payload) + len(e.Key) }

// Limit bounds a claim: at most Rows rows and, when Bytes is above 0, rows
// whose Sizes add up to at most Bytes. The first row is always taken,
// whatever its size: a row larger than the budget is claimed alone, not
// left behind.
type Limit struct {
	Rows  int
	Bytes int
}

// Rows is a Limit of n rows and no byte budget.
func Rows(n int) Limit { return Limit{Rows: n} }

// RowsFitting is how many rows of the average size of a sample (n rows of
// size bytes in all) fit in l: at most l.Rows, at least one. A reader that
// grows its reads learns the rows' size from the last one with it.
func (l Limit) RowsFitting(n int, size int64) int {
	if l.Bytes <= 0 || n <= 0 || size <= 0 {
		return l.Rows
	}
	return int(max(1, min(int64(l.Rows), int64(l.Bytes)*int64(n)/size)))
}

// OverBudgetError: a claim read more than its Limit.Bytes. The statement
// had claimed (locked, and marked or deleted) Limit.Rows rows before the
// first one was read, so the claim returns none of them: the caller rolls
// its transaction back, which returns every row to the outbox, and claims
// again at most Fit rows, the ones that came within the budget.
type OverBudgetError struct {
	Fit    int // rows that came within the budget, at least 1
	Budget int // Limit.Bytes
}

func (e *OverBudgetError) Error() string {
	return fmt.Sprintf("claimed rows over the byte budget of %d: the first %d fit", e.Budget, e.Fit)
}

// Errors that callers map to conditions, log lines and metrics.
var (
	// ErrTableNotFound: the outbox table (or its schema) does not exist.
	ErrTableNotFound = errors.New("outbox table not found")
	// ErrColumnNotFound: a configured column does not exist in the table.
	ErrColumnNotFound = errors.New("outbox column not found")
	// ErrDeleteCascades: cleanup mode OnDispatch refuses to claim, as
	// deleting a claimed row would delete other outbox rows with it (a
	// foreign key within the table's tree, ON DELETE CASCADE), unpublished.
	ErrDeleteCascades = errors.New("deleting a claimed row would delete other outbox rows with it")
)

// The SQLSTATE codes of the PostgreSQL errors the package tells apart
// (PostgreSQL's documentation, appendix A).
const (
	codeUniqueViolation   = "23505"
	codeUndefinedColumn   = "42703"
	codeUndefinedTable    = "42P01"
	codeDuplicateTable    = "42P07"
	codeInvalidSchemaName = "3F000"
	// codeInsufficientPrivilege: permission denied.
	codeInsufficientPrivilege = "42501"
)

// Identity is the table's name as PostgreSQL resolves it, whatever the
// spelling given: "outbox_events" and "public.outbox_events" (or an
// unqualified name found by the search_path) are one table, and what the
// relays of one table must agree on (the advisory locks and Redis fences
// of ordering Strict and PerKey) is keyed by this one name. It is
// unqualified in schema public and "schema.name" elsewhere, so that the
// default spelling keeps the name it always had.
func (t *Table) Identity(ctx context.Context, q Querier) (string, error) {
	var schema, name string
	err := q.QueryRow(ctx, identitySQL, t.qTable).Scan(&schema, &name)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", fmt.Errorf("%w: %s", ErrTableNotFound, t)
	}
	if err != nil {
		return "", fmt.Errorf("resolving table %s: %w", t, err)
	}
	if schema == "public" {
		return name, nil
	}
	return schema + "." + name, nil
}

// classify maps PostgreSQL errors that mean "wrong layout" to the package's
// sentinels, keeping the original error in the chain.
func (t *Table) classify(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case codeUndefinedTable, codeInvalidSchemaName:
			return fmt.Errorf("%w: %s: %w", ErrTableNotFound, t, err)
		case codeUndefinedColumn:
			return fmt.Errorf("%w: %s: %w", ErrColumnNotFound, t, err)
		}
	}
	return err
}

// Dispatch is what a claim does with the rows it takes: the cleanup mode
// (docs/relay.md, "Cleanup modes").
type Dispatch int

const (
	// MarkDispatched sets the rows' dispatched_at; they stay until cleanup
	// deletes them after the retention, and a replay can publish them again.
	MarkDispatched Dispatch = iota
	// DeleteOnDispatch deletes the rows: no dispatched_at to write, no dead
	// rows left for cleanup, and nothing to replay from.
	DeleteOnDispatch
)

// ParseDispatch reads a cleanup mode's name (String), case-insensitively.
func ParseDispatch(s string) (Dispatch, error) {
	for _, d := range []Dispatch{MarkDispatched, DeleteOnDispatch} {
		if strings.EqualFold(s, d.String()) {
			return d, nil
		}
	}
	return 0, fmt.Errorf("cleanup mode %q: must be AfterRetention or OnDispatch", s)
}

// String is the mode's name in spec.cleanup.mode and --cleanup-mode.
func (d Dispatch) String() string {
	if d == DeleteOnDispatch {
		return "OnDispatch"
	}
	return "AfterRetention"
}

// Claim takes up to limit pending events and marks them dispatched or
// deletes them (d), inside tx. The events come back ordered by created_at,
// ties by the id, in the order of the id column's type (numeric for a
// bigint, by its collation for text). Nothing is final until tx commits; a
// rollback returns every row to the outbox.
func (t *Table) Claim(ctx context.Context, tx Querier, d Dispatch, limit Limit) ([]Event, error) {
	return t.claim(ctx, tx, t.ClaimSQL(d), false, limit)
}

// ClaimFrom is Claim over the pending rows created at or after from only.
// It takes the same rows as Claim would, less those created before from,
// at a cost that does not grow with the index entries before from: the
// rows a claim in flight holds locked, and those of batches committed
// since the last vacuum, which a claim from the start of the index walks
// past. A caller that claims from a point must also claim from the start
// now and then (Frontier), or a row committed late below it would wait.
func (t *Table) ClaimFrom(ctx context.Context, tx Querier, d Dispatch, limit Limit, from time.Time) ([]Event, error) {
	return t.claim(ctx, tx, t.ClaimFromSQL(d), false, limit, from)
}

// ClaimNext is Claim from where the frontier f says (ClaimFrom, or Claim
// from the start), and records in f what it took: the claim loop of a
// relay of ordering None, in one place for the relay and the benchmark.
func (t *Table) ClaimNext(ctx context.Context, tx Querier, d Dispatch, limit Limit, f *Frontier) ([]Event, error) {
	now := time.Now()
	var events []Event
	var err error
	if from, ok := f.Next(now); ok {
		events, err = t.ClaimFrom(ctx, tx, d, limit, from)
	} else {
		events, err = t.Claim(ctx, tx, d, limit)
	}
	if err != nil {
		f.Reset()
		return nil, err
	}
	f.Claimed(events, limit.Rows, now)
	return events, nil
}

// ErrNoKeyColumn: a keyed claim on a table configured without a key column.
var ErrNoKeyColumn = errors.New("no key column configured (ordering PerKey needs --key-column)")

// ClaimKeyed is Claim for ordering PerKey: it takes only pending rows whose
// key falls in one of the given partitions (of partitions in all), and sets
// each event's Key and Partition.
func (t *Table) ClaimKeyed(ctx context.Context, tx Querier, d Dispatch, limit Limit, partitions int, owned []int64) ([]Event, error) {
	if t.columns.Key == "" {
		return nil, ErrNoKeyColumn
	}
	return t.claim(ctx, tx, t.ClaimKeyedSQL(d), true, limit, partitions, owned)
}

// claim runs a claim statement and reads its rows; keyed ones end with the
// key and the partition. A claim that reads past limit.Bytes stops keeping
// rows, reads the rest off the connection, and returns an OverBudgetError:
// what it holds in memory is bounded by the budget and one row, whatever
// the batch size. It reads the rest rather than cancel the statement: a
// cancel closes the connection (pgx's default), and the rows would stay
// locked until the server noticed, where the caller's next claim would
// skip them (out of order, for an ordered relay). The caller starts its
// claims small (the relay's slow start), so a claim that reads far past
// its budget is rare.
func (t *Table) claim(ctx context.Context, tx Querier, sql string, keyed bool, limit Limit, args ...any) ([]Event, error) {
	rows, err := tx.Query(ctx, sql, append([]any{limit.Rows}, args...)...)
	if err != nil {
		return nil, t.classify(err)
	}
	defer rows.Close()
	events := make([]Event, 0, limit.Rows)
	size := 0
	s := newEventScanner(t.columns, keyed)
	for rows.Next() {
		e, err := s.scan(rows)
		if err != nil {
			return nil, fmt.Errorf("scanning claimed row: %w", err)
		}
		if size += e.Size(); limit.Bytes > 0 && size > limit.Bytes && len(events) > 0 {
			fit := len(events) // the events are garbage from here, while Close reads the rest
			rows.Close()
			if err := rows.Err(); err != nil {
				return nil, t.classify(err)
			}
			return nil, &OverBudgetError{Fit: fit, Budget: limit.Bytes}
		}
		events = append(events, e)
	}
	if err := rows.Err(); err != nil {
		return nil, t.classify(err)
	}
	if len(events) > limit.Rows { // the statement's own guarantee, checked: never more than asked
		return nil, fmt.Errorf("claim returned %d rows for a batch of %d", len(events), limit.Rows)
	}
	return events, nil
}

// eventScanner reads rows of (id, type, payload, created_at), and for a
// keyed claim (key, partition) after them, into Events: the claim, the
// catch-up and the replay all read rows of that shape. Its values
// (pgtype.Text, not *string) are reused from row to row, so a row costs its
// three strings and nothing more, which matters on the claim's critical
// path (benchmarks.md).
type eventScanner struct {
	columns               Columns
	id, typ, payload, key pgtype.Text
	created               pgtype.Timestamptz
	partition             int64
	dest                  []any
}

func newEventScanner(c Columns, keyed bool) *eventScanner {
	s := &eventScanner{columns: c}
	s.dest = []any{&s.id, &s.typ, &s.payload, &s.created}
	if keyed {
		s.dest = append(s.dest, &s.key, &s.partition)
	}
	return s
}

// scan reads the current row.
func (s *eventScanner) scan(rows pgx.Rows) (Event, error) {
	if err := rows.Scan(s.dest...); err != nil {
		return Event{}, err
	}
	e := newEvent(s.columns, textOrNil(&s.id), textOrNil(&s.typ), textOrNil(&s.payload), nil)
	if s.created.Valid {
		e.CreatedAt = s.created.Time
	}
	e.Key, e.Partition, e.keyed = s.key.String, int(s.partition), len(s.dest) > 4
	return e, nil
}

// textOrNil is a scanned text column as newEvent takes it: nil for NULL.
// The pointer is to the scanned value itself, which newEvent copies.
func textOrNil(v *pgtype.Text) *string {
	if !v.Valid {
		return nil
	}
	return &v.String
}

// NewEvent builds an Event from nullable column values (nil: NULL),
// describing what is missing in Malformed, as a claim does: for readers of
// the outbox other than the claim (the logical replication source).
func NewEvent(c Columns, id, typ, payload *string, created *time.Time) Event {
	return newEvent(c, id, typ, payload, created)
}

// newEvent builds an Event from nullable columns, describing what is
// missing in Malformed.
func newEvent(c Columns, id, typ, payload *string, created *time.Time) Event {
	var e Event
	var missing []string
	for i, f := range [...]struct {
		col string
		src *string
		dst *string
	}{{c.ID, id, &e.ID}, {c.EventType, typ, &e.Type}, {c.Payload, payload, &e.Payload}} {
		if f.src == nil {
			e.null[i] = true
			missing = append(missing, f.col)
			continue
		}
		*f.dst = *f.src
	}
	if created != nil {
		e.CreatedAt = *created
	}
	if len(missing) > 0 {
		e.Malformed = "NULL in column " + strings.Join(missing, ", ")
	}
	return e
}

// Backlog is the state of the pending rows.
type Backlog struct {
	// Count of rows not yet dispatched.
	Count int64 `json:"count"`
	// Oldest created_at among them; nil (JSON null) when there are none.
	Oldest *time.Time `json:"oldest"`
	// DeadLetters is the count of parked rows (in the dead-letter table),
	// which Count leaves out; 0 when that table does not exist.
	DeadLetters int64 `json:"deadLetters"`
	// Capped reports that Count is a lower bound: BacklogUpTo stopped
	// counting at its limit.
	Capped bool `json:"capped,omitempty"`
	// StreamResets are the recorded resets of a stream not yet replayed,
	// when the measure was asked for a stream (replay.go); nil otherwise.
	StreamResets *PendingResets `json:"streamResets,omitempty"`
	// OtherRelays are the relays of the table, registered in its relays
	// table, that publish to another stream or with the other source than
	// the relay the measure was asked for, seen within RelaySeenWindow
	// (ConflictingRelays); nil when none, or not asked.
	OtherRelays []TableRelay `json:"otherRelays,omitempty"`
}

// Age of the oldest pending row at now, zero when none is pending.
func (b Backlog) Age(now time.Time) time.Duration {
	if b.Oldest == nil {
		return 0
	}
	return max(now.Sub(*b.Oldest), 0)
}

// oldestOf is the oldest created_at of the pending rows as Backlog.Oldest
// holds it. A timestamp column may hold 'infinity' and '-infinity', which a
// time.Time cannot: such a row is pending like any other (the claim
// publishes it), so it must not fail the measurement. -infinity is older
// than any time: the Unix epoch stands for it, so the backlog counts as
// stalled. infinity is the minimum only when every pending row is created
// at infinity: no age yet, as for a row created in the future.
func oldestOf(v pgtype.Timestamptz) *time.Time {
	switch {
	case !v.Valid || v.InfinityModifier == pgtype.Infinity:
		return nil
	case v.InfinityModifier == pgtype.NegativeInfinity:
		epoch := time.Unix(0, 0).UTC()
		return &epoch
	}
	return &v.Time
}

// Backlog counts the pending rows, finds the oldest and counts the parked
// ones.
func (t *Table) Backlog(ctx context.Context, q Querier) (Backlog, error) {
	return t.BacklogUpTo(ctx, q, 0)
}

// BacklogUpTo is Backlog with the count of pending rows stopped at limit:
// past it, Count is limit and Capped is set. A limit of 0 or less counts
// every row.
func (t *Table) BacklogUpTo(ctx context.Context, q Querier, limit int64) (Backlog, error) {
	var b Backlog
	var oldest pgtype.Timestamptz
	var err error
	if limit > 0 {
		err = q.QueryRow(ctx, t.BacklogUpToSQL(), limit+1).Scan(&b.Count, &oldest)
		if b.Count > limit {
			b.Count, b.Capped = limit, true
		}
	} else {
		err = q.QueryRow(ctx, t.BacklogSQL()).Scan(&b.Count, &oldest)
	}
	if err != nil {
		return Backlog{}, t.classify(err)
	}
	b.Oldest = oldestOf(oldest)
	if t.columns.Key != "" { // a missing key column shows here, not only in the relays' logs
		if _, err := q.Exec(ctx, t.format(keyCheckSQL, t.qKey)); err != nil {
			return Backlog{}, t.classify(err)
		}
	}
	n, err := t.CountDeadLetters(ctx, q)
	if err != nil {
		return Backlog{}, err
	}
	b.DeadLetters = n
	return b, nil
}

// DeleteDispatched deletes at most limit rows dispatched longer than
// retention ago, and none of what the stream resets hold (ResetsHold), in
// one short statement, and returns how many it deleted. Call it in a loop
// until it returns fewer than limit.
func (t *Table) DeleteDispatched(ctx context.Context, q Querier, retention time.Duration, limit int) (int64, error) {
	hold, err := t.ResetsHold(ctx, q, retention)
	if err != nil {
		return 0, err
	}
	tag, err := q.Exec(ctx, t.CleanupSQL(), retention.Seconds(), limit, hold.holdSince())
	if err != nil {
		return 0, t.classify(err)
	}
	return tag.RowsAffected(), nil
}

// CheckDeleteCascades returns ErrDeleteCascades, naming the keys, when
// deleting rows of the table deletes other rows of it through foreign keys
// ON DELETE CASCADE (deleteCascadesSQL): a deleting claim would take rows
// that were never claimed, or published, along with its own.
func (t *Table) CheckDeleteCascades(ctx context.Context, q Querier) error {
	rows, err := q.Query(ctx, deleteCascadesSQL, t.qTable)
	if err != nil {
		return t.classify(err)
	}
	keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return t.classify(err)
	}
	if len(keys) > 0 {
		return fmt.Errorf("%w (foreign keys ON DELETE CASCADE: %s): cleanup mode OnDispatch cannot be used on %s "+
			"until they are changed (docs/relay.md, \"Cleanup modes\")", ErrDeleteCascades, strings.Join(keys, ", "), t)
	}
	return nil
}

// Exists reports whether the table exists, resolved as the other statements
// resolve it.
func (t *Table) Exists(ctx context.Context, q Querier) (bool, error) {
	var ok bool
	if err := q.QueryRow(ctx, tableExistsSQL, t.qTable).Scan(&ok); err != nil {
		return false, t.classify(err)
	}
	return ok, nil
}

// HasNotifyTrigger reports whether the NOTIFY trigger of DDL is installed.
func (t *Table) HasNotifyTrigger(ctx context.Context, q Querier) (bool, error) {
	var ok bool
	if err := q.QueryRow(ctx, triggerExistsSQL, t.qTable, t.TriggerName()).Scan(&ok); err != nil {
		return false, t.classify(err)
	}
	return ok, nil
}
