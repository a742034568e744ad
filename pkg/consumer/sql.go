package consumer

import "fmt"

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
`
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
	return fmt.Sprintf(processedTableDDL, q), nil
}
