package outbox

import (
	"fmt"
	"strings"
)

// The SQL of the outbox lives here, and only here. %[n]s verbs are filled
// with quoted identifiers by the Table methods below; values are always bind
// parameters.
const (
	// claimSQL takes up to $1 pending rows, oldest first, skipping rows other
	// relays hold, and marks them dispatched in the same statement. The rows
	// are joined back by ctid: stable while the row is locked, and cheaper
	// than an index lookup on the id. RETURNING does not keep the CTE's order,
	// so callers sort by created_at (Claim does).
	claimSQL = `WITH batch AS (
	SELECT ctid FROM %[1]s
	WHERE %[6]s IS NULL
	ORDER BY %[5]s
	LIMIT $1
	FOR UPDATE SKIP LOCKED
)
UPDATE %[1]s AS o SET %[6]s = now()
FROM batch
WHERE o.ctid = batch.ctid
RETURNING o.%[2]s::text, o.%[3]s::text, o.%[4]s::text, o.%[5]s::timestamptz`

	// backlogSQL counts pending rows and finds the oldest. With the partial
	// index both are index-only over the pending rows.
	backlogSQL = `SELECT count(*), min(%[5]s)::timestamptz FROM %[1]s WHERE %[6]s IS NULL`

	// cleanupSQL deletes up to $2 rows dispatched more than $1 seconds ago.
	// Rows locked by someone else are skipped, so cleanup never waits on a
	// relay.
	cleanupSQL = `WITH doomed AS (
	SELECT ctid FROM %[1]s
	WHERE %[6]s < now() - make_interval(secs => $1)
	LIMIT $2
	FOR UPDATE SKIP LOCKED
)
DELETE FROM %[1]s AS o USING doomed WHERE o.ctid = doomed.ctid`

	// insertSQL writes one event with the id given by the caller.
	insertSQL = `INSERT INTO %[1]s (%[2]s, %[3]s, %[4]s) VALUES ($1, $2, $3)`

	// insertDefaultIDSQL writes one event and lets the table's default make
	// the id, which it returns.
	insertDefaultIDSQL = `INSERT INTO %[1]s (%[3]s, %[4]s) VALUES ($1, $2) RETURNING %[2]s::text`

	// tableExistsSQL resolves the table through search_path like the other
	// statements do; NULL when it does not exist.
	tableExistsSQL = `SELECT to_regclass($1) IS NOT NULL`

	// triggerExistsSQL reports whether the NOTIFY trigger is installed.
	triggerExistsSQL = `SELECT EXISTS (
	SELECT 1 FROM pg_trigger WHERE tgrelid = to_regclass($1) AND tgname = $2 AND NOT tgisinternal
)`

	tableDDL = `CREATE TABLE IF NOT EXISTS %[1]s (
	%[2]s uuid PRIMARY KEY DEFAULT gen_random_uuid(),
	%[3]s text NOT NULL,
	%[4]s text NOT NULL,
	%[5]s timestamptz NOT NULL DEFAULT now(),
	%[6]s timestamptz NULL
);`

	indexDDL = `CREATE INDEX IF NOT EXISTS %[7]s ON %[1]s (%[5]s) WHERE %[6]s IS NULL;`

	// The trigger is statement-level: one NOTIFY per inserting statement,
	// not per row. NOTIFY serialises committing transactions on a global
	// lock, so it is optional and polling is good on its own.
	triggerDDL = `CREATE OR REPLACE FUNCTION %[8]s() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
	PERFORM pg_notify(%[10]s, '');
	RETURN NULL;
END
$fn$;
CREATE OR REPLACE TRIGGER %[9]s AFTER INSERT ON %[1]s
	FOR EACH STATEMENT EXECUTE FUNCTION %[8]s();`
)

// format fills a statement template with the table's quoted identifiers.
func (t *Table) format(tmpl string) string {
	return fmt.Sprintf(tmpl,
		t.qTable,                               // 1
		t.qID,                                  // 2
		t.qType,                                // 3
		t.qPayload,                             // 4
		t.qCreated,                             // 5
		t.qDispatched,                          // 6
		quote(t.PendingIndexName()),            // 7 (an index lives in its table's schema)
		t.qualified(t.objectName("notify_fn")), // 8
		quote(t.TriggerName()),                 // 9
		quoteLiteral(t.Channel()),              // 10
	)
}

// quoteLiteral quotes a string known to match the identifier pattern (or a
// derived channel name) as an SQL string literal.
func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// ClaimSQL is the claim statement; $1 is the batch size.
func (t *Table) ClaimSQL() string { return t.format(claimSQL) }

// BacklogSQL counts pending rows and returns the oldest created_at.
func (t *Table) BacklogSQL() string { return t.format(backlogSQL) }

// CleanupSQL deletes a bounded batch; $1 is the retention in seconds, $2
// the batch size.
func (t *Table) CleanupSQL() string { return t.format(cleanupSQL) }

// InsertSQL inserts one event; $1 id, $2 event type, $3 payload.
func (t *Table) InsertSQL() string { return t.format(insertSQL) }

// InsertDefaultIDSQL inserts one event with the table's default id; $1
// event type, $2 payload; it returns the id as text.
func (t *Table) InsertDefaultIDSQL() string { return t.format(insertDefaultIDSQL) }

// DDLOptions selects the optional parts of DDL.
type DDLOptions struct {
	// Notify adds the statement-level NOTIFY trigger that wakes relays.
	Notify bool
}

// DDL returns the statements that create the table in the default types
// (uuid id, text type and payload, timestamptz times), its partial index on
// pending rows and, optionally, the NOTIFY trigger. Every statement is
// idempotent.
func (t *Table) DDL(opts DDLOptions) string {
	var parts []string
	if t.schema != "" {
		parts = append(parts, "CREATE SCHEMA IF NOT EXISTS "+quote(t.schema)+";")
	}
	parts = append(parts, t.format(tableDDL), t.format(indexDDL))
	if opts.Notify {
		parts = append(parts, t.format(triggerDDL))
	}
	return strings.Join(parts, "\n") + "\n"
}

// IndexDDL creates only the partial index, for an existing table.
func (t *Table) IndexDDL() string { return t.format(indexDDL) + "\n" }
