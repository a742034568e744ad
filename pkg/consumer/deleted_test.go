package consumer

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/outbox-dev/outbox-operator/internal/syncbuf"
)

// TestEntryDeletedWhilePendingIsDeadLetteredNotDroppedSilently: an entry
// delivered to a consumer that died before finishing it is then removed from
// the stream (the deprecated --max-len, an XTRIM or XDEL by hand). Redis 7's
// XAUTOCLAIM removes such an entry from the group's pending list and names it
// apart from the entries it claims; go-redis's XAutoClaim throws that list
// away, so the entry left the pending list with nothing said. It must be
// reported on the dead-letter stream, with its stream id.
func TestEntryDeletedWhilePendingIsDeadLetteredNotDroppedSilently(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	ctx := context.Background()
	require.NoError(t, b.rdb.XGroupCreateMkStream(ctx, b.stream, b.group, "0").Err())
	gone := b.publish(t, "gone", "order_created", "{}")
	b.publish(t, "kept", "order_created", "{}")
	_, err := b.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{
		Group: b.group, Consumer: "ghost", Streams: []string{b.stream, ">"}, Count: 1, Block: -1,
	}).Result()
	require.NoError(t, err)
	require.NoError(t, b.rdb.XDel(ctx, b.stream, gone).Err())
	require.EqualValues(t, 1, b.pending(t), "pending, and no longer in the stream")

	var logs syncbuf.Buffer
	run(t, b.newConsumer(t, Config{MinIdle: 20 * time.Millisecond, ClaimInterval: 10 * time.Millisecond,
		Logger: newTestLogger(&logs)}))
	waitFor(t, "kept processed", func() bool { return b.effects(t)["kept"] == 1 })
	waitFor(t, "nothing pending", func() bool { return b.pending(t) == 0 })
	waitFor(t, "the deleted entry reported on the dead-letter stream", func() bool { return len(b.deadLetters(t)) == 1 })
	dead := b.deadLetters(t)[0]
	require.Equal(t, gone, dead[FieldStreamID])
	require.Contains(t, dead[FieldError], "deleted from the stream while pending")
	require.Contains(t, logs.String(), "deleted from the stream while pending")
}

// TestEntryDeletedWhileItsHandlerFailsIsDeadLettered: consumer a runs an
// entry whose handler will fail (a transient error); meanwhile the entry is
// removed from the stream, and consumer b's reclaim pass, whatever the
// entry's idle time, drops it from the pending list. a must not leave it
// "pending" to be retried: nothing will ever redeliver it. a still holds the
// whole entry, so it dead-letters it, event_id and payload included.
func TestEntryDeletedWhileItsHandlerFailsIsDeadLettered(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	ctx := context.Background()
	require.NoError(t, b.rdb.XGroupCreateMkStream(ctx, b.stream, b.group, "0").Err())

	started := make(chan struct{})
	release := make(chan struct{})
	a := b.newConsumer(t, Config{Consumer: "a", MinIdle: time.Hour, ClaimInterval: time.Hour,
		Handler: b.handler.handle("a", func(context.Context, pgx.Tx, Message) error {
			close(started)
			<-release
			return errors.New("smtp: connection reset")
		})})
	entry := b.publish(t, "gone", "order_created", `{"n":1}`)
	run(t, a)
	<-started
	require.NoError(t, b.rdb.XDel(ctx, b.stream, entry).Err())
	// b reclaims nothing (MinIdle an hour), but its pass drops the deleted entry.
	run(t, b.newConsumer(t, Config{Consumer: "b", MinIdle: time.Hour, ClaimInterval: 10 * time.Millisecond}))
	waitFor(t, "the entry out of the pending list", func() bool { return b.pending(t) == 0 })
	close(release)

	waitFor(t, "dead-lettered by a with the whole entry", func() bool {
		for _, d := range b.deadLetters(t) {
			if d[FieldEventID] == "gone" {
				return true
			}
		}
		return false
	})
	for _, d := range b.deadLetters(t) {
		require.Equal(t, entry, d[FieldStreamID])
		if d[FieldEventID] == "gone" {
			require.Equal(t, `{"n":1}`, d[FieldPayload])
			require.Contains(t, d[FieldError], "smtp: connection reset")
		}
	}
}
