package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/outbox-dev/outbox-operator/pkg/contract"
)

// Field names of a stream entry, and the extra ones of a dead-letter entry
// (pkg/contract is their one home).
const (
	FieldEventID    = contract.FieldEventID
	FieldEventType  = contract.FieldEventType
	FieldPayload    = contract.FieldPayload
	FieldError      = contract.FieldError
	FieldStreamID   = contract.FieldStreamID
	FieldDeliveries = contract.FieldDeliveries
)

// Handler runs the side effects of one event inside tx, the transaction
// that also records the event as processed. It must not commit or roll tx
// back. An error rolls everything back and the entry is retried later (see
// the package doc); wrap it with Permanent when a retry cannot help. ctx
// ends after Config.HandlerTimeout.
type Handler func(ctx context.Context, tx pgx.Tx, m Message) error

// Message is one stream entry.
type Message struct {
	// ID is the stream entry's id, e.g. "1718000000000-0".
	ID string
	// EventID is the event's id (field event_id), unique per event: the
	// relay publishes an event again, under a new ID, after a crash.
	EventID string
	// EventType is the field event_type.
	EventType string
	// Payload is the field payload, verbatim.
	Payload []byte
	// Deliveries counts the deliveries of this entry, this one included: 1
	// the first time.
	Deliveries int64
	// Fields holds every field of the entry, the three above included.
	Fields map[string]string
}

// Permanent marks a handler error that no retry can fix, such as a payload
// that does not parse: the entry is dead-lettered at once instead of after
// MaxDeliveries tries.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err}
}

type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// Consumer reads one stream with one consumer group. Create it with New
// and start it with Run.
type Consumer struct {
	cfg        Config
	db         *pgxpool.Pool
	rdb        redis.UniversalClient
	log        *slog.Logger
	markSQL    string
	lastErr    atomic.Pointer[error]
	lastClaim  time.Time
	groupReady bool
	// deleted holds the ids of pending entries that XAUTOCLAIM found deleted
	// from the stream (and removed from the pending list) and that are not
	// on the dead-letter stream yet.
	deleted []string

	// testHookBeforeAck, when set, runs after an entry's transaction
	// committed and before its XACK. Tests use it to kill the consumer at
	// exactly that point.
	testHookBeforeAck func(Message)
}

// redisTimeout bounds the Redis commands that are not blocking reads.
const redisTimeout = 10 * time.Second

// errNotStarted is the readiness error until the first read.
var errNotStarted = errors.New("no read from the stream yet")

// New validates cfg and returns a Consumer on the given pool and client,
// which the caller owns and closes.
func New(cfg Config, db *pgxpool.Pool, rdb redis.UniversalClient) (*Consumer, error) {
	cfg = cfg.withDefaults(realEnv.getenv, realEnv.hostname)
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("invalid consumer config: %w", err)
	}
	if db == nil || rdb == nil {
		return nil, errors.New("invalid consumer config: a PostgreSQL pool and a Redis client are required")
	}
	table, _ := quoteTable(cfg.ProcessedTable) // validated
	c := &Consumer{
		cfg:     cfg,
		db:      db,
		rdb:     rdb,
		log:     cfg.Logger.With("stream", cfg.Stream, "group", cfg.Group, "consumer", cfg.Consumer),
		markSQL: fmt.Sprintf(markProcessedSQL, table),
	}
	c.setErr(errNotStarted)
	return c, nil
}

// Name is the consumer's name in its group.
func (c *Consumer) Name() string { return c.cfg.Consumer }

// Ready returns nil when the last read from Redis and the last use of
// PostgreSQL succeeded, else why not.
func (c *Consumer) Ready() error {
	if p := c.lastErr.Load(); p != nil {
		return *p
	}
	return nil
}

func (c *Consumer) setErr(err error) {
	if err == nil {
		c.lastErr.Store(nil)
		return
	}
	c.lastErr.Store(&err)
}

// Run consumes until ctx is cancelled, then finishes the entries already
// read and returns nil. Redis and PostgreSQL errors are retried with
// backoff; Run never gives up on them. Call it once per Consumer; run more
// consumers (with other names) for more throughput.
func (c *Consumer) Run(ctx context.Context) error {
	c.log.Info("Consumer started", "maxDeliveries", c.cfg.MaxDeliveries, "minIdle", c.cfg.MinIdle.String(),
		"deadLetterStream", c.cfg.DeadLetterStream, "processedTable", c.cfg.ProcessedTable)
	failures := 0
	for ctx.Err() == nil {
		if err := c.step(ctx); err != nil {
			if ctx.Err() != nil {
				break
			}
			failures++
			c.setErr(err)
			delay := backoff(failures, c.cfg.MinBackoff, c.cfg.MaxBackoff)
			c.logFailure("Reading the stream failed, retrying", err, failures, delay)
			sleep(ctx, delay)
			continue
		}
		if failures > 0 {
			c.log.Info("Consumer recovered", "failures", failures)
			failures = 0
		}
	}
	c.log.Info("Consumer stopped")
	return nil
}

// step makes sure the group exists, reclaims when a pass is due, then reads
// and handles one batch of new entries.
func (c *Consumer) step(ctx context.Context) error {
	if !c.groupReady {
		if err := c.ensureGroup(ctx); err != nil {
			return err
		}
		c.groupReady = true
	}
	if time.Since(c.lastClaim) >= c.cfg.ClaimInterval {
		if err := c.reclaim(ctx); err != nil {
			return c.redisErr("reclaiming pending entries", err)
		}
		c.lastClaim = time.Now()
	}
	block := min(c.cfg.Block, time.Until(c.lastClaim.Add(c.cfg.ClaimInterval)))
	streams, err := c.rdb.XReadGroup(context.WithoutCancel(ctx), &redis.XReadGroupArgs{
		Group:    c.cfg.Group,
		Consumer: c.cfg.Consumer,
		Streams:  []string{c.cfg.Stream, ">"},
		Count:    int64(c.cfg.BatchSize),
		Block:    max(block, time.Millisecond), // BLOCK 0 would wait forever
	}).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return c.redisErr("reading the stream", err)
	}
	if err := c.pingIfIdle(ctx, streams); err != nil {
		return err
	}
	c.setErr(nil)
	for _, s := range streams {
		for _, xm := range s.Messages {
			c.handle(ctx, newMessage(xm, 1))
		}
	}
	return nil
}

// pingIfIdle checks PostgreSQL when nothing was read, so that readiness
// tells the truth on an idle stream.
func (c *Consumer) pingIfIdle(ctx context.Context, streams []redis.XStream) error {
	for _, s := range streams {
		if len(s.Messages) > 0 {
			return nil
		}
	}
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.HandlerTimeout)
	defer cancel()
	if err := c.db.Ping(pctx); err != nil {
		return fmt.Errorf("pinging PostgreSQL: %w", err)
	}
	return nil
}

// redisErr wraps err and notes when the group has disappeared, so that the
// next step creates it again.
func (c *Consumer) redisErr(what string, err error) error {
	if strings.HasPrefix(err.Error(), "NOGROUP") {
		c.groupReady = false
	}
	return fmt.Errorf("%s: %w", what, err)
}

// ensureGroup creates the group, and the stream, when missing. The group
// starts at the beginning of the stream, so events published before the
// first consumer started are consumed too.
func (c *Consumer) ensureGroup(ctx context.Context) error {
	err := c.rdb.XGroupCreateMkStream(ctx, c.cfg.Stream, c.cfg.Group, "0").Err()
	if err != nil && !strings.HasPrefix(err.Error(), "BUSYGROUP") {
		return fmt.Errorf("creating consumer group %s on %s: %w", c.cfg.Group, c.cfg.Stream, err)
	}
	if err == nil {
		c.log.Info("Created consumer group")
	}
	return nil
}

// reclaim claims the entries pending longer than MinIdle, whoever holds
// them, and handles them, one at a time: XAUTOCLAIM counts a delivery for
// every entry it claims, so a page claimed by a consumer that then dies on
// its first entry (an OOM kill) would count one for the entries after it
// too, which never ran, and after MaxDeliveries such deaths dead-letter
// them with the entry that killed it. Claimed one at a time, an entry's
// count goes up only when it is the next to run.
func (c *Consumer) reclaim(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), redisTimeout)
	err := c.reportDeleted(cctx) // left over from a pass whose report failed
	cancel()
	if err != nil {
		return err
	}
	start := "0-0"
	for ctx.Err() == nil {
		// Not cut off by ctx: entries claimed are this consumer's to handle.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), redisTimeout)
		msgs, next, deleted, err := c.xautoclaim(rctx, start)
		if err != nil {
			cancel()
			return err
		}
		// Entries deleted from the stream while pending: XAUTOCLAIM has just
		// removed them from the pending list, so nothing will deliver them
		// again. They are reported, never dropped in silence.
		c.deleted = append(c.deleted, deleted...)
		if err := c.reportDeleted(rctx); err != nil {
			cancel()
			return err
		}
		var deliveries map[string]int64
		if len(msgs) > 0 {
			deliveries, err = c.deliveries(rctx, msgs)
		}
		cancel()
		if err != nil {
			return err
		}
		if len(msgs) > 0 {
			for _, xm := range msgs {
				n, mine := deliveries[xm.ID]
				if !mine {
					continue // acknowledged or claimed by another consumer meanwhile
				}
				m := newMessage(xm, n)
				c.log.Info("Reclaimed a pending entry", "entryID", m.ID, "eventID", m.EventID, "deliveries", n)
				c.handle(ctx, m)
			}
		}
		if next == "0-0" || next == "" {
			return nil
		}
		start = next
	}
	return nil
}

// xautoclaim runs XAUTOCLAIM ... COUNT 1 from start. Besides the entries
// claimed and the next cursor, it returns the ids of pending entries that
// were no longer in the stream (trimmed, XDEL): Redis 7 removes those from
// the pending list and names them in a third element of its reply, which
// go-redis's XAutoClaim discards. (Redis 6.2 returns them as entries
// without fields instead, and keeps them pending: they are dead-lettered as
// malformed.)
func (c *Consumer) xautoclaim(ctx context.Context, start string) (msgs []redis.XMessage, next string,
	deleted []string, err error) {
	reply, err := c.rdb.Do(ctx, "XAUTOCLAIM", c.cfg.Stream, c.cfg.Group, c.cfg.Consumer,
		c.cfg.MinIdle.Milliseconds(), start, "COUNT", 1).Slice()
	if err != nil {
		return nil, "", nil, err
	}
	bad := func(what string) error { return fmt.Errorf("XAUTOCLAIM: unexpected reply (%s)", what) } // no payloads in logs
	if len(reply) < 2 {
		return nil, "", nil, bad("length")
	}
	next, ok := reply[0].(string)
	if !ok {
		return nil, "", nil, bad("cursor")
	}
	entries, _ := reply[1].([]any)
	for _, e := range entries {
		pair, _ := e.([]any)
		if len(pair) < 1 {
			continue // a nil entry: nothing to handle
		}
		id, ok := pair[0].(string)
		if !ok {
			return nil, "", nil, bad("entry id")
		}
		xm := redis.XMessage{ID: id, Values: map[string]any{}}
		if len(pair) > 1 {
			fields, _ := pair[1].([]any)
			for i := 0; i+1 < len(fields); i += 2 {
				k, _ := fields[i].(string)
				xm.Values[k] = fields[i+1]
			}
		}
		msgs = append(msgs, xm)
	}
	if len(reply) > 2 {
		ids, _ := reply[2].([]any)
		for _, v := range ids {
			if id, ok := v.(string); ok {
				deleted = append(deleted, id)
			}
		}
	}
	return msgs, next, deleted, nil
}

// deliveries looks up the delivery count of claimed entries (XAUTOCLAIM
// does not return it): entry id to count, for the entries this consumer
// still holds.
func (c *Consumer) deliveries(ctx context.Context, msgs []redis.XMessage) (map[string]int64, error) {
	pipe := c.rdb.Pipeline()
	cmds := make([]*redis.XPendingExtCmd, len(msgs))
	for i, m := range msgs {
		cmds[i] = pipe.XPendingExt(ctx, &redis.XPendingExtArgs{
			Stream: c.cfg.Stream, Group: c.cfg.Group, Start: m.ID, End: m.ID, Count: 1,
		})
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, fmt.Errorf("reading delivery counts: %w", err)
	}
	out := make(map[string]int64, len(msgs))
	for _, cmd := range cmds {
		for _, p := range cmd.Val() {
			if p.Consumer == c.cfg.Consumer {
				out[p.ID] = p.RetryCount
			}
		}
	}
	return out, nil
}

// newMessage reads the fields of an entry.
func newMessage(xm redis.XMessage, deliveries int64) Message {
	m := Message{ID: xm.ID, Deliveries: deliveries, Fields: make(map[string]string, len(xm.Values))}
	for k, v := range xm.Values {
		s, _ := v.(string)
		m.Fields[k] = s
	}
	m.EventID = m.Fields[FieldEventID]
	m.EventType = m.Fields[FieldEventType]
	if p, ok := m.Fields[FieldPayload]; ok {
		m.Payload = []byte(p)
	}
	return m
}

// backoff returns the delay before retry number attempt (1-based): min
// doubled per attempt, capped at max, half of it fixed and half random.
func backoff(attempt int, minDelay, maxDelay time.Duration) time.Duration {
	d := minDelay
	for i := 1; i < attempt && d < maxDelay; i++ {
		d *= 2
	}
	d = min(d, maxDelay)
	half := d / 2
	return half + time.Duration(rand.Float64()*float64(d-half))
}

// sleep waits for d or ctx.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// logFailure logs the first failure and every tenth at warning level, the
// rest at debug, so an outage does not flood the log.
func (c *Consumer) logFailure(msg string, err error, failures int, delay time.Duration, args ...any) {
	level := slog.LevelDebug
	if failures == 1 || failures%10 == 0 {
		level = slog.LevelWarn
	}
	args = append(args, "error", err.Error(), "failures", failures, "retryIn", delay.String())
	c.log.Log(context.Background(), level, msg, args...)
}
