package relay

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/outbox-dev/outbox-operator/internal/outbox"
)

// Strict ordering runs one active relay per outbox table: the leader. The
// others are warm standbys that try to take over every StandbyPoll.
//
// Leadership is a session-level PostgreSQL advisory lock (the leader key)
// held by a dedicated session that sends a heartbeat every
// LeaderTimeout/3 and runs with idle_session_timeout = LeaderTimeout: a
// leader that stops (paused, cut off, killed) loses its session, and the
// lock with it, within LeaderTimeout, and a standby takes over.
//
// Three fences keep a former leader from publishing out of order:
//
//  1. Every batch of a leader takes the fence key in shared mode for its
//     transaction and checks, in the same statement, that its leader session
//     still holds the leader key. A new leader takes the fence key in
//     exclusive mode before its first claim, so it waits until every batch of
//     the former leader has committed or rolled back: no row stays locked by
//     a former leader, so no claim of the new one skips past it.
//  2. Each leadership has an epoch: the transaction id PostgreSQL assigns
//     when it takes over, larger than any before. Every publish is one Lua
//     script that refuses an epoch older than the stream's fence key
//     (<stream>:fence) and raises the fence to its own: once a new leader
//     has published, a former leader that wakes up cannot add anything.
//  3. Within one leader, the pipeline publishes in claim order and, when a
//     batch fails, rolls back every batch claimed after it (Relay.pipeline).
type leadership struct {
	r     *Relay
	conn  *pgx.Conn
	pid   uint32
	epoch int64
	// lost is closed when the leader session fails.
	lost chan struct{}
}

// Defaults of the leadership timings.
const (
	DefaultLeaderTimeout = 10 * time.Second
	DefaultStandbyPoll   = time.Second
)

// leaderKeys are the advisory lock keys of a table's leadership: the leader
// key, held by the leader's session, and the fence key, held shared by each
// of its batches.
func leaderKeys(t *outbox.Table) (leader, fence int64) {
	h := fnv.New64a()
	_, _ = h.Write([]byte("outbox-relay/strict/" + t.String()))
	k := int64(h.Sum64() &^ 1) // even: leader; the odd neighbour: fence
	return k, k | 1
}

// lead runs the pipeline whenever this relay is the leader, until ctx ends.
func (r *Relay) lead(ctx context.Context) {
	failures := 0
	standbyLogged := false
	for ctx.Err() == nil {
		l, err := r.acquireLeadership(ctx)
		switch {
		case errors.Is(err, errStandby):
			if !standbyLogged {
				r.log.Info("Standing by: another relay is the leader of this outbox (ordering Strict)")
				standbyLogged = true
			}
			r.setErr(nil) // a healthy standby is ready: it takes over within seconds
			sleep(ctx, r.cfg.StandbyPoll, nil)
			continue
		case err != nil:
			failures++
			delay := backoff(failures, r.cfg.MinBackoff, r.cfg.MaxBackoff, jitter)
			r.setErr(err)
			r.report(err, failures, delay)
			sleep(ctx, delay, nil)
			continue
		}
		failures, standbyLogged = 0, false
		r.log.Info("Became the leader (ordering Strict)", "epoch", l.epoch)
		leaderCtx, cancel := context.WithCancel(ctx)
		go func() {
			select {
			case <-l.lost:
				cancel()
			case <-leaderCtx.Done():
			}
		}()
		go l.heartbeat(leaderCtx)
		r.pipeline(leaderCtx, l)
		cancel()
		l.release()
		if ctx.Err() == nil {
			r.log.Warn("Lost the leadership; standing by")
		}
	}
}

var errStandby = errors.New("another relay is the leader")

// acquireLeadership tries once to become the leader: errStandby when
// another relay is.
func (r *Relay) acquireLeadership(ctx context.Context) (*leadership, error) {
	pc, err := r.db.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("connecting the leader session: %w", err)
	}
	conn := pc.Hijack() // a session holding a lock must not return to the pool
	l := &leadership{r: r, conn: conn, pid: conn.PgConn().PID(), lost: make(chan struct{})}
	fail := func(err error) (*leadership, error) {
		_ = conn.Close(context.WithoutCancel(ctx))
		return nil, err
	}
	leaderKey, fenceKey := leaderKeys(r.cfg.Table)
	if _, err := conn.Exec(ctx, "SET idle_session_timeout = "+strconv.FormatInt(r.cfg.LeaderTimeout.Milliseconds(), 10)); err != nil {
		return fail(fmt.Errorf("setting idle_session_timeout on the leader session (PostgreSQL 14 or later is needed for ordering Strict): %w", err))
	}
	var got bool
	if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", leaderKey).Scan(&got); err != nil {
		return fail(fmt.Errorf("taking the leader lock: %w", err))
	}
	if !got {
		return fail(errStandby)
	}
	// Wait until the former leader's batches have ended, then take an epoch.
	for {
		_, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", fenceKey)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return fail(ctx.Err())
		}
		// lock_timeout: a former leader's batch still runs; its session
		// ends within the idle-in-transaction limit.
		r.log.Info("Waiting for the former leader's batches to end", "error", err.Error())
		if _, err := conn.Exec(ctx, "SELECT 1"); err != nil { // heartbeat while waiting
			return fail(fmt.Errorf("leader session: %w", err))
		}
	}
	if err := conn.QueryRow(ctx, "SELECT pg_current_xact_id()::text::bigint").Scan(&l.epoch); err != nil {
		return fail(fmt.Errorf("taking an epoch: %w", err))
	}
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_unlock($1)", fenceKey); err != nil {
		return fail(fmt.Errorf("releasing the fence key: %w", err))
	}
	return l, nil
}

// heartbeat keeps the leader session busy within idle_session_timeout and
// closes lost when it fails.
func (l *leadership) heartbeat(ctx context.Context) {
	t := time.NewTicker(l.r.cfg.LeaderTimeout / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		hctx, cancel := context.WithTimeout(ctx, l.r.cfg.LeaderTimeout/3)
		_, err := l.conn.Exec(hctx, "SELECT 1")
		cancel()
		if err != nil && ctx.Err() == nil {
			l.r.log.Warn("Leader session failed", "error", err.Error())
			close(l.lost)
			return
		}
	}
}

// release ends the leadership: closing the session releases the lock.
func (l *leadership) release() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = l.conn.Close(ctx)
}

// errNotLeader: the leader session is gone; the batch must not be claimed.
var errNotLeader = errors.New("no longer the leader: the leader session ended")

// fenceSQL takes the fence key shared for the batch's transaction and tells
// whether the leader session ($2) still holds the leader key ($3).
const fenceSQL = `SELECT pg_advisory_xact_lock_shared($1), EXISTS (
	SELECT 1 FROM pg_locks
	WHERE locktype = 'advisory' AND pid = $2 AND granted AND objsubid = 1
		AND classid = (($3::bigint >> 32) & 4294967295)::oid AND objid = ($3::bigint & 4294967295)::oid
)`

// fence runs first in every batch of a leader (see leadership).
func (l *leadership) fence(ctx context.Context, tx pgx.Tx) error {
	leaderKey, fenceKey := leaderKeys(l.r.cfg.Table)
	var held bool
	var unit any
	if err := tx.QueryRow(ctx, fenceSQL, fenceKey, int64(l.pid), leaderKey).Scan(&unit, &held); err != nil {
		return fmt.Errorf("fencing batch: %w", err)
	}
	if !held {
		return errNotLeader
	}
	return nil
}

// fencedXAdd is the publish of a leader: one script that refuses an epoch
// older than the stream's fence, raises the fence to this epoch, and adds
// the entries in order (trimmed like XADD MAXLEN ~ when maxlen > 0).
var fencedXAdd = redis.NewScript(`
local fence = tonumber(redis.call('GET', KEYS[2]) or '0')
local epoch = tonumber(ARGV[1])
if fence > epoch then
	return redis.error_reply('FENCED the stream is written by a newer leader (epoch ' .. fence .. ', this relay ' .. epoch .. ')')
end
if fence < epoch then redis.call('SET', KEYS[2], ARGV[1]) end
local maxlen = tonumber(ARGV[2])
local n = 0
for i = 3, #ARGV, 3 do
	if maxlen > 0 then
		redis.call('XADD', KEYS[1], 'MAXLEN', '~', maxlen, '*', 'event_id', ARGV[i], 'event_type', ARGV[i+1], 'payload', ARGV[i+2])
	else
		redis.call('XADD', KEYS[1], '*', 'event_id', ARGV[i], 'event_type', ARGV[i+1], 'payload', ARGV[i+2])
	end
	n = n + 1
end
return n
`)

// FenceKey is the Redis key holding the epoch of the newest leader that
// published to stream.
func FenceKey(stream string) string { return stream + ":fence" }

// publishFenced adds the events not marked in skip, in order, with the
// leader's epoch.
func (l *leadership) publishFenced(ctx context.Context, events []outbox.Event, skip []string) error {
	args := []any{l.epoch, l.r.cfg.MaxLen}
	for i, e := range events {
		if skip[i] == "" {
			args = append(args, e.ID, e.Type, e.Payload)
		}
	}
	if len(args) == 2 {
		return nil
	}
	stream := l.r.cfg.Stream
	if err := fencedXAdd.Run(ctx, l.r.rdb, []string{stream, FenceKey(stream)}, args...).Err(); err != nil {
		return fmt.Errorf("XADD %s (fenced, epoch %d): %w", stream, l.epoch, err)
	}
	return nil
}
