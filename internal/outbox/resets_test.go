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
		_, err := tbl.RecordStreamReset(ctx, db, r)
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
		Groups: []string{"workers"}})
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
