package logical

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-dev/outbox-operator/internal/outbox"
)

// Inheritance children and partitions. A publication FOR TABLE parent
// takes the children an inheritance parent has when it is created (or
// altered), not those created later, and FOR TABLE ONLY parent takes none:
// pgoutput never sends the inserts of a child the publication does not
// list, and a relay that never marks rows would never publish them. A
// publication of a partitioned table covers its partitions, present and
// future, but one that lists only some partitions (say the table that a
// migration to partitioning renamed and attached as a partition, which the
// publication still names by its oid) covers only those: the inserts into
// the others, and into every partition created later, are not streamed.
// Both kinds are listed by Uncovered, and the relay adds them the same way.

// Child is a table of the outbox table's inheritance or partition tree
// that holds rows (an inheritance descendant, or a leaf partition), as the
// catalog spells it.
type Child struct {
	Schema, Name string
	// Partition says that it is a partition, not an inheritance child.
	Partition bool
	// Unlogged says that it is UNLOGGED (or temporary): its inserts never
	// reach the WAL, so no publication can stream them.
	Unlogged bool
	// OID is its pg_class oid.
	OID int64
}

// String is the child's quoted, schema-qualified name.
func (c Child) String() string { return pgx.Identifier{c.Schema, c.Name}.Sanitize() }

// ErrChildNotCovered: an inheritance child of the outbox table is not in
// the publication, so its inserts are not streamed.
var ErrChildNotCovered = errors.New("inheritance child of the outbox table not in the publication")

// ErrUnlogged: an inheritance child or partition of the outbox table is
// UNLOGGED (or temporary), so its inserts never reach the WAL and the slot
// never streams them.
var ErrUnlogged = errors.New("unlogged table under the outbox table")

// ErrPartitionNotCovered: a partition of the outbox table is not in the
// publication, nor the table or a partitioned ancestor of it, so its
// inserts are not streamed.
var ErrPartitionNotCovered = errors.New("partition of the outbox table not in the publication")

// codeInsufficientPrivilege is the SQLSTATE of a missing ownership or grant.
const codeInsufficientPrivilege = "42501"

// Uncovered lists the table's inheritance descendants (children,
// recursively) and leaf partitions whose inserts the publication of o does
// not stream. A missing publication covers none.
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

// UncoveredError says which children and partitions are not covered and
// how to fix it.
func UncoveredError(o Options, children []Child) error {
	o, _ = o.withDefaults()
	var kids, parts, only, unlogged []string
	for _, c := range children {
		if c.Unlogged {
			unlogged = append(unlogged, c.String())
			continue
		}
		if c.Partition {
			parts = append(parts, c.String())
			continue
		}
		kids = append(kids, c.String())
		only = append(only, "ONLY "+c.String())
	}
	pub := pgx.Identifier{o.Publication}.Sanitize()
	var errs []error
	if len(kids) > 0 {
		errs = append(errs, fmt.Errorf("%w: %s of %s not in publication %s, so their inserts are not streamed: "+
			"a relay of the table adds them (and publishes their rows from the table) when its role owns them; "+
			"or, as their owner, ALTER PUBLICATION %s ADD TABLE %s and publish their existing rows yourself",
			ErrChildNotCovered, strings.Join(kids, ", "), o.Table, o.Publication, pub, strings.Join(only, ", ")))
	}
	if len(parts) > 0 {
		errs = append(errs, fmt.Errorf("%w: partitions %s of %s not in publication %s, which lists some partitions "+
			"but neither the table nor a partitioned ancestor of these, so their inserts are not streamed: "+
			"a relay of the table adds them (and publishes their rows from the table) when its role owns them; "+
			"or, as the table's owner, ALTER PUBLICATION %s ADD TABLE %s, which covers its partitions present and future, "+
			"and publish the rows these partitions hold yourself: they were written to the WAL before the publication "+
			"listed them, so the slot has passed them and never streams them (a catch-up from the table)",
			ErrPartitionNotCovered, strings.Join(parts, ", "), o.Table, o.Publication, pub, quotedTable(o.Table)))
	}
	if len(unlogged) > 0 {
		errs = append(errs, fmt.Errorf("%w: %s of %s are UNLOGGED (or temporary): their inserts never reach the WAL, "+
			"so slot %s never streams them; ALTER TABLE ... SET LOGGED each, and a relay of the table then publishes "+
			"the rows they hold from the table",
			ErrUnlogged, strings.Join(unlogged, ", "), o.Table, o.Slot))
	}
	if len(errs) == 0 {
		return nil
	}
	err := errs[0]
	for _, e := range errs[1:] {
		err = fmt.Errorf("%w; %w", err, e)
	}
	return err
}

// Partition is a logged table under the outbox table (a leaf partition or
// an inheritance child), and its key (partitionsSQL): a new key is a table
// that joined the table since, or was rewritten (made LOGGED again, among
// others), whose rows written before may never have been streamed.
type Partition struct {
	Schema, Name, Key string
}

// String is the partition's quoted, schema-qualified name.
func (p Partition) String() string { return pgx.Identifier{p.Schema, p.Name}.Sanitize() }

// Partitions lists the logged leaf partitions and inheritance children of
// the table of o.
func Partitions(ctx context.Context, q outbox.Querier, o Options) ([]Partition, error) {
	o, err := o.withDefaults()
	if err != nil {
		return nil, err
	}
	rows, err := q.Query(ctx, partitionsSQL, quotedTable(o.Table))
	if err != nil {
		return nil, fmt.Errorf("listing the partitions of %s: %w", o.Table, err)
	}
	parts, err := pgx.CollectRows(rows, pgx.RowToStructByPos[Partition])
	if err != nil {
		return nil, fmt.Errorf("listing the partitions of %s: %w", o.Table, err)
	}
	return parts, nil
}

// PartitionKeys is what the progress table records of parts: their keys,
// sorted, comma separated.
func PartitionKeys(parts []Partition) string {
	keys := make([]string, 0, len(parts))
	for _, p := range parts {
		keys = append(keys, p.Key)
	}
	slices.Sort(keys)
	return strings.Join(keys, ",")
}

// WithoutTables is recorded (as PartitionKeys wrote it) less the keys of
// the tables of oids.
func WithoutTables(recorded string, oids []int64) string {
	keys := strings.Split(recorded, ",")
	keys = slices.DeleteFunc(keys, func(k string) bool {
		oid, _, _ := strings.Cut(k, ":")
		return slices.ContainsFunc(oids, func(o int64) bool { return strconv.FormatInt(o, 10) == oid })
	})
	return strings.Join(keys, ",")
}

// NewPartitions are the partitions of parts whose keys recorded (as
// PartitionKeys wrote them) does not hold.
func NewPartitions(parts []Partition, recorded string) []Partition {
	known := strings.Split(recorded, ",")
	return slices.DeleteFunc(slices.Clone(parts), func(p Partition) bool { return slices.Contains(known, p.Key) })
}

// AddChildren adds the children (and partitions) to the publication of o,
// each with ONLY, in tx: once tx commits, their inserts are streamed. The caller locks them against
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

// NotPublished lists the partitions of the table of o whose rows slot
// o.Slot's relay has not published yet: those new to what its progress
// records (NewPartitions); none when the slot has no progress or it
// records no partitions (a relay of an earlier version).
func NotPublished(ctx context.Context, q outbox.Querier, o Options) ([]Partition, error) {
	o, err := o.withDefaults()
	if err != nil {
		return nil, err
	}
	p, ok, err := o.Table.ReadProgress(ctx, q, o.Slot)
	if err != nil || !ok || p.Partitions == nil {
		return nil, err
	}
	parts, err := Partitions(ctx, q, o)
	if err != nil {
		return nil, err
	}
	return NewPartitions(parts, *p.Partitions), nil
}
