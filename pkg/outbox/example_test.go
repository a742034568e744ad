package outbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-dev/outbox-operator/internal/testenv"
	"github.com/outbox-dev/outbox-operator/pkg/outbox"
)

// exampleDB connects to a throwaway PostgreSQL server with the example's
// tables: the application's orders and the default outbox table. Examples
// cannot skip, so without PostgreSQL on the machine the example fails and
// prints how to install it.
func exampleDB(ctx context.Context) *pgxpool.Pool {
	exampleServer.Do(func() {
		srv, err := testenv.LaunchPostgres() // stopped by testenv.Main
		if err != nil {
			exampleErr = err
			return
		}
		exampleDSN = srv.DSN()
	})
	if exampleErr != nil {
		panic(exampleErr)
	}
	db, err := pgxpool.New(ctx, exampleDSN)
	if err != nil {
		panic(err)
	}
	if _, err := db.Exec(ctx, `
		DROP TABLE IF EXISTS orders, outbox_events;
		CREATE TABLE orders (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), customer_email text NOT NULL,
			amount numeric(10,2) NOT NULL);
		`+defaultDDL()); err != nil {
		panic(err)
	}
	return db
}

var (
	exampleServer sync.Once
	exampleDSN    string
	exampleErr    error
)

// An order and the event announcing it, in one transaction: both rows
// commit together or not at all.
func ExampleWrite() {
	ctx := context.Background()
	db := exampleDB(ctx)
	defer db.Close()

	tx, err := db.Begin(ctx)
	if err != nil {
		panic(err)
	}
	defer func() { _ = tx.Rollback(ctx) }() // a no-op after Commit

	var orderID string
	if err := tx.QueryRow(ctx, `INSERT INTO orders (customer_email, amount) VALUES ($1, $2) RETURNING id`,
		"reader@example.com", "19.99").Scan(&orderID); err != nil {
		panic(err)
	}
	payload, err := json.Marshal(map[string]string{
		"order_id": orderID, "customer_email": "reader@example.com", "amount": "19.99",
	})
	if err != nil {
		panic(err)
	}
	eventID, err := outbox.Write(ctx, tx, outbox.Event{Type: "order_created", Payload: payload})
	if err != nil {
		panic(err)
	}
	if err := tx.Commit(ctx); err != nil {
		panic(err)
	}

	// The relay will publish the row as the stream entry
	// event_id <eventID> event_type order_created payload <payload>.
	var typ, stored string
	if err := db.QueryRow(ctx, `SELECT event_type, payload FROM outbox_events WHERE id = $1 AND dispatched_at IS NULL`,
		eventID).Scan(&typ, &stored); err != nil {
		panic(err)
	}
	fmt.Println(typ, stored == string(payload))
	// Output: order_created true
}

// A table of another layout: the names are those given to the relay.
func ExampleNewWriter() {
	ctx := context.Background()
	db := exampleDB(ctx)
	defer db.Close()
	if _, err := db.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS shop; DROP TABLE IF EXISTS shop.events;
		CREATE TABLE shop.events (event_id uuid PRIMARY KEY, kind text NOT NULL, body jsonb NOT NULL,
			created_at timestamptz NOT NULL DEFAULT now(), published_at timestamptz)`); err != nil {
		panic(err)
	}

	w, err := outbox.NewWriter("shop.events", outbox.Columns{
		ID: "event_id", EventType: "kind", Payload: "body", DispatchedAt: "published_at",
	})
	if err != nil {
		panic(err)
	}
	err = pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		id, err := w.Write(ctx, tx, outbox.Event{
			ID:      "0b7e6f4e-1f0a-4c55-9a4a-7f3c1d2e9b10", // known before the insert
			Type:    "invoice_sent",
			Payload: []byte(`{"invoice": 42}`),
		})
		fmt.Println(id)
		return err
	})
	if err != nil {
		panic(err)
	}
	// Output: 0b7e6f4e-1f0a-4c55-9a4a-7f3c1d2e9b10
}
