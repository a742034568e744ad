package relay

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/outbox-dev/outbox-operator/internal/logical"
	"github.com/outbox-dev/outbox-operator/internal/outbox"
	"github.com/outbox-dev/outbox-operator/internal/pgtx"
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
// last recorded commit less CatchUpMargin (and those of the transactions
// that were running at about that commit, by the xmin horizon, however
// long ago they began), in one snapshot taken once the slot streams to
// this relay, before the stream is read. It is
// recorded as due before the slot is created and as done after its last
// page, so a relay that stops in between does it again: duplicates, never a
// loss.

// DefaultCatchUpMargin reaches back before the last recorded commit in a
// catch-up: a row's created_at is its transaction's start, or earlier when
// the application sets it; the xmin horizon covers the transactions that
// ran across that commit, and this the rest of the clock's uncertainty.
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
	if err := r.prepareSlot(ctx, opts); err != nil {
		return err
	}
	reader, err := logical.Open(ctx, r.cfg.Replication, opts)
	if err != nil {
		return fmt.Errorf("streaming from slot %s: %w", r.cfg.Slot, err)
	}
	defer func() { _ = reader.Close(context.WithoutCancel(ctx)) }()
	// What was due was decided before this relay held the slot: the relay
	// that held it may have done that catch-up since (and stopped), or
	// made the slot again. Nobody can drop it now without ending this
	// stream, so what is due now is final.
	due, err := r.catchUpDueNow(ctx, uint64(reader.Confirmed()))
	if err != nil {
		return err
	}
	// Where the slot stands now, a new slot's too, is this relay's to
	// confirm from: a catch-up due for what lies before is recorded.
	if err := r.cfg.Table.RecordConfirmed(ctx, r.db, r.cfg.Slot, uint64(reader.Confirmed())); err != nil {
		return err
	}
	recorded := reader.Confirmed()
	if due != nil {
		// The slot streams to this relay now, which proves its creation
		// finished: every transaction that commits after its consistent
		// point is in the stream, and every one that committed before is in
		// the snapshot the catch-up reads next. No other relay streams
		// while this one reads the table.
		if err := r.catchUp(ctx, *due, reader); err != nil {
			return err
		}
	}
	var pub pubWatch
	if err := r.watchPublication(ctx, opts, reader, &pub); err != nil {
		return err
	}
	if err := r.coverChildren(ctx, opts, reader); err != nil {
		return err
	}
	lastCover := time.Now()
	r.setErr(nil)
	r.recovered()
	var lastProgress, lastIdleConfirm time.Time
	for {
		nctx, cancel := context.WithTimeout(ctx, r.cfg.PollInterval)
		b, err := reader.Next(nctx, r.batchLimit(), r.cfg.BusyPollInterval)
		idle := nctx.Err() != nil
		cancel()
		if ctx.Err() == nil && time.Since(lastCover) >= max(r.cfg.PollInterval, minCoverEvery) {
			if err := r.watchPublication(ctx, opts, reader, &pub); err != nil {
				return err
			}
			if err := r.coverChildren(ctx, opts, reader); err != nil {
				return err
			}
			lastCover = time.Now()
		}
		switch {
		case ctx.Err() != nil:
			return nil
		case idle && err != nil: // nothing arrived: make sure Redis answers, for readiness
			if err := r.rdb.Ping(ctx).Err(); err != nil {
				return &publishError{fmt.Errorf("pinging Redis: %w", err)}
			}
			if err := r.confirmIdle(ctx, reader, &lastIdleConfirm, &recorded); err != nil {
				return err
			}
			r.setErr(nil)
			continue
		case errors.Is(err, logical.ErrPublicationDropped):
			return r.dropUndecodableSlot(ctx, reader, err)
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
			if err := r.cfg.Table.RecordConfirmed(ctx, r.db, r.cfg.Slot, uint64(b.Confirm)); err != nil {
				return err
			}
			recorded = max(recorded, b.Confirm)
			if err := reader.Confirm(ctx, b.Confirm); err != nil {
				return fmt.Errorf("confirming slot %s: %w", r.cfg.Slot, err)
			}
			if time.Since(lastProgress) >= progressEvery {
				if err := r.cfg.Table.RecordProgress(ctx, r.db, r.cfg.Slot, b.LastCommit, false, pub.recorded()); err != nil {
					return err
				}
				lastProgress = time.Now()
			}
		}
		r.setErr(nil)
		r.recovered()
	}
}

// idleConfirmBytes is how far the WAL decoded while the relay is idle (the
// writes of other tables) must run past the slot's confirmed position before
// the relay confirms it: the slot keeps no more WAL than that for nothing,
// and the relay's own record of the position, written first, is far less,
// so an idle relay does not confirm its own writes, forever.
const idleConfirmBytes = 1 << 20

// confirmIdle records the position the reader confirmed by itself (in
// reply to the server, logical.Reader.IdleEnd), and confirms its IdleEnd,
// recorded first (RecordConfirmed), when it is idleConfirmBytes past the
// confirmed position, at most once every progressEvery (*last).
func (r *Relay) confirmIdle(ctx context.Context, reader *logical.Reader, last *time.Time, recorded *pglogrepl.LSN) error {
	if c := reader.Confirmed(); c > *recorded {
		if err := r.cfg.Table.RecordConfirmed(ctx, r.db, r.cfg.Slot, uint64(c)); err != nil {
			return err
		}
		*recorded = c
	}
	end := reader.IdleEnd()
	if end == 0 || end-reader.Confirmed() < idleConfirmBytes || time.Since(*last) < progressEvery {
		return nil
	}
	if err := r.cfg.Table.RecordConfirmed(ctx, r.db, r.cfg.Slot, uint64(end)); err != nil {
		return err
	}
	*recorded = end
	if err := reader.Confirm(ctx, end); err != nil {
		return fmt.Errorf("confirming slot %s: %w", r.cfg.Slot, err)
	}
	*last = time.Now()
	return nil
}

// catchUpDue is a catch-up that prepareSlot recorded due.
type catchUpDue struct {
	// since is the lower bound of the rows read (nil: every row).
	since *time.Time
	// horizon is the slot's xmin horizon: the rows of transactions at or
	// after it are read too, however old their created_at (nil: none).
	horizon *int64
	// id is the catch-up's, which only it ends.
	id outbox.CatchUpID
	// after: the catch-up reads once every transaction below it has ended
	// (nil: at once).
	after *int64
	// gap says that it is the catch-up of a publication's gap, read while
	// the stream is behind its snapshot: it reads by the horizon alone,
	// and records no progress.
	gap bool
}

// noTimeBound is the since of a catch-up that reads by the horizon alone:
// no row is created after it.
var noTimeBound = time.Date(9999, time.December, 31, 0, 0, 0, 0, time.UTC)

// prepareSlot creates what the stream needs and records a catch-up due
// when one is (catchUpDueNow reads it once the relay holds the slot). A
// slot that was invalidated is dropped and made again, with a catch-up.
func (r *Relay) prepareSlot(ctx context.Context, opts logical.Options) error {
	if err := r.cfg.Table.EnsureProgressTable(ctx, r.db); err != nil {
		return err
	}
	st, err := logical.Status(ctx, r.db, r.cfg.Slot)
	if err != nil {
		return err
	}
	if st.Exists && st.WALStatus == "lost" {
		r.log.Error("Replication slot invalidated: the server removed WAL it had not streamed "+
			"(max_slot_wal_keep_size); making it again and publishing the gap from the table",
			"slot", r.cfg.Slot, "catchUpMargin", r.cfg.CatchUpMargin.String())
		r.cfg.Metrics.Errors.WithLabelValues(ErrorKindSlotInvalidated).Inc()
		if err := logical.DropSlot(ctx, r.db, r.cfg.Slot); err != nil {
			return err
		}
		st.Exists = false
	}
	p, ok, err := r.cfg.Table.ReadProgress(ctx, r.db, r.cfg.Slot)
	if err != nil {
		return err
	}
	if !st.Exists && ok && p.LastCommit != nil && st.WALStatus != "lost" {
		// Not a first start: a relay streamed from the slot, and nothing
		// here dropped it. Rows still in the table are published from it;
		// rows deleted since (by the application right after its commit, or
		// by cleanup) are not there to publish, so it is said loudly.
		r.log.Error("Replication slot missing, though a relay had streamed from it (dropped by hand, by a tool, "+
			"or with its OutboxRelay): making it again and publishing from the table the rows created since "+
			"the last published commit; rows deleted from the table meanwhile cannot be published",
			"slot", r.cfg.Slot, "lastPublishedCommit", p.LastCommit.UTC().Format(time.RFC3339Nano),
			"catchUpMargin", r.cfg.CatchUpMargin.String())
		r.cfg.Metrics.Errors.WithLabelValues(ErrorKindSlotMissing).Inc()
	}
	var due *catchUpDue
	startCatchUp := func(ctx context.Context, newSlot bool) (err error) {
		due, err = r.recordCatchUp(ctx, p, ok, newSlot)
		return err
	}
	if !st.Exists || !ok || p.CatchUpPending {
		if err := startCatchUp(ctx, !st.Exists); err != nil {
			return err
		}
	}
	// The slot was there, with nothing due, when this relay looked; if it is
	// gone by the time Setup would create it (another relay dropped it as
	// lost, and may not have recorded its catch-up yet, or never will), the
	// slot this relay creates needs a catch-up, recorded due first.
	opts.BeforeCreateSlot = func(ctx context.Context) error {
		if due == nil {
			if err := startCatchUp(ctx, true); err != nil {
				return err
			}
		}
		return r.recordPublicationBaseline(ctx, opts)
	}
	if ok && p.Publication.Fingerprint != "" {
		// The table dropped from the publication while no relay streamed:
		// added back, as while streaming; the first look finds the gap.
		look, err := logical.LookPublication(ctx, r.db, opts)
		if err == nil && look.Exists && look.Inserts && !look.Covered {
			if _, err := r.addTableBack(ctx, opts, look); err != nil {
				if _, merr := r.markUnpublished(ctx, p.Publication); merr != nil {
					err = errors.Join(err, merr)
				}
				return err
			}
		}
	}
	// The partitions there are now, before any catch-up reads them: one
	// that joins the table later is new to what is recorded, and its rows
	// are read then (publishNewPartitions).
	r.partitionsPublished = nil
	if err := r.recordPartitionsBaseline(ctx, opts); err != nil {
		return err
	}
	if r.testHookBeforeSetup != nil {
		r.testHookBeforeSetup(ctx)
	}
	if err := logical.Setup(ctx, r.db, opts); err != nil {
		return err
	}
	return nil
}

// recordCatchUp records a catch-up due for the slot whose progress is p
// (ok: it has a row) and returns it, from the last published commit less
// the margin (every row without one). A new slot gets a catch-up of its
// own: one still running on the slot it replaces (a relay cut off from it)
// ends only its own.
func (r *Relay) recordCatchUp(ctx context.Context, p outbox.Progress, ok, newSlot bool) (*catchUpDue, error) {
	start, err := r.cfg.Table.StartCatchUp(ctx, r.db, r.cfg.Slot, newSlot, nil)
	if err != nil {
		return nil, err
	}
	return r.catchUpDueFrom(p, ok, start), nil
}

// catchUpDueFrom is the catch-up start recorded due for the slot whose
// progress is p (ok: it has a row): from the last published commit less the
// margin, and the horizon (every row without a commit).
func (r *Relay) catchUpDueFrom(p outbox.Progress, ok bool, start outbox.CatchUpStart) *catchUpDue {
	due := &catchUpDue{id: start.ID, after: start.After}
	if ok && p.LastCommit != nil {
		t := p.LastCommit.Add(-r.cfg.CatchUpMargin)
		due.since, due.horizon = &t, start.Horizon
	}
	return due
}

// catchUpDueNow reads the slot's progress again once this relay holds the
// slot, which stands at position at: what prepareSlot found due before it
// did may be done since (by the relay that held the slot), or another relay
// may have made the slot again (dropped as lost, its catch-up recorded due
// before it was created). It returns the catch-up due now, or one of every
// row when the slot has no progress row; nil when nothing is due.
//
// A slot past the highest position its relays recorded before they
// confirmed it was moved by someone else while no relay streamed: dropped
// and made again (by hand, by a tool), or advanced
// (pg_replication_slot_advance). It never streams the rows committed in
// between, so a catch-up of a new slot is recorded due, as for a missing
// one (prepareSlot).
func (r *Relay) catchUpDueNow(ctx context.Context, at uint64) (*catchUpDue, error) {
	p, ok, err := r.cfg.Table.ReadProgress(ctx, r.db, r.cfg.Slot)
	if err != nil {
		return nil, err
	}
	if ok && !p.CatchUpPending {
		if p.ConfirmedLSN == nil || at <= uint64(*p.ConfirmedLSN) { //nolint:gosec // an LSN is below 2^63
			return nil, nil
		}
		last := "none"
		if p.LastCommit != nil {
			last = p.LastCommit.UTC().Format(time.RFC3339Nano)
		}
		r.log.Error("Replication slot ahead of the position its relays confirmed (dropped and made again, or "+
			"advanced, by hand or by a tool, while no relay streamed): it never streams what was committed in "+
			"between; publishing from the table the rows created since the last published commit; rows deleted "+
			"from the table meanwhile cannot be published",
			"slot", r.cfg.Slot, "slotConfirmedLSN", pglogrepl.LSN(at).String(),
			"relayConfirmedLSN", pglogrepl.LSN(uint64(*p.ConfirmedLSN)).String(), //nolint:gosec // an LSN is below 2^63
			"lastPublishedCommit", last, "catchUpMargin", r.cfg.CatchUpMargin.String())
		r.cfg.Metrics.Errors.WithLabelValues(ErrorKindSlotMoved).Inc()
		return r.recordCatchUp(ctx, p, ok, true)
	}
	return r.recordCatchUp(ctx, p, ok, false)
}

// catchUp publishes the rows not marked dispatched created since due.since
// (nil: every row; widened for a `timestamp` column) or without created_at,
// read in one snapshot taken once the slot streams to this relay, then
// records the catch-up done, which ends it unless a newer one is due.
func (r *Relay) catchUp(ctx context.Context, due catchUpDue, reader *logical.Reader) error {
	start := time.Now()
	// The slot streams to this relay, so its creation has ended. A
	// transaction whose commit record lies before the slot's consistent
	// point is not in the stream, and the snapshot below sees it only once
	// it has ended: a commit is in the WAL before it is visible (it waits
	// for a synchronous standby, or for its backend to run again). Each
	// such transaction had an id by now: wait for all of those to end (and
	// for those below due.after, older).
	next, err := r.cfg.Table.NextTransactionID(ctx, r.db)
	if err != nil {
		return fmt.Errorf("catching up: %w", err)
	}
	if due.after != nil {
		next = max(next, *due.after)
	}
	if err := r.waitBelowHoldingSlot(ctx, next, reader); err != nil {
		return err
	}
	since, err := r.cfg.Table.CatchUpSince(ctx, r.db, due.since)
	if err != nil {
		return fmt.Errorf("catching up: %w", err)
	}
	if due.gap && due.horizon != nil {
		// The horizon alone reads every row the slot skipped; a bound by
		// time would add the rows of the last --catch-up-margin, streamed.
		since = &noTimeBound
	}
	total := 0
	snapshot, err := r.cfg.Table.CatchUp(ctx, r.db, since, due.horizon, r.batchLimit(), func(page []outbox.Event) error {
		if r.testHookCatchUp != nil {
			if err := r.testHookCatchUp(ctx, false); err != nil {
				return err
			}
		}
		if err := r.publishStreamed(ctx, page, time.Now()); err != nil {
			return err
		}
		total += len(page)
		if err := reader.KeepAlive(); err != nil {
			return fmt.Errorf("holding slot %s while catching up: %w", r.cfg.Slot, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	if r.testHookCatchUp != nil {
		if err := r.testHookCatchUp(ctx, true); err != nil {
			return err
		}
	}
	if due.gap {
		snapshot = outbox.CatchUpSnapshot{} // no progress: the stream has not reached it
	}
	ended, err := r.cfg.Table.FinishCatchUp(ctx, r.db, r.cfg.Slot, snapshot, due.id)
	if err != nil {
		return err
	}
	if !ended {
		// Another relay recorded a catch-up of a new slot while this one
		// read the table: it stays due, and this relay starts over (its
		// slot is most likely gone), to do it if it takes the new slot.
		return fmt.Errorf("catching up on slot %s: published %d events, but the slot was made again meanwhile "+
			"and its own catch-up is due: starting over", r.cfg.Slot, total)
	}
	r.log.Info("Caught up from the table before streaming", "slot", r.cfg.Slot, "events", total,
		"since", fmtTime(since), "horizon", fmtXid(due.horizon), "took", time.Since(start).String())
	return nil
}

// minCoverEvery bounds how often coverChildren runs while streaming.
const minCoverEvery = time.Second

// coverChildren adds the table's inheritance children that the publication
// does not list (created after it, or left out by a publication FOR TABLE
// ONLY), and its partitions that it does not cover (a publication that
// lists some partitions, not the partitioned table: for instance the table
// a migration to partitioning renamed and attached), to the publication,
// and publishes the rows they hold: in one
// transaction that first locks them against inserts (SHARE, which waits
// for the transactions inserting into them to end), reads and publishes
// their rows, and adds them, so every row of a child is either read here
// or committed after the add, and streamed. A relay stopped in between
// rolls everything back and does it again: duplicates, never a loss. A
// child the relay's role cannot add is an error that says how to fix it.
func (r *Relay) coverChildren(ctx context.Context, opts logical.Options, reader *logical.Reader) error {
	children, err := logical.Uncovered(ctx, r.db, opts)
	if err != nil {
		return err
	}
	if unlogged := slices.DeleteFunc(slices.Clone(children), func(c logical.Child) bool { return !c.Unlogged }); len(unlogged) > 0 {
		// A partition made UNLOGGED after its rows were recorded published:
		// once LOGGED again it must be new to the record, for the rows
		// written meanwhile.
		if err := r.forgetPartitions(ctx, unlogged); err != nil {
			return err
		}
		return logical.UncoveredError(opts, unlogged)
	}
	added, err := r.addUncovered(ctx, opts, reader, children)
	if err != nil {
		return err
	}
	return r.publishNewPartitions(ctx, opts, reader, added)
}

// addUncovered adds the children to the publication (coverChildren) and
// returns those it added.
func (r *Relay) addUncovered(ctx context.Context, opts logical.Options, reader *logical.Reader,
	children []logical.Child) ([]logical.Child, error) {
	if len(children) == 0 {
		return nil, nil
	}
	start := time.Now()
	total := 0
	err := pgtx.Run(ctx, r.db, func(tx pgx.Tx) error {
		for _, c := range children {
			if _, err := tx.Exec(ctx, "LOCK TABLE ONLY "+c.String()+" IN SHARE MODE"); err != nil {
				return fmt.Errorf("locking %s to add it to the publication: %w", c, err)
			}
		}
		// Under the locks: another relay of the table may have added some.
		// One created meanwhile is not locked: the next look takes it.
		locked := children
		var err error
		children, err = logical.Uncovered(ctx, tx, opts)
		if err != nil {
			return err
		}
		children = slices.DeleteFunc(children, func(c logical.Child) bool { return !slices.Contains(locked, c) })
		if len(children) == 0 {
			return nil
		}
		for _, c := range children {
			n, err := r.publishRowsOf(ctx, tx, reader, c.Schema, c.Name)
			total += n
			if err != nil {
				return fmt.Errorf("publishing the rows of %s: %w", c, err)
			}
		}
		return logical.AddChildren(ctx, tx, opts, children)
	})
	if err != nil {
		return nil, err
	}
	if len(children) == 0 {
		return nil, nil
	}
	var names, parts []string
	for _, c := range children {
		if c.Partition {
			parts = append(parts, c.String())
		} else {
			names = append(names, c.String())
		}
	}
	msg := "Added inheritance children of the table to the publication and published their rows"
	if len(parts) > 0 {
		// A publication of the partitioned table would cover new partitions
		// from their creation, with no lock and no read of their rows.
		msg = "Added tables of the table to the publication and published their rows; the publication lists " +
			"some partitions but not the partitioned table: ALTER PUBLICATION ... ADD TABLE <the table> covers future ones"
	}
	r.log.Info(msg, "slot", r.cfg.Slot, "children", names, "partitions", parts, "events", total,
		"took", time.Since(start).String())
	return children, nil
}

// publishRowsOf publishes the rows of one table under the outbox table
// (ONLY it), read in tx, keeping the slot held, and returns how many.
func (r *Relay) publishRowsOf(ctx context.Context, tx pgx.Tx, reader *logical.Reader, schema, name string) (int, error) {
	total := 0
	err := r.cfg.Table.CatchUpChild(ctx, tx, schema, name, r.batchLimit(), func(page []outbox.Event) error {
		if err := r.publishStreamed(ctx, page, time.Now()); err != nil {
			return err
		}
		total += len(page)
		return reader.KeepAlive()
	})
	return total, err
}

// recordPartitionsBaseline records the table's partitions as published
// if none are recorded: before the slot's first catch-up, which reads them.
func (r *Relay) recordPartitionsBaseline(ctx context.Context, opts logical.Options) error {
	parts, err := logical.Partitions(ctx, r.db, opts)
	if err != nil {
		return err
	}
	return r.cfg.Table.RecordPartitions(ctx, r.db, r.cfg.Slot, logical.PartitionKeys(parts), true)
}

// forgetPartitions takes the tables out of the record of partitions
// published, as it is in the progress table (locked while it is read and
// written, so a record another relay wrote is not undone).
func (r *Relay) forgetPartitions(ctx context.Context, tables []logical.Child) error {
	oids := make([]int64, 0, len(tables))
	for _, c := range tables {
		oids = append(oids, c.OID)
	}
	return pgtx.Run(ctx, r.db, func(tx pgx.Tx) error {
		recorded, err := r.cfg.Table.LockPartitions(ctx, tx, r.cfg.Slot)
		if err != nil || recorded == nil {
			return err
		}
		keys := logical.WithoutTables(*recorded, oids)
		r.partitionsPublished = nil // read again at the next look
		if keys == *recorded {
			return nil
		}
		return r.cfg.Table.RecordPartitions(ctx, tx, r.cfg.Slot, keys, false)
	})
}

// publishNewPartitions publishes the rows of the tables under the table
// that are new to what the slot's progress records (logical.NewPartitions):
// a table attached with rows in it (a backfill, a migration), or one made
// LOGGED again (a rewrite: VACUUM FULL too, whose rows are then published
// again, duplicates). A publication of the
// partitioned table covers such a partition from then on, but its earlier
// rows entered the WAL as another table's, or not at all (UNLOGGED): the
// slot never streams them. They were all committed before the ATTACH or
// the SET LOGGED (which lock the table against writes), so a read after
// finds them all. Then it records the partitions: a relay stopped in
// between reads them again (duplicates). Partitions just added to the
// publication (added) had their rows published then.
func (r *Relay) publishNewPartitions(ctx context.Context, opts logical.Options, reader *logical.Reader,
	added []logical.Child) error {
	parts, err := logical.Partitions(ctx, r.db, opts)
	if err != nil {
		return err
	}
	keys := logical.PartitionKeys(parts)
	if r.partitionsPublished != nil && keys == *r.partitionsPublished {
		return nil // as this relay last recorded them: nothing joined since
	}
	// What the progress records, read under its row's lock: another relay
	// may have written it since this one last did.
	start := time.Now()
	total := 0
	var fresh []logical.Partition
	err = pgtx.Run(ctx, r.db, func(tx pgx.Tx) error {
		recorded, err := r.cfg.Table.LockPartitions(ctx, tx, r.cfg.Slot)
		if err != nil {
			return err
		}
		if recorded == nil {
			// Recorded by an earlier version: from now on.
			return r.cfg.Table.RecordPartitions(ctx, tx, r.cfg.Slot, keys, true)
		}
		fresh = slices.DeleteFunc(logical.NewPartitions(parts, *recorded), func(p logical.Partition) bool {
			return slices.ContainsFunc(added, func(c logical.Child) bool { return c.Schema == p.Schema && c.Name == p.Name })
		})
		for _, p := range fresh {
			n, err := r.publishRowsOf(ctx, tx, reader, p.Schema, p.Name)
			total += n
			if err != nil {
				return fmt.Errorf("publishing the rows of %s, which joined the table: %w", p, err)
			}
		}
		return r.cfg.Table.RecordPartitions(ctx, tx, r.cfg.Slot, keys, false)
	})
	if err != nil {
		return err
	}
	r.partitionsPublished = &keys
	if len(fresh) > 0 {
		names := make([]string, 0, len(fresh))
		for _, p := range fresh {
			names = append(names, p.String())
		}
		r.log.Info("Published the rows of tables new under the table (attached, inherited, made LOGGED or rewritten): "+
			"the slot may never have streamed rows written before", "slot", r.cfg.Slot, "tables", names, "events", total,
			"took", time.Since(start).String())
	}
	return nil
}

func fmtTime(t *time.Time) string {
	switch {
	case t == nil:
		return "the first row"
	case t.Equal(noTimeBound):
		return "the xmin horizon"
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
	}
	r.committed(events, published, dead, start)
	return nil
}

// fmtXid is a full transaction id for the log ("none": nil).
func fmtXid(x *int64) string {
	if x == nil {
		return "none"
	}
	return strconv.FormatInt(*x, 10)
}
