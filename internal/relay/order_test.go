package relay

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/outbox-dev/outbox-operator/internal/outbox"
	"github.com/outbox-dev/outbox-operator/internal/syncbuf"
	"github.com/outbox-dev/outbox-operator/internal/testenv"
)

// requireFirstOccurrencesInOrder checks what a consumer that dedupes on
// event_id sees: each id once, in the order of ids.
func requireFirstOccurrencesInOrder(t *testing.T, entries []entry, ids []string) {
	t.Helper()
	seen := map[string]bool{}
	var first []string
	for _, e := range entries {
		if id := e[FieldEventID]; !seen[id] {
			seen[id] = true
			first = append(first, id)
		}
	}
	require.Len(t, first, len(ids), "every event, once deduplicated")
	for i := range ids {
		require.Equal(t, ids[i], first[i], "event %d out of order", i)
	}
}

// TestFailedBatchHoldsBackTheBatchesClaimedAfterIt forces batches to
// overlap (three in flight) and fails one in the middle of the pipeline,
// before it reaches Redis: the batches claimed after it are rolled back,
// not published, and the stream stays in claim order.
func TestFailedBatchHoldsBackTheBatchesClaimedAfterIt(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	b.insertBulk(t, 400)
	ids := b.allIDs(t)
	r := b.newRelay(t, Config{BatchSize: 20, InFlight: 3})
	var batches atomic.Int64
	var failedOnce atomic.Bool
	release := make(chan struct{})
	r.testHookBeforePublish = func(events []outbox.Event) error {
		switch batches.Add(1) {
		case 2:
			<-release // hold batch 2 until the claimer has filled the pipeline behind it
			if failedOnce.CompareAndSwap(false, true) {
				return errors.New("injected failure of batch 2")
			}
		}
		return nil
	}
	stop := runInBackground(t, r)
	// Batches 3 and 4 are claimed (the tokens allow 3 in flight) while 2 waits.
	waitFor(t, "the pipeline full behind batch 2", func() bool { return b.openBatches(t) >= 3 })
	close(release)
	waitFor(t, "backlog drained", func() bool { return b.backlog(t) == 0 })
	require.NoError(t, stop())
	require.True(t, failedOnce.Load())
	requireFirstOccurrencesInOrder(t, b.readStream(t, b.stream), ids)
}

// TestClaimAfterAFailureWaitsForTheBatchesClaimedBeforeIt puts a claim
// between a batch's failure and the rollback of the batches claimed before
// it: the claim that reads the pipeline's epoch before the failure takes
// the failed batch's rows after their rollback, labelled with the old
// epoch. The next claim must wait until the publisher has rolled that one
// back; claiming beside it would skip the rows it holds (SKIP LOCKED) and
// publish the rows after them first.
func TestClaimAfterAFailureWaitsForTheBatchesClaimedBeforeIt(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	b.insertBulk(t, 100)
	ids := b.allIDs(t)
	r := b.newRelay(t, Config{BatchSize: 10, InFlight: 2, MinBackoff: time.Millisecond, MaxBackoff: time.Millisecond})
	var published, claims atomic.Int64
	release := make(chan struct{})
	r.testHookBeforePublish = func([]outbox.Event) error {
		if published.Add(1) == 2 {
			<-release // batch 2 fails once the third claim has read the epoch
			return errors.New("injected failure of batch 2")
		}
		return nil
	}
	r.testHookBeforeClaim = func() {
		if claims.Add(1) == 3 {
			close(release)
			// Batch 2 failed and was rolled back: this claim takes its
			// rows under the epoch it read before.
			waitFor(t, "batch 2 failed", func() bool { return r.failures.Load() > 0 })
		}
	}
	// The publisher is slow to roll back the stale claim: the claimer's
	// backoff (1 ms) ends long before.
	r.testHookBeforeStaleRollback = func() { time.Sleep(300 * time.Millisecond) }
	stop := runInBackground(t, r)
	waitFor(t, "backlog drained", func() bool { return b.backlog(t) == 0 })
	require.NoError(t, stop())
	require.GreaterOrEqual(t, claims.Load(), int64(4))
	requireFirstOccurrencesInOrder(t, b.readStream(t, b.stream), ids)
}

// TestStrictOneLeaderAndTakeover runs two relays with ordering Strict:
// one publishes, the other stands by; when the leader stops, the standby
// takes over, and the stream is in order throughout.
func TestStrictOneLeaderAndTakeover(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	b.insertBulk(t, 3000)
	ids := b.allIDs(t)
	cfg := Config{Ordering: OrderingStrict, BatchSize: 50, InFlight: 2, LeaderTimeout: 2 * time.Second,
		StandbyPoll: 50 * time.Millisecond}
	first := b.newRelay(t, cfg)
	second := b.newRelay(t, cfg)
	var published [2]atomic.Int64
	hold := make(chan struct{})
	var once sync.Once
	first.testHookBeforePublish = func(events []outbox.Event) error {
		if published[0].Add(int64(len(events))) >= 500 {
			once.Do(func() { close(hold) })
		}
		return nil
	}
	second.testHookBeforePublish = func(events []outbox.Event) error {
		published[1].Add(int64(len(events)))
		return nil
	}
	stopFirst := runInBackground(t, first)
	waitFor(t, "the first relay leading", func() bool { return published[0].Load() > 0 })
	stopSecond := runInBackground(t, second)
	<-hold
	require.Zero(t, published[1].Load(), "the standby publishes nothing while the leader runs")
	require.NoError(t, stopFirst())
	waitFor(t, "backlog drained by the new leader", func() bool { return b.backlog(t) == 0 })
	require.NoError(t, stopSecond())
	require.Positive(t, published[1].Load(), "the standby took over")
	requireFirstOccurrencesInOrder(t, b.readStream(t, b.stream), ids)
}

// TestStrictOneLeaderWhateverTheSpelling: two Strict relays of one table,
// one given "outbox_events" and the other "public.outbox_events" (a
// rollout that adds the schema to spec.postgres.table runs both for a
// while). Their locks and fences were keyed by the spelling, so both led
// and the stream was out of order (a review's reproduction: at event 89
// and 161 of 3,000). They are keyed by the table PostgreSQL resolves
// (outbox.Table.Identity): the second one waits as a standby.
func TestStrictOneLeaderWhateverTheSpelling(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	b.insertBulk(t, 3000)
	ids := b.allIDs(t)
	cfg := Config{Ordering: OrderingStrict, BatchSize: 20, InFlight: 2, LeaderTimeout: 2 * time.Second,
		StandbyPoll: 50 * time.Millisecond}
	qualified := *b
	qualified.table = outbox.MustNew("public.outbox_events", outbox.Columns{})
	relays := []*Relay{b.newRelay(t, cfg), qualified.newRelay(t, cfg)}
	var published [2]atomic.Int64
	stops := make([]func() error, len(relays))
	for i, r := range relays {
		r.testHookBeforePublish = func(events []outbox.Event) error {
			published[i].Add(int64(len(events)))
			time.Sleep(2 * time.Millisecond) // a batch in flight while the other claims
			return nil
		}
		stops[i] = runInBackground(t, r)
	}
	waitFor(t, "drained", func() bool { return b.backlog(t) == 0 })
	for _, stop := range stops {
		require.NoError(t, stop())
	}
	require.True(t, published[0].Load() == 0 || published[1].Load() == 0, "one leader: published %d and %d",
		published[0].Load(), published[1].Load())
	requireFirstOccurrencesInOrder(t, b.readStream(t, b.stream), ids)
}

// TestFenceRefusesAPartitionNotClaimableAnyMore: a claimer reads the
// claimable partitions, then fences its batch; a partition given up and
// taken again in between is held but not fenced yet (a former owner's
// batch may still hold its older rows), so the fence refuses it.
func TestFenceRefusesAPartitionNotClaimableAnyMore(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	r := b.newRelay(t, Config{Ordering: OrderingStrict, LeaderTimeout: 2 * time.Second})
	o := b.owner(t, r)
	require.Equal(t, []int64{0}, *o.claimable.Load())
	ctx := context.Background()
	tx, err := b.db.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	o.claimable.Store(&[]int64{}) // taken again, being fenced
	_, err = o.fence(ctx, tx, []int64{0})
	require.ErrorIs(t, err, errNotOwner)
}

// TestStrictLeaderWhoseSessionEndsStopsPublishing ends the leader's session
// on the server, as when it went silent: its next batch is refused by the
// fence, and a new ownership takes the partition with a larger epoch.
func TestStrictLeaderWhoseSessionEndsStopsPublishing(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	b.insertBulk(t, 100)
	r := b.newRelay(t, Config{Ordering: OrderingStrict, BatchSize: 10, LeaderTimeout: 2 * time.Second, StandbyPoll: 50 * time.Millisecond})
	ctx := context.Background()
	o := b.owner(t, r)
	require.Equal(t, []int64{0}, *o.claimable.Load())
	first := o.epoch.Load()
	require.Positive(t, first)

	tx, err := b.db.Begin(ctx)
	require.NoError(t, err)
	_, err = o.fence(ctx, tx, []int64{0})
	require.NoError(t, err)
	require.NoError(t, tx.Rollback(ctx))

	_, err = b.db.Exec(ctx, `SELECT pg_terminate_backend($1)`, int64(o.pid))
	require.NoError(t, err)
	waitFor(t, "the leader session gone", func() bool {
		var n int
		require.NoError(t, b.db.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, int64(o.pid)).Scan(&n))
		return n == 0
	})
	tx, err = b.db.Begin(ctx)
	require.NoError(t, err)
	_, err = o.fence(ctx, tx, []int64{0})
	require.ErrorIs(t, err, errNotOwner)
	require.NoError(t, tx.Rollback(ctx))

	again := b.owner(t, r)
	require.Equal(t, []int64{0}, *again.claimable.Load(), "the lock went with the session")
	require.Greater(t, again.epoch.Load(), first)
}

// TestEpochAboveAFenceFromTransactionIDsThatWentBack: the fence of a
// stream is above every transaction id of the database (the database was
// restored from a dump into a new cluster, whose ids start again near
// zero): a new ownership takes an epoch above the fence, and publishes,
// instead of being refused by it for good.
func TestEpochAboveAFenceFromTransactionIDsThatWentBack(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	ctx := context.Background()
	var database string
	require.NoError(t, b.db.QueryRow(ctx, `SELECT current_database()`).Scan(&database))
	field := database + "/outbox_events/0" // the table's partition 0 (ownership.fenceField)
	require.NoError(t, b.rdb.HSet(ctx, FenceKey(b.stream), field, "999999999999").Err())
	ids := b.insert(t, 30)
	r := b.newRelay(t, Config{Ordering: OrderingStrict, BatchSize: 10, LeaderTimeout: 2 * time.Second,
		StandbyPoll: 50 * time.Millisecond})
	stop := runInBackground(t, r)
	waitFor(t, "drained past the fence", func() bool { return b.backlog(t) == 0 })
	require.NoError(t, stop())
	requireFirstOccurrencesInOrder(t, b.readStream(t, b.stream), ids)
	fence, err := b.rdb.HGet(ctx, FenceKey(b.stream), field).Int64()
	require.NoError(t, err)
	require.Equal(t, int64(1_000_000_000_000), fence, "the epoch one above the fence it found")
}

// TestOwnershipWaitsForRedisToReadTheFences: a new ownership reads the
// stream's fences for its epoch; with Redis down the session lives on and
// its partitions stay unclaimable, then are fenced once Redis answers.
func TestOwnershipWaitsForRedisToReadTheFences(t *testing.T) {
	t.Parallel()
	rs := testenv.StartRedis(t)
	b := setup(t, bundleOpts{redisURL: rs.URL()})
	r := b.newRelay(t, Config{Ordering: OrderingStrict, PublishTimeout: time.Second})
	rs.Stop(t)
	o := b.owner(t, r) // the rebalance did not fail
	require.Empty(t, *o.claimable.Load(), "not fenced without the fences")
	rs.Start(t)
	require.NoError(t, o.rebalance(context.Background(), 0))
	require.Equal(t, []int64{0}, *o.claimable.Load())
	require.Positive(t, o.epoch.Load())
}

// TestFenceRefusesAnOlderEpoch: once a newer owner has published a
// partition, a former one cannot add anything to it; other partitions are
// unaffected.
func TestFenceRefusesAnOlderEpoch(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	r := b.newRelay(t, Config{Ordering: OrderingStrict})
	ctx := context.Background()
	o := &ownership{r: r}
	p0 := []outbox.Event{{ID: "1", Type: "t", Payload: "p", Partition: 0}}
	p1 := []outbox.Event{{ID: "2", Type: "t", Payload: "p", Partition: 1}}
	require.NoError(t, o.publishFenced(ctx, 200, p0, []string{""}))
	err := o.publishFenced(ctx, 100, p0, []string{""})
	require.ErrorContains(t, err, "FENCED partition 0")
	require.NoError(t, o.publishFenced(ctx, 100, p1, []string{""}), "another partition has its own fence")
	require.NoError(t, o.publishFenced(ctx, 200, p0, []string{""}), "the same epoch goes on")
	require.EqualValues(t, 3, b.streamLen(t))
}

// keyedBundle is an outbox with a key column, filled with n events over
// keys keys, interleaved, one statement each so created_at increases.
func keyedBundle(t *testing.T, n, keys int) (*testBundle, []entryKey) {
	t.Helper()
	table := outbox.MustNew("", outbox.Columns{Key: "aggregate_id"})
	b := setup(t, bundleOpts{table: table, ddl: `CREATE TABLE outbox_events (
		id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, event_type text NOT NULL, payload text NOT NULL,
		aggregate_id text, created_at timestamptz NOT NULL DEFAULT clock_timestamp(), dispatched_at timestamptz);` +
		table.IndexDDL() + table.DeadLetterDDL()})
	_, err := b.db.Exec(context.Background(), `INSERT INTO outbox_events (event_type, payload, aggregate_id, created_at)
		SELECT 't', g::text, 'k' || (g % $2), now() + g * interval '1 microsecond' FROM generate_series(1, $1) g`, n, keys)
	require.NoError(t, err)
	rows, err := b.db.Query(context.Background(), `SELECT id::text, aggregate_id FROM outbox_events ORDER BY created_at, id`)
	require.NoError(t, err)
	defer rows.Close()
	var want []entryKey
	for rows.Next() {
		var e entryKey
		require.NoError(t, rows.Scan(&e.id, &e.key))
		want = append(want, e)
	}
	return b, want
}

type entryKey struct{ id, key string }

// requirePerKeyOrder checks, on the first occurrences, that every event is
// there once, carries its key, and that each key's events are in order.
func requirePerKeyOrder(t *testing.T, entries []entry, want []entryKey) {
	t.Helper()
	seen := map[string]bool{}
	got := map[string][]string{}
	for _, e := range entries {
		if id := e[FieldEventID]; !seen[id] {
			seen[id] = true
			got[e[FieldKey]] = append(got[e[FieldKey]], id)
		}
	}
	require.Len(t, seen, len(want), "every event, once deduplicated")
	expected := map[string][]string{}
	for _, w := range want {
		expected[w.key] = append(expected[w.key], w.id)
	}
	require.Equal(t, len(expected), len(got), "keys")
	for k, ids := range expected {
		require.Equal(t, ids, got[k], "events of key %s out of order", k)
	}
}

// TestPerKeyOrderWhileRelaysComeAndGo drains a keyed outbox with relays
// joining and leaving: 1, then 3, then 2 (one stopped mid-drain). Every
// event arrives, and each key's events are in order.
func TestPerKeyOrderWhileRelaysComeAndGo(t *testing.T) {
	t.Parallel()
	b, want := keyedBundle(t, 6000, 200)
	cfg := Config{Ordering: OrderingPerKey, Partitions: 8, BatchSize: 50, InFlight: 2,
		LeaderTimeout: 2 * time.Second, StandbyPoll: 50 * time.Millisecond}
	var published atomic.Int64
	newRelay := func() *Relay {
		r := b.newRelay(t, cfg)
		r.testHookBeforePublish = func(events []outbox.Event) error {
			published.Add(int64(len(events)))
			time.Sleep(2 * time.Millisecond) // keep the drain long enough for the relays to rebalance
			return nil
		}
		return r
	}
	stops := make([]func() error, 0, 3)
	stops = append(stops, runInBackground(t, newRelay()))
	waitFor(t, "the first relay publishing", func() bool { return published.Load() > 500 })
	stops = append(stops, runInBackground(t, newRelay()), runInBackground(t, newRelay()))
	waitFor(t, "more published with three relays", func() bool { return published.Load() > 2500 })
	require.NoError(t, stops[1]())
	waitFor(t, "backlog drained", func() bool { return b.backlog(t) == 0 })
	require.NoError(t, stops[0]())
	require.NoError(t, stops[2]())
	requirePerKeyOrder(t, b.readStream(t, b.stream), want)
}

// TestPerKeyPartitionsAreShared: two relays split the partitions evenly,
// and one alone takes them all back once the other is gone.
func TestPerKeyPartitionsAreShared(t *testing.T) {
	t.Parallel()
	b, _ := keyedBundle(t, 1, 1)
	cfg := Config{Ordering: OrderingPerKey, Partitions: 8, LeaderTimeout: 2 * time.Second, StandbyPoll: 50 * time.Millisecond}
	ctx := context.Background()
	a := b.owner(t, b.newRelay(t, cfg))
	require.Len(t, *a.claimable.Load(), 8, "alone, it owns every partition")
	c, err := b.newRelay(t, cfg).openOwnership(ctx)
	require.NoError(t, err)
	require.NoError(t, a.rebalance(ctx, 0)) // gives up 4
	require.NoError(t, c.rebalance(ctx, 0)) // takes the 4 free ones
	require.Len(t, *a.claimable.Load(), 4)
	require.Len(t, *c.claimable.Load(), 4)
	for _, p := range *c.claimable.Load() {
		require.NotContains(t, *a.claimable.Load(), p, "no partition has two owners")
	}
	c.close()
	waitFor(t, "the first relay owning every partition again", func() bool {
		require.NoError(t, a.rebalance(ctx, 0))
		return len(*a.claimable.Load()) == 8
	})
}

// TestARowCommittedBelowTheFrontierIsPublished: while the relay claims
// full batches, its claims begin past the rows it claimed (outbox.Frontier).
// A row whose transaction commits after those claims passed its created_at
// lies below the frontier; it is published all the same, with every other.
func TestARowCommittedBelowTheFrontierIsPublished(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	b.insertBulk(t, 400)
	r := b.newRelay(t, Config{BatchSize: 20, InFlight: 2})
	var claims atomic.Int64
	late := make(chan string, 1)
	r.testHookBeforeClaim = func() {
		if claims.Add(1) != 4 { // claims 1 to 3 were full: this one begins at the frontier
			return
		}
		var id string
		require.NoError(t, b.db.QueryRow(context.Background(), `INSERT INTO outbox_events (event_type, payload, created_at)
			VALUES ('order_created', '{"late":true}', now() - interval '2 hours') RETURNING id::text`).Scan(&id))
		late <- id
	}
	stop := runInBackground(t, r)
	waitFor(t, "backlog drained, the late row included", func() bool { return len(late) == 1 && b.backlog(t) == 0 })
	require.NoError(t, stop())
	ids := b.allIDs(t)
	require.Len(t, ids, 401)
	requireAtLeastOnce(t, b.readStream(t, b.stream), ids)
	require.Contains(t, ids, <-late)
}

// TestStrictTablesSharingAStreamEachPublish: two outbox tables, each with
// its Strict relay, publish to one stream. Each table is its own ordering
// (its own leader lock), so each needs its own fence in Redis: with one
// fence per stream, the relay that took its leadership last raised the
// fence above the other's epoch, and the other was refused (FENCED) for
// good, its outbox stalled.
func TestStrictTablesSharingAStreamEachPublish(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	other := outbox.MustNew("outbox_more", outbox.Columns{})
	_, err := b.db.Exec(context.Background(), other.DDL(outbox.DDLOptions{}))
	require.NoError(t, err)
	ob := *b
	ob.table = other
	cfg := Config{Ordering: OrderingStrict, BatchSize: 10, LeaderTimeout: 2 * time.Second, StandbyPoll: 50 * time.Millisecond}
	insertInto := func(table string, n int) {
		_, err := b.db.Exec(context.Background(), `INSERT INTO `+table+` (event_type, payload)
			SELECT 't', g::text FROM generate_series(1, $1) g`, n)
		require.NoError(t, err)
	}
	insertInto("outbox_events", 30)
	insertInto("outbox_more", 30)
	runInBackground(t, b.newRelay(t, cfg))
	waitFor(t, "the first table drained", func() bool { return b.backlog(t) == 0 })
	runInBackground(t, ob.newRelay(t, cfg)) // a newer leadership: its epoch is above the first one's
	waitFor(t, "the second table drained", func() bool { return ob.backlog(t) == 0 })
	insertInto("outbox_events", 30)
	insertInto("outbox_more", 30)
	// The bug stalled one table for good: a minute's bound (waitFor) tells
	// that apart as well as 20 s did, without failing a slow machine.
	waitFor(t, "both tables drained again", func() bool {
		return b.backlog(t) == 0 && ob.backlog(t) == 0
	})
	require.Len(t, b.readStream(t, b.stream), 120)
}

// TestShortLeaderTimeoutKeepsTheOwnership: with the shortest leader timeout
// (1s, the session's idle_session_timeout) and the default rebalance
// period (1s), the ownership session is used often enough to live: the
// leader keeps its partition instead of losing it, and taking it again,
// every round.
func TestShortLeaderTimeoutKeepsTheOwnership(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	var logs syncbuf.Buffer
	r := b.newRelay(t, Config{Ordering: OrderingStrict, LeaderTimeout: time.Second, Logger: newTestLogger(&logs)})
	stop := runInBackground(t, r)
	waitFor(t, "the leader owns its partition", func() bool { return strings.Contains(logs.String(), "Key partitions owned") })
	time.Sleep(5 * time.Second)
	require.NoError(t, stop())
	require.NotContains(t, logs.String(), "Ownership session failed")
	require.Equal(t, 1, strings.Count(logs.String(), "Key partitions owned"), "the partition taken once")
}

// TestReplayOfAKeyedTableKeepsTheKey: a replay of a table with a key column
// adds each entry with its key field, as the relays of ordering PerKey add
// it (empty for a NULL key), so consumers that route by key see the
// replayed events where they saw the originals.
func TestReplayOfAKeyedTableKeepsTheKey(t *testing.T) {
	t.Parallel()
	b, want := keyedBundle(t, 40, 4)
	ctx := context.Background()
	var nullKey string
	require.NoError(t, b.db.QueryRow(ctx, `INSERT INTO outbox_events (event_type, payload) VALUES ('t', 'no key') RETURNING id::text`).
		Scan(&nullKey))
	want = append(want, entryKey{id: nullKey})
	r := b.newRelay(t, Config{Ordering: OrderingPerKey, Partitions: 4, BatchSize: 10,
		LeaderTimeout: 2 * time.Second, StandbyPoll: 50 * time.Millisecond})
	stop := runInBackground(t, r)
	waitFor(t, "drained", func() bool { return b.backlog(t) == 0 && b.streamLen(t) >= int64(len(want)) })
	require.NoError(t, stop())
	keys := func() map[string]string {
		got := map[string]string{}
		for _, e := range b.readStream(t, b.stream) {
			k, ok := e[FieldKey]
			require.True(t, ok, "entry %s has no key field", e[FieldEventID])
			got[e[FieldEventID]] = k
		}
		return got
	}
	published := keys()
	require.NoError(t, b.rdb.Del(ctx, b.stream).Err())
	res, err := Replay(ctx, b.table, b.db, b.rdb, ReplayOptions{Stream: b.stream,
		Since: time.Now().Add(-time.Hour), Until: time.Now().Add(time.Hour)})
	require.NoError(t, err)
	require.Equal(t, int64(len(want)), res.Republished)
	replayed := keys()
	require.Equal(t, published, replayed)
	for _, w := range want {
		require.Equal(t, w.key, replayed[w.id], "key of event %s", w.id)
	}
}

// TestParkedKeyedEventKeepsItsKey: under ordering PerKey every entry
// carries its event's key, so consumers route by it. An event parked by a
// PerKey relay (a payload over --max-payload-bytes) keeps its key in the
// dead-letter table, and `dead-letters retry` publishes it with the key, as
// the relay would have. Before, the retried entry had no key field.
func TestParkedKeyedEventKeepsItsKey(t *testing.T) {
	t.Parallel()
	b, want := keyedBundle(t, 10, 2)
	ctx := context.Background()
	var big string
	require.NoError(t, b.db.QueryRow(ctx, `INSERT INTO outbox_events (event_type, payload, aggregate_id)
		VALUES ('t', repeat('x', 2048), 'k-big') RETURNING id::text`).Scan(&big))
	r := b.newRelay(t, Config{Ordering: OrderingPerKey, Partitions: 4, BatchSize: 10, MaxPayloadBytes: 1024,
		LeaderTimeout: 2 * time.Second, StandbyPoll: 50 * time.Millisecond})
	stop := runInBackground(t, r)
	waitFor(t, "drained, the large one parked", func() bool { return b.backlog(t) == 0 && len(b.deadLetters(t)) == 1 })
	require.NoError(t, stop())
	parked := b.deadLetters(t)[0]
	require.NotNil(t, parked.Key)
	require.Equal(t, "k-big", *parked.Key)
	requirePerKeyOrder(t, b.readStream(t, b.stream), want)

	res, err := Retry(ctx, b.table, b.db, b.rdb, RetryOptions{Filter: outbox.DeadLetterFilter{}, MaxPayloadBytes: 4096})
	require.NoError(t, err)
	require.Equal(t, []int64{parked.ID}, res.Republished)
	entries := b.readStream(t, b.stream)
	last := entries[len(entries)-1]
	require.Equal(t, big, last[FieldEventID])
	require.Equal(t, "k-big", last[FieldKey], "the retried entry carries its key: %v", last)
}

// TestReplayPastWhatCleanupKeptSaysSo: a replay whose window starts where
// the table still holds an older row finds every row of the window; once
// cleanup has deleted every row older than the window's start, the replay
// cannot tell it found them all, and says so (ReplayResult.Incomplete),
// having republished what is left.
func TestReplayPastWhatCleanupKeptSaysSo(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	ids := b.insert(t, 5)
	b.drain(t, b.newRelay(t, Config{}))
	ctx := context.Background()
	_, err := b.db.Exec(ctx, `UPDATE outbox_events SET dispatched_at = now() - interval '2 hours' WHERE id = $1`, ids[0])
	require.NoError(t, err)
	replay := func() ReplayResult {
		res, err := Replay(ctx, b.table, b.db, b.rdb, ReplayOptions{Stream: b.stream,
			Since: time.Now().Add(-time.Hour), Until: time.Now().Add(time.Hour)})
		require.NoError(t, err)
		return res
	}
	res := replay()
	require.EqualValues(t, 4, res.Republished)
	require.Empty(t, res.Incomplete, "a row dispatched before the window is left: nothing of the window was deleted")

	_, err = b.db.Exec(ctx, `DELETE FROM outbox_events WHERE id = $1`, ids[0]) // as cleanup would
	require.NoError(t, err)
	res = replay()
	require.EqualValues(t, 4, res.Republished)
	require.Contains(t, res.Incomplete, "no row dispatched before ")
	require.Contains(t, res.Incomplete, "cleanup may have deleted rows of the window")
}

// TestPerKeyOwnershipSessionsTerminatedMidDrain: three PerKey relays
// drain while the server terminates their ownership sessions, one after
// another (partitions move while batches are in flight), in both cleanup
// modes: every event in the stream, each key in order.
func TestPerKeyOwnershipSessionsTerminatedMidDrain(t *testing.T) {
	t.Parallel()
	for _, d := range []outbox.Dispatch{outbox.MarkDispatched, outbox.DeleteOnDispatch} {
		t.Run(d.String(), func(t *testing.T) {
			b, want := keyedBundle(t, 8000, 60)
			cfg := Config{Ordering: OrderingPerKey, Partitions: 8, BatchSize: 40, InFlight: 2, Dispatch: d,
				LeaderTimeout: 2 * time.Second, StandbyPoll: 30 * time.Millisecond}
			var published atomic.Int64
			newRelay := func() *Relay {
				r := b.newRelay(t, cfg)
				r.testHookBeforePublish = func(events []outbox.Event) error {
					published.Add(int64(len(events)))
					time.Sleep(6 * time.Millisecond)
					return nil
				}
				return r
			}
			stops := []func() error{runInBackground(t, newRelay()), runInBackground(t, newRelay()), runInBackground(t, newRelay())}
			// The test's own session, outside the pool the relays share:
			// a kill meant for an ownership session that lands on a pool
			// connection (the lock list and the activity view are read at
			// different instants) then fails a relay's statement, which
			// the relay retries, never the test's.
			admin, err := pgx.Connect(context.Background(), b.db.Config().ConnString())
			require.NoError(t, err)
			t.Cleanup(func() { _ = admin.Close(context.Background()) })
			pending := func() int64 {
				var n int64
				q := `SELECT count(*) FROM outbox_events WHERE dispatched_at IS NULL`
				if d == outbox.DeleteOnDispatch {
					q = `SELECT count(*) FROM outbox_events`
				}
				require.NoError(t, admin.QueryRow(context.Background(), q).Scan(&n))
				return n
			}
			kills := 0
			for i := 0; i < 15 && pending() > 300; i++ {
				time.Sleep(150 * time.Millisecond)
				pids := ownershipPIDs(t, admin)
				if len(pids) > 0 {
					_, err := admin.Exec(context.Background(), `SELECT pg_terminate_backend($1)`, pids[i%len(pids)])
					require.NoError(t, err)
					kills++
				}
			}
			t.Logf("ownership sessions terminated: %d", kills)
			require.Positive(t, kills, "no ownership session was found to terminate")
			waitFor(t, "drained", func() bool { return pending() == 0 })
			for _, s := range stops {
				require.NoError(t, s())
			}
			requirePerKeyOrder(t, b.readStream(t, b.stream), want)
		})
	}
}

// ownershipPIDs are the sessions that hold exclusive advisory locks
// while idle outside a transaction: the relays' ownership sessions (a
// batch takes its fences shared, in its transaction).
func ownershipPIDs(t *testing.T, admin *pgx.Conn) []int64 {
	t.Helper()
	rows, err := admin.Query(context.Background(), `SELECT DISTINCT l.pid FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
		WHERE l.locktype = 'advisory' AND l.mode = 'ExclusiveLock' AND l.granted
		AND a.datname = current_database() AND a.state = 'idle' AND l.pid <> pg_backend_pid()`)
	require.NoError(t, err)
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	return pids
}

// TestStrictPublishTimedOutAndAppliedLaterDuplicatesOnly: an ambiguous
// Redis failure. The fenced script times out on the client (Redis is busy
// with another script), the batch rolls back, and Redis runs the script
// afterwards anyway. Strict, OnDispatch: duplicates only, first
// occurrences in order.
func TestStrictPublishTimedOutAndAppliedLaterDuplicatesOnly(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	ids := b.insert(t, 200)
	other := redis.NewClient(&redis.Options{Addr: b.rdb.Options().Addr, MaxRetries: -1,
		ReadTimeout: 10 * time.Second})
	t.Cleanup(func() { _ = other.Close() })
	r := b.newRelay(t, Config{Ordering: OrderingStrict, BatchSize: 10, InFlight: 2, Dispatch: outbox.DeleteOnDispatch,
		PublishTimeout: 300 * time.Millisecond, LeaderTimeout: 2 * time.Second, StandbyPoll: 50 * time.Millisecond,
		MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond})
	var n atomic.Int64
	var busy sync.WaitGroup
	busyScript := `local t0 = redis.call('TIME')
while true do
	local t = redis.call('TIME')
	if (t[1] - t0[1]) * 1000000 + (t[2] - t0[2]) > 1200000 then break end
end
return 1`
	r.testHookBeforePublish = func([]outbox.Event) error {
		if k := n.Add(1); k == 3 || k == 9 {
			busy.Go(func() { _ = other.Eval(context.Background(), busyScript, nil).Err() })
			time.Sleep(50 * time.Millisecond)
		}
		return nil
	}
	stop := runInBackground(t, r)
	waitFor(t, "drained", func() bool { return b.rowCount(t) == 0 })
	busy.Wait()
	time.Sleep(200 * time.Millisecond)
	require.NoError(t, stop())
	entries := b.readStream(t, b.stream)
	dups := requireAtLeastOnce(t, entries, ids)
	t.Logf("entries %d, duplicates %d", len(entries), dups)
	requireFirstOccurrencesInOrder(t, entries, ids)
}
