package logical

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
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

	// A row filter leaves rows out of the stream, and the slot is confirmed
	// past them: their events would be lost. A column list is refused too.
	_, err = db.Exec(ctx, `CREATE PUBLICATION pub_filtered FOR TABLE outbox_events WHERE (event_type <> 'internal') WITH (publish = 'insert');
		CREATE PUBLICATION pub_columns FOR TABLE outbox_events (id, event_type, created_at) WITH (publish = 'insert')`)
	require.NoError(t, err)
	o.Publication = "pub_filtered"
	err = Setup(ctx, db, o)
	require.ErrorContains(t, err, "lists outbox_events with a row filter (WHERE (event_type <> 'internal'::text))")
	require.ErrorContains(t, err, "ALTER PUBLICATION pub_filtered SET TABLE outbox_events")
	o.Publication = "pub_columns"
	require.ErrorContains(t, Setup(ctx, db, o), "lists outbox_events with a column list")

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
	_, err = r.Next(b.ctx, outbox.Rows(10), 0)
	require.Error(t, err, "the reader's walsender was terminated")
	require.NotErrorIs(t, err, context.DeadlineExceeded)
	_, err = r.Next(b.ctx, outbox.Rows(10), 0)
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
// listed (recursively) until added; the partitions of a published
// partitioned table are not.
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
	names := make([]string, 0, len(children))
	for _, c := range children {
		require.False(t, c.Partition || c.Unlogged, "%s", c)
		require.NotZero(t, c.OID)
		names = append(names, c.String())
	}
	require.Equal(t, []string{`"other"."c2"`, `"public"."outbox_c1"`}, names)
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

// TestUncoveredListsPartitionsOutsideThePublication: a publication of the
// partitioned table (or of an ancestor, a schema, ALL TABLES, with either
// publish_via_partition_root) covers its partitions, present and future; one
// that lists only some partitions leaves the others' inserts unstreamed, so
// they are listed, and Setup leaves them to the relay (which adds them).
func TestUncoveredListsPartitionsOutsideThePublication(t *testing.T) {
	t.Parallel()
	tbl := outbox.MustNew("app.outbox", outbox.Columns{})
	b := setup(t, testenv.Postgres(t), tbl.String(), outbox.Columns{}, tbl.DDL(outbox.DDLOptions{Partitioned: true}))
	ctx, db := b.ctx, b.db
	_, err := db.Exec(ctx, `CREATE TABLE app.outbox_2100 PARTITION OF app.outbox
			FOR VALUES FROM ('2100-01-01') TO ('2101-01-01') PARTITION BY RANGE (created_at);
		CREATE TABLE app.outbox_2100a PARTITION OF app.outbox_2100 FOR VALUES FROM ('2100-01-01') TO ('2100-07-01');
		CREATE TABLE app.outbox_2100b PARTITION OF app.outbox_2100 FOR VALUES FROM ('2100-07-01') TO ('2101-01-01');
		CREATE PUBLICATION pub_via_root FOR TABLE app.outbox WITH (publish_via_partition_root = true);
		CREATE PUBLICATION pub_schema FOR TABLES IN SCHEMA app WITH (publish_via_partition_root = true);
		CREATE PUBLICATION pub_all FOR ALL TABLES;
		CREATE PUBLICATION pub_leaf FOR TABLE app.outbox_default WITH (publish = 'insert');
		CREATE PUBLICATION pub_mid FOR TABLE app.outbox_2100 WITH (publish_via_partition_root = true);
		CREATE PUBLICATION pub_leaves FOR TABLE app.outbox_default, app.outbox_2100a, app.outbox_2100b`)
	require.NoError(t, err)
	list := func(pub string) []Child {
		t.Helper()
		o := b.opts
		o.Publication = pub
		children, err := Uncovered(ctx, db, o)
		require.NoError(t, err)
		return children
	}
	uncovered := func(pub string) []string {
		t.Helper()
		children := list(pub)
		names := make([]string, 0, len(children))
		for _, c := range children {
			names = append(names, c.String())
		}
		return names
	}
	for _, pub := range []string{b.opts.Publication, "pub_via_root", "pub_schema", "pub_all", "pub_leaves"} {
		require.Empty(t, uncovered(pub), pub)
	}
	require.Equal(t, []string{`"app"."outbox_2100a"`, `"app"."outbox_2100b"`}, uncovered("pub_leaf"))
	require.Equal(t, []string{`"app"."outbox_default"`}, uncovered("pub_mid"))

	// A partition created later is covered through the table, not through
	// a list of its siblings.
	_, err = db.Exec(ctx, `CREATE TABLE app.outbox_2200 PARTITION OF app.outbox FOR VALUES FROM ('2200-01-01') TO ('2201-01-01')`)
	require.NoError(t, err)
	require.Empty(t, uncovered(b.opts.Publication))
	require.Empty(t, uncovered("pub_via_root"))
	require.Equal(t, []string{`"app"."outbox_2200"`}, uncovered("pub_leaves"))

	// The error names the publication, the partitions and the fix.
	o := b.opts
	o.Publication = "pub_leaf"
	children := list("pub_leaf")
	require.True(t, children[0].Partition)
	err = UncoveredError(o, children)
	require.ErrorIs(t, err, ErrPartitionNotCovered)
	require.ErrorContains(t, err,
		`partitions "app"."outbox_2100a", "app"."outbox_2100b", "app"."outbox_2200" of app.outbox not in publication pub_leaf`)
	require.ErrorContains(t, err, `ALTER PUBLICATION "pub_leaf" ADD TABLE "app"."outbox"`)

	// A role that owns the publication but not the partitions cannot add
	// them: the relay refuses to stream, saying what to do.
	role := pgx.Identifier{testenv.Name(t)}.Sanitize()
	var database string
	require.NoError(t, db.QueryRow(ctx, `SELECT current_database()`).Scan(&database))
	_, err = db.Exec(ctx, fmt.Sprintf(`CREATE ROLE %[1]s; GRANT CREATE ON DATABASE %[2]s TO %[1]s;
		GRANT USAGE ON SCHEMA app TO %[1]s;
		CREATE PUBLICATION pub_role FOR TABLE app.outbox_default; ALTER PUBLICATION pub_role OWNER TO %[1]s`,
		role, pgx.Identifier{database}.Sanitize()))
	require.NoError(t, err)
	t.Cleanup(func() {
		_, err := db.Exec(context.Background(), fmt.Sprintf(`DROP OWNED BY %[1]s; DROP ROLE %[1]s`, role))
		require.NoError(t, err)
	})
	rtx, err := db.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = rtx.Rollback(context.Background()) }() // also when the test fails: db.Close waits for it
	_, err = rtx.Exec(ctx, "SET LOCAL ROLE "+role)
	require.NoError(t, err)
	o.Publication = "pub_role"
	err = AddChildren(ctx, rtx, o, list("pub_role"))
	require.ErrorIs(t, err, ErrPartitionNotCovered)
	require.ErrorContains(t, err, `ALTER PUBLICATION "pub_role" ADD TABLE "app"."outbox"`)
	require.ErrorContains(t, err, "must be owner of table")
	require.NoError(t, rtx.Rollback(ctx))

	// Setup takes a publication that covers part of the table (the relay
	// adds the rest), and the relay's way of adding them covers them.
	o.Publication = "pub_leaf"
	o.Slot = testenv.Name(t)
	t.Cleanup(func() { require.NoError(t, DropSlot(context.Background(), db, o.Slot)) })
	require.NoError(t, Setup(ctx, db, o))
	tx, err := db.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.Background()) }()
	require.NoError(t, AddChildren(ctx, tx, o, children))
	require.NoError(t, tx.Commit(ctx))
	require.Empty(t, uncovered("pub_leaf"))
}
