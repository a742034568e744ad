package main

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/outbox-dev/outbox-operator/internal/outbox"
)

func newBacklogCommand(c *common) *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "backlog",
		Short: "Print the count of undispatched rows, the oldest created_at and the count of parked rows",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			return withPool(cmd.Context(), c, func(ctx context.Context, t *outbox.Table, db *pgxpool.Pool) error {
				b, err := t.Backlog(ctx, db)
				if err != nil {
					return err
				}
				w := cmd.OutOrStdout()
				if output == outputJSON {
					return json.NewEncoder(w).Encode(b)
				}
				oldest := "none"
				if b.Oldest != nil {
					oldest = fmt.Sprintf("%s (%s ago)", b.Oldest.UTC().Format(time.RFC3339), b.Age(time.Now()).Round(time.Second))
				}
				_, err = fmt.Fprintf(w, "table:        %s\nbacklog:      %d\noldest:       %s\ndead letters: %d (relay dead-letters list)\n",
					t, b.Count, oldest, b.DeadLetters)
				return err
			})
		},
	}
	addOutputFlag(cmd.Flags(), &output)
	return cmd
}
