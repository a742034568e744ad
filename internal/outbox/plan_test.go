package outbox

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outbox-dev/outbox-operator/internal/testenv"
)

// connectRelay opens a pool with the relay's planner settings.
func connectRelay(t *testing.T, ddl string) *pgxpool.Pool {
	t.Helper()
	cfg, err := PoolConfig(testenv.Postgres(t), SessionSettings{StatementTimeout: time.Minute, StablePlans: true}, 2)
	require.NoError(t, err)
	db, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(db.Close)
	_, err = db.Exec(context.Background(), ddl)
	require.NoError(t, err)
	return db
}

func explain(t *testing.T, db *pgxpool.Pool, sql string, args ...any) string {
	t.Helper()
	rows, err := db.Query(context.Background(), "EXPLAIN "+sql, args...)
	require.NoError(t, err)
	var plan strings.Builder
	for rows.Next() {
		var line string
		require.NoError(t, rows.Scan(&line))
		plan.WriteString(line + "\n")
	}
	require.NoError(t, rows.Err())
	return plan.String()
}

// TestClaimPlanDoesNotDependOnStatistics asserts the claim's plan shape in
// the states where statistics mislead the planner: an outbox never
// analyzed, one analyzed while empty and then filled, and one with many
// dispatched rows analyzed while few were pending. In each, the pending rows
// are read in order from the partial index and joined back by TID: no
// sequential or bitmap scan, no hash join, whatever the statistics say.
func TestClaimPlanDoesNotDependOnStatistics(t *testing.T) {
	t.Parallel()
	tbl := MustNew("", Columns{})
	fill := func(pending, dispatched int) string {
		return `INSERT INTO outbox_events (event_type, payload, dispatched_at)
			SELECT 't', 'p', CASE WHEN g <= ` + itoa(dispatched) + ` THEN now() END
			FROM generate_series(1, ` + itoa(pending+dispatched) + `) g;`
	}
	for name, setup := range map[string]string{
		"never analyzed":           fill(5000, 0),
		"analyzed while empty":     "ANALYZE outbox_events;" + fill(5000, 0),
		"many dispatched analyzed": fill(10, 200000) + "ANALYZE outbox_events;" + fill(5000, 0),
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			db := connectRelay(t, tbl.DDL(DDLOptions{})+setup)
			for _, d := range dispatchModes {
				plan := explain(t, db, tbl.ClaimSQL(d), 500)
				require.Contains(t, plan, "Index Scan using "+tbl.PendingIndexName(), plan)
				require.Contains(t, plan, "Tid Scan", plan)
				requireNoBadScan(t, plan)
			}
		})
	}
}

// TestClaimPlanOnPartitions asserts the same shape on a partitioned outbox:
// each partition's own pending index, joined back by TID.
func TestClaimPlanOnPartitions(t *testing.T) {
	t.Parallel()
	tbl := MustNew("", Columns{})
	db := connectRelay(t, rangePartitionedDDL(tbl)+`
		INSERT INTO outbox_events (event_type, payload, created_at)
		SELECT 't', 'p', '2026-01-01'::timestamptz + g * interval '1 minute' FROM generate_series(1, 4000) g;`)
	for _, d := range dispatchModes {
		plan := explain(t, db, tbl.ClaimSQL(d), 500)
		require.Contains(t, plan, "Tid Scan", plan)
		requireNoBadScan(t, plan)
	}
}

// TestKeyedClaimPlan: the claim of ordering PerKey reads the pending index
// too, and filters on the partition, on a table analyzed while empty.
func TestKeyedClaimPlan(t *testing.T) {
	t.Parallel()
	tbl := MustNew("", Columns{Key: "aggregate_id"})
	db := connectRelay(t, MustNew("", Columns{}).DDL(DDLOptions{})+`
		ALTER TABLE outbox_events ADD COLUMN aggregate_id text;
		ANALYZE outbox_events;
		INSERT INTO outbox_events (event_type, payload, aggregate_id) SELECT 't', 'p', 'k' || (g % 50) FROM generate_series(1, 5000) g;`)
	for _, d := range dispatchModes {
		plan := explain(t, db, tbl.ClaimKeyedSQL(d), 500, 32, []int64{1, 2, 3})
		require.Contains(t, plan, "Index Scan using "+tbl.PendingIndexName(), plan)
		require.Contains(t, plan, "Tid Scan", plan)
		requireNoBadScan(t, plan)
	}
}

// dispatchModes are both claims: marking and deleting.
var dispatchModes = []Dispatch{MarkDispatched, DeleteOnDispatch}

// requireNoBadScan fails on the plan shapes that only statistics justify.
func requireNoBadScan(t *testing.T, plan string) {
	t.Helper()
	for _, bad := range []string{"Seq Scan", "Bitmap", "Hash Join", "Merge Join"} {
		require.NotContains(t, plan, bad, plan)
	}
}
