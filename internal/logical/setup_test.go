package logical

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outbox-dev/outbox-operator/internal/outbox"
	"github.com/outbox-dev/outbox-operator/internal/testenv"
)

func TestSetupIsIdempotentAndConcurrent(t *testing.T) {
	t.Parallel()
	b := setup(t, testenv.Postgres(t), "", outbox.Columns{}, "")
	require.NoError(t, Setup(b.ctx, b.db, b.opts), "a second Setup")

	// Concurrent Setups of a new publication and slot all succeed.
	o := b.opts
	o.Slot, o.Publication = testenv.Name(t), "pub_concurrent"
	t.Cleanup(func() { require.NoError(t, DropSlot(context.Background(), b.db, o.Slot)) })
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Go(func() { errs[i] = Setup(b.ctx, b.db, o) })
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}

	var pubs, slots int
	require.NoError(t, b.db.QueryRow(b.ctx, `SELECT count(*) FROM pg_publication WHERE pubname IN ($1, $2)`,
		b.opts.Table.PublicationName(), o.Publication).Scan(&pubs))
	require.Equal(t, 2, pubs)
	require.NoError(t, b.db.QueryRow(b.ctx, `SELECT count(*) FROM pg_replication_slots
		WHERE slot_name IN ($1, $2) AND plugin = 'pgoutput' AND database = current_database()`,
		b.opts.Slot, o.Slot).Scan(&slots))
	require.Equal(t, 2, slots)

	s, err := Status(b.ctx, b.db, b.opts.Slot)
	require.NoError(t, err)
	require.True(t, s.Exists)
	require.False(t, s.Active)
	require.Equal(t, "reserved", s.WALStatus)
	require.NotZero(t, s.ConfirmedFlush)
	require.Nil(t, s.SafeWALSize, "max_slot_wal_keep_size is unset on the shared server")
	keep, err := MaxSlotWALKeepSize(b.ctx, b.db)
	require.NoError(t, err)
	require.EqualValues(t, -1, keep)
}

func TestSetupRefusesWhatCannotStream(t *testing.T) {
	t.Parallel()
	b := setup(t, testenv.Postgres(t), "", outbox.Columns{}, "")
	ctx, db := b.ctx, b.db

	missing := b.opts
	missing.Table, missing.Slot = outbox.MustNew("nosuchschema.outbox", outbox.Columns{}), testenv.Name(t)
	require.ErrorIs(t, Setup(ctx, db, missing), outbox.ErrTableNotFound)
	missing.Table = outbox.MustNew("no_such_table", outbox.Columns{})
	require.ErrorIs(t, Setup(ctx, db, missing), outbox.ErrTableNotFound)

	_, err := db.Exec(ctx, `CREATE TABLE other (x int);
		CREATE PUBLICATION pub_other FOR TABLE other;
		CREATE PUBLICATION pub_updates FOR TABLE outbox_events WITH (publish = 'update')`)
	require.NoError(t, err)
	o := b.opts
	o.Publication = "pub_other"
	err = Setup(ctx, db, o)
	require.ErrorContains(t, err, "does not cover table outbox_events")
	o.Publication = "pub_updates"
	require.ErrorContains(t, Setup(ctx, db, o), "does not publish inserts")

	physical := b.opts
	physical.Slot = testenv.Name(t)
	_, err = db.Exec(ctx, `SELECT pg_create_physical_replication_slot($1)`, physical.Slot)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, DropSlot(context.Background(), db, physical.Slot)) })
	require.ErrorContains(t, Setup(ctx, db, physical), "physical slot")
}

func TestSetupCoversPartitionsAndSchemas(t *testing.T) {
	t.Parallel()
	tbl := outbox.MustNew("app.outbox", outbox.Columns{})
	b := setup(t, testenv.Postgres(t), tbl.String(), outbox.Columns{}, tbl.DDL(outbox.DDLOptions{Partitioned: true}))
	r := b.open(t)
	b.insert(t, b.db, 1, 2)
	events, _ := read(t, r, 2, 10)
	require.Equal(t, eventIDs(1, 2), ids(events), "inserts into the default partition arrive")

	// A publication FOR TABLES IN SCHEMA (PostgreSQL 15) covers the table too.
	_, err := b.db.Exec(b.ctx, `CREATE PUBLICATION pub_schema FOR TABLES IN SCHEMA app`)
	require.NoError(t, err)
	o := b.opts
	o.Publication, o.Slot = "pub_schema", testenv.Name(t)
	t.Cleanup(func() { require.NoError(t, DropSlot(context.Background(), b.db, o.Slot)) })
	require.NoError(t, Setup(b.ctx, b.db, o))
}

func TestDropSlotReleasesAConnectedReader(t *testing.T) {
	t.Parallel()
	b := setup(t, testenv.Postgres(t), "", outbox.Columns{}, "")
	r := b.open(t)
	s, err := Status(b.ctx, b.db, b.opts.Slot)
	require.NoError(t, err)
	require.True(t, s.Active, "the reader streams from the slot")

	require.NoError(t, DropSlot(b.ctx, b.db, b.opts.Slot))
	s, err = Status(b.ctx, b.db, b.opts.Slot)
	require.NoError(t, err)
	require.Equal(t, SlotStatus{}, s)
	_, err = r.Next(b.ctx, 10, 0)
	require.Error(t, err, "the reader's walsender was terminated")
	require.NotErrorIs(t, err, context.DeadlineExceeded)
	_, err = r.Next(b.ctx, 10, 0)
	require.Error(t, err, "a broken reader stays broken")
	require.NoError(t, r.Close(b.ctx))

	require.NoError(t, DropSlot(b.ctx, b.db, b.opts.Slot), "a missing slot")
	cfg := mustParse(t, b.dsn)
	_, err = Open(b.ctx, cfg, b.opts)
	require.ErrorIs(t, err, ErrSlotNotFound)

	require.NoError(t, DropPublication(b.ctx, b.db, b.opts))
	require.NoError(t, DropPublication(b.ctx, b.db, b.opts), "a missing publication")
	var n int
	require.NoError(t, b.db.QueryRow(b.ctx, `SELECT count(*) FROM pg_publication`).Scan(&n))
	require.Zero(t, n)
}

// TestUncoveredListsChildrenOutsideThePublication: inheritance children
// created after the publication, or left out by FOR TABLE ONLY, are
// listed (recursively) until added; partitions never are.
func TestUncoveredListsChildrenOutsideThePublication(t *testing.T) {
	t.Parallel()
	b := setup(t, testenv.Postgres(t), "", outbox.Columns{}, "")
	ctx, db := b.ctx, b.db
	none, err := Uncovered(ctx, db, b.opts)
	require.NoError(t, err)
	require.Empty(t, none)

	_, err = db.Exec(ctx, `CREATE SCHEMA other;
		CREATE TABLE outbox_c1 () INHERITS (outbox_events);
		CREATE TABLE other.c2 () INHERITS (outbox_c1)`)
	require.NoError(t, err)
	children, err := Uncovered(ctx, db, b.opts)
	require.NoError(t, err)
	require.Equal(t, []Child{{"other", "c2"}, {"public", "outbox_c1"}}, children)
	require.ErrorIs(t, UncoveredError(b.opts, children), ErrChildNotCovered)

	// Inserts into c1 are not streamed until it is added.
	r := b.open(t)
	_, err = db.Exec(ctx, `INSERT INTO outbox_c1 (id, event_type, payload) VALUES ($1, 't', '{}')`, eventID(1))
	require.NoError(t, err)
	tx, err := db.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, AddChildren(ctx, tx, b.opts, children))
	require.NoError(t, tx.Commit(ctx))
	_, err = db.Exec(ctx, `INSERT INTO other.c2 (id, event_type, payload) VALUES ($1, 't', '{}')`, eventID(2))
	require.NoError(t, err)
	events, _ := read(t, r, 1, 10)
	require.Equal(t, eventIDs(2), ids(events), "only what was inserted after the add")
	children, err = Uncovered(ctx, db, b.opts)
	require.NoError(t, err)
	require.Empty(t, children)

	// A publication FOR TABLE ONLY leaves every child out; a partitioned
	// table's partitions are covered through it.
	_, err = db.Exec(ctx, `CREATE PUBLICATION pub_only FOR TABLE ONLY outbox_events;
		CREATE TABLE parts (id uuid, event_type text, payload text, created_at timestamptz, dispatched_at timestamptz)
			PARTITION BY RANGE (created_at);
		CREATE TABLE parts_a PARTITION OF parts DEFAULT;
		CREATE PUBLICATION pub_parts FOR TABLE parts WITH (publish_via_partition_root = true)`)
	require.NoError(t, err)
	o := b.opts
	o.Publication = "pub_only"
	children, err = Uncovered(ctx, db, o)
	require.NoError(t, err)
	require.Len(t, children, 2)
	o.Table, o.Publication = outbox.MustNew("parts", outbox.Columns{}), "pub_parts"
	children, err = Uncovered(ctx, db, o)
	require.NoError(t, err)
	require.Empty(t, children)
}
