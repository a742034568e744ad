package logical

import (
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-dev/outbox-operator/internal/outbox"
)

// The SQL of the package lives here. Values are bind parameters on ordinary
// connections; identifiers are validated and quoted. The replication
// connection speaks only the simple protocol, so its statements take
// literals, of names validated first (SlotPattern, IdentifierPattern).
const (
	// walLevelSQL reads the setting that logical decoding needs.
	walLevelSQL = `SELECT current_setting('wal_level')`

	// publicationSQL ($1 the publication) says whether it publishes inserts.
	publicationSQL = `SELECT pubinsert FROM pg_publication WHERE pubname = $1`

	// createPublicationSQL (publication, table: quoted) publishes the
	// table's inserts only: the relay has nothing to do with updates and
	// deletes (the cleanup job's included). Without ONLY, an inheritance
	// parent brings the children it has now (those created later are
	// added by the relay: children.go); a partitioned table brings its
	// partitions, present and future, whose inserts arrive under each
	// partition's own relation.
	createPublicationSQL = `CREATE PUBLICATION %s FOR TABLE %s WITH (publish = 'insert')`

	// publicationCoversSQL ($1 the publication, $2 the quoted table) says
	// whether the publication streams some of the table's inserts: it names
	// the table (FOR TABLE ONLY too), or pg_publication_tables (which
	// resolves FOR TABLE, FOR TABLES IN SCHEMA and FOR ALL TABLES, and
	// lists partitions or their root per publish_via_partition_root) lists
	// the table, a partitioned ancestor of it, or one of its partitions.
	// Some, not all: the inheritance children and partitions it leaves out
	// are uncoveredSQL's, which the relay adds or refuses to stream without.
	publicationCoversSQL = `WITH t AS (SELECT to_regclass($2) AS oid),
listed AS (
	SELECT to_regclass(format('%I.%I', p.schemaname, p.tablename)) AS rel FROM pg_publication_tables p WHERE p.pubname = $1
)
SELECT EXISTS (
	SELECT 1 FROM pg_publication p JOIN pg_publication_rel r ON r.prpubid = p.oid JOIN t ON r.prrelid = t.oid
	WHERE p.pubname = $1
) OR EXISTS (
	SELECT 1 FROM listed JOIN t ON listed.rel = t.oid
		OR listed.rel IN (SELECT a.relid FROM pg_partition_ancestors(t.oid) AS a)
		OR t.oid IN (SELECT a.relid FROM pg_partition_ancestors(listed.rel) AS a)
)`

	// publicationFilterSQL ($1 the publication, $2 the quoted table; only
	// PostgreSQL 15 and later have row filters and column lists) finds a
	// relation of the table's tree (itself, its ancestors, its descendants)
	// that the publication lists with a row filter or a column list: the
	// name, the filter ("" for none), and whether it has a column list.
	publicationFilterSQL = `WITH RECURSIVE t AS (SELECT to_regclass($2) AS oid),
down(rel) AS (SELECT oid FROM t UNION SELECT i.inhrelid FROM pg_inherits i JOIN down ON i.inhparent = down.rel),
tree AS (SELECT rel FROM down UNION SELECT a.relid FROM t, pg_partition_ancestors(t.oid) AS a)
SELECT r.prrelid::regclass::text, coalesce(pg_get_expr(r.prqual, r.prrelid), ''), r.prattrs IS NOT NULL
FROM pg_publication p JOIN pg_publication_rel r ON r.prpubid = p.oid JOIN tree ON tree.rel = r.prrelid
WHERE p.pubname = $1 AND (r.prqual IS NOT NULL OR r.prattrs IS NOT NULL)
ORDER BY 1 LIMIT 1`

	// lookSQL ($1 the publication, $2 the quoted table; %[1]s
	// publicationCoversSQL, %[2]s schemaEntriesSQL or, before PostgreSQL
	// 15, noSchemaEntriesSQL) reads, in one snapshot, whether the
	// publication publishes inserts (NULL: it does not exist), whether it
	// covers the table, its fingerprint (Look.Fingerprint: the row
	// versions, oid and xmin, of the publication and of its entries that
	// list the table, a partitioned ancestor, a descendant (an inheritance
	// child or a partition, recursively; with the relation's oid), or the
	// schema of one of these, sorted), the oids of those tables, the
	// snapshot's xmin, the look's own transaction id and the table's oid
	// (0: no such table).
	lookSQL = `WITH RECURSIVE t AS (SELECT to_regclass($2) AS oid),
down(rel) AS (SELECT oid FROM t UNION SELECT i.inhrelid FROM pg_inherits i JOIN down ON i.inhparent = down.rel),
tree AS (SELECT rel FROM down UNION SELECT a.relid FROM t, pg_partition_ancestors(t.oid) AS a),
p AS (SELECT oid, xmin, pubinsert FROM pg_publication WHERE pubname = $1),
entries AS (
	SELECT 'p' || p.oid::text || ':' || p.xmin::text AS e FROM p
	UNION ALL
	SELECT 'r' || r.oid::text || ':' || r.xmin::text || ':' || r.prrelid::oid::text FROM pg_publication_rel r JOIN p ON r.prpubid = p.oid
		JOIN tree ON r.prrelid = tree.rel
	UNION ALL
	%[2]s
)
SELECT (SELECT pubinsert FROM p), (%[1]s),
	coalesce((SELECT string_agg(DISTINCT e, ',' ORDER BY e) FROM entries), ''),
	coalesce((SELECT array_agg(rel::oid::bigint) FROM tree WHERE rel IS NOT NULL), '{}'),
	pg_snapshot_xmin(pg_current_snapshot())::text::bigint, pg_current_xact_id()::text::bigint,
	coalesce((SELECT oid::oid::bigint FROM t), 0)`

	// schemaEntriesSQL is lookSQL's part of the fingerprint for FOR TABLES
	// IN SCHEMA (PostgreSQL 15): the entries of the schemas of the tree's
	// tables; noSchemaEntriesSQL stands for it before.
	schemaEntriesSQL = `SELECT 'n' || n.oid::text || ':' || n.xmin::text FROM pg_publication_namespace n JOIN p ON n.pnpubid = p.oid
		JOIN pg_class c ON c.relnamespace = n.pnnspid JOIN tree ON c.oid = tree.rel`
	noSchemaEntriesSQL = `SELECT NULL::text WHERE false`

	// serverVersionSQL is the server's version as a number (150004).
	serverVersionSQL = `SELECT current_setting('server_version_num')::int`

	// uncoveredSQL ($1 the publication, $2 the quoted table) lists the
	// table's descendants, recursively, whose inserts the publication does
	// not stream, with whether each is a partition, whether it is unlogged
	// and its oid: an UNLOGGED (or temporary) one, whose inserts never reach
	// the WAL whatever the publication lists; an inheritance child
	// that pg_publication_tables does not list (it resolves FOR TABLE, FOR
	// TABLES IN SCHEMA and FOR ALL TABLES alike), and a leaf partition
	// listed neither itself nor through a partitioned ancestor (the table
	// or one above or below it; listed under the topmost published one with
	// publish_via_partition_root, else as its leaves). A publication that
	// names the partitioned table covers its partitions, present and future;
	// one that names some partitions covers only those, so the others, and
	// every partition created later, are listed. Partitioned tables hold no
	// rows of their own and are left out.
	uncoveredSQL = `WITH RECURSIVE d(oid) AS (
	SELECT inhrelid FROM pg_inherits WHERE inhparent = to_regclass($2)
	UNION
	SELECT i.inhrelid FROM pg_inherits i JOIN d ON i.inhparent = d.oid
),
listed AS MATERIALIZED (
	SELECT to_regclass(format('%I.%I', t.schemaname, t.tablename)) AS rel FROM pg_publication_tables t WHERE t.pubname = $1
)
SELECT n.nspname::text, c.relname::text, c.relispartition, c.relpersistence <> 'p', c.oid::bigint
FROM d JOIN pg_class c ON c.oid = d.oid JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind <> 'p' AND (c.relpersistence <> 'p' OR NOT EXISTS (
	SELECT 1 FROM listed
	WHERE listed.rel = c.oid OR c.relispartition AND listed.rel IN (SELECT a.relid FROM pg_partition_ancestors(c.oid) AS a)
))
ORDER BY 1, 2`

	// partitionsSQL ($1 the quoted table) lists the tables under the table
	// (partitions and inheritance children, recursively; leaves only: a
	// partitioned table holds no rows) that are logged, each with a key: its
	// oid, its relfilenode and the xmin of every pg_inherits row from it up
	// to the table (the lowest such path, for a child of several parents).
	// An ATTACH or an INHERIT makes a new pg_inherits row, so a table that
	// joins (again) gets a new key, as does every leaf under a partitioned
	// table attached, and a new table gets one too. SET LOGGED rewrites the
	// table, so one made UNLOGGED and LOGGED again gets a new relfilenode
	// (as VACUUM FULL, CLUSTER and TRUNCATE do).
	partitionsSQL = `WITH RECURSIVE d(oid, links) AS (
	SELECT inhrelid, xmin::text FROM pg_inherits WHERE inhparent = to_regclass($1)
	UNION ALL
	SELECT i.inhrelid, d.links || '.' || i.xmin::text FROM pg_inherits i JOIN d ON i.inhparent = d.oid
)
SELECT n.nspname::text, c.relname::text, c.oid::text || ':' || c.relfilenode::text || ':' || min(d.links)
FROM d JOIN pg_class c ON c.oid = d.oid JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind <> 'p' AND c.relpersistence = 'p'
GROUP BY n.nspname, c.relname, c.oid, c.relfilenode
ORDER BY 3`

	// addTablesSQL (publication: quoted; the tables: ONLY and quoted, comma
	// separated) adds tables to a publication.
	addTablesSQL = `ALTER PUBLICATION %s ADD TABLE %s`

	// dropPublicationSQL (publication: quoted).
	dropPublicationSQL = `DROP PUBLICATION IF EXISTS %s`

	// slotSQL ($1 the slot) describes a slot for Setup: plugin and database
	// are NULL for a physical slot; wal_status is lost for an invalidated one.
	slotSQL = `SELECT plugin, database = current_database(), wal_status FROM pg_replication_slots WHERE slot_name = $1`

	// createSlotSQL ($1 the slot) creates a logical slot for pgoutput. It
	// waits for the transactions running at that moment to end (the slot
	// needs a consistent snapshot), and refuses a transaction that wrote.
	createSlotSQL = `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`

	// slotPIDSQL ($1 the slot) gives the pid of the walsender holding the
	// slot (NULL: none); no row when the slot does not exist.
	slotPIDSQL = `SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1`

	// terminateSQL ($1 a pid) ends a backend, which releases its slot.
	terminateSQL = `SELECT pg_terminate_backend($1)`

	// dropSlotSQL ($1 the slot) fails (55006) while a session holds it.
	dropSlotSQL = `SELECT pg_drop_replication_slot($1)`

	// statusSQL ($1 the slot) measures the slot against the server's
	// current WAL position (the received one on a standby).
	statusSQL = `WITH pos AS (
	SELECT CASE WHEN pg_is_in_recovery() THEN pg_last_wal_receive_lsn() ELSE pg_current_wal_lsn() END AS lsn
)
SELECT s.active, s.wal_status,
	pg_wal_lsn_diff(pos.lsn, s.restart_lsn)::bigint,
	pg_wal_lsn_diff(pos.lsn, s.confirmed_flush_lsn)::bigint,
	s.safe_wal_size, s.confirmed_flush_lsn::text
FROM pg_replication_slots s CROSS JOIN pos
WHERE s.slot_name = $1`

	// maxSlotWALKeepSizeSQL gives the setting in bytes, -1 when unset
	// (pg_settings reports it in MB).
	maxSlotWALKeepSizeSQL = `SELECT CASE WHEN setting::bigint < 0 THEN -1 ELSE pg_size_bytes(setting || unit) END
FROM pg_settings WHERE name = 'max_slot_wal_keep_size'`

	// replSlotSQL (the slot, as a literal) is the first statement of a
	// replication connection: where the slot stands, before streaming.
	replSlotSQL = `SELECT confirmed_flush_lsn, wal_status, plugin, database = current_database()
FROM pg_replication_slots WHERE slot_name = '%s'`

	// castTypesSQL lists the types whose cast to text is not their output
	// text (pg_cast: the casts to text by a function other than the output
	// function), with the domains over them at any depth, each with its
	// base type: char(n) (bpchar), boolean and inet (castText).
	castTypesSQL = `WITH RECURSIVE t AS (
	SELECT oid, typname::text AS base FROM pg_type WHERE oid IN ('bpchar'::regtype, 'bool'::regtype, 'inet'::regtype)
	UNION SELECT d.oid, t.base FROM pg_type d JOIN t ON d.typbasetype = t.oid WHERE d.typtype = 'd'
)
SELECT oid::text, base FROM t`
)

// quotedTable is the table's name quoted as the outbox package quotes it,
// schema-qualified when it is.
func quotedTable(t *outbox.Table) string {
	if t.Schema() != "" {
		return pgx.Identifier{t.Schema(), t.Name()}.Sanitize()
	}
	return pgx.Identifier{t.Name()}.Sanitize()
}

// pluginArgs are the options of START_REPLICATION for pgoutput: protocol
// version 1 (whole transactions, at their commit) and the publication,
// whose name pgoutput parses as an identifier list, hence the double quotes
// inside the literal.
func pluginArgs(publication string) []string {
	return []string{
		"proto_version '1'",
		fmt.Sprintf(`publication_names '%s'`, pgx.Identifier{publication}.Sanitize()),
	}
}
