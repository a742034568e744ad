package outbox

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-dev/outbox-operator/pkg/contract"
)

// Default names of the outbox layout that the reference implementation uses.
const (
	DefaultTable              = contract.DefaultTable
	DefaultIDColumn           = contract.DefaultIDColumn
	DefaultEventTypeColumn    = contract.DefaultEventTypeColumn
	DefaultPayloadColumn      = contract.DefaultPayloadColumn
	DefaultCreatedAtColumn    = contract.DefaultCreatedAtColumn
	DefaultDispatchedAtColumn = contract.DefaultDispatchedAtColumn
)

// maxIdentifierLength is PostgreSQL's NAMEDATALEN-1: longer names are
// silently truncated by the server, so they are refused here instead.
const maxIdentifierLength = 63

// IdentifierPattern is the pattern every table, schema and column name must
// match. It is deliberately narrower than what PostgreSQL accepts when quoted.
// Names are used exactly as written (quoted), so they are case-sensitive:
// a table created without quotes as OutboxEvents is stored as outboxevents.
const IdentifierPattern = `^[A-Za-z_][A-Za-z0-9_]*$`

var identifierRE = regexp.MustCompile(IdentifierPattern)

// ErrInvalidIdentifier is returned (wrapped) for a name that does not match
// IdentifierPattern or is too long.
var ErrInvalidIdentifier = errors.New("invalid identifier")

// Columns names the columns of an outbox table. An empty field means the
// default name.
type Columns struct {
	// ID is the event's identity; any type that casts to text.
	ID string
	// EventType is a text or varchar column.
	EventType string
	// Payload is a text or jsonb column, published verbatim (jsonb in its
	// canonical text form).
	Payload string
	// CreatedAt is a timestamp or timestamptz column; it orders the outbox.
	CreatedAt string
	// DispatchedAt is a nullable timestamp or timestamptz column: NULL while
	// the event waits to be published.
	DispatchedAt string
	// Key, optional, is the column whose value orders events per key (the
	// aggregate id) with ordering PerKey; any type that casts to text. Empty:
	// none (it has no default).
	Key string
}

func (c Columns) withDefaults() Columns {
	return Columns{
		ID:           or(c.ID, DefaultIDColumn),
		EventType:    or(c.EventType, DefaultEventTypeColumn),
		Payload:      or(c.Payload, DefaultPayloadColumn),
		CreatedAt:    or(c.CreatedAt, DefaultCreatedAtColumn),
		DispatchedAt: or(c.DispatchedAt, DefaultDispatchedAtColumn),
		Key:          c.Key,
	}
}

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// Table is a validated outbox table. Build it with New; its methods return
// SQL in which every identifier is quoted.
type Table struct {
	schema  string // empty: resolved through search_path
	name    string
	columns Columns

	// quoted forms, computed once
	qTable, qID, qType, qPayload, qCreated, qDispatched string
	qKey                                                string // "NULL" without a key column
}

// ValidateIdentifier reports whether s can be used as a table, schema or
// column name. what names the field in the error, e.g. "column payload".
func ValidateIdentifier(what, s string) error {
	switch {
	case s == "":
		return fmt.Errorf("%s: %w: must not be empty", what, ErrInvalidIdentifier)
	case len(s) > maxIdentifierLength:
		return fmt.Errorf("%s %.20q...: %w: longer than %d bytes", what, s, ErrInvalidIdentifier, maxIdentifierLength)
	case !identifierRE.MatchString(s):
		return fmt.Errorf("%s %q: %w: must match %s (letters, digits and underscores, not starting with a digit)",
			what, s, ErrInvalidIdentifier, IdentifierPattern)
	}
	return nil
}

// New validates a table name, optionally schema-qualified ("schema.table"),
// and the column names (empty ones take the defaults). It does not connect.
func New(table string, columns Columns) (*Table, error) {
	if table == "" {
		table = DefaultTable
	}
	t := &Table{columns: columns.withDefaults()}
	schema, name, qualified := strings.Cut(table, ".")
	if qualified {
		if err := ValidateIdentifier("schema", schema); err != nil {
			return nil, err
		}
		t.schema, t.name = schema, name
	} else {
		t.name = table
	}
	if err := ValidateIdentifier("table", t.name); err != nil {
		return nil, err
	}
	c := t.columns
	for _, col := range []struct{ what, name string }{
		{"column id", c.ID},
		{"column eventType", c.EventType},
		{"column payload", c.Payload},
		{"column createdAt", c.CreatedAt},
		{"column dispatchedAt", c.DispatchedAt},
	} {
		if err := ValidateIdentifier(col.what, col.name); err != nil {
			return nil, err
		}
	}
	if c.Key != "" {
		if err := ValidateIdentifier("column key", c.Key); err != nil {
			return nil, err
		}
	}
	seen := map[string]bool{}
	for _, n := range []string{c.ID, c.EventType, c.Payload, c.CreatedAt, c.DispatchedAt, c.Key} {
		if n == "" {
			continue
		}
		if seen[n] {
			return nil, fmt.Errorf("column %q is named twice: each column of the outbox layout must be distinct", n)
		}
		seen[n] = true
	}

	if t.schema != "" {
		t.qTable = pgx.Identifier{t.schema, t.name}.Sanitize()
	} else {
		t.qTable = pgx.Identifier{t.name}.Sanitize()
	}
	t.qID = quote(c.ID)
	t.qType = quote(c.EventType)
	t.qPayload = quote(c.Payload)
	t.qCreated = quote(c.CreatedAt)
	t.qDispatched = quote(c.DispatchedAt)
	t.qKey = "NULL"
	if c.Key != "" {
		t.qKey = quote(c.Key)
	}
	return t, nil
}

// MustNew is New for names known to be valid, such as the defaults; it
// panics on an invalid name.
func MustNew(table string, columns Columns) *Table {
	t, err := New(table, columns)
	if err != nil {
		panic(err)
	}
	return t
}

func quote(s string) string { return pgx.Identifier{s}.Sanitize() }

// String is the table's name as given, e.g. "outbox_events" or "app.outbox".
func (t *Table) String() string {
	if t.schema != "" {
		return t.schema + "." + t.name
	}
	return t.name
}

// Schema is the schema the table was qualified with, or "".
func (t *Table) Schema() string { return t.schema }

// Name is the table's unqualified name.
func (t *Table) Name() string { return t.name }

// Columns returns the column names, defaults filled in.
func (t *Table) Columns() Columns { return t.columns }

// Channel is the LISTEN/NOTIFY channel of this table's optional trigger.
// It always fits PostgreSQL's 63-byte identifier limit.
func (t *Table) Channel() string {
	ch := "outbox_" + strings.ReplaceAll(t.String(), ".", "__")
	if len(ch) <= maxIdentifierLength {
		return ch
	}
	sum := sha256.Sum256([]byte(t.String()))
	return "outbox_" + hex.EncodeToString(sum[:12])
}

// CompanionTableNames are the unqualified names of the tables the relays
// keep beside the outbox table, in its schema: dead letters, stream resets
// and state, the slot relays' progress and its log, the relays. None holds
// outbox rows.
func (t *Table) CompanionTableNames() []string {
	return []string{t.DeadLetterTableName(), t.StreamResetsTableName(), t.StreamStateTableName(),
		t.ProgressTableName(), t.ProgressLogTableName(), t.RelaysTableName()}
}

// objectName derives the name of an object that belongs to the table (index,
// trigger, function) with the given suffix, within the 63-byte limit.
func (t *Table) objectName(suffix string) string {
	n := t.name + "_" + suffix
	if len(n) <= maxIdentifierLength {
		return n
	}
	sum := sha256.Sum256([]byte(t.name))
	return "outbox_" + hex.EncodeToString(sum[:8]) + "_" + suffix
}

// qualified quotes an object name in the table's schema.
func (t *Table) qualified(name string) string {
	if t.schema != "" {
		return pgx.Identifier{t.schema, name}.Sanitize()
	}
	return quote(name)
}

// PendingIndexName is the name of the partial index on pending rows.
func (t *Table) PendingIndexName() string { return t.objectName("pending_idx") }

// DeadLetterTableName is the name of the table where rows that cannot be
// published are parked, in the outbox table's schema.
func (t *Table) DeadLetterTableName() string { return t.objectName("dead_letters") }

// DeadLetterTable is the dead-letter table's name as a person would type it,
// schema-qualified when the outbox table is.
func (t *Table) DeadLetterTable() string {
	if t.schema != "" {
		return t.schema + "." + t.DeadLetterTableName()
	}
	return t.DeadLetterTableName()
}

// TriggerName is the name of the optional NOTIFY trigger.
func (t *Table) TriggerName() string { return t.objectName("notify") }

// PublicationName is the name of the publication that logical replication
// relays read the table's inserts through (spec.source LogicalReplication).
// Publications are per database, not per schema, so the name holds the
// schema too: app.outbox and billing.outbox get two.
func (t *Table) PublicationName() string {
	n := strings.ReplaceAll(t.String(), ".", "__") + "_pub"
	if len(n) <= maxIdentifierLength {
		return n
	}
	sum := sha256.Sum256([]byte(t.String()))
	return "outbox_" + hex.EncodeToString(sum[:8]) + "_pub"
}
