package logical

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-dev/outbox-operator/internal/outbox"
)

// Inheritance children. A publication FOR TABLE parent takes the children
// an inheritance parent has when it is created (or altered), not those
// created later, and FOR TABLE ONLY parent takes none: pgoutput never sends
// the inserts of a child the publication does not list, and a relay that
// never marks rows would never publish them. Partitions differ: a
// publication of a partitioned table covers its partitions, present and
// future, so they are never uncovered.

// Child is an inheritance descendant of the outbox table, as the catalog
// spells it.
type Child struct {
	Schema, Name string
}

// String is the child's quoted, schema-qualified name.
func (c Child) String() string { return pgx.Identifier{c.Schema, c.Name}.Sanitize() }

// ErrChildNotCovered: an inheritance child of the outbox table is not in
// the publication, so its inserts are not streamed.
var ErrChildNotCovered = errors.New("inheritance child of the outbox table not in the publication")

// codeInsufficientPrivilege is the SQLSTATE of a missing ownership or grant.
const codeInsufficientPrivilege = "42501"

// Uncovered lists the table's inheritance descendants (children,
// recursively; partitions aside) that the publication of o does not
// publish. A missing publication covers none.
func Uncovered(ctx context.Context, q outbox.Querier, o Options) ([]Child, error) {
	o, err := o.withDefaults()
	if err != nil {
		return nil, err
	}
	rows, err := q.Query(ctx, uncoveredSQL, o.Publication, quotedTable(o.Table))
	if err != nil {
		return nil, fmt.Errorf("listing the children of %s not in publication %s: %w", o.Table, o.Publication, err)
	}
	children, err := pgx.CollectRows(rows, pgx.RowToStructByPos[Child])
	if err != nil {
		return nil, fmt.Errorf("listing the children of %s not in publication %s: %w", o.Table, o.Publication, err)
	}
	return children, nil
}

// UncoveredError says which children are not covered and how to fix it.
func UncoveredError(o Options, children []Child) error {
	o, _ = o.withDefaults()
	names := make([]string, 0, len(children))
	only := make([]string, 0, len(children))
	for _, c := range children {
		names = append(names, c.String())
		only = append(only, "ONLY "+c.String())
	}
	return fmt.Errorf("%w: %s of %s not in publication %s, so their inserts are not streamed: "+
		"a relay of the table adds them (and publishes their rows from the table) when its role owns them; "+
		"or, as their owner, ALTER PUBLICATION %s ADD TABLE %s and publish their existing rows yourself",
		ErrChildNotCovered, strings.Join(names, ", "), o.Table, o.Publication,
		pgx.Identifier{o.Publication}.Sanitize(), strings.Join(only, ", "))
}

// AddChildren adds the children to the publication of o, in tx: once tx
// commits, their inserts are streamed. The caller locks them against
// inserts first and publishes the rows they hold before committing (the
// relay), so that no row is in neither the table's read nor the stream.
func AddChildren(ctx context.Context, tx pgx.Tx, o Options, children []Child) error {
	o, err := o.withDefaults()
	if err != nil {
		return err
	}
	if len(children) == 0 {
		return nil
	}
	only := make([]string, 0, len(children))
	for _, c := range children {
		only = append(only, "ONLY "+c.String())
	}
	_, err = tx.Exec(ctx, fmt.Sprintf(addTablesSQL, pgx.Identifier{o.Publication}.Sanitize(), strings.Join(only, ", ")))
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == codeInsufficientPrivilege {
		return fmt.Errorf("%w (adding them failed: %w)", UncoveredError(o, children), err)
	}
	if err != nil {
		return fmt.Errorf("adding %s to publication %s: %w", strings.Join(only, ", "), o.Publication, err)
	}
	return nil
}
