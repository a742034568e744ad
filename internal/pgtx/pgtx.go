// Package pgtx runs a function in a PostgreSQL transaction, the one way the
// relay, the consumer package and the sample application open transactions.
//
// The rollback runs under context.WithoutCancel (with its own deadline), so a
// cancelled context, a SIGTERM for instance, still releases the transaction's
// locks at once instead of leaving them to the server's timeouts.
package pgtx

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// rollbackTimeout bounds the rollback after a failure.
const rollbackTimeout = 5 * time.Second

// Beginner opens transactions: *pgxpool.Pool and *pgx.Conn satisfy it.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Run runs fn in a transaction. When fn returns nil, Run commits, unless fn
// has already committed or rolled back itself. When fn returns an error, or
// panics, the transaction is rolled back and fn's error returned as is.
func Run(ctx context.Context, db Beginner, fn func(pgx.Tx) error) error {
	tx, err := db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("beginning transaction: %w", err)
	}
	defer func() {
		rbCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
		defer cancel()
		_ = tx.Rollback(rbCtx) // after a commit this is a no-op
	}()
	if err := fn(tx); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil && !errors.Is(err, pgx.ErrTxClosed) {
		return fmt.Errorf("committing transaction: %w", err)
	}
	return nil
}
