package logical

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outbox-dev/outbox-operator/internal/outbox"
	"github.com/outbox-dev/outbox-operator/internal/testenv"
)

// testTimeout bounds every wait of a test: a deadline for liveness, never a
// figure a test asserts.
const testTimeout = 60 * time.Second

// testStatusInterval is short, so that positions reach the server within a
// test's patience.
const testStatusInterval = 100 * time.Millisecond

// bundle is one test's database, outbox table, and the names of its stream.
type bundle struct {
	ctx  context.Context
	dsn  string
	db   *pgxpool.Pool
	opts Options
}

// setup connects to dsn, requires wal_level=logical, creates the table of
// ddl (the default outbox when empty) named by table, and runs Setup. The
// slot is dropped in the test's cleanup (before the database, which a slot
// would keep from being dropped).
func setup(t *testing.T, dsn, table string, columns outbox.Columns, ddl string) *bundle {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*testTimeout)
	t.Cleanup(cancel)
	db, err := pgxpool.New(ctx, dsn)
	require.NoError(t, err)
	t.Cleanup(db.Close)
	requireLogical(t, ctx, db)

	tbl := outbox.MustNew(table, columns)
	if ddl == "" {
		ddl = tbl.DDL(outbox.DDLOptions{})
	}
	_, err = db.Exec(ctx, ddl)
	require.NoError(t, err)
	b := &bundle{ctx: ctx, dsn: dsn, db: db, opts: Options{
		Table:          tbl,
		Slot:           testenv.Name(t),
		StatusInterval: testStatusInterval,
	}}
	require.NoError(t, Setup(ctx, db, b.opts))
	t.Cleanup(func() {
		require.NoError(t, DropSlot(context.Background(), db, b.opts.Slot))
	})
	return b
}

// requireLogical fails the test, saying how to fix it, on a server that
// cannot decode its WAL: testenv starts its servers with wal_level=logical,
// but OUTBOX_TEST_DATABASE_URL may point at another.
func requireLogical(t *testing.T, ctx context.Context, q outbox.Querier) {
	t.Helper()
	var level string
	require.NoError(t, q.QueryRow(ctx, walLevelSQL).Scan(&level))
	if level != "logical" {
		t.Fatalf("the test server runs with wal_level=%s; these tests need wal_level=logical. testenv's own servers "+
			"have it; a server named by %s needs wal_level=logical in postgresql.conf (or ALTER SYSTEM) and a restart",
			level, testenv.EnvDatabaseURL)
	}
}

// open opens a Reader of the bundle's slot, closed in the test's cleanup.
// A slot still held by the walsender of a connection that was cut off is
// waited for.
func (b *bundle) open(t *testing.T) *Reader {
	t.Helper()
	cfg, err := pgconn.ParseConfig(b.dsn)
	require.NoError(t, err)
	var r *Reader
	testenv.Eventually(t, testTimeout, "the slot to be free", func() error {
		r, err = Open(b.ctx, cfg, b.opts)
		if errors.Is(err, ErrSlotInUse) {
			return err
		}
		require.NoError(t, err)
		return nil
	})
	t.Cleanup(func() { _ = r.Close(context.Background()) })
	return r
}

// eventID makes the uuid of event n.
func eventID(n int) string { return fmt.Sprintf("00000000-0000-4000-8000-%012d", n) }

// insert writes events n (eventID(n), type "t<n>", payload {"n":n}), each in
// a transaction of its own unless q is one.
func (b *bundle) insert(t *testing.T, q outbox.Querier, ns ...int) {
	t.Helper()
	for _, n := range ns {
		_, err := q.Exec(b.ctx, b.opts.Table.InsertSQL(), eventID(n), fmt.Sprintf("t%d", n), fmt.Sprintf(`{"n":%d}`, n))
		require.NoError(t, err)
	}
}

// read calls Next until it has at least n events, and returns them and the
// batches they came in.
func read(t *testing.T, r *Reader, n, maxEvents int) ([]outbox.Event, []Batch) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	var events []outbox.Event
	var batches []Batch
	for len(events) < n {
		b, err := r.Next(ctx, outbox.Rows(maxEvents), 20*time.Millisecond)
		require.NoError(t, err, "after %d of %d events", len(events), n)
		require.LessOrEqual(t, len(b.Events), maxEvents)
		events = append(events, b.Events...)
		batches = append(batches, b)
	}
	return events, batches
}

// ids lists the ids of events.
func ids(events []outbox.Event) []string {
	out := make([]string, len(events))
	for i, e := range events {
		out[i] = e.ID
	}
	return out
}

// eventIDs lists eventID(n) of each n.
func eventIDs(ns ...int) []string {
	out := make([]string, len(ns))
	for i, n := range ns {
		out[i] = eventID(n)
	}
	return out
}

// last returns the last batch whose Confirm is set.
func lastConfirm(batches []Batch) Batch {
	for i := len(batches) - 1; i >= 0; i-- {
		if batches[i].Confirm != 0 {
			return batches[i]
		}
	}
	return Batch{}
}

// requireConfirmedFlush waits for the server to report the slot's
// confirmed position as want.
func (b *bundle) requireConfirmedFlush(t *testing.T, want fmt.Stringer) {
	t.Helper()
	testenv.Eventually(t, testTimeout, "confirmed_flush_lsn "+want.String(), func() error {
		s, err := Status(b.ctx, b.db, b.opts.Slot)
		require.NoError(t, err)
		if s.ConfirmedFlush.String() != want.String() {
			return fmt.Errorf("confirmed_flush_lsn is %s", s.ConfirmedFlush)
		}
		return nil
	})
}

// mustParse parses a DSN as the caller of Open does.
func mustParse(t *testing.T, dsn string) *pgconn.Config {
	t.Helper()
	cfg, err := pgconn.ParseConfig(dsn)
	require.NoError(t, err)
	return cfg
}
