package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-dev/outbox-operator/internal/pgtx"
)

// DropDispatchedPartitions detaches and drops every partition of a
// declaratively partitioned outbox whose rows are all dispatched longer
// than retention ago (and before the earliest window of a stream reset not
// yet replayed, ResetsHold): far cheaper than deleting them row by row. Each
// partition is checked and dropped in its own transaction, under a SHARE
// lock that keeps rows from being added or changed between the check and
// the drop; DETACH takes an ACCESS EXCLUSIVE lock on the outbox table for
// that short moment (bounded by lock_timeout), so claims wait meanwhile.
// The default partition, empty partitions (perhaps made ahead of time) and
// inheritance children are left alone, and so is every partition a new row
// could still need (partitionsSQL): only range partitions on the created-at
// column whose range has ended are dropped, since an insert that finds no
// partition fails. It returns the dropped partitions and the ones kept
// because a new row could need them; a table that is not partitioned has
// none.
func (t *Table) DropDispatchedPartitions(ctx context.Context, db pgtx.Beginner, q Querier,
	retention time.Duration) (dropped, needed []string, err error) {
	rows, err := q.Query(ctx, partitionsSQL, t.qTable, t.columns.CreatedAt)
	if err != nil {
		return nil, nil, t.classify(err)
	}
	type partition struct {
		Name  string
		Ended bool
	}
	parts, err := pgx.CollectRows(rows, pgx.RowToStructByPos[partition])
	if err != nil {
		return nil, nil, t.classify(err)
	}
	for _, p := range parts {
		if !p.Ended {
			needed = append(needed, p.Name)
			continue
		}
		part := p.Name
		var drop bool
		err := pgtx.Run(ctx, db, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "LOCK TABLE "+part+" IN SHARE MODE"); err != nil {
				return err
			}
			hold, err := t.ResetsHold(ctx, tx, retention)
			if err != nil {
				return err
			}
			check := t.format(partitionDroppableSQL, part)
			if err := tx.QueryRow(ctx, check, retention.Seconds(), hold.holdSince()).Scan(&drop); err != nil || !drop {
				return err
			}
			if _, err := tx.Exec(ctx, "ALTER TABLE "+t.qTable+" DETACH PARTITION "+part); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, "DROP TABLE "+part); err != nil {
				return err
			}
			return tx.Commit(ctx)
		})
		if err != nil {
			return dropped, needed, fmt.Errorf("dropping partition %s of %s: %w", part, t, err)
		}
		if drop {
			dropped = append(dropped, part)
		}
	}
	return dropped, needed, nil
}
