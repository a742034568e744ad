package outbox

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestNewDefaults(t *testing.T) {
	t.Parallel()
	tbl, err := New("", Columns{})
	require.NoError(t, err)
	require.Equal(t, "outbox_events", tbl.String())
	require.Equal(t, Columns{"id", "event_type", "payload", "created_at", "dispatched_at", ""}, tbl.Columns())
	require.Equal(t, "outbox_events_pending_idx", tbl.PendingIndexName())
	require.Equal(t, "outbox_outbox_events", tbl.Channel())
}

func TestNewRejectsUnsafeIdentifiers(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		table   string
		columns Columns
		wantMsg string
	}{
		{"injection in table", "x; DROP TABLE y", Columns{}, `table "x; DROP TABLE y"`},
		{"injection in schema", `a"; DROP TABLE y; --.t`, Columns{}, `schema "a\"; DROP TABLE y; --"`},
		{"quote in column", "outbox", Columns{Payload: `p" || pg_sleep(10) || "`}, "column payload"},
		{"three parts", "a.b.c", Columns{}, `table "b.c"`},
		{"empty table after schema", "app.", Columns{}, "table: invalid identifier: must not be empty"},
		{"leading digit", "1outbox", Columns{}, `table "1outbox"`},
		{"space", "outbox events", Columns{}, `table "outbox events"`},
		{"too long", strings.Repeat("a", 64), Columns{}, "longer than 63 bytes"},
		{"unicode", "outböx", Columns{}, `table "outböx"`},
		{"duplicate column", "outbox", Columns{ID: "payload"}, `column "payload" is named twice`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := New(tc.table, tc.columns)
			require.Error(t, err)
			require.Contains(t, err.Error(), tc.wantMsg)
		})
	}
}

func TestNewAcceptsSchemaAndCustomColumns(t *testing.T) {
	t.Parallel()
	tbl, err := New("app.Events", Columns{ID: "event_id", CreatedAt: "inserted_at"})
	require.NoError(t, err)
	require.Equal(t, "app", tbl.Schema())
	require.Equal(t, "Events", tbl.Name())
	claim := tbl.ClaimSQL(MarkDispatched)
	require.Contains(t, claim, `"app"."Events"`)
	require.Contains(t, claim, `o."event_id"::text`)
	require.Contains(t, claim, `ORDER BY "inserted_at"`)
	require.Contains(t, claim, `FOR UPDATE SKIP LOCKED`)
	require.Equal(t, "outbox_app__Events", tbl.Channel())
	require.Contains(t, claim, `UPDATE "app"."Events" AS o SET "dispatched_at" = now()`)
	deleting := tbl.ClaimSQL(DeleteOnDispatch)
	require.Contains(t, deleting, `DELETE FROM "app"."Events" AS o`)
	require.Contains(t, deleting, `WHERE "dispatched_at" IS NULL`)
	require.NotContains(t, deleting, "SET \"dispatched_at\"")
}

func TestDerivedNamesFitTheLimit(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("x", 63)
	tbl := MustNew(long+"."+long, Columns{})
	for _, n := range []string{tbl.Channel(), tbl.PendingIndexName(), tbl.TriggerName()} {
		require.LessOrEqual(t, len(n), 63, n)
		require.NoError(t, ValidateIdentifier("derived", n))
	}
	require.NotEqual(t, tbl.PendingIndexName(), tbl.TriggerName())
	require.LessOrEqual(t, len(tbl.PublicationName()), 63)
	require.Equal(t, "app__outbox_pub", MustNew("app.outbox", Columns{}).PublicationName())
	require.NotEqual(t, MustNew("app.outbox", Columns{}).PublicationName(), MustNew("billing.outbox", Columns{}).PublicationName(),
		"publications are per database: one per schema-qualified table")
	require.Equal(t, "outbox_events_pub", MustNew("", Columns{}).PublicationName())
}

func TestDDL(t *testing.T) {
	t.Parallel()
	tbl := MustNew("app.outbox", Columns{})
	ddl := tbl.DDL(DDLOptions{})
	require.Contains(t, ddl, `CREATE TABLE IF NOT EXISTS "app"."outbox"`)
	require.Contains(t, ddl,
		`CREATE INDEX IF NOT EXISTS "outbox_pending_idx" ON "app"."outbox" ("created_at", "id") WHERE "dispatched_at" IS NULL`)
	require.NotContains(t, ddl, "TRIGGER")
	withTrigger := tbl.DDL(DDLOptions{Notify: true})
	require.Contains(t, withTrigger, `FOR EACH STATEMENT EXECUTE FUNCTION "app"."outbox_notify_fn"()`)
	require.Contains(t, withTrigger, `pg_notify('outbox_app__outbox', '')`)
}

func TestKeyColumn(t *testing.T) {
	t.Parallel()
	tbl, err := New("", Columns{Key: "aggregate_id"})
	require.NoError(t, err)
	require.Equal(t, "aggregate_id", tbl.Columns().Key)
	_, err = New("", Columns{Key: "payload"})
	require.ErrorContains(t, err, `column "payload" is named twice`)
	_, err = New("", Columns{Key: "x; DROP TABLE y"})
	require.ErrorIs(t, err, ErrInvalidIdentifier)
	_, err = MustNew("", Columns{}).ClaimKeyed(t.Context(), nil, MarkDispatched, Rows(1), 1, nil)
	require.ErrorIs(t, err, ErrNoKeyColumn)
}
