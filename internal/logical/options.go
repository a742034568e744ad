package logical

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"regexp"
	"time"

	"github.com/outbox-dev/outbox-operator/internal/outbox"
)

// DefaultStatusInterval is how often a Reader tells the server its position
// when nothing else makes it: well below wal_sender_timeout (60s by default),
// after which the server drops a silent client.
const DefaultStatusInterval = 10 * time.Second

// SlotPattern is what a slot name must match: PostgreSQL's own rule for slot
// names (lower-case letters, digits and underscores, at most 63 bytes).
// START_REPLICATION takes the name unquoted, so nothing else may pass.
const SlotPattern = `^[a-z0-9_]{1,63}$`

var slotRE = regexp.MustCompile(SlotPattern)

// ErrInvalidOptions is returned (wrapped) for Options that cannot name a
// stream.
var ErrInvalidOptions = errors.New("invalid logical replication options")

// Options name what a Reader reads.
type Options struct {
	// Table is the outbox table; its columns (outbox.Columns) name the
	// fields of an event.
	Table *outbox.Table
	// Slot is the logical replication slot, one per relay of the table (a
	// slot serves one session at a time). It must match SlotPattern.
	Slot string
	// Publication is the publication of the table's inserts; empty means
	// Table.PublicationName().
	Publication string
	// StatusInterval is how often the Reader sends the server a standby
	// status update while it waits (0: DefaultStatusInterval). Keep it well
	// below the server's wal_sender_timeout.
	StatusInterval time.Duration
	// BeforeCreateSlot, when set, runs in Setup right before it creates the
	// slot, only when the slot is missing; its error stops Setup before the
	// slot exists. What the slot cannot stream (every commit before it) is
	// the caller's to record first: a relay marks a catch-up due.
	BeforeCreateSlot func(ctx context.Context) error
}

// PublicationName is the publication of o: Publication, or by default the
// table's (outbox.Table.PublicationName).
func (o Options) PublicationName() string {
	return cmp.Or(o.Publication, o.Table.PublicationName())
}

// withDefaults validates o and fills in the defaults.
func (o Options) withDefaults() (Options, error) {
	if o.Table == nil {
		return o, fmt.Errorf("%w: no table", ErrInvalidOptions)
	}
	if err := ValidateSlot(o.Slot); err != nil {
		return o, err
	}
	o.Publication = o.PublicationName()
	if err := outbox.ValidateIdentifier("publication", o.Publication); err != nil {
		return o, fmt.Errorf("%w: %w", ErrInvalidOptions, err)
	}
	if o.StatusInterval < 0 {
		return o, fmt.Errorf("%w: status interval %s is negative", ErrInvalidOptions, o.StatusInterval)
	}
	o.StatusInterval = cmp.Or(o.StatusInterval, DefaultStatusInterval)
	return o, nil
}

// ValidateSlot reports whether name can be a replication slot's name.
func ValidateSlot(name string) error {
	if !slotRE.MatchString(name) {
		return fmt.Errorf("%w: slot %.70q must match %s (lower-case letters, digits and underscores, at most 63)",
			ErrInvalidOptions, name, SlotPattern)
	}
	return nil
}
