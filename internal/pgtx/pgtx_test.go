package pgtx

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outbox-dev/outbox-operator/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func setup(t *testing.T) *pgxpool.Pool {
	t.Helper()
	db, err := pgxpool.New(context.Background(), testenv.Postgres(t))
	require.NoError(t, err)
	t.Cleanup(db.Close)
	_, err = db.Exec(context.Background(), `CREATE TABLE t (n int PRIMARY KEY)`)
	require.NoError(t, err)
	return db
}

func rows(t *testing.T, db *pgxpool.Pool) []int {
	t.Helper()
	r, err := db.Query(context.Background(), `SELECT n FROM t ORDER BY n`)
	require.NoError(t, err)
	out, err := pgx.CollectRows(r, pgx.RowTo[int])
	require.NoError(t, err)
	return out
}

func TestRun(t *testing.T) {
	t.Parallel()
	db := setup(t)
	ctx := context.Background()
	insert := func(n int) func(pgx.Tx) error {
		return func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO t VALUES ($1)`, n)
			return err
		}
	}

	require.NoError(t, Run(ctx, db, insert(1)), "commits")

	boom := errors.New("boom")
	err := Run(ctx, db, func(tx pgx.Tx) error {
		require.NoError(t, insert(2)(tx))
		return boom
	})
	require.ErrorIs(t, err, boom, "fn's error as is")

	require.NoError(t, Run(ctx, db, func(tx pgx.Tx) error {
		require.NoError(t, insert(3)(tx))
		return tx.Commit(ctx)
	}), "fn may commit itself")

	require.Panics(t, func() {
		_ = Run(ctx, db, func(tx pgx.Tx) error {
			require.NoError(t, insert(4)(tx))
			panic("handler bug")
		})
	})

	cancelled, cancel := context.WithCancel(ctx)
	err = Run(cancelled, db, func(tx pgx.Tx) error {
		require.NoError(t, insert(5)(tx))
		cancel()
		return cancelled.Err()
	})
	require.ErrorIs(t, err, context.Canceled)

	require.Equal(t, []int{1, 3}, rows(t, db))
	// Every rollback released its locks: the rolled-back keys are free.
	require.NoError(t, Run(ctx, db, func(tx pgx.Tx) error {
		for _, n := range []int{2, 4, 5} {
			if err := insert(n)(tx); err != nil {
				return err
			}
		}
		return nil
	}))
	require.Zero(t, db.Stat().AcquiredConns(), "every connection went back to the pool")
}
