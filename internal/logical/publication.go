package logical

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-dev/outbox-operator/internal/outbox"
)

// A publication that stops publishing the table's inserts, even for a
// moment, loses events: pgoutput decodes each insert with the catalog as it
// was at that insert's place in the WAL, so an insert made while the table
// was dropped from the publication (ALTER PUBLICATION ... DROP TABLE, then
// ADD TABLE), while the publication published no inserts (SET (publish =
// 'update')), or while it did not exist, is skipped by the slot for good,
// whatever the catalog says when it is decoded. A relay therefore looks at
// the publication while it streams (LookPublication): a change to the catalog rows that
// make it publish the table changes the Look's Fingerprint, and the relay
// publishes from the table what was inserted since its last look before the
// change.

// ErrPublicationChanged: the publication stopped publishing the table's
// inserts while the relay streamed, or does not now.
var ErrPublicationChanged = errors.New("publication no longer publishes the outbox table's inserts")

// ErrPublicationDropped: the slot reached the WAL written after its
// publication was dropped; PostgreSQL 15 to 17 cannot decode past that
// point with the publication's name, even once a publication of that name
// exists again.
var ErrPublicationDropped = errors.New("publication dropped while the slot streamed")

// Look is what a look at the publication saw, in one snapshot.
type Look struct {
	// Exists says that the publication exists.
	Exists bool
	// Inserts says that it publishes inserts.
	Inserts bool
	// Covered says that it publishes the table (or a partitioned ancestor
	// of it, or one of its partitions: publicationCoversSQL).
	Covered bool
	// Fingerprint names the catalog rows that make the publication publish
	// the table: the publication's own row version (its oid and xmin: every
	// CREATE, SET and DROP gives a new one), and those of the entries that
	// list the table, a partitioned ancestor of it or its schema. Any change
	// to what it publishes of the table gives another Fingerprint, even one
	// undone before the next look; adding a child or a partition to it does
	// not. Empty when the publication does not exist.
	Fingerprint string
	// Xmin is the oldest transaction running at the look (a full
	// transaction id): a transaction that inserts after a change made after
	// the look has an id at or after it.
	Xmin int64
}

// LookPublication reads what the publication of o publishes of its table now. A row
// filter or a column list on the table (PostgreSQL 15) is an error, as in
// Setup.
func LookPublication(ctx context.Context, q outbox.Querier, o Options) (Look, error) {
	o, err := o.withDefaults()
	if err != nil {
		return Look{}, err
	}
	var version int
	if err := q.QueryRow(ctx, serverVersionSQL).Scan(&version); err != nil {
		return Look{}, fmt.Errorf("reading the server's version: %w", err)
	}
	schemas := noSchemaEntriesSQL
	if version >= 150000 {
		schemas = schemaEntriesSQL
	}
	var l Look
	var inserts *bool
	err = q.QueryRow(ctx, fmt.Sprintf(lookSQL, publicationCoversSQL, schemas), o.Publication, quotedTable(o.Table)).
		Scan(&inserts, &l.Covered, &l.Fingerprint, &l.Xmin)
	if err != nil {
		return Look{}, fmt.Errorf("looking at publication %s: %w", o.Publication, err)
	}
	l.Exists, l.Inserts = inserts != nil, deref(inserts)
	if l.Exists && l.Covered {
		if err := checkPublicationFilter(ctx, q, o); err != nil {
			return Look{}, fmt.Errorf("%w: publication %s %w", ErrPublicationChanged, o.Publication, err)
		}
	}
	return l, nil
}

// Problem says what keeps the publication from publishing the table's
// inserts, with the fix, or nil when nothing does.
func (l Look) Problem(o Options) error {
	o, _ = o.withDefaults()
	switch {
	case !l.Exists:
		return fmt.Errorf("%w: publication %s does not exist (the relay creates it when it starts)", ErrPublicationChanged, o.Publication)
	case !l.Inserts:
		return fmt.Errorf("%w: publication %s does not publish inserts: ALTER PUBLICATION %s SET (publish = 'insert'); "+
			"the relay then publishes from the table the rows inserted meanwhile",
			ErrPublicationChanged, o.Publication, pgx.Identifier{o.Publication}.Sanitize())
	case !l.Covered:
		return fmt.Errorf("%w: publication %s does not cover table %s: ALTER PUBLICATION %s ADD TABLE %s; "+
			"the relay then publishes from the table the rows inserted meanwhile",
			ErrPublicationChanged, o.Publication, o.Table, pgx.Identifier{o.Publication}.Sanitize(), quotedTable(o.Table))
	}
	return nil
}

// AddTable adds the table of o to its publication again (as Setup creates
// it: with its inheritance children, or its partitions present and future).
// A table listed meanwhile is not an error.
func AddTable(ctx context.Context, q outbox.Querier, o Options) error {
	o, err := o.withDefaults()
	if err != nil {
		return err
	}
	_, err = q.Exec(ctx, fmt.Sprintf(addTablesSQL, pgx.Identifier{o.Publication}.Sanitize(), quotedTable(o.Table)))
	if err != nil && !isDuplicate(err) {
		return fmt.Errorf("adding table %s to publication %s again: %w", o.Table, o.Publication, err)
	}
	return nil
}
