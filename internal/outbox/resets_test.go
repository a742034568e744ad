package outbox

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestAwaitedGroups: a reset records the consumer groups the stream had;
// they are awaited (for trimming) until recorded back, per stream; a reset
// without groups awaits none. A stream-resets table of an earlier version
// gets the group columns.
func TestAwaitedGroups(t *testing.T) {
	t.Parallel()
	tbl := MustNew("app.outbox", Columns{})
	db := connect(t, tbl.DDL(DDLOptions{})+`
		DROP TABLE app.outbox_stream_resets;
		CREATE TABLE app.outbox_stream_resets `+earlierResetsColumns+`
		INSERT INTO app.outbox_stream_resets (stream, window_start, window_end, reason) VALUES ('s', now(), now(), 'old');`)
	ctx := context.Background()
	require.NoError(t, tbl.EnsureStreamResetsTable(ctx, db))
	require.NoError(t, tbl.EnsureStreamResetsTable(ctx, db), "twice")

	groups, resets, err := tbl.AwaitedGroups(ctx, db, "s")
	require.NoError(t, err)
	require.Empty(t, groups, "a reset of an earlier version awaits no group")
	require.Empty(t, resets)

	now := time.Now()
	for _, r := range []StreamReset{
		{Stream: "s", Groups: []string{"workers", "audit"}},
		{Stream: "s", Groups: []string{"audit", "billing"}},
		{Stream: "s"},
		{Stream: "other", Groups: []string{"x"}},
	} {
		r.WindowStart, r.WindowEnd, r.Reason = now, now, "test"
		_, err := tbl.RecordStreamReset(ctx, db, r, now)
		require.NoError(t, err)
	}
	groups, resets, err = tbl.AwaitedGroups(ctx, db, "s")
	require.NoError(t, err)
	require.Equal(t, []string{"workers", "audit", "billing"}, groups)
	require.Len(t, resets, 2)

	require.NoError(t, tbl.GroupsBack(ctx, db, resets))
	groups, _, err = tbl.AwaitedGroups(ctx, db, "s")
	require.NoError(t, err)
	require.Empty(t, groups)
	groups, _, err = tbl.AwaitedGroups(ctx, db, "other")
	require.NoError(t, err)
	require.Equal(t, []string{"x"}, groups, "another stream's")
	require.NoError(t, tbl.GroupsBack(ctx, db, nil))

	_, err = db.Exec(ctx, `DROP TABLE app.outbox_stream_resets`)
	require.NoError(t, err)
	groups, _, err = tbl.AwaitedGroups(ctx, db, "s")
	require.NoError(t, err)
	require.Empty(t, groups, "no table: none")
}

// TestResetRecordedInATableOfAnEarlierVersion: a stream-resets table made
// by an earlier version, which the relay's role cannot alter (relay schema
// --apply was run by its owner), still gets the reset, without its groups;
// no groups are awaited from it.
func TestResetRecordedInATableOfAnEarlierVersion(t *testing.T) {
	t.Parallel()
	tbl := MustNew("", Columns{})
	db := connect(t, tbl.DDL(DDLOptions{})+`
		DROP TABLE outbox_events_stream_resets;
		CREATE TABLE outbox_events_stream_resets `+earlierResetsColumns)
	ctx := context.Background()
	now := time.Now()
	r, err := tbl.RecordStreamReset(ctx, db, StreamReset{Stream: "s", WindowStart: now, WindowEnd: now, Reason: "test",
		Groups: []string{"workers"}}, now)
	require.NoError(t, err)
	require.Positive(t, r.RunningBelow)
	p, err := tbl.PendingStreamResets(ctx, db, "s")
	require.NoError(t, err)
	require.EqualValues(t, 1, p.Count)
	groups, _, err := tbl.AwaitedGroups(ctx, db, "s")
	require.NoError(t, err)
	require.Empty(t, groups)
}

// earlierResetsColumns are the columns of a stream-resets table made by a
// version before the consumer groups were recorded.
const earlierResetsColumns = `(id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, stream text NOT NULL,
	detected_at timestamptz NOT NULL DEFAULT now(), window_start timestamptz NOT NULL, window_end timestamptz NOT NULL,
	reason text NOT NULL, replayed_at timestamptz NULL);`

// TestResetWindowRecordedOnPostgresClock: a reset's window comes from the
// relay's clock and selects rows by dispatched_at, PostgreSQL's. Recorded
// by a relay whose clock is ten minutes ahead, it starts ten minutes
// earlier; by one behind, where it was (the wider window). Both in a table
// of this version and one of an earlier version. One machine has one
// clock: the relay's reading is given ahead and behind.
func TestResetWindowRecordedOnPostgresClock(t *testing.T) {
	t.Parallel()
	for name, ddl := range map[string]string{
		"this version":    "",
		"earlier version": "DROP TABLE outbox_events_stream_resets; CREATE TABLE outbox_events_stream_resets " + earlierResetsColumns,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			tbl := MustNew("", Columns{})
			db := connect(t, tbl.DDL(DDLOptions{})+ddl)
			ctx := context.Background()
			start := time.Now().Add(-time.Minute).Truncate(time.Microsecond)
			for _, c := range []struct {
				skew      time.Duration // the relay's clock against PostgreSQL's
				wantStart time.Time
			}{
				{10 * time.Minute, start.Add(-10 * time.Minute)},
				{-10 * time.Minute, start},
			} {
				r, err := tbl.RecordStreamReset(ctx, db, StreamReset{Stream: "s", WindowStart: start, WindowEnd: start,
					Reason: "test"}, time.Now().Add(c.skew))
				require.NoError(t, err)
				// Less the time between the relay's reading and PostgreSQL's.
				require.WithinDuration(t, c.wantStart, r.WindowStart, time.Second, "relay clock %s", c.skew)
				require.False(t, r.ReachedBack)
				require.False(t, r.WindowEnd.Before(start))
			}
			// A replay since the window began: the window reaches back to its start.
			_, err := tbl.RecordReplay(ctx, db, "s", start.Add(-time.Hour), start, "test")
			require.NoError(t, err)
			r, err := tbl.RecordStreamReset(ctx, db, StreamReset{Stream: "s", WindowStart: start, WindowEnd: start,
				Reason: "test"}, time.Now())
			require.NoError(t, err)
			require.True(t, r.ReachedBack)
			require.True(t, r.WindowStart.Equal(start.Add(-time.Hour)), "%s", r.WindowStart)
		})
	}
}
