package consumer

import (
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// The SQL of the consumer; %[1]s is the quoted processed-events table.
const (
	// markProcessedSQL records an event as processed; no row is affected
	// when it was recorded before (or is being recorded by a transaction
	// still open, which it waits for).
	markProcessedSQL = `INSERT INTO %[1]s (event_id) VALUES ($1) ON CONFLICT (event_id) DO NOTHING`

	processedTableDDL = `CREATE TABLE IF NOT EXISTS %[1]s (
	event_id     text PRIMARY KEY,
	processed_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS %[2]s ON %[1]s (processed_at);
`

	// cleanupProcessedSQL deletes one batch of rows processed before $1:
	// at most $2, skipping rows another transaction holds, the predicate
	// repeated under the row lock.
	cleanupProcessedSQL = `WITH doomed AS (
	SELECT event_id FROM %[1]s WHERE processed_at < $1 ORDER BY processed_at LIMIT $2 FOR UPDATE SKIP LOCKED
)
DELETE FROM %[1]s AS p USING doomed WHERE p.event_id = doomed.event_id AND p.processed_at < $1`
)

// ProcessedTableDDL returns the idempotent statement that creates the
// processed-events table: event_id text primary key, processed_at. Empty
// means processed_events; a schema must exist already.
func ProcessedTableDDL(table string) (string, error) {
	if table == "" {
		table = DefaultProcessedTable
	}
	q, err := quoteTable(table)
	if err != nil {
		return "", err
	}
	name := table[strings.LastIndex(table, ".")+1:]
	index := pgx.Identifier{processedIndexName(name)}.Sanitize()
	return fmt.Sprintf(processedTableDDL, q, index), nil
}

// processedIndexName names the index on processed_at (which cleanup
// uses), within the 63-byte limit.
func processedIndexName(table string) string {
	const suffix = "_processed_at_idx"
	if len(table)+len(suffix) > 63 {
		table = table[:63-len(suffix)]
	}
	return table + suffix
}
