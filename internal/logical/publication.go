package logical

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-dev/outbox-operator/internal/outbox"
	"github.com/outbox-dev/outbox-operator/internal/pgtx"
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
	// the table, by their row versions (oid and xmin), sorted and comma
	// separated: the publication's own row (every CREATE, SET and DROP gives
	// a new one) and its entries that list the table, a partitioned
	// ancestor, a descendant (inheritance child or partition) or the schema
	// of one of these. An entry that a change removed or rewrote is gone
	// from it, even if the change was undone before the next look
	// (DropsFrom); an entry added (a child the relay adds) only adds one.
	// Empty when the publication does not exist.
	Fingerprint string
	// Xmin is the look's snapshot's (a full transaction id): a transaction
	// that inserts after a change made visible after the look has an id at
	// or after it. Next is the look's own transaction id: every transaction
	// running at the look (a change among them, even one whose commit is in
	// the WAL but not yet visible) has an id below it. A snapshot's xmax
	// would not do: a running transaction's id can be at or above it.
	Xmin, Next int64
	// tree is the oids of the table, its partitioned ancestors and its
	// descendants at the look.
	tree []int64
	// table is the table's oid at the look (0: none).
	table int64
}

// DropsFrom says whether the fingerprint lacks an entry of old (a
// fingerprint seen earlier): a change since then removed or rewrote one, so
// for a while the publication may not have published the table (or a
// descendant of it), and the slot may have skipped inserts. Entries only
// added (a child added to the publication) drop nothing.
//
// An entry of a table no longer in the tree (a child dropped, or detached,
// or no longer inheriting) drops nothing either: that table's rows are not
// the outbox's any more.
//
// But an entry that lists the table itself and is new since old is a
// break too: the table was listed again, or it is another table than
// before (swapped in under the name: renamed, or dropped and created
// again, by a migration), which the publication, naming tables by oid, did
// not list until then. The old table's entry left the tree; the inserts
// made into the new one before it was listed were skipped by the slot.
func (l Look) DropsFrom(old string) bool {
	if old == "" {
		return false
	}
	now := map[string]bool{}
	for _, e := range strings.Split(l.Fingerprint, ",") {
		now[e] = true
	}
	before := map[string]bool{}
	for _, e := range strings.Split(old, ",") {
		before[e] = true
		if !now[e] && !l.leftTheTree(e) {
			return true
		}
	}
	for e := range now {
		if rel, ok := entryRelation(e); ok && rel == l.table && l.table != 0 && !before[e] {
			return true
		}
	}
	return false
}

// leftTheTree says whether e is the entry of a table (r<oid>:<xmin>:<relid>)
// that is not in the look's tree.
func (l Look) leftTheTree(e string) bool {
	rel, ok := entryRelation(e)
	return ok && !slices.Contains(l.tree, rel)
}

// entryRelation is the table an entry of a table (r<oid>:<xmin>:<relid>)
// lists; ok is false for other entries.
func entryRelation(e string) (rel int64, ok bool) {
	parts := strings.Split(e, ":")
	if !strings.HasPrefix(e, "r") || len(parts) != 3 {
		return 0, false
	}
	rel, err := strconv.ParseInt(parts[2], 10, 64)
	return rel, err == nil
}

// LookPublication reads what the publication of o publishes of its table now,
// in a transaction of its own (it takes a transaction id: Look.Next; its
// commit waits for no flush, nor for a synchronous standby). A row filter or
// a column list on the table (PostgreSQL 15) is an error, as in Setup.
func LookPublication(ctx context.Context, db pgtx.Beginner, o Options) (Look, error) {
	o, err := o.withDefaults()
	if err != nil {
		return Look{}, err
	}
	var l Look
	err = pgtx.Run(ctx, db, func(tx pgx.Tx) error {
		version, err := serverVersion(ctx, tx)
		if err != nil {
			return err
		}
		schemas := noSchemaEntriesSQL
		if version >= 150000 {
			schemas = schemaEntriesSQL
		}
		if _, err := tx.Exec(ctx, `SET LOCAL synchronous_commit = off`); err != nil {
			return fmt.Errorf("looking at publication %s: %w", o.Publication, err)
		}
		var inserts *bool
		err = tx.QueryRow(ctx, fmt.Sprintf(lookSQL, publicationCoversSQL, schemas), o.Publication, quotedTable(o.Table)).
			Scan(&inserts, &l.Covered, &l.Fingerprint, &l.tree, &l.Xmin, &l.Next, &l.table)
		if err != nil {
			return fmt.Errorf("looking at publication %s: %w", o.Publication, err)
		}
		l.Exists, l.Inserts = inserts != nil, deref(inserts)
		if l.Exists && l.Covered {
			if err := checkPublicationFilter(ctx, tx, o, version); err != nil {
				return fmt.Errorf("%w: publication %s %w", ErrPublicationChanged, o.Publication, err)
			}
		}
		return nil
	})
	return l, err
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
