package logical

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outbox-dev/outbox-operator/internal/outbox"
)

// closeTimeout bounds how long Close waits for the server to end the stream
// in order, which releases the slot at once; past it the connection is
// simply dropped and the server notices on its own.
const closeTimeout = 5 * time.Second

// Reader streams the inserts of the outbox table from a replication slot,
// over a replication connection of its own. It is not safe for concurrent
// use: Next, Confirm and Close are called in turn, by one goroutine (the
// relay's loop). After an error other than the caller's context ending, the
// Reader is broken for good: Close it and Open another, which resumes at the
// confirmed position.
type Reader struct {
	conn      *pgconn.PgConn
	opts      Options
	columns   outbox.Columns
	types     *pgtype.Map
	relations map[uint32]*relation // by relation id, from the latest RelationMessage
	castTypes map[uint32]textCast  // the types whose ::text is not their output text, at Open (castTypesSQL)
	tree      map[uint32]bool      // the outbox table's tree at the last look (Saw); nil before

	// confirmed is what the caller confirmed, the only position ever sent
	// to the server as flushed, which moves the slot (it may be a
	// keepalive's, see IdleEnd); returned is the highest Confirm of a batch
	// returned so far; idleEnd the position of the latest keepalive that
	// came while the Reader was idle.
	confirmed, returned, idleEnd pglogrepl.LSN
	// inTx: the stream is between a transaction's Begin and its Commit.
	inTx bool
	// events and commits are what was received and not returned yet; they
	// survive a Next that ends with its context.
	events  []outbox.Event
	bytes   int // the Sizes of events
	commits []commit

	nextStatus time.Time
	err        error // the stream broke
}

// Open connects for replication with cfg (a parsed DSN, with its TLS,
// dialer and fallbacks; it is copied, not changed) and starts streaming the
// slot of o from its confirmed position: what was confirmed is never read
// again, what was not is. The session runs with the relay's sessions' output
// settings (outbox.TextOutputParams: TimeZone UTC and DateStyle ISO, which
// the decoding of timestamps relies on, bytea_output hex, ...), so a column
// comes as the text those read, and without statement_timeout, since the
// stream is one statement that never ends.
//
// A slot that cannot stream gives ErrSlotNotFound, ErrSlotInvalidated or
// ErrSlotInUse. Errors never hold the password.
func Open(ctx context.Context, cfg *pgconn.Config, o Options) (*Reader, error) {
	o, err := o.withDefaults()
	if err != nil {
		return nil, err
	}
	if cfg == nil {
		return nil, fmt.Errorf("%w: no connection config", ErrInvalidOptions)
	}
	c := cfg.Copy()
	if c.RuntimeParams == nil {
		c.RuntimeParams = map[string]string{}
	}
	c.RuntimeParams["replication"] = "database"
	for k, v := range outbox.TextOutputParams() { // the text of every column, as the relay's sessions read it
		c.RuntimeParams[k] = v
	}
	c.RuntimeParams["statement_timeout"] = "0"
	// A context that ends interrupts a read by the socket's deadline, which
	// keeps the stream; a cancel request (another handler) would end it.
	c.BuildContextWatcherHandler = func(pc *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.DeadlineContextWatcherHandler{Conn: pc.Conn()}
	}
	conn, err := pgconn.ConnectConfig(ctx, c)
	if err != nil {
		return nil, fmt.Errorf("connecting for replication: %w", err)
	}
	r := &Reader{
		conn:      conn,
		opts:      o,
		columns:   o.Table.Columns(),
		types:     pgtype.NewMap(),
		relations: map[uint32]*relation{},
	}
	if err := r.start(ctx); err != nil {
		_ = conn.Close(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("replication slot %s: %w", o.Slot, err)
	}
	r.nextStatus = time.Now().Add(o.StatusInterval)
	return r, nil
}

// start reads where the slot stands, refusing one that cannot stream, then
// starts streaming.
func (r *Reader) start(ctx context.Context) error {
	if err := r.readSlot(ctx); err != nil {
		return err
	}
	if err := r.readCastTypes(ctx); err != nil {
		return err
	}
	return r.startReplication(ctx)
}

// readCastTypes reads the types whose cast to text is not the text
// pgoutput sends (castTypesSQL), which the decoder turns into it. A domain
// over one of them created after Open is not among them (until the next
// Open).
func (r *Reader) readCastTypes(ctx context.Context) error {
	results, err := r.conn.Exec(ctx, castTypesSQL).ReadAll()
	if err != nil {
		return fmt.Errorf("listing the types cast to text by a function: %w", classify(err))
	}
	r.castTypes = map[uint32]textCast{}
	for _, res := range results {
		for _, row := range res.Rows {
			oid, err := strconv.ParseUint(string(row[0]), 10, 32)
			if err != nil {
				return fmt.Errorf("listing the types cast to text by a function: oid %q: %w", row[0], err)
			}
			r.castTypes[uint32(oid)] = textCasts[string(row[1])]
		}
	}
	return nil
}

// readSlot looks up the slot on the replication connection and takes its
// confirmed position as the Reader's.
func (r *Reader) readSlot(ctx context.Context) error {
	results, err := r.conn.Exec(ctx, fmt.Sprintf(replSlotSQL, r.opts.Slot)).ReadAll()
	if err != nil {
		return fmt.Errorf("looking up: %w", classify(err))
	}
	if len(results) != 1 || len(results[0].Rows) == 0 {
		return fmt.Errorf("%w (Setup creates it)", ErrSlotNotFound)
	}
	row := results[0].Rows[0] // confirmed_flush_lsn, wal_status, plugin, this database
	if string(row[1]) == walStatusLost {
		return errLost
	}
	var here *bool
	if row[3] != nil {
		b := string(row[3]) == "t"
		here = &b
	}
	if err := checkSlot(textOrNil(row[2]), here); err != nil {
		return err
	}
	if row[0] != nil {
		if r.confirmed, err = pglogrepl.ParseLSN(string(row[0])); err != nil {
			return fmt.Errorf("confirmed_flush_lsn: %w", err)
		}
		r.returned = r.confirmed
	}
	return nil
}

// startReplication issues START_REPLICATION from the slot's confirmed
// position (0/0: the server's choice, which is that).
func (r *Reader) startReplication(ctx context.Context) error {
	err := pglogrepl.StartReplication(ctx, r.conn, r.opts.Slot, 0, pglogrepl.StartReplicationOptions{
		Mode:       pglogrepl.LogicalReplication,
		PluginArgs: pluginArgs(r.opts.Publication),
	})
	if err != nil {
		return fmt.Errorf("starting replication: %w", classify(err))
	}
	return nil
}

// textOrNil returns a text column of a simple-protocol row, nil for NULL.
func textOrNil(b []byte) *string {
	if b == nil {
		return nil
	}
	s := string(b)
	return &s
}

// Confirm records that every event up to lsn (a Batch's Confirm, or
// IdleEnd) is published, and tells the server at once, which may then free
// the WAL before it. A position behind the confirmed one changes nothing;
// one past every batch returned (and past IdleEnd) is refused, since
// confirming it could skip events.
func (r *Reader) Confirm(ctx context.Context, lsn pglogrepl.LSN) error {
	if r.err != nil {
		return r.err
	}
	if lsn <= r.confirmed {
		return nil
	}
	if lsn > r.returned && (lsn > r.idleEnd || !r.idle()) {
		return fmt.Errorf("confirming %s: past the last batch's position %s", lsn, r.returned)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	r.confirmed = lsn
	r.returned = max(r.returned, lsn)
	if err := r.sendStatus(); err != nil {
		return r.fail(err)
	}
	return nil
}

// Confirmed is the position confirmed so far, where a new Reader resumes.
func (r *Reader) Confirmed() pglogrepl.LSN { return r.confirmed }

// IdleEnd is the position of the server's latest keepalive while
// everything received is confirmed (0: none past the confirmed position, or
// something arrived since): the server decoded the WAL up to there and
// found nothing for the publication, so confirming it skips no event. A
// caught-up Reader in a busy database would otherwise keep WAL forever. The
// Reader confirms it by itself only when the server asks for a reply (a
// walsender asked to stop, a fast shutdown, waits until its client has
// confirmed everything it sent, which a Reader that answers otherwise
// delays; it asks nothing of a client that sends its status every
// StatusInterval): its caller records what it confirms first (the relay
// compares its slot with that record, to find a slot moved by someone
// else), then passes it to Confirm, and records Confirmed after a reply.
func (r *Reader) IdleEnd() pglogrepl.LSN {
	if r.idle() && r.idleEnd > r.confirmed {
		return r.idleEnd
	}
	return 0
}

// sendStatus sends a standby status update with the confirmed position as
// written, flushed and applied.
func (r *Reader) sendStatus() error {
	err := pglogrepl.SendStandbyStatusUpdate(context.Background(), r.conn, pglogrepl.StandbyStatusUpdate{
		WALWritePosition: r.confirmed,
		WALFlushPosition: r.confirmed,
		WALApplyPosition: r.confirmed,
	})
	if err != nil {
		return fmt.Errorf("sending standby status: %w", err)
	}
	r.nextStatus = time.Now().Add(r.opts.StatusInterval)
	return nil
}

// fail records that the stream broke, for every later call.
func (r *Reader) fail(err error) error {
	r.err = fmt.Errorf("reading replication slot %s: %w", r.opts.Slot, err)
	return r.err
}

// Close ends the stream and the connection. It ends the stream in order
// first (CopyDone, then the server's reply), so that the server releases
// the slot before Close returns and a new Reader can take it at once; when
// that fails, the connection is dropped and the server releases the slot
// once it notices. Nothing is confirmed by closing.
func (r *Reader) Close(ctx context.Context) error {
	if r.conn.IsClosed() {
		return nil
	}
	if r.err == nil {
		ctx, cancel := context.WithTimeout(ctx, closeTimeout)
		r.endStream(ctx)
		cancel()
	}
	if r.err == nil {
		r.err = errors.New("reader closed")
	}
	return r.conn.Close(ctx)
}

// endStream sends CopyDone and reads until the server is ready for a new
// command, which it is once it has released the slot. Data still on its way
// is dropped: it was not confirmed, so it comes again.
func (r *Reader) endStream(ctx context.Context) {
	r.conn.Frontend().Send(&pgproto3.CopyDone{})
	if err := r.conn.Frontend().Flush(); err != nil {
		return
	}
	for {
		msg, err := r.conn.ReceiveMessage(ctx)
		if err != nil {
			return
		}
		if _, ok := msg.(*pgproto3.ReadyForQuery); ok {
			return
		}
	}
}

// KeepAlive sends the standby status when it is due, for a caller that
// holds the stream without reading it for a while (the relay's catch-up
// reads the table first): the server ends a client it has not heard from
// for wal_sender_timeout.
func (r *Reader) KeepAlive() error {
	if r.err != nil {
		return r.err
	}
	if time.Now().Before(r.nextStatus) {
		return nil
	}
	if err := r.sendStatus(); err != nil {
		return r.fail(err)
	}
	return nil
}
