package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/outbox-dev/outbox-operator/internal/outbox"
	"github.com/outbox-dev/outbox-operator/internal/relay"
)

type replayOptions struct {
	stream           string
	since, until     string
	pending          bool
	batchSize        int
	batchBytes       int
	publishTimeout   time.Duration
	statementTimeout time.Duration
	waitReplicas     int
	waitTimeout      time.Duration
	maxPayloadBytes  int
	source           string
	acceptUnparked   bool
	inFlightWait     time.Duration
	output           string
}

func newReplayCommand(c *common) *cobra.Command {
	var o replayOptions
	cmd := &cobra.Command{
		Use:   "replay",
		Short: "Republish the rows dispatched in a window, after the stream lost entries",
		Long: `Republish to the stream the outbox rows dispatched in a window of time (they stay
in the table until cleanup deletes them), in (created_at, id) order, in pipelines of
--batch-size entries: at least once, so consumers dedupe on event_id. Use it after
a stream reset (Redis restarted without persistence, was flushed, failed over to a
replica that lagged, or evicted the stream): the relay logs the window, exports it
as metrics, records it in <table>_stream_resets and the operator shows it in the
OutboxRelay's StreamIntact condition. --pending replays the union of the recorded
resets' windows. The resets whose window the replay covered are marked replayed,
and the replay itself is recorded, so that a later reset covers its rows too.
The rows are read, never changed; running the same replay twice only duplicates.

Relays of --source LogicalReplication mark no row dispatched: give the same
--source here, and the window bounds the rows' created_at instead; with --pending,
every row the table keeps is republished (a row's event reaches the stream any time
after its created_at, and a created_at may lie ahead of the reset), as far back as
relay cleanup --slot kept.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runReplay(cmd, c, &o)
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&o.stream, "stream", relay.DefaultStream, "Redis stream to republish to")
	fs.StringVar(&o.since, "since", "", "republish rows dispatched at or after this time (RFC 3339); required without --pending")
	fs.StringVar(&o.until, "until", "", "and before this time (RFC 3339; default now)")
	fs.BoolVar(&o.pending, "pending", false, "replay the window of every stream reset recorded for --stream and not replayed yet")
	fs.IntVar(&o.batchSize, "batch-size", relay.DefaultBatchSize, fmt.Sprintf("entries per pipeline (1..%d)", relay.MaxBatchSize))
	fs.IntVar(&o.batchBytes, "batch-bytes", relay.DefaultBatchBytes, fmt.Sprintf(
		"bytes of ids, types and payloads per pipeline (at least %d; a larger event goes alone)", relay.MinBatchBytes))
	fs.DurationVar(&o.publishTimeout, "publish-timeout", relay.DefaultPublishTimeout, "deadline of each pipeline")
	fs.DurationVar(&o.statementTimeout, "statement-timeout", time.Hour, "PostgreSQL statement_timeout of the one query that reads the window")
	fs.IntVar(&o.waitReplicas, "wait-replicas", 0, "WAIT for this many replicas after each pipeline")
	fs.DurationVar(&o.waitTimeout, "wait-timeout", relay.DefaultWaitTimeout, "how long each pipeline waits for --wait-replicas")
	fs.IntVar(&o.maxPayloadBytes, "max-payload-bytes", relay.DefaultMaxPayloadBytes, "larger payloads are skipped (they were parked)")
	fs.BoolVar(&o.acceptUnparked, "accept-unparked", false,
		"mark the resets replayed even when rows over the payload limits were skipped whose parked copies are gone (discarded)")
	fs.DurationVar(&o.inFlightWait, "in-flight-wait", time.Minute,
		"first wait at most this long for the transactions running when the replay starts (relays' batches in flight) "+
			"to end; above the relays' --in-flight times --publish-timeout plus 15s; past it no reset is marked replayed; 0: do not wait")
	fs.StringVar(&o.source, "source", string(relay.SourcePolling),
		"the relays' --source: with LogicalReplication the rows are selected by created_at, not dispatched_at")
	addOutputFlag(fs, &o.output)
	return cmd
}

func (o *replayOptions) validate() error {
	var errs []error
	if err := checkOutput(o.output); err != nil {
		errs = append(errs, err)
	}
	if o.pending == (o.since != "") {
		errs = append(errs, errors.New("give either --since (and optionally --until) or --pending"))
	}
	if o.pending && o.until != "" {
		errs = append(errs, errors.New("--until goes with --since, not --pending"))
	}
	if o.batchSize < 1 || o.batchSize > relay.MaxBatchSize {
		errs = append(errs, fmt.Errorf("--batch-size %d: must be between 1 and %d", o.batchSize, relay.MaxBatchSize))
	}
	if o.batchBytes < relay.MinBatchBytes {
		errs = append(errs, fmt.Errorf("--batch-bytes %d: must be at least %d", o.batchBytes, relay.MinBatchBytes))
	}
	if o.publishTimeout <= 0 || o.statementTimeout <= 0 || o.maxPayloadBytes < 1 {
		errs = append(errs, errors.New("--publish-timeout, --statement-timeout and --max-payload-bytes must be positive"))
	}
	if _, err := relay.ParseSource(o.source); err != nil {
		errs = append(errs, err)
	}
	if o.inFlightWait < 0 {
		errs = append(errs, fmt.Errorf("--in-flight-wait %s: must not be negative", o.inFlightWait))
	}
	if o.waitReplicas < 0 || (o.waitReplicas > 0 && (o.waitTimeout <= 0 || o.waitTimeout >= o.publishTimeout)) {
		errs = append(errs, errors.New("--wait-replicas must not be negative, and --wait-timeout must be positive and below --publish-timeout"))
	}
	return errors.Join(errs...)
}

// window reads --since and --until (default now).
func (o *replayOptions) window() (since, until time.Time, err error) {
	until = time.Now()
	for _, t := range []struct {
		flag, v string
		dst     *time.Time
	}{{"--since", o.since, &since}, {"--until", o.until, &until}} {
		if t.v == "" {
			continue
		}
		if *t.dst, err = time.Parse(time.RFC3339, t.v); err != nil {
			return since, until, fmt.Errorf("%s %q: not an RFC 3339 time (e.g. 2026-12-01T10:00:00Z)", t.flag, t.v)
		}
	}
	if !since.Before(until) {
		return since, until, fmt.Errorf("--since %s is not before --until %s", since.Format(time.RFC3339), until.Format(time.RFC3339))
	}
	return since, until, nil
}

func runReplay(cmd *cobra.Command, c *common, o *replayOptions) error {
	if err := o.validate(); err != nil {
		return err
	}
	redisURL, err := secretEnv(envRedisURL)
	if err != nil {
		return err
	}
	rdb, err := newRedisClient(redisURL, c.redisCAFile, o.publishTimeout, netdialDefaults())
	if err != nil {
		return err
	}
	defer func() { _ = rdb.Close() }()
	return withPoolTimeout(cmd.Context(), c, o.statementTimeout, func(ctx context.Context, t *outbox.Table, db *pgxpool.Pool) error {
		source, _ := relay.ParseSource(o.source) // validated
		created := source == relay.SourceLogicalReplication
		var since, until time.Time
		if o.pending {
			p, err := t.PendingStreamResets(ctx, db, o.stream)
			if err != nil {
				return err
			}
			if p.Count == 0 {
				return printReplay(cmd, o.output, relay.ReplayResult{}, "no stream reset of "+o.stream+" waits for a replay")
			}
			since, until = relay.ReplayWindow(*p.WindowStart, *p.WindowEnd, created)
		} else if since, until, err = o.window(); err != nil {
			return err
		}
		res, err := relay.Replay(ctx, t, db, rdb, relay.ReplayOptions{
			Stream: o.stream, Since: since, Until: until, Created: created, BatchSize: o.batchSize, BatchBytes: o.batchBytes,
			PublishTimeout: o.publishTimeout, MaxPayloadBytes: o.maxPayloadBytes,
			WaitReplicas: o.waitReplicas, WaitTimeout: o.waitTimeout, AcceptUnparked: o.acceptUnparked,
			InFlightWait: o.inFlightWait,
		})
		by := "dispatched"
		if created {
			by = "created"
		}
		msg := fmt.Sprintf("republished %d events %s from %s to %s to %s (%d skipped: parked rows); %d recorded resets marked replayed",
			res.Republished, by, since.UTC().Format(time.RFC3339), until.UTC().Format(time.RFC3339), o.stream, res.Skipped,
			res.ResetsReplayed)
		if perr := printReplay(cmd, o.output, res, msg); err == nil {
			err = perr
		}
		for _, w := range []string{res.Incomplete, res.StillRunning, res.ResetsKept} {
			if w != "" && o.output != outputJSON { // JSON carries them as "incomplete", "stillRunning" and "resetsKept"
				_, _ = fmt.Fprintln(cmd.ErrOrStderr(), "warning: "+w)
			}
		}
		return err
	})
}

func printReplay(cmd *cobra.Command, output string, res relay.ReplayResult, msg string) error {
	if output == outputJSON {
		return json.NewEncoder(cmd.OutOrStdout()).Encode(res)
	}
	_, err := fmt.Fprintln(cmd.OutOrStdout(), msg)
	return err
}
