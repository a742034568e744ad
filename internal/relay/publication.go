package relay

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/outbox-dev/outbox-operator/internal/logical"
	"github.com/outbox-dev/outbox-operator/internal/outbox"
)

// The publication of a slot's relay (source LogicalReplication) must
// publish the table's inserts without a break: pgoutput decodes each insert
// with the catalog as it was at the insert, so one made while the table was
// out of the publication (ALTER PUBLICATION ... DROP TABLE, even if ADD
// TABLE followed at once), while the publication published no inserts, or
// while it did not exist, is skipped by the slot for good. The relay looks
// at the publication whenever it looks for new children (at least every
// second while it streams) and compares its fingerprint (logical.Look)
// with the one recorded in the slot's progress row. When it changed, the
// rows inserted since the last look that saw the old one are published from
// the table (a catch-up of the gap), once the transactions running at the
// change have ended, so every insert the slot skipped is read. A table
// dropped from the publication is added back; a publication that publishes
// no inserts is an error until it does again; one that was dropped is made
// again (Setup), and a slot of PostgreSQL 15 to 17 that cannot decode past
// the drop is made again with the catch-up of a lost slot.

// pubWatch is what a streaming relay knows of its publication.
type pubWatch struct {
	loaded bool
	// seen is the fingerprint recorded in the slot's progress row, and the
	// xmin of the last confirmed look that saw it.
	seen outbox.PublicationSeen
	// candidate is a look that saw the recorded fingerprint, waiting to be
	// confirmed: its xmin becomes seen's once a later look that still sees
	// it finds every transaction that was running at it ended (xmin at or
	// past its Next). A change still in flight at a look (an ALTER whose
	// commit waits for a synchronous standby, already in the WAL but not yet
	// visible) is one of those, and a transaction that inserted after it in
	// the WAL may have committed before the look: the look's xmin does not
	// bound it, the confirming look sees the change.
	candidate *logical.Look
}

// recorded is what RecordProgress records of the publication: the recorded
// fingerprint and the last confirmed look (nil before the first look).
func (w *pubWatch) recorded() *outbox.PublicationSeen {
	if !w.loaded || w.seen.Fingerprint == "" {
		return nil
	}
	return &w.seen
}

// saw takes a look that saw the recorded fingerprint (or one that only
// added entries to it, which becomes the recorded one).
func (w *pubWatch) saw(look logical.Look) {
	w.seen.Fingerprint = look.Fingerprint
	switch {
	case w.candidate == nil:
		w.candidate = &look
	case look.Xmin >= w.candidate.Next:
		xmin := w.candidate.Xmin
		w.seen.Xmin, w.candidate = &xmin, &look
	}
}

// watchPublication looks at the publication of opts and, when an entry of
// the fingerprint recorded is gone from it (since the last look of this
// relay, or as recorded by another), publishes the gap from the table; see
// above.
func (r *Relay) watchPublication(ctx context.Context, opts logical.Options, reader *logical.Reader, w *pubWatch) error {
	var horizon *int64 // the slot's own xmin horizon, for a first look
	if !w.loaded {
		p, _, err := r.cfg.Table.ReadProgress(ctx, r.db, r.cfg.Slot)
		if err != nil {
			return err
		}
		w.seen, w.loaded, horizon = p.Publication, true, p.XminHorizon
	}
	look, err := logical.LookPublication(ctx, r.db, opts)
	if err != nil {
		return err
	}
	reader.Saw(look)
	if look.Exists && look.Inserts && !look.Covered {
		look, err = r.addTableBack(ctx, opts, look)
	}
	if err == nil {
		err = look.Problem(opts)
	}
	if err != nil {
		r.cfg.Metrics.Errors.WithLabelValues(ErrorKindPublicationChanged).Inc()
		// The fingerprint recorded is marked, so that the look that finds
		// the table published again publishes the gap, even when nothing
		// in the publication's catalog changed (a table made UNLOGGED and
		// LOGGED again under FOR ALL TABLES or FOR TABLES IN SCHEMA).
		seen, merr := r.markUnpublished(ctx, w.seen)
		if merr != nil {
			return errors.Join(err, merr)
		}
		w.seen, w.candidate = seen, nil
		return err
	}
	if w.seen.Fingerprint == "" {
		// A slot of an earlier version: nothing to compare with yet (a new
		// slot's is recorded before it is made, prepareSlot). The look is
		// not confirmed: the slot's horizon, which the stream has not
		// passed, bounds a change in flight at it.
		xmin := look.Xmin
		if horizon != nil && *horizon < xmin {
			xmin = *horizon
		}
		w.seen, w.candidate = outbox.PublicationSeen{Fingerprint: look.Fingerprint, Xmin: &xmin}, &look
		return r.cfg.Table.RecordPublication(ctx, r.db, r.cfg.Slot, w.seen)
	}
	if !look.DropsFrom(w.seen.Fingerprint) {
		w.saw(look)
		return nil
	}
	r.log.Error("The publication changed since the relay last looked at it (ALTER PUBLICATION, or DROP and CREATE), "+
		"or did not publish the table for a while (a table made UNLOGGED, under FOR TABLES IN SCHEMA or FOR ALL TABLES): "+
		"the slot skips what was inserted while it did not publish the table; publishing from the table the rows "+
		"inserted since that look", "slot", r.cfg.Slot, "publication", opts.PublicationName())
	r.cfg.Metrics.Errors.WithLabelValues(ErrorKindPublicationChanged).Inc()
	p, ok, err := r.cfg.Table.ReadProgress(ctx, r.db, r.cfg.Slot)
	if err != nil {
		return err
	}
	start, err := r.cfg.Table.StartCatchUp(ctx, r.db, r.cfg.Slot, false,
		&outbox.PublicationSeen{Fingerprint: look.Fingerprint, Xmin: w.seen.Xmin})
	if errors.Is(err, outbox.ErrCatchUpPending) {
		// Another relay recorded a catch-up of a new slot meanwhile (this
		// one's was lost): it reads more than a gap's, so it must not be
		// ended by one. Starting over does it, and finds the gap again.
		return fmt.Errorf("%w: publication %s changed, and %w: starting over",
			logical.ErrPublicationChanged, opts.PublicationName(), err)
	}
	if err != nil {
		return err
	}
	due := r.catchUpDueFrom(p, ok, start)
	due.gap = true
	if err := r.catchUp(ctx, *due, reader); err != nil {
		return err
	}
	// The catch-up read every row committed before its snapshot, after
	// this look: the look's xmin bounds the next gap once confirmed.
	w.seen.Fingerprint, w.candidate = look.Fingerprint, &look
	return nil
}

// unpublishedEntry is the entry that markUnpublished adds to a recorded
// fingerprint. No look has it, so the next look that finds the table
// published drops it (Look.DropsFrom), and publishes the gap.
const unpublishedEntry = "!unpublished"

// markUnpublished records that a look found the publication not publishing
// the table's inserts (look.Problem), keeping the last confirmed look's
// xmin: the gap begins there. A change of the publication's catalog shows
// in the fingerprint anyway, but a table that the publication stops
// publishing and publishes again with no catalog change (ALTER TABLE SET
// UNLOGGED, then SET LOGGED, under FOR ALL TABLES or FOR TABLES IN SCHEMA:
// an unlogged table's inserts are not in the WAL) would not. A fingerprint
// not recorded yet (a slot of an earlier version) is left alone.
func (r *Relay) markUnpublished(ctx context.Context, seen outbox.PublicationSeen) (outbox.PublicationSeen, error) {
	if seen.Fingerprint == "" || slices.Contains(strings.Split(seen.Fingerprint, ","), unpublishedEntry) {
		return seen, nil
	}
	if err := r.cfg.Table.PublicationUnpublished(ctx, r.db, r.cfg.Slot, unpublishedEntry); err != nil {
		return seen, err
	}
	seen.Fingerprint += "," + unpublishedEntry
	return seen, nil
}

// addTableBack adds the table to its publication again (look: it exists,
// publishes inserts and does not cover the table), as the relay would
// create the publication, and looks again.
func (r *Relay) addTableBack(ctx context.Context, opts logical.Options, look logical.Look) (logical.Look, error) {
	if err := logical.AddTable(ctx, r.db, opts); err != nil {
		return look, fmt.Errorf("%w (adding it back failed: %w)", look.Problem(opts), err)
	}
	r.log.Error("The table was dropped from the publication: added it back, and publishing from the table "+
		"what was inserted meanwhile", "slot", r.cfg.Slot, "table", r.cfg.Table.String())
	return logical.LookPublication(ctx, r.db, opts)
}

// recordPublicationBaseline records what the publication is before a new
// slot is made: a change after this look is in the slot's stream's time,
// and the first look of the stream finds it; what was committed before the
// slot, the slot's catch-up reads.
func (r *Relay) recordPublicationBaseline(ctx context.Context, opts logical.Options) error {
	look, err := logical.LookPublication(ctx, r.db, opts)
	if err != nil {
		return err
	}
	xmin := look.Xmin
	return r.cfg.Table.RecordPublication(ctx, r.db, r.cfg.Slot, outbox.PublicationSeen{Fingerprint: look.Fingerprint, Xmin: &xmin})
}

// waitBelowHoldingSlot waits until every transaction with an id below xid
// has ended (those running when a catch-up began), keeping the slot
// alive. A minute on, the relay is not ready, with the reason, and logs it
// once a minute: the catch-up cannot read before (a transaction among them
// may have inserted rows the slot skipped), and streams nothing meanwhile.
func (r *Relay) waitBelowHoldingSlot(ctx context.Context, xid int64, reader *logical.Reader) error {
	start, logged := time.Now(), time.Now()
	for {
		ended, err := r.cfg.Table.TransactionsEndedBelow(ctx, r.db, xid)
		if err != nil || ended {
			return err
		}
		if err := reader.KeepAlive(); err != nil {
			return fmt.Errorf("holding slot %s while waiting for transactions to end: %w", r.cfg.Slot, err)
		}
		if time.Since(logged) >= time.Minute {
			err := fmt.Errorf("a catch-up of slot %s has waited %s for the transactions running when it began "+
				"to end (one of them may have inserted rows the slot skipped, or wait for a synchronous standby); "+
				"end the oldest (pg_stat_activity's backend_xid and backend_xmin, and pg_prepared_xacts, "+
				"in every database of the server)",
				r.cfg.Slot, time.Since(start).Round(time.Second))
			r.setErr(err)
			r.log.Warn("Catch-up waiting for old transactions", "slot", r.cfg.Slot, "error", err.Error())
			logged = time.Now()
		}
		if sleep(ctx, 50*time.Millisecond, nil); ctx.Err() != nil {
			return ctx.Err()
		}
	}
}

// dropUndecodableSlot drops the slot after its stream failed with
// logical.ErrPublicationDropped: it can decode no further, so it is made
// again (the next pass) with the catch-up of a lost slot.
func (r *Relay) dropUndecodableSlot(ctx context.Context, reader *logical.Reader, cause error) error {
	r.log.Error("The publication was dropped while the slot streamed, and the slot cannot decode past the drop: "+
		"making the slot again and publishing the gap from the table", "slot", r.cfg.Slot, "error", cause.Error())
	r.cfg.Metrics.Errors.WithLabelValues(ErrorKindPublicationChanged).Inc()
	_ = reader.Close(context.WithoutCancel(ctx))
	if err := logical.DropSlot(ctx, r.db, r.cfg.Slot); err != nil {
		return fmt.Errorf("%w (dropping the slot to make it again failed: %w)", cause, err)
	}
	return fmt.Errorf("streaming from slot %s: %w (slot dropped, to be made again with a catch-up)", r.cfg.Slot, cause)
}
