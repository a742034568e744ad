package logical

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outbox-dev/outbox-operator/internal/outbox"
	"github.com/outbox-dev/outbox-operator/internal/testenv"
)

// Every change to what the publication publishes of the table gives another
// fingerprint, even one undone at once; a child added to it does not.
func TestLookPublicationFingerprint(t *testing.T) {
	t.Parallel()
	b := setup(t, testenv.Postgres(t), "", outbox.Columns{}, "")
	ctx, db, o := b.ctx, b.db, b.opts
	look := func() Look {
		t.Helper()
		l, err := LookPublication(ctx, db, o)
		require.NoError(t, err)
		return l
	}
	exec := func(sql string) {
		t.Helper()
		_, err := db.Exec(ctx, sql)
		require.NoError(t, err)
	}
	first := look()
	require.True(t, first.Exists && first.Inserts && first.Covered, "%+v", first)
	require.NoError(t, first.Problem(o))
	require.NotEmpty(t, first.Fingerprint)
	require.Equal(t, first.Fingerprint, look().Fingerprint, "nothing changed")

	exec(`CREATE TABLE outbox_child () INHERITS (outbox_events)`)
	exec(`ALTER PUBLICATION outbox_events_pub ADD TABLE ONLY outbox_child`)
	withChild := look()
	require.NotEqual(t, first.Fingerprint, withChild.Fingerprint, "the child's entry")
	require.False(t, withChild.DropsFrom(first.Fingerprint), "a child added drops nothing")
	exec(`ALTER PUBLICATION outbox_events_pub DROP TABLE ONLY outbox_child`)
	exec(`ALTER PUBLICATION outbox_events_pub ADD TABLE ONLY outbox_child`)
	childBack := look()
	require.True(t, childBack.DropsFrom(withChild.Fingerprint), "the child dropped and added back")
	require.False(t, childBack.DropsFrom(first.Fingerprint), "the table's own entries are those of the first look")
	exec(`DROP TABLE outbox_child`)
	require.False(t, look().DropsFrom(childBack.Fingerprint), "a child dropped is no longer the outbox's")
	first = childBack

	steps := []struct {
		sql     string
		problem bool
	}{
		{`ALTER PUBLICATION outbox_events_pub DROP TABLE ONLY outbox_events`, true},
		{`ALTER PUBLICATION outbox_events_pub ADD TABLE ONLY outbox_events`, false},
		{`ALTER PUBLICATION outbox_events_pub SET (publish = 'update')`, true},
		{`ALTER PUBLICATION outbox_events_pub SET (publish = 'insert')`, false},
		{`DROP PUBLICATION outbox_events_pub`, true},
		{`CREATE PUBLICATION outbox_events_pub FOR TABLE outbox_events WITH (publish = 'insert')`, false},
	}
	seen := map[string]string{first.Fingerprint: "first"}
	for _, s := range steps {
		exec(s.sql)
		l := look()
		if s.problem {
			require.ErrorIs(t, l.Problem(o), ErrPublicationChanged, s.sql)
		} else {
			require.NoError(t, l.Problem(o), s.sql)
		}
		prev, dup := seen[l.Fingerprint]
		require.False(t, dup, "after %s: the fingerprint of %q", s.sql, prev)
		seen[l.Fingerprint] = s.sql
		require.True(t, l.DropsFrom(first.Fingerprint), "after %s: an entry of the first look is gone", s.sql)
		require.NotZero(t, l.Xmin)
		require.Greater(t, l.Next, l.Xmin-1)
	}

	// A row filter is refused as Setup refuses it.
	exec(`ALTER PUBLICATION outbox_events_pub SET TABLE outbox_events WHERE (event_type <> 'x')`)
	_, err := LookPublication(ctx, db, o)
	require.ErrorIs(t, err, ErrPublicationChanged)
	require.ErrorContains(t, err, "row filter")
}

// Another table swapped in under the table's name (renamed, or dropped and
// created again, by a migration) and listed again: the old table's entry
// left the tree, which alone drops nothing, but the slot skipped the
// inserts into the new table until it was listed, so its entry is a break.
func TestLookPublicationTableSwappedIn(t *testing.T) {
	t.Parallel()
	b := setup(t, testenv.Postgres(t), "", outbox.Columns{}, "")
	ctx, db, o := b.ctx, b.db, b.opts
	look := func() Look {
		t.Helper()
		l, err := LookPublication(ctx, db, o)
		require.NoError(t, err)
		return l
	}
	first := look()
	_, err := db.Exec(ctx, `ALTER TABLE outbox_events RENAME TO outbox_old`)
	require.NoError(t, err)
	_, err = db.Exec(ctx, `CREATE TABLE outbox_events (LIKE outbox_old INCLUDING ALL)`)
	require.NoError(t, err)
	swapped := look()
	require.False(t, swapped.Covered)
	require.False(t, swapped.DropsFrom(first.Fingerprint), "nothing the table lists is gone: the old table left")
	require.NoError(t, AddTable(ctx, db, o))
	listed := look()
	require.True(t, listed.Covered)
	require.True(t, listed.DropsFrom(first.Fingerprint), "the new table is listed only now")
	require.False(t, look().DropsFrom(listed.Fingerprint), "nothing changed since")
}
