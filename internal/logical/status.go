package logical

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/outbox-dev/outbox-operator/internal/outbox"
)

// SlotStatus is what pg_replication_slots says of a slot: whether a Reader
// streams from it, and how much WAL it makes the server keep. A slot nobody
// confirms keeps WAL until the disk is full, unless max_slot_wal_keep_size
// bounds it, at the price of invalidating the slot (WALStatus "lost").
type SlotStatus struct {
	// Exists is false when there is no such slot; the other fields are then
	// zero.
	Exists bool
	// Active: a walsender streams from the slot.
	Active bool
	// WALStatus is the server's word for the WAL the slot needs: reserved,
	// extended (past max_wal_size, still kept), unreserved (to be removed
	// at the next checkpoint) or lost (removed: the slot is invalidated).
	WALStatus string
	// RetainedBytes is the WAL the slot keeps: from its restart_lsn to the
	// server's current position. 0 once it is lost.
	RetainedBytes int64
	// LagBytes is the WAL not yet confirmed: from the slot's
	// confirmed_flush_lsn to the server's current position.
	LagBytes int64
	// SafeWALSize is how much more WAL can be written before the slot is
	// lost; nil when max_slot_wal_keep_size is unset (-1), so nothing bounds
	// what the slot keeps.
	SafeWALSize *int64
	// ConfirmedFlush is the position the stream resumes from.
	ConfirmedFlush pglogrepl.LSN
}

// Status reads the state of the slot, on an ordinary connection.
func Status(ctx context.Context, q outbox.Querier, slot string) (SlotStatus, error) {
	if err := ValidateSlot(slot); err != nil {
		return SlotStatus{}, err
	}
	var (
		s                 = SlotStatus{Exists: true}
		walStatus         *string
		retained, lag     *int64
		confirmedFlushLSN *string
	)
	err := q.QueryRow(ctx, statusSQL, slot).Scan(&s.Active, &walStatus, &retained, &lag, &s.SafeWALSize, &confirmedFlushLSN)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return SlotStatus{}, nil
	case err != nil:
		return SlotStatus{}, fmt.Errorf("reading the status of replication slot %s: %w", slot, err)
	}
	s.WALStatus = deref(walStatus)
	s.RetainedBytes, s.LagBytes = max(deref(retained), 0), max(deref(lag), 0)
	if confirmedFlushLSN != nil {
		if s.ConfirmedFlush, err = pglogrepl.ParseLSN(*confirmedFlushLSN); err != nil {
			return SlotStatus{}, fmt.Errorf("replication slot %s: confirmed_flush_lsn: %w", slot, err)
		}
	}
	return s, nil
}

// MaxSlotWALKeepSize returns the server's max_slot_wal_keep_size in bytes,
// or -1 when it is unset (the default, and the only behaviour before
// PostgreSQL 13): then a slot keeps WAL without bound and can fill the disk.
func MaxSlotWALKeepSize(ctx context.Context, q outbox.Querier) (int64, error) {
	var n int64
	err := q.QueryRow(ctx, maxSlotWALKeepSizeSQL).Scan(&n)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return -1, nil
	case err != nil:
		return 0, fmt.Errorf("reading max_slot_wal_keep_size: %w", err)
	}
	return n, nil
}

// deref returns *p, or the zero value for nil.
func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}
