package outbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-dev/outbox-operator/internal/pgtx"
)

// ErrDeadLetterTableNotFound: a row had to be parked and the dead-letter
// table does not exist. The batch is rolled back, so nothing is lost, and
// the relay retries until the table is created (relay schema --apply).
var ErrDeadLetterTableNotFound = errors.New("dead-letter table not found")

// DeadLetter is a parked row: a copy of an outbox row that could not be
// published, kept until a person retries or discards it.
type DeadLetter struct {
	// ID numbers parked rows; retry and discard select by it.
	ID int64 `json:"id"`
	// EventID, EventType and CreatedAt are the outbox row's, nil where the
	// row had NULL.
	EventID   *string    `json:"eventId"`
	EventType *string    `json:"eventType"`
	CreatedAt *time.Time `json:"createdAt"`
	// Stream is the stream the event was meant for.
	Stream string `json:"stream"`
	// Reason says why it was parked (or why the last retry failed).
	Reason string `json:"reason"`
	// ParkedAt is when it was parked.
	ParkedAt time.Time `json:"parkedAt"`
	// Attempts counts the publications tried: 1 when parked, one more per
	// failed retry.
	Attempts int `json:"attempts"`
	// PayloadBytes is the payload's size; nil for a NULL payload.
	PayloadBytes *int64 `json:"payloadBytes"`
	// Key is the event's key under ordering PerKey, which its entry
	// carries; nil for an event of another ordering.
	Key *string `json:"key,omitempty"`
	// Payload is read only by ReadDeadLetterPayloads; nil for a NULL
	// payload or one not read.
	Payload *string `json:"-"`
}

// Event is the parked row as an event to publish again, and why it cannot
// be ("" when it can): a column that is still NULL.
func (d DeadLetter) Event() (Event, string) {
	e := newEvent(deadLetterColumnNames, d.EventID, d.EventType, d.Payload, d.CreatedAt)
	if d.Key != nil {
		e.Key, e.keyed = *d.Key, true
	}
	if e.Malformed != "" {
		return e, "malformed row: " + e.Malformed + " of the dead-letter table; set it with UPDATE, then retry"
	}
	return e, ""
}

// deadLetterColumnNames names the dead-letter table's copies of the event
// columns, for messages.
var deadLetterColumnNames = Columns{ID: "event_id", EventType: "event_type", Payload: "payload"}

// DeadLetterFilter selects parked rows: by id (none: any), and by parked_at
// in [Since, Until) (zero: open).
type DeadLetterFilter struct {
	IDs          []int64
	Since, Until time.Time
	// Limit caps the rows returned; 0 means 1000.
	Limit int
	// AfterID returns only rows with a larger id: a cursor for paging.
	AfterID int64
}

func (f DeadLetterFilter) args() []any {
	var since, until *time.Time
	if !f.Since.IsZero() {
		since = &f.Since
	}
	if !f.Until.IsZero() {
		until = &f.Until
	}
	ids := f.IDs
	if ids == nil {
		ids = []int64{}
	}
	limit := f.Limit
	if limit <= 0 {
		limit = 1000
	}
	return []any{ids, since, until, limit, f.AfterID}
}

// classifyDeadLetters maps a missing dead-letter table to its sentinel, and
// says how to add a column it lacks (made by an earlier version).
func (t *Table) classifyDeadLetters(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == codeUndefinedTable || pgErr.Code == codeInvalidSchemaName) {
		return fmt.Errorf("%w: %s (create it with `relay schema --apply`, or apply `relay schema`'s CREATE TABLE for it): %w",
			ErrDeadLetterTableNotFound, t.DeadLetterTable(), err)
	}
	if errors.As(err, &pgErr) && pgErr.Code == codeUndefinedColumn {
		return fmt.Errorf("%s lacks a column of this version (add it with `relay schema --apply`, run by the table's owner): %w",
			t.DeadLetterTable(), err)
	}
	return err
}

// EnsureDeadLetterTable creates the dead-letter table if it is missing
// (ApplyDDL).
func (t *Table) EnsureDeadLetterTable(ctx context.Context, db pgtx.Beginner) error {
	if err := t.ApplyDDL(ctx, db, t.DeadLetterDDL()); err != nil {
		return fmt.Errorf("creating dead-letter table %s: %w", t.DeadLetterTable(), err)
	}
	return nil
}

// Park copies e into the dead-letter table inside tx, the transaction that
// claimed it: the outbox row is marked dispatched by the same commit, so
// the event is either pending or parked, never neither.
func (t *Table) Park(ctx context.Context, tx Querier, stream string, e Event, reason string) error {
	nullable := func(s string, null bool) *string {
		if null {
			return nil
		}
		return &s
	}
	var created *time.Time
	if !e.CreatedAt.IsZero() {
		created = &e.CreatedAt
	}
	sql, args := parkSQL, []any{nullable(e.ID, e.null[0]), nullable(e.Type, e.null[1]), nullable(e.Payload, e.null[2]),
		created, stream, reason}
	if e.keyed {
		sql, args = parkKeyedSQL, append(args, e.Key)
	}
	_, err := tx.Exec(ctx, t.format(sql), args...)
	if err != nil {
		return fmt.Errorf("parking event %s: %w", e.ID, t.classifyDeadLetters(err))
	}
	return nil
}

// ListDeadLetters returns the parked rows the filter selects, oldest first,
// without their payloads.
func (t *Table) ListDeadLetters(ctx context.Context, q Querier, f DeadLetterFilter) ([]DeadLetter, error) {
	return t.queryDeadLetters(ctx, q, t.format(listDeadLettersSQL), f)
}

// LockDeadLetters returns the parked rows the filter selects, oldest
// first, without their payloads (ReadDeadLetterPayloads), locked in tx:
// rows another transaction holds are skipped.
func (t *Table) LockDeadLetters(ctx context.Context, tx Querier, f DeadLetterFilter) ([]DeadLetter, error) {
	return t.queryDeadLetters(ctx, tx, t.format(lockDeadLettersSQL), f)
}

// ReadDeadLetterPayloads reads into their Payload the payloads of the
// parked rows of page (locked in tx by LockDeadLetters) that are not over
// maxBytes; a larger one is left unread.
func (t *Table) ReadDeadLetterPayloads(ctx context.Context, tx Querier, page []DeadLetter, maxBytes int64) error {
	ids := make([]int64, 0, len(page))
	at := make(map[int64]int, len(page))
	for i, d := range page {
		if d.PayloadBytes != nil && *d.PayloadBytes <= maxBytes {
			ids, at[d.ID] = append(ids, d.ID), i
		}
	}
	if len(ids) == 0 {
		return nil
	}
	rows, err := tx.Query(ctx, t.format(deadLetterPayloadsSQL), ids)
	if err != nil {
		return t.classifyDeadLetters(err)
	}
	defer rows.Close()
	read := 0
	for rows.Next() {
		var id int64
		var payload *string
		if err := rows.Scan(&id, &payload); err != nil {
			return fmt.Errorf("scanning dead letter payload: %w", err)
		}
		page[at[id]].Payload = payload
		read++
	}
	if err := rows.Err(); err != nil {
		return t.classifyDeadLetters(err)
	}
	if read != len(ids) {
		return fmt.Errorf("read %d of the %d parked payloads of %s: rows not locked by this transaction", read, len(ids), t.DeadLetterTable())
	}
	return nil
}

func (t *Table) queryDeadLetters(ctx context.Context, q Querier, sql string, f DeadLetterFilter) ([]DeadLetter, error) {
	rows, err := q.Query(ctx, sql, f.args()...)
	if err != nil {
		return nil, t.classifyDeadLetters(err)
	}
	defer rows.Close()
	var out []DeadLetter
	for rows.Next() {
		var d DeadLetter
		err := rows.Scan(&d.ID, &d.EventID, &d.EventType, &d.CreatedAt, &d.Stream, &d.Reason, &d.ParkedAt, &d.Attempts,
			&d.PayloadBytes, &d.Key)
		if err != nil {
			return nil, fmt.Errorf("scanning dead letter: %w", err)
		}
		out = append(out, d)
	}
	if err := rows.Err(); err != nil {
		return nil, t.classifyDeadLetters(err)
	}
	return out, nil
}

// DeleteDeadLetter removes a parked row (published again, or discarded).
func (t *Table) DeleteDeadLetter(ctx context.Context, tx Querier, id int64) error {
	if _, err := tx.Exec(ctx, t.format(deleteDeadLetterSQL), id); err != nil {
		return fmt.Errorf("deleting dead letter %d: %w", id, t.classifyDeadLetters(err))
	}
	return nil
}

// Redispatched moves the dispatch time of the outbox row whose event a
// retry published again (its id; nil: the row had no id, and none is
// found) to now, in the retry's transaction. A parked row was marked
// dispatched when it was parked: its entry is as new as the retry, and a
// stream reset after it replays the rows dispatched in its window, as
// cleanup keeps the rows dispatched within the retention. Cleanup mode
// OnDispatch deleted the row: nothing to move.
//
// An id that is no value of the id column (a dead letter of another table,
// or parked by hand) has no row to move: the statement runs under a
// savepoint, and its data exception (SQLSTATE class 22) is no error.
func (t *Table) Redispatched(ctx context.Context, tx pgx.Tx, eventID *string) error {
	if eventID == nil {
		return nil
	}
	sp, err := tx.Begin(ctx)
	if err != nil {
		return fmt.Errorf("moving the dispatch time of the retried event %s: %w", *eventID, t.classify(err))
	}
	_, err = sp.Exec(ctx, t.format(redispatchedSQL), pgx.QueryExecModeSimpleProtocol, *eventID)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && strings.HasPrefix(pgErr.Code, "22") {
		return sp.Rollback(ctx)
	}
	if err != nil {
		_ = sp.Rollback(ctx)
		return fmt.Errorf("moving the dispatch time of the retried event %s: %w", *eventID, t.classify(err))
	}
	return sp.Commit(ctx)
}

// RefuseDeadLetter records a retry that failed again, with its reason.
func (t *Table) RefuseDeadLetter(ctx context.Context, tx Querier, id int64, reason string) error {
	if _, err := tx.Exec(ctx, t.format(refuseDeadLetterSQL), id, reason); err != nil {
		return fmt.Errorf("updating dead letter %d: %w", id, t.classifyDeadLetters(err))
	}
	return nil
}

// CountDeadLetters counts the parked rows; 0 when the dead-letter table does
// not exist (nothing was ever parked there).
func (t *Table) CountDeadLetters(ctx context.Context, q Querier) (int64, error) {
	var exists bool
	if err := q.QueryRow(ctx, tableExistsSQL, t.qualified(t.DeadLetterTableName())).Scan(&exists); err != nil {
		return 0, t.classify(err)
	}
	if !exists {
		return 0, nil
	}
	var n int64
	if err := q.QueryRow(ctx, t.format(countDeadLettersSQL)).Scan(&n); err != nil {
		return 0, t.classifyDeadLetters(err)
	}
	return n, nil
}

// ParkedAmong returns which of the event ids have a parked copy in the
// dead-letter table (none when there is no such table).
func (t *Table) ParkedAmong(ctx context.Context, q Querier, ids []string) (map[string]bool, error) {
	parked := map[string]bool{}
	for chunk := range slices.Chunk(ids, 10000) {
		rows, err := q.Query(ctx, t.format(parkedAmongSQL), chunk)
		if err == nil {
			var id string
			_, err = pgx.ForEachRow(rows, []any{&id}, func() error {
				parked[id] = true
				return nil
			})
		}
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == codeUndefinedTable {
			return parked, nil
		}
		if err != nil {
			return nil, fmt.Errorf("looking for parked rows in %s: %w", t.DeadLetterTable(), t.classify(err))
		}
	}
	return parked, nil
}
