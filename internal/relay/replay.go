package relay

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/outbox-dev/outbox-operator/internal/outbox"
)

// ReplayOptions configures Replay.
type ReplayOptions struct {
	// Stream receives the events again; required.
	Stream string
	// Since and Until bound the dispatch times (dispatched_at) of the rows
	// republished: Since <= dispatched_at < Until; with Created, their
	// created_at.
	Since, Until time.Time
	// Created selects the rows by created_at (Table.Created: rows without
	// one too) instead of dispatched_at: for a relay of source
	// LogicalReplication, which marks no row dispatched, so that a replay by
	// dispatched_at would find nothing to republish.
	Created bool
	// BatchSize is the number of events per pipeline; default
	// DefaultBatchSize.
	BatchSize int
	// BatchBytes bounds the ids, types and payloads of a pipeline (a larger
	// event goes alone); default DefaultBatchBytes.
	BatchBytes int
	// PublishTimeout bounds each pipeline; default DefaultPublishTimeout.
	PublishTimeout time.Duration
	// MaxPayloadBytes: larger payloads are skipped (the relay parked them
	// when they were claimed); default DefaultMaxPayloadBytes.
	MaxPayloadBytes int
	// WaitReplicas and WaitTimeout make each pipeline WAIT for replicas, as
	// the relay does.
	WaitReplicas int
	WaitTimeout  time.Duration
	// MarkSince, when set, replaces Since as the start of the window within
	// which recorded resets are marked replayed (an automatic replay
	// clamped to its bound still covers the reset it was made for).
	MarkSince time.Time
	// AcceptUnparked marks the resets replayed even when rows over the
	// payload limits that no relay parked were skipped (their parked copies
	// were discarded on purpose); without it the replay fails on them.
	AcceptUnparked bool
	// KeepResets, when set, says why the replay marks no recorded reset
	// replayed (ReplayResult.ResetsKept): the automatic replay's wait for
	// the transactions in flight ended before they did. InFlightWait
	// ending before they did sets it too.
	KeepResets string
	// InFlightWait, when above 0, makes the replay first wait, at most
	// that long, for every transaction running when it starts to end: a
	// relay's batch that added its entries to the lost stream and has not
	// committed yet is one, and the replay's read would not see its rows
	// (so the reset would be marked replayed without them). A relay's batch
	// ends within its in-flight batches times its publish timeout plus
	// 15 s. The automatic replay waits by itself.
	InFlightWait time.Duration
}

// ReplayResult is what Replay did.
type ReplayResult struct {
	// Republished is the number of events added to the stream again.
	Republished int64 `json:"republished"`
	// Skipped counts the rows that were not: malformed, or over the
	// payload limit (the relay parked them in the dead-letter table).
	Skipped int64 `json:"skipped"`
	// First and Last are the created_at of the first and last event
	// republished.
	First *time.Time `json:"first,omitempty"`
	Last  *time.Time `json:"last,omitempty"`
	// ResetsReplayed is the number of recorded stream resets whose window
	// the replay covered, now marked replayed.
	ResetsReplayed int64 `json:"resetsReplayed"`
	// Incomplete, when set, says why the window may have held more events
	// than the table still has (outbox.Table.KeepsRowsBefore): those were
	// not republished, and cannot be.
	Incomplete string `json:"incomplete,omitempty"`
	// StillRunning, when set, says that transactions running when the
	// replay started had not ended after InFlightWait: a relay's batch
	// among them that commits later was not replayed, so no reset was
	// marked replayed (ResetsKept).
	StillRunning string `json:"stillRunning,omitempty"`
	// ResetsKept, when set, says why the replay marked no reset replayed
	// though it ended: a replay by created_at (Created) over a bounded
	// window covers no reset's window.
	ResetsKept string `json:"resetsKept,omitempty"`
}

// Replay republishes the rows dispatched (with Created: created) in
// [Since, Until) to the stream, in (created_at, id) order, in pipelines of
// BatchSize entries, each acknowledged by Redis (and WaitReplicas replicas)
// before the next is sent: at least once, so consumers see duplicates of
// what they already had, and dedupe them on event_id. The rows stay as
// they are. The replay is recorded in the stream-resets table before its
// first page, and its end when it ends (so that a reset found later, or
// while it runs, covers the rows it added again, Table.RecordReplay), and
// when every page went out, the recorded stream resets of the stream whose
// window (its end included) lies within [Since, Until), detected before the replay started,
// are marked replayed. On an error, what was republished so far is in the
// result; running the same replay again is safe.
func Replay(ctx context.Context, table *outbox.Table, db *pgxpool.Pool, rdb redis.UniversalClient,
	o ReplayOptions) (res ReplayResult, retErr error) {
	if o.Stream == "" {
		return res, errors.New("replay: a stream is required")
	}
	if !o.Since.Before(o.Until) {
		return res, fmt.Errorf("replay: since %s is not before until %s", o.Since.Format(time.RFC3339), o.Until.Format(time.RFC3339))
	}
	r := &Relay{cfg: Config{
		Table: table, Stream: o.Stream,
		MaxPayloadBytes: cmp.Or(o.MaxPayloadBytes, DefaultMaxPayloadBytes),
		PublishTimeout:  cmp.Or(o.PublishTimeout, DefaultPublishTimeout),
		WaitReplicas:    o.WaitReplicas, WaitTimeout: cmp.Or(o.WaitTimeout, DefaultWaitTimeout),
	}}
	read, by := table.Dispatched, "dispatched_at"
	if o.Created {
		read, by = table.Created, "created_at"
	}
	page := outbox.Limit{Rows: cmp.Or(o.BatchSize, DefaultBatchSize), Bytes: cmp.Or(o.BatchBytes, DefaultBatchBytes)}
	// Resets detected from now on are not marked by this replay: one may
	// have lost entries it added (its window reaches back to this replay's
	// by the record made below, before the first page), or entries of a
	// batch that claimed after the wait below took its transaction id (the
	// replay neither waits for that batch nor sees its rows).
	started, err := outbox.Now(ctx, db)
	if err != nil {
		return res, fmt.Errorf("replaying %s: %w", o.Stream, err)
	}
	if o.InFlightWait > 0 {
		ended, err := waitRunningNow(ctx, table, db, o.InFlightWait)
		if err != nil {
			return res, fmt.Errorf("replaying %s: %w", o.Stream, err)
		}
		if !ended {
			res.StillRunning = fmt.Sprintf("transactions running when the replay started had not ended after %s "+
				"(see pg_stat_activity): a relay's batch among them that commits later is not in this replay; "+
				"replay the window again once they have ended", o.InFlightWait)
			// Its rows are not in this replay's read: the resets stay
			// pending (StreamIntact, cleanup's hold, --pending), as the
			// automatic replay's do when its own wait ends first.
			o.KeepResets = cmp.Or(o.KeepResets, "transactions running when the replay started had not ended after "+
				o.InFlightWait.String()+": a relay's batch among them may hold events the stream lost, and this replay "+
				"did not see its rows; the resets stay pending, replay again once they have ended")
		}
	}
	record, err := table.RecordReplay(ctx, db, o.Stream, o.Since, o.Until, "replayed: the rows of this window by "+by)
	if err != nil {
		return res, err
	}
	if record != 0 {
		defer func() {
			// Not cut short by a cancelled replay: the record's end is
			// what keeps later windows as narrow as they need be.
			ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			defer cancel()
			if err := table.ReplayEnded(ctx, db, record, res.Republished > 0); err != nil && retErr == nil {
				retErr = err
			}
		}()
	}
	var skippedIDs []string
	err = read(ctx, db, o.Since, o.Until, page, func(events []outbox.Event) error {
		n, skipped, err := r.replayPage(ctx, rdb, events, &skippedIDs)
		res.Republished += n
		res.Skipped += skipped
		if n > 0 {
			// Copies: the page's events are reused for the next page.
			if res.First == nil {
				first := events[0].CreatedAt
				res.First = &first
			}
			last := events[len(events)-1].CreatedAt
			res.Last = &last
		}
		return err
	})
	if err != nil {
		return res, fmt.Errorf("replaying %s: %w", o.Stream, err)
	}
	// Rows skipped that no relay parked keep the resets pending (below).
	var unparked error
	if !o.AcceptUnparked {
		unparked = notParked(ctx, table, db, skippedIDs, r.cfg.MaxPayloadBytes)
	}
	// A window from the epoch (ReplayWindow of a slot's relay) asks for
	// every row kept: none older can be missing from it.
	// A hint, best effort: its failure does not undo the replay.
	kept := !o.Since.After(time.Unix(0, 0))
	if !kept {
		if kept, err = table.KeepsRowsBefore(ctx, db, o.Created, o.Since); err != nil {
			res.Incomplete = "could not look for rows older than the window (" + err.Error() + ")"
			kept = true
		}
	}
	if !kept {
		res.Incomplete = fmt.Sprintf("no row %s before %s is left in %s: cleanup may have deleted rows of the window "+
			"already (it deletes the rows past its retention), whose events could not be republished",
			strings.TrimSuffix(by, "_at"), o.Since.UTC().Format(time.RFC3339), table)
	}
	if unparked != nil {
		return res, fmt.Errorf("replaying %s: %w", o.Stream, unparked)
	}
	if o.Created && (o.Since.After(time.Unix(0, 0)) || o.Until.Before(noTimeBound)) {
		// A reset's window is of stream times, and a slot relay streams a
		// row any time after its created_at (a lag, a catch-up, a long
		// transaction) or before it (a created_at ahead): no bounded window
		// of created_at covers the events a reset lost (ReplayWindow).
		res.ResetsKept = "a replay by created_at over a bounded window marks no stream reset replayed: " +
			"the events a reset lost may have rows created outside any window; replay with --pending " +
			"(every row kept) to end the resets"
		return res, nil
	}
	if o.KeepResets != "" {
		res.ResetsKept = o.KeepResets
		return res, nil
	}
	markSince := o.Since
	if !o.MarkSince.IsZero() {
		markSince = o.MarkSince
	}
	res.ResetsReplayed, err = table.MarkStreamResetsReplayed(ctx, db, o.Stream, markSince, o.Until, started)
	return res, err
}

// notParked fails when a row the replay skipped for its size (over
// maxPayload or Redis's proto-max-bulk-len) has no parked copy: the relays
// published it (with a larger --max-payload-bytes, or to a Redis that took
// it), so its event may be lost with the stream, and the resets must stay
// pending until a replay that can publish it; or a person discarded its
// parked copy (ReplayOptions.AcceptUnparked). A malformed row was never
// published by any relay: not checked.
func notParked(ctx context.Context, table *outbox.Table, db *pgxpool.Pool, skipped []string, maxPayload int) error {
	if len(skipped) == 0 {
		return nil
	}
	parked, err := table.ParkedAmong(ctx, db, skipped)
	if err != nil {
		return err
	}
	var missing []string
	for _, id := range skipped {
		if !parked[id] {
			missing = append(missing, id)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	return fmt.Errorf("%d rows of the window were not republished (over --max-payload-bytes %d or Redis's proto-max-bulk-len), "+
		"though no parked copy of them is left, e.g. %s: the relays published them with a larger limit (replay with the relays' "+
		"--max-payload-bytes), or their parked copies were discarded (replay with --accept-unparked); "+
		"the stream resets stay pending", len(missing), maxPayload, missing[0])
}

// replayPage adds one page's publishable events in one pipeline and
// returns how many went out and how many were skipped, whose ids it adds
// to skippedIDs.
func (r *Relay) replayPage(ctx context.Context, rdb redis.UniversalClient, events []outbox.Event,
	skippedIDs *[]string) (int64, int64, error) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.PublishTimeout)
	defer cancel()
	bulk := r.bulkLimit.get(ctx, rdb)
	pipe, err := r.pipelineFor(ctx, rdb, r.cfg.Stream)
	if err != nil {
		return 0, 0, &publishError{err}
	}
	add := newEntries(r.cfg.Stream, 0, len(events))
	keyed := r.cfg.Table.Columns().Key != "" // the entries of ordering PerKey carry the key
	var skipped int64
	for _, e := range events {
		if r.unpublishable(e, bulk) != "" {
			skipped++
			if e.Malformed == "" {
				*skippedIDs = append(*skippedIDs, e.ID)
			}
			continue
		}
		if keyed {
			add.addFields(ctx, pipe, e.ID, e.Type, e.Payload, FieldKey, e.Key)
		} else {
			add.add(ctx, pipe, e.ID, e.Type, e.Payload, "")
		}
	}
	if pipe.Len() == 0 {
		return 0, skipped, nil
	}
	wait := r.queueWait(ctx, pipe)
	if _, err := pipe.Exec(ctx); err != nil {
		return 0, skipped, &publishError{err}
	}
	if err := r.checkWait(wait); err != nil {
		return 0, skipped, err
	}
	return int64(len(events)) - skipped, skipped, nil
}

// waitRunningNow waits, at most wait, until every transaction running now
// has ended, and says whether they did.
func waitRunningNow(ctx context.Context, table *outbox.Table, db *pgxpool.Pool, wait time.Duration) (bool, error) {
	var xid int64
	if err := db.QueryRow(ctx, `SELECT pg_current_xact_id()::text::bigint`).Scan(&xid); err != nil {
		return false, fmt.Errorf("reading a transaction id: %w", err)
	}
	return waitEndedBelow(ctx, table, db, xid, time.Now().Add(wait))
}

// waitEndedBelow waits until every transaction with an id below xid has
// ended, ctx ends or the deadline passes (a long transaction elsewhere on
// the server holds the oldest running id back), and says whether they did.
// A failed look is looked again; the last failure is returned at the
// deadline.
func waitEndedBelow(ctx context.Context, table *outbox.Table, db outbox.Querier, xid int64, deadline time.Time) (bool, error) {
	for {
		ended, err := table.TransactionsEndedBelow(ctx, db, xid)
		if err == nil && ended {
			return true, nil
		}
		if !time.Now().Before(deadline) {
			return false, err
		}
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}
