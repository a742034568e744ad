package consumer

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/outbox-dev/outbox-operator/internal/pgtx"
)

// errRollback ends a transaction on purpose; it is never returned.
var errRollback = errors.New("rollback")

// outcome is what processing an entry came to.
type outcome int

const (
	processed        outcome = iota // the handler ran and its transaction committed
	duplicate                       // recorded as processed before: the handler did not run
	handlerFailed                   // the handler (or the commit after it) failed; rolled back
	tooManyDelivered                // delivered more than MaxDeliveries times; rolled back
)

// handle takes one entry to its end: acknowledged, dead-lettered, or left
// pending after a handler error. PostgreSQL errors that keep it from being
// recorded are retried here, until ctx is cancelled.
func (c *Consumer) handle(ctx context.Context, m Message) {
	log := c.log.With("entryID", m.ID, "eventID", m.EventID, "eventType", m.EventType, "deliveries", m.Deliveries)
	if reason := malformed(m); reason != "" {
		c.deadLetter(ctx, m, "malformed entry: "+reason)
		return
	}
	for failures := 1; ; failures++ {
		out, handlerErr, err := c.process(ctx, m)
		if err != nil {
			c.setErr(err)
			if ctx.Err() != nil {
				if c.goneFromStream(ctx, m) {
					c.deadLetter(ctx, m, deletedWhilePending+"; stopped before PostgreSQL recorded it: "+err.Error())
					return
				}
				log.Warn("Left an entry pending at shutdown", "error", err.Error())
				return
			}
			delay := backoff(failures, c.cfg.MinBackoff, c.cfg.MaxBackoff)
			c.logFailure("Recording an event as processed failed, retrying", err, failures, delay,
				"entryID", m.ID, "eventID", m.EventID)
			sleep(ctx, delay)
			continue
		}
		switch out {
		case processed:
			log.Debug("Processed an event")
			c.ack(ctx, m)
		case duplicate:
			log.Info("Skipped an event already processed")
			c.ack(ctx, m)
		case tooManyDelivered:
			c.deadLetter(ctx, m, fmt.Sprintf(
				"delivered %d times without completing (max %d): its consumers crashed or timed out on it",
				m.Deliveries, c.cfg.MaxDeliveries))
		case handlerFailed:
			var perm *permanentError
			switch {
			case errors.As(handlerErr, &perm):
				c.deadLetter(ctx, m, "permanent error: "+handlerErr.Error())
			case m.Deliveries >= int64(c.cfg.MaxDeliveries):
				c.deadLetter(ctx, m, handlerErr.Error())
			case c.goneFromStream(ctx, m):
				// Left pending, it would be dropped by the next XAUTOCLAIM.
				c.deadLetter(ctx, m, deletedWhilePending+"; the handler failed: "+handlerErr.Error())
			default:
				log.Warn("Handler failed; the entry stays pending and is retried after minIdle",
					"error", handlerErr.Error(), "maxDeliveries", c.cfg.MaxDeliveries, "minIdle", c.cfg.MinIdle.String())
			}
		}
		return
	}
}

// malformed says why an entry cannot be processed at all, or "".
func malformed(m Message) string {
	switch {
	case m.EventID == "":
		return "no " + FieldEventID + " field"
	case len(m.EventID) > MaxEventIDLength:
		return fmt.Sprintf("%s longer than %d bytes", FieldEventID, MaxEventIDLength)
	}
	return ""
}

// process runs one entry's transaction: record the event as processed, run
// the handler, commit. err reports a failure to record the event, which is
// not the entry's fault; handlerErr a failure of the handler or its commit.
// The transaction is not cut off by ctx, only by HandlerTimeout, so an
// entry in flight at shutdown finishes.
func (c *Consumer) process(ctx context.Context, m Message) (out outcome, handlerErr, err error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.HandlerTimeout)
	defer cancel()
	err = pgtx.Run(ctx, c.db, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, c.markSQL, m.EventID)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			out = duplicate
			return nil // commit: nothing to keep, but nothing to undo either
		}
		if m.Deliveries > int64(c.cfg.MaxDeliveries) {
			out = tooManyDelivered
			return errRollback // not processed: a replay from the dead-letter stream must run it
		}
		if err := c.runHandler(ctx, tx, m); err != nil {
			out, handlerErr = handlerFailed, err
			return errRollback
		}
		if err := tx.Commit(ctx); err != nil {
			out, handlerErr = handlerFailed, fmt.Errorf("committing: %w", err)
			return errRollback
		}
		out = processed
		return nil
	})
	switch {
	case errors.Is(err, errRollback):
		err = nil
	case err != nil:
		err = fmt.Errorf("recording event %s in %s: %w", m.EventID, c.cfg.ProcessedTable, err)
	}
	return out, handlerErr, err
}

// runHandler runs the handler, turning a panic into an error so that one
// entry cannot crash the consumer again on every redelivery.
func (c *Consumer) runHandler(ctx context.Context, tx pgx.Tx, m Message) (err error) {
	defer func() {
		if r := recover(); r != nil {
			c.log.Error("Handler panicked", "entryID", m.ID, "eventID", m.EventID, "panic", fmt.Sprint(r),
				"stack", string(debug.Stack()))
			err = fmt.Errorf("handler panicked: %v", r)
		}
	}()
	return c.cfg.Handler(ctx, tx, m)
}

// ack acknowledges an entry. A failure is logged and left alone: the entry
// is reclaimed later and then skipped as a duplicate.
func (c *Consumer) ack(ctx context.Context, m Message) {
	if c.testHookBeforeAck != nil {
		c.testHookBeforeAck(m)
	}
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), redisTimeout)
	defer cancel()
	if err := c.rdb.XAck(actx, c.cfg.Stream, c.cfg.Group, m.ID).Err(); err != nil {
		c.setErr(fmt.Errorf("acknowledging: %w", err))
		c.log.Warn("Acknowledging an entry failed; it will be redelivered and skipped", "entryID", m.ID,
			"eventID", m.EventID, "error", err.Error())
	}
}

// deletedWhilePending is the dead-letter reason of an entry removed from
// the stream (trimmed, XDEL) before it was acknowledged.
const deletedWhilePending = "deleted from the stream while pending (trimmed or XDEL): nothing can deliver it again"

// goneFromStream says whether the entry is no longer in the stream. Such an
// entry must not be left pending to be retried: XAUTOCLAIM drops a deleted
// entry from the pending list (Redis 7), so nothing would ever deliver it
// again. An error reading the stream says no: the entry stays pending, and
// the reclaim pass that drops it reports it.
func (c *Consumer) goneFromStream(ctx context.Context, m Message) bool {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), redisTimeout)
	defer cancel()
	got, err := c.rdb.XRangeN(rctx, c.cfg.Stream, m.ID, m.ID, 1).Result()
	if err != nil {
		c.log.Debug("Could not check that a failed entry is still in the stream", "entryID", m.ID, "error", err.Error())
		return false
	}
	return len(got) == 0
}

// reportDeleted adds to the dead-letter stream the pending entries that
// XAUTOCLAIM found deleted from the stream: their id, and an error that
// says so (event_id, event_type, payload and deliveries are gone with the
// entry, and empty). They are no longer pending, so one that cannot be
// reported now is kept and reported at the next reclaim pass.
func (c *Consumer) reportDeleted(ctx context.Context) error {
	for len(c.deleted) > 0 {
		id := c.deleted[0]
		err := c.rdb.XAdd(ctx, &redis.XAddArgs{
			Stream: c.cfg.DeadLetterStream,
			Values: []any{
				FieldEventID, "",
				FieldEventType, "",
				FieldPayload, "",
				FieldError, deletedWhilePending + "; its event was never acknowledged by the group " + c.cfg.Group +
					": find it by its stream id (relay replay)",
				FieldStreamID, id,
				FieldDeliveries, "",
			},
		}).Err()
		if err != nil {
			return fmt.Errorf("dead-lettering entry %s, deleted from the stream while pending: %w", id, err)
		}
		c.log.Error("An entry was deleted from the stream before it was acknowledged; reported on the dead-letter stream",
			"entryID", id, "reason", deletedWhilePending, "deadLetterStream", c.cfg.DeadLetterStream)
		c.deleted = c.deleted[1:]
	}
	return nil
}

// deadLetter adds the entry to the dead-letter stream with the reason, then
// acknowledges it. The two are separate commands, not MULTI, because the
// streams may live in different slots of a Redis Cluster; a failure between
// them redelivers the entry, which is dead-lettered again.
func (c *Consumer) deadLetter(ctx context.Context, m Message, reason string) {
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), redisTimeout)
	defer cancel()
	err := c.rdb.XAdd(dctx, &redis.XAddArgs{
		Stream: c.cfg.DeadLetterStream,
		Values: []any{
			FieldEventID, m.EventID,
			FieldEventType, m.EventType,
			FieldPayload, string(m.Payload),
			FieldError, reason,
			FieldStreamID, m.ID,
			FieldDeliveries, strconv.FormatInt(m.Deliveries, 10),
		},
	}).Err()
	if err != nil {
		c.setErr(fmt.Errorf("dead-lettering: %w", err))
		c.log.Error("Dead-lettering an entry failed; it stays pending", "entryID", m.ID, "eventID", m.EventID,
			"reason", reason, "error", err.Error())
		return
	}
	c.log.Error("Dead-lettered a stream entry", "entryID", m.ID, "eventID", m.EventID, "eventType", m.EventType,
		"deliveries", m.Deliveries, "reason", reason, "deadLetterStream", c.cfg.DeadLetterStream)
	c.ack(ctx, m)
}
