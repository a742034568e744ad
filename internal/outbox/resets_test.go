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

// TestStreamStateKeepsTheLaterView: of two relays that write what they saw
// of a stream at once (both stopping), the one that looked first may write
// last. Its older view must not replace the later one: a Redis that then
// lost the entries between the two would go back to the older last id,
// which the next relay would take for no reset. Ids compare as numbers,
// not text; a stream forgotten (seen gone) is written anew whatever its ids.
func TestStreamStateKeepsTheLaterView(t *testing.T) {
	t.Parallel()
	tbl := MustNew("app.outbox", Columns{})
	db := connect(t, tbl.DDL(DDLOptions{}))
	ctx := context.Background()
	write := func(id string, added int64, groups ...string) {
		t.Helper()
		require.NoError(t, tbl.WriteStreamState(ctx, db, StreamState{Stream: "s", LastID: id, EntriesAdded: added, Groups: groups}))
	}
	read := func() StreamState {
		t.Helper()
		s, ok, err := tbl.ReadStreamState(ctx, db, "s")
		require.NoError(t, err)
		require.True(t, ok)
		return s
	}

	write("1700000000000-5", 10)
	write("1700000000100-2", 20, "workers") // A's later look
	write("1700000000000-7", 12)            // B's older one, written last
	got := read()
	require.Equal(t, "1700000000100-2", got.LastID, "an older view replaced a later one")
	require.EqualValues(t, 20, got.EntriesAdded)

	write("1700000000100-2", 20, "workers", "audit") // the same id: the groups move on
	require.Equal(t, []string{"workers", "audit"}, read().Groups)
	write("1700000000100-10", 21) // seq 10 > 2 as numbers ("10" < "2" as text)
	require.Equal(t, "1700000000100-10", read().LastID)
	write("999999999999-0", 22) // fewer digits: an earlier ms as a number
	require.Equal(t, "1700000000100-10", read().LastID)
	write("", 0)
	require.Equal(t, "1700000000100-10", read().LastID, "an empty id is the lowest")

	require.NoError(t, tbl.ForgetStreamState(ctx, db, "s")) // seen gone: the stream made anew starts low
	write("5-0", 1)
	require.Equal(t, "5-0", read().LastID)
	write("9-0", 2)
	// A relay that saw the stream reset writes its view of the new one,
	// with earlier ids, over the row (never forgotten: it saw the new
	// stream before it wrote).
	require.NoError(t, tbl.WriteStreamState(ctx, db, StreamState{Stream: "s", LastID: "3-0", EntriesAdded: 1, Replace: true}))
	require.Equal(t, "3-0", read().LastID)
}
