package logical

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-dev/outbox-operator/internal/outbox"
)

// Setup creates what a Reader streams from, where missing: the publication
// of the table's inserts and a logical replication slot for pgoutput. It
// runs on an ordinary connection or pool, not in a transaction (a slot
// cannot be created in one that wrote), and is idempotent: a concurrent
// Setup of the same names is fine.
//
// It checks what it finds: the server's wal_level (ErrWALLevel), the table
// (outbox.ErrTableNotFound), that an existing publication publishes the
// table's inserts (some of them: the inheritance children and partitions it
// leaves out are Uncovered's, which a caller adds or refuses to stream
// without) and that an existing slot is a pgoutput slot of this database. A new slot's stream starts at its creation, which waits for the
// transactions running at that moment to end (the slot needs a consistent
// snapshot): ctx bounds that wait.
func Setup(ctx context.Context, q outbox.Querier, o Options) error {
	o, err := o.withDefaults()
	if err != nil {
		return err
	}
	var level string
	if err := q.QueryRow(ctx, walLevelSQL).Scan(&level); err != nil {
		return fmt.Errorf("reading wal_level: %w", err)
	}
	if err := checkWALLevel(level); err != nil {
		return err
	}
	exists, err := o.Table.Exists(ctx, q)
	if err != nil {
		return fmt.Errorf("looking up table %s: %w", o.Table, err)
	}
	if !exists {
		return fmt.Errorf("%w: %s (create it before the publication)", outbox.ErrTableNotFound, o.Table)
	}
	if err := setupPublication(ctx, q, o); err != nil {
		return fmt.Errorf("publication %s: %w", o.Publication, err)
	}
	if err := setupSlot(ctx, q, o.Slot, o.BeforeCreateSlot); err != nil {
		return fmt.Errorf("replication slot %s: %w", o.Slot, err)
	}
	return nil
}

// setupPublication creates the publication unless it exists, then checks
// that it streams the table's inserts.
func setupPublication(ctx context.Context, q outbox.Querier, o Options) error {
	var inserts bool
	err := q.QueryRow(ctx, publicationSQL, o.Publication).Scan(&inserts)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		stmt := fmt.Sprintf(createPublicationSQL, pgx.Identifier{o.Publication}.Sanitize(), quotedTable(o.Table))
		if _, err := q.Exec(ctx, stmt); err != nil && !isDuplicate(err) {
			return fmt.Errorf("creating: %w", err)
		}
		if err := q.QueryRow(ctx, publicationSQL, o.Publication).Scan(&inserts); err != nil {
			return fmt.Errorf("reading back: %w", err)
		}
	case err != nil:
		return fmt.Errorf("looking up: %w", err)
	}
	if !inserts {
		return fmt.Errorf("exists but does not publish inserts: ALTER PUBLICATION %s SET (publish = 'insert')", o.Publication)
	}
	var covered bool
	if err := q.QueryRow(ctx, publicationCoversSQL, o.Publication, quotedTable(o.Table)).Scan(&covered); err != nil {
		return fmt.Errorf("checking its tables: %w", err)
	}
	if !covered {
		return fmt.Errorf("exists but does not cover table %s: ALTER PUBLICATION %s ADD TABLE %s, or name another publication",
			o.Table, o.Publication, o.Table)
	}
	version, err := serverVersion(ctx, q)
	if err != nil {
		return err
	}
	return checkPublicationFilter(ctx, q, o, version)
}

// serverVersion reads the server's version as a number (150004).
func serverVersion(ctx context.Context, q outbox.Querier) (int, error) {
	var version int
	if err := q.QueryRow(ctx, serverVersionSQL).Scan(&version); err != nil {
		return 0, fmt.Errorf("reading the server's version: %w", err)
	}
	return version, nil
}

// checkPublicationFilter refuses a publication that lists the table (or a
// relation of its tree) with a row filter or a column list (PostgreSQL 15):
// pgoutput leaves out the rows a filter rejects, and the slot is then
// confirmed past them, so their events would be lost without a trace.
func checkPublicationFilter(ctx context.Context, q outbox.Querier, o Options, version int) error {
	if version < 150000 {
		return nil // no row filters or column lists before PostgreSQL 15
	}
	var rel, filter string
	var columns bool
	err := q.QueryRow(ctx, publicationFilterSQL, o.Publication, quotedTable(o.Table)).Scan(&rel, &filter, &columns)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil
	case err != nil:
		return fmt.Errorf("checking its row filters: %w", err)
	}
	what := "a column list"
	if filter != "" {
		what = "a row filter (WHERE " + filter + ")"
	}
	return fmt.Errorf("lists %s with %s: the rows it leaves out would never reach the stream; "+
		"ALTER PUBLICATION %s SET TABLE %s (no WHERE, no column list), or name another publication",
		rel, what, o.Publication, rel)
}

// setupSlot creates the slot unless it exists, then checks that it is one
// a Reader of this database can stream from.
func setupSlot(ctx context.Context, q outbox.Querier, slot string, beforeCreate func(context.Context) error) error {
	var plugin, walStatus *string
	var here *bool
	err := q.QueryRow(ctx, slotSQL, slot).Scan(&plugin, &here, &walStatus)
	if errors.Is(err, pgx.ErrNoRows) {
		if beforeCreate != nil {
			if err := beforeCreate(ctx); err != nil {
				return err
			}
		}
		if _, err := q.Exec(ctx, createSlotSQL, slot); err != nil && !isDuplicate(err) {
			return fmt.Errorf("creating: %w", classify(err))
		}
		err = q.QueryRow(ctx, slotSQL, slot).Scan(&plugin, &here, &walStatus)
	}
	if err != nil {
		return fmt.Errorf("looking up: %w", err)
	}
	if err := checkSlot(plugin, here); err != nil {
		return err
	}
	if deref(walStatus) == walStatusLost {
		return errLost
	}
	return nil
}

// checkSlot says what is wrong with a slot of another kind than Setup makes:
// a physical one (no plugin, no database), another plugin's, another
// database's.
func checkSlot(plugin *string, thisDatabase *bool) error {
	switch {
	case plugin == nil:
		return errors.New("exists but is a physical slot, not a logical one: choose another name")
	case *plugin != "pgoutput":
		return fmt.Errorf("exists but decodes with plugin %s, not pgoutput: choose another name", *plugin)
	case thisDatabase == nil || !*thisDatabase:
		return errors.New("exists but belongs to another database: slot names are per server, choose another name")
	}
	return nil
}

// isDuplicate reports an object created meanwhile by a concurrent Setup:
// duplicate_object, or, for a publication whose catalog row a concurrent
// CREATE inserted first, unique_violation.
func isDuplicate(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == codeDuplicateObject || pgErr.Code == codeUniqueViolation)
}

// dropSlotAttempts and dropSlotWait bound how long DropSlot waits for a
// walsender it terminated to let go of the slot, and how often it looks.
const (
	dropSlotAttempts = 100
	dropSlotWait     = 50 * time.Millisecond
)

// DropSlot drops the slot, and with it the WAL it keeps. A slot held by a
// walsender (a Reader still connected) is released first: its backend is
// terminated, then DropSlot waits briefly for the slot to be free. A missing
// slot is not an error.
func DropSlot(ctx context.Context, q outbox.Querier, slot string) error {
	if err := ValidateSlot(slot); err != nil {
		return err
	}
	var last error
	for range dropSlotAttempts {
		var pid *int64
		err := q.QueryRow(ctx, slotPIDSQL, slot).Scan(&pid)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			return nil
		case err != nil:
			return fmt.Errorf("dropping replication slot %s: %w", slot, err)
		case pid != nil:
			if _, err := q.Exec(ctx, terminateSQL, *pid); err != nil {
				return fmt.Errorf("dropping replication slot %s: terminating its walsender (pid %d): %w", slot, *pid, err)
			}
		default:
			_, err = q.Exec(ctx, dropSlotSQL, slot)
			switch err = classify(err); {
			case err == nil, errors.Is(err, ErrSlotNotFound):
				return nil
			case !errors.Is(err, ErrSlotInUse): // in use: taken again, or not yet let go
				return fmt.Errorf("dropping replication slot %s: %w", slot, err)
			}
			last = err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("dropping replication slot %s: %w", slot, ctx.Err())
		case <-time.After(dropSlotWait):
		}
	}
	return fmt.Errorf("dropping replication slot %s: still held after %s: %w",
		slot, dropSlotAttempts*dropSlotWait, cmpErr(last, ErrSlotInUse))
}

// cmpErr returns err, or def when err is nil.
func cmpErr(err, def error) error {
	if err != nil {
		return err
	}
	return def
}

// DropPublication drops the publication of o, if it exists.
func DropPublication(ctx context.Context, q outbox.Querier, o Options) error {
	o, err := o.withDefaults()
	if err != nil {
		return err
	}
	if _, err := q.Exec(ctx, fmt.Sprintf(dropPublicationSQL, pgx.Identifier{o.Publication}.Sanitize())); err != nil {
		return fmt.Errorf("dropping publication %s: %w", o.Publication, err)
	}
	return nil
}
