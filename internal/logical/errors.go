package logical

import (
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// Errors that callers map to conditions, log lines and metrics. Each comes
// wrapped with the server's message.
var (
	// ErrWALLevel: the server's wal_level is not logical, so it cannot decode
	// its WAL into changes.
	ErrWALLevel = errors.New("wal_level is not logical: set wal_level=logical (postgresql.conf or ALTER SYSTEM) " +
		"and restart PostgreSQL; a reload is not enough")
	// ErrSlotInvalidated: the server removed WAL the slot still needed
	// (max_slot_wal_keep_size) and the slot can no longer stream. The events
	// written since its last confirmed position must be recovered by polling;
	// drop the slot and set up a new one.
	ErrSlotInvalidated = errors.New("replication slot invalidated")
	// ErrSlotInUse: another session (another relay, or the walsender of a
	// connection not yet closed) streams from the slot.
	ErrSlotInUse = errors.New("replication slot in use")
	// ErrSlotNotFound: the slot does not exist (Setup creates it).
	ErrSlotNotFound = errors.New("replication slot not found")
)

// The SQLSTATE codes this package tells apart (PostgreSQL's documentation,
// appendix A).
const (
	codeObjectNotInPrerequisiteState = "55000"
	codeObjectInUse                  = "55006"
	codeUndefinedObject              = "42704"
	codeDuplicateObject              = "42710"
	codeUniqueViolation              = "23505"
)

// Messages that tell the meanings of one SQLSTATE apart. PostgreSQL 16 and
// later say an invalidated slot "can no longer get changes"; 15 says it
// cannot read from the slot, with a detail naming the invalidation.
const (
	msgInvalidated    = "can no longer get changes from replication slot"
	msgCannotRead     = "cannot read from logical replication slot"
	detailInvalidated = "invalidated"
	msgWALLevel       = "wal_level"
	msgReplSlot       = "replication slot"
	msgPublication    = "publication"
)

// walStatusLost is the wal_status of an invalidated slot.
const walStatusLost = "lost"

// errLost is ErrSlotInvalidated as the slot's own status reports it, before
// anything tries to stream.
var errLost = fmt.Errorf("%w: wal_status is lost: the server removed WAL the slot needed (max_slot_wal_keep_size); "+
	"drop the slot, set it up again and poll the table for what was written meanwhile", ErrSlotInvalidated)

// classify maps the errors of the server that this package gives a meaning
// to onto its sentinels, keeping the original in the chain; others are
// returned as they are. It serves every statement of the package: the slot's
// creation, START_REPLICATION and the stream itself.
func classify(err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return err
	}
	switch pgErr.Code {
	case codeObjectNotInPrerequisiteState:
		switch {
		case strings.Contains(pgErr.Message, msgInvalidated),
			strings.Contains(pgErr.Message, msgCannotRead) && strings.Contains(pgErr.Detail, detailInvalidated):
			return fmt.Errorf("%w: %w", ErrSlotInvalidated, err)
		case strings.Contains(pgErr.Message, msgWALLevel): // "logical decoding requires wal_level >= logical"
			return fmt.Errorf("%w: %w", ErrWALLevel, err)
		}
	case codeObjectInUse:
		if strings.Contains(pgErr.Message, msgReplSlot) {
			return fmt.Errorf("%w: %w", ErrSlotInUse, err)
		}
	case codeUndefinedObject:
		switch {
		case strings.Contains(pgErr.Message, msgReplSlot):
			return fmt.Errorf("%w: %w", ErrSlotNotFound, err)
		case strings.HasPrefix(pgErr.Message, msgPublication): // publication "p" does not exist, while decoding
			return fmt.Errorf("%w: %w", ErrPublicationDropped, err)
		}
	}
	return err
}

// checkWALLevel returns ErrWALLevel, naming the setting found, unless level
// is logical.
func checkWALLevel(level string) error {
	if level == "logical" {
		return nil
	}
	return fmt.Errorf("%w (the server has wal_level=%s)", ErrWALLevel, level)
}
