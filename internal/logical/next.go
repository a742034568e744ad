package logical

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/outbox-dev/outbox-operator/internal/outbox"
)

// Batch is what one Next returns: events, and the position to confirm once
// they are published.
type Batch struct {
	// Events are in commit order; a transaction's in the order of its
	// inserts. A transaction bigger than the batch spans several.
	Events []outbox.Event
	// Confirm is the end LSN of the last transaction of the batch that
	// arrived whole (its commit): what Reader.Confirm takes once every event
	// of the batch is published. 0 when no transaction ended in the batch,
	// because a transaction is confirmed only at its end (a replay repeats
	// it from its start). A batch may hold no event and a nonzero Confirm.
	Confirm pglogrepl.LSN
	// LastCommit is the commit time of that transaction; zero when Confirm
	// is 0.
	LastCommit time.Time
}

// commit marks where a transaction ended in the events being gathered.
type commit struct {
	events int // events received before its commit
	end    pglogrepl.LSN
	at     time.Time
}

// Next returns the next batch of at most limit.Rows events, and of events
// whose sizes add up to at most limit.Bytes when that is above 0 (the
// first event always: a larger one comes alone). It returns
// linger after the first event (or whole transaction without one) it
// gathered, with what arrived by then, or at once when a batch is full:
// so an event waits at most about linger in the reader, however steadily
// others follow it. While it
// waits it answers the server's keepalives and sends a standby status
// update every StatusInterval, always with the confirmed position.
//
// A caught-up Reader in a busy database would otherwise keep WAL forever:
// when everything received is confirmed, the position of a keepalive (the
// server has decoded the WAL up to there and found nothing for the
// publication) is IdleEnd, which the caller may confirm.
//
// When ctx ends, Next returns its error and keeps what it had gathered for
// the next call.
func (r *Reader) Next(ctx context.Context, limit outbox.Limit, linger time.Duration) (Batch, error) {
	if r.err != nil {
		return Batch{}, r.err
	}
	if limit.Rows < 1 {
		return Batch{}, fmt.Errorf("reading a batch of %d events: must be at least 1", limit.Rows)
	}
	var lingerUntil time.Time // zero while nothing is gathered
	if r.gathered() {
		lingerUntil = time.Now().Add(linger)
	}
	for {
		if len(r.events) >= limit.Rows || (limit.Bytes > 0 && r.bytes > limit.Bytes) {
			return r.take(limit), nil
		}
		now := time.Now()
		if !lingerUntil.IsZero() && !now.Before(lingerUntil) {
			return r.take(limit), nil
		}
		if !now.Before(r.nextStatus) {
			if err := r.sendStatus(); err != nil {
				return Batch{}, r.fail(err)
			}
		}
		deadline := r.nextStatus
		if !lingerUntil.IsZero() && lingerUntil.Before(deadline) {
			deadline = lingerUntil
		}
		data, err := r.receive(ctx, deadline)
		switch {
		case ctx.Err() != nil:
			return Batch{}, fmt.Errorf("reading replication slot %s: %w", r.opts.Slot, ctx.Err())
		case pgconn.Timeout(err):
			continue
		case err != nil:
			return Batch{}, r.fail(classify(err))
		}
		if data && r.gathered() && lingerUntil.IsZero() {
			// From the first event gathered, not the latest: a steady
			// trickle must not hold a batch until it is full.
			lingerUntil = time.Now().Add(linger)
		}
	}
}

// gathered reports whether a batch is waiting to be returned.
func (r *Reader) gathered() bool { return len(r.events) > 0 || len(r.commits) > 0 }

// take returns the first events gathered, within limit, with the position
// of the last transaction that ended within them, and keeps the rest.
func (r *Reader) take(limit outbox.Limit) Batch {
	n := min(len(r.events), limit.Rows)
	size := 0
	for i, e := range r.events[:n] {
		if size += e.Size(); limit.Bytes > 0 && size > limit.Bytes && i > 0 {
			n = i
			size -= e.Size()
			break
		}
	}
	r.bytes -= size
	b := Batch{Events: r.events[:n:n]}
	done := 0
	for _, c := range r.commits {
		if c.events > n {
			break
		}
		b.Confirm, b.LastCommit = c.end, c.at
		done++
	}
	// A copy of the rest, not a slice of it: the array before it holds the
	// returned events, which must not stay reachable for as long as a rest
	// is left (large payloads behind a batch cut by the byte budget).
	r.events = slices.Clone(r.events[n:])
	r.commits = r.commits[done:]
	for i := range r.commits {
		r.commits[i].events -= n
	}
	if len(r.events) == 0 {
		r.events = nil
	}
	r.returned = max(r.returned, b.Confirm)
	return b
}

// receive waits until deadline for one message and handles it; data reports
// a message of the stream (rather than a keepalive). A timeout is an error
// for which pgconn.Timeout is true, after which the stream goes on.
func (r *Reader) receive(ctx context.Context, deadline time.Time) (data bool, err error) {
	rctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	msg, err := r.conn.ReceiveMessage(rctx)
	if err != nil {
		return false, err
	}
	switch msg := msg.(type) {
	case *pgproto3.CopyData:
		if len(msg.Data) == 0 {
			return false, errors.New("empty CopyData message")
		}
		switch msg.Data[0] {
		case pglogrepl.PrimaryKeepaliveMessageByteID:
			return false, r.keepalive(msg.Data[1:])
		case pglogrepl.XLogDataByteID:
			xld, err := pglogrepl.ParseXLogData(msg.Data[1:])
			if err != nil {
				return true, fmt.Errorf("parsing XLogData: %w", err)
			}
			return true, r.decode(xld.WALData)
		}
		return false, nil
	case *pgproto3.ErrorResponse:
		return false, classify(pgconn.ErrorResponseToPgError(msg))
	case *pgproto3.CopyDone:
		return false, errors.New("the server ended the stream")
	}
	return false, nil // notices, parameter changes
}

// keepalive handles the server's keepalive: the idle end (IdleEnd), and
// the reply it may ask for.
func (r *Reader) keepalive(buf []byte) error {
	ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(buf)
	if err != nil {
		return fmt.Errorf("parsing keepalive: %w", err)
	}
	if r.idle() && ka.ServerWALEnd > r.confirmed {
		r.idleEnd = max(r.idleEnd, ka.ServerWALEnd)
	}
	if ka.ReplyRequested {
		if end := r.IdleEnd(); end != 0 { // see IdleEnd
			r.confirmed = end
			r.returned = max(r.returned, end)
		}
		return r.sendStatus()
	}
	return nil
}

// idle reports that everything received so far is confirmed: no
// transaction open, nothing gathered, no batch returned and unconfirmed.
// Then the server's position holds nothing for the caller. (The server
// sends a transaction at its commit, after all the WAL before it, so a
// keepalive comes after every transaction that ended before its position.)
func (r *Reader) idle() bool {
	return !r.inTx && !r.gathered() && r.confirmed >= r.returned
}

// decode handles one pgoutput message.
func (r *Reader) decode(walData []byte) error {
	if len(walData) == 0 {
		return errors.New("empty pgoutput message")
	}
	msg, err := pglogrepl.Parse(walData)
	if err != nil {
		return fmt.Errorf("parsing pgoutput message %q: %w", walData[0], err)
	}
	switch m := msg.(type) {
	case *pglogrepl.RelationMessage:
		if r.foreign(m) {
			r.relations[m.RelationID] = &relation{foreign: true}
			break
		}
		r.relations[m.RelationID] = newRelation(m, r.columns, r.castTypes)
	case *pglogrepl.BeginMessage:
		r.inTx = true
	case *pglogrepl.InsertMessage:
		rel := r.relations[m.RelationID]
		if rel == nil {
			return fmt.Errorf("insert into relation %d before its RelationMessage", m.RelationID)
		}
		if rel.foreign {
			break
		}
		e := rel.event(r.columns, m.Tuple, r.types)
		r.events = append(r.events, e)
		r.bytes += e.Size()
	case *pglogrepl.CommitMessage:
		r.inTx = false
		r.commits = append(r.commits, commit{events: len(r.events), end: m.TransactionEndLSN, at: m.CommitTime})
	}
	return nil // updates, deletes, truncates, types, origins: not the relay's
}

// foreign says whether m describes a table that a publication FOR TABLES IN
// SCHEMA or FOR ALL TABLES publishes beside the outbox table, whose inserts
// are no events: one of the relays' own tables in its schema (dead letters,
// whose rows would otherwise be parked again, and again), or a table that
// was not in the outbox table's tree at the last look (Saw) and lacks the
// columns of an event. A table of the tree always has them (children and
// partitions share the parent's columns; a column renamed on the table
// itself shows as malformed events, parked, as before), and so does a
// partition attached since the last look: those are decoded. Before the
// first look, only the relays' own tables are foreign.
func (r *Reader) foreign(m *pglogrepl.RelationMessage) bool {
	t := r.opts.Table
	if t.Schema() == "" || t.Schema() == m.Namespace {
		if slices.Contains(t.CompanionTableNames(), m.RelationName) {
			return true
		}
	}
	if r.tree == nil || r.tree[m.RelationID] {
		return false
	}
	has := map[string]bool{}
	for _, c := range m.Columns {
		has[c.Name] = true
	}
	return !has[r.columns.ID] || !has[r.columns.EventType] || !has[r.columns.Payload]
}

// Saw takes the outbox table's tree from a look at the publication: the
// tables whose inserts are events, for foreign.
func (r *Reader) Saw(l Look) {
	tree := make(map[uint32]bool, len(l.tree))
	for _, rel := range l.tree {
		tree[uint32(rel)] = true
	}
	r.tree = tree
}
