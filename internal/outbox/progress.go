package outbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outbox-dev/outbox-operator/internal/pgtx"
)

// The progress of logical replication relays (source LogicalReplication),
// beside the outbox table: one row per replication slot. Rows streamed from
// the WAL are never marked dispatched, so this is where the operator learns
// how far a slot's relay got (BacklogSince), and where a relay remembers
// that the rows committed before its slot existed still have to be
// published (a catch-up).

// ProgressTableName is the name of the progress table, in the outbox
// table's schema.
func (t *Table) ProgressTableName() string { return t.objectName("relay_progress") }

// ProgressTable is that table's name as a person would type it.
func (t *Table) ProgressTable() string {
	if t.schema != "" {
		return t.schema + "." + t.ProgressTableName()
	}
	return t.ProgressTableName()
}

// ProgressLogTableName is the name of the progress log, where the relays
// log their progress at most once a minute, for the cleanup by age.
func (t *Table) ProgressLogTableName() string { return t.objectName("relay_progress_log") }

// progress fills a statement on the progress table (%[14]s) and the
// progress log (%[15]s).
func (t *Table) progress(tmpl string) string {
	return t.format(tmpl, t.qualified(t.ProgressTableName()), t.qualified(t.ProgressLogTableName()))
}

// Progress is one slot's row.
type Progress struct {
	// LastCommit is the commit time of the last transaction the slot's relay
	// published and confirmed, or when its last catch-up read the table;
	// nil before the first.
	LastCommit *time.Time
	// CatchUpPending says that the slot was (re)created and the rows
	// committed before it have not all been published yet.
	CatchUpPending bool
	// CatchUpID is the id of the catch-up last recorded due (0: none, or
	// one recorded by an earlier version, without an id).
	CatchUpID CatchUpID
	// XminHorizon is a full transaction id (xid8) at or before that of
	// every transaction that commits after LastCommit: the oldest one
	// running at a time before that commit. A catch-up reads the rows of
	// those transactions too, however long before LastCommit they began
	// (their created_at, the transaction's start, can be older than the
	// catch-up's margin), and cleanup keeps them. nil: none recorded yet
	// (the slot's first commits, or a row of an earlier version).
	XminHorizon *int64
	// Publication is the fingerprint of the slot's publication and the xmin
	// of the last look of a relay that saw it (PublicationSeen); zero
	// before the first look.
	Publication PublicationSeen
	// Partitions are the partitions of the table whose rows the slot's
	// relay published or streams (logical.PartitionKeys): one not among
	// them joined the table since, with rows the slot never streamed. nil
	// before the first record (a row of an earlier version).
	Partitions *string
	// ConfirmedLSN is the highest position a relay of the slot confirmed
	// to the server (recorded before it did: RecordConfirmed), as a number.
	// A slot whose confirmed_flush_lsn is past it was moved by someone
	// else: dropped and made again, or advanced. nil: none recorded yet (a
	// row of an earlier version).
	ConfirmedLSN *int64
}

// PublicationSeen is what a relay saw of its publication: its fingerprint
// (logical.Look), and the oldest transaction running at the last look that
// saw it. A transaction that inserts after the fingerprint changes has an
// id at or after Xmin, so a catch-up from it reads every row the slot
// skipped while the publication did not publish the table.
type PublicationSeen struct {
	Fingerprint string
	Xmin        *int64
}

// ErrCatchUpPending: StartCatchUp of a publication's gap found a catch-up
// due already (of a new slot, recorded by another relay): a gap's catch-up
// reads less, and must not end it. The caller starts over, doing that one.
var ErrCatchUpPending = errors.New("a catch-up of the slot is due already")

// CatchUpStart is a catch-up recorded due (StartCatchUp).
type CatchUpStart struct {
	// ID is the catch-up's.
	ID CatchUpID
	// After: the catch-up reads the table once every transaction with an id
	// below it has ended (TransactionsEndedBelow); nil: at once.
	After *int64
	// Horizon is the slot's xmin horizon (Progress.XminHorizon), lowered to
	// a publication's gap.
	Horizon *int64
}

// CatchUpSnapshot is what a catch-up's snapshot covers: every transaction
// committed before At, and none with an id at or after Xmin (the oldest
// running then).
type CatchUpSnapshot struct {
	At   time.Time
	Xmin int64
}

// CatchUpID tells one catch-up of a slot from another: StartCatchUp
// returns it and FinishCatchUp takes it, so that a catch-up ends only the
// catch-up it was started for. A relay whose catch-up ran on a slot that
// was dropped and made again meanwhile (by another relay, which recorded
// the new slot's catch-up due) must not end that one: the rows committed
// between its snapshot and the new slot are in no stream.
type CatchUpID int64

// EnsureProgressTable creates the progress table if it is missing.
func (t *Table) EnsureProgressTable(ctx context.Context, db pgtx.Beginner) error {
	if err := t.ApplyDDL(ctx, db, t.progress(progressDDL)); err != nil {
		return fmt.Errorf("creating the replication progress table %s: %w", t.ProgressTable(), err)
	}
	return nil
}

// ReadProgress reads the slot's row; ok is false when it has none (or the
// progress table does not exist yet).
func (t *Table) ReadProgress(ctx context.Context, q Querier, slot string) (p Progress, ok bool, err error) {
	var id int64
	err = q.QueryRow(ctx, t.progress(readProgressSQL), slot).Scan(&p.LastCommit, &p.CatchUpPending, &id, &p.XminHorizon,
		&p.Publication.Fingerprint, &p.Publication.Xmin, &p.Partitions, &p.ConfirmedLSN)
	p.CatchUpID = CatchUpID(id)
	var pgErr *pgconn.PgError
	if errors.Is(err, pgx.ErrNoRows) || errors.As(err, &pgErr) && pgErr.Code == codeUndefinedTable {
		return Progress{}, false, nil // no row, or no table yet: no relay of the slot has run
	}
	if err != nil {
		return Progress{}, false, t.classify(fmt.Errorf("reading %s: %w", t.ProgressTable(), err))
	}
	return p, true, nil
}

// StartCatchUp records that a catch-up of the slot is due, before the slot
// is created (newSlot: it does not exist, or was dropped to be made again)
// or taken: a relay that stops before it ends does it again. It returns
// the catch-up's id, for FinishCatchUp: a new one when newSlot (a catch-up
// of an older slot, still running somewhere, must not end this one) or
// when none was due; else the one already due, which this relay now does
// on the same slot (its relay stopped, or streams it now and this one
// waits for the slot).
//
// gap, when not nil, is a change to the slot's publication found since
// the relay last saw it: Xmin, that look's, lowers the catch-up's horizon,
// and Fingerprint is the publication's from now on. A new catch-up, and
// every one of a gap, waits for the transactions running now to end
// (CatchUpStart.After).
func (t *Table) StartCatchUp(ctx context.Context, q Querier, slot string, newSlot bool, gap *PublicationSeen) (CatchUpStart, error) {
	var horizon *int64
	var fingerprint *string
	if gap != nil {
		horizon, fingerprint = gap.Xmin, &gap.Fingerprint
		if horizon == nil {
			var zero int64 // no look recorded: every row
			horizon = &zero
		}
	}
	var id int64
	var c CatchUpStart
	err := q.QueryRow(ctx, t.progress(startCatchUpSQL), slot, newSlot, horizon, fingerprint).Scan(&id, &c.After, &c.Horizon)
	if errors.Is(err, pgx.ErrNoRows) {
		return CatchUpStart{}, ErrCatchUpPending
	}
	if err != nil {
		return CatchUpStart{}, t.classify(fmt.Errorf("recording a catch-up in %s: %w", t.ProgressTable(), err))
	}
	c.ID = CatchUpID(id)
	return c, nil
}

// FinishCatchUp records catch-up id of the slot done: everything committed
// before snapshot.At (the time of its read of the table) is published, and
// snapshot.Xmin is the xmin horizon. It ends the catch-up due only if that
// is still id, and says whether it did:
// false when the slot was made again meanwhile and a newer catch-up is due
// (then the rows committed between this snapshot and the new slot were
// read by no catch-up yet), or when the slot has no row. A zero snapshot
// ends the catch-up only: that of a publication's gap, read while the
// stream is behind its snapshot, is no progress.
func (t *Table) FinishCatchUp(ctx context.Context, q Querier, slot string, snapshot CatchUpSnapshot, id CatchUpID) (bool, error) {
	var at *time.Time
	var xmin *int64
	if !snapshot.At.IsZero() {
		at, xmin = &snapshot.At, &snapshot.Xmin
	}
	var done bool
	err := q.QueryRow(ctx, t.progress(finishCatchUpSQL), slot, at, int64(id), xmin).Scan(&done)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, t.classify(fmt.Errorf("recording a catch-up done in %s: %w", t.ProgressTable(), err))
	}
	return done, nil
}

// RecordProgress records that everything committed up to lastCommit is
// published. The time never goes back. It also keeps the xmin horizon
// (recordProgressSQL), and, when seen is not nil, what the relay's last
// look saw of the publication. done ends a catch-up recorded without an id
// (by a relay of an earlier version) only; one started by StartCatchUp
// ends with FinishCatchUp.
func (t *Table) RecordProgress(ctx context.Context, q Querier, slot string, lastCommit time.Time, done bool,
	seen *PublicationSeen) error {
	var fingerprint *string
	var xmin *int64
	if seen != nil {
		fingerprint, xmin = &seen.Fingerprint, seen.Xmin
	}
	if _, err := q.Exec(ctx, t.progress(recordProgressSQL), slot, lastCommit, done, fingerprint, xmin); err != nil {
		return t.classify(fmt.Errorf("recording progress in %s: %w", t.ProgressTable(), err))
	}
	return nil
}

// RecordConfirmed records that the slot's relay is about to confirm lsn to
// the server; it calls this before every confirmation, so a slot found
// with a confirmed_flush_lsn past the highest recorded was moved by someone
// else. A slot without a row is left without one.
func (t *Table) RecordConfirmed(ctx context.Context, q Querier, slot string, lsn uint64) error {
	if _, err := q.Exec(ctx, t.progress(recordConfirmedSQL), slot, int64(lsn)); err != nil { //nolint:gosec // an LSN is below 2^63
		return t.classify(fmt.Errorf("recording the confirmed position in %s: %w", t.ProgressTable(), err))
	}
	return nil
}

// RecordPublication records what the slot's relay saw of its publication
// when nothing is recorded yet (a first look; RecordProgress records the
// later ones): a fingerprint recorded earlier stays, so that a change since
// is found by the next look.
func (t *Table) RecordPublication(ctx context.Context, q Querier, slot string, seen PublicationSeen) error {
	if _, err := q.Exec(ctx, t.progress(recordPublicationSQL), slot, seen.Fingerprint, seen.Xmin); err != nil {
		return t.classify(fmt.Errorf("recording the publication's fingerprint in %s: %w", t.ProgressTable(), err))
	}
	return nil
}

// PublicationUnpublished adds entry to the publication's fingerprint
// recorded for slot (once; none when nothing is recorded), keeping the xmin
// of the last confirmed look: a look found the publication not publishing
// the table, and the next look that finds it published again must find the
// fingerprint changed (no look has the entry), whatever the catalog says.
func (t *Table) PublicationUnpublished(ctx context.Context, q Querier, slot, entry string) error {
	if _, err := q.Exec(ctx, t.progress(markUnpublishedSQL), slot, entry); err != nil {
		return t.classify(fmt.Errorf("recording in %s that the publication stopped publishing the table: %w", t.ProgressTable(), err))
	}
	return nil
}

// RecordPartitions records the partitions of the table whose rows slot's
// relay published or streams (keys: logical.PartitionKeys); baseline
// records them only if none are (before the slot's first catch-up, which
// reads every partition there is).
func (t *Table) RecordPartitions(ctx context.Context, q Querier, slot, keys string, baseline bool) error {
	if _, err := q.Exec(ctx, t.progress(recordPartitionsSQL), slot, keys, baseline); err != nil {
		return t.classify(fmt.Errorf("recording the partitions published in %s: %w", t.ProgressTable(), err))
	}
	return nil
}

// LockPartitions reads what slot's progress records of the partitions (nil:
// nothing, or no row) and locks the row until tx ends: a record written
// in tx after it is based on what it read, whatever another relay wrote.
func (t *Table) LockPartitions(ctx context.Context, tx pgx.Tx, slot string) (*string, error) {
	var keys *string
	err := tx.QueryRow(ctx, t.progress(lockPartitionsSQL), slot).Scan(&keys)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, t.classify(fmt.Errorf("reading the partitions published in %s: %w", t.ProgressTable(), err))
	}
	return keys, nil
}

// LocalTimeSkew is how much older than it is a row of a `timestamp without
// time zone` created_at can look: such a column holds the wall time of the
// writer's session TimeZone, which the relay reads as UTC, and zones run
// from UTC-12 to UTC+14. A catch-up reaches back this much further, and
// DeleteStreamed keeps this much more, for such a column.
const LocalTimeSkew = 14 * time.Hour

// CreatedAtIsLocal reports whether the created_at column is a `timestamp
// without time zone`, whose values depend on the writer's TimeZone.
func (t *Table) CreatedAtIsLocal(ctx context.Context, q Querier) (bool, error) {
	var local bool
	err := q.QueryRow(ctx, createdAtIsLocalSQL, t.qTable, t.columns.CreatedAt).Scan(&local)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, fmt.Errorf("%w: %s (or its column %s)", ErrTableNotFound, t, t.columns.CreatedAt)
	}
	if err != nil {
		return false, t.classify(fmt.Errorf("reading the type of %s.%s: %w", t, t.columns.CreatedAt, err))
	}
	return local, nil
}

// CatchUpSince widens a catch-up's lower bound for the column's type: by
// LocalTimeSkew for a `timestamp without time zone` created_at. nil stays
// nil (every row).
func (t *Table) CatchUpSince(ctx context.Context, q Querier, since *time.Time) (*time.Time, error) {
	if since == nil {
		return nil, nil
	}
	local, err := t.CreatedAtIsLocal(ctx, q)
	if err != nil {
		return nil, err
	}
	if !local {
		return since, nil
	}
	s := since.Add(-LocalTimeSkew)
	return &s, nil
}

// CatchUp reads, in one REPEATABLE READ snapshot, the rows not marked
// dispatched created at or after since (nil: every row), inserted by a
// transaction at or after the xmin horizon (Progress.XminHorizon; nil:
// none), or without created_at, from the table and its children, and hands them to fn in
// pages of at most limit, in the claim's order; it marks nothing. There is
// no upper bound: a row committed after the snapshot is not read, so the
// caller takes the snapshot once its slot streams and every transaction
// that had an id by then has ended (a row committed after the slot's
// consistent point is then in the stream, one committed before it in the
// snapshot: a commit is in the WAL before it is visible, e.g. while it
// waits for a synchronous standby). It returns the server's clock at the snapshot
// (every row committed before it was read) and the oldest transaction
// then running.
//
// The caller widens since for the column's type first (CatchUpSince).
func (t *Table) CatchUp(ctx context.Context, db pgtx.Beginner, since *time.Time, horizon *int64, limit Limit,
	fn func([]Event) error) (snapshot CatchUpSnapshot, err error) {
	err = pgtx.Run(ctx, db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY`); err != nil {
			return fmt.Errorf("catching up: %w", err)
		}
		// The snapshot is taken by the transaction's first query: this one.
		if err := tx.QueryRow(ctx, `SELECT clock_timestamp(), pg_snapshot_xmin(pg_current_snapshot())::text::bigint`).
			Scan(&snapshot.At, &snapshot.Xmin); err != nil {
			return fmt.Errorf("catching up: reading the server's clock: %w", err)
		}
		return t.readCatchUp(ctx, tx, t.qTable, since, horizon, limit, fn)
	})
	return snapshot, t.classify(err)
}

// CatchUpChild reads, in tx, every row of ONLY the child table (schema and
// name as the catalog spells them; an inheritance child of the table) not
// marked dispatched, and hands them to fn in pages of at most limit. The
// caller holds a lock that keeps inserts out (relay: adding the child to
// the publication).
func (t *Table) CatchUpChild(ctx context.Context, tx pgx.Tx, schema, name string, limit Limit, fn func([]Event) error) error {
	return t.classify(t.readCatchUp(ctx, tx, "ONLY "+pgx.Identifier{schema, name}.Sanitize(), nil, nil, limit, fn))
}

// readCatchUp pages through declareCatchUpSQL of from in tx, handing the
// rows to fn in pages within limit (pager), so that memory stays within
// limit.Bytes however large the rows. fn runs while a FETCH's rows are
// read: it must not use tx. A FETCH of rows larger than the budget spans
// several pages, and its statement lasts until the last is published: so
// the first FETCH takes catchUpFirstFetch rows, and each next one
// as many as the rows read so far say fit in the budget (up to twice the
// last, and limit.Rows), so that a FETCH publishes about one page.
func (t *Table) readCatchUp(ctx context.Context, tx pgx.Tx, from string, since *time.Time, horizon *int64, limit Limit,
	fn func([]Event) error) error {
	if limit.Rows < 1 {
		return fmt.Errorf("catching up in pages of %d rows: must be at least 1", limit.Rows)
	}
	if _, err := tx.Exec(ctx, t.format(declareCatchUpSQL, from, fmt.Sprintf(insertedSinceHorizon, "$2")), since, horizon); err != nil {
		return fmt.Errorf("catching up: %w", err)
	}
	p := newPager(t.columns, false, limit, fn)
	for fetch := min(limit.Rows, catchUpFirstFetch); ; {
		before := p.read
		n, err := p.scan(tx.Query(ctx, fmt.Sprintf(fetchCatchUpSQL, fetch)))
		switch {
		case p.failed:
			return err // fn's own
		case err != nil:
			return fmt.Errorf("catching up: %w", err)
		}
		if err := p.flush(); err != nil {
			return err
		}
		if n < fetch {
			_, err := tx.Exec(ctx, `CLOSE outbox_catch_up`)
			return err
		}
		fetch = min(2*fetch, limit.RowsFitting(n, p.read-before))
	}
}

// catchUpFirstFetch is the rows of a catch-up's first FETCH, before it
// knows their size: one, so that even rows of the largest payloads make a
// FETCH of one page; small rows reach limit.Rows in a few doublings.
const catchUpFirstFetch = 1

// pager gathers the rows a statement streams into pages of at most
// limit.Rows events, and of events whose sizes add up to at most
// limit.Bytes when that is above 0 (a larger event makes a page alone),
// and hands each page to fn as it fills: the readers of many rows (the
// catch-up, the replay) hold a page in memory, never the whole result.
// fn must not keep the page: its slice is reused.
type pager struct {
	scanner *eventScanner
	limit   Limit
	fn      func([]Event) error
	page    []Event
	bytes   int   // the Sizes of page
	read    int64 // the Sizes of every event read
	// failed: fn returned an error, which scan and flush return as it is.
	failed bool
}

// newPager reads rows of (id, type, payload, created_at), and a key and a
// partition after them when keyed (eventScanner).
func newPager(c Columns, keyed bool, limit Limit, fn func([]Event) error) *pager {
	return &pager{scanner: newEventScanner(c, keyed), limit: limit, fn: fn, page: make([]Event, 0, min(limit.Rows, 1024))}
}

// scan reads a statement's rows into pages, and returns how many it read.
func (p *pager) scan(rows pgx.Rows, err error) (int, error) {
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		e, err := p.scanner.scan(rows)
		if err != nil {
			return n, fmt.Errorf("scanning row: %w", err)
		}
		n++
		if err := p.add(e); err != nil {
			return n, err
		}
	}
	return n, rows.Err()
}

// add adds e to the page, handing the page to fn first when e would take
// it over limit.Bytes, and after when it is full.
func (p *pager) add(e Event) error {
	if len(p.page) > 0 && p.limit.Bytes > 0 && p.bytes+e.Size() > p.limit.Bytes {
		if err := p.flush(); err != nil {
			return err
		}
	}
	p.page = append(p.page, e)
	p.bytes += e.Size()
	p.read += int64(e.Size())
	if len(p.page) >= p.limit.Rows {
		return p.flush()
	}
	return nil
}

// flush hands what the page holds to fn, if anything.
func (p *pager) flush() error {
	if len(p.page) == 0 {
		return nil
	}
	err := p.fn(p.page)
	clear(p.page) // let the collector have the payloads
	p.page, p.bytes = p.page[:0], 0
	p.failed = p.failed || err != nil
	return err
}

// Now is the server's clock, which created_at defaults read.
func Now(ctx context.Context, q Querier) (time.Time, error) {
	var now time.Time
	if err := q.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&now); err != nil {
		return time.Time{}, fmt.Errorf("reading the server's clock: %w", err)
	}
	return now, nil
}

// BacklogSince is the backlog of a logical replication relay: the rows
// created after the slot's last published commit (the progress table), at
// most limit counted (0: all), and the oldest of them. A row's created_at
// is usually its transaction's start, before its commit, so a transaction
// that ran across the last commit is not counted: an estimate, low by the
// rows of such transactions. Without a progress row every row counts.
func (t *Table) BacklogSince(ctx context.Context, q Querier, slot string, limit int64) (Backlog, error) {
	var b Backlog
	var oldest pgtype.Timestamptz
	n := limit + 1
	if limit <= 0 {
		n = 1 << 62
	}
	if err := q.QueryRow(ctx, t.progress(backlogSinceSQL), slot, n).Scan(&b.Count, &oldest); err != nil {
		return Backlog{}, t.classify(err)
	}
	b.Oldest = oldestOf(oldest)
	if limit > 0 && b.Count > limit {
		b.Count, b.Capped = limit, true
	}
	dead, err := t.CountDeadLetters(ctx, q)
	if err != nil {
		return Backlog{}, err
	}
	b.DeadLetters = dead
	return b, nil
}

// ErrNoProgress: a cleanup of a logical replication relay's table found no
// published commit of its slot, so it cannot tell what is safe to delete.
var ErrNoProgress = errors.New("no published commit recorded for the slot")

// YoungProgressError is the cleanup by age of a logical replication
// relay's table deleting nothing because the slot's progress was not
// logged a retention ago yet (its relay is younger than the retention, or
// of a version without the log): nothing tells which rows were published
// more than the retention ago.
type YoungProgressError struct {
	Slot      string
	Retention time.Duration
}

func (e *YoungProgressError) Error() string {
	return fmt.Sprintf("the progress of slot %s was not logged %s ago yet (its relay runs for less than the retention): "+
		"nothing is known to be published that long ago", e.Slot, e.Retention)
}

// DeleteStreamed deletes, in batches of batchSize, the rows published
// more than retention ago (the cleanup by age of source
// LogicalReplication, whose rows are never marked dispatched): the rows
// created more than retention ago and more than margin before the slot's
// commit as the progress log had it a retention ago (so a row created
// long before its relay published it, after a lag or a catch-up, stays a
// retention after, for a replay), but those inserted at or after the xmin
// horizon of then or of now (Progress.XminHorizon: such a transaction may
// have committed after that commit). The margin and the horizon keep what a
// catch-up after a lost slot would read; for a `timestamp without time zone` created_at it is
// LocalTimeSkew longer, as the catch-up's reach. It returns the rows deleted and the cutoff used.
// Without a log entry a retention old it deletes nothing: YoungProgressError.
// While relays of other streams are registered (CheckSlotAlone: rows they
// did not publish yet would go) it deletes nothing and returns a
// SlotNotAloneError.
// While a stream reset waits for a replay, or was replayed less than the
// retention ago (ResetsHold), it deletes nothing and returns a
// ResetsPendingError: the replay of that source republishes every row
// created before the reset's end.
//
// beforeBatch, when given, runs before each batch: an error stops the
// deletes there and is returned (what the caller must check again while
// the deletes run, as tables that join the outbox table).
func (t *Table) DeleteStreamed(ctx context.Context, q Querier, slot string, retention, margin time.Duration,
	batchSize int, beforeBatch ...func(context.Context) error) (int64, time.Time, error) {
	p, ok, err := t.ReadProgress(ctx, q, slot)
	if err != nil {
		return 0, time.Time{}, err
	}
	if !ok || p.LastCommit == nil {
		return 0, time.Time{}, fmt.Errorf("%w: %s in %s (has its relay run?)", ErrNoProgress, slot, t.ProgressTable())
	}
	// Relays of other streams (CheckSlotAlone) and the resets' hold stop
	// the deletes: checked first and again before each batch, as a relay
	// or a reset recorded while they run holds too.
	held := func(ctx context.Context) error {
		if err := t.CheckSlotAlone(ctx, q, slot); err != nil {
			return err
		}
		hold, err := t.ResetsHold(ctx, q, retention)
		if err == nil && hold != nil {
			err = &ResetsPendingError{ResetsTable: t.StreamResetsTable(), Since: hold.Since, Replayed: !hold.Pending,
				Retention: retention}
		}
		return err
	}
	if err := held(ctx); err != nil {
		return 0, time.Time{}, err
	}
	beforeBatch = append(slices.Clip(beforeBatch), held)
	var agedAt, agedCommit time.Time
	var agedHorizon *int64
	err = q.QueryRow(ctx, t.progress(agedProgressSQL), slot, retention.Seconds()).Scan(&agedAt, &agedCommit, &agedHorizon)
	var pgErr *pgconn.PgError
	if errors.Is(err, pgx.ErrNoRows) || errors.As(err, &pgErr) && pgErr.Code == codeUndefinedTable {
		return 0, time.Time{}, &YoungProgressError{Slot: slot, Retention: retention}
	}
	if err != nil {
		return 0, time.Time{}, t.classify(fmt.Errorf("reading the progress log %s: %w", t.ProgressLogTableName(), err))
	}
	horizon := p.XminHorizon // the lowest keeps most
	// The last confirmed look at the publication: a gap found and not yet
	// recorded (the publication publishes no inserts, until it is fixed)
	// reads from it.
	for _, h := range []*int64{agedHorizon, p.Publication.Xmin} {
		if h != nil && (horizon == nil || *h < *horizon) {
			horizon = h
		}
	}
	now, err := Now(ctx, q)
	if err != nil {
		return 0, time.Time{}, err
	}
	local, err := t.CreatedAtIsLocal(ctx, q)
	if err != nil {
		return 0, time.Time{}, err
	}
	if local {
		margin += LocalTimeSkew // a row written west of UTC looks older than it is
	}
	cutoff := now.Add(-retention)
	for _, c := range []time.Time{p.LastCommit.Add(-margin), agedCommit.Add(-margin)} {
		if c.Before(cutoff) {
			cutoff = c
		}
	}
	if _, err := q.Exec(ctx, t.progress(pruneProgressLogSQL), slot, agedAt); err != nil {
		return 0, cutoff, t.classify(fmt.Errorf("pruning the progress log %s: %w", t.ProgressLogTableName(), err))
	}
	var total int64
	for {
		for _, f := range beforeBatch {
			if err := f(ctx); err != nil {
				return total, cutoff, err
			}
		}
		tag, err := q.Exec(ctx, t.format(cleanupStreamedSQL, fmt.Sprintf(insertedSinceHorizon, "$3")), cutoff, batchSize, horizon)
		if err != nil {
			return total, cutoff, t.classify(fmt.Errorf("deleting streamed rows: %w", err))
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < int64(batchSize) || ctx.Err() != nil {
			return total, cutoff, ctx.Err()
		}
	}
}
