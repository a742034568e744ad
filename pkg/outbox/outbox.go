// Package outbox writes transactional-outbox events for Go producers.
//
// An application that changes its state and must tell the world about it
// writes the event into the outbox table in the same PostgreSQL transaction
// as the change:
//
//	tx, err := db.Begin(ctx)
//	...
//	_, err = tx.Exec(ctx, `INSERT INTO orders ...`)
//	...
//	_, err = outbox.Write(ctx, tx, outbox.Event{Type: "order_created", Payload: payload})
//	...
//	err = tx.Commit(ctx)
//
// Both rows commit together or not at all: PostgreSQL guarantees it, not this
// package. That is why Write does nothing else than one INSERT in the
// caller's transaction: it opens no connection of its own, never commits and
// never retries. A relay (the outbox-operator's OutboxRelay, or `relay run`)
// then publishes the row to a Redis stream, at least once, as the entry
//
//	XADD <stream> * event_id <id> event_type <type> payload <payload>
//
// and consumers dedupe on event_id (see package
// github.com/outbox-dev/outbox-operator/pkg/consumer).
//
// The table is described exactly as the relay describes it: the default
// layout is
//
//	outbox_events (id uuid primary key default gen_random_uuid(), event_type text,
//	               payload text or jsonb, created_at timestamptz default now(),
//	               dispatched_at timestamptz null)
//
// and NewWriter takes another table name (optionally schema-qualified) and
// other column names. Names are validated and quoted, never spliced into SQL.
// `relay schema` prints the DDL of a layout.
package outbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	ioutbox "github.com/outbox-dev/outbox-operator/internal/outbox"
	"github.com/outbox-dev/outbox-operator/pkg/contract"
)

// DefaultTable is the table Write uses, with the default column names id,
// event_type, payload, created_at and dispatched_at.
const DefaultTable = contract.DefaultTable

// ErrInvalidIdentifier is returned (wrapped) by NewWriter for a table or
// column name that is not a plain identifier: letters, digits and
// underscores, not starting with a digit, at most 63 bytes.
var ErrInvalidIdentifier = ioutbox.ErrInvalidIdentifier

// ErrInvalidEvent is returned (wrapped) by Write for an event without a type
// or a payload; nothing is written then.
var ErrInvalidEvent = errors.New("invalid outbox event")

// Columns names the columns of an outbox table. An empty field keeps the
// default name, shown in parentheses. The names are those of the relay's
// flags and of the OutboxRelay's spec.postgres.columns, so one layout is
// written down the same way everywhere.
type Columns struct {
	// ID (id) is the event's identity: uuid by default, or any type that
	// casts to and from text. Write lets the column's default make it when
	// Event.ID is empty.
	ID string
	// EventType (event_type) is a text or varchar column.
	EventType string
	// Payload (payload) is a text or jsonb column.
	Payload string
	// CreatedAt (created_at) orders the outbox; Write leaves it to the
	// column's default, now().
	CreatedAt string
	// DispatchedAt (dispatched_at) is NULL until the relay publishes the
	// event; Write leaves it NULL.
	DispatchedAt string
}

// Event is one event to write.
type Event struct {
	// ID is the event's identity, published as event_id; consumers dedupe on
	// it. Optional: when empty, the table's default for the id column makes
	// it (gen_random_uuid() in the default layout), and Write returns it.
	// Give one when the caller needs to know it before the insert, or when
	// the column has no default.
	ID string
	// Type is the event type, published as event_type. Required.
	Type string
	// Payload is the event's body, stored in the payload column and
	// published verbatim. Required. Any bytes the column accepts: JSON by
	// convention (a jsonb column insists on valid JSON; a text column
	// insists on valid UTF-8 without NUL bytes).
	Payload []byte
}

// Writer writes events into one outbox table. It holds no connection and is
// safe for concurrent use.
type Writer struct {
	table *ioutbox.Table
}

// NewWriter returns a Writer for table, optionally schema-qualified
// ("schema.table"; empty means outbox_events), with the given column names.
// It validates the names and does not connect.
func NewWriter(table string, cols Columns) (*Writer, error) {
	t, err := ioutbox.New(table, ioutbox.Columns{
		ID:           cols.ID,
		EventType:    cols.EventType,
		Payload:      cols.Payload,
		CreatedAt:    cols.CreatedAt,
		DispatchedAt: cols.DispatchedAt,
	})
	if err != nil {
		return nil, fmt.Errorf("outbox writer: %w", err)
	}
	return &Writer{table: t}, nil
}

// defaultWriter writes the default layout.
var defaultWriter = &Writer{table: ioutbox.MustNew(DefaultTable, ioutbox.Columns{})}

// Write inserts e into the default outbox table (outbox_events, default
// column names) inside tx, and returns the event's id. See Writer.Write.
func Write(ctx context.Context, tx pgx.Tx, e Event) (id string, err error) {
	return defaultWriter.Write(ctx, tx, e)
}

// Write inserts e into the outbox table inside tx and returns the event's
// id: e.ID, or the one the table's default made. It runs exactly one
// INSERT. It never commits, rolls back or retries: the event becomes
// visible to the relay when, and only if, the caller commits tx. An error
// from PostgreSQL (a missing table, a payload a jsonb column refuses)
// aborts tx, as any failed statement does; roll it back.
func (w *Writer) Write(ctx context.Context, tx pgx.Tx, e Event) (id string, err error) {
	switch {
	case tx == nil:
		return "", fmt.Errorf("%w: a transaction is required", ErrInvalidEvent)
	case e.Type == "":
		return "", fmt.Errorf("%w: type is empty", ErrInvalidEvent)
	case len(e.Payload) == 0:
		return "", fmt.Errorf("%w: payload is empty", ErrInvalidEvent)
	}
	// The payload goes as a string, so that it reaches a text or a jsonb
	// column unchanged (a []byte would be encoded as bytea).
	if e.ID != "" {
		if _, err := tx.Exec(ctx, w.table.InsertSQL(), e.ID, e.Type, string(e.Payload)); err != nil {
			return "", fmt.Errorf("writing %s event to %s: %w", e.Type, w.table, err)
		}
		return e.ID, nil
	}
	if err := tx.QueryRow(ctx, w.table.InsertDefaultIDSQL(), e.Type, string(e.Payload)).Scan(&id); err != nil {
		return "", fmt.Errorf("writing %s event to %s: %w", e.Type, w.table, err)
	}
	return id, nil
}

// Table is the table the Writer writes to, as given (schema.table or
// table).
func (w *Writer) Table() string { return w.table.String() }
