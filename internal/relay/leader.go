package relay

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/outbox-dev/outbox-operator/internal/outbox"
)

// Ordered relays (ordering Strict and PerKey) split the outbox into key
// partitions, each owned by one relay at a time: Strict has one partition
// holding every row, PerKey hashes the key column into Partitions of them.
// A relay claims only rows of the partitions it owns, and its pipeline
// publishes them in claim order, so each partition reaches the stream in
// (created_at, id) order.
//
// Ownership is a set of session-level PostgreSQL advisory locks, one per
// partition, held by a session of the relay's own that runs with
// idle_session_timeout = LeaderTimeout and is used at least every
// StandbyPoll: a relay that stops (paused, cut off, killed with its host)
// loses the session, and every partition with it, within LeaderTimeout. The
// same session holds a member lock in shared mode, so relays count each
// other; each aims at ceil(partitions / relays) partitions, giving up the
// extra ones and taking free ones, so ownership follows the Deployment's
// scale. With Strict the one partition goes to one relay; the others stand by.
//
// Three fences keep a former owner from publishing out of order:
//
//  1. Every batch takes the fence lock of each partition it may claim in
//     shared mode for its transaction, then checks that its owner session
//     still holds those partitions. A new owner takes a partition's fence in
//     exclusive mode before its first claim of it, so it waits until every
//     batch of the former owner has committed or rolled back: no row of the
//     partition stays locked by a former owner for a claim to skip.
//  2. Each acquisition takes an epoch: the transaction id PostgreSQL assigns,
//     larger than any before. Every publish is one Lua script that refuses an
//     epoch older than the partition's fence in Redis (field
//     <database>/<table>/<p> of the hash <stream>:fence: tables that share a
//     stream are orderings of their own, each with its own leaders and
//     epochs) and raises it: once a new owner has published, a former owner
//     that wakes up cannot add an entry of that partition.
//  3. Within one relay, the pipeline publishes in claim order and, when a
//     batch fails, rolls back every batch claimed after it (Relay.pipeline).
type ownership struct {
	r          *Relay
	partitions int
	keys       lockKeys

	mu      sync.Mutex // the session is used by one goroutine at a time
	conn    *pgx.Conn
	held    map[int64]bool // partitions whose lock the session holds
	fencing map[int64]bool // held, but the former owner's batches may still run

	pid       uint32
	field     string                  // "<database>/<table>/": the prefix of the partitions' fields in the fence hash
	claimable atomic.Pointer[[]int64] // held and fenced: what the claimer may take
	epoch     atomic.Int64
	lost      chan struct{} // closed when the session fails
	lostOnce  sync.Once
}

// Defaults of the ownership timings.
const (
	DefaultLeaderTimeout = 10 * time.Second
	DefaultStandbyPoll   = time.Second
	// DefaultPartitions is the number of key partitions of ordering PerKey:
	// the most relays that share the work.
	DefaultPartitions = 32
	// MaxPartitions bounds Partitions (the lock keys leave room for this many).
	MaxPartitions = 4096
)

// lockKeys are the advisory lock keys of a table's ordering: per partition
// p, base+2p (ownership) and base+2p+1 (fence); member is held shared by
// every relay of the table.
type lockKeys struct{ base, member int64 }

// newLockKeys derives the keys of the table named table (its
// outbox.Table.Identity, one name whatever the spelling a relay was given).
func newLockKeys(table string, partitions int) lockKeys {
	h := fnv.New64a()
	_, _ = h.Write([]byte("outbox-relay/ordered/" + table + "/" + strconv.Itoa(partitions)))
	base := int64(h.Sum64()&(1<<42-1)) << 20 // positive; 2^20 keys of room
	return lockKeys{base: base, member: base + 1<<20 - 1}
}

func (k lockKeys) owner(p int64) int64 { return k.base + 2*p }
func (k lockKeys) fence(p int64) int64 { return k.base + 2*p + 1 }

// heldLocksSQL counts the advisory locks of $2 that session $1 holds.
// Advisory locks belong to a database: pg_locks shows every database's.
const heldLocksSQL = `SELECT count(*) FROM pg_locks
WHERE locktype = 'advisory' AND pid = $1 AND granted AND objsubid = 1
	AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
	AND ((classid::bigint << 32) | objid::bigint) = ANY($2::bigint[])`

// membersSQL counts the sessions holding the member lock $1.
const membersSQL = `SELECT count(DISTINCT pid) FROM pg_locks
WHERE locktype = 'advisory' AND granted AND objsubid = 1
	AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
	AND ((classid::bigint << 32) | objid::bigint) = $1`

// own runs the pipeline on the partitions this relay owns, until ctx ends.
func (r *Relay) own(ctx context.Context) {
	failures := 0
	for ctx.Err() == nil {
		o, err := r.openOwnership(ctx)
		if err != nil {
			failures++
			delay := backoff(failures, r.cfg.MinBackoff, r.cfg.MaxBackoff, jitter)
			r.setErr(err)
			r.report(err, failures, delay)
			sleep(ctx, delay, nil)
			continue
		}
		failures = 0
		ownCtx, cancel := context.WithCancel(ctx)
		go func() {
			select {
			case <-o.lost:
				cancel()
			case <-ownCtx.Done():
			}
		}()
		go o.maintain(ownCtx)
		r.pipeline(ownCtx, o)
		cancel()
		o.close()
		if ctx.Err() == nil {
			r.log.Warn("Lost the ownership session; every partition is given up, starting again")
		}
	}
}

// openOwnership opens the relay's own session, bounded by
// idle_session_timeout, and joins the table's members.
func (r *Relay) openOwnership(ctx context.Context) (*ownership, error) {
	partitions := 1
	if r.cfg.Ordering == OrderingPerKey {
		partitions = r.cfg.Partitions
	}
	pc, err := r.db.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("connecting the ownership session: %w", err)
	}
	conn := pc.Hijack() // a session holding locks must not return to the pool
	o := &ownership{r: r, partitions: partitions, conn: conn,
		held: map[int64]bool{}, fencing: map[int64]bool{}, pid: conn.PgConn().PID(), lost: make(chan struct{})}
	o.claimable.Store(&[]int64{})
	if _, err := conn.Exec(ctx, "SET idle_session_timeout = "+strconv.FormatInt(r.cfg.LeaderTimeout.Milliseconds(), 10)); err != nil {
		_ = conn.Close(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("setting idle_session_timeout on the ownership session (ordering %s needs PostgreSQL 14 or later): %w",
			r.cfg.Ordering, err)
	}
	var database string
	if err := conn.QueryRow(ctx, "SELECT current_database()").Scan(&database); err != nil {
		_ = conn.Close(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("reading the database of the ownership session: %w", err)
	}
	table, err := r.cfg.Table.Identity(ctx, conn)
	if err != nil {
		_ = conn.Close(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("ordering %s: %w", r.cfg.Ordering, err)
	}
	o.keys, o.field = newLockKeys(table, partitions), database+"/"+table+"/"
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock_shared($1)", o.keys.member); err != nil {
		_ = conn.Close(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("joining the relays of %s: %w", r.cfg.Table, err)
	}
	return o, nil
}

// fenceField is partition p's field in the stream's fence hash. The fences
// of a stream are per table (and database): the relays of another table
// publishing to the same stream have leaders and epochs of their own, and
// a fence shared with them would refuse this table's batches for good once
// one of theirs, with a larger epoch, had published.
func (o *ownership) fenceField(p int64) string { return o.field + strconv.FormatInt(p, 10) }

// maintain rebalances every StandbyPoll, or every half LeaderTimeout when
// that is shorter (a round also keeps the session from idling out: a
// LeaderTimeout of 1s would otherwise end it between two rounds of 1s),
// and closes lost when the session fails.
func (o *ownership) maintain(ctx context.Context) {
	start := rand.IntN(o.partitions) // spread the first picks of relays starting together
	every := min(o.r.cfg.StandbyPoll, o.r.cfg.LeaderTimeout/2)
	for ctx.Err() == nil {
		if err := o.rebalance(ctx, start); err != nil {
			if ctx.Err() == nil {
				o.r.log.Warn("Ownership session failed", "error", err.Error())
				o.lostOnce.Do(func() { close(o.lost) })
			}
			return
		}
		sleep(ctx, every, nil)
	}
}

// rebalance gives up partitions above this relay's share, takes free ones
// up to it, and makes fenced partitions claimable.
func (o *ownership) rebalance(ctx context.Context, start int) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, o.r.cfg.LeaderTimeout/2)
	defer cancel()
	var members int64
	if err := o.conn.QueryRow(ctx, membersSQL, o.keys.member).Scan(&members); err != nil {
		return err
	}
	target := (o.partitions + int(max(members, 1)) - 1) / int(max(members, 1))
	changed := false
	// Give up the extra partitions, the highest first. A batch in flight
	// keeps the partition's fence shared, so the next owner waits for it.
	for _, p := range o.sortedHeld() {
		if len(o.held) <= target {
			break
		}
		if _, err := o.conn.Exec(ctx, "SELECT pg_advisory_unlock($1)", o.keys.owner(p)); err != nil {
			return err
		}
		delete(o.held, p)
		delete(o.fencing, p)
		changed = true
		o.r.log.Info("Gave up a key partition", "partition", p, "relays", members)
	}
	// Take free partitions up to the share.
	for i := 0; i < o.partitions && len(o.held) < target; i++ {
		p := int64((start + i) % o.partitions)
		if o.held[p] {
			continue
		}
		var got bool
		if err := o.conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", o.keys.owner(p)).Scan(&got); err != nil {
			return err
		}
		if got {
			o.held[p], o.fencing[p] = true, true
		}
	}
	// Wait for the former owners' batches; then an epoch, larger than theirs.
	var fenced []int64
	for p := range o.fencing {
		var got bool
		if err := o.conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", o.keys.fence(p)).Scan(&got); err != nil {
			return err
		}
		if !got {
			continue // a former owner's batch still runs; try again next round
		}
		if _, err := o.conn.Exec(ctx, "SELECT pg_advisory_unlock($1)", o.keys.fence(p)); err != nil {
			return err
		}
		delete(o.fencing, p)
		fenced = append(fenced, p)
	}
	if len(fenced) > 0 {
		epoch, err := o.newEpoch(ctx)
		var redisErr *fenceReadError
		switch {
		case errors.As(err, &redisErr):
			// Redis did not answer: nothing could be published anyway. The
			// partitions stay held, and are fenced again next round.
			o.r.log.Warn("Could not read the stream's fences; the partitions wait for the next round", "error", err.Error())
			for _, p := range fenced {
				o.fencing[p] = true
			}
		case err != nil:
			return err
		default:
			o.epoch.Store(epoch)
			changed = true
		}
	}
	if changed {
		ready := o.storeClaimable()
		o.r.log.Info("Key partitions owned", "partitions", ready, "of", o.partitions, "relays", members,
			"epoch", o.epoch.Load())
	}
	// A query every round keeps the session within idle_session_timeout.
	_, err := o.conn.Exec(ctx, "SELECT 1")
	return err
}

// refence makes parts unclaimable until their fences are taken in exclusive
// mode again (rebalance, as for a new owner), with a new epoch: after a
// batch of this relay whose transaction the server may still keep open
// (Relay.lingering). Its transaction holds the fence in shared mode, so the
// fences are taken once it is over, and the claims begin again from the
// oldest pending row.
func (o *ownership) refence(parts []int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, p := range parts {
		if o.held[p] {
			o.fencing[p] = true
		}
	}
	o.storeClaimable()
}

// storeClaimable makes the partitions held and fenced claimable, and
// returns them. o.mu is held.
func (o *ownership) storeClaimable() []int64 {
	var ready []int64
	for p := range o.held {
		if !o.fencing[p] {
			ready = append(ready, p)
		}
	}
	slices.Sort(ready)
	o.claimable.Store(&ready)
	return ready
}

// newEpoch is the epoch of a new ownership: PostgreSQL's current
// transaction id, which only grows, so it is above the epoch of every
// former owner. Unless the transaction ids went back (a database restored
// from a dump into a new cluster, a failover that lost transactions): then
// every fence in Redis would stay above it and refuse every batch for good.
// So the epoch is also above the highest fence of the stream. A former
// owner can have an epoch above both only if it never published; ownership
// is exclusive in PostgreSQL, so it runs no batch once this one owns.
func (o *ownership) newEpoch(ctx context.Context) (int64, error) {
	var epoch int64
	if err := o.conn.QueryRow(ctx, "SELECT pg_current_xact_id()::text::bigint").Scan(&epoch); err != nil {
		return 0, err
	}
	rctx, cancel := context.WithTimeout(ctx, o.r.cfg.PublishTimeout)
	defer cancel()
	fences, err := o.r.rdb.HVals(rctx, FenceKey(o.r.cfg.Stream)).Result()
	if err != nil {
		return 0, &fenceReadError{fmt.Errorf("reading the fences of %s: %w", o.r.cfg.Stream, err)}
	}
	for _, f := range fences {
		if v, err := strconv.ParseInt(f, 10, 64); err == nil && v >= epoch {
			epoch = v + min(1, math.MaxInt64-v) // above it, or equal to the largest there is
		}
	}
	return epoch, nil
}

// fenceReadError: Redis did not answer newEpoch's read of the fences.
type fenceReadError struct{ err error }

func (e *fenceReadError) Error() string { return e.err.Error() }
func (e *fenceReadError) Unwrap() error { return e.err }

func (o *ownership) sortedHeld() []int64 {
	ps := slices.Sorted(maps.Keys(o.held))
	slices.Reverse(ps)
	return ps
}

// close ends the session, which releases every lock.
func (o *ownership) close() {
	o.mu.Lock()
	defer o.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = o.conn.Close(ctx)
}

// errNotOwner: the session no longer holds a partition the batch would
// claim; the batch is not claimed.
var errNotOwner = errors.New("no longer the owner of the key partitions: the ownership session ended or gave them up")

// fence runs first in every batch of an ordered relay (see ownership): it
// takes the fences of the partitions in shared mode, then checks the
// session still owns them and that they are still claimable: parts was
// read before, and a partition given up and taken again since (a claimer
// that stalled over a rebalance) is held but not fenced yet, so a former
// owner's batch may still hold its older rows. It returns the epoch to
// publish with.
func (o *ownership) fence(ctx context.Context, tx pgx.Tx, parts []int64) (int64, error) {
	epoch := o.epoch.Load()
	fences := make([]int64, len(parts))
	owners := make([]int64, len(parts))
	for i, p := range parts {
		fences[i], owners[i] = o.keys.fence(p), o.keys.owner(p)
	}
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock_shared(k) FROM unnest($1::bigint[]) k", fences); err != nil {
		return 0, fmt.Errorf("fencing batch: %w", err)
	}
	var held int
	if err := tx.QueryRow(ctx, heldLocksSQL, int64(o.pid), owners).Scan(&held); err != nil {
		return 0, fmt.Errorf("fencing batch: %w", err)
	}
	if held != len(parts) {
		return 0, errNotOwner
	}
	claimable := *o.claimable.Load()
	for _, p := range parts {
		if !slices.Contains(claimable, p) {
			return 0, errNotOwner
		}
	}
	return epoch, nil
}

// fencedXAdd is the publish of an ordered relay: one script that refuses an
// epoch older than the fence of any partition of the batch, raises those
// fences to this epoch, and adds the entries in order (trimmed like XADD
// MAXLEN ~ when maxlen > 0; with a key field when withKey is 1). It returns
// the count added and the last entry's id.
//
// KEYS: stream, fence hash. ARGV: epoch, maxlen, withKey, n, the n
// partitions' fields in the fence hash, then the entries' fields.
var fencedXAdd = redis.NewScript(`
local epoch = tonumber(ARGV[1])
local maxlen = tonumber(ARGV[2])
local withKey = ARGV[3] == '1'
local n = tonumber(ARGV[4])
for i = 5, 4 + n do
	local f = tonumber(redis.call('HGET', KEYS[2], ARGV[i]) or '0')
	if f > epoch then
		return redis.error_reply('FENCED partition ' .. ARGV[i] ..
			' of the stream is written by a newer owner (epoch ' .. f .. ', this relay ' .. epoch .. ')')
	end
end
for i = 5, 4 + n do redis.call('HSET', KEYS[2], ARGV[i], ARGV[1]) end
local step = 3
if withKey then step = 4 end
local added = 0
local last = ''
for i = 5 + n, #ARGV, step do
	local fields = {'event_id', ARGV[i], 'event_type', ARGV[i+1], 'payload', ARGV[i+2]}
	if withKey then
		fields[7] = 'key'
		fields[8] = ARGV[i+3]
	end
	if maxlen > 0 then
		last = redis.call('XADD', KEYS[1], 'MAXLEN', '~', maxlen, '*', unpack(fields))
	else
		last = redis.call('XADD', KEYS[1], '*', unpack(fields))
	end
	added = added + 1
end
return {added, last}
`)

// FenceKey is the Redis hash holding, per table and key partition
// (ownership.fenceField), the epoch of the newest owner that published it
// to stream.
func FenceKey(stream string) string { return stream + ":fence" }

// publishFenced adds the events not marked in skip, in order, with epoch,
// fencing the batch's partitions.
func (o *ownership) publishFenced(ctx context.Context, epoch int64, events []outbox.Event, skip []string) error {
	withKey := o.r.cfg.Ordering == OrderingPerKey
	var parts []int64
	var fields []any
	for i, e := range events {
		if skip[i] != "" {
			continue
		}
		if !slices.Contains(parts, int64(e.Partition)) {
			parts = append(parts, int64(e.Partition))
		}
		fields = append(fields, e.ID, e.Type, e.Payload)
		if withKey {
			fields = append(fields, e.Key)
		}
	}
	if len(fields) == 0 {
		return nil
	}
	wk := "0"
	if withKey {
		wk = "1"
	}
	args := []any{epoch, o.r.cfg.MaxLen, wk, len(parts)}
	for _, p := range parts {
		args = append(args, o.fenceField(p))
	}
	args = append(args, fields...)
	stream := o.r.cfg.Stream
	// One pipeline, one connection: the script, then WAIT for the replicas
	// when asked, which counts exactly the script's writes.
	// XINFO STREAM first, as the unfenced publish does: has the stream gone
	// back in time since the last batch (streamloss.go)?
	pipe, err := o.r.pipelineFor(ctx, o.r.rdb, stream)
	if err != nil {
		return err
	}
	check := o.r.stream.queueCheck(ctx, pipe, stream)
	script := fencedXAdd.Eval(ctx, pipe, []string{stream, FenceKey(stream)}, args...)
	wait := o.r.queueWait(ctx, pipe)
	o.r.execObserved(ctx, pipe, check, func() (string, int, bool) {
		res, err := script.Slice()
		if err != nil || len(res) != 2 {
			return "", 0, false
		}
		n, _ := res[0].(int64)
		last, _ := res[1].(string)
		return last, int(n), true
	})
	if err := script.Err(); err != nil {
		return fmt.Errorf("XADD %s (fenced, epoch %d): %w", stream, epoch, err)
	}
	if err := o.r.checkWait(wait); err != nil {
		var pe *publishError
		if errors.As(err, &pe) {
			return pe.err
		}
		return err
	}
	return nil
}
