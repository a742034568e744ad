package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	ioutbox "github.com/outbox-dev/outbox-operator/internal/outbox"
	"github.com/outbox-dev/outbox-operator/internal/pgtx"
	"github.com/outbox-dev/outbox-operator/internal/testenv"
	"github.com/outbox-dev/outbox-operator/pkg/outbox"
)

// testBundle is a fresh database with an outbox table (the relay's DDL of
// the layout) and a table for the caller's own state.
type testBundle struct {
	db *pgxpool.Pool
}

func setup(t *testing.T, ddl string) *testBundle {
	t.Helper()
	ctx := context.Background()
	db, err := pgxpool.New(ctx, testenv.Postgres(t))
	require.NoError(t, err)
	t.Cleanup(db.Close)
	_, err = db.Exec(ctx, ddl+`CREATE TABLE state (n int NOT NULL);`)
	require.NoError(t, err)
	return &testBundle{db: db}
}

func defaultDDL() string { return ioutbox.MustNew("", ioutbox.Columns{}).DDL(ioutbox.DDLOptions{}) }

// row is an outbox row as the relay reads it.
type row struct {
	ID, Type, Payload string
	Dispatched        bool
}

func (b *testBundle) rows(t *testing.T, query string) []row {
	t.Helper()
	rows, err := b.db.Query(context.Background(), query)
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[row])
	require.NoError(t, err)
	return out
}

const defaultRowsSQL = `SELECT id::text, event_type, payload, dispatched_at IS NOT NULL FROM outbox_events ORDER BY created_at`

func TestWriteWithTheTableDefaultID(t *testing.T) {
	t.Parallel()
	b := setup(t, defaultDDL())
	ctx := context.Background()

	var id string
	err := pgtx.Run(ctx, b.db, func(tx pgx.Tx) error {
		var err error
		id, err = outbox.Write(ctx, tx, outbox.Event{Type: "order_created", Payload: []byte(`{"order_id":"1"}`)})
		return err
	})
	require.NoError(t, err)

	require.Len(t, id, 36, "a uuid from gen_random_uuid()")
	require.Equal(t, []row{{ID: id, Type: "order_created", Payload: `{"order_id":"1"}`}}, b.rows(t, defaultRowsSQL))
	pending, err := ioutbox.MustNew("", ioutbox.Columns{}).Backlog(ctx, b.db)
	require.NoError(t, err)
	require.EqualValues(t, 1, pending.Count, "pending for the relay")
}

func TestWriteWithTheCallersID(t *testing.T) {
	t.Parallel()
	b := setup(t, defaultDDL())
	ctx := context.Background()
	const given = "6f1c8a52-3b1e-4f7e-9d43-2f0a8c1b7e11"

	err := pgtx.Run(ctx, b.db, func(tx pgx.Tx) error {
		id, err := outbox.Write(ctx, tx, outbox.Event{ID: given, Type: "t", Payload: []byte("p")})
		require.Equal(t, given, id)
		return err
	})
	require.NoError(t, err)
	require.Equal(t, []row{{ID: given, Type: "t", Payload: "p"}}, b.rows(t, defaultRowsSQL))
}

func TestEventAndStateCommitTogetherOrNotAtAll(t *testing.T) {
	t.Parallel()
	b := setup(t, defaultDDL())
	ctx := context.Background()
	write := func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO state VALUES (1)`); err != nil {
			return err
		}
		_, err := outbox.Write(ctx, tx, outbox.Event{Type: "t", Payload: []byte("p")})
		return err
	}

	tx, err := b.db.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, write(tx))
	require.NoError(t, tx.Rollback(ctx))
	require.Empty(t, b.rows(t, defaultRowsSQL), "a rolled-back event is never seen")
	var n int
	require.NoError(t, b.db.QueryRow(ctx, `SELECT count(*) FROM state`).Scan(&n))
	require.Zero(t, n)

	require.NoError(t, pgtx.Run(ctx, b.db, write))
	require.Len(t, b.rows(t, defaultRowsSQL), 1)
	require.NoError(t, b.db.QueryRow(ctx, `SELECT count(*) FROM state`).Scan(&n))
	require.Equal(t, 1, n)
}

func TestWriteRefusesAnIncompleteEventWithoutTouchingTheTransaction(t *testing.T) {
	t.Parallel()
	b := setup(t, defaultDDL())
	ctx := context.Background()

	err := pgtx.Run(ctx, b.db, func(tx pgx.Tx) error {
		for _, e := range []outbox.Event{
			{Payload: []byte("p")},
			{Type: "t"},
			{Type: "t", Payload: []byte{}},
		} {
			_, err := outbox.Write(ctx, tx, e)
			require.ErrorIs(t, err, outbox.ErrInvalidEvent, "%+v", e)
		}
		// The transaction is still usable: nothing was sent.
		_, err := outbox.Write(ctx, tx, outbox.Event{Type: "t", Payload: []byte("p")})
		return err
	})
	require.NoError(t, err)
	require.Len(t, b.rows(t, defaultRowsSQL), 1)

	_, err = outbox.Write(ctx, nil, outbox.Event{Type: "t", Payload: []byte("p")})
	require.ErrorIs(t, err, outbox.ErrInvalidEvent)
}

func TestWriterWithACustomLayoutAndJSONBPayload(t *testing.T) {
	t.Parallel()
	// An application's own table: schema-qualified, other column names, a
	// bigint id, a jsonb payload and timestamp without time zone.
	b := setup(t, `CREATE SCHEMA app;
		CREATE TABLE app."Events" (seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, kind varchar NOT NULL,
			body jsonb NOT NULL, at timestamp NOT NULL DEFAULT (now() AT TIME ZONE 'utc'), sent_at timestamp NULL);`)
	ctx := context.Background()
	w, err := outbox.NewWriter("app.Events", outbox.Columns{
		ID: "seq", EventType: "kind", Payload: "body", CreatedAt: "at", DispatchedAt: "sent_at",
	})
	require.NoError(t, err)
	require.Equal(t, "app.Events", w.Table())

	var ids []string
	err = pgtx.Run(ctx, b.db, func(tx pgx.Tx) error {
		for _, p := range []string{`{"b": 2, "a": 1}`, `[1, 2]`} {
			id, err := w.Write(ctx, tx, outbox.Event{Type: "k", Payload: []byte(p)})
			if err != nil {
				return err
			}
			ids = append(ids, id)
		}
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, []string{"1", "2"}, ids)
	require.Equal(t, []row{{ID: "1", Type: "k", Payload: `{"a": 1, "b": 2}`}, {ID: "2", Type: "k", Payload: `[1, 2]`}},
		b.rows(t, `SELECT seq::text, kind, body::text, sent_at IS NOT NULL FROM app."Events" ORDER BY seq`))

	// The relay claims what the writer wrote.
	tbl := ioutbox.MustNew("app.Events", ioutbox.Columns{
		ID: "seq", EventType: "kind", Payload: "body", CreatedAt: "at", DispatchedAt: "sent_at",
	})
	tx, err := b.db.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	claimed, err := tbl.Claim(ctx, tx, ioutbox.MarkDispatched, ioutbox.Rows(10))
	require.NoError(t, err)
	require.Len(t, claimed, 2)
	require.WithinDuration(t, time.Now(), claimed[0].CreatedAt, time.Minute, "created_at read as UTC")

	// A payload the jsonb column refuses is PostgreSQL's error, wrapped.
	err = pgtx.Run(ctx, b.db, func(tx pgx.Tx) error {
		_, err := w.Write(ctx, tx, outbox.Event{Type: "k", Payload: []byte("not json")})
		return err
	})
	require.ErrorContains(t, err, "writing k event to app.Events")
	require.ErrorContains(t, err, "invalid input syntax for type json")
}

func TestNewWriterRefusesInvalidNames(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		table string
		cols  outbox.Columns
	}{
		{table: "x; DROP TABLE y"},
		{table: "a.b.c"},
		{cols: outbox.Columns{Payload: `payload"`}},
		{cols: outbox.Columns{ID: "event_type"}},
	} {
		_, err := outbox.NewWriter(tc.table, tc.cols)
		require.Error(t, err, "%+v", tc)
	}
	_, err := outbox.NewWriter("1table", outbox.Columns{})
	require.ErrorIs(t, err, outbox.ErrInvalidIdentifier)
}

func TestWriteToAMissingTableFails(t *testing.T) {
	t.Parallel()
	b := setup(t, "")
	ctx := context.Background()
	err := pgtx.Run(ctx, b.db, func(tx pgx.Tx) error {
		_, err := outbox.Write(ctx, tx, outbox.Event{Type: "t", Payload: []byte("p")})
		return err
	})
	require.ErrorContains(t, err, "writing t event to outbox_events")
	require.ErrorContains(t, err, "42P01")
}
