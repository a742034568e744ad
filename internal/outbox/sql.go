package outbox

import (
	"fmt"
	"slices"
	"strings"
)

// The SQL of the outbox lives here, and only here. %[n]s verbs are filled
// with quoted identifiers by the Table methods below; values are always bind
// parameters.
const (
	// claimSQL takes up to $1 pending rows, oldest first (created_at, then
	// the id), skipping rows other relays hold, and marks them dispatched in
	// the same statement. The rows are joined back by (tableoid, ctid): a
	// ctid alone is unique only within one partition or inheritance child,
	// and the pairing is what keeps a partitioned table from returning (and
	// marking) rows the CTE never locked. The pending predicate is not
	// repeated in the UPDATE: FOR UPDATE rechecked it under the row lock,
	// and without it the only way to the rows (with the relay's planner
	// settings, SessionSettings.StablePlans) is a TID scan per row, whatever
	// the statistics say; with it the planner may rescan the pending index
	// for every row of the batch. RETURNING does not keep the CTE's order,
	// so the outer SELECT sorts by the same key, with the column's own
	// collation.
	//
	// %[14]s, %[15]s and %[16]s extend it for ordering PerKey (claimKeyed*);
	// %[17]s is what the claim does to the rows: claimMark or claimDelete.
	claimSQL = `WITH batch AS (
	SELECT tableoid, ctid FROM %[1]s
	WHERE %[6]s IS NULL%[14]s
	ORDER BY %[5]s, %[2]s
	LIMIT $1
	FOR UPDATE SKIP LOCKED
), claimed AS (
	%[17]s
	WHERE o.tableoid = batch.tableoid AND o.ctid = batch.ctid
	RETURNING o.%[2]s AS sort_id, o.%[5]s AS sort_created,
		o.%[2]s::text AS r_id, o.%[3]s::text AS r_type, o.%[4]s::text AS r_payload, o.%[5]s::timestamptz AS r_created%[15]s
)
SELECT r_id, r_type, r_payload, r_created%[16]s FROM claimed ORDER BY sort_created, sort_id`

	// claimMark marks the claimed rows dispatched (MarkDispatched): they
	// stay, for cleanup to delete after the retention and for a replay.
	claimMark = `UPDATE %[1]s AS o SET %[6]s = now()
	FROM batch`
	// claimDelete deletes the claimed rows (DeleteOnDispatch): the same
	// rows, locked the same way, gone when the batch commits, so there is
	// no dispatched_at to write and nothing for cleanup. The pending
	// predicate stays in the CTE: it keeps the partial index serving the
	// claim, and rows marked by relays of the other mode are left alone.
	claimDelete = `DELETE FROM %[1]s AS o
	USING batch`

	// For ordering PerKey, the claim takes only rows of the key partitions
	// in $3 (of $2 partitions) and returns each row's key and partition. A
	// row's partition is a stable hash of its key (hashtextextended, seed
	// 0; a NULL key counts as the empty string), so every event of one key
	// is in one partition, drained in order by its one owner. %[14]s is the
	// key column in these.
	claimKeyedPartition = `(hashtextextended(coalesce(%[14]s::text, ''), 0) & 9223372036854775807) %% $2`
	claimKeyedWhere     = `
		AND ` + claimKeyedPartition + ` = ANY($3::bigint[])`
	claimKeyedReturning = `,
		coalesce(o.%[14]s::text, '') AS r_key, ` + claimKeyedPartitionOfO + ` AS r_partition`
	claimKeyedPartitionOfO = `(hashtextextended(coalesce(o.%[14]s::text, ''), 0) & 9223372036854775807) %% $2`
	claimKeyedSelect       = `, r_key, r_partition`

	// claimFromWhere starts the claim's scan of the pending index at a
	// created_at (Table.ClaimFrom). timestamptz compares with a timestamp
	// column within the index's operator family, so the index serves both.
	claimFromWhere = `
		AND %[5]s >= $2::timestamptz`

	// identitySQL is the schema and name of the table $1 (quoted) as the
	// session resolves it; no row when there is none.
	identitySQL = `SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.oid = to_regclass($1)`

	// keyCheckSQL (with %[14]s the key column) reads no row: it fails when
	// the key column does not exist.
	keyCheckSQL = `SELECT %[14]s FROM %[1]s LIMIT 0`

	// backlogSQL counts pending rows and finds the oldest. With the partial
	// index both are index-only over the pending rows.
	backlogSQL = `SELECT count(*), min(%[5]s)::timestamptz FROM %[1]s WHERE %[6]s IS NULL`

	// backlogUpToSQL counts at most $1 pending rows and finds the oldest:
	// the count stops at $1, so a huge backlog is still a number within the
	// statement timeout, and min() is one step of the partial index.
	backlogUpToSQL = `SELECT
	(SELECT count(*) FROM (SELECT 1 FROM %[1]s WHERE %[6]s IS NULL LIMIT $1) AS pending),
	(SELECT min(%[5]s) FROM %[1]s WHERE %[6]s IS NULL)::timestamptz`

	// cleanupSQL deletes up to $2 rows dispatched more than $1 seconds ago
	// and, when $3 is not NULL, before $3 (the hold of stream resets not
	// replayed: a replay republishes the rows dispatched since).
	// Rows locked by someone else are skipped, so cleanup never waits on a
	// relay. Rows are joined back by (tableoid, ctid), unique across
	// partitions, and the dispatched predicate is repeated, so a pending row
	// can never be deleted.
	cleanupSQL = `WITH doomed AS (
	SELECT tableoid, ctid FROM %[1]s
	WHERE %[6]s < now() - make_interval(secs => $1) AND ($3::timestamptz IS NULL OR %[6]s < $3)
	LIMIT $2
	FOR UPDATE SKIP LOCKED
)
DELETE FROM %[1]s AS o USING doomed
WHERE o.tableoid = doomed.tableoid AND o.ctid = doomed.ctid
	AND o.%[6]s < now() - make_interval(secs => $1) AND ($3::timestamptz IS NULL OR o.%[6]s < $3)`

	// cleanupStreamedSQL (with %[14]s insertedSinceHorizon of $3) deletes
	// up to $2 rows created before $1, the cleanup of a logical replication
	// relay's table, whose rows are never marked (the caller bounds $1 by
	// the slot's progress), except those inserted at or after the slot's
	// xmin horizon $3, which a catch-up would read. Locked rows are skipped
	// and the predicate repeated, like cleanupSQL.
	cleanupStreamedSQL = `WITH doomed AS (
	SELECT tableoid, ctid FROM %[1]s
	WHERE %[5]s < $1 AND NOT %[14]s
	LIMIT $2
	FOR UPDATE SKIP LOCKED
)
DELETE FROM %[1]s AS o USING doomed
WHERE o.tableoid = doomed.tableoid AND o.ctid = doomed.ctid
	AND o.%[5]s < $1`

	// partitionsSQL lists the leaf partitions of a declaratively
	// partitioned table ($1), but its default partition, oldest first by
	// name (the usual per-day names sort by date), each with whether a new
	// row can no longer need it: the table is range-partitioned on the
	// created-at column ($2) alone and the partition's range ended at or
	// before now (new rows, created now, belong to later partitions). A
	// hash partition (a hash-partitioned table has no default partition), a
	// list partition, or a range partition of another key or whose range
	// has not ended could still be the only place a new row fits: dropping
	// it would fail the producers' inserts. The bound is read from the
	// partition's FOR VALUES ... TO ('...') text; the CASE keeps the cast
	// from other kinds of bounds.
	partitionsSQL = `SELECT quote_ident(n.nspname) || '.' || quote_ident(c.relname),
	CASE WHEN pt.partstrat = 'r' AND pt.partnatts = 1 AND pt.partattrs[0] = a.attnum
		THEN coalesce((regexp_match(pg_get_expr(c.relpartbound, c.oid), 'TO \(''([^'']*)''\)$'))[1]::timestamptz <= now(), false)
		ELSE false END
FROM pg_inherits i
JOIN pg_class c ON c.oid = i.inhrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
JOIN pg_partitioned_table pt ON pt.partrelid = i.inhparent
LEFT JOIN pg_attribute a ON a.attrelid = i.inhparent AND a.attname = $2 AND NOT a.attisdropped
WHERE i.inhparent = to_regclass($1) AND c.relispartition AND c.relkind = 'r'
	AND pg_get_expr(c.relpartbound, c.oid) <> 'DEFAULT'
ORDER BY c.relname`

	// deleteCascadesSQL lists the foreign keys ON DELETE CASCADE through
	// which deleting a row of the table $1 (or of one of its partitions or
	// inheritance children) deletes rows of the table again, directly (a
	// key to the table itself: an event that references an earlier one)
	// or through other tables: each key, by name and table, whose cascade
	// lands in the table's tree. A deleting claim (DeleteOnDispatch) would
	// delete those rows with the claimed ones, unpublished.
	deleteCascadesSQL = `WITH RECURSIVE tree AS (
	SELECT to_regclass($1)::oid AS oid
	UNION SELECT i.inhrelid FROM pg_inherits i JOIN tree ON i.inhparent = tree.oid
), reached AS (
	SELECT c.conrelid AS rel, c.oid AS con FROM pg_constraint c JOIN tree ON c.confrelid = tree.oid
	WHERE c.contype = 'f' AND c.confdeltype = 'c'
	UNION
	SELECT c.conrelid, c.oid FROM pg_constraint c JOIN reached r ON c.confrelid = r.rel
	WHERE c.contype = 'f' AND c.confdeltype = 'c'
)
SELECT DISTINCT quote_ident(c.conname) || ' on ' || c.conrelid::regclass::text
FROM reached r JOIN pg_constraint c ON c.oid = r.con
WHERE r.rel IN (SELECT oid FROM tree) AND c.conparentid = 0
ORDER BY 1`

	// partitionDroppableSQL (with %[14]s the partition) is true when the
	// partition holds rows and every one is dispatched more than $1 seconds
	// ago and, when $2 is not NULL, before $2 (the resets' hold). An empty
	// partition is left alone: it may be one made ahead of time.
	partitionDroppableSQL = `SELECT EXISTS (SELECT 1 FROM %[14]s)
	AND NOT EXISTS (SELECT 1 FROM %[14]s WHERE %[6]s IS NULL OR %[6]s >= now() - make_interval(secs => $1)
		OR %[6]s >= $2::timestamptz)`

	// insertSQL writes one event with the id given by the caller.
	insertSQL = `INSERT INTO %[1]s (%[2]s, %[3]s, %[4]s) VALUES ($1, $2, $3)`

	// insertDefaultIDSQL writes one event and lets the table's default make
	// the id, which it returns.
	insertDefaultIDSQL = `INSERT INTO %[1]s (%[3]s, %[4]s) VALUES ($1, $2) RETURNING %[2]s::text`

	// tableExistsSQL resolves the table through search_path like the other
	// statements do; NULL when it does not exist.
	tableExistsSQL = `SELECT to_regclass($1) IS NOT NULL`

	// triggerExistsSQL reports whether the NOTIFY trigger is installed.
	triggerExistsSQL = `SELECT EXISTS (
	SELECT 1 FROM pg_trigger WHERE tgrelid = to_regclass($1) AND tgname = $2 AND NOT tgisinternal
)`

	tableDDL = `CREATE TABLE IF NOT EXISTS %[1]s (
	%[2]s uuid PRIMARY KEY DEFAULT gen_random_uuid(),
	%[3]s text NOT NULL,
	%[4]s text NOT NULL,
	%[5]s timestamptz NOT NULL DEFAULT now(),
	%[6]s timestamptz NULL
);`

	// indexDDL serves the claim's order, (created_at, id), over pending rows
	// only. On a partitioned table it is created on every partition; an
	// inheritance parent's children need their own (docs/relay.md).
	// partitionedTableDDL is tableDDL partitioned by range on created_at,
	// with a default partition so no insert fails for want of one. The
	// primary key must include the partition key.
	partitionedTableDDL = `-- A range-partitioned outbox: create a partition per day (or month) ahead of time,
-- e.g. CREATE TABLE %[12]s PARTITION OF %[1]s FOR VALUES FROM ('2026-12-01') TO ('2026-12-02');
-- rows outside every partition land in the default one. relay cleanup drops a
-- partition whose rows are all dispatched and past the retention (docs/relay.md).
CREATE TABLE IF NOT EXISTS %[1]s (
	%[2]s uuid NOT NULL DEFAULT gen_random_uuid(),
	%[3]s text NOT NULL,
	%[4]s text NOT NULL,
	%[5]s timestamptz NOT NULL DEFAULT now(),
	%[6]s timestamptz NULL,
	PRIMARY KEY (%[2]s, %[5]s)
) PARTITION BY RANGE (%[5]s);
CREATE TABLE IF NOT EXISTS %[13]s PARTITION OF %[1]s DEFAULT;`

	indexDDL = `CREATE INDEX IF NOT EXISTS %[7]s ON %[1]s (%[5]s, %[2]s) WHERE %[6]s IS NULL;`

	// deadLetterDDL creates the table where rows that cannot be published are
	// parked: a copy of the row (any column may be NULL: a malformed row is
	// parked too), the stream it was meant for and why it was refused, and
	// the key of an event of ordering PerKey (NULL otherwise), whose entry
	// carries it. The outbox table itself needs no extra column. A table
	// made by an earlier version gets the key column (the check first, so
	// that the usual case takes no lock).
	deadLetterDDL = `CREATE TABLE IF NOT EXISTS %[11]s (
	id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	event_id text NULL,
	event_type text NULL,
	payload text NULL,
	created_at timestamptz NULL,
	stream text NOT NULL,
	reason text NOT NULL,
	parked_at timestamptz NOT NULL DEFAULT now(),
	attempts integer NOT NULL DEFAULT 1,
	key text NULL
);
DO $ddl$ BEGIN
	IF NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = '%[11]s'::regclass AND NOT attisdropped
		AND attname = 'key') THEN
		ALTER TABLE %[11]s ADD COLUMN IF NOT EXISTS key text NULL;
	END IF;
END $ddl$;`

	// parkSQL copies one row into the dead-letter table.
	parkSQL = `INSERT INTO %[11]s (event_id, event_type, payload, created_at, stream, reason)
VALUES ($1, $2, $3, $4, $5, $6)`

	// parkKeyedSQL is parkSQL for an event whose key was read ($7).
	parkKeyedSQL = `INSERT INTO %[11]s (event_id, event_type, payload, created_at, stream, reason, key)
VALUES ($1, $2, $3, $4, $5, $6, $7)`

	// deadLetterColumns is the column list of a parked row; payload is read
	// only when it is to be published.
	deadLetterColumns = `id, event_id, event_type, created_at, stream, reason, parked_at, attempts, octet_length(payload), key`

	// listDeadLettersSQL selects parked rows by id ($1, empty: any) and
	// parked_at range ($2, $3: NULL for open), oldest first, at most $4,
	// after the id $5 (a cursor).
	listDeadLettersSQL = `SELECT ` + deadLetterColumns + ` FROM %[11]s
WHERE (cardinality($1::bigint[]) = 0 OR id = ANY($1))
	AND ($2::timestamptz IS NULL OR parked_at >= $2)
	AND ($3::timestamptz IS NULL OR parked_at < $3)
	AND id > $5
ORDER BY id
LIMIT $4`

	// lockDeadLettersSQL is listDeadLettersSQL locking the rows for a retry
	// or a discard. It reads no payload: parked payloads are often the
	// large ones, and a retry reads only those that fit its byte budget
	// (deadLetterPayloadsSQL).
	lockDeadLettersSQL = `SELECT ` + deadLetterColumns + ` FROM %[11]s
WHERE (cardinality($1::bigint[]) = 0 OR id = ANY($1))
	AND ($2::timestamptz IS NULL OR parked_at >= $2)
	AND ($3::timestamptz IS NULL OR parked_at < $3)
	AND id > $5
ORDER BY id
LIMIT $4
FOR UPDATE SKIP LOCKED`

	// deadLetterPayloadsSQL reads the payloads of the parked rows in $1.
	deadLetterPayloadsSQL = `SELECT id, payload FROM %[11]s WHERE id = ANY($1::bigint[])`

	// deleteDeadLetterSQL removes a parked row that was published or discarded.
	deleteDeadLetterSQL = `DELETE FROM %[11]s WHERE id = $1`

	// redispatchedSQL moves the dispatch time of the outbox row of id $1 (a
	// row marked dispatched when it was parked) to now (Redispatched). $1 is
	// sent as an untyped literal (the simple protocol), which takes the id
	// column's type, whatever it is, and its index.
	redispatchedSQL = `UPDATE %[1]s SET %[6]s = now() WHERE %[2]s = $1 AND %[6]s IS NOT NULL`

	// refuseDeadLetterSQL records a retry that failed again.
	refuseDeadLetterSQL = `UPDATE %[11]s SET reason = $2, attempts = attempts + 1 WHERE id = $1`

	// parkedAmongSQL lists which of the event ids $1 have a parked copy.
	parkedAmongSQL = `SELECT DISTINCT event_id FROM %[11]s WHERE event_id = ANY($1::text[])`

	// countDeadLettersSQL counts parked rows.
	countDeadLettersSQL = `SELECT count(*) FROM %[11]s`

	// streamResetsDDL (with %[14]s the table) creates the table where relays
	// record that the stream went back in time (it lost entries): the window
	// of dispatch times whose events may be gone, until a replay covers it,
	// and the consumer groups the stream had, which trimming waits for
	// until they are all back (groups_back_at). The operator reads it with
	// the backlog check (docs/operations.md). The group columns, added
	// later, are added to a table made without them; the ALTER runs only
	// then, as it takes a lock that would queue behind the table's readers.
	streamResetsDDL = `CREATE TABLE IF NOT EXISTS %[14]s (
	id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	stream text NOT NULL,
	detected_at timestamptz NOT NULL DEFAULT now(),
	window_start timestamptz NOT NULL,
	window_end timestamptz NOT NULL,
	reason text NOT NULL,
	replayed_at timestamptz NULL,
	groups text[] NULL,
	groups_back_at timestamptz NULL
);
DO $ddl$ BEGIN
	IF (SELECT count(*) FROM pg_attribute WHERE attrelid = '%[14]s'::regclass AND NOT attisdropped
		AND attname IN ('groups', 'groups_back_at')) < 2 THEN
		ALTER TABLE %[14]s ADD COLUMN IF NOT EXISTS groups text[] NULL,
			ADD COLUMN IF NOT EXISTS groups_back_at timestamptz NULL;
	END IF;
END $ddl$;
CREATE TABLE IF NOT EXISTS %[15]s (
	stream text PRIMARY KEY,
	last_id text NOT NULL,
	entries_added bigint NOT NULL,
	first_ms bigint NOT NULL,
	consumed_ms bigint NOT NULL,
	groups text[] NULL,
	updated_at timestamptz NOT NULL DEFAULT now()
);`

	// readStreamStateSQL (with %[15]s the stream-state table) reads what the
	// relays last saw of stream $1, and how long ago (ms).
	readStreamStateSQL = `SELECT last_id, entries_added, first_ms, consumed_ms, coalesce(groups, '{}'),
	greatest(0, (extract(epoch FROM clock_timestamp() - updated_at) * 1000)::bigint) FROM %[15]s WHERE stream = $1`

	// writeStreamStateSQL (with %[15]s the stream-state table) records what
	// a relay saw of a stream, replacing what was there unless that has a
	// later last id: the relays write what they saw a moment ago, after
	// their own look for a reset, and of two relays writing at once (both
	// stopping) the one that looked first may write last. Its older view
	// would hide a loss of the entries between the two from the next relay
	// (the stream's last id back at the older one is no reset to it). A
	// relay that saw the stream reset writes its view of the stream made
	// anew with replaceStreamStateSQL. Ids compare as (ms, seq) numbers; an
	// empty id is the lowest.
	writeStreamStateSQL = replaceStreamStateSQL + `
WHERE (coalesce(nullif(split_part(s.last_id, '-', 1), '')::numeric, -1),
		coalesce(nullif(split_part(s.last_id, '-', 2), '')::numeric, -1))
	<= (coalesce(nullif(split_part(excluded.last_id, '-', 1), '')::numeric, -1),
		coalesce(nullif(split_part(excluded.last_id, '-', 2), '')::numeric, -1))`

	// replaceStreamStateSQL records what a relay saw of a stream, replacing
	// what was there (writeStreamStateSQL without its condition).
	replaceStreamStateSQL = `INSERT INTO %[15]s AS s (stream, last_id, entries_added, first_ms, consumed_ms, groups)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (stream) DO UPDATE SET last_id = excluded.last_id, entries_added = excluded.entries_added,
	first_ms = excluded.first_ms, consumed_ms = excluded.consumed_ms, groups = excluded.groups, updated_at = now()`

	// forgetStreamStateSQL (with %[15]s the stream-state table) forgets a
	// stream that is gone (its reset recorded): a stream made anew is not
	// one more reset.
	forgetStreamStateSQL = `DELETE FROM %[15]s WHERE stream = $1`

	// recordStreamResetSQL (with %[14]s the resets table) records one reset
	// and returns the window recorded, and whether a replay moved its
	// start. The window is of dispatch times, PostgreSQL's clock, and the
	// relay gives it by its own ($2, $3; $6 is the relay's clock now): a
	// relay clock ahead of PostgreSQL's moves the start back by as much
	// (one behind leaves it, the wider window), and the window ends no
	// earlier than now(), after the detection, whatever the two clocks say.
	// A replay of stream $1 after the start (a reset marked replayed, or a
	// replay's own record) added the events of its window again then,
	// inside the new window, while their rows' dispatched_at stayed where
	// it was: so the new window reaches back to the start of that replay's
	// window too.
	recordStreamResetSQL = `WITH s AS (
	SELECT $2::timestamptz - greatest(interval '0', $6::timestamptz - clock_timestamp()) AS start
), rec AS (
	INSERT INTO %[14]s (stream, window_start, window_end, reason, groups)
	SELECT $1, least(s.start, (SELECT min(window_start) FROM %[14]s WHERE stream = $1 AND replayed_at >= s.start)),
		greatest($3::timestamptz, now()), $4, $5::text[]
	FROM s
	RETURNING window_start, window_end, pg_current_xact_id()::text::bigint AS xid
)
SELECT rec.window_start, rec.window_end, rec.xid, rec.window_start < s.start FROM rec, s`

	// endedBelowSQL says whether every transaction with an id below $1 has
	// ended.
	endedBelowSQL = `SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint >= $1::bigint`

	// nextXactIDSQL assigns its transaction an id, above every id assigned
	// before. (A snapshot's xmax is not that: it is one past the latest
	// transaction that ended, and a transaction still running may have a
	// larger id.)
	nextXactIDSQL = `SELECT pg_current_xact_id()::text::bigint`

	// recordStreamResetNoGroupsSQL is recordStreamResetSQL on a table made
	// by an earlier version that the relay's role may not alter (relay
	// schema --apply, run by its owner, adds the groups); $5 is the relay's
	// clock.
	recordStreamResetNoGroupsSQL = `WITH s AS (
	SELECT $2::timestamptz - greatest(interval '0', $5::timestamptz - clock_timestamp()) AS start
), rec AS (
	INSERT INTO %[14]s (stream, window_start, window_end, reason)
	SELECT $1, least(s.start, (SELECT min(window_start) FROM %[14]s WHERE stream = $1 AND replayed_at >= s.start)),
		greatest($3::timestamptz, now()), $4
	FROM s
	RETURNING window_start, window_end, pg_current_xact_id()::text::bigint AS xid
)
SELECT rec.window_start, rec.window_end, rec.xid, rec.window_start < s.start FROM rec, s`

	// awaitedGroupsSQL (with %[14]s the resets table) lists the resets of
	// stream $1 whose consumer groups were not all seen back yet, with
	// their groups.
	awaitedGroupsSQL = `SELECT id, groups FROM %[14]s
WHERE stream = $1 AND groups_back_at IS NULL AND cardinality(groups) > 0 ORDER BY id`

	// groupsBackSQL (with %[14]s the resets table) records the groups of
	// resets $1 seen back.
	groupsBackSQL = `UPDATE %[14]s SET groups_back_at = now() WHERE id = ANY($1::bigint[]) AND groups_back_at IS NULL`

	// recordReplaySQL (with %[14]s the resets table) records a replay of
	// stream $1 over [$2, $3) that begins, for recordStreamResetSQL, and
	// returns its id: until it ends (replayEndedSQL) its replayed_at is
	// 'infinity', so that a reset recorded while it runs, which may have
	// taken entries it added, reaches back to its window; one that never
	// ends (its process killed) stays so, and widens later windows.
	recordReplaySQL = `INSERT INTO %[14]s (stream, window_start, window_end, reason, replayed_at)
VALUES ($1, $2, $3, $4, 'infinity') RETURNING id`

	// replayEndedSQL (with %[14]s the resets table) records that replay $1
	// (recordReplaySQL) ended now, and forgets it when it added nothing
	// ($2 false).
	replayEndedSQL = `WITH ended AS (
	UPDATE %[14]s SET replayed_at = now() WHERE id = $1 AND $2::boolean
)
DELETE FROM %[14]s WHERE id = $1 AND NOT $2::boolean`

	// pendingStreamResetsSQL (with %[14]s the resets table) sums up the
	// resets of stream $1 that no replay has covered yet: how many, the
	// union of their windows and the latest detection.
	pendingStreamResetsSQL = `SELECT count(*), min(window_start), max(window_end), max(detected_at)
FROM %[14]s WHERE stream = $1 AND replayed_at IS NULL`

	// resetsHoldSQL (with %[14]s the resets table) is the start of the
	// earliest window, of any stream, of a reset not yet replayed or of a
	// replay (a reset marked replayed, or a replay's own record) that ended
	// less than $1 seconds ago, or began so for one that never ended
	// ('infinity'): NULL when none; and whether a reset not yet replayed is
	// among them.
	resetsHoldSQL = `SELECT min(window_start), coalesce(bool_or(replayed_at IS NULL), false) FROM %[14]s
WHERE replayed_at IS NULL
	OR CASE WHEN replayed_at = 'infinity' THEN detected_at ELSE replayed_at END > now() - $1 * interval '1 second'`

	// markStreamResetsReplayedSQL (with %[14]s the resets table) marks the
	// resets of stream $1 whose window [window_start, window_end], its end
	// included, lies within the replay's [$2, $3), and that were detected
	// before $4 as replayed: the replay read no row dispatched at $3.
	markStreamResetsReplayedSQL = `UPDATE %[14]s SET replayed_at = now()
WHERE stream = $1 AND replayed_at IS NULL AND window_start >= $2 AND window_end < $3 AND detected_at < $4`

	// dispatchedSQL reads the rows dispatched in [$1, $2), oldest first by
	// (created_at, id) as the claim orders them, for a replay. It is one
	// statement whose rows are streamed: one scan of the table however many
	// pages the replay publishes (no index serves dispatched_at; a replay
	// is rare and bounded by the retention).
	// %[14]s adds the key (replayKeyed) when the table has a key column.
	dispatchedSQL = `SELECT %[2]s::text, %[3]s::text, %[4]s::text, %[5]s::timestamptz%[14]s FROM %[1]s
WHERE %[6]s >= $1 AND %[6]s < $2
ORDER BY %[5]s, %[2]s`

	// createdSQL reads the rows created in [$1, $2), and those without a
	// created_at, in the same order, for a replay of a relay of source
	// LogicalReplication, which marks no row dispatched. One streamed
	// statement too; the pending index does not serve it (it holds the
	// rows not marked, which here are all of them), and a replay is rare.
	createdSQL = `SELECT %[2]s::text, %[3]s::text, %[4]s::text, %[5]s::timestamptz%[14]s FROM %[1]s
WHERE (%[5]s >= $1 AND %[5]s < $2) OR %[5]s IS NULL
ORDER BY %[5]s, %[2]s`

	// olderDispatchedSQL and olderCreatedSQL ask whether a row dispatched
	// (created) before $1 is still in the table (Table.KeepsRowsBefore).
	olderDispatchedSQL = `SELECT EXISTS (SELECT 1 FROM %[1]s WHERE %[6]s < $1)`
	olderCreatedSQL    = `SELECT EXISTS (SELECT 1 FROM %[1]s WHERE %[5]s < $1)`

	// replayKeyed (with %[14]s the key column) is the key of a replayed
	// row, as the claim of ordering PerKey returns it, and no partition
	// (a replay publishes unfenced).
	replayKeyed = `, coalesce(%[14]s::text, ''), 0::bigint`

	// progressDDL (with %[14]s the progress table) creates the table where
	// logical replication relays record, per slot, the last commit they
	// published and the catch-up due (progress.go). catch_up_id, the xmin
	// columns, catch_up_after, the pub_ columns, partitions and
	// confirmed_lsn, added later, are added to a table made without them;
	// the ALTER runs only then, as it takes a lock that would queue behind
	// the table's readers.
	progressDDL = `CREATE TABLE IF NOT EXISTS %[14]s (
	slot text PRIMARY KEY,
	last_commit timestamptz NULL,
	catch_up_pending boolean NOT NULL DEFAULT false,
	catch_up_id bigint NULL,
	xmin_horizon bigint NULL,
	xmin_sample bigint NULL,
	xmin_sampled_at timestamptz NULL,
	catch_up_after bigint NULL,
	pub_fingerprint text NULL,
	pub_xmin bigint NULL,
	partitions text NULL,
	confirmed_lsn bigint NULL,
	updated_at timestamptz NOT NULL DEFAULT now()
);
DO $ddl$ BEGIN
	IF (SELECT count(*) FROM pg_attribute WHERE attrelid = '%[14]s'::regclass AND NOT attisdropped
		AND attname IN ('catch_up_id', 'xmin_horizon', 'xmin_sample', 'xmin_sampled_at',
			'catch_up_after', 'pub_fingerprint', 'pub_xmin', 'partitions', 'confirmed_lsn')) < 9 THEN
		ALTER TABLE %[14]s ADD COLUMN IF NOT EXISTS catch_up_id bigint NULL,
			ADD COLUMN IF NOT EXISTS xmin_horizon bigint NULL,
			ADD COLUMN IF NOT EXISTS xmin_sample bigint NULL,
			ADD COLUMN IF NOT EXISTS xmin_sampled_at timestamptz NULL,
			ADD COLUMN IF NOT EXISTS catch_up_after bigint NULL,
			ADD COLUMN IF NOT EXISTS pub_fingerprint text NULL,
			ADD COLUMN IF NOT EXISTS pub_xmin bigint NULL,
			ADD COLUMN IF NOT EXISTS partitions text NULL,
			ADD COLUMN IF NOT EXISTS confirmed_lsn bigint NULL;
	END IF;
END $ddl$;
CREATE TABLE IF NOT EXISTS %[15]s (
	slot text NOT NULL,
	recorded_at timestamptz NOT NULL DEFAULT now(),
	last_commit timestamptz NOT NULL,
	xmin_horizon bigint NULL,
	PRIMARY KEY (slot, recorded_at)
);`

	readProgressSQL = `SELECT last_commit, catch_up_pending, coalesce(catch_up_id, 0), xmin_horizon,
	coalesce(pub_fingerprint, ''), pub_xmin, partitions, confirmed_lsn FROM %[14]s WHERE slot = $1`

	// recordConfirmedSQL (with %[14]s the progress table) records that slot
	// $1's relay is about to confirm position $2 (an LSN), before it tells
	// the server: the highest recorded, so a relay cut off from the slot
	// cannot lower it.
	recordConfirmedSQL = `UPDATE %[14]s SET confirmed_lsn = greatest(confirmed_lsn, $2::bigint), updated_at = now() WHERE slot = $1`

	// lockPartitionsSQL (with %[14]s the progress table) reads what slot
	// $1's progress records of the partitions, and locks its row until the
	// transaction ends, so that what is written after is based on it.
	lockPartitionsSQL = `SELECT partitions FROM %[14]s WHERE slot = $1 FOR UPDATE`

	// recordPartitionsSQL (with %[14]s the progress table) records the
	// partitions of the table whose rows slot $1's relay has published
	// ($2, logical.PartitionKeys); with $3, only if none are recorded (the
	// baseline, before the slot's catch-up).
	recordPartitionsSQL = `UPDATE %[14]s SET partitions = $2, updated_at = now()
WHERE slot = $1 AND (NOT $3::boolean OR partitions IS NULL)`

	// startCatchUpSQL (with %[14]s the progress table) records a catch-up of
	// slot $1 due and returns its id, the transactions it waits for and its
	// xmin horizon. The id is a new one when the slot is to be made ($2),
	// when none was due or when the one due has none (recorded by an
	// earlier version); else (the slot exists and its catch-up is still
	// due: its relay stopped, or streams it now) the one due. A new
	// catch-up reads once every transaction running now has ended: those
	// below catch_up_after, this statement's own id (one that began later
	// got its id later; a snapshot's xmax would not do, as a running
	// transaction's id can be at or above it). Those of a publication's
	// gap insert rows the slot skips, and commit whenever they end. $3, the xmin of the last look at
	// the publication before it changed (NULL: not a publication's gap),
	// lowers the horizon to it, and its wait too is now's; $4 is the
	// publication's fingerprint since (NULL: unchanged). A gap's finds no
	// row when a catch-up is due already (ErrCatchUpPending).
	startCatchUpSQL = `INSERT INTO %[14]s AS p (slot, catch_up_pending, catch_up_id, catch_up_after, xmin_horizon, pub_fingerprint)
VALUES ($1, true, 1, pg_current_xact_id()::text::bigint, $3::bigint, $4::text)
ON CONFLICT (slot) DO UPDATE SET
	catch_up_id = CASE WHEN $2::boolean OR NOT p.catch_up_pending OR p.catch_up_id IS NULL
		THEN coalesce(p.catch_up_id, 0) + 1 ELSE p.catch_up_id END,
	catch_up_after = CASE WHEN $2::boolean OR NOT p.catch_up_pending OR p.catch_up_id IS NULL OR $3::bigint IS NOT NULL
		THEN excluded.catch_up_after ELSE p.catch_up_after END,
	catch_up_pending = true,
	xmin_horizon = CASE WHEN $3::bigint IS NULL THEN p.xmin_horizon ELSE least(p.xmin_horizon, $3::bigint) END,
	xmin_sample = CASE WHEN $3::bigint IS NULL THEN p.xmin_sample END,
	xmin_sampled_at = CASE WHEN $3::bigint IS NULL THEN p.xmin_sampled_at END,
	pub_fingerprint = coalesce($4::text, p.pub_fingerprint),
	updated_at = now()
WHERE $3::bigint IS NULL OR NOT p.catch_up_pending
RETURNING catch_up_id, catch_up_after, xmin_horizon`

	// finishCatchUpSQL (with %[14]s the progress table) records catch-up $3
	// of slot $1 done, up to $2, and ends it only if it is still the one
	// due; it returns whether it did. $4, the oldest transaction running at
	// the catch-up's snapshot, is the xmin horizon from then on: a
	// transaction that commits after that snapshot has an id at or after it
	// (whether or not the catch-up still ends). $2 and $4 NULL (a catch-up
	// of a publication's gap, while the stream is behind its snapshot) leave
	// the progress and the horizon as they are.
	finishCatchUpSQL = `UPDATE %[14]s AS p SET
	last_commit = greatest(p.last_commit, $2::timestamptz),
	catch_up_pending = p.catch_up_pending AND p.catch_up_id IS DISTINCT FROM $3::bigint,
	xmin_horizon = coalesce($4::bigint, p.xmin_horizon),
	xmin_sample = CASE WHEN $4::bigint IS NULL THEN p.xmin_sample END,
	xmin_sampled_at = CASE WHEN $4::bigint IS NULL THEN p.xmin_sampled_at END,
	updated_at = now()
WHERE p.slot = $1
RETURNING NOT p.catch_up_pending`

	// recordPublicationSQL (with %[14]s the progress table) records what
	// slot $1's relay saw of its publication, fingerprint $2 at a look of
	// xmin $3, unless one is recorded: that one's gap, if any, is not
	// found yet (a new slot made after it, or by another relay meanwhile).
	recordPublicationSQL = `UPDATE %[14]s SET pub_fingerprint = coalesce(pub_fingerprint, $2),
	pub_xmin = CASE WHEN pub_fingerprint IS NULL THEN $3 ELSE pub_xmin END, updated_at = now() WHERE slot = $1`

	// markUnpublishedSQL adds the entry $2 to the fingerprint recorded for
	// slot $1, once, keeping pub_xmin (PublicationUnpublished).
	markUnpublishedSQL = `UPDATE %[14]s SET pub_fingerprint = pub_fingerprint || ',' || $2, updated_at = now()
WHERE slot = $1 AND pub_fingerprint IS NOT NULL AND pub_fingerprint <> '' AND NOT $2 = ANY (string_to_array(pub_fingerprint, ','))`

	// recordProgressSQL moves last_commit forward only; $3 ends a catch-up
	// recorded without an id only (by a relay of an earlier version): one
	// with an id ends with finishCatchUpSQL.
	//
	// It also keeps the xmin horizon (progress.go, Progress.XminHorizon): it
	// samples the oldest transaction running now with the time after the
	// sample's snapshot, and makes a sample the horizon once a commit at
	// least a second later is recorded. A transaction that commits
	// after that commit had not committed at the sample (PostgreSQL takes a
	// commit's time before it writes the commit, which a transaction after
	// it in the WAL follows): its id is at or after the sample. The slack
	// covers the clock stepping back. A sample waits until then; the next
	// is taken when it is used.
	//
	// $4 and $5, when $4 is not NULL, are the publication's fingerprint
	// and the xmin of the relay's last look that saw it (Look): the
	// lower bound of a catch-up if it changes before the next.
	//
	// And at most once a minute it logs the progress (%[15]s, the progress
	// log), for the cleanup, which keeps the rows published within its
	// retention (DeleteStreamed).
	recordProgressSQL = `WITH rec AS (
INSERT INTO %[14]s AS p (slot, last_commit, xmin_sample, xmin_sampled_at, pub_fingerprint, pub_xmin)
VALUES ($1, $2, pg_snapshot_xmin(pg_current_snapshot())::text::bigint, clock_timestamp(), $4::text, $5::bigint)
ON CONFLICT (slot) DO UPDATE SET
	last_commit = greatest(p.last_commit, excluded.last_commit),
	pub_fingerprint = coalesce($4::text, p.pub_fingerprint),
	pub_xmin = CASE WHEN $4::text IS NULL THEN p.pub_xmin ELSE $5::bigint END,
	catch_up_pending = p.catch_up_pending AND NOT ($3::boolean AND p.catch_up_id IS NULL),
	xmin_horizon = CASE
		WHEN p.xmin_sampled_at <= greatest(p.last_commit, excluded.last_commit) - interval '1 second'
		THEN p.xmin_sample ELSE p.xmin_horizon END,
	xmin_sample = CASE
		WHEN p.xmin_sampled_at IS NULL OR p.xmin_sampled_at <= greatest(p.last_commit, excluded.last_commit) - interval '1 second'
		THEN excluded.xmin_sample ELSE p.xmin_sample END,
	xmin_sampled_at = CASE
		WHEN p.xmin_sampled_at IS NULL OR p.xmin_sampled_at <= greatest(p.last_commit, excluded.last_commit) - interval '1 second'
		THEN excluded.xmin_sampled_at ELSE p.xmin_sampled_at END,
	updated_at = now()
RETURNING p.slot, p.last_commit, p.xmin_horizon)
INSERT INTO %[15]s (slot, last_commit, xmin_horizon)
SELECT slot, last_commit, xmin_horizon FROM rec
WHERE NOT EXISTS (SELECT 1 FROM %[15]s l WHERE l.slot = $1 AND l.recorded_at > now() - interval '1 minute')`

	// agedProgressSQL (with %[15]s the progress log) is the progress of slot
	// $1 as it was logged $2 seconds ago or before: the newest such entry.
	agedProgressSQL = `SELECT recorded_at, last_commit, xmin_horizon FROM %[15]s
WHERE slot = $1 AND recorded_at <= now() - make_interval(secs => $2) ORDER BY recorded_at DESC LIMIT 1`

	// pruneProgressLogSQL (with %[15]s the progress log) forgets the entries
	// of slot $1 older than $2 (the one the cleanup used).
	pruneProgressLogSQL = `DELETE FROM %[15]s WHERE slot = $1 AND recorded_at < $2`

	// insertedSinceHorizon (with %[1]s the parameter that holds a full
	// transaction id, NULL: none) says whether a row was inserted by a
	// transaction at or after it: whether the row is at most as old as the
	// horizon, in transactions. A row's xmin is a 32-bit id: its age (which
	// counts back from the current id) is read as less than 2^32 (a negative
	// age is one past 2^31). The horizon's age is age() of its 32-bit id
	// while it is less than 2^31 (less a margin) old, which counts from the
	// same current id; older, its 64-bit distance from the snapshot's xmax.
	insertedSinceHorizon = `(%[1]s::bigint IS NOT NULL AND
	(CASE WHEN age(xmin) < 0 THEN age(xmin)::bigint + 4294967296 ELSE age(xmin)::bigint END) <=
	(CASE WHEN pg_snapshot_xmax(pg_current_snapshot())::text::bigint - %[1]s::bigint < 2000000000
		THEN age((%[1]s::bigint %% 4294967296)::text::xid)::bigint
		ELSE pg_snapshot_xmax(pg_current_snapshot())::text::bigint - %[1]s::bigint END))`

	// declareCatchUpSQL (with %[14]s what to read: the table, with its
	// children, or ONLY one child, and %[15]s insertedSinceHorizon of $2)
	// opens the cursor of a catch-up: the rows not marked dispatched created
	// at or after $1 ($1 NULL: every row), those inserted by a transaction
	// at or after the xmin horizon $2, and those without created_at, in the
	// claim's order. It has no upper bound: the transaction's snapshot
	// bounds it, and what commits later is in the slot's stream.
	declareCatchUpSQL = `DECLARE outbox_catch_up NO SCROLL CURSOR FOR
SELECT %[2]s::text, %[3]s::text, %[4]s::text, %[5]s::timestamptz FROM %[14]s
WHERE %[6]s IS NULL AND ($1::timestamptz IS NULL OR %[5]s IS NULL OR %[5]s >= $1 OR %[15]s)
ORDER BY %[5]s NULLS FIRST, %[2]s::text`

	// fetchCatchUpSQL reads the next page of that cursor.
	fetchCatchUpSQL = `FETCH FORWARD %d FROM outbox_catch_up`

	// createdAtIsLocalSQL ($1 the quoted table, $2 the created_at column)
	// says whether the column is a timestamp without time zone (or a domain
	// over one), whose values are wall times in the writer's TimeZone.
	createdAtIsLocalSQL = `SELECT coalesce(nullif(t.typbasetype, 0), t.oid) = 'timestamp'::regtype
FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
WHERE a.attrelid = to_regclass($1) AND a.attname = $2 AND NOT a.attisdropped`

	// backlogSinceSQL (with %[14]s the progress table) counts at most $2
	// rows created after slot $1's last commit, and finds the oldest.
	backlogSinceSQL = `WITH p AS (SELECT max(last_commit) AS since FROM %[14]s WHERE slot = $1)
SELECT
	(SELECT count(*) FROM (SELECT 1 FROM %[1]s, p WHERE p.since IS NULL OR %[5]s > p.since LIMIT $2) AS pending),
	(SELECT min(%[5]s) FROM %[1]s, p WHERE p.since IS NULL OR %[5]s > p.since)::timestamptz`

	// The trigger is statement-level: one NOTIFY per inserting statement,
	// not per row. NOTIFY serialises committing transactions on a global
	// lock, so it is optional and polling is good on its own.
	triggerDDL = `CREATE OR REPLACE FUNCTION %[8]s() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
	PERFORM pg_notify(%[10]s, '');
	RETURN NULL;
END
$fn$;
CREATE OR REPLACE TRIGGER %[9]s AFTER INSERT ON %[1]s
	FOR EACH STATEMENT EXECUTE FUNCTION %[8]s();`
)

// format fills a statement template with the table's quoted identifiers;
// extra values (already quoted) follow as %[14]s and up.
func (t *Table) format(tmpl string, extra ...any) string {
	args := []any{
		t.qTable,                               // 1
		t.qID,                                  // 2
		t.qType,                                // 3
		t.qPayload,                             // 4
		t.qCreated,                             // 5
		t.qDispatched,                          // 6
		quote(t.PendingIndexName()),            // 7 (an index lives in its table's schema)
		t.qualified(t.objectName("notify_fn")), // 8
		quote(t.TriggerName()),                 // 9
		quoteLiteral(t.Channel()),              // 10
		t.qualified(t.DeadLetterTableName()),   // 11
		t.qualified(t.objectName("20261201")),  // 12 (an example partition)
		t.qualified(t.objectName("default")),   // 13
	}
	return fmt.Sprintf(tmpl, slices.Concat(args, extra)...)
}

// quoteLiteral quotes a string known to match the identifier pattern (or a
// derived channel name) as an SQL string literal.
func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// ClaimSQL is the claim statement of dispatch mode d; $1 is the batch size.
func (t *Table) ClaimSQL(d Dispatch) string { return t.format(claimSQL, "", "", "", t.claimAction(d)) }

// ClaimFromSQL is ClaimSQL starting at a created_at: $2 (Table.ClaimFrom).
func (t *Table) ClaimFromSQL(d Dispatch) string {
	return t.format(claimSQL, t.format(claimFromWhere), "", "", t.claimAction(d))
}

// ClaimKeyedSQL is the claim of ordering PerKey; $1 is the batch size, $2
// the number of key partitions, $3 the partitions to take rows of.
func (t *Table) ClaimKeyedSQL(d Dispatch) string {
	return t.format(claimSQL, t.format(claimKeyedWhere, t.qKey), t.format(claimKeyedReturning, t.qKey), claimKeyedSelect,
		t.claimAction(d))
}

// claimAction is the claim's statement on the rows it took.
func (t *Table) claimAction(d Dispatch) string {
	if d == DeleteOnDispatch {
		return t.format(claimDelete)
	}
	return t.format(claimMark)
}

// BacklogSQL counts pending rows and returns the oldest created_at.
func (t *Table) BacklogSQL() string { return t.format(backlogSQL) }

// BacklogUpToSQL counts at most $1 pending rows and returns the oldest
// created_at.
func (t *Table) BacklogUpToSQL() string { return t.format(backlogUpToSQL) }

// CleanupSQL deletes a bounded batch; $1 is the retention in seconds, $2
// the batch size.
func (t *Table) CleanupSQL() string { return t.format(cleanupSQL) }

// InsertSQL inserts one event; $1 id, $2 event type, $3 payload.
func (t *Table) InsertSQL() string { return t.format(insertSQL) }

// InsertDefaultIDSQL inserts one event with the table's default id; $1
// event type, $2 payload; it returns the id as text.
func (t *Table) InsertDefaultIDSQL() string { return t.format(insertDefaultIDSQL) }

// DDLOptions selects the optional parts of DDL.
type DDLOptions struct {
	// Notify adds the statement-level NOTIFY trigger that wakes relays.
	Notify bool
	// Partitioned makes the table range-partitioned on created_at, with a
	// default partition; the primary key becomes (id, created_at).
	Partitioned bool
}

// DDL returns the statements that create the table in the default types
// (uuid id, text type and payload, timestamptz times), its partial index on
// pending rows, the dead-letter table and, optionally, the NOTIFY trigger.
// Every statement is idempotent.
func (t *Table) DDL(opts DDLOptions) string {
	var parts []string
	if t.schema != "" {
		parts = append(parts, "CREATE SCHEMA IF NOT EXISTS "+quote(t.schema)+";")
	}
	table := tableDDL
	if opts.Partitioned {
		table = partitionedTableDDL
	}
	parts = append(parts, t.format(table), t.format(indexDDL), t.format(deadLetterDDL), t.StreamResetsDDL())
	if opts.Notify {
		parts = append(parts, t.format(triggerDDL))
	}
	return strings.Join(parts, "\n") + "\n"
}

// IndexDDL creates only the partial index, for an existing table.
func (t *Table) IndexDDL() string { return t.format(indexDDL) + "\n" }

// DeadLetterDDL creates only the dead-letter table, for an existing table.
func (t *Table) DeadLetterDDL() string { return t.format(deadLetterDDL) + "\n" }
