package outbox

import (
	"context"
	"errors"
	"hash/fnv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-dev/outbox-operator/internal/pgtx"
)

// ApplyDDL runs idempotent DDL of this table (DDL, DeadLetterDDL, ...) in
// one transaction holding the table's schema lock, an advisory lock that
// `relay schema --apply` and every relay creating its side tables take:
// two sessions running CREATE TABLE IF NOT EXISTS at once can otherwise
// fail with a unique violation on the catalog. The errors of such a race
// with a session that does not take the lock are ignored as well.
func (t *Table) ApplyDDL(ctx context.Context, db pgtx.Beginner, ddl string) error {
	err := pgtx.Run(ctx, db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", t.schemaLockKey()); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, ddl)
		return err
	})
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == codeUniqueViolation || pgErr.Code == codeDuplicateTable) {
		return nil
	}
	if err != nil {
		return t.classify(err)
	}
	return nil
}

// schemaLockKey is the advisory lock key of the table's DDL.
func (t *Table) schemaLockKey() int64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte("outbox-relay/schema/" + t.String()))
	return int64(h.Sum64() >> 1)
}
