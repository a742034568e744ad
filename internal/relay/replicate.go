package relay

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/outbox-dev/outbox-operator/internal/logical"
	"github.com/outbox-dev/outbox-operator/internal/outbox"
)

// Source LogicalReplication: the relay reads the table's inserts from its
// replication slot (internal/logical) instead of claiming rows, publishes
// them in commit order and confirms the slot's position only after Redis
// acknowledged them. Rows are never marked dispatched: the slot's position
// is the relay's progress, and the progress table (outbox/progress.go)
// records the last published commit for the operator's backlog and for a
// catch-up.
//
// A catch-up publishes, by reading the table, the rows a new slot's stream
// cannot hold: a slot streams what is committed after its creation, so the
// rows committed before the first slot (or in the gap of a slot that was
// invalidated, or dropped and made again) are read from the table, from the
// last recorded commit less CatchUpMargin, before the stream starts. It is
// recorded as due before the slot is created and as done after its last
// page, so a relay that stops in between does it again: duplicates, never a
// loss.

// DefaultCatchUpMargin reaches back before the last recorded commit in a
// catch-up: a row's created_at is its transaction's start, so a transaction
// that ran for up to this long across that commit is still covered.
const DefaultCatchUpMargin = 5 * time.Minute

// progressEvery bounds how often the progress table is written while
// streaming.
const progressEvery = time.Second

// replicate relays from the slot until ctx ends. A slot held by another
// relay makes this one a standby, which tries again every StandbyPoll.
func (r *Relay) replicate(ctx context.Context) {
	standby := false
	for ctx.Err() == nil {
		err := r.replicateOnce(ctx)
		switch {
		case ctx.Err() != nil:
			return
		case errors.Is(err, logical.ErrSlotInUse):
			if !standby {
				r.log.Info("Replication slot held by another relay; standing by", "slot", r.cfg.Slot)
			}
			standby = true
			r.setErr(nil) // a warm standby is healthy
			r.recovered()
			sleep(ctx, r.cfg.StandbyPoll, nil)
			continue
		}
		standby = false
		failures := int(r.failures.Add(1))
		pause := r.retryDelay(err, failures)
		r.setErr(err)
		r.report(err, failures, pause)
		sleep(ctx, pause, nil)
	}
}

// replicateOnce sets up the slot, catches up when due, and streams until
// ctx ends (nil) or something fails (its error; the caller retries, and the
// stream resumes at the last confirmed position).
func (r *Relay) replicateOnce(ctx context.Context) error {
	opts := logical.Options{Table: r.cfg.Table, Slot: r.cfg.Slot}
	since, catchUp, err := r.prepareSlot(ctx, opts)
	if err != nil {
		return err
	}
	// Every row committed before the slot existed was created before now,
	// on the server's clock (created_at is its transaction's start); rows
	// created later are in the slot's stream.
	until, err := outbox.Now(ctx, r.db)
	if err != nil {
		return err
	}
	reader, err := logical.Open(ctx, r.cfg.Replication, opts)
	if err != nil {
		return fmt.Errorf("streaming from slot %s: %w", r.cfg.Slot, err)
	}
	defer func() { _ = reader.Close(context.WithoutCancel(ctx)) }()
	if catchUp {
		// The slot holds this stream now, so no other relay streams while
		// this one reads the table.
		if err := r.catchUp(ctx, since, until, reader); err != nil {
			return err
		}
	}
	r.setErr(nil)
	r.recovered()
	var lastProgress time.Time
	for {
		nctx, cancel := context.WithTimeout(ctx, r.cfg.PollInterval)
		b, err := reader.Next(nctx, r.cfg.BatchSize, r.cfg.BusyPollInterval)
		idle := nctx.Err() != nil
		cancel()
		switch {
		case ctx.Err() != nil:
			return nil
		case idle && err != nil: // nothing arrived: make sure Redis answers, for readiness
			if err := r.rdb.Ping(ctx).Err(); err != nil {
				return &publishError{fmt.Errorf("pinging Redis: %w", err)}
			}
			r.setErr(nil)
			continue
		case err != nil:
			return fmt.Errorf("streaming from slot %s: %w", r.cfg.Slot, err)
		}
		if err := r.publishStreamed(ctx, b.Events, time.Now()); err != nil {
			return err
		}
		if r.testHookBeforeCommit != nil { // here the confirm is the commit
			if err := r.testHookBeforeCommit(ctx); err != nil {
				return err
			}
		}
		if b.Confirm != 0 {
			if err := reader.Confirm(ctx, b.Confirm); err != nil {
				return fmt.Errorf("confirming slot %s: %w", r.cfg.Slot, err)
			}
			if time.Since(lastProgress) >= progressEvery {
				if err := r.cfg.Table.RecordProgress(ctx, r.db, r.cfg.Slot, b.LastCommit, false); err != nil {
					return err
				}
				lastProgress = time.Now()
			}
		}
		r.setErr(nil)
		r.recovered()
	}
}

// prepareSlot creates what the stream needs and says whether a catch-up is
// due, and from when (nil: every row not marked dispatched). A slot that
// was invalidated is dropped and made again, with a catch-up.
func (r *Relay) prepareSlot(ctx context.Context, opts logical.Options) (since *time.Time, catchUp bool, err error) {
	if err := r.cfg.Table.EnsureProgressTable(ctx, r.db); err != nil {
		return nil, false, err
	}
	st, err := logical.Status(ctx, r.db, r.cfg.Slot)
	if err != nil {
		return nil, false, err
	}
	if st.Exists && st.WALStatus == "lost" {
		r.log.Error("Replication slot invalidated: the server removed WAL it had not streamed "+
			"(max_slot_wal_keep_size); making it again and publishing the gap from the table",
			"slot", r.cfg.Slot, "catchUpMargin", r.cfg.CatchUpMargin.String())
		r.cfg.Metrics.Errors.WithLabelValues(ErrorKindSlotInvalidated).Inc()
		if err := logical.DropSlot(ctx, r.db, r.cfg.Slot); err != nil {
			return nil, false, err
		}
		st.Exists = false
	}
	p, ok, err := r.cfg.Table.ReadProgress(ctx, r.db, r.cfg.Slot)
	if err != nil {
		return nil, false, err
	}
	catchUp = !st.Exists || !ok || p.CatchUpPending
	if catchUp {
		if err := r.cfg.Table.StartCatchUp(ctx, r.db, r.cfg.Slot); err != nil {
			return nil, false, err
		}
	}
	if err := logical.Setup(ctx, r.db, opts); err != nil {
		return nil, false, err
	}
	if ok && p.LastCommit != nil {
		t := p.LastCommit.Add(-r.cfg.CatchUpMargin)
		since = &t
	}
	return since, catchUp, nil
}

// catchUp publishes the rows not marked dispatched created in [since,
// until], in pages, then records the catch-up done. It runs after the slot
// exists, so every row committed later is in the slot's stream.
func (r *Relay) catchUp(ctx context.Context, since *time.Time, until time.Time, reader *logical.Reader) error {
	start := time.Now()
	var afterCreated *time.Time
	var afterID string
	total := 0
	for {
		page, err := r.cfg.Table.PendingSince(ctx, r.db, since, until, afterCreated, afterID, r.cfg.BatchSize)
		if err != nil {
			return fmt.Errorf("catching up: %w", err)
		}
		if err := r.publishStreamed(ctx, page, time.Now()); err != nil {
			return err
		}
		total += len(page)
		if err := reader.KeepAlive(); err != nil {
			return fmt.Errorf("holding slot %s while catching up: %w", r.cfg.Slot, err)
		}
		if len(page) < r.cfg.BatchSize {
			break
		}
		last := page[len(page)-1]
		afterCreated, afterID = &last.CreatedAt, last.ID
	}
	if err := r.cfg.Table.RecordProgress(ctx, r.db, r.cfg.Slot, until, true); err != nil {
		return err
	}
	r.log.Info("Caught up from the table before streaming", "slot", r.cfg.Slot, "events", total,
		"since", fmtTime(since), "took", time.Since(start).String())
	return nil
}

func fmtTime(t *time.Time) string {
	if t == nil {
		return "the first row"
	}
	return t.UTC().Format(time.RFC3339)
}

// publishStreamed publishes events read from the stream or the table and
// parks those that cannot be published, in one transaction of their own:
// the parked copy is written before the caller confirms the position.
func (r *Relay) publishStreamed(ctx context.Context, events []outbox.Event, start time.Time) error {
	if len(events) == 0 {
		return nil
	}
	published, dead, err := r.publish(ctx, events, nil, 0)
	if err != nil {
		return err
	}
	if len(dead) > 0 {
		tx, err := r.db.Begin(ctx)
		if err != nil {
			return fmt.Errorf("parking rows: %w", err)
		}
		defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
		for _, d := range dead {
			if err := r.cfg.Table.Park(ctx, tx, r.cfg.Stream, d.event, d.reason); err != nil {
				return err
			}
		}
		if err := tx.Commit(ctx); err != nil {
			return fmt.Errorf("parking rows: %w", err)
		}
		for _, d := range dead {
			r.log.Error("Parked an outbox row that cannot be published", "eventID", d.event.ID,
				"eventType", d.event.Type, "reason", d.reason, "deadLetterTable", r.cfg.Table.DeadLetterTable())
		}
		r.refused.forget(dead)
	}
	now := time.Now()
	r.cfg.Metrics.Batches.Inc()
	r.cfg.Metrics.EventsPublished.Add(float64(published))
	r.cfg.Metrics.EventsDeadLettered.Add(float64(len(dead)))
	r.cfg.Metrics.BatchDuration.Observe(now.Sub(start).Seconds())
	for _, e := range events {
		if !e.CreatedAt.IsZero() {
			r.cfg.Metrics.Lag.Observe(now.Sub(e.CreatedAt).Seconds())
		}
	}
	return nil
}
