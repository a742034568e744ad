package logical

import (
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outbox-dev/outbox-operator/internal/outbox"
)

// absent marks a column of the outbox layout that a relation lacks.
const absent = -1

// relation maps the columns of one relation of the stream (the table, or
// one of its partitions or children) onto the fields of an event, by name,
// as its latest RelationMessage describes it. pgoutput sends a new one
// before the first change after an ALTER TABLE, so a column added, dropped
// or renamed mid-stream is seen at the next insert. Dropped and generated
// columns are in neither the message nor the tuples.
type relation struct {
	id, typ, payload, created, key int // positions in the tuple, or absent
	createdOID                     uint32
	// foreign: not a table of the outbox (Reader.foreign); its inserts are
	// not events.
	foreign bool
}

// newRelation maps the columns of m named by c.
func newRelation(m *pglogrepl.RelationMessage, c outbox.Columns) *relation {
	rel := &relation{id: absent, typ: absent, payload: absent, created: absent, key: absent}
	for i, col := range m.Columns {
		switch col.Name {
		case c.ID:
			rel.id = i
		case c.EventType:
			rel.typ = i
		case c.Payload:
			rel.payload = i
		case c.CreatedAt:
			rel.created, rel.createdOID = i, col.DataType
		}
		if c.Key != "" && col.Name == c.Key {
			rel.key = i
		}
	}
	return rel
}

// event builds the event of an inserted tuple. A column that is NULL or
// missing (renamed away) leaves its field nil, which outbox.NewEvent turns
// into a Malformed event for the relay to park, rather than a stalled
// stream. created_at arrives as text in the session's DateStyle (ISO) and
// TimeZone (UTC), set by Open; it is parsed by its column's type, so that a
// timestamp without time zone reads as UTC like the poller reads it.
func (rel *relation) event(c outbox.Columns, tuple *pglogrepl.TupleData, types *pgtype.Map) outbox.Event {
	var created *time.Time
	if text := column(tuple, rel.created); text != nil {
		var t time.Time
		if err := types.Scan(rel.createdOID, pgtype.TextFormatCode, []byte(*text), &t); err == nil {
			created = &t
		}
	}
	e := outbox.NewEvent(c, column(tuple, rel.id), column(tuple, rel.typ), column(tuple, rel.payload), created)
	if c.Key != "" {
		e.Key = deref(column(tuple, rel.key)) // NULL: "", as the claim's coalesce
	}
	return e
}

// column returns the text of the tuple's column i, nil when the relation
// lacks it, the value is NULL, or it came in another form than text: an
// "unchanged TOAST" marker (never in an insert, but the protocol allows it)
// or binary (never asked for).
func column(tuple *pglogrepl.TupleData, i int) *string {
	if tuple == nil || i < 0 || i >= len(tuple.Columns) {
		return nil
	}
	col := tuple.Columns[i]
	if col == nil || col.DataType != pglogrepl.TupleDataTypeText {
		return nil
	}
	s := string(col.Data)
	return &s
}
