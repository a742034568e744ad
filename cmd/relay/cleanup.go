package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/outbox-dev/outbox-operator/internal/logical"
	"github.com/outbox-dev/outbox-operator/internal/outbox"
	"github.com/outbox-dev/outbox-operator/internal/relay"
)

func newCleanupCommand(c *common) *cobra.Command {
	var retention time.Duration
	var batchSize int
	var dropPartitions bool
	var slot string
	var margin time.Duration
	cmd := &cobra.Command{
		Use:   "cleanup",
		Short: "Delete dispatched rows older than the retention, in bounded batches (with --slot: streamed rows, by age)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if retention < 0 {
				return fmt.Errorf("--retention %s is negative", retention)
			}
			if batchSize < 1 {
				return fmt.Errorf("--batch-size %d must be at least 1", batchSize)
			}
			if slot != "" && dropPartitions {
				return errors.New("--drop-partitions judges dispatched_at, which source LogicalReplication (--slot) never sets")
			}
			return withPool(cmd.Context(), c, func(ctx context.Context, t *outbox.Table, db *pgxpool.Pool) error {
				start := time.Now()
				if slot != "" {
					o := logical.Options{Table: t, Slot: slot}
					// Checked before the first batch and before each next one:
					// a table attached meanwhile brings rows never streamed.
					before := func(ctx context.Context) error { return streamedHeld(ctx, db, o) }
					err := before(ctx)
					var n int64
					var cutoff time.Time
					if err == nil {
						n, cutoff, err = t.DeleteStreamed(ctx, db, slot, retention, margin, batchSize, before)
					}
					held, young, joined := (*outbox.ResetsPendingError)(nil), (*outbox.YoungProgressError)(nil), (*joinedError)(nil)
					if errors.As(err, &held) || errors.As(err, &young) || errors.As(err, &joined) {
						// Not a failure of the Job: the StreamIntact condition
						// and the relay's log already ask for the replay, a young
						// relay's rows are all within the retention, and the
						// relay publishes a joined partition's rows at its next
						// look.
						_, _ = fmt.Fprintf(cmd.OutOrStdout(), "deleted %d rows from %s: %v\n", n, t, err)
						return nil
					}
					if errors.Is(err, logical.ErrChildNotCovered) || errors.Is(err, logical.ErrPartitionNotCovered) ||
						errors.Is(err, logical.ErrUnlogged) {
						return fmt.Errorf("deleted %d rows, then stopped: %w", n, err)
					}
					if cutoff.IsZero() {
						return err
					}
					_, _ = fmt.Fprintf(cmd.OutOrStdout(),
						"deleted %d rows created before %s (older than %s, and streamed by slot %s more than that ago) from %s in %s\n",
						n, cutoff.UTC().Format(time.RFC3339), retention, slot, t, time.Since(start).Round(time.Millisecond))
					return err
				}
				hold, err := t.ResetsHold(ctx, db, retention)
				if err != nil {
					return err
				}
				switch {
				case hold != nil && hold.Pending:
					_, _ = fmt.Fprintf(cmd.OutOrStdout(), "keeping the rows dispatched since %s: a stream reset waits for a replay "+
						"(relay replay --pending; see %s)\n", hold.Since.UTC().Format(time.RFC3339), t.StreamResetsTable())
				case hold != nil:
					_, _ = fmt.Fprintf(cmd.OutOrStdout(), "keeping the rows dispatched since %s: a stream reset was replayed less "+
						"than %s ago, and a second loss would need them again (see %s)\n",
						hold.Since.UTC().Format(time.RFC3339), retention, t.StreamResetsTable())
				}
				if dropPartitions {
					dropped, needed, err := t.DropDispatchedPartitions(ctx, db, db, retention)
					for _, p := range dropped {
						_, _ = fmt.Fprintf(cmd.OutOrStdout(), "dropped partition %s: every row dispatched more than %s ago\n", p, retention)
					}
					if len(needed) > 0 {
						_, _ = fmt.Fprintf(cmd.OutOrStdout(), "kept partitions a new row could still need "+
							"(only range partitions on %s whose range has ended are dropped): %s\n",
							t.Columns().CreatedAt, strings.Join(needed, ", "))
					}
					if err != nil {
						return err
					}
				}
				n, err := t.DeleteAllDispatched(ctx, db, retention, batchSize, nil)
				_, _ = fmt.Fprintf(cmd.OutOrStdout(), "deleted %d dispatched rows older than %s from %s in %s\n",
					n, retention, t, time.Since(start).Round(time.Millisecond))
				return err
			})
		},
	}
	cmd.Flags().DurationVar(&retention, "retention", 72*time.Hour, "keep dispatched rows this long")
	cmd.Flags().IntVar(&batchSize, "batch-size", 1000, "rows deleted per statement")
	cmd.Flags().StringVar(&slot, "slot", "",
		"source LogicalReplication: delete the rows the slot's relay published more than the retention ago: created "+
			"--catch-up-margin before its commit as logged a retention ago, but those of transactions running at about that commit "+
			"(the slot's xmin horizon; rows are never marked dispatched in that mode)")
	cmd.Flags().DurationVar(&margin, "catch-up-margin", relay.DefaultCatchUpMargin,
		"with --slot: keep the rows a catch-up after a lost slot would read (the relay's --catch-up-margin)")
	cmd.Flags().BoolVar(&dropPartitions, "drop-partitions", false,
		"first detach and drop each partition whose rows are all dispatched past the retention "+
			"(declarative partitioning; needs the table's owner)")
	return cmd
}

// withPool validates the layout, connects with bounded session settings and
// runs fn.
func withPool(ctx context.Context, c *common, fn func(context.Context, *outbox.Table, *pgxpool.Pool) error) error {
	return withPoolTimeout(ctx, c, time.Minute, fn)
}

// withPoolTimeout is withPool with the given statement_timeout.
func withPoolTimeout(ctx context.Context, c *common, statementTimeout time.Duration,
	fn func(context.Context, *outbox.Table, *pgxpool.Pool) error) error {
	t, err := c.outboxTable()
	if err != nil {
		return err
	}
	dsn, err := secretEnv(envDatabaseURL)
	if err != nil {
		return err
	}
	cfg, err := outbox.PoolConfig(dsn, outbox.SessionSettings{
		StatementTimeout:         statementTimeout,
		LockTimeout:              5 * time.Second,
		IdleInTransactionTimeout: time.Minute,
		ApplicationName:          "outbox-relay",
	}, 1)
	if err != nil {
		return err
	}
	db, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("creating PostgreSQL pool: %w", err)
	}
	defer db.Close()
	if err := db.Ping(ctx); err != nil {
		return fmt.Errorf("connecting to %s: %w", databaseName(dsn), err)
	}
	return fn(ctx, t, db)
}

// joinedError: tables joined the outbox table since the slot's relay last
// looked (logical.NotPublished), with rows it has not published yet.
type joinedError struct {
	slot   string
	tables []logical.Partition
}

func (e *joinedError) Error() string {
	return fmt.Sprintf("tables %v joined it since slot %s's relay last looked, and their rows are not published yet", e.tables, e.slot)
}

// streamedHeld says why cleanup --slot must not delete now: a child or
// partition the publication does not cover (its rows were never streamed:
// they stay until a relay adds it and publishes them), or one that joined
// the table since the relay last looked (published within a second of its
// next look).
func streamedHeld(ctx context.Context, db outbox.Querier, o logical.Options) error {
	children, err := logical.Uncovered(ctx, db, o)
	if err != nil {
		return err
	}
	if len(children) > 0 {
		return logical.UncoveredError(o, children)
	}
	fresh, err := logical.NotPublished(ctx, db, o)
	if err != nil {
		return err
	}
	if len(fresh) > 0 {
		return &joinedError{slot: o.Slot, tables: fresh}
	}
	return nil
}
