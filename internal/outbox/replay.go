package outbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-dev/outbox-operator/internal/pgtx"
)

// StreamResetsTableName is the name of the table, beside the outbox table,
// where relays record that their stream lost entries.
func (t *Table) StreamResetsTableName() string { return t.objectName("stream_resets") }

// StreamResetsTable is that table's name as a person would type it,
// schema-qualified when the outbox table is.
func (t *Table) StreamResetsTable() string {
	if t.schema != "" {
		return t.schema + "." + t.StreamResetsTableName()
	}
	return t.StreamResetsTableName()
}

// StreamResetsDDL creates only the stream-resets and stream-state tables,
// and the relays table (relays.go).
func (t *Table) StreamResetsDDL() string {
	return t.resets(streamResetsDDL) + "\n" + t.relays(relaysDDL)
}

// StreamStateTableName is the name of the table, beside the outbox table,
// where relays record what they last saw of their stream (StreamState).
func (t *Table) StreamStateTableName() string { return t.objectName("stream_state") }

// resets fills a statement on the stream-resets table (%[14]s) and the
// stream-state table (%[15]s).
func (t *Table) resets(tmpl string) string {
	return t.format(tmpl, t.qualified(t.StreamResetsTableName()), t.qualified(t.StreamStateTableName()))
}

// StreamState is what the relays last saw of a stream, kept in PostgreSQL
// so that a relay started later (after a time with no relay at all: scaled
// to zero, suspended, or moved to another Redis) can tell that the stream
// went back in time meanwhile, as one that ran throughout would.
type StreamState struct {
	Stream string
	// LastID is the highest id seen, EntriesAdded the stream's count of
	// entries ever added (Redis 7; 0 before).
	LastID       string
	EntriesAdded int64
	// FirstMs is the time of the oldest entry, ConsumedMs the time below
	// which every group had read and acknowledged (ms since the epoch).
	FirstMs, ConsumedMs int64
	// Groups are the stream's consumer groups.
	Groups []string
	// Age is how long ago the state was recorded, by PostgreSQL's clock
	// (read only: ReadStreamState).
	Age time.Duration
	// Replace (write only: WriteStreamState) says that the writer saw the
	// stream reset since its last write: its view, of the stream made
	// anew, replaces the one recorded, though its last id is earlier.
	Replace bool
}

// ReadStreamState reads what the relays last saw of stream; ok is false
// when nothing is recorded (or there is no table yet).
func (t *Table) ReadStreamState(ctx context.Context, q Querier, stream string) (s StreamState, ok bool, err error) {
	s.Stream = stream
	var ageMs int64
	err = q.QueryRow(ctx, t.resets(readStreamStateSQL), stream).Scan(&s.LastID, &s.EntriesAdded, &s.FirstMs, &s.ConsumedMs, &s.Groups, &ageMs)
	var pgErr *pgconn.PgError
	if errors.Is(err, pgx.ErrNoRows) || errors.As(err, &pgErr) && pgErr.Code == codeUndefinedTable {
		return StreamState{}, false, nil
	}
	if err != nil {
		return StreamState{}, false, fmt.Errorf("reading the stream's state from %s: %w", t.StreamStateTableName(), t.classify(err))
	}
	s.Age = time.Duration(ageMs) * time.Millisecond
	return s, true, nil
}

// WriteStreamState records what a relay saw of a stream.
func (t *Table) WriteStreamState(ctx context.Context, q Querier, s StreamState) error {
	sql := writeStreamStateSQL
	if s.Replace {
		sql = replaceStreamStateSQL
	}
	_, err := q.Exec(ctx, t.resets(sql), s.Stream, s.LastID, s.EntriesAdded, s.FirstMs, s.ConsumedMs, s.Groups)
	if err != nil {
		return fmt.Errorf("recording the stream's state in %s: %w", t.StreamStateTableName(), t.classify(err))
	}
	return nil
}

// ForgetStreamState forgets what was seen of a stream that is gone.
func (t *Table) ForgetStreamState(ctx context.Context, q Querier, stream string) error {
	if _, err := q.Exec(ctx, t.resets(forgetStreamStateSQL), stream); err != nil {
		return fmt.Errorf("forgetting the stream's state in %s: %w", t.StreamStateTableName(), t.classify(err))
	}
	return nil
}

// StreamReset is a window of dispatch times whose events may be missing
// from a stream: the stream went back in time (Redis restarted without
// persistence, was flushed, failed over to a replica that lagged, evicted
// the key) and entries the relay had added were gone.
type StreamReset struct {
	Stream string
	// WindowStart and WindowEnd bound the dispatched_at of the rows whose
	// events may be lost; `relay replay` republishes them.
	WindowStart, WindowEnd time.Time
	// Reason says what the relay saw.
	Reason string
	// Groups are the consumer groups the stream had before the reset, as
	// far as the relay knew: the reset took them with the stream, and
	// trimming waits until they are all back (AwaitedGroups).
	Groups []string
	// ReachedBack, set by RecordStreamReset, says that the window reaches
	// back to the start of a replay's made since it began.
	ReachedBack bool
	// RunningBelow, set by RecordStreamReset, is a full transaction id
	// above that of every transaction running when the reset was recorded
	// (the record's own):
	// a batch of any relay that added its entries to the lost stream and
	// had not committed is one of them, and a replay must not read the
	// table before it ended (TransactionsEndedBelow).
	RunningBelow int64
}

// NextTransactionID is a transaction id above the id of every transaction
// that has one now (a full transaction id): it assigns one, to the
// transaction of its statement (q's, which must be free to take one).
func (t *Table) NextTransactionID(ctx context.Context, q Querier) (int64, error) {
	var xid int64
	if err := q.QueryRow(ctx, nextXactIDSQL).Scan(&xid); err != nil {
		return 0, fmt.Errorf("reading the next transaction id: %w", t.classify(err))
	}
	return xid, nil
}

// TransactionsEndedBelow reports whether every transaction with an id
// below xid (a full transaction id) has ended.
func (t *Table) TransactionsEndedBelow(ctx context.Context, q Querier, xid int64) (bool, error) {
	var ended bool
	if err := q.QueryRow(ctx, endedBelowSQL, xid).Scan(&ended); err != nil {
		return false, fmt.Errorf("asking whether the transactions below %d ended: %w", xid, t.classify(err))
	}
	return ended, nil
}

// EnsureStreamResetsTable creates the stream-resets table if it is missing
// (ApplyDDL).
func (t *Table) EnsureStreamResetsTable(ctx context.Context, db pgtx.Beginner) error {
	if err := t.ApplyDDL(ctx, db, t.StreamResetsDDL()); err != nil {
		return fmt.Errorf("creating stream-resets table %s: %w", t.StreamResetsTable(), err)
	}
	return nil
}

// RecordStreamReset records a reset whose window is of the caller's clock
// (now is its reading) and returns it as recorded, of PostgreSQL's (the
// dispatch times' clock): it starts earlier by as much as the caller's
// clock is ahead of PostgreSQL's, reaches back to the start of the window
// of any replay of the stream done since the reset's window began (a
// replay adds old rows' events anew, so a reset that loses entries added
// since may lose theirs again), and ends no earlier than PostgreSQL's
// clock at the record.
func (t *Table) RecordStreamReset(ctx context.Context, q Querier, r StreamReset, now time.Time) (StreamReset, error) {
	err := q.QueryRow(ctx, t.resets(recordStreamResetSQL), r.Stream, r.WindowStart, r.WindowEnd, r.Reason, r.Groups, now).
		Scan(&r.WindowStart, &r.WindowEnd, &r.RunningBelow, &r.ReachedBack)
	if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && pgErr.Code == codeUndefinedColumn {
		// A table of an earlier version the relay's role could not alter:
		// the reset is recorded without its groups rather than not at all.
		err = q.QueryRow(ctx, t.resets(recordStreamResetNoGroupsSQL), r.Stream, r.WindowStart, r.WindowEnd, r.Reason, now).
			Scan(&r.WindowStart, &r.WindowEnd, &r.RunningBelow, &r.ReachedBack)
	}
	if err != nil {
		return r, fmt.Errorf("recording a stream reset in %s: %w", t.StreamResetsTable(), err)
	}
	r.WindowStart, r.WindowEnd = r.WindowStart.UTC(), r.WindowEnd.UTC()
	return r, nil
}

// RecordReplay records that a replay of the rows of window [since, until)
// of stream begins, as a reset already replayed, and returns the record's
// id (0 when there is no table): a reset found later, or while the replay
// runs, whose window began before the replay's end reaches back to since
// (RecordStreamReset). ReplayEnded ends the record. A missing table means
// nothing to record: no relay could record a reset in it either.
func (t *Table) RecordReplay(ctx context.Context, q Querier, stream string, since, until time.Time, what string) (int64, error) {
	var id int64
	err := q.QueryRow(ctx, t.resets(recordReplaySQL), stream, since, until, what).Scan(&id)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == codeUndefinedTable {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("recording a replay in %s: %w", t.StreamResetsTable(), err)
	}
	return id, nil
}

// ReplayEnded records that replay id (RecordReplay) ended now, having
// added entries or not (then it is forgotten).
func (t *Table) ReplayEnded(ctx context.Context, q Querier, id int64, added bool) error {
	if _, err := q.Exec(ctx, t.resets(replayEndedSQL), id, added); err != nil {
		return fmt.Errorf("recording the end of a replay in %s: %w", t.StreamResetsTable(), err)
	}
	return nil
}

// AwaitedGroups are the consumer groups that resets of stream took with it
// and that were not all seen back since: the groups, and the resets that
// recorded them (for GroupsBack). A group the reset took is created again
// by its consumers, at 0 or at the position they keep; until then nothing
// says what it still has to read, so the stream is not trimmed. A missing
// table means none.
func (t *Table) AwaitedGroups(ctx context.Context, q Querier, stream string) (groups []string, resets []int64, err error) {
	rows, err := q.Query(ctx, t.resets(awaitedGroupsSQL), stream)
	if err == nil {
		var id int64
		var gs []string
		_, err = pgx.ForEachRow(rows, []any{&id, &gs}, func() error {
			resets = append(resets, id)
			for _, g := range gs {
				if !slices.Contains(groups, g) {
					groups = append(groups, g)
				}
			}
			return nil
		})
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == codeUndefinedTable || pgErr.Code == codeUndefinedColumn) {
		return nil, nil, nil // no table, or one of an earlier version: no groups recorded
	}
	if err != nil {
		return nil, nil, fmt.Errorf("reading the groups awaited after stream resets in %s: %w", t.StreamResetsTable(), t.classify(err))
	}
	return groups, resets, nil
}

// GroupsBack records that the groups of resets (AwaitedGroups) were all
// seen on the stream: trimming no longer waits for them.
func (t *Table) GroupsBack(ctx context.Context, q Querier, resets []int64) error {
	if len(resets) == 0 {
		return nil
	}
	if _, err := q.Exec(ctx, t.resets(groupsBackSQL), resets); err != nil {
		return fmt.Errorf("recording the groups back in %s: %w", t.StreamResetsTable(), t.classify(err))
	}
	return nil
}

// Hold is what cleanup keeps for the stream resets of a table: every row a
// replay of the earliest window held would republish, those dispatched
// (or, for a logical replication relay, created) since Since.
type Hold struct {
	// Since is the start of the earliest window held.
	Since time.Time
	// Pending: a reset among them waits for a replay. Otherwise every one
	// was replayed less than the retention ago.
	Pending bool
}

// ResetsHold is what cleanup with retention keeps for the stream resets of
// the table, on any stream; nil when nothing or no stream-resets table.
// It holds the window of a reset that no replay has covered yet, so that
// the retention does not make a loss of it. And it holds the window of a
// replay for a retention after the replay ended: the rows it republished
// were dispatched long before, and a reset found later (Redis lost the
// replayed entries too) reaches back to the replay's window
// (RecordStreamReset), whose replay must find them. It runs no statement
// that can fail on a missing table, so it may run inside a transaction.
func (t *Table) ResetsHold(ctx context.Context, q Querier, retention time.Duration) (*Hold, error) {
	var exists bool
	if err := q.QueryRow(ctx, tableExistsSQL, t.qualified(t.StreamResetsTableName())).Scan(&exists); err != nil {
		return nil, fmt.Errorf("looking for %s: %w", t.StreamResetsTable(), t.classify(err))
	}
	if !exists {
		return nil, nil
	}
	var since *time.Time
	var pending bool
	if err := q.QueryRow(ctx, t.resets(resetsHoldSQL), retention.Seconds()).Scan(&since, &pending); err != nil {
		return nil, fmt.Errorf("reading stream resets from %s: %w", t.StreamResetsTable(), t.classify(err))
	}
	if since == nil {
		return nil, nil
	}
	return &Hold{Since: *since, Pending: pending}, nil
}

// holdSince is the start of what h holds; nil for none.
func (h *Hold) holdSince() *time.Time {
	if h == nil {
		return nil
	}
	return &h.Since
}

// ResetsPendingError is the cleanup by age of a logical replication relay's
// table refusing while a stream reset waits for a replay, or was replayed
// less than the retention ago: that replay republishes every row created
// before the reset's end (a row's event may reach the stream hours after
// the row was created), so no row may go.
type ResetsPendingError struct {
	ResetsTable string    // where the reset is recorded
	Since       time.Time // the earliest window's start
	// Replayed: every reset held was replayed, less than Retention ago.
	Replayed  bool
	Retention time.Duration
}

func (e *ResetsPendingError) Error() string {
	if e.Replayed {
		return fmt.Sprintf("a stream reset since %s was replayed less than %s ago (see %s): "+
			"its rows stay a retention after the replay, for the replay of a second loss",
			e.Since.UTC().Format(time.RFC3339), e.Retention, e.ResetsTable)
	}
	return fmt.Sprintf("a stream reset since %s waits for a replay (relay replay --pending; see %s): "+
		"its rows stay until it is replayed", e.Since.UTC().Format(time.RFC3339), e.ResetsTable)
}

// PendingResets sums up the resets of one stream that no replay has
// covered yet. The zero value (Count 0) means the stream is intact as far
// as the relays know.
type PendingResets struct {
	// Count of resets recorded and not replayed.
	Count int64 `json:"count"`
	// WindowStart and WindowEnd are the union of their windows; nil when
	// Count is 0.
	WindowStart *time.Time `json:"windowStart,omitempty"`
	WindowEnd   *time.Time `json:"windowEnd,omitempty"`
	// LastDetected is the latest detection.
	LastDetected *time.Time `json:"lastDetected,omitempty"`
}

// PendingStreamResets reads the resets of stream not yet replayed. A
// missing stream-resets table means none.
func (t *Table) PendingStreamResets(ctx context.Context, q Querier, stream string) (PendingResets, error) {
	var p PendingResets
	err := q.QueryRow(ctx, t.resets(pendingStreamResetsSQL), stream).Scan(&p.Count, &p.WindowStart, &p.WindowEnd, &p.LastDetected)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == codeUndefinedTable { // no reset was ever recorded
		return PendingResets{}, nil
	}
	if err != nil {
		return PendingResets{}, fmt.Errorf("reading stream resets from %s: %w", t.StreamResetsTable(), t.classify(err))
	}
	return p, nil
}

// MarkStreamResetsReplayed marks the resets of stream whose window (its end
// included) lies within [since, until) and that were detected before (PostgreSQL's clock:
// a replay's start) as replayed, and returns how many. A reset detected
// since may have lost entries the replay added before it. A missing table
// means none.
func (t *Table) MarkStreamResetsReplayed(ctx context.Context, q Querier, stream string, since, until, before time.Time) (int64, error) {
	tag, err := q.Exec(ctx, t.resets(markStreamResetsReplayedSQL), stream, since, until, before)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == codeUndefinedTable {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("marking stream resets replayed in %s: %w", t.StreamResetsTable(), err)
	}
	return tag.RowsAffected(), nil
}

// Dispatched reads the rows dispatched at or after since and before until,
// in (created_at, id) order, and hands them to fn in pages within page
// (rows, and bytes: a pager). It runs one statement whose rows are
// streamed, so memory stays bounded by a page; the rows are read from one
// snapshot, so cleanup deleting them meanwhile changes nothing. fn runs
// while the statement's rows are read: it must not use q. fn's error stops
// the read.
func (t *Table) Dispatched(ctx context.Context, q Querier, since, until time.Time, page Limit, fn func([]Event) error) error {
	return t.readPages(ctx, q, dispatchedSQL, page, fn, since, until)
}

// Created is Dispatched by created_at instead: the rows created at or
// after since and before until, and every row without a created_at, in the
// same order and pages. They are what a relay of source LogicalReplication,
// which marks no row dispatched, published in a window. For a `timestamp
// without time zone` column the window widens by LocalTimeSkew on each
// side: such a value is the writer's wall time, read as UTC.
func (t *Table) Created(ctx context.Context, q Querier, since, until time.Time, page Limit, fn func([]Event) error) error {
	local, err := t.CreatedAtIsLocal(ctx, q)
	if err != nil {
		return err
	}
	if local {
		since, until = since.Add(-LocalTimeSkew), until.Add(LocalTimeSkew)
	}
	return t.readPages(ctx, q, createdSQL, page, fn, since, until)
}

// KeepsRowsBefore reports whether a row dispatched before since (by
// created_at with byCreated) is still in the table: a hint, not a proof.
// Cleanup deletes the rows past its retention, so when none older than
// since is left it has most likely reached into a replay's window from
// since (or the table holds nothing older); when one is left it most
// likely has not (a cleanup interrupted, or one that skipped rows another
// session held locked, can leave older rows behind). One scan of the table
// at most, like the replay's own.
func (t *Table) KeepsRowsBefore(ctx context.Context, q Querier, byCreated bool, since time.Time) (bool, error) {
	tmpl := olderDispatchedSQL
	if byCreated {
		tmpl = olderCreatedSQL
	}
	var kept bool
	if err := q.QueryRow(ctx, t.format(tmpl), since).Scan(&kept); err != nil {
		return false, t.classify(err)
	}
	return kept, nil
}

// readPages runs a statement (tmpl, whose %[14]s is where the key goes)
// that reads (id, type, payload, created_at) rows, and each row's key when
// the table has a key column (Event.Key: replayed entries of ordering
// PerKey carry it too), and hands them to fn in pages within page.
func (t *Table) readPages(ctx context.Context, q Querier, tmpl string, page Limit, fn func([]Event) error, args ...any) error {
	if page.Rows < 1 {
		return fmt.Errorf("page size %d: must be positive", page.Rows)
	}
	keyed := t.columns.Key != ""
	key := ""
	if keyed {
		key = t.format(replayKeyed, t.qKey)
	}
	p := newPager(t.columns, keyed, page, fn)
	_, err := p.scan(q.Query(ctx, t.format(tmpl, key), args...))
	switch {
	case p.failed:
		return err // fn's own
	case err != nil:
		return t.classify(err)
	}
	return p.flush()
}
