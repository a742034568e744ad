package logical

import (
	"strings"
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
	// casts are the positions of columns whose type's cast to text is not
	// the output text pgoutput sends (castTypes), and how to make it: the
	// relay's sessions read a column as its cast to text (id::text).
	casts map[int]textCast
	// foreign: not a table of the outbox (Reader.foreign); its inserts are
	// not events.
	foreign bool
}

// newRelation maps the columns of m named by c; castTypes are the types
// whose cast to text is not their output text.
func newRelation(m *pglogrepl.RelationMessage, c outbox.Columns, castTypes map[uint32]textCast) *relation {
	rel := &relation{id: absent, typ: absent, payload: absent, created: absent, key: absent}
	for i, col := range m.Columns {
		if cast := castTypes[col.DataType]; cast != nil {
			if rel.casts == nil {
				rel.casts = map[int]textCast{}
			}
			rel.casts[i] = cast
		}
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
// timestamp without time zone reads as UTC like the poller reads it. The
// other columns are their text as the poller's ::text gives it: the same
// output settings (Open), and char(n) without its padding (asText).
func (rel *relation) event(c outbox.Columns, tuple *pglogrepl.TupleData, types *pgtype.Map) outbox.Event {
	var created *time.Time
	if text := column(tuple, rel.created); text != nil {
		var t time.Time
		if err := types.Scan(rel.createdOID, pgtype.TextFormatCode, []byte(*text), &t); err == nil {
			created = &t
		}
	}
	e := outbox.NewEvent(c, rel.asText(tuple, rel.id), rel.asText(tuple, rel.typ), rel.asText(tuple, rel.payload), created)
	if c.Key != "" {
		e.Key = deref(rel.asText(tuple, rel.key)) // NULL: "", as the claim's coalesce
	}
	return e
}

// asText is column i as its cast to text reads it (textCast); any other
// type's cast to text is its output text, which pgoutput sent.
func (rel *relation) asText(tuple *pglogrepl.TupleData, i int) *string {
	s := column(tuple, i)
	if cast := rel.casts[i]; s != nil && cast != nil {
		t := cast(*s)
		s = &t
	}
	return s
}

// textCast turns a type's output text into its cast to text.
type textCast func(string) string

// textCasts are the built-in types whose cast to text is a function other
// than their output function (pg_cast), by type name, and what it does to
// the output text: char(n) loses its padding (rtrim of ' ' only), a boolean
// is spelled out, an inet address with a full mask gets it written.
var textCasts = map[string]textCast{
	"bpchar": func(s string) string { return strings.TrimRight(s, " ") },
	"bool": func(s string) string {
		switch s {
		case "t":
			return "true"
		case "f":
			return "false"
		}
		return s
	},
	"inet": func(s string) string {
		switch {
		case strings.Contains(s, "/"):
			return s
		case strings.Contains(s, ":"):
			return s + "/128"
		}
		return s + "/32"
	},
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
