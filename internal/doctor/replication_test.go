package doctor

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outbox-dev/outbox-operator/internal/logical"
	"github.com/outbox-dev/outbox-operator/internal/testenv"
)

func TestReplicationChecksJudgeTheFacts(t *testing.T) {
	t.Parallel()
	good := ReplicationFacts{WALLevel: "logical", MaxSlotWALKeepSize: 10 << 30, Replication: true,
		Slot: logical.SlotStatus{Exists: true, Active: true, WALStatus: "reserved", RetainedBytes: 5 << 20}}
	for name, tc := range map[string]struct {
		change func(*ReplicationFacts)
		check  string
		status Status
		want   string
	}{
		"healthy":      {func(*ReplicationFacts) {}, "replication.slot", OK, "retains 5.0 MiB of WAL (active: true)"},
		"wal_level":    {func(f *ReplicationFacts) { f.WALLevel = "replica" }, "replication.wal_level", Fail, "wal_level is replica"},
		"no role attr": {func(f *ReplicationFacts) { f.Replication = false }, "replication.role", Fail, "no REPLICATION attribute"},
		"unbounded": {func(f *ReplicationFacts) { f.MaxSlotWALKeepSize = -1 }, "replication.max_slot_wal_keep_size", Warn,
			"until the disk is full"},
		"bounded": {func(*ReplicationFacts) {}, "replication.max_slot_wal_keep_size", OK, "is 10.0 GiB"},
		"missing": {func(f *ReplicationFacts) { f.Slot = logical.SlotStatus{} }, "replication.slot", Info, "creates it when it starts"},
		"lost":    {func(f *ReplicationFacts) { f.Slot.WALStatus = "lost" }, "replication.slot", Fail, "is invalidated"},
		"retained": {
			func(f *ReplicationFacts) { f.Slot.RetainedBytes = 3 << 30 }, "replication.slot", Warn, "retains 3.0 GiB of WAL, above 1.0 GiB",
		},
	} {
		t.Run(name, func(t *testing.T) {
			f := good
			tc.change(&f)
			c := byName(ReplicationChecks(f, "s", DefaultMaxRetainedWAL))[tc.check]
			require.Equal(t, tc.status, c.Status, c.Message)
			require.Contains(t, c.Message, tc.want)
		})
	}
}

// TestGatherReplication reads the shared test server: wal_level logical,
// max_slot_wal_keep_size unset, a superuser, and a slot before and after
// it exists.
func TestGatherReplication(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db, err := pgxpool.New(ctx, testenv.Postgres(t))
	require.NoError(t, err)
	t.Cleanup(db.Close)

	checks := byName(ReplicationChecks(GatherReplication(ctx, db, "doctor_slot"), "doctor_slot", DefaultMaxRetainedWAL))
	require.Equal(t, OK, checks["replication.wal_level"].Status, checks["replication.wal_level"].Message)
	require.Equal(t, OK, checks["replication.role"].Status)
	require.Equal(t, Warn, checks["replication.max_slot_wal_keep_size"].Status)
	require.Equal(t, Info, checks["replication.slot"].Status)

	_, err = db.Exec(ctx, `SELECT pg_create_logical_replication_slot('doctor_slot', 'pgoutput')`)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, logical.DropSlot(context.Background(), db, "doctor_slot")) })
	checks = byName(ReplicationChecks(GatherReplication(ctx, db, "doctor_slot"), "doctor_slot", DefaultMaxRetainedWAL))
	require.Equal(t, OK, checks["replication.slot"].Status, checks["replication.slot"].Message)
	require.Contains(t, checks["replication.slot"].Message, "active: false")
}
