package main

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/outbox-dev/outbox-operator/internal/outbox"
)

func newSchemaCommand(c *common) *cobra.Command {
	var apply, notify, partitioned bool
	cmd := &cobra.Command{
		Use:   "schema",
		Short: "Print the outbox DDL (table, partial index, dead-letter table, optional NOTIFY trigger); --apply runs it",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			t, err := c.outboxTable()
			if err != nil {
				return err
			}
			ddl := t.DDL(outbox.DDLOptions{Notify: notify, Partitioned: partitioned})
			if !apply {
				_, err := fmt.Fprint(cmd.OutOrStdout(), ddl)
				return err
			}
			return withPool(cmd.Context(), c, func(ctx context.Context, t *outbox.Table, db *pgxpool.Pool) error {
				if err := t.ApplyDDL(ctx, db, ddl); err != nil {
					return fmt.Errorf("applying schema of %s: %w", t, err)
				}
				_, err := fmt.Fprintf(cmd.OutOrStdout(), "applied schema of %s\n", t)
				return err
			})
		},
	}
	cmd.Flags().BoolVar(&apply, "apply", false, "run the DDL against DATABASE_URL")
	cmd.Flags().BoolVar(&notify, "notify", false, "include the statement-level NOTIFY trigger")
	cmd.Flags().BoolVar(&partitioned, "partitioned", false,
		"a table range-partitioned on the created-at column, with a default partition (add one per day or month)")
	return cmd
}
