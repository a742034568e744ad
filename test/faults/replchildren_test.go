//go:build faults

package faults

import (
	"fmt"
	"math/rand/v2"
	"regexp"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outbox-dev/outbox-operator/internal/testenv"
)

// producerZones are the TimeZone settings of the producers of
// TestReplicationChildren, one per connection: far east of UTC, UTC, far
// west. In a `timestamp without time zone` created_at their rows look 14
// hours in the future and 10 hours in the past.
var producerZones = []string{"Pacific/Kiritimati", "UTC", "Pacific/Honolulu"}

// TestReplicationChildren checks source LogicalReplication on an
// inheritance parent whose created_at is a `timestamp without time zone`
// (local wall time), as processes:
//   - rows are committed in every zone, into the parent and its child c1,
//     before any relay runs, and the producers keep writing while the first
//     relay creates the slot and catches up (rows that look in the future,
//     and rows committed during the slot's creation, were lost before);
//   - a third of the way, a new child c2 is created and the producers write
//     into it at once, then the relay holding the slot is SIGKILLed, so the
//     standby takes the slot and must add c2 to the publication with the
//     rows written into it before;
//   - two thirds of the way, a child c3 is created and written into while
//     the holder streams: it adds c3 itself (it looks at least every second).
//
// Nothing may be lost; duplicates (the catch-up overlapping the stream, the
// children's rows published again after the kill, the unconfirmed tail) are
// a figure within a bound, order is not asserted (three producers, three
// clocks). It runs in the CI slice, once: a slot's relay marks and deletes
// nothing, so the cleanup mode does not apply.
func TestReplicationChildren(t *testing.T) {
	t.Parallel()
	require.True(t, runHelpLists(t, "--source"), "this relay has no --source: it cannot stream from a slot")
	prefill := sized(150, 1000) // rows per zone and table (the parent, c1)
	events := sized(4000, 20000)
	rate := sized(400.0, 800.0) // rows per second, all producers together
	const batchSize = 100

	pg, rs := testenv.StartPostgres(t), testenv.StartRedis(t)
	env, stream := caseEnv(t, pg, rs)
	conn := connect(t, pg.DSN())
	const parent = "outbox_events"
	mustExec(t, conn, `ALTER TABLE outbox_events ALTER COLUMN created_at TYPE timestamp`)
	mustExec(t, conn, `CREATE TABLE outbox_events_c1 () INHERITS (outbox_events)`)

	var committed []Committed
	for _, zone := range producerZones {
		mustExec(t, conn, `SELECT set_config('TimeZone', $1, false)`, zone)
		for _, table := range []string{parent, "outbox_events_c1"} {
			sql, args := insertInto(table)(nil, prefill)
			committed = append(committed, insertRows(t, conn, sql, args...)...)
		}
	}
	mustExec(t, conn, `SET TimeZone = 'UTC'`)

	// Each producer transaction writes into the parent or into the newest
	// child, half and half.
	var child atomic.Pointer[string]
	newest := func(name string) { child.Store(&name) }
	newest("outbox_events_c1")
	// The producers write on past events until c3 has rows: on a loaded
	// machine the relays' start and the first catch-up may outlast the
	// planned production, and a child created after the producers stopped
	// would get no row (the case would miss its point).
	var writing atomic.Bool
	writing.Store(true)
	prod := startProducers(t, producerConfig{
		dsn: pg.DSN(), conns: len(producerZones), events: events, rate: rate, more: writing.Load,
		session: func(i int) string { return fmt.Sprintf("SET TimeZone = '%s'", producerZones[i]) },
		insert: func(rng *rand.Rand, n int) (string, []any) {
			if rng.IntN(2) == 0 {
				return insertInto(parent)(rng, n)
			}
			return insertInto(*child.Load())(rng, n)
		},
	})
	produceStart := time.Now()

	args := []string{"--stream", stream, "--source", "LogicalReplication", "--slot", replicationSlot,
		"--batch-size", strconv.Itoa(batchSize), "--poll-interval", "50ms"}
	sr := &slotRelays{t: t, conn: conn, env: env, args: args, prefix: "C"}
	sr.start()
	sr.holder()
	var committedAtCatchUp int
	eventually(t, time.Minute, "the first catch-up", func() error {
		if countLog(sr.all, "Caught up") == 0 {
			return fmt.Errorf("no relay logged its catch-up")
		}
		committedAtCatchUp = len(committed) + prod.committedCount()
		return nil
	})
	// The standby starts once the catch-up is recorded done: one that read
	// the progress while it was still due, and takes the slot right after
	// (the kill below comes soon after a long catch-up on a loaded
	// machine), does it again from the first row, beyond the bound.
	sr.start() // the standby

	// c2, written into at once; the holder is killed before it can have
	// looked twice, and the standby takes over.
	production := time.Duration(float64(events) / rate * float64(time.Second))
	sleepUntil(t.Context(), produceStart.Add(production/3))
	h := sr.holder()
	mustExec(t, conn, `CREATE TABLE outbox_events_c2 () INHERITS (outbox_events)`)
	newest("outbox_events_c2")
	waitRowsIn(t, conn, "outbox_events_c2")
	takeover := sr.kill(h)
	sr.start()

	// c3, written into while the holder streams.
	sleepUntil(t.Context(), produceStart.Add(production*2/3))
	mustExec(t, conn, `CREATE TABLE outbox_events_c3 () INHERITS (outbox_events)`)
	newest("outbox_events_c3")
	waitRowsIn(t, conn, "outbox_events_c3")
	writing.Store(false)

	prod.wait(t)
	committed = append(committed, prod.committed()...)
	rdb := redisClient(t, rs.URL())
	drain := waitStreamed(t, rdb, stream, committed)
	sr.stopAll()

	var published int
	require.NoError(t, conn.QueryRow(t.Context(), `SELECT count(*) FROM pg_publication_tables
		WHERE schemaname = 'public' AND tablename IN ('outbox_events_c2', 'outbox_events_c3')`).Scan(&published))
	adds, added := addedChildren(sr.all)
	r := Check(committed, streamEventIDs(t, rdb, stream, 1000))
	// The catch-up overlapping the stream, the rows the children held when
	// added (published again if a relay died before the add committed), two
	// batches of unconfirmed tail per kill and at the end.
	bound := committedAtCatchUp + added + 2*2*batchSize
	figures(t, r, 1, fmt.Sprintf("prefill=%d zones=%d children_added=%d rows_published_from_children=%d "+
		"duplicate_bound=%d takeover=%s drain=%s", len(producerZones)*2*prefill, len(producerZones), adds, added,
		bound, ms(takeover), ms(drain)))
	require.GreaterOrEqual(t, r.Committed, len(producerZones)*2*prefill+events)
	require.Zero(t, r.Lost, "lost events, e.g. %v", r.LostIDs)
	require.Zero(t, r.Unexpected, "stream entries no producer committed")
	require.LessOrEqual(t, r.Duplicates, bound, "duplicates beyond the catch-up, the children's rows and two batches per kill")
	require.Equal(t, 2, published, "outbox_events_c2 and c3 in the publication")
	require.Positive(t, added, "no row was written into a new child before a relay added it: the case missed its point")
	require.Zero(t, countLog(sr.all, "panic:"), "a relay panicked")
}

// waitRowsIn waits until a producer committed a row into child (its own
// rows, not its children's).
func waitRowsIn(t testing.TB, conn *pgx.Conn, child string) {
	t.Helper()
	eventually(t, time.Minute, "a row committed into "+child, func() error {
		var n int
		err := conn.QueryRow(t.Context(), `SELECT count(*) FROM ONLY `+pgx.Identifier{child}.Sanitize()).Scan(&n)
		if err == nil && n == 0 {
			err = fmt.Errorf("no row in %s yet", child)
		}
		return err
	})
}

var addedRE = regexp.MustCompile(`msg="Added inheritance children[^\n]* events=(\d+)`)

// slotRelays are the relays of one slot that a case starts: those still
// running, and all it started.
type slotRelays struct {
	t            testing.TB
	conn         *pgx.Conn
	env          relayEnv
	args         []string
	prefix       string // of the relays' names
	running, all []*relayProc
}

// start starts one more relay.
func (s *slotRelays) start() {
	s.t.Helper()
	r := startRelay(s.t, fmt.Sprintf("%s%d", s.prefix, len(s.all)+1), s.env, s.args...)
	s.running, s.all = append(s.running, r), append(s.all, r)
}

// holder waits for a running relay to stream from the slot, and returns it.
func (s *slotRelays) holder() (h *relayProc) {
	s.t.Helper()
	eventually(s.t, time.Minute, "a relay streaming from the slot", func() (err error) {
		h, err = slotHolder(s.t, s.conn, s.env.databaseURL, s.running)
		return err
	})
	return h
}

// kill SIGKILLs r and returns how long until another relay held the slot.
func (s *slotRelays) kill(r *relayProc) time.Duration {
	s.t.Helper()
	r.kill(s.t)
	killed := time.Now()
	s.running = slices.DeleteFunc(s.running, func(x *relayProc) bool { return x == r })
	s.holder()
	return time.Since(killed)
}

// stopAll stops the running relays (SIGTERM, a clean exit).
func (s *slotRelays) stopAll() {
	s.t.Helper()
	for _, r := range s.running {
		r.stop(s.t, time.Minute)
	}
}

// addedChildren counts the relays' log lines of children added to the
// publication, and the rows those adds published from the children.
func addedChildren(relays []*relayProc) (adds, rows int) {
	for _, r := range relays {
		for _, m := range addedRE.FindAllStringSubmatch(r.out.String(), -1) {
			n, _ := strconv.Atoi(m[1])
			adds, rows = adds+1, rows+n
		}
	}
	return adds, rows
}
