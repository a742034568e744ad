package orders

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	ioutbox "github.com/outbox-dev/outbox-operator/internal/outbox"
	"github.com/outbox-dev/outbox-operator/pkg/consumer"
)

// The application's SQL; the outbox and processed-events tables come from
// their packages.
const (
	ordersDDL = `CREATE TABLE IF NOT EXISTS orders (
	id             uuid PRIMARY KEY DEFAULT gen_random_uuid(),
	customer_email text NOT NULL,
	amount         numeric(10,2) NOT NULL CHECK (amount > 0),
	created_at     timestamptz NOT NULL DEFAULT now()
);
`
	sentEmailsDDL = `CREATE TABLE IF NOT EXISTS sent_emails (
	order_id       uuid PRIMARY KEY,
	customer_email text NOT NULL,
	event_id       text NOT NULL,
	sent_at        timestamptz NOT NULL DEFAULT now()
);
`
	insertOrderSQL = `INSERT INTO orders (customer_email, amount) VALUES ($1, $2::numeric)
RETURNING id::text, customer_email, amount::text, created_at`
	selectOrderSQL = `SELECT id::text, customer_email, amount::text, created_at FROM orders WHERE id = $1::uuid`
	// schemaReadySQL is true once the tables the API writes exist.
	schemaReadySQL   = `SELECT to_regclass('orders') IS NOT NULL AND to_regclass($1) IS NOT NULL`
	insertSentSQL    = `INSERT INTO sent_emails (order_id, customer_email, event_id) VALUES ($1::uuid, $2, $3)`
	uniqueViolation  = "23505"
	invalidTextInput = "22P02"
)

// OutboxTable is the outbox table of the sample: the default layout.
var OutboxTable = ioutbox.MustNew("", ioutbox.Columns{})

// Schema returns the idempotent DDL of the sample application: orders, the
// outbox table with its partial index, processed_events and sent_emails.
func Schema() string {
	processed, err := consumer.ProcessedTableDDL("")
	if err != nil {
		panic(err) // the default name is valid
	}
	return ordersDDL + OutboxTable.DDL(ioutbox.DDLOptions{}) + processed + sentEmailsDDL
}

// Migrate applies Schema.
func Migrate(ctx context.Context, db *pgxpool.Pool) error {
	if _, err := db.Exec(ctx, Schema()); err != nil {
		return fmt.Errorf("applying the orders schema: %w", err)
	}
	return nil
}
