package outbox

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outbox-dev/outbox-operator/internal/testenv"
)

// rangePartitionedDDL is an outbox partitioned by day on created_at, with
// two partitions and a default one, and the relay's index on the parent
// (created on every partition).
func rangePartitionedDDL(tbl *Table) string {
	return `CREATE TABLE outbox_events (
		id uuid NOT NULL DEFAULT gen_random_uuid(), event_type text NOT NULL, payload text NOT NULL,
		created_at timestamptz NOT NULL DEFAULT now(), dispatched_at timestamptz,
		PRIMARY KEY (id, created_at)
	) PARTITION BY RANGE (created_at);
	CREATE TABLE outbox_events_old PARTITION OF outbox_events FOR VALUES FROM ('2000-01-01') TO ('2026-01-01');
	CREATE TABLE outbox_events_new PARTITION OF outbox_events FOR VALUES FROM ('2026-01-01') TO ('2100-01-01');
	` + tbl.IndexDDL() + tbl.DeadLetterDDL()
}

// The table shapes teams use for a big outbox. Each fills two children with
// the same number of rows, so ctids overlap across them: (0,1) .. (0,n) in
// both. Old rows are dispatched long ago, new ones pending.
var partitionedShapes = map[string]string{
	"range": rangePartitionedDDL(MustNew("", Columns{})),
	"list": `CREATE TABLE outbox_events (
		id uuid NOT NULL DEFAULT gen_random_uuid(), event_type text NOT NULL, payload text NOT NULL,
		created_at timestamptz NOT NULL DEFAULT now(), dispatched_at timestamptz,
		PRIMARY KEY (id, event_type)
	) PARTITION BY LIST (event_type);
	CREATE TABLE outbox_events_old PARTITION OF outbox_events FOR VALUES IN ('old');
	CREATE TABLE outbox_events_new PARTITION OF outbox_events FOR VALUES IN ('new');
	` + MustNew("", Columns{}).IndexDDL(),
	"hash": `CREATE TABLE outbox_events (
		id uuid NOT NULL DEFAULT gen_random_uuid(), event_type text NOT NULL, payload text NOT NULL,
		created_at timestamptz NOT NULL DEFAULT now(), dispatched_at timestamptz,
		PRIMARY KEY (id, event_type)
	) PARTITION BY HASH (event_type);
	CREATE TABLE outbox_events_h0 PARTITION OF outbox_events FOR VALUES WITH (MODULUS 2, REMAINDER 0);
	CREATE TABLE outbox_events_h1 PARTITION OF outbox_events FOR VALUES WITH (MODULUS 2, REMAINDER 1);
	` + MustNew("", Columns{}).IndexDDL(),
	"inheritance": `CREATE TABLE outbox_events (
		id uuid PRIMARY KEY DEFAULT gen_random_uuid(), event_type text NOT NULL, payload text NOT NULL,
		created_at timestamptz NOT NULL DEFAULT now(), dispatched_at timestamptz);
	CREATE TABLE outbox_events_old () INHERITS (outbox_events);
	CREATE TABLE outbox_events_new () INHERITS (outbox_events);
	CREATE INDEX ON outbox_events_old (created_at, id) WHERE dispatched_at IS NULL;
	CREATE INDEX ON outbox_events_new (created_at, id) WHERE dispatched_at IS NULL;`,
}

// fillShape inserts n dispatched rows of type 'old' and n pending rows of
// type 'new'. For range partitions the old rows fall in the old partition;
// for inheritance they are inserted into the children directly; for hash,
// the two types land in different partitions.
func fillShape(t *testing.T, db *pgxpool.Pool, shape string, n int) {
	t.Helper()
	oldTable, newTable := "outbox_events", "outbox_events"
	if shape == "inheritance" {
		oldTable, newTable = "outbox_events_old", "outbox_events_new"
	}
	_, err := db.Exec(context.Background(), `
		INSERT INTO `+oldTable+` (event_type, payload, created_at, dispatched_at)
		SELECT 'old', 'o' || g, '2025-06-01'::timestamptz + g * interval '1 s', '2025-06-02'
		FROM generate_series(1, `+itoa(n)+`) g;
		INSERT INTO `+newTable+` (event_type, payload, created_at)
		SELECT 'new', 'n' || g, '2026-06-01'::timestamptz + g * interval '1 s'
		FROM generate_series(1, `+itoa(n)+`) g;`)
	require.NoError(t, err)
}

func pendingCount(t *testing.T, db *pgxpool.Pool) int {
	t.Helper()
	var n int
	require.NoError(t, db.QueryRow(context.Background(), `SELECT count(*) FROM outbox_events WHERE dispatched_at IS NULL`).Scan(&n))
	return n
}

// TestCleanupNeverDeletesPendingRowsOfAnotherPartition: the rows that share
// a ctid with a dispatched row in another partition stay.
func TestCleanupNeverDeletesPendingRowsOfAnotherPartition(t *testing.T) {
	t.Parallel()
	for shape, ddl := range partitionedShapes {
		t.Run(shape, func(t *testing.T) {
			t.Parallel()
			tbl := MustNew("", Columns{})
			db := connect(t, ddl)
			fillShape(t, db, shape, 5)
			deleted, err := tbl.DeleteAllDispatched(context.Background(), db, time.Hour, 2, nil)
			require.NoError(t, err)
			require.EqualValues(t, 5, deleted, "only the 5 dispatched rows")
			require.Equal(t, 5, pendingCount(t, db), "every pending row is kept")
		})
	}
}

// TestClaimNeverReturnsMoreThanTheBatchAcrossPartitions: a claim of one row
// returns one row, and claims in turn take each pending row exactly once.
func TestClaimNeverReturnsMoreThanTheBatchAcrossPartitions(t *testing.T) {
	t.Parallel()
	for shape, ddl := range partitionedShapes {
		t.Run(shape, func(t *testing.T) {
			t.Parallel()
			tbl := MustNew("", Columns{})
			db := connect(t, ddl)
			// Old rows pending too, so both children hold pending rows at the same ctids.
			fillShape(t, db, shape, 5)
			_, err := db.Exec(context.Background(), `UPDATE outbox_events SET dispatched_at = NULL`)
			require.NoError(t, err)

			seen := map[string]bool{}
			for range 10 {
				claimOne(t, db, tbl, seen)
			}
			require.Len(t, seen, 10)
			require.Zero(t, pendingCount(t, db))
		})
	}
}

func claimOne(t *testing.T, db *pgxpool.Pool, tbl *Table, seen map[string]bool) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		events, err := tbl.Claim(ctx, tx, MarkDispatched, Rows(1))
		require.NoError(t, err)
		require.Len(t, events, 1)
		require.False(t, seen[events[0].ID], "claimed twice: %s", events[0].ID)
		seen[events[0].ID] = true
		return nil
	}))
}

// TestTwoClaimsOnPartitionsAreDisjoint: a claim holding rows in one
// transaction, a second claim in another never returns them.
func TestTwoClaimsOnPartitionsAreDisjoint(t *testing.T) {
	t.Parallel()
	for _, d := range dispatchModes {
		t.Run(d.String(), func(t *testing.T) {
			t.Parallel()
			tbl := MustNew("", Columns{})
			db := connect(t, partitionedShapes["range"])
			fillShape(t, db, "range", 20)
			_, err := db.Exec(context.Background(), `UPDATE outbox_events SET dispatched_at = NULL`)
			require.NoError(t, err)
			ctx := context.Background()
			tx1, err := db.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = tx1.Rollback(ctx) }()
			first, err := tbl.Claim(ctx, tx1, d, Rows(25))
			require.NoError(t, err)
			require.Len(t, first, 25)
			tx2, err := db.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = tx2.Rollback(ctx) }()
			second, err := tbl.Claim(ctx, tx2, d, Rows(25))
			require.NoError(t, err)
			require.Len(t, second, 15)
			ids := map[string]bool{}
			for _, e := range append(first, second...) {
				require.False(t, ids[e.ID], "claimed by both: %s", e.ID)
				ids[e.ID] = true
			}
		})
	}
}

// TestClaimOrdersTiesByID: rows written in one transaction share created_at
// and leave in id order (bigint ids: insertion order).
func TestClaimOrdersTiesByID(t *testing.T) {
	t.Parallel()
	tbl := MustNew("", Columns{})
	db := connect(t, `CREATE TABLE outbox_events (
		id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, event_type text NOT NULL, payload text NOT NULL,
		created_at timestamptz NOT NULL DEFAULT now(), dispatched_at timestamptz);`+tbl.IndexDDL()+`
		INSERT INTO outbox_events (event_type, payload) SELECT 't', g::text FROM generate_series(1, 300) g;`)
	ctx := context.Background()
	require.NoError(t, pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		events, err := tbl.Claim(ctx, tx, MarkDispatched, Rows(300))
		require.NoError(t, err)
		require.Len(t, events, 300)
		for i, e := range events {
			require.Equal(t, itoa(i+1), e.ID)
		}
		return nil
	}))
}

// TestDropDispatchedPartitions: a partition whose rows are all dispatched
// past the retention is dropped whole; one with a pending row, or a
// dispatched row inside the retention, is kept.
func TestDropDispatchedPartitions(t *testing.T) {
	t.Parallel()
	tbl := MustNew("", Columns{})
	db := connect(t, rangePartitionedDDL(tbl)+`
		CREATE TABLE outbox_events_mid PARTITION OF outbox_events FOR VALUES FROM ('2100-01-01') TO ('2100-02-01');
		CREATE TABLE outbox_events_empty PARTITION OF outbox_events FOR VALUES FROM ('2100-02-01') TO ('2100-03-01');`)
	fillShape(t, db, "range", 5)
	ctx := context.Background()
	// mid: dispatched rows, one of them recently.
	_, err := db.Exec(ctx, `INSERT INTO outbox_events (event_type, payload, created_at, dispatched_at) VALUES
		('m', '1', '2100-01-02', now() - interval '2 days'), ('m', '2', '2100-01-03', now())`)
	require.NoError(t, err)

	dropped, needed, err := tbl.DropDispatchedPartitions(ctx, db, db, 24*time.Hour)
	require.NoError(t, err)
	require.Equal(t, []string{"public.outbox_events_old"}, dropped)
	require.Equal(t, []string{"public.outbox_events_empty", "public.outbox_events_mid", "public.outbox_events_new"}, needed,
		"their ranges have not ended")
	require.Equal(t, 5, pendingCount(t, db), "the partition with pending rows is kept")
	var parts int
	require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM pg_inherits WHERE inhparent = 'outbox_events'::regclass`).Scan(&parts))
	require.Equal(t, 3, parts, "new, mid (a recent dispatch) and empty are kept")

	// Not partitioned: nothing to drop.
	plain := connect(t, tbl.DDL(DDLOptions{}))
	dropped, needed, err = tbl.DropDispatchedPartitions(ctx, plain, plain, 0)
	require.NoError(t, err)
	require.Empty(t, dropped)
	require.Empty(t, needed)
}

// rangeTableDDL is an outbox range-partitioned on key (also in its primary
// key), with the given partitions ("name PARTITION OF ..."), and the
// pending index.
func rangeTableDDL(tbl *Table, key string, partitions ...string) string {
	ddl := `CREATE TABLE outbox_events (
		id uuid NOT NULL DEFAULT gen_random_uuid(), event_type text NOT NULL, payload text NOT NULL,
		created_at timestamptz NOT NULL DEFAULT now(), dispatched_at timestamptz,
		PRIMARY KEY (id, ` + key + `)
	) PARTITION BY RANGE (` + key + `);
	`
	for _, p := range partitions {
		ddl += "CREATE TABLE " + p + ";\n"
	}
	return ddl + tbl.IndexDDL()
}

// TestDropPartitionsKeepsThoseANewRowCouldNeed: a partition whose rows are
// all dispatched long ago is still kept when a producer's next insert could
// have nowhere else to go (no default partition can take it): a hash
// partition, a list partition, a range partition whose range has not ended
// (created ahead of time, or the current one), and a range partition of
// another key. Dropping one would fail every insert routed to it.
func TestDropPartitionsKeepsThoseANewRowCouldNeed(t *testing.T) {
	t.Parallel()
	tbl := MustNew("", Columns{})
	ctx := context.Background()
	shapes := map[string]string{
		"hash": partitionedShapes["hash"],
		"list": partitionedShapes["list"],
		"range of another key": rangeTableDDL(tbl, "event_type",
			`outbox_events_a PARTITION OF outbox_events FOR VALUES FROM ('a') TO ('p')`,
			`outbox_events_p PARTITION OF outbox_events FOR VALUES FROM ('p') TO (MAXVALUE)`),
		"range not ended": rangeTableDDL(tbl, "created_at",
			`outbox_events_old PARTITION OF outbox_events FOR VALUES FROM ('2000-01-01') TO ('2100-01-01')`,
			`outbox_events_new PARTITION OF outbox_events FOR VALUES FROM ('2100-01-01') TO (MAXVALUE)`),
	}
	for shape, ddl := range shapes {
		t.Run(shape, func(t *testing.T) {
			t.Parallel()
			db := connect(t, ddl)
			// Rows of type 'old', all dispatched long ago, fill a partition of each shape.
			_, err := db.Exec(ctx, `INSERT INTO outbox_events (event_type, payload, created_at, dispatched_at)
				SELECT 'old', 'o' || g, '2025-06-01'::timestamptz + g * interval '1 s', '2025-06-02'
				FROM generate_series(1, 5) g`)
			require.NoError(t, err)
			dropped, needed, err := tbl.DropDispatchedPartitions(ctx, db, db, 0)
			require.NoError(t, err)
			require.Empty(t, dropped)
			require.Len(t, needed, 2)
			_, err = db.Exec(ctx, `INSERT INTO outbox_events (event_type, payload) VALUES ('old', '{}')`)
			require.NoError(t, err, "a producer still writes events of type 'old', created now")
		})
	}
}

// TestBacklogReportsAMissingKeyColumn: the operator's backlog check shows a
// key column that does not exist, as it does the other columns.
func TestBacklogReportsAMissingKeyColumn(t *testing.T) {
	t.Parallel()
	plain := MustNew("", Columns{})
	db := connect(t, plain.DDL(DDLOptions{}))
	_, err := MustNew("", Columns{Key: "aggregate_id"}).Backlog(context.Background(), db)
	require.ErrorIs(t, err, ErrColumnNotFound)
	require.ErrorContains(t, err, "aggregate_id")
	_, err = db.Exec(context.Background(), `ALTER TABLE outbox_events ADD COLUMN aggregate_id text`)
	require.NoError(t, err)
	_, err = MustNew("", Columns{Key: "aggregate_id"}).Backlog(context.Background(), db)
	require.NoError(t, err)
}

// dropWaitingForALock runs DropDispatchedPartitions (retention 0) in the
// background and returns once its session waits for a lock, with a channel
// of its result.
func dropWaitingForALock(t *testing.T, tbl *Table, db *pgxpool.Pool) <-chan []string {
	t.Helper()
	ctx := context.Background()
	done := make(chan []string, 1)
	go func() {
		dropped, _, err := tbl.DropDispatchedPartitions(ctx, db, db, 0)
		assert.NoError(t, err)
		done <- dropped
	}()
	testenv.Eventually(t, 10*time.Second, "the drop waiting for a lock", func() error {
		var waiting bool
		err := db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE 'LOCK TABLE%')`).Scan(&waiting)
		if err == nil && !waiting {
			err = errors.New("not waiting")
		}
		return err
	})
	select {
	case dropped := <-done:
		t.Fatalf("the drop did not wait: dropped %v", dropped)
	default:
	}
	return done
}

// TestDropPartitionsWaitsForAClaim: a claim in flight (not committed: its
// batch is being published) holds pending rows of an old partition; the
// drop waits for it, and when the claim rolls back (the publish failed)
// the partition and its pending rows stay. In both dispatch modes.
func TestDropPartitionsWaitsForAClaim(t *testing.T) {
	t.Parallel()
	for _, d := range []Dispatch{MarkDispatched, DeleteOnDispatch} {
		t.Run(d.String(), func(t *testing.T) {
			t.Parallel()
			tbl := MustNew("", Columns{})
			db := connect(t, rangePartitionedDDL(tbl)+`
				INSERT INTO outbox_events (event_type, payload, created_at, dispatched_at) VALUES
				('a', '1', '2025-01-01', NULL), ('a', '2', '2025-01-02', NULL), ('a', '3', '2025-01-03', NULL),
				('a', '4', '2024-01-01', '2024-01-02'), ('a', '5', '2024-01-01', '2024-01-02');`)
			ctx := context.Background()
			tx, err := db.Begin(ctx)
			require.NoError(t, err)
			claimed, err := tbl.Claim(ctx, tx, d, Rows(10))
			require.NoError(t, err)
			require.Len(t, claimed, 3)

			done := dropWaitingForALock(t, tbl, db)
			require.NoError(t, tx.Rollback(ctx))
			require.Empty(t, <-done, "the claim rolled back: its rows are pending again")
			require.Equal(t, 3, pendingCount(t, db))
		})
	}
}

// TestDropPartitionsWaitsForAProducer: an old partition whose rows are all
// dispatched, and a producer's insert into it not yet committed (a late
// created_at): the drop waits for it and keeps the partition.
func TestDropPartitionsWaitsForAProducer(t *testing.T) {
	t.Parallel()
	tbl := MustNew("", Columns{})
	db := connect(t, rangePartitionedDDL(tbl)+`
		INSERT INTO outbox_events (event_type, payload, created_at, dispatched_at) VALUES
		('a', '4', '2024-01-01', '2024-01-02'), ('a', '5', '2024-01-01', '2024-01-02');`)
	ctx := context.Background()
	tx, err := db.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `INSERT INTO outbox_events (event_type, payload, created_at) VALUES ('p', 'late', '2025-03-01')`)
	require.NoError(t, err)

	done := dropWaitingForALock(t, tbl, db)
	require.NoError(t, tx.Commit(ctx))
	require.Empty(t, <-done, "the late row is pending")
	require.Equal(t, 1, pendingCount(t, db))
}
