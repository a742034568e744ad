package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/outbox-dev/outbox-operator/internal/outbox"
	"github.com/outbox-dev/outbox-operator/internal/relay"
)

// deadLetterFlags select parked rows, for every dead-letters subcommand.
type deadLetterFlags struct {
	ids          []int64
	all          bool
	since, until string
	output       string
}

func (f *deadLetterFlags) add(cmd *cobra.Command, selecting bool) {
	fs := cmd.Flags()
	fs.Int64SliceVar(&f.ids, "id", nil, "parked row ids (the id column of `list`), repeated or comma-separated")
	fs.StringVar(&f.since, "since", "", "only rows parked at or after this time (RFC 3339)")
	fs.StringVar(&f.until, "until", "", "only rows parked before this time (RFC 3339)")
	addOutputFlag(fs, &f.output)
	if selecting {
		fs.BoolVar(&f.all, "all", false, "every parked row (narrowed by --since and --until); required without --id")
	}
}

// filter validates the flags; selecting commands need --id or --all, so a
// bare command never changes every parked row by accident.
func (f *deadLetterFlags) filter(selecting bool) (outbox.DeadLetterFilter, error) {
	var out outbox.DeadLetterFilter
	if err := checkOutput(f.output); err != nil {
		return out, err
	}
	if selecting && len(f.ids) == 0 && !f.all {
		return out, errors.New("select the parked rows with --id, or --all (narrowed by --since and --until)")
	}
	if selecting && len(f.ids) > 0 && f.all {
		return out, errors.New("--id and --all exclude each other")
	}
	out.IDs = f.ids
	for _, t := range []struct {
		flag, v string
		dst     *time.Time
	}{{"--since", f.since, &out.Since}, {"--until", f.until, &out.Until}} {
		if t.v == "" {
			continue
		}
		v, err := time.Parse(time.RFC3339, t.v)
		if err != nil {
			return out, fmt.Errorf("%s %q: not an RFC 3339 time (e.g. 2026-12-01T10:00:00Z)", t.flag, t.v)
		}
		*t.dst = v
	}
	return out, nil
}

func newDeadLettersCommand(c *common) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "dead-letters",
		Aliases: []string{"dl"},
		Short:   "List, retry or discard the rows parked because they could not be published",
		Long: `Rows that can never be published (a NULL column, a payload over --max-payload-bytes,
an entry Redis refuses) are parked in the dead-letter table beside the outbox table
(<table>_dead_letters): a copy of the row and why. They are kept until a person
retries them (after fixing the cause) or discards them; cleanup never deletes them.`,
	}
	cmd.AddCommand(newDeadLettersListCommand(c), newDeadLettersRetryCommand(c), newDeadLettersDiscardCommand(c))
	return cmd
}

func newDeadLettersListCommand(c *common) *cobra.Command {
	var f deadLetterFlags
	var limit int
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List parked rows, oldest first",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			filter, err := f.filter(false)
			if err != nil {
				return err
			}
			if limit < 1 {
				return fmt.Errorf("--limit %d: must be positive", limit)
			}
			filter.Limit = limit
			return withPool(cmd.Context(), c, func(ctx context.Context, t *outbox.Table, db *pgxpool.Pool) error {
				rows, err := t.ListDeadLetters(ctx, db, filter)
				if err != nil {
					return err
				}
				if rows == nil {
					rows = []outbox.DeadLetter{}
				}
				if f.output == outputJSON {
					return json.NewEncoder(cmd.OutOrStdout()).Encode(rows)
				}
				return printDeadLetters(cmd.OutOrStdout(), rows)
			})
		},
	}
	f.add(cmd, false)
	cmd.Flags().IntVar(&limit, "limit", 1000, "most rows listed")
	return cmd
}

func printDeadLetters(w io.Writer, rows []outbox.DeadLetter) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	_, _ = fmt.Fprintln(tw, "ID\tEVENT ID\tTYPE\tSTREAM\tPARKED\tATTEMPTS\tBYTES\tREASON")
	orNull := func(s *string) string {
		if s == nil {
			return "NULL"
		}
		return *s
	}
	for _, d := range rows {
		size := "NULL"
		if d.PayloadBytes != nil {
			size = fmt.Sprint(*d.PayloadBytes)
		}
		_, _ = fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", d.ID, orNull(d.EventID), orNull(d.EventType), d.Stream,
			d.ParkedAt.UTC().Format(time.RFC3339), d.Attempts, size, d.Reason)
	}
	return tw.Flush()
}

func newDeadLettersRetryCommand(c *common) *cobra.Command {
	var f deadLetterFlags
	var maxPayload, waitReplicas, batchBytes int
	var publishTimeout, waitTimeout time.Duration
	cmd := &cobra.Command{
		Use:   "retry",
		Short: "Publish parked rows again, each to its stream, and remove those published",
		Long: `Publish parked rows again, after the cause is fixed: an UPDATE of the parked copy
(a NULL column), a larger --max-payload-bytes, or a Redis that accepts the entry.
A row is removed from the dead-letter table by the commit that follows Redis's
acknowledgement (at least once); with --wait-replicas N only once N replicas
acknowledged it too, as relay run does, so a failover cannot lose a row removed
here. A row that still cannot be published stays, with its new reason; the
command then exits with status 1.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			filter, err := f.filter(true)
			if err != nil {
				return err
			}
			if maxPayload < 1 || publishTimeout <= 0 {
				return errors.New("--max-payload-bytes and --publish-timeout must be positive")
			}
			if batchBytes < relay.MinBatchBytes {
				return fmt.Errorf("--batch-bytes %d: must be at least %d", batchBytes, relay.MinBatchBytes)
			}
			if waitReplicas < 0 || (waitReplicas > 0 && (waitTimeout <= 0 || waitTimeout >= publishTimeout)) {
				return errors.New("--wait-replicas must not be negative, and --wait-timeout must be positive and below --publish-timeout")
			}
			redisURL, err := secretEnv(envRedisURL)
			if err != nil {
				return err
			}
			rdb, err := newRedisClient(redisURL, c.redisCAFile, publishTimeout, netdialDefaults())
			if err != nil {
				return err
			}
			defer func() { _ = rdb.Close() }()
			return withPool(cmd.Context(), c, func(ctx context.Context, t *outbox.Table, db *pgxpool.Pool) error {
				res, err := relay.Retry(ctx, t, db, rdb, relay.RetryOptions{
					Filter: filter, MaxPayloadBytes: maxPayload, BatchBytes: batchBytes, PublishTimeout: publishTimeout,
					WaitReplicas: waitReplicas, WaitTimeout: waitTimeout,
				})
				if perr := printRetry(cmd.OutOrStdout(), f.output, res); err == nil {
					err = perr
				}
				if err == nil && len(res.Refused) > 0 {
					err = fmt.Errorf("%d parked rows still cannot be published; they stay parked", len(res.Refused))
				}
				return err
			})
		},
	}
	f.add(cmd, true)
	cmd.Flags().IntVar(&maxPayload, "max-payload-bytes", relay.DefaultMaxPayloadBytes, "larger payloads stay parked (and are not read)")
	cmd.Flags().IntVar(&batchBytes, "batch-bytes", relay.DefaultBatchBytes, fmt.Sprintf(
		"payload bytes read and published per page, as relay run's --batch-bytes (at least %d; a larger payload goes alone)",
		relay.MinBatchBytes))
	cmd.Flags().DurationVar(&publishTimeout, "publish-timeout", relay.DefaultPublishTimeout, "deadline of each page's XADD pipeline")
	cmd.Flags().IntVar(&waitReplicas, "wait-replicas", 0,
		"WAIT for this many replicas to acknowledge each page before its rows are removed (as relay run's --wait-replicas); 0: no wait")
	cmd.Flags().DurationVar(&waitTimeout, "wait-timeout", relay.DefaultWaitTimeout,
		"how long each page waits for --wait-replicas (below --publish-timeout)")
	return cmd
}

func printRetry(w io.Writer, output string, res relay.RetryResult) error {
	if output == outputJSON {
		return json.NewEncoder(w).Encode(res)
	}
	_, err := fmt.Fprintf(w, "republished %d parked rows %v\n", len(res.Republished), res.Republished)
	for _, r := range res.Refused {
		_, err = fmt.Fprintf(w, "still parked: %d: %s\n", r.ID, r.Reason)
	}
	return err
}

func newDeadLettersDiscardCommand(c *common) *cobra.Command {
	var f deadLetterFlags
	cmd := &cobra.Command{
		Use:   "discard",
		Short: "Delete parked rows for good",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			filter, err := f.filter(true)
			if err != nil {
				return err
			}
			return withPool(cmd.Context(), c, func(ctx context.Context, t *outbox.Table, db *pgxpool.Pool) error {
				ids, err := relay.Discard(ctx, t, db, filter)
				if err != nil {
					return err
				}
				if f.output == outputJSON {
					return json.NewEncoder(cmd.OutOrStdout()).Encode(map[string][]int64{"discarded": ids})
				}
				_, err = fmt.Fprintf(cmd.OutOrStdout(), "discarded %d parked rows %v\n", len(ids), ids)
				return err
			})
		},
	}
	f.add(cmd, true)
	return cmd
}
