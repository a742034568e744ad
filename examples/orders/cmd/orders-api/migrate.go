package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/outbox-dev/outbox-operator/examples/orders"
)

func newMigrateCommand(getenv func(string) string, o *options) *cobra.Command {
	var timeout time.Duration
	var printOnly bool
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Create the schema (orders, outbox table and partial index, processed_events, sent_emails); idempotent",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if printOnly {
				_, err := fmt.Fprint(cmd.OutOrStdout(), orders.Schema())
				return err
			}
			return migrate(cmd.Context(), cmd.ErrOrStderr(), getenv, o, timeout)
		},
	}
	cmd.Flags().DurationVar(&timeout, "timeout", 2*time.Minute,
		"how long to wait for PostgreSQL to accept connections (a Job may start before the database)")
	cmd.Flags().BoolVar(&printOnly, "print", false, "print the DDL instead of running it")
	return cmd
}

// migrate applies the schema, retrying while PostgreSQL does not answer yet.
func migrate(ctx context.Context, logTo io.Writer, getenv func(string) string, o *options, timeout time.Duration) error {
	log, err := o.log.Logger(logTo)
	if err != nil {
		return err
	}
	db, err := connect(ctx, getenv, 1)
	if err != nil {
		return err
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for attempt := 1; ; attempt++ {
		err := db.Ping(ctx)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return fmt.Errorf("PostgreSQL did not answer within %s: %w", timeout, err)
		}
		log.Warn("PostgreSQL does not answer yet, retrying", "error", err.Error(), "attempt", attempt)
		select {
		case <-ctx.Done():
		case <-time.After(2 * time.Second):
		}
	}
	if err := orders.Migrate(ctx, db); err != nil {
		return err
	}
	log.Info("Applied the orders schema")
	return nil
}
