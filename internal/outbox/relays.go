package outbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// One OutboxRelay per table (docs/api.md). The relays of a table register
// in the relays table beside it, one row per stream and slot ("" for source
// Polling), refreshed while they run: the database is the one place every
// relay of the table shares, whatever its namespace, Secret or cluster. A
// relay that finds another one publishing to another stream, or with the
// other source, says so (relay.go); cleanup --slot deletes nothing while a
// relay of another stream is registered (DeleteStreamed).

// RelaysTableName is the name of the relays table, in the outbox table's
// schema.
func (t *Table) RelaysTableName() string { return t.objectName("relays") }

// RelaysTable is that table's name as a person would type it.
func (t *Table) RelaysTable() string {
	if t.schema != "" {
		return t.schema + "." + t.RelaysTableName()
	}
	return t.RelaysTableName()
}

// relays fills a statement on the relays table (%[14]s).
func (t *Table) relays(tmpl string) string { return t.format(tmpl, t.qualified(t.RelaysTableName())) }

const (
	// relaysDDL (with %[14]s the table) creates the relays table; created
	// with the stream-resets table (StreamResetsDDL).
	relaysDDL = `CREATE TABLE IF NOT EXISTS %[14]s (
	stream text NOT NULL,
	slot text NOT NULL DEFAULT '',
	first_seen_at timestamptz NOT NULL DEFAULT now(),
	seen_at timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (stream, slot)
);`

	// recordRelaySQL registers a relay, or refreshes its row, and returns
	// the server's clock.
	recordRelaySQL = `INSERT INTO %[14]s AS r (stream, slot) VALUES ($1, $2)
ON CONFLICT (stream, slot) DO UPDATE SET seen_at = now()
RETURNING clock_timestamp()`

	// readRelaysSQL lists the relays registered, and the server's clock.
	readRelaysSQL = `SELECT stream, slot, seen_at, clock_timestamp() FROM %[14]s ORDER BY stream, slot`
)

// TableRelay is a relay of the table as the relays table has it: the relays
// of one stream and slot share a row.
type TableRelay struct {
	Stream string `json:"stream"`
	// Slot is the replication slot of source LogicalReplication, "" for
	// source Polling.
	Slot string `json:"slot,omitempty"`
	// SeenAt is when such a relay last refreshed the row (the server's clock).
	SeenAt time.Time `json:"seenAt"`
}

// String names the relay by its stream and source, never by its database.
func (r TableRelay) String() string {
	if r.Slot == "" {
		return fmt.Sprintf("stream %s (source Polling)", r.Stream)
	}
	return fmt.Sprintf("stream %s (source LogicalReplication, slot %s)", r.Stream, r.Slot)
}

// Conflicts reports whether relays r and o cannot share a table: they
// publish to different streams, or one claims rows (Polling) while the
// other streams them from a slot. Relays of one stream and source (the
// members of an ordering, standbys, replicas) share it by design.
func (r TableRelay) Conflicts(o TableRelay) bool {
	return r.Stream != o.Stream || (r.Slot == "") != (o.Slot == "")
}

// RelaySeenWindow is how long after its last refresh a relay's row stands
// for a running relay, to the readers of the relays table other than the
// relays (relay doctor, the operator's backlog check): three refreshes of
// the relays' default interval (relay.DefaultTableCheckInterval).
const RelaySeenWindow = 30 * time.Second

// RecentConflicts returns the relays that conflict with self (Conflicts)
// and refreshed their row within window before now (the server's clock).
func RecentConflicts(relays []TableRelay, self TableRelay, now time.Time, window time.Duration) []TableRelay {
	var others []TableRelay
	for _, r := range relays {
		if self.Conflicts(r) && now.Sub(r.SeenAt) <= window {
			others = append(others, r)
		}
	}
	return others
}

// ConflictingRelays lists the relays registered that conflict with self
// and were seen within RelaySeenWindow. Without the relays table, or
// without the right to read it (a role of an earlier version's grants),
// nothing is known: none, and no error.
func (t *Table) ConflictingRelays(ctx context.Context, q Querier, self TableRelay) ([]TableRelay, error) {
	relays, now, ok, err := t.ReadRelays(ctx, q)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == codeInsufficientPrivilege {
		return nil, nil
	}
	if err != nil || !ok {
		return nil, err
	}
	return RecentConflicts(relays, self, now, RelaySeenWindow), nil
}

// RelaysDDL creates the relays table, for an existing table.
func (t *Table) RelaysDDL() string { return t.relays(relaysDDL) + "\n" }

// RecordRelay registers r (its stream and slot), or refreshes its row, and
// returns the server's clock.
func (t *Table) RecordRelay(ctx context.Context, q Querier, r TableRelay) (time.Time, error) {
	var now time.Time
	if err := q.QueryRow(ctx, t.relays(recordRelaySQL), r.Stream, r.Slot).Scan(&now); err != nil {
		return time.Time{}, t.classify(fmt.Errorf("registering the relay in %s: %w", t.RelaysTable(), err))
	}
	return now, nil
}

// ReadRelays lists the relays registered and returns the server's clock;
// ok is false when the relays table does not exist (relays of an earlier
// version, or a role that may not create it: nothing is known).
func (t *Table) ReadRelays(ctx context.Context, q Querier) (relays []TableRelay, now time.Time, ok bool, err error) {
	rows, err := q.Query(ctx, t.relays(readRelaysSQL))
	if err == nil {
		for rows.Next() {
			var r TableRelay
			if err = rows.Scan(&r.Stream, &r.Slot, &r.SeenAt, &now); err != nil {
				break
			}
			relays = append(relays, r)
		}
		rows.Close()
		err = errors.Join(err, rows.Err())
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == codeUndefinedTable {
		return nil, time.Time{}, false, nil
	}
	if err != nil {
		return nil, time.Time{}, false, t.classify(fmt.Errorf("reading %s: %w", t.RelaysTable(), err))
	}
	if now.IsZero() {
		if now, err = Now(ctx, q); err != nil {
			return nil, time.Time{}, false, err
		}
	}
	return relays, now, true, nil
}

// ErrTableShared: relays of other streams, or of the other source, relay
// the outbox table (one OutboxRelay per table).
var ErrTableShared = errors.New("the outbox table is relayed by relays of other streams or sources (one OutboxRelay per table)")

// SlotNotAloneError is cleanup --slot refusing to delete: relays of other
// streams than the slot's relay are registered, and rows they have not
// published yet would be deleted with those the slot's relay published.
type SlotNotAloneError struct {
	Slot        string
	Others      []TableRelay
	RelaysTable string
}

func (e *SlotNotAloneError) Error() string {
	names := make([]string, 0, len(e.Others))
	for _, o := range e.Others {
		names = append(names, fmt.Sprintf("%s, last seen %s", o, o.SeenAt.UTC().Format(time.RFC3339)))
	}
	return fmt.Sprintf("%v: deleting nothing by the progress of slot %s, as other relays of the table publish to other "+
		"streams and may not have published those rows: %s. Relay the table with one OutboxRelay; once such a relay is "+
		"gone for good, forget it: DELETE FROM %s WHERE stream = '<stream>' AND slot = '<slot>'",
		ErrTableShared, e.Slot, strings.Join(names, "; "), e.RelaysTable)
}

func (e *SlotNotAloneError) Unwrap() error { return ErrTableShared }

// CheckSlotAlone returns a SlotNotAloneError when relays are registered
// that publish to other streams than slot's relay (a Polling relay, or a
// relay of another slot): the rows slot's relay published, which
// DeleteStreamed deletes, may not be in theirs. Relays of the slot's own
// streams are no reason: the slot's relay published those rows there. A
// slot not registered (its relay is of an earlier version) has no stream
// known: every other relay is a reason. Without the relays table it knows
// nothing, and returns nil.
func (t *Table) CheckSlotAlone(ctx context.Context, q Querier, slot string) error {
	relays, _, ok, err := t.ReadRelays(ctx, q)
	if err != nil || !ok {
		return err
	}
	var streams []string
	for _, r := range relays {
		if r.Slot == slot {
			streams = append(streams, r.Stream)
		}
	}
	var others []TableRelay
	for _, r := range relays {
		if r.Slot != slot && !slices.Contains(streams, r.Stream) {
			others = append(others, r)
		}
	}
	if len(others) > 0 {
		return &SlotNotAloneError{Slot: slot, Others: others, RelaysTable: t.RelaysTable()}
	}
	return nil
}
