package doctor

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-dev/outbox-operator/internal/logical"
)

// DefaultMaxRetainedWAL is the WAL a slot may retain before the slot check
// warns: a relay that stopped for a while, or one that falls behind.
const DefaultMaxRetainedWAL int64 = 1 << 30

// replicationRoleSQL: may the role open a replication connection?
const replicationRoleSQL = `SELECT rolreplication OR rolsuper FROM pg_roles WHERE rolname = current_user`

// ReplicationFacts is what GatherReplication learnt for source
// LogicalReplication.
type ReplicationFacts struct {
	WALLevel string
	// MaxSlotWALKeepSize in bytes; -1 when unset.
	MaxSlotWALKeepSize int64
	// Replication: the role has the REPLICATION attribute (or is a
	// superuser).
	Replication bool
	Slot        logical.SlotStatus
	// QueryErr is the first query that failed.
	QueryErr string
}

// GatherReplication reads the server's settings and the slot's state. It
// never fails: what it cannot learn is in QueryErr.
func GatherReplication(ctx context.Context, db *pgxpool.Pool, slot string) ReplicationFacts {
	var f ReplicationFacts
	err := db.QueryRow(ctx, `SHOW wal_level`).Scan(&f.WALLevel)
	if err == nil {
		f.MaxSlotWALKeepSize, err = logical.MaxSlotWALKeepSize(ctx, db)
	}
	if err == nil {
		err = db.QueryRow(ctx, replicationRoleSQL).Scan(&f.Replication)
	}
	if err == nil {
		f.Slot, err = logical.Status(ctx, db, slot)
	}
	if err != nil {
		f.QueryErr = errText(err)
	}
	return f
}

// ReplicationChecks judges the facts for the relay of slot, which may
// retain up to maxRetained bytes of WAL before it warns.
func ReplicationChecks(f ReplicationFacts, slot string, maxRetained int64) Report {
	var r Report
	if f.QueryErr != "" {
		return Report{{Name: "replication.catalog", Status: Fail,
			Message: "reading the replication settings failed: " + f.QueryErr + "."}}
	}
	c := Check{Name: "replication.wal_level", Status: OK, Message: "wal_level is logical."}
	if f.WALLevel != "logical" {
		c.Status, c.Message = Fail, fmt.Sprintf("wal_level is %s: the server writes no logical decoding information.", f.WALLevel)
		c.Fix = "set wal_level = logical (postgresql.conf or ALTER SYSTEM) and restart PostgreSQL."
	}
	r = append(r, c)
	c = Check{Name: "replication.role", Status: OK, Message: "the role may open a replication connection."}
	if !f.Replication {
		c.Status, c.Message = Fail, "the role has no REPLICATION attribute: the relay cannot stream from a slot."
		c.Fix = "ALTER ROLE <role> REPLICATION; (and allow it in pg_hba.conf for the database)."
	}
	r = append(r, c)
	c = Check{Name: "replication.max_slot_wal_keep_size", Status: OK,
		Message: fmt.Sprintf("max_slot_wal_keep_size is %s: a slot that falls behind is invalidated, the disk does not fill.",
			bytesText(f.MaxSlotWALKeepSize))}
	if f.MaxSlotWALKeepSize < 0 {
		c.Status = Warn
		c.Message = "max_slot_wal_keep_size is unset: a relay stopped for long makes its slot keep WAL until the disk is full."
		c.Fix = "set max_slot_wal_keep_size (e.g. 10GB) well above what the relay may fall behind; a slot past it is " +
			"invalidated and the relay catches up from the table (docs/relay.md)."
	}
	r = append(r, c)
	return append(r, SlotCheck(f.Slot, slot, maxRetained))
}

// SlotCheck judges the slot's state.
func SlotCheck(s logical.SlotStatus, slot string, maxRetained int64) Check {
	c := Check{Name: "replication.slot"}
	switch {
	case !s.Exists:
		c.Status, c.Message = Info, fmt.Sprintf("slot %s does not exist yet: the relay creates it when it starts.", slot)
	case s.WALStatus == "lost":
		c.Status = Fail
		c.Message = fmt.Sprintf("slot %s is invalidated: the server removed WAL it had not streamed.", slot)
		c.Fix = "a relay drops and recreates it, then republishes from the table the rows of the gap (docs/relay.md)."
	case s.RetainedBytes > maxRetained:
		c.Status = Warn
		c.Message = fmt.Sprintf("slot %s retains %s of WAL, above %s (active: %t).", slot,
			bytesText(s.RetainedBytes), bytesText(maxRetained), s.Active)
		c.Fix = "check that its relay runs and keeps up; a slot nobody reads keeps WAL until max_slot_wal_keep_size."
	default:
		c.Status, c.Message = OK, fmt.Sprintf("slot %s retains %s of WAL (active: %t).", slot, bytesText(s.RetainedBytes), s.Active)
	}
	return c
}

// bytesText writes a size in the largest binary unit that keeps it at least 1.
func bytesText(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	f, u := float64(n), 0
	for f >= unit && u < 4 {
		f /= unit
		u++
	}
	return fmt.Sprintf("%.1f %ciB", f, "KMGT"[u-1])
}
