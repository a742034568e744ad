package outbox

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestProgressAndBacklogSince: a slot's backlog is the rows created after
// its last published commit; without a progress row every row counts. The
// recorded commit never goes back, and a catch-up stays due until done.
func TestProgressAndBacklogSince(t *testing.T) {
	t.Parallel()
	tbl := MustNew("", Columns{})
	db := connect(t, tbl.DDL(DDLOptions{})+`
		INSERT INTO outbox_events (event_type, payload, created_at)
			SELECT 't', 'p' || g, '2026-01-01'::timestamptz + g * interval '1 minute' FROM generate_series(1, 10) g;`)
	ctx := context.Background()
	require.NoError(t, tbl.EnsureProgressTable(ctx, db))

	b, err := tbl.BacklogSince(ctx, db, "s", 0)
	require.NoError(t, err)
	require.EqualValues(t, 10, b.Count, "no progress yet: every row")

	idStart, err := tbl.StartCatchUp(ctx, db, "s", true, nil)
	id := idStart.ID
	require.NoError(t, err)
	p, ok, err := tbl.ReadProgress(ctx, db, "s")
	require.NoError(t, err)
	require.True(t, ok)
	require.True(t, p.CatchUpPending)
	require.Nil(t, p.LastCommit)

	at := func(m int) time.Time { return time.Date(2026, 1, 1, 0, m, 0, 0, time.UTC) }
	require.NoError(t, tbl.RecordProgress(ctx, db, "s", at(6), false, nil))
	p, _, err = tbl.ReadProgress(ctx, db, "s")
	require.NoError(t, err)
	require.True(t, p.CatchUpPending, "still due until a catch-up says done")
	ended, err := tbl.FinishCatchUp(ctx, db, "s", CatchUpSnapshot{At: at(4)}, id)
	require.NoError(t, err)
	require.True(t, ended)
	p, _, err = tbl.ReadProgress(ctx, db, "s")
	require.NoError(t, err)
	require.False(t, p.CatchUpPending)
	require.True(t, p.LastCommit.Equal(at(6)), "the commit never goes back: %s", p.LastCommit)

	b, err = tbl.BacklogSince(ctx, db, "s", 0)
	require.NoError(t, err)
	require.EqualValues(t, 4, b.Count, "rows 7 to 10")
	require.True(t, b.Oldest.Equal(at(7)), "oldest %s", b.Oldest)
	b, err = tbl.BacklogSince(ctx, db, "s", 2)
	require.NoError(t, err)
	require.EqualValues(t, 2, b.Count)
	require.True(t, b.Capped)

	// A catch-up's pages: from since, with no upper bound, and rows
	// without created_at first.
	_, err = db.Exec(ctx, `ALTER TABLE outbox_events ALTER COLUMN created_at DROP NOT NULL;
		INSERT INTO outbox_events (event_type, payload, created_at) VALUES ('t', 'null', NULL), ('t', 'future', now() + interval '1 day')`)
	require.NoError(t, err)
	since := at(3)
	var pages [][]string
	snapshot, err := tbl.CatchUp(ctx, db, &since, nil, Rows(4), func(page []Event) error {
		pages = append(pages, payloads(page))
		return nil
	})
	require.NoError(t, err)
	require.WithinDuration(t, time.Now(), snapshot.At, time.Minute)
	require.Positive(t, snapshot.Xmin)
	// FETCHes of 1, 2 and then 4 rows (the first small, before the rows' size is known).
	require.Equal(t, [][]string{{"null"}, {"p3", "p4"}, {"p5", "p6", "p7", "p8"}, {"p9", "p10", "future"}}, pages)
}

// TestCatchUpReadsOneSnapshot: a row committed while a catch-up pages
// through the table is not read (the stream has it), and one committed
// before is, whatever its created_at.
func TestCatchUpReadsOneSnapshot(t *testing.T) {
	t.Parallel()
	tbl := MustNew("", Columns{})
	db := connect(t, tbl.DDL(DDLOptions{})+`
		INSERT INTO outbox_events (event_type, payload) SELECT 't', 'p' || g FROM generate_series(1, 5) g;`)
	ctx := context.Background()
	var got []string
	_, err := tbl.CatchUp(ctx, db, nil, nil, Rows(2), func(page []Event) error {
		got = append(got, payloads(page)...)
		_, err := db.Exec(ctx, `INSERT INTO outbox_events (event_type, payload, created_at) VALUES ('t', 'late', '2000-01-01')`)
		return err
	})
	require.NoError(t, err)
	require.ElementsMatch(t, []string{"p1", "p2", "p3", "p4", "p5"}, got)
}

// TestCatchUpAndCleanupOfALocalTimeColumn: with a `timestamp without time
// zone` created_at, written in a TimeZone west of UTC, rows look hours
// older than they are: the catch-up reaches back LocalTimeSkew further,
// and DeleteStreamed keeps them.
func TestCatchUpAndCleanupOfALocalTimeColumn(t *testing.T) {
	t.Parallel()
	tbl := MustNew("", Columns{})
	db := connect(t, `CREATE TABLE outbox_events (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), event_type text NOT NULL,
			payload text NOT NULL, created_at timestamp NOT NULL DEFAULT now(), dispatched_at timestamp);
		BEGIN; SET LOCAL TimeZone = 'America/New_York';
		INSERT INTO outbox_events (event_type, payload) VALUES ('t', 'new york');
		COMMIT;`)
	ctx := context.Background()
	local, err := tbl.CreatedAtIsLocal(ctx, db)
	require.NoError(t, err)
	require.True(t, local)
	now, err := Now(ctx, db)
	require.NoError(t, err)
	since, err := tbl.CatchUpSince(ctx, db, new(now.Add(-time.Minute)))
	require.NoError(t, err)
	require.True(t, since.Equal(now.Add(-time.Minute-LocalTimeSkew)))
	var got []string
	_, err = tbl.CatchUp(ctx, db, since, nil, Rows(10), func(page []Event) error {
		got = append(got, payloads(page)...)
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, []string{"new york"}, got)

	require.NoError(t, tbl.EnsureProgressTable(ctx, db))
	require.NoError(t, tbl.RecordProgress(ctx, db, "s", now, true, nil))
	logProgress(t, tbl, db, time.Hour, now.Add(-time.Hour))
	n, _, err := tbl.DeleteStreamed(ctx, db, "s", time.Minute, time.Minute, 10)
	require.NoError(t, err)
	require.Zero(t, n, "written a minute ago in New York, the row looks 5 hours old: kept")

	tz := MustNew("", Columns{})
	db2 := connect(t, tz.DDL(DDLOptions{}))
	local, err = tz.CreatedAtIsLocal(ctx, db2)
	require.NoError(t, err)
	require.False(t, local, "timestamptz")
}

// TestDeleteStreamed: the cleanup by age of a logical replication relay's
// table deletes rows older than the retention, never those within the
// margin before the slot's last published commit, nothing without a
// recorded commit, and nothing while a stream reset waits for its replay.
func TestDeleteStreamed(t *testing.T) {
	t.Parallel()
	tbl := MustNew("", Columns{})
	db := connect(t, tbl.DDL(DDLOptions{})+`
		INSERT INTO outbox_events (event_type, payload, created_at)
			SELECT 't', 'p' || g, now() - g * interval '1 hour' FROM generate_series(1, 10) g;`)
	ctx := context.Background()
	require.NoError(t, tbl.EnsureProgressTable(ctx, db))
	_, _, err := tbl.DeleteStreamed(ctx, db, "s", time.Hour, time.Minute, 3)
	require.ErrorIs(t, err, ErrNoProgress)

	now, err := Now(ctx, db)
	require.NoError(t, err)
	// Published up to 5h30 ago: with a margin of 1h, rows up to 6h30 ago may go.
	require.NoError(t, tbl.RecordProgress(ctx, db, "s", now.Add(-330*time.Minute), true, nil))
	_, _, err = tbl.DeleteStreamed(ctx, db, "s", 2*time.Hour, time.Hour, 3)
	var young *YoungProgressError
	require.ErrorAs(t, err, &young, "no progress logged 2 hours ago: nothing known published that long ago")
	logProgress(t, tbl, db, 3*time.Hour, now.Add(-330*time.Minute))
	// What the caller checks before each batch stops the deletes there (a
	// table that joined the outbox table meanwhile).
	joined := errors.New("a table joined")
	batches := 0
	n, _, err := tbl.DeleteStreamed(ctx, db, "s", 2*time.Hour, time.Hour, 3, func(context.Context) error {
		if batches++; batches > 1 {
			return joined
		}
		return nil
	})
	require.ErrorIs(t, err, joined)
	require.EqualValues(t, 3, n, "one batch, then stopped")
	n, cutoff, err := tbl.DeleteStreamed(ctx, db, "s", 2*time.Hour, time.Hour, 3)
	require.NoError(t, err)
	require.EqualValues(t, 1, n, "the rest of the rows 7h to 10h old")
	require.WithinDuration(t, now.Add(-390*time.Minute), cutoff, time.Second)
	var left int
	require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM outbox_events`).Scan(&left))
	require.Equal(t, 6, left)

	// A stream reset waiting for its replay, which republishes every row
	// created before its end: nothing is deleted until it is replayed.
	require.NoError(t, tbl.RecordProgress(ctx, db, "s", now, true, nil))
	logProgress(t, tbl, db, 100*time.Minute, now.Add(-100*time.Minute))
	recordReset(t, tbl, db, time.Minute)
	n, _, err = tbl.DeleteStreamed(ctx, db, "s", 90*time.Minute, time.Minute, 100)
	var held *ResetsPendingError
	require.ErrorAs(t, err, &held)
	require.ErrorContains(t, err, "relay replay --pending")
	require.Zero(t, n)
	_, err = tbl.MarkStreamResetsReplayed(ctx, db, "s", time.Unix(0, 0), time.Now().Add(time.Hour), time.Now().Add(time.Hour))
	require.NoError(t, err)
	// Replayed: its rows stay a retention after the replay, for the replay
	// of a second loss, which reaches back to this one's window.
	n, _, err = tbl.DeleteStreamed(ctx, db, "s", 90*time.Minute, time.Minute, 100)
	require.ErrorAs(t, err, &held)
	require.True(t, held.Replayed)
	require.ErrorContains(t, err, "was replayed less than 1h30m0s ago")
	require.Zero(t, n)
	_, err = db.Exec(ctx, `UPDATE outbox_events_stream_resets SET replayed_at = replayed_at - interval '91 minutes'`)
	require.NoError(t, err)
	n, _, err = tbl.DeleteStreamed(ctx, db, "s", 90*time.Minute, time.Minute, 100)
	require.NoError(t, err)
	require.EqualValues(t, 5, n, "replayed: the rows 2 to 6 hours old")
}

// TestDeleteStreamedStopsAtAResetRecordedMeanwhile: a stream reset recorded
// while cleanup --slot deletes in batches holds the rest: a slot relay's
// replay republishes every row created before the window's end, so the
// next batch must not delete them. The hold was read once, before the first
// batch.
func TestDeleteStreamedStopsAtAResetRecordedMeanwhile(t *testing.T) {
	t.Parallel()
	tbl := MustNew("", Columns{})
	db := connect(t, tbl.DDL(DDLOptions{})+`
		INSERT INTO outbox_events (event_type, payload, created_at)
			SELECT 't', 'p' || g, now() - g * interval '1 hour' FROM generate_series(1, 10) g;`)
	ctx := context.Background()
	require.NoError(t, tbl.EnsureProgressTable(ctx, db))
	require.NoError(t, tbl.EnsureStreamResetsTable(ctx, db))
	now, err := Now(ctx, db)
	require.NoError(t, err)
	require.NoError(t, tbl.RecordProgress(ctx, db, "s", now, true, nil))
	logProgress(t, tbl, db, 3*time.Hour, now.Add(-time.Hour))

	batches := 0
	n, _, err := tbl.DeleteStreamed(ctx, db, "s", 2*time.Hour, time.Minute, 2, func(context.Context) error {
		if batches++; batches == 2 {
			recordReset(t, tbl, db, time.Minute) // Redis lost the stream during the deletes
		}
		return nil
	})
	var held *ResetsPendingError
	require.ErrorAs(t, err, &held, "deleted %d rows past a reset recorded after the first batch", n)
	require.EqualValues(t, 2, n, "one batch, then held")
}

// TestCatchUpEndsOnlyItsOwn: relay A catches up on slot #1; the slot is
// lost and relay B, making #2, records a catch-up of its own due; B stops
// before it ends. A's catch-up ending late must leave B's due (its rows,
// committed between A's snapshot and #2, are in no stream), and a relay
// that then takes #2 does B's catch-up, whose end is its own.
func TestCatchUpEndsOnlyItsOwn(t *testing.T) {
	t.Parallel()
	tbl := MustNew("", Columns{})
	db := connect(t, tbl.DDL(DDLOptions{}))
	ctx := context.Background()
	require.NoError(t, tbl.EnsureProgressTable(ctx, db))
	at := func(m int) time.Time { return time.Date(2026, 1, 1, 0, m, 0, 0, time.UTC) }

	aStart, err := tbl.StartCatchUp(ctx, db, "s", true, nil) // A: slot #1 made
	a := aStart.ID
	require.NoError(t, err)
	bStart, err := tbl.StartCatchUp(ctx, db, "s", true, nil) // B: #1 lost, #2 made
	b := bStart.ID
	require.NoError(t, err)
	require.NotEqual(t, a, b)
	ended, err := tbl.FinishCatchUp(ctx, db, "s", CatchUpSnapshot{At: at(1)}, a) // A ends late
	require.NoError(t, err)
	require.False(t, ended)
	p, _, err := tbl.ReadProgress(ctx, db, "s")
	require.NoError(t, err)
	require.True(t, p.CatchUpPending, "B's catch-up is still due")
	require.Equal(t, b, p.CatchUpID)
	require.True(t, p.LastCommit.Equal(at(1)), "what A read is published: %s", p.LastCommit)

	// A standby waiting for #2 while B catches up records the same one due;
	// the relay that takes #2 after B stopped does it and ends it.
	cStart, err := tbl.StartCatchUp(ctx, db, "s", false, nil)
	c := cStart.ID
	require.NoError(t, err)
	require.Equal(t, b, c)
	require.NoError(t, tbl.RecordProgress(ctx, db, "s", at(2), true, nil), "progress alone ends no catch-up with an id")
	p, _, err = tbl.ReadProgress(ctx, db, "s")
	require.NoError(t, err)
	require.True(t, p.CatchUpPending)
	ended, err = tbl.FinishCatchUp(ctx, db, "s", CatchUpSnapshot{At: at(3)}, c)
	require.NoError(t, err)
	require.True(t, ended)
	p, _, err = tbl.ReadProgress(ctx, db, "s")
	require.NoError(t, err)
	require.False(t, p.CatchUpPending)
	require.True(t, p.LastCommit.Equal(at(3)))

	// Done, a catch-up due again (the slot exists: say the progress was
	// reset) gets a new id; the old one ends nothing.
	dStart, err := tbl.StartCatchUp(ctx, db, "s", false, nil)
	d := dStart.ID
	require.NoError(t, err)
	require.NotEqual(t, c, d)
	ended, err = tbl.FinishCatchUp(ctx, db, "s", CatchUpSnapshot{At: at(4)}, c)
	require.NoError(t, err)
	require.False(t, ended)
	ended, err = tbl.FinishCatchUp(ctx, db, "other", CatchUpSnapshot{At: at(4)}, d)
	require.NoError(t, err)
	require.False(t, ended, "a slot without a row")
}

// TestProgressTableOfAnEarlierVersionIsUpgraded: a progress table made
// without catch_up_id gets it; a catch-up recorded due by an earlier
// version (no id) is done again under an id of its own.
func TestProgressTableOfAnEarlierVersionIsUpgraded(t *testing.T) {
	t.Parallel()
	tbl := MustNew("app.outbox", Columns{})
	db := connect(t, tbl.DDL(DDLOptions{})+`
		CREATE TABLE app.outbox_relay_progress (
			slot text PRIMARY KEY,
			last_commit timestamptz NULL,
			catch_up_pending boolean NOT NULL DEFAULT false,
			updated_at timestamptz NOT NULL DEFAULT now()
		);
		INSERT INTO app.outbox_relay_progress (slot, catch_up_pending) VALUES ('s', true);`)
	ctx := context.Background()
	require.NoError(t, tbl.EnsureProgressTable(ctx, db))
	require.NoError(t, tbl.EnsureProgressTable(ctx, db), "twice")
	p, ok, err := tbl.ReadProgress(ctx, db, "s")
	require.NoError(t, err)
	require.True(t, ok)
	require.True(t, p.CatchUpPending)
	require.Zero(t, p.CatchUpID)

	idStart, err := tbl.StartCatchUp(ctx, db, "s", false, nil)
	id := idStart.ID
	require.NoError(t, err)
	require.NotZero(t, id)
	ended, err := tbl.FinishCatchUp(ctx, db, "s", CatchUpSnapshot{At: time.Now()}, id)
	require.NoError(t, err)
	require.True(t, ended)
}

// TestXminHorizon: progress samples the oldest running transaction and
// makes the sample the slot's horizon once a commit a second after it is
// recorded; a catch-up reads the rows of transactions at or after the
// horizon whatever their created_at, and cleanup keeps them.
func TestXminHorizon(t *testing.T) {
	t.Parallel()
	tbl := MustNew("", Columns{})
	db := connect(t, tbl.DDL(DDLOptions{}))
	ctx := context.Background()
	require.NoError(t, tbl.EnsureProgressTable(ctx, db))
	horizon := func() *int64 {
		t.Helper()
		p, ok, err := tbl.ReadProgress(ctx, db, "s")
		require.NoError(t, err)
		require.True(t, ok)
		return p.XminHorizon
	}

	// A transaction begins, inserts a row dated long ago, and runs on.
	long, err := db.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = long.Rollback(ctx) }()
	var longXID int64
	require.NoError(t, long.QueryRow(ctx, `INSERT INTO outbox_events (event_type, payload, created_at)
		VALUES ('t', 'long', '2020-01-01') RETURNING pg_current_xact_id()::text::bigint`).Scan(&longXID))

	now, err := Now(ctx, db)
	require.NoError(t, err)
	require.NoError(t, tbl.RecordProgress(ctx, db, "s", now.Add(-time.Hour), false, nil)) // sampled
	require.Nil(t, horizon(), "a sample is not a horizon")
	require.NoError(t, tbl.RecordProgress(ctx, db, "s", now, false, nil))
	require.Nil(t, horizon(), "no commit a second after the sample yet")
	require.NoError(t, tbl.RecordProgress(ctx, db, "s", now.Add(2*time.Second), false, nil))
	h := horizon()
	require.NotNil(t, h, "a commit a second after the sample: the sample is the horizon")
	require.LessOrEqual(t, *h, longXID, "the long transaction ran at the sample")
	require.NoError(t, long.Commit(ctx))

	// The long transaction's row is read by a catch-up from now, and kept by
	// a cleanup that deletes everything created before an hour from now.
	read := func(h *int64) []string {
		t.Helper()
		var payloads []string
		since := now.Add(time.Minute)
		_, err := tbl.CatchUp(ctx, db, &since, h, Rows(10), func(page []Event) error {
			for _, e := range page {
				payloads = append(payloads, e.Payload)
			}
			return nil
		})
		require.NoError(t, err)
		return payloads
	}
	require.Equal(t, []string{"long"}, read(h))
	require.Empty(t, read(nil), "without a horizon the bound alone")

	// A catch-up done makes its snapshot's oldest running transaction the
	// horizon: a transaction after it is read, one before it not.
	_, err = db.Exec(ctx, `INSERT INTO outbox_events (event_type, payload, created_at) VALUES ('t', 'before', '2020-01-01')`)
	require.NoError(t, err)
	snap, err := tbl.CatchUp(ctx, db, nil, nil, Rows(10), func([]Event) error { return nil })
	require.NoError(t, err)
	var after int64 // as if the oldest transaction running at the snapshot
	require.NoError(t, db.QueryRow(ctx, `INSERT INTO outbox_events (event_type, payload, created_at)
		VALUES ('t', 'after', '2020-01-01') RETURNING pg_current_xact_id()::text::bigint`).Scan(&after))
	require.LessOrEqual(t, snap.Xmin, after)
	idStart, err := tbl.StartCatchUp(ctx, db, "s", false, nil)
	id := idStart.ID
	require.NoError(t, err)
	_, err = tbl.FinishCatchUp(ctx, db, "s", CatchUpSnapshot{At: snap.At, Xmin: after}, id)
	require.NoError(t, err)
	h = horizon()
	require.NotNil(t, h)
	require.Equal(t, after, *h)
	require.Equal(t, []string{"after"}, read(h))
	ancient := after - 3_000_000_000 // more than 2^31 transactions before
	require.ElementsMatch(t, []string{"after", "before", "long"}, read(&ancient), "every row is after a horizon that old")

	// Cleanup by age keeps the row at the horizon, deletes the others.
	n, _, err := tbl.DeleteStreamed(ctx, db, "s", time.Nanosecond, time.Nanosecond, 10)
	require.NoError(t, err)
	require.EqualValues(t, 2, n, "long and before")
	require.Equal(t, []string{"after"}, payloadsLeft(t, db))
}

// logProgress adds an entry to the progress log of slot "s", as if its
// relay had logged lastCommit ago (without an xmin horizon).
func logProgress(t *testing.T, tbl *Table, db Querier, ago time.Duration, lastCommit time.Time) {
	t.Helper()
	_, err := db.Exec(context.Background(), tbl.progress(`INSERT INTO %[15]s (slot, recorded_at, last_commit)
		VALUES ('s', now() - make_interval(secs => $1), $2)`), ago.Seconds(), lastCommit)
	require.NoError(t, err)
}

// TestDeleteStreamedKeepsRowsPublishedWithinTheRetention: a row created
// three hours ago and published a moment ago (its relay lagged, or a
// catch-up read it) stays a retention after it was published: a stream
// reset in that time is replayed from the table. A review found it deleted
// by the next cleanup, by its created_at alone.
func TestDeleteStreamedKeepsRowsPublishedWithinTheRetention(t *testing.T) {
	t.Parallel()
	tbl := MustNew("", Columns{})
	db := connect(t, tbl.DDL(DDLOptions{})+`
		INSERT INTO outbox_events (event_type, payload, created_at) VALUES ('t', 'late', now() - interval '3 hours'),
			('t', 'old', now() - interval '6 hours');`)
	ctx := context.Background()
	require.NoError(t, tbl.EnsureProgressTable(ctx, db))
	now, err := Now(ctx, db)
	require.NoError(t, err)
	// An hour ago the relay had published up to 4 hours ago; now, to now.
	logProgress(t, tbl, db, time.Hour, now.Add(-4*time.Hour))
	require.NoError(t, tbl.RecordProgress(ctx, db, "s", now, true, nil))
	n, cutoff, err := tbl.DeleteStreamed(ctx, db, "s", time.Hour, time.Minute, 10)
	require.NoError(t, err)
	require.EqualValues(t, 1, n, "the row published more than an hour ago")
	require.WithinDuration(t, now.Add(-4*time.Hour-time.Minute), cutoff, time.Second)
	require.Equal(t, []string{"late"}, payloadsLeft(t, db))
	var logged int
	require.NoError(t, db.QueryRow(ctx, tbl.progress(`SELECT count(*) FROM %[15]s`)).Scan(&logged))
	require.Equal(t, 2, logged, "the entry used and the one RecordProgress logged")
}

// payloadsLeft lists the payloads of the rows left in outbox_events.
func payloadsLeft(t *testing.T, db Querier) []string {
	t.Helper()
	var left []string
	rows, err := db.Query(context.Background(), `SELECT payload FROM outbox_events`)
	require.NoError(t, err)
	for rows.Next() {
		var p string
		require.NoError(t, rows.Scan(&p))
		left = append(left, p)
	}
	require.NoError(t, rows.Err())
	return left
}

// A publication's gap: StartCatchUp lowers the horizon to the last look
// before the change, records the new fingerprint and waits for the
// transactions running now; its FinishCatchUp records no progress, and
// RecordProgress records the looks.
func TestCatchUpOfAPublicationsGap(t *testing.T) {
	t.Parallel()
	tbl := MustNew("", Columns{})
	db := connect(t, tbl.DDL(DDLOptions{}))
	ctx := context.Background()
	require.NoError(t, tbl.EnsureProgressTable(ctx, db))
	read := func() Progress {
		t.Helper()
		p, ok, err := tbl.ReadProgress(ctx, db, "s")
		require.NoError(t, err)
		require.True(t, ok)
		return p
	}
	var xid int64
	require.NoError(t, db.QueryRow(ctx, `SELECT pg_current_xact_id()::text::bigint`).Scan(&xid))
	now := time.Now().UTC().Truncate(time.Microsecond)
	look := PublicationSeen{Fingerprint: "1:700|2:701|", Xmin: ptr(xid)}
	require.NoError(t, tbl.RecordProgress(ctx, db, "s", now, false, &look))
	p := read()
	require.Equal(t, look.Fingerprint, p.Publication.Fingerprint)
	require.Equal(t, xid, *p.Publication.Xmin)
	require.NoError(t, tbl.RecordProgress(ctx, db, "s", now.Add(time.Second), false, nil))
	require.Equal(t, look.Fingerprint, read().Publication.Fingerprint, "no look: kept")

	// Another session's transaction runs across the change.
	other, err := db.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = other.Rollback(ctx) }()
	var otherXid int64
	require.NoError(t, other.QueryRow(ctx, `SELECT pg_current_xact_id()::text::bigint`).Scan(&otherXid))

	start, err := tbl.StartCatchUp(ctx, db, "s", false, &PublicationSeen{Fingerprint: "3:900|4:901|", Xmin: ptr(xid - 5)})
	require.NoError(t, err)
	require.NotNil(t, start.Horizon)
	require.Equal(t, xid-5, *start.Horizon, "lowered to the look before the change")
	require.NotNil(t, start.After)
	require.Greater(t, *start.After, otherXid, "waits for the transaction running at the change")
	ended, err := tbl.TransactionsEndedBelow(ctx, db, *start.After)
	require.NoError(t, err)
	require.False(t, ended)
	require.NoError(t, other.Rollback(ctx))
	_, err = tbl.StartCatchUp(ctx, db, "s", false, &PublicationSeen{Fingerprint: "5:1|", Xmin: ptr(xid)})
	require.ErrorIs(t, err, ErrCatchUpPending, "a gap does not take over a catch-up due")
	p = read()
	require.True(t, p.CatchUpPending)
	require.Equal(t, "3:900|4:901|", p.Publication.Fingerprint)

	done, err := tbl.FinishCatchUp(ctx, db, "s", CatchUpSnapshot{}, start.ID)
	require.NoError(t, err)
	require.True(t, done)
	p = read()
	require.False(t, p.CatchUpPending)
	require.True(t, p.LastCommit.Equal(now.Add(time.Second)), "no progress recorded: %v", p.LastCommit)
	require.Equal(t, xid-5, *p.XminHorizon, "the horizon stays")
}

func ptr[T any](v T) *T { return &v }

// A gap of the publication found and not recorded yet (the relay reports a
// publication without inserts until it is fixed) reads from the last
// confirmed look: cleanup keeps the rows at or after it, however old their
// created_at (a long transaction's).
func TestDeleteStreamedKeepsRowsAfterTheLastConfirmedLook(t *testing.T) {
	t.Parallel()
	tbl := MustNew("", Columns{})
	db := connect(t, tbl.DDL(DDLOptions{}))
	ctx := context.Background()
	require.NoError(t, tbl.EnsureProgressTable(ctx, db))
	var look int64
	require.NoError(t, db.QueryRow(ctx, `SELECT pg_current_xact_id()::text::bigint`).Scan(&look))
	_, err := db.Exec(ctx, `INSERT INTO outbox_events (event_type, payload, created_at) VALUES ('t', 'long', now() - interval '6 hours')`)
	require.NoError(t, err)
	now, err := Now(ctx, db)
	require.NoError(t, err)
	logProgress(t, tbl, db, 2*time.Hour, now)
	require.NoError(t, tbl.RecordProgress(ctx, db, "s", now, true, &PublicationSeen{Fingerprint: "p1:1", Xmin: ptr(look + 1)}))
	n, _, err := tbl.DeleteStreamed(ctx, db, "s", time.Hour, time.Minute, 10)
	require.NoError(t, err)
	require.Zero(t, n, "the row inserted after the last confirmed look stays")
	require.Equal(t, []string{"long"}, payloadsLeft(t, db))
}
