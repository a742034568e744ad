package orders

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-dev/outbox-operator/internal/pgtx"
	"github.com/outbox-dev/outbox-operator/pkg/outbox"
)

// EventOrderCreated is the event type written for each new order.
const EventOrderCreated = "order_created"

// ErrNotFound: no order has that id.
var ErrNotFound = errors.New("order not found")

// CommitUnknownError is returned by Store.Create when the COMMIT was sent
// but its answer never came (the connection was lost, a timeout): the order
// and its event may have committed, or not. A client told "failed, try
// again" would then place a second order; it must look OrderID up first.
type CommitUnknownError struct {
	OrderID string
	Err     error
}

func (e *CommitUnknownError) Error() string {
	return fmt.Sprintf("the commit of order %s may or may not have happened: %v", e.OrderID, e.Err)
}

func (e *CommitUnknownError) Unwrap() error { return e.Err }

// commitOutcomeUnknown says whether a failed COMMIT may have committed all
// the same: yes, unless PostgreSQL answered, with an error or with
// ROLLBACK. pgconn.SafeToRetry is no guide here: a connection lost after
// the COMMIT was sent comes back from pgx as "conn closed", which it calls
// safe to retry.
func commitOutcomeUnknown(err error) bool {
	var pgErr *pgconn.PgError
	return !errors.As(err, &pgErr) && !errors.Is(err, pgx.ErrTxCommitRollback)
}

// Order is a stored order.
type Order struct {
	ID            string    `json:"order_id"`
	CustomerEmail string    `json:"customer_email"`
	Amount        string    `json:"amount"`
	CreatedAt     time.Time `json:"created_at"`
}

// OrderCreated is the payload of order_created.
type OrderCreated struct {
	OrderID       string `json:"order_id"`
	CustomerEmail string `json:"customer_email"`
	Amount        string `json:"amount"`
}

// Store reads and writes orders.
type Store struct {
	db *pgxpool.Pool
	// testHookAfterOrderInsert, when set, runs in the transaction after the
	// order row is inserted and before the outbox row; an error aborts the
	// transaction. Tests use it to fail at exactly that point.
	testHookAfterOrderInsert func(ctx context.Context, tx pgx.Tx) error
}

// NewStore returns a Store on db.
func NewStore(db *pgxpool.Pool) *Store { return &Store{db: db} }

// Create stores a validated order and its order_created outbox row in one
// transaction: both commit, or neither. When the COMMIT's answer is lost,
// the error is a *CommitUnknownError: the order may exist.
func (s *Store) Create(ctx context.Context, in NewOrder) (Order, error) {
	var o Order
	err := pgtx.Run(ctx, s.db, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, insertOrderSQL, in.CustomerEmail, in.Amount).
			Scan(&o.ID, &o.CustomerEmail, &o.Amount, &o.CreatedAt); err != nil {
			return fmt.Errorf("inserting order: %w", err)
		}
		if s.testHookAfterOrderInsert != nil {
			if err := s.testHookAfterOrderInsert(ctx, tx); err != nil {
				return err
			}
		}
		payload, err := json.Marshal(OrderCreated{OrderID: o.ID, CustomerEmail: o.CustomerEmail, Amount: o.Amount})
		if err != nil {
			return err
		}
		if _, err := outbox.Write(ctx, tx, outbox.Event{Type: EventOrderCreated, Payload: payload}); err != nil {
			return err
		}
		if err := tx.Commit(ctx); err != nil {
			if commitOutcomeUnknown(err) {
				return &CommitUnknownError{OrderID: o.ID, Err: err}
			}
			return fmt.Errorf("committing: %w", err)
		}
		return nil
	})
	if err != nil {
		return Order{}, fmt.Errorf("creating order: %w", err)
	}
	return o, nil
}

// Get reads an order; ErrNotFound when there is none with that id.
func (s *Store) Get(ctx context.Context, id string) (Order, error) {
	var o Order
	err := s.db.QueryRow(ctx, selectOrderSQL, id).Scan(&o.ID, &o.CustomerEmail, &o.Amount, &o.CreatedAt)
	var pgErr *pgconn.PgError
	switch {
	case errors.Is(err, pgx.ErrNoRows), errors.As(err, &pgErr) && pgErr.Code == invalidTextInput:
		return Order{}, ErrNotFound
	case err != nil:
		return Order{}, fmt.Errorf("reading order %s: %w", id, err)
	}
	return o, nil
}

// Ready returns nil when PostgreSQL answers and the tables the API writes
// exist.
func (s *Store) Ready(ctx context.Context) error {
	var ok bool
	if err := s.db.QueryRow(ctx, schemaReadySQL, OutboxTable.String()).Scan(&ok); err != nil {
		return fmt.Errorf("checking the schema: %w", err)
	}
	if !ok {
		return errors.New("the orders schema does not exist yet: run orders-api migrate")
	}
	return nil
}
