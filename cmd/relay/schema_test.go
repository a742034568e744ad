package main

import (
	"regexp"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outbox-dev/outbox-operator/internal/testenv"
)

func TestSchemaPrintsDDL(t *testing.T) {
	t.Parallel()
	// Printing needs no database: no DATABASE_URL at all.
	res := requireSuccess(t, relayEnv(), "schema")
	require.Contains(t, res.stdout, `CREATE TABLE IF NOT EXISTS "outbox_events" (`)
	for _, col := range []string{`"id" uuid PRIMARY KEY`, `"event_type" text NOT NULL`, `"payload" text NOT NULL`,
		`"created_at" timestamptz NOT NULL`, `"dispatched_at" timestamptz NULL`} {
		require.Contains(t, res.stdout, col)
	}
	require.Regexp(t, regexp.MustCompile(
		`CREATE INDEX IF NOT EXISTS "\w+" ON "outbox_events" \("created_at", "id"\) WHERE "dispatched_at" IS NULL;`), res.stdout,
		"the partial index on pending rows")
	require.NotContains(t, res.stdout, "TRIGGER", "no trigger without --notify")
	require.Empty(t, res.stderr)

	res = requireSuccess(t, relayEnv(), "schema", "--notify", "--table", "app.outbox", "--created-at-column", "ts")
	require.Contains(t, res.stdout, `CREATE SCHEMA IF NOT EXISTS "app";`)
	require.Contains(t, res.stdout, `CREATE TABLE IF NOT EXISTS "app"."outbox" (`)
	require.Regexp(t, regexp.MustCompile(
		`CREATE INDEX IF NOT EXISTS "\w+" ON "app"."outbox" \("ts", "id"\) WHERE "dispatched_at" IS NULL;`), res.stdout)
	require.Regexp(t, regexp.MustCompile(`CREATE OR REPLACE TRIGGER "\w+" AFTER INSERT ON "app"."outbox"\s+FOR EACH STATEMENT`),
		res.stdout)
	require.Contains(t, res.stdout, "pg_notify(")
	require.Contains(t, res.stdout, `CREATE TABLE IF NOT EXISTS "app"."outbox_dead_letters" (`, "the dead-letter table")
}

func TestSchemaPartitioned(t *testing.T) {
	t.Parallel()
	res := requireSuccess(t, relayEnv(), "schema", "--partitioned")
	require.Contains(t, res.stdout, `PRIMARY KEY ("id", "created_at")`)
	require.Contains(t, res.stdout, `) PARTITION BY RANGE ("created_at");`)
	require.Contains(t, res.stdout, `CREATE TABLE IF NOT EXISTS "outbox_events_default" PARTITION OF "outbox_events" DEFAULT;`)

	// It applies, twice, and the relay's statements run on it.
	dsn, db := freshDB(t)
	env := relayEnv("DATABASE_URL=" + dsn)
	execSQL(t, db, `DROP TABLE outbox_events`)
	requireSuccess(t, env, "schema", "--partitioned", "--apply")
	requireSuccess(t, env, "schema", "--partitioned", "--apply")
	execSQL(t, db, `CREATE TABLE outbox_events_2026 PARTITION OF outbox_events FOR VALUES FROM ('2026-01-01') TO ('2027-01-01')`)
	execSQL(t, db, `INSERT INTO outbox_events (event_type, payload, created_at) VALUES ('a', '{}', '2026-06-01'), ('b', '{}', now())`)
	_, count, _ := backlogJSON(t, env, "--output", "json")
	require.EqualValues(t, 2, count)
}

// schemaState describes the objects of app.outbox.
type schemaState struct {
	schemas, tables, partialIndexes, triggers, rows int64
	triggerDef                                      string
	columns                                         []string
}

func inspectAppOutbox(t *testing.T, db *pgxpool.Pool) schemaState {
	t.Helper()
	var s schemaState
	s.schemas = queryInt(t, db, `SELECT count(*) FROM pg_namespace WHERE nspname = 'app'`)
	s.tables = queryInt(t, db, `SELECT count(*) FROM pg_tables WHERE schemaname = 'app' AND tablename = 'outbox'`)
	s.partialIndexes = queryInt(t, db, `SELECT count(*) FROM pg_indexes
		WHERE schemaname = 'app' AND tablename = 'outbox'
		AND indexdef LIKE '%(created_at, id) WHERE (dispatched_at IS NULL)'`)
	if s.tables == 0 {
		return s
	}
	s.triggers = queryInt(t, db, `SELECT count(*) FROM pg_trigger WHERE tgrelid = 'app.outbox'::regclass AND NOT tgisinternal`)
	if s.triggers == 1 {
		s.triggerDef = queryStrings(t, db, `SELECT pg_get_triggerdef(oid) FROM pg_trigger
			WHERE tgrelid = 'app.outbox'::regclass AND NOT tgisinternal`)[0]
	}
	s.rows = queryInt(t, db, `SELECT count(*) FROM app.outbox`)
	s.columns = queryStrings(t, db, `SELECT column_name || ' ' || data_type || ' ' || is_nullable
		FROM information_schema.columns WHERE table_schema = 'app' AND table_name = 'outbox' ORDER BY ordinal_position`)
	return s
}

func TestSchemaApplyIsIdempotent(t *testing.T) {
	t.Parallel()
	dsn := testenv.Postgres(t)
	db := connectDB(t, dsn)
	env := relayEnv("DATABASE_URL=" + dsn)
	require.Zero(t, inspectAppOutbox(t, db).schemas)

	res := requireSuccess(t, env, "schema", "--apply", "--notify", "--table", "app.outbox")
	require.Equal(t, "applied schema of app.outbox\n", res.stdout)
	s := inspectAppOutbox(t, db)
	require.EqualValues(t, 1, s.schemas, "schema app")
	require.EqualValues(t, 1, s.tables, "table app.outbox")
	require.EqualValues(t, 1, s.partialIndexes, "the partial index on pending rows")
	require.EqualValues(t, 1, s.triggers, "the NOTIFY trigger")
	require.Contains(t, s.triggerDef, "AFTER INSERT ON app.outbox FOR EACH STATEMENT")
	require.Equal(t, []string{
		"id uuid NO",
		"event_type text NO",
		"payload text NO",
		"created_at timestamp with time zone NO",
		"dispatched_at timestamp with time zone YES",
	}, s.columns)

	execSQL(t, db, `INSERT INTO app.outbox (event_type, payload) VALUES ('a', '{}')`)
	res = requireSuccess(t, env, "schema", "--apply", "--notify", "--table", "app.outbox")
	require.Equal(t, "applied schema of app.outbox\n", res.stdout)
	again := inspectAppOutbox(t, db)
	require.EqualValues(t, 1, again.rows, "applying again keeps the rows")
	again.rows = 0
	require.Equal(t, s, again, "applying again changes nothing")

	// Without --notify, applying leaves the trigger in place.
	requireSuccess(t, env, "schema", "--apply", "--table", "app.outbox")
	require.EqualValues(t, 1, inspectAppOutbox(t, db).triggers)

	// The layout flags reach every subcommand: backlog sees the row.
	res = requireSuccess(t, env, "backlog", "--table", "app.outbox", "--output", "json")
	require.True(t, strings.HasPrefix(res.stdout, `{"count":1,`), "backlog of app.outbox: %s", res.stdout)
}

func TestSchemaApplyCustomColumns(t *testing.T) {
	t.Parallel()
	dsn := testenv.Postgres(t)
	db := connectDB(t, dsn)
	layout := []string{"--table", "events", "--id-column", "event_id", "--event-type-column", "kind",
		"--payload-column", "body", "--created-at-column", "ts", "--dispatched-at-column", "sent_at"}
	env := relayEnv("DATABASE_URL=" + dsn)
	requireSuccess(t, env, append([]string{"schema", "--apply"}, layout...)...)
	require.Equal(t, []string{"event_id", "kind", "body", "ts", "sent_at"}, queryStrings(t, db,
		`SELECT column_name::text FROM information_schema.columns WHERE table_name = 'events' ORDER BY ordinal_position`))
	execSQL(t, db, `INSERT INTO events (kind, body, ts, sent_at) VALUES ('a', '{}', now() - interval '3 hours', now() - interval '2 hours'),
		('b', '{}', now(), NULL)`)

	res := requireSuccess(t, env, append([]string{"backlog", "-o", "json"}, layout...)...)
	require.True(t, strings.HasPrefix(res.stdout, `{"count":1,`), "backlog: %s", res.stdout)
	res = requireSuccess(t, env, append([]string{"cleanup", "--retention", "1h"}, layout...)...)
	require.Contains(t, res.stdout, "deleted 1 dispatched rows")
	require.Equal(t, []string{"b"}, queryStrings(t, db, `SELECT kind FROM events`))
}
