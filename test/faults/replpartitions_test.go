//go:build faults

package faults

import (
	"fmt"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-dev/outbox-operator/internal/testenv"
)

// partitionedOutboxDDL replaces the outbox table with a range-partitioned
// one of the same columns: a partition for 2000 to 2100, where the
// producers' rows (created now) go.
const partitionedOutboxDDL = `DROP TABLE outbox_events;
CREATE TABLE outbox_events (
	id uuid NOT NULL DEFAULT gen_random_uuid(),
	event_type text NOT NULL,
	payload text NOT NULL,
	created_at timestamptz NOT NULL DEFAULT now(),
	dispatched_at timestamptz NULL
) PARTITION BY RANGE (created_at);
CREATE TABLE outbox_events_now PARTITION OF outbox_events FOR VALUES FROM ('2000-01-01') TO ('2100-01-01')`

// TestReplicationPartitionsJoining checks source LogicalReplication on a
// partitioned outbox table, published as a whole, as processes. Producers
// write while two relays share the slot, and:
//   - a third of the way a table filled with rows (a backfill, dated
//     before 2000) is attached as a partition, and 200 ms later the relay
//     holding the slot is SIGKILLed: the standby takes the slot and must
//     publish the rows the partition brought, which the slot never streams
//     (they went into the WAL as another table's);
//   - two thirds of the way a partition for 2100 on is created UNLOGGED and
//     written into: the holder must refuse to go on (its inserts never
//     reach the WAL) and say how to fix it; then it is made LOGGED, and its
//     rows must be published.
//
// Nothing may be lost. Before the relay recorded the partitions it
// published, the backfill's rows and the unlogged partition's were lost
// with the relay ready all along. It runs in the CI slice, once.
func TestReplicationPartitionsJoining(t *testing.T) {
	t.Parallel()
	backfill := sized(500, 5000)
	events := sized(4000, 20000)
	rate := sized(400.0, 800.0)
	const batchSize = 100

	pg, rs := testenv.StartPostgres(t), testenv.StartRedis(t)
	env, stream := caseEnv(t, pg, rs)
	conn := connect(t, pg.DSN())
	mustExec(t, conn, partitionedOutboxDDL)

	prod := startProducers(t, producerConfig{dsn: pg.DSN(), conns: 2, events: events, rate: rate,
		insert: insertInto("outbox_events")})
	produceStart := time.Now()
	args := []string{"--stream", stream, "--source", "LogicalReplication", "--slot", replicationSlot,
		"--batch-size", strconv.Itoa(batchSize), "--poll-interval", "50ms"}
	sr := &slotRelays{t: t, conn: conn, env: env, args: args, prefix: "P"}
	sr.start()
	sr.holder()
	// The holder's catch-up (the rows committed before the slot) done, and
	// only then the standby: a catch-up still due at the kill, or one the
	// standby read as due just before it ended, is done again in full,
	// beyond the duplicates' bound (on a loaded machine the catch-up may
	// outlast a third of the production).
	eventually(t, time.Minute, "the first catch-up", func() error {
		if countLog(sr.all, "Caught up") == 0 {
			return fmt.Errorf("no relay logged its catch-up")
		}
		return nil
	})
	sr.start() // the standby
	production := time.Duration(float64(events) / rate * float64(time.Second))

	// The backfill, attached; the holder killed before it can have looked
	// twice.
	sleepUntil(t.Context(), produceStart.Add(production/3))
	mustExec(t, conn, `CREATE TABLE outbox_backfill (LIKE outbox_events INCLUDING DEFAULTS)`)
	committed := insertRows(t, conn, `INSERT INTO outbox_backfill (event_type, payload, created_at)
SELECT 'fault.backfill', '{}', '1999-01-01'::timestamptz + g * interval '1 second' FROM generate_series(1, $1) g
RETURNING id::text, created_at`, backfill)
	h := sr.holder()
	mustExec(t, conn, `ALTER TABLE outbox_events ATTACH PARTITION outbox_backfill FOR VALUES FROM (MINVALUE) TO ('2000-01-01')`)
	time.Sleep(200 * time.Millisecond)
	takeover := sr.kill(h)
	sr.start()

	// An UNLOGGED partition, written into; refused; made LOGGED.
	sleepUntil(t.Context(), produceStart.Add(production*2/3))
	mustExec(t, conn, `CREATE UNLOGGED TABLE outbox_events_later PARTITION OF outbox_events FOR VALUES FROM ('2100-01-01') TO (MAXVALUE)`)
	committed = append(committed, insertRows(t, conn, `INSERT INTO outbox_events (event_type, payload, created_at)
SELECT 'fault.later', '{}', '2100-01-01'::timestamptz + g * interval '1 second' FROM generate_series(1, $1) g
RETURNING id::text, created_at`, 100)...)
	refused := eventually(t, time.Minute, "the relays refusing the unlogged partition", func() error {
		if countLog(sr.all, "UNLOGGED (or temporary)") == 0 {
			return fmt.Errorf("no relay said so")
		}
		return nil
	})
	mustExec(t, conn, `ALTER TABLE outbox_events_later SET LOGGED`)

	prod.wait(t)
	committed = append(committed, prod.committed()...)
	rdb := redisClient(t, rs.URL())
	drain := waitStreamed(t, rdb, stream, committed)
	sr.stopAll()

	joined := joinedRows(sr.all)
	r := Check(committed, streamEventIDs(t, rdb, stream, 1000))
	// The partitions' rows published again if a relay died before it
	// recorded them, and two batches of unconfirmed tail per kill and at the
	// end.
	bound := backfill + 100 + 2*2*batchSize
	figures(t, r, 2, fmt.Sprintf("backfill=%d unlogged_rows=100 rows_published_from_joined_partitions=%d duplicate_bound=%d "+
		"takeover=%s refused_after=%s drain=%s", backfill, joined, bound, ms(takeover), ms(refused), ms(drain)))
	require.Zero(t, r.Lost, "lost events, e.g. %v", r.LostIDs)
	require.Zero(t, r.Unexpected, "stream entries no producer committed")
	require.LessOrEqual(t, r.Duplicates, bound, "duplicates beyond the partitions' rows and two batches per kill")
	require.GreaterOrEqual(t, joined, backfill+100, "the rows the partitions brought, published by their joining")
	require.Zero(t, countLog(sr.all, "panic:"), "a relay panicked")
}

var joinedRE = regexp.MustCompile(`msg="Published the rows of tables new under the table[^\n]* events=(\d+)`)

// joinedRows counts the rows the relays published from partitions that
// joined the table.
func joinedRows(relays []*relayProc) (rows int) {
	for _, r := range relays {
		for _, m := range joinedRE.FindAllStringSubmatch(r.out.String(), -1) {
			n, _ := strconv.Atoi(m[1])
			rows += n
		}
	}
	return rows
}
