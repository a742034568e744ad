package doctor

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-dev/outbox-operator/internal/outbox"
)

// The doctor's catalog queries, in one place. $1 is always a quoted,
// possibly schema-qualified name resolved with to_regclass, as the relay
// resolves it.
const (
	tableSQL = `
SELECT n.nspname,
       coalesce((SELECT sum(greatest(c2.reltuples, 0))::bigint FROM pg_class c2
                  WHERE c2.oid IN (SELECT relid FROM pg_partition_tree(c.oid) WHERE isleaf UNION SELECT c.oid)), 0),
       coalesce((SELECT sum(pg_relation_size(c2.oid))::bigint FROM pg_class c2
                  WHERE c2.oid IN (SELECT relid FROM pg_partition_tree(c.oid) WHERE isleaf UNION SELECT c.oid)), 0)
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE c.oid = to_regclass($1)`

	columnsSQL = `
SELECT a.attname, format_type(a.atttypid, a.atttypmod),
       CASE WHEN t.typtype = 'd' THEN bt.typname ELSE t.typname END, a.attnotnull
  FROM pg_attribute a
  JOIN pg_type t ON t.oid = a.atttypid
  LEFT JOIN pg_type bt ON bt.oid = t.typbasetype
 WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped`

	indexesSQL = `
SELECT ic.relname, coalesce(pg_get_expr(i.indpred, i.indrelid), ''),
       coalesce((SELECT array_agg(a.attname ORDER BY k.ord)
                   FROM unnest(i.indkey::int2[]) WITH ORDINALITY k(attnum, ord)
                   JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum), '{}')
  FROM pg_index i JOIN pg_class ic ON ic.oid = i.indexrelid
 WHERE i.indrelid = to_regclass($1)`

	privilegesSQL = `
SELECT has_table_privilege(to_regclass($1), 'SELECT'),
       has_table_privilege(to_regclass($1), 'UPDATE'),
       has_table_privilege(to_regclass($1), 'DELETE'),
       to_regclass($2) IS NOT NULL,
       CASE WHEN to_regclass($2) IS NULL THEN false ELSE has_table_privilege(to_regclass($2), 'INSERT') END,
       has_schema_privilege($3, 'CREATE')`
)

// Column is one column of the outbox table as the catalog shows it.
type Column struct {
	// Type is the declared type, e.g. "character varying(200)".
	Type string
	// Base is the base type's name (a domain's underlying type), e.g.
	// "varchar", "jsonb", "timestamptz".
	Base    string
	NotNull bool
}

// Index is one index of the outbox table.
type Index struct {
	Name      string
	Keys      []string
	Predicate string
}

// PostgresFacts is what GatherPostgres learnt.
type PostgresFacts struct {
	ConnectErr string
	// TableFound is false when the table does not exist (or is not
	// visible to the role).
	TableFound bool
	Schema     string
	// EstimatedRows is the planner's estimate over every partition;
	// SizeBytes their size on disk.
	EstimatedRows, SizeBytes int64
	Columns                  map[string]Column
	Indexes                  []Index
	// Select, Update and Delete are the role's privileges on the table.
	Select, Update, Delete bool
	// DeadLetterExists, DeadLetterInsert: the dead-letter table, and the
	// role's INSERT on it; SchemaCreate: whether the role may create it.
	DeadLetterExists, DeadLetterInsert, SchemaCreate bool
	// Trigger: the NOTIFY trigger of `relay schema --notify` is installed.
	Trigger bool
	// QueryErr is the first catalog query that failed.
	QueryErr string
	// RelaysFound: the relays table exists; Relays are its rows, RelaysNow
	// the server's clock when they were read, RelaysErr why the read failed
	// (RelaysCheck).
	RelaysFound bool
	Relays      []outbox.TableRelay
	RelaysNow   time.Time
	RelaysErr   string
}

// quotedName is a name as the relay's SQL resolves it.
func quotedName(schema, name string) string {
	if schema != "" {
		return pgx.Identifier{schema, name}.Sanitize()
	}
	return pgx.Identifier{name}.Sanitize()
}

// GatherPostgres reads the catalog facts about t. It never fails: what it
// cannot learn is recorded in the facts.
func GatherPostgres(ctx context.Context, db *pgxpool.Pool, t *outbox.Table) PostgresFacts {
	var f PostgresFacts
	if err := db.Ping(ctx); err != nil {
		f.ConnectErr = errText(err)
		return f
	}
	q := quotedName(t.Schema(), t.Name())
	err := db.QueryRow(ctx, tableSQL, q).Scan(&f.Schema, &f.EstimatedRows, &f.SizeBytes)
	if err == pgx.ErrNoRows {
		return f
	}
	if err != nil {
		f.QueryErr = errText(err)
		return f
	}
	f.TableFound = true
	f.Columns = map[string]Column{}
	rows, err := db.Query(ctx, columnsSQL, q)
	if err == nil {
		for rows.Next() {
			var name string
			var c Column
			if err = rows.Scan(&name, &c.Type, &c.Base, &c.NotNull); err != nil {
				break
			}
			f.Columns[name] = c
		}
		rows.Close()
		err = firstErr(err, rows.Err())
	}
	if err == nil {
		rows, err = db.Query(ctx, indexesSQL, q)
		if err == nil {
			for rows.Next() {
				var ix Index
				if err = rows.Scan(&ix.Name, &ix.Predicate, &ix.Keys); err != nil {
					break
				}
				f.Indexes = append(f.Indexes, ix)
			}
			rows.Close()
			err = firstErr(err, rows.Err())
		}
	}
	if err == nil {
		err = db.QueryRow(ctx, privilegesSQL, q, quotedName(t.Schema(), t.DeadLetterTableName()), f.Schema).Scan(
			&f.Select, &f.Update, &f.Delete, &f.DeadLetterExists, &f.DeadLetterInsert, &f.SchemaCreate)
	}
	if err == nil {
		f.Trigger, err = t.HasNotifyTrigger(ctx, db)
	}
	if err != nil {
		f.QueryErr = errText(err)
	}
	if f.Relays, f.RelaysNow, f.RelaysFound, err = t.ReadRelays(ctx, db); err != nil {
		f.RelaysErr = errText(err)
	}
	return f
}

func firstErr(errs ...error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}

// BigTableRows is the estimated row count past which a table without the
// pending index makes every claim scan it.
const BigTableRows = 10000

// PostgresChecks judges the facts about t.
func PostgresChecks(f PostgresFacts, t *outbox.Table) Report {
	c := Check{Name: "postgres.connection"}
	if f.ConnectErr != "" {
		c.Status, c.Message = Fail, "PostgreSQL did not answer: "+f.ConnectErr+"."
		c.Fix = "check DATABASE_URL (host, port, user, password, sslmode) and the network path."
		return Report{c}
	}
	c.Status, c.Message = OK, "PostgreSQL answered."
	r := Report{c}
	tc := Check{Name: "outbox.table"}
	switch {
	case f.QueryErr != "" && !f.TableFound:
		tc.Status, tc.Message = Fail, "reading the catalog failed: "+f.QueryErr+"."
		return append(r, tc)
	case !f.TableFound:
		tc.Status, tc.Message = Fail, fmt.Sprintf("table %s does not exist (or the role cannot see it).", t)
		tc.Fix = "create it with `relay schema --apply`, or fix --table (names are case-sensitive)."
		return append(r, tc)
	}
	tc.Status, tc.Message = OK, fmt.Sprintf("table %s exists (about %d rows).", t, f.EstimatedRows)
	r = append(r, tc)
	r = append(r, ColumnChecks(f, t.Columns())...)
	r = append(r, IndexCheck(f, t), PrivilegesCheck(f, t), DeadLetterCheck(f, t), TriggerCheck(f, t))
	if f.QueryErr != "" {
		r = append(r, Check{Name: "outbox.catalog", Status: Warn,
			Message: "a catalog query failed, so some checks above are incomplete: " + f.QueryErr + "."})
	}
	return r
}

// columnRule is what one outbox column may be.
type columnRule struct {
	flag, name string
	types      []string // base type names accepted; nil: any
	want       string
	nullable   bool // must not be NOT NULL
	notNull    bool // should be NOT NULL: a warning otherwise
	whyNotNull string
	// unique: the event ids, which consumers dedupe on: a warning for a
	// type other than uuid (idWarning).
	unique bool
}

// idWarning is why an id column of a type other than uuid is a risk: the
// stream's consumers dedupe on event_id, and ids from a sequence repeat
// across tables and after the sequence starts again, so an event whose id
// a consumer saw before is taken for a duplicate and never handled.
const idWarning = "consumers dedupe on event_id, and ids of this type repeat across tables (and after the sequence " +
	"starts again, e.g. TRUNCATE ... RESTART IDENTITY): another table's event with the same id, published to the same " +
	"stream, is taken for a duplicate and never handled"

// ColumnChecks: one check per configured column: exists, usable type.
func ColumnChecks(f PostgresFacts, c outbox.Columns) Report {
	timestamps := []string{"timestamp", "timestamptz"}
	rules := []columnRule{
		{flag: "--id-column", name: c.ID, want: "any type that casts to text", unique: true},
		{flag: "--event-type-column", name: c.EventType, types: []string{"text", "varchar", "bpchar"}, want: "text or varchar"},
		{flag: "--payload-column", name: c.Payload, types: []string{"text", "varchar", "jsonb", "json"}, want: "text, jsonb or json"},
		{flag: "--created-at-column", name: c.CreatedAt, types: timestamps, want: "timestamp or timestamptz", notNull: true,
			whyNotNull: "a row without it sorts after every other in the claim's order, so it is claimed only once fewer " +
				"than a batch are pending (under steady load, never), and the backlog's oldest row leaves it out"},
		{flag: "--dispatched-at-column", name: c.DispatchedAt, types: timestamps, want: "timestamp or timestamptz, nullable",
			nullable: true},
	}
	r := make(Report, 0, len(rules))
	for _, rule := range rules {
		ch := Check{Name: "outbox.column." + strings.TrimSuffix(strings.TrimPrefix(rule.flag, "--"), "-column")}
		col, ok := f.Columns[rule.name]
		switch {
		case !ok:
			ch.Status, ch.Message = Fail, fmt.Sprintf("column %q does not exist.", rule.name)
			ch.Fix = "add it, or name the right column with " + rule.flag + " (case-sensitive)."
		case rule.types != nil && !contains(rule.types, col.Base):
			ch.Status, ch.Message = Fail, fmt.Sprintf("column %q is %s; the relay needs %s.", rule.name, col.Type, rule.want)
			ch.Fix = fmt.Sprintf("ALTER TABLE ... ALTER COLUMN %q TYPE ... (%s).", rule.name, rule.want)
		case rule.nullable && col.NotNull:
			ch.Status, ch.Message = Fail, fmt.Sprintf("column %q is NOT NULL; NULL is what marks a row pending.", rule.name)
			ch.Fix = fmt.Sprintf("ALTER TABLE ... ALTER COLUMN %q DROP NOT NULL.", rule.name)
		case rule.unique && col.Base != "uuid":
			ch.Status, ch.Message = Warn, fmt.Sprintf("column %q is %s: %s.", rule.name, col.Type, idWarning)
			ch.Fix = "give every table that publishes to this stream its own stream, or ids unique across all of them " +
				"(uuid, the default layout's: DEFAULT gen_random_uuid())."
		case rule.notNull && !col.NotNull:
			ch.Status, ch.Message = Warn, fmt.Sprintf("column %q allows NULL: %s.", rule.name, rule.whyNotNull)
			ch.Fix = fmt.Sprintf("ALTER TABLE ... ALTER COLUMN %q SET DEFAULT now(), ALTER COLUMN %q SET NOT NULL "+
				"(after giving the rows without it a value).", rule.name, rule.name)
		default:
			ch.Status, ch.Message = OK, fmt.Sprintf("column %q is %s.", rule.name, col.Type)
		}
		r = append(r, ch)
	}
	return r
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// normalizePredicate reduces "(dispatched_at IS NULL)" and its quoted
// forms to "dispatched_atisnull" for comparison.
func normalizePredicate(s string) string {
	return strings.ToLower(strings.NewReplacer("(", "", ")", "", " ", "", `"`, "").Replace(s))
}

// IndexCheck: a partial index on (created_at, id) WHERE dispatched_at IS
// NULL keeps the claim and the backlog query cheap on a big table.
func IndexCheck(f PostgresFacts, t *outbox.Table) Check {
	c := Check{Name: "outbox.index"}
	cols := t.Columns()
	want := normalizePredicate(cols.DispatchedAt + " IS NULL")
	var older string
	for _, ix := range f.Indexes {
		if normalizePredicate(ix.Predicate) != want || len(ix.Keys) == 0 || ix.Keys[0] != cols.CreatedAt {
			continue
		}
		if len(ix.Keys) >= 2 && ix.Keys[1] == cols.ID {
			c.Status, c.Message = OK, fmt.Sprintf("pending index %s on (%s, %s) WHERE %s IS NULL.",
				ix.Name, cols.CreatedAt, cols.ID, cols.DispatchedAt)
			return c
		}
		older = ix.Name
	}
	if older != "" {
		c.Status = OK
		c.Message = fmt.Sprintf("pending index %s is on (%s) without %s: it works (the planner adds a sort).", older, cols.CreatedAt, cols.ID)
		c.Fix = "when convenient: " + strings.TrimSpace(t.IndexDDL()) + " then drop " + older + "."
		return c
	}
	c.Fix = strings.TrimSpace(t.IndexDDL())
	if f.EstimatedRows > BigTableRows || f.SizeBytes > 64<<20 {
		c.Status = Warn
		c.Message = fmt.Sprintf("no partial index on (%s, %s) WHERE %s IS NULL, on a table of about %d rows (%d MiB): "+
			"every claim and backlog check scans it.",
			cols.CreatedAt, cols.ID, cols.DispatchedAt, f.EstimatedRows, f.SizeBytes>>20)
		return c
	}
	c.Status = Info
	c.Message = fmt.Sprintf("no partial index on (%s, %s) WHERE %s IS NULL; the table is small now, but claims will slow down as it grows.",
		cols.CreatedAt, cols.ID, cols.DispatchedAt)
	return c
}

// PrivilegesCheck: the relay needs SELECT and UPDATE, cleanup DELETE.
func PrivilegesCheck(f PostgresFacts, t *outbox.Table) Check {
	c := Check{Name: "outbox.privileges"}
	var missing []string
	if !f.Select {
		missing = append(missing, "SELECT")
	}
	if !f.Update {
		missing = append(missing, "UPDATE")
	}
	switch {
	case len(missing) > 0:
		if !f.Delete {
			missing = append(missing, "DELETE")
		}
		c.Status = Fail
		c.Message = fmt.Sprintf("the role lacks %s on %s: the relay cannot claim rows.", strings.Join(missing, ", "), t)
		c.Fix = fmt.Sprintf("GRANT %s ON %s TO <role>.", strings.Join(missing, ", "), t)
	case !f.Delete:
		c.Status = Warn
		c.Message = fmt.Sprintf("the role has SELECT and UPDATE on %s but not DELETE: the relay works, `relay cleanup` cannot.", t)
		c.Fix = fmt.Sprintf("GRANT DELETE ON %s TO <role> (or run cleanup with another role).", t)
	default:
		c.Status, c.Message = OK, fmt.Sprintf("the role has SELECT, UPDATE and DELETE on %s.", t)
	}
	return c
}

// DeadLetterCheck: rows that cannot be published need INSERT on the
// dead-letter table (or the right to create it).
func DeadLetterCheck(f PostgresFacts, t *outbox.Table) Check {
	c := Check{Name: "outbox.dead-letter-table"}
	dl := t.DeadLetterTable()
	switch {
	case f.DeadLetterExists && f.DeadLetterInsert:
		c.Status, c.Message = OK, fmt.Sprintf("dead-letter table %s exists and the role may INSERT into it.", dl)
	case f.DeadLetterExists:
		c.Status = Warn
		c.Message = fmt.Sprintf("the role may not INSERT into %s: a row that cannot be published holds up its batch.", dl)
		c.Fix = fmt.Sprintf("GRANT SELECT, INSERT, UPDATE, DELETE ON %s TO <role>.", dl)
	case f.SchemaCreate:
		c.Status, c.Message = OK, fmt.Sprintf("dead-letter table %s does not exist; the relay creates it at start.", dl)
	default:
		c.Status = Warn
		c.Message = fmt.Sprintf("dead-letter table %s does not exist and the role may not create it: "+
			"a row that cannot be published holds up its batch.", dl)
		c.Fix = "run `relay schema --apply` as the table's owner (it creates the dead-letter table)."
	}
	return c
}

// TriggerCheck reports the optional NOTIFY trigger.
func TriggerCheck(f PostgresFacts, t *outbox.Table) Check {
	c := Check{Name: "outbox.notify-trigger", Status: Info}
	if f.Trigger {
		c.Status, c.Message = OK, fmt.Sprintf("NOTIFY trigger %s is installed: relays wake at once on new rows.", t.TriggerName())
		return c
	}
	c.Message = "no NOTIFY trigger: relays poll (5 ms while events flow, --poll-interval when idle); that is fine."
	c.Fix = "optional: `relay schema --notify` prints it (it serialises committing producers on a lock)."
	return c
}
