package consumer

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/outbox-dev/outbox-operator/internal/syncbuf"
	"github.com/outbox-dev/outbox-operator/internal/testenv"
)

func TestEachEntryIsHandledOnceAndAcknowledged(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	// Published before the group exists: the group starts at the beginning.
	ids := make([]string, 0, 50)
	for i := range 50 {
		ids = append(ids, b.publish(t, fmt.Sprintf("e%d", i), "order_created", fmt.Sprintf(`{"n":%d}`, i)))
	}
	c := b.newConsumer(t, Config{})
	run(t, c)

	waitFor(t, "50 effects", func() bool { return len(b.effects(t)) == 50 })
	waitFor(t, "nothing pending", func() bool { return b.pending(t) == 0 })
	for i := range 50 {
		require.Equal(t, 1, b.handler.callsOf(fmt.Sprintf("e%d", i)))
	}
	first := b.handler.all()[0]
	require.Equal(t, Message{
		ID: ids[0], EventID: "e0", EventType: "order_created", Payload: []byte(`{"n":0}`), Deliveries: 1,
		Fields: map[string]string{"event_id": "e0", "event_type": "order_created", "payload": `{"n":0}`},
	}, first)
	require.NoError(t, c.Ready())
	require.Empty(t, b.deadLetters(t))
}

func TestDuplicateEventIsAcknowledgedWithoutRunningTheHandler(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	var logs syncbuf.Buffer
	c := b.newConsumer(t, Config{Logger: newTestLogger(&logs)})
	// The relay republishes after a crash: same event, new entry.
	b.publish(t, "e1", "order_created", "{}")
	b.publish(t, "e1", "order_created", "{}")
	b.publish(t, "e2", "order_created", "{}")
	run(t, c)

	waitFor(t, "every entry acknowledged", func() bool {
		n, err := b.rdb.XLen(context.Background(), b.stream).Result()
		return err == nil && n == 3 && b.pending(t) == 0 && len(b.effects(t)) == 2
	})
	require.Equal(t, map[string]int{"e1": 1, "e2": 1}, b.effects(t))
	require.Equal(t, 1, b.handler.callsOf("e1"), "the handler ran once for e1")
	require.Contains(t, logs.String(), "Skipped an event already processed")
}

func TestAnExistingGroupIsKeptAsItIs(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	ctx := context.Background()
	b.publish(t, "before", "t", "{}")
	// A group created by someone else, reading only new entries.
	require.NoError(t, b.rdb.XGroupCreate(ctx, b.stream, b.group, "$").Err())
	run(t, b.newConsumer(t, Config{}))
	b.publish(t, "after", "t", "{}")

	waitFor(t, "the new entry", func() bool { return b.effects(t)["after"] == 1 })
	require.Zero(t, b.handler.callsOf("before"), "the group's position was not reset")
}

func TestConsumerKilledBeforeItsAckIsReclaimedAndNotProcessedAgain(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	ctx := context.Background()

	// Consumer a dies after its commit and before its XACK: its Redis
	// connection is closed and its context cancelled at that point.
	rdbA := b.newRedis(t)
	a := b.newConsumerWith(t, Config{Consumer: "a"}, b.db, rdbA)
	ctxA, cancelA := context.WithCancel(ctx)
	killed := make(chan struct{})
	a.testHookBeforeAck = func(Message) {
		cancelA()
		_ = rdbA.Close()
		close(killed)
	}
	entry := b.publish(t, "e1", "order_created", "{}")
	stopA := runCtx(t, ctxA, cancelA, a)
	<-killed
	require.NoError(t, stopA())

	require.Equal(t, map[string]int{"e1": 1}, b.effects(t), "a's transaction committed")
	pend, err := b.rdb.XPendingExt(ctx, &redis.XPendingExtArgs{
		Stream: b.stream, Group: b.group, Start: "-", End: "+", Count: 10,
	}).Result()
	require.NoError(t, err)
	require.Len(t, pend, 1, "but the entry was never acknowledged")
	require.Equal(t, entry, pend[0].ID)
	require.Equal(t, "a", pend[0].Consumer)

	// Consumer b reclaims it once it has been idle for MinIdle.
	var logs syncbuf.Buffer
	bc := b.newConsumer(t, Config{Consumer: "b", MinIdle: 50 * time.Millisecond, ClaimInterval: 20 * time.Millisecond,
		Logger: newTestLogger(&logs)})
	run(t, bc)
	waitFor(t, "nothing pending", func() bool { return b.pending(t) == 0 })

	require.Equal(t, map[string]int{"e1": 1}, b.effects(t), "processed once")
	require.Equal(t, 1, b.handler.callsOf("e1"), "b did not run the handler")
	require.Contains(t, logs.String(), "Reclaimed a pending entry")
	require.Contains(t, logs.String(), "Skipped an event already processed")
}

func TestConsumerKilledBeforeItsCommitIsReclaimedAndProcessedOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	ctx := context.Background()

	// Consumer a's handler is in the middle of its transaction when the
	// process dies: its PostgreSQL session is terminated by the server and
	// its context cancelled.
	started := make(chan int32, 1)
	release := make(chan struct{})
	a := b.newConsumer(t, Config{Consumer: "a", Handler: b.handler.handle("a",
		func(ctx context.Context, tx pgx.Tx, _ Message) error {
			var pid int32
			if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
				return err
			}
			started <- pid
			<-release
			return nil
		})})
	ctxA, cancelA := context.WithCancel(ctx)
	stopA := runCtx(t, ctxA, cancelA, a)
	b.publish(t, "e1", "order_created", "{}")

	pid := <-started
	var terminated bool
	require.NoError(t, b.db.QueryRow(ctx, `SELECT pg_terminate_backend($1)`, pid).Scan(&terminated))
	require.True(t, terminated)
	cancelA()
	close(release)
	require.NoError(t, stopA())
	require.Empty(t, b.effects(t), "a's transaction never committed")
	require.EqualValues(t, 1, b.pending(t))

	bc := b.newConsumer(t, Config{Consumer: "b", MinIdle: 50 * time.Millisecond, ClaimInterval: 20 * time.Millisecond})
	run(t, bc)
	waitFor(t, "nothing pending", func() bool { return b.pending(t) == 0 })

	require.Equal(t, map[string]int{"e1": 1}, b.effects(t), "processed once, by b")
	var consumer string
	var deliveries int
	require.NoError(t, b.db.QueryRow(ctx, `SELECT consumer, deliveries FROM effects`).Scan(&consumer, &deliveries))
	require.Equal(t, "b", consumer)
	require.Equal(t, 2, deliveries)
	require.Empty(t, b.deadLetters(t))
}

func TestPoisonEntryIsDeadLetteredAfterMaxDeliveriesAndTheGroupMovesOn(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	boom := errors.New("boom: cannot send")
	c := b.newConsumer(t, Config{
		MaxDeliveries: 3, MinIdle: 30 * time.Millisecond, ClaimInterval: 10 * time.Millisecond,
		Handler: b.handler.handle("c1", func(_ context.Context, _ pgx.Tx, m Message) error {
			if m.EventID == "poison" {
				return boom
			}
			return nil
		}),
	})
	poison := b.publish(t, "poison", "order_created", `{"bad":true}`)
	for i := range 5 {
		b.publish(t, "ok"+strconv.Itoa(i), "order_created", "{}")
	}
	run(t, c)

	waitFor(t, "the poison entry dead-lettered", func() bool { return len(b.deadLetters(t)) == 1 })
	b.publish(t, "later", "order_created", "{}")
	waitFor(t, "every other entry processed", func() bool { return len(b.effects(t)) == 6 })
	waitFor(t, "nothing pending", func() bool { return b.pending(t) == 0 })

	require.Equal(t, 3, b.handler.callsOf("poison"), "tried MaxDeliveries times")
	require.Equal(t, map[string]string{
		"event_id": "poison", "event_type": "order_created", "payload": `{"bad":true}`,
		"error": "boom: cannot send", "stream_id": poison, "deliveries": "3",
	}, b.deadLetters(t)[0])
	require.Zero(t, b.effects(t)["poison"])
	var processed bool
	require.NoError(t, b.db.QueryRow(context.Background(),
		`SELECT EXISTS (SELECT 1 FROM processed_events WHERE event_id = 'poison')`).Scan(&processed))
	require.False(t, processed, "not recorded as processed, so a replay from the dead-letter stream runs it")
}

func TestMalformedEntryIsDeadLetteredAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	id, err := b.rdb.XAdd(context.Background(), &redis.XAddArgs{Stream: b.stream, Values: []any{"payload", "x"}}).Result()
	require.NoError(t, err)
	run(t, b.newConsumer(t, Config{}))
	b.publish(t, "e1", "t", "{}")

	waitFor(t, "e1 processed", func() bool { return b.effects(t)["e1"] == 1 })
	waitFor(t, "nothing pending", func() bool { return b.pending(t) == 0 })
	dead := b.deadLetters(t)
	require.Len(t, dead, 1)
	require.Equal(t, id, dead[0]["stream_id"])
	require.Equal(t, "malformed entry: no event_id field", dead[0]["error"])
	require.Equal(t, "x", dead[0]["payload"])
	require.Equal(t, "1", dead[0]["deliveries"])
}

func TestPermanentErrorAndPanicAreDeadLettered(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	c := b.newConsumer(t, Config{
		MaxDeliveries: 2, MinIdle: 30 * time.Millisecond, ClaimInterval: 10 * time.Millisecond,
		Handler: b.handler.handle("c1", func(_ context.Context, _ pgx.Tx, m Message) error {
			switch m.EventID {
			case "permanent":
				return Permanent(errors.New("payload does not parse"))
			case "panics":
				panic("nil map")
			}
			return nil
		}),
	})
	b.publish(t, "permanent", "t", "{}")
	b.publish(t, "panics", "t", "{}")
	run(t, c)

	waitFor(t, "both dead-lettered", func() bool { return len(b.deadLetters(t)) == 2 })
	waitFor(t, "nothing pending", func() bool { return b.pending(t) == 0 })
	byEvent := map[string]map[string]string{}
	for _, d := range b.deadLetters(t) {
		byEvent[d["event_id"]] = d
	}
	require.Equal(t, 1, b.handler.callsOf("permanent"), "no retry")
	require.Equal(t, "permanent error: payload does not parse", byEvent["permanent"]["error"])
	require.Equal(t, 2, b.handler.callsOf("panics"), "a panic is a failure like any other")
	require.Equal(t, "handler panicked: nil map", byEvent["panics"]["error"])
	require.NoError(t, c.Ready())
}

func TestEntryDeliveredTooOftenWithoutCompletingIsDeadLettered(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	ctx := context.Background()
	require.NoError(t, b.rdb.XGroupCreateMkStream(ctx, b.stream, b.group, "0").Err())
	entry := b.publish(t, "crasher", "t", "{}")
	// Consumers that died while running it: delivered three times, never
	// completed.
	_, err := b.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{
		Group: b.group, Consumer: "ghost", Streams: []string{b.stream, ">"}, Count: 1, Block: -1,
	}).Result()
	require.NoError(t, err)
	for range 2 {
		require.NoError(t, b.rdb.XClaim(ctx, &redis.XClaimArgs{
			Stream: b.stream, Group: b.group, Consumer: "ghost", Messages: []string{entry},
		}).Err())
	}

	run(t, b.newConsumer(t, Config{MaxDeliveries: 3, MinIdle: 20 * time.Millisecond, ClaimInterval: 10 * time.Millisecond}))
	waitFor(t, "dead-lettered", func() bool { return len(b.deadLetters(t)) == 1 })
	waitFor(t, "nothing pending", func() bool { return b.pending(t) == 0 })

	require.Zero(t, b.handler.callsOf("crasher"), "not run a fourth time")
	dead := b.deadLetters(t)[0]
	require.Equal(t, "4", dead["deliveries"])
	require.Contains(t, dead["error"], "delivered 4 times without completing (max 3)")
}

// TestADeathOnOneEntrySpendsNoDeliveryOfTheOthers: consumers die on the
// first entry of what they hold, again and again (the handler ends its
// goroutine with runtime.Goexit: nothing after it runs, no ack, as when the
// process is killed there; a test cannot survive a real kill). Each reclaim
// must count a delivery only for the entry it runs: the entries after the
// killer, which never ran, are processed once it is dead-lettered, not
// dead-lettered with it (a review saw all five dead-lettered when a
// reclaim claimed a page at once).
func TestADeathOnOneEntrySpendsNoDeliveryOfTheOthers(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	ctx := context.Background()
	require.NoError(t, b.rdb.XGroupCreateMkStream(ctx, b.stream, b.group, "0").Err())
	b.publish(t, "killer", "t", "{}")
	innocents := []string{"innocent-1", "innocent-2", "innocent-3", "innocent-4"}
	for _, id := range innocents {
		b.publish(t, id, "t", "{}")
	}
	cfg := Config{MaxDeliveries: 3, MinIdle: 20 * time.Millisecond, ClaimInterval: 10 * time.Millisecond}
	dies := b.handler.handle("c1", func(_ context.Context, _ pgx.Tx, m Message) error {
		if m.EventID == "killer" {
			runtime.Goexit()
		}
		return nil
	})
	for i := range cfg.MaxDeliveries {
		c := cfg
		c.Consumer, c.Handler = fmt.Sprintf("dies-%d", i), dies
		consumer := b.newConsumer(t, c)
		died := make(chan struct{})
		go func() {
			defer close(died)
			_ = consumer.Run(ctx)
		}()
		<-died
		require.Equal(t, i+1, b.handler.callsOf("killer"))
		time.Sleep(cfg.MinIdle) // idle long enough to be reclaimed
	}

	run(t, b.newConsumer(t, cfg))
	waitFor(t, "nothing pending", func() bool { return b.pending(t) == 0 })
	dead := b.deadLetters(t)
	require.Len(t, dead, 1, "only the entry its consumers died on: %v", dead)
	require.Equal(t, "killer", dead[0]["event_id"])
	for _, id := range innocents {
		require.Equal(t, 1, b.handler.callsOf(id), "%s ran once", id)
	}
}

func TestRunFinishesTheEntryInFlightWhenCancelled(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	started := make(chan struct{})
	release := make(chan struct{})
	c := b.newConsumer(t, Config{Handler: b.handler.handle("c1", func(context.Context, pgx.Tx, Message) error {
		close(started)
		<-release
		return nil
	})})
	stop := run(t, c)
	b.publish(t, "e1", "t", "{}")
	<-started

	stopped := make(chan error, 1)
	go func() { stopped <- stop() }()
	select {
	case err := <-stopped:
		t.Fatalf("Run returned with an entry in flight: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	close(release)
	require.NoError(t, <-stopped)
	require.Equal(t, map[string]int{"e1": 1}, b.effects(t))
	require.Zero(t, b.pending(t), "acknowledged before Run returned")
}

func TestGroupDeletedWhileRunningIsCreatedAgain(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	ctx := context.Background()
	run(t, b.newConsumer(t, Config{}))
	b.publish(t, "e1", "t", "{}")
	waitFor(t, "e1", func() bool { return b.effects(t)["e1"] == 1 })

	require.NoError(t, b.rdb.XGroupDestroy(ctx, b.stream, b.group).Err())
	b.publish(t, "e2", "t", "{}")
	waitFor(t, "e2", func() bool { return b.effects(t)["e2"] == 1 })
	require.Equal(t, 1, b.handler.callsOf("e1"), "e1 again, but skipped as processed")
}

func TestPostgresDownIsRetriedWithoutCountingAgainstTheEntry(t *testing.T) {
	t.Parallel()
	pg := testenv.StartPostgres(t)
	b := setup(t, bundleOpts{dsn: pg.DSN()})
	c := b.newConsumer(t, Config{MaxDeliveries: 1})
	run(t, c)
	waitFor(t, "ready", func() bool { return c.Ready() == nil })

	pg.Stop(t)
	b.publish(t, "e1", "t", "{}")
	waitFor(t, "e1 retried", func() bool {
		err := c.Ready()
		return err != nil && strings.Contains(err.Error(), "recording event e1 in processed_events")
	})
	pg.Start(t)
	b.db.Reset() // the test's own pool holds connections the restart ended

	waitFor(t, "e1 processed", func() bool { return b.effects(t)["e1"] == 1 })
	waitFor(t, "nothing pending", func() bool { return b.pending(t) == 0 })
	require.Empty(t, b.deadLetters(t), "an outage is not the entry's fault")
	waitFor(t, "ready again", func() bool { return c.Ready() == nil })
}

func TestProcessedTableDDL(t *testing.T) {
	t.Parallel()
	ddl, err := ProcessedTableDDL("")
	require.NoError(t, err)
	require.Contains(t, ddl, `CREATE TABLE IF NOT EXISTS "processed_events" (`)
	ddl, err = ProcessedTableDDL("app.Seen")
	require.NoError(t, err)
	require.Contains(t, ddl, `"app"."Seen"`)
	for _, bad := range []string{"x; DROP TABLE y", "a.b.c", `a"b`, "1x"} {
		_, err := ProcessedTableDDL(bad)
		require.Error(t, err, bad)
	}
}
